//! Options for opening a [`Store`](crate::Store).

use std::collections::HashMap;
use std::path::PathBuf;

/// The environment variable that overrides where `dbfs:/` paths are mounted.
pub const DBFS_MOUNT_ENV: &str = "KOLO_DBFS_MOUNT";

/// How to open a store: backend options and where the Databricks `/dbfs` mount lives.
///
/// ```
/// let mut options = kolo_store::StoreOptions::default();
/// options.storage_options.insert("aws_endpoint".into(), "http://127.0.0.1:9000".into());
/// options.storage_options.insert("aws_allow_http".into(), "true".into());
/// ```
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Backend options, keyed as `object_store` names them (`aws_access_key_id`,
    /// `aws_endpoint`, `google_service_account`, `azure_storage_account_name`, ...) plus
    /// `timeout`, `connect_timeout`, `max_retries` and `retry_timeout`; for HDFS, Hadoop
    /// configuration keys (`dfs.ha.namenodes.ns`, ...). Options override environment variables.
    pub storage_options: HashMap<String, String>,
    /// The local directory `dbfs:/x`, `/dbfs/x` and `file:///dbfs/x` map onto
    /// (default: `$KOLO_DBFS_MOUNT`, else `/dbfs`).
    pub dbfs_mount: PathBuf,
}

impl Default for StoreOptions {
    fn default() -> Self {
        let dbfs_mount = std::env::var_os(DBFS_MOUNT_ENV)
            .filter(|value| !value.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/dbfs"));
        StoreOptions {
            storage_options: HashMap::new(),
            dbfs_mount,
        }
    }
}
