//! Integration tests of kolo-store: the Store API on real local directories (and the remote
//! code paths over `object_store::memory::InMemory`).

use std::path::Path as FsPath;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use kolo_store::{layout, Error, Store, StoreOptions};
use object_store::memory::InMemory;
use object_store::path::Path;

fn local_store(dir: &FsPath) -> Store {
    Store::open(dir.to_str().unwrap(), &StoreOptions::default()).unwrap()
}

fn memory_store() -> Store {
    Store::from_object_store(
        "memory:///base",
        Arc::new(InMemory::new()),
        Path::from("base"),
    )
}

fn write(path: &FsPath, data: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, data).unwrap();
}

fn set_mtime(path: &FsPath, time: SystemTime) {
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(time)
        .unwrap();
}

async fn round_trip(store: &Store) {
    let key = layout::checkpoint("run_1").unwrap();
    assert!(!store.exists(&key).await.unwrap());
    store
        .put_atomic(&key, Bytes::from_static(b"v1"))
        .await
        .unwrap();
    store
        .put_atomic("runs/run_1/logs/events", Bytes::from_static(b"log"))
        .await
        .unwrap();
    store
        .put_atomic(&layout::train_data(Some(0)), Bytes::from_static(b"part"))
        .await
        .unwrap();
    assert_eq!(store.get(&key).await.unwrap(), Bytes::from_static(b"v1"));
    store
        .put_atomic(&key, Bytes::from_static(b"version two"))
        .await
        .unwrap();
    assert_eq!(
        store.get(&key).await.unwrap(),
        Bytes::from_static(b"version two")
    );

    assert!(store.exists(&key).await.unwrap());
    assert!(
        store.exists(&layout::run("run_1").unwrap()).await.unwrap(),
        "a non-empty directory exists"
    );
    assert!(!store.exists("runs/other").await.unwrap());

    let listed = store.list(layout::RUNS).await.unwrap();
    let names: Vec<&str> = listed.iter().map(|info| info.rel.as_str()).collect();
    assert_eq!(names, ["runs/run_1/checkpoint", "runs/run_1/logs/events"]);
    assert_eq!(listed[0].size, 11);
    assert!(store.list("missing").await.unwrap().is_empty());
    assert_eq!(store.list("").await.unwrap().len(), 3);

    store.delete(&layout::logs("run_1").unwrap()).await.unwrap();
    assert!(!store.exists("runs/run_1/logs/events").await.unwrap());
    assert!(store.exists(&key).await.unwrap());
    store.delete(&key).await.unwrap();
    assert!(!store.exists(&key).await.unwrap());
    store.delete("never/was").await.unwrap();
    store.delete("").await.unwrap();
    assert!(store.list("").await.unwrap().is_empty());
}

#[tokio::test]
async fn local_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let store = local_store(&dir.path().join("store"));
    round_trip(&store).await;
}

#[tokio::test]
async fn memory_round_trip_exercises_the_remote_paths() {
    round_trip(&memory_store()).await;
}

#[tokio::test]
async fn local_writes_land_where_local_path_says() {
    let dir = tempfile::tempdir().unwrap();
    let store = local_store(dir.path());
    store
        .put_atomic("a/b.txt", Bytes::from_static(b"hello"))
        .await
        .unwrap();
    let path = store.local_path("a/b.txt").unwrap().unwrap();
    assert_eq!(path, dir.path().join("a/b.txt"));
    assert_eq!(std::fs::read(&path).unwrap(), b"hello");
    // No staging file is left beside the object.
    let names: Vec<_> = std::fs::read_dir(dir.path().join("a"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["b.txt"]);
}

#[tokio::test]
async fn dbfs_paths_map_onto_the_configured_mount() {
    let mount = tempfile::tempdir().unwrap();
    let options = StoreOptions {
        dbfs_mount: mount.path().to_path_buf(),
        ..StoreOptions::default()
    };
    for location in ["dbfs:/jobs/x", "/dbfs/jobs/x", "file:///dbfs/jobs/x"] {
        let store = Store::open(location, &options).unwrap();
        assert_eq!(
            store.local_path("").unwrap(),
            Some(mount.path().join("jobs/x")),
            "{location}"
        );
        store
            .put_atomic("f", Bytes::from(location.to_string()))
            .await
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(mount.path().join("jobs/x/f")).unwrap(),
            location
        );
    }
}

