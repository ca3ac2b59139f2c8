//! When the engine starts cycles: an idle engine runs none, and a burst of ops submitted after
//! the caller computed for longer than the cycle time goes into one cycle (one fused
//! collective), on every rank.

use std::sync::{Arc, Barrier};
use std::thread::sleep;
use std::time::{Duration, Instant};

use kolo_collective::engine::deferral::BackgroundCycles;
use kolo_collective::engine::{Engine, EngineConfig, Output, RawTensor, Submission};
use kolo_collective::wire::OpKind;
use kolo_collective::DType;

use super::collectives::{with_meshes, with_ranks, Options};

const WAIT: Duration = Duration::from_secs(30);

/// The engine's counter `name` (panics naming it when there is none).
pub(crate) fn stat(engine: &Engine, name: &str) -> u64 {
    engine
        .stats()
        .into_iter()
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
        .unwrap_or_else(|| panic!("no counter {name}"))
}

/// Submits an in-place f32 allreduce of `values` named `name` on the global set.
fn allreduce(engine: &Engine, name: &str, values: &mut [f32]) -> u64 {
    allreduce_in(engine, 0, name, values)
}

/// Submits an in-place f32 allreduce of `values` named `name` on process set `set`.
fn allreduce_in(engine: &Engine, set: u32, name: &str, values: &mut [f32]) -> u64 {
    let mut sub = Submission::new(OpKind::Allreduce, name);
    sub.dtype = DType::F32;
    sub.shape = vec![values.len() as i64];
    sub.process_set = set;
    // SAFETY: the callers keep `values` alive and untouched until the handle completes.
    sub.tensor = unsafe { RawTensor::new(values.as_mut_ptr().cast(), values.len() * 4) };
    engine.submit(sub).expect("a valid submission")
}

/// The default configuration with these timers.
fn timers(cycle_time: Duration, submit_quiet_time: Duration) -> EngineConfig {
    EngineConfig {
        cycle_time,
        submit_quiet_time,
        ..EngineConfig::default()
    }
}

/// Waits for every handle in `handles`, each of which must succeed.
fn wait_all(engine: &Engine, handles: Vec<u64>) {
    for handle in handles {
        engine.wait(handle, WAIT).unwrap().unwrap();
    }
}

/// Cycles each of two ranks ran in 100 ms (100 cycle times of the default 1 ms) with nothing
/// submitted anywhere, after a warm-up allreduce, over meshes formed at once (`eager`) or on
/// demand.
fn idle_cycles(eager: bool) -> Vec<u64> {
    let barrier = Barrier::new(2);
    with_meshes(
        2,
        eager,
        Options::default(),
        &[],
        |_, _| {},
        |rank, comm| {
            let engine = Engine::start(Arc::new(comm), EngineConfig::default()).unwrap();
            let mut values = [rank as f32; 4];
            let handle = allreduce(&engine, "warm", &mut values);
            engine.wait(handle, WAIT).unwrap().unwrap();
            assert_eq!(values, [1.0; 4]);
            barrier.wait();
            let before = stat(&engine, "cycles");
            sleep(Duration::from_millis(100));
            let idle = stat(&engine, "cycles") - before;
            barrier.wait();
            engine.shutdown();
            idle
        },
    )
    .into_iter()
    .map(|idle| idle.expect("every rank is present"))
    .collect()
}

#[test]
fn an_idle_engine_runs_no_cycles() {
    // A cycle of the warm-up op may still end after the first barrier; no timed ones follow.
    for (rank, idle) in idle_cycles(true).into_iter().enumerate() {
        assert!(idle <= 1, "rank {rank} ran {idle} cycles while idle");
    }
}

#[test]
fn an_idle_engine_over_a_lazy_mesh_runs_no_cycles() {
    // Once a rank's acceptor has every connection it waits for (at once on the highest rank),
    // its thread ends and the engine's wake-up pipe from it reads end-of-stream: that is not
    // a peer starting a cycle (taken for one, it made both ranks cycle every millisecond,
    // each cycle costing the CPU time a training step's other rank needs: 30-50 cycles in these
    // 100 ms). The warm-up op's last cycle and the acceptor's last arrival may each still end
    // inside the window on a loaded machine.
    for (rank, idle) in idle_cycles(false).into_iter().enumerate() {
        assert!(idle <= 3, "rank {rank} ran {idle} cycles while idle");
    }
}

