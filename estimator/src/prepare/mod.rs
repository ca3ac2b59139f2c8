//! Preparation of non-Spark sources: Parquet/CSV paths or in-memory Arrow data become
//! Horovod's `intermediate_train_data.<idx>` / `intermediate_val_data.<idx>` in a store.
//!
//! DataFusion reads the source (any store kolo-store reaches), projects the feature, label
//! and sample-weight columns and counts rows and nulls; one ordered scan then splits the rows
//! (seeded by row position, or by a column) and writes exactly
//! `num_processes × partitions_per_process` train files whose row counts differ by at most
//! one. A `_SUCCESS` marker is written last.
//!
//! ```
//! use std::sync::Arc;
//! use arrow::array::{Float64Array, Int64Array};
//! use arrow::datatypes::{DataType, Field, Schema};
//! use arrow::record_batch::RecordBatch;
//! use kolo_estimator::prepare::{prepare_data, PrepareOptions, Source, Validation};
//! use kolo_store::{Store, StoreOptions};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let schema = Arc::new(Schema::new(vec![
//!     Field::new("x", DataType::Float64, false),
//!     Field::new("y", DataType::Int64, false),
//! ]));
//! let batch = RecordBatch::try_new(
//!     schema.clone(),
//!     vec![
//!         Arc::new(Float64Array::from_iter_values((0..100).map(f64::from))),
//!         Arc::new(Int64Array::from_iter_values(0..100)),
//!     ],
//! )?;
//! let dir = tempfile::tempdir()?;
//! let store = Store::open(dir.path().to_str().unwrap(), &StoreOptions::default())?;
//! let mut options = PrepareOptions::new(vec!["x".into()], vec!["y".into()]);
//! options.validation = Some(Validation::Ratio(0.2));
//! options.num_processes = 2;
//! options.partitions_per_process = 2;
//! let source = Source::Batches { schema, batches: vec![batch] };
//! let prepared = kolo_runtime::block_on(prepare_data(&store, source, &options))??;
//! assert_eq!(prepared.train_rows + prepared.val_rows, 100);
//! assert_eq!(prepared.train_files, 4);
//! # Ok(())
//! # }
//! ```

mod columns;
mod options;
mod source;
mod split;
mod writer;

use std::sync::Arc;

use arrow::array::{Array, AsArray, BooleanArray, RecordBatch};
use arrow::compute::{cast, filter_record_batch, not};
use arrow::datatypes::{DataType, Int64Type, Schema};
use bytes::Bytes;
use datafusion::functions_aggregate::expr_fn::{count, sum};
use datafusion::prelude::{ident, lit, DataFrame, Expr, SessionConfig, SessionContext};
use futures::StreamExt;
use kolo_store::{layout, Store};

pub use columns::ColumnInfo;
pub use options::{PrepareOptions, Validation};
pub use source::Source;

use crate::error::{Error, Result};
use columns::{check_column, Role, ShapeTracker};
use source::query_error;
use split::{balanced_plan, validation_files, RatioSplit};
use writer::BalancedWriter;

/// The marker written into each output directory once all its files are complete.
pub const SUCCESS_MARKER: &str = "_SUCCESS";

/// What [`prepare_data`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedData {
    /// The dataset index in the store.
    pub dataset_idx: usize,
    /// URL of the train directory (`<prefix>/intermediate_train_data.<idx>`).
    pub train_url: String,
    /// URL of the validation directory, when there is a validation split.
    pub val_url: Option<String>,
    /// Rows written for training.
    pub train_rows: u64,
    /// Rows written for validation.
    pub val_rows: u64,
    /// The written columns in order, with dtype and shape.
    pub columns: Vec<ColumnInfo>,
    /// Train files written (`num_processes × partitions_per_process`, fewer only when there
    /// are fewer train rows).
    pub train_files: usize,
    /// Validation files written.
    pub val_files: usize,
}

/// What the counting pass found.
#[derive(Debug)]
struct Counts {
    rows: u64,
    /// Nulls per output column, in output order.
    nulls: Vec<u64>,
    /// Nulls and true values of the validation column.
    validation: Option<(u64, u64)>,
}

