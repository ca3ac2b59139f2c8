//! Storing into a shared half without first taking its cache lines from the readers.
//!
//! A rank writes its half in phase `p` after every peer read it in phase `p - 2`, so those
//! lines sit in the peers' caches. An ordinary store must first take each line back
//! (invalidate the readers' copies) before it writes, and stores leave the core in order, so
//! only a few such ownership requests overlap. Where the two cores of a 2-rank job are far
//! apart, that is slow: on the 2-vCPU AMD EPYC host kolo is developed on, the cores' round
//! trip is ~80 ns at times and ~330 ns at others (the hypervisor moves the vCPUs), and copying
//! 64 KiB into lines the other core had read then takes 7 µs or 28 µs (2.3 GB/s), while
//! non-temporal stores write the same 64 KiB in 2 µs either way and the reader fetches it in
//! 4 µs from memory (`bench/core_round_trip.c` shows which state a host is in). Measured in a
//! 2-rank allreduce of 1 MiB (`bench/shm_stores.py`), streaming is 5x faster while the cores
//! are far apart and 2x slower while they are near (the data then stays in the shared L3
//! instead of making a round trip through memory).
//!
//! So the way is chosen by measurement ([`StoreTuner`]): the node's first local rank times the
//! work of its allreduces (the copies and the reduction, not the waits) per byte under each
//! way, keeps the cheaper, tries the other again now and then (the hypervisor moves vCPUs
//! every few seconds to minutes), and publishes the choice in its segment's header for the
//! other local ranks, which read it at the start of each collective. Copies shorter than
//! [`STREAM_MIN`] are ordinary either way.
//!
//! Non-temporal stores are weakly ordered: [`publish_fence`] must run between the last of
//! them and the release store that publishes the phase.

use std::time::{Duration, Instant};

use crate::error::Error;

/// Environment variable: `auto` (the default: measured, as above), `ordinary` or `streaming`.
pub const SHM_STORES: &str = "KOLO_SHM_STORES";

/// The way [`SHM_STORES`] forces, if any.
pub(crate) fn forced_way() -> Result<Option<bool>, Error> {
    std::env::var(SHM_STORES).map_or(Ok(None), |text| parse_way(&text))
}

/// Parses a value of [`SHM_STORES`]: `None` for auto, else whether to stream.
fn parse_way(text: &str) -> Result<Option<bool>, Error> {
    match text.trim().to_ascii_lowercase().as_str() {
        "" | "auto" => Ok(None),
        "ordinary" => Ok(Some(false)),
        "streaming" => Ok(Some(true)),
        _ => Err(Error::Config(format!(
            "{SHM_STORES}={text:?} is not a way to store into shared memory: use auto (the \
             default: measured), ordinary or streaming"
        ))),
    }
}

/// Copies shorter than this use ordinary stores.
pub(crate) const STREAM_MIN: usize = 4096;

/// Copies `src` into `dst` (of the same length, inside a shared half), streaming when
/// `streaming` and the copy is long enough.
pub(crate) fn copy_into_half(dst: &mut [u8], src: &[u8], streaming: bool) {
    assert_eq!(
        dst.len(),
        src.len(),
        "a copy into a half needs equal lengths"
    );
    if !streaming || dst.len() < STREAM_MIN {
        dst.copy_from_slice(src);
        return;
    }
    stream(dst, src);
}

#[cfg(target_arch = "x86_64")]
fn stream(dst: &mut [u8], src: &[u8]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    // Ordinary stores up to the first 16-byte boundary, then whole 64-byte lines' worth of
    // 16-byte streaming stores (SSE2: every x86-64 has them), then the rest.
    let head = dst.as_ptr().align_offset(16).min(dst.len());
    let (dst_head, dst_body) = dst.split_at_mut(head);
    let (src_head, src_body) = src.split_at(head);
    dst_head.copy_from_slice(src_head);
    let body = dst_body.len() / 64 * 64;
    let d = dst_body.as_mut_ptr().cast::<__m128i>();
    let s = src_body.as_ptr().cast::<__m128i>();
    for i in 0..body / 16 {
        // SAFETY: i * 16 + 16 <= body <= both lengths; `d` is 16-byte aligned (the head
        // reached the boundary); loads are unaligned.
        unsafe { _mm_stream_si128(d.add(i), _mm_loadu_si128(s.add(i))) };
    }
    dst_body[body..].copy_from_slice(&src_body[body..]);
}

#[cfg(not(target_arch = "x86_64"))]
fn stream(dst: &mut [u8], src: &[u8]) {
    dst.copy_from_slice(src);
}

