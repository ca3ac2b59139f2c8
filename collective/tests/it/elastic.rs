//! The job driver's elastic mode with real sockets and in-process workers: a failed task
//! leaves the job (the survivors' collectives fail with `MembershipChanged`, not an abort), the
//! survivors join the next round with dense ranks, tasks the launcher adds join a later round,
//! and the `min_np`/`elastic_timeout` and `reset_limit` bounds abort with messages naming them.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use kolo_collective::communicator::RankInfo;
use kolo_collective::control::host_updates::{ADDED, REMOVED};
use kolo_collective::control::{DriverConfig, DriverService, ElasticConfig, HostUpdate, WorkerEnv};
use kolo_collective::engine::{EngineConfig, Output, RawTensor, Submission};
use kolo_collective::wire::OpKind;
use kolo_collective::worker::Worker;
use kolo_collective::{AbortSignal, DType, Error};
use kolo_runtime::block_on;

use super::driver::{connect, register_all, task};

/// How long a collective may take here before the test calls it a hang.
const WAIT: Duration = Duration::from_secs(20);

fn elastic_driver(
    num_tasks: usize,
    elastic: ElasticConfig,
    heartbeat_timeout: Duration,
) -> (DriverService, DriverConfig) {
    let config = DriverConfig {
        start_timeout: Duration::from_secs(20),
        heartbeat_timeout,
        elastic: Some(elastic),
        ..DriverConfig::new(num_tasks)
    };
    (DriverService::start(config.clone()).unwrap(), config)
}

fn env(driver: &DriverService, config: &DriverConfig, task_index: u32, host: &str) -> WorkerEnv {
    WorkerEnv {
        driver_addr: driver.addr().to_string(),
        secret: config.secret.clone(),
        job_id: config.job_id,
        task_index,
        num_tasks: config.num_tasks as u32,
        start_timeout: config.start_timeout,
        hostname: Some(host.to_owned()),
        host_hash_salt: None,
        data_addr: None,
    }
}

fn join(env: &WorkerEnv) -> Worker {
    Worker::join(env, EngineConfig::default()).unwrap()
}

/// An f32 sum allreduce of `values` named `name` on `worker`; waits at most [`WAIT`].
fn allreduce(worker: &Worker, name: &str, values: &[f32]) -> Result<Vec<f32>, Error> {
    let mut bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut sub = Submission::new(OpKind::Allreduce, name);
    sub.dtype = DType::F32;
    sub.shape = vec![values.len() as i64];
    // SAFETY: `bytes` outlives the op (waited for below).
    sub.tensor = unsafe { RawTensor::new(bytes.as_mut_ptr(), bytes.len()) };
    let engine = worker.engine();
    let handle = engine.submit(sub)?;
    match engine.wait(handle, WAIT).expect("no hang") {
        Ok(Output::Done) => Ok(bytes
            .chunks(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()),
        Ok(other) => panic!("an allreduce returned {other:?}"),
        Err(err) => Err(err),
    }
}

/// The host updates `worker` drained until one said "added" (at most 10 s).
fn wait_for_added(worker: &Worker) -> Vec<HostUpdate> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    while !seen.iter().any(|u: &HostUpdate| u.result == ADDED) {
        assert!(Instant::now() < deadline, "no 'added' update: {seen:?}");
        seen.extend(worker.take_host_updates());
        std::thread::sleep(Duration::from_millis(10));
    }
    seen
}

/// Joins the job's next round, sums `value(rank)` over it in an allreduce named "after", leaves.
fn join_and_allreduce(env: &WorkerEnv, value: impl Fn(usize) -> f32) -> (RankInfo, Vec<f32>) {
    let worker = join(env);
    let info = worker.info().clone();
    let sum = allreduce(&worker, "after", &[value(info.rank)]).unwrap();
    worker.shutdown();
    (info, sum)
}

fn elastic(min_np: usize, max_np: usize) -> ElasticConfig {
    ElasticConfig {
        elastic_timeout: Duration::from_secs(20),
        ..ElasticConfig::new(min_np, max_np)
    }
}

