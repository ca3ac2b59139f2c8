//! Elementwise reduction and scaling kernels on raw tensor bytes (native byte order).
//!
//! Semantics follow Horovod and torch: integer sums and products wrap; float16 and bfloat16
//! compute in float32 and round back (to nearest, ties to even); bool `Sum`/`Max` are logical
//! or and `Min`/`Product` logical and. Scaling is Horovod's `ScaleBufferCPUImpl`, bit for bit:
//! integers multiply in float64 and truncate toward zero (wrapping into the type like an
//! integer overflow), float64 multiplies in float64, and float32, float16 and bfloat16 multiply
//! by the factor rounded to float32, in float32 (float16/bfloat16 then round to nearest even).
//!
//! Speed: every kernel is one elementwise loop over typed slices (bfloat16 converts, reduces and
//! rounds back in the same loop) that the compiler vectorizes. On x86-64 the whole kernel tree
//! is compiled three times — baseline (SSE2), AVX2 and AVX-512 — and the widest one the CPU
//! supports is picked once at run time; float16 uses the F16C conversion instructions on the
//! AVX2 and AVX-512 tiers (the `half` crate's slice conversions on the baseline). Misaligned
//! buffers go through small aligned blocks. The kernels run on the calling thread: splitting a
//! large reduction over both cores of a 2-core machine did not help while the other rank of a
//! 2-rank job reduces at the same time (both ranks of a ring or shared-memory allreduce do), as
//! measured with `cargo bench -p kolo-collective --bench reduce`.

use std::sync::OnceLock;

use bytemuck::Pod;
use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};

/// The instruction-set tier the kernels run with, detected once per process. Tiers are
/// ordered narrowest first; a CPU that supports a tier supports every narrower one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// The target's baseline (SSE2 on x86-64), or any other architecture.
    Baseline,
    /// x86-64 AVX2 with F16C.
    Avx2,
    /// x86-64 AVX-512 (F, BW, DQ, VL) with AVX2 and F16C.
    Avx512,
}

impl Isa {
    /// The widest tier this CPU supports.
    pub fn detected() -> Isa {
        static DETECTED: OnceLock<Isa> = OnceLock::new();
        *DETECTED.get_or_init(|| Isa::available().last().copied().unwrap_or(Isa::Baseline))
    }

    /// Every tier this CPU supports, narrowest first (always starts with `Baseline`).
    pub fn available() -> Vec<Isa> {
        // Only x86_64 has wider tiers; elsewhere the vector never grows.
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut tiers = vec![Isa::Baseline];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c") {
                tiers.push(Isa::Avx2);
                if is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512dq")
                    && is_x86_feature_detected!("avx512vl")
                {
                    tiers.push(Isa::Avx512);
                }
            }
        }
        tiers
    }
}

/// Checks that `op` and the scale factors are supported for `dtype`: bool tensors support
/// `Sum`, `Min`, `Max` and `Product` without scaling; `Adasum` needs a float dtype. Returns the
/// reason otherwise.
pub fn check_reduction(
    dtype: DType,
    op: ReduceOp,
    prescale: f64,
    postscale: f64,
) -> Result<(), String> {
    if !prescale.is_finite() || !postscale.is_finite() {
        return Err(format!(
            "prescale_factor={prescale} and postscale_factor={postscale}: scale factors must be finite numbers"
        ));
    }
    if op == ReduceOp::Adasum && !dtype.is_float() {
        return Err(format!(
            "op Adasum is not supported for {dtype} tensors: Adasum combines float16, bfloat16, \
             float32 or float64 tensors; convert the tensor to a float dtype or use Sum"
        ));
    }
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
    reduce_into_with(Isa::detected(), dtype, op, acc, src)
}

