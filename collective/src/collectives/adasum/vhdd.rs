//! Horovod's Adasum allreduce: vector halving, distance doubling (VHDD) over a power-of-two
//! group, on a buffer of one or more tensors laid end to end.
//!
//! Level `l` (distance 1, 2, 4, …) pairs rank `r` with `r ^ l`. Both hold the same element
//! range; the lower rank keeps the first half (`len / 2` elements), the upper one the second,
//! and each sends the other the half it gives up. Each then combines its kept half `a` with
//! the partner's `b`, tensor by tensor: `a = (1 - a·b / 2|a|²) a + (1 - a·b / 2|b|²) b`. A
//! tensor is split across the `2l` ranks of the aligned block holding this rank, so its dot
//! product and norms are summed (in float64) over that block before the coefficients are
//! computed (Horovod's `reduction_comms`). After the last level every rank holds a disjoint
//! slice of the result; the levels are then undone in reverse order, each rank sending its
//! slice to the partner, so every rank ends with the whole result.
//!
//! The sums are formed by recursive doubling (`s + s_partner` at distances 1, 2, …, `l`), so
//! every rank of a block computes bit-identical coefficients.

use std::ops::Range;

use super::kernel::{dot_norms, scaled_add, DotNorms};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The point-to-point exchanges VHDD needs within its group (ranks are group ranks).
pub(crate) trait Pairwise {
    /// Sends `send` to `peer` and receives exactly `recv.len()` bytes from it, concurrently.
    fn swap(&mut self, peer: usize, send: &[u8], recv: &mut [u8]) -> Result<()>;
    /// Sends `mine` to `peer` and returns the peer's vector of the same length.
    fn swap_sums(&mut self, peer: usize, mine: &[f64]) -> Result<Vec<f64>>;
}

/// Why Adasum cannot run on `size` ranks, if it cannot (Horovod's message).
pub(crate) fn size_refusal(size: usize) -> Option<String> {
    (!size.is_power_of_two()).then(|| {
        format!(
            "Running Adasum with non-power of 2 ranks is not supported yet: the process set has \
             {size} ranks; run on 1, 2, 4, 8, ... ranks (or a process set of that size), or use \
             op=Average or op=Sum"
        )
    })
}

/// Splits per-tensor element counts of a range at element `first`: the counts before it and
/// from it on.
fn split_counts(counts: &[usize], first: usize) -> (Vec<usize>, Vec<usize>) {
    let (mut before, mut after) = (Vec::with_capacity(counts.len()), Vec::new());
    let mut at = 0usize;
    for &c in counts {
        let head = c.min(first.saturating_sub(at));
        before.push(head);
        after.push(c - head);
        at += c;
    }
    (before, after)
}

/// One rank's side of one VHDD level.
struct Level {
    rank: usize,
    /// 0 for distance 1, 1 for distance 2, ...
    index: u32,
    dtype: DType,
    /// Whether this rank is the pair's lower rank (it keeps the first half).
    lower: bool,
}

/// Combines `a` (this rank's kept half) with `b` (the partner's copy of it) tensor by tensor;
/// the dot products and norms are summed over the block of `2 << level.index` ranks.
fn combine(
    net: &mut impl Pairwise,
    level: &Level,
    a: &mut [u8],
    b: &[u8],
    counts: &[usize],
) -> Result<()> {
    let Level {
        rank,
        index: level_index,
        dtype,
        lower,
    } = *level;
    let elem = dtype.size();
    let mut sums = Vec::with_capacity(3 * counts.len());
    let mut at = 0usize;
    for &c in counts {
        let bytes = at * elem..(at + c) * elem;
        let dn = dot_norms(dtype, &a[bytes.clone()], &b[bytes])?;
        // Slots 1 and 2 hold the lower side's and the upper side's norms on every rank.
        let (low, high) = if lower {
            (dn.a_norm_sq, dn.b_norm_sq)
        } else {
            (dn.b_norm_sq, dn.a_norm_sq)
        };
        sums.extend([dn.dot, low, high]);
        at += c;
    }
    for j in 0..=level_index {
        let theirs = net.swap_sums(rank ^ (1 << j), &sums)?;
        for (s, t) in sums.iter_mut().zip(theirs) {
            *s += t;
        }
    }
    let mut at = 0usize;
    for (i, &c) in counts.iter().enumerate() {
        let (low, high) = (sums[3 * i + 1], sums[3 * i + 2]);
        let dn = DotNorms {
            dot: sums[3 * i],
            a_norm_sq: if lower { low } else { high },
            b_norm_sq: if lower { high } else { low },
        };
        let (acoeff, bcoeff) = dn.coefficients();
        let bytes = at * elem..(at + c) * elem;
        scaled_add(dtype, acoeff, &mut a[bytes.clone()], bcoeff, &b[bytes])?;
        at += c;
    }
    Ok(())
}

