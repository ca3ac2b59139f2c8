//! Dataset metadata from Parquet footers: files, rows, row groups, and per column its dtype and
//! shape (array lengths are checked by reading list columns once).
//!
//! A *dataset* is a directory (prefix) of Parquet files, as Spark writes it, or a single file.
//! Names starting with `_` or `.` (`_SUCCESS`, `.part-0.crc`, `_kolo_metadata.json`) are not
//! data; files are sorted by path. The metadata is cached next to the data in
//! `_kolo_metadata.json` (`_kolo_metadata.<file>.json` for a single file), written atomically
//! and keyed by the dataset's *fingerprint*: a hash of every data file's path, size, entity tag
//! and modification time, so a rewritten dataset is described afresh.
//!
//! ```no_run
//! use kolo_estimator::metadata::Dataset;
//!
//! # fn main() -> kolo_estimator::Result<()> {
//! let dataset = Dataset::open("/data/train", &Default::default())?;
//! let metadata = dataset.metadata()?;
//! println!("{} rows in {} files", metadata.rows, metadata.files.len());
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::UNIX_EPOCH;

use arrow::array::{Array, AsArray, GenericListArray, OffsetSizeTrait, RecordBatch};
use arrow::datatypes::{DataType, Schema};
use bytes::Bytes;
use kolo_store::{ObjectInfo, Store, StoreOptions};
use object_store::ObjectStoreExt;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::loader::columns::{classify, same_type, ColumnShape, SELECTED};
use crate::loader::source::{DataFile, FileReader};

/// The cache file's name in a dataset directory.
pub const METADATA_FILE: &str = "_kolo_metadata.json";
/// Version of the cache format; a cache of another version is recomputed.
const FORMAT_VERSION: u32 = 1;
/// Threads reading footers (and list columns) at once.
const MAX_SCAN_THREADS: usize = 8;

/// A dataset located in a store: its data files, sorted, and their fingerprint. Clones share
/// one [`FileReader`] per file, so each footer is read (and each local file mapped) at most
/// once, by whichever of the metadata scan and the loaders needs it first.
#[derive(Debug, Clone)]
pub struct Dataset {
    store: Store,
    url: String,
    files: Vec<DataFile>,
    readers: Arc<[FileReader]>,
    fingerprint: String,
    cache_rel: String,
}

