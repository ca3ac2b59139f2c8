//! Elementwise reduction and scaling kernels on raw tensor bytes (native byte order).
//!
//! Semantics follow Horovod and torch: integer sums and products wrap; float16 and bfloat16
//! compute in float32 and round back (to nearest, ties to even); bool `Sum`/`Max` are logical
//! or and `Min`/`Product` logical and. Scaling multiplies in float64 and converts back: floats
//! round, integers truncate toward zero and wrap into the type like an integer overflow.
//!
//! The kernels run on typed slices when the bytes are aligned for the element type, so the
//! loops auto-vectorize; misaligned buffers go through small aligned blocks instead.

use bytemuck::Pod;
use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};

/// Checks that `op` and the scale factors are supported for `dtype`: bool tensors support
/// `Sum`, `Min`, `Max` and `Product` without scaling. Returns the reason otherwise.
pub fn check_reduction(
    dtype: DType,
    op: ReduceOp,
    prescale: f64,
    postscale: f64,
) -> Result<(), String> {
    if dtype != DType::Bool {
        return Ok(());
    }
    if op == ReduceOp::Average {
        return Err("op Average is not supported for bool tensors; use Sum (logical or), Max, Min or Product \
                    (logical and), or convert the tensor to a numeric dtype"
            .into());
    }
    if prescale != 1.0 || postscale != 1.0 {
        return Err(format!(
            "bool tensors cannot be scaled (prescale_factor={prescale}, postscale_factor={postscale}); \
             pass 1.0 for both or convert the tensor to a numeric dtype"
        ));
    }
    Ok(())
}

/// `acc[i] = acc[i] op src[i]` for every element. `Average` reduces like `Sum` (the division
/// is a postscale). Both slices must have the same length, a multiple of the element size.
pub fn reduce_into(dtype: DType, op: ReduceOp, acc: &mut [u8], src: &[u8]) -> Result<()> {
    if acc.len() != src.len() || !acc.len().is_multiple_of(dtype.size()) {
        return Err(Error::Internal(format!(
            "reduce_into: {} and {} bytes of {dtype}",
            acc.len(),
            src.len()
        )));
    }
    match dtype {
        DType::U8 => with_typed::<u8>(acc, src, |a, s| reduce_num(op, a, s)),
        DType::I8 => with_typed::<i8>(acc, src, |a, s| reduce_num(op, a, s)),
        DType::I16 => with_typed::<i16>(acc, src, |a, s| reduce_num(op, a, s)),
        DType::I32 => with_typed::<i32>(acc, src, |a, s| reduce_num(op, a, s)),
        DType::I64 => with_typed::<i64>(acc, src, |a, s| reduce_num(op, a, s)),
        DType::F32 => with_typed::<f32>(acc, src, |a, s| reduce_num(op, a, s)),
        DType::F64 => with_typed::<f64>(acc, src, |a, s| reduce_num(op, a, s)),
        DType::F16 => with_typed::<f16>(acc, src, |a, s| reduce_f16(op, a, s)),
        DType::BF16 => with_typed::<u16>(acc, src, |a, s| reduce_bf16(op, a, s)),
        DType::Bool => {
            if op == ReduceOp::Average {
                return Err(Error::InvalidArgument(
                    "op Average is not supported for bool tensors; use Sum, Max, Min or Product"
                        .into(),
                ));
            }
            reduce_bool(op, acc, src);
        }
    }
    Ok(())
}

/// Multiplies every element of `buf` by `factor` (a no-op for 1.0). Bool tensors cannot be
/// scaled by anything but 1.0.
pub fn scale(dtype: DType, buf: &mut [u8], factor: f64) -> Result<()> {
    if factor == 1.0 {
        return Ok(());
    }
    if !buf.len().is_multiple_of(dtype.size()) {
        return Err(Error::Internal(format!(
            "scale: {} bytes of {dtype}",
            buf.len()
        )));
    }
    match dtype {
        DType::U8 => with_typed_one::<u8>(buf, |b| scale_num(b, factor)),
        DType::I8 => with_typed_one::<i8>(buf, |b| scale_num(b, factor)),
        DType::I16 => with_typed_one::<i16>(buf, |b| scale_num(b, factor)),
        DType::I32 => with_typed_one::<i32>(buf, |b| scale_num(b, factor)),
        DType::I64 => with_typed_one::<i64>(buf, |b| scale_num(b, factor)),
        DType::F32 => with_typed_one::<f32>(buf, |b| scale_num(b, factor)),
        DType::F64 => with_typed_one::<f64>(buf, |b| scale_num(b, factor)),
        DType::F16 => with_typed_one::<f16>(buf, |b| scale_f16(b, factor)),
        DType::BF16 => with_typed_one::<u16>(buf, |b| scale_bf16(b, factor)),
        DType::Bool => {
            return Err(Error::InvalidArgument(format!(
                "bool tensors cannot be scaled (factor {factor}); pass 1.0 or convert the tensor to a numeric dtype"
            )))
        }
    }
    Ok(())
}

