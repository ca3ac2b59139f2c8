//! The Parquet loader: streams a rank's rows of a dataset, shuffles them (row-group order and a
//! windowed shuffle), cuts fixed-size batches and prefetches them on background threads.
//!
//! ```no_run
//! use std::time::Duration;
//! use kolo_estimator::loader::{Loader, LoaderOptions, Next};
//! use kolo_estimator::metadata::Dataset;
//!
//! # fn main() -> kolo_estimator::Result<()> {
//! let dataset = Dataset::open("/data/train", &Default::default())?;
//! let options = LoaderOptions::new(vec!["features".into(), "label".into()], 256);
//! let mut loader = Loader::open(&dataset, options)?;
//! loop {
//!     match loader.next(Duration::from_millis(100))? {
//!         Next::Batch(batch) => println!("{} rows", batch.rows),
//!         Next::EndOfEpoch(_) | Next::Finished => break,
//!         Next::Pending => continue,
//!     }
//! }
//! # Ok(())
//! # }
//! ```

pub mod assemble;
pub mod columns;
pub mod decode;
mod gather;
mod memory;
mod pipeline;
mod plain;
pub mod queue;
pub mod source;
mod split;
pub mod state;
mod workers;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

pub use assemble::{Batch, BatchBuffer, BatchView, Group};
pub use columns::DType;
pub use state::LoaderState;

use crate::error::{Error, Result};
use crate::metadata::{Dataset, DatasetMetadata};
use crate::plan::{EpochPlan, PlanConfig};
use decode::ColumnSpec;
use pipeline::{Context, Item, Pipeline};
use queue::Pop;
use state::{Current, Position, STATE_VERSION};

/// Default rows per shuffle window: at least this many and four batches, rounded up to whole
/// batches.
pub const DEFAULT_SHUFFLE_WINDOW: u64 = 16_384;
/// Decoded bytes aimed at per piece read by one decode thread.
const PIECE_BYTES: usize = 8 << 20;

/// How to load a dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoaderOptions {
    /// Columns to hand out, in order.
    pub columns: Vec<String>,
    /// Rows per batch.
    pub batch_size: u64,
    /// This rank.
    pub rank: u32,
    /// Number of ranks.
    pub size: u32,
    /// Shuffle row groups and rows within windows.
    pub shuffle: bool,
    /// Seed of every shuffle.
    pub seed: u64,
    /// Drop the remainder (`true`) or wrap around to fill it (`false`).
    pub drop_last: bool,
    /// Batches kept ready.
    pub prefetch: usize,
    /// Rows per shuffle window (default `max(16384, 4 * batch_size)` rounded up to a multiple of
    /// `batch_size`).
    pub shuffle_buffer_size: Option<u64>,
    /// Decode threads (default `min(4, available parallelism)`).
    pub num_threads: Option<usize>,
    /// Epochs to run (`None`: no end).
    pub num_epochs: Option<u64>,
    /// Hand out the scalar columns that share the first selected scalar column's dtype as one
    /// row-major `[rows, columns]` buffer (a model's feature matrix, one tensor per batch)
    /// instead of `[columns, rows]`; see [`Loader::stack_group`].
    pub stack: bool,
}

impl LoaderOptions {
    /// Rank 0 of 1, shuffled with seed 0, dropping the remainder, two batches prefetched.
    pub fn new(columns: Vec<String>, batch_size: u64) -> Self {
        Self {
            columns,
            batch_size,
            rank: 0,
            size: 1,
            shuffle: true,
            seed: 0,
            drop_last: true,
            prefetch: 2,
            shuffle_buffer_size: None,
            num_threads: None,
            num_epochs: None,
            stack: false,
        }
    }
}

/// What [`Loader::next`] found.
#[derive(Debug)]
pub enum Next {
    /// A batch.
    Batch(Batch),
    /// The epoch ended; the next call starts the next epoch.
    EndOfEpoch(u64),
    /// All `num_epochs` epochs ended.
    Finished,
    /// Nothing arrived within the timeout; call again.
    Pending,
}