impl Dataset {
    /// Lists the dataset at `location` (a directory/prefix of Parquet files or one file; local
    /// path or store URL).
    pub fn open(location: &str, options: &StoreOptions) -> Result<Dataset> {
        let store = Store::open(location, options)?;
        if let Some(path) = store.local_path("")? {
            return match std::fs::metadata(&path) {
                Ok(meta) if meta.is_file() => {
                    let parent = path.parent().unwrap_or(std::path::Path::new("/"));
                    let name = file_name(&path.to_string_lossy());
                    Self::single_file(Store::open(&parent.to_string_lossy(), options)?, &name)
                }
                Ok(_) => Self::directory(store),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                    Err(Error::DatasetNotFound {
                        location: store.url().to_string(),
                    })
                }
                Err(source) => Err(Error::ReadFile { path, source }),
            };
        }
        let listed = list_data_files(&store)?;
        if !listed.is_empty() {
            return Self::from_listing(store, listed, METADATA_FILE.to_string());
        }
        let head = kolo_runtime::block_on(store.object_store().head(&store.path("")?))?;
        match head {
            Ok(_) => {
                let url = store.url().to_string();
                let (parent, name) = url.rsplit_once('/').unwrap_or(("", url.as_str()));
                Self::single_file(Store::open(parent, options)?, name)
            }
            Err(object_store::Error::NotFound { .. }) => {
                if kolo_runtime::block_on(store.exists(""))?? {
                    Self::from_listing(store, Vec::new(), METADATA_FILE.to_string())
                } else {
                    Err(Error::DatasetNotFound {
                        location: store.url().to_string(),
                    })
                }
            }
            Err(source) => Err(Error::Store(kolo_store::Error::Backend {
                operation: "head",
                url: store.url().to_string(),
                source,
            })),
        }
    }

    fn directory(store: Store) -> Result<Dataset> {
        let listed = list_data_files(&store)?;
        Self::from_listing(store, listed, METADATA_FILE.to_string())
    }

    fn single_file(parent: Store, name: &str) -> Result<Dataset> {
        let listed: Vec<ObjectInfo> = kolo_runtime::block_on(parent.list(""))??
            .into_iter()
            .filter(|info| info.rel == name)
            .collect();
        if listed.is_empty() {
            return Err(Error::DatasetNotFound {
                location: parent.url_of(name),
            });
        }
        Self::from_listing(parent, listed, format!("_kolo_metadata.{name}.json"))
    }

    fn from_listing(store: Store, listed: Vec<ObjectInfo>, cache_rel: String) -> Result<Dataset> {
        let url = if listed.len() == 1 && cache_rel != METADATA_FILE {
            store.url_of(&listed[0].rel)
        } else {
            store.url().to_string()
        };
        if listed.is_empty() {
            return Err(Error::EmptyDataset {
                what: format!("the dataset {url}"),
                why: "it holds no data files; names starting with '_' or '.' are not data".into(),
                fix: "write Parquet files there first".into(),
            });
        }
        let fingerprint = fingerprint(&listed);
        let files: Vec<DataFile> = listed
            .into_iter()
            .map(|info| DataFile {
                url: store.url_of(&info.rel),
                rel: info.rel,
                size: info.size,
            })
            .collect();
        let readers = files
            .iter()
            .map(|file| FileReader::new(store.clone(), file.clone()))
            .collect();
        Ok(Dataset {
            store,
            url,
            files,
            readers,
            fingerprint,
            cache_rel,
        })
    }

    /// The dataset's URL (the directory, or the single file).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The store the data files are in.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The data files, sorted by path.
    pub fn files(&self) -> &[DataFile] {
        &self.files
    }

    /// One reader per data file (in [`Dataset::files`] order), shared by every clone of
    /// this dataset and every loader over it.
    pub fn readers(&self) -> &Arc<[FileReader]> {
        &self.readers
    }

    /// Hash of every data file's path, size, entity tag and modification time.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The metadata: from the cache when its fingerprint matches, else read from the footers
    /// (and list columns) and cached. A cache that cannot be written (read-only dataset) is
    /// skipped with a warning.
    pub fn metadata(&self) -> Result<DatasetMetadata> {
        if let Some(cached) = self.cached() {
            return Ok(cached);
        }
        let metadata = self.compute()?;
        match serde_json::to_vec_pretty(&metadata) {
            Ok(json) => {
                let written = kolo_runtime::block_on(
                    self.store.put_atomic(&self.cache_rel, Bytes::from(json)),
                );
                match written {
                    Ok(Ok(())) => {}
                    Ok(Err(err)) => log::warn!("not caching the dataset metadata: {err}"),
                    Err(err) => log::warn!("not caching the dataset metadata: {err}"),
                }
            }
            Err(err) => log::warn!("not caching the dataset metadata: {err}"),
        }
        Ok(metadata)
    }

    fn cached(&self) -> Option<DatasetMetadata> {
        let bytes = match kolo_runtime::block_on(self.store.get(&self.cache_rel)) {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(kolo_store::Error::NotFound { .. })) => return None,
            Ok(Err(err)) => {
                log::debug!("no cached dataset metadata: {err}");
                return None;
            }
            Err(err) => {
                log::debug!("no cached dataset metadata: {err}");
                return None;
            }
        };
        match serde_json::from_slice::<DatasetMetadata>(&bytes) {
            Ok(metadata)
                if metadata.version == FORMAT_VERSION
                    && metadata.fingerprint == self.fingerprint
                    && metadata.url == self.url =>
            {
                Some(metadata)
            }
            Ok(_) => None,
            Err(err) => {
                log::warn!(
                    "ignoring the unreadable metadata cache {}: {err}",
                    self.cache_rel
                );
                None
            }
        }
    }

    /// Reads every footer and list column.
    fn compute(&self) -> Result<DatasetMetadata> {
        let readers = &self.readers[..];
        let footers = parallel(readers, |reader| {
            let metadata = reader.metadata()?;
            Ok(FileFooter::of(
                reader.file(),
                metadata.schema(),
                metadata.metadata(),
            ))
        })?;
        let schema = footers[0].schema.clone();
        for footer in &footers[1..] {
            check_schema(&schema, footer)?;
        }
        let mut columns: Vec<ColumnMetadata> = schema
            .fields()
            .iter()
            .enumerate()
            .map(|(i, field)| ColumnMetadata::new(field, &footers, i))
            .collect();
        let list_columns: Vec<usize> = columns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.problem.is_none() && c.shape.is_none())
            .map(|(i, _)| i)
            .collect();
        if !list_columns.is_empty() {
            let scans = parallel(readers, |reader| scan_lists(reader, &list_columns))?;
            for (scan, file) in scans.iter().zip(&self.files) {
                for (&column, lengths) in list_columns.iter().zip(scan) {
                    columns[column].add_list_scan(lengths, &file.url);
                }
            }
            for &column in &list_columns {
                if columns[column].shape.is_none() && columns[column].problem.is_none() {
                    // Every file was empty: no length to find.
                    columns[column].shape = Some(vec![0]);
                }
            }
        }
        let files: Vec<FileMetadata> = footers
            .iter()
            .map(|footer| FileMetadata {
                path: footer.file.rel.clone(),
                bytes: footer.file.size,
                rows: footer.row_groups.iter().sum(),
                row_groups: footer.row_groups.clone(),
            })
            .collect();
        Ok(DatasetMetadata {
            version: FORMAT_VERSION,
            url: self.url.clone(),
            fingerprint: self.fingerprint.clone(),
            rows: files.iter().map(|f| f.rows).sum(),
            bytes: files.iter().map(|f| f.bytes).sum(),
            files,
            columns,
        })
    }
}

