//! How regularly the job driver hears heartbeats: a fixed-size histogram of the gap between a
//! rank's consecutive heartbeats as the driver receives them. A driver that keeps up sees gaps
//! near the workers' heartbeat interval; gaps that grow toward the heartbeat timeout mean
//! heartbeats are starved (the driver, its runtime or the network falls behind) long before a
//! rank is wrongly declared lost. Recording is O(1) and the memory is fixed whatever the job's
//! size.

use std::time::Duration;

/// Sub-buckets per power of two (relative error of a percentile at most 1/16).
const SUB_BUCKETS: usize = 16;
/// Powers of two of microseconds covered (2^40 µs is about 12 days; longer gaps are clamped).
const OCTAVES: usize = 40;

/// Gaps between consecutive heartbeats of the same rank, as the driver received them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatGaps {
    counts: Vec<u64>,
    total: u64,
    max: Duration,
}

impl Default for HeartbeatGaps {
    fn default() -> Self {
        Self {
            counts: vec![0; SUB_BUCKETS * (OCTAVES + 1)],
            total: 0,
            max: Duration::ZERO,
        }
    }
}

/// The bucket of `micros`: exact below [`SUB_BUCKETS`], then [`SUB_BUCKETS`] per octave.
fn bucket(micros: u64) -> usize {
    if micros < SUB_BUCKETS as u64 {
        return micros as usize;
    }
    let octave = (63 - micros.leading_zeros() as usize) - (SUB_BUCKETS.trailing_zeros() as usize);
    let sub = (micros >> octave) as usize - SUB_BUCKETS;
    ((octave + 1) * SUB_BUCKETS + sub).min(SUB_BUCKETS * (OCTAVES + 1) - 1)
}

/// The largest gap (in µs) that falls in bucket `index`.
fn bucket_top(index: usize) -> u64 {
    if index < SUB_BUCKETS {
        return index as u64;
    }
    let octave = index / SUB_BUCKETS - 1;
    let sub = (index % SUB_BUCKETS + SUB_BUCKETS) as u64;
    ((sub + 1) << octave) - 1
}

impl HeartbeatGaps {
    /// Counts one gap.
    pub(crate) fn record(&mut self, gap: Duration) {
        let micros = u64::try_from(gap.as_micros()).unwrap_or(u64::MAX);
        self.counts[bucket(micros)] += 1;
        self.total += 1;
        self.max = self.max.max(gap);
    }

    /// How many gaps were recorded.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// The longest gap recorded (exact).
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The gap that `quantile` (0.0 ..= 1.0) of all gaps do not exceed, within 1/16 (the top
    /// of its bucket, never above [`HeartbeatGaps::max`]); `None` before any gap.
    ///
    /// ```
    /// use kolo_collective::control::HeartbeatGaps;
    /// assert_eq!(HeartbeatGaps::default().percentile(0.5), None);
    /// ```
    pub fn percentile(&self, quantile: f64) -> Option<Duration> {
        if self.total == 0 {
            return None;
        }
        let rank = ((quantile.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (index, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Some(Duration::from_micros(bucket_top(index)).min(self.max));
            }
        }
        Some(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_gap_in_order_and_within_a_sixteenth() {
        let mut last = 0;
        for micros in (0..100_000u64).chain([1 << 30, (1 << 40) - 1]) {
            let index = bucket(micros);
            assert!(index >= last, "bucket of {micros} went back");
            last = index;
            let top = bucket_top(index);
            assert!(top >= micros, "{micros} above its bucket's top {top}");
            assert!(
                top - micros <= micros / SUB_BUCKETS as u64,
                "bucket of {micros} too wide"
            );
        }
        assert_eq!(bucket(u64::MAX), SUB_BUCKETS * (OCTAVES + 1) - 1);
    }

    #[test]
    fn percentiles_follow_the_recorded_gaps() {
        let mut gaps = HeartbeatGaps::default();
        for ms in 1..=100u64 {
            gaps.record(Duration::from_millis(ms));
        }
        assert_eq!(gaps.count(), 100);
        assert_eq!(gaps.max(), Duration::from_millis(100));
        let median = gaps.percentile(0.5).unwrap();
        assert!(
            median >= Duration::from_millis(50) && median <= Duration::from_micros(53_125),
            "{median:?}"
        );
        assert_eq!(gaps.percentile(1.0), Some(Duration::from_millis(100)));
        let low = gaps.percentile(0.0).unwrap();
        assert!(low >= Duration::from_millis(1) && low < Duration::from_millis(2));
    }
}
