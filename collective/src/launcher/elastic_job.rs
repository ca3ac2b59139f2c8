//! An elastic kolorun launch (`--min-np`, `--host-discovery-script`), as horovodrun's
//! `launch_gloo_elastic` and `ElasticDriver`: the job driver runs in elastic mode, the hosts are
//! polled every second (the script, or the fixed `-H`/`--hostfile` hosts as Horovod's
//! `FixedHosts`; `localhost` with `-np` slots without either), and the loop here keeps the
//! ranks on the planned slots:
//!
//! - the first round waits (at most `--elastic-timeout`) for `-np` usable slots, then starts a
//!   rank on every usable slot up to `--max-np`;
//! - a rank process that exits non-zero or is killed leaves the job
//!   ([`DriverService::remove_task`]: the survivors' collectives fail, they restore their last
//!   commit and reset into a smaller round) instead of aborting it, and its host is blacklisted
//!   ([`Blacklist`]: Horovod's cooldown, or for good without `--blacklist-cooldown-range`);
//! - after every change (discovery, a failure, a host's cooldown ending) the [`plan`] says which
//!   slots run: new slots get new processes with task indices never used before
//!   ([`DriverService::add_tasks`]: the running ranks see "hosts added" at their next
//!   `commit()`), ranks on slots that are gone (host removed, blacklisted, `--max-np`) get
//!   SIGTERM then SIGKILL and leave the job;
//! - with fewer usable slots than `--min-np` the job waits at most `--elastic-timeout`, then
//!   fails naming both numbers; with no rank of the job left on a usable host it fails (nobody
//!   could send the state to new ranks);
//! - the first rank to exit with status 0 ends the job (Horovod: one `SUCCESS` at a round's
//!   barrier stops the driver): the others get the abort grace period to finish by themselves,
//!   then SIGTERM and SIGKILL; the job's exit code is 0 unless a rank exits non-zero *by itself*
//!   after that (Horovod counts every non-zero exit of the last round; kolo does not count the
//!   ranks it had to stop);
//! - every rank failing, the driver aborting (`--reset-limit` passed, too few ranks for
//!   `--elastic-timeout`), or Ctrl-C end it with a non-zero code.
//!
//! Every completed rendezvous is reported on stderr (`kolorun: rendezvous N: ...`), as are
//! failures, blacklisting, discovered host changes and the ranks started and stopped.
//!
//! What a rank sees: the job variables with its own `KOLO_TASK_INDEX` (`KOLO_NUM_TASKS` is the
//! number of task indices handed out so far, above every index), `KOLO_HOSTNAME=<host>`,
//! `KOLO_ELASTIC_TIMEOUT`, `HOROVOD_ELASTIC=1`, and the rank variables of the round it is
//! started for (as Horovod's `slot_info`; computed with the driver's rule from the previous
//! round's host order). After each `init()` the worker rewrites them from its registration (as
//! Horovod's Gloo context does after an elastic reset), so they never describe an older round.
//! Output lines carry the rank of the latest completed round the task is in (before that, the
//! rank it was started for); `--output-filename DIR` writes `DIR/task.T/{stdout,stderr}`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::blacklist::Blacklist;
use super::discovery::{
    DiscoveryEvent, DiscoveryScript, FixedHosts, HostDiscovery, HostPoller, ScriptLimits,
    POLL_INTERVAL,
};
use super::output::{open_task_files, RankLabels};
use super::planner::{plan, LiveTask, Plan, PlanRequest, SlotPlan};
use super::process::{describe_exit, RankProcess};
use super::{
    fixed_host_list, hosts, print_notices, redact, spawn_rank, stop_all, FunctionRun, HostSlots,
    HostSource, Job, LaunchArgs, Output, OUTPUT_DRAIN, TERM_TO_KILL,
};
use crate::abort::AbortCause;
use crate::control::assign::assign_ranks_in_host_order;
use crate::control::env::{format_seconds, ELASTIC_JOINING, ELASTIC_TIMEOUT};
use crate::control::launch::keys;
use crate::control::service::MAX_TASKS;
use crate::control::{
    Assignment, DriverConfig, DriverService, ElasticConfig, JobId, JobSecret, PeerAssignment,
    WorkerEnv,
};
use crate::error::{Error, Result};

/// How often the loop reaps processes and looks at the driver and discovery.
const TICK: Duration = Duration::from_millis(20);
/// How long processes get to die after SIGKILL before kolorun gives up on them.
const AFTER_KILL: Duration = Duration::from_secs(5);

