//! What the engine holds for autotuning: on every rank the setting in force and the trials
//! applied so far ([`Tuning`]); on global rank 0 the tuner that decides them ([`Coordinating`]).

use std::sync::Mutex;
use std::time::Instant;

use super::log::CsvLog;
use super::steps::StepClock;
use super::tuner::{Dim, Switch, Tuner};
use super::{AppliedTrial, TunedParams};
use crate::collectives::hier;
use crate::engine::config::EngineConfig;
use crate::error::Result;
use crate::wire::OpKind;

/// The most applied trials remembered (a search needs far fewer; a coordinator sending more
/// cannot grow the record without bound).
const MAX_RECORDED: usize = 4096;

/// The setting in force on this rank and the trials applied.
#[derive(Debug)]
pub(crate) struct Tuning {
    current: Mutex<TunedParams>,
    trials: Mutex<Vec<AppliedTrial>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Tuning {
    /// The configured setting, not yet tuned.
    pub(crate) fn new(config: &EngineConfig) -> Tuning {
        hier::set_tuned(None);
        Tuning {
            current: Mutex::new(configured(config)),
            trials: Mutex::new(Vec::new()),
        }
    }

    /// The setting in force.
    pub(crate) fn current(&self) -> TunedParams {
        *lock(&self.current)
    }

    /// Puts `trial` in force (at the same cycle on every rank).
    pub(crate) fn apply(&self, trial: AppliedTrial) {
        let p = trial.params;
        *lock(&self.current) = p;
        hier::set_tuned(Some((p.hierarchical_allreduce, p.hierarchical_allgather)));
        let mut trials = lock(&self.trials);
        if trials.len() < MAX_RECORDED {
            trials.push(trial);
        }
    }

    /// The trials applied so far, in order.
    pub(crate) fn trials(&self) -> Vec<AppliedTrial> {
        lock(&self.trials).clone()
    }
}

/// The setting the configuration gives.
pub(crate) fn configured(config: &EngineConfig) -> TunedParams {
    TunedParams {
        fusion_threshold: config.fusion_threshold,
        cycle_time: config.cycle_time,
        cache_enabled: config.cache_capacity > 0,
        hierarchical_allreduce: hier::from_env(OpKind::Allreduce),
        hierarchical_allgather: hier::from_env(OpKind::Allgather),
        active: false,
    }
}

/// Global rank 0's tuner: scores the steps it sees and hands out each next setting.
#[derive(Debug)]
pub(crate) struct Coordinating {
    tuner: Tuner,
    clock: StepClock,
    outgoing: Option<AppliedTrial>,
    trial: u32,
}

impl Coordinating {
    /// The tuner for `config` (autotune on) on a job whose layout is `hierarchical` or not:
    /// knobs the environment fixed, and switches that change nothing here, are not tuned.
    pub(crate) fn new(config: &EngineConfig, hierarchical: bool) -> Result<Coordinating> {
        let log = config
            .autotune
            .log
            .as_deref()
            .map(CsvLog::create)
            .transpose()?;
        let fixed = config.fixed;
        let mut dims = Vec::new();
        if !fixed.fusion_threshold {
            dims.push(Dim::Fusion);
        }
        if !fixed.cycle_time {
            dims.push(Dim::Cycle);
        }
        let mut switches = Vec::new();
        if hierarchical && !fixed.hierarchical_allreduce {
            switches.push(Switch::HierarchicalAllreduce);
        }
        if hierarchical && !fixed.hierarchical_allgather {
            switches.push(Switch::HierarchicalAllgather);
        }
        // A capacity of 0 set explicitly fixes the cache off; the default capacity is tuned.
        if !fixed.cache && config.cache_capacity > 0 {
            switches.push(Switch::Cache);
        }
        ::log::info!(
            "autotune: tunable params [hierarchical_allreduce,hierarchical_allgather,\
             torus_allreduce,cache_enabled,cycle_time_ms,tensor_fusion_threshold] score"
        );
        let tuner = Tuner::new(
            config.autotune.clone(),
            configured(config),
            dims,
            switches,
            log,
        );
        let mut coordinating = Coordinating {
            outgoing: None,
            trial: 0,
            clock: StepClock::default(),
            tuner,
        };
        let first = coordinating.tuner.current();
        coordinating.send(first);
        Ok(coordinating)
    }

    fn send(&mut self, params: TunedParams) {
        self.trial = self.trial.wrapping_add(1);
        self.outgoing = Some(AppliedTrial {
            trial: self.trial,
            params,
        });
    }

    /// The setting to send with the next cycle message, once.
    pub(crate) fn take_outgoing(&mut self) -> Option<AppliedTrial> {
        self.outgoing.take()
    }

    /// Whether this cycle's agreed tensors are still wanted (the search is not over).
    pub(crate) fn searching(&self) -> bool {
        !self.tuner.done()
    }

    /// Feeds one cycle's agreed tensors of the global process set, seen at `now`.
    pub(crate) fn observe(&mut self, tensors: &[(String, u64)], now: Instant) {
        if !self.searching() {
            return;
        }
        let score = self
            .clock
            .observe(tensors.iter().map(|(n, b)| (n.as_str(), *b)), now);
        if let Some(next) = score.and_then(|s| self.tuner.observe_step(s)) {
            self.send(next);
        }
    }
}
