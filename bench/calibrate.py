"""Physical limits of this machine: memcpy, TCP loopback and shared-memory ping-pong.

    python bench/calibrate.py [--quick] [--max-bytes 536870912] [--json PATH]

The denominators the other bench scripts divide by (they load the newest
``bench/results/calibrate-*.json``):

- memcpy GB/s with 1 thread and with 2 threads copying concurrently (two copies of the same
  size, each its own source and destination; numpy's copy releases the GIL), 64 KiB ... 512 MiB.
  Each copy's GB/s is bytes / its time; 2 threads also give the aggregate.
- TCP loopback (127.0.0.1) one-way bandwidth between two processes (sendall / recv_into of
  4 MiB pieces) and ping-pong latency of 8-byte messages (TCP_NODELAY), half the round trip.
- shared-memory ping-pong latency: two processes spin on flags in a shared mmap, half the round
  trip. Measured from Python, so it is an upper bound on the hardware's cache-line round trip
  (the Python loop costs a few hundred ns per poll) and a fair floor for a call from Python.

With 2 or more CPUs the two processes / threads are pinned to cores 0 and 1. One line per
figure; JSON to bench/results/calibrate-<time>.json (or ``--json``).
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing as mp
import os
import socket
import statistics
import struct
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
from common import human, write_results

CORES = os.cpu_count() or 1


def pin(core: int) -> None:
    if CORES >= 2:
        try:
            os.sched_setaffinity(0, {core % CORES})
        except (AttributeError, OSError):
            pass


def best_seconds_per_call(call: Callable[[], None], budget_s: float, repeats: int = 3) -> float:
    """The best over ``repeats`` batches of the mean seconds per call (each batch >= budget)."""
    call()
    best = float("inf")
    for _ in range(repeats):
        calls, start = 0, time.perf_counter()
        while True:
            call()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= budget_s:
                break
        best = min(best, elapsed / calls)
    return best


def concurrent_copy_seconds(nbytes: int, threads: int, budget_s: float) -> float:
    """Seconds per copy of ``nbytes`` while ``threads`` threads copy at the same time (the
    slowest thread's mean over a common number of copies; best of 3 rounds)."""
    pairs = [(np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)) for _ in range(threads)]
    for src, dst in pairs:
        np.copyto(dst, src)  # fault the pages in
    per_copy = best_seconds_per_call(lambda: np.copyto(pairs[0][1], pairs[0][0]), budget_s / 3, 1)
    copies = max(3, int(budget_s / max(per_copy, 1e-9) / threads))
    best = float("inf")
    for _ in range(3):
        barrier = threading.Barrier(threads)
        elapsed = [0.0] * threads

        def work(i: int, barrier: threading.Barrier = barrier, elapsed: list = elapsed) -> None:
            src, dst = pairs[i]
            barrier.wait()
            start = time.perf_counter()
            for _ in range(copies):
                np.copyto(dst, src)
            elapsed[i] = time.perf_counter() - start

        workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, max(elapsed) / copies)
    return best


def measure_memcpy(sizes: list[int], budget_s: float) -> list[dict[str, Any]]:
    rows = []
    for nbytes in sizes:
        one = concurrent_copy_seconds(nbytes, 1, budget_s)
        two = concurrent_copy_seconds(nbytes, 2, budget_s)
        rows.append(
            {
                "bytes": nbytes,
                "one_thread_s": one,
                "one_thread_GBps": nbytes / one / 1e9,
                "two_threads_s_each": two,
                "two_threads_GBps_each": nbytes / two / 1e9,
                "two_threads_GBps_total": 2 * nbytes / two / 1e9,
            }
        )
    return rows


def _tcp_peer(port: int, mode: str, nbytes: int, pieces: int, rounds: int) -> None:
    pin(1)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if mode == "bandwidth":
            buf = bytearray(nbytes)
            view = memoryview(buf)
            for _ in range(pieces):
                got = 0
                while got < nbytes:
                    got += sock.recv_into(view[got:])
            sock.sendall(b"k")
        else:
            msg = bytearray(8)
            for _ in range(rounds):
                got = 0
                while got < 8:
                    got += sock.recv_into(memoryview(msg)[got:])
                sock.sendall(msg)


