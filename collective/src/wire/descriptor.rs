//! The `Descriptor` frame payload: what a rank is about to run, so all ranks can check that
//! they agree before any tensor bytes move.
//!
//! Layout (little endian): kind u8, dtype u8, op u8 (255 = none), flags u8 (bit 0: invalid,
//! bit 1: the tensor is on a CUDA device),
//! root u32, prescale f64, postscale f64, name (u32 length + UTF-8), shape (u32 count + i64
//! each), splits (u32 count + u64 each), and when the invalid flag is set the local error
//! message (u32 length + UTF-8).

use std::fmt;

use super::{FrameError, FrameKind};
use crate::dtype::{DType, ReduceOp};

/// The longest tensor name a descriptor carries, in bytes.
pub const MAX_NAME_LEN: usize = 64 * 1024;
/// The most dimensions a tensor may have.
pub const MAX_DIMS: usize = 64;
/// The longest local error message an invalid descriptor carries, in bytes.
pub const MAX_INVALID_LEN: usize = 4096;

const FIXED_LEN: usize = 4 + 4 + 8 + 8;
const NO_OP: u8 = 255;
const FLAG_INVALID: u8 = 1;
const FLAG_DEVICE: u8 = 2;

/// Which collective a descriptor announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum OpKind {
    /// `allreduce`
    Allreduce = 1,
    /// `allgather`
    Allgather = 2,
    /// `broadcast`
    Broadcast = 3,
    /// `alltoall`
    Alltoall = 4,
    /// `reducescatter`
    Reducescatter = 5,
    /// `barrier`
    Barrier = 6,
    /// Registering a process set (its members travel in `splits`).
    AddProcessSet = 7,
    /// Removing a process set (its id travels in `root`).
    RemoveProcessSet = 8,
}

impl OpKind {
    /// The kind with wire code `code`.
    pub fn from_code(code: u8) -> Option<OpKind> {
        match code {
            1 => Some(OpKind::Allreduce),
            2 => Some(OpKind::Allgather),
            3 => Some(OpKind::Broadcast),
            4 => Some(OpKind::Alltoall),
            5 => Some(OpKind::Reducescatter),
            6 => Some(OpKind::Barrier),
            7 => Some(OpKind::AddProcessSet),
            8 => Some(OpKind::RemoveProcessSet),
            _ => None,
        }
    }

    /// The collective's name.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Allreduce => "allreduce",
            OpKind::Allgather => "allgather",
            OpKind::Broadcast => "broadcast",
            OpKind::Alltoall => "alltoall",
            OpKind::Reducescatter => "reducescatter",
            OpKind::Barrier => "barrier",
            OpKind::AddProcessSet => "add_process_set",
            OpKind::RemoveProcessSet => "remove_process_set",
        }
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What one rank is about to run.
#[derive(Debug, Clone)]
pub struct OpDescriptor {
    /// The collective.
    pub kind: OpKind,
    /// The tensor's name (may be empty).
    pub name: String,
    /// The element type.
    pub dtype: DType,
    /// The tensor's shape on this rank.
    pub shape: Vec<i64>,
    /// The reduction op (allreduce and reducescatter).
    pub op: Option<ReduceOp>,
    /// The root rank (broadcast), else 0.
    pub root: u32,
    /// Factor applied to every input before the reduction.
    pub prescale: f64,
    /// Factor applied to the result.
    pub postscale: f64,
    /// Alltoall: rows sent to each rank; else empty.
    pub splits: Vec<u64>,
    /// The tensor is CUDA device memory (the op runs through NCCL).
    pub device: bool,
    /// Set when this rank's arguments failed local validation: the error it reports. Other
    /// ranks then fail the collective too instead of waiting for data that never comes.
    pub invalid: Option<String>,
}

