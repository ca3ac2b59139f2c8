//! The engine's knobs, read from the environment. Every `KOLO_*` name also accepts Horovod's
//! `HOROVOD_*` spelling (the `KOLO_*` one wins when both are set).

use std::path::PathBuf;
use std::time::Duration;

use super::autotune::settings::AutotuneConfig;
use super::deferral::{BackgroundCycles, BACKGROUND_CYCLES};
use super::negotiation::Negotiation;
use crate::control::env::parse_seconds;
use crate::error::{Error, Result};

/// How the engine runs.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// The longest time between the starts of two cycles (`KOLO_CYCLE_TIME`, milliseconds,
    /// default 1): the most a submitted op waits before negotiation starts.
    pub cycle_time: Duration,
    /// How long submissions must pause before a cycle starts early for them
    /// (`KOLO_SUBMIT_QUIET_TIME`, milliseconds, default 0.1; kolo's own knob). A lone op starts
    /// negotiating after this instead of waiting for the cycle time; a burst of ops submitted
    /// closer together than this still goes into one cycle (and fuses).
    pub submit_quiet_time: Duration,
    /// Largest fused allreduce buffer in bytes (`KOLO_FUSION_THRESHOLD`, default 128 MiB; 0
    /// turns fusion off).
    pub fusion_threshold: usize,
    /// Entries of the response cache (`KOLO_CACHE_CAPACITY`, default 1024; 0 turns it off).
    pub cache_capacity: usize,
    /// After how long rank 0 warns about tensors some ranks have not submitted
    /// (`KOLO_STALL_CHECK_TIME_SECONDS`, default 60); `None` with
    /// `KOLO_STALL_CHECK_DISABLE=1`.
    pub stall_warning: Option<Duration>,
    /// After how long stalled tensors fail on every rank (`KOLO_STALL_SHUTDOWN_TIME_SECONDS`;
    /// default off).
    pub stall_shutdown: Option<Duration>,
    /// Chrome-trace file written by rank 0 (`KOLO_TIMELINE`).
    pub timeline: Option<PathBuf>,
    /// Mark every cycle in the timeline (`KOLO_TIMELINE_MARK_CYCLES=1`).
    pub timeline_mark_cycles: bool,
    /// Allow adding and removing process sets after `init` (`KOLO_DYNAMIC_PROCESS_SETS=1`).
    pub dynamic_process_sets: bool,
    /// Cores to pin the background thread to, one per local rank
    /// (`KOLO_THREAD_AFFINITY`/`HOROVOD_THREAD_AFFINITY`, e.g. `2,3`; see [`super::affinity`]).
    pub thread_affinity: Option<String>,
    /// Horovod's autotune (`KOLO_AUTOTUNE*` / `HOROVOD_AUTOTUNE*`; see [`super::autotune`]).
    pub autotune: AutotuneConfig,
    /// The knobs set explicitly, which the autotuner leaves alone (as Horovod does).
    pub fixed: FixedKnobs,
    /// How the members of a process set share their cycle messages (`KOLO_NEGOTIATION`:
    /// `auto`, the default, `all_to_all` or `tree`; kolo's own knob; see
    /// [`super::negotiation`]).
    pub negotiation: Negotiation,
    /// Whether the engine thread holds back cycles for this rank's ops while the rank computes
    /// (`KOLO_BACKGROUND_CYCLES`: `auto`, the default, `eager` or `lazy`; kolo's own knob; see
    /// [`super::deferral`]).
    pub background_cycles: BackgroundCycles,
}