#[test]
fn a_failed_task_leaves_and_the_survivors_reset_into_a_dense_smaller_round() {
    let (driver, config) = elastic_driver(3, elastic(2, 4), Duration::from_secs(30));
    let envs = [
        env(&driver, &config, 0, "host-a"),
        env(&driver, &config, 1, "host-b"),
        env(&driver, &config, 2, "host-a"),
    ];
    // The three workers and this thread.
    let joined = Barrier::new(4);
    let pending = Barrier::new(4);
    let reported = std::sync::Mutex::new(None::<Instant>);
    let outcomes: Vec<_> = std::thread::scope(|scope| {
        let workers: Vec<_> = envs
            .iter()
            .enumerate()
            .map(|(task, env)| {
                let (joined, pending) = (&joined, &pending);
                scope.spawn(move || {
                    let worker = join(env);
                    let info = worker.info().clone();
                    let sum = allreduce(&worker, "first", &[info.rank as f32 + 1.0]).unwrap();
                    joined.wait();
                    pending.wait();
                    if task == 2 {
                        // The "dead" task: the driver removes it; its own next collective
                        // fails as an abort (it is out of the job), not as a reset.
                        let err = allreduce(&worker, "after removal", &[1.0]).unwrap_err();
                        worker.shutdown();
                        return (info, sum, Err::<(), _>(err), Vec::new(), None);
                    }
                    // Pending when the driver learns task 2 failed: fails at once.
                    let err = allreduce(&worker, "second", &[1.0]).unwrap_err();
                    let failed_at = Instant::now();
                    let updates = worker.take_host_updates();
                    worker.shutdown();
                    let again = join(env);
                    let next = again.info().clone();
                    let sum2 = allreduce(&again, "on the new mesh", &[10.0 * (task as f32 + 1.0)])
                        .unwrap();
                    again.shutdown();
                    (next, sum2, Err(err), updates, Some(failed_at))
                })
            })
            .collect();
        joined.wait();
        pending.wait();
        // Let the survivors' "second" allreduce be in flight, then report task 2's exit as a
        // launcher would.
        std::thread::sleep(Duration::from_millis(300));
        *reported.lock().unwrap() = Some(Instant::now());
        driver.report_task_failure(2, "exited with code 137 (killed by signal 9)");
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let reported = reported.lock().unwrap().unwrap();
    assert!(
        driver.abort_cause().is_none(),
        "an elastic job is not aborted by one failure: {:?}",
        driver.abort_cause()
    );
    assert_eq!(driver.live_tasks(), vec![0, 1]);
    assert_eq!(driver.resets(), 1);
    for (task, (info, sum, err, updates, failed_at)) in outcomes.iter().enumerate() {
        let err = err.as_ref().unwrap_err();
        if task == 2 {
            assert!(matches!(err, Error::Aborted(_)), "task 2: {err:?}");
            assert!(err.to_string().contains("was removed"), "{err}");
            assert_eq!(sum, &[6.0], "the first round had 3 ranks");
            continue;
        }
        assert!(
            matches!(err, Error::MembershipChanged(_)),
            "task {task}: a reset, not an abort: {err:?}"
        );
        let text = err.to_string();
        // Task 2 was rank 1 (host-a holds ranks 0 and 1: tasks 0 and 2).
        assert!(text.contains("rank 1 on host host-a"), "{text}");
        assert!(text.contains("exited with code 137"), "{text}");
        let latency = failed_at.unwrap().duration_since(reported);
        assert!(
            latency < Duration::from_millis(500),
            "task {task} learned of the failure {latency:?} after the driver"
        );
        eprintln!("task {task}: pending allreduce failed {latency:?} after the report");
        assert!(
            updates.iter().any(|u| u.result == REMOVED),
            "task {task} got a 'removed' host update: {updates:?}"
        );
        // Dense ranks in the new round: task 0 (host-a) rank 0, task 1 (host-b) rank 1.
        assert_eq!(
            (info.rank, info.size, info.local_rank, info.local_size),
            (task, 2, 0, 1),
            "task {task}"
        );
        assert_eq!((info.cross_rank, info.cross_size), (task, 2), "task {task}");
        assert_eq!(sum, &[30.0], "10 + 20 on the new two-rank mesh");
    }
    driver.shutdown();
}

#[test]
fn a_task_the_launcher_adds_joins_the_next_round_and_the_others_see_added() {
    let (driver, config) = elastic_driver(3, elastic(2, 4), Duration::from_secs(30));
    let hosts = ["host-a", "host-b", "host-a", "host-c"];
    let envs: Vec<WorkerEnv> = hosts
        .iter()
        .enumerate()
        .map(|(task, host)| env(&driver, &config, task as u32, host))
        .collect();
    let first_round = Barrier::new(4);
    let results: Vec<_> = std::thread::scope(|scope| {
        let mut workers: Vec<_> = envs[..3]
            .iter()
            .map(|env| {
                let first_round = &first_round;
                scope.spawn(move || {
                    let worker = join(env);
                    assert_eq!(worker.info().size, 3);
                    allreduce(&worker, "before", &[1.0]).unwrap();
                    first_round.wait();
                    // check_host_updates() at the next commit: wait for "added", then reset.
                    wait_for_added(&worker);
                    worker.shutdown();
                    join_and_allreduce(env, |rank| 1.0 + rank as f32)
                })
            })
            .collect();
        first_round.wait();
        driver.add_tasks(&[3]).unwrap();
        let new_env = &envs[3];
        workers.push(scope.spawn(move || join_and_allreduce(new_env, |rank| 1.0 + rank as f32)));
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    assert!(driver.abort_cause().is_none(), "{:?}", driver.abort_cause());
    // Hosts keep their order (a, b), the new host c comes last.
    let ranks: Vec<_> = results
        .iter()
        .map(|(info, _)| (info.rank, info.size, info.local_rank, info.local_size))
        .collect();
    assert_eq!(
        ranks,
        [(0, 4, 0, 2), (2, 4, 0, 1), (1, 4, 1, 2), (3, 4, 0, 1)]
    );
    for (info, sum) in &results {
        assert_eq!(sum, &[10.0], "1+2+3+4 on rank {}", info.rank);
    }
    // More than max_np is refused.
    let err = driver.add_tasks(&[4]).unwrap_err();
    assert!(err.to_string().contains("max_np 4"), "{err}");
    driver.shutdown();
}

#[test]
fn a_silent_task_is_removed_and_the_others_are_interrupted_not_aborted() {
    let (driver, config) = elastic_driver(3, elastic(2, 3), Duration::from_millis(400));
    let joined = register_all(
        &driver,
        &config.secret,
        &[(0, "host-a"), (1, "host-b"), (2, "host-c")],
    );
    let signals: Vec<AbortSignal> = (0..3).map(|_| AbortSignal::new()).collect();
    // Tasks 0 and 1 heartbeat; task 2 never does.
    for (client, me) in &joined[..2] {
        client
            .start_background(me.rank, signals[me.rank as usize].clone())
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !(signals[0].is_aborted() && signals[1].is_aborted()) {
        assert!(Instant::now() < deadline, "the survivors were not told");
        std::thread::sleep(Duration::from_millis(10));
    }
    for signal in &signals[..2] {
        assert!(signal.is_interrupted(), "{:?}", signal.cause());
        let err = signal.error().unwrap();
        assert!(matches!(err, Error::MembershipChanged(_)), "{err:?}");
        assert!(
            err.to_string().contains("stopped sending heartbeats"),
            "{err}"
        );
    }
    assert!(driver.abort_cause().is_none(), "{:?}", driver.abort_cause());
    assert_eq!(driver.live_tasks(), vec![0, 1]);
    // The removed task cannot come back into the job under its old index.
    let late = connect(&driver, &config.secret);
    let err = block_on(late.register(&task(2, "host-c"), Duration::from_secs(5)))
        .unwrap()
        .unwrap_err();
    assert!(err.to_string().contains("not a live task"), "{err}");
    driver.shutdown();
}

#[test]
fn fewer_than_min_np_for_the_elastic_timeout_aborts_naming_both() {
    let elastic = ElasticConfig {
        elastic_timeout: Duration::from_secs(1),
        ..ElasticConfig::new(2, 3)
    };
    let (driver, config) = elastic_driver(2, elastic, Duration::from_secs(30));
    let joined = register_all(&driver, &config.secret, &[(0, "host-a"), (1, "host-b")]);
    let survivor = AbortSignal::new();
    joined[0].0.start_background(0, survivor.clone()).unwrap();
    let removed_at = Instant::now();
    assert!(driver
        .remove_task(1, "its host left the discovery output")
        .unwrap());
    // Task 0 resets and waits for a round that cannot reach min_np.
    let again = connect(&driver, &config.secret);
    let mut retry = task(0, "host-a");
    retry.data_addr.set_port(21_000);
    let err = block_on(again.register(&retry, Duration::from_secs(20)))
        .unwrap()
        .unwrap_err();
    let waited = removed_at.elapsed();
    let text = err.to_string();
    assert!(
        text.contains("only 1 of the minimum 2 processes (--min-np) were available for 1 s (--elastic-timeout)"),
        "{text}"
    );
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(4),
        "{waited:?}"
    );
    assert!(
        survivor.is_interrupted(),
        "the first round ended as a reset"
    );
    assert!(driver.abort_cause().unwrap().message.contains("--min-np"));
    driver.shutdown();
}

#[test]
fn the_reset_past_the_limit_aborts_naming_it() {
    let elastic = ElasticConfig {
        reset_limit: Some(1),
        ..elastic(1, 3)
    };
    let (driver, config) = elastic_driver(2, elastic, Duration::from_secs(30));
    register_all(&driver, &config.secret, &[(0, "host-a"), (1, "host-b")]);
    // The first reset is within the limit.
    driver.remove_task(1, "exited with code 1").unwrap();
    assert!(driver.abort_cause().is_none());
    let again = connect(&driver, &config.secret);
    let mut retry = task(0, "host-a");
    retry.data_addr.set_port(21_000);
    let me = block_on(again.register(&retry, Duration::from_secs(20)))
        .unwrap()
        .unwrap();
    assert_eq!((me.rank, me.size, me.generation), (0, 1, 1));
    assert_eq!(driver.resets(), 1);
    // The second one is past it: Horovod stops the job when reset_count >= reset_limit.
    driver.remove_task(0, "exited with code 1").unwrap();
    let cause = driver
        .abort_cause()
        .expect("aborted at the reset past the limit");
    assert!(
        cause
            .message
            .contains("exceeded its limit of 1 (--reset-limit 1)"),
        "{cause}"
    );
    driver.shutdown();
}

#[test]
fn elastic_bounds_are_checked_and_a_fixed_job_refuses_elastic_calls() {
    let bad = DriverConfig {
        elastic: Some(ElasticConfig::new(3, 2)),
        ..DriverConfig::new(2)
    };
    let err = DriverService::start(bad).unwrap_err();
    assert!(err.to_string().contains("min_np 3 and max_np 2"), "{err}");
    let outside = DriverConfig {
        elastic: Some(ElasticConfig::new(1, 2)),
        ..DriverConfig::new(3)
    };
    assert!(DriverService::start(outside).is_err());
    let fixed = DriverService::start(DriverConfig::new(1)).unwrap();
    assert!(matches!(fixed.add_tasks(&[1]), Err(Error::Config(_))));
    assert!(matches!(fixed.remove_task(0, "x"), Err(Error::Config(_))));
    fixed.shutdown();
}

/// Registers `tasks` for the next round (concurrently) and returns `(task, rank)` sorted by
/// rank.
fn next_round(driver: &DriverService, config: &DriverConfig, tasks: &[(u32, &str)]) -> Vec<u32> {
    next_round_after(driver, config, &[], tasks)
}

/// [`next_round`] where the tasks of `added` (just added with `add_tasks`) register first, as
/// they do in a job: the driver announces them when they register, and only then do the
/// running tasks of `running` reset and register.
fn next_round_after(
    driver: &DriverService,
    config: &DriverConfig,
    added: &[(u32, &str)],
    running: &[(u32, &str)],
) -> Vec<u32> {
    let joined = std::thread::scope(|scope| {
        let first = scope.spawn(|| register_all(driver, &config.secret, added));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !added
            .iter()
            .all(|(index, _)| driver.registered_tasks().contains(index))
        {
            assert!(
                Instant::now() < deadline,
                "the added tasks did not register"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut joined = register_all(driver, &config.secret, running);
        joined.extend(first.join().unwrap());
        joined
    });
    let tasks = added.len() + running.len();
    let mut by_rank: Vec<(u32, u32)> = joined
        .iter()
        .map(|(_, me)| (me.rank, me.peers[me.rank as usize].task_index))
        .collect();
    by_rank.sort();
    assert!(joined.iter().all(|(_, me)| me.size as usize == tasks));
    by_rank.into_iter().map(|(_, task)| task).collect()
}

#[test]
fn hosts_keep_their_order_across_rounds_and_a_host_that_left_comes_back_last() {
    let (driver, config) = elastic_driver(3, elastic(1, 4), Duration::from_secs(30));
    let round0 = next_round(
        &driver,
        &config,
        &[(0, "host-a"), (1, "host-b"), (2, "host-a")],
    );
    assert_eq!(round0, [0, 2, 1], "host-a (tasks 0, 2) first, then host-b");
    // Task 0 leaves; host-a keeps its place before host-b although task 1 is now the lowest.
    driver.remove_task(0, "exited").unwrap();
    let round1 = next_round(&driver, &config, &[(1, "host-b"), (2, "host-a")]);
    assert_eq!(round1, [2, 1]);
    // host-a's last task leaves and host-c joins: order b, c.
    driver.remove_task(2, "exited").unwrap();
    driver.add_tasks(&[3]).unwrap();
    let round2 = next_round_after(&driver, &config, &[(3, "host-c")], &[(1, "host-b")]);
    assert_eq!(round2, [1, 3]);
    // host-a comes back: it is a new host now, so it comes last.
    driver.add_tasks(&[4]).unwrap();
    let round3 = next_round_after(
        &driver,
        &config,
        &[(4, "host-a")],
        &[(1, "host-b"), (3, "host-c")],
    );
    assert_eq!(round3, [1, 3, 4]);
    assert_eq!(driver.resets(), 3);
    assert!(driver.abort_cause().is_none());
    driver.shutdown();
}

#[test]
fn an_added_task_is_announced_when_it_registers_and_one_that_never_does_is_dropped() {
    let config = DriverConfig {
        start_timeout: Duration::from_millis(1500),
        heartbeat_timeout: Duration::from_secs(30),
        elastic: Some(elastic(2, 4)),
        ..DriverConfig::new(2)
    };
    let driver = DriverService::start(config.clone()).unwrap();
    let envs: Vec<WorkerEnv> = ["host-a", "host-b", "host-c", "host-d"]
        .iter()
        .enumerate()
        .map(|(task, host)| env(&driver, &config, task as u32, host))
        .collect();
    let added = Barrier::new(3);
    let quiet = Barrier::new(3);
    let results: Vec<_> = std::thread::scope(|scope| {
        let mut workers: Vec<_> = envs[..2]
            .iter()
            .map(|env| {
                let (added, quiet) = (&added, &quiet);
                scope.spawn(move || {
                    let worker = join(env);
                    allreduce(&worker, "before", &[1.0]).unwrap();
                    added.wait();
                    // Tasks 2 and 3 were added but have not registered: the running ranks
                    // hear nothing and keep running collectives in their round.
                    std::thread::sleep(Duration::from_millis(300));
                    let early = worker.take_host_updates();
                    assert!(early.is_empty(), "announced before registering: {early:?}");
                    allreduce(&worker, "while joining", &[1.0]).unwrap();
                    quiet.wait();
                    let seen = wait_for_added(&worker);
                    worker.shutdown();
                    let (info, sum) = join_and_allreduce(env, |_| 1.0);
                    (info, sum, seen)
                })
            })
            .collect();
        added.wait();
        driver.add_tasks(&[2, 3]).unwrap();
        assert_eq!(driver.live_tasks(), vec![0, 1, 2, 3]);
        quiet.wait();
        assert_eq!(driver.resets(), 0, "nobody reset for a task still starting");
        let new_env = &envs[2];
        workers.push(scope.spawn(move || {
            let (info, sum) = join_and_allreduce(new_env, |_| 1.0);
            (info, sum, Vec::new())
        }));
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    for (info, sum, seen) in &results[..2] {
        assert_eq!(
            info.size, 3,
            "task 3 never registered: the round did not wait for it"
        );
        assert_eq!(sum, &[3.0]);
        assert_eq!(seen.len(), 1, "one update, for task 2: {seen:?}");
    }
    assert_eq!(results[2].0.size, 3);
    // Task 3 is dropped at the start timeout; nobody is interrupted for it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while driver.live_tasks() != vec![0, 1, 2] {
        assert!(
            Instant::now() < deadline,
            "task 3 was not dropped: {:?}",
            driver.live_tasks()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(driver.resets(), 1);
    assert!(driver.abort_cause().is_none(), "{:?}", driver.abort_cause());
    driver.shutdown();
}
