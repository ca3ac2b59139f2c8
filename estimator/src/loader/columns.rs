//! Which Arrow columns the loader can turn into tensors, and how: element dtype and shape.

use arrow::datatypes::{DataType, Field, Schema};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Element type of a loaded tensor (numpy's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// `bool` (one byte per value).
    Bool,
    /// `int8`.
    Int8,
    /// `int16`.
    Int16,
    /// `int32`.
    Int32,
    /// `int64`.
    Int64,
    /// `uint8`.
    Uint8,
    /// `uint16`.
    Uint16,
    /// `uint32`.
    Uint32,
    /// `uint64`.
    Uint64,
    /// `float16`.
    Float16,
    /// `float32`.
    Float32,
    /// `float64`.
    Float64,
}

const ALL: [DType; 12] = [
    DType::Bool,
    DType::Int8,
    DType::Int16,
    DType::Int32,
    DType::Int64,
    DType::Uint8,
    DType::Uint16,
    DType::Uint32,
    DType::Uint64,
    DType::Float16,
    DType::Float32,
    DType::Float64,
];

impl DType {
    /// The dtype of an Arrow element type, if it is numeric or boolean.
    pub fn of(data_type: &DataType) -> Option<DType> {
        Some(match data_type {
            DataType::Boolean => DType::Bool,
            DataType::Int8 => DType::Int8,
            DataType::Int16 => DType::Int16,
            DataType::Int32 => DType::Int32,
            DataType::Int64 => DType::Int64,
            DataType::UInt8 => DType::Uint8,
            DataType::UInt16 => DType::Uint16,
            DataType::UInt32 => DType::Uint32,
            DataType::UInt64 => DType::Uint64,
            DataType::Float16 => DType::Float16,
            DataType::Float32 => DType::Float32,
            DataType::Float64 => DType::Float64,
            _ => return None,
        })
    }

    /// The dtype named `name` (numpy's name, as [`DType::name`] gives it).
    pub fn from_name(name: &str) -> Option<DType> {
        ALL.into_iter().find(|d| d.name() == name)
    }

    /// Bytes per element.
    pub fn width(self) -> usize {
        match self {
            DType::Bool | DType::Int8 | DType::Uint8 => 1,
            DType::Int16 | DType::Uint16 | DType::Float16 => 2,
            DType::Int32 | DType::Uint32 | DType::Float32 => 4,
            DType::Int64 | DType::Uint64 | DType::Float64 => 8,
        }
    }

    /// numpy's name (`float32`).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::Int8 => "int8",
            DType::Int16 => "int16",
            DType::Int32 => "int32",
            DType::Int64 => "int64",
            DType::Uint8 => "uint8",
            DType::Uint16 => "uint16",
            DType::Uint32 => "uint32",
            DType::Uint64 => "uint64",
            DType::Float16 => "float16",
            DType::Float32 => "float32",
            DType::Float64 => "float64",
        }
    }

    /// The `__array_interface__` type string (`<f4`, `|b1`).
    pub fn typestr(self) -> &'static str {
        match self {
            DType::Bool => "|b1",
            DType::Int8 => "|i1",
            DType::Int16 => "<i2",
            DType::Int32 => "<i4",
            DType::Int64 => "<i8",
            DType::Uint8 => "|u1",
            DType::Uint16 => "<u2",
            DType::Uint32 => "<u4",
            DType::Uint64 => "<u8",
            DType::Float16 => "<f2",
            DType::Float32 => "<f4",
            DType::Float64 => "<f8",
        }
    }
}

/// How a column becomes a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ColumnShape {
    /// One value per row: a `[batch]` tensor.
    Scalar,
    /// A fixed-size list (`FixedSizeList`): `[batch, len]`.
    Fixed(u64),
    /// A variable-size list (`List`/`LargeList`) whose rows must all have one length, found by
    /// reading the data.
    List,
}

/// A column as the loader reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnKind {
    /// Element dtype.
    pub dtype: DType,
    /// Scalar, fixed list or list.
    pub shape: ColumnShape,
}

/// The role [`classify`] names in its errors: a column selected for loading.
pub const SELECTED: &str = "selected";

/// Classifies `field` as a column selected for loading; an error names the column and says
/// what to do with it.
pub fn classify(field: &Field) -> Result<ColumnKind> {
    classify_as(field, SELECTED)
}

/// Classifies `field`, asked for in `role` (`selected`, `feature`, `label`, ...): the one set
/// of rules, shared by the loader and the preparation, for which Arrow columns can become
/// tensors. The error ([`Error::UnsupportedColumn`]) names the role, the column and its type,
/// and says what to do with it.
pub fn classify_as(field: &Field, role: &'static str) -> Result<ColumnKind> {
    tensor_kind(field.data_type()).map_err(|hint| Error::UnsupportedColumn {
        role,
        column: field.name().clone(),
        data_type: field.data_type().to_string(),
        hint: hint.to_string(),
    })
}

