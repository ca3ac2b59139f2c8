//! Adasum's per-tensor arithmetic on raw bytes: the dot product and squared norms of two
//! vectors (accumulated in float64 for every dtype, as Horovod does), the coefficients of the
//! pairwise combination, and the combination `a = acoeff * a + bcoeff * b`.
//!
//! Elements are read and written unaligned (native byte order), so any tensor buffer works.

use half::{bf16, f16};

use crate::dtype::DType;
use crate::error::{Error, Result};

/// `sqrt(f64::MIN_POSITIVE)`: a squared norm below this counts as zero (Horovod's
/// `sqrt_double_min`), so a zero vector keeps coefficient 1 instead of dividing by zero.
fn norm_floor() -> f64 {
    f64::MIN_POSITIVE.sqrt()
}

/// The dot product and squared norms of one tensor's part on the two sides of a pair.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct DotNorms {
    pub dot: f64,
    pub a_norm_sq: f64,
    pub b_norm_sq: f64,
}

impl DotNorms {
    /// The coefficients of `a` and `b` in Adasum's combination:
    /// `1 - a·b / (2 |a|²)` and `1 - a·b / (2 |b|²)` (1 for a vector of norm ~0).
    pub(crate) fn coefficients(&self) -> (f64, f64) {
        let floor = norm_floor();
        let a = if self.a_norm_sq >= floor {
            1.0 - self.dot / self.a_norm_sq * 0.5
        } else {
            1.0
        };
        let b = if self.b_norm_sq >= floor {
            1.0 - self.dot / self.b_norm_sq * 0.5
        } else {
            1.0
        };
        (a, b)
    }
}

/// Elements Adasum combines: read as float64, written back rounded from float64.
trait Element: Copy {
    const SIZE: usize;
    fn read(bytes: &[u8]) -> f64;
    fn write(bytes: &mut [u8], value: f64);
}

macro_rules! element {
    ($t:ty, $size:expr, $to:expr, $from:expr) => {
        impl Element for $t {
            const SIZE: usize = $size;
            #[inline(always)]
            fn read(bytes: &[u8]) -> f64 {
                let mut raw = [0u8; $size];
                raw.copy_from_slice(bytes);
                ($to)(<$t>::from_ne_bytes(raw))
            }
            #[inline(always)]
            fn write(bytes: &mut [u8], value: f64) {
                let v: $t = ($from)(value);
                bytes.copy_from_slice(&v.to_ne_bytes());
            }
        }
    };
}
element!(f64, 8, |x: f64| x, |v: f64| v);
element!(f32, 4, f64::from, |v: f64| v as f32);
element!(f16, 2, f64::from, f16::from_f64);
element!(bf16, 2, f64::from, bf16::from_f64);

fn dot_norms_of<T: Element>(a: &[u8], b: &[u8]) -> DotNorms {
    let mut out = DotNorms::default();
    for (x, y) in a.chunks_exact(T::SIZE).zip(b.chunks_exact(T::SIZE)) {
        let (x, y) = (T::read(x), T::read(y));
        out.dot += x * y;
        out.a_norm_sq += x * x;
        out.b_norm_sq += y * y;
    }
    out
}

fn scaled_add_of<T: Element>(acoeff: f64, a: &mut [u8], bcoeff: f64, b: &[u8]) {
    for (x, y) in a.chunks_exact_mut(T::SIZE).zip(b.chunks_exact(T::SIZE)) {
        let value = acoeff * T::read(x) + bcoeff * T::read(y);
        T::write(x, value);
    }
}

fn not_float(dtype: DType) -> Error {
    Error::InvalidArgument(format!(
        "op Adasum is not supported for {dtype} tensors; use float16, bfloat16, float32 or float64"
    ))
}

fn check_pair(dtype: DType, a: usize, b: usize) -> Result<()> {
    if a != b || !a.is_multiple_of(dtype.size()) {
        return Err(Error::Internal(format!(
            "adasum: pair of {a} and {b} bytes of {dtype}"
        )));
    }
    Ok(())
}