/// Orders every non-temporal store this thread made before the stores that follow (the
/// phase's release store).
pub(crate) fn publish_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SFENCE has no operands and no preconditions.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// Allreduces shorter than this neither tune nor trial the way (their fixed costs would
/// drown the per-byte cost).
pub(crate) const TUNED_MIN: usize = 64 << 10;
/// Size classes of tuned collectives, each with its own choice: powers of two from
/// [`TUNED_MIN`] (the first also holds shorter ones, the last longer ones). Costs per byte
/// differ by size (the algorithm, the caches), so a trial is only compared with its own size.
pub(crate) const SIZE_CLASSES: usize = 16;

/// The size class of a collective of `bytes`.
pub(crate) fn size_class(bytes: usize) -> usize {
    let log = usize::BITS - 1 - bytes.max(1).leading_zeros();
    let min = TUNED_MIN.trailing_zeros();
    (log.saturating_sub(min) as usize).min(SIZE_CLASSES - 1)
}

/// The first trial of the way not in use follows this many tuned allreduces (so that it falls
/// in a job's warm-up).
const FIRST_TRIAL: u32 = 1;
/// Later trials follow at least this many tuned allreduces...
const TRIAL_EVERY: u32 = 64;
/// ...and this long after the last trial (a trial of the worse way costs up to 2.5x one op)...
const TRIAL_GAP: Duration = Duration::from_millis(200);
/// ...both doubled after every trial that kept the way, at most this many times (16x), and
/// reset when the way changes: a machine that stays as it is pays for fewer trials. A slowdown
/// of the kept way is seen without a trial (its cost rises past the other's).
const MAX_DOUBLINGS: u32 = 4;
/// The way not in use is taken when its cost is below the current way's by this factor.
const SWITCH_MARGIN: f64 = 1.2;
/// Weight of the newest sample in the current way's cost.
const NEWEST_WEIGHT: f64 = 0.25;

/// The local leader's choice between ordinary and streaming stores into halves.
#[derive(Debug, Default)]
pub(crate) struct StoreTuner {
    /// Work seconds per byte of each way (ordinary, streaming); `None` until tried.
    cost: [Option<f64>; 2],
    streaming: bool,
    /// Tuned allreduces since the last trial, and when it ran.
    since_trial: u32,
    last_trial: Option<Instant>,
    /// How many times [`TRIAL_EVERY`] and [`TRIAL_GAP`] are doubled.
    doublings: u32,
}

impl StoreTuner {
    /// The way the next collective uses: the kept one, or the other as a trial.
    pub(crate) fn next(&mut self, now: Instant) -> bool {
        let untried = self.cost[usize::from(!self.streaming)].is_none();
        let due = if untried {
            self.since_trial >= FIRST_TRIAL
        } else {
            let backoff = 1 << self.doublings;
            self.since_trial >= TRIAL_EVERY * backoff
                && self
                    .last_trial
                    .is_none_or(|at| now.duration_since(at) >= TRIAL_GAP * backoff)
        };
        if due {
            self.since_trial = 0;
            self.last_trial = Some(now);
            return !self.streaming;
        }
        self.streaming
    }

    /// Records a tuned allreduce of `bytes` done with `streaming` stores in `work`, and
    /// switches ways when the other is cheaper by [`SWITCH_MARGIN`].
    pub(crate) fn record(&mut self, streaming: bool, bytes: usize, work: Duration) {
        if bytes < TUNED_MIN {
            return;
        }
        let sample = work.as_secs_f64() / bytes as f64;
        let slot = &mut self.cost[usize::from(streaming)];
        *slot = Some(match *slot {
            // A trial's single sample replaces the old estimate: the machine may have changed.
            Some(old) if streaming == self.streaming => old + NEWEST_WEIGHT * (sample - old),
            _ => sample,
        });
        let trial = streaming != self.streaming;
        if !trial {
            self.since_trial += 1;
        }
        if let [Some(ordinary), Some(streamed)] = self.cost {
            let (current, other) = if self.streaming {
                (streamed, ordinary)
            } else {
                (ordinary, streamed)
            };
            if other * SWITCH_MARGIN < current {
                self.streaming = !self.streaming;
                self.doublings = 0;
            } else if trial {
                self.doublings = (self.doublings + 1).min(MAX_DOUBLINGS);
            }
        }
    }

