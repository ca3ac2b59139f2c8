//! The loader's fast path: PLAIN-encoded, fixed-width pages without nulls are used as they
//! are. Their value bytes (in the mapped file, or the page's decompressed buffer) become the
//! chunk's column buffers: no decoding and no copy. Anything else (dictionary or other
//! encodings, nulls, ragged or empty arrays, nested lists, BOOLEAN and narrow integers) makes
//! [`read`] answer `None`, and the Arrow reader decodes the piece and reports what is wrong.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use arrow::buffer::Buffer;
use arrow::datatypes::{DataType, Schema};
use bytes::Bytes;
use parquet::basic::{Compression, Encoding, Type as PhysicalType};
use parquet::column::page::{Page, PageReader};
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::serialized_reader::SerializedPageReader;

use crate::loader::columns::DType;
use crate::loader::decode::{Chunk, ColumnSpec};

/// Per (row group, leaf column) of one mapped file, the runs of all the pages of an
/// uncompressed column chunk whose pages all read plain. Their values lie in the mapping, so
/// keeping them costs no memory, and every later read of the chunk (each piece, each epoch)
/// slices them instead of parsing its page headers again (in a loader's later epochs that
/// parsing, a byte at a time, took a tenth of its CPU). `None` for a chunk with a page that
/// does not read plain: each read then reads the pages it needs, as a compressed chunk's do.
#[derive(Debug, Default)]
pub struct PageCache(Mutex<ChunkPages>);

/// (row group, leaf column) -> the chunk's page runs, or `None` when it reads per piece.
type ChunkPages = HashMap<(usize, usize), Option<Arc<[Run]>>>;

impl PageCache {
    /// The cached runs of `leaf` in `row_group`, or `read()`'s (kept when they lie in `file`).
    fn runs(
        &self,
        file: &Bytes,
        row_group: usize,
        leaf: usize,
        read: impl FnOnce() -> Result<Option<Vec<Run>>, ParquetError>,
    ) -> Result<Option<Arc<[Run]>>, ParquetError> {
        let key = (row_group, leaf);
        if let Some(runs) = self.lock().get(&key) {
            return Ok(runs.clone());
        }
        let runs: Option<Arc<[Run]>> = read()?.map(Into::into);
        let mapped = file.as_ptr_range();
        let in_file = runs.as_deref().is_none_or(|runs| {
            runs.iter().all(|run| {
                let values = run.values.as_slice().as_ptr_range();
                mapped.start <= values.start && values.end <= mapped.end
            })
        });
        if in_file {
            self.lock().insert(key, runs.clone());
        }
        Ok(runs)
    }

