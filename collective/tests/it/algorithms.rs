//! The TCP algorithms (ring, recursive doubling, chain, binomial tree) on 1 to 9 ranks over
//! loopback: every algorithm, every n (powers of two and not), dtype and op gives every rank
//! a bitwise-identical result equal to a reference reduction; the automatic selection is
//! identical on every rank; a forced algorithm is the one that runs.

use half::f16;
use kolo_collective::collectives::algorithm::{
    self, ALLGATHER_RECURSIVE_DOUBLING_MAX_BYTES, ALLREDUCE_RECURSIVE_DOUBLING_MAX_BYTES,
    BROADCAST_TREE_MAX_BYTES,
};
use kolo_collective::collectives::{Algorithm, AlgorithmChoices};
use kolo_collective::communicator::Communicator;
use kolo_collective::reduce::{bf16_to_f32, f32_to_bf16};
use kolo_collective::wire::OpKind;
use kolo_collective::{DType, ReduceOp};

use crate::collectives::with_ranks;

const DTYPES: [DType; 6] = [
    DType::F32,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::I32,
    DType::Bool,
];

/// A small deterministic generator (xorshift64*), seeded per rank and case.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [lo, hi).
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next() >> 11) as f64 / (1u64 << 53) as f64)
    }
}

fn encode(dtype: DType, x: f64) -> Vec<u8> {
    match dtype {
        DType::I32 => ((x as i64) as i32).to_ne_bytes().to_vec(),
        DType::F16 => f16::from_f64(x).to_ne_bytes().to_vec(),
        DType::BF16 => f32_to_bf16(x as f32).to_ne_bytes().to_vec(),
        DType::F32 => (x as f32).to_ne_bytes().to_vec(),
        DType::F64 => x.to_ne_bytes().to_vec(),
        DType::Bool => vec![u8::from(x != 0.0)],
        other => unreachable!("not used here: {other}"),
    }
}

fn decode(dtype: DType, b: &[u8]) -> f64 {
    match dtype {
        DType::I32 => f64::from(i32::from_ne_bytes([b[0], b[1], b[2], b[3]])),
        DType::F16 => f64::from(f16::from_ne_bytes([b[0], b[1]]).to_f32()),
        DType::BF16 => f64::from(bf16_to_f32(u16::from_ne_bytes([b[0], b[1]]))),
        DType::F32 => f64::from(f32::from_ne_bytes([b[0], b[1], b[2], b[3]])),
        DType::F64 => f64::from_ne_bytes(b.try_into().unwrap()),
        DType::Bool => f64::from(b[0]),
        other => unreachable!("not used here: {other}"),
    }
}

/// Rank `rank`'s input values for one case: random floats (near 1 for products, so 9 of
/// them stay representable), small integers, random booleans.
fn inputs(dtype: DType, op: ReduceOp, rank: usize, count: usize, case: u64) -> Vec<f64> {
    let mut rng = Rng::new(case * 1000 + rank as u64 + 1);
    (0..count)
        .map(|_| match (dtype, op) {
            (DType::Bool, _) => f64::from(u8::from(!rng.next().is_multiple_of(3))),
            (DType::I32, ReduceOp::Product) => (rng.next() % 5) as f64 - 2.0,
            (DType::I32, _) => (rng.next() % 2001) as f64 - 1000.0,
            (_, ReduceOp::Product) => rng.uniform(0.5, 1.5),
            _ => rng.uniform(-1.0, 1.0),
        })
        .map(|x| decode(dtype, &encode(dtype, x)))
        .collect()
}

/// (op, prescale, postscale) cases for `dtype`.
fn reductions(dtype: DType) -> Vec<(ReduceOp, f64, f64)> {
    let mut out: Vec<(ReduceOp, f64, f64)> = ReduceOp::ELEMENTWISE
        .into_iter()
        .filter(|op| !(dtype == DType::Bool && *op == ReduceOp::Average))
        .map(|op| (op, 1.0, 1.0))
        .collect();
    if dtype != DType::Bool {
        out.push((ReduceOp::Sum, 0.5, 3.0));
        out.push((ReduceOp::Average, 2.0, 1.5));
    }
    out
}