/// How a column of `data_type` becomes a tensor, or what to do with it instead.
fn tensor_kind(data_type: &DataType) -> std::result::Result<ColumnKind, &'static str> {
    let element = |item: &Field| {
        DType::of(item.data_type()).ok_or(
            "array columns must hold numbers or booleans (nested lists, strings and structs \
             are not supported); flatten or encode them first",
        )
    };
    match data_type {
        DataType::List(item) | DataType::LargeList(item) => Ok(ColumnKind {
            dtype: element(item)?,
            shape: ColumnShape::List,
        }),
        DataType::FixedSizeList(item, len) => Ok(ColumnKind {
            dtype: element(item)?,
            shape: ColumnShape::Fixed(u64::try_from(*len).unwrap_or(0)),
        }),
        DataType::Struct(children) if is_spark_vector(children) => Err(
            "it is a Spark ML vector; convert it to an array column first (e.g. \
             pyspark.ml.functions.vector_to_array before writing the data)",
        ),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            Err("strings must be encoded as numbers first (e.g. StringIndexer or a vocabulary)")
        }
        data_type => match DType::of(data_type) {
            Some(dtype) => Ok(ColumnKind {
                dtype,
                shape: ColumnShape::Scalar,
            }),
            None => Err(
                "only numeric and boolean columns, and fixed-length arrays of them, can \
                 become tensors; cast or encode it first",
            ),
        },
    }
}

/// Spark ML's `VectorUDT` as written to Parquet: `struct<type, size, indices, values>`.
fn is_spark_vector(children: &arrow::datatypes::Fields) -> bool {
    let names: Vec<&str> = children.iter().map(|f| f.name().as_str()).collect();
    names == ["type", "size", "indices", "values"]
}

/// Whether two files' types of a column are the same for the loader (field names and
/// nullability inside lists do not matter: Spark and pyarrow name list items differently).
pub fn same_type(a: &DataType, b: &DataType) -> bool {
    match (a, b) {
        (DataType::List(x), DataType::List(y))
        | (DataType::LargeList(x), DataType::LargeList(y)) => {
            same_type(x.data_type(), y.data_type())
        }
        (DataType::FixedSizeList(x, n), DataType::FixedSizeList(y, m)) => {
            n == m && same_type(x.data_type(), y.data_type())
        }
        (DataType::Struct(x), DataType::Struct(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y.iter())
                    .all(|(f, g)| f.name() == g.name() && same_type(f.data_type(), g.data_type()))
        }
        _ => a == b,
    }
}

/// Comma-separated column names of `schema`, for messages.
pub fn column_names(schema: &Schema) -> String {
    schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn numeric_and_list_columns_classify() {
        let f = Field::new("x", DataType::Float32, false);
        assert_eq!(classify(&f).unwrap().dtype, DType::Float32);
        let item = Arc::new(Field::new("element", DataType::Int16, true));
        let list = Field::new("v", DataType::List(item.clone()), true);
        assert_eq!(classify(&list).unwrap().shape, ColumnShape::List);
        let fixed = Field::new("v", DataType::FixedSizeList(item, 3), true);
        assert_eq!(classify(&fixed).unwrap().shape, ColumnShape::Fixed(3));
    }

    #[test]
    fn strings_and_vectors_are_refused_with_a_hint() {
        let err = classify(&Field::new("name", DataType::Utf8, true)).unwrap_err();
        assert!(err.to_string().contains("'name'"), "{err}");
        assert!(err.to_string().contains("encoded"), "{err}");
        let vector = DataType::Struct(
            vec![
                Field::new("type", DataType::Int8, false),
                Field::new("size", DataType::Int32, true),
                Field::new(
                    "indices",
                    DataType::List(Arc::new(Field::new("element", DataType::Int32, true))),
                    true,
                ),
                Field::new(
                    "values",
                    DataType::List(Arc::new(Field::new("element", DataType::Float64, true))),
                    true,
                ),
            ]
            .into(),
        );
        let err = classify(&Field::new("features", vector, true)).unwrap_err();
        assert!(err.to_string().contains("Spark ML vector"), "{err}");
    }

    #[test]
    fn errors_name_the_role_column_and_type() {
        let when = Field::new("when", DataType::Date32, true);
        let err = classify(&when).unwrap_err();
        assert!(
            matches!(
                err,
                Error::UnsupportedColumn { role: SELECTED, ref column, .. } if column == "when"
            ),
            "{err}"
        );
        assert!(
            err.to_string()
                .starts_with("selected column 'when' has type Date32; only numeric"),
            "{err}"
        );
        let nested = DataType::List(Arc::new(Field::new(
            "item",
            DataType::List(Arc::new(Field::new("item", DataType::Float32, true))),
            true,
        )));
        let err = classify_as(&Field::new("v", nested, true), "label").unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("label column 'v' has type List(")
                && text.contains("array columns must hold numbers or booleans"),
            "{text}"
        );
        let bools = DataType::List(Arc::new(Field::new("item", DataType::Boolean, true)));
        let kind = classify_as(&Field::new("mask", bools, true), "feature").unwrap();
        assert_eq!((kind.dtype, kind.shape), (DType::Bool, ColumnShape::List));
    }

    #[test]
    fn list_item_names_do_not_matter() {
        let a = DataType::List(Arc::new(Field::new("element", DataType::Float32, true)));
        let b = DataType::List(Arc::new(Field::new("item", DataType::Float32, false)));
        let c = DataType::List(Arc::new(Field::new("item", DataType::Float64, false)));
        assert!(same_type(&a, &b));
        assert!(!same_type(&a, &c));
    }
}