/// [`reduce_into`] with the kernels of tier `isa`, which must be one of [`Isa::available`]
/// (for tests and benchmarks; a tier the CPU lacks runs the baseline kernels instead).
pub fn reduce_into_with(
    isa: Isa,
    dtype: DType,
    op: ReduceOp,
    acc: &mut [u8],
    src: &[u8],
) -> Result<()> {
    if acc.len() != src.len() || !acc.len().is_multiple_of(dtype.size()) {
        return Err(Error::Internal(format!(
            "reduce_into: {} and {} bytes of {dtype}",
            acc.len(),
            src.len()
        )));
    }
    if dtype == DType::Bool && op == ReduceOp::Average {
        return Err(Error::InvalidArgument(
            "op Average is not supported for bool tensors; use Sum, Max, Min or Product".into(),
        ));
    }
    if op == ReduceOp::Adasum {
        return Err(Error::Internal(
            "reduce_into: Adasum is not an elementwise reduction (collectives::adasum runs it)"
                .into(),
        ));
    }
    match checked(isa) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `checked` returns the AVX-512 tier only when the CPU supports its features.
        Isa::Avx512 => unsafe { x86::reduce_avx512(dtype, op, acc, src) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `checked` returns the AVX2 tier only when the CPU supports AVX2 and F16C.
        Isa::Avx2 => unsafe { x86::reduce_avx2(dtype, op, acc, src) },
        _ => reduce_kernels(Isa::Baseline, dtype, op, acc, src),
    }
    Ok(())
}

/// Multiplies every element of `buf` by `factor` (a no-op for 1.0). Bool tensors cannot be
/// scaled by anything but 1.0.
pub fn scale(dtype: DType, buf: &mut [u8], factor: f64) -> Result<()> {
    scale_with(Isa::detected(), dtype, buf, factor)
}

/// [`scale`] with the kernels of tier `isa` (see [`reduce_into_with`]).
pub fn scale_with(isa: Isa, dtype: DType, buf: &mut [u8], factor: f64) -> Result<()> {
    if factor == 1.0 {
        return Ok(());
    }
    if !buf.len().is_multiple_of(dtype.size()) {
        return Err(Error::Internal(format!(
            "scale: {} bytes of {dtype}",
            buf.len()
        )));
    }
    if dtype == DType::Bool {
        return Err(Error::InvalidArgument(format!(
            "bool tensors cannot be scaled (factor {factor}); pass 1.0 or convert the tensor to a numeric dtype"
        )));
    }
    match checked(isa) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `checked` returns the AVX-512 tier only when the CPU supports its features.
        Isa::Avx512 => unsafe { x86::scale_avx512(dtype, buf, factor) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `checked` returns the AVX2 tier only when the CPU supports AVX2 and F16C.
        Isa::Avx2 => unsafe { x86::scale_avx2(dtype, buf, factor) },
        _ => scale_kernels(Isa::Baseline, dtype, buf, factor),
    }
    Ok(())
}

/// `isa` if this CPU supports it, else the baseline (no detection or allocation per call).
fn checked(isa: Isa) -> Isa {
    if isa <= Isa::detected() {
        isa
    } else {
        Isa::Baseline
    }
}

/// The kernel tree, inlined into each tier's entry point so that it is compiled with that
/// tier's instructions (no closures on the way: a closure would be compiled once, for the
/// baseline, and called from every tier). Misaligned buffers are staged through aligned blocks.
#[inline(always)]
fn reduce_kernels(isa: Isa, dtype: DType, op: ReduceOp, acc: &mut [u8], src: &[u8]) {
    if is_aligned(dtype, acc) && is_aligned(dtype, src) {
        reduce_aligned(isa, dtype, op, acc, src);
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
        reduce_aligned(isa, dtype, op, ta, ts);
        a.copy_from_slice(ta);
    }
}