/// Reads `source`, checks and splits it, and writes the prepared dataset into `store`.
pub async fn prepare_data(
    store: &Store,
    source: Source,
    options: &PrepareOptions,
) -> Result<PreparedData> {
    options.check()?;
    let source_name = source.describe();
    let ctx = session();
    let frame = source.into_dataframe(&ctx).await?;

    let keep = options.output_columns();
    let validation_column = match &options.validation {
        Some(Validation::Column(c)) => Some(c.clone()),
        _ => None,
    };
    check_columns(
        frame.schema().as_arrow(),
        options,
        validation_column.as_deref(),
        &source_name,
    )?;
    let mut projection: Vec<Expr> = keep.iter().map(ident).collect();
    projection.extend(validation_column.iter().map(ident));
    let frame = frame
        .select(projection)
        .map_err(|e| query_error("selecting columns of", &source_name, e))?;

    let counts = count_rows(&frame, &keep, validation_column.as_deref(), &source_name).await?;
    check_counts(&counts, &keep, validation_column.as_deref(), &source_name)?;
    let ratio_split = match options.validation {
        Some(Validation::Ratio(r)) if r > 0.0 => Some(RatioSplit::new(r, options.seed)),
        _ => None,
    };
    let has_validation = ratio_split.is_some() || validation_column.is_some();
    let val_rows = match (&ratio_split, &counts.validation) {
        (Some(split), _) => split.count_validation(counts.rows),
        (None, Some((_, true_rows))) => *true_rows,
        (None, None) => 0,
    };
    let train_rows = counts.rows - val_rows;
    check_split(options, counts.rows, train_rows, val_rows, has_validation)?;

    let dataset_idx = match options.dataset_idx {
        Some(idx) => idx,
        None => next_free_index(store).await?,
    };
    let train_dir = layout::train_data(Some(dataset_idx));
    let val_dir = layout::val_data(Some(dataset_idx));
    clear_output(store, &[&train_dir, &val_dir], options.overwrite).await?;

    let train_plan = balanced_plan(train_rows, options.num_files());
    if train_plan.len() < options.num_files() {
        log::warn!(
            "only {train_rows} train rows for the {} files asked (num_processes {} × \
             partitions_per_process {}); writing {} files of one row",
            options.num_files(),
            options.num_processes,
            options.partitions_per_process,
            train_plan.len()
        );
    }
    let val_plan = if has_validation {
        let files = validation_files(
            train_plan.len(),
            options.num_processes,
            val_rows,
            counts.rows,
        );
        balanced_plan(val_rows, files)
    } else {
        Vec::new()
    };
    let fields = frame.schema().as_arrow().fields()[..keep.len()].to_vec();
    let out_schema = Arc::new(Schema::new(fields));
    let codec = options.codec()?;
    let job = WriteJob {
        out_schema: out_schema.clone(),
        shapes: ShapeTracker::new(&out_schema),
        train: BalancedWriter::new(
            store.clone(),
            train_dir.clone(),
            out_schema.clone(),
            codec,
            train_plan,
        ),
        val: BalancedWriter::new(store.clone(), val_dir.clone(), out_schema, codec, val_plan),
        ratio_split,
        by_column: validation_column.is_some(),
        total: counts.rows,
        source_name,
    };
    let (train_files, val_files, columns) = match job.run(frame).await {
        Ok(written) => written,
        Err(err) => {
            // Leave no partial dataset behind; the error that stopped the writing wins.
            for dir in [&train_dir, &val_dir] {
                if let Err(cleanup) = store.delete(dir).await {
                    log::warn!("could not remove the partial output {dir}: {cleanup}");
                }
            }
            return Err(err);
        }
    };
    if has_validation {
        store
            .put_atomic(&format!("{val_dir}/{SUCCESS_MARKER}"), Bytes::new())
            .await?;
    }
    store
        .put_atomic(&format!("{train_dir}/{SUCCESS_MARKER}"), Bytes::new())
        .await?;
    log::info!(
        "prepared {train_rows} train rows in {} files at {}{}",
        train_files,
        store.url_of(&train_dir),
        if has_validation {
            format!(
                ", {val_rows} validation rows in {} files at {}",
                val_files,
                store.url_of(&val_dir)
            )
        } else {
            String::new()
        }
    );
    Ok(PreparedData {
        dataset_idx,
        train_url: store.url_of(&train_dir),
        val_url: has_validation.then(|| store.url_of(&val_dir)),
        train_rows,
        val_rows,
        columns,
        train_files,
        val_files,
    })
}

/// A DataFusion session whose scans run as one ordered stream, so the row order (and with
/// it the seeded split and the file contents) is the same on every run and machine.
fn session() -> SessionContext {
    let config = SessionConfig::new()
        .with_target_partitions(1)
        .with_repartition_file_scans(false);
    SessionContext::new_with_config(config)
}