/// A rank's loader over a dataset.
#[derive(Debug)]
pub struct Loader {
    context: Arc<Context>,
    url: String,
    fingerprint: String,
    window: u64,
    prefetch: usize,
    decoders: usize,
    position: Position,
    pipeline: Option<Pipeline>,
    batches_per_epoch: u64,
    rows_per_epoch: u64,
}

impl Loader {
    /// Checks the options and the columns against the dataset's metadata; no thread starts
    /// before the first [`Loader::next`].
    pub fn open(dataset: &Dataset, options: LoaderOptions) -> Result<Loader> {
        let metadata = dataset.metadata()?;
        Self::with_metadata(dataset, &metadata, options)
    }

    /// [`Loader::open`] with metadata already read.
    pub fn with_metadata(
        dataset: &Dataset,
        metadata: &DatasetMetadata,
        options: LoaderOptions,
    ) -> Result<Loader> {
        validate(&options)?;
        if metadata.rows == 0 {
            return Err(Error::EmptyDataset {
                what: format!("the dataset {}", metadata.url),
                why: format!("its {} data file(s) hold no rows", metadata.files.len()),
                fix: "write rows there first".into(),
            });
        }
        let specs = resolve_columns(metadata, &options.columns)?;
        let window = options.shuffle_buffer_size.unwrap_or_else(|| {
            // A multiple of the batch size, so batches never straddle two windows.
            let rows = DEFAULT_SHUFFLE_WINDOW.max(4 * options.batch_size);
            rows.div_ceil(options.batch_size) * options.batch_size
        });
        let config = PlanConfig {
            size: options.size,
            batch_size: options.batch_size,
            seed: options.seed,
            shuffle: options.shuffle,
            drop_last: options.drop_last,
            window,
        };
        let row_groups = metadata.row_groups();
        let ranges: Vec<_> = row_groups.iter().map(|g| g.rows.clone()).collect();
        let full = EpochPlan::new(&ranges, &config, 0, &[]).rank(options.rank);
        if full.batches() == 0 {
            return Err(Error::TooFewRows {
                url: metadata.url.clone(),
                rows: metadata.rows,
                size: options.size,
                batch_size: options.batch_size,
            });
        }
        let row_bytes: usize = specs.iter().map(ColumnSpec::row_bytes).sum();
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let decoders = options.num_threads.unwrap_or(cpus.min(4)).max(1);
        // Gathering a window on every core slowed the loader down: the caller's thread, which
        // turns batches into tensors, needs one of them.
        let assemble_threads = decoders.min(cpus.saturating_sub(1)).max(1);
        let mut groups = assemble::layout(&specs);
        let stack_group = if options.stack {
            Some(
                groups
                    .iter()
                    .position(|g| g.array_len.is_none())
                    .ok_or_else(|| {
                        Error::InvalidArgument(format!(
                            "stack needs a scalar column to stack, but the columns {:?} are all \
                             arrays (already one [rows, len] tensor each); drop stack",
                            options.columns
                        ))
                    })?,
            )
        } else {
            None
        };
        if let Some(g) = stack_group {
            groups[g].row_major = true;
        }
        let files = dataset.files();
        let context = Context {
            // The dataset's readers: footers read by the metadata scan are not read again.
            readers: Arc::clone(dataset.readers()),
            roots: files.iter().map(|_| OnceLock::new()).collect(),
            row_groups,
            groups,
            stack_group,
            specs,
            config,
            rank: options.rank,
            num_epochs: options.num_epochs,
            piece_rows: (PIECE_BYTES / row_bytes.max(1)).clamp(8192, 1 << 20),
            assemble_threads,
            windows_gathered_inline: AtomicU64::new(0),
            bytes_copied: AtomicU64::new(0),
        };
        Ok(Loader {
            context: Arc::new(context),
            url: metadata.url.clone(),
            fingerprint: dataset.fingerprint().to_string(),
            window,
            prefetch: options.prefetch.max(1),
            decoders,
            position: Position::default(),
            pipeline: None,
            batches_per_epoch: full.batches(),
            rows_per_epoch: full.delivered_rows(),
        })
    }

    /// The dataset's URL (the directory, or the single file).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The data files' readers: the dataset's own (shared with it and every loader over it),
    /// so footers read for the metadata are not read again.
    pub fn readers(&self) -> &Arc<[source::FileReader]> {
        &self.context.readers
    }