/// [`reduce_kernels`] on buffers aligned for `dtype`.
#[inline(always)]
fn reduce_aligned(isa: Isa, dtype: DType, op: ReduceOp, acc: &mut [u8], src: &[u8]) {
    use bytemuck::{cast_slice as cs, cast_slice_mut as csm};
    match dtype {
        DType::U8 => reduce_num::<u8>(op, csm(acc), cs(src)),
        DType::I8 => reduce_num::<i8>(op, csm(acc), cs(src)),
        DType::I16 => reduce_num::<i16>(op, csm(acc), cs(src)),
        DType::I32 => reduce_num::<i32>(op, csm(acc), cs(src)),
        DType::I64 => reduce_num::<i64>(op, csm(acc), cs(src)),
        DType::F32 => reduce_num::<f32>(op, csm(acc), cs(src)),
        DType::F64 => reduce_num::<f64>(op, csm(acc), cs(src)),
        DType::F16 => reduce_f16(isa, op, csm(acc), cs(src)),
        DType::BF16 => reduce_bf16(op, csm(acc), cs(src)),
        DType::Bool => reduce_bool(op, acc, src),
    }
}

/// Like [`reduce_kernels`] for scaling (`dtype` is not bool).
#[inline(always)]
fn scale_kernels(isa: Isa, dtype: DType, buf: &mut [u8], factor: f64) {
    if is_aligned(dtype, buf) {
        scale_aligned(isa, dtype, buf, factor);
        return;
    }
    let mut stage = [0u64; STAGE_BYTES / 8];
    for b in buf.chunks_mut(STAGE_BYTES) {
        let n = b.len();
        let t = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut stage)[..n];
        t.copy_from_slice(b);
        scale_aligned(isa, dtype, t, factor);
        b.copy_from_slice(t);
    }
}

