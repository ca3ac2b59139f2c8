//! Reclaiming the temporary files of writers that died mid-write. A local store writes an
//! object atomically through a staging file beside it, `<name>#<n>` (`object_store`'s
//! `LocalFileSystem`), renamed over the target when complete; a writer killed before the
//! rename leaves the staging file behind, invisible to listings but holding disk space. After
//! each successful write, the staging files in the same directory that nobody has written to
//! for [`STALE_AFTER`] are removed: a live writer keeps its file's modification time fresh.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How long a staging file must have gone unmodified to count as a dead writer's.
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(15 * 60);

/// Whether `name` is a staging file name: `<something>#<digits>`.
pub(crate) fn is_staging_name(name: &str) -> bool {
    match name.rsplit_once('#') {
        Some((base, n)) => {
            !base.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
        }
        None => false,
    }
}

/// Removes the stale staging files in the directory of `target`; returns what it removed.
/// Failures are logged and skipped (the write that triggered this already succeeded).
pub(crate) async fn reclaim_beside(target: PathBuf, stale_after: Duration) -> Vec<PathBuf> {
    let Some(dir) = target.parent().map(Path::to_path_buf) else {
        return Vec::new();
    };
    tokio::task::spawn_blocking(move || reclaim_in(&dir, stale_after, SystemTime::now()))
        .await
        .unwrap_or_default()
}

/// The blocking part of [`reclaim_beside`], with the clock passed in.
pub(crate) fn reclaim_in(dir: &Path, stale_after: Duration, now: SystemTime) -> Vec<PathBuf> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) => {
            log::debug!(
                "cannot list {} for stale staging files: {err}",
                dir.display()
            );
            return Vec::new();
        }
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_str().is_some_and(is_staging_name) {
            continue;
        }
        // Regular files only, never through a symlink.
        let Ok(meta) = entry.metadata() else { continue };
        let stale = meta.is_file()
            && meta
                .modified()
                .ok()
                .and_then(|modified| now.duration_since(modified).ok())
                .is_some_and(|age| age >= stale_after);
        if !stale {
            continue;
        }
        let path = entry.path();
        match std::fs::remove_file(&path) {
            Ok(()) => {
                log::info!(
                    "removed {} ({} bytes), the temporary file of a write that never finished",
                    path.display(),
                    meta.len()
                );
                removed.push(path);
            }
            Err(err) => log::debug!("cannot remove the stale {}: {err}", path.display()),
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_old_staging_files_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let now = SystemTime::now();
        let hour_ago = now - Duration::from_secs(3600);
        let make = |name: &str, mtime: SystemTime| {
            let path = dir.path().join(name);
            std::fs::write(&path, b"x").unwrap();
            std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(mtime)
                .unwrap();
            path
        };
        let dead = make("checkpoint#1", hour_ago);
        let live = make("checkpoint#2", now);
        let data = make("checkpoint", hour_ago);
        let not_staging = make("notes#draft", hour_ago);
        let removed = reclaim_in(dir.path(), STALE_AFTER, now);
        assert_eq!(removed, std::slice::from_ref(&dead));
        assert!(!dead.exists() && live.exists() && data.exists() && not_staging.exists());
        assert!(
            is_staging_name("a.parquet#12") && !is_staging_name("#1") && !is_staging_name("a#")
        );
    }
}
