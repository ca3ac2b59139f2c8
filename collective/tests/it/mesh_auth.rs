//! Hostile peers during data-plane mesh setup: an impostor that knows the job id but not the
//! secret, one with a valid proof from the wrong address, floods of silent connections, and
//! connections after the mesh formed.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::FromRawFd;
use std::thread;
use std::time::{Duration, Instant};

use kolo_collective::communicator::{Communicator, RankInfo};
use kolo_collective::control::mac::{nonce, MacKey};
use kolo_collective::control::JobSecret;
use kolo_collective::transport::handshake::{self, data_key, Dial, DialError};
use kolo_collective::transport::{DataListener, Mesh, MeshConfig};
use kolo_collective::wire::{self, FrameKind, Hello, JobId};
use kolo_collective::{AbortSignal, DType, ReduceOp};

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const JOB: JobId = *b"mesh-auth-job-id";

fn info(rank: usize, size: usize) -> RankInfo {
    RankInfo {
        rank,
        size,
        local_rank: rank,
        local_size: size,
        cross_rank: 0,
        cross_size: 1,
        hosts: (0..size).map(|r| format!("host{r}")).collect(),
    }
}

fn config(key: &MacKey, rank: usize, peers: &[SocketAddr]) -> MeshConfig {
    MeshConfig {
        job_id: JOB,
        key: key.clone(),
        rank,
        round: 0,
        peers: peers.to_vec(),
        connect_timeout: Duration::from_secs(10),
        op_timeout: Duration::from_secs(10),
    }
}