/// Runs the elastic launch `args` (whose `elastic` is set); `payload` is `kolo.run`'s pickled
/// function. The results are those of the last completed round's ranks, by rank.
pub(super) fn run(
    args: LaunchArgs,
    interrupted: &dyn Fn() -> bool,
    output: &Output,
    payload: Option<Vec<u8>>,
) -> Result<FunctionRun> {
    let Some(elastic) = args.elastic.clone() else {
        return Err(Error::Internal(
            "a fixed-size launch reached the elastic loop".into(),
        ));
    };
    print_notices(&args, output);
    let timeout = elastic.elastic_timeout()?;
    let discovery = discovery_for(&args, elastic.num_proc, elastic.slots_per_host)?;
    let (poller, first_hosts, events) = HostPoller::start(discovery, POLL_INTERVAL)?;
    let blacklist = Blacklist::new(elastic.cooldown_range);
    let Some((hosts, first)) =
        wait_for_first_round(first_hosts, &events, &elastic, timeout, interrupted, output)?
    else {
        output.message("kolorun: interrupted by the user before any rank started");
        return Ok(FunctionRun {
            exit_code: 130,
            results: Vec::new(),
            failure: None,
        });
    };
    let host_names: Vec<String> = hosts.iter().map(|h| h.host.clone()).collect();
    let mut job = Job::settle(args, host_names, Vec::new(), true)?;
    job.extra_env = vec![
        (ELASTIC_TIMEOUT.to_owned(), format_seconds(timeout)),
        ("HOROVOD_ELASTIC".to_owned(), "1".to_owned()),
    ];
    let secret = JobSecret::generate();
    let job_id = JobId::generate();
    let size = first.size();
    let reset_limit = elastic
        .reset_limit
        .map(|limit| u32::try_from(limit).unwrap_or(u32::MAX));
    let driver = DriverService::start(DriverConfig {
        bind: std::net::SocketAddr::new(job.bind, 0),
        num_tasks: size,
        secret: secret.clone(),
        job_id,
        start_timeout: job.start_timeout,
        heartbeat_timeout: job.heartbeat_timeout,
        abort_if_nobody_registers: false,
        elastic: Some(ElasticConfig {
            min_np: elastic.min_num_proc,
            max_np: elastic.max_num_proc.unwrap_or(MAX_TASKS).max(size),
            elastic_timeout: timeout,
            reset_limit,
        }),
    })?;
    if let Some(payload) = payload {
        driver.kv_put(keys::PAYLOAD, payload)?;
    }
    let driver_addr = std::net::SocketAddr::new(job.advertise, driver.addr().port()).to_string();
    let (done, drained) = mpsc::channel();
    let mut launch = ElasticLaunch {
        min_num_proc: elastic.min_num_proc,
        max_num_proc: elastic.max_num_proc,
        timeout,
        job,
        output,
        driver,
        driver_addr,
        secret,
        job_id,
        cwd: std::env::current_dir()?,
        labels: RankLabels::new(0),
        done,
        forwarders: 0,
        tasks: Vec::new(),
        hosts,
        blacklist,
        next_task: 0,
        waiting_since: None,
        round: None,
        ending: None,
        late_failure: None,
        failures: 0,
    };
    launch.message(format!(
        "kolorun: elastic job: {size} rank(s) on {} (--min-np {}, --max-np {}, \
         --elastic-timeout {} s); driver on {}",
        describe_hosts(&launch.hosts),
        elastic.min_num_proc,
        elastic
            .max_num_proc
            .map_or_else(|| "every slot".to_owned(), |max| max.to_string()),
        format_seconds(timeout),
        launch.driver.addr()
    ));
    if let Err(err) = launch.start_tasks(&first, false) {
        stop_all(&mut launch.processes());
        launch.driver.shutdown();
        poller.stop();
        return Err(err);
    }
    let outcome = launch.supervise(&events, interrupted);
    poller.stop();
    if outcome.is_err() {
        stop_all(&mut launch.processes());
    }
    let deadline = Instant::now() + OUTPUT_DRAIN;
    for _ in 0..launch.forwarders {
        let left = deadline.saturating_duration_since(Instant::now());
        if drained.recv_timeout(left).is_err() {
            log::debug!(
                "kolorun: output of some rank is still open (a process it started holds it)"
            );
            break;
        }
    }
    let run = launch.finish();
    launch.driver.shutdown();
    outcome?;
    Ok(run)
}

