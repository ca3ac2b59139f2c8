//! Hostile clients of the job driver: the connection handshake refuses them before any gRPC
//! byte, the driver's state does not change, and memory and handshake slots stay bounded.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use kolo_collective::control::handshake::{CLIENT_HELLO_LEN, DRIVER_PROOF_LEN, MAGIC};
use kolo_collective::control::mac::{nonce, MacKey, TAG_LEN};
use kolo_collective::control::proto::driver_client::DriverClient as RawClient;
use kolo_collective::control::proto::{
    FailureReport, HeartbeatRequest, KvChunk, KvGetRequest, KvPutRequest, LeaveRequest,
    PostRequest, RegisterRequest, SilentRanksRequest, WatchAbortRequest,
};
use kolo_collective::control::{ClientOptions, DriverClient, DriverService, JobSecret};
use kolo_runtime::block_on;
use tonic::transport::Endpoint;

use crate::driver::{config, connect, register_all};

fn start(num_tasks: usize) -> (DriverService, JobSecret) {
    let config = config(num_tasks);
    let secret = config.secret.clone();
    (DriverService::start(config).unwrap(), secret)
}

/// Nothing a refused peer could have done is visible in the driver's state.
fn assert_untouched(driver: &DriverService) {
    assert!(driver.registered_tasks().is_empty());
    assert!(driver.assignment().is_none());
    assert_eq!(driver.kv_value("k"), None);
    assert_eq!(driver.abort_cause(), None);
    assert!(block_on(driver.take_events(Duration::ZERO))
        .unwrap()
        .is_empty());
}

/// True when the driver closes `stream` (EOF or reset) within `limit`; what it sent before
/// (at most its handshake answer) is read and dropped.
fn closed_by_driver(stream: &mut TcpStream, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let mut buf = [0u8; 256];
    let mut received = 0;
    while Instant::now() < deadline {
        stream
            .set_read_timeout(Some(
                deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1)),
            ))
            .unwrap();
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(n) => {
                received += n;
                assert!(
                    received <= DRIVER_PROOF_LEN,
                    "the driver sent more than its handshake answer"
                );
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
    false
}

#[test]
fn every_rpc_without_the_handshake_is_refused_and_changes_nothing() {
    let (driver, _) = start(1);
    let endpoint = Endpoint::from_shared(format!("http://{}", driver.addr()))
        .unwrap()
        .connect_timeout(Duration::from_secs(2));
    let put = || KvPutRequest {
        key: "k".into(),
        value: b"v".to_vec(),
    };
    let refusals: Vec<(&str, bool)> = block_on(async {
        let mut raw = RawClient::new(endpoint.connect_lazy());
        vec![
            (
                "Register",
                raw.register(RegisterRequest::default()).await.is_err(),
            ),
            ("KvPut", raw.kv_put(put()).await.is_err()),
            (
                "KvGet",
                raw.kv_get(KvGetRequest {
                    key: "k".into(),
                    timeout_ms: 10,
                })
                .await
                .is_err(),
            ),
            (
                "Heartbeat",
                raw.heartbeat(HeartbeatRequest {
                    rank: 0,
                    ..Default::default()
                })
                .await
                .is_err(),
            ),
            (
                "ReportFailure",
                raw.report_failure(FailureReport {
                    rank: 0,
                    message: "forged".into(),
                    task_index: Some(0),
                })
                .await
                .is_err(),
            ),
            (
                "WatchAbort",
                raw.watch_abort(WatchAbortRequest {
                    rank: 0,
                    ..Default::default()
                })
                .await
                .is_err(),
            ),
            (
                "Leave",
                raw.leave(LeaveRequest {
                    rank: 0,
                    ..Default::default()
                })
                .await
                .is_err(),
            ),
            (
                "Post",
                raw.post(PostRequest {
                    task_index: 0,
                    events: Vec::new(),
                })
                .await
                .is_err(),
            ),
            (
                "KvPutStream",
                raw.kv_put_stream(tokio_stream::iter(vec![KvChunk {
                    key: "k".into(),
                    data: b"v".to_vec(),
                }]))
                .await
                .is_err(),
            ),
            (
                "KvGetStream",
                raw.kv_get_stream(KvGetRequest {
                    key: "k".into(),
                    timeout_ms: 10,
                })
                .await
                .is_err(),
            ),
            (
                "SilentRanks",
                raw.silent_ranks(SilentRanksRequest {
                    rank: 0,
                    silent_for_ms: 0,
                })
                .await
                .is_err(),
            ),
        ]
    })
    .unwrap();
    for (method, refused) in &refusals {
        assert!(refused, "{method} without the handshake was served");
    }
    assert_eq!(refusals.len(), 11, "every method of the Driver service");
    assert_untouched(&driver);
}

