//! The TCP data plane and the CPU collectives, with ranks as threads of this process.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use half::f16;
use kolo_collective::collectives::{reducescatter_rows, Algorithm, AlgorithmChoices};
use kolo_collective::communicator::{Communicator, RankInfo};
use kolo_collective::control::mac::MacKey;
use kolo_collective::control::JobSecret;
use kolo_collective::reduce::{bf16_to_f32, f32_to_bf16};
use kolo_collective::transport::handshake::{self, data_key, Dial};
use kolo_collective::transport::{DataListener, Mesh, MeshConfig};
use kolo_collective::wire::{self, FrameKind, Header, Hello, JobId, OpDescriptor, OpKind};
use kolo_collective::{AbortCause, AbortSignal, DType, Error, ReduceOp};

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

pub(crate) fn job_id() -> JobId {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&std::process::id().to_le_bytes().repeat(2));
    id[8..].copy_from_slice(&NEXT.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    id
}

/// The data-plane key of the tests' job secret (one per test process).
pub(crate) fn key() -> MacKey {
    static SECRET: std::sync::OnceLock<JobSecret> = std::sync::OnceLock::new();
    data_key(SECRET.get_or_init(JobSecret::generate))
}

pub(crate) fn info(rank: usize, size: usize) -> RankInfo {
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

pub(crate) struct Options {
    pub(crate) op_timeout: Duration,
    pub(crate) connect_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            op_timeout: Duration::from_secs(20),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// Runs `f(rank, comm)` on `n` ranks (threads), each with its own listener, mesh and
/// communicator; `before` runs after the listeners are bound and before the mesh forms.
fn with_ranks_custom<T: Send>(
    n: usize,
    options: Options,
    before: impl FnOnce(&[SocketAddr]),
    f: impl Fn(usize, Communicator) -> T + Sync,
) -> Vec<T> {
    with_meshes(n, true, options, &[], |peers, _| before(peers), f)
        .into_iter()
        .map(|r| r.expect("every rank is present"))
        .collect()
}

/// Runs `f(rank, comm)` on `n` ranks (threads) over meshes formed at once (`eager`, today's
/// design) or connecting on demand; `before` runs after the listeners are bound. Ranks listed
/// in `absent` bind a listener but never form a mesh (their entry is `None`).
pub(crate) fn with_meshes<T: Send>(
    n: usize,
    eager: bool,
    options: Options,
    absent: &[usize],
    before: impl FnOnce(&[SocketAddr], JobId),
    f: impl Fn(usize, Communicator) -> T + Sync,
) -> Vec<Option<T>> {
    let listeners: Vec<DataListener> = (0..n)
        .map(|_| DataListener::bind(LOCALHOST).unwrap())
        .collect();
    let peers: Vec<SocketAddr> = listeners.iter().map(DataListener::local_addr).collect();
    let job_id = job_id();
    before(&peers, job_id);
    thread::scope(|s| {
        let handles: Vec<_> = listeners
            .into_iter()
            .enumerate()
            .map(|(rank, listener)| {
                let config = MeshConfig {
                    job_id,
                    key: key(),
                    rank,
                    round: 0,
                    peers: peers.clone(),
                    connect_timeout: options.connect_timeout,
                    op_timeout: options.op_timeout,
                };
                let f = &f;
                let absent = absent.contains(&rank);
                s.spawn(move || {
                    if absent {
                        // Bound and registered, but the process never gets to its mesh.
                        thread::sleep(options.connect_timeout * 3);
                        drop(listener);
                        return None;
                    }
                    let abort = AbortSignal::new();
                    let mesh = if eager {
                        Mesh::establish(listener, config, abort.clone())
                    } else {
                        Mesh::connect_lazily(listener, config, abort.clone())
                    }
                    .expect("mesh forms");
                    Some(f(rank, Communicator::new(info(rank, n), mesh, abort)))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

pub(crate) fn with_ranks<T: Send>(n: usize, f: impl Fn(usize, Communicator) -> T + Sync) -> Vec<T> {
    with_ranks_custom(n, Options::default(), |_| {}, f)
}

// ---------------------------------------------------------------------------------------------
// Values in every dtype, and reference results computed element by element.

fn encode(dtype: DType, x: f64) -> Vec<u8> {
    match dtype {
        DType::U8 => vec![(x as i64) as u8],
        DType::I8 => ((x as i64) as i8).to_ne_bytes().to_vec(),
        DType::I16 => ((x as i64) as i16).to_ne_bytes().to_vec(),
        DType::I32 => ((x as i64) as i32).to_ne_bytes().to_vec(),
        DType::I64 => (x as i64).to_ne_bytes().to_vec(),
        DType::F16 => f16::from_f32(x as f32).to_ne_bytes().to_vec(),
        DType::BF16 => f32_to_bf16(x as f32).to_ne_bytes().to_vec(),
        DType::F32 => (x as f32).to_ne_bytes().to_vec(),
        DType::F64 => x.to_ne_bytes().to_vec(),
        DType::Bool => vec![u8::from(x != 0.0)],
    }
}

fn decode(dtype: DType, b: &[u8]) -> f64 {
    match dtype {
        DType::U8 => f64::from(b[0]),
        DType::I8 => f64::from(b[0] as i8),
        DType::I16 => f64::from(i16::from_ne_bytes([b[0], b[1]])),
        DType::I32 => f64::from(i32::from_ne_bytes([b[0], b[1], b[2], b[3]])),
        DType::I64 => i64::from_ne_bytes(b.try_into().unwrap()) as f64,
        DType::F16 => f64::from(f16::from_ne_bytes([b[0], b[1]]).to_f32()),
        DType::BF16 => f64::from(bf16_to_f32(u16::from_ne_bytes([b[0], b[1]]))),
        DType::F32 => f64::from(f32::from_ne_bytes([b[0], b[1], b[2], b[3]])),
        DType::F64 => f64::from_ne_bytes(b.try_into().unwrap()),
        DType::Bool => f64::from(b[0]),
    }
}

/// Rounds `x` to what `dtype` stores (integers wrap).
fn round(dtype: DType, x: f64) -> f64 {
    decode(dtype, &encode(dtype, x))
}

/// Horovod's scaling: integers multiply in float64 and truncate; float32 (and float16,
/// bfloat16 widened to it) multiply by the factor rounded to float32, in float32.
fn scaled(dtype: DType, x: f64, factor: f64) -> f64 {
    if factor == 1.0 {
        return x;
    }
    match dtype {
        DType::F16 | DType::BF16 | DType::F32 => {
            round(dtype, f64::from((x as f32) * (factor as f32)))
        }
        DType::F64 => x * factor,
        _ => round(dtype, (x * factor).trunc()),
    }
}

fn combine(dtype: DType, op: ReduceOp, a: f64, b: f64) -> f64 {
    let r = match (dtype, op) {
        (DType::Bool, ReduceOp::Sum | ReduceOp::Max) => f64::from(a != 0.0 || b != 0.0),
        (DType::Bool, _) => f64::from(a != 0.0 && b != 0.0),
        (_, ReduceOp::Sum | ReduceOp::Average) => a + b,
        (_, ReduceOp::Product) => a * b,
        (_, ReduceOp::Min) => a.min(b),
        (_, ReduceOp::Max) => a.max(b),
        (_, ReduceOp::Adasum) => unreachable!("elementwise ops only (see adasum.rs)"),
    };
    round(dtype, r)
}

/// Deterministic per-rank data: small values, exact in every dtype.
fn value(dtype: DType, rank: usize, i: usize, salt: usize) -> f64 {
    if dtype == DType::Bool {
        return f64::from(u8::from(!(rank + i + salt).is_multiple_of(3)));
    }
    ((rank * 7 + i * 13 + salt * 5) % 9) as f64 - 4.0
}

fn tensor(dtype: DType, rank: usize, count: usize, salt: usize) -> Vec<u8> {
    (0..count)
        .flat_map(|i| encode(dtype, value(dtype, rank, i, salt)))
        .collect()
}

struct Reduction {
    op: ReduceOp,
    prescale: f64,
    postscale: f64,
}

/// The reduced tensor of `count` elements over `size` ranks.
fn reference(dtype: DType, r: &Reduction, size: usize, count: usize, salt: usize) -> Vec<u8> {
    let factor = if r.op == ReduceOp::Average {
        r.postscale / size as f64
    } else {
        r.postscale
    };
    (0..count)
        .flat_map(|i| {
            let inputs = (0..size)
                .map(|rank| scaled(dtype, round(dtype, value(dtype, rank, i, salt)), r.prescale));
            let reduced = inputs.reduce(|a, b| combine(dtype, r.op, a, b)).unwrap();
            encode(dtype, scaled(dtype, reduced, factor))
        })
        .collect()
}

fn reductions(dtype: DType) -> Vec<Reduction> {
    let mut out: Vec<Reduction> = ReduceOp::ELEMENTWISE
        .into_iter()
        .filter(|op| !(dtype == DType::Bool && *op == ReduceOp::Average))
        .map(|op| Reduction {
            op,
            prescale: 1.0,
            postscale: 1.0,
        })
        .collect();
    if dtype != DType::Bool {
        out.push(Reduction {
            op: ReduceOp::Sum,
            prescale: 0.5,
            postscale: 3.0,
        });
        out.push(Reduction {
            op: ReduceOp::Average,
            prescale: 2.0,
            postscale: 1.5,
        });
    }
    out
}

fn show(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks(dtype.size())
        .map(|c| decode(dtype, c))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Every collective, every dtype, every op, N = 1, 2, 3.

fn check_everything(rank: usize, comm: &Communicator) {
    let size = comm.info().size;
    for dtype in DType::ALL {
        for (k, r) in reductions(dtype).iter().enumerate() {
            for (count, shape) in [
                (0usize, vec![0i64]),
                (1, vec![1]),
                (1023, vec![341, 3]),
                (6, vec![]),
            ] {
                let count = if shape.is_empty() { 1 } else { count };
                let salt = k + count;
                let mut buf = tensor(dtype, rank, count, salt);
                let name = format!("ar.{dtype}.{}.{count}", r.op);
                comm.allreduce(
                    &name,
                    &mut buf,
                    &shape,
                    dtype,
                    r.op,
                    r.prescale,
                    r.postscale,
                )
                .unwrap();
                let want = reference(dtype, r, size, count, salt);
                assert_eq!(
                    show(dtype, &buf),
                    show(dtype, &want),
                    "{name} pre {} post {} on {size} ranks",
                    r.prescale,
                    r.postscale
                );
            }
            for rows in [0usize, 1, 7] {
                let cols = 3;
                let salt = k + rows + 1;
                let input = tensor(dtype, rank, rows * cols, salt);
                let split = reducescatter_rows(rows as u64, size);
                let mine = split[rank] as usize;
                let start: usize = split[..rank].iter().sum::<u64>() as usize;
                let mut output = vec![0u8; mine * cols * dtype.size()];
                let name = format!("rs.{dtype}.{}.{rows}", r.op);
                comm.reducescatter(
                    &name,
                    &input,
                    &mut output,
                    &[rows as i64, cols as i64],
                    dtype,
                    r.op,
                    r.prescale,
                    r.postscale,
                )
                .unwrap();
                let full = reference(dtype, r, size, rows * cols, salt);
                let esize = dtype.size();
                let want = &full[start * cols * esize..(start + mine) * cols * esize];
                assert_eq!(
                    show(dtype, &output),
                    show(dtype, want),
                    "{name} on {size} ranks, rank {rank}"
                );
            }
        }
        // allgather: rank 0 has no rows, rank r has r + 1.
        for cols in [1usize, 5] {
            let my_rows = if rank == 0 { 0 } else { rank + 1 };
            let input: Vec<u8> = (0..my_rows * cols)
                .flat_map(|i| encode(dtype, value(dtype, rank, i, 2)))
                .collect();
            let mut output = Vec::new();
            let rows = comm
                .allgather(
                    "ag",
                    &input,
                    &[my_rows as i64, cols as i64],
                    dtype,
                    |rows| {
                        let total: u64 = rows.iter().sum();
                        output = vec![0u8; total as usize * cols * dtype.size()];
                        Ok(&mut output[..])
                    },
                )
                .unwrap();
            let want_rows: Vec<u64> = (0..size)
                .map(|r| if r == 0 { 0 } else { r as u64 + 1 })
                .collect();
            assert_eq!(rows, want_rows);
            let want: Vec<u8> = (0..size)
                .flat_map(|r| {
                    let n = if r == 0 { 0 } else { r + 1 } * cols;
                    (0..n).flat_map(move |i| encode(dtype, value(dtype, r, i, 2)))
                })
                .collect();
            assert_eq!(output, want, "allgather {dtype} on {size} ranks");
        }
        // broadcast from every root, several sizes.
        for root in 0..size {
            for count in [0usize, 1, 1023] {
                let mut buf = tensor(dtype, rank, count, root);
                comm.broadcast("bc", &mut buf, &[count as i64], dtype, root)
                    .unwrap();
                assert_eq!(
                    buf,
                    tensor(dtype, root, count, root),
                    "broadcast {dtype} root {root}"
                );
            }
        }
        // alltoall with uneven splits, zeros included: rank r sends (r + 2j) % 3 rows to rank j.
        let cols = 2;
        let splits: Vec<u64> = (0..size).map(|j| ((rank + 2 * j) % 3) as u64).collect();
        let rows: u64 = splits.iter().sum();
        let input = tensor(dtype, rank, rows as usize * cols, 9);
        let mut output = Vec::new();
        let received = comm
            .alltoall(
                "a2a",
                &input,
                &[rows as i64, cols as i64],
                dtype,
                &splits,
                |recv| {
                    output = vec![0u8; recv.iter().sum::<u64>() as usize * cols * dtype.size()];
                    Ok(&mut output[..])
                },
            )
            .unwrap();
        let want_splits: Vec<u64> = (0..size).map(|j| ((j + 2 * rank) % 3) as u64).collect();
        assert_eq!(received, want_splits);
        let want: Vec<u8> = (0..size)
            .flat_map(|j| {
                let their_splits: Vec<usize> = (0..size).map(|k| (j + 2 * k) % 3).collect();
                let offset: usize = their_splits[..rank].iter().sum();
                let theirs = tensor(dtype, j, their_splits.iter().sum::<usize>() * cols, 9);
                let es = dtype.size() * cols;
                theirs[offset * es..(offset + their_splits[rank]) * es].to_vec()
            })
            .collect();
        assert_eq!(output, want, "alltoall {dtype} on {size} ranks");
        comm.barrier().unwrap();
    }
}

#[test]
fn every_collective_dtype_and_op_on_one_two_and_three_ranks() {
    check_everything(0, &Communicator::single());
    for n in 1..=3 {
        with_ranks(n, |rank, comm| check_everything(rank, &comm));
    }
}

#[test]
fn messages_beyond_16_mib() {
    with_ranks(3, |rank, comm| {
        let count = (17 << 20) / 4 + 3;
        let value = |r: usize, i: usize| ((i * 31 + r * 7) % 1000) as f32;
        let mut buf: Vec<u8> = (0..count)
            .flat_map(|i| value(rank, i).to_ne_bytes())
            .collect();
        comm.allreduce(
            "big",
            &mut buf,
            &[count as i64],
            DType::F32,
            ReduceOp::Sum,
            1.0,
            1.0,
        )
        .unwrap();
        for (i, chunk) in buf.chunks_exact(4).enumerate() {
            let want: f32 = (0..3).map(|r| value(r, i)).sum();
            assert_eq!(
                f32::from_ne_bytes(chunk.try_into().unwrap()),
                want,
                "element {i}"
            );
        }
        let rows = (6 << 20) / 8 + rank;
        let input: Vec<u8> = (0..rows)
            .flat_map(|i| ((i + rank * 1_000_000) as u64).to_ne_bytes())
            .collect();
        let mut output = Vec::new();
        let got = comm
            .allgather("big.gather", &input, &[rows as i64], DType::I64, |rows| {
                output = vec![0u8; rows.iter().sum::<u64>() as usize * 8];
                Ok(&mut output[..])
            })
            .unwrap();
        assert_eq!(
            got,
            (0..3)
                .map(|r| ((6 << 20) / 8 + r) as u64)
                .collect::<Vec<_>>()
        );
        let want: Vec<u8> = (0..3)
            .flat_map(|r| {
                (0..(6 << 20) / 8 + r).flat_map(move |i| ((i + r * 1_000_000) as u64).to_ne_bytes())
            })
            .collect();
        assert!(output == want, "big allgather differs");

        // Reducescatter of ~12 MiB with an uneven split and scaling (several ring pieces).
        let (rows, cols) = (1_000_003usize, 3usize);
        let input: Vec<u8> = (0..rows * cols)
            .flat_map(|i| value(rank, i).to_ne_bytes())
            .collect();
        let split = reducescatter_rows(rows as u64, 3);
        let start = split[..rank].iter().sum::<u64>() as usize;
        let mut output = vec![0u8; split[rank] as usize * cols * 4];
        comm.reducescatter(
            "big.rs",
            &input,
            &mut output,
            &[rows as i64, cols as i64],
            DType::F32,
            ReduceOp::Average,
            2.0,
            1.5,
        )
        .unwrap();
        for (k, chunk) in output.chunks_exact(4).enumerate() {
            let i = start * cols + k;
            let sum: f32 = (0..3).map(|r| value(r, i) * 2.0).sum();
            let want = (f64::from(sum) * (1.5 / 3.0)) as f32;
            assert_eq!(
                f32::from_ne_bytes(chunk.try_into().unwrap()),
                want,
                "row element {i}"
            );
        }

        // Broadcast of 17 MiB down the chain from rank 1.
        let mut buf: Vec<u8> = (0..count)
            .flat_map(|i| value(rank, i).to_ne_bytes())
            .collect();
        comm.broadcast("big.bc", &mut buf, &[count as i64], DType::F32, 1)
            .unwrap();
        assert!(
            buf.chunks_exact(4)
                .enumerate()
                .all(|(i, c)| f32::from_ne_bytes(c.try_into().unwrap()) == value(1, i)),
            "big broadcast differs"
        );
    });
}

// ---------------------------------------------------------------------------------------------
// Argument errors and mismatches.

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

#[test]
fn invalid_arguments_are_reported_locally_and_as_mismatch_elsewhere() {
    let single = Communicator::single();
    let err = single
        .allreduce(
            "x",
            &mut [0u8; 7],
            &[2],
            DType::F32,
            ReduceOp::Sum,
            1.0,
            1.0,
        )
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("holds 7 bytes") && m.contains("needs 8 bytes")),
        "{err}"
    );
    let err = single
        .allreduce(
            "b",
            &mut [1u8],
            &[1],
            DType::Bool,
            ReduceOp::Average,
            1.0,
            1.0,
        )
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)));
    let err = single
        .allreduce("b", &mut [1u8], &[1], DType::Bool, ReduceOp::Sum, 2.0, 1.0)
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)));
    let err = single
        .broadcast("r", &mut [0u8; 4], &[1], DType::F32, 1)
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("root rank 1 is out of range")),
        "{err}"
    );
    let err = single
        .alltoall("s", &[0u8; 8], &[2], DType::F32, &[1], |_| unreachable!())
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("add up to 1 rows but the tensor has 2")),
        "{err}"
    );
    let err = single
        .allgather("s", &[0u8; 4], &[], DType::F32, |_| unreachable!())
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("scalar")),
        "{err}"
    );
    let err = single
        .reducescatter(
            "s",
            &[0u8; 8],
            &mut [0u8; 4],
            &[2],
            DType::F32,
            ReduceOp::Sum,
            1.0,
            1.0,
        )
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("output buffer holds 4 bytes")),
        "{err}"
    );
    // Average and scaling on one rank: Average is the identity, prescale applies.
    let mut buf = f32_bytes(&[1.0, 2.0]);
    single
        .allreduce("", &mut buf, &[2], DType::F32, ReduceOp::Average, 3.0, 1.0)
        .unwrap();
    assert_eq!(buf, f32_bytes(&[3.0, 6.0]));

    with_ranks(3, |rank, comm| {
        let mut buf = f32_bytes(&[1.0; 4]);
        let shape = if rank == 1 { [5i64] } else { [4] };
        let err = comm
            .allreduce("bad", &mut buf, &shape, DType::F32, ReduceOp::Sum, 1.0, 1.0)
            .unwrap_err();
        match (rank, &err) {
            (1, Error::InvalidArgument(m)) => assert!(
                m.starts_with("allreduce 'bad': the input buffer holds 16 bytes"),
                "{m}"
            ),
            (_, Error::Mismatch(m)) => {
                assert!(m.contains("rank 1 passed invalid arguments"), "{m}")
            }
            _ => panic!("rank {rank}: {err:?}"),
        }
        let splits: Vec<u64> = if rank == 2 { vec![1, 1] } else { vec![0, 0, 0] };
        let err = comm
            .alltoall("a2a", &[], &[0], DType::F32, &splits, |_| unreachable!())
            .unwrap_err();
        assert!(
            matches!(err, Error::InvalidArgument(_) | Error::Mismatch(_)),
            "{err}"
        );
        let mut buf = f32_bytes(&[1.0; 4]);
        comm.allreduce("good", &mut buf, &[4], DType::F32, ReduceOp::Sum, 1.0, 1.0)
            .unwrap();
        assert_eq!(buf, f32_bytes(&[3.0; 4]));
    });
}

