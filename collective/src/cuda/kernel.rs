//! The batched pack/unpack kernel's CUDA C source, compiled at run time by NVRTC for the
//! device in use (so no PTX version has to match the driver).
//!
//! `kolo_batched_copy(segments, count, dtype, factor)`: thread blocks take segments
//! ([`super::plan::Segment`]) in turn; with `factor == 1` a segment is copied with 16-byte
//! vectors when source, destination and length allow it (else 4-byte words, else bytes);
//! otherwise every element is scaled on the way, exactly like the CPU path
//! (`reduce::scale`, Horovod's CPU rule): float64 in float64; float32, float16 and bfloat16
//! multiplied by the factor rounded to float32, in float32 (then rounded to the 16-bit type);
//! integers multiplied in float64, truncated toward zero into int64 and wrapped. `dtype` is
//! kolo's dtype code ([`crate::DType`]). Source and destination may be the same (in-place
//! scaling); other overlaps are not allowed.
//!
//! ```
//! use kolo_collective::cuda::kernel::{KERNEL_NAME, SOURCE};
//! assert!(SOURCE.contains(KERNEL_NAME));
//! ```

/// The kernel's entry point.
pub const KERNEL_NAME: &str = "kolo_batched_copy";

/// Threads per block.
pub const BLOCK_THREADS: u32 = 512;

/// The most thread blocks one launch uses (blocks loop over the segments).
pub const MAX_BLOCKS: u32 = 8192;

/// The CUDA C source (no headers: NVRTC needs none).
pub const SOURCE: &str = r#"
typedef unsigned long long kolo_u64;
typedef long long kolo_i64;
typedef unsigned int kolo_u32;
typedef unsigned short kolo_u16;

struct KoloSegment { kolo_u64 src; kolo_u64 dst; kolo_u64 bytes; };
struct alignas(16) KoloVec { kolo_u32 x, y, z, w; };

__device__ __forceinline__ float kolo_h2f(kolo_u16 h) {
    float f;
    asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ kolo_u16 kolo_f2h(float f) {
    kolo_u16 h;
    asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float kolo_bf2f(kolo_u16 b) {
    return __uint_as_float(((kolo_u32)b) << 16);
}

/* Round to nearest even; NaNs stay (quiet) NaNs: what the CPU path's `half` crate does. */
__device__ __forceinline__ kolo_u16 kolo_f2bf(float f) {
    kolo_u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (kolo_u16)((u >> 16) | 0x40u);
    }
    return (kolo_u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

template <typename T>
__device__ __forceinline__ void kolo_scale_int(const char* src, char* dst, kolo_u64 n, double factor) {
    const T* s = (const T*)src;
    T* d = (T*)dst;
    for (kolo_u64 i = threadIdx.x; i < n; i += blockDim.x) {
        d[i] = (T)(kolo_i64)((double)s[i] * factor);
    }
}

__device__ void kolo_scale(const char* src, char* dst, kolo_u64 bytes, int dtype, double factor) {
    switch (dtype) {
    case 0: kolo_scale_int<unsigned char>(src, dst, bytes, factor); break;
    case 1: kolo_scale_int<signed char>(src, dst, bytes, factor); break;
    case 2: kolo_scale_int<short>(src, dst, bytes / 2, factor); break;
    case 3: kolo_scale_int<int>(src, dst, bytes / 4, factor); break;
    case 4: kolo_scale_int<kolo_i64>(src, dst, bytes / 8, factor); break;
    case 5: {
        const kolo_u16* s = (const kolo_u16*)src;
        kolo_u16* d = (kolo_u16*)dst;
        for (kolo_u64 i = threadIdx.x; i < bytes / 2; i += blockDim.x) {
            d[i] = kolo_f2h(__fmul_rn((float)factor, kolo_h2f(s[i])));
        }
        break;
    }
    case 6: {
        const kolo_u16* s = (const kolo_u16*)src;
        kolo_u16* d = (kolo_u16*)dst;
        for (kolo_u64 i = threadIdx.x; i < bytes / 2; i += blockDim.x) {
            d[i] = kolo_f2bf(__fmul_rn((float)factor, kolo_bf2f(s[i])));
        }
        break;
    }
    case 7: {
        const float* s = (const float*)src;
        float* d = (float*)dst;
        for (kolo_u64 i = threadIdx.x; i < bytes / 4; i += blockDim.x) {
            d[i] = __fmul_rn((float)factor, s[i]);
        }
        break;
    }
    case 8: {
        const double* s = (const double*)src;
        double* d = (double*)dst;
        for (kolo_u64 i = threadIdx.x; i < bytes / 8; i += blockDim.x) {
            d[i] = s[i] * factor;
        }
        break;
    }
    default: break;
    }
}

__device__ void kolo_copy(const char* src, char* dst, kolo_u64 bytes) {
    if ((((kolo_u64)src | (kolo_u64)dst | bytes) & 15ull) == 0ull) {
        const KoloVec* s = (const KoloVec*)src;
        KoloVec* d = (KoloVec*)dst;
        for (kolo_u64 i = threadIdx.x; i < bytes / 16; i += blockDim.x) {
            d[i] = s[i];
        }
    } else if ((((kolo_u64)src | (kolo_u64)dst | bytes) & 3ull) == 0ull) {
        const kolo_u32* s = (const kolo_u32*)src;
        kolo_u32* d = (kolo_u32*)dst;
        for (kolo_u64 i = threadIdx.x; i < bytes / 4; i += blockDim.x) {
            d[i] = s[i];
        }
    } else {
        for (kolo_u64 i = threadIdx.x; i < bytes; i += blockDim.x) {
            dst[i] = src[i];
        }
    }
}

extern "C" __global__ void kolo_batched_copy(const KoloSegment* __restrict__ segments, int count,
                                             int dtype, double factor) {
    for (int s = blockIdx.x; s < count; s += gridDim.x) {
        const char* src = (const char*)segments[s].src;
        char* dst = (char*)segments[s].dst;
        kolo_u64 bytes = segments[s].bytes;
        if (factor == 1.0) {
            kolo_copy(src, dst, bytes);
        } else {
            kolo_scale(src, dst, bytes, dtype, factor);
        }
    }
}
"#;

/// NVRTC options for a device of compute capability `major.minor`: a CUBIN for exactly that
/// architecture.
pub fn compile_options(major: i32, minor: i32) -> Vec<String> {
    vec![
        format!("--gpu-architecture=sm_{major}{minor}"),
        "--std=c++14".to_owned(),
        "-default-device".to_owned(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_name_the_device_architecture() {
        assert_eq!(compile_options(9, 0)[0], "--gpu-architecture=sm_90");
        // Segment segments start on 16-byte boundaries, so vector copies stay aligned.
        assert_eq!(super::super::plan::SEGMENT_BYTES % 16, 0);
    }
}
