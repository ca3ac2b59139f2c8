//! The paired A/B re-check that decides which setting is kept. A search scores each point once
//! or twice, and on a shared machine one sample can be 2× off (a quiet spell makes a bad point
//! look best). So before a setting is kept, the incumbent (the configured setting, or the
//! setting kept so far) and the top candidates are sampled again in alternating rounds
//! (`A B C`, then `C B A`, ...): each round's samples run close together in time, so the
//! ratio of a candidate's score to the incumbent's in the same round cancels most of the
//! machine's drift. A candidate replaces the incumbent only when the median of those paired
//! log-ratios beats both [`KEEP_MARGIN`] and the noise measured from their own spread. When
//! after [`RECHECK_ROUNDS`] rounds a challenger beats the margin but not the noise, the
//! re-check is unresolved and runs on to [`MAX_RECHECK_ROUNDS`]: the noise bar shrinks as
//! `1/√rounds`, so a real gain of a few % is resolved on a noisy machine instead of being
//! given up for the incumbent.

use super::steps::median;
use super::TunedParams;

/// Rounds of the re-check before its first verdict: every candidate is sampled once per round.
pub(crate) const RECHECK_ROUNDS: usize = 6;

/// The rounds of an unresolved re-check's second and last look (twice the rounds shrink the
/// noise bar by √2).
pub(crate) const MAX_RECHECK_ROUNDS: usize = 2 * RECHECK_ROUNDS;

/// A re-check sample scores this many windows of `steps_per_sample` steps (one: the paired
/// rounds, not long samples, are what beat the noise).
pub(crate) const RECHECK_WINDOWS: usize = 1;

/// A change away from the incumbent must score at least this much better to be kept, however
/// quiet the machine (a few % is not worth leaving a known setting for).
pub(crate) const KEEP_MARGIN: f64 = 0.03;

/// A change must beat the incumbent by this many standard errors of the paired median.
const NOISE_Z: f64 = 2.0;

/// The standard deviation of normal data is 1.4826 × its median absolute deviation, and the
/// standard error of a median of `n` is 1.2533 σ / √n.
const MAD_TO_SIGMA: f64 = 1.4826;
const MEDIAN_SE: f64 = 1.2533;

/// What a finished re-check decided.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Verdict {
    /// Index of the kept candidate (0: the incumbent stays).
    pub(crate) kept: usize,
    /// The kept candidate's median score over the rounds.
    pub(crate) score: f64,
    /// The best challenger's median paired log-ratio to the incumbent.
    pub(crate) gain: f64,
    /// The gain it had to beat: `ln(1 + KEEP_MARGIN)` or the measured noise, the larger.
    pub(crate) bar: f64,
    /// Rounds the verdict is based on.
    pub(crate) rounds: usize,
}

impl Verdict {
    /// A challenger beat the margin but not the measured noise: more rounds could tell.
    fn unresolved(&self) -> bool {
        self.kept == 0 && self.gain > KEEP_MARGIN.ln_1p()
    }
}

/// A running re-check of `candidates` (index 0 the incumbent).
#[derive(Debug, Clone)]
pub(crate) struct Recheck {
    candidates: Vec<TunedParams>,
    /// `scores[c][r]`: candidate `c`'s sample score in round `r`.
    scores: Vec<Vec<f64>>,
    round: usize,
    turn: usize,
}

impl Recheck {
    /// A re-check of the incumbent `candidates[0]` against the others (at least one).
    pub(crate) fn new(candidates: Vec<TunedParams>) -> Recheck {
        debug_assert!(candidates.len() >= 2);
        Recheck {
            scores: vec![Vec::with_capacity(RECHECK_ROUNDS); candidates.len()],
            candidates,
            round: 0,
            turn: 0,
        }
    }

    /// The candidates, incumbent first.
    pub(crate) fn candidates(&self) -> &[TunedParams] {
        &self.candidates
    }

    /// Which candidate the running sample measures: forward in even rounds, backward in odd
    /// ones, so no candidate always runs right after another.
    fn running(&self) -> usize {
        if self.round.is_multiple_of(2) {
            self.turn
        } else {
            self.candidates.len() - 1 - self.turn
        }
    }

    /// The setting the running sample measures.
    pub(crate) fn current(&self) -> TunedParams {
        self.candidates[self.running()]
    }

    /// Takes the running sample's score; returns the verdict once it is resolved, after
    /// [`RECHECK_ROUNDS`] rounds or, when unresolved then, after [`MAX_RECHECK_ROUNDS`].
    pub(crate) fn record(&mut self, score: f64) -> Option<Verdict> {
        let running = self.running();
        self.scores[running].push(score.max(f64::MIN_POSITIVE));
        self.turn += 1;
        if self.turn < self.candidates.len() {
            return None;
        }
        self.turn = 0;
        self.round += 1;
        // Two looks only: each look is a chance for noise to pass the bar.
        if self.round != RECHECK_ROUNDS && self.round != MAX_RECHECK_ROUNDS {
            return None;
        }
        let verdict = decide(&self.scores);
        (self.round == MAX_RECHECK_ROUNDS || !verdict.unresolved()).then_some(verdict)
    }
}