#[test]
fn mismatches_fail_every_rank_the_same_way_and_the_mesh_stays_usable() {
    type Case = fn(usize, &Communicator) -> Result<(), Error>;
    let cases: [(&str, Case); 6] = [
        (
            "rank 0 has float32 [4, 5] but rank 1 has float32 [4, 6]",
            |rank, comm| {
                let cols = if rank == 1 { 6 } else { 5 };
                let mut buf = vec![0u8; 4 * cols * 4];
                comm.allreduce(
                    "grad.3",
                    &mut buf,
                    &[4, cols as i64],
                    DType::F32,
                    ReduceOp::Sum,
                    1.0,
                    1.0,
                )
            },
        ),
        (
            "rank 0 has float32 [4] but rank 2 has float64 [4]",
            |rank, comm| {
                let dtype = if rank == 2 { DType::F64 } else { DType::F32 };
                let mut buf = vec![0u8; 4 * dtype.size()];
                comm.allreduce("t", &mut buf, &[4], dtype, ReduceOp::Sum, 1.0, 1.0)
            },
        ),
        ("rank 0 uses op Sum but rank 1 uses op Max", |rank, comm| {
            let op = if rank == 0 {
                ReduceOp::Sum
            } else {
                ReduceOp::Max
            };
            comm.allreduce("t", &mut [0u8; 8], &[2], DType::F32, op, 1.0, 1.0)
        }),
        (
            "rank 0 uses root rank 0 but rank 1 uses root rank 1",
            |rank, comm| {
                comm.broadcast("w", &mut [0u8; 8], &[2], DType::F32, usize::from(rank > 0))
            },
        ),
        (
            "allreduce: rank 0 called it 'a' but rank 2 called it 'b'",
            |rank, comm| {
                let name = if rank == 2 { "b" } else { "a" };
                comm.allreduce(
                    name,
                    &mut [0u8; 8],
                    &[2],
                    DType::F32,
                    ReduceOp::Sum,
                    1.0,
                    1.0,
                )
            },
        ),
        (
            "rank 0 called allreduce 'x' but rank 1 called broadcast 'x'",
            |rank, comm| {
                if rank == 0 {
                    comm.allreduce(
                        "x",
                        &mut [0u8; 8],
                        &[2],
                        DType::F32,
                        ReduceOp::Sum,
                        1.0,
                        1.0,
                    )
                } else {
                    comm.broadcast("x", &mut [0u8; 8], &[2], DType::F32, 0)
                }
            },
        ),
    ];
    with_ranks(3, |rank, comm| {
        for (expected, case) in &cases {
            match case(rank, &comm) {
                Err(Error::Mismatch(m)) => assert!(
                    m.contains(expected),
                    "rank {rank}: {m:?} lacks {expected:?}"
                ),
                other => panic!(
                    "rank {rank}: expected a mismatch containing {expected:?}, got {other:?}"
                ),
            }
            let mut buf = f32_bytes(&[rank as f32, 1.0]);
            comm.allreduce("after", &mut buf, &[2], DType::F32, ReduceOp::Sum, 1.0, 1.0)
                .unwrap();
            assert_eq!(buf, f32_bytes(&[3.0, 3.0]));
        }
        // Allgather: differing first dims are fine, other dims are not.
        let cols = if rank == 2 { 3 } else { 2 };
        let err = comm
            .allgather(
                "g",
                &vec![0u8; cols],
                &[1, cols as i64],
                DType::U8,
                |_| unreachable!(),
            )
            .unwrap_err();
        assert!(
            matches!(&err, Error::Mismatch(m) if m.contains("all dimensions but the first must match")),
            "{err}"
        );
        comm.barrier().unwrap();
    });
}