    fn lock(&self) -> MutexGuard<'_, ChunkPages> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// For each of `specs` (top-level columns `roots` of `schema`), the runs covering rows `rows`
/// of `row_group`, read from the whole file `file` with buffers pointing into the file or the
/// decompressed pages; `None` for a column that needs the Arrow reader. Uncompressed chunks'
/// pages are read once, whole, into `pages`.
#[allow(clippy::too_many_arguments)]
pub fn column_runs(
    file: &Bytes,
    metadata: &ParquetMetaData,
    schema: &Schema,
    roots: &[usize],
    specs: &[ColumnSpec],
    row_group: usize,
    rows: &Range<usize>,
    pages: &PageCache,
) -> Result<Vec<Option<Vec<Run>>>, ParquetError> {
    let group = metadata.row_group(row_group);
    let group_rows = usize::try_from(group.num_rows()).unwrap_or(0);
    let descr = metadata.file_metadata().schema_descr();
    let mut columns = Vec::with_capacity(specs.len());
    for (spec, &root) in specs.iter().zip(roots) {
        if rows.end > group_rows || rows.is_empty() {
            columns.push(None);
            continue;
        }
        let mut leaves = (0..descr.num_columns()).filter(|&l| descr.get_column_root_idx(l) == root);
        let (Some(leaf), None) = (leaves.next(), leaves.next()) else {
            columns.push(None);
            continue;
        };
        let column = descr.column(leaf);
        let levels = Levels {
            max_def: column.max_def_level(),
            max_rep: column.max_rep_level(),
            len: spec.len,
        };
        let chunk = group.column(leaf);
        if !levels.fits(spec)
            || !same_bits(spec.dtype, chunk.column_type())
            || element_dtype(schema.field(root).data_type()) != Some(spec.dtype)
            || chunk.dictionary_page_offset().is_some()
        {
            columns.push(None);
            continue;
        }
        let reader = || SerializedPageReader::new(Arc::new(file.clone()), chunk, group_rows, None);
        let whole = if chunk.compression() == Compression::UNCOMPRESSED {
            pages.runs(file, row_group, leaf, || {
                column_pages(reader()?, &levels, spec.row_bytes(), &(0..group_rows))
            })?
        } else {
            None
        };
        let runs = match whole {
            Some(all) => Some(within(&all, rows)),
            None => column_pages(reader()?, &levels, spec.row_bytes(), rows)?,
        };
        columns.push(runs);
    }
    Ok(columns)
}

/// The bytes one read fault on a file mapping maps in: the kernel's fault-around window
/// (`fault_around_bytes`, 64 KiB unless changed in debugfs), aligned to itself.
const FAULT_AROUND: usize = 64 * 1024;

/// Maps in the pages of `values` (the rows a piece reads, when they lie in the mapped `file`)
/// here, on a decode thread, rather than when the gather first touches them: it reads one byte
/// per fault-around window, and each read fault maps the window's cached pages (16 page-table
/// entries in one go; a whole large folio of the page cache, up to 2 MiB, on kernels that
/// keep files in them). `MADV_POPULATE_READ`, used before, walks the range a page at a time:
/// 0.062-0.085 CPU-s per GB of a warm file against 0.047-0.064 (`touch` below, 5 interleaved
/// rounds), and a first epoch 0.27-0.31 CPU-s/GB against 0.30-0.34 (6 interleaved pairs).
/// Only the piece's own rows: a row group is read in several pieces.
/// [`crate::loader::source::FileReader::read_plain`] calls it on a row range's first read.
/// Pages not in the page cache are read as the gather would read them.
pub fn map_in(file: &Bytes, values: &[u8]) {
    let range = values.as_ptr_range();
    let mapped = file.as_ptr_range();
    if values.is_empty() || range.start < mapped.start || range.end > mapped.end {
        return;
    }
    let (mut at, end) = (range.start as usize, range.end as usize);
    while at < end {
        // SAFETY: `at` lies in `values`, bytes of `file`, which stays mapped while borrowed.
        unsafe { std::ptr::read_volatile(at as *const u8) };
        at = (at & !(FAULT_AROUND - 1)) + FAULT_AROUND;
    }
}

/// The parts of `runs` (consecutive, from their first row on) that cover `rows`.
fn within(runs: &[Run], rows: &Range<usize>) -> Vec<Run> {
    runs.iter()
        .filter_map(|run| {
            let start = run.start.max(rows.start);
            let end = (run.start + run.rows).min(rows.end);
            let row_bytes = run.values.len() / run.rows;
            (start < end).then(|| Run {
                start,
                rows: end - start,
                values: run
                    .values
                    .slice_with_length((start - run.start) * row_bytes, (end - start) * row_bytes),
            })
        })
        .collect()
}

/// Values of consecutive rows of one column (from one page, or decoded by the Arrow reader).
#[derive(Debug)]
pub struct Run {
    /// First row (in the row group).
    pub start: usize,
    /// Rows.
    pub rows: usize,
    /// `rows * row_bytes` bytes of values.
    pub values: Buffer,
}

/// The page runs of one column covering `rows` (in order, without gaps), or `None` when a
/// page is not plain, complete and null-free.
fn column_pages<R: PageReader>(
    mut reader: R,
    levels: &Levels,
    row_bytes: usize,
    rows: &Range<usize>,
) -> Result<Option<Vec<Run>>, ParquetError> {
    let mut runs = Vec::new();
    let mut at = 0usize;
    while at < rows.end {
        if levels.max_rep == 0 {
            // A flat column's levels count its rows: pages before `rows` are skipped unread
            // (and not decompressed).
            match reader.peek_next_page()? {
                None => return Ok(None),
                Some(meta) if meta.is_dict => return Ok(None),
                Some(meta) => {
                    if let Some(n) = meta.num_rows.or(meta.num_levels) {
                        if at + n <= rows.start {
                            reader.skip_next_page()?;
                            at += n;
                            continue;
                        }
                    }
                }
            }
        }
        let Some(page) = reader.get_next_page()? else {
            return Ok(None);
        };
        let Some((page_rows, values)) = levels.page_values(&page, row_bytes) else {
            return Ok(None);
        };
        let start = at.max(rows.start);
        let end = (at + page_rows).min(rows.end);
        if start < end {
            runs.push(Run {
                start,
                rows: end - start,
                values: Buffer::from(
                    values.slice((start - at) * row_bytes..(end - at) * row_bytes),
                ),
            });
        }
        at += page_rows;
    }
    Ok(Some(runs))
}

/// Chunks over `rows`, cut wherever some column moves to its next run.
pub fn cut(columns: &[Vec<Run>], rows: &Range<usize>) -> Vec<Chunk> {
    let mut next = vec![0usize; columns.len()];
    let mut chunks = Vec::new();
    let mut at = rows.start;
    while at < rows.end {
        let end = columns
            .iter()
            .zip(&next)
            .map(|(runs, &i)| runs[i].start + runs[i].rows)
            .min()
            .unwrap_or(rows.end);
        let buffers = columns
            .iter()
            .zip(next.iter_mut())
            .map(|(runs, i)| {
                let run = &runs[*i];
                let row_bytes = run.values.len() / run.rows;
                let values = run
                    .values
                    .slice_with_length((at - run.start) * row_bytes, (end - at) * row_bytes);
                if run.start + run.rows == end {
                    *i += 1;
                }
                values
            })
            .collect();
        chunks.push(Chunk {
            rows: end - at,
            columns: buffers,
        });
        at = end;
    }
    chunks
}

/// Whether Parquet's physical type stores exactly the bits of `dtype`.
fn same_bits(dtype: DType, physical: PhysicalType) -> bool {
    matches!(
        (dtype, physical),
        (DType::Float32, PhysicalType::FLOAT)
            | (DType::Float64, PhysicalType::DOUBLE)
            | (DType::Int32 | DType::Uint32, PhysicalType::INT32)
            | (DType::Int64 | DType::Uint64, PhysicalType::INT64)
    )
}

/// The element dtype of a scalar or (fixed-size, large) list Arrow type.
fn element_dtype(data_type: &DataType) -> Option<DType> {
    match data_type {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            DType::of(f.data_type())
        }
        other => DType::of(other),
    }
}