#[test]
fn a_burst_after_a_long_compute_goes_into_one_cycle() {
    const STEPS: usize = 4;
    const TENSORS: usize = 8;
    let config = timers(Duration::from_millis(50), Duration::from_millis(20));
    let barrier = Barrier::new(2);
    let collectives = with_ranks(2, |rank, comm| {
        let engine = Engine::start(Arc::new(comm), config.clone()).unwrap();
        let mut tensors = vec![[0f32; 4]; TENSORS];
        let names: Vec<String> = (0..TENSORS).map(|i| format!("grad.{i}")).collect();
        let mut counts = Vec::new();
        for step in 0..STEPS {
            barrier.wait();
            let before = stat(&engine, "collectives");
            // "Compute" for most of a cycle time since the last cycle, then submit the
            // gradients one by one, the burst running past the cycle time since that cycle
            // (a timer counted from the last cycle would fire inside it).
            sleep(Duration::from_millis(45));
            let mut handles = Vec::new();
            for (t, name) in tensors.iter_mut().zip(&names) {
                *t = [(rank + step) as f32; 4];
                handles.push(allreduce(&engine, name, t));
                sleep(Duration::from_millis(1));
            }
            wait_all(&engine, handles);
            let want = (2 * step + 1) as f32;
            assert!(tensors.iter().all(|t| *t == [want; 4]), "{tensors:?}");
            counts.push(stat(&engine, "collectives") - before);
        }
        engine.shutdown();
        counts
    });
    for (rank, counts) in collectives.into_iter().enumerate() {
        assert_eq!(
            counts, [1; STEPS],
            "rank {rank}: collectives per step (more than one: the burst was split)"
        );
    }
}

#[test]
fn a_burst_of_async_ops_wakes_the_engine_thread_once() {
    // Every wake-up of the engine thread is a context switch that, on a host with no spare
    // core, preempts the caller (or the other rank) computing: the thread only needs to learn
    // that the inbox is no longer empty, not of every op pushed after that.
    const OPS: usize = 16;
    let config = timers(Duration::from_secs(5), Duration::from_secs(5));
    let barrier = Barrier::new(2);
    let wakeups = with_ranks(2, |rank, comm| {
        let engine = Engine::start(Arc::new(comm), config.clone()).unwrap();
        let mut tensors = vec![[rank as f32; 4]; OPS];
        barrier.wait();
        let before = stat(&engine, "engine_wakeups");
        let mut handles = Vec::new();
        for (i, t) in tensors.iter_mut().enumerate() {
            handles.push(allreduce(&engine, &format!("burst.{i}"), t));
            // Long enough for a woken engine thread to run and wait again.
            sleep(Duration::from_millis(2));
        }
        let woke = stat(&engine, "engine_wakeups") - before;
        wait_all(&engine, handles);
        assert!(tensors.iter().all(|t| *t == [1.0; 4]), "{tensors:?}");
        engine.shutdown();
        woke
    });
    for (rank, woke) in wakeups.into_iter().enumerate() {
        assert!(
            woke <= 3,
            "rank {rank}'s engine thread woke {woke} times while {OPS} ops were submitted"
        );
    }
}

#[test]
fn a_peer_starting_a_cycle_does_not_wake_an_engine_with_ops_of_its_own_waiting() {
    // Rank 1's op waits in its inbox for the quiet time when rank 0 starts a cycle: that
    // changes nothing for rank 1 (its op starts at the quiet time either way), so its engine
    // thread sleeps on. Woken, it took a core from whoever computed there, often the other
    // rank (2 ranks of 10 async ops per step: 250-400 us per step, 110 us without).
    let config = timers(Duration::from_secs(5), Duration::from_millis(200));
    let barrier = Barrier::new(2);
    let wakeups = with_ranks(2, |rank, comm| {
        let engine = Engine::start(Arc::new(comm), config.clone()).unwrap();
        // A warm-up op: the start-up cycles are over on both ranks.
        let mut values = [rank as f32; 4];
        let handle = allreduce(&engine, "warm", &mut values);
        engine.wait(handle, WAIT).unwrap().unwrap();
        barrier.wait();
        let mut values = [rank as f32; 4];
        let mut woke = 0;
        if rank == 1 {
            let seen = stat(&engine, "engine_wakeups");
            let handle = allreduce(&engine, "late", &mut values);
            // The thread has taken the submission's wake-up (and looked at the inbox) before
            // rank 0 starts.
            let deadline = Instant::now() + WAIT;
            while stat(&engine, "engine_wakeups") == seen {
                assert!(
                    Instant::now() < deadline,
                    "the submission never woke the engine"
                );
                sleep(Duration::from_millis(1));
            }
            sleep(Duration::from_millis(10));
            let before = stat(&engine, "engine_wakeups_by_peers");
            barrier.wait();
            sleep(Duration::from_millis(50));
            woke = stat(&engine, "engine_wakeups_by_peers") - before;
            engine.wait(handle, WAIT).unwrap().unwrap();
        } else {
            barrier.wait();
            let handle = allreduce(&engine, "late", &mut values);
            engine.wait(handle, WAIT).unwrap().unwrap();
        }
        assert_eq!(values, [1.0; 4]);
        engine.shutdown();
        woke
    });
    assert_eq!(
        wakeups[1], 0,
        "rank 1's engine thread was woken by rank 0's start while its op waited for the quiet \
         time (wake-ups by peers: {wakeups:?})"
    );
}