/// Field by field, the cheap fields first and without `memcmp`: a response-cache look-up
/// compares one descriptor per submitted tensor every cycle, and glibc's `memcmp` for the short
/// names and shapes of a descriptor took ~40 ns a call on this project's (AMD, AVX-512) machines
/// against ~7 ns for the whole comparison here.
impl PartialEq for OpDescriptor {
    fn eq(&self, other: &Self) -> bool {
        // Destructured so that a new field cannot be left out of the comparison.
        let OpDescriptor {
            kind,
            name,
            dtype,
            shape,
            op,
            root,
            prescale,
            postscale,
            splits,
            device,
            invalid,
        } = self;
        *kind == other.kind
            && *dtype == other.dtype
            && *op == other.op
            && *root == other.root
            && *prescale == other.prescale
            && *postscale == other.postscale
            && *device == other.device
            && same_words(shape, &other.shape)
            && same_words(splits, &other.splits)
            && same_bytes(name.as_bytes(), other.name.as_bytes())
            && *invalid == other.invalid
    }
}

/// `a == b` for short slices, element by element.
fn same_words<T: Copy + PartialEq>(a: &[T], b: &[T]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

/// `a == b` for short byte strings, eight bytes at a time.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let (mut wa, mut wb) = (a.chunks_exact(8), b.chunks_exact(8));
    let word = |c: &[u8]| u64::from_ne_bytes(c.try_into().unwrap_or_default());
    (&mut wa).zip(&mut wb).all(|(x, y)| word(x) == word(y))
        && same_words(wa.remainder(), wb.remainder())
}

impl OpDescriptor {
    /// A descriptor of collective `kind` with no tensor (barrier), or a starting point to fill.
    pub fn new(kind: OpKind, name: &str) -> Self {
        OpDescriptor {
            kind,
            name: name.to_owned(),
            dtype: DType::U8,
            shape: Vec::new(),
            op: None,
            root: 0,
            prescale: 1.0,
            postscale: 1.0,
            splits: Vec::new(),
            device: false,
            invalid: None,
        }
    }

    /// The largest encoded descriptor in a job of `size` ranks.
    pub fn max_encoded_len(size: usize) -> usize {
        FIXED_LEN + 4 + MAX_NAME_LEN + 4 + 8 * MAX_DIMS + 4 + 8 * size + 4 + MAX_INVALID_LEN
    }

    /// The payload bytes. Fields beyond the caps (name, shape, message) are cut so the result
    /// always decodes; callers validate them first.
    pub fn encode(&self) -> Vec<u8> {
        let name = clip(&self.name, MAX_NAME_LEN);
        let shape = &self.shape[..self.shape.len().min(MAX_DIMS)];
        let mut out =
            Vec::with_capacity(FIXED_LEN + 16 + name.len() + 8 * (shape.len() + self.splits.len()));
        out.push(self.kind as u8);
        out.push(self.dtype as u8);
        out.push(self.op.map_or(NO_OP, |op| op as u8));
        out.push(
            if self.invalid.is_some() {
                FLAG_INVALID
            } else {
                0
            } | if self.device { FLAG_DEVICE } else { 0 },
        );
        out.extend_from_slice(&self.root.to_le_bytes());
        out.extend_from_slice(&self.prescale.to_bits().to_le_bytes());
        out.extend_from_slice(&self.postscale.to_bits().to_le_bytes());
        put_bytes(&mut out, name.as_bytes());
        out.extend_from_slice(&(shape.len() as u32).to_le_bytes());
        for dim in shape {
            out.extend_from_slice(&dim.to_le_bytes());
        }
        out.extend_from_slice(&(self.splits.len() as u32).to_le_bytes());
        for split in &self.splits {
            out.extend_from_slice(&split.to_le_bytes());
        }
        if let Some(message) = &self.invalid {
            put_bytes(&mut out, clip(message, MAX_INVALID_LEN).as_bytes());
        }
        out
    }

