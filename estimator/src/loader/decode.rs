//! Decoded rows ready to gather: per column, one buffer of fixed-width rows, checked for nulls
//! and ragged arrays.

use arrow::array::{Array, ArrayRef, AsArray, OffsetSizeTrait, RecordBatch};
use arrow::buffer::Buffer;
use arrow::datatypes::DataType;

use crate::error::{Error, Result};
use crate::loader::columns::DType;

/// A column the loader hands out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnSpec {
    /// Name.
    pub name: String,
    /// Element dtype.
    pub dtype: DType,
    /// Elements per row: 1 for scalars, the array length otherwise.
    pub len: usize,
    /// Whether the column is an array (`[batch, len]`) rather than a scalar (`[batch]`).
    pub array: bool,
}

impl ColumnSpec {
    /// A column for tests: an array when `len > 1`.
    #[cfg(test)]
    pub(crate) fn for_test(name: &str, dtype: DType, len: usize) -> ColumnSpec {
        ColumnSpec {
            name: name.into(),
            dtype,
            len,
            array: len > 1,
        }
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.len * self.dtype.width()
    }
}

/// Consecutive rows of the selected columns: for each column a buffer holding exactly
/// `rows * len` elements of its dtype, starting at the first row.
#[derive(Debug)]
pub struct Chunk {
    /// Number of rows.
    pub rows: usize,
    /// One buffer per selected column, in selection order.
    pub columns: Vec<Buffer>,
}

impl Chunk {
    /// Checks and flattens `batch` (read from `file`) for `specs`.
    pub fn from_batch(batch: &RecordBatch, specs: &[ColumnSpec], file: &str) -> Result<Chunk> {
        let rows = batch.num_rows();
        let columns = specs
            .iter()
            .map(|spec| {
                let array = batch.column_by_name(&spec.name).ok_or_else(|| {
                    Error::Internal(format!(
                        "column '{}' missing from a batch decoded from {file}",
                        spec.name
                    ))
                })?;
                column_values(array, spec, file)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Chunk { rows, columns })
    }
}

fn nulls(spec: &ColumnSpec, file: &str, count: usize) -> Result<()> {
    if count == 0 {
        return Ok(());
    }
    Err(Error::NullValues {
        column: spec.name.clone(),
        count: count as u64,
        location: file.to_string(),
        inside_lists: false,
    })
}

fn column_values(array: &ArrayRef, spec: &ColumnSpec, file: &str) -> Result<Buffer> {
    nulls(spec, file, array.null_count())?;
    match array.data_type() {
        DataType::List(_) => list_values(array.as_list::<i32>(), spec, file),
        DataType::LargeList(_) => list_values(array.as_list::<i64>(), spec, file),
        DataType::FixedSizeList(_, len) => {
            let list = array.as_fixed_size_list();
            if *len as usize != spec.len {
                return Err(Error::RaggedColumn {
                    column: spec.name.clone(),
                    file: file.to_string(),
                    expected: spec.len as u64,
                    found: *len as u64,
                });
            }
            let start = if list.is_empty() {
                0
            } else {
                list.value_offset(0) as usize
            };
            element_values(list.values(), start, list.len() * spec.len, spec, file)
        }
        _ => element_values(array, 0, array.len(), spec, file),
    }
}

/// Checks that every row of `list` has `spec.len` elements and returns them, flat.
fn list_values<O: OffsetSizeTrait>(
    list: &arrow::array::GenericListArray<O>,
    spec: &ColumnSpec,
    file: &str,
) -> Result<Buffer> {
    let offsets = list.value_offsets();
    let expected = spec.len;
    if let Some(w) = offsets
        .windows(2)
        .find(|w| (w[1] - w[0]).as_usize() != expected)
    {
        return Err(Error::RaggedColumn {
            column: spec.name.clone(),
            file: file.to_string(),
            expected: expected as u64,
            found: (w[1] - w[0]).as_usize() as u64,
        });
    }
    let start = offsets.first().map_or(0, |o| o.as_usize());
    element_values(list.values(), start, list.len() * expected, spec, file)
}

/// Elements `[start, start + count)` of a flat array, as a buffer of `spec.dtype`.
fn element_values(
    values: &ArrayRef,
    start: usize,
    count: usize,
    spec: &ColumnSpec,
    file: &str,
) -> Result<Buffer> {
    let found = DType::of(values.data_type());
    if found != Some(spec.dtype) {
        return Err(Error::SchemaDiffers {
            column: spec.name.clone(),
            file: file.to_string(),
            expected: spec.dtype.name().to_string(),
            found: values.data_type().to_string(),
        });
    }
    let values = values.slice(start, count);
    nulls(spec, file, values.null_count())?;
    if spec.dtype == DType::Bool {
        let bools = values.as_boolean();
        let bytes: Vec<u8> = bools.values().iter().map(u8::from).collect();
        return Ok(Buffer::from_vec(bytes));
    }
    let data = values.to_data();
    let width = spec.dtype.width();
    Ok(data.buffers()[0].slice_with_length(data.offset() * width, count * width))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{BooleanArray, Float32Array, Int64Array, ListArray};
    use arrow::datatypes::{Field, Int32Type, Schema};
    use std::sync::Arc;

    fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
        let fields: Vec<Field> = columns
            .iter()
            .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
            .collect();
        RecordBatch::try_new(
            Arc::new(Schema::new(fields)),
            columns.into_iter().map(|(_, a)| a).collect(),
        )
        .unwrap()
    }

