//! A registration lost in transit (its connection reset, as a driver or network under heavy
//! load does) is retried by the client and counted once by the driver: through a real TCP relay
//! in front of the real driver that resets a client's first connection.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kolo_collective::control::{
    DriverClient, DriverConfig, DriverService, ElasticConfig, Registration,
};
use kolo_runtime::block_on;

use crate::driver::{config, connect, fast, task};

/// A relay on 127.0.0.1 to the driver. Its first connection can be told to swallow what the
/// driver sends (`mute_first`) and then to end with a reset (`cut_first`); later connections
/// pass untouched.
struct Relay {
    addr: SocketAddr,
    mute_first: Arc<AtomicBool>,
    cut_first: Arc<AtomicBool>,
    connections: Arc<AtomicUsize>,
}

impl Relay {
    fn start(driver: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let relay = Self {
            addr: listener.local_addr().unwrap(),
            mute_first: Arc::default(),
            cut_first: Arc::default(),
            connections: Arc::default(),
        };
        let (mute, cut, count) = (
            Arc::clone(&relay.mute_first),
            Arc::clone(&relay.cut_first),
            Arc::clone(&relay.connections),
        );
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(upstream) = TcpStream::connect(driver) else {
                    return;
                };
                let first = count.fetch_add(1, Ordering::SeqCst) == 0;
                let (mute, cut) = if first {
                    (Arc::clone(&mute), Arc::clone(&cut))
                } else {
                    (Arc::default(), Arc::default())
                };
                pump(&client, &upstream, Arc::default(), Arc::clone(&cut));
                pump(&upstream, &client, mute, Arc::clone(&cut));
                if first {
                    std::thread::spawn(move || {
                        while !cut.load(Ordering::SeqCst) {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        for stream in [&client, &upstream] {
                            // Linger 0: closing sends a reset, as a dropped connection does.
                            let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
                            let _ = stream.shutdown(Shutdown::Both);
                        }
                    });
                }
            }
        });
        relay
    }
}

/// Copies `from` → `to` on a thread until either ends or `cut` is set; bytes read while `mute`
/// is set are dropped.
fn pump(from: &TcpStream, to: &TcpStream, mute: Arc<AtomicBool>, cut: Arc<AtomicBool>) {
    let (mut from, mut to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
    from.set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        while !cut.load(Ordering::SeqCst) {
            match from.read(&mut buf) {
                Ok(0) => return,
                Ok(_) if mute.load(Ordering::SeqCst) => {}
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
                Err(err)
                    if matches!(
                        err.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => return,
            }
        }
    });
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn through(relay: &Relay, secret: &kolo_collective::control::JobSecret) -> DriverClient {
    block_on(DriverClient::connect(
        &relay.addr.to_string(),
        secret,
        fast(),
    ))
    .unwrap()
    .unwrap()
}

/// A driver for `config` with task 0's registration under way through a relay (the driver has
/// recorded it); the handle gives task 0's registration.
fn task_zero_registering_through_a_relay(
    config: DriverConfig,
) -> (DriverService, Relay, std::thread::JoinHandle<Registration>) {
    let secret = config.secret.clone();
    let driver = DriverService::start(config).unwrap();
    let relay = Relay::start(driver.addr());
    let client = through(&relay, &secret);
    let first = std::thread::spawn(move || {
        block_on(client.register(&task(0, "a"), Duration::from_secs(20)))
            .unwrap()
            .unwrap()
    });
    wait_until("task 0 registered", || driver.registered_tasks() == [0]);
    (driver, relay, first)
}

/// Task 0's registration call is under way (the driver recorded it) when its connection is
/// reset: the client registers again on a new connection and gets its assignment, and the
/// driver counted it once (it was not refused as a duplicate of itself).
#[test]
fn a_registration_whose_connection_is_reset_is_retried_and_counted_once() {
    let config = config(2);
    let secret = config.secret.clone();
    let (driver, relay, first) = task_zero_registering_through_a_relay(config);
    relay.cut_first.store(true, Ordering::SeqCst);
    // Let the reset reach the client before the round can complete.
    std::thread::sleep(Duration::from_millis(300));
    let other = connect(&driver, &secret);
    let second = block_on(other.register(&task(1, "a"), Duration::from_secs(20)))
        .unwrap()
        .unwrap();
    let first = first.join().expect("task 0's registration failed");
    assert_eq!((first.size, second.size), (2, 2));
    assert_eq!(first.peers, second.peers);
    assert_ne!(first.rank, second.rank);
    assert!(
        relay.connections.load(Ordering::SeqCst) >= 2,
        "no second connection"
    );
    assert_eq!(driver.registered_tasks(), [0, 1]);
    driver.shutdown();
}

/// In an elastic job the reply to the registration that completed round 0 is lost (the
/// connection swallows it, then resets): the retry gets round 0's assignment, the same the
/// other task got, instead of opening round 1 (a reset nobody asked for, which would leave
/// both tasks waiting for each other in different rounds).
#[test]
fn an_elastic_registration_whose_reply_is_lost_gets_its_round_not_a_new_one() {
    let config = DriverConfig {
        start_timeout: Duration::from_secs(20),
        elastic: Some(ElasticConfig::new(2, 2)),
        ..DriverConfig::new(2)
    };
    let secret = config.secret.clone();
    let (driver, relay, first) = task_zero_registering_through_a_relay(config);
    relay.mute_first.store(true, Ordering::SeqCst);
    let other = connect(&driver, &secret);
    let second = block_on(other.register(&task(1, "b"), Duration::from_secs(20)))
        .unwrap()
        .unwrap();
    assert_eq!((second.size, second.generation), (2, 0));
    // The round completed and task 0's reply went into the muted connection.
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !first.is_finished(),
        "task 0 heard its reply through a muted relay"
    );
    relay.cut_first.store(true, Ordering::SeqCst);
    let first = first.join().expect("task 0's registration failed");
    assert_eq!((first.size, first.generation), (2, 0));
    assert_eq!(first.peers, second.peers);
    assert_eq!(driver.resets(), 0, "the retry opened a new round");
    driver.shutdown();
}
