//! The message every member of a process set sends every other member once per cycle: flags,
//! the response-cache bits of the tensors it submitted since the last cycle, and the full
//! descriptors of those the cache does not know.

use super::autotune::{AppliedTrial, WIRE_LEN as PARAMS_LEN};
use super::cache::ResponseCache;
use crate::control::host_updates::HostNews;
use crate::wire::{FrameError, FrameKind, OpDescriptor};

fn malformed(what: String) -> FrameError {
    FrameError::Malformed {
        kind: FrameKind::Descriptor,
        what,
    }
}

/// This rank has joined (it has no more data and contributes identities).
pub(crate) const FLAG_JOINED: u8 = 1;
/// This rank is shutting down the engine; every rank stops after this cycle.
pub(crate) const FLAG_SHUTDOWN: u8 = 2;
/// Rank 0's stall inspector gave up on the tensors waiting in the table: fail them everywhere.
pub(crate) const FLAG_STALL_ABORT: u8 = 4;
/// The message carries the autotuner's next setting (only global rank 0's is read).
pub(crate) const FLAG_PARAMS: u8 = 8;
const KNOWN_FLAGS: u8 = FLAG_JOINED | FLAG_SHUTDOWN | FLAG_STALL_ABORT | FLAG_PARAMS;

/// Largest encoded message accepted from a peer.
pub(crate) const MAX_MESSAGE_LEN: usize = 256 << 20;

/// One rank's message for one cycle.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct CycleMessage {
    pub flags: u8,
    /// Cache bits, 64 per word (bit `b` is word `b / 64`, bit `b % 64`).
    pub bits: Vec<u64>,
    /// Descriptors of submitted tensors the cache does not hold.
    pub requests: Vec<OpDescriptor>,
    /// The sender's host-update news (only group rank 0's is read; see `super::host_news`).
    pub news: HostNews,
    /// The autotuner's next setting, with [`FLAG_PARAMS`] (see `super::autotune`).
    pub params: Option<AppliedTrial>,
}

impl CycleMessage {
    pub(crate) fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    /// Sets cache bit `bit`.
    pub(crate) fn set_bit(&mut self, bit: usize) {
        let word = bit / 64;
        if self.bits.len() <= word {
            self.bits.resize(word + 1, 0);
        }
        self.bits[word] |= 1 << (bit % 64);
    }

    /// Adds a submitted tensor: only its cache bit when `cache` holds exactly `desc` (same
    /// name, same arguments), else `desc` in full, to be negotiated.
    pub(crate) fn announce(&mut self, desc: OpDescriptor, cache: Option<&mut ResponseCache>) {
        match cache.and_then(|c| c.lookup(&desc)) {
            Some(bit) => self.set_bit(bit),
            None => self.requests.push(desc),
        }
    }