#[test]
fn ops_waiting_for_a_late_rank_run_no_timed_cycles() {
    // Rank 0's gradients are ready 100 ms before rank 1's (as when one rank computes faster).
    // The cycle of rank 0's submission negotiates them; more cycles before rank 1 submits
    // would decide nothing (the coordinator keeps what rank 0 sent, and rank 1's submission
    // starts the cycle that runs them). Timed every cycle time, as before, they made both
    // ranks cycle every millisecond or two (50-100 cycles in these 100 ms), each costing the
    // CPU time the late rank needs for its compute.
    const TENSORS: usize = 8;
    let barrier = Barrier::new(2);
    let cycles = with_ranks(2, |rank, comm| {
        let engine = Engine::start(Arc::new(comm), EngineConfig::default()).unwrap();
        let mut warm = [rank as f32; 4];
        let handle = allreduce(&engine, "warm", &mut warm);
        engine.wait(handle, WAIT).unwrap().unwrap();
        barrier.wait();
        let before = stat(&engine, "cycles");
        let mut tensors = vec![[rank as f32 + 1.0; 4]; TENSORS];
        let submit = |tensors: &mut [[f32; 4]]| -> Vec<u64> {
            tensors
                .iter_mut()
                .enumerate()
                .map(|(i, t)| allreduce(&engine, &format!("grad.{i}"), t))
                .collect()
        };
        let mut handles = if rank == 0 {
            submit(&mut tensors)
        } else {
            Vec::new()
        };
        sleep(Duration::from_millis(100));
        let waiting = stat(&engine, "cycles") - before;
        barrier.wait();
        if rank == 1 {
            handles = submit(&mut tensors);
        }
        wait_all(&engine, handles);
        assert!(tensors.iter().all(|t| *t == [3.0; 4]), "{tensors:?}");
        engine.shutdown();
        waiting
    });
    // Rank 0's submission's cycle (rank 1 joins it after its grace), and on a loaded machine
    // the warm-up's last cycle ending inside the window.
    for (rank, waiting) in cycles.into_iter().enumerate() {
        assert!(
            waiting <= 3,
            "rank {rank} ran {waiting} cycles while rank 0's ops waited for rank 1"
        );
    }
}

#[test]
fn a_rank_outside_a_process_set_does_not_slow_its_ops_while_it_idles() {
    // Every cycle starts with the global set's exchange, so rank 2, idle outside the set {0, 1},
    // must join the cycles that run that set's ops. It joins with nothing after
    // PEER_JOIN_GRACE: a grace of 50 ms made every op of the set take 50 ms (1-3 ms at 1 ms).
    const OPS: usize = 20;
    let barrier = Barrier::new(3);
    let medians = with_ranks(3, |rank, comm| {
        let engine = Engine::start(Arc::new(comm), EngineConfig::default()).unwrap();
        let handle = engine.add_process_set(&[0, 1], true).unwrap();
        let set = match engine.wait(handle, WAIT).unwrap().unwrap() {
            Output::ProcessSet(id) => id,
            other => panic!("{other:?}"),
        };
        barrier.wait();
        let mut took = Vec::new();
        if rank < 2 {
            for i in 0..OPS {
                let mut x = [rank as f32 + 1.0; 4];
                let started = Instant::now();
                let handle = allreduce_in(&engine, set, &format!("pair.{}", i % 3), &mut x);
                engine.wait(handle, WAIT).unwrap().unwrap();
                took.push(started.elapsed());
                assert_eq!(x, [3.0; 4]);
            }
        }
        barrier.wait();
        engine.shutdown();
        took.sort();
        took.get(OPS / 2).copied()
    });
    for (rank, median) in medians.iter().enumerate().take(2) {
        let median = median.unwrap();
        assert!(
            median < Duration::from_millis(25),
            "rank {rank}: the set's ops took {median:?} (median) while rank 2 idled"
        );
    }
}