/// bfloat16 bits to float32 (exact).
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// float32 to bfloat16 bits, rounding to nearest with ties to even (NaN stays NaN).
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    let is_nan = (bits & 0x7fff_ffff) > 0x7f80_0000;
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
    let quiet_nan = (bits >> 16) | 0x0040;
    (if is_nan { quiet_nan } else { rounded }) as u16
}

/// Element types with Horovod's arithmetic.
trait Num: Pod {
    fn sum(a: Self, b: Self) -> Self;
    fn prod(a: Self, b: Self) -> Self;
    fn min(a: Self, b: Self) -> Self;
    fn max(a: Self, b: Self) -> Self;
    fn scaled(a: Self, factor: f64) -> Self;
}

macro_rules! int_num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            #[inline(always)]
            fn sum(a: Self, b: Self) -> Self { a.wrapping_add(b) }
            #[inline(always)]
            fn prod(a: Self, b: Self) -> Self { a.wrapping_mul(b) }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self { if b < a { b } else { a } }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self { if b > a { b } else { a } }
            #[inline(always)]
            // Truncate toward zero into int64, then wrap into the type (what Horovod's C++
            // cast does on common hardware; Rust's direct cast would saturate instead).
            #[allow(clippy::cast_possible_wrap, trivial_numeric_casts, reason = "wrapping is the point")]
            fn scaled(a: Self, factor: f64) -> Self { (a as f64 * factor) as i64 as Self }
        }
    )*};
}
int_num!(u8, i8, i16, i32, i64);

macro_rules! float_num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            #[inline(always)]
            fn sum(a: Self, b: Self) -> Self { a + b }
            #[inline(always)]
            fn prod(a: Self, b: Self) -> Self { a * b }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self { if b < a { b } else { a } }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self { if b > a { b } else { a } }
            #[inline(always)]
            // Scale in float64 and round once into the type.
            #[allow(trivial_numeric_casts, clippy::unnecessary_cast, reason = "the f64 instance casts to itself")]
            fn scaled(a: Self, factor: f64) -> Self { (f64::from(a) * factor) as Self }
        }
    )*};
}
float_num!(f32, f64);

#[inline(always)]
fn zip_with<T: Copy>(acc: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    for (a, b) in acc.iter_mut().zip(src) {
        *a = f(*a, *b);
    }
}

fn reduce_num<T: Num>(op: ReduceOp, acc: &mut [T], src: &[T]) {
    match op {
        ReduceOp::Sum | ReduceOp::Average => zip_with(acc, src, T::sum),
        ReduceOp::Product => zip_with(acc, src, T::prod),
        ReduceOp::Min => zip_with(acc, src, T::min),
        ReduceOp::Max => zip_with(acc, src, T::max),
    }
}

fn scale_num<T: Num>(buf: &mut [T], factor: f64) {
    for x in buf {
        *x = T::scaled(*x, factor);
    }
}

fn reduce_bool(op: ReduceOp, acc: &mut [u8], src: &[u8]) {
    match op {
        ReduceOp::Sum | ReduceOp::Max | ReduceOp::Average => {
            zip_with(acc, src, |a, b| u8::from((a | b) != 0))
        }
        ReduceOp::Min | ReduceOp::Product => {
            zip_with(acc, src, |a, b| u8::from(a != 0) & u8::from(b != 0))
        }
    }
}

/// Elements of a half-precision block converted to float32 at a time.
const HALF_BLOCK: usize = 1024;

fn reduce_f16(op: ReduceOp, acc: &mut [f16], src: &[f16]) {
    let mut fa = [0f32; HALF_BLOCK];
    let mut fs = [0f32; HALF_BLOCK];
    for (a, s) in acc.chunks_mut(HALF_BLOCK).zip(src.chunks(HALF_BLOCK)) {
        let n = a.len();
        a.convert_to_f32_slice(&mut fa[..n]);
        s.convert_to_f32_slice(&mut fs[..n]);
        reduce_num(op, &mut fa[..n], &fs[..n]);
        a.convert_from_f32_slice(&fa[..n]);
    }
}

