//! The autotuner's settings, read from `KOLO_AUTOTUNE*` or Horovod's `HOROVOD_AUTOTUNE*`
//! variables (what `kolorun --autotune ...` sets), with Horovod's defaults.

use std::path::PathBuf;

use crate::error::{Error, Result};

/// Horovod's `DEFAULT_WARMUPS`.
pub const DEFAULT_WARMUP_SAMPLES: usize = 3;
/// Horovod's `DEFAULT_STEPS_PER_SAMPLE`.
pub const DEFAULT_STEPS_PER_SAMPLE: usize = 10;
/// Horovod's `DEFAULT_BAYES_OPT_MAX_SAMPLES`.
pub const DEFAULT_BAYES_OPT_MAX_SAMPLES: usize = 20;
/// Horovod's `DEFAULT_GAUSSIAN_PROCESS_NOISE`.
pub const DEFAULT_GAUSSIAN_PROCESS_NOISE: f64 = 0.8;

/// The largest sample counts accepted (a run needs steps in proportion).
const MAX_COUNT: usize = 100_000;

/// How the autotuner runs.
#[derive(Debug, Clone, PartialEq)]
pub struct AutotuneConfig {
    /// Tune at all (`KOLO_AUTOTUNE` / `HOROVOD_AUTOTUNE`, default off).
    pub enabled: bool,
    /// CSV log of every scored trial, written by rank 0 (`*_AUTOTUNE_LOG`).
    pub log: Option<PathBuf>,
    /// Samples discarded before scoring starts (`*_AUTOTUNE_WARMUP_SAMPLES`, default 3).
    pub warmup_samples: usize,
    /// Steps scored per sample (`*_AUTOTUNE_STEPS_PER_SAMPLE`, default 10, at least 1).
    pub steps_per_sample: usize,
    /// The most Bayesian-optimisation samples (`*_AUTOTUNE_BAYES_OPT_MAX_SAMPLES`, default 20,
    /// at least 1). Unlike Horovod, the search usually stops earlier, once it converged.
    pub bayes_opt_max_samples: usize,
    /// Noise standard deviation of the Gaussian process, in units of the scores' standard
    /// deviation (`*_AUTOTUNE_GAUSSIAN_PROCESS_NOISE`, default 0.8, in `[0, 1]`).
    pub gaussian_process_noise: f64,
}

impl Default for AutotuneConfig {
    fn default() -> Self {
        AutotuneConfig {
            enabled: false,
            log: None,
            warmup_samples: DEFAULT_WARMUP_SAMPLES,
            steps_per_sample: DEFAULT_STEPS_PER_SAMPLE,
            bayes_opt_max_samples: DEFAULT_BAYES_OPT_MAX_SAMPLES,
            gaussian_process_noise: DEFAULT_GAUSSIAN_PROCESS_NOISE,
        }
    }
}

impl AutotuneConfig {
    /// Reads the settings through `knob`, which maps a suffix such as `AUTOTUNE_LOG` to the
    /// variable found (`KOLO_` first, then `HOROVOD_`) and its value.
    pub(crate) fn from_knobs(knob: impl Fn(&str) -> Option<(String, String)>) -> Result<Self> {
        let mut config = AutotuneConfig::default();
        if let Some((name, text)) = knob("AUTOTUNE") {
            config.enabled = match text.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => true,
                "0" | "false" | "no" | "off" => false,
                _ => {
                    return Err(Error::Config(format!(
                        "{name}={text:?} is not a flag; use 1 to autotune or 0 not to"
                    )))
                }
            };
        }
        if let Some((_, path)) = knob("AUTOTUNE_LOG") {
            config.log = Some(PathBuf::from(path));
        }
        let count = |suffix: &str, default: usize, min: usize, example: &str| -> Result<usize> {
            let Some((name, text)) = knob(suffix) else {
                return Ok(default);
            };
            match text.trim().parse::<usize>() {
                Ok(n) if (min..=MAX_COUNT).contains(&n) => Ok(n),
                _ => Err(Error::Config(format!(
                    "{name}={text:?} is not a count between {min} and {MAX_COUNT}: give a whole \
                     number, e.g. {example}"
                ))),
            }
        };
        config.warmup_samples = count("AUTOTUNE_WARMUP_SAMPLES", DEFAULT_WARMUP_SAMPLES, 0, "3")?;
        config.steps_per_sample = count(
            "AUTOTUNE_STEPS_PER_SAMPLE",
            DEFAULT_STEPS_PER_SAMPLE,
            1,
            "10",
        )?;
        config.bayes_opt_max_samples = count(
            "AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
            DEFAULT_BAYES_OPT_MAX_SAMPLES,
            1,
            "20",
        )?;
        if let Some((name, text)) = knob("AUTOTUNE_GAUSSIAN_PROCESS_NOISE") {
            config.gaussian_process_noise = text
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|v| (0.0..=1.0).contains(v))
                .ok_or_else(|| {
                    Error::Config(format!(
                        "{name}={text:?} is not a noise level: give a number in [0, 1], e.g. 0.8"
                    ))
                })?;
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<AutotuneConfig> {
        AutotuneConfig::from_knobs(|suffix| {
            ["KOLO_", "HOROVOD_"].iter().find_map(|prefix| {
                let name = format!("{prefix}{suffix}");
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (name.clone(), (*v).to_owned()))
            })
        })
    }

    #[test]
    fn defaults_are_horovods() {
        let c = parse(&[]).unwrap();
        assert_eq!(c, AutotuneConfig::default());
        assert!(!c.enabled && c.log.is_none());
        assert_eq!(
            (
                c.warmup_samples,
                c.steps_per_sample,
                c.bayes_opt_max_samples
            ),
            (3, 10, 20)
        );
        assert_eq!(c.gaussian_process_noise, 0.8);
    }

    #[test]
    fn reads_horovod_and_kolo_names() {
        let c = parse(&[
            ("HOROVOD_AUTOTUNE", "1"),
            ("HOROVOD_AUTOTUNE_LOG", "/tmp/a.csv"),
            ("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "0"),
            ("KOLO_AUTOTUNE_STEPS_PER_SAMPLE", "4"),
            ("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "7"),
            ("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "12"),
            ("KOLO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "0.25"),
        ])
        .unwrap();
        assert!(c.enabled);
        assert_eq!(c.log, Some(PathBuf::from("/tmp/a.csv")));
        assert_eq!(
            (
                c.warmup_samples,
                c.steps_per_sample,
                c.bayes_opt_max_samples
            ),
            (0, 4, 12)
        );
        assert_eq!(c.gaussian_process_noise, 0.25);
    }

    #[test]
    fn bad_values_are_config_errors_naming_the_variable() {
        for (name, value) in [
            ("HOROVOD_AUTOTUNE", "perhaps"),
            ("KOLO_AUTOTUNE_WARMUP_SAMPLES", "-1"),
            ("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "0"),
            ("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "ten"),
            ("KOLO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "0"),
            ("KOLO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "100000000"),
            ("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "1.5"),
            ("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "NaN"),
        ] {
            match parse(&[(name, value)]) {
                Err(Error::Config(m)) => assert!(m.contains(name), "{m}"),
                other => panic!("{name}={value}: {other:?}"),
            }
        }
    }
}
