//! A digest of cycle messages: every distinct encoded message once, with the ranges of group
//! ranks that sent exactly it. What the tree gathers up and broadcasts down: in the common
//! cycle every member sends the same bytes (the same cache bits, or the same descriptors of a
//! step's first run), so a digest of any number of members is one message and one range.
//!
//! Wire format (little-endian): `u32` entry count, then per entry a `u32` payload length, the
//! payload, a `u32` range count and per range `u32` start and `u32` length. Every count and
//! length is checked against the set size and the receive limit before anything is allocated.

use std::collections::HashMap;
use std::ops::Range;

/// One distinct message and who sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub payload: Vec<u8>,
    /// Disjoint, ascending, non-adjacent ranges of group ranks.
    pub ranks: Vec<Range<usize>>,
}

/// Distinct messages of a range of ranks, ordered by their first sender.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Digest {
    pub entries: Vec<Entry>,
}

/// Why a peer's digest was refused.
pub(crate) type DigestError = String;

impl Digest {
    /// The digest of one rank's message.
    pub(crate) fn single(rank: usize, payload: Vec<u8>) -> Digest {
        Digest {
            entries: vec![Entry {
                payload,
                ranks: just(rank),
            }],
        }
    }

    /// The digest of every member's message, indexed by group rank.
    pub(crate) fn from_payloads(payloads: Vec<Vec<u8>>) -> Digest {
        let mut index: HashMap<Vec<u8>, usize> = HashMap::new();
        let mut entries: Vec<Entry> = Vec::new();
        for (rank, payload) in payloads.into_iter().enumerate() {
            match index.get(&payload) {
                Some(&i) => {
                    let ranks = &mut entries[i].ranks;
                    match ranks.last_mut() {
                        Some(last) if last.end == rank => last.end = rank + 1,
                        _ => ranks.push(rank..rank + 1),
                    }
                }
                None => {
                    index.insert(payload.clone(), entries.len());
                    entries.push(Entry {
                        payload,
                        ranks: just(rank),
                    });
                }
            }
        }
        Digest { entries }
    }

    /// Adds `other`'s senders (which must not overlap this digest's).
    pub(crate) fn merge(&mut self, other: Digest) {
        // Few entries (the common cycle: one each) are compared directly; many through an index.
        let added: Vec<(Option<usize>, Entry)> = if self.entries.len() * other.entries.len() <= 64 {
            other
                .entries
                .into_iter()
                .map(|entry| {
                    let at = self.entries.iter().position(|e| e.payload == entry.payload);
                    (at, entry)
                })
                .collect()
        } else {
            let mut index: HashMap<&[u8], usize> = HashMap::new();
            for (i, e) in self.entries.iter().enumerate() {
                index.insert(&e.payload, i);
            }
            other
                .entries
                .into_iter()
                .map(|entry| (index.get(entry.payload.as_slice()).copied(), entry))
                .collect()
        };
        for (at, entry) in added {
            match at {
                Some(i) => {
                    let ranks = &mut self.entries[i].ranks;
                    ranks.extend(entry.ranks);
                    normalize(ranks);
                }
                None => self.entries.push(entry),
            }
        }
        self.entries
            .sort_by_key(|e| e.ranks.first().map_or(0, |r| r.start));
    }

