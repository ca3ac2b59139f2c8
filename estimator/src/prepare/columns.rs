//! Which columns a preparation keeps, and the checks on their types.

use arrow::array::{Array, AsArray};
use arrow::datatypes::{DataType, Schema};

use crate::error::{Error, Result};
use crate::loader::columns::DType;

/// What a column is for; named in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A model input.
    Feature,
    /// A training target.
    Label,
    /// The per-row sample weight.
    SampleWeight,
    /// The boolean column choosing validation rows.
    Validation,
}

impl Role {
    /// The role as written in messages.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Role::Feature => "feature",
            Role::Label => "label",
            Role::SampleWeight => "sample weight",
            Role::Validation => "validation",
        }
    }
}

/// The dtype and shape of one prepared column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnInfo {
    /// The column name.
    pub name: String,
    /// The element type in numpy's spelling (`float32`, `int64`, `bool`, ...).
    pub dtype: String,
    /// The shape of one row's value: empty for a scalar, one entry for a list; `None` where
    /// the list length varies between rows.
    pub shape: Vec<Option<usize>>,
}

/// numpy's name for a numeric or bool Arrow type; `None` for anything else.
pub(crate) fn numpy_dtype(data_type: &DataType) -> Option<&'static str> {
    DType::of(data_type).map(DType::name)
}

/// The element type of a list column, if the type is a (large, fixed-size) list.
fn list_element(data_type: &DataType) -> Option<&DataType> {
    match data_type {
        DataType::List(field) | DataType::LargeList(field) | DataType::FixedSizeList(field, _) => {
            Some(field.data_type())
        }
        _ => None,
    }
}

