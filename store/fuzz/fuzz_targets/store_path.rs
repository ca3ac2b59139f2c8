//! The store's path parsing: a location string (local path, `file://`, `dbfs:/`, `s3://`,
//! `gs://`, `az://`, `abfs[s]://`, `hdfs://`) resolved by `Store::resolve_url`, and the
//! relative path every store operation takes, applied to a local store.
//!
//! Input: UTF-8 text, used as both. To fuzz another entry point, change [`parse_location`] or
//! [`resolve_relative`] only.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use kolo_store::{Store, StoreOptions};
use libfuzzer_sys::fuzz_target;

/// The local store the relative paths are resolved in (opening it touches no file).
const ROOT: &str = "/kolo-fuzz-root/store";

fn options() -> StoreOptions {
    StoreOptions {
        storage_options: Default::default(),
        dbfs_mount: PathBuf::from("/mnt/kolo-fuzz-dbfs"),
    }
}

/// The location parser's public entry point: the canonical URL of `location`.
fn parse_location(location: &str) -> Option<String> {
    Store::resolve_url(location, &options()).ok()
}

/// A relative path inside the store: its client key, URL and local path.
fn resolve_relative(store: &Store, rel: &str) {
    // Every key the store accepts stays under its prefix (`..`, absolute and NUL are refused).
    if let Ok(key) = store.path(rel) {
        assert!(
            key.as_ref().starts_with(&ROOT[1..]),
            "key {key} left the prefix"
        );
    }
    let url = store.url_of(rel);
    assert!(url.starts_with(store.url()), "{url} left {}", store.url());
    if let Ok(Some(path)) = store.local_path(rel) {
        assert!(path.starts_with(ROOT), "{} left {ROOT}", path.display());
    }
    // The key parser itself: whatever it accepts has no `..`, empty or absolute component.
    if let Ok(key) = kolo_store::parse_key(rel) {
        let text = key.as_str();
        assert!(!text.starts_with('/'), "{rel:?} parsed to absolute {text:?}");
        assert!(
            text.is_empty() || text.split('/').all(|part| !part.is_empty() && part != ".."),
            "{rel:?} parsed to {text:?}"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(url) = parse_location(text) {
        // The canonical URL is a fixed point: it resolves to itself.
        assert_eq!(
            parse_location(&url).as_deref(),
            Some(url.as_str()),
            "{text:?} resolved to {url:?}, which does not resolve to itself"
        );
    }
    static STORE: OnceLock<Store> = OnceLock::new();
    let store = STORE.get_or_init(|| Store::open(ROOT, &options()).expect("a local store opens"));
    resolve_relative(store, text);
});