/// Which tunable knobs the environment set explicitly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FixedKnobs {
    /// `*_FUSION_THRESHOLD` was set.
    pub fusion_threshold: bool,
    /// `*_CYCLE_TIME` was set.
    pub cycle_time: bool,
    /// `*_CACHE_CAPACITY` was set.
    pub cache: bool,
    /// `*_HIERARCHICAL_ALLREDUCE` was set.
    pub hierarchical_allreduce: bool,
    /// `*_HIERARCHICAL_ALLGATHER` was set.
    pub hierarchical_allgather: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            cycle_time: Duration::from_millis(1),
            submit_quiet_time: Duration::from_micros(100),
            fusion_threshold: 128 << 20,
            cache_capacity: 1024,
            stall_warning: Some(Duration::from_secs(60)),
            stall_shutdown: None,
            timeline: None,
            timeline_mark_cycles: false,
            dynamic_process_sets: false,
            thread_affinity: None,
            autotune: AutotuneConfig::default(),
            fixed: FixedKnobs::default(),
            negotiation: Negotiation::Auto,
            background_cycles: BackgroundCycles::Auto,
        }
    }
}

/// kolo's own knob (Horovod has no such setting, so there is no `HOROVOD_*` spelling).
const SUBMIT_QUIET_TIME: &str = "KOLO_SUBMIT_QUIET_TIME";
/// kolo's own knob (Horovod has none): how cycle messages travel.
const NEGOTIATION: &str = "KOLO_NEGOTIATION";

/// The largest cache we accept (its bit vector travels every cycle).
const MAX_CACHE_CAPACITY: usize = 1 << 20;

impl EngineConfig {
    /// Reads the knobs from this process's environment.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the knobs through `get` (an environment lookup).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let knob = |suffix: &str| -> Option<(String, String)> {
            ["KOLO_", "HOROVOD_"].iter().find_map(|prefix| {
                let name = format!("{prefix}{suffix}");
                get(&name)
                    .filter(|v| !v.trim().is_empty())
                    .map(|v| (name, v))
            })
        };
        let mut config = EngineConfig::default();
        if let Some((name, text)) = knob("CYCLE_TIME") {
            let ms = parse_number(&name, &text, "a number of milliseconds (e.g. 1 or 0.5)")?;
            if !(ms > 0.0 && ms <= 60_000.0) {
                return Err(Error::Config(format!(
                    "{name}={text:?} must be more than 0 and at most 60000 milliseconds"
                )));
            }
            config.cycle_time = Duration::from_secs_f64(ms / 1000.0);
        }
        if let Some(text) = get(SUBMIT_QUIET_TIME).filter(|v| !v.trim().is_empty()) {
            let ms = parse_number(
                SUBMIT_QUIET_TIME,
                &text,
                "a number of milliseconds (e.g. 0.1)",
            )?;
            if !(0.0..=60_000.0).contains(&ms) {
                return Err(Error::Config(format!(
                    "{SUBMIT_QUIET_TIME}={text:?} must be between 0 and 60000 milliseconds"
                )));
            }
            config.submit_quiet_time = Duration::from_secs_f64(ms / 1000.0);
        }
        if let Some((name, text)) = knob("FUSION_THRESHOLD") {
            config.fusion_threshold = parse_count(&name, &text, "a number of bytes", usize::MAX)?;
        }
        if let Some((name, text)) = knob("CACHE_CAPACITY") {
            config.cache_capacity =
                parse_count(&name, &text, "a number of entries", MAX_CACHE_CAPACITY)?;
        }
        if let Some((name, text)) = knob("STALL_CHECK_TIME_SECONDS") {
            config.stall_warning = Some(parse_seconds(&name, &text)?);
        }
        if let Some((name, text)) = knob("STALL_CHECK_DISABLE") {
            if parse_flag(&name, &text)? {
                config.stall_warning = None;
            }
        }
        if let Some((name, text)) = knob("STALL_SHUTDOWN_TIME_SECONDS") {
            let zero = text.trim().parse::<f64>().is_ok_and(|v| v == 0.0);
            config.stall_shutdown = if zero {
                None
            } else {
                Some(parse_seconds(&name, &text)?)
            };
        }
        if let Some((_, path)) = knob("TIMELINE") {
            config.timeline = Some(PathBuf::from(path));
        }
        if let Some((name, text)) = knob("TIMELINE_MARK_CYCLES") {
            config.timeline_mark_cycles = parse_flag(&name, &text)?;
        }
        if let Some((name, text)) = knob("DYNAMIC_PROCESS_SETS") {
            config.dynamic_process_sets = parse_flag(&name, &text)?;
        }
        if let Some(text) = get(NEGOTIATION).filter(|v| !v.trim().is_empty()) {
            config.negotiation = Negotiation::parse(&text).ok_or_else(|| {
                Error::Config(format!(
                    "{NEGOTIATION}={text:?} is not a negotiation protocol: use auto (the default), all_to_all \
                     (every member messages every other each cycle) or tree"
                ))
            })?;
        }
        if let Some(text) = get(BACKGROUND_CYCLES).filter(|v| !v.trim().is_empty()) {
            config.background_cycles = BackgroundCycles::parse(&text)?;
        }
        config.thread_affinity = knob("THREAD_AFFINITY").map(|(_, text)| text);
        config.autotune = AutotuneConfig::from_knobs(knob)?;
        config.fixed = FixedKnobs {
            fusion_threshold: knob("FUSION_THRESHOLD").is_some(),
            cycle_time: knob("CYCLE_TIME").is_some(),
            cache: knob("CACHE_CAPACITY").is_some(),
            hierarchical_allreduce: knob("HIERARCHICAL_ALLREDUCE").is_some(),
            hierarchical_allgather: knob("HIERARCHICAL_ALLGATHER").is_some(),
        };
        Ok(config)
    }
}