def measure_tcp(total_bytes: int, rounds: int) -> dict[str, Any]:
    """Loopback one-way bandwidth (``total_bytes`` in 4 MiB pieces) and 8-byte ping-pong."""
    ctx = mp.get_context("fork")
    piece = 4 << 20
    pieces = max(1, total_bytes // piece)
    out: dict[str, Any] = {}
    for mode in ("bandwidth", "latency"):
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            child = ctx.Process(
                target=_tcp_peer, args=(server.getsockname()[1], mode, piece, pieces, rounds)
            )
            child.start()
            conn, _ = server.accept()
            pin(0)
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if mode == "bandwidth":
                    data = memoryview(np.ones(piece, np.uint8))
                    start = time.perf_counter()
                    for _ in range(pieces):
                        conn.sendall(data)
                    conn.recv(1)
                    seconds = time.perf_counter() - start
                    out["bandwidth_GBps"] = piece * pieces / seconds / 1e9
                    out["bandwidth_bytes"] = piece * pieces
                else:
                    msg = bytearray(8)
                    times = []
                    for _ in range(rounds):
                        start = time.perf_counter()
                        conn.sendall(msg)
                        got = 0
                        while got < 8:
                            got += conn.recv_into(memoryview(msg)[got:])
                        times.append(time.perf_counter() - start)
                    out["pingpong_one_way_us"] = statistics.median(times) / 2 * 1e6
                    out["pingpong_rounds"] = rounds
            child.join()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(range(CORES)))
    return out


def _shm_peer(buf: mmap.mmap, rounds: int) -> None:
    pin(1)
    for i in range(1, rounds + 1):
        while struct.unpack_from("q", buf, 0)[0] != i:
            pass
        struct.pack_into("q", buf, 64, i)


def measure_shm(rounds: int) -> dict[str, Any]:
    """Ping-pong over flags in a shared anonymous mmap (two cache lines apart)."""
    buf = mmap.mmap(-1, 4096)
    child = mp.get_context("fork").Process(target=_shm_peer, args=(buf, rounds))
    child.start()
    pin(0)
    times = []
    for i in range(1, rounds + 1):
        start = time.perf_counter()
        struct.pack_into("q", buf, 0, i)
        while struct.unpack_from("q", buf, 64)[0] != i:
            pass
        times.append(time.perf_counter() - start)
    child.join()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(range(CORES)))
    return {"pingpong_one_way_us": statistics.median(times) / 2 * 1e6, "pingpong_rounds": rounds}


def calibrate(sizes: list[int], budget_s: float, tcp_bytes: int, rounds: int) -> dict[str, Any]:
    return {
        "memcpy": measure_memcpy(sizes, budget_s),
        "tcp_loopback": measure_tcp(tcp_bytes, rounds),
        "shm": measure_shm(rounds),
    }


def print_figures(record: dict[str, Any]) -> None:
    for row in record["memcpy"]:
        print(
            f"memcpy {human(row['bytes']):>9}: 1 thread {row['one_thread_GBps']:6.2f} GB/s "
            f"({row['one_thread_s'] * 1e6:9.1f} us) | 2 threads "
            f"{row['two_threads_GBps_each']:6.2f} GB/s each "
            f"({row['two_threads_s_each'] * 1e6:9.1f} us), "
            f"{row['two_threads_GBps_total']:6.2f} total | 2-thread/1-thread total "
            f"{row['two_threads_GBps_total'] / row['one_thread_GBps']:.2f}x",
            flush=True,
        )
    tcp, shm = record["tcp_loopback"], record["shm"]
    print(
        f"tcp loopback: {tcp['bandwidth_GBps']:.2f} GB/s one way | ping-pong "
        f"{tcp['pingpong_one_way_us']:.1f} us one way",
        flush=True,
    )
    print(
        f"shm ping-pong (python spin): {shm['pingpong_one_way_us']:.2f} us one way | "
        f"tcp/shm latency {tcp['pingpong_one_way_us'] / shm['pingpong_one_way_us']:.1f}x",
        flush=True,
    )


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="64 KiB ... 64 MiB, shorter timings")
    parser.add_argument("--min-bytes", type=int, default=64 << 10)
    parser.add_argument("--max-bytes", type=int, default=None, help="default 512 MiB (quick 64)")
    parser.add_argument("--budget", type=float, default=None, help="seconds per memcpy figure")
    parser.add_argument("--tcp-bytes", type=int, default=None, help="bytes sent for bandwidth")
    parser.add_argument("--rounds", type=int, default=None, help="ping-pong round trips")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    max_bytes = args.max_bytes or ((64 << 20) if args.quick else (512 << 20))
    budget = args.budget or (0.1 if args.quick else 0.4)
    tcp_bytes = args.tcp_bytes or ((256 << 20) if args.quick else (2 << 30))
    rounds = args.rounds or (2000 if args.quick else 20000)
    sizes = []
    nbytes = args.min_bytes
    while nbytes <= max_bytes:
        sizes.append(nbytes)
        nbytes *= 4
    if sizes and sizes[-1] != max_bytes and max_bytes > args.min_bytes:
        sizes.append(max_bytes)
    record = calibrate(sizes, budget, tcp_bytes, rounds)
    print_figures(record)
    write_results(
        "calibrate",
        {"quick": args.quick, "cpu_model": cpu_model(), **record},
        args.json,
    )


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
