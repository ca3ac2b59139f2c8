//! The split that fills a shuffle window read in a few ascending runs: one sequential pass over
//! each column's source rows, sending every value to the run that reads it.
//!
//! A window's batches each read their rows in ascending order, so at batch 4096 of a
//! 16,384-row window its positions are four ascending runs. When the positions read every row
//! of the window's segments exactly once, position `starts[k] + j` holds the `j`-th source row
//! (in segment, then row order) that run `k` reads. So a column need not be gathered one value
//! per cache line: its source is read once in order, 16 rows at a time, and each run's values
//! among them are packed together (`vpcompressd`) and stored at that run's cursor. The source
//! is read sequentially once and each output byte written once.
//!
//! Which of a block's 16 rows each run reads is the same for every column of the window, so it
//! is computed once per window ([`Split::new`]) as one 16-bit mask per block and run.
//!
//! Tried and dropped (a 16,384-row window of 100 float32 columns in 3 segments, its sources
//! out of cache, best of 100 windows, interleaved builds): the split costs about what a plain
//! sequential copy of its bytes costs (0.10-0.11 s/GB), where a copy with streaming stores costs
//! 0.06. Staging each run's values in L1 and moving whole lines with streaming stores
//! cost 1.2-1.4x; full (unmasked) stores where they stay inside the run, 1.07x; one permute
//! per block sorting its rows by run (instead of a compress per run) saved less than its
//! per-window table cost.
//!
//! Where its time goes (one core, 8 columns so that source and window stay in L2, session 20):
//! the kernel costs 0.08 s/GB there against 0.021 for a memcpy. Without its stores it costs
//! 0.065 (the compresses, 2 cycles each on Zen 4), without its compresses 0.078 (the masked
//! stores, about 3 cycles each), and the masks and cursors alone 0.027: four stores per
//! 16-row block are its limit. Two more variants were dropped. 256-bit stores when a run takes
//! at most 8 values saved a twentieth in L2 and nothing measurable in the loader (later
//! epochs 0.171-0.188 CPU-s/GB against 0.174-0.181, 4 interleaved pairs). Staging each run's
//! values in L1 and flushing whole lines with streaming stores every 16 blocks (out of cache,
//! where a plain memcpy of the window costs 0.087-0.098) cost the same: 0.101-0.102 s/GB
//! against 0.101-0.107.

use std::ops::Range;

/// Runs above which the split is not used: per 16 rows it packs and stores once per run that
/// reads one of them, where a gather loads 16 values whatever the runs. On a 16,384-row window
/// of 100 float32 columns (one core, AVX-512 on Zen 4) the split cost 0.72x the gather's time
/// at 4 runs (batch 4096), 1.14x at 8 and 3x at 16.
pub const MAX_RUNS: usize = 4;
/// Bytes ahead of its reads that the split prefetches its source: without it the loop waited
/// on its loads (the split cost 1.1x the gather instead of 0.72x); 1-8 KiB were measured,
/// 2-4 KiB did best.
const AHEAD: usize = 2048;
/// Rows per block: one vector of 4-byte values, two of 8-byte ones.
const BLOCK: usize = 16;

/// One window's split: which source rows go to which run, and where each run starts.
#[derive(Debug)]
pub struct Split {
    /// Per run, its first output position.
    starts: Vec<usize>,
    /// Per block of [`BLOCK`] source rows (blocks start at each segment's first row and never
    /// span two segments), per run, the block's rows the run reads:
    /// `masks[block * runs + run]`.
    masks: Vec<u16>,
    /// Per segment, its rows.
    lens: Vec<usize>,
}

