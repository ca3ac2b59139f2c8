//! kolo-store: one view of a training job's storage location — a local directory, a Databricks
//! `/dbfs` path, or a prefix in S3, GCS, Azure or HDFS — over `object_store`.
//!
//! [`Store::open`] resolves the location (credentials and endpoints from `storage_options` or
//! the usual environment variables), [`layout`] names Horovod's run layout under it, and the
//! async methods read, write (atomically), list, delete and sync directories up. Every key
//! goes through [`parse_key`] first, so no operation reaches outside the store root; run ids
//! go through [`check_run_id`].
//!
//! ```
//! use bytes::Bytes;
//! use kolo_store::{layout, Store, StoreOptions};
//!
//! # fn main() -> kolo_store::Result<()> {
//! let dir = std::env::temp_dir().join(format!("kolo-store-example-{}", std::process::id()));
//! let store = Store::open(dir.to_str().unwrap(), &StoreOptions::default())?;
//! let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
//! runtime.block_on(async {
//!     let key = layout::checkpoint("run_1")?;
//!     store.put_atomic(&key, Bytes::from_static(b"weights")).await?;
//!     assert_eq!(store.get(&key).await?, Bytes::from_static(b"weights"));
//!     assert!(store.exists(&layout::run("run_1")?).await?);
//!     store.delete("").await
//! })?;
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]

mod backend;
mod error;
mod key;
pub mod layout;
mod location;
mod options;
mod staging;
mod store;
mod sync;

pub use error::{Error, Result};
pub use key::{check_run_id, parse_key, KeyRule, StoreKey, MAX_RUN_ID_BYTES};
pub use options::{StoreOptions, DBFS_MOUNT_ENV};
pub use store::{ObjectInfo, Store};
pub use sync::SyncReport;

/// The `bytes` crate kolo-store's API uses, so callers need not pin it themselves.
pub use bytes;
/// The `object_store` crate behind [`Store::object_store`].
pub use object_store;
