//! The gather kernels that fill a shuffle window: `dst[i] = source(segment_of[i])[row_of[i]]`
//! for every output position `i`, per column.
//!
//! Sources are byte buffers whose values need not be aligned (plain pages in a mapped file
//! start anywhere), so values are read unaligned. One window's rows are checked against each
//! column's sources once ([`Gather::run`]); the loops then index without checks. 4- and 8-byte
//! scalars use AVX-512 gathers where the CPU has them, four columns at a time: one load of the
//! row indices serves four gathers (a tenth to a fifth more bytes per second, measured, than
//! one column at a time).
//!
//! A streaming window's gather reads each column's source once per run (four runs at batch
//! 4096 of a 16,384-row window; the later ones from L2). Taking the runs in turn on tiles of
//! 4 KiB of each column's source (so that three runs of four read it from L1) was tried and
//! cost 1.11x the process's CPU per GB (median of 6 interleaved pairs, 5 against it, load 8-11):
//! each run sweeps the window's sources. Where the CPU has AVX-512, such a window's 4- and
//! 8-byte columns are split instead ([`Split`]: one sequential read of each source).

use std::ops::Range;

use super::split::{self, Split};

/// Columns gathered together by one pass over the row indices.
const COLUMNS_PER_PASS: usize = 4;
/// How many positions ahead the gather loop prefetches its source rows, when they are read in
/// long ascending runs (1 KiB ahead for 4-byte values at batch 4096 of a 16,384-row window).
const PREFETCH_AHEAD: usize = 64;
/// A window read in at most this many ascending runs streams through its sources; its
/// consecutive positions are then at most this many rows apart on average (the runs together
/// span at most this many times the window's rows).
const STREAMING_RUNS: usize = 4;

/// One window's row mapping, shared by all its columns.
#[derive(Debug)]
pub struct Gather<'a> {
    /// Output positions.
    positions: usize,
    /// For each output position, its segment (empty for a window that only splits).
    segment_of: &'a [u32],
    /// For each output position, its row in the segment's chunk (as `segment_of`).
    row_of: &'a [u32],
    /// For each segment, the rows of its chunk that positions read.
    ranges: &'a [Range<u32>],
    /// Whether positions read their rows in at most 4 ascending runs (large batches of the
    /// window, or no shuffle): the reads then stream through each source, and prefetching a
    /// little ahead in the loop beats sweeping the whole source into the cache first.
    streaming: bool,
    /// When the positions read every row once in a few runs, and the CPU can: the split that
    /// fills 4- and 8-byte columns in one sequential pass over their sources instead.
    split: Option<Split>,
}

/// One column to gather: its part of the window buffer and its source per segment.
#[derive(Debug)]
pub struct Column<'a> {
    /// The column's output, one value (of `width * len` bytes) per position.
    pub dst: &'a mut [u8],
    /// The column's bytes in each segment's chunk.
    pub sources: Vec<&'a [u8]>,
}

impl<'a> Gather<'a> {
    /// The mapping of positions to (`segment_of[i]`, `row_of[i]`), each row in
    /// `ranges[segment]`, with `split` (made for these positions and ranges) for its 4- and
    /// 8-byte scalar columns.
    ///
    /// # Panics
    /// When the two position lists differ in length, or a position's row is not in its
    /// segment's range (or names no segment), or `split` was made for other segments.
    /// [`Gather::run`]'s unchecked loops rely on this, so it is checked in every build, once per
    /// window (one pass over the positions).
    pub fn new(
        segment_of: &'a [u32],
        row_of: &'a [u32],
        ranges: &'a [Range<u32>],
        split: Option<Split>,
    ) -> Self {
        assert_eq!(segment_of.len(), row_of.len(), "one segment per position");
        if let Some(split) = &split {
            assert!(
                split.fits(ranges) && split.positions() == row_of.len(),
                "a split made for other segments"
            );
        }
        let mut runs = 1;
        let mut previous = (0, 0);
        for (&s, &r) in segment_of.iter().zip(row_of) {
            let inside = ranges
                .get(s as usize)
                .is_some_and(|range| range.contains(&r));
            assert!(inside, "a position's row lies outside its segment's range");
            runs += usize::from((s, r) < previous);
            previous = (s, r);
        }
        Self {
            positions: row_of.len(),
            segment_of,
            row_of,
            ranges,
            streaming: runs <= STREAMING_RUNS,
            split,
        }
    }