impl Split {
    /// The split of the window whose position `i` reads its row `permutation[i]`, the window's
    /// rows being the rows of its segments in order (segment `s` holds `lens[s]` of them),
    /// read in the runs where the permutation ascends. `None` when the CPU cannot run it, when
    /// there are more than [`MAX_RUNS`] runs, or when the permutation does not read every row
    /// exactly once (then each run's cursor would not meet the next run's start).
    ///
    /// Made from the permutation itself (one pass per run, each walking the segments
    /// forward), so a window that splits needs no per-position segment and row lists.
    pub fn new(permutation: &[u32], lens: &[usize]) -> Option<Self> {
        if !available() {
            return None;
        }
        let mut starts = vec![0];
        for (i, pair) in permutation.windows(2).enumerate() {
            if pair[1] < pair[0] {
                if starts.len() == MAX_RUNS {
                    return None;
                }
                starts.push(i + 1);
            }
        }
        // Per segment: its first window row and first block (blocks never span two).
        let (mut first_row, mut first_block) = (Vec::new(), Vec::new());
        let (mut rows, mut blocks) = (0, 0);
        for &len in lens {
            first_row.push(rows);
            first_block.push(blocks);
            rows += len;
            blocks += len.div_ceil(BLOCK);
        }
        if rows != permutation.len() {
            return None;
        }
        let runs = starts.len();
        let mut masks = vec![0u16; blocks * runs];
        let ends = starts[1..].iter().copied().chain([permutation.len()]);
        for (run, (&from, to)) in starts.iter().zip(ends).enumerate() {
            // A run's rows ascend, so its segment only moves forward.
            let mut segment = 0;
            for &row in &permutation[from..to] {
                let row = row as usize;
                while segment < lens.len() && row >= first_row[segment] + lens[segment] {
                    segment += 1;
                }
                if segment == lens.len() {
                    return None; // past the window's rows
                }
                let local = row - first_row[segment];
                masks[(first_block[segment] + local / BLOCK) * runs + run] |= 1 << (local % BLOCK);
            }
        }
        // As many positions as rows: each row is read once exactly when the rows read are
        // all distinct, i.e. no two runs read the same row and no run reads one twice (which
        // sets a bit once for two positions).
        let mut distinct = 0;
        for block in masks.chunks_exact(runs) {
            let mut read = 0u16;
            for &mask in block {
                if read & mask != 0 {
                    return None;
                }
                read |= mask;
            }
            distinct += read.count_ones() as usize;
        }
        (distinct == permutation.len()).then(|| Self {
            starts,
            masks,
            lens: lens.to_vec(),
        })
    }

    /// Whether this split was made for segments of `ranges` (one per segment, of its rows).
    pub fn fits(&self, ranges: &[Range<u32>]) -> bool {
        ranges.len() == self.lens.len()
            && ranges
                .iter()
                .zip(&self.lens)
                .all(|(r, &len)| r.len() == len)
    }

    /// Output positions: the window's rows.
    pub fn positions(&self) -> usize {
        self.lens.iter().sum()
    }

    /// Fills `dst` (one value of `width` = 4 or 8 bytes per position) from `sources`, source
    /// `s` holding the rows `ranges[s]` (the ranges this split was made for).
    ///
    /// # Safety
    /// Every source holds its range's rows (`sources[s].len() >= ranges[s].end * width`),
    /// `dst` holds one value per position, and the ranges are the split's.
    pub unsafe fn run(
        &self,
        width: usize,
        ranges: &[Range<u32>],
        dst: &mut [u8],
        sources: &[&[u8]],
    ) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller's contract; `available()` (checked in `new`) found AVX-512F.
        unsafe {
            if width == 4 {
                avx512::run::<4>(self, ranges, dst, sources);
            } else {
                assert_eq!(width, 8, "a split moves 4- or 8-byte values");
                avx512::run::<8>(self, ranges, dst, sources);
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (width, ranges, dst, sources);
    }
}

/// Whether a split fills a column of `len` values of `width` bytes per row: one 4- or 8-byte
/// value per row.
pub fn fills(width: usize, len: usize) -> bool {
    len == 1 && matches!(width, 4 | 8)
}

/// Whether this CPU runs the split's kernel (AVX-512F).
pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("popcnt");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::{
        _mm512_mask_storeu_epi32, _mm512_mask_storeu_epi64, _mm512_maskz_compress_epi32,
        _mm512_maskz_compress_epi64, _mm512_maskz_loadu_epi32, _mm512_maskz_loadu_epi64,
    };
    use std::ops::Range;

    use super::{Split, AHEAD, BLOCK, MAX_RUNS};

