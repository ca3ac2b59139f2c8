//! The TCP collective algorithms against each other (`cargo bench -p kolo-collective --bench
//! algorithms`): for n = 2, 3, 4, 8, 16 real rank processes (this binary re-run as children)
//! on 127.0.0.1, every algorithm of allreduce (ring, recursive doubling), broadcast (chain,
//! binomial tree) and allgather (ring, recursive doubling) at sizes 4 B … 64 MiB (powers of
//! 4), forced with `Communicator::set_algorithms`, the algorithms interleaved round by round
//! so machine noise hits them alike; the median of the rounds, as rank 0 timed it.
//!
//! Prints a table per collective and n (latency per algorithm and size), the crossover (the
//! largest size at which the O(log n) algorithm still wins), and, on the last line, all of it
//! as one JSON document. `KOLO_ALGO_BENCH_NS=2,8` picks n, `KOLO_ALGO_BENCH_OPS=broadcast`
//! the collectives, `KOLO_ALGO_BENCH_MAX_BYTES` the largest size, `KOLO_ALGO_BENCH_ROUNDS` the
//! rounds (default 3). Never run in CI.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kolo_collective::collectives::{Algorithm, AlgorithmChoices};
use kolo_collective::communicator::{Communicator, RankInfo};
use kolo_collective::control::JobSecret;
use kolo_collective::transport::handshake::data_key;
use kolo_collective::transport::{DataListener, Mesh, MeshConfig};
use kolo_collective::wire::OpKind;
use kolo_collective::{AbortSignal, DType, ReduceOp};

/// Seconds per call by collective, n, algorithm and bytes.
type Results = BTreeMap<String, BTreeMap<usize, BTreeMap<String, BTreeMap<usize, f64>>>>;

const CHILD: &str = "KOLO_ALGO_BENCH_CHILD";
const OPS: [OpKind; 3] = [OpKind::Allreduce, OpKind::Broadcast, OpKind::Allgather];