// ---------------------------------------------------------------------------------------------
// Failures: dropped ranks, shutdown, abort, timeouts, junk connections.

#[test]
fn a_dropped_rank_makes_the_others_fail_fast_not_hang() {
    let results = with_ranks(3, |rank, comm| {
        let mut buf = f32_bytes(&[1.0; 4]);
        comm.allreduce("first", &mut buf, &[4], DType::F32, ReduceOp::Sum, 1.0, 1.0)
            .unwrap();
        if rank == 2 {
            drop(comm);
            return None;
        }
        let start = Instant::now();
        let err = comm
            .allreduce(
                "second",
                &mut buf,
                &[4],
                DType::F32,
                ReduceOp::Sum,
                1.0,
                1.0,
            )
            .unwrap_err();
        let elapsed = start.elapsed();
        // Later operations fail at once with a clear error.
        let again = Instant::now();
        let later = comm.barrier().unwrap_err();
        assert!(again.elapsed() < Duration::from_millis(100));
        assert!(matches!(later, Error::Closed(_)), "{later}");
        Some((err, elapsed))
    });
    for (err, elapsed) in results.into_iter().flatten() {
        assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
        let text = err.to_string();
        assert!(matches!(err, Error::Peer { .. }), "{text}");
        assert!(
            text.contains("rank 2") && text.contains("shut down"),
            "{text}"
        );
    }
}