    /// The set cache bits, ascending.
    pub(crate) fn bit_indices(&self) -> impl Iterator<Item = usize> + '_ {
        self.bits.iter().enumerate().flat_map(|(w, &word)| {
            (0..64)
                .filter(move |b| word & (1u64 << b) != 0)
                .map(move |b| w * 64 + b)
        })
    }

    /// Attaches the autotuner's next setting.
    pub(crate) fn carry(&mut self, params: AppliedTrial) {
        self.flags |= FLAG_PARAMS;
        self.params = Some(params);
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + 8 * self.bits.len() + 64 * self.requests.len());
        out.push(self.flags);
        out.extend_from_slice(&(self.bits.len() as u32).to_le_bytes());
        for word in &self.bits {
            out.extend_from_slice(&word.to_le_bytes());
        }
        out.extend_from_slice(&(self.requests.len() as u32).to_le_bytes());
        for desc in &self.requests {
            let bytes = desc.encode();
            out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            out.extend_from_slice(&bytes);
        }
        for stamp in [self.news.removed, self.news.added, self.news.handled] {
            out.extend_from_slice(&stamp.to_le_bytes());
        }
        if let (true, Some(params)) = (self.has(FLAG_PARAMS), &self.params) {
            params.encode(&mut out);
        }
        out
    }

    /// Decodes a message from a job of `world` ranks whose cache has `capacity` entries.
    pub(crate) fn decode(
        bytes: &[u8],
        world: usize,
        capacity: usize,
    ) -> Result<CycleMessage, FrameError> {
        let mut rest = bytes;
        let mut take = |n: usize| -> Result<&[u8], FrameError> {
            if rest.len() < n {
                return Err(malformed(format!(
                    "cycle message ends early ({} bytes left, {n} needed)",
                    rest.len()
                )));
            }
            let (head, tail) = rest.split_at(n);
            rest = tail;
            Ok(head)
        };
        let u32_at = |b: &[u8]| u32::from_le_bytes(b.try_into().unwrap_or_default()) as usize;
        let flags = take(1)?[0];
        if flags & !KNOWN_FLAGS != 0 {
            return Err(malformed(format!("unknown cycle flags {flags:#04x}")));
        }
        let words = u32_at(take(4)?);
        if words > capacity.div_ceil(64) {
            return Err(malformed(format!(
                "{words} cache words for a cache of {capacity} entries"
            )));
        }
        let bits = (0..words)
            .map(|_| take(8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default())))
            .collect::<Result<Vec<_>, _>>()?;
        let count = u32_at(take(4)?);
        let mut requests = Vec::with_capacity(count.min(4096));
        for _ in 0..count {
            let len = u32_at(take(4)?);
            requests.push(OpDescriptor::decode(take(len)?, world)?);
        }
        let mut stamp = |what: &str| -> Result<f64, FrameError> {
            let value = f64::from_le_bytes(take(8)?.try_into().unwrap_or_default());
            if value.is_finite() && value >= 0.0 {
                Ok(value)
            } else {
                Err(malformed(format!(
                    "host news {what} time {value} is not a timestamp"
                )))
            }
        };
        let news = HostNews {
            removed: stamp("removal")?,
            added: stamp("addition")?,
            handled: stamp("handled")?,
        };
        let params = if flags & FLAG_PARAMS != 0 {
            Some(AppliedTrial::decode(take(PARAMS_LEN)?)?)
        } else {
            None
        };
        if !rest.is_empty() {
            return Err(malformed(format!(
                "{} trailing bytes after a cycle message",
                rest.len()
            )));
        }
        Ok(CycleMessage {
            flags,
            bits,
            requests,
            news,
            params,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{DType, ReduceOp};
    use crate::wire::OpKind;
    use proptest::prelude::*;

    fn desc(name: String, dims: Vec<i64>) -> OpDescriptor {
        OpDescriptor {
            dtype: DType::F32,
            shape: dims,
            op: Some(ReduceOp::Average),
            ..OpDescriptor::new(OpKind::Allreduce, &name)
        }
    }

    proptest! {
        #[test]
        fn round_trips(flags in 0u8..8, tuned in proptest::option::of((any::<u32>(), 0usize..1 << 30, 1u64..1_000_000_000, any::<bool>())), bits in proptest::collection::vec(0usize..200, 0..20),
                       names in proptest::collection::vec("[a-z.0-9]{0,12}", 0..5),
                       dims in proptest::collection::vec(0i64..1000, 0..4),
                       stamps in proptest::array::uniform3(0.0f64..2e9)) {
            let news = HostNews { removed: stamps[0], added: stamps[1], handled: stamps[2] };
            let mut m = CycleMessage { flags, news, ..Default::default() };
            if let Some((trial, fusion, nanos, on)) = tuned {
                m.carry(AppliedTrial { trial, params: crate::engine::autotune::TunedParams {
                    fusion_threshold: fusion,
                    cycle_time: std::time::Duration::from_nanos(nanos),
                    cache_enabled: on,
                    hierarchical_allreduce: !on,
                    hierarchical_allgather: on,
                    active: on,
                }});
            }
            for b in &bits { m.set_bit(*b); }
            m.requests = names.into_iter().map(|n| desc(n, dims.clone())).collect();
            let decoded = CycleMessage::decode(&m.encode(), 4, 256).unwrap();
            prop_assert_eq!(&decoded, &m);
            let mut want: Vec<usize> = bits.clone();
            want.sort_unstable();
            want.dedup();
            prop_assert_eq!(decoded.bit_indices().collect::<Vec<_>>(), want);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = CycleMessage::decode(&bytes, 4, 1024);
        }
    }

    #[test]
    fn rejects_too_many_cache_words_and_unknown_flags() {
        let mut m = CycleMessage::default();
        m.set_bit(200);
        assert!(CycleMessage::decode(&m.encode(), 2, 64).is_err());
        let bad = CycleMessage {
            flags: 64,
            ..Default::default()
        };
        assert!(CycleMessage::decode(&bad.encode(), 2, 64).is_err());
        // The parameters flag without its parameters ends early.
        let missing = CycleMessage {
            flags: FLAG_PARAMS,
            ..Default::default()
        };
        assert!(CycleMessage::decode(&missing.encode(), 2, 64).is_err());
    }

    #[test]
    fn rejects_host_news_that_is_not_a_timestamp() {
        for bad in [f64::NAN, f64::INFINITY, -1.0] {
            let m = CycleMessage {
                news: HostNews {
                    added: bad,
                    ..HostNews::default()
                },
                ..Default::default()
            };
            let error = CycleMessage::decode(&m.encode(), 2, 64).unwrap_err();
            assert!(error.to_string().contains("addition"), "{error}");
        }
    }
}
