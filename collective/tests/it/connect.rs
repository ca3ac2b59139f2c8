//! Connections on demand (`KOLO_CONNECT=lazy`): a lazy mesh makes no connection at start-up,
//! connects a pair of ranks when a collective first needs it (exactly one connection per pair,
//! even when both need each other at the same moment), refuses peers without the key without
//! delaying the others, and names a peer that never shows up within the connect timeout. The
//! eager mesh (today's design) still opens n − 1 connections per rank at start-up.

use std::net::TcpStream;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use kolo_collective::communicator::Communicator;
use kolo_collective::control::JobSecret;
use kolo_collective::engine::{Engine, EngineConfig, RawTensor, Submission};
use kolo_collective::transport::handshake::{self, data_key, Dial};
use kolo_collective::transport::ConnectionCounts;
use kolo_collective::wire::OpKind;
use kolo_collective::{DType, Error, ReduceOp};

use super::collectives::{with_meshes, Options};
use super::engine_cycles::stat;

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn f32_values(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// An alltoall of one f32 per pair: rank r sends `100 r + j` to rank j.
fn alltoall(rank: usize, n: usize, comm: &Communicator) -> Vec<f32> {
    let input = f32_bytes(&(0..n).map(|j| (100 * rank + j) as f32).collect::<Vec<_>>());
    let mut out = vec![0u8; 4 * n];
    comm.alltoall(
        "pairs",
        &input,
        &[n as i64],
        DType::F32,
        &vec![1; n],
        |rows| {
            assert_eq!(rows, vec![1; n]);
            Ok(&mut out[..])
        },
    )
    .unwrap();
    f32_values(&out)
}

fn counts(opened: u64, open: u64) -> ConnectionCounts {
    ConnectionCounts { opened, open }
}

#[test]
fn a_lazy_mesh_connects_nothing_at_start_and_each_pair_once_when_all_dial_at_once() {
    const N: usize = 8;
    let start = Barrier::new(N);
    let seen = with_meshes(
        N,
        false,
        Options::default(),
        &[],
        |_, _| {},
        |rank, comm| {
            let at_start = comm.connections();
            // Every rank starts the alltoall at the same moment: every pair needs its connection
            // on both sides at once.
            start.wait();
            let received = alltoall(rank, N, &comm);
            let expected: Vec<f32> = (0..N).map(|j| (100 * j + rank) as f32).collect();
            assert_eq!(received, expected, "rank {rank}");
            let after_first = comm.connections();
            // Connections are reused: a second alltoall opens none.
            assert_eq!(alltoall(rank, N, &comm), expected, "rank {rank}");
            (at_start, after_first, comm.connections())
        },
    );
    for (rank, seen) in seen.into_iter().enumerate() {
        let (at_start, after_first, after_second) = seen.unwrap();
        assert_eq!(at_start, counts(0, 0), "rank {rank} at start");
        let all = (N - 1) as u64;
        assert_eq!(after_first, counts(all, all), "rank {rank} after alltoall");
        assert_eq!(after_second, counts(all, all), "rank {rank} after 2nd");
    }
}

#[test]
fn an_eager_mesh_opens_every_connection_at_start() {
    const N: usize = 6;
    let seen = with_meshes(
        N,
        true,
        Options::default(),
        &[],
        |_, _| {},
        |rank, comm| {
            let at_start = comm.connections();
            let mut buf = f32_bytes(&[rank as f32]);
            comm.allreduce("sum", &mut buf, &[1], DType::F32, ReduceOp::Sum, 1.0, 1.0)
                .unwrap();
            assert_eq!(f32_values(&buf), [15.0]);
            comm.shutdown();
            (at_start, comm.connections())
        },
    );
    for (rank, seen) in seen.into_iter().enumerate() {
        let (at_start, closed) = seen.unwrap();
        let all = (N - 1) as u64;
        assert_eq!(at_start, counts(all, all), "rank {rank}");
        assert_eq!(closed, counts(all, 0), "rank {rank} after shutdown");
    }
}

#[test]
fn peers_without_the_key_are_refused_and_do_not_delay_the_job() {
    const N: usize = 6;
    let stranger = data_key(&JobSecret::generate());
    let mut silent: Vec<TcpStream> = Vec::new();
    let mut impostors = Vec::new();
    let took = with_meshes(
        N,
        false,
        Options::default(),
        &[],
        |peers, job| {
            for &addr in peers {
                // Silent connections hold handshake slots until their deadline...
                for _ in 0..40 {
                    silent.push(TcpStream::connect(addr).unwrap());
                }
            }
            // ...and impostors that know the job's addresses but not its secret claim the
            // highest rank to every other, repeatedly, while the job runs.
            let peers = peers.to_vec();
            let stranger = stranger.clone();
            impostors.push(thread::spawn(move || {
                let mut accepted = 0;
                for round in 0..10 {
                    for (to, &addr) in peers.iter().enumerate().take(N - 1) {
                        let Ok(mut stream) = TcpStream::connect(addr) else {
                            continue; // the listener closed: every real peer is in
                        };
                        let dial = Dial {
                            key: &stranger,
                            job_id: &job,
                            from: (N - 1) as u32,
                            to: to as u32,
                            size: N as u32,
                            round: 0,
                        };
                        let deadline = Instant::now() + Duration::from_secs(3);
                        if handshake::dial(&mut stream, dial, deadline, &|| Ok(())).is_ok() {
                            accepted += 1;
                        }
                    }
                    thread::sleep(Duration::from_millis(5 * round));
                }
                accepted
            }));
        },
        |rank, comm| {
            let started = Instant::now();
            let mut buf = f32_bytes(&[rank as f32; 16]);
            comm.allreduce("sum", &mut buf, &[16], DType::F32, ReduceOp::Sum, 1.0, 1.0)
                .unwrap();
            assert_eq!(f32_values(&buf), [15.0; 16], "rank {rank}");
            let _ = alltoall(rank, N, &comm);
            assert_eq!(comm.connections().opened, (N - 1) as u64, "rank {rank}");
            started.elapsed()
        },
    );
    for impostor in impostors {
        assert_eq!(impostor.join().unwrap(), 0, "an impostor was accepted");
    }
    for (rank, took) in took.into_iter().enumerate() {
        let took = took.unwrap();
        // Well under the 2 s handshake deadline the silent connections hold their slots for.
        assert!(
            took < Duration::from_millis(1500),
            "rank {rank} took {took:?}"
        );
    }
    drop(silent);
}

#[test]
fn a_peer_that_never_shows_up_is_named_within_the_connect_timeout() {
    const N: usize = 4;
    // Waiting for a higher rank to dial is bounded by the longer of the two.
    let timeouts = Options {
        connect_timeout: Duration::from_millis(300),
        op_timeout: Duration::from_millis(600),
    };
    let errors = with_meshes(
        N,
        false,
        timeouts,
        &[3],
        |_, _| {},
        |rank, comm| {
            let started = Instant::now();
            let mut buf = f32_bytes(&[rank as f32]);
            let err = comm
                .allreduce("sum", &mut buf, &[1], DType::F32, ReduceOp::Sum, 1.0, 1.0)
                .unwrap_err();
            (err, started.elapsed())
        },
    );
    for (rank, outcome) in errors.into_iter().enumerate().take(N - 1) {
        let (err, took) = outcome.unwrap();
        let text = err.to_string();
        assert!(
            took < Duration::from_secs(3),
            "rank {rank} took {took:?}: {text}"
        );
        // The ranks below 3 wait for its dial; none hangs, and the one that times out first
        // tells the others, whose errors then name it or rank 3.
        assert!(
            matches!(err, Error::Timeout { .. } | Error::Peer { .. }),
            "rank {rank}: {text}"
        );
        if let Error::Timeout { .. } = err {
            assert!(text.contains("rank 3"), "rank {rank}: {text}");
        }
    }
}

#[test]
fn the_engine_runs_over_a_lazy_mesh_and_reports_its_connections() {
    const N: usize = 4;
    // Each rank connects to the peers its work needs, not to every member: the negotiation
    // tree's edges (at 4 members a star, rank 0 and each other) and the small allreduce's
    // recursive-doubling partners (r ^ 1, r ^ 2). Ranks 1 and 2 never talk.
    let needs: [u64; N] = [3, 2, 2, 3];
    // Every rank looks at its fresh engine before any rank submits. The engine's first cycle
    // runs as it starts and may already have reached its tree peers, never more.
    let started = Barrier::new(N);
    let opened = with_meshes(
        N,
        false,
        Options::default(),
        &[],
        |_, _| {},
        |rank, comm| {
            let engine = Engine::start(Arc::new(comm), EngineConfig::default()).unwrap();
            let stat = |name: &str| stat(&engine, name);
            let at_start = stat("connections_opened");
            started.wait();
            let tree_peers = if rank == 0 { N - 1 } else { 1 } as u64;
            assert!(at_start <= tree_peers, "rank {rank} at start: {at_start}");
            // The last rank submits late: the others' engines learn of it when it connects.
            if rank == N - 1 {
                thread::sleep(Duration::from_millis(200));
            }
            let mut values = [rank as f32; 8];
            let mut sub = Submission::new(OpKind::Allreduce, "grad");
            sub.dtype = DType::F32;
            sub.shape = vec![8];
            // SAFETY: `values` stays alive and untouched until the handle completes.
            sub.tensor = unsafe { RawTensor::new(values.as_mut_ptr().cast(), 32) };
            let handle = engine.submit(sub).unwrap();
            engine
                .wait(handle, Duration::from_secs(20))
                .unwrap()
                .unwrap();
            assert_eq!(values, [6.0; 8]);
            let opened = (stat("connections_opened"), stat("connections_open"));
            engine.shutdown();
            opened
        },
    );
    for (rank, opened) in opened.into_iter().enumerate() {
        assert_eq!(opened.unwrap(), (needs[rank], needs[rank]), "rank {rank}");
    }
}
