//! The layout of a device fusion buffer and the copy segments of the batched pack/unpack
//! kernel (one launch copies every tensor of a fused batch, scaling on the way).
//!
//! Each tensor starts at a multiple of [`ALIGN`] in the fusion buffer, so the kernel can copy
//! with 16-byte vectors whenever the tensor itself is 16-byte aligned (torch's allocations
//! are). Every copy is cut into segments of at most [`SEGMENT_BYTES`], one per thread block
//! at a time, so a batch of one huge and many tiny tensors still spreads over every SM.
//!
//! ```
//! use kolo_collective::cuda::plan::{FusionLayout, Direction};
//!
//! let layout = FusionLayout::new(&[6, 4000]);
//! assert_eq!(layout.offsets(), &[0, 256]);
//! let segs = layout.segments(&[0x1000, 0x9000], 0x100000, Direction::Pack);
//! assert_eq!((segs[0].src, segs[0].dst, segs[0].bytes), (0x1000, 0x100000, 6));
//! ```

/// Where each tensor starts in the fusion buffer is a multiple of this many bytes.
pub const ALIGN: u64 = 256;

/// The most bytes one segment (one thread block's unit of work) copies; a multiple of 16, so
/// segments of a tensor start on element and vector boundaries.
pub const SEGMENT_BYTES: u64 = 64 << 10;

/// One contiguous copy; the layout the kernel reads (`struct KoloSegment`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Segment {
    /// Device address to read.
    pub src: u64,
    /// Device address to write.
    pub dst: u64,
    /// Bytes to copy.
    pub bytes: u64,
}

/// Which way a batch is copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Tensors into the fusion buffer.
    Pack,
    /// The fusion buffer back into the tensors.
    Unpack,
}

/// Where each tensor of a fused batch lives in the fusion buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FusionLayout {
    sizes: Vec<u64>,
    offsets: Vec<u64>,
    total: u64,
}

impl FusionLayout {
    /// The layout of tensors of `sizes` bytes, in order.
    pub fn new(sizes: &[u64]) -> Self {
        let mut offsets = Vec::with_capacity(sizes.len());
        let mut at = 0u64;
        for &size in sizes {
            offsets.push(at);
            at = (at + size).div_ceil(ALIGN) * ALIGN;
        }
        let total = match (offsets.last(), sizes.last()) {
            (Some(&o), Some(&s)) => o + s,
            _ => 0,
        };
        FusionLayout {
            sizes: sizes.to_vec(),
            offsets,
            total,
        }
    }

    /// Byte offset of each tensor.
    pub fn offsets(&self) -> &[u64] {
        &self.offsets
    }

    /// Bytes of the fusion buffer the batch uses (its last tensor ends there); a multiple of
    /// every dtype's size when the tensors are whole elements.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The segments copying tensors at device addresses `tensors` into (or out of) the
    /// fusion buffer at `base`.
    pub fn segments(&self, tensors: &[u64], base: u64, direction: Direction) -> Vec<Segment> {
        let mut out = Vec::new();
        for ((&ptr, &size), &offset) in tensors.iter().zip(&self.sizes).zip(&self.offsets) {
            let (src, dst) = match direction {
                Direction::Pack => (ptr, base + offset),
                Direction::Unpack => (base + offset, ptr),
            };
            push_split(&mut out, src, dst, size);
        }
        out
    }
}

/// Appends the copy of `bytes` from `src` to `dst`, cut into segments of at most
/// [`SEGMENT_BYTES`].
pub fn push_split(out: &mut Vec<Segment>, src: u64, dst: u64, bytes: u64) {
    let mut done = 0;
    while done < bytes {
        let n = (bytes - done).min(SEGMENT_BYTES);
        out.push(Segment {
            src: src + done,
            dst: dst + done,
            bytes: n,
        });
        done += n;
    }
}

/// Thread blocks for `segments` segments: one per segment, at most `max_blocks` (blocks loop
/// over the segments), at least one.
pub fn grid_blocks(segments: usize, max_blocks: u32) -> u32 {
    u32::try_from(segments)
        .unwrap_or(u32::MAX)
        .clamp(1, max_blocks.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn segments_cover_every_byte_once(sizes in proptest::collection::vec(0u64..300_000, 0..12)) {
            let layout = FusionLayout::new(&sizes);
            let mut tensors = Vec::new();
            let mut at = 1u64 << 40;
            for &s in &sizes {
                tensors.push(at);
                at += s + 512;
            }
            let base = 1u64 << 32;
            for (i, (&o, &s)) in layout.offsets().iter().zip(&sizes).enumerate() {
                prop_assert_eq!(o % ALIGN, 0);
                if i + 1 < sizes.len() {
                    prop_assert!(o + s <= layout.offsets()[i + 1], "no overlap");
                } else {
                    prop_assert_eq!(o + s, layout.total());
                }
            }
            let segs = layout.segments(&tensors, base, Direction::Pack);
            prop_assert_eq!(segs.iter().map(|s| s.bytes).sum::<u64>(), sizes.iter().sum::<u64>());
            for seg in &segs {
                prop_assert!(seg.bytes > 0 && seg.bytes <= SEGMENT_BYTES);
                // A segment starts on a 16-byte boundary relative to its tensor's start.
                let t = tensors.iter().rposition(|&t| t <= seg.src).unwrap();
                prop_assert_eq!((seg.src - tensors[t]) % 16, 0);
                prop_assert_eq!(seg.dst - (base + layout.offsets()[t]), seg.src - tensors[t]);
            }
            let back = layout.segments(&tensors, base, Direction::Unpack);
            prop_assert_eq!(back.len(), segs.len());
            for (a, b) in segs.iter().zip(&back) {
                prop_assert_eq!((a.src, a.dst, a.bytes), (b.dst, b.src, b.bytes));
            }
        }
    }

    #[test]
    fn grids_have_between_one_and_max_blocks() {
        assert_eq!(grid_blocks(0, 1024), 1);
        assert_eq!(grid_blocks(10, 1024), 10);
        assert_eq!(grid_blocks(5000, 1024), 1024);
        assert_eq!(FusionLayout::new(&[]).total(), 0);
    }
}