/// [`scale_kernels`] on a buffer aligned for `dtype`.
#[inline(always)]
fn scale_aligned(isa: Isa, dtype: DType, buf: &mut [u8], factor: f64) {
    use bytemuck::cast_slice_mut as csm;
    match dtype {
        DType::U8 => scale_num::<u8>(csm(buf), factor),
        DType::I8 => scale_num::<i8>(csm(buf), factor),
        DType::I16 => scale_num::<i16>(csm(buf), factor),
        DType::I32 => scale_num::<i32>(csm(buf), factor),
        DType::I64 => scale_num::<i64>(csm(buf), factor),
        DType::F32 => scale_num::<f32>(csm(buf), factor),
        DType::F64 => scale_num::<f64>(csm(buf), factor),
        DType::F16 => scale_f16(isa, csm(buf), factor),
        DType::BF16 => scale_bf16(csm(buf), factor),
        DType::Bool => {}
    }
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
            // Horovod's rule: the factor in the type's own precision, one multiplication in it
            // (`(float)scale_factor * input[i]` for float32, `scale_factor * input[i]` for
            // float64).
            #[allow(trivial_numeric_casts, clippy::unnecessary_cast, reason = "the f64 instance casts to itself")]
            fn scaled(a: Self, factor: f64) -> Self { (factor as Self) * a }
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

// The elementwise kernels group `Adasum` with `Sum` only to stay exhaustive:
// `reduce_into_with` refuses Adasum before any kernel runs.
#[inline(always)]
fn reduce_num<T: Num>(op: ReduceOp, acc: &mut [T], src: &[T]) {
    match op {
        ReduceOp::Sum | ReduceOp::Average | ReduceOp::Adasum => zip_with(acc, src, T::sum),
        ReduceOp::Product => zip_with(acc, src, T::prod),
        ReduceOp::Min => zip_with(acc, src, T::min),
        ReduceOp::Max => zip_with(acc, src, T::max),
    }
}

#[inline(always)]
fn scale_num<T: Num>(buf: &mut [T], factor: f64) {
    for x in buf {
        *x = T::scaled(*x, factor);
    }
}

#[inline(always)]
fn bool_or(a: u8, b: u8) -> u8 {
    u8::from((a | b) != 0)
}

#[inline(always)]
fn bool_and(a: u8, b: u8) -> u8 {
    u8::from(a != 0) & u8::from(b != 0)
}

#[inline(always)]
fn reduce_bool(op: ReduceOp, acc: &mut [u8], src: &[u8]) {
    match op {
        ReduceOp::Sum | ReduceOp::Max | ReduceOp::Average | ReduceOp::Adasum => {
            zip_with(acc, src, bool_or)
        }
        ReduceOp::Min | ReduceOp::Product => zip_with(acc, src, bool_and),
    }
}

/// bfloat16 ops: widen (a shift), compute in float32, round back (integer ops), so that one
/// loop vectorizes.
macro_rules! bf16_ops {
    ($($name:ident => $f:expr),*) => {$(
        #[inline(always)]
        fn $name(a: u16, b: u16) -> u16 {
            f32_to_bf16(($f)(bf16_to_f32(a), bf16_to_f32(b)))
        }
    )*};
}
bf16_ops!(
    bf16_sum => <f32 as Num>::sum,
    bf16_prod => <f32 as Num>::prod,
    bf16_min => <f32 as Num>::min,
    bf16_max => <f32 as Num>::max
);

#[inline(always)]
fn reduce_bf16(op: ReduceOp, acc: &mut [u16], src: &[u16]) {
    match op {
        ReduceOp::Sum | ReduceOp::Average | ReduceOp::Adasum => zip_with(acc, src, bf16_sum),
        ReduceOp::Product => zip_with(acc, src, bf16_prod),
        ReduceOp::Min => zip_with(acc, src, bf16_min),
        ReduceOp::Max => zip_with(acc, src, bf16_max),
    }
}

#[inline(always)]
fn scale_bf16(buf: &mut [u16], factor: f64) {
    for x in buf {
        *x = f32_to_bf16(f32::scaled(bf16_to_f32(*x), factor));
    }
}

/// Elements of a float16 block converted to float32 at a time (baseline tier).
const HALF_BLOCK: usize = 1024;

#[inline(always)]
fn reduce_f16(isa: Isa, op: ReduceOp, acc: &mut [f16], src: &[f16]) {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Baseline {
        // SAFETY: the AVX2 and AVX-512 tiers are only chosen on CPUs with F16C (`Isa::available`).
        unsafe { x86::reduce_f16_f16c(op, acc, src) };
        return;
    }
    let _ = isa;
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

#[inline(always)]
fn scale_f16(isa: Isa, buf: &mut [f16], factor: f64) {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Baseline {
        // SAFETY: the AVX2 and AVX-512 tiers are only chosen on CPUs with F16C (`Isa::available`).
        unsafe { x86::scale_f16_f16c(buf, factor) };
        return;
    }
    let _ = isa;
    let mut f = [0f32; HALF_BLOCK];
    for b in buf.chunks_mut(HALF_BLOCK) {
        let n = b.len();
        b.convert_to_f32_slice(&mut f[..n]);
        scale_num(&mut f[..n], factor);
        b.convert_from_f32_slice(&f[..n]);
    }
}

/// The x86-64 tiers: entry points compiled with the tier's features, and the F16C kernels.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m256, _mm256_add_ps, _mm256_cvtph_ps, _mm256_cvtps_ph, _mm256_max_ps, _mm256_min_ps,
        _mm256_mul_ps, _mm_loadu_si128, _mm_storeu_si128, _MM_FROUND_TO_NEAREST_INT,
    };

    use half::f16;

    use super::{reduce_kernels, scale_kernels, DType, Isa, Num, ReduceOp};

    /// # Safety
    /// The CPU must support AVX-512 F, BW, DQ and VL, AVX2 and F16C.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,f16c")]
    pub(super) unsafe fn reduce_avx512(dtype: DType, op: ReduceOp, acc: &mut [u8], src: &[u8]) {
        reduce_kernels(Isa::Avx512, dtype, op, acc, src);
    }

    /// # Safety
    /// The CPU must support AVX2 and F16C.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn reduce_avx2(dtype: DType, op: ReduceOp, acc: &mut [u8], src: &[u8]) {
        reduce_kernels(Isa::Avx2, dtype, op, acc, src);
    }

    /// # Safety
    /// As [`reduce_avx512`].
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,f16c")]
    pub(super) unsafe fn scale_avx512(dtype: DType, buf: &mut [u8], factor: f64) {
        scale_kernels(Isa::Avx512, dtype, buf, factor);
    }

    /// # Safety
    /// As [`reduce_avx2`].
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn scale_avx2(dtype: DType, buf: &mut [u8], factor: f64) {
        scale_kernels(Isa::Avx2, dtype, buf, factor);
    }

    /// Loads 8 float16 values as float32.
    ///
    /// # Safety
    /// `p` points to 8 readable float16 values (any alignment); the CPU has F16C.
    #[inline]
    #[target_feature(enable = "avx,f16c")]
    unsafe fn load8(p: *const f16) -> __m256 {
        // SAFETY: the caller guarantees 16 readable bytes; the load is unaligned.
        _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p.cast()) })
    }

    /// Rounds 8 float32 values to float16 (nearest, ties to even) and stores them.
    ///
    /// # Safety
    /// `p` points to 8 writable float16 values (any alignment); the CPU has F16C.
    #[inline]
    #[target_feature(enable = "avx,f16c")]
    unsafe fn store8(p: *mut f16, v: __m256) {
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
        // SAFETY: the caller guarantees 16 writable bytes; the store is unaligned.
        unsafe { _mm_storeu_si128(p.cast(), h) };
    }

    /// `acc = f16(f(f32(acc), f32(src)))` 8 lanes at a time, the tail one by one.
    macro_rules! f16c_zip {
        ($acc:ident, $src:ident, |$a:ident, $s:ident| $vector:expr, $scalar:expr) => {{
            let body = $acc.len() - $acc.len() % 8;
            let (head, tail) = $acc.split_at_mut(body);
            for (a, s) in head.chunks_exact_mut(8).zip($src.chunks_exact(8)) {
                // SAFETY: both chunks hold exactly 8 float16 values; F16C is enabled here.
                unsafe {
                    let ($a, $s) = (load8(a.as_ptr()), load8(s.as_ptr()));
                    store8(a.as_mut_ptr(), $vector);
                }
            }
            for (a, s) in tail.iter_mut().zip(&$src[body..]) {
                let ($a, $s) = (a.to_f32(), s.to_f32());
                *a = f16::from_f32($scalar);
            }
        }};
    }

    /// float16 reduction through F16C: convert 8 lanes, reduce in float32, round back.
    /// `Min`/`Max` keep `acc` unless `src` compares smaller/larger, as the scalar kernels do
    /// (`_mm256_min_ps(s, a)` is `s < a ? s : a`).
    ///
    /// # Safety
    /// The CPU must support AVX and F16C; the slices have the same length.
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn reduce_f16_f16c(op: ReduceOp, acc: &mut [f16], src: &[f16]) {
        match op {
            ReduceOp::Sum | ReduceOp::Average | ReduceOp::Adasum => {
                f16c_zip!(acc, src, |a, s| _mm256_add_ps(a, s), a + s)
            }
            ReduceOp::Product => f16c_zip!(acc, src, |a, s| _mm256_mul_ps(a, s), a * s),
            ReduceOp::Min => {
                f16c_zip!(
                    acc,
                    src,
                    |a, s| _mm256_min_ps(s, a),
                    <f32 as Num>::min(a, s)
                )
            }
            ReduceOp::Max => {
                f16c_zip!(
                    acc,
                    src,
                    |a, s| _mm256_max_ps(s, a),
                    <f32 as Num>::max(a, s)
                )
            }
        }
    }

    /// float16 scaling through F16C: widen to float32, scale in float64 rounding to float32
    /// (as the baseline kernel), round to float16.
    ///
    /// # Safety
    /// The CPU must support AVX and F16C.
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn scale_f16_f16c(buf: &mut [f16], factor: f64) {
        let mut lanes = [0f32; 8];
        let body = buf.len() - buf.len() % 8;
        let (head, tail) = buf.split_at_mut(body);
        for chunk in head.chunks_exact_mut(8) {
            // SAFETY: the chunk holds exactly 8 float16 values; F16C is enabled here.
            let v = unsafe { load8(chunk.as_ptr()) };
            // SAFETY: `lanes` has room for 8 float32 values.
            unsafe { std::arch::x86_64::_mm256_storeu_ps(lanes.as_mut_ptr(), v) };
            for x in &mut lanes {
                *x = f32::scaled(*x, factor);
            }
            // SAFETY: as above; `lanes` holds 8 float32 values.
            unsafe {
                store8(
                    chunk.as_mut_ptr(),
                    std::arch::x86_64::_mm256_loadu_ps(lanes.as_ptr()),
                )
            };
        }
        for x in tail {
            *x = f16::from_f32(f32::scaled(x.to_f32(), factor));
        }
    }
}