    /// The common cycle's way to take in a subtree's digest: when `bytes` is one message sent
    /// by exactly the ranks `lo..hi` (the subtree agreed: the same cache bits everywhere) and
    /// this digest already holds that message, adds `lo..hi` to its senders without decoding
    /// anything and returns true. Otherwise (any other shape, including a malformed one)
    /// changes nothing and returns false: the caller decodes, checks and merges in full, with
    /// the same result. `lo..hi` must lie above every rank this digest holds (a later child).
    pub(crate) fn merge_same(&mut self, bytes: &[u8], lo: usize, hi: usize) -> bool {
        let word = |at: usize| {
            bytes
                .get(at..at + 4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        };
        let Some(len) = word(4) else {
            return false;
        };
        let tail = 8usize.saturating_add(len);
        if word(0) != Some(1)
            || bytes.len() != tail.saturating_add(12)
            || word(tail) != Some(1)
            || word(tail + 4) != Some(lo)
            || word(tail + 8) != Some(hi.wrapping_sub(lo))
            || lo >= hi
        {
            return false;
        }
        let payload = &bytes[8..tail];
        let Some(entry) = self.entries.iter_mut().find(|e| e.payload == payload) else {
            return false;
        };
        match entry.ranks.last_mut() {
            Some(last) if last.end == lo => last.end = hi,
            Some(last) if last.end < lo => entry.ranks.push(lo..hi),
            _ => {
                entry.ranks.push(lo..hi);
                normalize(&mut entry.ranks);
            }
        }
        true
    }

    /// Checks that the senders are exactly the ranks `lo..hi`, each once.
    pub(crate) fn check_covers(&self, lo: usize, hi: usize) -> Result<(), DigestError> {
        let mut ranges: Vec<Range<usize>> = self
            .entries
            .iter()
            .flat_map(|e| e.ranks.iter().cloned())
            .collect();
        ranges.sort_by_key(|r| r.start);
        let mut next = lo;
        for r in ranges {
            if r.start != next || r.is_empty() {
                return Err(format!(
                    "the gathered cycle messages should come from ranks {lo}..{hi} once each; a range starts at {} \
                     where {next} was expected",
                    r.start
                ));
            }
            next = r.end;
        }
        if next != hi {
            return Err(format!(
                "the gathered cycle messages should come from ranks {lo}..{hi}; they end at {next}"
            ));
        }
        Ok(())
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let len: usize = self
            .entries
            .iter()
            .map(|e| 8 + e.payload.len() + 8 * e.ranks.len())
            .sum();
        let mut out = Vec::with_capacity(4 + len);
        put(&mut out, self.entries.len());
        for e in &self.entries {
            put(&mut out, e.payload.len());
            out.extend_from_slice(&e.payload);
            put(&mut out, e.ranks.len());
            for r in &e.ranks {
                put(&mut out, r.start);
                put(&mut out, r.len());
            }
        }
        out
    }

    /// Decodes a digest of a set of `size` ranks; no payload may exceed `max_payload` bytes.
    pub(crate) fn decode(
        bytes: &[u8],
        size: usize,
        max_payload: usize,
    ) -> Result<Digest, DigestError> {
        let mut entries = Vec::new();
        let mut pos = 0usize;
        let read = |pos: &mut usize, n: usize| -> Result<&[u8], DigestError> {
            let end = pos
                .checked_add(n)
                .filter(|&e| e <= bytes.len())
                .ok_or_else(|| {
                    format!(
                        "a cycle digest ends early ({} bytes left, {n} needed)",
                        bytes.len() - *pos
                    )
                })?;
            let out = &bytes[*pos..end];
            *pos = end;
            Ok(out)
        };
        let number = |pos: &mut usize, what: &str, max: usize| -> Result<usize, DigestError> {
            let n = u32::from_le_bytes(read(pos, 4)?.try_into().unwrap_or_default()) as usize;
            if n > max {
                return Err(format!("a cycle digest has {what} {n}, more than {max}"));
            }
            Ok(n)
        };
        let n_entries = number(&mut pos, "entry count", size)?;
        for _ in 0..n_entries {
            let len = number(&mut pos, "payload length", max_payload)?;
            let payload = read(&mut pos, len)?.to_vec();
            let n_ranges = number(&mut pos, "range count", size)?;
            let mut ranks = Vec::with_capacity(n_ranges);
            for _ in 0..n_ranges {
                let start = number(&mut pos, "range start", size)?;
                let len = number(&mut pos, "range length", size - start)?;
                if len == 0 {
                    return Err("a cycle digest has an empty range of ranks".into());
                }
                ranks.push(start..start + len);
            }
            if ranks.is_empty() {
                return Err("a cycle digest has a message without senders".into());
            }
            entries.push(Entry { payload, ranks });
        }
        if pos != bytes.len() {
            return Err(format!(
                "{} trailing bytes after a cycle digest",
                bytes.len() - pos
            ));
        }
        Ok(Digest { entries })
    }
}

/// The ranges holding only `rank`.
pub(crate) fn just(rank: usize) -> Vec<Range<usize>> {
    std::iter::once(rank..rank + 1).collect()
}

fn put(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&(n as u32).to_le_bytes());
}