#[test]
fn a_broken_link_reports_the_abort_cause_the_driver_broadcasts() {
    with_ranks(2, |rank, comm| {
        if rank == 1 {
            // Dies (as far as rank 0 can tell) while rank 0 waits for it.
            thread::sleep(Duration::from_millis(200));
            drop(comm);
            return;
        }
        let abort = comm.abort_signal().clone();
        let driver = thread::spawn(move || {
            thread::sleep(Duration::from_millis(600));
            abort.abort(AbortCause {
                rank: Some(1),
                host: "host1".into(),
                message: "killed by signal 9 (SIGKILL)".into(),
            });
        });
        let start = Instant::now();
        let err = comm
            .allreduce(
                "grad",
                &mut [0u8; 4],
                &[1],
                DType::F32,
                ReduceOp::Sum,
                1.0,
                1.0,
            )
            .unwrap_err();
        driver.join().unwrap();
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
        assert!(
            matches!(&err, Error::Aborted(cause) if cause.rank == Some(1)),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            "job aborted: rank 1 on host host1: killed by signal 9 (SIGKILL)"
        );
    });
}

#[test]
fn shutdown_closes_the_communicator_and_stops_a_waiting_collective() {
    with_ranks(2, |rank, comm| {
        if rank == 1 {
            comm.shutdown();
            let err = comm.barrier().unwrap_err();
            assert!(
                matches!(&err, Error::Closed(m) if m.contains("shut down")),
                "{err}"
            );
            return;
        }
        let err = comm.barrier().unwrap_err();
        assert!(matches!(err, Error::Peer { rank: 1, .. }), "{err}");
    });
    // A collective waiting in one thread stops when another thread shuts the communicator down.
    with_ranks(2, |rank, comm| {
        if rank == 1 {
            thread::sleep(Duration::from_millis(800));
            return;
        }
        thread::scope(|s| {
            s.spawn(|| {
                thread::sleep(Duration::from_millis(200));
                comm.shutdown();
            });
            let start = Instant::now();
            let err = comm
                .allreduce(
                    "w",
                    &mut [0u8; 4],
                    &[1],
                    DType::F32,
                    ReduceOp::Sum,
                    1.0,
                    1.0,
                )
                .unwrap_err();
            assert!(matches!(err, Error::Closed(_)), "{err}");
            assert!(
                start.elapsed() < Duration::from_millis(700),
                "{:?}",
                start.elapsed()
            );
        });
    });
}

