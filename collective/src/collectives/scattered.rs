//! A batch of tensors seen as one byte range, laid end to end: the engine's fused allreduce
//! over shared memory reads and writes the tensors where they are, so packing a fusion buffer
//! *is* the copy into the shared segment and unpacking it the copy out of it.

use std::ops::Range;

use crate::error::{Error, Result};

/// Copies at or above this many bytes use non-temporal stores in [`copy_streaming`].
const STREAMING_MIN: usize = 4096;

/// Several disjoint byte slices viewed as their concatenation (the "joint range").
pub(crate) struct Scattered<'a> {
    parts: Vec<&'a mut [u8]>,
    /// Where each part starts in the joint range, then the total length.
    starts: Vec<usize>,
}

impl<'a> Scattered<'a> {
    /// The concatenation of `parts`, in order. An error (a bug) if their total overflows.
    pub(crate) fn new(parts: Vec<&'a mut [u8]>) -> Result<Self> {
        let mut starts = Vec::with_capacity(parts.len() + 1);
        let mut at = 0usize;
        for part in &parts {
            starts.push(at);
            at = at
                .checked_add(part.len())
                .ok_or_else(|| Error::Internal("a tensor batch larger than memory".into()))?;
        }
        starts.push(at);
        Ok(Scattered { parts, starts })
    }

    /// One contiguous buffer.
    pub(crate) fn one(buf: &'a mut [u8]) -> Self {
        let len = buf.len();
        Scattered {
            parts: vec![buf],
            starts: vec![0, len],
        }
    }

    /// Bytes in the joint range.
    pub(crate) fn len(&self) -> usize {
        self.starts.last().copied().unwrap_or(0)
    }

    /// The parts, in order.
    pub(crate) fn parts_mut(&mut self) -> &mut [&'a mut [u8]] {
        &mut self.parts
    }

    /// Calls `f(offset, piece)` for every non-empty piece of a part inside `range` of the joint
    /// range, in order; `offset` is the piece's start relative to `range.start`. A range past
    /// the end is an error (a bug), checked before `f` runs.
    pub(crate) fn visit(
        &mut self,
        range: Range<usize>,
        mut f: impl FnMut(usize, &mut [u8]) -> Result<()>,
    ) -> Result<()> {
        if range.start > range.end || range.end > self.len() {
            return Err(Error::Internal(format!(
                "bytes {range:?} of a {}-byte tensor batch",
                self.len()
            )));
        }
        let mut i = self
            .starts
            .partition_point(|&s| s <= range.start)
            .saturating_sub(1);
        let mut at = range.start;
        while at < range.end && i < self.parts.len() {
            let (start, end) = (self.starts[i], self.starts[i + 1]);
            if end > at {
                let piece = &mut self.parts[i][at - start..range.end.min(end) - start];
                f(at - range.start, piece)?;
                at += piece.len();
            }
            i += 1;
        }
        Ok(())
    }

    /// Copies `range` of the joint range into `dst` (of `range.len()` bytes).
    pub(crate) fn gather(&mut self, range: Range<usize>, dst: &mut [u8]) -> Result<()> {
        check_len(&range, dst.len())?;
        self.visit(range, |at, piece| {
            dst[at..at + piece.len()].copy_from_slice(piece);
            Ok(())
        })
    }

    /// Copies `src` (of `range.len()` bytes) into `range` of the joint range; `streaming`
    /// bypasses the cache (see [`copy_streaming`]) for data nobody reads soon.
    pub(crate) fn scatter(
        &mut self,
        range: Range<usize>,
        src: &[u8],
        streaming: bool,
    ) -> Result<()> {
        check_len(&range, src.len())?;
        self.visit(range, |at, piece| {
            let from = &src[at..at + piece.len()];
            if streaming {
                copy_streaming(piece, from);
            } else {
                piece.copy_from_slice(from);
            }
            Ok(())
        })
    }
}

fn check_len(range: &Range<usize>, len: usize) -> Result<()> {
    if range.len() != len {
        return Err(Error::Internal(format!(
            "{len} bytes for the {}-byte range {range:?} of a tensor batch",
            range.len()
        )));
    }
    Ok(())
}

