//! The one error type of kolo-store.

use std::path::PathBuf;

/// `Result` with kolo-store's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while resolving or using a store. Every message names the
/// location (URL or path) and says how to fix the problem.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The location string is not a usable store location (empty, a host on a `file://` URL, a
    /// bucket missing, `dbfs://` instead of `dbfs:/`, ...).
    #[error("invalid store location {location:?}: {reason}")]
    InvalidLocation {
        /// The location as given.
        location: String,
        /// What is wrong and how to write it instead.
        reason: String,
    },

    /// The location looks like a URL but does not parse as one.
    #[error(
        "malformed store URL {location:?}: {source}; write it as scheme://bucket/path \
         (s3, gs, az, abfs, abfss, hdfs), file:///abs/path, dbfs:/path or a local path"
    )]
    MalformedUrl {
        /// The location as given.
        location: String,
        /// The parser's complaint.
        #[source]
        source: url::ParseError,
    },

    /// The path part of the URL is not a valid object path (empty segments, `..`, control
    /// characters).
    #[error("invalid path in store URL {location:?}: {source}; use plain /-separated names")]
    BadPath {
        /// The location as given.
        location: String,
        /// The path parser's complaint.
        #[source]
        source: object_store::path::Error,
    },

    /// The URL scheme is not one kolo knows.
    #[error(
        "unsupported store scheme {scheme:?} in {location:?}; use a local path, file://, \
         dbfs:/, s3:// (or s3a://), gs://, az://, abfs://, abfss:// or hdfs://"
    )]
    UnsupportedScheme {
        /// The location as given.
        location: String,
        /// The scheme found.
        scheme: String,
    },

    /// The backend for this location was compiled out of this build.
    #[error(
        "store location {location:?} needs the `{feature}` feature of kolo-store, which this \
         build was compiled without; rebuild kolo with `--features {feature}` (on by default)"
    )]
    FeatureDisabled {
        /// The location as given.
        location: String,
        /// The cargo feature that provides the backend.
        feature: &'static str,
    },

    /// A `storage_options` key (or value) is not understood by the location's backend.
    #[error(
        "storage option {key:?} is not valid for {location} ({backend}): {reason}; see \
         docs/store.md for the accepted keys"
    )]
    InvalidOption {
        /// The store URL.
        location: String,
        /// The backend (`s3`, `gcs`, `azure`, `hdfs`).
        backend: &'static str,
        /// The offending key.
        key: String,
        /// Why it was refused.
        reason: String,
    },

    /// Building the client of a remote store failed (bad option value, missing account, ...).
    #[error(
        "cannot set up the store client for {location}: {source}; check storage_options and \
         the AWS_*/GOOGLE_*/AZURE_* environment variables"
    )]
    Client {
        /// The store URL.
        location: String,
        /// The backend's error.
        #[source]
        source: object_store::Error,
    },

    /// There is no object at the location.
    #[error("no object at {url}: {source}; {hint}", hint = hint(source))]
    NotFound {
        /// The full URL of the missing object.
        url: String,
        /// The backend's error.
        #[source]
        source: object_store::Error,
    },

    /// A request to the store failed.
    #[error("store {operation} of {url} failed: {source}; {hint}", hint = hint(source))]
    Backend {
        /// What was attempted (`get`, `put`, `list`, `delete`, `head`).
        operation: &'static str,
        /// The full URL involved.
        url: String,
        /// The backend's error.
        #[source]
        source: object_store::Error,
    },

    /// A local file operation failed.
    #[error("{operation} of local path {} failed: {source}", path.display())]
    Io {
        /// What was attempted.
        operation: &'static str,
        /// The local path involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// A store-relative key could reach outside the store root (a `..` component, a leading
    /// `/`, a NUL or control character); nothing was read, written or deleted.
    #[error(
        "store key {key:?} is refused: {rule}; give a /-separated path relative to the store \
         root, without `..`, NUL or control characters"
    )]
    UnsafeKey {
        /// The key as given.
        key: String,
        /// The rule it broke.
        rule: crate::key::KeyRule,
    },

    /// A run id is not one plain path component (`runs/<run_id>` names its directory).
    #[error(
        "run_id {run_id:?} is refused: {rule}; use one plain name such as run_1 (no `/`, \
         `.`/`..`, NUL or control characters, at most 255 bytes)"
    )]
    InvalidRunId {
        /// The run id as given.
        run_id: String,
        /// The rule it broke.
        rule: crate::key::KeyRule,
    },

    /// A bug in kolo-store.
    #[error("internal error in kolo-store (this is a bug): {0}")]
    Internal(String),
}

/// The fix to suggest for a failed request, by kind of failure.
fn hint(source: &object_store::Error) -> &'static str {
    match source {
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => {
            "the credentials were refused: check the access key/secret (storage_options or the \
             AWS_*/GOOGLE_*/AZURE_* environment variables) and the permissions on the bucket"
        }
        object_store::Error::NotFound { .. } if names_missing_bucket(source) => {
            "the bucket/container does not exist: create it or fix the URL"
        }
        object_store::Error::NotFound { .. } => {
            "the object or the bucket/container does not exist: create the bucket or fix the path"
        }
        object_store::Error::AlreadyExists { .. } => "the object already exists",
        object_store::Error::NotSupported { .. } | object_store::Error::NotImplemented { .. } => {
            "this backend does not support the operation"
        }
        _ => {
            "check that the endpoint is reachable (aws_endpoint/google_base_url/azure endpoint \
             or the hdfs://host:port namenode), that the bucket/container exists and that the \
             credentials are right"
        }
    }
}

/// Whether the server said the bucket or container (not just the object) is missing.
fn names_missing_bucket(source: &object_store::Error) -> bool {
    let text = source.to_string();
    [
        "NoSuchBucket",
        "ContainerNotFound",
        "The specified bucket does not exist",
    ]
    .iter()
    .any(|marker| text.contains(marker))
}