/// What the dataset holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetMetadata {
    /// Cache format version.
    pub version: u32,
    /// The dataset's URL.
    pub url: String,
    /// See [`Dataset::fingerprint`].
    pub fingerprint: String,
    /// Rows in all files.
    pub rows: u64,
    /// Bytes of all files.
    pub bytes: u64,
    /// The data files, sorted by path.
    pub files: Vec<FileMetadata>,
    /// The columns, in the first file's order.
    pub columns: Vec<ColumnMetadata>,
}

impl DatasetMetadata {
    /// The metadata as JSON (the cache format).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| unreachable!("metadata serializes: {e}"))
    }

    /// The column named `name`.
    pub fn column(&self, name: &str) -> Option<&ColumnMetadata> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// Every row group as a range of global row indices (files in order, row groups in order),
    /// with its file and row-group index.
    pub fn row_groups(&self) -> Vec<RowGroupRef> {
        let mut start = 0;
        let mut out = Vec::new();
        for (file, meta) in self.files.iter().enumerate() {
            for (index, &rows) in meta.row_groups.iter().enumerate() {
                if rows > 0 {
                    out.push(RowGroupRef {
                        file,
                        row_group: index,
                        rows: start..start + rows,
                    });
                }
                start += rows;
            }
        }
        out
    }
}

/// A row group located in the global row index space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowGroupRef {
    /// Index of the file in [`DatasetMetadata::files`].
    pub file: usize,
    /// Index of the row group in its file.
    pub row_group: usize,
    /// Its global row indices.
    pub rows: Range<u64>,
}

/// One data file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileMetadata {
    /// Path relative to the dataset's store.
    pub path: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Rows.
    pub rows: u64,
    /// Rows of each row group.
    pub row_groups: Vec<u64>,
}

/// One column.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnMetadata {
    /// Name.
    pub name: String,
    /// The Arrow type, as Arrow prints it.
    pub arrow_type: String,
    /// Element dtype (numpy's name), when the column can be loaded.
    pub dtype: Option<String>,
    /// Shape of one row: `[]` for scalars, `[len]` for arrays; `None` when it cannot be loaded.
    pub shape: Option<Vec<u64>>,
    /// Uncompressed bytes of the column in all files.
    pub uncompressed_bytes: u64,
    /// Nulls counted (footer statistics for flat columns, the scan for list columns); `None`
    /// when a file has no statistics.
    pub null_count: Option<u64>,
    /// Why the column cannot be loaded, if it cannot.
    pub problem: Option<ColumnProblem>,
}