#[tokio::test]
async fn missing_objects_are_not_found_errors_naming_the_url() {
    let dir = tempfile::tempdir().unwrap();
    let store = local_store(dir.path());
    let err = store.get("runs/nope/checkpoint").await.unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("runs/nope/checkpoint") && message.contains("file://"),
        "{message}"
    );
    let err = memory_store().get("x").await.unwrap_err();
    assert!(
        matches!(&err, Error::NotFound { url, .. } if url == "memory:///base/x"),
        "{err:?}"
    );
}

#[tokio::test]
async fn sync_dir_uploads_changed_files_only() {
    for remote in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let local = dir.path().join("local");
        write(&local.join("model.pt"), b"weights-1");
        write(&local.join("logs/events.1"), b"e1");
        let store = if remote {
            memory_store()
        } else {
            local_store(&dir.path().join("store"))
        };

        let first = store.sync_dir(&local, "runs/r").await.unwrap();
        assert_eq!(first.uploaded, ["logs/events.1", "model.pt"]);
        assert_eq!(first.bytes_uploaded, 11);
        assert_eq!(
            store.get("runs/r/logs/events.1").await.unwrap(),
            Bytes::from_static(b"e1")
        );

        let second = store.sync_dir(&local, "runs/r").await.unwrap();
        assert!(second.uploaded.is_empty(), "remote={remote}: {second:?}");
        assert_eq!(second.unchanged, ["logs/events.1", "model.pt"]);

        // Same size, new content, new mtime: uploaded.
        write(&local.join("model.pt"), b"weights-2");
        set_mtime(
            &local.join("model.pt"),
            SystemTime::now() + Duration::from_secs(5),
        );
        // A new file.
        write(&local.join("logs/events.2"), b"e2");
        let third = store.sync_dir(&local, "runs/r").await.unwrap();
        assert_eq!(
            third.uploaded,
            ["logs/events.2", "model.pt"],
            "remote={remote}"
        );
        assert_eq!(third.unchanged, ["logs/events.1"]);
        assert_eq!(
            store.get("runs/r/model.pt").await.unwrap(),
            Bytes::from_static(b"weights-2")
        );

        // Removing a local file keeps the remote copy.
        std::fs::remove_file(local.join("logs/events.1")).unwrap();
        store.sync_dir(&local, "runs/r").await.unwrap();
        assert!(store.exists("runs/r/logs/events.1").await.unwrap());
    }
}

#[tokio::test]
async fn sync_dir_in_a_fresh_process_trusts_size_and_time() {
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("local");
    write(&local.join("old.bin"), b"0123456789");
    set_mtime(
        &local.join("old.bin"),
        SystemTime::now() - Duration::from_secs(60),
    );
    write(&local.join("grown.bin"), b"abc");
    let root = dir.path().join("store");
    local_store(&root).sync_dir(&local, "").await.unwrap();

    // A new Store (as in a new process) knows nothing of the earlier upload.
    write(&local.join("grown.bin"), b"abcd");
    let report = local_store(&root).sync_dir(&local, "").await.unwrap();
    assert_eq!(report.uploaded, ["grown.bin"]);
    assert_eq!(report.unchanged, ["old.bin"]);
}

#[tokio::test]
async fn sync_dir_of_a_missing_directory_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let err = local_store(dir.path())
        .sync_dir(&missing, "runs/r")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Io { path, .. } if path == &missing),
        "{err:?}"
    );
}

