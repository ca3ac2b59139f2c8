//! Horovod's autotune (`HOROVOD_AUTOTUNE`, `kolorun --autotune`): the coordinator tunes the
//! fusion threshold and the cycle time by Bayesian optimisation ([`gp`], [`acquisition`]), then
//! tries the categorical switches (response cache; hierarchical allreduce and allgather on a
//! hierarchical layout), and keeps the best setting, logging every sample as Horovod's CSV
//! ([`log`]).
//!
//! What kolo does beyond Horovod:
//! - **Agreement through the engine.** Only global rank 0 scores and decides ([`tuner`]); each
//!   new setting rides on rank 0's next cycle message of the global process set, and every rank
//!   (rank 0 too) applies it right after that exchange, before the cycle runs anything. Every
//!   rank so runs every cycle with the same parameters, with no extra collective and whatever
//!   each rank's own timings are.
//! - **Robust scores.** A sample is the median of its steps' scores (bytes the engine moved
//!   per microsecond of the step, [`steps`]), and the first step after a change is not scored.
//!   The model fits log scores over log-scaled knobs (cycle time 0.01–100 ms), so the region
//!   of short cycles and few-MiB thresholds is not a sliver of the search space.
//! - **Convergence.** The search stops once the expected improvement is negligible or the best
//!   point has not changed for a few samples (`bayes_opt_max_samples` is only the cap), and it
//!   never samples a point twice ([`acquisition`]).
//! - **A paired re-check before keeping** ([`recheck`]): the configured setting and the
//!   search's top points, then each switch against the setting kept so far, are sampled again
//!   in alternating rounds; a challenger is kept only when the median of its paired score
//!   ratios beats both a 3 % margin and the noise measured from their spread (with twice the
//!   rounds when the first look cannot tell).
//!
//! Knobs the user set explicitly (`KOLO_`/`HOROVOD_FUSION_THRESHOLD`, `CYCLE_TIME`,
//! `CACHE_CAPACITY`, `HIERARCHICAL_ALLREDUCE`, `HIERARCHICAL_ALLGATHER`) stay fixed, as in
//! Horovod.

pub(crate) mod acquisition;
pub(crate) mod gp;
pub(crate) mod log;
pub(crate) mod recheck;
pub(crate) mod runtime;
pub mod settings;
pub(crate) mod steps;
pub(crate) mod tuner;

use std::time::Duration;

use crate::wire::{FrameError, FrameKind};

/// The engine parameters the autotuner sets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TunedParams {
    /// Largest fused allreduce buffer in bytes.
    pub fusion_threshold: usize,
    /// The longest time between two cycles.
    pub cycle_time: Duration,
    /// Whether ranks announce cached tensors by their cache bit.
    pub cache_enabled: bool,
    /// Allreduce takes the hierarchical path on a hierarchical layout.
    pub hierarchical_allreduce: bool,
    /// Allgather takes the hierarchical path on a hierarchical layout.
    pub hierarchical_allgather: bool,
    /// Still tuning (false once the best setting is kept).
    pub active: bool,
}

/// One setting every rank applied, with the trial it belongs to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AppliedTrial {
    /// Counts the settings rank 0 sent, from 1.
    pub trial: u32,
    /// What was applied.
    pub params: TunedParams,
}

/// Encoded length of an [`AppliedTrial`] in a cycle message.
pub(crate) const WIRE_LEN: usize = 4 + 8 + 8 + 1;

/// The longest cycle time accepted from the coordinator.
const MAX_CYCLE_TIME: Duration = Duration::from_secs(60);
/// The largest fusion threshold accepted from the coordinator (1 TiB).
const MAX_FUSION_THRESHOLD: u64 = 1 << 40;

const CACHE: u8 = 1;
const HIER_ALLREDUCE: u8 = 2;
const HIER_ALLGATHER: u8 = 4;
const ACTIVE: u8 = 8;

