//! Resolving a location string (local path, `file://`, `dbfs:/`, `s3://`, `gs://`, `az://`,
//! `abfs[s]://`, `hdfs://`) into what the backend needs: which backend, the URL its builder
//! takes, the prefix inside it, and the canonical URL kolo reports.

use std::path::{Component, Path as FsPath, PathBuf};

use object_store::path::Path;
use url::Url;

use crate::error::{Error, Result};

/// The remote backends, one per cargo feature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    /// Amazon S3 and S3-compatible servers (`s3://`, `s3a://`).
    S3,
    /// Google Cloud Storage (`gs://`, `gcs://`).
    Gcs,
    /// Azure Blob Storage / ADLS Gen2 (`az://`, `azure://`, `adl://`, `abfs://`, `abfss://`).
    Azure,
    /// HDFS through the native client (`hdfs://`, `viewfs://`).
    Hdfs,
}

impl Backend {
    /// Short name used in messages.
    #[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
    pub(crate) fn name(self) -> &'static str {
        match self {
            Backend::S3 => "s3",
            Backend::Gcs => "gcs",
            Backend::Azure => "azure",
            Backend::Hdfs => "hdfs",
        }
    }

    /// The cargo feature that compiles the backend in.
    #[cfg(not(all(feature = "aws", feature = "gcp", feature = "azure", feature = "hdfs")))]
    pub(crate) fn feature(self) -> &'static str {
        match self {
            Backend::S3 => "aws",
            Backend::Gcs => "gcp",
            Backend::Azure => "azure",
            Backend::Hdfs => "hdfs",
        }
    }
}

/// A resolved store location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Location {
    /// A directory on a local (or FUSE-mounted, such as `/dbfs`) filesystem.
    Local {
        /// Absolute, lexically normalized directory.
        root: PathBuf,
    },
    /// A prefix in a remote store.
    Remote {
        /// Which backend.
        backend: Backend,
        /// What the backend builder's `with_url` takes (`s3://bucket`, `hdfs://nn:8020`);
        /// `None` for `hdfs:///path` (the namenode comes from `fs.defaultFS`).
        builder_url: Option<String>,
        /// `scheme://authority` of the canonical URL.
        base: String,
        /// The prefix inside the store.
        prefix: Path,
    },
}

impl Location {
    /// Resolves `location`; `dbfs_mount` is where `dbfs:/x`, `/dbfs/x` and `file:///dbfs/x` point.
    pub(crate) fn parse(location: &str, dbfs_mount: &FsPath) -> Result<Location> {
        let trimmed = location.trim();
        if trimmed.is_empty() {
            return Err(invalid(
                location,
                "the location is empty; pass a path or a URL",
            ));
        }
        if let Some(rest) = trimmed.strip_prefix("dbfs:") {
            if rest.starts_with("//") {
                return Err(invalid(
                    location,
                    "dbfs:// URLs (the DBFS REST API) are not supported; write dbfs:/path, which \
                     maps onto the /dbfs mount of the cluster",
                ));
            }
            if !rest.starts_with('/') {
                return Err(invalid(location, "write DBFS paths as dbfs:/path"));
            }
            return local(
                location,
                PathBuf::from("/dbfs").join(rest.trim_start_matches('/')),
                dbfs_mount,
            );
        }
        if trimmed.starts_with('/') {
            return local(location, PathBuf::from(trimmed), dbfs_mount);
        }
        match scheme_of(trimmed) {
            Some(_) => parse_url(location, trimmed, dbfs_mount),
            None => {
                let cwd = std::env::current_dir().map_err(|source| Error::Io {
                    operation: "reading the current directory",
                    path: PathBuf::from("."),
                    source,
                })?;
                local(location, cwd.join(trimmed), dbfs_mount)
            }
        }
    }