/// Where the hosts come from: the discovery script, the fixed `-H`/`--hostfile` hosts, or
/// `localhost` with `num_proc` slots.
fn discovery_for(
    args: &LaunchArgs,
    num_proc: usize,
    slots_per_host: usize,
) -> Result<Box<dyn HostDiscovery>> {
    if let Some(HostSource::Discovery(script)) = &args.hosts {
        return Ok(Box::new(DiscoveryScript::new(
            script.clone(),
            slots_per_host,
            ScriptLimits::default(),
        )));
    }
    let hosts = match fixed_host_list(args)? {
        Some((hosts, _)) => hosts,
        None => vec![HostSlots {
            host: "localhost".into(),
            slots: num_proc,
        }],
    };
    Ok(Box::new(FixedHosts(hosts)))
}

/// Waits until `-np` slots are usable (Horovod's `wait_for_available_slots(num_proc)`) and
/// returns the hosts then and the first round (every usable slot up to `--max-np`); `None`
/// when interrupted. A `Timeout` error after `timeout`.
fn wait_for_first_round(
    mut hosts: Vec<HostSlots>,
    events: &mpsc::Receiver<DiscoveryEvent>,
    elastic: &super::ElasticArgs,
    timeout: Duration,
    interrupted: &dyn Fn() -> bool,
    output: &Output,
) -> Result<Option<(Vec<HostSlots>, SlotPlan)>> {
    let started = Instant::now();
    let mut said = false;
    loop {
        let request = PlanRequest {
            hosts: &hosts,
            live: &[],
            min_num_proc: elastic.num_proc,
            max_num_proc: elastic.max_num_proc,
            next_task_index: 0,
        };
        let available = match plan(&request)? {
            Plan::Ready(slots) => return Ok(Some((hosts, slots))),
            Plan::Wait { available, .. } => available,
            Plan::NoSurvivor { .. } => {
                return Err(Error::Internal(
                    "the elastic planner found lost tasks before any started".into(),
                ))
            }
        };
        if !said {
            output.message(&format!(
                "kolorun: waiting up to {} s (--elastic-timeout) for {} slot(s) (-np {}); {} \
                 available on {}",
                format_seconds(timeout),
                elastic.num_proc,
                elastic.num_proc,
                available,
                describe_hosts(&hosts)
            ));
            said = true;
        }
        if started.elapsed() >= timeout {
            return Err(Error::Timeout {
                what: format!(
                    "kolorun: {} slot(s) to start the elastic job (-np {}, --min-np {}): only \
                     {available} were available (--elastic-timeout {} s); add hosts, or lower -np \
                     and --min-np",
                    elastic.num_proc,
                    elastic.num_proc,
                    elastic.min_num_proc,
                    format_seconds(timeout)
                ),
                after: timeout,
            });
        }
        if interrupted() {
            return Ok(None);
        }
        match events.recv_timeout(Duration::from_millis(100)) {
            Ok(DiscoveryEvent::Updated { hosts: found, .. }) => hosts = found,
            Ok(DiscoveryEvent::Failed(err)) => output.message(&format!(
                "kolorun: host discovery failed (the previous hosts stand; retrying): {err}"
            )),
            Err(_) => {}
        }
    }
}

/// Why kolorun asked a rank to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopReason {
    /// Its slot is not in the next round (host removed or blacklisted, fewer slots, --max-np):
    /// not a failure.
    Unplanned,
    /// The job driver dropped it (lost heartbeats, a failure report): a failure of its host.
    Dropped,
    /// The job is ending.
    Ending,
}

/// One rank process of the job and what kolorun knows about it.
#[derive(Debug)]
struct TaskProcess {
    process: RankProcess,
    slot: LiveTask,
    /// Why and when kolorun sent SIGTERM, and whether SIGKILL followed (when).
    stopping: Option<(StopReason, Instant, Option<Instant>)>,
}

/// How the job ends.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ending {
    /// A rank exited with status 0.
    Succeeded,
    /// kolorun gave up: every rank failed, too few slots too long, nobody left to sync from.
    Failed { cause: AbortCause, code: i32 },
    /// The driver aborted the job (the reset limit, its elastic timeout, ...).
    DriverAbort(AbortCause),
    /// Ctrl-C.
    Interrupted,
}

/// The state of a running elastic launch.
struct ElasticLaunch<'a> {
    min_num_proc: usize,
    max_num_proc: Option<usize>,
    timeout: Duration,
    job: Job,
    output: &'a Output,
    driver: DriverService,
    driver_addr: String,
    secret: JobSecret,
    job_id: JobId,
    cwd: PathBuf,
    labels: RankLabels,
    done: mpsc::Sender<()>,
    forwarders: usize,
    /// Processes not reaped yet.
    tasks: Vec<TaskProcess>,
    /// The discovered hosts, oldest first.
    hosts: Vec<HostSlots>,
    blacklist: Blacklist,
    next_task: u32,
    /// Since when fewer than `--min-np` slots are usable.
    waiting_since: Option<Instant>,
    /// The latest completed round reported.
    round: Option<u32>,
    ending: Option<(Ending, Instant)>,
    /// A rank that exited non-zero by itself after another succeeded: `(code, cause)`.
    late_failure: Option<(i32, AbortCause)>,
    /// Rank failures so far.
    failures: usize,
}