/// Spins this thread and a helper for `wall` (a rank computing on two threads, as torch may:
/// on a loaded host two ranks' four spinning threads still keep half a core busy at every
/// look), polling `handle` every millisecond when given; returns whether the rank's op ran
/// meanwhile (its `collectives` counter moved, or the poll saw the handle done) and when.
fn compute(engine: &Engine, wall: Duration, poll: Option<u64>) -> Option<Duration> {
    let start = Instant::now();
    let _helper = Spinner::start();
    let before = stat(engine, "collectives");
    let mut next_poll = start;
    while start.elapsed() < wall {
        std::hint::spin_loop();
        if let Some(handle) = poll.filter(|_| Instant::now() >= next_poll) {
            next_poll += Duration::from_millis(1);
            if engine.poll(handle).unwrap() {
                return Some(start.elapsed());
            }
        }
        if stat(engine, "collectives") != before {
            return Some(start.elapsed());
        }
    }
    None
}

/// A thread that spins until it is dropped.
struct Spinner {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Spinner {
    fn start() -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Each rank submits an allreduce, then computes for 60 ms (polling it when `poll`), then
/// waits for it: per rank, when the op ran during the compute (if it did), and the engine
/// thread's deferrals and wake-ups meanwhile.
fn submit_then_compute(config: &EngineConfig, poll: bool) -> Vec<(Option<Duration>, u64, u64)> {
    let barrier = Barrier::new(2);
    with_ranks(2, |rank, comm| {
        let engine = Engine::start(Arc::new(comm), config.clone()).unwrap();
        let mut values = [rank as f32; 4];
        let handle = allreduce(&engine, "warm", &mut values);
        engine.wait(handle, WAIT).unwrap().unwrap();
        barrier.wait();
        let (deferrals, wakeups) = (
            stat(&engine, "engine_deferrals"),
            stat(&engine, "engine_wakeups"),
        );
        let mut values = [rank as f32; 4];
        let handle = allreduce(&engine, "step", &mut values);
        let ran = compute(&engine, Duration::from_millis(60), poll.then_some(handle));
        let deferred = stat(&engine, "engine_deferrals") - deferrals;
        let woke = stat(&engine, "engine_wakeups") - wakeups;
        engine.wait(handle, WAIT).unwrap().unwrap();
        assert_eq!(values, [1.0; 4]);
        engine.shutdown();
        (ran, deferred, woke)
    })
}

#[test]
fn a_lazy_engine_leaves_a_computing_ranks_ops_to_its_caller() {
    // Without a spare core, an engine-thread cycle during the compute takes a core from it
    // (and wakes the other rank to join): the op waits for its caller's wait instead.
    let config = EngineConfig {
        background_cycles: BackgroundCycles::Lazy,
        ..EngineConfig::default()
    };
    // A host so loaded that the computing threads got less than half a core between two
    // looks rightly ends the deferral; an engine that does not defer runs the op every time.
    let mut results = submit_then_compute(&config, false);
    for _ in 0..3 {
        if results.iter().all(|(ran, ..)| ran.is_none()) {
            break;
        }
        results = submit_then_compute(&config, false);
    }
    for (rank, (ran, deferred, woke)) in results.into_iter().enumerate() {
        assert_eq!(ran, None, "rank {rank}: the op ran while its rank computed");
        // Woken for the submission and again at the quiet time, the thread looked and
        // deferred (on a loaded host it may not have run at all within the 60 ms).
        assert!(
            woke < 2 || deferred >= 1,
            "rank {rank}: the engine thread woke {woke} times and never deferred"
        );
    }
    // A caller that polls rather than waits gets its op started at once.
    for (rank, (ran, _, _)) in submit_then_compute(&config, true).into_iter().enumerate() {
        let ran = ran.unwrap_or_else(|| panic!("rank {rank}: a polled op waited out the compute"));
        assert!(
            ran < Duration::from_millis(50),
            "rank {rank}: polled op ran after {ran:?}"
        );
    }
}

#[test]
fn an_eager_engine_runs_a_computing_ranks_ops_in_the_background() {
    let config = EngineConfig {
        background_cycles: BackgroundCycles::Eager,
        ..EngineConfig::default()
    };
    for (rank, (ran, deferred, _)) in submit_then_compute(&config, false).into_iter().enumerate() {
        assert!(ran.is_some(), "rank {rank}: the op waited for its caller");
        assert_eq!(deferred, 0, "rank {rank}");
    }
}