#[test]
fn wrong_truncated_and_junk_handshakes_are_refused() {
    let (driver, _) = start(1);
    let wrong_key = MacKey::derive(&JobSecret::generate(), "control plane");

    // Truncated opening message, then silence: closed at the handshake deadline.
    let mut half = TcpStream::connect(driver.addr()).unwrap();
    half.write_all(&MAGIC[..5]).unwrap();
    assert!(closed_by_driver(&mut half, Duration::from_secs(10)));

    // Junk instead of the magic (an HTTP/2 preface, as a plain gRPC client sends).
    let mut junk = TcpStream::connect(driver.addr()).unwrap();
    junk.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n0123456789abcdef")
        .unwrap();
    assert!(closed_by_driver(&mut junk, Duration::from_secs(2)));

    // A complete opening, the driver's answer, then a proof made with another key.
    let mut wrong = TcpStream::connect(driver.addr()).unwrap();
    let ours = nonce();
    wrong.write_all(MAGIC).unwrap();
    wrong.write_all(&ours).unwrap();
    let mut answer = [0u8; DRIVER_PROOF_LEN];
    wrong.read_exact(&mut answer).unwrap();
    let theirs = &answer[..TAG_LEN];
    wrong
        .write_all(&wrong_key.tag(&[MAGIC, b"worker", &ours, theirs]))
        .unwrap();
    assert!(closed_by_driver(&mut wrong, Duration::from_secs(2)));

    // A truncated proof (31 bytes), then the gRPC preface.
    let mut short = TcpStream::connect(driver.addr()).unwrap();
    short.write_all(MAGIC).unwrap();
    short.write_all(&nonce()).unwrap();
    short.read_exact(&mut answer).unwrap();
    short.write_all(&[0u8; TAG_LEN - 1]).unwrap();
    short.shutdown(Shutdown::Write).unwrap();
    assert!(closed_by_driver(&mut short, Duration::from_secs(2)));
    assert_untouched(&driver);
}

/// A TCP relay that records every byte in both directions.
struct Recorder {
    addr: SocketAddr,
    to_driver: Arc<Mutex<Vec<u8>>>,
    from_driver: Arc<Mutex<Vec<u8>>>,
}

fn pump(mut from: TcpStream, mut to: TcpStream, log: Arc<Mutex<Vec<u8>>>) {
    let mut buf = [0u8; 16 << 10];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
        log.lock().unwrap().extend_from_slice(&buf[..n]);
    }
    let _ = to.shutdown(Shutdown::Write);
}

fn record(driver: SocketAddr) -> Recorder {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let to_driver = Arc::new(Mutex::new(Vec::new()));
    let from_driver = Arc::new(Mutex::new(Vec::new()));
    let (up, down) = (Arc::clone(&to_driver), Arc::clone(&from_driver));
    thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let server = TcpStream::connect(driver).unwrap();
            let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (up, down) = (Arc::clone(&up), Arc::clone(&down));
            thread::spawn(move || pump(client, server, up));
            thread::spawn(move || pump(s2, c2, down));
        }
    });
    Recorder {
        addr,
        to_driver,
        from_driver,
    }
}

#[test]
fn captured_traffic_holds_no_secret_and_replaying_it_is_refused() {
    let (driver, secret) = start(1);
    let relay = record(driver.addr());
    let client = block_on(DriverClient::connect(
        &relay.addr.to_string(),
        &secret,
        ClientOptions {
            connect_timeout: Duration::from_secs(5),
            ..ClientOptions::default()
        },
    ))
    .unwrap()
    .unwrap();
    block_on(client.kv_put("replayed", b"from the worker".to_vec()))
        .unwrap()
        .unwrap();
    assert_eq!(
        driver.kv_value("replayed").as_deref(),
        Some(&b"from the worker"[..])
    );
    drop(client);
    thread::sleep(Duration::from_millis(200));

    let hex = secret.to_hex();
    let raw = hex::decode(&hex).unwrap();
    for (direction, bytes) in [
        ("to the driver", relay.to_driver.lock().unwrap().clone()),
        ("from the driver", relay.from_driver.lock().unwrap().clone()),
    ] {
        assert!(
            bytes.len() > CLIENT_HELLO_LEN,
            "nothing recorded {direction}"
        );
        for needle in [hex.as_bytes(), hex.to_uppercase().as_bytes(), &raw[..]] {
            assert!(
                !bytes.windows(needle.len()).any(|w| w == needle),
                "the secret crossed the network {direction}"
            );
        }
    }

    // Replay the worker's bytes verbatim: the driver's fresh nonce makes the old proof wrong.
    driver.kv_put("replayed", b"original".to_vec()).unwrap();
    let captured = relay.to_driver.lock().unwrap().clone();
    let mut replay = TcpStream::connect(driver.addr()).unwrap();
    let _ = replay.write_all(&captured);
    assert!(closed_by_driver(&mut replay, Duration::from_secs(2)));
    thread::sleep(Duration::from_millis(200));
    assert_eq!(
        driver.kv_value("replayed").as_deref(),
        Some(&b"original"[..])
    );
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .unwrap()
}