/// The reduction of every rank's inputs, in float64, with Horovod's scaling (integers
/// truncate after each scaling).
fn reference(dtype: DType, reduction: (ReduceOp, f64, f64), all: &[Vec<f64>]) -> Vec<f64> {
    let (op, pre, post) = reduction;
    let size = all.len();
    let factor = if op == ReduceOp::Average {
        post / size as f64
    } else {
        post
    };
    let scale = |x: f64, f: f64| {
        if f == 1.0 {
            x
        } else if dtype == DType::I32 {
            (x * f).trunc()
        } else {
            x * f
        }
    };
    (0..all[0].len())
        .map(|i| {
            let values = all.iter().map(|v| scale(v[i], pre));
            let reduced = match (dtype, op) {
                (DType::Bool, ReduceOp::Sum | ReduceOp::Max) => {
                    f64::from(u8::from(values.into_iter().any(|x| x != 0.0)))
                }
                (DType::Bool, _) => f64::from(u8::from(values.into_iter().all(|x| x != 0.0))),
                (_, ReduceOp::Sum | ReduceOp::Average) => values.sum(),
                (_, ReduceOp::Product) => values.product(),
                (_, ReduceOp::Min) => values.fold(f64::INFINITY, f64::min),
                (_, ReduceOp::Max) => values.fold(f64::NEG_INFINITY, f64::max),
                (_, ReduceOp::Adasum) => unreachable!(),
            };
            scale(reduced, factor)
        })
        .collect()
}

/// How far a result in `dtype` may be from the float64 reference over `size` ranks.
fn tolerance(dtype: DType, size: usize, want: f64) -> f64 {
    let eps = match dtype {
        DType::F16 => 1e-3,
        DType::BF16 => 8e-3,
        DType::F32 => 1.2e-7,
        DType::F64 => 2.3e-16,
        _ => return 0.0,
    };
    // Each of up to `size` roundings of partial results of magnitude up to ~size·3.
    eps * (size as f64 + 2.0) * (want.abs() + 3.0 * size as f64) * 2.0
}

fn allreduce_choices(algorithm: Algorithm) -> AlgorithmChoices {
    AlgorithmChoices {
        allreduce: Some(algorithm),
        ..AlgorithmChoices::default()
    }
}

/// Runs every (dtype, reduction, count) case with `algorithm` on this rank; returns the
/// result bytes of each case.
fn allreduce_cases(comm: &Communicator, algorithm: Algorithm, counts: &[usize]) -> Vec<Vec<u8>> {
    comm.set_algorithms(allreduce_choices(algorithm));
    let rank = comm.info().rank;
    let mut out = Vec::new();
    let mut case = 0u64;
    for dtype in DTYPES {
        for reduction in reductions(dtype) {
            for &count in counts {
                case += 1;
                let mut buf: Vec<u8> = inputs(dtype, reduction.0, rank, count, case)
                    .into_iter()
                    .flat_map(|x| encode(dtype, x))
                    .collect();
                let (op, pre, post) = reduction;
                comm.allreduce("ar", &mut buf, &[count as i64], dtype, op, pre, post)
                    .unwrap();
                out.push(buf);
            }
        }
    }
    out
}

/// Checks one algorithm's allreduce results from every rank: bitwise identical, and equal
/// to the reference within the dtype's tolerance.
fn check_allreduce(algorithm: Algorithm, size: usize, counts: &[usize], results: &[Vec<Vec<u8>>]) {
    for (rank, theirs) in results.iter().enumerate() {
        assert_eq!(
            theirs, &results[0],
            "{algorithm} on {size} ranks: rank {rank}'s results differ bitwise from rank 0's"
        );
    }
    let mut case = 0u64;
    let mut at = 0;
    for dtype in DTYPES {
        for reduction in reductions(dtype) {
            for &count in counts {
                case += 1;
                let all: Vec<Vec<f64>> = (0..size)
                    .map(|r| inputs(dtype, reduction.0, r, count, case))
                    .collect();
                let want = reference(dtype, reduction, &all);
                let got = &results[0][at];
                at += 1;
                for (i, (chunk, w)) in got.chunks(dtype.size()).zip(&want).enumerate() {
                    let g = decode(dtype, chunk);
                    assert!(
                        (g - w).abs() <= tolerance(dtype, size, *w),
                        "{algorithm} on {size} ranks, {dtype} {reduction:?} count {count}: element \
                         {i} is {g}, want {w}"
                    );
                }
            }
        }
    }
}

#[test]
fn every_allreduce_algorithm_on_1_to_9_ranks_is_bitwise_identical_and_correct() {
    // Empty, one element, and sizes that split unevenly over every n (the forced algorithm
    // runs whatever the size; the automatic choice is tested below).
    let counts = [0, 1, 7, 333, 4099];
    for size in 1..=9 {
        for algorithm in Algorithm::of(OpKind::Allreduce) {
            let results = with_ranks(size, |_, comm| allreduce_cases(&comm, *algorithm, &counts));
            check_allreduce(*algorithm, size, &counts, &results);
        }
    }
}

