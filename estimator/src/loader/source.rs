//! Reading one Parquet data file: its footer, and row ranges of a row group for a projection.
//!
//! Local files are memory-mapped once and read through `bytes::Bytes` (no copies of compressed
//! pages, and the page cache is shared between processes); remote files go through
//! `ParquetObjectReader`, driven by the process-wide runtime from the calling (non-runtime)
//! thread.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use arrow::array::RecordBatch;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, TryStreamExt};
use kolo_store::Store;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder, RowSelection,
};
use parquet::arrow::async_reader::{AsyncFileReader, ParquetRecordBatchStreamBuilder};
use parquet::arrow::ProjectionMask;
use parquet::errors::ParquetError;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};

use crate::error::{Error, Result};
use crate::loader::decode::{Chunk, ColumnSpec};
use crate::loader::plain;

/// One data file of a dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataFile {
    /// Key relative to the dataset's store.
    pub rel: String,
    /// Full URL, for messages.
    pub url: String,
    /// Size in bytes.
    pub size: u64,
}

/// A data file opened for reading; footers and the local mapping are loaded once. A
/// [`Dataset`](crate::metadata::Dataset) keeps one per file and shares it between the metadata
/// scan and every loader over it, so a cold start reads each footer (and maps each local
/// file) once.
#[derive(Debug)]
pub struct FileReader {
    store: Store,
    file: DataFile,
    mapped: OnceLock<Bytes>,
    metadata: OnceLock<ArrowReaderMetadata>,
    /// Held while the footer or the mapping is loaded, so threads asking at once load it once.
    loading: Mutex<()>,
    footer_reads: AtomicUsize,
    opens: AtomicUsize,
    /// Per row group, the row ranges whose pages were mapped in (merged, in order): their
    /// page tables stay filled while the file is mapped, so later epochs skip the call.
    populated: Mutex<HashMap<usize, Vec<Range<usize>>>>,
    populates: AtomicUsize,
    /// The pages of the mapped file's uncompressed column chunks, once read.
    pages: plain::PageCache,
}

impl FileReader {
    /// A reader of `file` in `store`; nothing is read yet.
    pub fn new(store: Store, file: DataFile) -> Self {
        Self {
            store,
            file,
            mapped: OnceLock::new(),
            metadata: OnceLock::new(),
            loading: Mutex::new(()),
            footer_reads: AtomicUsize::new(0),
            opens: AtomicUsize::new(0),
            populated: Mutex::new(HashMap::new()),
            populates: AtomicUsize::new(0),
            pages: plain::PageCache::default(),
        }
    }

    /// How many times this reader has read the file's footer (once, after the first
    /// [`FileReader::metadata`]).
    pub fn footer_reads(&self) -> usize {
        self.footer_reads.load(Ordering::Relaxed)
    }

    /// How many times this reader has opened and mapped the (local) file.
    pub fn opens(&self) -> usize {
        self.opens.load(Ordering::Relaxed)
    }

    /// Whether `values` lie in this (local) file's mapping: bytes the loader reads where
    /// they are, rather than ones it decoded or fetched.
    pub fn is_mapped(&self, values: &[u8]) -> bool {
        self.mapped.get().is_some_and(|file| {
            let range = file.as_ptr_range();
            let inside = values.as_ptr_range();
            !values.is_empty() && range.start <= inside.start && inside.end <= range.end
        })
    }

    /// How many plain reads mapped their pages in ahead of the gather (the first read of
    /// each row range; see [`FileReader::read_plain`]).
    pub fn populates(&self) -> usize {
        self.populates.load(Ordering::Relaxed)
    }