/// `dst.copy_from_slice(src)` with non-temporal stores on x86_64 for copies of 4 KiB and
/// more: the destination is written to memory without first being read into the cache, and
/// does not evict the data a pipelined collective is about to use. For destinations read
/// again only much later (the copy-out of a large allreduce). Panics if the lengths differ.
pub(crate) fn copy_streaming(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_streaming of unequal lengths");
    #[cfg(target_arch = "x86_64")]
    if dst.len() >= STREAMING_MIN {
        // SAFETY: SSE2 is part of the x86_64 baseline; the slices are valid and equally long.
        unsafe { stream_sse2(dst, src) };
        return;
    }
    dst.copy_from_slice(src);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
unsafe fn stream_sse2(dst: &mut [u8], src: &[u8]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    let head = dst.as_ptr().align_offset(16).min(dst.len());
    dst[..head].copy_from_slice(&src[..head]);
    let body = (dst.len() - head) / 64 * 64;
    let d = dst[head..].as_mut_ptr();
    let s = src[head..].as_ptr();
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 64 <= body <= dst.len() - head`, so all four 16-byte loads and stores
        // are inside the slices; `d + i` is 16-byte aligned (`head` aligned `d`, `i` is a
        // multiple of 64) as `_mm_stream_si128` requires; the loads are unaligned ones.
        unsafe {
            let a = _mm_loadu_si128(s.add(i).cast::<__m128i>());
            let b = _mm_loadu_si128(s.add(i + 16).cast::<__m128i>());
            let c = _mm_loadu_si128(s.add(i + 32).cast::<__m128i>());
            let e = _mm_loadu_si128(s.add(i + 48).cast::<__m128i>());
            _mm_stream_si128(d.add(i).cast::<__m128i>(), a);
            _mm_stream_si128(d.add(i + 16).cast::<__m128i>(), b);
            _mm_stream_si128(d.add(i + 32).cast::<__m128i>(), c);
            _mm_stream_si128(d.add(i + 48).cast::<__m128i>(), e);
        }
        i += 64;
    }
    // Non-temporal stores are weakly ordered: fence them before anything that publishes the
    // bytes (completing the handle) can be seen by another thread.
    _mm_sfence();
    dst[head + body..].copy_from_slice(&src[head + body..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_and_scatter_cross_part_boundaries_and_skip_empty_parts() {
        let (mut a, mut b, mut c, mut d) = ([1u8, 2, 3], [0u8; 0], [4u8, 5], [6u8, 7, 8, 9]);
        let mut s = Scattered::new(vec![&mut a, &mut b, &mut c, &mut d]).unwrap();
        assert_eq!(s.len(), 9);
        let mut out = [0u8; 5];
        s.gather(2..7, &mut out).unwrap();
        assert_eq!(out, [3, 4, 5, 6, 7]);
        s.scatter(1..8, &[10, 11, 12, 13, 14, 15, 16], false)
            .unwrap();
        let mut all = [0u8; 9];
        s.gather(0..9, &mut all).unwrap();
        assert_eq!(all, [1, 10, 11, 12, 13, 14, 15, 16, 9]);
        let mut seen = Vec::new();
        s.visit(2..9, |at, piece| {
            seen.push((at, piece.len()));
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, vec![(0, 1), (1, 2), (3, 4)]);
        // Out-of-range and wrong-length requests are errors, not panics or partial copies.
        assert!(s.gather(5..10, &mut [0; 5]).is_err());
        assert!(s.scatter(0..3, &[1, 2], false).is_err());
        assert_eq!(all, {
            let mut again = [0u8; 9];
            s.gather(0..9, &mut again).unwrap();
            again
        });
    }

    #[test]
    fn streaming_copies_equal_plain_ones_at_every_alignment() {
        let src: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + 3) as u8).collect();
        for (offset, len) in [(0, 20_000 - 64), (1, 4096), (13, 10_007), (5, 100), (0, 0)] {
            let mut dst = vec![0u8; 20_001];
            copy_streaming(&mut dst[offset..offset + len], &src[..len]);
            assert_eq!(&dst[offset..offset + len], &src[..len], "{offset} {len}");
            assert!(dst[..offset].iter().all(|&b| b == 0));
            assert!(dst[offset + len..].iter().all(|&b| b == 0));
        }
    }
}