fn parse_number(name: &str, text: &str, what: &str) -> Result<f64> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
        .ok_or_else(|| Error::Config(format!("{name}={text:?} is not {what}")))
}

fn parse_count(name: &str, text: &str, what: &str, max: usize) -> Result<usize> {
    let value = text.trim().parse::<usize>().map_err(|_| {
        Error::Config(format!(
            "{name}={text:?} is not {what} (a whole number, 0 or more)"
        ))
    })?;
    if value > max {
        return Err(Error::Config(format!(
            "{name}={text:?} is too large; at most {max} is supported"
        )));
    }
    Ok(value)
}

fn parse_flag(name: &str, text: &str) -> Result<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(Error::Config(format!(
            "{name}={text:?} is not a flag; use 1 or 0"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> Result<EngineConfig> {
        EngineConfig::from_lookup(|name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn defaults_match_horovod() {
        let c = config(&[]).unwrap();
        assert_eq!(c, EngineConfig::default());
        assert_eq!(c.fusion_threshold, 128 << 20);
        assert_eq!(c.cycle_time, Duration::from_millis(1));
        assert_eq!(c.submit_quiet_time, Duration::from_micros(100));
        assert_eq!(c.cache_capacity, 1024);
        assert_eq!(c.stall_warning, Some(Duration::from_secs(60)));
    }

    #[test]
    fn kolo_names_win_over_horovod_names() {
        let c = config(&[
            ("HOROVOD_FUSION_THRESHOLD", "100"),
            ("KOLO_FUSION_THRESHOLD", "0"),
            ("HOROVOD_CYCLE_TIME", "2.5"),
            ("HOROVOD_CACHE_CAPACITY", "0"),
            ("HOROVOD_STALL_CHECK_DISABLE", "1"),
            ("KOLO_STALL_SHUTDOWN_TIME_SECONDS", "3"),
            ("HOROVOD_TIMELINE", "/tmp/t.json"),
            ("KOLO_TIMELINE_MARK_CYCLES", "true"),
            ("HOROVOD_DYNAMIC_PROCESS_SETS", "1"),
        ])
        .unwrap();
        assert_eq!(c.fusion_threshold, 0);
        assert_eq!(c.cycle_time, Duration::from_micros(2500));
        assert_eq!(c.cache_capacity, 0);
        assert_eq!(c.stall_warning, None);
        assert_eq!(c.stall_shutdown, Some(Duration::from_secs(3)));
        assert_eq!(c.timeline, Some(PathBuf::from("/tmp/t.json")));
        assert!(c.timeline_mark_cycles && c.dynamic_process_sets);
        assert_eq!(
            c.fixed,
            FixedKnobs {
                fusion_threshold: true,
                cycle_time: true,
                cache: true,
                ..FixedKnobs::default()
            }
        );
    }

    #[test]
    fn reads_the_autotune_settings() {
        let c = config(&[
            ("HOROVOD_AUTOTUNE", "1"),
            ("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "5"),
            ("HOROVOD_HIERARCHICAL_ALLGATHER", "0"),
        ])
        .unwrap();
        assert!(c.autotune.enabled);
        assert_eq!(c.autotune.steps_per_sample, 5);
        assert!(c.fixed.hierarchical_allgather && !c.fixed.fusion_threshold);
        match config(&[("KOLO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "many")]) {
            Err(Error::Config(m)) => assert!(m.contains("KOLO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn background_cycles_is_kolo_only_and_refuses_unknown_modes() {
        assert_eq!(
            config(&[]).unwrap().background_cycles,
            BackgroundCycles::Auto
        );
        let c = config(&[("KOLO_BACKGROUND_CYCLES", "eager")]).unwrap();
        assert_eq!(c.background_cycles, BackgroundCycles::Eager);
        let c = config(&[("HOROVOD_BACKGROUND_CYCLES", "lazy")]).unwrap();
        assert_eq!(c.background_cycles, BackgroundCycles::Auto);
        match config(&[("KOLO_BACKGROUND_CYCLES", "always")]) {
            Err(Error::Config(m)) => assert!(m.contains("KOLO_BACKGROUND_CYCLES"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn submit_quiet_time_is_kolo_only_and_may_be_zero() {
        let c = config(&[("KOLO_SUBMIT_QUIET_TIME", "0.25")]).unwrap();
        assert_eq!(c.submit_quiet_time, Duration::from_micros(250));
        let c = config(&[("KOLO_SUBMIT_QUIET_TIME", "0")]).unwrap();
        assert_eq!(c.submit_quiet_time, Duration::ZERO);
        let c = config(&[("HOROVOD_SUBMIT_QUIET_TIME", "5")]).unwrap();
        assert_eq!(c.submit_quiet_time, Duration::from_micros(100));
    }

    #[test]
    fn negotiation_is_read_and_defaults_to_auto() {
        assert_eq!(config(&[]).unwrap().negotiation, Negotiation::Auto);
        assert_eq!(
            config(&[("KOLO_NEGOTIATION", "tree")]).unwrap().negotiation,
            Negotiation::Tree
        );
        assert_eq!(
            config(&[("KOLO_NEGOTIATION", "all_to_all")])
                .unwrap()
                .negotiation,
            Negotiation::AllToAll
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (name, value) in [
            ("KOLO_CYCLE_TIME", "fast"),
            ("KOLO_CYCLE_TIME", "0"),
            ("KOLO_FUSION_THRESHOLD", "-1"),
            ("HOROVOD_CACHE_CAPACITY", "many"),
            ("KOLO_STALL_CHECK_DISABLE", "maybe"),
            ("KOLO_STALL_CHECK_TIME_SECONDS", "-5"),
            ("KOLO_SUBMIT_QUIET_TIME", "-1"),
            ("KOLO_SUBMIT_QUIET_TIME", "soon"),
            ("KOLO_NEGOTIATION", "ring"),
        ] {
            match config(&[(name, value)]) {
                Err(Error::Config(m)) => assert!(m.contains(name), "{m}"),
                other => panic!("{name}={value}: {other:?}"),
            }
        }
    }
}
