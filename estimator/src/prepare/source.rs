//! Where the rows come from: Parquet/CSV files in any store, or in-memory Arrow data.

use std::ffi::c_void;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::ffi_stream::{ArrowArrayStreamReader, FFI_ArrowArrayStream};
use arrow::record_batch::{RecordBatch, RecordBatchReader};
use datafusion::datasource::listing::ListingTableUrl;
use datafusion::datasource::MemTable;
use datafusion::error::DataFusionError;
use datafusion::prelude::{CsvReadOptions, DataFrame, ParquetReadOptions, SessionContext};
use kolo_store::{Store, StoreOptions};
use object_store::ObjectStoreExt;

use crate::error::{Error, Result};

/// The rows to prepare.
pub enum Source {
    /// Parquet files, CSV files or directories of Parquet (or CSV) files, as local paths or
    /// store URLs (`s3://`, `gs://`, `az://`, `hdfs://`, `file://`, `dbfs:/`), all of one
    /// format; read in path order.
    Paths {
        /// The paths or URLs.
        paths: Vec<String>,
        /// How to reach them (credentials, endpoints).
        options: StoreOptions,
    },
    /// Record batches already in memory, in order.
    Batches {
        /// Their schema (also when there are no batches).
        schema: SchemaRef,
        /// The batches.
        batches: Vec<RecordBatch>,
    },
    /// A stream of record batches (e.g. a pyarrow Table handed over through the Arrow C
    /// stream interface); read once, into memory.
    Stream(Box<dyn RecordBatchReader + Send>),
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Paths { paths, .. } => f.debug_struct("Paths").field("paths", paths).finish(),
            Source::Batches { batches, .. } => {
                write!(f, "Batches({} batches)", batches.len())
            }
            Source::Stream(reader) => write!(f, "Stream({:?})", reader.schema()),
        }
    }
}

impl Source {
    /// Takes over an Arrow C stream (`ArrowArrayStream`, e.g. the pointer inside the
    /// PyCapsule that `pyarrow.Table.__arrow_c_stream__()` returns). The stream at `stream`
    /// is moved out and left released, as the C stream interface asks of a consumer.
    ///
    /// # Safety
    /// `stream` must point to a valid, not yet released `ArrowArrayStream`, and nothing else
    /// may use it afterwards.
    pub unsafe fn from_arrow_c_stream(stream: *mut c_void) -> Result<Self> {
        // SAFETY: the caller guarantees a valid, unreleased ArrowArrayStream; `from_raw` moves
        // it out and leaves an empty (released) one behind.
        let reader =
            unsafe { ArrowArrayStreamReader::from_raw(stream.cast::<FFI_ArrowArrayStream>()) }
                .map_err(|source| Error::Arrow {
                    context: "reading the Arrow stream",
                    source,
                })?;
        Ok(Source::Stream(Box::new(reader)))
    }

    /// What the source is, for messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            Source::Paths { paths, .. } => paths.join(", "),
            Source::Batches { .. } => "the in-memory table".to_owned(),
            Source::Stream(_) => "the Arrow stream (table)".to_owned(),
        }
    }

    /// A DataFusion frame over the source.
    pub(crate) async fn into_dataframe(self, ctx: &SessionContext) -> Result<DataFrame> {
        match self {
            Source::Paths { paths, options } => read_paths(ctx, &paths, &options).await,
            Source::Batches { schema, batches } => mem_table(ctx, schema, batches),
            Source::Stream(reader) => {
                let schema = reader.schema();
                let batches =
                    reader
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|source| Error::Arrow {
                            context: "reading the Arrow stream",
                            source,
                        })?;
                mem_table(ctx, schema, batches)
            }
        }
    }
}

/// One partition of in-memory batches, so the scan order is the batch order.
fn mem_table(
    ctx: &SessionContext,
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
) -> Result<DataFrame> {
    let table = MemTable::try_new(schema, vec![batches])
        .map_err(|e| query_error("reading the in-memory table", "memory://", e))?;
    ctx.read_table(Arc::new(table))
        .map_err(|e| query_error("reading the in-memory table", "memory://", e))
}

/// The file formats a path can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// Apache Parquet.
    Parquet,
    /// Comma-separated values with a header line.
    Csv,
}

/// The format a file name says it holds.
pub(crate) fn format_of(name: &str) -> Option<Format> {
    let lower = name.to_ascii_lowercase();
    if [".parquet", ".parq", ".pq"]
        .iter()
        .any(|e| lower.ends_with(e))
    {
        Some(Format::Parquet)
    } else if lower.ends_with(".csv") {
        Some(Format::Csv)
    } else {
        None
    }
}

/// Whether a listed file is bookkeeping (`_SUCCESS`, `.crc`, ...) rather than data.
fn is_hidden(rel: &str) -> bool {
    rel.rsplit('/')
        .next()
        .is_some_and(|name| name.starts_with('_') || name.starts_with('.'))
}

/// One resolved source path: its table URL for DataFusion and its format.
struct Resolved {
    table_url: String,
    format: Format,
    is_dir: bool,
}