/// Why a column cannot be loaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ColumnProblem {
    /// Its type is not numeric (or an array of numbers).
    Unsupported {
        /// What to do instead.
        hint: String,
    },
    /// Its rows are arrays of different lengths.
    Ragged {
        /// The file with the odd length.
        file: String,
        /// The first length seen.
        expected: u64,
        /// The other length.
        found: u64,
    },
    /// It holds nulls.
    Nulls {
        /// The first file holding nulls.
        file: String,
        /// Nulls in that file.
        count: u64,
    },
}

impl ColumnProblem {
    /// The error to raise when the column `column` is selected for loading.
    pub fn to_error(&self, column: &str, arrow_type: &str) -> Error {
        match self {
            ColumnProblem::Unsupported { hint } => Error::UnsupportedColumn {
                role: SELECTED,
                column: column.to_string(),
                data_type: arrow_type.to_string(),
                hint: hint.clone(),
            },
            ColumnProblem::Ragged {
                file,
                expected,
                found,
            } => Error::RaggedColumn {
                column: column.to_string(),
                file: file.clone(),
                expected: *expected,
                found: *found,
            },
            ColumnProblem::Nulls { file, count } => Error::NullValues {
                column: column.to_string(),
                count: *count,
                location: file.clone(),
                inside_lists: false,
            },
        }
    }
}

impl ColumnMetadata {
    fn new(field: &arrow::datatypes::Field, footers: &[FileFooter], index: usize) -> Self {
        let mut column = ColumnMetadata {
            name: field.name().clone(),
            arrow_type: field.data_type().to_string(),
            dtype: None,
            shape: None,
            uncompressed_bytes: footers.iter().map(|f| f.columns[index].bytes).sum(),
            null_count: Some(0),
            problem: None,
        };
        match classify(field) {
            Ok(kind) => {
                column.dtype = Some(kind.dtype.name().to_string());
                column.shape = match kind.shape {
                    ColumnShape::Scalar => Some(vec![]),
                    ColumnShape::Fixed(len) => Some(vec![len]),
                    ColumnShape::List => None,
                };
            }
            Err(err) => {
                let hint = match err {
                    Error::UnsupportedColumn { hint, .. } => hint,
                    other => other.to_string(),
                };
                column.problem = Some(ColumnProblem::Unsupported { hint });
            }
        }
        if column.shape.as_ref().is_some_and(|s| s.is_empty()) {
            for footer in footers {
                match footer.columns[index].nulls {
                    Some(0) => {}
                    Some(count) => {
                        column.null_count = column.null_count.map(|n| n + count);
                        if column.problem.is_none() {
                            column.problem = Some(ColumnProblem::Nulls {
                                file: footer.file.url.clone(),
                                count,
                            });
                        }
                    }
                    None => column.null_count = None,
                }
            }
        } else if column.problem.is_some() || column.shape.is_some() {
            // Fixed-size lists and unsupported columns: nulls are checked when loading.
            column.null_count = None;
        }
        column
    }

    fn add_list_scan(&mut self, scan: &ListScan, file: &str) {
        self.null_count = self.null_count.map(|n| n + scan.nulls);
        if self.problem.is_some() {
            return;
        }
        if scan.nulls > 0 {
            self.problem = Some(ColumnProblem::Nulls {
                file: file.to_string(),
                count: scan.nulls,
            });
            return;
        }
        let Some(first) = scan.lengths.first().copied() else {
            return;
        };
        let expected = match &self.shape {
            Some(shape) => shape[0],
            None => {
                self.shape = Some(vec![first]);
                first
            }
        };
        if let Some(&found) = scan.lengths.iter().find(|&&len| len != expected) {
            self.shape = None;
            self.problem = Some(ColumnProblem::Ragged {
                file: file.to_string(),
                expected,
                found,
            });
        }
    }
}

