//! Noticing within about a second that a launcher's task runner (the Spark task that
//! supervises one rank process) died without reporting its rank's exit. The driver then
//! records that exit for the launcher: an elastic job removes the task, a fixed job is aborted
//! naming it, and a launcher stopping an aborted job does not wait for an exit that would
//! never come. A runner that hears of an abort keeps its watch open until it posted its rank's
//! exit, so only a runner that is gone ends its watch without one.
//!
//! When a Spark executor dies, its task runners die with it, and their rank processes with
//! them (parent-death signal), so nothing is left to post the rank's exit. Before, the driver
//! learnt of the loss only when Spark started the task's next attempt (seconds: Spark has to
//! notice the executor loss and start a Python worker elsewhere) or after the heartbeat
//! timeout. A runner therefore holds a watch stream to the driver for as long as it
//! supervises its rank process (`WatchAbort` with the runner rank [`RUNNER_RANK`] and its
//! task index), and posts the rank's exit *before* closing it. A process that dies has its
//! sockets closed by the kernel, so the driver sees the stream end at once.
//!
//! A stream can also end while the runner lives (a broken connection it re-opens after a
//! short pause), so the driver waits [`RUNNER_GRACE`] and declares the task lost only if by
//! then the runner has not opened a new watch, has not posted an exit, and the task's rank
//! has sent no heartbeat since the stream ended (a rank whose runner died is dead too).

use std::collections::HashMap;
use std::time::Duration;

/// The `rank` a task runner's `WatchAbort` carries (it is not a rank itself).
pub const RUNNER_RANK: u32 = u32::MAX;

/// How long after a runner's watch stream ended the driver waits before declaring its task
/// lost: longer than the runner's pause before it re-opens a broken watch (250 ms) plus a
/// reconnect, and one heartbeat interval (1 s) of a rank that is still alive.
pub const RUNNER_GRACE: Duration = Duration::from_millis(1200);

/// How the exit the driver records for a lost task's rank starts (launchers match on it).
pub const LOST_WITH_RUNNER: &str = "was lost with its task runner";

/// What the driver knows of one task's runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Runner {
    /// Bumped each time the runner opens a watch: a watch that ended only counts if no newer
    /// one was opened since.
    lease: u64,
    /// The runner posted its rank's exit (or the driver declared the task lost): its stream
    /// ending is expected.
    done: bool,
}

/// The runners of one job, by task index.
#[derive(Debug, Default)]
pub(crate) struct RunnerLeases {
    runners: HashMap<u32, Runner>,
    next_lease: u64,
}

impl RunnerLeases {
    /// The runner of `task_index` opened a watch; returns its lease.
    pub(crate) fn opened(&mut self, task_index: u32) -> u64 {
        self.next_lease += 1;
        let lease = self.next_lease;
        let runner = self
            .runners
            .entry(task_index)
            .or_insert(Runner { lease, done: false });
        runner.lease = lease;
        lease
    }

    /// The runner of `task_index` posted its rank's exit (possibly before its watch opened).
    pub(crate) fn exited(&mut self, task_index: u32) {
        self.runners
            .entry(task_index)
            .or_insert(Runner {
                lease: 0,
                done: true,
            })
            .done = true;
    }

    /// The watch with `lease` ended [`RUNNER_GRACE`] ago: true (once) when its task is lost,
    /// i.e. no newer watch was opened and no exit was posted; the task is then marked done.
    pub(crate) fn lost(&mut self, task_index: u32, lease: u64) -> bool {
        match self.runners.get_mut(&task_index) {
            Some(runner) if runner.lease == lease && !runner.done => {
                runner.done = true;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_that_ends_without_an_exit_loses_its_task_once() {
        let mut leases = RunnerLeases::default();
        let lease = leases.opened(3);
        assert!(leases.lost(3, lease));
        assert!(!leases.lost(3, lease), "a task is declared lost once");
    }

    #[test]
    fn an_exit_or_a_newer_watch_keeps_the_task() {
        let mut leases = RunnerLeases::default();
        let first = leases.opened(1);
        leases.exited(1);
        assert!(!leases.lost(1, first));
        let old = leases.opened(2);
        let _new = leases.opened(2);
        assert!(!leases.lost(2, old), "the runner re-opened its watch");
        assert!(!leases.lost(9, 1), "an unknown task is not lost");
        leases.exited(4);
        let late = leases.opened(4);
        assert!(
            !leases.lost(4, late),
            "the exit was posted before the watch opened"
        );
    }
}
