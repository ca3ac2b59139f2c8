//! Host identity as Horovod computes it: `<short hostname>-<md5 hex>` of the hostname plus the
//! process's kernel namespaces (so two containers on one machine are two hosts) plus a salt.

use md5::{Digest, Md5};

use crate::control::env::{HOROVOD_HOSTNAME, HOSTNAME, HOST_HASH_SALT};
use crate::control::net::system_hostname;

const NAMESPACE_DIR: &str = "/proc/self/ns";

/// This host's identity: `KOLO_HOSTNAME`, else `HOROVOD_HOSTNAME`, else the system hostname.
pub fn hostname() -> String {
    hostname_from(|name| std::env::var(name).ok())
}

/// Like [`hostname`], reading the override variables through `lookup`.
pub fn hostname_from(lookup: impl Fn(&str) -> Option<String>) -> String {
    [HOSTNAME, HOROVOD_HOSTNAME]
        .into_iter()
        .filter_map(|name| lookup(name).map(|value| value.trim().to_owned()))
        .find(|value| !value.is_empty())
        .unwrap_or_else(system_hostname)
}

/// This process's host hash, as Horovod: `<short hostname>-<md5 hex of (hostname + readlink of
/// every /proc/self/ns/* entry in name order + salt)>`. The hostname is [`hostname`]; the salt is
/// `salt`, else `KOLO_HOST_HASH_SALT` when set.
pub fn host_hash(salt: Option<&str>) -> String {
    let env_salt = std::env::var(HOST_HASH_SALT)
        .ok()
        .filter(|value| !value.is_empty());
    host_hash_for(&hostname(), &namespaces(), salt.or(env_salt.as_deref()))
}

/// The host hash of `hostname` with the given namespace string and salt (pure; see
/// [`host_hash`]). The prefix is the hostname up to its first dot, or the whole name when it is
/// an IP address (so `127.0.0.1` stays recognisable).
pub fn host_hash_for(hostname: &str, namespaces: &str, salt: Option<&str>) -> String {
    let mut md5 = Md5::new();
    md5.update(hostname.as_bytes());
    md5.update(namespaces.as_bytes());
    if let Some(salt) = salt {
        md5.update(salt.as_bytes());
    }
    let short = if hostname.parse::<std::net::IpAddr>().is_ok() {
        hostname
    } else {
        hostname.split('.').next().unwrap_or(hostname)
    };
    format!("{short}-{}", hex::encode(md5.finalize()))
}

/// The readlink targets of every `/proc/self/ns/*` entry, in name order, concatenated; empty
/// where `/proc` has no namespaces.
pub fn namespaces() -> String {
    let Ok(entries) = std::fs::read_dir(NAMESPACE_DIR) else {
        return String::new();
    };
    let mut names: Vec<_> = entries
        .filter_map(|entry| entry.ok().map(|e| e.file_name()))
        .collect();
    names.sort();
    names
        .iter()
        .filter_map(|name| std::fs::read_link(std::path::Path::new(NAMESPACE_DIR).join(name)).ok())
        .map(|target| target.to_string_lossy().into_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_horovods_formula() {
        // python3 -c "import hashlib; print(hashlib.md5(b'node1.example.com' + b'ns' + b'salt').hexdigest())"
        let expected = format!("{:x}", Md5::digest(b"node1.example.comnssalt"));
        assert_eq!(
            host_hash_for("node1.example.com", "ns", Some("salt")),
            format!("node1-{expected}")
        );
        let unsalted = format!("{:x}", Md5::digest(b"node1.example.comns"));
        assert_eq!(
            host_hash_for("node1.example.com", "ns", None),
            format!("node1-{unsalted}")
        );
    }

    #[test]
    fn known_md5_vector() {
        // md5("abc") is a published test vector.
        assert_eq!(
            host_hash_for("a", "b", Some("c")),
            "a-900150983cd24fb0d6963f7d28e17f72"
        );
    }

    #[test]
    fn salt_and_hostname_change_the_hash() {
        let ns = namespaces();
        let base = host_hash_for("h", &ns, None);
        assert_ne!(base, host_hash_for("h", &ns, Some("1")));
        assert_ne!(base, host_hash_for("g", &ns, None));
        assert_eq!(base, host_hash_for("h", &ns, None));
        assert!(host_hash_for("127.0.0.1", &ns, None).starts_with("127.0.0.1-"));
    }

    #[test]
    fn this_process_hash_has_the_right_shape() {
        let hash = host_hash(None);
        let (prefix, digest) = hash.rsplit_once('-').unwrap();
        assert!(!prefix.is_empty());
        assert_eq!(digest.len(), 32);
        assert!(digest.chars().all(|c| c.is_ascii_hexdigit()));
        assert!(namespaces().contains("net:["), "{}", namespaces());
    }

    #[test]
    fn hostname_override_order() {
        let both = |name: &str| match name {
            HOSTNAME => Some("kolo-host".to_owned()),
            HOROVOD_HOSTNAME => Some("hvd-host".to_owned()),
            _ => None,
        };
        assert_eq!(hostname_from(both), "kolo-host");
        let horovod = |name: &str| (name == HOROVOD_HOSTNAME).then(|| "hvd-host".to_owned());
        assert_eq!(hostname_from(horovod), "hvd-host");
        assert_eq!(hostname_from(|_| Some(" ".to_owned())), system_hostname());
    }
}