/// Min and max are not bitwise commutative in IEEE (min(+0, -0) is whichever comes first,
/// and so is a NaN's partner): recursive doubling must still give every rank the same bits.
#[test]
fn min_and_max_of_signed_zeros_and_nans_are_bitwise_identical_on_every_rank() {
    for size in [2, 3, 5, 6, 8] {
        for algorithm in Algorithm::of(OpKind::Allreduce) {
            let results = with_ranks(size, |rank, comm| {
                comm.set_algorithms(allreduce_choices(*algorithm));
                let mut out = Vec::new();
                for op in [ReduceOp::Min, ReduceOp::Max] {
                    let zero = if rank % 2 == 0 { 0.0f32 } else { -0.0 };
                    let nan = f32::from_bits(0x7fc0_0000 | rank as u32);
                    let values = [zero, if rank == 1 { nan } else { 1.0 }, nan, -zero];
                    let mut buf: Vec<u8> = values.iter().flat_map(|x| x.to_ne_bytes()).collect();
                    comm.allreduce("z", &mut buf, &[4], DType::F32, op, 1.0, 1.0)
                        .unwrap();
                    out.push(buf);
                }
                out
            });
            for (rank, theirs) in results.iter().enumerate() {
                assert_eq!(
                    theirs, &results[0],
                    "{algorithm} on {size} ranks: rank {rank} differs"
                );
            }
        }
    }
}

#[test]
fn every_allgather_and_broadcast_algorithm_on_1_to_9_ranks() {
    for size in 1..=9 {
        for (ag, bc) in [
            (Algorithm::Ring, Algorithm::Chain),
            (Algorithm::RecursiveDoubling, Algorithm::BinomialTree),
        ] {
            let results = with_ranks(size, |rank, comm| {
                comm.set_algorithms(AlgorithmChoices {
                    allgather: Some(ag),
                    broadcast: Some(bc),
                    ..AlgorithmChoices::default()
                });
                // allgather: rank r has (r * 3) % 4 rows of 5 bytes (some none).
                let mut gathered = Vec::new();
                for cols in [1usize, 5, 4099] {
                    let rows = (rank * 3) % 4;
                    let input: Vec<u8> = (0..rows * cols).map(|i| (rank * 31 + i) as u8).collect();
                    let mut output = Vec::new();
                    comm.allgather(
                        "ag",
                        &input,
                        &[rows as i64, cols as i64],
                        DType::U8,
                        |rows| {
                            output = vec![0u8; rows.iter().sum::<u64>() as usize * cols];
                            Ok(&mut output[..])
                        },
                    )
                    .unwrap();
                    gathered.push(output);
                }
                // broadcast from every root, small and large.
                let mut broadcast = Vec::new();
                for root in 0..size {
                    for len in [1usize, 1000, 300_000] {
                        let mut buf: Vec<u8> = if rank == root {
                            (0..len).map(|i| (i * 7 + root) as u8).collect()
                        } else {
                            vec![0xEE; len]
                        };
                        comm.broadcast("bc", &mut buf, &[len as i64], DType::U8, root)
                            .unwrap();
                        broadcast.push(buf);
                    }
                }
                (gathered, broadcast, comm.algorithm_runs())
            });
            for (rank, (gathered, broadcast, runs)) in results.iter().enumerate() {
                for (k, cols) in [1usize, 5, 4099].into_iter().enumerate() {
                    let want: Vec<u8> = (0..size)
                        .flat_map(|r| (0..((r * 3) % 4) * cols).map(move |i| (r * 31 + i) as u8))
                        .collect();
                    assert_eq!(
                        gathered[k], want,
                        "{ag} allgather on {size} ranks, rank {rank}"
                    );
                }
                let mut k = 0;
                for root in 0..size {
                    for len in [1usize, 1000, 300_000] {
                        let want: Vec<u8> = (0..len).map(|i| (i * 7 + root) as u8).collect();
                        assert!(
                            broadcast[k] == want,
                            "{bc} from {root} on {size}: rank {rank}"
                        );
                        k += 1;
                    }
                }
                if size > 1 {
                    // The forced algorithms ran, and nothing else.
                    let want = vec![
                        (format!("allgather_{ag}"), 3),
                        (format!("broadcast_{bc}"), 3 * size as u64),
                    ];
                    assert_eq!(runs, &want, "rank {rank} of {size}");
                }
            }
        }
    }
}