fn scale_f16(buf: &mut [f16], factor: f64) {
    let mut f = [0f32; HALF_BLOCK];
    for b in buf.chunks_mut(HALF_BLOCK) {
        let n = b.len();
        b.convert_to_f32_slice(&mut f[..n]);
        scale_num(&mut f[..n], factor);
        b.convert_from_f32_slice(&f[..n]);
    }
}

fn reduce_bf16(op: ReduceOp, acc: &mut [u16], src: &[u16]) {
    let mut fa = [0f32; HALF_BLOCK];
    let mut fs = [0f32; HALF_BLOCK];
    for (a, s) in acc.chunks_mut(HALF_BLOCK).zip(src.chunks(HALF_BLOCK)) {
        let n = a.len();
        for (f, x) in fa.iter_mut().zip(a.iter()) {
            *f = bf16_to_f32(*x);
        }
        for (f, x) in fs.iter_mut().zip(s) {
            *f = bf16_to_f32(*x);
        }
        reduce_num(op, &mut fa[..n], &fs[..n]);
        for (x, f) in a.iter_mut().zip(&fa) {
            *x = f32_to_bf16(*f);
        }
    }
}

fn scale_bf16(buf: &mut [u16], factor: f64) {
    for x in buf {
        *x = f32_to_bf16(f32::scaled(bf16_to_f32(*x), factor));
    }
}

/// Bytes of the aligned blocks misaligned buffers are staged through.
const STAGE_BYTES: usize = 4096;

fn is_aligned<T>(bytes: &[u8]) -> bool {
    bytes.as_ptr().align_offset(std::mem::align_of::<T>()) == 0
}

/// Runs `f` on `acc` and `src` viewed as `T` slices, staging through aligned blocks when either
/// is misaligned. Lengths are multiples of `size_of::<T>()` (checked by the callers).
fn with_typed<T: Pod>(acc: &mut [u8], src: &[u8], mut f: impl FnMut(&mut [T], &[T])) {
    if is_aligned::<T>(acc) && is_aligned::<T>(src) {
        f(bytemuck::cast_slice_mut(acc), bytemuck::cast_slice(src));
        return;
    }
    let mut stage_acc = [0u64; STAGE_BYTES / 8];
    let mut stage_src = [0u64; STAGE_BYTES / 8];
    for (a, s) in acc.chunks_mut(STAGE_BYTES).zip(src.chunks(STAGE_BYTES)) {
        let n = a.len();
        let ta = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut stage_acc)[..n];
        let ts = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut stage_src)[..n];
        ta.copy_from_slice(a);
        ts.copy_from_slice(s);
        f(bytemuck::cast_slice_mut(ta), bytemuck::cast_slice(ts));
        a.copy_from_slice(ta);
    }
}

/// Like [`with_typed`] for one buffer.
fn with_typed_one<T: Pod>(buf: &mut [u8], mut f: impl FnMut(&mut [T])) {
    if is_aligned::<T>(buf) {
        f(bytemuck::cast_slice_mut(buf));
        return;
    }
    let mut stage = [0u64; STAGE_BYTES / 8];
    for b in buf.chunks_mut(STAGE_BYTES) {
        let n = b.len();
        let t = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut stage)[..n];
        t.copy_from_slice(b);
        f(bytemuck::cast_slice_mut(t));
        b.copy_from_slice(t);
    }
}

