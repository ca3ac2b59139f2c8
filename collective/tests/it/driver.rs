//! The job driver service and its client, over real gRPC on 127.0.0.1.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kolo_collective::control::host_hash::host_hash_for;
use kolo_collective::control::{
    self, ClientOptions, DriverClient, DriverConfig, DriverService, JobSecret, Registration,
    TaskInfo, WorkerEnv,
};
use kolo_collective::{AbortCause, AbortSignal, Error};
use kolo_runtime::block_on;

pub(crate) fn config(num_tasks: usize) -> DriverConfig {
    DriverConfig {
        start_timeout: Duration::from_secs(20),
        ..DriverConfig::new(num_tasks)
    }
}

pub(crate) fn fast() -> ClientOptions {
    ClientOptions {
        connect_timeout: Duration::from_secs(5),
        heartbeat_interval: Duration::from_millis(100),
        lost_after: Duration::from_secs(1),
    }
}

pub(crate) fn task(index: u32, host: &str) -> TaskInfo {
    TaskInfo {
        task_index: index,
        host_hash: host_hash_for(host, "ns", None),
        hostname: host.to_owned(),
        data_addr: SocketAddr::from(([127, 0, 0, 1], 20_000 + index as u16)),
        pid: 1_000 + index,
        generation: 0,
    }
}

