//! Holding back the engine thread's cycles while its rank computes, on a host without a spare
//! core for it.
//!
//! A cycle the engine thread starts for ops this rank submitted (a backward pass's gradients)
//! overlaps communication with the computation still running, which pays when the thread has
//! a core of its own. On a host with fewer than two cores per local rank it has none: each such
//! cycle takes the core from a computing rank (its own or, with the other rank woken to join,
//! another's), and the step gains nothing, since the data must move anyway and the caller that
//! waits for it runs the cycle itself (`Engine::wait`). So there the thread defers such a start
//! while the process keeps at least half a core busy (its own thread excepted), looking first
//! [`FIRST_LOOK`] after the ops' quiet time and then every [`RECHECK`], for at most
//! [`MAX_DEFERRAL`] after the oldest op was submitted; it starts at once when the process goes
//! idle (a caller blocked on something other than the engine), and when a caller polls a
//! handle of an op not yet in a cycle.

use std::time::{Duration, Instant};

use super::cpu_clock;
use crate::error::{Error, Result};

/// How long after the ops' quiet time a start first looks whether the process computes.
pub const FIRST_LOOK: Duration = Duration::from_millis(5);
/// How often a deferred start looks again whether the process still computes. Every look is a
/// wake-up that takes a core from the computation: at 5 ms, 2-rank training on 2 cores gained
/// less than at 25 ms.
pub const RECHECK: Duration = Duration::from_millis(25);
/// The longest a start is deferred after the oldest op it would run was submitted: what a rank
/// that waits for this rank's op (rather than computing) can lose at most.
pub const MAX_DEFERRAL: Duration = Duration::from_millis(100);

/// kolo's own knob (Horovod's background thread always cycles): `auto`, `eager` or `lazy`.
pub const BACKGROUND_CYCLES: &str = "KOLO_BACKGROUND_CYCLES";

/// Whether the engine thread defers starts for this rank's own ops while the rank computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackgroundCycles {
    /// Lazy on a host with fewer than two usable cores per local rank, else eager.
    #[default]
    Auto,
    /// Start at the submit quiet time or the cycle time, as Horovod does.
    Eager,
    /// Defer while the process computes.
    Lazy,
}

impl BackgroundCycles {
    /// Parses `KOLO_BACKGROUND_CYCLES`.
    pub fn parse(text: &str) -> Result<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "eager" => Ok(Self::Eager),
            "lazy" => Ok(Self::Lazy),
            _ => Err(Error::Config(format!(
                "{BACKGROUND_CYCLES}={text:?} is not a mode: use auto (the default: lazy when the \
                 host has fewer than two cores per local rank), eager or lazy"
            ))),
        }
    }

    /// Whether to defer, on a host where this process may use `cores` cores and runs
    /// `local_ranks` ranks.
    pub fn lazy(self, cores: usize, local_ranks: usize) -> bool {
        match self {
            Self::Auto => crate::transport::shm::no_spare_core(cores, local_ranks),
            Self::Eager => false,
            Self::Lazy => true,
        }
    }
}

/// Tells whether the rest of the process computes: its CPU time, less the calling thread's,
/// against the wall time between two looks.
#[derive(Debug, Default)]
pub struct BusyProbe {
    last: Option<(Instant, Duration)>,
}

impl BusyProbe {
    /// How long to defer a start, looking now: [`FIRST_LOOK`] at the first look (which only
    /// samples, so that the next one judges the time since the ops were submitted, not the
    /// idle time before), [`RECHECK`] while the process's other threads used at least half a
    /// core since the previous look, none once they did not.
    pub fn defer_for(&mut self) -> Option<Duration> {
        let now = (Instant::now(), other_threads_cpu());
        let defer = match self.last {
            None => Some(FIRST_LOOK),
            Some(before) => half_a_core(before, now).then_some(RECHECK),
        };
        self.last = Some(now);
        defer
    }
}

/// Whether CPU time grew by at least half the wall time between two (wall, CPU) samples.
fn half_a_core(before: (Instant, Duration), now: (Instant, Duration)) -> bool {
    let wall = now.0.saturating_duration_since(before.0);
    !wall.is_zero() && now.1.saturating_sub(before.1) * 2 >= wall
}

/// The CPU time of this process's threads but the calling one.
fn other_threads_cpu() -> Duration {
    cpu_clock::process().saturating_sub(cpu_clock::thread())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_is_lazy_only_without_a_spare_core_per_rank() {
        assert!(BackgroundCycles::Auto.lazy(2, 2));
        assert!(BackgroundCycles::Auto.lazy(3, 2));
        assert!(!BackgroundCycles::Auto.lazy(4, 2));
        assert!(!BackgroundCycles::Eager.lazy(1, 8));
        assert!(BackgroundCycles::Lazy.lazy(64, 1));
        assert_eq!(
            BackgroundCycles::parse(" Lazy ").unwrap(),
            BackgroundCycles::Lazy
        );
        let err = BackgroundCycles::parse("sometimes")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("KOLO_BACKGROUND_CYCLES") && err.contains("eager"),
            "{err}"
        );
    }

    #[test]
    fn half_a_core_of_other_threads_counts_as_computing() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let at = |wall: u64, cpu: u64| (t0 + ms(wall), ms(cpu));
        assert!(half_a_core(at(0, 0), at(10, 5)));
        assert!(half_a_core(at(0, 100), at(10, 120)), "two busy threads");
        assert!(!half_a_core(at(0, 0), at(10, 4)));
        assert!(!half_a_core(at(10, 0), at(10, 1)), "no wall time passed");
    }

    #[test]
    fn the_first_look_defers_without_judging() {
        let mut probe = BusyProbe::default();
        assert_eq!(probe.defer_for(), Some(FIRST_LOOK));
    }

    #[test]
    fn another_threads_cpu_time_is_counted_and_this_ones_is_not() {
        let before = other_threads_cpu();
        let mine = cpu_clock::thread();
        // This thread spins 30 ms of its own CPU, then another thread 50 ms of its own
        // (thread CPU clocks, so a loaded machine only makes it take longer).
        let spin = |cpu: Duration| {
            let start = cpu_clock::thread();
            while cpu_clock::thread() - start < cpu {
                std::hint::spin_loop();
            }
        };
        spin(Duration::from_millis(30));
        std::thread::spawn(move || spin(Duration::from_millis(50)))
            .join()
            .unwrap();
        assert!(cpu_clock::thread() - mine >= Duration::from_millis(30));
        let others = other_threads_cpu() - before;
        assert!(others >= Duration::from_millis(50), "{others:?}");
    }
}
