//! The coordinator's parameter manager (Horovod's `ParameterManager`): warm-up, samples of
//! steps scored by their median, Bayesian optimisation of fusion threshold × cycle time until
//! it converges, then one sample per categorical switch, then the best setting for good.

use std::time::Duration;

use super::acquisition::propose;
use super::gp::GaussianProcess;
use super::log::CsvLog;
use super::settings::AutotuneConfig;
use super::steps::median;
use super::TunedParams;

/// Fusion threshold range searched, in MiB (Horovod: 0–64; kolo's default is 128).
pub(crate) const FUSION_MB: (f64, f64) = (0.0, 128.0);
/// Cycle time range searched, in milliseconds (Horovod's).
pub(crate) const CYCLE_MS: (f64, f64) = (1.0, 100.0);
/// Horovod's first Bayesian test points `(fusion MiB, cycle ms)`, tried after the configured
/// setting.
const TEST_POINTS: [(f64, f64); 4] = [(4.0, 5.0), (32.0, 50.0), (16.0, 25.0), (8.0, 10.0)];
/// The search has converged when the largest expected improvement is below this fraction of
/// the best predicted score...
pub(crate) const EI_CONVERGED: f64 = 0.01;
/// ...or the best predicted score did not rise by more than that fraction for this many
/// samples.
pub(crate) const PATIENCE: usize = 4;

/// A change away from the configured setting must score at least this much better to be kept
/// (a noisy sample does not move a job off a good default).
pub(crate) const KEEP_MARGIN: f64 = 0.03;

/// A parameter of the joint (Bayesian) search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dim {
    /// The fusion threshold.
    Fusion,
    /// The cycle time.
    Cycle,
}

impl Dim {
    fn range(self) -> (f64, f64) {
        match self {
            Dim::Fusion => FUSION_MB,
            Dim::Cycle => CYCLE_MS,
        }
    }

    /// `params`' value of this dimension in `[0, 1]`.
    fn unit(self, params: &TunedParams) -> f64 {
        let value = match self {
            Dim::Fusion => params.fusion_threshold as f64 / (1024.0 * 1024.0),
            Dim::Cycle => params.cycle_time.as_secs_f64() * 1e3,
        };
        let (low, high) = self.range();
        ((value - low) / (high - low)).clamp(0.0, 1.0)
    }

    fn set(self, params: &mut TunedParams, unit: f64) {
        let (low, high) = self.range();
        let value = low + unit.clamp(0.0, 1.0) * (high - low);
        match self {
            Dim::Fusion => params.fusion_threshold = (value * 1024.0 * 1024.0).round() as usize,
            Dim::Cycle => params.cycle_time = Duration::from_secs_f64(value / 1e3),
        }
    }
}

/// A categorical switch tried after the joint search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Switch {
    /// Hierarchical allreduce.
    HierarchicalAllreduce,
    /// Hierarchical allgather.
    HierarchicalAllgather,
    /// The response cache.
    Cache,
}