    /// Decodes a payload from a job of `size` ranks (which bounds the splits).
    pub fn decode(payload: &[u8], size: usize) -> Result<OpDescriptor, FrameError> {
        let mut r = Reader { rest: payload };
        let kind_code = r.u8()?;
        let kind = OpKind::from_code(kind_code)
            .ok_or_else(|| malformed(format!("unknown collective {kind_code}")))?;
        let dtype_code = r.u8()?;
        let dtype = DType::from_code(dtype_code)
            .ok_or_else(|| malformed(format!("unknown dtype {dtype_code}")))?;
        let op = match r.u8()? {
            NO_OP => None,
            code => Some(
                ReduceOp::from_code(code)
                    .ok_or_else(|| malformed(format!("unknown reduce op {code}")))?,
            ),
        };
        let flags = r.u8()?;
        if flags & !(FLAG_INVALID | FLAG_DEVICE) != 0 {
            return Err(malformed(format!("unknown descriptor flags {flags:#04x}")));
        }
        let root = r.u32()?;
        let prescale = f64::from_bits(r.u64()?);
        let postscale = f64::from_bits(r.u64()?);
        let name = r.string(MAX_NAME_LEN, "name")?;
        let ndim = r.count(MAX_DIMS, 8, "shape")?;
        let shape = (0..ndim)
            .map(|_| r.u64().map(|d| d as i64))
            .collect::<Result<Vec<_>, _>>()?;
        let nsplits = r.count(size, 8, "splits")?;
        let splits = (0..nsplits)
            .map(|_| r.u64())
            .collect::<Result<Vec<_>, _>>()?;
        let invalid = if flags & FLAG_INVALID != 0 {
            Some(r.string(MAX_INVALID_LEN, "error message")?)
        } else {
            None
        };
        if !r.rest.is_empty() {
            return Err(malformed(format!("{} trailing bytes", r.rest.len())));
        }
        Ok(OpDescriptor {
            kind,
            name,
            dtype,
            shape,
            op,
            root,
            prescale,
            postscale,
            splits,
            device: flags & FLAG_DEVICE != 0,
            invalid,
        })
    }
}