    /// Shuffle windows gathered on the loader's assembler thread while batches waited for
    /// them, since the loader was opened: the first window after each (re)start of the
    /// threads. Every other window, the next epoch's first ones included, is gathered ahead
    /// on the gather threads while the caller takes the batches before it.
    pub fn windows_gathered_inline(&self) -> u64 {
        self.context.windows_gathered_inline.load(Ordering::Relaxed)
    }

    /// Bytes the loader has written since it was opened: values decoded, decompressed or
    /// fetched into memory (values of plain, uncompressed pages of a local file are used
    /// where they lie in the mapped file, and are not counted), shuffle windows gathered
    /// (twice the rows' bytes for a row-major `stack` group: gathered, then transposed), and
    /// batches copied together from two windows. The passes over each byte the loader
    /// makes: for plain, uncompressed local files whose batches divide the shuffle window,
    /// one pass, `rows * row bytes` per epoch.
    pub fn bytes_copied(&self) -> u64 {
        self.context.bytes_copied.load(Ordering::Relaxed)
    }

    /// The output buffers of every batch, in order.
    pub fn groups(&self) -> &[Group] {
        &self.context.groups
    }

    /// The group (index into [`Loader::groups`]) handed out as a row-major
    /// `[rows, columns]` buffer when [`LoaderOptions::stack`] is set: the scalar columns of
    /// the first selected scalar column's dtype, in selection order.
    pub fn stack_group(&self) -> Option<usize> {
        self.context.stack_group
    }

    /// The selected columns.
    pub fn columns(&self) -> &[ColumnSpec] {
        &self.context.specs
    }

    /// Batches per (full) epoch; the same on every rank.
    pub fn batches_per_epoch(&self) -> u64 {
        self.batches_per_epoch
    }

    /// Rows handed out per (full) epoch by this rank.
    pub fn rows_per_epoch(&self) -> u64 {
        self.rows_per_epoch
    }

    /// The current epoch (the one the next batch belongs to).
    pub fn epoch(&self) -> u64 {
        self.position.epoch
    }

    /// Rows of the current epoch handed out so far.
    pub fn offset(&self) -> u64 {
        self.position.offset
    }

    /// Rows per shuffle window.
    pub fn shuffle_buffer_size(&self) -> u64 {
        self.window
    }

    /// Whether all `num_epochs` epochs are done.
    pub fn finished(&self) -> bool {
        self.context
            .num_epochs
            .is_some_and(|n| self.position.epoch >= n)
    }

    /// The next batch or event, waiting at most `timeout`. After an error the threads are
    /// gone; the next call starts them again from the current position.
    pub fn next(&mut self, timeout: Duration) -> Result<Next> {
        if self.finished() {
            return Ok(Next::Finished);
        }
        let pipeline = match &self.pipeline {
            Some(pipeline) => pipeline,
            None => self.pipeline.insert(Pipeline::start(
                Arc::clone(&self.context),
                self.position.clone(),
                self.prefetch,
                self.decoders,
            )?),
        };
        match pipeline.pop(timeout) {
            Pop::Item(Item::Batch(batch)) => {
                if batch.last {
                    self.position = Position {
                        epoch: batch.epoch + 1,
                        ..Position::default()
                    };
                } else {
                    if batch.epoch != self.position.epoch {
                        self.position.history.clear();
                    }
                    self.position.epoch = batch.epoch;
                    self.position.offset = batch.end_offset;
                }
                Ok(Next::Batch(batch))
            }
            Pop::Item(Item::EndOfEpoch(epoch)) => {
                if self.position.epoch <= epoch {
                    self.position = Position {
                        epoch: epoch + 1,
                        ..Position::default()
                    };
                }
                Ok(Next::EndOfEpoch(epoch))
            }
            Pop::Item(Item::Finished) => Ok(Next::Finished),
            Pop::Item(Item::Failed(err)) => {
                self.pipeline = None;
                Err(err)
            }
            Pop::Empty => Ok(Next::Pending),
            Pop::Closed => {
                self.pipeline = None;
                Err(Error::Internal(
                    "the loader's threads ended without a reason".into(),
                ))
            }
        }
    }