impl Switch {
    fn flip(self, params: &mut TunedParams) {
        let value = match self {
            Switch::HierarchicalAllreduce => &mut params.hierarchical_allreduce,
            Switch::HierarchicalAllgather => &mut params.hierarchical_allgather,
            Switch::Cache => &mut params.cache_enabled,
        };
        *value = !*value;
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    Warmup {
        left: usize,
    },
    Joint,
    /// `next`: the switch the running sample tries; `None` while the baseline runs.
    Categorical {
        next: Option<usize>,
    },
    Done,
}

/// What the coordinator's tuner knows.
#[derive(Debug)]
pub(crate) struct Tuner {
    config: AutotuneConfig,
    dims: Vec<Dim>,
    switches: Vec<Switch>,
    phase: Phase,
    /// The setting the running sample measures.
    current: TunedParams,
    best: TunedParams,
    best_score: f64,
    /// Joint points to sample before the model proposes them.
    initial: Vec<Vec<f64>>,
    xs: Vec<Vec<f64>>,
    ys: Vec<f64>,
    incumbent: Option<usize>,
    /// The best predicted score so far, and for how many samples it has not risen by more
    /// than [`EI_CONVERGED`].
    best_predicted: f64,
    unchanged: usize,
    step_scores: Vec<f64>,
    /// The next step straddles a change of setting: not scored.
    settling: bool,
    log: Option<CsvLog>,
    samples: usize,
}

impl Tuner {
    /// A tuner starting from `start` (the configured setting) that searches `dims` and then
    /// tries `switches`.
    pub(crate) fn new(
        config: AutotuneConfig,
        start: TunedParams,
        dims: Vec<Dim>,
        switches: Vec<Switch>,
        log: Option<CsvLog>,
    ) -> Tuner {
        let start = TunedParams {
            active: true,
            ..start
        };
        let mut initial = vec![dims.iter().map(|d| d.unit(&start)).collect::<Vec<_>>()];
        for (fusion, cycle) in TEST_POINTS {
            let mut p = start;
            Dim::Fusion.set(&mut p, (fusion - FUSION_MB.0) / (FUSION_MB.1 - FUSION_MB.0));
            Dim::Cycle.set(&mut p, (cycle - CYCLE_MS.0) / (CYCLE_MS.1 - CYCLE_MS.0));
            initial.push(dims.iter().map(|d| d.unit(&p)).collect());
        }
        initial.dedup();
        let phase = if config.warmup_samples > 0 {
            Phase::Warmup {
                left: config.warmup_samples,
            }
        } else {
            Phase::Joint
        };
        let mut tuner = Tuner {
            config,
            dims,
            switches,
            phase,
            current: start,
            best: start,
            best_score: 0.0,
            initial,
            xs: Vec::new(),
            ys: Vec::new(),
            incumbent: None,
            best_predicted: f64::NEG_INFINITY,
            unchanged: 0,
            step_scores: Vec::new(),
            settling: false,
            log,
            samples: 0,
        };
        if tuner.phase == Phase::Joint && tuner.dims.is_empty() {
            tuner.start_categorical();
        }
        tuner
    }

    /// The setting to apply now.
    pub(crate) fn current(&self) -> TunedParams {
        self.current
    }

    /// Whether the search is over (the best setting is applied).
    pub(crate) fn done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// Scored samples so far (warm-up excluded).
    #[cfg(test)]
    pub(crate) fn samples(&self) -> usize {
        self.samples
    }

    /// Takes the score of one finished step; returns the next setting when the sample ended
    /// (possibly the same values: every sample is a new trial every rank records).
    pub(crate) fn observe_step(&mut self, score: f64) -> Option<TunedParams> {
        if self.phase == Phase::Done {
            return None;
        }
        if self.settling {
            self.settling = false;
            return None;
        }
        self.step_scores.push(score);
        if self.step_scores.len() < self.config.steps_per_sample {
            return None;
        }
        let sample = median(&self.step_scores).unwrap_or(0.0);
        self.step_scores.clear();
        self.settling = true;
        self.finish_sample(sample);
        Some(self.current)
    }