    /// The kept way.
    #[cfg(test)]
    pub(crate) fn streaming(&self) -> bool {
        self.streaming
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_every_byte_at_every_alignment_and_length() {
        let src: Vec<u8> = (0..3 * STREAM_MIN).map(|i| (i * 7 + 3) as u8).collect();
        let mut backing = vec![0u8; 3 * STREAM_MIN + 64];
        for offset in [0, 1, 15, 16, 17, 63] {
            for len in [
                0,
                1,
                STREAM_MIN - 1,
                STREAM_MIN,
                STREAM_MIN + 1,
                STREAM_MIN + 79,
            ] {
                backing.fill(0xAA);
                let from = 5 % (src.len() - len + 1);
                copy_into_half(
                    &mut backing[offset..offset + len],
                    &src[from..from + len],
                    true,
                );
                publish_fence();
                assert_eq!(&backing[offset..offset + len], &src[from..from + len]);
                assert!(
                    backing[..offset].iter().all(|&b| b == 0xAA),
                    "wrote before the range"
                );
                assert!(
                    backing[offset + len..].iter().all(|&b| b == 0xAA),
                    "wrote past the range"
                );
            }
        }
    }

    fn tuned(tuner: &mut StoreTuner, ordinary_us: f64, streamed_us: f64, ops: usize) -> Vec<bool> {
        let mut at = Instant::now();
        let mut ways = Vec::new();
        for _ in 0..ops {
            at += Duration::from_millis(10);
            let way = tuner.next(at);
            let us = if way { streamed_us } else { ordinary_us };
            tuner.record(way, 1 << 20, Duration::from_secs_f64(us * 1e-6));
            ways.push(way);
        }
        ways
    }

    #[test]
    fn the_tuner_keeps_the_cheaper_way_and_follows_the_machine_when_it_changes() {
        let mut tuner = StoreTuner::default();
        // Cores near: ordinary stores are cheaper; the first trial confirms it.
        let ways = tuned(&mut tuner, 70.0, 140.0, 200);
        assert!(!tuner.streaming());
        let trials = ways.iter().filter(|&&w| w).count();
        assert!(
            (1..=4).contains(&trials),
            "{trials} trials of streaming in 200 ops"
        );
        // Cores far apart: the next trial finds streaming 5x cheaper and keeps it.
        let ways = tuned(&mut tuner, 580.0, 100.0, 200);
        assert!(tuner.streaming());
        assert!(ways[ways.len() / 2..].iter().filter(|&&w| !w).count() <= 2);
        // A difference inside the margin does not flip the way back and forth.
        tuned(&mut tuner, 110.0, 100.0, 200);
        assert!(tuner.streaming());
    }

    #[test]
    fn the_knob_forces_a_way_or_names_its_values() {
        for (text, way) in [
            ("auto", None),
            ("Ordinary", Some(false)),
            (" streaming", Some(true)),
        ] {
            assert_eq!(parse_way(text).unwrap(), way, "{text}");
        }
        let err = parse_way("nt").unwrap_err().to_string();
        assert!(
            err.contains("KOLO_SHM_STORES=\"nt\"") && err.contains("streaming"),
            "{err}"
        );
    }

    #[test]
    fn size_classes_are_powers_of_two_from_the_tuned_minimum() {
        assert_eq!(size_class(0), 0);
        assert_eq!(size_class(TUNED_MIN - 1), 0);
        assert_eq!(size_class(TUNED_MIN), 0);
        assert_eq!(size_class(2 * TUNED_MIN - 1), 0);
        assert_eq!(size_class(2 * TUNED_MIN), 1);
        assert_eq!(size_class(2_232 << 10), 5);
        assert_eq!(size_class(usize::MAX), SIZE_CLASSES - 1);
    }

    #[test]
    fn trials_thin_out_while_the_machine_stays_as_it_is() {
        let mut tuner = StoreTuner::default();
        let ways = tuned(&mut tuner, 70.0, 140.0, 4000);
        let trials: Vec<usize> = (0..ways.len()).filter(|&i| ways[i]).collect();
        // The second allreduce, then after 128, 256, 512, ... allreduces, at most 1024 apart.
        assert_eq!(trials[..4], [1, 130, 387, 900], "{trials:?}");
        let gaps: Vec<usize> = trials.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.iter().all(|&g| g <= 16 * 64 + 1), "{gaps:?}");
        assert!(
            trials.len() <= 8,
            "{} trials in 4000 allreduces",
            trials.len()
        );
    }

    #[test]
    fn short_allreduces_do_not_tune() {
        let mut tuner = StoreTuner::default();
        tuner.record(false, TUNED_MIN - 1, Duration::from_secs(1));
        tuner.record(true, TUNED_MIN - 1, Duration::from_nanos(1));
        assert_eq!(tuner.cost, [None, None]);
        assert!(!tuner.streaming());
    }
}
