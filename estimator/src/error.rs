//! The one error type of kolo-estimator.

/// `Result` with kolo-estimator's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while preparing, describing, planning or loading a dataset.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Reaching the store failed (path, credentials, backend).
    #[error(transparent)]
    Store(#[from] kolo_store::Error),
    /// An argument is invalid (batch size, rank, ratio, ...); the message says which and why.
    #[error("{0}")]
    InvalidArgument(String),
    /// An Arrow operation failed (reading an Arrow C stream such as a pyarrow Table, casting,
    /// filtering).
    #[error("{context} failed: {source}")]
    Arrow {
        /// What was being done.
        context: &'static str,
        /// Arrow's error.
        #[source]
        source: arrow::error::ArrowError,
    },
    /// A column asked for (by the preparation options or the loader) is not in the source or
    /// dataset.
    #[error(
        "{role} column '{column}' is not in {dataset}; available columns: {available} (check \
         the name's spelling and case)"
    )]
    UnknownColumn {
        /// What it was asked for: `feature`, `label`, `sample weight`, `validation` when
        /// preparing, `selected` when loading.
        role: &'static str,
        /// The column asked for.
        column: String,
        /// Where it was looked for, as the message names it (`the source (data.csv)`,
        /// `the dataset s3://bucket/train`).
        dataset: String,
        /// The columns there, comma-separated.
        available: String,
    },
    /// A column asked for has a type that cannot become a tensor (or not in its role).
    #[error("{role} column '{column}' has type {data_type}; {hint}")]
    UnsupportedColumn {
        /// What it was asked for (see [`Error::UnknownColumn`]).
        role: &'static str,
        /// The column.
        column: String,
        /// Its Arrow type, as Arrow prints it.
        data_type: String,
        /// What is allowed, and how to convert the column.
        hint: String,
    },
    /// A source, a dataset, or one side of a prepared split has no data.
    #[error("{what} is empty ({why}); {fix}")]
    EmptyDataset {
        /// Which data is empty (`the source (data.csv)`, `the train split`,
        /// `the dataset s3://bucket/train`).
        what: String,
        /// What is missing (no rows, no data files) and why.
        why: String,
        /// How to get data there.
        fix: String,
    },
    /// A column holds nulls (missing values), which tensors cannot hold.
    #[error(
        "column '{column}' has {count} null value(s){where_} in {location}; tensors cannot hold \
         missing values: fill or drop them when preparing the data (e.g. pandas' fillna/dropna)",
        where_ = if *inside_lists { " inside its lists" } else { "" }
    )]
    NullValues {
        /// The column.
        column: String,
        /// How many nulls were found (in the part of the data looked at).
        count: u64,
        /// Where they are: the file being loaded, or the source being prepared.
        location: String,
        /// Whether the nulls are list elements rather than whole values.
        inside_lists: bool,
    },
    /// The prepared dataset already exists and overwriting was not asked for.
    #[error(
        "{url} already exists; pass overwrite=True to replace it, or another dataset_idx \
         (None takes the next free one)"
    )]
    OutputExists {
        /// The existing output's URL.
        url: String,
    },
    /// A DataFusion query over the source failed.
    #[error("{context} failed: {source}")]
    Query {
        /// What was being done, and on what.
        context: String,
        /// DataFusion's error.
        #[source]
        source: datafusion::error::DataFusionError,
    },
    /// The source changed between the counting and the writing pass.
    #[error(
        "{source_name} changed while it was being prepared ({counted} rows counted, more or \
         fewer read); prepare a source that is not being written to"
    )]
    SourceChanged {
        /// The source.
        source_name: String,
        /// Rows counted in the first pass.
        counted: u64,
    },
    /// A source path's format cannot be used or told.
    #[error("cannot read {path}: {reason}")]
    SourceFormat {
        /// The path.
        path: String,
        /// Why, and what to do.
        reason: String,
    },
    /// Writing a Parquet file into the store failed.
    #[error("writing {url} failed: {source}")]
    WriteParquet {
        /// The file's URL.
        url: String,
        /// The writer's error.
        #[source]
        source: parquet::errors::ParquetError,
    },
    /// The process-wide async runtime could not run a store or Parquet request.
    #[error("the kolo runtime failed: {0}")]
    Runtime(#[from] kolo_runtime::Error),
    /// A dataset, or a source path to prepare, does not exist.
    #[error(
        "{location} does not exist: no file there and no files under it as a directory; check \
         the path (and, for a remote store, the storage options)"
    )]
    DatasetNotFound {
        /// The path or URL as given (source) or resolved (dataset).
        location: String,
    },
    /// A data file of the dataset cannot be read as Parquet.
    #[error("cannot read the Parquet file {file}: {source}")]
    ReadParquet {
        /// The file's URL.
        file: String,
        /// The Parquet reader's error.
        #[source]
        source: parquet::errors::ParquetError,
    },
    /// A local data file cannot be opened or mapped into memory.
    #[error("cannot read {path}: {source}", path = path.display())]
    ReadFile {
        /// The file.
        path: std::path::PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// An array column's rows do not all have the same length.
    #[error(
        "array column '{column}' has rows of length {found} in {file}, but {expected} elsewhere; \
         every row of an array column must have the same length (pad or truncate them when \
         preparing the data)"
    )]
    RaggedColumn {
        /// The column.
        column: String,
        /// The file with the odd row.
        file: String,
        /// The length of the first rows seen.
        expected: u64,
        /// The other length found.
        found: u64,
    },
    /// A column's type differs between files of the dataset.
    #[error(
        "column '{column}' is {found} in {file} but {expected} in the dataset's first file; \
         rewrite the dataset with one schema"
    )]
    SchemaDiffers {
        /// The column.
        column: String,
        /// The file that differs.
        file: String,
        /// The type in the first file.
        expected: String,
        /// The type in `file`.
        found: String,
    },
    /// With `drop_last`, the dataset does not fill one batch on every rank.
    #[error(
        "dataset {url} has {rows} rows, fewer than size ({size}) x batch_size ({batch_size}) = \
         {needed}, so no rank would get a whole batch; use a smaller batch_size, fewer ranks, \
         drop_last=False, or more data",
        needed = u64::from(*size) * batch_size
    )]
    TooFewRows {
        /// The dataset's URL.
        url: String,
        /// Rows in the dataset.
        rows: u64,
        /// Number of ranks.
        size: u32,
        /// Rows per batch.
        batch_size: u64,
    },
    /// A saved loader state belongs to another version of the dataset.
    #[error(
        "the loader state was saved for dataset {url} with fingerprint {saved}, but its files \
         now give {current}: the dataset changed since; start the epoch over instead of resuming"
    )]
    DatasetChanged {
        /// The dataset's URL.
        url: String,
        /// The fingerprint in the state.
        saved: String,
        /// The fingerprint now.
        current: String,
    },
    /// The operating system refused to start a loader thread.
    #[error("cannot start a data loader thread: {0}")]
    LoaderThread(#[source] std::io::Error),
    /// A bug in kolo-estimator.
    #[error("internal error in kolo-estimator (this is a bug): {0}")]
    Internal(String),
}