/// Sorts `ranges` and joins adjacent ones.
pub(crate) fn normalize(ranges: &mut Vec<Range<usize>>) {
    ranges.sort_by_key(|r| r.start);
    let mut out: Vec<Range<usize>> = Vec::with_capacity(ranges.len());
    for r in ranges.drain(..) {
        match out.last_mut() {
            Some(last) if last.end == r.start => last.end = r.end,
            _ => out.push(r),
        }
    }
    *ranges = out;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn equal_messages_merge_into_one_entry_and_one_range() {
        let mut d = Digest::single(0, b"bits".to_vec());
        for r in 1..64 {
            d.merge(Digest::single(r, b"bits".to_vec()));
        }
        assert_eq!(d.entries.len(), 1);
        assert_eq!(d.entries[0].ranks, vec![0..64]);
        assert!(d.check_covers(0, 64).is_ok());
        assert!(d.check_covers(0, 65).is_err());
        d.merge(Digest::single(64, b"other".to_vec()));
        assert_eq!(d.entries.len(), 2);
        assert!(d.check_covers(0, 65).is_ok());
    }

    #[test]
    fn overlapping_or_missing_senders_are_refused() {
        let mut d = Digest::single(0, b"a".to_vec());
        d.merge(Digest::single(0, b"b".to_vec()));
        assert!(d.check_covers(0, 1).is_err(), "rank 0 twice");
        let gap = Digest {
            entries: vec![Entry {
                payload: vec![],
                ranks: vec![0..1, 2..3],
            }],
        };
        assert!(gap.check_covers(0, 3).is_err());
    }

    #[test]
    fn merge_same_is_decode_check_and_merge_for_an_agreeing_subtree() {
        let subtree = |payload: &[u8], lo: usize, hi: usize| {
            Digest {
                entries: vec![Entry {
                    payload: payload.to_vec(),
                    ranks: std::iter::once(lo..hi).collect(),
                }],
            }
            .encode()
        };
        let mut fast = Digest::single(0, b"bits".to_vec());
        assert!(fast.merge_same(&subtree(b"bits", 1, 5), 1, 5));
        assert!(fast.merge_same(&subtree(b"bits", 5, 9), 5, 9));
        let mut full = Digest::single(0, b"bits".to_vec());
        full.merge(Digest::decode(&subtree(b"bits", 1, 9), 9, 16).unwrap());
        assert_eq!(fast, full);
        // Anything else is left to the full path, unchanged.
        let before = fast.clone();
        assert!(
            !fast.merge_same(&subtree(b"other", 9, 12), 9, 12),
            "another message"
        );
        assert!(
            !fast.merge_same(&subtree(b"bits", 9, 12), 9, 13),
            "not the whole subtree"
        );
        assert!(!fast.merge_same(&subtree(b"bits", 10, 12), 9, 12), "a gap");
        let mut two = Digest::single(9, b"bits".to_vec());
        two.merge(Digest::single(10, b"x".to_vec()));
        assert!(!fast.merge_same(&two.encode(), 9, 11), "two messages");
        let mut long = subtree(b"bits", 9, 12);
        long.push(0);
        assert!(!fast.merge_same(&long, 9, 12), "trailing bytes");
        assert!(!fast.merge_same(&long[..10], 9, 12), "cut short");
        assert_eq!(fast, before);
    }

    #[test]
    fn decode_bounds_every_count() {
        let d = Digest::single(3, vec![7; 10]);
        let bytes = d.encode();
        assert_eq!(Digest::decode(&bytes, 4, 10).unwrap(), d);
        assert!(Digest::decode(&bytes, 3, 10).is_err(), "rank 3 of 3");
        assert!(Digest::decode(&bytes, 4, 9).is_err(), "payload too long");
        let mut huge = Vec::new();
        put(&mut huge, u32::MAX as usize);
        assert!(Digest::decode(&huge, 1024, 1 << 20).is_err());
    }

    proptest! {
        #[test]
        fn round_trips(msgs in proptest::collection::vec(0u8..4, 1..50)) {
            let mut d = Digest::single(0, vec![msgs[0]]);
            for (r, m) in msgs.iter().enumerate().skip(1) {
                d.merge(Digest::single(r, vec![*m]));
            }
            prop_assert!(d.check_covers(0, msgs.len()).is_ok());
            prop_assert_eq!(Digest::decode(&d.encode(), msgs.len(), 1).unwrap(), d);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Digest::decode(&bytes, 8, 64);
            let mut d = Digest::single(0, vec![]);
            let _ = d.merge_same(&bytes, 1, 8);
        }
    }
}