/// Finds what `path` is (a file or a directory, which format), registering its store.
async fn resolve(ctx: &SessionContext, path: &str, options: &StoreOptions) -> Result<Resolved> {
    let store = Store::open(path, options)?;
    let url = store.url().trim_end_matches('/').to_owned();
    let listing = ListingTableUrl::parse(&url).map_err(|e| query_error("parsing", &url, e))?;
    ctx.register_object_store(listing.object_store().as_ref(), store.object_store());
    match store.object_store().head(&store.path("")?).await {
        Ok(_) => {
            let format = format_of(&url).ok_or_else(|| Error::SourceFormat {
                path: path.to_owned(),
                reason: "its extension is neither .parquet (.parq, .pq) nor .csv; rename it"
                    .to_owned(),
            })?;
            Ok(Resolved {
                table_url: url,
                format,
                is_dir: false,
            })
        }
        Err(object_store::Error::NotFound { .. }) => {
            let files = store.list("").await?;
            let formats: Vec<Option<Format>> = files
                .iter()
                .filter(|f| !is_hidden(&f.rel))
                .map(|f| format_of(&f.rel))
                .collect();
            if files.is_empty() {
                return Err(Error::DatasetNotFound {
                    location: path.to_owned(),
                });
            }
            let format = if formats.contains(&Some(Format::Parquet)) {
                Format::Parquet
            } else if formats.contains(&Some(Format::Csv)) {
                Format::Csv
            } else {
                return Err(Error::SourceFormat {
                    path: path.to_owned(),
                    reason: "the directory holds no *.parquet or *.csv files".to_owned(),
                });
            };
            Ok(Resolved {
                table_url: format!("{url}/"),
                format,
                is_dir: true,
            })
        }
        Err(source) => Err(Error::Store(kolo_store::Error::Backend {
            operation: "head",
            url,
            source,
        })),
    }
}

/// A DataFusion frame over Parquet or CSV paths of one format.
async fn read_paths(
    ctx: &SessionContext,
    paths: &[String],
    options: &StoreOptions,
) -> Result<DataFrame> {
    if paths.is_empty() {
        return Err(Error::InvalidArgument(
            "no source paths given; pass a Parquet/CSV path, a list of them, a pyarrow Table \
             or a pandas DataFrame"
                .to_owned(),
        ));
    }
    let mut resolved = Vec::with_capacity(paths.len());
    for path in paths {
        resolved.push(resolve(ctx, path, options).await?);
    }
    let format = resolved[0].format;
    if let Some((i, other)) = resolved
        .iter()
        .enumerate()
        .find(|(_, r)| r.format != format)
    {
        return Err(Error::SourceFormat {
            path: paths[i].clone(),
            reason: format!(
                "it is {:?} while {} is {:?}; prepare one format at a time",
                other.format, paths[0], format
            ),
        });
    }
    // Directories are filtered to data files by extension; explicit files need no filter.
    let any_dir = resolved.iter().any(|r| r.is_dir);
    let extension = match (any_dir, format) {
        (false, _) => "",
        (true, Format::Parquet) => ".parquet",
        (true, Format::Csv) => ".csv",
    };
    if any_dir {
        if let Some(r) = resolved
            .iter()
            .find(|r| !r.is_dir && !r.table_url.to_ascii_lowercase().ends_with(extension))
        {
            return Err(Error::SourceFormat {
                path: r.table_url.clone(),
                reason: format!(
                    "when files and directories are mixed, files must be named *{extension}"
                ),
            });
        }
    }
    let urls: Vec<String> = resolved.into_iter().map(|r| r.table_url).collect();
    let what = urls.join(", ");
    let frame = match format {
        Format::Parquet => {
            ctx.read_parquet(urls, ParquetReadOptions::new().file_extension(extension))
                .await
        }
        Format::Csv => {
            ctx.read_csv(
                urls,
                CsvReadOptions::new()
                    .has_header(true)
                    .file_extension(extension),
            )
            .await
        }
    };
    frame.map_err(|e| query_error("reading", &what, e))
}

/// Wraps a DataFusion error; store failures inside it become store errors.
pub(crate) fn query_error(context: &str, url: &str, error: DataFusionError) -> Error {
    match error {
        DataFusionError::ObjectStore(source) => Error::Store(kolo_store::Error::Backend {
            operation: "read",
            url: url.to_owned(),
            source: *source,
        }),
        source => Error::Query {
            context: format!("{context} {url}"),
            source,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_come_from_extensions() {
        assert_eq!(
            format_of("s3://b/x/part-0.snappy.parquet"),
            Some(Format::Parquet)
        );
        assert_eq!(format_of("/a/B.PQ"), Some(Format::Parquet));
        assert_eq!(format_of("/a/b.csv"), Some(Format::Csv));
        assert_eq!(format_of("/a/b.json"), None);
        assert!(is_hidden("x/_SUCCESS"));
        assert!(is_hidden(".part-0.parquet.crc"));
        assert!(!is_hidden("x/part-0.parquet"));
    }
}