fn env_list(name: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(name).map_or_else(
        |_| default.to_vec(),
        |v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect(),
    )
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn sizes() -> Vec<usize> {
    let max = env_usize("KOLO_ALGO_BENCH_MAX_BYTES", 64 << 20);
    std::iter::successors(Some(4usize), |s| Some(s * 4))
        .take_while(|s| *s <= max)
        .collect()
}

/// Calls per timing at `bytes`: identical on every rank (the collectives must match up).
fn calls(bytes: usize) -> usize {
    ((4usize << 20) / bytes.max(1)).clamp(3, 200)
}

fn main() {
    if let Ok(spec) = std::env::var(CHILD) {
        return child(&spec);
    }
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let ns = env_list("KOLO_ALGO_BENCH_NS", &[2, 3, 4, 8, 16]);
    let exe = std::env::current_exe().expect("this benchmark's path");
    let secret = JobSecret::generate().to_hex();
    // results[op][n][algorithm][bytes] = seconds
    let mut results: Results = BTreeMap::new();
    for &n in &ns {
        let dir = std::env::temp_dir().join(format!("kolo-algo-bench-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("rendezvous directory");
        let mut children: Vec<_> = (0..n)
            .map(|rank| {
                Command::new(&exe)
                    .env(CHILD, format!("{rank},{n},{},{secret}", dir.display()))
                    .stdout(if rank == 0 {
                        Stdio::piped()
                    } else {
                        Stdio::null()
                    })
                    .spawn()
                    .expect("rank process starts")
            })
            .collect();
        let out = children[0].stdout.take().expect("rank 0's output");
        for line in BufReader::new(out).lines() {
            let line = line.expect("rank 0's output");
            let f: Vec<&str> = line.split_whitespace().collect();
            if let ["RESULT", op, algorithm, bytes, seconds] = f[..] {
                results
                    .entry(op.to_owned())
                    .or_default()
                    .entry(n)
                    .or_default()
                    .entry(algorithm.to_owned())
                    .or_default()
                    .insert(bytes.parse().unwrap(), seconds.parse().unwrap());
            }
        }
        for mut c in children {
            let status = c.wait().expect("rank process ends");
            assert!(status.success(), "a rank of {n} failed: {status}");
        }
        let _ = std::fs::remove_dir_all(&dir);
        eprintln!("n = {n} done");
    }
    report(&results);
}

fn fast_and_slow(op: &str) -> (&'static str, &'static str) {
    if op == "broadcast" {
        ("binomial_tree", "chain")
    } else {
        ("recursive_doubling", "ring")
    }
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn report(results: &Results) {
    let mut crossovers = Vec::new();
    for (op, by_n) in results {
        let (fast, slow) = fast_and_slow(op);
        for (n, by_algo) in by_n {
            println!("\n{op}, n = {n}: latency (µs) per algorithm; ratio {fast}/{slow}");
            println!("{:>10} {:>14} {:>14} {:>8}", "size", fast, slow, "ratio");
            let (Some(f), Some(s)) = (by_algo.get(fast), by_algo.get(slow)) else {
                continue;
            };
            let mut last_win: Option<usize> = None;
            let mut lost = false;
            for (bytes, tf) in f {
                let ts = s.get(bytes).copied().unwrap_or(f64::NAN);
                println!(
                    "{:>10} {:>14.1} {:>14.1} {:>8.2}",
                    human(*bytes),
                    tf * 1e6,
                    ts * 1e6,
                    tf / ts
                );
                if !lost && *tf <= ts {
                    last_win = Some(*bytes);
                } else {
                    lost = true;
                }
            }
            let text = last_win.map_or("never".into(), human);
            println!("crossover: {fast} wins up to {text}");
            let wins = last_win.map_or("null".into(), |b| b.to_string());
            crossovers.push(format!(
                r#"{{"op":"{op}","n":{n},"fast":"{fast}","slow":"{slow}","fast_wins_up_to_bytes":{wins}}}"#
            ));
        }
    }
    let mut parts = Vec::new();
    for (op, by_n) in results {
        for (n, by_algo) in by_n {
            for (algorithm, by_bytes) in by_algo {
                let points: Vec<String> = by_bytes
                    .iter()
                    .map(|(b, t)| format!("[{b},{t:e}]"))
                    .collect();
                parts.push(format!(
                    r#"{{"op":"{op}","n":{n},"algorithm":"{algorithm}","bytes_seconds":[{}]}}"#,
                    points.join(",")
                ));
            }
        }
    }
    let doc = format!(
        r#"{{"bench":"algorithms","note":"rank 0's median seconds per call; real processes over 127.0.0.1","results":[{}],"crossovers":[{}]}}"#,
        parts.join(","),
        crossovers.join(",")
    );
    println!("{doc}");
}

/// One rank: rendezvous through files in the directory, build the mesh, run every timing.
fn child(spec: &str) {
    let parts: Vec<&str> = spec.splitn(4, ',').collect();
    let (rank, n): (usize, usize) = (parts[0].parse().unwrap(), parts[1].parse().unwrap());
    let dir = PathBuf::from(parts[2]);
    let secret = JobSecret::from_hex(parts[3], "bench secret").expect("secret");
    let listener = DataListener::bind(IpAddr::V4(Ipv4Addr::LOCALHOST)).expect("bind");
    let tmp = dir.join(format!("{rank}.tmp"));
    std::fs::write(&tmp, listener.local_addr().to_string()).expect("publish address");
    std::fs::rename(&tmp, dir.join(format!("{rank}.addr"))).expect("publish address");
    let peers = wait_for_peers(&dir, n);
    let mut job_id = [0u8; 16];
    job_id[..8].copy_from_slice(
        &u64::from_str_radix(&parts[3][..16], 16)
            .unwrap()
            .to_le_bytes(),
    );
    let config = MeshConfig {
        job_id,
        key: data_key(&secret),
        rank,
        round: 0,
        peers,
        connect_timeout: Duration::from_secs(60),
        op_timeout: Duration::from_secs(120),
    };
    let abort = AbortSignal::new();
    let mesh = Mesh::establish(listener, config, abort.clone()).expect("mesh forms");
    let info = RankInfo {
        rank,
        size: n,
        local_rank: rank,
        local_size: n,
        cross_rank: 0,
        cross_size: 1,
        hosts: (0..n).map(|r| format!("host{r}")).collect(),
    };
    let comm = Communicator::new(info, mesh, abort);
    let rounds = env_usize("KOLO_ALGO_BENCH_ROUNDS", 3);
    let only = std::env::var("KOLO_ALGO_BENCH_OPS").unwrap_or_default();
    let ops = OPS
        .into_iter()
        .filter(|op| only.is_empty() || only.split(',').any(|o| o.trim() == op.name()));
    for op in ops {
        for bytes in sizes() {
            let mut times: BTreeMap<Algorithm, Vec<f64>> = BTreeMap::new();
            for _ in 0..rounds {
                for &algorithm in Algorithm::of(op) {
                    let mut choices = AlgorithmChoices::default();
                    choices.force(op, Some(algorithm)).unwrap();
                    comm.set_algorithms(choices);
                    times
                        .entry(algorithm)
                        .or_default()
                        .push(time(&comm, op, bytes, rank, n));
                }
            }
            if rank == 0 {
                for (algorithm, mut t) in times {
                    t.sort_by(f64::total_cmp);
                    println!(
                        "RESULT {} {algorithm} {bytes} {:e}",
                        op.name(),
                        t[t.len() / 2]
                    );
                }
            }
        }
    }
    comm.shutdown();
}

fn wait_for_peers(dir: &Path, n: usize) -> Vec<SocketAddr> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let addrs: Vec<Option<SocketAddr>> = (0..n)
            .map(|r| {
                std::fs::read_to_string(dir.join(format!("{r}.addr")))
                    .ok()
                    .and_then(|s| s.parse().ok())
            })
            .collect();
        if addrs.iter().all(Option::is_some) {
            return addrs.into_iter().flatten().collect();
        }
        assert!(
            Instant::now() < deadline,
            "the other ranks never published addresses"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Seconds per call of `op` moving `bytes` (the tensor; the gathered result for allgather).
fn time(comm: &Communicator, op: OpKind, bytes: usize, rank: usize, n: usize) -> f64 {
    let calls = calls(bytes);
    let mut buf = vec![1u8; bytes];
    let rows = (bytes / n).max(1);
    let input = vec![rank as u8; rows];
    let mut output = vec![0u8; rows * n];
    let mut once = || match op {
        OpKind::Allreduce => {
            let count = (bytes / 4).max(1);
            let buf = &mut buf[..count * 4];
            comm.allreduce(
                "b",
                buf,
                &[count as i64],
                DType::F32,
                ReduceOp::Sum,
                1.0,
                1.0,
            )
            .expect("allreduce");
        }
        OpKind::Broadcast => comm
            .broadcast("b", &mut buf, &[bytes as i64], DType::U8, 0)
            .expect("broadcast"),
        _ => {
            comm.allgather("b", &input, &[rows as i64], DType::U8, |_| {
                Ok(&mut output[..])
            })
            .expect("allgather");
        }
    };
    once();
    comm.barrier().expect("barrier");
    let start = Instant::now();
    for _ in 0..calls {
        once();
    }
    comm.barrier().expect("barrier");
    start.elapsed().as_secs_f64() / calls as f64
}