/// The level structure of one column: scalars have no repetition; arrays repeat once, with
/// `len` elements per row.
#[derive(Debug)]
struct Levels {
    max_def: i16,
    max_rep: i16,
    len: usize,
}

impl Levels {
    fn fits(&self, spec: &ColumnSpec) -> bool {
        if spec.array {
            self.max_rep == 1 && self.len > 0
        } else {
            self.max_rep == 0 && self.max_def <= 1
        }
    }

    /// The rows of a data page and its value bytes (`rows * row_bytes`), if the page is
    /// PLAIN, has no null or missing element and (for arrays) exactly `len` elements per row,
    /// starting at a row boundary.
    fn page_values(&self, page: &Page, row_bytes: usize) -> Option<(usize, Bytes)> {
        let (buf, levels, num_values) = match page {
            Page::DataPage {
                buf,
                num_values,
                encoding: Encoding::PLAIN,
                def_level_encoding,
                rep_level_encoding,
                ..
            } => {
                let rle = |used: bool, encoding: &Encoding| !used || *encoding == Encoding::RLE;
                if !rle(self.max_def > 0, def_level_encoding)
                    || !rle(self.max_rep > 0, rep_level_encoding)
                {
                    return None;
                }
                let mut at = 0;
                let mut prefixed = |used: bool| -> Option<Range<usize>> {
                    if !used {
                        return Some(at..at);
                    }
                    let len = u32::from_le_bytes(buf.get(at..at + 4)?.try_into().ok()?) as usize;
                    let range = at + 4..at + 4 + len;
                    at = range.end;
                    Some(range)
                };
                let rep = prefixed(self.max_rep > 0)?;
                let def = prefixed(self.max_def > 0)?;
                (buf, [rep, def, at..buf.len()], *num_values as usize)
            }
            Page::DataPageV2 {
                buf,
                num_values,
                encoding: Encoding::PLAIN,
                num_nulls: 0,
                def_levels_byte_len,
                rep_levels_byte_len,
                ..
            } => {
                let rep = 0..*rep_levels_byte_len as usize;
                let def = rep.end..rep.end + *def_levels_byte_len as usize;
                let values = def.end..buf.len();
                (buf, [rep, def, values], *num_values as usize)
            }
            _ => return None,
        };
        let [rep, def, values] = levels;
        let elements = if self.max_rep > 0 { self.len } else { 1 };
        if !num_values.is_multiple_of(elements) || values.start > buf.len() {
            return None;
        }
        let page_rows = num_values / elements;
        let width = row_bytes / elements;
        if values.len() < num_values * width {
            return None;
        }
        if self.max_def > 0 {
            let expected = Expected::Constant(self.max_def as u8);
            if !hybrid_matches(
                buf.get(def)?,
                bit_width(self.max_def),
                num_values,
                &expected,
            ) {
                return None;
            }
        }
        if self.max_rep > 0 {
            let expected = Expected::RowStarts(self.len);
            if !hybrid_matches(buf.get(rep)?, 1, num_values, &expected) {
                return None;
            }
        }
        let start = values.start;
        Some((page_rows, buf.slice(start..start + num_values * width)))
    }
}