    fn finish_sample(&mut self, score: f64) {
        match self.phase.clone() {
            Phase::Warmup { left } => {
                ::log::info!("autotune: warming up ({} remaining)", left - 1);
                if left > 1 {
                    self.phase = Phase::Warmup { left: left - 1 };
                } else if self.dims.is_empty() {
                    self.start_categorical();
                } else {
                    self.phase = Phase::Joint;
                }
            }
            Phase::Joint => {
                self.record(score);
                self.xs.push(self.point());
                self.ys.push(score);
                match self.next_joint_point() {
                    Some(point) => self.set_point(&point),
                    None => {
                        let best = self.kept_joint_sample();
                        let point = self.xs[best].clone();
                        self.set_point(&point);
                        self.best = self.current;
                        self.best_score = self.ys[best];
                        ::log::info!(
                            "autotune: fusion threshold × cycle time converged after {} samples",
                            self.xs.len()
                        );
                        self.start_categorical();
                    }
                }
            }
            Phase::Categorical { next } => {
                self.record(score);
                match next {
                    None => self.best_score = score,
                    Some(_) if score > self.best_score * (1.0 + KEEP_MARGIN) => {
                        self.best = self.current;
                        self.best_score = score;
                    }
                    Some(_) => {}
                }
                let following = next.map_or(0, |i| i + 1);
                if following < self.switches.len() {
                    self.current = self.best;
                    self.switches[following].flip(&mut self.current);
                    self.phase = Phase::Categorical {
                        next: Some(following),
                    };
                } else {
                    self.finish();
                }
            }
            Phase::Done => {}
        }
    }

    fn record(&mut self, score: f64) {
        self.samples += 1;
        let p = self.current;
        ::log::info!(
            "autotune: [{}, {}, 0, {}, {:.3} ms, {:.3} mb] {score:.3}",
            u8::from(p.hierarchical_allreduce),
            u8::from(p.hierarchical_allgather),
            u8::from(p.cache_enabled),
            p.cycle_time.as_secs_f64() * 1e3,
            p.fusion_threshold as f64 / (1024.0 * 1024.0)
        );
        if let Some(log) = &mut self.log {
            log.record(&p, score);
        }
    }

    /// The next joint point to sample, or `None` once the search converged.
    fn next_joint_point(&mut self) -> Option<Vec<f64>> {
        let n = self.xs.len();
        let gp = GaussianProcess::fit(&self.xs, &self.ys, self.config.gaussian_process_noise);
        if let Some(gp) = &gp {
            self.incumbent =
                (0..n).max_by(|&a, &b| gp.mean_at(&self.xs[a]).total_cmp(&gp.mean_at(&self.xs[b])));
            let predicted = self.incumbent.map_or(0.0, |i| gp.mean_at(&self.xs[i]));
            let margin = EI_CONVERGED * self.best_predicted.abs();
            if !self.best_predicted.is_finite() || predicted > self.best_predicted + margin {
                self.best_predicted = predicted;
                self.unchanged = 0;
            } else {
                self.unchanged += 1;
            }
        }
        if n >= self.config.bayes_opt_max_samples {
            return None;
        }
        if n < self.initial.len() {
            return Some(self.initial[n].clone());
        }
        let gp = gp?;
        let proposal = propose(&gp, &self.xs, self.dims.len());
        let expected_gain = proposal.expected_improvement * gp.score_scale();
        // The model proposes at least two points of its own before it may call the search
        // converged.
        let converged = n >= self.initial.len() + 2
            && (expected_gain < EI_CONVERGED * self.best_predicted.abs()
                || self.unchanged >= PATIENCE);
        ::log::debug!(
            "autotune: sample {n}: expected gain {expected_gain:.3}, best predicted {:.3}, \
             unchanged for {} samples",
            self.best_predicted,
            self.unchanged
        );
        (!converged).then_some(proposal.point)
    }

    /// The sample kept from the joint search: the best predicted one, unless it is predicted
    /// less than [`KEEP_MARGIN`] better than the configured setting (sample 0).
    fn kept_joint_sample(&self) -> usize {
        let best = self.incumbent.unwrap_or(0);
        let Some(gp) = GaussianProcess::fit(&self.xs, &self.ys, self.config.gaussian_process_noise)
        else {
            return best;
        };
        let configured = gp.mean_at(&self.xs[0]);
        if gp.mean_at(&self.xs[best]) > configured + KEEP_MARGIN * configured.abs() {
            best
        } else {
            0
        }
    }

    fn point(&self) -> Vec<f64> {
        self.dims.iter().map(|d| d.unit(&self.current)).collect()
    }

