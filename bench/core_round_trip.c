/* How far apart two cores are, as a shared-memory allreduce feels it.

       cc -O2 -pthread bench/core_round_trip.c -o /tmp/core_round_trip
       /tmp/core_round_trip [seconds] [core_a] [core_b]

   Two threads pinned to core_a and core_b (0 and 1) take turns, every 0.3 s for `seconds` (5):
   20,000 cache-line round trips (one writes a counter, the other answers), then 2,000 rounds in
   which core_a copies 64 KiB into a buffer core_b has just read (what an ordinary store into a
   shared half does, docs/transport.md "Stores into a half"), then a JSON line: the round trip
   in ns and that copy's GB/s. On the 2-vCPU AMD EPYC VM kolo is developed on it reads ~50-90 ns
   and 7-9 GB/s at times and ~330 ns and ~2.3 GB/s at others, for minutes each: the hypervisor
   moves the vCPUs. Run it beside bench/shm_stores.py or bench/training.py to tell which state
   a figure was measured in. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ROUND_TRIPS 20000
#define COPIES 2000
#define BYTES (64 * 1024)

static _Atomic int ball __attribute__((aligned(64)));
static _Atomic int turn __attribute__((aligned(64)));
static _Atomic int done;
static char *shared, *mine;
static int core_b = 1;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void pin(int core) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(core, &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0) {
        fprintf(stderr, "cannot pin to core %d\n", core);
        exit(2);
    }
}

/* core_b: answers round trips, then reads the buffer after each copy. Turn 1: round trips;
   turn 3 + 2r: read after copy r (answers 4 + 2r); turn 0: idle. */
static void *peer(void *unused) {
    (void)unused;
    pin(core_b);
    while (!atomic_load(&done)) {
        if (atomic_load(&turn) != 1)
            continue;
        for (int i = 0; i < ROUND_TRIPS; i++) {
            while (atomic_load_explicit(&ball, memory_order_acquire) != 2 * i + 1)
                ;
            atomic_store_explicit(&ball, 2 * i + 2, memory_order_release);
        }
        for (int r = 0; r < COPIES; r++) {
            while (atomic_load(&turn) != 3 + 2 * r)
                ;
            volatile long sum = 0;
            for (int i = 0; i < BYTES; i += 64)
                sum += shared[i];
            atomic_store(&turn, 4 + 2 * r);
        }
        while (atomic_load(&turn) != 0 && !atomic_load(&done))
            ;
    }
    return NULL;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5;
    int core_a = argc > 2 ? atoi(argv[2]) : 0;
    core_b = argc > 3 ? atoi(argv[3]) : 1;
    shared = aligned_alloc(4096, BYTES);
    mine = aligned_alloc(4096, BYTES);
    memset(shared, 1, BYTES);
    memset(mine, 2, BYTES);
    pthread_t thread;
    pthread_create(&thread, NULL, peer, NULL);
    pin(core_a);
    double start = now();
    while (now() - start < seconds) {
        atomic_store(&ball, 0);
        atomic_store(&turn, 1);
        double t0 = now();
        for (int i = 0; i < ROUND_TRIPS; i++) {
            atomic_store_explicit(&ball, 2 * i + 1, memory_order_release);
            while (atomic_load_explicit(&ball, memory_order_acquire) != 2 * i + 2)
                ;
        }
        double round_trip = (now() - t0) / ROUND_TRIPS;
        double copying = 0;
        for (int r = 0; r < COPIES; r++) {
            double t = now();
            memcpy(shared, mine, BYTES);
            copying += now() - t;
            atomic_store(&turn, 3 + 2 * r);
            while (atomic_load(&turn) != 4 + 2 * r)
                ;
        }
        printf("{\"round_trip_ns\": %.0f, \"copy_into_read_lines_gb_s\": %.2f}\n",
               round_trip * 1e9, (double)COPIES * BYTES / copying / 1e9);
        fflush(stdout);
        atomic_store(&turn, 0);
        struct timespec pause = {0, 300000000};
        nanosleep(&pause, NULL);
    }
    atomic_store(&done, 1);
    pthread_join(thread, NULL);
    return 0;
}
