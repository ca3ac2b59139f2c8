//! Keyed proofs of the job secret: the one place that turns the [`JobSecret`] into HMAC-SHA256
//! keys and tags. The secret itself never leaves the process; handshakes exchange fresh
//! [`nonce`]s and tags over them, so what crosses the network cannot be replayed.
//!
//! Every purpose (the control plane, the data plane, shared-memory names, …) derives its own
//! [`MacKey`], so a tag made for one can never be presented to another.
//!
//! ```
//! use kolo_collective::control::mac::{nonce, MacKey};
//! use kolo_collective::control::JobSecret;
//!
//! let secret = JobSecret::generate();
//! let key = MacKey::derive(&secret, "example");
//! let (ours, theirs) = (nonce(), nonce());
//! let tag = key.tag(&[b"server", &ours, &theirs]);
//! assert!(key.verify(&[b"server", &ours, &theirs], &tag));
//! assert!(!key.verify(&[b"client", &ours, &theirs], &tag));
//! assert!(!MacKey::derive(&secret, "other").verify(&[b"server", &ours, &theirs], &tag));
//! ```

use std::fmt;

use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::control::ids::JobSecret;

type HmacSha256 = Hmac<Sha256>;

/// Bytes of a tag (HMAC-SHA256) and of a nonce.
pub const TAG_LEN: usize = 32;

/// A fresh 32-byte random challenge from the operating system's CSPRNG-seeded generator.
pub fn nonce() -> [u8; TAG_LEN] {
    let mut bytes = [0u8; TAG_LEN];
    rand::rng().fill_bytes(&mut bytes);
    bytes
}

/// An HMAC-SHA256 key derived from the job secret for one purpose. `Debug` never prints it.
#[derive(Clone, PartialEq, Eq)]
pub struct MacKey([u8; TAG_LEN]);

impl MacKey {
    /// The key for `purpose`: HMAC-SHA256(secret, "kolo key v1" ‖ purpose). Different purposes
    /// give unrelated keys.
    pub fn derive(secret: &JobSecret, purpose: &str) -> Self {
        let mut mac =
            HmacSha256::new_from_slice(secret.bytes()).expect("HMAC takes any key length");
        mac.update(b"kolo key v1\0");
        mac.update(purpose.as_bytes());
        Self(mac.finalize().into_bytes().into())
    }

    /// The tag over `parts`. Each part is length-prefixed, so `["ab", "c"]` and `["a", "bc"]`
    /// get different tags.
    pub fn tag(&self, parts: &[&[u8]]) -> [u8; TAG_LEN] {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length");
        for part in parts {
            mac.update(&(part.len() as u64).to_le_bytes());
            mac.update(part);
        }
        mac.finalize().into_bytes().into()
    }

    /// True when `tag` is the tag over `parts` (constant-time comparison; any other length is
    /// false).
    pub fn verify(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        tag.len() == TAG_LEN && bool::from(self.tag(parts).ct_eq(tag))
    }

    /// A short name derived from the key and `label` (hex, `len` digits at most 64): unguessable
    /// without the secret, the same on every rank of the job (e.g. shared-memory names).
    pub fn name(&self, label: &[u8], len: usize) -> String {
        let mut text = hex::encode(self.tag(&[b"name", label]));
        text.truncate(len.min(TAG_LEN * 2));
        text
    }
}

impl fmt::Debug for MacKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MacKey(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_depend_on_key_purpose_and_part_boundaries() {
        let secret = JobSecret::generate();
        let key = MacKey::derive(&secret, "a");
        assert_eq!(key, MacKey::derive(&secret, "a"));
        assert_ne!(key, MacKey::derive(&secret, "b"));
        assert_ne!(key, MacKey::derive(&JobSecret::generate(), "a"));
        let tag = key.tag(&[b"ab", b"c"]);
        assert_ne!(tag, key.tag(&[b"a", b"bc"]));
        assert!(key.verify(&[b"ab", b"c"], &tag));
        assert!(!key.verify(&[b"ab", b"c"], &tag[..31]));
        let mut flipped = tag;
        flipped[0] ^= 1;
        assert!(!key.verify(&[b"ab", b"c"], &flipped));
    }

    #[test]
    fn key_matches_rfc_4231_hmac_sha256() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        let mut mac = HmacSha256::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        assert_eq!(
            hex::encode(mac.finalize().into_bytes()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn names_are_stable_per_key_and_redacted_in_debug() {
        let secret = JobSecret::generate();
        let key = MacKey::derive(&secret, "shm");
        assert_eq!(key.name(b"host", 24), key.name(b"host", 24));
        assert_eq!(key.name(b"host", 24).len(), 24);
        assert_ne!(key.name(b"host", 24), key.name(b"other", 24));
        assert_eq!(format!("{key:?}"), "MacKey(<redacted>)");
    }
}