fn clip(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn malformed(what: String) -> FrameError {
    FrameError::Malformed {
        kind: FrameKind::Descriptor,
        what,
    }
}

struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        if self.rest.len() < n {
            return Err(malformed(format!(
                "needed {n} more bytes but only {} remain",
                self.rest.len()
            )));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, FrameError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, FrameError> {
        let mut word = [0u8; 8];
        word.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(word))
    }

    /// A count of `item`-byte entries, at most `max` and no more than the bytes left.
    fn count(&mut self, max: usize, item: usize, what: &str) -> Result<usize, FrameError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(malformed(format!(
                "{n} {what} entries exceed the limit of {max}"
            )));
        }
        if n.saturating_mul(item) > self.rest.len() {
            return Err(malformed(format!(
                "{n} {what} entries do not fit in {} bytes",
                self.rest.len()
            )));
        }
        Ok(n)
    }

    fn string(&mut self, max: usize, what: &str) -> Result<String, FrameError> {
        let n = self.count(max, 1, what)?;
        let bytes = self.take(n)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| malformed(format!("{what} is not UTF-8")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn descriptor_strategy() -> impl Strategy<Value = OpDescriptor> {
        (
            1u8..=6,
            0u8..10,
            proptest::option::of(0u8..5),
            any::<u32>(),
            any::<f64>(),
            any::<f64>(),
            ".{0,40}",
            proptest::collection::vec(any::<i64>(), 0..6),
            proptest::collection::vec(any::<u64>(), 0..8),
            proptest::option::of(".{0,40}"),
            any::<bool>(),
        )
            .prop_map(
                |(
                    kind,
                    dtype,
                    op,
                    root,
                    prescale,
                    postscale,
                    name,
                    shape,
                    splits,
                    invalid,
                    device,
                )| {
                    OpDescriptor {
                        kind: OpKind::from_code(kind).unwrap(),
                        name,
                        dtype: DType::from_code(dtype).unwrap(),
                        shape,
                        op: op.and_then(ReduceOp::from_code),
                        root,
                        prescale,
                        postscale,
                        splits,
                        device,
                        invalid,
                    }
                },
            )
    }

    /// Equality that treats NaN scale factors bit for bit.
    fn same(a: &OpDescriptor, b: &OpDescriptor) -> bool {
        a.prescale.to_bits() == b.prescale.to_bits()
            && a.postscale.to_bits() == b.postscale.to_bits()
            && OpDescriptor {
                prescale: 0.0,
                postscale: 0.0,
                ..a.clone()
            } == OpDescriptor {
                prescale: 0.0,
                postscale: 0.0,
                ..b.clone()
            }
    }

    #[test]
    fn oversized_fields_are_clipped_so_they_still_decode() {
        let mut d = OpDescriptor::new(OpKind::Allreduce, &"n".repeat(MAX_NAME_LEN + 10));
        d.shape = vec![1; MAX_DIMS + 3];
        d.invalid = Some("x".repeat(MAX_INVALID_LEN * 2));
        let back = OpDescriptor::decode(&d.encode(), 4).unwrap();
        assert_eq!(back.name.len(), MAX_NAME_LEN);
        assert_eq!(back.shape.len(), MAX_DIMS);
        assert_eq!(back.invalid.unwrap().len(), MAX_INVALID_LEN);
        assert!(d.encode().len() <= OpDescriptor::max_encoded_len(4));
    }

    #[test]
    fn splits_beyond_the_job_size_are_rejected() {
        let mut d = OpDescriptor::new(OpKind::Alltoall, "a");
        d.splits = vec![1, 2, 3];
        assert!(OpDescriptor::decode(&d.encode(), 3).is_ok());
        assert!(OpDescriptor::decode(&d.encode(), 2).is_err());
    }

    /// Equality as the standard comparisons of every field give it.
    fn field_by_field(a: &OpDescriptor, b: &OpDescriptor) -> bool {
        (a.kind, &a.name, a.dtype, &a.shape, a.op, a.root)
            == (b.kind, &b.name, b.dtype, &b.shape, b.op, b.root)
            && (a.prescale, a.postscale, &a.splits, a.device, &a.invalid)
                == (b.prescale, b.postscale, &b.splits, b.device, &b.invalid)
    }

    proptest! {
        #[test]
        fn equality_is_the_standard_one_of_every_field(
            a in descriptor_strategy(),
            b in descriptor_strategy(),
            change in 0usize..12,
            cut in 0usize..48,
        ) {
            prop_assert_eq!(a == b, field_by_field(&a, &b));
            // A copy equals its original unless one field differs (NaN scales never equal).
            let mut c = a.clone();
            match change {
                0 => c.kind = if a.kind == OpKind::Allreduce { OpKind::Broadcast } else { OpKind::Allreduce },
                1 => {
                    c.name.pop();
                }
                2 => c.name.push(char::from(b'a' + (cut % 26) as u8)),
                3 => c.shape.push(cut as i64),
                4 => c.shape = c.shape.iter().map(|d| d.wrapping_add(1)).collect(),
                5 => c.splits.push(cut as u64),
                6 => c.root = c.root.wrapping_add(1),
                7 => c.prescale += 1.0,
                8 => c.device = !c.device,
                9 => c.invalid = Some(format!("{:?}x", a.invalid)),
                _ => {}
            }
            prop_assert_eq!(c == a, field_by_field(&c, &a), "{:?} against {:?}", c, a);
        }

        #[test]
        fn descriptor_round_trips(d in descriptor_strategy()) {
            let bytes = d.encode();
            prop_assert!(bytes.len() <= OpDescriptor::max_encoded_len(8));
            let back = OpDescriptor::decode(&bytes, 8).unwrap();
            prop_assert!(same(&back, &d), "{:?} != {:?}", back, d);
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256), size in 0usize..16) {
            let _ = OpDescriptor::decode(&bytes, size);
        }

        #[test]
        fn decoding_mutated_descriptors_never_panics(d in descriptor_strategy(), at in 0usize..128, byte in any::<u8>()) {
            let mut bytes = d.encode();
            if let Some(slot) = bytes.get_mut(at) {
                *slot = byte;
            }
            let _ = OpDescriptor::decode(&bytes, 8);
        }
    }
}