#[test]
fn an_unauthenticated_gigabyte_stream_is_cut_off_unread() {
    let (driver, _) = start(1);
    let before = rss_kib();
    let mut stream = TcpStream::connect(driver.addr()).unwrap();
    stream
        .set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // A valid opening, then 1 GiB where the 32-byte proof belongs.
    stream.write_all(MAGIC).unwrap();
    stream.write_all(&nonce()).unwrap();
    let chunk = vec![0xA5u8; 1 << 20];
    let started = Instant::now();
    let mut sent = 0usize;
    for _ in 0..1024 {
        match stream.write(&chunk) {
            Ok(n) => sent += n,
            Err(_) => break,
        }
    }
    assert!(
        sent < 64 << 20,
        "the driver kept accepting bytes: {} MiB",
        sent >> 20
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    let grown = rss_kib().saturating_sub(before);
    assert!(grown < 32 << 10, "RSS grew by {grown} KiB");
    assert_untouched(&driver);
}

fn raise_fd_limit(to: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to an rlimit.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur = to.min(limit.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
}

#[test]
fn five_thousand_idle_connections_do_not_keep_four_ranks_out() {
    raise_fd_limit(16_384);
    let config = kolo_collective::control::DriverConfig {
        start_timeout: Duration::from_secs(120),
        ..config(4)
    };
    let secret = config.secret.clone();
    let driver = DriverService::start(config).unwrap();
    let flood = Instant::now();
    // Opened from 10 threads: a loopback connect costs milliseconds here, one at a time.
    let addr = driver.addr();
    let idle: Vec<TcpStream> = thread::scope(|scope| {
        let openers: Vec<_> = (0..10)
            .map(|_| {
                scope.spawn(move || {
                    (0..500)
                        .map_while(|_| TcpStream::connect(addr).ok())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        openers
            .into_iter()
            .flat_map(|opener| opener.join().unwrap())
            .collect()
    });
    assert_eq!(idle.len(), 5_000, "could not open the idle connections");
    eprintln!("5,000 idle connections opened in {:?}", flood.elapsed());
    let started = Instant::now();
    let tasks = [(0, "a"), (1, "a"), (2, "b"), (3, "b")];
    let joined = register_all(&driver, &secret, &tasks);
    assert_eq!(joined.len(), 4);
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "registration took {:?}",
        started.elapsed()
    );
    assert_eq!(driver.registered_tasks(), vec![0, 1, 2, 3]);
    drop(idle);
}

#[test]
fn a_worker_refuses_a_driver_that_cannot_prove_the_secret() {
    // The impostor is a real driver with its own secret: the worker's first connection fails
    // its proof, so the worker never sends a request, let alone reads a payload.
    let (impostor, _) = start(1);
    impostor
        .kv_put("payload", b"crafted pickle".to_vec())
        .unwrap();
    let err = block_on(DriverClient::connect(
        &impostor.addr().to_string(),
        &JobSecret::generate(),
        ClientOptions::default(),
    ))
    .unwrap()
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("could not prove it knows this job's secret"),
        "{err}"
    );
    assert!(impostor.registered_tasks().is_empty());
}

#[test]
fn a_job_nobody_registers_for_aborts_at_the_start_timeout() {
    let driver = DriverService::start(kolo_collective::control::DriverConfig {
        start_timeout: Duration::from_millis(500),
        ..config(3)
    })
    .unwrap();
    let started = Instant::now();
    while driver.abort_cause().is_none() && started.elapsed() < Duration::from_secs(5) {
        thread::sleep(Duration::from_millis(20));
    }
    let cause = driver.abort_cause().expect("the job never aborted");
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(cause.message.contains("0 of 3 registered"), "{cause}");
    let _ = connect;
}
