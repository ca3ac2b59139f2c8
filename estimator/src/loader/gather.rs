//! The gather kernels that fill a shuffle window: `dst[i] = source(segment_of[i])[row_of[i]]`
//! for every output position `i`, per column.
//!
//! Sources are byte buffers whose values need not be aligned (plain pages in a mapped file
//! start anywhere), so values are read unaligned. One window's rows are checked against its
//! sources once per column ([`Gather::run`]); the loops then index without checks, and 4- and
//! 8-byte scalars use AVX-512 gathers where the CPU has them.

use std::ops::Range;

/// One window's row mapping, shared by all its columns.
#[derive(Debug)]
pub struct Gather<'a> {
    /// For each output position, its segment.
    pub segment_of: &'a [u32],
    /// For each output position, its row in the segment's chunk.
    pub row_of: &'a [u32],
    /// For each segment, the rows of its chunk that positions read.
    pub ranges: &'a [Range<u32>],
}

impl Gather<'_> {
    /// `dst[i * len .. (i + 1) * len] = sources[segment_of[i]][row_of[i] * len ..]` for
    /// elements of `width` bytes, `dst` holding `row_of.len() * len` of them.
    ///
    /// # Panics
    /// When a source is shorter than the rows it must give, or `dst` is not the right size.
    pub fn run(&self, dst: &mut [u8], width: usize, len: usize, sources: &[&[u8]]) {
        let row_bytes = width * len;
        let n = self.row_of.len();
        assert_eq!(dst.len(), n * row_bytes, "window buffer size");
        assert_eq!(self.segment_of.len(), n);
        assert_eq!(sources.len(), self.ranges.len(), "one source per segment");
        for (src, range) in sources.iter().zip(self.ranges) {
            let used = range.start as usize * row_bytes..range.end as usize * row_bytes;
            assert!(src.len() >= used.end, "source shorter than its rows");
            prefetch(&src[used]);
        }
        debug_assert!(self
            .segment_of
            .iter()
            .zip(self.row_of)
            .all(|(&s, r)| self.ranges[s as usize].contains(r)));
        // SAFETY (for every call below): every `row_of[i]` is in `ranges[segment_of[i]]` (by
        // construction in `Window::new`, checked in debug builds), every source holds those
        // rows (checked above) and `dst` holds `n` rows (checked above).
        let (segment_of, row_of) = (self.segment_of, self.row_of);
        // SAFETY: the kernels read only rows in `ranges` of their segment's source and write
        // `n` rows of `dst`, all checked above.
        unsafe {
            match (width, len) {
                (4, 1) => wide_scalars::<u32>(dst, sources, segment_of, row_of),
                (8, 1) => wide_scalars::<u64>(dst, sources, segment_of, row_of),
                (2, 1) => scalars::<u16>(dst, sources, segment_of, row_of),
                (1, 1) => scalars::<u8>(dst, sources, segment_of, row_of),
                _ => rows(dst, row_bytes, sources, segment_of, row_of),
            }
        }
    }
}

/// Asks for `bytes` in the cache ahead of the random reads: one sequential sweep streams them
/// in, where the gather alone would wait for memory once per cache line.
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        // SAFETY: a prefetch is only a hint and `line` is valid memory.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                line.as_ptr().cast(),
            );
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

/// 4- or 8-byte scalars (`T` is `u32` or `u64`), with AVX-512 gathers where the CPU has them.
///
/// # Safety
/// See the kernels' safety contract above.
unsafe fn wide_scalars<T: Copy>(
    dst: &mut [u8],
    sources: &[&[u8]],
    segment_of: &[u32],
    row_of: &[u32],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: by the kernels' contract; the CPU has AVX-512F.
        unsafe { avx512::gather::<T>(dst, sources, segment_of, row_of) };
        return;
    }
    // SAFETY: by the kernels' contract.
    unsafe { scalars::<T>(dst, sources, segment_of, row_of) }
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