#[test]
fn abort_stops_a_waiting_collective_within_a_second() {
    with_ranks(2, |rank, comm| {
        if rank == 1 {
            // Never joins the collective; its later call fails because rank 0 gave up.
            thread::sleep(Duration::from_millis(1200));
            // Rank 0 had announced its allreduce before giving up: a mismatch or a broken link.
            let err = comm.barrier().unwrap_err();
            assert!(
                matches!(err, Error::Peer { rank: 0, .. } | Error::Mismatch(_)),
                "{err}"
            );
            return;
        }
        let abort = comm.abort_signal().clone();
        let setter = thread::spawn(move || {
            thread::sleep(Duration::from_millis(300));
            abort.abort(AbortCause {
                rank: Some(1),
                host: "host1".into(),
                message: "killed by signal 9".into(),
            });
            Instant::now()
        });
        let mut buf = vec![0u8; 1 << 20];
        let err = comm
            .allreduce(
                "grad",
                &mut buf,
                &[1 << 18],
                DType::F32,
                ReduceOp::Sum,
                1.0,
                1.0,
            )
            .unwrap_err();
        let aborted_at = setter.join().unwrap();
        assert!(
            aborted_at.elapsed() < Duration::from_secs(1),
            "{:?}",
            aborted_at.elapsed()
        );
        assert_eq!(
            err.to_string(),
            "job aborted: rank 1 on host host1: killed by signal 9"
        );
        assert!(matches!(comm.barrier(), Err(Error::Aborted(_))));
    });
}