    /// The split's kernel for values of `W` (4 or 8) bytes.
    ///
    /// # Safety
    /// As [`Split::run`], on a CPU with AVX-512F.
    #[target_feature(enable = "avx512f,popcnt")]
    pub unsafe fn run<const W: usize>(
        split: &Split,
        ranges: &[Range<u32>],
        dst: &mut [u8],
        sources: &[&[u8]],
    ) {
        let runs = split.starts.len();
        let out = dst.as_mut_ptr();
        let mut cursors = [out; MAX_RUNS];
        for (cursor, &start) in cursors.iter_mut().zip(&split.starts) {
            *cursor = out.wrapping_add(start * W);
        }
        let mut masks = split.masks.chunks_exact(runs);
        // SAFETY: each block's loads read rows `at..at + here` of its segment's range (the
        // masked-off lanes of a short block are not read, so they cannot fault); each run's
        // stores write its next `count` positions, which lie before the next run's start
        // because the masks give every position exactly one source row (checked in `new`).
        unsafe {
            for (src, range) in sources.iter().zip(ranges) {
                let mut at = src.as_ptr().add(range.start as usize * W);
                let mut left = range.len();
                while left > 0 {
                    let here = left.min(BLOCK);
                    let block = masks.next().unwrap_unchecked();
                    for line in 0..BLOCK * W / 64 {
                        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                            at.wrapping_add(AHEAD + line * 64).cast(),
                        );
                    }
                    for half in 0..BLOCK * W / 64 {
                        let lanes = 64 / W;
                        let rows = here.saturating_sub(half * lanes).min(lanes);
                        if rows == 0 {
                            break;
                        }
                        let valid = (1u32 << rows) - 1;
                        let from = at.add(half * 64);
                        if W == 4 {
                            let values = _mm512_maskz_loadu_epi32(valid as u16, from.cast());
                            for (cursor, &mask) in cursors.iter_mut().zip(block) {
                                if mask != 0 {
                                    let packed = _mm512_maskz_compress_epi32(mask, values);
                                    let count = mask.count_ones();
                                    let keep = ((1u32 << count) - 1) as u16;
                                    _mm512_mask_storeu_epi32(cursor.cast(), keep, packed);
                                    *cursor = cursor.add(count as usize * W);
                                }
                            }
                        } else {
                            let values = _mm512_maskz_loadu_epi64(valid as u8, from.cast());
                            for (cursor, &mask) in cursors.iter_mut().zip(block) {
                                let mask = (mask >> (half * 8)) as u8;
                                if mask != 0 {
                                    let packed = _mm512_maskz_compress_epi64(mask, values);
                                    let count = mask.count_ones();
                                    let keep = ((1u32 << count) - 1) as u8;
                                    _mm512_mask_storeu_epi64(cursor.cast(), keep, packed);
                                    *cursor = cursor.add(count as usize * W);
                                }
                            }
                        }
                    }
                    at = at.add(here * W);
                    left -= here;
                }
            }
        }
        let ends = split.starts[1..].iter().copied().chain([dst.len() / W]);
        for (cursor, end) in cursors[..runs].iter().zip(ends) {
            debug_assert_eq!(
                *cursor,
                out.wrapping_add(end * W),
                "a run's values end at the next run"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_needs_every_row_read_once_in_few_runs() {
        if !available() {
            return;
        }
        // Runs [1, 3] and [0, 2]: every row once.
        let split = Split::new(&[1, 3, 0, 2], &[4]).expect("a split");
        assert_eq!(
            (split.starts.clone(), split.masks),
            (vec![0, 2], vec![0b1010, 0b0101])
        );
        // Two segments of 3 and 2 rows: window rows 3 and 4 are segment 1's rows 0 and 1,
        // each segment's rows starting a block of its own.
        let split = Split::new(&[0, 4, 1, 2, 3], &[3, 2]).expect("a split");
        assert_eq!(split.starts, vec![0, 2]);
        assert_eq!(split.masks, vec![0b001, 0b110, 0b10, 0b01]);
        // Row 1 twice, row 2 never.
        assert!(Split::new(&[1, 3, 0, 1], &[4]).is_none());
        // One run reading row 0 twice (and row 3 never).
        assert!(Split::new(&[0, 0, 1, 2], &[4]).is_none());
        // Fewer positions than rows; a row past the window's.
        assert!(Split::new(&[1, 3, 0], &[4]).is_none());
        assert!(Split::new(&[1, 3, 0, 4], &[4]).is_none());
        // More runs than MAX_RUNS.
        let rows: Vec<u32> = (0..=MAX_RUNS as u32).rev().collect();
        assert!(Split::new(&rows, &[rows.len()]).is_none());
        let rows: Vec<u32> = (0..MAX_RUNS as u32).rev().collect();
        assert_eq!(
            Split::new(&rows, &[rows.len()])
                .expect("a split")
                .starts
                .len(),
            MAX_RUNS
        );
    }
}