    /// Stops the background threads (the next [`Loader::next`] starts them again).
    pub fn stop(&mut self) {
        self.pipeline = None;
    }

    /// Where the loader stands (rows handed out, not prefetched).
    pub fn state(&self) -> LoaderState {
        let config = &self.context.config;
        LoaderState {
            version: STATE_VERSION,
            epoch: self.position.epoch,
            offset: self.position.offset,
            seed: config.seed,
            size: config.size,
            rank: self.context.rank,
            batch_size: config.batch_size,
            drop_last: config.drop_last,
            shuffle: config.shuffle,
            shuffle_buffer_size: config.window,
            fingerprint: self.fingerprint.clone(),
            history: self.position.history.clone(),
        }
    }

    /// Continues from `state` (saved by this or another rank, with this or another number of
    /// ranks): exactly where it stood with the same settings, else the rest of its epoch
    /// spread over this loader's ranks.
    pub fn load_state(&mut self, state: &LoaderState) -> Result<()> {
        let config = &self.context.config;
        let mut position = state.resume_position(&Current {
            seed: config.seed,
            shuffle: config.shuffle,
            size: config.size,
            batch_size: config.batch_size,
            drop_last: config.drop_last,
            window: config.window,
            fingerprint: &self.fingerprint,
            url: &self.url,
        })?;
        let plan = EpochPlan::new(
            &self.context.row_group_ranges(),
            config,
            position.epoch,
            &position.history,
        )
        .rank(self.context.rank);
        if position.offset > plan.delivered_rows() {
            return Err(Error::InvalidArgument(format!(
                "the loader state's offset {} is past the {} rows of its epoch",
                position.offset,
                plan.delivered_rows()
            )));
        }
        if position.offset == plan.delivered_rows() {
            position = Position {
                epoch: position.epoch + 1,
                ..Position::default()
            };
        }
        self.pipeline = None;
        self.position = position;
        Ok(())
    }
}

fn validate(options: &LoaderOptions) -> Result<()> {
    let invalid = |message: String| Err(Error::InvalidArgument(message));
    if options.batch_size == 0 {
        return invalid("batch_size must be at least 1".into());
    }
    if options.size == 0 {
        return invalid("size must be at least 1".into());
    }
    if options.rank >= options.size {
        return invalid(format!(
            "rank {} is out of range for size {}; ranks are 0..size-1",
            options.rank, options.size
        ));
    }
    if options.shuffle_buffer_size == Some(0)
        || options
            .shuffle_buffer_size
            .is_some_and(|w| w > u64::from(u32::MAX / 2))
    {
        return invalid("shuffle_buffer_size must be between 1 and 2**31 rows".into());
    }
    if options.num_threads == Some(0) {
        return invalid("num_threads must be at least 1".into());
    }
    if options.columns.is_empty() {
        return invalid("columns is empty; name the columns to load".into());
    }
    let mut seen = HashSet::new();
    if let Some(dup) = options.columns.iter().find(|c| !seen.insert(c.as_str())) {
        return invalid(format!("column '{dup}' is named twice in columns"));
    }
    Ok(())
}

/// Checks the asked-for columns against the metadata and describes each.
fn resolve_columns(metadata: &DatasetMetadata, columns: &[String]) -> Result<Vec<ColumnSpec>> {
    columns
        .iter()
        .map(|name| {
            let column = metadata.column(name).ok_or_else(|| Error::UnknownColumn {
                role: columns::SELECTED,
                column: name.clone(),
                dataset: format!("the dataset {}", metadata.url),
                available: metadata
                    .columns
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
            if let Some(problem) = &column.problem {
                return Err(problem.to_error(name, &column.arrow_type));
            }
            let dtype = column
                .dtype
                .as_deref()
                .and_then(DType::from_name)
                .ok_or_else(|| Error::Internal(format!("column '{name}' has no dtype")))?;
            let shape = column
                .shape
                .as_ref()
                .ok_or_else(|| Error::Internal(format!("column '{name}' has no shape")))?;
            let len = shape.first().copied().unwrap_or(1) as usize;
            Ok(ColumnSpec {
                name: name.clone(),
                dtype,
                len,
                array: !shape.is_empty(),
            })
        })
        .collect()
}
