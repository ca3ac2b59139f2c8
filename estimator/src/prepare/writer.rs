//! Writes a stream of batches into a fixed number of Parquet files holding planned row counts.

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use kolo_store::Store;
use object_store::buffered::BufWriter;
use parquet::arrow::AsyncArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

use crate::error::{Error, Result};

/// Largest row group, in encoded bytes, before the writer starts a new one (Spark's
/// `parquet.block.size`), so wide rows never hold more than this in memory per file.
const MAX_ROW_GROUP_BYTES: usize = 128 << 20;

/// The name of output file `index`: `part-00000.parquet`, ...
pub(crate) fn file_name(index: usize) -> String {
    format!("part-{index:05}.parquet")
}

/// Fills `plan.len()` files in order: file `i` gets exactly `plan[i]` rows, taken in the
/// order the batches arrive. One file is open at a time.
pub(crate) struct BalancedWriter {
    store: Store,
    dir: String,
    schema: SchemaRef,
    properties: WriterProperties,
    plan: Vec<u64>,
    file: usize,
    rows_in_file: u64,
    open: Option<AsyncArrowWriter<BufWriter>>,
}

impl std::fmt::Debug for BalancedWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BalancedWriter")
            .field("dir", &self.dir)
            .field("plan", &self.plan)
            .field("file", &self.file)
            .field("rows_in_file", &self.rows_in_file)
            .finish_non_exhaustive()
    }
}

impl BalancedWriter {
    /// A writer of `plan.len()` files under `dir` (relative to the store prefix).
    pub(crate) fn new(
        store: Store,
        dir: String,
        schema: SchemaRef,
        compression: Compression,
        plan: Vec<u64>,
    ) -> Self {
        // PLAIN pages without a dictionary: the loader uses such pages of numeric columns
        // without decoding them (see `loader::plain`).
        let properties = WriterProperties::builder()
            .set_dictionary_enabled(false)
            .set_compression(compression)
            .set_max_row_group_bytes(Some(MAX_ROW_GROUP_BYTES))
            .set_created_by(format!("kolo {}", env!("CARGO_PKG_VERSION")))
            .build();
        Self {
            store,
            dir,
            schema,
            properties,
            plan,
            file: 0,
            rows_in_file: 0,
            open: None,
        }
    }

    /// The path of file `index` relative to the store prefix.
    fn rel(&self, index: usize) -> String {
        format!("{}/{}", self.dir, file_name(index))
    }

    /// Appends `batch`'s rows, closing each file when it holds its planned rows.
    pub(crate) async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let mut offset = 0;
        while offset < batch.num_rows() {
            let Some(&target) = self.plan.get(self.file) else {
                return Err(Error::Internal(format!(
                    "more rows arrived for {} than the {} planned",
                    self.dir,
                    self.plan.iter().sum::<u64>()
                )));
            };
            let take = ((target - self.rows_in_file) as usize).min(batch.num_rows() - offset);
            let rel = self.rel(self.file);
            if self.open.is_none() {
                let sink = BufWriter::new(self.store.object_store(), self.store.path(&rel)?);
                let writer = AsyncArrowWriter::try_new(
                    sink,
                    self.schema.clone(),
                    Some(self.properties.clone()),
                )
                .map_err(|source| self.write_error(&rel, source))?;
                self.open = Some(writer);
            }
            let writer = self.open.as_mut().expect("opened above");
            let result = writer.write(&batch.slice(offset, take)).await;
            result.map_err(|source| self.write_error(&rel, source))?;
            offset += take;
            self.rows_in_file += take as u64;
            if self.rows_in_file == target {
                self.close_file().await?;
            }
        }
        Ok(())
    }

    /// Finishes the open file and moves on to the next.
    async fn close_file(&mut self) -> Result<()> {
        let rel = self.rel(self.file);
        if let Some(writer) = self.open.take() {
            writer
                .close()
                .await
                .map_err(|source| self.write_error(&rel, source))?;
        }
        self.file += 1;
        self.rows_in_file = 0;
        Ok(())
    }

    /// Checks that every planned file was written in full; returns the file count.
    pub(crate) fn finish(self) -> Result<usize> {
        if self.file != self.plan.len() || self.open.is_some() {
            return Err(Error::Internal(format!(
                "{} got {} of its {} planned files (the source changed while it was read?)",
                self.dir,
                self.file,
                self.plan.len()
            )));
        }
        Ok(self.file)
    }

    /// Wraps a Parquet writer failure with the file's URL.
    fn write_error(&self, rel: &str, source: parquet::errors::ParquetError) -> Error {
        Error::WriteParquet {
            url: format!("{}/{rel}", self.store.url().trim_end_matches('/')),
            source,
        }
    }
}