/// Checks that every named column exists in `source` and has a usable type.
fn check_columns(
    schema: &Schema,
    options: &PrepareOptions,
    validation_column: Option<&str>,
    source: &str,
) -> Result<()> {
    let roles = options
        .feature_columns
        .iter()
        .map(|c| (c.as_str(), Role::Feature))
        .chain(
            options
                .label_columns
                .iter()
                .map(|c| (c.as_str(), Role::Label)),
        )
        .chain(
            options
                .sample_weight_col
                .iter()
                .map(|c| (c.as_str(), Role::SampleWeight)),
        )
        .chain(validation_column.map(|c| (c, Role::Validation)));
    for (column, role) in roles {
        check_column(schema, column, role, source)?;
    }
    Ok(())
}

/// Counts rows, nulls per column and validation rows in one aggregate query.
async fn count_rows(
    frame: &DataFrame,
    keep: &[String],
    validation_column: Option<&str>,
    source_name: &str,
) -> Result<Counts> {
    let mut aggregates = vec![count_all()];
    aggregates.extend(keep.iter().map(|c| count_expr(ident(c))));
    if let Some(c) = validation_column {
        aggregates.push(count_expr(ident(c)));
        let as_int = datafusion::prelude::cast(
            datafusion::prelude::cast(ident(c), DataType::Boolean),
            DataType::Int64,
        );
        aggregates.push(sum(as_int));
    }
    let aliased: Vec<Expr> = aggregates
        .into_iter()
        .enumerate()
        .map(|(i, e)| e.alias(format!("kolo_count_{i}")))
        .collect();
    let batches = frame
        .clone()
        .aggregate(vec![], aliased)
        .map_err(|e| query_error("counting rows of", source_name, e))?
        .collect()
        .await
        .map_err(|e| query_error("counting rows of", source_name, e))?;
    let batch = batches
        .iter()
        .find(|b| b.num_rows() > 0)
        .ok_or_else(|| Error::Internal("the count query returned no row".into()))?;
    let value = |i: usize| -> u64 {
        let column = batch.column(i);
        let column = cast(column, &DataType::Int64).ok();
        column
            .as_ref()
            .map(|c| c.as_primitive::<Int64Type>())
            .filter(|c| !c.is_null(0))
            .map_or(0, |c| c.value(0).max(0) as u64)
    };
    let rows = value(0);
    let nulls = (0..keep.len()).map(|i| rows - value(1 + i)).collect();
    let validation = validation_column.map(|_| {
        let at = 1 + keep.len();
        (rows - value(at), value(at + 1))
    });
    Ok(Counts {
        rows,
        nulls,
        validation,
    })
}

/// `count(*)`.
fn count_all() -> Expr {
    count_expr(lit(1u8))
}

/// `count(expr)`: the non-null values of `expr`.
fn count_expr(expr: Expr) -> Expr {
    count(expr)
}

/// Refuses an empty source and nulls in any written or validation column.
fn check_counts(
    counts: &Counts,
    keep: &[String],
    validation_column: Option<&str>,
    source_name: &str,
) -> Result<()> {
    if counts.rows == 0 {
        return Err(Error::EmptyDataset {
            what: format!("the source ({source_name})"),
            why: "it has no rows".into(),
            fix: "check the path and that the files hold data".into(),
        });
    }
    let nulls = keep
        .iter()
        .zip(&counts.nulls)
        .map(|(c, n)| (c.as_str(), *n))
        .chain(validation_column.zip(counts.validation.map(|(n, _)| n)));
    for (column, count) in nulls {
        if count > 0 {
            return Err(Error::NullValues {
                column: column.to_owned(),
                count,
                location: source_name.to_owned(),
                inside_lists: false,
            });
        }
    }
    Ok(())
}

/// Refuses a split that leaves train or validation without rows.
fn check_split(
    options: &PrepareOptions,
    rows: u64,
    train_rows: u64,
    val_rows: u64,
    has_validation: bool,
) -> Result<()> {
    let validation = match &options.validation {
        Some(Validation::Ratio(r)) => format!("validation={r}"),
        Some(Validation::Column(c)) => format!("validation column '{c}'"),
        None => String::new(),
    };
    if train_rows == 0 {
        return Err(Error::EmptyDataset {
            what: "the train split".into(),
            why: format!("{validation} took all {rows} rows"),
            fix: "use a smaller validation ratio, or mark fewer rows in the validation column"
                .into(),
        });
    }
    if has_validation && val_rows == 0 {
        return Err(Error::EmptyDataset {
            what: "the validation split".into(),
            why: format!("{validation} selected none of {rows} rows"),
            fix: "use a larger ratio or more data, or pass validation=None".into(),
        });
    }
    Ok(())
}