fn byte_range(r: &Range<usize>, elem: usize) -> Range<usize> {
    r.start * elem..r.end * elem
}

/// Runs Adasum in place on `buf` (elements of `dtype`; `counts[i]` elements of tensor `i`, in
/// order) as group rank `rank` of `size` ranks, a power of two.
pub(crate) fn allreduce(
    net: &mut impl Pairwise,
    rank: usize,
    size: usize,
    dtype: DType,
    buf: &mut [u8],
    counts: &[usize],
) -> Result<()> {
    if let Some(why) = size_refusal(size) {
        return Err(Error::InvalidArgument(why));
    }
    let elem = dtype.size();
    let n = buf.len() / elem;
    if !buf.len().is_multiple_of(elem) || counts.iter().sum::<usize>() != n {
        return Err(Error::Internal(format!(
            "adasum: {} bytes of {dtype} for tensors of {counts:?} elements",
            buf.len()
        )));
    }
    if size == 1 || n == 0 {
        return Ok(());
    }
    let mut recv = Vec::new();
    let half = n.div_ceil(2) * elem;
    recv.try_reserve_exact(half).map_err(|_| {
        Error::InvalidArgument(format!(
            "Adasum needs a {half}-byte receive buffer and the allocator refused it"
        ))
    })?;
    recv.resize(half, 0);
    let mut counts = counts.to_vec();
    let mut mine = 0..n;
    let mut parents = Vec::new();
    let mut level_index = 0u32;
    while (1usize << level_index) < size {
        let level = 1usize << level_index;
        let peer = rank ^ level;
        let first = mine.len() / 2;
        let split = mine.start + first;
        let lower = rank & level == 0;
        let (low_counts, high_counts) = split_counts(&counts, first);
        let (keep, give) = if lower {
            (mine.start..split, split..mine.end)
        } else {
            (split..mine.end, mine.start..split)
        };
        counts = if lower { low_counts } else { high_counts };
        let b = &mut recv[..keep.len() * elem];
        net.swap(peer, &buf[byte_range(&give, elem)], b)?;
        let a = &mut buf[byte_range(&keep, elem)];
        let step = Level {
            rank,
            index: level_index,
            dtype,
            lower,
        };
        combine(net, &step, a, b, &counts)?;
        parents.push(std::mem::replace(&mut mine, keep));
        level_index += 1;
    }
    while let Some(parent) = parents.pop() {
        level_index -= 1;
        let peer = rank ^ (1usize << level_index);
        let (mine_bytes, parent_bytes) = (byte_range(&mine, elem), byte_range(&parent, elem));
        if mine.start == parent.start {
            let (head, tail) = buf.split_at_mut(mine_bytes.end);
            net.swap(
                peer,
                &head[mine_bytes],
                &mut tail[..parent_bytes.end - head.len()],
            )?;
        } else {
            let (head, tail) = buf.split_at_mut(mine_bytes.start);
            let theirs = &mut head[parent_bytes.start..];
            net.swap(peer, &tail[..mine_bytes.len()], theirs)?;
        }
        mine = parent;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::{channel, Receiver, Sender};

    use half::{bf16, f16};

    use super::*;

    /// In-process ranks joined by channels: `to[p]` sends to rank p, `from[p]` receives from it.
    struct Channels {
        to: Vec<Option<Sender<Vec<u8>>>>,
        from: Vec<Option<Receiver<Vec<u8>>>>,
    }

    fn channels(size: usize) -> Vec<Channels> {
        let mut ranks: Vec<Channels> = (0..size)
            .map(|_| Channels {
                to: (0..size).map(|_| None).collect(),
                from: (0..size).map(|_| None).collect(),
            })
            .collect();
        for i in 0..size {
            for j in 0..size {
                if i != j {
                    let (tx, rx) = channel();
                    ranks[i].to[j] = Some(tx);
                    ranks[j].from[i] = Some(rx);
                }
            }
        }
        ranks
    }

    impl Pairwise for Channels {
        fn swap(&mut self, peer: usize, send: &[u8], recv: &mut [u8]) -> Result<()> {
            self.to[peer].as_ref().unwrap().send(send.to_vec()).unwrap();
            let got = self.from[peer].as_ref().unwrap().recv().unwrap();
            assert_eq!(got.len(), recv.len(), "the partner sent another length");
            recv.copy_from_slice(&got);
            Ok(())
        }
        fn swap_sums(&mut self, peer: usize, mine: &[f64]) -> Result<Vec<f64>> {
            let mut got = vec![0u8; mine.len() * 8];
            self.swap(peer, bytemuck::cast_slice(mine), &mut got)?;
            Ok(got
                .chunks_exact(8)
                .map(|c| f64::from_ne_bytes(c.try_into().unwrap()))
                .collect())
        }
    }

    /// The plain reference: Horovod's test's tree reduction, pairs (0,1), (2,3), … then
    /// (01, 23), …, each tensor combined by the formula on whole vectors in float64.
    fn reference(tensors: &[Vec<Vec<f64>>]) -> Vec<Vec<f64>> {
        fn pair(a: &[f64], b: &[f64]) -> Vec<f64> {
            let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
            let an: f64 = a.iter().map(|x| x * x).sum();
            let bn: f64 = b.iter().map(|x| x * x).sum();
            let ac = if an != 0.0 { 1.0 - dot / an * 0.5 } else { 1.0 };
            let bc = if bn != 0.0 { 1.0 - dot / bn * 0.5 } else { 1.0 };
            a.iter().zip(b).map(|(x, y)| ac * x + bc * y).collect()
        }
        let mut level: Vec<Vec<Vec<f64>>> = tensors.to_vec();
        while level.len() > 1 {
            level = level
                .chunks(2)
                .map(|p| p[0].iter().zip(&p[1]).map(|(a, b)| pair(a, b)).collect())
                .collect();
        }
        level.pop().unwrap()
    }

    fn encode(dtype: DType, v: &[f64]) -> Vec<u8> {
        v.iter()
            .flat_map(|&x| match dtype {
                DType::F64 => x.to_ne_bytes().to_vec(),
                DType::F32 => (x as f32).to_ne_bytes().to_vec(),
                DType::F16 => f16::from_f64(x).to_ne_bytes().to_vec(),
                DType::BF16 => bf16::from_f64(x).to_ne_bytes().to_vec(),
                _ => unreachable!(),
            })
            .collect()
    }

    fn decode(dtype: DType, b: &[u8]) -> Vec<f64> {
        b.chunks_exact(dtype.size())
            .map(|c| match dtype {
                DType::F64 => f64::from_ne_bytes(c.try_into().unwrap()),
                DType::F32 => f64::from(f32::from_ne_bytes(c.try_into().unwrap())),
                DType::F16 => f64::from(f16::from_ne_bytes(c.try_into().unwrap())),
                DType::BF16 => f64::from(bf16::from_ne_bytes(c.try_into().unwrap())),
                _ => unreachable!(),
            })
            .collect()
    }

    /// A deterministic pseudo-random value in [-1, 1).
    fn noise(seed: u64) -> f64 {
        let x = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((x >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }

    /// Runs VHDD on `size` threads over tensors of `counts` elements; returns every rank's
    /// result and the reference (of the inputs as rounded to `dtype`).
    fn run(size: usize, dtype: DType, counts: &[usize]) -> (Vec<Vec<f64>>, Vec<f64>) {
        let inputs: Vec<Vec<Vec<f64>>> = (0..size)
            .map(|r| {
                counts
                    .iter()
                    .enumerate()
                    .map(|(t, &c)| {
                        let raw: Vec<f64> = (0..c)
                            .map(|i| noise((r * 1_000_003 + t * 7919 + i) as u64))
                            .collect();
                        decode(dtype, &encode(dtype, &raw))
                    })
                    .collect()
            })
            .collect();
        let expected: Vec<f64> = reference(&inputs).concat();
        let results = std::thread::scope(|scope| {
            let handles: Vec<_> = channels(size)
                .into_iter()
                .enumerate()
                .map(|(rank, mut net)| {
                    let mut buf = encode(dtype, &inputs[rank].concat());
                    scope.spawn(move || {
                        allreduce(&mut net, rank, size, dtype, &mut buf, counts).unwrap();
                        decode(dtype, &buf)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        (results, expected)
    }

    #[test]
    fn matches_the_tree_reference_on_2_4_and_8_ranks() {
        let cases: [(DType, f64); 4] = [
            (DType::F64, 1e-12),
            (DType::F32, 1e-5),
            (DType::F16, 4e-3),
            (DType::BF16, 3e-2),
        ];
        // One tensor; a fused batch whose boundaries fall anywhere in the halvings; tensors
        // shorter than the rank count (some ranks hold none of them).
        let layouts: [&[usize]; 3] = [&[1000], &[7, 130, 1, 64, 33], &[1, 2, 3]];
        for size in [2, 4, 8] {
            for (dtype, tol) in cases {
                for counts in layouts {
                    let (results, expected) = run(size, dtype, counts);
                    let scale = expected.iter().fold(1f64, |m, x| m.max(x.abs()));
                    for (rank, got) in results.iter().enumerate() {
                        assert_eq!(got, &results[0], "rank {rank} differs from rank 0");
                        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                            assert!(
                                (g - e).abs() <= tol * scale,
                                "{size} ranks {dtype} {counts:?}: element {i}: {g} vs {e}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn per_tensor_coefficients_differ_from_one_fused_vector() {
        // Two tensors: the first identical on both ranks (averaged), the second orthogonal
        // (summed). Treating the buffer as one vector would mix their coefficients.
        let (results, expected) = {
            let counts = [2usize, 2];
            let inputs = [vec![1.0, 1.0, 1.0, 0.0], vec![1.0, 1.0, 0.0, 1.0]];
            let expected = vec![1.0, 1.0, 1.0, 1.0];
            let results = std::thread::scope(|scope| {
                let hs: Vec<_> = channels(2)
                    .into_iter()
                    .enumerate()
                    .map(|(rank, mut net)| {
                        let mut buf = encode(DType::F64, &inputs[rank]);
                        scope.spawn(move || {
                            allreduce(&mut net, rank, 2, DType::F64, &mut buf, &counts).unwrap();
                            decode(DType::F64, &buf)
                        })
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap())
                    .collect::<Vec<_>>()
            });
            (results, expected)
        };
        assert_eq!(results[0], expected);
        assert_eq!(results[1], expected);
    }

    #[test]
    fn splits_counts_at_the_half() {
        assert_eq!(split_counts(&[3, 4, 5], 5), (vec![3, 2, 0], vec![0, 2, 5]));
        assert_eq!(split_counts(&[0, 2], 0), (vec![0, 0], vec![0, 2]));
    }

    #[test]
    fn non_power_of_two_groups_are_refused() {
        for size in [3, 5, 6, 12] {
            let mut net = channels(size).remove(0);
            let err = allreduce(&mut net, 0, size, DType::F32, &mut [0; 4], &[1]).unwrap_err();
            assert!(
                matches!(&err, Error::InvalidArgument(m) if m.contains("non-power of 2") && m.contains(&format!("{size} ranks"))),
                "{err}"
            );
        }
        assert!(size_refusal(8).is_none() && size_refusal(1).is_none());
    }
}