/// The dot product and squared norms of `a` and `b` (same length, elements of `dtype`).
pub(crate) fn dot_norms(dtype: DType, a: &[u8], b: &[u8]) -> Result<DotNorms> {
    check_pair(dtype, a.len(), b.len())?;
    Ok(match dtype {
        DType::F64 => dot_norms_of::<f64>(a, b),
        DType::F32 => dot_norms_of::<f32>(a, b),
        DType::F16 => dot_norms_of::<f16>(a, b),
        DType::BF16 => dot_norms_of::<bf16>(a, b),
        other => return Err(not_float(other)),
    })
}

/// `a[i] = acoeff * a[i] + bcoeff * b[i]`, computed in float64 and rounded once to `dtype`.
pub(crate) fn scaled_add(
    dtype: DType,
    acoeff: f64,
    a: &mut [u8],
    bcoeff: f64,
    b: &[u8],
) -> Result<()> {
    check_pair(dtype, a.len(), b.len())?;
    match dtype {
        DType::F64 => scaled_add_of::<f64>(acoeff, a, bcoeff, b),
        DType::F32 => scaled_add_of::<f32>(acoeff, a, bcoeff, b),
        DType::F16 => scaled_add_of::<f16>(acoeff, a, bcoeff, b),
        DType::BF16 => scaled_add_of::<bf16>(acoeff, a, bcoeff, b),
        other => return Err(not_float(other)),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(v: &[f64]) -> Vec<u8> {
        bytemuck::cast_slice(v).to_vec()
    }

    #[test]
    fn orthogonal_vectors_add_and_parallel_ones_average() {
        let (a, b) = (bytes(&[1.0, 0.0]), bytes(&[0.0, 2.0]));
        let dn = dot_norms(DType::F64, &a, &b).unwrap();
        assert_eq!(dn.coefficients(), (1.0, 1.0));
        let (a, b) = (bytes(&[3.0, 4.0]), bytes(&[3.0, 4.0]));
        let dn = dot_norms(DType::F64, &a, &b).unwrap();
        assert_eq!(dn.coefficients(), (0.5, 0.5));
        let mut out = a.clone();
        scaled_add(DType::F64, 0.5, &mut out, 0.5, &b).unwrap();
        assert_eq!(out, a);
    }

    #[test]
    fn a_zero_vector_keeps_coefficient_one() {
        let (a, b) = (bytes(&[0.0, 0.0]), bytes(&[1.0, 2.0]));
        let dn = dot_norms(DType::F64, &a, &b).unwrap();
        assert_eq!(dn.coefficients(), (1.0, 1.0));
    }

    #[test]
    fn half_types_accumulate_in_f64_and_round_once() {
        // 4096 elements of 1.0: a float16 accumulator would stop at 2048.
        let ones: Vec<u8> = (0..4096).flat_map(|_| f16::ONE.to_ne_bytes()).collect();
        let dn = dot_norms(DType::F16, &ones, &ones).unwrap();
        assert_eq!(dn.dot, 4096.0);
        let third: Vec<u8> = bf16::from_f64(1.0 / 3.0).to_ne_bytes().to_vec();
        let mut a = third.clone();
        scaled_add(DType::BF16, 1.5, &mut a, 1.5, &third).unwrap();
        let exact = 3.0 * f64::from(bf16::from_f64(1.0 / 3.0));
        assert_eq!(a, bf16::from_f64(exact).to_ne_bytes());
    }

    #[test]
    fn integer_dtypes_and_ragged_pairs_are_refused() {
        assert!(matches!(
            dot_norms(DType::I32, &[0; 4], &[0; 4]),
            Err(Error::InvalidArgument(m)) if m.contains("int32")
        ));
        assert!(matches!(
            scaled_add(DType::F32, 1.0, &mut [0; 4], 1.0, &[0; 8]),
            Err(Error::Internal(_))
        ));
    }
}