/// What one footer says.
struct FileFooter {
    file: DataFile,
    schema: Schema,
    row_groups: Vec<u64>,
    /// Per top-level column.
    columns: Vec<FooterColumn>,
}

struct FooterColumn {
    bytes: u64,
    /// Nulls by the statistics of a flat column (`None` without statistics or when nested).
    nulls: Option<u64>,
}

impl FileFooter {
    fn of(
        file: &DataFile,
        schema: &Schema,
        metadata: &parquet::file::metadata::ParquetMetaData,
    ) -> Self {
        let descr = metadata.file_metadata().schema_descr();
        let roots = schema.fields().len();
        let mut columns: Vec<FooterColumn> = (0..roots)
            .map(|_| FooterColumn {
                bytes: 0,
                nulls: Some(0),
            })
            .collect();
        let mut leaves_per_root = vec![0usize; roots];
        for leaf in 0..descr.num_columns() {
            let root = descr.get_column_root_idx(leaf);
            if root < roots {
                leaves_per_root[root] += 1;
            }
        }
        for group in metadata.row_groups() {
            for (leaf, chunk) in group.columns().iter().enumerate() {
                let root = descr.get_column_root_idx(leaf);
                let Some(column) = columns.get_mut(root) else {
                    continue;
                };
                column.bytes += u64::try_from(chunk.uncompressed_size()).unwrap_or(0);
                let flat = leaves_per_root[root] == 1 && descr.column(leaf).max_rep_level() == 0;
                column.nulls = match (column.nulls, flat, chunk.statistics()) {
                    (Some(n), true, Some(stats)) => stats.null_count_opt().map(|c| n + c),
                    _ => None,
                };
            }
        }
        FileFooter {
            file: file.clone(),
            schema: schema.clone(),
            row_groups: metadata
                .row_groups()
                .iter()
                .map(|g| u64::try_from(g.num_rows()).unwrap_or(0))
                .collect(),
            columns,
        }
    }
}

/// Every file must have the first file's columns, with the same types.
fn check_schema(first: &Schema, footer: &FileFooter) -> Result<()> {
    for field in first.fields() {
        let found = match footer.schema.field_with_name(field.name()) {
            Ok(other) if same_type(field.data_type(), other.data_type()) => continue,
            Ok(other) => other.data_type().to_string(),
            Err(_) => "missing".to_string(),
        };
        return Err(Error::SchemaDiffers {
            column: field.name().clone(),
            file: footer.file.url.clone(),
            expected: field.data_type().to_string(),
            found,
        });
    }
    Ok(())
}

/// Lengths and nulls of one list column in one file.
#[derive(Debug, Default)]
struct ListScan {
    /// The distinct lengths found, first seen first.
    lengths: Vec<u64>,
    nulls: u64,
}

/// Reads the list columns `columns` (top-level indices) of one file and collects lengths.
fn scan_lists(reader: &FileReader, columns: &[usize]) -> Result<Vec<ListScan>> {
    let metadata = reader.metadata()?;
    let names: Vec<String> = columns
        .iter()
        .map(|&i| metadata.schema().field(i).name().clone())
        .collect();
    let groups = metadata.metadata().num_row_groups();
    let mut scans: Vec<ListScan> = columns.iter().map(|_| ListScan::default()).collect();
    for group in 0..groups {
        let rows = usize::try_from(metadata.metadata().row_group(group).num_rows()).unwrap_or(0);
        for batch in reader.read(columns, group, 0..rows, 65_536)? {
            scan_batch(&batch, &names, &mut scans);
        }
    }
    Ok(scans)
}

fn scan_batch(batch: &RecordBatch, names: &[String], scans: &mut [ListScan]) {
    for (name, scan) in names.iter().zip(scans.iter_mut()) {
        let Some(column) = batch.column_by_name(name) else {
            continue;
        };
        let (nulls, values_nulls) = match column.data_type() {
            DataType::List(_) => scan_list(column.as_list::<i32>(), scan),
            DataType::LargeList(_) => scan_list(column.as_list::<i64>(), scan),
            _ => continue,
        };
        scan.nulls += (nulls + values_nulls) as u64;
    }
}