/// Bits per level for levels up to `max`.
fn bit_width(max: i16) -> u8 {
    (16 - (max as u16).leading_zeros()) as u8
}

/// The level every position must have.
#[derive(Debug)]
enum Expected {
    /// The same level everywhere.
    Constant(u8),
    /// Repetition levels of rows of `n` elements: 0 at multiples of `n`, 1 elsewhere.
    RowStarts(usize),
}

impl Expected {
    fn at(&self, i: usize) -> u8 {
        match *self {
            Expected::Constant(v) => v,
            Expected::RowStarts(n) => u8::from(!i.is_multiple_of(n)),
        }
    }

    /// Whether positions `[i, i + count)` all hold `value`.
    fn run(&self, i: usize, count: usize, value: u8) -> bool {
        match *self {
            Expected::Constant(v) => v == value,
            Expected::RowStarts(1) => value == 0,
            Expected::RowStarts(n) => match value {
                0 => count == 1 && i.is_multiple_of(n),
                1 => !i.is_multiple_of(n) && i % n + count <= n,
                _ => false,
            },
        }
    }
}

/// Whether the first `count` levels of Parquet's RLE/bit-packed hybrid encoding `data`
/// (`width` bits each) are the `expected` ones.
fn hybrid_matches(data: &[u8], width: u8, count: usize, expected: &Expected) -> bool {
    let value_bytes = usize::from(width).div_ceil(8);
    let mut at = 0usize;
    let mut i = 0usize;
    while i < count {
        let Some(header) = varint(data, &mut at) else {
            return false;
        };
        let n = (header >> 1) as usize;
        if header & 1 == 0 {
            let Some(bytes) = data.get(at..at + value_bytes) else {
                return false;
            };
            at += value_bytes;
            let value = bytes
                .iter()
                .rev()
                .fold(0u64, |v, &b| (v << 8) | u64::from(b));
            let n = n.min(count - i);
            if n == 0 || value > u64::from(u8::MAX) || !expected.run(i, n, value as u8) {
                return false;
            }
            i += n;
        } else {
            let bytes = n * usize::from(width);
            let Some(packed) = data.get(at..at + bytes) else {
                return false;
            };
            at += bytes;
            let values = (n * 8).min(count - i);
            if n == 0 {
                return false;
            }
            let mask = (1u16 << width) - 1;
            for k in 0..values {
                let bit = k * usize::from(width);
                let word = u16::from(packed[bit / 8])
                    | packed.get(bit / 8 + 1).map_or(0, |&b| u16::from(b) << 8);
                if (word >> (bit % 8)) & mask != u16::from(expected.at(i + k)) {
                    return false;
                }
            }
            i += values;
        }
    }
    true
}