/// Fills `buf` with the identity of `op` for `dtype` (what a rank without data contributes):
/// 0 for Sum and Average, 1 for Product, the largest value for Min, the smallest for Max.
pub fn fill_identity(dtype: DType, op: ReduceOp, buf: &mut [u8]) {
    fn pattern<T: Pod>(value: T) -> Vec<u8> {
        bytemuck::bytes_of(&value).to_vec()
    }
    let element: Vec<u8> = match (op, dtype) {
        (ReduceOp::Sum | ReduceOp::Average, _) => {
            buf.fill(0);
            return;
        }
        (ReduceOp::Product, DType::F16) => pattern(f16::ONE),
        (ReduceOp::Product, DType::BF16) => pattern(half::bf16::ONE),
        (ReduceOp::Product, DType::F32) => pattern(1f32),
        (ReduceOp::Product, DType::F64) => pattern(1f64),
        (ReduceOp::Product, _) => {
            let mut one = vec![0u8; dtype.size()];
            one[0] = 1;
            one
        }
        (ReduceOp::Min, DType::U8 | DType::Bool) => vec![u8::MAX],
        (ReduceOp::Min, DType::I8) => pattern(i8::MAX),
        (ReduceOp::Min, DType::I16) => pattern(i16::MAX),
        (ReduceOp::Min, DType::I32) => pattern(i32::MAX),
        (ReduceOp::Min, DType::I64) => pattern(i64::MAX),
        (ReduceOp::Min, DType::F16) => pattern(f16::INFINITY),
        (ReduceOp::Min, DType::BF16) => pattern(half::bf16::INFINITY),
        (ReduceOp::Min, DType::F32) => pattern(f32::INFINITY),
        (ReduceOp::Min, DType::F64) => pattern(f64::INFINITY),
        (ReduceOp::Max, DType::U8 | DType::Bool) => vec![0],
        (ReduceOp::Max, DType::I8) => pattern(i8::MIN),
        (ReduceOp::Max, DType::I16) => pattern(i16::MIN),
        (ReduceOp::Max, DType::I32) => pattern(i32::MIN),
        (ReduceOp::Max, DType::I64) => pattern(i64::MIN),
        (ReduceOp::Max, DType::F16) => pattern(f16::NEG_INFINITY),
        (ReduceOp::Max, DType::BF16) => pattern(half::bf16::NEG_INFINITY),
        (ReduceOp::Max, DType::F32) => pattern(f32::NEG_INFINITY),
        (ReduceOp::Max, DType::F64) => pattern(f64::NEG_INFINITY),
    };
    let bool_min = op == ReduceOp::Min && dtype == DType::Bool;
    for chunk in buf.chunks_exact_mut(element.len()) {
        chunk.copy_from_slice(&element);
        if bool_min {
            chunk[0] = 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of<T: Pod>(v: &[T]) -> Vec<u8> {
        bytemuck::cast_slice(v).to_vec()
    }

    /// Round to nearest even, the slow obvious way.
    fn reference_f32_to_bf16(x: f32) -> u16 {
        if x.is_nan() {
            return ((x.to_bits() >> 16) | 0x40) as u16;
        }
        let bits = x.to_bits();
        let upper = (bits >> 16) as u16;
        let lower = bits & 0xffff;
        match lower.cmp(&0x8000) {
            std::cmp::Ordering::Less => upper,
            std::cmp::Ordering::Greater => upper.wrapping_add(1),
            std::cmp::Ordering::Equal => upper.wrapping_add(upper & 1),
        }
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        for bits in (0..=u32::MAX).step_by(4099).chain([
            0x3f80_8000,
            0x3f81_8000,
            0x7f7f_ffff,
            0xff80_0000,
            0x7fc0_0001,
        ]) {
            let x = f32::from_bits(bits);
            assert_eq!(f32_to_bf16(x), reference_f32_to_bf16(x), "{bits:#x}");
        }
        for bits in 0..=u16::MAX {
            let x = bf16_to_f32(bits);
            if !x.is_nan() {
                assert_eq!(f32_to_bf16(x), bits);
            }
        }
    }

    #[test]
    fn integer_sums_wrap_and_scales_truncate() {
        let mut acc = bytes_of(&[250u8, 3]);
        reduce_into(DType::U8, ReduceOp::Sum, &mut acc, &bytes_of(&[10u8, 4])).unwrap();
        assert_eq!(acc, [4, 7]);
        let mut acc = bytes_of(&[7i32, -7]);
        scale(DType::I32, &mut acc, 0.5).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, i32>(&acc), &[3, -3]);
        let mut acc = bytes_of(&[i8::MAX]);
        reduce_into(DType::I8, ReduceOp::Product, &mut acc, &bytes_of(&[2i8])).unwrap();
        assert_eq!(acc, bytes_of(&[-2i8]));
    }

    #[test]
    fn every_dtype_and_op_matches_a_scalar_reference() {
        let a: Vec<f64> = (0..37).map(|i| f64::from((i * 7) % 11) - 5.0).collect();
        let b: Vec<f64> = (0..37).map(|i| f64::from((i * 5) % 9) - 4.0).collect();
        for dtype in DType::ALL {
            for op in ReduceOp::ALL {
                if dtype == DType::Bool && op == ReduceOp::Average {
                    continue;
                }
                let enc =
                    |v: &[f64]| -> Vec<u8> { v.iter().flat_map(|x| encode(dtype, *x)).collect() };
                let expected: Vec<u8> = a
                    .iter()
                    .zip(&b)
                    .flat_map(|(x, y)| {
                        let (x, y) = (
                            decode(dtype, &encode(dtype, *x)),
                            decode(dtype, &encode(dtype, *y)),
                        );
                        let r = match (dtype, op) {
                            (DType::Bool, ReduceOp::Sum | ReduceOp::Max) => {
                                f64::from(x != 0.0 || y != 0.0)
                            }
                            (DType::Bool, _) => f64::from(x != 0.0 && y != 0.0),
                            (_, ReduceOp::Sum | ReduceOp::Average) => x + y,
                            (_, ReduceOp::Product) => x * y,
                            (_, ReduceOp::Min) => x.min(y),
                            (_, ReduceOp::Max) => x.max(y),
                        };
                        encode(dtype, r)
                    })
                    .collect();
                // Aligned and misaligned (offset by one byte) buffers give the same answer.
                for offset in [0usize, 1] {
                    let mut acc = vec![0u8; offset];
                    acc.extend(enc(&a));
                    let mut src = vec![0u8; offset];
                    src.extend(enc(&b));
                    reduce_into(dtype, op, &mut acc[offset..], &src[offset..]).unwrap();
                    assert_eq!(
                        &acc[offset..],
                        &expected[..],
                        "{dtype} {op} offset {offset}"
                    );
                }
            }
        }
    }

    #[test]
    fn scaling_every_numeric_dtype() {
        for dtype in DType::ALL.into_iter().filter(|d| *d != DType::Bool) {
            let values = [3.0, -3.0, 5.0, 0.0];
            for offset in [0usize, 1] {
                let mut buf = vec![0u8; offset];
                buf.extend(values.iter().flat_map(|x| encode(dtype, *x)));
                scale(dtype, &mut buf[offset..], 0.5).unwrap();
                let got: Vec<f64> = buf[offset..]
                    .chunks(dtype.size())
                    .map(|c| decode(dtype, c))
                    .collect();
                let want: Vec<f64> = if dtype.is_float() {
                    vec![1.5, -1.5, 2.5, 0.0]
                } else if dtype == DType::U8 {
                    vec![1.0, 0.0, 2.0, 0.0] // -3 does not exist in uint8: encode gives 253 -> 126
                } else {
                    vec![1.0, -1.0, 2.0, 0.0]
                };
                if dtype == DType::U8 {
                    assert_eq!(got, vec![1.0, 126.0, 2.0, 0.0]);
                } else {
                    assert_eq!(got, want, "{dtype}");
                }
            }
        }
        assert!(scale(DType::Bool, &mut [1], 2.0).is_err());
        assert!(scale(DType::Bool, &mut [1], 1.0).is_ok());
        assert!(check_reduction(DType::Bool, ReduceOp::Average, 1.0, 1.0).is_err());
        assert!(check_reduction(DType::Bool, ReduceOp::Sum, 2.0, 1.0).is_err());
        assert!(check_reduction(DType::F32, ReduceOp::Average, 2.0, 1.0).is_ok());
    }

    #[test]
    fn length_mismatch_is_an_internal_error() {
        assert!(matches!(
            reduce_into(DType::F32, ReduceOp::Sum, &mut [0; 8], &[0; 4]),
            Err(Error::Internal(_))
        ));
        assert!(matches!(
            reduce_into(DType::F32, ReduceOp::Sum, &mut [0; 6], &[0; 6]),
            Err(Error::Internal(_))
        ));
    }

    fn encode(dtype: DType, x: f64) -> Vec<u8> {
        match dtype {
            DType::U8 => vec![(x as i64) as u8],
            DType::I8 => (x as i8).to_ne_bytes().to_vec(),
            DType::I16 => (x as i16).to_ne_bytes().to_vec(),
            DType::I32 => (x as i32).to_ne_bytes().to_vec(),
            DType::I64 => (x as i64).to_ne_bytes().to_vec(),
            DType::F16 => f16::from_f64(x).to_ne_bytes().to_vec(),
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
            DType::F16 => f16::from_ne_bytes([b[0], b[1]]).to_f64(),
            DType::BF16 => f64::from(bf16_to_f32(u16::from_ne_bytes([b[0], b[1]]))),
            DType::F32 => f64::from(f32::from_ne_bytes([b[0], b[1], b[2], b[3]])),
            DType::F64 => f64::from_ne_bytes(b.try_into().unwrap()),
            DType::Bool => f64::from(b[0]),
        }
    }
}