    fn set_point(&mut self, point: &[f64]) {
        for (dim, &unit) in self.dims.iter().zip(point) {
            dim.set(&mut self.current, unit);
        }
    }

    /// Moves on to the switches, from the joint search's kept setting (or, without a joint
    /// search, the configured one).
    fn start_categorical(&mut self) {
        if self.xs.is_empty() {
            self.best = self.current;
        }
        self.current = self.best;
        if self.switches.is_empty() {
            self.finish();
        } else {
            self.phase = Phase::Categorical { next: None };
        }
    }

    fn finish(&mut self) {
        self.current = TunedParams {
            active: false,
            ..self.best
        };
        self.phase = Phase::Done;
        let p = self.current;
        ::log::info!(
            "autotune: best params [{}, {}, 0, {}, {:.3} ms, {:.3} mb] {:.3} after {} samples",
            u8::from(p.hierarchical_allreduce),
            u8::from(p.hierarchical_allgather),
            u8::from(p.cache_enabled),
            p.cycle_time.as_secs_f64() * 1e3,
            p.fusion_threshold as f64 / (1024.0 * 1024.0),
            self.best_score,
            self.samples
        );
        if let Some(log) = &mut self.log {
            log.record(&p, self.best_score);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start() -> TunedParams {
        TunedParams {
            fusion_threshold: 128 << 20,
            cycle_time: Duration::from_millis(1),
            cache_enabled: true,
            hierarchical_allreduce: true,
            hierarchical_allgather: true,
            active: false,
        }
    }

    fn config(max: usize, noise: f64) -> AutotuneConfig {
        AutotuneConfig {
            enabled: true,
            warmup_samples: 1,
            steps_per_sample: 3,
            bayes_opt_max_samples: max,
            gaussian_process_noise: noise,
            ..AutotuneConfig::default()
        }
    }

    /// A deterministic pseudo-random sequence in [-1, 1].
    fn noise(seed: &mut u64) -> f64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        (*seed % 20001) as f64 / 10000.0 - 1.0
    }

    /// Runs the tuner against `score(params)` (plus noise) until it is done; returns the
    /// final setting, the steps it took and the scored samples.
    fn drive(
        tuner: &mut Tuner,
        score: impl Fn(&TunedParams) -> f64,
        noise_level: f64,
    ) -> (TunedParams, usize, usize) {
        let mut seed = 0x9e37_79b9_7f4a_7c15;
        let mut steps = 0;
        while !tuner.done() {
            steps += 1;
            assert!(steps < 100_000, "the tuner never finished");
            let p = tuner.current();
            let s = score(&p) * (1.0 + noise_level * noise(&mut seed));
            tuner.observe_step(s);
        }
        (tuner.current(), steps, tuner.samples())
    }

    /// A smooth synthetic score with its optimum at 40 MiB and 20 ms.
    fn bowl(p: &TunedParams) -> f64 {
        let f = p.fusion_threshold as f64 / (1024.0 * 1024.0);
        let c = p.cycle_time.as_secs_f64() * 1e3;
        1000.0 - ((f - 40.0) / 128.0).powi(2) * 2000.0 - ((c - 20.0) / 100.0).powi(2) * 2000.0
    }

    #[test]
    fn finds_the_optimum_of_a_noisy_function_within_the_budget() {
        let mut tuner = Tuner::new(
            config(20, 0.8),
            start(),
            vec![Dim::Fusion, Dim::Cycle],
            Vec::new(),
            None,
        );
        let (best, steps, samples) = drive(&mut tuner, bowl, 0.05);
        let optimum = 1000.0;
        assert!(
            bowl(&best) >= 0.95 * optimum,
            "best {best:?} scores {} (optimum {optimum})",
            bowl(&best)
        );
        assert!(!best.active);
        assert!(samples <= 20, "{samples} samples");
        // Warm-up (1 sample) plus every sample's settling step and scored steps.
        assert!(
            steps <= (1 + samples) * 4 + 1,
            "{steps} steps for {samples}"
        );
    }

    #[test]
    fn stops_before_the_cap_once_converged() {
        // A flat score: nothing to improve, the search ends early.
        let mut tuner = Tuner::new(
            config(50, 0.8),
            start(),
            vec![Dim::Fusion, Dim::Cycle],
            Vec::new(),
            None,
        );
        let (_, _, samples) = drive(&mut tuner, |_| 500.0, 0.01);
        assert!(samples < 50 && samples > TEST_POINTS.len(), "{samples}");
    }

    #[test]
    fn keeps_a_switch_only_when_it_scores_better() {
        // Cache off is better, hierarchical allreduce off is worse.
        let score = |p: &TunedParams| {
            100.0 + if p.cache_enabled { 0.0 } else { 50.0 }
                - if p.hierarchical_allreduce { 0.0 } else { 30.0 }
        };
        let mut tuner = Tuner::new(
            config(20, 0.8),
            start(),
            Vec::new(),
            vec![Switch::HierarchicalAllreduce, Switch::Cache],
            None,
        );
        let (best, _, samples) = drive(&mut tuner, score, 0.0);
        assert!(
            !best.cache_enabled && best.hierarchical_allreduce,
            "{best:?}"
        );
        // Baseline plus one sample per switch.
        assert_eq!(samples, 3);
        // Fixed dimensions keep the configured values.
        assert_eq!(best.fusion_threshold, 128 << 20);
        assert_eq!(best.cycle_time, Duration::from_millis(1));
    }

    #[test]
    fn a_change_within_the_noise_margin_is_not_kept() {
        // Cache off scores 1 % better: within the margin, the configured setting stays.
        let score = |p: &TunedParams| if p.cache_enabled { 100.0 } else { 101.0 };
        let mut tuner = Tuner::new(
            config(20, 0.8),
            start(),
            Vec::new(),
            vec![Switch::Cache],
            None,
        );
        let (best, _, _) = drive(&mut tuner, score, 0.0);
        assert!(best.cache_enabled, "{best:?}");
        // A flat joint search keeps the configured fusion threshold and cycle time.
        let mut tuner = Tuner::new(
            config(20, 0.8),
            start(),
            vec![Dim::Fusion, Dim::Cycle],
            Vec::new(),
            None,
        );
        let (best, _, _) = drive(&mut tuner, |_| 100.0, 0.01);
        assert_eq!(
            (best.fusion_threshold, best.cycle_time),
            (start().fusion_threshold, start().cycle_time)
        );
    }

    #[test]
    fn a_fixed_knob_is_never_changed() {
        let mut tuner = Tuner::new(config(8, 0.8), start(), vec![Dim::Fusion], Vec::new(), None);
        let mut seen = Vec::new();
        while !tuner.done() {
            seen.push(tuner.current());
            tuner.observe_step(1.0);
        }
        assert!(seen
            .iter()
            .all(|p| p.cycle_time == Duration::from_millis(1)));
        assert!(seen.iter().any(|p| p.fusion_threshold != 128 << 20));
    }

    #[test]
    fn logs_every_sample_and_the_best_in_horovods_csv() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("autotune.csv");
        let log = CsvLog::create(&path).unwrap();
        let mut tuner = Tuner::new(
            config(6, 0.8),
            start(),
            vec![Dim::Fusion, Dim::Cycle],
            vec![Switch::Cache],
            Some(log),
        );
        let (best, _, samples) = drive(&mut tuner, bowl, 0.0);
        drop(tuner);
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], super::super::log::HEADER);
        // The header, one line per scored sample, the best line.
        assert_eq!(lines.len(), 1 + samples + 1, "{text}");
        assert_eq!(
            *lines.last().unwrap(),
            super::super::log::line(&best, bowl(&best))
        );
        // The first scored sample is the configured setting.
        assert!(lines[1].starts_with("1,1,0,1,1,128,"), "{}", lines[1]);
    }
}