/// AVX-512 gathers: 16 (or 2 x 8) values per step. Sources within ±2 GiB of the first one
/// (the pages of a column in one mapped file, decompressed pages on the heap) are read by one
/// gather whose 32-bit byte offsets add each lane's source distance (a 16-entry table indexed
/// by segment) to its row; other windows (more than 16 sources, or sources far apart) take
/// the scalar loop.
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use std::arch::x86_64::{
        __m512i, _mm512_add_epi32, _mm512_castsi512_si256, _mm512_extracti64x4_epi64,
        _mm512_i32gather_epi32, _mm512_i32gather_epi64, _mm512_loadu_si512,
        _mm512_permutexvar_epi32, _mm512_slli_epi32, _mm512_storeu_si512,
    };

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

    /// 4- or 8-byte scalars (`T` is `u32` or `u64`): vector steps where the sources allow,
    /// then the scalar loop for the rest.
    ///
    /// # Safety
    /// The kernels' contract (see the parent module), on a CPU with AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn gather<T: Copy>(
        dst: &mut [u8],
        sources: &[&[u8]],
        segment_of: &[u32],
        row_of: &[u32],
    ) {
        let width = std::mem::size_of::<T>();
        let done = match (distances(sources), width) {
            // SAFETY: the contract, and every lane's offset stays inside its own source.
            (Some(table), 4) => unsafe { offsets_4(dst, sources[0], &table, segment_of, row_of) },
            // SAFETY: as above.
            (Some(table), 8) => unsafe { offsets_8(dst, sources[0], &table, segment_of, row_of) },
            _ => 0,
        };
        // SAFETY: the remaining positions, per the contract.
        unsafe {
            super::scalars::<T>(
                &mut dst[done * width..],
                sources,
                &segment_of[done..],
                &row_of[done..],
            )
        }
    }

    /// Full steps of 16 four-byte lanes through source distances; returns the positions done.
    ///
    /// # Safety
    /// The kernels' contract; `table` holds each source's distance from `first`.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn offsets_4(
        dst: &mut [u8],
        first: &[u8],
        table: &[i32; 16],
        segment_of: &[u32],
        row_of: &[u32],
    ) -> usize {
        let (out, base) = (dst.as_mut_ptr(), first.as_ptr());
        let mut i = 0;
        // SAFETY: lanes `i..i + 16` exist in every slice; each lane's address is its source's
        // start plus its row's offset, inside the source by the contract.
        unsafe {
            let table = _mm512_loadu_si512(table.as_ptr().cast::<__m512i>());
            while i + 16 <= row_of.len() {
                let index = _mm512_loadu_si512(row_of.as_ptr().add(i).cast::<__m512i>());
                let segment = _mm512_loadu_si512(segment_of.as_ptr().add(i).cast::<__m512i>());
                let offset = _mm512_add_epi32(
                    _mm512_permutexvar_epi32(segment, table),
                    _mm512_slli_epi32::<2>(index),
                );
                let values = _mm512_i32gather_epi32::<1>(offset, base.cast());
                _mm512_storeu_si512(out.add(i * 4).cast::<__m512i>(), values);
                i += 16;
            }
        }
        i
    }

    /// Full steps of 16 eight-byte lanes through source distances; returns the positions done.
    ///
    /// # Safety
    /// The kernels' contract; `table` holds each source's distance from `first`.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn offsets_8(
        dst: &mut [u8],
        first: &[u8],
        table: &[i32; 16],
        segment_of: &[u32],
        row_of: &[u32],
    ) -> usize {
        let (out, base) = (dst.as_mut_ptr(), first.as_ptr());
        let mut i = 0;
        // SAFETY: as in `offsets_4`, with 8-byte lanes in two halves of 8.
        unsafe {
            let table = _mm512_loadu_si512(table.as_ptr().cast::<__m512i>());
            while i + 16 <= row_of.len() {
                let index = _mm512_loadu_si512(row_of.as_ptr().add(i).cast::<__m512i>());
                let segment = _mm512_loadu_si512(segment_of.as_ptr().add(i).cast::<__m512i>());
                let offset = _mm512_add_epi32(
                    _mm512_permutexvar_epi32(segment, table),
                    _mm512_slli_epi32::<3>(index),
                );
                let low = _mm512_i32gather_epi64::<1>(_mm512_castsi512_si256(offset), base.cast());
                let high = _mm512_i32gather_epi64::<1>(
                    _mm512_extracti64x4_epi64::<1>(offset),
                    base.cast(),
                );
                _mm512_storeu_si512(out.add(i * 8).cast::<__m512i>(), low);
                _mm512_storeu_si512(out.add(i * 8 + 64).cast::<__m512i>(), high);
                i += 16;
            }
        }
        i
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_width_and_source_count_gathers_the_same_as_indexing() {
        // Odd sizes exercise the vector loops' tails; an offset of 1 byte makes every source
        // value unaligned.
        let n = 1003usize;
        let rows: Vec<u32> = (0..n).map(|i| ((i * 389) % n) as u32).collect();
        let segment_of: Vec<u32> = (0..n).map(|i| (i % 3 == 0) as u32).collect();
        for (width, len) in [(4, 1), (8, 1), (2, 1), (4, 3), (1, 5)] {
            let row_bytes = width * len;
            let values: Vec<u8> = (0..(n * row_bytes) as u32)
                .map(|v| (v * 7 % 251) as u8)
                .collect();
            let mut shifted = vec![0u8];
            shifted.extend(&values);
            let src = &shifted[1..];
            let other: Vec<u8> = values.iter().map(|v| v ^ 0xff).collect();
            let expect = |segments: &[&[u8]], one: bool| -> Vec<u8> {
                (0..n)
                    .flat_map(|i| {
                        let s = if one { 0 } else { segment_of[i] as usize };
                        let r = rows[i] as usize * row_bytes;
                        segments[s][r..r + row_bytes].to_vec()
                    })
                    .collect()
            };
            let zeros = vec![0u32; n];
            let all = 0..n as u32;
            let one = Gather {
                segment_of: &zeros,
                row_of: &rows,
                ranges: std::slice::from_ref(&all),
            };
            let mut dst = vec![0u8; n * row_bytes];
            one.run(&mut dst, width, len, &[src]);
            assert_eq!(
                dst,
                expect(&[src], true),
                "one source, width {width} len {len}"
            );
            let two = Gather {
                segment_of: &segment_of,
                row_of: &rows,
                ranges: &[0..n as u32, 0..n as u32],
            };
            let mut dst = vec![0u8; n * row_bytes];
            two.run(&mut dst, width, len, &[src, &other]);
            assert_eq!(
                dst,
                expect(&[src, &other], false),
                "two sources, width {width}"
            );
        }
    }

    #[test]
    #[should_panic(expected = "source shorter than its rows")]
    fn a_short_source_is_refused_before_any_unchecked_read() {
        let rows = [0u32, 9];
        let gather = Gather {
            segment_of: &[0, 0],
            row_of: &rows,
            ranges: std::slice::from_ref(&(0..10)),
        };
        let mut dst = vec![0u8; 8];
        gather.run(&mut dst, 4, 1, &[&[0u8; 36]]);
    }
}