    /// Whether rows `rows` of `row_group` are read plain for the first time (then recorded):
    /// only then are their pages mapped in ahead of the gather.
    fn first_read(&self, row_group: usize, rows: &Range<usize>) -> bool {
        let mut populated = self.populated.lock().unwrap_or_else(|e| e.into_inner());
        let ranges = populated.entry(row_group).or_default();
        if ranges
            .iter()
            .any(|r| r.start <= rows.start && rows.end <= r.end)
        {
            return false;
        }
        ranges.push(rows.clone());
        ranges.sort_unstable_by_key(|r| r.start);
        let mut merged: Vec<Range<usize>> = Vec::with_capacity(ranges.len());
        for range in ranges.drain(..) {
            match merged.last_mut() {
                Some(last) if range.start <= last.end => last.end = last.end.max(range.end),
                _ => merged.push(range),
            }
        }
        *ranges = merged;
        self.populates.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// The file.
    pub fn file(&self) -> &DataFile {
        &self.file
    }

    fn parquet_error(&self, source: ParquetError) -> Error {
        Error::ReadParquet {
            file: self.file.url.clone(),
            source,
        }
    }

    /// The whole file, mapped into memory, for local stores.
    fn local_bytes(&self) -> Result<Option<Bytes>> {
        let Some(path) = self.store.local_path(&self.file.rel)? else {
            return Ok(None);
        };
        if let Some(bytes) = self.mapped.get() {
            return Ok(Some(bytes.clone()));
        }
        let _loading = self.loading.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bytes) = self.mapped.get() {
            return Ok(Some(bytes.clone()));
        }
        self.opens.fetch_add(1, Ordering::Relaxed);
        let bytes = map_file(&path)?;
        Ok(Some(self.mapped.get_or_init(|| bytes).clone()))
    }

    fn object_reader(&self) -> Result<ObjectReader> {
        Ok(ObjectReader {
            store: self.store.object_store(),
            path: self.store.path(&self.file.rel)?,
            size: self.file.size,
        })
    }

    /// The file's footer with its Arrow schema (and offset index, if the file has one, so
    /// partial row groups skip pages instead of decoding them); loaded once.
    pub fn metadata(&self) -> Result<&ArrowReaderMetadata> {
        if let Some(metadata) = self.metadata.get() {
            return Ok(metadata);
        }
        // Mapping a local file takes this lock too: map it first.
        let local = self.local_bytes()?;
        let _loading = self.loading.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(metadata) = self.metadata.get() {
            return Ok(metadata);
        }
        let options = ArrowReaderOptions::new()
            .with_column_index_policy(PageIndexPolicy::Skip)
            .with_offset_index_policy(PageIndexPolicy::Optional);
        self.footer_reads.fetch_add(1, Ordering::Relaxed);
        let metadata = match local {
            Some(bytes) => ArrowReaderMetadata::load(&bytes, options),
            None => {
                let mut reader = self.object_reader()?;
                kolo_runtime::block_on(ArrowReaderMetadata::load_async(&mut reader, options))?
            }
        }
        .map_err(|e| self.parquet_error(e))?;
        Ok(self.metadata.get_or_init(|| metadata))
    }

    /// Rows `rows` of `row_group` for `specs` (top-level columns `roots`) from a local file:
    /// columns with PLAIN pages straight from the pages, without decoding or copying (see
    /// [`plain`]), the others decoded by the Arrow reader. `None` for remote files and when no
    /// column reads plain.
    pub fn read_plain(
        &self,
        roots: &[usize],
        specs: &[ColumnSpec],
        row_group: usize,
        rows: &Range<usize>,
    ) -> Result<Option<Vec<Chunk>>> {
        let Some(bytes) = self.local_bytes()? else {
            return Ok(None);
        };
        let metadata = self.metadata()?;
        let runs = plain::column_runs(
            &bytes,
            metadata.metadata(),
            metadata.schema(),
            roots,
            specs,
            row_group,
            rows,
            &self.pages,
        )
        .map_err(|e| self.parquet_error(e))?;
        if runs.iter().any(Option::is_some) && self.first_read(row_group, rows) {
            for run in runs.iter().flatten().flatten() {
                plain::map_in(&bytes, run.values.as_slice());
            }
        }
        let decode: Vec<usize> = (0..specs.len()).filter(|&k| runs[k].is_none()).collect();
        if decode.len() == specs.len() {
            return Ok(None);
        }
        let mut columns: Vec<Vec<plain::Run>> =
            runs.into_iter().map(Option::unwrap_or_default).collect();
        if !decode.is_empty() {
            let decode_roots: Vec<usize> = decode.iter().map(|&k| roots[k]).collect();
            let decode_specs: Vec<ColumnSpec> = decode.iter().map(|&k| specs[k].clone()).collect();
            let mut at = rows.start;
            for batch in self.read(&decode_roots, row_group, rows.clone(), rows.len())? {
                let n = batch.num_rows();
                if n == 0 {
                    continue;
                }
                let chunk = Chunk::from_batch(&batch, &decode_specs, &self.file.url)?;
                for (&k, values) in decode.iter().zip(chunk.columns) {
                    columns[k].push(plain::Run {
                        start: at,
                        rows: n,
                        values,
                    });
                }
                at += n;
            }
            if at != rows.end {
                return Err(Error::Internal(format!(
                    "decoded rows {}..{at} instead of {rows:?} from row group {row_group} of {}",
                    rows.start, self.file.url
                )));
            }
        }
        Ok(Some(plain::cut(&columns, rows)))
    }