/// An unsigned LEB128 varint at `*at` (moved past it).
fn varint(data: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *data.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{ArrayRef, Float32Array, Int64Array, ListArray, RecordBatch};
    use arrow::datatypes::{Field, Float32Type};
    use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
    use parquet::arrow::ArrowWriter;
    use parquet::basic::Compression;
    use parquet::file::properties::{WriterProperties, WriterVersion};

    const ROWS: usize = 100;

    /// `id` (i64, required), `x` (f32, nullable; `null_at` makes one null), `v` (list of
    /// three f32; `ragged_at` gives that row two).
    fn table(null_at: Option<usize>, ragged_at: Option<usize>) -> RecordBatch {
        let id = Int64Array::from_iter_values(0..ROWS as i64);
        let x = Float32Array::from_iter(
            (0..ROWS).map(|i| (Some(i) != null_at).then_some(i as f32 * 0.5)),
        );
        let v = ListArray::from_iter_primitive::<Float32Type, _, _>((0..ROWS).map(|i| {
            let n = if Some(i) == ragged_at { 2 } else { 3 };
            Some(
                (0..n)
                    .map(|k| Some(i as f32 + k as f32 / 4.0))
                    .collect::<Vec<_>>(),
            )
        }));
        let columns: Vec<(&str, ArrayRef, bool)> = vec![
            ("id", Arc::new(id), false),
            ("x", Arc::new(x), true),
            ("v", Arc::new(v), true),
        ];
        let schema = Schema::new(
            columns
                .iter()
                .map(|(n, a, nullable)| Field::new(*n, a.data_type().clone(), *nullable))
                .collect::<Vec<_>>(),
        );
        RecordBatch::try_new(Arc::new(schema), columns.into_iter().map(|c| c.1).collect()).unwrap()
    }

    fn write(batch: &RecordBatch, props: WriterProperties) -> Bytes {
        let mut out = Vec::new();
        let mut writer = ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).unwrap();
        writer.write(batch).unwrap();
        writer.close().unwrap();
        Bytes::from(out)
    }

    /// Plain pages of 16 rows, one row group.
    fn plain(version: WriterVersion, compression: Compression) -> WriterProperties {
        WriterProperties::builder()
            .set_dictionary_enabled(false)
            .set_encoding(Encoding::PLAIN)
            .set_writer_version(version)
            .set_compression(compression)
            .set_data_page_row_count_limit(16)
            .set_write_batch_size(16)
            .build()
    }

    fn specs() -> Vec<ColumnSpec> {
        vec![
            ColumnSpec::for_test("id", DType::Int64, 1),
            ColumnSpec::for_test("x", DType::Float32, 1),
            ColumnSpec::for_test("v", DType::Float32, 3),
        ]
    }

    /// The chunks when every column reads plain, else `None`.
    fn read_rows(file: &Bytes, rows: Range<usize>) -> Option<Vec<Chunk>> {
        read_rows_with(file, rows, &PageCache::default())
    }

    fn read_rows_with(file: &Bytes, rows: Range<usize>, pages: &PageCache) -> Option<Vec<Chunk>> {
        let meta = ArrowReaderMetadata::load(file, ArrowReaderOptions::new()).unwrap();
        let specs = specs();
        let runs = column_runs(
            file,
            meta.metadata(),
            meta.schema(),
            &[0, 1, 2],
            &specs,
            0,
            &rows,
            pages,
        );
        let runs = runs.unwrap().into_iter().collect::<Option<Vec<_>>>()?;
        Some(cut(&runs, &rows))
    }

    fn concat<T: Copy>(chunks: &[Chunk], column: usize, read: fn(&[u8]) -> T) -> Vec<T> {
        let width = std::mem::size_of::<T>();
        chunks
            .iter()
            .flat_map(|c| c.columns[column].as_slice().chunks_exact(width).map(read))
            .collect()
    }

    #[test]
    fn plain_pages_are_used_as_they_are_in_every_page_format() {
        for version in [WriterVersion::PARQUET_1_0, WriterVersion::PARQUET_2_0] {
            for compression in [Compression::UNCOMPRESSED, Compression::SNAPPY] {
                let file = write(&table(None, None), plain(version, compression));
                let chunks = read_rows(&file, 5..77).expect("plain pages take the fast path");
                assert!(chunks.len() > 1, "rows 5..77 span several 16-row pages");
                assert_eq!(chunks.iter().map(|c| c.rows).sum::<usize>(), 72);
                let id = concat(&chunks, 0, |b| i64::from_le_bytes(b.try_into().unwrap()));
                assert_eq!(id, (5..77).collect::<Vec<i64>>());
                let x = concat(&chunks, 1, |b| f32::from_le_bytes(b.try_into().unwrap()));
                assert_eq!(x, (5..77).map(|i| i as f32 * 0.5).collect::<Vec<_>>());
                let v = concat(&chunks, 2, |b| f32::from_le_bytes(b.try_into().unwrap()));
                let want: Vec<f32> = (5..77)
                    .flat_map(|i| (0..3).map(move |k| i as f32 + k as f32 / 4.0))
                    .collect();
                assert_eq!(v, want);
                if compression == Compression::UNCOMPRESSED {
                    let range = file.as_ptr_range();
                    let inside = chunks[0].columns[0].as_ptr();
                    assert!(
                        range.contains(&inside),
                        "uncompressed values are not copied"
                    );
                }
            }
        }
    }

    #[test]
    fn an_uncompressed_chunks_pages_are_read_once_for_every_piece() {
        let file = write(
            &table(None, None),
            plain(WriterVersion::PARQUET_1_0, Compression::UNCOMPRESSED),
        );
        let pages = PageCache::default();
        let pieces = [0..20, 20..77, 5..77, 77..ROWS, 0..ROWS];
        for _epoch in 0..2 {
            for rows in pieces.clone() {
                let cached = read_rows_with(&file, rows.clone(), &pages).expect("plain");
                let fresh = read_rows(&file, rows.clone()).expect("plain");
                assert_eq!(cached.len(), fresh.len(), "{rows:?}");
                for (a, b) in cached.iter().zip(&fresh) {
                    assert_eq!(a.rows, b.rows);
                    for (x, y) in a.columns.iter().zip(&b.columns) {
                        assert_eq!(x.as_ptr(), y.as_ptr(), "the same bytes of the file");
                        assert_eq!(x.len(), y.len());
                    }
                }
            }
        }
        // One entry per leaf column, each all of the chunk's (about 16-row) pages.
        let cached = pages.lock();
        assert_eq!(cached.len(), 3);
        for runs in cached.values() {
            let runs = runs.as_ref().expect("every page reads plain");
            assert_eq!(runs.iter().map(|r| r.rows).sum::<usize>(), ROWS);
            assert!(runs.len() > 1, "several pages");
        }
        drop(cached);
        // A hit does not read again.
        let hit = pages.runs(&file, 0, 0, || panic!("read again")).unwrap();
        assert!(hit.is_some());
    }

    #[test]
    fn a_chunk_with_a_page_that_is_not_plain_is_read_per_piece_and_compressed_ones_not_kept() {
        let props = plain(WriterVersion::PARQUET_1_0, Compression::UNCOMPRESSED);
        let file = write(&table(Some(90), None), props);
        let pages = PageCache::default();
        for _ in 0..2 {
            assert!(read_rows_with(&file, 0..64, &pages).is_some());
            assert!(read_rows_with(&file, 0..ROWS, &pages).is_none());
        }
        let cached = pages.lock();
        assert!(
            cached[&(0, 0)].is_some() && cached[&(0, 1)].is_none(),
            "x has a null"
        );
        drop(cached);
        let snappy = plain(WriterVersion::PARQUET_1_0, Compression::SNAPPY);
        let file = write(&table(None, None), snappy);
        let pages = PageCache::default();
        assert!(read_rows_with(&file, 0..ROWS, &pages).is_some());
        assert!(pages.lock().is_empty(), "decompressed pages are not kept");
    }

    #[test]
    fn other_pages_go_to_the_arrow_reader() {
        let version = WriterVersion::PARQUET_1_0;
        let props = || plain(version, Compression::UNCOMPRESSED);
        assert!(read_rows(&write(&table(Some(40), None), props()), 0..ROWS).is_none());
        assert!(read_rows(&write(&table(None, Some(40)), props()), 0..ROWS).is_none());
        // Nulls and ragged rows in pages outside the rows read do not matter.
        assert!(read_rows(&write(&table(Some(90), Some(90)), props()), 0..64).is_some());
        let dictionary = WriterProperties::builder().build();
        assert!(read_rows(&write(&table(None, None), dictionary), 0..ROWS).is_none());
    }

    /// RLE run header + value.
    fn rle(count: u64, value: u8) -> Vec<u8> {
        let mut out = Vec::new();
        let mut header = count << 1;
        loop {
            let byte = (header & 0x7f) as u8;
            header >>= 7;
            if header == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        }
        out.push(value);
        out
    }

    /// A bit-packed run of 1-bit `values` (padded to groups of 8).
    fn packed(values: &[u8]) -> Vec<u8> {
        let groups = values.len().div_ceil(8);
        let mut out = vec![((groups as u8) << 1) | 1];
        let mut bytes = vec![0u8; groups];
        for (k, &v) in values.iter().enumerate() {
            bytes[k / 8] |= v << (k % 8);
        }
        out.extend(bytes);
        out
    }

    #[test]
    fn constant_levels_accept_only_the_constant() {
        let all = Expected::Constant(1);
        assert!(hybrid_matches(&rle(1000, 1), 1, 1000, &all));
        assert!(!hybrid_matches(&rle(1000, 0), 1, 1000, &all));
        let mut split = rle(500, 1);
        split.extend(packed(&[1; 16]));
        split.extend(rle(484, 1));
        assert!(hybrid_matches(&split, 1, 1000, &all));
        let mut one_null = rle(500, 1);
        let mut bits = [1u8; 16];
        bits[3] = 0;
        one_null.extend(packed(&bits));
        one_null.extend(rle(484, 1));
        assert!(!hybrid_matches(&one_null, 1, 1000, &all));
        // Too short: the data ends before `count` levels.
        assert!(!hybrid_matches(&rle(999, 1), 1, 1000, &all));
    }

    #[test]
    fn row_starts_accept_exactly_rows_of_n() {
        let rows_of_4 = Expected::RowStarts(4);
        // 0,1,1,1 | 0,1,1,1 bit-packed, then RLE 0 / RLE 1x3 for a third row.
        let mut data = packed(&[0, 1, 1, 1, 0, 1, 1, 1]);
        data.extend(rle(1, 0));
        data.extend(rle(3, 1));
        assert!(hybrid_matches(&data, 1, 12, &rows_of_4));
        // A row of 5 then one of 3: same count, wrong shape.
        let mut ragged = packed(&[0, 1, 1, 1, 1, 0, 1, 1]);
        ragged.extend(rle(1, 0));
        ragged.extend(rle(3, 1));
        assert!(!hybrid_matches(&ragged, 1, 12, &rows_of_4));
        // An RLE run of ones crossing a row start.
        let mut crossing = rle(1, 0);
        crossing.extend(rle(4, 1));
        assert!(!hybrid_matches(&crossing, 1, 5, &rows_of_4));
        // Rows of one element: every level 0.
        assert!(hybrid_matches(&rle(7, 0), 1, 7, &Expected::RowStarts(1)));
    }

    #[test]
    fn bit_widths_cover_the_maximum() {
        assert_eq!(bit_width(1), 1);
        assert_eq!(bit_width(2), 2);
        assert_eq!(bit_width(3), 2);
        assert_eq!(bit_width(4), 3);
    }

    /// The resident size of the mapping that starts at `start`, from /proc/self/smaps: the
    /// pages this process has mapped in.
    #[cfg(target_os = "linux")]
    fn mapped_kib(start: usize) -> usize {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut lines = smaps.lines();
        while let Some(line) = lines.next() {
            let begin = line.split('-').next().unwrap_or("");
            if usize::from_str_radix(begin, 16).ok() == Some(start) {
                let rss = lines.find(|l| l.starts_with("Rss:")).unwrap();
                return rss.split_whitespace().nth(1).unwrap().parse().unwrap();
            }
        }
        panic!("no mapping at {start:#x}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn map_in_maps_every_page_of_the_range_and_none_outside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        std::fs::write(&path, vec![7u8; 4 << 20]).unwrap();
        std::fs::read(&path).unwrap(); // in the page cache
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: the test's own file, not changed while mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let bytes = Bytes::from_owner(map);
        let start = bytes.as_ptr() as usize;
        assert_eq!(mapped_kib(start), 0, "nothing is mapped before");
        // 1 MiB + 100 bytes from 512 KiB + 100 on (257 pages): 17 windows of 64 KiB touched, each
        // mapping its pages (or, for a large folio of the page cache, the whole folio).
        map_in(&bytes, &bytes[(512 << 10) + 100..(1536 << 10) + 200]);
        let kib = mapped_kib(start);
        assert!(
            (1028..=2048).contains(&kib),
            "the range's pages are mapped in: {kib} KiB"
        );
        let far = &bytes[3 << 20..(3 << 20) + 4096];
        map_in(&Bytes::from(vec![0u8; 4096]), far);
        assert_eq!(
            mapped_kib(start),
            kib,
            "bytes outside the file are left alone"
        );
    }
}