impl ElasticLaunch<'_> {
    fn message(&self, text: String) {
        self.output.message(&text);
    }

    fn processes(&mut self) -> Vec<RankProcess> {
        self.tasks.drain(..).map(|t| t.process).collect()
    }

    /// The loop: until every process exited after the job's end.
    fn supervise(
        &mut self,
        events: &mpsc::Receiver<DiscoveryEvent>,
        interrupted: &dyn Fn() -> bool,
    ) -> Result<()> {
        loop {
            if self.ending.is_none() && interrupted() {
                self.driver.abort(AbortCause {
                    rank: None,
                    host: String::new(),
                    message: "interrupted by the user".into(),
                });
                self.end(Ending::Interrupted);
            }
            let mut replan = self.reap()?;
            if self.ending.is_none() {
                if let Some(cause) = self.driver.abort_cause() {
                    self.end(Ending::DriverAbort(cause));
                }
            }
            self.notice_round();
            if self.ending.is_none() {
                replan |= self.drop_lost_tasks();
                replan |= self.take_discovery(events);
                let back = self
                    .blacklist
                    .whitelist_resurrected(self.hosts.iter().map(|h| h.host.as_str()));
                if !back.is_empty() {
                    self.message(format!(
                        "kolorun: host(s) {back:?} may run ranks again: their blacklist cooldown \
                         ended"
                    ));
                    replan = true;
                }
                if replan || self.waiting_since.is_some() {
                    self.replan()?;
                }
            }
            self.escalate()?;
            if let Some((ending, since)) = &self.ending {
                let grace = match ending {
                    Ending::Interrupted => Duration::ZERO,
                    _ => self.job.grace,
                };
                if since.elapsed() >= grace {
                    let now = Instant::now();
                    for task in self.tasks.iter_mut().filter(|t| t.stopping.is_none()) {
                        task.process.stop(libc::SIGTERM);
                        task.stopping = Some((StopReason::Ending, now, None));
                    }
                }
                if self.tasks.is_empty() {
                    return Ok(());
                }
            }
            std::thread::sleep(TICK);
        }
    }

    fn end(&mut self, ending: Ending) {
        if self.ending.is_some() {
            return;
        }
        if let Ending::Failed { cause, .. } = &ending {
            // Ranks waiting in a rendezvous stop at once instead of at their timeout.
            self.driver.abort(cause.clone());
        }
        self.ending = Some((ending, Instant::now()));
    }

    /// Reaps exited processes; true when one failed (the slots need a new plan).
    fn reap(&mut self) -> Result<bool> {
        let mut failed = false;
        let mut index = 0;
        while index < self.tasks.len() {
            let Some(status) = self.tasks[index].process.poll()? else {
                index += 1;
                continue;
            };
            let task = self.tasks.remove(index);
            let slot = &task.slot;
            let label = self.labels.get(slot.task_index);
            let stopped = task.stopping.map(|(reason, _, _)| reason);
            if matches!(stopped, Some(StopReason::Unplanned | StopReason::Ending)) {
                log::debug!(
                    "kolorun: task {} (pid {}) stopped: {status}",
                    slot.task_index,
                    task.process.pid()
                );
                continue;
            }
            if status.success() && stopped.is_none() {
                self.driver.task_finished(slot.task_index);
                if self.ending.is_none() {
                    self.message(format!(
                        "kolorun: rank {label} (task {}) on host {} finished; the job ends (the \
                         first rank to return ends an elastic job, as in Horovod): the other \
                         ranks get {} s to finish",
                        slot.task_index,
                        slot.host,
                        format_seconds(self.job.grace)
                    ));
                    self.end(Ending::Succeeded);
                }
                continue;
            }
            let (description, cause_text, code) = describe_exit(status, task.process.remote);
            let cause = AbortCause {
                rank: Some(label),
                host: slot.host.clone(),
                message: cause_text,
            };
            match &self.ending {
                Some((Ending::Succeeded, _)) => {
                    self.message(format!(
                        "kolorun: rank {label} on host {} {description} after the job's first \
                         rank finished",
                        slot.host
                    ));
                    self.late_failure.get_or_insert((code, cause));
                }
                Some(_) => log::debug!(
                    "kolorun: task {} {description} while the job was ending",
                    slot.task_index
                ),
                None => {
                    self.rank_failed(slot, label, &description, cause, code)?;
                    failed = true;
                }
            }
        }
        Ok(failed)
    }

    /// A rank failed while the job runs: it leaves the job, its host is blacklisted, and when
    /// no rank is left the job fails (Horovod: every worker failed).
    fn rank_failed(
        &mut self,
        slot: &LiveTask,
        label: u32,
        description: &str,
        cause: AbortCause,
        code: i32,
    ) -> Result<()> {
        self.failures += 1;
        self.driver
            .remove_task(slot.task_index, cause.message.clone())?;
        let comes_back = self.blacklist.blacklist(&slot.host);
        let until = match comes_back {
            Some(at) => format!(
                "for {:.1} s (its cooldown)",
                at.saturating_duration_since(Instant::now()).as_secs_f64()
            ),
            None => "for the rest of the job (no --blacklist-cooldown-range)".to_owned(),
        };
        self.message(format!(
            "kolorun: rank {label} (task {}) on host {} {description}; it leaves the job, the \
             others reset, and host {} is blacklisted {until}",
            slot.task_index, slot.host, slot.host
        ));
        if self.live().is_empty() {
            self.end(Ending::Failed {
                cause: AbortCause {
                    message: format!(
                        "every rank of the elastic job failed (the last one {description}); \
                         nobody is left to continue"
                    ),
                    ..cause
                },
                code,
            });
        }
        Ok(())
    }

    /// The tasks running on their slots (not being stopped).
    fn live(&self) -> Vec<LiveTask> {
        self.tasks
            .iter()
            .filter(|t| t.stopping.is_none())
            .map(|t| t.slot.clone())
            .collect()
    }

    /// Stops the processes of tasks the driver no longer counts as live (lost heartbeats, a
    /// failure report); true when there were any.
    fn drop_lost_tasks(&mut self) -> bool {
        let live: BTreeSet<u32> = self.driver.live_tasks().into_iter().collect();
        let now = Instant::now();
        let mut dropped = Vec::new();
        for task in self.tasks.iter_mut() {
            if task.stopping.is_none() && !live.contains(&task.slot.task_index) {
                task.process.stop(libc::SIGTERM);
                task.stopping = Some((StopReason::Dropped, now, None));
                dropped.push(task.slot.clone());
            }
        }
        for slot in &dropped {
            self.message(format!(
                "kolorun: the job driver dropped task {} on host {} (it reported a failure or \
                 stopped sending heartbeats); stopping its process",
                slot.task_index, slot.host
            ));
        }
        !dropped.is_empty()
    }

    /// Takes the discovery events; true when the hosts changed.
    fn take_discovery(&mut self, events: &mpsc::Receiver<DiscoveryEvent>) -> bool {
        let mut changed = false;
        while let Ok(event) = events.try_recv() {
            match event {
                DiscoveryEvent::Updated { hosts, changes } => {
                    let added: Vec<String> = changes
                        .added
                        .iter()
                        .map(|h| format!("{}:{}", h.host, h.slots))
                        .collect();
                    let resized: Vec<String> = changes
                        .resized
                        .iter()
                        .map(|c| format!("{} {}->{}", c.host, c.before, c.after))
                        .collect();
                    self.message(format!(
                        "kolorun: discovered hosts now {} (added {added:?}, removed {:?}, \
                         resized {resized:?})",
                        describe_hosts(&hosts),
                        changes.removed
                    ));
                    self.hosts = hosts;
                    changed = true;
                }
                DiscoveryEvent::Failed(err) => self.message(format!(
                    "kolorun: host discovery failed (the previous hosts stand; retrying every \
                     second): {err}"
                )),
            }
        }
        changed
    }

    /// Plans the slots again and acts on the plan.
    fn replan(&mut self) -> Result<()> {
        let usable = self.blacklist.usable(&self.hosts);
        let live = self.live();
        if live.is_empty() {
            // Every rank is being stopped after the driver dropped it: nobody could send the
            // state to new ranks. The job fails once their exits are handled (`rank_failed`).
            return Ok(());
        }
        let request = PlanRequest {
            hosts: &usable,
            live: &live,
            min_num_proc: self.min_num_proc,
            max_num_proc: self.max_num_proc,
            next_task_index: self.next_task,
        };
        match plan(&request)? {
            Plan::Ready(slots) => {
                if self.waiting_since.take().is_some() {
                    self.message(format!(
                        "kolorun: {} slot(s) usable again (--min-np {})",
                        slots.size(),
                        self.min_num_proc
                    ));
                }
                for gone in &slots.gone {
                    let why = self.why_gone(gone, &usable);
                    self.stop_unplanned(gone, &why)?;
                }
                if !slots.start.is_empty() {
                    self.start_tasks(&slots, true)?;
                }
            }
            Plan::Wait { available, needed } => {
                for task in &live {
                    let placeable = usable
                        .iter()
                        .any(|h| h.host == task.host && task.slot < h.slots);
                    if !placeable {
                        let why = self.why_gone(task, &usable);
                        self.stop_unplanned(task, &why)?;
                    }
                }
                let since = match self.waiting_since {
                    Some(since) => since,
                    None => {
                        self.message(format!(
                            "kolorun: only {available} slot(s) usable, fewer than --min-np \
                             {needed}: waiting up to {} s (--elastic-timeout) for more",
                            format_seconds(self.timeout)
                        ));
                        *self.waiting_since.insert(Instant::now())
                    }
                };
                if since.elapsed() >= self.timeout {
                    self.end(Ending::Failed {
                        cause: AbortCause {
                            rank: None,
                            host: String::new(),
                            message: format!(
                                "only {available} slot(s) were available, fewer than --min-np \
                                 {needed}, for {} s (--elastic-timeout); add hosts or lower \
                                 --min-np",
                                format_seconds(self.timeout)
                            ),
                        },
                        code: 1,
                    });
                }
            }
            Plan::NoSurvivor { lost } => {
                let where_: Vec<String> = lost
                    .iter()
                    .map(|t| format!("task {} on {}", t.task_index, t.host))
                    .collect();
                self.end(Ending::Failed {
                    cause: AbortCause {
                        rank: None,
                        host: String::new(),
                        message: format!(
                            "no rank of the job is left on a usable host ({} ran on hosts that \
                             are gone or blacklisted), so nobody can send the training state to \
                             new ranks",
                            where_.join(", ")
                        ),
                    },
                    code: 1,
                });
            }
        }
        Ok(())
    }

    fn why_gone(&self, task: &LiveTask, usable: &[HostSlots]) -> String {
        match usable.iter().find(|h| h.host == task.host) {
            Some(host) if task.slot >= host.slots => {
                format!("host {} has {} slot(s) now", task.host, host.slots)
            }
            Some(_) => format!(
                "--max-np {} leaves no room for it",
                self.max_num_proc.unwrap_or(usize::MAX)
            ),
            None if self.blacklist.is_blacklisted(&task.host) => {
                format!("host {} is blacklisted", task.host)
            }
            None => format!("host {} is no longer discovered", task.host),
        }
    }

    /// Stops a task whose slot is not in the next round: it leaves the job and gets SIGTERM.
    fn stop_unplanned(&mut self, slot: &LiveTask, why: &str) -> Result<()> {
        self.driver
            .remove_task(slot.task_index, format!("kolorun stopped it: {why}"))?;
        let label = self.labels.get(slot.task_index);
        self.message(format!(
            "kolorun: stopping rank {label} (task {}) on host {}: {why}",
            slot.task_index, slot.host
        ));
        let now = Instant::now();
        if let Some(task) = self
            .tasks
            .iter_mut()
            .find(|t| t.slot.task_index == slot.task_index)
        {
            task.process.stop(libc::SIGTERM);
            task.stopping = Some((StopReason::Unplanned, now, None));
        }
        Ok(())
    }

    /// Starts the new tasks of `slots` (announcing them to the driver first when `announce`).
    /// A task that cannot start fails its host, as a rank that exits at once would.
    fn start_tasks(&mut self, slots: &SlotPlan, announce: bool) -> Result<()> {
        let indices: Vec<u32> = slots.start.iter().map(|t| t.task_index).collect();
        if announce {
            self.driver.add_tasks(&indices)?;
        }
        self.next_task = slots.next_task_index;
        let round: Vec<LiveTask> = slots.keep.iter().chain(&slots.start).cloned().collect();
        let previous = self.driver.assignment();
        let planned = planned_assignments(&round, previous.as_deref());
        let mut started = Vec::new();
        for slot in &slots.start {
            let assignment = planned
                .iter()
                .find(|a| a.task_index == slot.task_index)
                .copied()
                .ok_or_else(|| Error::Internal("a new task without a planned rank".into()))?;
            match self.spawn(slot, &assignment) {
                Ok(()) => started.push(format!(
                    "task {} on {} (rank {})",
                    slot.task_index, slot.host, assignment.rank
                )),
                Err(err) if !announce => return Err(err),
                Err(err) => {
                    let label = assignment.rank;
                    let cause = AbortCause {
                        rank: Some(label),
                        host: slot.host.clone(),
                        message: err.to_string(),
                    };
                    self.rank_failed(slot, label, "could not start", cause, 1)?;
                }
            }
        }
        if !started.is_empty() {
            self.message(format!(
                "kolorun: starting {} for a round of {} rank(s): {}",
                if started.len() == 1 {
                    "a rank"
                } else {
                    "ranks"
                },
                round.len(),
                started.join(", ")
            ));
        }
        Ok(())
    }

    fn spawn(&mut self, slot: &LiveTask, assignment: &Assignment) -> Result<()> {
        let host = &slot.host;
        let worker = WorkerEnv {
            driver_addr: self.driver_addr.clone(),
            secret: self.secret.clone(),
            job_id: self.job_id,
            task_index: slot.task_index,
            // Above every task index handed out, which is all a worker checks.
            num_tasks: self.next_task.max(slot.task_index + 1),
            start_timeout: self.job.start_timeout,
            hostname: Some(hosts::host_name(host).to_owned()),
            host_hash_salt: None,
            data_addr: self.job.data_addr_for(host),
        };
        // A task added to the running job loads its framework's lazy imports before it
        // registers (the running ranks wait for it from then on).
        let joining = self.driver.is_joining(slot.task_index);
        if joining {
            self.job
                .extra_env
                .push((ELASTIC_JOINING.to_owned(), "1".to_owned()));
        }
        let launch = self.job.launch_for(host, &worker, assignment, &self.cwd);
        if joining {
            self.job.extra_env.pop();
        }
        let launch = launch?;
        let line = format!(
            "kolorun: task {} on {host}: {}",
            slot.task_index,
            redact(&launch, &self.secret, &self.job_id)
        );
        if self.job.args.verbose {
            self.output.message(&line);
        } else {
            log::debug!("{line}");
        }
        let files = match &self.job.args.output_dir {
            Some(dir) => Some(open_task_files(dir, slot.task_index)?),
            None => None,
        };
        self.labels.set_one(slot.task_index, assignment.rank);
        let process = spawn_rank(
            slot.task_index,
            host,
            &launch,
            files,
            &self.labels,
            self.output,
            &self.done,
            self.job.args.prefix_timestamp,
        )?;
        self.forwarders += 2;
        self.tasks.push(TaskProcess {
            process,
            slot: slot.clone(),
            stopping: None,
        });
        Ok(())
    }

    /// Reports a newly completed round (rendezvous) and labels its tasks' output with their
    /// ranks.
    fn notice_round(&mut self) {
        let generation = self.driver.resets();
        let Some(mut peers) = self.driver.assignment() else {
            return;
        };
        if self.round == Some(generation) {
            return;
        }
        self.round = Some(generation);
        peers.sort_by_key(|p| p.rank);
        for peer in &peers {
            self.labels.set_one(peer.task_index, peer.rank);
        }
        let mut by_host: Vec<(String, Vec<u32>)> = Vec::new();
        for peer in &peers {
            match by_host.iter_mut().find(|(h, _)| *h == peer.hostname) {
                Some((_, ranks)) => ranks.push(peer.rank),
                None => by_host.push((peer.hostname.clone(), vec![peer.rank])),
            }
        }
        let hosts: Vec<String> = by_host
            .iter()
            .map(|(host, ranks)| format!("{host} {ranks:?}"))
            .collect();
        let tasks: Vec<u32> = peers.iter().map(|p| p.task_index).collect();
        self.message(format!(
            "kolorun: rendezvous {}: {} rank(s) on {} (tasks {tasks:?} by rank)",
            generation + 1,
            peers.len(),
            hosts.join(", ")
        ));
    }

    /// SIGKILL for processes that outlived SIGTERM; an error for ones that outlive SIGKILL.
    fn escalate(&mut self) -> Result<()> {
        let now = Instant::now();
        for task in self.tasks.iter_mut() {
            match &mut task.stopping {
                Some((_, termed, killed @ None)) if now >= *termed + TERM_TO_KILL => {
                    log::warn!(
                        "kolorun: task {} still running {TERM_TO_KILL:?} after SIGTERM; sending \
                         SIGKILL",
                        task.slot.task_index
                    );
                    task.process.stop(libc::SIGKILL);
                    *killed = Some(now);
                }
                Some((_, _, Some(killed))) if now >= *killed + AFTER_KILL => {
                    return Err(Error::Launch(format!(
                        "kolorun: process {} did not exit {AFTER_KILL:?} after SIGKILL",
                        task.process.pid()
                    )));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The results of the last completed round's ranks, the failure and the exit code; prints
    /// the summary.
    fn finish(&self) -> FunctionRun {
        let mut peers = self.driver.assignment().unwrap_or_default();
        peers.sort_by_key(|p| p.rank);
        let results = peers
            .iter()
            .map(|peer| {
                self.driver
                    .kv_value(&keys::result(peer.task_index))
                    .map(|value| value.to_vec())
            })
            .collect();
        let (exit_code, failure) = match self.ending.as_ref().map(|(e, _)| e) {
            None | Some(Ending::Succeeded) => match &self.late_failure {
                Some((code, cause)) => (*code, Some(cause.clone())),
                None => (0, None),
            },
            Some(Ending::Failed { cause, code }) => (*code, Some(cause.clone())),
            Some(Ending::DriverAbort(cause)) => (1, Some(cause.clone())),
            Some(Ending::Interrupted) => (130, self.driver.abort_cause()),
        };
        match &failure {
            Some(cause) => self.message(format!(
                "kolorun: the elastic job failed after {} rank failure(s) and {} reset(s): \
                 {cause}",
                self.failures,
                self.driver.resets()
            )),
            None => log::debug!("kolorun: the elastic job finished"),
        }
        FunctionRun {
            exit_code,
            results,
            failure,
        }
    }
}

/// The ranks the driver will assign to `round`'s tasks: its rule
/// ([`assign_ranks_in_host_order`]) with the previous round's hosts first, in their order (a
/// rank's host identity is its host name, which kolorun sets in `KOLO_HOSTNAME`).
fn planned_assignments(round: &[LiveTask], previous: Option<&[PeerAssignment]>) -> Vec<Assignment> {
    let mut order: Vec<String> = Vec::new();
    if let Some(previous) = previous {
        let mut peers: Vec<&PeerAssignment> = previous.iter().collect();
        peers.sort_by_key(|p| p.rank);
        for peer in peers {
            if !order.contains(&peer.hostname) {
                order.push(peer.hostname.clone());
            }
        }
    }
    let keyed: Vec<(u32, String)> = round
        .iter()
        .map(|t| (t.task_index, hosts::host_name(&t.host).to_owned()))
        .collect();
    assign_ranks_in_host_order(&keyed, &order)
}

/// `host:slots, host:slots` (or `no host`).
fn describe_hosts(hosts: &[HostSlots]) -> String {
    if hosts.is_empty() {
        return "no host".into();
    }
    hosts
        .iter()
        .map(|h| format!("{}:{}", h.host, h.slots))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(task_index: u32, host: &str, slot: usize) -> LiveTask {
        LiveTask {
            task_index,
            host: host.into(),
            slot,
        }
    }

    fn peer(task_index: u32, rank: u32, hostname: &str) -> PeerAssignment {
        PeerAssignment {
            task_index,
            rank,
            size: 0,
            local_rank: 0,
            local_size: 0,
            cross_rank: 0,
            cross_size: 0,
            host_hash: String::new(),
            hostname: hostname.into(),
            data_addr: "127.0.0.1:1".parse().unwrap(),
            pid: 1,
        }
    }

    #[test]
    fn planned_ranks_keep_the_previous_host_order_and_put_new_hosts_last() {
        // Host b held rank 0 in the previous round; a new task on a joins after b's.
        let previous = [peer(1, 0, "b"), peer(2, 1, "a")];
        let round = [
            task(1, "b", 0),
            task(2, "a", 0),
            task(5, "c", 0),
            task(4, "a", 1),
        ];
        let planned = planned_assignments(&round, Some(&previous));
        let rank = |index: u32| planned.iter().find(|a| a.task_index == index).unwrap().rank;
        assert_eq!((rank(1), rank(2), rank(4), rank(5)), (0, 1, 2, 3));
        assert!(planned.iter().all(|a| a.size == 4));
        // The first round: hosts in task-index order, as the fixed launch.
        let first = planned_assignments(&[task(0, "x", 0), task(1, "y", 0), task(2, "x", 1)], None);
        let ranks: Vec<u32> = first.iter().map(|a| a.rank).collect();
        assert_eq!(ranks, [0, 2, 1]);
        // user@host entries: the identity is the host name.
        let named = planned_assignments(&[task(0, "me@b", 0)], Some(&previous));
        assert_eq!(named[0].rank, 0);
    }

    #[test]
    fn hosts_are_described_with_their_slots() {
        assert_eq!(describe_hosts(&[]), "no host");
        let hosts = [
            HostSlots {
                host: "a".into(),
                slots: 2,
            },
            HostSlots {
                host: "b".into(),
                slots: 1,
            },
        ];
        assert_eq!(describe_hosts(&hosts), "a:2, b:1");
    }
}
