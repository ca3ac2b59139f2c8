//! Supervision of a running job: reap ranks, fail fast (abort through the driver, a grace
//! period, then SIGTERM, then SIGKILL), react to driver-side aborts and Ctrl-C, and decide
//! kolorun's exit code and summary.

use std::time::{Duration, Instant};

use crate::abort::AbortCause;
use crate::control::DriverService;
use crate::error::{Error, Result};
use crate::launcher::output::RankLabels;
use crate::launcher::process::{describe_exit, RankProcess};

/// How often the loop polls children, the driver and the interrupt callback.
const POLL: Duration = Duration::from_millis(100);
/// How long processes get to die after SIGKILL before kolorun gives up on them.
const AFTER_KILL: Duration = Duration::from_secs(5);

/// Timing of the stop sequence.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StopTiming {
    /// After a failure, how long surviving ranks get to exit by themselves.
    pub(crate) grace: Duration,
    /// After SIGTERM, how long before SIGKILL.
    pub(crate) term_to_kill: Duration,
}

/// How the job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Every rank exited with status 0.
    Success,
    /// A rank exited non-zero or by a signal.
    RankFailed {
        /// Its rank (task index before ranks were assigned).
        rank: u32,
        /// Its host entry.
        host: String,
        /// `exited with code 3`, `was killed by signal 9 (SIGKILL)`.
        description: String,
    },
    /// The driver aborted the job (failure report, lost heartbeat, start timeout).
    DriverAbort(AbortCause),
    /// The user pressed Ctrl-C.
    Interrupted,
}

/// The result of supervision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub(crate) ending: Ending,
    /// What kolorun returns.
    pub(crate) exit_code: i32,
    /// Ranks still running when the failure was noticed (the ones kolorun had to stop).
    pub(crate) stopped: usize,
}