#[test]
fn auto_selection_is_identical_on_every_rank_and_follows_the_thresholds() {
    for size in [2, 3, 5, 8] {
        let results = with_ranks(size, |rank, comm| {
            let mut seen = Vec::new();
            let mut before = comm.algorithm_runs();
            let mut ran = |comm: &Communicator| {
                let now = comm.algorithm_runs();
                let new: Vec<String> = now
                    .iter()
                    .filter(|(name, n)| {
                        before.iter().find(|(b, _)| b == name).map(|b| b.1) != Some(*n)
                    })
                    .map(|(name, _)| name.clone())
                    .collect();
                before = now;
                new
            };
            let t = ALLREDUCE_RECURSIVE_DOUBLING_MAX_BYTES;
            for bytes in [4, t - 4, t, t + 4, 4 * t] {
                let mut buf = vec![0u8; bytes];
                comm.allreduce(
                    "a",
                    &mut buf,
                    &[(bytes / 4) as i64],
                    DType::F32,
                    ReduceOp::Sum,
                    1.0,
                    1.0,
                )
                .unwrap();
                seen.push((OpKind::Allreduce, bytes, ran(&comm)));
            }
            let t = BROADCAST_TREE_MAX_BYTES;
            for bytes in [1, t, t + 1] {
                let mut buf = vec![rank as u8; bytes];
                comm.broadcast("b", &mut buf, &[bytes as i64], DType::U8, size - 1)
                    .unwrap();
                seen.push((OpKind::Broadcast, bytes, ran(&comm)));
            }
            let t = ALLGATHER_RECURSIVE_DOUBLING_MAX_BYTES;
            for total in [size, t, t + size] {
                // Rank 0 takes the remainder: the total is what selects.
                let rows = total / size + if rank == 0 { total % size } else { 0 };
                let input = vec![1u8; rows];
                let mut output = Vec::new();
                comm.allgather("g", &input, &[rows as i64], DType::U8, |rows| {
                    output = vec![0u8; rows.iter().sum::<u64>() as usize];
                    Ok(&mut output[..])
                })
                .unwrap();
                seen.push((OpKind::Allgather, total, ran(&comm)));
            }
            seen
        });
        for (rank, seen) in results.iter().enumerate() {
            assert_eq!(seen, &results[0], "rank {rank} of {size} chose differently");
        }
        for (kind, bytes, ran) in &results[0] {
            let want = algorithm::select(*kind, *bytes, size, &AlgorithmChoices::default());
            assert_eq!(
                ran,
                &vec![format!("{}_{}", kind.name(), want)],
                "{kind} {bytes} B on {size}"
            );
        }
        // Both sides of every threshold were exercised (where n has both sides).
        if size >= 4 && !size.is_power_of_two() {
            let names: std::collections::BTreeSet<&String> =
                results[0].iter().flat_map(|(_, _, r)| r).collect();
            assert_eq!(names.len(), 6, "{names:?}");
        }
    }
}

#[test]
fn peers_are_what_each_algorithm_needs() {
    for size in 1..=33 {
        for rank in 0..size {
            for algorithm in [Algorithm::Ring, Algorithm::RecursiveDoubling] {
                let peers = algorithm::peers(OpKind::Allreduce, algorithm, rank, size, 0);
                assert!(!peers.contains(&rank) && peers.iter().all(|&p| p < size));
                assert_eq!(peers.is_empty(), size == 1);
            }
            let log = usize::BITS - (size.max(1) - 1).leading_zeros();
            let tree = algorithm::peers(
                OpKind::Broadcast,
                Algorithm::BinomialTree,
                rank,
                size,
                3 % size,
            );
            assert!(tree.len() <= log as usize + 1, "{size}: {rank} {tree:?}");
            let doubling = algorithm::peers(
                OpKind::Allreduce,
                Algorithm::RecursiveDoubling,
                rank,
                size,
                0,
            );
            assert!(
                doubling.len() <= log as usize + 1,
                "{size}: {rank} {doubling:?}"
            );
        }
    }
    assert_eq!(
        algorithm::peers(OpKind::Allreduce, Algorithm::RecursiveDoubling, 0, 6, 0),
        vec![1]
    );
    assert_eq!(
        algorithm::peers(OpKind::Allreduce, Algorithm::RecursiveDoubling, 1, 6, 0),
        vec![0, 3, 4]
    );
    assert_eq!(
        algorithm::peers(OpKind::Broadcast, Algorithm::BinomialTree, 0, 8, 0),
        vec![1, 2, 4]
    );
}