    /// The canonical URL of the location (`file:///abs/dir`, `s3://bucket/prefix`, ...), without
    /// a trailing slash.
    pub(crate) fn url(&self) -> String {
        match self {
            Location::Local { root } => match Url::from_file_path(root) {
                Ok(url) => url.to_string().trim_end_matches('/').to_string(),
                Err(()) => format!("file://{}", root.display()),
            },
            Location::Remote { base, prefix, .. } => {
                if prefix.as_ref().is_empty() {
                    return base.clone();
                }
                // The prefix's parts are raw (decoded) text: percent-encode each as a URL path
                // segment, so that `?`, `#`, `%` or a trailing space in a key name cannot make
                // the URL name another prefix.
                match Url::parse(base) {
                    Ok(mut url) if !url.cannot_be_a_base() => {
                        if let Ok(mut segments) = url.path_segments_mut() {
                            segments.clear().extend(prefix.parts());
                        }
                        url.to_string()
                    }
                    _ => format!("{base}/{prefix}"),
                }
            }
        }
    }
}

/// The URL scheme of `s` when it starts with one (at least two characters, so that nothing
/// resembling a drive letter counts).
fn scheme_of(s: &str) -> Option<&str> {
    let end = s.find(':')?;
    let scheme = &s[..end];
    let mut chars = scheme.chars();
    let first = chars.next()?;
    (scheme.len() >= 2
        && first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
    .then_some(scheme)
}

fn parse_url(location: &str, trimmed: &str, dbfs_mount: &FsPath) -> Result<Location> {
    let url = Url::parse(trimmed).map_err(|source| Error::MalformedUrl {
        location: location.to_string(),
        source,
    })?;
    let scheme = url.scheme().to_ascii_lowercase();
    let backend = match scheme.as_str() {
        "file" => {
            match url.host_str() {
                None | Some("") | Some("localhost") => {}
                Some(host) => {
                    return Err(invalid(
                        location,
                        &format!(
                            "file:// URLs name a local path, not host {host:?}; write \
                             file:///abs/path (three slashes)"
                        ),
                    ))
                }
            }
            let path = url.to_file_path().map_err(|()| {
                invalid(
                    location,
                    "the file:// URL does not name an absolute local path",
                )
            })?;
            return local(location, path, dbfs_mount);
        }
        "s3" | "s3a" => Backend::S3,
        "gs" | "gcs" => Backend::Gcs,
        "az" | "azure" | "adl" | "abfs" | "abfss" => Backend::Azure,
        "hdfs" | "viewfs" => Backend::Hdfs,
        _ => {
            return Err(Error::UnsupportedScheme {
                location: location.to_string(),
                scheme,
            })
        }
    };
    let host = url.host_str().unwrap_or("");
    if host.is_empty() && backend != Backend::Hdfs {
        let what = if backend == Backend::Azure {
            "container"
        } else {
            "bucket"
        };
        return Err(invalid(
            location,
            &format!("the URL names no {what}; write {scheme}://{what}/path"),
        ));
    }
    let prefix = Path::from_url_path(url.path()).map_err(|source| Error::BadPath {
        location: location.to_string(),
        source,
    })?;
    let (builder_url, base) = match backend {
        Backend::S3 | Backend::Gcs => {
            let canonical = if backend == Backend::S3 { "s3" } else { "gs" };
            (
                Some(format!("{scheme}://{host}")),
                format!("{canonical}://{host}"),
            )
        }
        Backend::Azure => {
            let authority = authority(&url);
            let base = format!("{scheme}://{authority}");
            (Some(base.clone()), base)
        }
        Backend::Hdfs => {
            let authority = authority(&url);
            let base = format!("{scheme}://{authority}");
            ((!authority.is_empty()).then(|| base.clone()), base)
        }
    };
    Ok(Location::Remote {
        backend,
        builder_url,
        base,
        prefix,
    })
}

/// `user@host:port` of a URL, as written.
fn authority(url: &Url) -> String {
    let mut out = String::new();
    if !url.username().is_empty() {
        out.push_str(url.username());
        out.push('@');
    }
    out.push_str(url.host_str().unwrap_or(""));
    if let Some(port) = url.port() {
        out.push_str(&format!(":{port}"));
    }
    out
}

/// A local directory, with `/dbfs` remapped onto `dbfs_mount`.
fn local(location: &str, path: PathBuf, dbfs_mount: &FsPath) -> Result<Location> {
    let path = normalize(&path);
    if !path.is_absolute() {
        return Err(invalid(
            location,
            "the local path does not resolve to an absolute path",
        ));
    }
    let root = match path.strip_prefix("/dbfs") {
        Ok(rest) if dbfs_mount != FsPath::new("/dbfs") => normalize(&dbfs_mount.join(rest)),
        _ => path,
    };
    Ok(Location::Local { root })
}

/// Lexical normalization: drops `.`, resolves `..` against earlier components.
fn normalize(path: &FsPath) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

fn invalid(location: &str, reason: &str) -> Error {
    Error::InvalidLocation {
        location: location.to_string(),
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Location> {
        Location::parse(s, FsPath::new("/mnt/fake-dbfs"))
    }

    fn local_root(s: &str) -> PathBuf {
        match parse(s).unwrap() {
            Location::Local { root } => root,
            other => panic!("{s} resolved to {other:?}"),
        }
    }

    fn remote(s: &str) -> (Backend, Option<String>, String, String) {
        match parse(s).unwrap() {
            Location::Remote {
                backend,
                builder_url,
                base,
                prefix,
            } => (backend, builder_url, base, prefix.to_string()),
            other => panic!("{s} resolved to {other:?}"),
        }
    }

    #[test]
    fn local_paths_and_file_urls() {
        assert_eq!(local_root("/tmp/a/b"), PathBuf::from("/tmp/a/b"));
        assert_eq!(local_root("/tmp/a/./b/../c/"), PathBuf::from("/tmp/a/c"));
        assert_eq!(local_root("file:///tmp/a"), PathBuf::from("/tmp/a"));
        assert_eq!(local_root("file:/tmp/a"), PathBuf::from("/tmp/a"));
        assert_eq!(
            local_root("file://localhost/tmp/a"),
            PathBuf::from("/tmp/a")
        );
        assert_eq!(
            local_root("file:///tmp/with%20space"),
            PathBuf::from("/tmp/with space")
        );
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(local_root("rel/dir"), cwd.join("rel/dir"));
        assert_eq!(parse("/tmp/a").unwrap().url(), "file:///tmp/a");
        assert_eq!(
            parse("/tmp/with space/").unwrap().url(),
            "file:///tmp/with%20space"
        );
    }

    #[test]
    fn dbfs_forms_map_onto_the_mount() {
        let want = PathBuf::from("/mnt/fake-dbfs/x/y");
        assert_eq!(local_root("dbfs:/x/y"), want);
        assert_eq!(local_root("/dbfs/x/y"), want);
        assert_eq!(local_root("file:///dbfs/x/y"), want);
        assert_eq!(local_root("/dbfs"), PathBuf::from("/mnt/fake-dbfs"));
        // A sibling that merely starts with the same letters is not DBFS.
        assert_eq!(local_root("/dbfsx/y"), PathBuf::from("/dbfsx/y"));
        // With the default mount, /dbfs stays /dbfs.
        let real = Location::parse("dbfs:/x", FsPath::new("/dbfs")).unwrap();
        assert_eq!(
            real,
            Location::Local {
                root: PathBuf::from("/dbfs/x")
            }
        );
    }

    #[test]
    fn dbfs_double_slash_and_relative_are_refused() {
        let err = parse("dbfs://workspace/x").unwrap_err().to_string();
        assert!(err.contains("dbfs:/path"), "{err}");
        assert!(matches!(
            parse("dbfs:x"),
            Err(Error::InvalidLocation { .. })
        ));
    }

    #[test]
    fn s3_and_gcs() {
        let (backend, builder, base, prefix) = remote("s3://bucket/a/b/");
        assert_eq!(backend, Backend::S3);
        assert_eq!(builder.as_deref(), Some("s3://bucket"));
        assert_eq!((base.as_str(), prefix.as_str()), ("s3://bucket", "a/b"));
        assert_eq!(parse("s3a://bucket/a").unwrap().url(), "s3://bucket/a");
        assert_eq!(parse("s3://bucket").unwrap().url(), "s3://bucket");
        let (backend, builder, _, prefix) = remote("gs://bkt/p");
        assert_eq!(
            (backend, builder.as_deref(), prefix.as_str()),
            (Backend::Gcs, Some("gs://bkt"), "p")
        );
        assert_eq!(parse("gcs://bkt/p").unwrap().url(), "gs://bkt/p");
    }

    #[test]
    fn azure_forms_keep_their_authority() {
        let (backend, builder, _, prefix) = remote("az://container/runs");
        assert_eq!(
            (backend, builder.as_deref(), prefix.as_str()),
            (Backend::Azure, Some("az://container"), "runs")
        );
        let url = "abfss://fs@acct.dfs.core.windows.net/dir/sub";
        let (_, builder, _, prefix) = remote(url);
        assert_eq!(
            builder.as_deref(),
            Some("abfss://fs@acct.dfs.core.windows.net")
        );
        assert_eq!(prefix, "dir/sub");
        assert_eq!(parse(url).unwrap().url(), url);
    }

    #[test]
    fn hdfs_with_and_without_namenode() {
        let (backend, builder, base, prefix) = remote("hdfs://nn:8020/user/me/store");
        assert_eq!(backend, Backend::Hdfs);
        assert_eq!(builder.as_deref(), Some("hdfs://nn:8020"));
        assert_eq!(
            (base.as_str(), prefix.as_str()),
            ("hdfs://nn:8020", "user/me/store")
        );
        let (_, builder, base, prefix) = remote("hdfs:///user/me");
        assert_eq!(
            (builder, base.as_str(), prefix.as_str()),
            (None, "hdfs://", "user/me")
        );
    }

    #[test]
    fn bad_locations_are_typed_errors() {
        assert!(matches!(parse(""), Err(Error::InvalidLocation { .. })));
        assert!(matches!(parse("   "), Err(Error::InvalidLocation { .. })));
        assert!(matches!(
            parse("ftp://host/x"),
            Err(Error::UnsupportedScheme { scheme, .. }) if scheme == "ftp"
        ));
        assert!(matches!(
            parse("s3:///no-bucket"),
            Err(Error::InvalidLocation { .. })
        ));
        assert!(matches!(
            parse("az:///x"),
            Err(Error::InvalidLocation { .. })
        ));
        assert!(matches!(
            parse("s3://bad host/x"),
            Err(Error::MalformedUrl { .. })
        ));
        assert!(matches!(
            parse("hdfs://nn:99999/x"),
            Err(Error::MalformedUrl { .. })
        ));
        let err = parse("file://otherhost/x").unwrap_err().to_string();
        assert!(err.contains("three slashes"), "{err}");
        let err = parse("ftp://host/x").unwrap_err().to_string();
        assert!(
            err.contains("s3://"),
            "the message lists the accepted forms: {err}"
        );
    }

    /// Found by the `store_path` fuzz target (store/fuzz): a remote prefix holding a character
    /// that means something in a URL (`?`, `#`, `%`, a trailing space) was reported raw in the
    /// canonical URL, which then resolved to another prefix (`s3://b/a?b` is `s3://b/a`).
    #[test]
    fn canonical_remote_urls_resolve_to_themselves() {
        for location in [
            "hdfs:/020/us%3Fmer:/p/a/:/p/a/.o",
            "s3://b/a%3Fb/c",
            "gs://b/x%23frag",
            "az://c/100%2541",
            "s3://b/dir/trailing%20",
            "hdfs://nn:8020/user/a%20b",
        ] {
            let first = parse(location).unwrap();
            let url = first.url();
            assert_eq!(parse(&url).unwrap(), first, "{location} -> {url}");
            assert_eq!(parse(&url).unwrap().url(), url, "{location} -> {url}");
        }
        assert_eq!(parse("s3://b/a%3Fb").unwrap().url(), "s3://b/a%3Fb");
        assert_eq!(parse("s3://b/a b").unwrap().url(), "s3://b/a%20b");
    }

    #[test]
    fn scheme_detection() {
        assert_eq!(scheme_of("s3://x"), Some("s3"));
        assert_eq!(scheme_of("relative/dir"), None);
        assert_eq!(scheme_of("c:/x"), None);
        assert_eq!(scheme_of("dir with: colon"), None);
    }
}