/// The verdict on complete rounds `scores` (`scores[c][r]`, candidate 0 the incumbent).
pub(crate) fn decide(scores: &[Vec<f64>]) -> Verdict {
    let incumbent = &scores[0];
    let mut best: Option<(usize, f64, f64)> = None;
    for (c, challenger) in scores.iter().enumerate().skip(1) {
        let ratios: Vec<f64> = challenger
            .iter()
            .zip(incumbent)
            .map(|(s, i)| (s / i).ln())
            .collect();
        let Some(gain) = median(&ratios) else {
            continue;
        };
        let deviations: Vec<f64> = ratios.iter().map(|r| (r - gain).abs()).collect();
        let sigma = MAD_TO_SIGMA * median(&deviations).unwrap_or(0.0);
        let noise = NOISE_Z * MEDIAN_SE * sigma / (ratios.len() as f64).sqrt();
        if best.is_none_or(|(_, g, _)| gain > g) {
            best = Some((c, gain, noise));
        }
    }
    let (challenger, gain, noise) = best.unwrap_or((0, 0.0, 0.0));
    let bar = KEEP_MARGIN.ln_1p().max(noise);
    let kept = if challenger > 0 && gain > bar {
        challenger
    } else {
        0
    };
    Verdict {
        kept,
        score: median(&scores[kept]).unwrap_or(0.0),
        gain,
        bar,
        rounds: incumbent.len(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn setting(fusion_mib: usize) -> TunedParams {
        TunedParams {
            fusion_threshold: fusion_mib << 20,
            cycle_time: Duration::from_millis(1),
            cache_enabled: true,
            hierarchical_allreduce: false,
            hierarchical_allgather: false,
            active: true,
        }
    }

    /// Runs a re-check of settings 0, 1, 2 scoring `score(candidate, round)`.
    fn run(score: impl Fn(usize, usize) -> f64) -> (Verdict, Vec<usize>) {
        let candidates = vec![setting(0), setting(1), setting(2)];
        let mut recheck = Recheck::new(candidates.clone());
        let mut order = Vec::new();
        for sample in 0.. {
            let current = recheck.current();
            let c = candidates.iter().position(|p| *p == current).unwrap();
            order.push(c);
            if let Some(verdict) = recheck.record(score(c, sample / candidates.len())) {
                return (verdict, order);
            }
        }
        unreachable!()
    }

    #[test]
    fn alternates_the_order_every_round() {
        let (_, order) = run(|_, _| 1.0);
        assert_eq!(order.len(), 3 * RECHECK_ROUNDS);
        assert_eq!(&order[..9], &[0, 1, 2, 2, 1, 0, 0, 1, 2]);
    }

    #[test]
    fn keeps_the_challenger_that_wins_every_paired_round() {
        // Candidate 2 is 10 % better than the incumbent in every round, candidate 1 5 %, while
        // the machine's speed drifts 2× between rounds: pairing cancels the drift.
        let (verdict, _) = run(|c, round| {
            let drift = if round % 2 == 0 { 1.0 } else { 0.5 };
            drift * [100.0, 105.0, 110.0][c]
        });
        assert_eq!(verdict.kept, 2, "{verdict:?}");
        assert!((verdict.gain - 1.1f64.ln()).abs() < 1e-9, "{verdict:?}");
        assert_eq!(verdict.score, median(&[110.0, 55.0]).unwrap());
    }

    #[test]
    fn a_win_within_the_measured_noise_keeps_the_incumbent() {
        // Candidate 1 wins by 8 % in the median round, but the paired ratios swing ±30 %:
        // unresolved after 6 rounds, and still within the noise after 12.
        let swing = [1.3, 0.75, 1.08, 1.35, 0.8, 1.08];
        let (verdict, order) = run(|c, round| match c {
            1 => 100.0 * swing[round % swing.len()],
            _ => 100.0,
        });
        assert_eq!(verdict.kept, 0, "{verdict:?}");
        assert!(
            verdict.gain > 0.05 && verdict.bar > verdict.gain,
            "{verdict:?}"
        );
        assert_eq!(verdict.rounds, MAX_RECHECK_ROUNDS);
        assert_eq!(order.len(), 3 * MAX_RECHECK_ROUNDS);
        // The same 8 % with steady rounds is kept.
        let (verdict, _) = run(|c, round| match c {
            1 => 108.0 + round as f64 * 0.1,
            _ => 100.0,
        });
        assert_eq!(verdict.kept, 1, "{verdict:?}");
    }

    #[test]
    fn a_steady_win_below_the_margin_keeps_the_incumbent() {
        let (verdict, order) = run(|c, _| if c == 1 { 102.0 } else { 100.0 });
        assert_eq!(verdict.kept, 0, "{verdict:?}");
        assert_eq!(verdict.bar, KEEP_MARGIN.ln_1p());
        // Resolved: below the margin, more rounds could not change it.
        assert_eq!(order.len(), 3 * RECHECK_ROUNDS);
    }

    #[test]
    fn an_unresolved_win_is_resolved_by_more_rounds() {
        // Candidate 1 is 10 % better in the median round, with paired ratios between 1.0 and
        // 1.2: after 6 rounds the measured noise (11 %) hides the gain, after 12 (8 %) it does
        // not.
        let ratios = [1.10, 1.20, 1.0, 1.10, 1.18, 1.02];
        let first: Vec<Vec<f64>> = vec![vec![100.0; 6], ratios.iter().map(|r| 100.0 * r).collect()];
        let early = decide(&first);
        assert!(early.unresolved() && early.bar > early.gain, "{early:?}");
        let (verdict, order) = run(|c, round| match c {
            1 => 100.0 * ratios[round % ratios.len()],
            _ => 100.0,
        });
        assert_eq!(verdict.kept, 1, "{verdict:?}");
        assert_eq!(verdict.rounds, MAX_RECHECK_ROUNDS);
        assert_eq!(order.len(), 3 * MAX_RECHECK_ROUNDS);
    }
}