/// Bytes of the aligned blocks misaligned buffers are staged through.
const STAGE_BYTES: usize = 4096;

/// True when `bytes` starts at an address aligned for `dtype`'s elements.
fn is_aligned(dtype: DType, bytes: &[u8]) -> bool {
    let align = match dtype {
        DType::F16 => std::mem::align_of::<f16>(),
        _ => dtype.size(),
    };
    (bytes.as_ptr() as usize).is_multiple_of(align)
}

/// Fills `buf` with the identity of `op` for `dtype` (what a rank without data contributes):
/// 0 for Sum, Average and Adasum, 1 for Product, the largest value for Min, the smallest for Max.
pub fn fill_identity(dtype: DType, op: ReduceOp, buf: &mut [u8]) {
    fn pattern<T: Pod>(value: T) -> Vec<u8> {
        bytemuck::bytes_of(&value).to_vec()
    }
    let element: Vec<u8> = match (op, dtype) {
        (ReduceOp::Sum | ReduceOp::Average | ReduceOp::Adasum, _) => {
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
            for op in ReduceOp::ELEMENTWISE {
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
                            (_, ReduceOp::Adasum) => unreachable!("elementwise ops only"),
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

    /// The scalar reference of one element: `a op b` (or `a * factor` when `factor` is set),
    /// written independently of the kernels (plain per-type arithmetic).
    fn reference(dtype: DType, op: ReduceOp, a: &[u8], b: &[u8], factor: Option<f64>) -> Vec<u8> {
        macro_rules! int {
            ($t:ty) => {{
                let x = <$t>::from_ne_bytes(a.try_into().unwrap());
                let y = <$t>::from_ne_bytes(b.try_into().unwrap());
                let r = match (factor, op) {
                    (Some(f), _) => (x as f64 * f) as i64 as $t,
                    (None, ReduceOp::Sum | ReduceOp::Average) => x.wrapping_add(y),
                    (None, ReduceOp::Product) => x.wrapping_mul(y),
                    (None, ReduceOp::Min) => x.min(y),
                    (None, ReduceOp::Max) => x.max(y),
                    (None, ReduceOp::Adasum) => unreachable!("elementwise ops only"),
                };
                r.to_ne_bytes().to_vec()
            }};
        }
        // Float ops in float32 (float16/bfloat16 widened exactly); `Min`/`Max` keep `x` unless
        // `y` compares smaller/larger.
        let float32 = |x: f32, y: f32| -> f32 {
            match (factor, op) {
                (Some(f), _) => (f as f32) * x,
                (None, ReduceOp::Sum | ReduceOp::Average) => x + y,
                (None, ReduceOp::Product) => x * y,
                (None, ReduceOp::Min) => {
                    if y < x {
                        y
                    } else {
                        x
                    }
                }
                (None, ReduceOp::Max) => {
                    if y > x {
                        y
                    } else {
                        x
                    }
                }
                (None, ReduceOp::Adasum) => unreachable!("elementwise ops only"),
            }
        };
        match dtype {
            DType::U8 => int!(u8),
            DType::I8 => int!(i8),
            DType::I16 => int!(i16),
            DType::I32 => int!(i32),
            DType::I64 => int!(i64),
            DType::F32 => {
                let x = f32::from_ne_bytes(a.try_into().unwrap());
                let y = f32::from_ne_bytes(b.try_into().unwrap());
                float32(x, y).to_ne_bytes().to_vec()
            }
            DType::F64 => {
                let x = f64::from_ne_bytes(a.try_into().unwrap());
                let y = f64::from_ne_bytes(b.try_into().unwrap());
                let r = match (factor, op) {
                    (Some(f), _) => x * f,
                    (None, ReduceOp::Sum | ReduceOp::Average) => x + y,
                    (None, ReduceOp::Product) => x * y,
                    (None, ReduceOp::Min) => {
                        if y < x {
                            y
                        } else {
                            x
                        }
                    }
                    (None, ReduceOp::Max) => {
                        if y > x {
                            y
                        } else {
                            x
                        }
                    }
                    (None, ReduceOp::Adasum) => unreachable!("elementwise ops only"),
                };
                r.to_ne_bytes().to_vec()
            }
            DType::F16 => {
                let x = f16::from_ne_bytes(a.try_into().unwrap()).to_f32();
                let y = f16::from_ne_bytes(b.try_into().unwrap()).to_f32();
                f16::from_f32(float32(x, y)).to_ne_bytes().to_vec()
            }
            DType::BF16 => {
                let x = f32::from_bits(u32::from(u16::from_ne_bytes(a.try_into().unwrap())) << 16);
                let y = f32::from_bits(u32::from(u16::from_ne_bytes(b.try_into().unwrap())) << 16);
                reference_f32_to_bf16(float32(x, y)).to_ne_bytes().to_vec()
            }
            DType::Bool => {
                let (x, y) = (a[0] != 0, b[0] != 0);
                vec![u8::from(match op {
                    ReduceOp::Sum | ReduceOp::Max | ReduceOp::Average => x || y,
                    ReduceOp::Min | ReduceOp::Product => x && y,
                    ReduceOp::Adasum => unreachable!("elementwise ops only"),
                })]
            }
        }
    }

    /// Equal elements, where two NaNs of a float type count as equal (which NaN payload an
    /// operation propagates depends on operand order, which the vectorizer may swap).
    fn same_element(dtype: DType, got: &[u8], want: &[u8]) -> bool {
        let nan = |b: &[u8]| match dtype {
            DType::F16 => f16::from_ne_bytes([b[0], b[1]]).is_nan(),
            DType::BF16 => bf16_to_f32(u16::from_ne_bytes([b[0], b[1]])).is_nan(),
            DType::F32 => f32::from_ne_bytes(b.try_into().unwrap()).is_nan(),
            DType::F64 => f64::from_ne_bytes(b.try_into().unwrap()).is_nan(),
            _ => false,
        };
        got == want || (nan(got) && nan(want))
    }

    /// Random bytes as `dtype` elements; bool elements are 0 or 1 half the time.
    fn element_bytes(dtype: DType, raw: &[u8]) -> Vec<u8> {
        if dtype == DType::Bool {
            raw.iter()
                .map(|b| if b & 0x80 != 0 { b & 1 } else { *b })
                .collect()
        } else {
            raw.to_vec()
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Every tier, dtype and op against the scalar reference, on random bits (NaN,
        /// infinities, subnormals, wrapping integers), odd lengths and every misalignment.
        #[test]
        fn every_tier_matches_the_scalar_reference(
            dtype_index in 0usize..10,
            op_index in 0usize..5,
            raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..1200),
            acc_offset in 0usize..8,
            src_offset in 0usize..8,
            small in proptest::prelude::any::<bool>(),
        ) {
            let (dtype, op) = (DType::ALL[dtype_index], ReduceOp::ELEMENTWISE[op_index]);
            proptest::prop_assume!(!(dtype == DType::Bool && op == ReduceOp::Average));
            // Small values too, so that sums and products are not all overflow and NaN.
            let raw: Vec<u8> = if small && dtype.is_float() {
                raw.chunks(2 * dtype.size())
                    .flat_map(|c| encode(dtype, f64::from(c[0] as i8) / 4.0))
                    .collect()
            } else {
                element_bytes(dtype, &raw)
            };
            let n = raw.len() / 2 / dtype.size();
            let a = &raw[..n * dtype.size()];
            let b = &raw[n * dtype.size()..2 * n * dtype.size()];
            let want: Vec<u8> = a
                .chunks(dtype.size())
                .zip(b.chunks(dtype.size()))
                .flat_map(|(x, y)| reference(dtype, op, x, y, None))
                .collect();
            for isa in Isa::available() {
                let mut acc = vec![0u8; acc_offset];
                acc.extend_from_slice(a);
                let mut src = vec![0u8; src_offset];
                src.extend_from_slice(b);
                reduce_into_with(isa, dtype, op, &mut acc[acc_offset..], &src[src_offset..])
                    .unwrap();
                for (i, (got, want)) in acc[acc_offset..]
                    .chunks(dtype.size())
                    .zip(want.chunks(dtype.size()))
                    .enumerate()
                {
                    proptest::prop_assert!(
                        same_element(dtype, got, want),
                        "{isa:?} {dtype} {op} n={n} element {i}: {got:?} != {want:?}"
                    );
                }
            }
        }

        /// Scaling: every tier and numeric dtype against the scalar reference.
        #[test]
        fn every_tier_scales_like_the_scalar_reference(
            dtype_index in 0usize..9,
            raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
            offset in 0usize..8,
            factor in proptest::prop_oneof![
                proptest::prelude::Just(0.5), proptest::prelude::Just(1.0 / 3.0),
                proptest::prelude::Just(-2.5), -1e3f64..1e3
            ],
        ) {
            let dtype = DType::ALL[dtype_index];
            let n = raw.len() / dtype.size();
            let a = &raw[..n * dtype.size()];
            let want: Vec<u8> = a
                .chunks(dtype.size())
                .flat_map(|x| reference(dtype, ReduceOp::Sum, x, x, Some(factor)))
                .collect();
            for isa in Isa::available() {
                let mut buf = vec![0u8; offset];
                buf.extend_from_slice(a);
                scale_with(isa, dtype, &mut buf[offset..], factor).unwrap();
                for (i, (got, want)) in buf[offset..]
                    .chunks(dtype.size())
                    .zip(want.chunks(dtype.size()))
                    .enumerate()
                {
                    proptest::prop_assert!(
                        same_element(dtype, got, want),
                        "{isa:?} {dtype} x{factor} n={n} element {i}: {got:?} != {want:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn large_buffers_match_across_tiers() {
        // Long enough for every vector body and tail; each tier must agree with the baseline.
        for dtype in DType::ALL {
            for op in ReduceOp::ELEMENTWISE {
                if dtype == DType::Bool && op == ReduceOp::Average {
                    continue;
                }
                let n = 100_003;
                let a: Vec<u8> = (0..n)
                    .flat_map(|i| encode(dtype, f64::from((i * 7) % 13) - 6.0))
                    .collect();
                let b: Vec<u8> = (0..n)
                    .flat_map(|i| encode(dtype, f64::from((i * 5) % 11) - 5.0))
                    .collect();
                let mut want = a.clone();
                reduce_into_with(Isa::Baseline, dtype, op, &mut want, &b).unwrap();
                for isa in Isa::available() {
                    let mut got = a.clone();
                    reduce_into_with(isa, dtype, op, &mut got, &b).unwrap();
                    assert!(got == want, "{isa:?} {dtype} {op}");
                }
            }
        }
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
