//! [`Store`]: one prefix in one backend, addressed by store-relative keys.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path as FsPath, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::local::LocalFileSystem;
use object_store::path::{Path, PathPart};
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt, PutPayload, PutResult};

use crate::error::{Error, Result};
use crate::key::{parse_key, StoreKey};
use crate::location::{Backend, Location};
use crate::options::StoreOptions;
use crate::sync::Synced;

/// Objects larger than this are uploaded in parts (a single S3 PUT stops at 5 GiB); both ways
/// are atomic on every backend.
pub(crate) const MULTIPART_THRESHOLD: usize = 4 << 30;
/// Part size of multipart uploads.
const PART_SIZE: usize = 64 << 20;

/// One object under a store, as [`Store::list`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Key relative to the store prefix (`runs/r1/checkpoint`), usable with [`Store::get`].
    pub rel: String,
    /// Size in bytes.
    pub size: u64,
    /// The backend's entity tag, when it has one.
    pub e_tag: Option<String>,
    /// When the object was last written (the backend's clock).
    pub last_modified: SystemTime,
}

/// A store prefix: a local directory, a DBFS path (through the `/dbfs` mount), or a prefix in
/// S3, GCS, Azure or HDFS. Cheap to clone (shared client).
///
/// ```
/// # fn main() -> kolo_store::Result<()> {
/// let dir = std::env::temp_dir().join(format!("kolo-store-doc-{}", std::process::id()));
/// let store = kolo_store::Store::open(dir.to_str().unwrap(), &Default::default())?;
/// assert!(store.url().starts_with("file:///"));
/// assert_eq!(store.local_path("runs/r1")?, Some(dir.join("runs/r1")));
/// assert!(store.local_path("runs/../../etc").is_err());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    url: String,
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    local_root: Option<PathBuf>,
    backend: Option<Backend>,
    /// What [`Store::sync_dir`] uploaded, to skip unchanged files without trusting clocks.
    synced: Mutex<HashMap<String, Synced>>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("url", &self.inner.url)
            .field("store", &self.inner.store)
            .field("prefix", &self.inner.prefix)
            .finish()
    }
}

impl Store {
    /// Resolves `prefix` (local path, `file://`, `dbfs:/`, `/dbfs/`, `s3://`, `gs://`, `az://`,
    /// `abfs[s]://`, `hdfs://`) and builds its client. Does not contact the backend: a wrong
    /// endpoint or credential shows on the first request.
    pub fn open(prefix: &str, options: &StoreOptions) -> Result<Store> {
        let location = Location::parse(prefix, &options.dbfs_mount)?;
        let url = location.url();
        match location {
            Location::Local { root } => {
                if !options.storage_options.is_empty() {
                    log::debug!("storage_options are ignored for the local store {url}");
                }
                let prefix = Path::from_absolute_path(&root).map_err(|source| Error::BadPath {
                    location: prefix.to_string(),
                    source,
                })?;
                Ok(Store::build(
                    url,
                    Arc::new(LocalFileSystem::new()),
                    prefix,
                    Some(root),
                    None,
                ))
            }
            Location::Remote {
                backend,
                builder_url,
                prefix,
                ..
            } => {
                let store = crate::backend::build(
                    &url,
                    backend,
                    builder_url.as_deref(),
                    &options.storage_options,
                )?;
                Ok(Store::build(url, store, prefix, None, Some(backend)))
            }
        }
    }

    /// The canonical URL `prefix` resolves to, without building a client (`/tmp/x/` →
    /// `file:///tmp/x`, `s3a://b/p` → `s3://b/p`, `dbfs:/x` → the mount's `file://` URL).
    pub fn resolve_url(prefix: &str, options: &StoreOptions) -> Result<String> {
        Ok(Location::parse(prefix, &options.dbfs_mount)?.url())
    }

    /// A store over an existing client, e.g. `object_store::memory::InMemory` in tests; `url`
    /// is only used in messages and [`Store::url`].
    pub fn from_object_store(
        url: impl Into<String>,
        store: Arc<dyn ObjectStore>,
        prefix: Path,
    ) -> Store {
        Store::build(url.into(), store, prefix, None, None)
    }

