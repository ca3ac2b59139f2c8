//! Uploading a local directory to a store prefix, changed files only.
//!
//! A file is uploaded unless the store already has an object of the same size that is known to
//! be current: either this `Store` uploaded it from the same (size, mtime) and the object's
//! entity tag is still the one that upload returned, or the object's `last_modified` is in a
//! later whole second than the file's mtime. The second-granularity comparison means a file
//! rewritten in the same second as its upload is uploaded again rather than missed.

use std::path::{Path as FsPath, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use futures::{StreamExt, TryStreamExt};

use crate::error::{Error, Result};
use crate::store::{ObjectInfo, Store};

/// How many files upload at once.
const PARALLEL_UPLOADS: usize = 4;

/// What [`Store::sync_dir`] did; file names are relative to the local directory, sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Files uploaded (new or changed).
    pub uploaded: Vec<String>,
    /// Files skipped because the store already had them.
    pub unchanged: Vec<String>,
    /// Bytes uploaded.
    pub bytes_uploaded: u64,
}

/// What one upload of a local file left in the store.
#[derive(Debug, Clone)]
pub(crate) struct Synced {
    size: u64,
    mtime: SystemTime,
    e_tag: Option<String>,
}

/// A regular file under the directory being synced.
#[derive(Debug)]
struct LocalFile {
    name: String,
    path: PathBuf,
    size: u64,
    mtime: SystemTime,
}

pub(crate) async fn sync_dir(store: &Store, local_dir: &FsPath, rel: &str) -> Result<SyncReport> {
    let dir = local_dir.to_path_buf();
    let files = tokio::task::spawn_blocking(move || walk(&dir))
        .await
        .map_err(|err| Error::Internal(format!("the directory walk panicked: {err}")))??;
    let remote: std::collections::HashMap<String, ObjectInfo> = store
        .list(rel)
        .await?
        .into_iter()
        .map(|info| (info.rel.clone(), info))
        .collect();
    let skip = store.path("")?.parts().count();
    let rel_prefix: Vec<String> = store
        .path(rel)?
        .parts()
        .skip(skip)
        .map(|p| p.as_ref().to_string())
        .collect();
    let key_of = |name: &str| {
        let mut parts = rel_prefix.clone();
        parts.push(name.to_string());
        parts.join("/")
    };

    let mut report = SyncReport::default();
    let mut todo = Vec::new();
    for file in files {
        let key = key_of(&file.name);
        if is_current(store, &key, &file, remote.get(&key)) {
            report.unchanged.push(file.name);
        } else {
            todo.push((key, file));
        }
    }
    let uploaded: Vec<(String, u64)> = futures::stream::iter(todo)
        .map(|(key, file)| async move {
            let data = tokio::fs::read(&file.path)
                .await
                .map_err(|source| Error::Io {
                    operation: "read",
                    path: file.path.clone(),
                    source,
                })?;
            let result = store.put_inner(&key, data.into()).await?;
            let synced = Synced {
                size: file.size,
                mtime: file.mtime,
                e_tag: result.e_tag,
            };
            lock(store).insert(key, synced);
            Ok::<_, Error>((file.name, file.size))
        })
        .buffer_unordered(PARALLEL_UPLOADS)
        .try_collect()
        .await?;
    for (name, size) in uploaded {
        report.bytes_uploaded += size;
        report.uploaded.push(name);
    }
    report.uploaded.sort();
    report.unchanged.sort();
    Ok(report)
}

fn lock(store: &Store) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Synced>> {
    store
        .synced()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The skip rule of the module docs.
fn is_current(store: &Store, key: &str, file: &LocalFile, remote: Option<&ObjectInfo>) -> bool {
    let Some(remote) = remote else {
        return false;
    };
    if remote.size != file.size {
        return false;
    }
    if let Some(synced) = lock(store).get(key) {
        if synced.size == file.size
            && synced.mtime == file.mtime
            && synced.e_tag.is_some()
            && synced.e_tag == remote.e_tag
        {
            return true;
        }
    }
    whole_seconds(remote.last_modified) > whole_seconds(file.mtime)
}

fn whole_seconds(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Every regular file under `dir` (symlinks to files followed, symlinked directories not),
/// named `/`-relative to `dir`.
fn walk(dir: &FsPath) -> Result<Vec<LocalFile>> {
    let io = |operation, path: &FsPath, source| Error::Io {
        operation,
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(dir).map_err(|e| io("stat", dir, e))?;
    if !meta.is_dir() {
        return Err(io(
            "sync_dir",
            dir,
            std::io::Error::new(
                std::io::ErrorKind::NotADirectory,
                "not a directory; pass the directory to sync",
            ),
        ));
    }
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), String::new())];
    while let Some((path, name)) = stack.pop() {
        for entry in std::fs::read_dir(&path).map_err(|e| io("read_dir", &path, e))? {
            let entry = entry.map_err(|e| io("read_dir", &path, e))?;
            let child = entry.path();
            let Some(file_name) = entry.file_name().to_str().map(str::to_string) else {
                log::warn!("sync_dir skips {} (name is not UTF-8)", child.display());
                continue;
            };
            let child_name = if name.is_empty() {
                file_name
            } else {
                format!("{name}/{file_name}")
            };
            let kind = entry.file_type().map_err(|e| io("stat", &child, e))?;
            if kind.is_dir() {
                stack.push((child, child_name));
                continue;
            }
            let meta = std::fs::metadata(&child).map_err(|e| io("stat", &child, e))?;
            if !meta.is_file() {
                continue;
            }
            let mtime = meta.modified().map_err(|e| io("stat", &child, e))?;
            out.push(LocalFile {
                name: child_name,
                path: child,
                size: meta.len(),
                mtime,
            });
        }
    }
    Ok(out)
}