#[test]
fn bad_locations_fail_at_open() {
    let options = StoreOptions::default();
    for (location, want) in [
        ("", "empty"),
        ("ftp://host/x", "unsupported store scheme"),
        ("s3://", "no bucket"),
        ("dbfs://x/y", "dbfs:/path"),
    ] {
        let err = Store::open(location, &options).unwrap_err().to_string();
        assert!(err.contains(want), "{location:?}: {err}");
    }
}

#[cfg(feature = "aws")]
#[tokio::test]
async fn an_unreachable_endpoint_fails_within_seconds() {
    let mut options = StoreOptions::default();
    for (key, value) in [
        // Nothing listens on port 9 (discard) of localhost in the test environment.
        ("aws_endpoint", "http://127.0.0.1:9"),
        ("aws_allow_http", "true"),
        ("aws_access_key_id", "k"),
        ("aws_secret_access_key", "s"),
        ("aws_region", "us-east-1"),
    ] {
        options.storage_options.insert(key.into(), value.into());
    }
    let store = Store::open("s3://bucket/pre", &options).unwrap();
    let started = std::time::Instant::now();
    let err = store.get("x").await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
    let message = err.to_string();
    assert!(
        message.contains("s3://bucket/pre/x") && message.contains("endpoint"),
        "{message}"
    );
}

/// Every key that could leave the store: `..` components, absolute, NUL, control characters.
const ESCAPING_KEYS: [&str; 7] = [
    "..",
    "../x",
    "a/../../b",
    "runs/../../outside",
    "/abs",
    "a\0b",
    "a\nb",
];

/// Where `..` from a store rooted at `a/store` or from its `runs/r1` would land.
const SENTINELS: [&str; 6] = [
    "outside/keep",
    "a/outside/keep",
    "x/keep",
    "b/keep",
    "a/x/keep",
    "a/b/keep",
];

#[tokio::test]
async fn no_operation_reaches_outside_the_store_root() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("a/store");
    std::fs::create_dir_all(root.join("runs/r1")).unwrap();
    for sentinel in SENTINELS {
        write(&dir.path().join(sentinel), b"sentinel");
    }
    let store = local_store(&root);
    let other = tempfile::tempdir().unwrap();
    write(&other.path().join("f"), b"local");
    for key in ESCAPING_KEYS {
        let refused = |result: Result<(), Error>| match result {
            Err(Error::UnsafeKey { key: named, .. }) => assert_eq!(named, key),
            other => panic!("{key:?}: {other:?}"),
        };
        refused(store.delete(key).await);
        refused(store.exists(key).await.map(|_| ()));
        refused(store.get(key).await.map(|_| ()));
        refused(store.list(key).await.map(|_| ()));
        refused(store.put_atomic(key, Bytes::from_static(b"x")).await);
        refused(store.sync_dir(other.path(), key).await.map(|_| ()));
        refused(store.local_path(key).map(|_| ()));
        refused(store.path(key).map(|_| ()));
    }
    for sentinel in SENTINELS {
        assert_eq!(
            std::fs::read(dir.path().join(sentinel)).unwrap(),
            b"sentinel",
            "{sentinel}"
        );
    }
    // The store's own content is untouched too.
    assert!(root.join("runs/r1").is_dir());
}

#[tokio::test]
async fn a_bad_run_id_never_becomes_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let store = local_store(&dir.path().join("store"));
    store
        .put_atomic("runs/keep/checkpoint", Bytes::from_static(b"x"))
        .await
        .unwrap();
    for run_id in ["..", "../x", "a/../../b", "/abs", "a\0b", ""] {
        match layout::run(run_id) {
            Err(Error::InvalidRunId { run_id: named, .. }) => assert_eq!(named, run_id),
            other => panic!("{run_id:?}: {other:?}"),
        }
        assert!(layout::checkpoint(run_id).is_err() && layout::logs(run_id).is_err());
    }
    assert!(store.exists("runs/keep/checkpoint").await.unwrap());
}