/// Forms the mesh of `listeners` (rank = index) on threads, each first calling `gate(rank)`,
/// and checks it with an allreduce. Returns how long the slowest rank took to form its mesh.
fn form_and_check(
    key: &MacKey,
    listeners: Vec<DataListener>,
    gate: impl Fn(usize) + Sync,
) -> Duration {
    let peers: Vec<SocketAddr> = listeners.iter().map(DataListener::local_addr).collect();
    let n = peers.len();
    let took: Vec<Duration> = thread::scope(|s| {
        let handles: Vec<_> = listeners
            .into_iter()
            .enumerate()
            .map(|(rank, listener)| {
                let config = config(key, rank, &peers);
                let gate = &gate;
                s.spawn(move || {
                    gate(rank);
                    let start = Instant::now();
                    let abort = AbortSignal::new();
                    let mesh =
                        Mesh::establish(listener, config, abort.clone()).expect("mesh forms");
                    let took = start.elapsed();
                    let comm = Communicator::new(info(rank, n), mesh, abort);
                    let mut buf = (rank as f32 + 1.0).to_ne_bytes().to_vec();
                    comm.allreduce("check", &mut buf, &[1], DType::F32, ReduceOp::Sum, 1.0, 1.0)
                        .unwrap();
                    let want = (n * (n + 1) / 2) as f32;
                    assert_eq!(buf, want.to_ne_bytes().to_vec());
                    took
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    took.into_iter().max().unwrap()
}

fn bind(n: usize) -> Vec<DataListener> {
    (0..n)
        .map(|_| DataListener::bind(LOCALHOST).unwrap())
        .collect()
}

/// Rank 1's dial of rank 0 in a 2-rank job keyed by `key`.
fn rank_one_to_zero(key: &MacKey) -> Dial<'_> {
    Dial {
        key,
        job_id: &JOB,
        from: 1,
        to: 0,
        size: 2,
        round: 0,
    }
}

/// A fresh job: its data-plane key, `n` bound listeners and their addresses (rank = index).
fn job(n: usize) -> (MacKey, Vec<DataListener>, Vec<SocketAddr>) {
    let listeners = bind(n);
    let peers = listeners.iter().map(DataListener::local_addr).collect();
    (data_key(&JobSecret::generate()), listeners, peers)
}

/// A TCP connection to `to` whose source address is `from` (bound before connecting).
fn connect_from(from: Ipv4Addr, to: SocketAddr) -> TcpStream {
    let SocketAddr::V4(to) = to else {
        panic!("IPv4 only")
    };
    let sockaddr = |ip: Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: plain socket calls on a descriptor this function owns; the addresses are valid
    // `sockaddr_in`s of the given length.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let stream = TcpStream::from_raw_fd(fd);
        let src = sockaddr(from, 0);
        assert_eq!(
            libc::bind(fd, (&src as *const libc::sockaddr_in).cast(), len),
            0,
            "bind {from}: {}",
            std::io::Error::last_os_error()
        );
        let dst = sockaddr(*to.ip(), to.port());
        assert_eq!(
            libc::connect(fd, (&dst as *const libc::sockaddr_in).cast(), len),
            0,
            "connect {to}: {}",
            std::io::Error::last_os_error()
        );
        stream
    }
}

/// True when the acceptor closed `stream` (end of stream or reset) within `within`.
fn closed_by_peer(stream: &mut TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).unwrap();
    let mut sink = [0u8; 512];
    loop {
        match stream.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return false,
            Err(_) => return true,
        }
    }
}

#[test]
fn impostor_knowing_the_job_id_cannot_claim_a_rank() {
    let (key, listeners, peers) = job(3);
    let wrong = data_key(&JobSecret::generate());
    // While ranks 0 and 1 set up and before the real rank 2 starts, an impostor with the job
    // id, the ranks and the addresses (everything but the secret) claims rank 2 at both.
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let wait = std::sync::Mutex::new(wait);
    let impostor = || {
        let mut impostors = Vec::new();
        for target in [0u32, 1] {
            let mut stream = TcpStream::connect(peers[target as usize]).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            let hello = Hello {
                job_id: JOB,
                from: 2,
                to: target,
                size: 3,
                round: 0,
                nonce: nonce(),
            };
            stream.write_all(&hello.encode_frame()).unwrap();
            let mut reply = [0u8; wire::HEADER_LEN + wire::HELLO_LEN + wire::HEADER_LEN + 32];
            stream.read_exact(&mut reply).unwrap();
            // Its best guess at a proof: a tag under another key (it cannot derive the right one).
            let guess = wrong.tag(&[&reply[..]]);
            let frame = wire::encode_frame(FrameKind::Proof, 0, &wire::job_check(&JOB), &guess);
            stream.write_all(&frame).unwrap();
            impostors.push(stream);
        }
        // A full dial with the wrong key fails on the ranks' own proofs: it learns nothing.
        let mut probe = TcpStream::connect(peers[0]).unwrap();
        let dial = Dial {
            key: &wrong,
            job_id: &JOB,
            from: 2,
            to: 0,
            size: 3,
            round: 0,
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        let refused = handshake::dial(&mut probe, dial, deadline, &|| Ok(()));
        assert!(
            matches!(refused, Err(DialError::Rejected(ref m)) if m.contains("secret")),
            "{refused:?}"
        );
        for impostor in &mut impostors {
            assert!(
                closed_by_peer(impostor, Duration::from_secs(5)),
                "the impostor was not dropped"
            );
        }
        go.send(()).unwrap();
    };
    thread::scope(|s| {
        s.spawn(impostor);
        // The real rank 2 joins after the impostor was refused, and the mesh works.
        form_and_check(&key, listeners, |rank| {
            if rank == 2 {
                wait.lock()
                    .unwrap()
                    .recv_timeout(Duration::from_secs(20))
                    .expect("the impostor finished");
            }
        });
    });
}

#[test]
fn valid_proof_from_another_source_address_is_rejected() {
    let (key, listeners, peers) = job(2);
    // Rank 1 registered 127.0.0.1; a process on 127.0.0.2 holding the key (e.g. a leaked key
    // replayed elsewhere) claims rank 1.
    let mut impostor = connect_from(Ipv4Addr::new(127, 0, 0, 2), peers[0]);
    let dial = rank_one_to_zero(&key);
    let mut listeners = listeners.into_iter();
    let (zero, one) = (listeners.next().unwrap(), listeners.next().unwrap());
    thread::scope(|s| {
        let config0 = config(&key, 0, &peers);
        let forming = s.spawn(move || Mesh::establish(zero, config0, AbortSignal::new()));
        let result = handshake::dial(
            &mut impostor,
            dial,
            Instant::now() + Duration::from_secs(5),
            &|| Ok(()),
        );
        assert!(
            matches!(result, Err(DialError::Dropped(_))),
            "rank 0 answered an impostor from the wrong address: {result:?}"
        );
        // The real rank 1, from its registered address, still joins.
        let start = Instant::now();
        let real = Mesh::establish(one, config(&key, 1, &peers), AbortSignal::new());
        real.expect("rank 1 joins");
        forming.join().unwrap().expect("rank 0 forms its mesh");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    });
}

#[test]
fn two_hundred_silent_connections_do_not_stop_the_mesh() {
    let (key, listeners, peers) = job(3);
    let silent: Vec<TcpStream> = (0..200)
        .filter_map(|i| TcpStream::connect(peers[i % 2]).ok())
        .collect();
    assert!(silent.len() >= 150, "only {} connections", silent.len());
    let took = form_and_check(&key, listeners, |_| {});
    assert!(took < Duration::from_secs(8), "mesh took {took:?}");
    drop(silent);
}

#[test]
fn a_flood_after_a_real_peer_connected_does_not_evict_it() {
    let (key, listeners, peers) = job(2);
    let zero = listeners.into_iter().next().unwrap();
    thread::scope(|s| {
        let config = config(&key, 0, &peers);
        let forming = s.spawn(move || Mesh::establish(zero, config, AbortSignal::new()));
        // The real rank 1 connects first and is a little slow to send its Hello, while 200
        // silent connections arrive behind it.
        let mut real = TcpStream::connect(peers[0]).unwrap();
        let silent: Vec<TcpStream> = (0..200)
            .filter_map(|_| TcpStream::connect(peers[0]).ok())
            .collect();
        thread::sleep(Duration::from_millis(300));
        let dial = rank_one_to_zero(&key);
        handshake::dial(
            &mut real,
            dial,
            Instant::now() + Duration::from_secs(5),
            &|| Ok(()),
        )
        .expect("the real peer's handshake completes");
        forming.join().unwrap().expect("rank 0 takes the real peer");
        drop(silent);
    });
}

#[test]
fn the_listener_refuses_connections_once_the_mesh_formed() {
    let (key, listeners, peers) = job(2);
    let meshes: Vec<Mesh> = thread::scope(|s| {
        let handles: Vec<_> = listeners
            .into_iter()
            .enumerate()
            .map(|(rank, listener)| {
                let config = config(&key, rank, &peers);
                s.spawn(move || Mesh::establish(listener, config, AbortSignal::new()).unwrap())
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for addr in &peers {
        let err = TcpStream::connect_timeout(addr, Duration::from_secs(2)).unwrap_err();
        assert_eq!(
            err.kind(),
            std::io::ErrorKind::ConnectionRefused,
            "{addr}: {err}"
        );
    }
    drop(meshes);
}

#[test]
fn a_rank_connects_from_its_registered_address_on_a_host_with_several() {
    // Rank 1 registered 127.0.0.2; rank 0 listens on 127.0.0.1, where the kernel would pick
    // 127.0.0.1 as the source. Rank 0 only accepts rank 1 from 127.0.0.2, so the mesh forms
    // only if rank 1 connects from the address it registered.
    let key = data_key(&JobSecret::generate());
    let second = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let listeners = vec![
        DataListener::bind(LOCALHOST).unwrap(),
        DataListener::bind(second).unwrap(),
    ];
    let took = form_and_check(&key, listeners, |_| {});
    assert!(took < Duration::from_secs(5), "mesh took {took:?}");
}

/// A rank of another registration round (an elastic reset happened between the two ranks'
/// registrations), with the right key and job id, is refused: the dialer gets a typed error
/// naming both rounds at once (no retrying until the connect timeout), and the mesh of the
/// current round still forms with the current round's rank.
#[test]
fn a_rank_of_another_round_is_refused_naming_both_rounds() {
    let (key, mut listeners, peers) = job(2);
    let stale_listener = listeners.pop().unwrap();
    let zero = listeners.pop().unwrap();
    let round = |rank: usize, round: u32| MeshConfig {
        round,
        ..config(&key, rank, &peers)
    };
    thread::scope(|s| {
        let current = round(0, 1);
        let acceptor = s.spawn(move || Mesh::establish(zero, current, AbortSignal::new()));
        // By hand: rank 1 of round 0 proves the key, but for the old round.
        let mut stream = TcpStream::connect(peers[0]).unwrap();
        let old = Dial {
            round: 0,
            ..rank_one_to_zero(&key)
        };
        let started = Instant::now();
        let err = handshake::dial(&mut stream, old, started + Duration::from_secs(10), &|| {
            Ok(())
        })
        .unwrap_err();
        assert!(
            matches!(err, DialError::OtherRound { ours: 0, theirs: 1 }),
            "{err:?}"
        );
        // A whole mesh of the old round: a typed error naming both rounds, at once.
        let err = Mesh::establish(stale_listener, round(1, 0), AbortSignal::new()).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("round 1") && text.contains("round 0"),
            "{text}"
        );
        assert!(
            matches!(err, kolo_collective::Error::Rendezvous(_)),
            "{err:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(5), "not at once");
        // The current round's rank 1 gets in.
        let fresh = DataListener::bind(LOCALHOST).unwrap();
        let mine = Mesh::establish(fresh, round(1, 1), AbortSignal::new());
        assert!(mine.is_ok(), "{:?}", mine.err());
        assert!(acceptor.join().unwrap().is_ok());
    });
}
