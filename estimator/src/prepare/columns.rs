//! Which columns a preparation keeps, and the checks on their types.

use arrow::array::{Array, AsArray};
use arrow::datatypes::{DataType, Schema};

use crate::error::{Error, Result};
use crate::loader::columns::{classify_as, column_names, ColumnShape, DType};

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

/// Checks that `column` exists in `schema` (the schema of `source`, as messages name it) and
/// has a type its role allows: whatever the loader can turn into a tensor
/// ([`classify_as`]) for features and labels, scalars only for the sample weight and the
/// validation column.
pub(crate) fn check_column(schema: &Schema, column: &str, role: Role, source: &str) -> Result<()> {
    let field = schema
        .field_with_name(column)
        .map_err(|_| Error::UnknownColumn {
            role: role.name(),
            column: column.to_owned(),
            dataset: format!("the source ({source})"),
            available: column_names(schema),
        })?;
    let kind = classify_as(field, role.name())?;
    let scalar_only = match role {
        Role::Feature | Role::Label => None,
        Role::SampleWeight => Some("a sample weight must be one number per row, not an array"),
        Role::Validation => Some(
            "a validation column must be one bool or number per row (non-zero = validation \
             row), not an array",
        ),
    };
    match scalar_only {
        Some(hint) if kind.shape != ColumnShape::Scalar => Err(Error::UnsupportedColumn {
            role: role.name(),
            column: column.to_owned(),
            data_type: field.data_type().to_string(),
            hint: hint.to_owned(),
        }),
        _ => Ok(()),
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

    /// Records the list lengths of `columns` (in schema order, read from `source`) and refuses
    /// nulls inside lists.
    pub(crate) fn observe(
        &mut self,
        columns: &[std::sync::Arc<dyn Array>],
        source: &str,
    ) -> Result<()> {
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
                        location: source.to_owned(),
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

    const SOURCE: &str = "data.parquet";

    #[test]
    fn numeric_bool_and_lists_of_them_pass() {
        let s = schema();
        check_column(&s, "x", Role::Feature, SOURCE).unwrap();
        check_column(&s, "v", Role::Label, SOURCE).unwrap();
        check_column(&s, "bl", Role::Feature, SOURCE).unwrap();
        check_column(&s, "flag", Role::Feature, SOURCE).unwrap();
        check_column(&s, "flag", Role::Validation, SOURCE).unwrap();
        check_column(&s, "x", Role::SampleWeight, SOURCE).unwrap();
    }

    #[test]
    fn wrong_types_are_refused_naming_role_column_and_type() {
        let s = schema();
        let err = check_column(&s, "s", Role::Feature, SOURCE).unwrap_err();
        assert!(
            matches!(
                err,
                Error::UnsupportedColumn { role: "feature", ref column, .. } if column == "s"
            ),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            "feature column 's' has type Utf8; strings must be encoded as numbers first (e.g. \
             StringIndexer or a vocabulary)"
        );
        let err = check_column(&s, "v", Role::SampleWeight, SOURCE).unwrap_err();
        assert!(
            matches!(
                err,
                Error::UnsupportedColumn { role: "sample weight", ref column, .. } if column == "v"
            ),
            "{err}"
        );
        let text = err.to_string();
        assert!(
            text.starts_with("sample weight column 'v' has type List(")
                && text.contains("one number per row, not an array"),
            "{text}"
        );
        let err = check_column(&s, "bl", Role::Validation, SOURCE).unwrap_err();
        assert!(
            matches!(
                err,
                Error::UnsupportedColumn { role: "validation", ref column, .. } if column == "bl"
            ),
            "{err}"
        );
    }

    #[test]
    fn a_missing_column_names_role_source_and_the_available_ones() {
        let err = check_column(&schema(), "nope", Role::Label, SOURCE).unwrap_err();
        assert!(
            matches!(
                err,
                Error::UnknownColumn { role: "label", ref column, .. } if column == "nope"
            ),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            "label column 'nope' is not in the source (data.parquet); available columns: x, v, \
             s, bl, flag (check the name's spelling and case)"
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
        tracker.observe(&[x.clone(), fixed], SOURCE).unwrap();
        assert_eq!(tracker.infos()[1].shape, vec![Some(2)]);
        assert_eq!(tracker.infos()[0].shape, Vec::<Option<usize>>::new());
        assert_eq!(tracker.infos()[0].dtype, "float32");
        let ragged: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Float32Type, _, _>(vec![
            Some(vec![Some(1.0)]),
            Some(vec![Some(3.0), Some(4.0)]),
        ]));
        tracker.observe(&[x.clone(), ragged], SOURCE).unwrap();
        assert_eq!(tracker.infos()[1].shape, vec![None]);
        let holey: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Float32Type, _, _>(vec![
            Some(vec![Some(1.0), None]),
            Some(vec![Some(3.0), Some(4.0)]),
        ]));
        let err = tracker.observe(&[x, holey], SOURCE).unwrap_err();
        assert!(
            matches!(
                err,
                Error::NullValues { ref column, count: 1, inside_lists: true, .. } if column == "v"
            ),
            "{err}"
        );
        assert!(
            err.to_string()
                .starts_with("column 'v' has 1 null value(s) inside its lists in data.parquet;"),
            "{err}"
        );
    }
}
