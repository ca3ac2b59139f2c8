//! kolo's dtypes and reduction ops in NCCL's terms, and how an average is computed.
//!
//! NCCL has no int16 (those tensors take the host-staged path) and no bool: bools travel as
//! uint8, where Max is logical or and Min logical and. An average uses `ncclAvg` for float
//! dtypes when the loaded NCCL is 2.10 or newer; otherwise (and always for integers, so they
//! round exactly like the CPU path) it is a sum whose division by the number of ranks is folded
//! into the postscale the unpack kernel applies.
//!
//! ```
//! use kolo_collective::cuda::mapping::{reduction, NcclOp, NcclType};
//! use kolo_collective::{DType, ReduceOp};
//!
//! let r = reduction(DType::F32, ReduceOp::Average, 4, 21_903).unwrap();
//! assert_eq!((r.dtype, r.op, r.postscale), (NcclType::Float32, NcclOp::Avg, 1.0));
//! let r = reduction(DType::I32, ReduceOp::Average, 4, 21_903).unwrap();
//! assert_eq!((r.op, r.postscale), (NcclOp::Sum, 0.25));
//! ```

use crate::dtype::{DType, ReduceOp};

/// The first NCCL version (`ncclGetVersion` code) with `ncclAvg` and `ncclBfloat16`.
pub const NCCL_AVG_VERSION: i32 = 21_000;

/// `ncclDataType_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum NcclType {
    /// `ncclInt8`
    Int8 = 0,
    /// `ncclUint8`
    Uint8 = 1,
    /// `ncclInt32`
    Int32 = 2,
    /// `ncclInt64`
    Int64 = 4,
    /// `ncclFloat16`
    Float16 = 6,
    /// `ncclFloat32`
    Float32 = 7,
    /// `ncclFloat64`
    Float64 = 8,
    /// `ncclBfloat16` (NCCL 2.10+)
    Bfloat16 = 9,
}

/// `ncclRedOp_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum NcclOp {
    /// `ncclSum`
    Sum = 0,
    /// `ncclProd`
    Prod = 1,
    /// `ncclMax`
    Max = 2,
    /// `ncclMin`
    Min = 3,
    /// `ncclAvg` (NCCL 2.10+)
    Avg = 4,
}

/// NCCL's type for `dtype` with NCCL version `version`, or `None` when NCCL cannot carry it
/// (int16 always, bfloat16 before 2.10).
pub fn nccl_type(dtype: DType, version: i32) -> Option<NcclType> {
    Some(match dtype {
        DType::U8 | DType::Bool => NcclType::Uint8,
        DType::I8 => NcclType::Int8,
        DType::I32 => NcclType::Int32,
        DType::I64 => NcclType::Int64,
        DType::F16 => NcclType::Float16,
        DType::F32 => NcclType::Float32,
        DType::F64 => NcclType::Float64,
        DType::BF16 if version >= NCCL_AVG_VERSION => NcclType::Bfloat16,
        DType::BF16 | DType::I16 => return None,
    })
}

/// How one reduction runs through NCCL.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NcclReduction {
    /// The element type NCCL reduces.
    pub dtype: NcclType,
    /// The NCCL op.
    pub op: NcclOp,
    /// The extra factor to apply to the result (1/size for an average computed as a sum).
    pub postscale: f64,
}

/// The NCCL form of reducing `dtype` with `op` over `size` ranks, or `None` when the dtype
/// needs the host-staged path (see [`nccl_type`]).
pub fn reduction(dtype: DType, op: ReduceOp, size: usize, version: i32) -> Option<NcclReduction> {
    let nccl = nccl_type(dtype, version)?;
    let (op, postscale) = match (dtype, op) {
        (DType::Bool, ReduceOp::Sum | ReduceOp::Max) => (NcclOp::Max, 1.0),
        (DType::Bool, ReduceOp::Min | ReduceOp::Product) => (NcclOp::Min, 1.0),
        // Rejected before it gets here (check_reduction); sum like the CPU path would.
        (DType::Bool, ReduceOp::Average) => (NcclOp::Max, 1.0),
        (_, ReduceOp::Sum) => (NcclOp::Sum, 1.0),
        (_, ReduceOp::Min) => (NcclOp::Min, 1.0),
        (_, ReduceOp::Max) => (NcclOp::Max, 1.0),
        (_, ReduceOp::Product) => (NcclOp::Prod, 1.0),
        (d, ReduceOp::Average) if d.is_float() && version >= NCCL_AVG_VERSION => (NcclOp::Avg, 1.0),
        (_, ReduceOp::Average) => (NcclOp::Sum, 1.0 / size.max(1) as f64),
        // Not elementwise: NCCL has no such op; kolo.torch stages Adasum tensors on the host.
        (_, ReduceOp::Adasum) => return None,
    };
    Some(NcclReduction {
        dtype: nccl,
        op,
        postscale,
    })
}

/// `major.minor.patch` of an `ncclGetVersion` code (`21903` → `2.19.3`; codes before 2.9 use
/// `major*1000 + minor*100 + patch`).
pub fn version_string(code: i32) -> String {
    if code >= 10_000 {
        format!("{}.{}.{}", code / 10_000, (code % 10_000) / 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, (code % 1000) / 100, code % 100)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_maps_or_is_staged() {
        for dtype in DType::ALL {
            let t = nccl_type(dtype, 22_000);
            assert_eq!(t.is_none(), dtype == DType::I16, "{dtype}");
            if let Some(t) = t {
                let bytes = match t {
                    NcclType::Int8 | NcclType::Uint8 => 1,
                    NcclType::Float16 | NcclType::Bfloat16 => 2,
                    NcclType::Int32 | NcclType::Float32 => 4,
                    NcclType::Int64 | NcclType::Float64 => 8,
                };
                assert_eq!(bytes, dtype.size(), "{dtype} keeps its element size");
            }
        }
        assert_eq!(
            nccl_type(DType::BF16, 20_907),
            None,
            "bfloat16 needs NCCL 2.10"
        );
    }

    #[test]
    fn averages_use_avg_only_for_floats_on_new_nccl() {
        let r = |d, op, v| reduction(d, op, 8, v).unwrap();
        assert_eq!(r(DType::F16, ReduceOp::Average, 21_000).op, NcclOp::Avg);
        let old = r(DType::F16, ReduceOp::Average, 2_908);
        assert_eq!((old.op, old.postscale), (NcclOp::Sum, 0.125));
        let int = r(DType::I64, ReduceOp::Average, 22_000);
        assert_eq!((int.op, int.postscale), (NcclOp::Sum, 0.125));
        assert_eq!(r(DType::Bool, ReduceOp::Sum, 22_000).op, NcclOp::Max);
        assert_eq!(r(DType::Bool, ReduceOp::Product, 22_000).op, NcclOp::Min);
        assert_eq!(r(DType::F32, ReduceOp::Product, 22_000).op, NcclOp::Prod);
        assert_eq!(r(DType::F32, ReduceOp::Min, 22_000).op, NcclOp::Min);
        assert!(reduction(DType::I16, ReduceOp::Sum, 2, 22_000).is_none());
    }

    #[test]
    fn versions_read_like_nccl_prints_them() {
        assert_eq!(version_string(21_903), "2.19.3");
        assert_eq!(version_string(23_007), "2.30.7");
        assert_eq!(version_string(2_804), "2.8.4");
    }
}