#[test]
fn a_silent_peer_times_out_naming_the_op_and_the_peer() {
    let options = Options {
        op_timeout: Duration::from_millis(400),
        ..Options::default()
    };
    with_ranks_custom(
        2,
        options,
        |_| {},
        |rank, comm| {
            if rank == 1 {
                thread::sleep(Duration::from_millis(900));
                assert!(comm.barrier().is_err());
                return;
            }
            let start = Instant::now();
            let err = comm
                .allreduce(
                    "slow",
                    &mut [0u8; 4],
                    &[1],
                    DType::F32,
                    ReduceOp::Sum,
                    1.0,
                    1.0,
                )
                .unwrap_err();
            assert!(
                start.elapsed() < Duration::from_millis(800),
                "{:?}",
                start.elapsed()
            );
            let text = err.to_string();
            assert!(matches!(err, Error::Timeout { .. }), "{text}");
            assert!(
                text.contains("rank 1 (host host1") && text.contains("allreduce 'slow'"),
                "{text}"
            );
        },
    );
}

#[test]
fn junk_connections_during_mesh_setup_are_dropped() {
    let mut junk: Vec<TcpStream> = Vec::new();
    with_ranks_custom(
        3,
        Options::default(),
        |peers| {
            for target in [peers[0], peers[1]] {
                // Not kolo at all.
                let mut http = TcpStream::connect(target).unwrap();
                http.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                    .unwrap();
                junk.push(http);
                // A kolo frame of another job.
                let mut other = TcpStream::connect(target).unwrap();
                other
                    .write_all(
                        &Hello {
                            job_id: [7; 16],
                            from: 2,
                            to: 0,
                            size: 3,
                            round: 0,
                            nonce: [0; 32],
                        }
                        .encode_frame(),
                    )
                    .unwrap();
                junk.push(other);
                // Silence.
                junk.push(TcpStream::connect(target).unwrap());
                // Half a header, then gone.
                let mut half = TcpStream::connect(target).unwrap();
                half.write_all(b"KOLO\x01").unwrap();
                drop(half);
            }
        },
        |rank, comm| {
            let mut buf = f32_bytes(&[rank as f32]);
            comm.allreduce(
                "after.junk",
                &mut buf,
                &[1],
                DType::F32,
                ReduceOp::Sum,
                1.0,
                1.0,
            )
            .unwrap();
            assert_eq!(buf, f32_bytes(&[3.0]));
        },
    );
    drop(junk);
}