impl Outcome {
    /// The one-line summary for stderr, `None` on success.
    pub(crate) fn summary(&self) -> Option<String> {
        match &self.ending {
            Ending::Success => None,
            Ending::RankFailed {
                rank,
                host,
                description,
            } => Some(format!(
                "kolorun: rank {rank} on host {host} {description}; stopped {} other rank(s)",
                self.stopped
            )),
            Ending::DriverAbort(cause) => Some(format!(
                "kolorun: {cause}; stopped {} rank(s)",
                self.stopped
            )),
            Ending::Interrupted => Some(format!(
                "kolorun: interrupted by the user; stopped {} rank(s)",
                self.stopped
            )),
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Stopping {
    /// Ranks may still exit by themselves until then.
    Grace(Instant),
    /// SIGTERM sent; SIGKILL at that time.
    Terminated(Instant),
    /// SIGKILL sent; give up waiting at that time.
    Killed(Instant),
}

/// Watches `ranks` until every one has exited, stopping the rest on the first failure. Once
/// the driver has assigned ranks, they must be `expected` (by task index: the ranks kolorun put
/// in the rank variables); otherwise the job is aborted.
pub(crate) fn supervise(
    ranks: &mut [RankProcess],
    driver: &DriverService,
    labels: &RankLabels,
    expected: &[u32],
    timing: StopTiming,
    interrupted: &dyn Fn() -> bool,
) -> Result<Outcome> {
    let mut ending: Option<Ending> = None;
    let mut first_bad_code: Option<i32> = None;
    let mut failed_code: Option<i32> = None;
    let mut stopped = 0usize;
    let mut stopping: Option<Stopping> = None;
    let mut labelled = false;
    loop {
        if !labelled {
            if let Some(assignment) = driver.assignment() {
                labels.set(assignment.iter().map(|peer| peer.rank).collect());
                labelled = true;
                if let Some(peer) = assignment
                    .iter()
                    .find(|peer| expected.get(peer.task_index as usize) != Some(&peer.rank))
                {
                    driver.abort(AbortCause {
                        rank: Some(peer.rank),
                        host: peer.hostname.clone(),
                        message: format!(
                            "the job driver assigned rank {} to task {}, but kolorun set \
                             HOROVOD_RANK={:?} for it (the host list names one machine under \
                             two entries?); list each host once",
                            peer.rank,
                            peer.task_index,
                            expected.get(peer.task_index as usize)
                        ),
                    });
                }
                log::debug!(
                    "kolorun: ranks assigned; task i is rank {:?}",
                    assignment.iter().map(|p| p.rank).collect::<Vec<_>>()
                );
            }
        }

        for index in 0..ranks.len() {
            let Some(status) = (if ranks[index].is_running() {
                ranks[index].poll()?
            } else {
                None
            }) else {
                continue;
            };
            let rank = &ranks[index];
            if status.success() {
                log::debug!(
                    "kolorun: task {} (pid {}) exited cleanly",
                    rank.task_index,
                    rank.pid()
                );
                driver.task_finished(rank.task_index);
                continue;
            }
            let (description, cause_text, code) = describe_exit(status, rank.remote);
            first_bad_code.get_or_insert(code);
            if ending.is_some() {
                log::debug!(
                    "kolorun: task {} {description} while the job was stopping",
                    rank.task_index
                );
                continue;
            }
            let label = labels.get(rank.task_index);
            driver.abort(AbortCause {
                rank: Some(label),
                host: rank.host.clone(),
                message: cause_text,
            });
            ending = Some(Ending::RankFailed {
                rank: label,
                host: rank.host.clone(),
                description,
            });
            failed_code = Some(code);
            stopped = ranks.iter().filter(|r| r.is_running()).count();
            stopping = Some(Stopping::Grace(Instant::now() + timing.grace));
        }

        if ending.is_none() {
            if let Some(cause) = driver.abort_cause() {
                stopped = ranks.iter().filter(|r| r.is_running()).count();
                ending = Some(Ending::DriverAbort(cause));
                stopping = Some(Stopping::Grace(Instant::now() + timing.grace));
            }
        }

        if ending != Some(Ending::Interrupted) && interrupted() {
            driver.abort(AbortCause {
                rank: None,
                host: String::new(),
                message: "interrupted by the user".into(),
            });
            if ending.is_none() {
                stopped = ranks.iter().filter(|r| r.is_running()).count();
            }
            ending = Some(Ending::Interrupted);
            stopping = Some(terminate(ranks, timing));
        }

        if ranks.iter().all(|r| !r.is_running()) {
            break;
        }

        let now = Instant::now();
        match stopping {
            Some(Stopping::Grace(until)) if now >= until => {
                stopping = Some(terminate(ranks, timing))
            }
            Some(Stopping::Terminated(until)) if now >= until => {
                log::warn!(
                    "kolorun: ranks still running {:?} after SIGTERM; sending SIGKILL",
                    timing.term_to_kill
                );
                for rank in ranks.iter_mut() {
                    rank.stop(libc::SIGKILL);
                }
                stopping = Some(Stopping::Killed(now + AFTER_KILL));
            }
            Some(Stopping::Killed(until)) if now >= until => {
                let stuck: Vec<u32> = ranks
                    .iter()
                    .filter(|r| r.is_running())
                    .map(|r| r.pid())
                    .collect();
                return Err(Error::Launch(format!(
                    "kolorun: processes {stuck:?} did not exit {AFTER_KILL:?} after SIGKILL"
                )));
            }
            _ => {}
        }
        std::thread::sleep(POLL);
    }

    let exit_code = match &ending {
        None | Some(Ending::Success) => 0,
        Some(Ending::RankFailed { .. }) => failed_code.unwrap_or(1),
        Some(Ending::DriverAbort(_)) => first_bad_code.unwrap_or(1),
        Some(Ending::Interrupted) => 130,
    };
    Ok(Outcome {
        ending: ending.unwrap_or(Ending::Success),
        exit_code,
        stopped,
    })
}

fn terminate(ranks: &mut [RankProcess], timing: StopTiming) -> Stopping {
    let running = ranks.iter().filter(|r| r.is_running()).count();
    if running > 0 {
        log::info!("kolorun: sending SIGTERM to {running} rank(s)");
    }
    for rank in ranks.iter_mut() {
        rank.stop(libc::SIGTERM);
    }
    Stopping::Terminated(Instant::now() + timing.term_to_kill)
}