/// The smallest index above every existing `intermediate_{train,val}_data.<idx>`.
async fn next_free_index(store: &Store) -> Result<usize> {
    let listing = store
        .object_store()
        .list_with_delimiter(Some(&store.path("")?))
        .await
        .map_err(|source| {
            Error::Store(kolo_store::Error::Backend {
                operation: "list",
                url: store.url().to_owned(),
                source,
            })
        })?;
    let used = listing.common_prefixes.iter().filter_map(|p| {
        let name = p.filename()?;
        let (base, idx) = name.rsplit_once('.')?;
        (base == layout::TRAIN_DATA || base == layout::VAL_DATA)
            .then(|| idx.parse::<usize>().ok())
            .flatten()
    });
    Ok(used.max().map_or(0, |max| max + 1))
}

/// Removes earlier output at `dirs` (when `overwrite`), or refuses to touch it.
async fn clear_output(store: &Store, dirs: &[&str], overwrite: bool) -> Result<()> {
    for dir in dirs {
        if store.exists(dir).await? {
            if !overwrite {
                return Err(Error::OutputExists {
                    url: store.url_of(dir),
                });
            }
            log::info!("replacing the earlier dataset at {}", store.url_of(dir));
            store.delete(dir).await?;
        }
    }
    Ok(())
}

/// The writing pass: one ordered scan, split, and two balanced writers.
#[derive(Debug)]
struct WriteJob {
    out_schema: Arc<Schema>,
    shapes: ShapeTracker,
    train: BalancedWriter,
    val: BalancedWriter,
    ratio_split: Option<RatioSplit>,
    by_column: bool,
    total: u64,
    source_name: String,
}

impl WriteJob {
    /// Streams `frame` into the writers; returns the train and validation file counts and
    /// the written columns.
    async fn run(mut self, frame: DataFrame) -> Result<(usize, usize, Vec<ColumnInfo>)> {
        let mut stream = frame
            .execute_stream()
            .await
            .map_err(|e| query_error("scanning", &self.source_name, e))?;
        let mut offset = 0u64;
        while let Some(batch) = stream.next().await {
            let batch = batch.map_err(|e| query_error("scanning", &self.source_name, e))?;
            let rows = batch.num_rows() as u64;
            if rows == 0 {
                continue;
            }
            if offset + rows > self.total {
                return Err(self.changed());
            }
            self.write_batch(&batch, offset).await?;
            offset += rows;
        }
        if offset != self.total {
            return Err(self.changed());
        }
        let infos = self.shapes.infos();
        Ok((self.train.finish()?, self.val.finish()?, infos))
    }

    /// Splits one batch (rows `offset..`) and hands each side to its writer.
    async fn write_batch(&mut self, batch: &RecordBatch, offset: u64) -> Result<()> {
        let keep = self.out_schema.fields().len();
        let out = RecordBatch::try_new(self.out_schema.clone(), batch.columns()[..keep].to_vec())
            .map_err(|e| Error::Internal(format!("re-schema of a scanned batch: {e}")))?;
        self.shapes.observe(out.columns(), &self.source_name)?;
        let mask: Option<BooleanArray> = if let Some(split) = &self.ratio_split {
            Some(
                (0..out.num_rows() as u64)
                    .map(|i| Some(split.is_validation(offset + i)))
                    .collect(),
            )
        } else if self.by_column {
            let flags =
                cast(batch.column(keep), &DataType::Boolean).map_err(|source| Error::Arrow {
                    context: "reading the validation column",
                    source,
                })?;
            Some(flags.as_boolean().clone())
        } else {
            None
        };
        match mask {
            None => self.train.write(&out).await,
            Some(mask) => {
                let compute = |source| Error::Arrow {
                    context: "splitting a batch",
                    source,
                };
                let train_mask = not(&mask).map_err(compute)?;
                let train = filter_record_batch(&out, &train_mask).map_err(compute)?;
                let val = filter_record_batch(&out, &mask).map_err(compute)?;
                self.train.write(&train).await?;
                self.val.write(&val).await
            }
        }
    }

    /// The error for a source whose row count changed between the passes.
    fn changed(&self) -> Error {
        Error::SourceChanged {
            source_name: self.source_name.clone(),
            counted: self.total,
        }
    }
}