#[test]
fn mesh_setup_fails_clearly() {
    // A rank that never shows up.
    let listeners: Vec<DataListener> = (0..2)
        .map(|_| DataListener::bind(LOCALHOST).unwrap())
        .collect();
    let peers: Vec<SocketAddr> = listeners.iter().map(DataListener::local_addr).collect();
    let mut listeners = listeners.into_iter();
    let first = listeners.next().unwrap();
    let config = MeshConfig {
        job_id: job_id(),
        key: key(),
        rank: 0,
        round: 0,
        peers: peers.clone(),
        connect_timeout: Duration::from_millis(300),
        op_timeout: Duration::from_secs(1),
    };
    let start = Instant::now();
    let err = Mesh::establish(first, config, AbortSignal::new()).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(2));
    assert!(
        matches!(&err, Error::Timeout { what, .. } if what.contains("rank 1")),
        "{err}"
    );

    // Something else answers at a peer's address.
    let impostor = TcpListener::bind((LOCALHOST, 0)).unwrap();
    let impostor_addr = impostor.local_addr().unwrap();
    let server = thread::spawn(move || {
        let (mut conn, _) = impostor.accept().unwrap();
        let _ =
            conn.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n and some more bytes to fill a frame");
        thread::sleep(Duration::from_millis(200));
    });
    let second = listeners.next().unwrap();
    let config = MeshConfig {
        job_id: job_id(),
        key: key(),
        rank: 1,
        round: 0,
        peers: vec![impostor_addr, peers[1]],
        connect_timeout: Duration::from_secs(2),
        op_timeout: Duration::from_secs(1),
    };
    let err = Mesh::establish(second, config, AbortSignal::new()).unwrap_err();
    assert!(
        matches!(&err, Error::Rendezvous(m) if m.contains("not a kolo data-plane frame")),
        "{err}"
    );
    server.join().unwrap();

    // A rank outside the address list.
    let listener = DataListener::bind(LOCALHOST).unwrap();
    let config = MeshConfig {
        job_id: job_id(),
        key: key(),
        rank: 3,
        round: 0,
        peers: vec![listener.local_addr()],
        connect_timeout: Duration::from_secs(1),
        op_timeout: Duration::from_secs(1),
    };
    assert!(matches!(
        Mesh::establish(listener, config, AbortSignal::new()),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn communicator_rejects_rank_info_that_does_not_match_its_mesh() {
    let listener = DataListener::bind(LOCALHOST).unwrap();
    let config = MeshConfig {
        job_id: job_id(),
        key: key(),
        rank: 0,
        round: 0,
        peers: vec![listener.local_addr()],
        connect_timeout: Duration::from_secs(1),
        op_timeout: Duration::from_secs(1),
    };
    let mesh = Mesh::establish(listener, config, AbortSignal::new()).unwrap();
    let comm = Communicator::new(info(0, 2), mesh, AbortSignal::new());
    assert!(matches!(comm.barrier(), Err(Error::Closed(m)) if m.contains("rank 0 of 2")));
}

/// Rank 0 of a two-rank job whose rank 1 is played by `fake`: it completes the handshake, then
/// gets the raw connection.
fn against_fake_peer(fake: impl FnOnce(&mut TcpStream, JobId) + Send) -> Error {
    let job = job_id();
    let listener = DataListener::bind(LOCALHOST).unwrap();
    let addr = listener.local_addr();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    thread::scope(|s| {
        s.spawn(move || {
            let mut stream = TcpStream::connect(addr).unwrap();
            let dial = Dial {
                key: &key(),
                job_id: &job,
                from: 1,
                to: 0,
                size: 2,
                round: 0,
            };
            let deadline = Instant::now() + Duration::from_secs(5);
            handshake::dial(&mut stream, dial, deadline, &|| Ok(())).unwrap();
            fake(&mut stream, job);
            // Keep the connection open until rank 0 has its answer.
            let _ = done_rx.recv_timeout(Duration::from_secs(10));
        });
        let config = MeshConfig {
            job_id: job,
            key: key(),
            rank: 0,
            round: 0,
            peers: vec![addr, addr],
            connect_timeout: Duration::from_secs(5),
            op_timeout: Duration::from_secs(5),
        };
        let abort = AbortSignal::new();
        let mesh = Mesh::establish(listener, config, abort.clone()).unwrap();
        let comm = Communicator::new(info(0, 2), mesh, abort);
        // The fakes speak the ring's protocol: its first data frame is half the tensor.
        comm.set_algorithms(AlgorithmChoices {
            allreduce: Some(Algorithm::Ring),
            ..AlgorithmChoices::default()
        });
        let mut buf = f32_bytes(&[1.0; 4]);
        let start = Instant::now();
        let err = comm
            .allreduce("x", &mut buf, &[4], DType::F32, ReduceOp::Sum, 1.0, 1.0)
            .unwrap_err();
        assert!(
            start.elapsed() < Duration::from_secs(4),
            "{:?}",
            start.elapsed()
        );
        done_tx.send(()).unwrap();
        err
    })
}

fn header(kind: FrameKind, tag: u32, len: u64, job: &JobId) -> [u8; wire::HEADER_LEN] {
    Header { kind, tag, len }.encode(&wire::job_check(job))
}

#[test]
fn a_peer_sending_garbage_mid_collective_is_an_error_not_a_panic() {
    let matching = || OpDescriptor {
        dtype: DType::F32,
        shape: vec![4],
        op: Some(ReduceOp::Sum),
        ..OpDescriptor::new(OpKind::Allreduce, "x")
    };
    type Fake = fn(&mut TcpStream, JobId, OpDescriptor);
    let fakes: [(&str, Fake); 6] = [
        ("not a kolo data-plane frame", |s, _, _| {
            s.write_all(b"this is certainly not a frame of kolo")
                .unwrap()
        }),
        ("at most", |s, job, _| {
            s.write_all(&header(FrameKind::Descriptor, 0, u64::MAX, &job))
                .unwrap()
        }),
        ("malformed descriptor payload", |s, job, _| {
            s.write_all(&wire::encode_frame(
                FrameKind::Descriptor,
                0,
                &wire::job_check(&job),
                &[0xff; 10],
            ))
            .unwrap()
        }),
        ("out of step", |s, job, d| {
            s.write_all(&wire::encode_frame(
                FrameKind::Descriptor,
                5,
                &wire::job_check(&job),
                &d.encode(),
            ))
            .unwrap()
        }),
        ("exactly 8 were expected", |s, job, d| {
            s.write_all(&wire::encode_frame(
                FrameKind::Descriptor,
                0,
                &wire::job_check(&job),
                &d.encode(),
            ))
            .unwrap();
            s.write_all(&header(FrameKind::Data, 0, 9999, &job))
                .unwrap();
        }),
        ("closed the connection", |s, job, d| {
            s.write_all(&wire::encode_frame(
                FrameKind::Descriptor,
                0,
                &wire::job_check(&job),
                &d.encode(),
            ))
            .unwrap();
            s.write_all(&header(FrameKind::Data, 0, 8, &job)).unwrap();
            s.write_all(&[0; 3]).unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
        }),
    ];
    thread::scope(|s| {
        for (expected, fake) in fakes {
            let desc = matching();
            s.spawn(move || {
                let err = against_fake_peer(move |stream, job| fake(stream, job, desc));
                let text = err.to_string();
                assert!(matches!(err, Error::Peer { rank: 1, .. }), "{text}");
                assert!(text.contains(expected), "{text:?} lacks {expected:?}");
            });
        }
    });
}

#[test]
fn communicator_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Communicator>();
    check::<Mesh>();
}

/// Latency and throughput of float32 allreduce on two ranks over loopback: median and best
/// wall time of many runs, and the CPU time per run of the busier rank. Sizes in bytes via
/// `KOLO_BENCH_BYTES=4,1048576`. Run with
/// `cargo test --release -p kolo-collective --test it -- --ignored --nocapture allreduce_throughput`.
#[test]
#[ignore = "benchmark"]
fn allreduce_throughput() {
    let sizes: Vec<usize> = std::env::var("KOLO_BENCH_BYTES")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![4, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]);
    for bytes in sizes {
        let count = bytes / 4;
        let mut results = with_ranks(2, |_, comm| {
            let mut buf: Vec<u8> = (0..count).flat_map(|i| (i as f32).to_ne_bytes()).collect();
            let iterations = ((1usize << 29) / bytes.max(1)).clamp(5, 2000);
            for _ in 0..3 {
                comm.allreduce(
                    "warmup",
                    &mut buf,
                    &[count as i64],
                    DType::F32,
                    ReduceOp::Sum,
                    1.0,
                    1.0,
                )
                .unwrap();
            }
            comm.barrier().unwrap();
            let cpu_start = thread_cpu_time();
            let times = (0..iterations)
                .map(|_| {
                    let start = Instant::now();
                    comm.allreduce(
                        "bench",
                        &mut buf,
                        &[count as i64],
                        DType::F32,
                        ReduceOp::Sum,
                        1.0,
                        1.0,
                    )
                    .unwrap();
                    start.elapsed()
                })
                .collect::<Vec<_>>();
            (times, (thread_cpu_time() - cpu_start) / iterations as u32)
        });
        let cpu = results.iter().map(|(_, cpu)| *cpu).max().unwrap();
        let mut times = results.remove(0).0;
        times.sort();
        let gbps = |t: Duration| bytes as f64 / t.as_secs_f64() / 1e9;
        let (median, best) = (times[times.len() / 2], times[0]);
        println!(
            "allreduce {bytes:>9} B float32, 2 ranks: median {median:?} ({:.2} GB/s), best {best:?} ({:.2} GB/s), \
             CPU per rank {cpu:?}",
            gbps(median),
            gbps(best),
        );
    }
}

/// CPU time this thread has used.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}
