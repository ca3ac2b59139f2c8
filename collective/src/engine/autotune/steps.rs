//! Cuts the stream of agreed tensors into training steps and scores each step: a step ends when
//! a tensor name of the current step is agreed again (Horovod's `tensor_counts_` rule), and its
//! score is the bytes the engine moved in it per microsecond of the step's wall time.

use std::collections::HashSet;
use std::time::Instant;

/// Step detection on the coordinator.
#[derive(Debug, Default)]
pub(crate) struct StepClock {
    names: HashSet<String>,
    bytes: u64,
    started: Option<Instant>,
}

impl StepClock {
    /// Feeds one cycle's agreed tensors (`(name, bytes)`) seen at `now`; returns the score
    /// (bytes per microsecond) of the step that ended, if one did.
    pub(crate) fn observe<'a>(
        &mut self,
        tensors: impl IntoIterator<Item = (&'a str, u64)>,
        now: Instant,
    ) -> Option<f64> {
        let mut score = None;
        for (name, bytes) in tensors {
            if self.names.contains(name) {
                if let Some(started) = self.started {
                    let micros = now.duration_since(started).as_secs_f64() * 1e6;
                    if micros > 0.0 {
                        score = Some(self.bytes as f64 / micros);
                    }
                }
                self.names.clear();
                self.bytes = 0;
                self.started = Some(now);
            }
            self.started.get_or_insert(now);
            self.names.insert(name.to_owned());
            self.bytes += bytes;
        }
        score
    }
}

/// The median of `values` (the mean of the middle two for an even count); `None` when empty.
/// Robust to a few slow or fast outlier steps, unlike the mean.
pub(crate) fn median(values: &[f64]) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    Some(if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_repeated_name_ends_the_step_and_scores_bytes_per_microsecond() {
        let t0 = Instant::now();
        let mut clock = StepClock::default();
        assert_eq!(clock.observe([("a", 1000), ("b", 1000)], t0), None);
        assert_eq!(
            clock.observe([("c", 2000)], t0 + Duration::from_millis(1)),
            None
        );
        // Step 1 (4000 bytes) took 2 ms when `a` comes again.
        let score = clock.observe([("a", 1000)], t0 + Duration::from_millis(2));
        assert!((score.unwrap() - 2.0).abs() < 1e-9, "{score:?}");
        assert_eq!(
            clock.observe([("b", 1000)], t0 + Duration::from_millis(3)),
            None
        );
        let score = clock.observe([("a", 1000)], t0 + Duration::from_millis(6));
        assert!((score.unwrap() - 0.5).abs() < 1e-9, "{score:?}");
    }

    #[test]
    fn median_ignores_outliers() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 1000.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 2.0]), Some(2.0));
    }
}