/// Notes the row lengths of one list array; returns its null rows and null elements.
fn scan_list<O: OffsetSizeTrait>(
    list: &GenericListArray<O>,
    scan: &mut ListScan,
) -> (usize, usize) {
    note_lengths(
        scan,
        list.value_offsets()
            .windows(2)
            .map(|w| (w[1] - w[0]).as_usize() as u64),
    );
    (list.null_count(), list.values().null_count())
}

fn note_lengths(scan: &mut ListScan, lengths: impl Iterator<Item = u64>) {
    for len in lengths {
        if !scan.lengths.contains(&len) {
            scan.lengths.push(len);
            if scan.lengths.len() > 1 {
                return;
            }
        }
    }
}

/// Runs `work` on every reader, a few at a time, keeping the order; the first error wins.
fn parallel<T: Send>(
    readers: &[FileReader],
    work: impl Fn(&FileReader) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let threads = readers.len().clamp(1, MAX_SCAN_THREADS);
    let next = AtomicUsize::new(0);
    let results: Mutex<BTreeMap<usize, Result<T>>> = Mutex::new(BTreeMap::new());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(reader) = readers.get(index) else {
                    break;
                };
                let result = work(reader);
                let failed = result.is_err();
                results
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(index, result);
                if failed {
                    next.store(readers.len(), Ordering::Relaxed);
                }
            });
        }
    });
    let results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut out = Vec::with_capacity(readers.len());
    for (_, result) in results {
        out.push(result?);
    }
    if out.len() != readers.len() {
        return Err(Error::Internal("a metadata scan thread ended early".into()));
    }
    Ok(out)
}

/// The data files under `store`, sorted by path, hidden names (`_*`, `.*`) left out.
fn list_data_files(store: &Store) -> Result<Vec<ObjectInfo>> {
    let mut listed: Vec<ObjectInfo> = kolo_runtime::block_on(store.list(""))??
        .into_iter()
        .filter(|info| {
            !info.rel.is_empty()
                && info
                    .rel
                    .split('/')
                    .all(|part| !part.starts_with('_') && !part.starts_with('.'))
        })
        .collect();
    listed.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(listed)
}

fn file_name(path: &str) -> String {
    path.rsplit(['/', '\\']).next().unwrap_or(path).to_string()
}

/// FNV-1a (64 bit) over every file's path, size, entity tag and modification time.
fn fingerprint(files: &[ObjectInfo]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for &b in bytes {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for file in files {
        let modified = file
            .last_modified
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        feed(file.rel.as_bytes());
        feed(&[0]);
        feed(&file.size.to_le_bytes());
        feed(file.e_tag.as_deref().unwrap_or("").as_bytes());
        feed(&[0]);
        feed(&modified.to_le_bytes());
    }
    format!("{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    fn info(rel: &str, size: u64, secs: u64) -> ObjectInfo {
        ObjectInfo {
            rel: rel.into(),
            size,
            e_tag: None,
            last_modified: SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
        }
    }

    #[test]
    fn fingerprint_follows_paths_sizes_and_times() {
        let base = fingerprint(&[info("a", 1, 1), info("b", 2, 2)]);
        assert_eq!(base, fingerprint(&[info("a", 1, 1), info("b", 2, 2)]));
        assert_ne!(base, fingerprint(&[info("a", 1, 1), info("b", 3, 2)]));
        assert_ne!(base, fingerprint(&[info("a", 1, 1), info("b", 2, 3)]));
        assert_ne!(base, fingerprint(&[info("a", 1, 1), info("c", 2, 2)]));
        assert_ne!(base, fingerprint(&[info("a", 1, 1)]));
    }

    #[test]
    fn list_lengths_stop_at_the_second() {
        let mut scan = ListScan::default();
        note_lengths(&mut scan, [3, 3, 4, 5].into_iter());
        assert_eq!(scan.lengths, vec![3, 4]);
    }
}
