//! The job's key-value space on the driver: values shared, not copied, by every reader, under a
//! lock of its own (not the one heartbeats and registrations take), with caps on the size of a
//! key, the number of keys and the total bytes, so workers cannot grow the driver without bound.

use std::collections::HashMap;
use std::sync::Arc;

/// The longest key, in bytes.
pub const MAX_KEY_LEN: usize = 1024;
/// The most keys the space holds.
pub const MAX_KEYS: usize = 65_536;
/// The most bytes (keys and values) the space holds in all: room for the largest streamed value
/// ([`crate::control::handlers`] takes up to 16 GiB) and the job's small keys.
pub const MAX_TOTAL_BYTES: usize = (16 << 30) + (64 << 20);

/// A value of the space; cloning shares it.
pub type KvValue = Arc<[u8]>;

/// Keys and shared values with size accounting.
#[derive(Debug, Default)]
pub(crate) struct KvSpace {
    values: HashMap<String, KvValue>,
    bytes: usize,
}

impl KvSpace {
    /// Stores `value` under `key`, replacing any earlier value. `Err` names the limit a put
    /// would pass (nothing is stored then).
    pub(crate) fn put(&mut self, key: String, value: KvValue) -> Result<(), String> {
        if key.len() > MAX_KEY_LEN {
            return Err(format!(
                "a key-value key may have at most {MAX_KEY_LEN} bytes, this one has {}",
                key.len()
            ));
        }
        let replaced = self.values.get(&key).map_or(0, |old| key.len() + old.len());
        if replaced == 0 && self.values.len() >= MAX_KEYS {
            return Err(format!(
                "the job's key-value space holds at most {MAX_KEYS} keys; it is full"
            ));
        }
        let after = (self.bytes - replaced)
            .checked_add(key.len() + value.len())
            .filter(|total| *total <= MAX_TOTAL_BYTES)
            .ok_or_else(|| {
                format!(
                    "storing {} bytes under {key:?} would take the job's key-value space past its \
                     cap of {MAX_TOTAL_BYTES} bytes ({} in use)",
                    value.len(),
                    self.bytes
                )
            })?;
        self.bytes = after;
        self.values.insert(key, value);
        Ok(())
    }

    /// The value of `key`, shared.
    pub(crate) fn get(&self, key: &str) -> Option<KvValue> {
        self.values.get(key).cloned()
    }

    /// Bytes in use (keys and values).
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_refuse_without_storing_and_replacing_frees_the_old_value() {
        let mut kv = KvSpace::default();
        kv.put("a".into(), Arc::from(vec![1u8; 10])).unwrap();
        kv.put("a".into(), Arc::from(vec![2u8; 4])).unwrap();
        assert_eq!(kv.bytes(), 5);
        let long = "k".repeat(MAX_KEY_LEN + 1);
        assert!(kv
            .put(long, Arc::from(vec![]))
            .unwrap_err()
            .contains("at most 1024 bytes"));
        for i in 1..MAX_KEYS {
            kv.put(format!("{i}"), Arc::from(vec![])).unwrap();
        }
        let full = kv.put("one more".into(), Arc::from(vec![])).unwrap_err();
        assert!(full.contains("65536 keys"), "{full}");
        kv.put("a".into(), Arc::from(vec![3u8; 1])).unwrap();
        assert_eq!(&*kv.get("a").unwrap(), &[3u8]);
    }

    #[test]
    fn the_total_cap_is_checked_before_anything_is_stored() {
        let mut kv = KvSpace {
            bytes: MAX_TOTAL_BYTES - 10,
            ..KvSpace::default()
        };
        let err = kv.put("big".into(), Arc::from(vec![0u8; 8])).unwrap_err();
        assert!(err.contains("past its cap"), "{err}");
        assert!(kv.get("big").is_none());
        kv.put("ok".into(), Arc::from(vec![0u8; 8])).unwrap();
    }
}