    /// A window whose columns are all 4- and 8-byte scalars, filled by `split`: no
    /// per-position lists to make or check.
    ///
    /// # Panics
    /// When `split` was made for other segments than `ranges`'.
    pub fn split(ranges: &'a [Range<u32>], split: Split) -> Self {
        assert!(split.fits(ranges), "a split made for other segments");
        Self {
            positions: split.positions(),
            segment_of: &[],
            row_of: &[],
            ranges,
            streaming: true,
            split: Some(split),
        }
    }

    /// Fills every column: `dst[i * len .. (i + 1) * len] = sources[segment_of[i]][row_of[i] *
    /// len ..]` for elements of `width` bytes, `dst` holding `row_of.len() * len` of them.
    ///
    /// # Panics
    /// When a source is shorter than the rows it must give, or a `dst` is not the right size.
    pub fn run(&self, width: usize, len: usize, columns: &mut [Column<'_>]) {
        let row_bytes = width * len;
        let n = self.positions;
        for column in columns.iter() {
            assert_eq!(column.dst.len(), n * row_bytes, "window buffer size");
            assert_eq!(
                column.sources.len(),
                self.ranges.len(),
                "one source per segment"
            );
            for (src, range) in column.sources.iter().zip(self.ranges) {
                assert!(
                    src.len() >= range.end as usize * row_bytes,
                    "source shorter than its rows"
                );
            }
        }
        if let Some(split) = self.split.as_ref().filter(|_| split::fills(width, len)) {
            for column in columns.iter_mut() {
                // SAFETY: the sources hold their ranges' rows and `dst` the window's (both
                // checked above); the split was made for these ranges (checked when it was given).
                unsafe { split.run(width, self.ranges, column.dst, &column.sources) };
            }
            return;
        }
        assert_eq!(
            self.row_of.len(),
            n,
            "a window made for its split fills only 4- and 8-byte scalars"
        );
        for pass in columns.chunks_mut(COLUMNS_PER_PASS) {
            if !self.streaming {
                for column in pass.iter() {
                    self.sweep(&column.sources, row_bytes);
                }
            }
            // SAFETY: every `row_of[i]` is in `ranges[segment_of[i]]` (by construction in
            // `Window::new`, checked in `Gather::new`), every source holds those rows and every
            // `dst` holds `n` rows (both checked above).
            unsafe { self.pass(width, len, pass) };
        }
    }

    /// Asks for the rows of `sources` that positions read in the cache ahead of the random
    /// reads: one sequential sweep streams them in, where the gather alone would wait for
    /// memory once per cache line.
    fn sweep(&self, sources: &[&[u8]], row_bytes: usize) {
        for (src, range) in sources.iter().zip(self.ranges) {
            let used = &src[range.start as usize * row_bytes..range.end as usize * row_bytes];
            #[cfg(target_arch = "x86_64")]
            for line in used.chunks(64) {
                // SAFETY: a prefetch is only a hint and `line` is valid memory.
                unsafe {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                        line.as_ptr().cast(),
                    );
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = used;
        }
    }

    /// Gathers up to [`COLUMNS_PER_PASS`] columns of one kind.
    ///
    /// # Safety
    /// Every column's sources hold the rows positions read, and every `dst` holds `n` rows.
    unsafe fn pass(&self, width: usize, len: usize, columns: &mut [Column<'_>]) {
        #[cfg(target_arch = "x86_64")]
        if len == 1 && (width == 4 || width == 8) && std::arch::is_x86_feature_detected!("avx512f")
        {
            // SAFETY: as this function's contract; the CPU has AVX-512F.
            unsafe { avx512::gather(self, width, columns) };
            return;
        }
        let (segment_of, row_of) = (self.segment_of, self.row_of);
        for column in columns {
            let (dst, sources) = (&mut *column.dst, column.sources.as_slice());
            // SAFETY: by this function's contract.
            unsafe {
                match (width, len) {
                    (8, 1) => scalars::<u64>(dst, sources, segment_of, row_of),
                    (4, 1) => scalars::<u32>(dst, sources, segment_of, row_of),
                    (2, 1) => scalars::<u16>(dst, sources, segment_of, row_of),
                    (1, 1) => scalars::<u8>(dst, sources, segment_of, row_of),
                    _ => rows(dst, width * len, sources, segment_of, row_of),
                }
            }
        }
    }
}

// Safety contract of the kernels below: `dst` holds `row_of.len()` rows; `segment_of[i]` is a
// valid index into `sources`, and `sources[segment_of[i]]` holds row `row_of[i]` (rows of
// `row_bytes`, or of the scalar's width).

/// Rows of `row_bytes` bytes.
///
/// # Safety
/// See the kernels' safety contract above.
unsafe fn rows(
    dst: &mut [u8],
    row_bytes: usize,
    sources: &[&[u8]],
    segment_of: &[u32],
    row_of: &[u32],
) {
    let dst = dst.as_mut_ptr();
    for (i, (&s, &r)) in segment_of.iter().zip(row_of).enumerate() {
        // SAFETY: by the kernels' contract.
        unsafe {
            let src = sources.get_unchecked(s as usize).as_ptr();
            std::ptr::copy_nonoverlapping(
                src.add(r as usize * row_bytes),
                dst.add(i * row_bytes),
                row_bytes,
            );
        }
    }
}

/// Scalars of `T` (a plain integer type), one at a time.
///
/// # Safety
/// See the kernels' safety contract above.
unsafe fn scalars<T: Copy>(dst: &mut [u8], sources: &[&[u8]], segment_of: &[u32], row_of: &[u32]) {
    let dst = dst.as_mut_ptr().cast::<T>();
    let width = std::mem::size_of::<T>();
    if let [src] = sources {
        let src = src.as_ptr();
        for (i, &r) in row_of.iter().enumerate() {
            // SAFETY: by the kernels' contract (one source: every segment is 0).
            unsafe {
                let value = src.add(r as usize * width).cast::<T>().read_unaligned();
                dst.add(i).write_unaligned(value);
            }
        }
        return;
    }
    for (i, (&s, &r)) in segment_of.iter().zip(row_of).enumerate() {
        // SAFETY: by the kernels' contract.
        unsafe {
            let src = sources.get_unchecked(s as usize).as_ptr();
            let value = src.add(r as usize * width).cast::<T>().read_unaligned();
            dst.add(i).write_unaligned(value);
        }
    }
}

/// AVX-512 gathers: 16 positions per step, of up to four columns that share the step's row
/// indices. Sources within ±2 GiB of a column's first one (the pages of a column in one
/// mapped file, decompressed pages on the heap) are read by one gather whose 32-bit byte
/// offsets add each lane's source distance (a 16-entry table indexed by segment) to its row;
/// other columns (more than 16 sources, or sources far apart) take the scalar loop, as do the
/// positions after the last full step.
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use std::arch::x86_64::{
        __m512i, _mm512_add_epi32, _mm512_castsi512_si256, _mm512_extracti64x4_epi64,
        _mm512_i32gather_epi32, _mm512_i32gather_epi64, _mm512_loadu_si512,
        _mm512_permutexvar_epi32, _mm512_slli_epi32, _mm512_storeu_si512, _mm_prefetch,
        _MM_HINT_T0,
    };

    use super::{Column, Gather, COLUMNS_PER_PASS, PREFETCH_AHEAD, STREAMING_RUNS};

    /// Rows a step of 16 positions of a streaming gather spans on average, at most.
    const STEP_ROWS: usize = 16 * STREAMING_RUNS;

    /// A column ready for the vector loop: where it writes, its first source, and each
    /// source's distance in bytes from that one.
    struct Lanes {
        out: *mut u8,
        base: *const u8,
        table: [i32; 16],
    }

    /// Each source's distance in bytes from the first, when there are at most 16 and every
    /// byte of every source is within `i32` reach of the first's start.
    fn distances(sources: &[&[u8]]) -> Option<[i32; 16]> {
        let base = sources.first()?.as_ptr() as isize;
        if sources.len() > 16 {
            return None;
        }
        let mut table = [0i32; 16];
        for (slot, src) in table.iter_mut().zip(sources) {
            let start = src.as_ptr() as isize - base;
            let end = start.checked_add(isize::try_from(src.len()).ok()?)?;
            *slot = i32::try_from(start).ok()?;
            i32::try_from(end).ok()?;
        }
        Some(table)
    }

    /// 4- or 8-byte scalars (`width`) of `columns`: vector steps for the columns whose sources
    /// allow them, then the scalar loop for the rest.
    ///
    /// # Safety
    /// The kernels' contract (see the parent module) for every column, on a CPU with AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn gather(map: &Gather<'_>, width: usize, columns: &mut [Column<'_>]) {
        debug_assert!(columns.len() <= COLUMNS_PER_PASS);
        let mut lanes = Vec::with_capacity(COLUMNS_PER_PASS);
        let mut vectored = [false; COLUMNS_PER_PASS];
        for (column, done) in columns.iter_mut().zip(&mut vectored) {
            if let Some(table) = distances(&column.sources) {
                lanes.push(Lanes {
                    out: column.dst.as_mut_ptr(),
                    base: column.sources[0].as_ptr(),
                    table,
                });
                *done = true;
            }
        }
        // SAFETY: the contract, and every lane's offset stays inside its own source.
        let steps = unsafe {
            match (lanes.len(), width) {
                (0, _) => 0,
                (1, 4) => steps::<1, 4>(map, &lanes),
                (2, 4) => steps::<2, 4>(map, &lanes),
                (3, 4) => steps::<3, 4>(map, &lanes),
                (_, 4) => steps::<4, 4>(map, &lanes),
                (1, _) => steps::<1, 8>(map, &lanes),
                (2, _) => steps::<2, 8>(map, &lanes),
                (3, _) => steps::<3, 8>(map, &lanes),
                (_, _) => steps::<4, 8>(map, &lanes),
            }
        };
        for (column, vectored) in columns.iter_mut().zip(vectored) {
            let done = if vectored { steps } else { 0 };
            let (segment_of, row_of) = (&map.segment_of[done..], &map.row_of[done..]);
            let (dst, sources) = (&mut column.dst[done * width..], &column.sources);
            // SAFETY: the remaining positions, per the contract.
            unsafe {
                if width == 4 {
                    super::scalars::<u32>(dst, sources, segment_of, row_of);
                } else {
                    super::scalars::<u64>(dst, sources, segment_of, row_of);
                }
            }
        }
    }

    /// Full steps of 16 positions of the `K` columns `lanes`, values of `W` (4 or 8) bytes;
    /// returns the positions done.
    ///
    /// # Safety
    /// The kernels' contract for every column; each `table` holds its sources' distances from
    /// its `base`.
    #[target_feature(enable = "avx512f")]
    unsafe fn steps<const K: usize, const W: usize>(map: &Gather<'_>, lanes: &[Lanes]) -> usize {
        let (segment_of, row_of) = (map.segment_of, map.row_of);
        let n = row_of.len();
        let lanes: &[Lanes; K] = lanes[..K].try_into().expect("K columns");
        let mut i = 0;
        // SAFETY: positions `i..i + 16` exist in both index slices; each lane's address is its
        // source's start plus its row's offset, inside the source by the contract; prefetches
        // are hints (their addresses are computed the same way, for a valid position).
        unsafe {
            let tables: [__m512i; K] =
                std::array::from_fn(|k| _mm512_loadu_si512(lanes[k].table.as_ptr().cast()));
            while i + 16 <= n {
                if map.streaming && i + PREFETCH_AHEAD < n {
                    let s = *segment_of.get_unchecked(i + PREFETCH_AHEAD) as usize;
                    let r = *row_of.get_unchecked(i + PREFETCH_AHEAD) as usize * W;
                    for lane in lanes {
                        let at = lane
                            .base
                            .wrapping_offset(lane.table[s] as isize)
                            .wrapping_add(r);
                        // The lines that step's rows span (4 of 64 bytes for 4-byte values),
                        // not only its first: the gather's CPU per GB at batch 4096 went to
                        // 0.88-0.94x in later epochs, 0.83x in the first (medians of 7 and 5
                        // interleaved pairs; one line before). Re-checked at load 7-9: the
                        // whole process's CPU per GB over 3 epochs 0.96x one line's (median
                        // of 7 interleaved pairs, 6 favouring it).
                        for line in 0..STEP_ROWS * W / 64 {
                            _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(line * 64).cast());
                        }
                    }
                }
                let index = _mm512_loadu_si512(row_of.as_ptr().add(i).cast::<__m512i>());
                let segment = _mm512_loadu_si512(segment_of.as_ptr().add(i).cast::<__m512i>());
                let rows = if W == 4 {
                    _mm512_slli_epi32::<2>(index)
                } else {
                    _mm512_slli_epi32::<3>(index)
                };
                for (lane, table) in lanes.iter().zip(&tables) {
                    let offset = _mm512_add_epi32(_mm512_permutexvar_epi32(segment, *table), rows);
                    if W == 4 {
                        let values = _mm512_i32gather_epi32::<1>(offset, lane.base.cast());
                        _mm512_storeu_si512(lane.out.add(i * 4).cast::<__m512i>(), values);
                    } else {
                        let low = _mm512_i32gather_epi64::<1>(
                            _mm512_castsi512_si256(offset),
                            lane.base.cast(),
                        );
                        let high = _mm512_i32gather_epi64::<1>(
                            _mm512_extracti64x4_epi64::<1>(offset),
                            lane.base.cast(),
                        );
                        _mm512_storeu_si512(lane.out.add(i * 8).cast::<__m512i>(), low);
                        _mm512_storeu_si512(lane.out.add(i * 8 + 64).cast::<__m512i>(), high);
                    }
                }
                i += 16;
            }
        }
        i
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loader::split;

    /// What every position of a column should hold: its segment's row, by plain indexing.
    fn expected(sources: &[&[u8]], segment_of: &[u32], rows: &[u32], row_bytes: usize) -> Vec<u8> {
        segment_of
            .iter()
            .zip(rows)
            .flat_map(|(&s, &r)| {
                let at = r as usize * row_bytes;
                sources[s as usize][at..at + row_bytes].to_vec()
            })
            .collect()
    }

    /// Column `c`'s bytes for segment `s`: distinct per column and segment, shifted by one
    /// byte so that no value is aligned.
    fn source(n: usize, row_bytes: usize, c: usize, s: usize) -> Vec<u8> {
        let mut bytes = vec![0u8];
        bytes.extend((0..n * row_bytes).map(|v| ((v * 7 + c * 31 + s * 101) % 251) as u8));
        bytes
    }

    /// A column's segment sources without their first byte (so that no value is aligned).
    fn unaligned(srcs: &[Vec<u8>]) -> Vec<&[u8]> {
        srcs.iter().map(|v| &v[1..]).collect()
    }

    /// Runs `map` over one column per `data[c]` (segment `s`'s source is `data[c][s]` after
    /// its first byte, so that no value is aligned) and checks every column against plain
    /// indexing of the positions `(segment_of, rows)`.
    fn run_and_check(
        map: &Gather<'_>,
        (width, len): (usize, usize),
        data: &[Vec<Vec<u8>>],
        (segment_of, rows): (&[u32], &[u32]),
        what: &str,
    ) {
        let row_bytes = width * len;
        let mut out = vec![vec![0u8; rows.len() * row_bytes]; data.len()];
        let mut columns: Vec<Column<'_>> = out
            .iter_mut()
            .zip(data)
            .map(|(dst, srcs)| Column {
                dst,
                sources: unaligned(srcs),
            })
            .collect();
        map.run(width, len, &mut columns);
        for (c, (got, srcs)) in out.iter().zip(data).enumerate() {
            assert_eq!(
                *got,
                expected(&unaligned(srcs), segment_of, rows, row_bytes),
                "column {c} of {}, width {width} len {len}, {what}",
                data.len()
            );
        }
    }

    #[test]
    fn every_width_column_count_and_order_gathers_the_same_as_indexing() {
        // Odd sizes exercise the vector loops' tails; six columns make a pass of four and one
        // of two; the scattered order sweeps first, the sorted blocks stream with prefetches.
        let n = 1003usize;
        let scattered: Vec<u32> = (0..n).map(|i| ((i * 389) % n) as u32).collect();
        let mut blocks = scattered.clone();
        for block in blocks.chunks_mut(300) {
            block.sort_unstable();
        }
        let alternating: Vec<u32> = (0..n).map(|i| u32::from(i % 3 == 0)).collect();
        for (rows, streaming) in [(&scattered, false), (&blocks, true)] {
            for (width, len) in [(4, 1), (8, 1), (2, 1), (4, 3), (1, 5)] {
                let row_bytes = width * len;
                for segments in [1usize, 2] {
                    let zeros = vec![0u32; n];
                    let segment_of = if segments == 1 { &zeros } else { &alternating };
                    let ranges = vec![0..n as u32; segments];
                    // One segment read whole: the sorted blocks split (4 runs).
                    let split = (segments == 1).then(|| Split::new(rows, &[n])).flatten();
                    let map = Gather::new(segment_of, rows, &ranges, split);
                    assert_eq!(map.streaming, streaming && segments == 1);
                    for count in [1usize, 6] {
                        let data: Vec<Vec<Vec<u8>>> = (0..count)
                            .map(|c| (0..segments).map(|s| source(n, row_bytes, c, s)).collect())
                            .collect();
                        run_and_check(
                            &map,
                            (width, len),
                            &data,
                            (segment_of, rows),
                            &format!("{segments} segments, streaming {streaming}"),
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn windows_read_in_a_few_runs_split_the_same_as_indexing() {
        // Windows as `Window::new` makes them: a shuffle of the rows of a few segments (that
        // start anywhere in their chunks and hold no whole number of 16-row blocks), cut into
        // runs each read in ascending order. Up to MAX_RUNS runs take the split (on a CPU with
        // AVX-512F), more take the gather; both must give what indexing gives.
        let lens = [700usize, 3, 333];
        let offsets = [5u32, 0, 17];
        let n: usize = lens.iter().sum();
        let mut order: Vec<usize> = (0..n).collect();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for i in (1..n).rev() {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            order.swap(i, (state >> 33) as usize % (i + 1));
        }
        for runs in [1usize, 2, 3, 4, 5, 9] {
            let mut shuffled = order.clone();
            for run in shuffled.chunks_mut(n.div_ceil(runs)) {
                run.sort_unstable();
            }
            let permutation: Vec<u32> = shuffled.iter().map(|&p| p as u32).collect();
            let (mut segment_of, mut row_of) = (Vec::new(), Vec::new());
            for p in shuffled {
                let (mut s, mut p) = (0, p);
                while p >= lens[s] {
                    p -= lens[s];
                    s += 1;
                }
                segment_of.push(s as u32);
                row_of.push(offsets[s] + p as u32);
            }
            let ranges: Vec<Range<u32>> = offsets
                .iter()
                .zip(lens)
                .map(|(&o, l)| o..o + l as u32)
                .collect();
            let made = Split::new(&permutation, &lens);
            let split = runs <= split::MAX_RUNS && split::available();
            assert_eq!(made.is_some(), split, "{runs} runs");
            // The split beside the per-position lists (a window with other columns too), and
            // alone (a window of 4- and 8-byte scalars only).
            let alone = Split::new(&permutation, &lens).map(|s| Gather::split(&ranges, s));
            let beside = Gather::new(&segment_of, &row_of, &ranges, made);
            for (map, what) in [(Some(beside), "beside"), (alone, "alone")] {
                let Some(map) = map else { continue };
                for width in [4usize, 8] {
                    let data: Vec<Vec<Vec<u8>>> = (0..3)
                        .map(|c| {
                            (0..lens.len())
                                .map(|s| source(offsets[s] as usize + lens[s], width, c, s))
                                .collect()
                        })
                        .collect();
                    run_and_check(
                        &map,
                        (width, 1),
                        &data,
                        (&segment_of, &row_of),
                        &format!("{runs} runs, split {split} {what}"),
                    );
                }
            }
        }
    }

    #[test]
    fn columns_whose_sources_are_far_apart_gather_beside_near_ones() {
        // A static and a large heap block are usually gigabytes apart (no 32-bit offsets):
        // that column takes the scalar loop in the same pass as the vector columns.
        static FAR: [u8; 4096] = {
            let mut bytes = [0u8; 4096];
            let mut i = 0;
            while i < 4096 {
                bytes[i] = (i % 253) as u8;
                i += 1;
            }
            bytes
        };
        let n = 1000usize;
        let heap: Vec<u8> = (0..1usize << 20).map(|v| (v % 241) as u8).collect();
        let near: Vec<u8> = (0..8 * n).map(|v| (v % 239) as u8).collect();
        let rows: Vec<u32> = (0..n).map(|i| ((i * 17) % n) as u32).collect();
        let segment_of: Vec<u32> = (0..n).map(|i| (i % 2) as u32).collect();
        let ranges = [0..n as u32, 0..n as u32];
        let map = Gather::new(&segment_of, &rows, &ranges, None);
        let sources: [Vec<&[u8]>; 3] = [
            vec![&FAR[..], &heap[..]],
            vec![&near[..], &near[4 * n..]],
            vec![&heap[8..], &near[..]],
        ];
        let mut out = vec![vec![0u8; 4 * n]; 3];
        let mut columns: Vec<Column<'_>> = out
            .iter_mut()
            .zip(&sources)
            .map(|(dst, sources)| Column {
                dst,
                sources: sources.clone(),
            })
            .collect();
        map.run(4, 1, &mut columns);
        for (got, sources) in out.iter().zip(&sources) {
            assert_eq!(*got, expected(sources, &segment_of, &rows, 4));
        }
    }

    #[test]
    #[should_panic(expected = "source shorter than its rows")]
    fn a_short_source_is_refused_before_any_unchecked_read() {
        let rows = [0u32, 9];
        let gather = Gather::new(&[0, 0], &rows, std::slice::from_ref(&(0..10)), None);
        let mut dst = vec![0u8; 8];
        gather.run(
            4,
            1,
            &mut [Column {
                dst: &mut dst,
                sources: vec![&[0u8; 36]],
            }],
        );
    }

    #[test]
    #[should_panic(expected = "outside its segment's range")]
    fn a_row_outside_its_range_is_refused_in_every_build() {
        // Row 10 of a source that holds rows 0..10 (40 bytes): the unchecked loop would read
        // past it. Release builds (the ones CI and users run) must refuse it too.
        let rows = [0u32, 10];
        let _ = Gather::new(&[0, 0], &rows, std::slice::from_ref(&(0..10)), None);
    }

    #[test]
    #[should_panic(expected = "outside its segment's range")]
    fn a_position_naming_no_segment_is_refused() {
        let _ = Gather::new(&[1], &[0], std::slice::from_ref(&(0..10)), None);
    }

    #[test]
    #[should_panic(expected = "fills only 4- and 8-byte scalars")]
    fn a_window_made_for_its_split_refuses_other_columns() {
        if !split::available() {
            panic!("fills only 4- and 8-byte scalars (no AVX-512F here: nothing to test)");
        }
        let rows = 0..4u32;
        let split = Split::new(&[1, 3, 0, 2], &[4]).expect("a split");
        let gather = Gather::split(std::slice::from_ref(&rows), split);
        let source = [0u8; 8];
        let mut dst = vec![0u8; 8];
        gather.run(
            2,
            1,
            &mut [Column {
                dst: &mut dst,
                sources: vec![&source[..]],
            }],
        );
    }

    #[test]
    #[should_panic(expected = "a split made for other segments")]
    fn a_split_made_for_other_segments_is_refused() {
        if !split::available() {
            panic!("a split made for other segments (no AVX-512F here: nothing to test)");
        }
        let split = Split::new(&[1, 3, 0, 2], &[4]).expect("a split");
        // Five rows where the split was made for four: its kernel would read past its masks.
        let rows = 0..5u32;
        let _ = Gather::split(std::slice::from_ref(&rows), split);
    }
}