impl AppliedTrial {
    /// Appends the wire form to `out`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        let p = &self.params;
        out.extend_from_slice(&self.trial.to_le_bytes());
        out.extend_from_slice(&(p.fusion_threshold as u64).to_le_bytes());
        let nanos = u64::try_from(p.cycle_time.as_nanos()).unwrap_or(u64::MAX);
        out.extend_from_slice(&nanos.to_le_bytes());
        let flags = [
            (p.cache_enabled, CACHE),
            (p.hierarchical_allreduce, HIER_ALLREDUCE),
            (p.hierarchical_allgather, HIER_ALLGATHER),
            (p.active, ACTIVE),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .fold(0u8, |acc, (_, bit)| acc | bit);
        out.push(flags);
    }

    /// Decodes [`WIRE_LEN`] bytes, refusing values no coordinator sends.
    pub(crate) fn decode(bytes: &[u8]) -> Result<AppliedTrial, FrameError> {
        let bad = |what: String| FrameError::Malformed {
            kind: FrameKind::Descriptor,
            what,
        };
        if bytes.len() != WIRE_LEN {
            return Err(bad(format!(
                "autotune parameters of {} bytes (expected {WIRE_LEN})",
                bytes.len()
            )));
        }
        let u64_at =
            |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default());
        let trial = u32::from_le_bytes(bytes[0..4].try_into().unwrap_or_default());
        let fusion = u64_at(4);
        let nanos = u64_at(12);
        let flags = bytes[20];
        if fusion > MAX_FUSION_THRESHOLD {
            return Err(bad(format!(
                "autotune fusion threshold {fusion} is too large"
            )));
        }
        let cycle_time = Duration::from_nanos(nanos);
        if cycle_time.is_zero() || cycle_time > MAX_CYCLE_TIME {
            return Err(bad(format!(
                "autotune cycle time {cycle_time:?} is not in (0, {MAX_CYCLE_TIME:?}]"
            )));
        }
        if flags & !(CACHE | HIER_ALLREDUCE | HIER_ALLGATHER | ACTIVE) != 0 {
            return Err(bad(format!("unknown autotune flags {flags:#04x}")));
        }
        Ok(AppliedTrial {
            trial,
            params: TunedParams {
                fusion_threshold: fusion as usize,
                cycle_time,
                cache_enabled: flags & CACHE != 0,
                hierarchical_allreduce: flags & HIER_ALLREDUCE != 0,
                hierarchical_allgather: flags & HIER_ALLGATHER != 0,
                active: flags & ACTIVE != 0,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trips(trial in any::<u32>(), fusion in 0u64..=MAX_FUSION_THRESHOLD,
                       nanos in 1u64..60_000_000_000, flags in 0u8..16) {
            let applied = AppliedTrial {
                trial,
                params: TunedParams {
                    fusion_threshold: fusion as usize,
                    cycle_time: Duration::from_nanos(nanos),
                    cache_enabled: flags & 1 != 0,
                    hierarchical_allreduce: flags & 2 != 0,
                    hierarchical_allgather: flags & 4 != 0,
                    active: flags & 8 != 0,
                },
            };
            let mut bytes = Vec::new();
            applied.encode(&mut bytes);
            prop_assert_eq!(bytes.len(), WIRE_LEN);
            prop_assert_eq!(AppliedTrial::decode(&bytes).unwrap(), applied);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = AppliedTrial::decode(&bytes);
        }
    }

    #[test]
    fn refuses_values_no_coordinator_sends() {
        let good = AppliedTrial {
            trial: 1,
            params: TunedParams {
                fusion_threshold: 1,
                cycle_time: Duration::from_millis(1),
                cache_enabled: true,
                hierarchical_allreduce: true,
                hierarchical_allgather: true,
                active: true,
            },
        };
        let mut bytes = Vec::new();
        good.encode(&mut bytes);
        let mut zero_cycle = bytes.clone();
        zero_cycle[12..20].copy_from_slice(&0u64.to_le_bytes());
        let mut huge_fusion = bytes.clone();
        huge_fusion[4..12].copy_from_slice(&u64::MAX.to_le_bytes());
        let mut unknown_flag = bytes.clone();
        unknown_flag[20] |= 0x40;
        for bad in [zero_cycle, huge_fusion, unknown_flag, bytes[..5].to_vec()] {
            assert!(AppliedTrial::decode(&bad).is_err());
        }
    }
}
