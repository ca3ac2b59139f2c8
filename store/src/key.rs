//! Store-relative keys and run ids, checked so that no operation reaches outside the store
//! root: [`parse_key`] is the one parser every [`crate::Store`] method runs its key through,
//! [`check_run_id`] the one check of a run id before it becomes part of a key.
//!
//! ```
//! use kolo_store::{check_run_id, parse_key, KeyRule};
//!
//! assert_eq!(parse_key("runs/r1//checkpoint").unwrap().as_str(), "runs/r1/checkpoint");
//! assert_eq!(parse_key("").unwrap().as_str(), ""); // the store root itself
//! assert!(matches!(
//!     parse_key("runs/../../etc"),
//!     Err(kolo_store::Error::UnsafeKey { rule: KeyRule::ParentComponent, .. })
//! ));
//! assert!(check_run_id("run_1").is_ok() && check_run_id("../x").is_err());
//! ```

use std::fmt;

use crate::error::{Error, Result};

/// Which rule a refused key or run id broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRule {
    /// A `..` component, which would climb out of the directory it names.
    ParentComponent,
    /// A leading `/`: an absolute path where a store-relative key is expected.
    Absolute,
    /// A NUL byte, which no filesystem or object store name may hold.
    Nul,
    /// Another ASCII control character (newline, tab, escape, ...).
    ControlCharacter,
    /// Empty, where a name is required (run ids).
    Empty,
    /// A `/` inside a name that must be one path component (run ids).
    Separator,
    /// `.` as a name that must be one path component (run ids).
    CurrentDirectory,
    /// Longer than [`MAX_RUN_ID_BYTES`] (run ids).
    TooLong,
}

impl fmt::Display for KeyRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyRule::ParentComponent => "it has a `..` component, which would leave the store",
            KeyRule::Absolute => {
                "it is absolute (starts with `/`) where a store-relative key is expected"
            }
            KeyRule::Nul => "it contains a NUL byte",
            KeyRule::ControlCharacter => "it contains a control character",
            KeyRule::Empty => "it is empty",
            KeyRule::Separator => "it contains `/`",
            KeyRule::CurrentDirectory => "it is `.`",
            KeyRule::TooLong => "it is longer than 255 bytes",
        })
    }
}

/// The longest run id: one file name on common filesystems.
pub const MAX_RUN_ID_BYTES: usize = 255;

/// A key that stays under the store root: its `/`-separated names, none empty, `.` or `..`,
/// none with a NUL or control character. No names: the root itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreKey {
    names: Vec<String>,
}

impl StoreKey {
    /// The names, root first.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }

    /// The names joined with `/` (`""` for the root).
    pub fn as_str(&self) -> String {
        self.names.join("/")
    }

    /// Whether the key is the store root itself.
    pub fn is_root(&self) -> bool {
        self.names.is_empty()
    }
}

/// Parses a store-relative key (`runs/r1/checkpoint`): a pure function, total over every
/// `&str`. Empty names (`a//b`, a trailing `/`) and `.` are dropped; `""` is the store root.
/// Refused with [`Error::UnsafeKey`] naming the key and the rule: a `..` component, a leading
/// `/`, a NUL byte or another control character.
pub fn parse_key(key: &str) -> Result<StoreKey> {
    let refuse = |rule| {
        Err(Error::UnsafeKey {
            key: key.to_string(),
            rule,
        })
    };
    if key.contains('\0') {
        return refuse(KeyRule::Nul);
    }
    if key.chars().any(|c| c.is_ascii_control()) {
        return refuse(KeyRule::ControlCharacter);
    }
    if key.starts_with('/') {
        return refuse(KeyRule::Absolute);
    }
    let mut names = Vec::new();
    for name in key.split('/') {
        match name {
            "" | "." => {}
            ".." => return refuse(KeyRule::ParentComponent),
            name => names.push(name.to_string()),
        }
    }
    Ok(StoreKey { names })
}

/// Checks a run id (`runs/<run_id>` names its directory): one non-empty path component, not
/// `.` or `..`, without `/`, NUL or control characters, at most [`MAX_RUN_ID_BYTES`] bytes.
/// [`Error::InvalidRunId`] naming the id and the rule otherwise.
pub fn check_run_id(run_id: &str) -> Result<&str> {
    let rule = if run_id.is_empty() {
        Some(KeyRule::Empty)
    } else if run_id.contains('\0') {
        Some(KeyRule::Nul)
    } else if run_id.chars().any(|c| c.is_ascii_control()) {
        Some(KeyRule::ControlCharacter)
    } else if run_id == ".." {
        Some(KeyRule::ParentComponent)
    } else if run_id == "." {
        Some(KeyRule::CurrentDirectory)
    } else if run_id.contains('/') {
        Some(KeyRule::Separator)
    } else if run_id.len() > MAX_RUN_ID_BYTES {
        Some(KeyRule::TooLong)
    } else {
        None
    };
    match rule {
        Some(rule) => Err(Error::InvalidRunId {
            run_id: run_id.to_string(),
            rule,
        }),
        None => Ok(run_id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule_of(key: &str) -> Option<KeyRule> {
        match parse_key(key) {
            Ok(_) => None,
            Err(Error::UnsafeKey { rule, .. }) => Some(rule),
            Err(other) => panic!("{key:?}: {other}"),
        }
    }

    #[test]
    fn keys_that_could_leave_the_root_are_refused_with_their_rule() {
        for (key, rule) in [
            ("..", KeyRule::ParentComponent),
            ("../x", KeyRule::ParentComponent),
            ("a/../../b", KeyRule::ParentComponent),
            ("a/..", KeyRule::ParentComponent),
            ("/abs", KeyRule::Absolute),
            ("/", KeyRule::Absolute),
            ("a\0b", KeyRule::Nul),
            ("a\nb", KeyRule::ControlCharacter),
        ] {
            assert_eq!(rule_of(key), Some(rule), "{key:?}");
        }
        let err = parse_key("runs/../../etc").unwrap_err().to_string();
        assert!(
            err.contains("runs/../../etc") && err.contains(".."),
            "{err}"
        );
    }

    #[test]
    fn ordinary_keys_normalize() {
        for (key, want) in [
            ("", ""),
            (".", ""),
            ("runs/r1/", "runs/r1"),
            ("a//b/./c", "a/b/c"),
            ("..a/b..", "..a/b.."),
            ("a b/ü", "a b/ü"),
        ] {
            assert_eq!(parse_key(key).unwrap().as_str(), want, "{key:?}");
        }
        assert!(parse_key("").unwrap().is_root());
    }

    #[test]
    fn run_ids_are_one_plain_name() {
        for (run_id, rule) in [
            ("..", KeyRule::ParentComponent),
            ("../x", KeyRule::Separator),
            ("a/../../b", KeyRule::Separator),
            ("/abs", KeyRule::Separator),
            ("a\0b", KeyRule::Nul),
            ("", KeyRule::Empty),
            (".", KeyRule::CurrentDirectory),
            ("a\tb", KeyRule::ControlCharacter),
        ] {
            match check_run_id(run_id) {
                Err(Error::InvalidRunId { rule: got, .. }) => assert_eq!(got, rule, "{run_id:?}"),
                other => panic!("{run_id:?}: {other:?}"),
            }
        }
        assert!(check_run_id(&"x".repeat(256)).is_err());
        for ok in [
            "run_1",
            "run_1732000000000",
            "2026-11-26T10:00",
            "a.b",
            "..x",
        ] {
            assert_eq!(check_run_id(ok).unwrap(), ok);
        }
    }
}