    /// Reads `rows` (relative to the row group) of `row_group` for the columns `roots`
    /// (top-level column indices), as record batches of at most `batch_rows` rows.
    pub fn read(
        &self,
        roots: &[usize],
        row_group: usize,
        rows: Range<usize>,
        batch_rows: usize,
    ) -> Result<Vec<RecordBatch>> {
        let metadata = self.metadata()?.clone();
        let group_rows = usize::try_from(metadata.metadata().row_group(row_group).num_rows())
            .map_err(|_| Error::Internal("negative row count in a row group".into()))?;
        let projection = ProjectionMask::roots(metadata.parquet_schema(), roots.iter().copied());
        let selection = (rows.start > 0 || rows.end < group_rows).then(|| {
            RowSelection::from_consecutive_ranges(std::iter::once(rows.clone()), group_rows)
        });
        let batch_rows = batch_rows.max(1);
        match self.local_bytes()? {
            Some(bytes) => {
                let mut builder =
                    ParquetRecordBatchReaderBuilder::new_with_metadata(bytes, metadata)
                        .with_projection(projection)
                        .with_row_groups(vec![row_group])
                        .with_batch_size(batch_rows);
                if let Some(selection) = selection {
                    builder = builder.with_row_selection(selection);
                }
                let reader = builder.build().map_err(|e| self.parquet_error(e))?;
                reader
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|e| self.parquet_error(ParquetError::External(Box::new(e))))
            }
            None => {
                let mut builder = ParquetRecordBatchStreamBuilder::new_with_metadata(
                    self.object_reader()?,
                    metadata,
                )
                .with_projection(projection)
                .with_row_groups(vec![row_group])
                .with_batch_size(batch_rows);
                if let Some(selection) = selection {
                    builder = builder.with_row_selection(selection);
                }
                let stream = builder.build().map_err(|e| self.parquet_error(e))?;
                kolo_runtime::block_on(stream.try_collect::<Vec<_>>())?
                    .map_err(|e| self.parquet_error(e))
            }
        }
    }
}

/// Reads a remote Parquet file through `object_store` (byte ranges, footer by suffix).
#[derive(Debug)]
struct ObjectReader {
    store: Arc<dyn ObjectStore>,
    path: ObjectPath,
    size: u64,
}

fn store_error(source: object_store::Error) -> ParquetError {
    ParquetError::External(Box::new(source))
}

impl AsyncFileReader for ObjectReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move {
            self.store
                .get_range(&self.path, range)
                .await
                .map_err(store_error)
        }
        .boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        async move {
            self.store
                .get_ranges(&self.path, &ranges)
                .await
                .map_err(store_error)
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            let (column_index, offset_index) = options
                .map_or((PageIndexPolicy::Skip, PageIndexPolicy::Skip), |o| {
                    (o.column_index_policy(), o.offset_index_policy())
                });
            let size = self.size;
            let metadata = ParquetMetaDataReader::new()
                .with_column_index_policy(column_index)
                .with_offset_index_policy(offset_index)
                .with_prefetch_hint(Some(FOOTER_PREFETCH))
                .load_and_finish(self, size)
                .await?;
            Ok(Arc::new(metadata))
        }
        .boxed()
    }
}

/// Bytes fetched from the end of a remote file in the first request (footer and usually
/// the page index in one round trip).
const FOOTER_PREFETCH: usize = 256 << 10;

/// Maps `path` read-only into memory as `Bytes` (an empty file gives empty bytes).
fn map_file(path: &Path) -> Result<Bytes> {
    let io = |source| Error::ReadFile {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    if file.metadata().map_err(io)?.len() == 0 {
        return Ok(Bytes::new());
    }
    // SAFETY: the map is read-only and private to this process. Data files of a dataset are
    // written once (Spark, `prepare_data`) and not modified while training reads them; a file
    // truncated underneath would fault, as it would for any mmap reader (pyarrow's included).
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    Ok(Bytes::from_owner(map))
}
