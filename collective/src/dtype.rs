//! Element types and reduction operations of collectives.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// The element type of a tensor crossing the runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DType {
    /// `uint8`
    U8 = 0,
    /// `int8`
    I8 = 1,
    /// `int16`
    I16 = 2,
    /// `int32`
    I32 = 3,
    /// `int64`
    I64 = 4,
    /// `float16` (IEEE half)
    F16 = 5,
    /// `bfloat16`
    BF16 = 6,
    /// `float32`
    F32 = 7,
    /// `float64`
    F64 = 8,
    /// `bool` (one byte, 0 or 1)
    Bool = 9,
}

impl DType {
    /// Every dtype, in wire-code order.
    pub const ALL: [DType; 10] = [
        DType::U8,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::Bool,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::U8 | DType::I8 | DType::Bool => 1,
            DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// The name used by torch and numpy (`float32`, `bfloat16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::U8 => "uint8",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::Bool => "bool",
        }
    }

    /// True for float16, bfloat16, float32 and float64.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// The dtype with wire code `code`.
    pub fn from_code(code: u8) -> Option<DType> {
        DType::ALL.get(usize::from(code)).copied()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let name = s.strip_prefix("torch.").unwrap_or(s);
        DType::ALL
            .into_iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "unsupported dtype {s:?}; kolo supports uint8, int8, int16, int32, int64, \
                 float16, bfloat16, float32, float64 and bool"
                ))
            })
    }
}

/// A reduction operation (Horovod's `Sum`, `Average`, `Min`, `Max`, `Product`, `Adasum`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReduceOp {
    /// Elementwise sum (logical or for bool).
    Sum = 0,
    /// Sum divided by the number of contributing ranks.
    Average = 1,
    /// Elementwise minimum (logical and for bool).
    Min = 2,
    /// Elementwise maximum (logical or for bool).
    Max = 3,
    /// Elementwise product (logical and for bool).
    Product = 4,
    /// Horovod's Adasum: ranks' float tensors combined pairwise,
    /// `(1 - a·b / 2|a|²) a + (1 - a·b / 2|b|²) b`, over a power-of-two number of ranks (not an
    /// elementwise op: see `collectives::adasum`).
    Adasum = 5,
}

impl ReduceOp {
    /// Every op, in wire-code order.
    pub const ALL: [ReduceOp; 6] = [
        ReduceOp::Sum,
        ReduceOp::Average,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Product,
        ReduceOp::Adasum,
    ];

    /// The elementwise ops (every op but Adasum), in wire-code order.
    pub const ELEMENTWISE: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Average,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Product,
    ];

    /// Horovod's name of the op.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "Sum",
            ReduceOp::Average => "Average",
            ReduceOp::Min => "Min",
            ReduceOp::Max => "Max",
            ReduceOp::Product => "Product",
            ReduceOp::Adasum => "Adasum",
        }
    }

    /// The op with wire code `code`.
    pub fn from_code(code: u8) -> Option<ReduceOp> {
        ReduceOp::ALL.get(usize::from(code)).copied()
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReduceOp {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        ReduceOp::ALL
            .into_iter()
            .find(|op| op.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "unsupported reduction op {s:?}; use Sum, Average, Min, Max, Product or Adasum"
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_codes_round_trip() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
            assert_eq!(DType::from_code(d as u8), Some(d));
        }
        assert_eq!("torch.bfloat16".parse::<DType>().unwrap(), DType::BF16);
        assert!("complex64".parse::<DType>().is_err());
        for op in ReduceOp::ALL {
            assert_eq!(op.name().parse::<ReduceOp>().unwrap(), op);
            assert_eq!(ReduceOp::from_code(op as u8), Some(op));
        }
    }
}
