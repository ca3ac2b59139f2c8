//! The per-job random identifiers: the secret that authenticates every call to the driver, and
//! the job id that names the job's resources (e.g. shared-memory segments).

use std::fmt;

use rand::RngCore;
use subtle::ConstantTimeEq;

use crate::error::{Error, Result};

/// The per-job secret (32 random bytes). Reaches workers once, as hex in `KOLO_JOB_SECRET`,
/// through the launcher's own channel (ssh stdin, the Spark task, the Ray actor, the MPI
/// broadcast); kolo's network only ever carries proofs of it ([`crate::control::mac`]). `Debug`
/// never prints it, and there is deliberately no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct JobSecret([u8; JobSecret::LEN]);

impl JobSecret {
    /// Length of a secret in bytes.
    pub const LEN: usize = 32;

    /// A fresh secret from the operating system's CSPRNG-seeded generator.
    pub fn generate() -> Self {
        let mut bytes = [0u8; Self::LEN];
        rand::rng().fill_bytes(&mut bytes);
        Self(bytes)
    }

    /// Parses the hex form (64 hex digits). The error names `what` (e.g. the variable) but never
    /// echoes the value.
    pub fn from_hex(text: &str, what: &str) -> Result<Self> {
        let bytes = hex::decode(text.trim()).map_err(|_| {
            Error::Config(format!(
                "{what} is not a hex string (expected {} hex digits)",
                Self::LEN * 2
            ))
        })?;
        let array: [u8; Self::LEN] = bytes.try_into().map_err(|bytes: Vec<u8>| {
            Error::Config(format!(
                "{what} has {} bytes, expected {} ({} hex digits)",
                bytes.len(),
                Self::LEN,
                Self::LEN * 2
            ))
        })?;
        Ok(Self(array))
    }

    /// The hex form, for `KOLO_JOB_SECRET` and the metadata header.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The raw secret, for deriving keys ([`crate::control::mac::MacKey`]); never send it.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// Compares `candidate` with this secret in constant time (for equal lengths).
    pub fn matches(&self, candidate: &[u8]) -> bool {
        candidate.len() == Self::LEN && bool::from(self.0.ct_eq(candidate))
    }
}

impl fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JobSecret(<redacted>)")
    }
}

/// The per-job id (16 random bytes), shown as 32 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(pub [u8; JobId::LEN]);

impl JobId {
    /// Length of a job id in bytes.
    pub const LEN: usize = 16;

    /// A fresh random job id.
    pub fn generate() -> Self {
        let mut bytes = [0u8; Self::LEN];
        rand::rng().fill_bytes(&mut bytes);
        Self(bytes)
    }

    /// Parses the hex form (32 hex digits); the error names `what`.
    pub fn from_hex(text: &str, what: &str) -> Result<Self> {
        let bytes = hex::decode(text.trim())
            .map_err(|_| Error::Config(format!("{what}={text:?} is not a hex string")))?;
        Self::from_slice(&bytes).ok_or_else(|| {
            Error::Config(format!(
                "{what}={text:?} has {} bytes, expected {} ({} hex digits)",
                bytes.len(),
                Self::LEN,
                Self::LEN * 2
            ))
        })
    }

    /// The id from exactly 16 bytes, `None` for any other length.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }

    /// The hex form, for `KOLO_JOB_ID`.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JobId({})", self.to_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_hex_round_trip_and_redacted_debug() {
        let secret = JobSecret::generate();
        let hex = secret.to_hex();
        assert_eq!(hex.len(), 64);
        assert_eq!(
            JobSecret::from_hex(&hex, "KOLO_JOB_SECRET").unwrap(),
            secret
        );
        let debug = format!("{secret:?}");
        assert!(!debug.contains(&hex[..8]), "{debug}");
        assert_eq!(debug, "JobSecret(<redacted>)");
        assert_ne!(JobSecret::generate(), secret);
    }

    #[test]
    fn secret_matches_only_itself() {
        let secret = JobSecret::generate();
        let bytes = hex::decode(secret.to_hex()).unwrap();
        assert!(secret.matches(&bytes));
        let mut other = bytes.clone();
        other[31] ^= 1;
        assert!(!secret.matches(&other));
        assert!(!secret.matches(&bytes[..31]));
        assert!(!secret.matches(&[]));
    }

    #[test]
    fn bad_secret_errors_name_the_variable_without_the_value() {
        let err = JobSecret::from_hex("abcd", "KOLO_JOB_SECRET")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("KOLO_JOB_SECRET") && err.contains("2 bytes"),
            "{err}"
        );
        assert!(!err.contains("abcd"), "{err}");
        let err = JobSecret::from_hex("zz", "KOLO_JOB_SECRET")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a hex string"), "{err}");
    }

    #[test]
    fn job_id_round_trip() {
        let id = JobId::generate();
        assert_eq!(JobId::from_hex(&id.to_hex(), "KOLO_JOB_ID").unwrap(), id);
        assert_eq!(id.to_string().len(), 32);
        assert!(JobId::from_hex("00", "KOLO_JOB_ID")
            .unwrap_err()
            .to_string()
            .contains("KOLO_JOB_ID"));
        assert_eq!(JobId::from_slice(&[0; 15]), None);
    }
}