pub(crate) fn connect(driver: &DriverService, secret: &JobSecret) -> DriverClient {
    block_on(DriverClient::connect(
        &driver.addr().to_string(),
        secret,
        fast(),
    ))
    .unwrap()
    .unwrap()
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Registers every `(index, host)` concurrently; results in the same order.
pub(crate) fn register_all(
    driver: &DriverService,
    secret: &JobSecret,
    tasks: &[(u32, &str)],
) -> Vec<(DriverClient, Registration)> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = tasks
            .iter()
            .map(|&(index, host)| {
                scope.spawn(move || {
                    let client = connect(driver, secret);
                    let me = block_on(client.register(&task(index, host), Duration::from_secs(20)))
                        .unwrap()
                        .unwrap();
                    (client, me)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn a_worker_with_another_secret_is_refused_and_the_right_one_works() {
    let config = config(1);
    let secret = config.secret.clone();
    let driver = DriverService::start(config).unwrap();

    let err = block_on(DriverClient::connect(
        &driver.addr().to_string(),
        &JobSecret::generate(),
        fast(),
    ))
    .unwrap()
    .unwrap_err();
    assert!(matches!(err, Error::Rendezvous(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("could not prove it knows this job's secret"),
        "{err}"
    );
    assert!(driver.assignment().is_none());

    let client = connect(&driver, &secret);
    block_on(client.kv_put("k", b"v".to_vec()))
        .unwrap()
        .unwrap();
    assert_eq!(driver.kv_value("k").as_deref(), Some(&b"v"[..]));
}

#[test]
fn three_tasks_on_two_hosts_get_consecutive_ranks() {
    let config = config(3);
    let secret = config.secret.clone();
    let job_id = config.job_id;
    let driver = DriverService::start(config).unwrap();
    // Task 0 and 2 on host a, task 1 on host b: a gets ranks 0 and 1, b gets rank 2.
    let joined = register_all(&driver, &secret, &[(0, "a"), (1, "b"), (2, "a")]);
    let got: Vec<_> = joined
        .iter()
        .map(|(_, r)| {
            (
                r.rank,
                r.size,
                r.local_rank,
                r.local_size,
                r.cross_rank,
                r.cross_size,
            )
        })
        .collect();
    assert_eq!(
        got,
        [(0, 3, 0, 2, 0, 2), (2, 3, 0, 1, 1, 2), (1, 3, 1, 2, 0, 1)]
    );
    let me = &joined[1].1;
    assert_eq!(me.job_id, job_id);
    let peers: Vec<_> = me
        .peers
        .iter()
        .map(|p| {
            (
                p.rank,
                p.task_index,
                p.hostname.as_str(),
                p.data_addr.port(),
            )
        })
        .collect();
    assert_eq!(
        peers,
        [
            (0, 0, "a", 20_000),
            (1, 2, "a", 20_002),
            (2, 1, "b", 20_001)
        ]
    );
    assert_eq!(me.peers[2].host_hash, host_hash_for("b", "ns", None));
    let assignment = driver.assignment().unwrap();
    let ranks: Vec<u32> = assignment.iter().map(|a| a.rank).collect();
    assert_eq!(ranks, [0, 2, 1]);
    assert_eq!(assignment[1].hostname, "b");
    assert_eq!(assignment[1].pid, 1_001);
}

/// Registers `task(index, host)` for round `generation` with data port `port`, in a thread.
fn register_round(
    driver: &DriverService,
    secret: &JobSecret,
    index: u32,
    generation: u32,
    port: u16,
) -> std::thread::JoinHandle<kolo_collective::Result<Registration>> {
    let client = connect(driver, secret);
    let info = TaskInfo {
        generation,
        data_addr: SocketAddr::from(([127, 0, 0, 1], port)),
        ..task(index, "a")
    };
    std::thread::spawn(move || block_on(client.register(&info, Duration::from_secs(20)))?)
}

#[test]
fn tasks_that_init_again_register_for_the_next_round() {
    let config = config(2);
    let secret = config.secret.clone();
    let driver = DriverService::start(config).unwrap();
    let first: Vec<Registration> = [(0, 21_000), (1, 21_001)]
        .map(|(index, port)| register_round(&driver, &secret, index, 0, port))
        .into_iter()
        .map(|waiter| waiter.join().unwrap().unwrap())
        .collect();
    assert_eq!(first[0].peers[1].data_addr.port(), 21_001);

    // Task 1 calls init() again first: round 1 opens and waits for task 0.
    let again = register_round(&driver, &secret, 1, 1, 22_001);
    wait_until(
        "task 1 registered for round 1",
        Duration::from_secs(5),
        || driver.registered_tasks() == [1],
    );
    std::thread::sleep(Duration::from_millis(200));
    assert!(!again.is_finished(), "round 1 completed without task 0");
    assert_eq!(
        driver.assignment().unwrap()[1].data_addr.port(),
        21_001,
        "the latest completed round's assignment stays visible"
    );
    // A registration for a finished round, or one that skips a round, is refused.
    for stale in [0, 2] {
        let err = register_round(&driver, &secret, 0, stale, 23_000)
            .join()
            .unwrap()
            .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("registration round 1"), "{text}");
        assert!(text.contains("init() and shutdown() alike"), "{text}");
    }
    let zero = register_round(&driver, &secret, 0, 1, 22_000)
        .join()
        .unwrap()
        .unwrap();
    let one = again.join().unwrap().unwrap();
    for (me, before) in [(&zero, &first[0]), (&one, &first[1])] {
        assert_eq!((me.rank, me.size), (before.rank, before.size));
        assert_eq!(me.job_id, before.job_id);
        let ports: Vec<u16> = me.peers.iter().map(|p| p.data_addr.port()).collect();
        assert_eq!(ports, [22_000, 22_001], "round 1 carries the new addresses");
    }
    assert_eq!(driver.assignment().unwrap()[0].data_addr.port(), 22_000);
    assert!(driver.abort_cause().is_none());
}

#[test]
fn a_round_opened_by_init_again_times_out_when_a_task_never_joins() {
    let config = DriverConfig {
        start_timeout: Duration::from_secs(1),
        ..DriverConfig::new(2)
    };
    let secret = config.secret.clone();
    let driver = DriverService::start(config).unwrap();
    let round0 = [
        register_round(&driver, &secret, 0, 0, 24_000),
        register_round(&driver, &secret, 1, 0, 24_001),
    ];
    for waiter in round0 {
        waiter.join().unwrap().unwrap();
    }
    // Later than the first round's start deadline: round 1 has its own.
    std::thread::sleep(Duration::from_millis(1_200));
    let started = Instant::now();
    let err = register_round(&driver, &secret, 0, 1, 25_000)
        .join()
        .unwrap()
        .unwrap_err();
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(800) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("register with the job driver again"),
        "{text}"
    );
    assert!(text.contains("missing task indices: [1]"), "{text}");
    assert!(
        driver.abort_cause().is_some(),
        "a timed-out round aborts the job"
    );
}

#[test]
fn start_timeout_names_the_missing_tasks() {
    let config = DriverConfig {
        start_timeout: Duration::from_secs(1),
        ..DriverConfig::new(2)
    };
    let secret = config.secret.clone();
    let driver = DriverService::start(config).unwrap();
    let client = connect(&driver, &secret);
    let started = Instant::now();
    let err = block_on(client.register(&task(0, "a"), Duration::from_secs(1)))
        .unwrap()
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let text = err.to_string();
    assert!(matches!(err, Error::Rendezvous(_)), "{err:?}");
    assert!(text.contains("1 of 2 registered"), "{text}");
    assert!(text.contains("missing task indices: [1]"), "{text}");
    assert!(
        text.contains("hvd.init()") && text.contains("--start-timeout"),
        "{text}"
    );
    // The job is aborted with the same explanation, and latecomers are refused.
    assert!(driver.abort_cause().unwrap().message.contains("1 of 2"));
    let late = block_on(client.register(&task(1, "a"), Duration::from_secs(1)))
        .unwrap()
        .unwrap_err();
    assert!(late.to_string().contains("1 of 2"), "{late}");
}

#[test]
fn duplicate_task_index_is_refused() {
    let config = config(2);
    let secret = config.secret.clone();
    let driver = DriverService::start(config).unwrap();
    let first = connect(&driver, &secret);
    let waiting = std::thread::spawn(move || {
        block_on(first.register(&task(0, "a"), Duration::from_secs(20))).unwrap()
    });
    wait_until("task 0 registered", Duration::from_secs(5), || {
        driver.registered_tasks() == [0]
    });
    let second = connect(&driver, &secret);
    let impostor = TaskInfo {
        pid: 4242,
        ..task(0, "b")
    };
    let err = block_on(second.register(&impostor, Duration::from_secs(5)))
        .unwrap()
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("task index 0 is already registered"),
        "{text}"
    );
    assert!(text.contains("KOLO_TASK_INDEX"), "{text}");
    // The same registration again (a retried call) is not a duplicate: it waits like the first.
    let retry_client = connect(&driver, &secret);
    let retried = std::thread::spawn(move || {
        block_on(retry_client.register(&task(0, "a"), Duration::from_secs(20))).unwrap()
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(!retried.is_finished());
    // Out of range too.
    let client = connect(&driver, &secret);
    let err = block_on(client.register(&task(7, "a"), Duration::from_secs(5)))
        .unwrap()
        .unwrap_err();
    assert!(err.to_string().contains("out of range"), "{err}");
    driver.shutdown();
    for waiter in [waiting, retried] {
        let err = waiter.join().unwrap().unwrap_err();
        assert!(err.to_string().contains("shut down"), "{err}");
    }
}

#[test]
fn kv_put_get_and_get_timeout() {
    let config = config(1);
    let secret = config.secret.clone();
    let driver = DriverService::start(config).unwrap();
    let client = connect(&driver, &secret);
    block_on(client.kv_put("nccl-id", vec![1, 2, 3]))
        .unwrap()
        .unwrap();
    assert_eq!(
        block_on(client.kv_get("nccl-id", Duration::from_secs(1)))
            .unwrap()
            .unwrap(),
        [1, 2, 3]
    );

    let started = Instant::now();
    let err = block_on(client.kv_get("never", Duration::from_millis(200)))
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    assert!(err.to_string().contains("\"never\""), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3));

    // A get waits for a later put.
    let reader = client.clone();
    let waiting = std::thread::spawn(move || {
        block_on(reader.kv_get("later", Duration::from_secs(10))).unwrap()
    });
    std::thread::sleep(Duration::from_millis(200));
    driver.kv_put("later", b"here".to_vec()).unwrap();
    assert_eq!(waiting.join().unwrap().unwrap(), b"here");
}

#[test]
fn abort_broadcast_reaches_every_watcher_within_a_second() {
    let config = config(2);
    let secret = config.secret.clone();
    let driver = DriverService::start(config).unwrap();
    let joined = register_all(&driver, &secret, &[(0, "a"), (1, "b")]);
    let signals: Vec<AbortSignal> = joined
        .iter()
        .map(|(client, me)| {
            let signal = AbortSignal::new();
            client.start_background(me.rank, signal.clone()).unwrap();
            signal
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300)); // Let the watchers open their streams.
    let cause = AbortCause {
        rank: Some(1),
        host: "b".into(),
        message: "killed by signal 9 (SIGKILL)".into(),
    };
    let sent = Instant::now();
    assert!(driver.abort(cause.clone()));
    assert!(!driver.abort(AbortCause {
        rank: None,
        host: String::new(),
        message: "second".into()
    }));
    wait_until("every worker saw the abort", Duration::from_secs(1), || {
        signals.iter().all(AbortSignal::is_aborted)
    });
    eprintln!("abort reached every watcher in {:?}", sent.elapsed());
    for signal in &signals {
        assert_eq!(signal.cause().unwrap(), cause);
    }
    assert_eq!(driver.abort_cause().unwrap(), cause);
}

#[test]
fn failure_report_aborts_the_job_with_its_message() {
    let config = config(2);
    let secret = config.secret.clone();
    let driver = DriverService::start(config).unwrap();
    let mut failures = driver.failures();
    let joined = register_all(&driver, &secret, &[(0, "a"), (1, "b")]);
    let signal = AbortSignal::new();
    joined[0].0.start_background(0, signal.clone()).unwrap();
    block_on(joined[1].0.report_failure(1, "CUDA out of memory"))
        .unwrap()
        .unwrap();
    let cause = block_on(async { failures.wait_for(Option::is_some).await.unwrap().clone() })
        .unwrap()
        .unwrap();
    assert_eq!(
        cause,
        AbortCause {
            rank: Some(1),
            host: "b".into(),
            message: "CUDA out of memory".into()
        }
    );
    wait_until("rank 0 saw the abort", Duration::from_secs(2), || {
        signal.is_aborted()
    });
    assert_eq!(signal.cause().unwrap(), cause);
}

/// A 2-task job with heartbeat timeout `timeout`: task 0 (host "alive-host") heartbeats with
/// the returned signal, task 1 (host "silent-host") registered and never heartbeats.
fn alive_and_silent(
    timeout: Duration,
) -> (
    DriverService,
    Vec<(DriverClient, Registration)>,
    AbortSignal,
) {
    let config = DriverConfig {
        heartbeat_timeout: timeout,
        ..config(2)
    };
    let secret = config.secret.clone();
    let driver = DriverService::start(config).unwrap();
    let joined = register_all(&driver, &secret, &[(0, "alive-host"), (1, "silent-host")]);
    let signal = AbortSignal::new();
    joined[0]
        .0
        .start_background(joined[0].1.rank, signal.clone())
        .unwrap();
    (driver, joined, signal)
}

#[test]
fn a_silent_worker_gets_the_job_aborted_naming_it() {
    // Only rank 0 runs its heartbeat; rank 1 (task 1, host "silent-host") never sends one.
    let (driver, _joined, signal) = alive_and_silent(Duration::from_secs(1));
    wait_until(
        "the driver gave up on rank 1",
        Duration::from_secs(5),
        || driver.abort_cause().is_some(),
    );
    let cause = driver.abort_cause().unwrap();
    assert_eq!(cause.rank, Some(1));
    assert_eq!(cause.host, "silent-host");
    assert!(cause.message.contains("heartbeats"), "{}", cause.message);
    wait_until("rank 0 saw the abort", Duration::from_secs(2), || {
        signal.is_aborted()
    });
    assert_eq!(signal.cause().unwrap(), cause);
}

#[test]
fn a_worker_that_leaves_is_not_missed() {
    let config = DriverConfig {
        heartbeat_timeout: Duration::from_millis(500),
        ..config(1)
    };
    let secret = config.secret.clone();
    let driver = DriverService::start(config).unwrap();
    let joined = register_all(&driver, &secret, &[(0, "a")]);
    block_on(joined[0].0.leave(0)).unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(driver.abort_cause(), None);
}

#[test]
fn driver_shutdown_sets_lost_connection() {
    let config = config(1);
    let secret = config.secret.clone();
    let driver = DriverService::start(config).unwrap();
    let addr = driver.addr();
    let joined = register_all(&driver, &secret, &[(0, "a")]);
    let signal = AbortSignal::new();
    joined[0].0.start_background(0, signal.clone()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    driver.shutdown();
    wait_until("the worker noticed", Duration::from_secs(5), || {
        signal.is_aborted()
    });
    let cause = signal.cause().unwrap();
    assert_eq!(cause.rank, None);
    assert!(
        cause
            .message
            .starts_with(&format!("lost connection to the job driver at {addr}")),
        "{}",
        cause.message
    );
}

#[test]
fn unreachable_driver_is_a_rendezvous_error_naming_it() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let options = ClientOptions {
        connect_timeout: Duration::from_millis(500),
        ..ClientOptions::default()
    };
    let err = block_on(DriverClient::connect(
        &addr,
        &JobSecret::generate(),
        options,
    ))
    .unwrap()
    .unwrap_err();
    assert!(matches!(err, Error::Rendezvous(_)), "{err:?}");
    assert!(err.to_string().contains(&addr), "{err}");
}

#[test]
fn join_job_from_the_environment() {
    let config = config(2);
    let driver = DriverService::start(config.clone()).unwrap();
    let env = |task_index: u32, hostname: &str| WorkerEnv {
        driver_addr: driver.addr().to_string(),
        secret: config.secret.clone(),
        job_id: config.job_id,
        task_index,
        num_tasks: 2,
        start_timeout: Duration::from_secs(20),
        hostname: Some(hostname.to_owned()),
        host_hash_salt: None,
        data_addr: None,
    };
    let envs = [env(0, "localhost"), env(1, "127.0.0.1")];
    let join_all = || -> Vec<_> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = envs
                .iter()
                .map(|env| {
                    scope.spawn(move || {
                        let ip = control::data_plane_ip(env).unwrap();
                        assert!(ip.is_loopback());
                        let listener = std::net::TcpListener::bind((ip, 0)).unwrap();
                        let signal = AbortSignal::new();
                        let (me, client) =
                            control::join_job(env, listener.local_addr().unwrap(), signal).unwrap();
                        (me, client, listener.local_addr().unwrap())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    let joined = join_all();
    // Two hosts (the hostname override differs), one rank each.
    assert_eq!((joined[0].0.rank, joined[1].0.rank), (0, 1));
    assert_eq!(
        (
            joined[1].0.cross_rank,
            joined[1].0.cross_size,
            joined[1].0.local_size
        ),
        (1, 2, 1)
    );
    assert_eq!(joined[0].0.peers[1].data_addr, joined[1].2);
    assert_eq!(joined[0].0.peers[1].hostname, "127.0.0.1");
    for (me, client, _) in &joined {
        block_on(client.leave(me.rank)).unwrap().unwrap();
    }
    // Both join again (init after shutdown): the next round, same ranks, new data addresses.
    let again = join_all();
    assert_eq!((again[0].0.rank, again[1].0.rank), (0, 1));
    assert_eq!(again[0].0.peers[1].data_addr, again[1].2);
    assert_eq!(again[1].0.peers[0].data_addr, again[0].2);
    assert_ne!(again[1].2, joined[1].2);
    for (me, client, _) in &again {
        block_on(client.leave(me.rank)).unwrap().unwrap();
    }
    // A worker whose KOLO_JOB_ID does not match the driver's is refused after registering.
    let other = DriverService::start(DriverConfig {
        secret: config.secret.clone(),
        ..DriverConfig::new(1)
    })
    .unwrap();
    let stale = WorkerEnv {
        driver_addr: other.addr().to_string(),
        num_tasks: 1,
        ..env(0, "x")
    };
    let err = control::join_job(
        &stale,
        SocketAddr::from(([127, 0, 0, 1], 9)),
        AbortSignal::new(),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("was started for job {}", config.job_id)),
        "{err}"
    );
}

#[test]
fn streamed_values_pass_the_message_limit_and_events_arrive_in_order() {
    use kolo_collective::control::proto::{task_event, TaskEvent};

    let config = config(1);
    let secret = config.secret.clone();
    let driver = DriverService::start(config).unwrap();
    let client = connect(&driver, &secret);
    // 9 MiB: more than twice gRPC's default 4 MiB message limit.
    let big: Vec<u8> = (0..9 << 20).map(|i: u32| (i % 251) as u8).collect();
    block_on(client.kv_put_stream("big", &big, Duration::from_secs(30)))
        .unwrap()
        .unwrap();
    assert_eq!(driver.kv_value("big").as_deref(), Some(big.as_slice()));
    let back = block_on(client.kv_get_stream("big", Duration::from_secs(5)))
        .unwrap()
        .unwrap();
    assert_eq!(back, big);
    let empty = block_on(client.kv_put_stream("empty", &[], Duration::from_secs(5)));
    empty.unwrap().unwrap();
    let back = block_on(client.kv_get_stream("empty", Duration::from_secs(5)));
    assert!(back.unwrap().unwrap().is_empty());
    let missing = block_on(client.kv_get_stream("missing", Duration::from_millis(100))).unwrap();
    assert!(matches!(missing, Err(Error::Timeout { .. })), "{missing:?}");

    for batch in 0..3u8 {
        let events = (0..2u8)
            .map(|i| TaskEvent {
                kind: Some(task_event::Kind::Message(vec![batch, i])),
            })
            .collect();
        assert!(!block_on(client.post(0, events)).unwrap().unwrap());
    }
    let events = block_on(driver.take_events(Duration::from_secs(1))).unwrap();
    let messages: Vec<Vec<u8>> = events
        .into_iter()
        .map(|(task, event)| {
            assert_eq!(task, 0);
            match event.kind {
                Some(task_event::Kind::Message(data)) => data,
                other => panic!("unexpected {other:?}"),
            }
        })
        .collect();
    assert_eq!(
        messages,
        [[0, 0], [0, 1], [1, 0], [1, 1], [2, 0], [2, 1]].map(|m| m.to_vec())
    );
    let started = Instant::now();
    assert!(block_on(driver.take_events(Duration::from_millis(200)))
        .unwrap()
        .is_empty());
    assert!(started.elapsed() >= Duration::from_millis(150));

    block_on(client.report_task_failure(0, "the child died"))
        .unwrap()
        .unwrap();
    let cause = driver.abort_cause().unwrap();
    assert_eq!(cause.rank, None);
    assert!(cause.message.contains("task 0") && cause.message.contains("the child died"));
    driver.shutdown();
}

#[test]
fn init_adopts_an_early_registration() {
    use kolo_collective::worker;

    let config = config(1);
    let driver = DriverService::start(config.clone()).unwrap();
    let env = WorkerEnv {
        driver_addr: driver.addr().to_string(),
        secret: config.secret.clone(),
        job_id: config.job_id,
        task_index: 0,
        num_tasks: 1,
        start_timeout: config.start_timeout,
        hostname: None,
        host_hash_salt: None,
        data_addr: None,
    };
    let (registration, _client) = worker::register_early(&env).unwrap();
    assert_eq!((registration.rank, registration.size), (0, 1));
    // A second registration for round 0 would be refused as a duplicate with another pid or
    // address; adopting it joins without registering again.
    let joined =
        worker::Worker::join(&env, kolo_collective::engine::EngineConfig::default()).unwrap();
    assert_eq!(joined.info().rank, 0);
    assert!(
        !worker::leave_early().unwrap(),
        "adopted: nothing left to leave"
    );
    joined.shutdown();
    driver.shutdown();
}

#[test]
fn the_driver_names_the_ranks_it_no_longer_hears_from_bounded() {
    // Rank 0 heartbeats every 100 ms; rank 1 (task 1) never does.
    let (_driver, joined, _signal) = alive_and_silent(Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(800));
    let reply = block_on(joined[0].0.silent_ranks(
        0,
        Duration::from_millis(500),
        Duration::from_secs(2),
    ))
    .unwrap()
    .unwrap();
    assert_eq!(reply.total, 1, "{reply:?}");
    let silent = &reply.ranks[0];
    assert_eq!(
        (
            silent.rank,
            silent.hostname.as_str(),
            silent.data_addr.as_str()
        ),
        (1, "silent-host", "127.0.0.1:20001")
    );
    assert!(silent.silent_ms >= 500, "{silent:?}");
    // Above the silence asked for, nobody.
    let none = block_on(joined[0].0.silent_ranks(
        0,
        Duration::from_secs(30),
        Duration::from_secs(2),
    ))
    .unwrap()
    .unwrap();
    assert_eq!((none.total, none.ranks.len()), (0, 0));
    joined[0].0.stop_background();
}

#[test]
fn a_silent_ranks_reply_lists_at_most_sixteen() {
    let config = DriverConfig {
        heartbeat_timeout: Duration::from_secs(60),
        ..config(20)
    };
    let secret = config.secret.clone();
    let driver = DriverService::start(config).unwrap();
    let hosts: Vec<String> = (0..20).map(|i| format!("h{i}")).collect();
    let tasks: Vec<(u32, &str)> = (0..20).map(|i| (i, hosts[i as usize].as_str())).collect();
    let joined = register_all(&driver, &secret, &tasks);
    let reply = block_on(
        joined[0]
            .0
            .silent_ranks(0, Duration::ZERO, Duration::from_secs(2)),
    )
    .unwrap()
    .unwrap();
    assert_eq!((reply.total, reply.ranks.len()), (20, 16));
}