    #[test]
    fn flattens_scalars_bools_and_lists() {
        let list = ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
            Some(vec![Some(1), Some(2)]),
            Some(vec![Some(3), Some(4)]),
            Some(vec![Some(5), Some(6)]),
        ]);
        let b = batch(vec![
            ("x", Arc::new(Float32Array::from(vec![1.0, 2.0, 3.0]))),
            ("b", Arc::new(BooleanArray::from(vec![true, false, true]))),
            ("v", Arc::new(list)),
        ]);
        let b = b.slice(1, 2);
        let specs = [
            ColumnSpec::for_test("x", DType::Float32, 1),
            ColumnSpec::for_test("b", DType::Bool, 1),
            ColumnSpec::for_test("v", DType::Int32, 2),
        ];
        let chunk = Chunk::from_batch(&b, &specs, "f").unwrap();
        assert_eq!(chunk.rows, 2);
        assert_eq!(chunk.columns[0].typed_data::<f32>(), &[2.0, 3.0]);
        assert_eq!(chunk.columns[1].as_slice(), &[0, 1]);
        assert_eq!(chunk.columns[2].typed_data::<i32>(), &[3, 4, 5, 6]);
    }

    #[test]
    fn nulls_and_ragged_rows_name_column_and_file() {
        let b = batch(vec![("y", Arc::new(Int64Array::from(vec![Some(1), None])))]);
        let err = Chunk::from_batch(
            &b,
            &[ColumnSpec::for_test("y", DType::Int64, 1)],
            "s3://b/part-1",
        )
        .unwrap_err();
        assert!(matches!(err, Error::NullValues { .. }), "{err}");
        assert!(err.to_string().contains("'y'") && err.to_string().contains("part-1"));
        let list = ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
            Some(vec![Some(1), Some(2)]),
            Some(vec![Some(3)]),
        ]);
        let b = batch(vec![("v", Arc::new(list))]);
        let err = Chunk::from_batch(&b, &[ColumnSpec::for_test("v", DType::Int32, 2)], "part-2")
            .unwrap_err();
        match err {
            Error::RaggedColumn {
                expected, found, ..
            } => assert_eq!((expected, found), (2, 1)),
            other => panic!("{other}"),
        }
        let list =
            ListArray::from_iter_primitive::<Int32Type, _, _>(vec![Some(vec![Some(1), None])]);
        let b = batch(vec![("v", Arc::new(list))]);
        let err = Chunk::from_batch(&b, &[ColumnSpec::for_test("v", DType::Int32, 2)], "part-3")
            .unwrap_err();
        assert!(matches!(err, Error::NullValues { .. }), "{err}");
    }
}