/// Checks that `column` exists in `schema` and has a type its role allows: numeric or bool
/// scalars everywhere, lists of numbers for features and labels only.
pub(crate) fn check_column(schema: &Schema, column: &str, role: Role) -> Result<()> {
    let field = schema
        .field_with_name(column)
        .map_err(|_| Error::ColumnMissing {
            column: column.to_owned(),
            role: role.name(),
            available: schema
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    let data_type = field.data_type();
    let allowed = match role {
        Role::Feature | Role::Label => {
            numpy_dtype(data_type).is_some()
                || list_element(data_type)
                    .is_some_and(|e| numpy_dtype(e).is_some() && *e != DataType::Boolean)
        }
        Role::SampleWeight | Role::Validation => numpy_dtype(data_type).is_some(),
    };
    if allowed {
        Ok(())
    } else {
        Err(Error::ColumnType {
            column: column.to_owned(),
            role: role.name(),
            data_type: data_type.clone(),
            allowed: match role {
                Role::Feature | Role::Label => {
                    "a number, a bool, or a list / fixed-size list of numbers"
                }
                Role::SampleWeight => "a number",
                Role::Validation => "a bool or a number (non-zero = validation row)",
            },
        })
    }
}

/// Tracks each kept column's list lengths over the batches written, for [`ColumnInfo`].
#[derive(Debug)]
pub(crate) struct ShapeTracker {
    columns: Vec<Tracked>,
}

/// One column's name, type, and the smallest and largest list length seen.
#[derive(Debug)]
struct Tracked {
    name: String,
    data_type: DataType,
    lengths: Option<(usize, usize)>,
}

impl ShapeTracker {
    /// A tracker for the columns of `schema` (all already checked).
    pub(crate) fn new(schema: &Schema) -> Self {
        Self {
            columns: schema
                .fields()
                .iter()
                .map(|f| Tracked {
                    name: f.name().clone(),
                    data_type: f.data_type().clone(),
                    lengths: None,
                })
                .collect(),
        }
    }

    /// Records the list lengths of `columns` (in schema order) and refuses nulls inside lists.
    pub(crate) fn observe(&mut self, columns: &[std::sync::Arc<dyn Array>]) -> Result<()> {
        for (
            Tracked {
                name,
                lengths: range,
                ..
            },
            array,
        ) in self.columns.iter_mut().zip(columns)
        {
            let lengths: Option<(usize, usize, usize)> = match array.data_type() {
                DataType::List(_) => {
                    let list = array.as_list::<i32>();
                    let offsets = list.value_offsets();
                    let (lo, hi) = min_max(offsets.windows(2).map(|w| (w[1] - w[0]) as usize));
                    Some((lo, hi, list.values().null_count()))
                }
                DataType::LargeList(_) => {
                    let list = array.as_list::<i64>();
                    let offsets = list.value_offsets();
                    let (lo, hi) = min_max(offsets.windows(2).map(|w| (w[1] - w[0]) as usize));
                    Some((lo, hi, list.values().null_count()))
                }
                DataType::FixedSizeList(_, n) => {
                    let list = array.as_fixed_size_list();
                    let n = *n as usize;
                    Some((n, n, list.values().null_count()))
                }
                _ => None,
            };
            if let Some((lo, hi, nulls)) = lengths {
                if nulls > 0 {
                    return Err(Error::NullValues {
                        column: name.clone(),
                        count: nulls as u64,
                        inside_lists: true,
                    });
                }
                if array.is_empty() {
                    continue;
                }
                *range = Some(match *range {
                    None => (lo, hi),
                    Some((a, b)) => (a.min(lo), b.max(hi)),
                });
            }
        }
        Ok(())
    }

    /// The dtype and shape of every column.
    pub(crate) fn infos(&self) -> Vec<ColumnInfo> {
        self.columns
            .iter()
            .map(
                |Tracked {
                     name,
                     data_type,
                     lengths: range,
                 }| {
                    let (element, shape) = match list_element(data_type) {
                        Some(element) => {
                            let length = match (data_type, range) {
                                (DataType::FixedSizeList(_, n), _) => Some(*n as usize),
                                (_, Some((lo, hi))) if lo == hi => Some(*lo),
                                _ => None,
                            };
                            (element, vec![length])
                        }
                        None => (data_type, Vec::new()),
                    };
                    ColumnInfo {
                        name: name.clone(),
                        dtype: numpy_dtype(element).unwrap_or("unknown").to_owned(),
                        shape,
                    }
                },
            )
            .collect()
    }
}

/// The smallest and largest of `values` (`(0, 0)` when empty).
fn min_max(values: impl Iterator<Item = usize>) -> (usize, usize) {
    values
        .fold(None, |acc: Option<(usize, usize)>, v| {
            Some(acc.map_or((v, v), |(lo, hi)| (lo.min(v), hi.max(v))))
        })
        .unwrap_or((0, 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{ArrayRef, Float32Array, ListArray};
    use arrow::datatypes::{Field, Float32Type};
    use std::sync::Arc;

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("x", DataType::Float32, true),
            Field::new(
                "v",
                DataType::List(Arc::new(Field::new("item", DataType::Float64, true))),
                true,
            ),
            Field::new("s", DataType::Utf8, true),
            Field::new(
                "bl",
                DataType::List(Arc::new(Field::new("item", DataType::Boolean, true))),
                true,
            ),
            Field::new("flag", DataType::Boolean, true),
        ])
    }

    #[test]
    fn numeric_bool_and_numeric_lists_pass() {
        let s = schema();
        check_column(&s, "x", Role::Feature).unwrap();
        check_column(&s, "v", Role::Label).unwrap();
        check_column(&s, "flag", Role::Feature).unwrap();
        check_column(&s, "flag", Role::Validation).unwrap();
        check_column(&s, "x", Role::SampleWeight).unwrap();
    }

    #[test]
    fn wrong_types_are_refused_naming_the_column() {
        let s = schema();
        let err = check_column(&s, "s", Role::Feature).unwrap_err();
        assert!(matches!(err, Error::ColumnType { ref column, .. } if column == "s"));
        assert!(err.to_string().contains("'s'"), "{err}");
        assert!(err.to_string().contains("Utf8"), "{err}");
        let err = check_column(&s, "bl", Role::Label).unwrap_err();
        assert!(matches!(err, Error::ColumnType { ref column, .. } if column == "bl"));
        let err = check_column(&s, "v", Role::SampleWeight).unwrap_err();
        assert!(matches!(err, Error::ColumnType { ref column, .. } if column == "v"));
    }

    #[test]
    fn a_missing_column_lists_the_available_ones() {
        let err = check_column(&schema(), "nope", Role::Feature).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("'nope'") && text.contains("x, v, s, bl, flag"),
            "{text}"
        );
    }

    #[test]
    fn shapes_follow_list_lengths_and_nulls_inside_lists_are_refused() {
        let s = Schema::new(vec![
            Field::new("x", DataType::Float32, true),
            Field::new(
                "v",
                DataType::List(Arc::new(Field::new("item", DataType::Float32, true))),
                true,
            ),
        ]);
        let mut tracker = ShapeTracker::new(&s);
        let x: ArrayRef = Arc::new(Float32Array::from(vec![1.0, 2.0]));
        let fixed: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Float32Type, _, _>(vec![
            Some(vec![Some(1.0), Some(2.0)]),
            Some(vec![Some(3.0), Some(4.0)]),
        ]));
        tracker.observe(&[x.clone(), fixed]).unwrap();
        assert_eq!(tracker.infos()[1].shape, vec![Some(2)]);
        assert_eq!(tracker.infos()[0].shape, Vec::<Option<usize>>::new());
        assert_eq!(tracker.infos()[0].dtype, "float32");
        let ragged: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Float32Type, _, _>(vec![
            Some(vec![Some(1.0)]),
            Some(vec![Some(3.0), Some(4.0)]),
        ]));
        tracker.observe(&[x.clone(), ragged]).unwrap();
        assert_eq!(tracker.infos()[1].shape, vec![None]);
        let holey: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Float32Type, _, _>(vec![
            Some(vec![Some(1.0), None]),
            Some(vec![Some(3.0), Some(4.0)]),
        ]));
        let err = tracker.observe(&[x, holey]).unwrap_err();
        assert!(matches!(err, Error::NullValues { ref column, count: 1, .. } if column == "v"));
    }
}