    fn build(
        url: String,
        store: Arc<dyn ObjectStore>,
        prefix: Path,
        local_root: Option<PathBuf>,
        backend: Option<Backend>,
    ) -> Store {
        Store {
            inner: Arc::new(Inner {
                url,
                store,
                prefix,
                local_root,
                backend,
                synced: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The canonical prefix URL (`file:///tmp/x`, `s3://bucket/pre`), without a trailing slash.
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// The underlying client; keys for it come from [`Store::path`].
    pub fn object_store(&self) -> Arc<dyn ObjectStore> {
        Arc::clone(&self.inner.store)
    }

    /// The client key of `rel` (`/`-separated, relative to the prefix; `""` is the prefix);
    /// [`Error::UnsafeKey`] when `rel` could leave the prefix ([`parse_key`]).
    pub fn path(&self, rel: &str) -> Result<Path> {
        Ok(self.key_path(&parse_key(rel)?))
    }

    fn key_path(&self, key: &StoreKey) -> Path {
        let mut parts: Vec<PathPart<'static>> = self
            .inner
            .prefix
            .parts()
            .map(|part| PathPart::from(part.as_ref().to_string()))
            .collect();
        parts.extend(key.names().map(|name| PathPart::from(name.to_string())));
        Path::from_iter(parts)
    }

    /// The full URL of `rel`, for messages and for Python (`s3://bucket/pre/runs/r1`). A key
    /// [`parse_key`] refuses is shown as given (this names, it does not resolve).
    pub fn url_of(&self, rel: &str) -> String {
        let rel = match parse_key(rel) {
            Ok(key) => key.as_str(),
            Err(_) => rel.to_string(),
        };
        if rel.is_empty() {
            self.inner.url.clone()
        } else {
            format!("{}/{rel}", self.inner.url)
        }
    }

    /// The local filesystem path of `rel` for local and DBFS stores; `None` for remote stores;
    /// [`Error::UnsafeKey`] when `rel` could leave the store root ([`parse_key`]).
    pub fn local_path(&self, rel: &str) -> Result<Option<PathBuf>> {
        let key = parse_key(rel)?;
        Ok(self.key_local_path(&key))
    }

    fn key_local_path(&self, key: &StoreKey) -> Option<PathBuf> {
        let root = self.inner.local_root.as_ref()?;
        Some(key.names().fold(root.clone(), |path, name| path.join(name)))
    }

    /// Writes `data` at `rel` so that a reader sees the previous object or the whole new one,
    /// never a part (see docs/store.md for how each backend does it).
    pub async fn put_atomic(&self, rel: &str, data: Bytes) -> Result<()> {
        self.put_inner(rel, data).await.map(|_| ())
    }

    pub(crate) async fn put_inner(&self, rel: &str, data: Bytes) -> Result<PutResult> {
        let key = parse_key(rel)?;
        let result = self.put_key(&key, rel, data).await;
        if result.is_ok() {
            if let Some(target) = self.key_local_path(&key) {
                crate::staging::reclaim_beside(target, crate::staging::STALE_AFTER).await;
            }
        }
        result
    }

    async fn put_key(&self, key: &StoreKey, rel: &str, data: Bytes) -> Result<PutResult> {
        let path = self.key_path(key);
        let store = &self.inner.store;
        let result = if data.len() <= MULTIPART_THRESHOLD {
            store.put(&path, PutPayload::from(data)).await
        } else {
            let mut upload = store
                .put_multipart(&path)
                .await
                .map_err(|e| self.error("put", rel, e))?;
            let mut result = Ok(());
            for start in (0..data.len()).step_by(PART_SIZE) {
                let end = (start + PART_SIZE).min(data.len());
                result = upload
                    .put_part(PutPayload::from(data.slice(start..end)))
                    .await;
                if result.is_err() {
                    break;
                }
            }
            match result {
                Ok(()) => upload.complete().await,
                Err(err) => {
                    if let Err(abort) = upload.abort().await {
                        log::warn!(
                            "aborting the upload of {} failed: {abort}",
                            self.url_of(rel)
                        );
                    }
                    Err(err)
                }
            }
        };
        result.map_err(|e| self.error("put", rel, e))
    }

    /// Reads the whole object at `rel`; [`Error::NotFound`] when there is none.
    pub async fn get(&self, rel: &str) -> Result<Bytes> {
        let path = self.path(rel)?;
        let result = self
            .inner
            .store
            .get(&path)
            .await
            .map_err(|e| self.error("get", rel, e))?;
        result.bytes().await.map_err(|e| self.error("get", rel, e))
    }

    /// Whether `rel` is an object or a non-empty "directory" (for local stores: any existing
    /// file or directory, empty ones included).
    pub async fn exists(&self, rel: &str) -> Result<bool> {
        let key = parse_key(rel)?;
        if let Some(path) = self.key_local_path(&key) {
            return match tokio::fs::metadata(&path).await {
                Ok(_) => Ok(true),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(false),
                Err(source) => Err(Error::Io {
                    operation: "stat",
                    path,
                    source,
                }),
            };
        }
        let path = self.key_path(&key);
        match self.inner.store.head(&path).await {
            Ok(_) => return Ok(true),
            Err(object_store::Error::NotFound { .. }) => {}
            Err(err) => return Err(self.error("head", rel, err)),
        }
        match self.inner.store.list(Some(&path)).next().await {
            None => Ok(false),
            Some(Ok(_)) => Ok(true),
            Some(Err(err)) => Err(self.error("list", rel, err)),
        }
    }

    /// Every object under `rel` (recursively; `rel` itself when it is an object is not
    /// included), sorted by key. A missing prefix lists as empty.
    pub async fn list(&self, rel: &str) -> Result<Vec<ObjectInfo>> {
        let metas: Vec<ObjectMeta> = self
            .inner
            .store
            .list(Some(&self.path(rel)?))
            .try_collect()
            .await
            .map_err(|e| self.error("list", rel, e))?;
        let skip = self.inner.prefix.parts().count();
        let mut out: Vec<ObjectInfo> = metas
            .into_iter()
            .filter(|meta| !self.is_staging_file(&meta.location))
            .map(|meta| ObjectInfo {
                rel: meta
                    .location
                    .parts()
                    .skip(skip)
                    .map(|p| p.as_ref().to_string())
                    .collect::<Vec<_>>()
                    .join("/"),
                size: meta.size,
                e_tag: meta.e_tag,
                last_modified: meta.last_modified.into(),
            })
            .collect();
        out.sort_by(|a, b| a.rel.cmp(&b.rel));
        Ok(out)
    }

    /// Deletes the object at `rel` and everything under it. Deleting what is not there is not
    /// an error.
    pub async fn delete(&self, rel: &str) -> Result<()> {
        let key = parse_key(rel)?;
        if let Some(path) = self.key_local_path(&key) {
            let io = |operation, path: &FsPath, source| Error::Io {
                operation,
                path: path.to_path_buf(),
                source,
            };
            return match tokio::fs::symlink_metadata(&path).await {
                Ok(meta) if meta.is_dir() => tokio::fs::remove_dir_all(&path)
                    .await
                    .map_err(|e| io("remove_dir_all", &path, e)),
                Ok(_) => tokio::fs::remove_file(&path)
                    .await
                    .map_err(|e| io("remove_file", &path, e)),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(err) => Err(io("stat", &path, err)),
            };
        }
        let path = self.key_path(&key);
        let store = &self.inner.store;
        let mut doomed: Vec<Path> = store
            .list(Some(&path))
            .map_ok(|meta| meta.location)
            .try_collect()
            .await
            .map_err(|e| self.error("list", rel, e))?;
        match store.head(&path).await {
            Ok(meta) => doomed.push(meta.location),
            Err(object_store::Error::NotFound { .. }) => {}
            Err(err) => return Err(self.error("head", rel, err)),
        }
        let locations = futures::stream::iter(doomed.into_iter().map(Ok)).boxed();
        store
            .delete_stream(locations)
            .try_for_each(|_| async { Ok(()) })
            .await
            .or_else(|err| match err {
                object_store::Error::NotFound { .. } => Ok(()),
                err => Err(self.error("delete", rel, err)),
            })
    }

    /// Uploads the files under `local_dir` to `rel`, skipping those that are unchanged (rule in
    /// docs/store.md). Remote files missing locally are kept.
    pub async fn sync_dir(&self, local_dir: &FsPath, rel: &str) -> Result<crate::SyncReport> {
        parse_key(rel)?;
        crate::sync::sync_dir(self, local_dir, rel).await
    }

    pub(crate) fn synced(&self) -> &Mutex<HashMap<String, Synced>> {
        &self.inner.synced
    }

    /// HDFS writes `.<name>.tmp.<n>` beside the target; a killed writer leaves it behind.
    fn is_staging_file(&self, location: &Path) -> bool {
        if self.inner.backend != Some(Backend::Hdfs) {
            return false;
        }
        let Some(name) = location.filename() else {
            return false;
        };
        match name
            .strip_prefix('.')
            .and_then(|rest| rest.rsplit_once(".tmp."))
        {
            Some((_, n)) => !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()),
            None => false,
        }
    }

    /// Maps a backend error for `rel` onto [`Error`].
    pub(crate) fn error(
        &self,
        operation: &'static str,
        rel: &str,
        source: object_store::Error,
    ) -> Error {
        let url = self.url_of(rel);
        match source {
            object_store::Error::NotFound { .. } if operation == "get" => {
                Error::NotFound { url, source }
            }
            source => Error::Backend {
                operation,
                url,
                source,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_join_the_prefix() {
        let options = StoreOptions::default();
        let store = Store::open("/tmp/kolo-unit/base", &options).unwrap();
        assert_eq!(store.path("").unwrap().as_ref(), "tmp/kolo-unit/base");
        assert_eq!(
            store.path("runs/r1/").unwrap().as_ref(),
            "tmp/kolo-unit/base/runs/r1"
        );
        assert_eq!(
            store.path("a//b/./c").unwrap().as_ref(),
            "tmp/kolo-unit/base/a/b/c"
        );
        for escaping in ["/a", "..", "runs/../../x", "a\0b"] {
            assert!(
                matches!(store.path(escaping), Err(Error::UnsafeKey { .. })),
                "{escaping:?}"
            );
            assert!(store.local_path(escaping).is_err(), "{escaping:?}");
        }
        assert_eq!(
            store.url_of("runs/r1"),
            "file:///tmp/kolo-unit/base/runs/r1"
        );
        assert_eq!(store.url_of(""), "file:///tmp/kolo-unit/base");
        assert_eq!(
            store.local_path("a/b").unwrap(),
            Some(PathBuf::from("/tmp/kolo-unit/base/a/b"))
        );
    }

    #[cfg(feature = "aws")]
    #[test]
    fn remote_stores_have_no_local_path() {
        let mut options = StoreOptions::default();
        options
            .storage_options
            .insert("aws_region".into(), "us-east-1".into());
        let store = Store::open("s3://bucket/pre", &options).unwrap();
        assert_eq!(store.url(), "s3://bucket/pre");
        assert_eq!(store.local_path("x").unwrap(), None);
        assert_eq!(store.path("runs/r1").unwrap().as_ref(), "pre/runs/r1");
        assert_eq!(store.url_of("runs/r1"), "s3://bucket/pre/runs/r1");
    }

    #[cfg(feature = "hdfs")]
    #[test]
    fn hdfs_staging_files_are_recognized() {
        let store = Store::open("hdfs://127.0.0.1:1/base", &StoreOptions::default()).unwrap();
        assert!(store.is_staging_file(&Path::from("base/.checkpoint.tmp.1")));
        assert!(!store.is_staging_file(&Path::from("base/checkpoint")));
        assert!(!store.is_staging_file(&Path::from("base/.hidden.tmp.x")));
    }
}
