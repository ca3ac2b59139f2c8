//! The job driver's state machine: registrations and the rank assignment, the start deadline,
//! the key-value space, heartbeats and the abort flag. The gRPC handlers are thin wrappers.
//!
//! Registration happens in rounds: every task registers once per round, and the round completes
//! (everyone gets the assignment) when the last one did. A worker that called `shutdown()` and
//! then `init()` again registers for the next round (its request carries the round number); the
//! first such registration opens the round, with its own start deadline. Ranks stay the same
//! (the assignment depends only on the task indices and hosts); data addresses are new.
//!
//! Elastic jobs ([`ElasticConfig`]) keep a set of live tasks instead of a fixed count. A task
//! that fails (a failure report, lost heartbeats, the launcher's `remove_task`) leaves it
//! instead of aborting the job: the latest completed round is *invalidated* (its workers' watch
//! streams get a reset event, so their collectives fail with `MembershipChanged`), and the next
//! round completes once every live task registered, at least `min_np`. The first registration
//! after a completed round opens the next one, whatever generation the worker sends (a new
//! task's first `init()` counts from 0). Ranks follow Horovod's host order: hosts keep the
//! order they first joined in, new hosts come last.
//!
//! Tasks the launcher adds ([`JobState::add_tasks`]) are *joining* until their first
//! registration: nobody waits for them and nobody hears of them, so the running ranks keep
//! training while the new process starts (Python, its framework imports). Their first
//! registration makes them live members and records the "added" host update then: the running
//! ranks reset at their next commit and find the new task already waiting in the next round.
//! A joining task that does not register within the start timeout is dropped.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use prost::bytes::Bytes;
use prost::Message;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::Status;

use crate::abort::AbortCause;
use crate::control::assign::assign_ranks_in_host_order;
use crate::control::event_queue::EventQueue;
use crate::control::heartbeat_gaps::HeartbeatGaps;
use crate::control::host_updates::{HostUpdate, HostUpdateLog, ADDED, REMOVED};
use crate::control::ids::JobId;
use crate::control::kv_space::{KvSpace, KvValue};
use crate::control::proto::{
    task_event, Peer, PeerList, RegisterReply, RegisterRequest, SilentRank, SilentRanksReply,
    TaskEvent, TaskExited,
};
use crate::control::runner_watch::{RunnerLeases, LOST_WITH_RUNNER, RUNNER_GRACE};
use crate::control::service::{DriverConfig, ElasticConfig, PeerAssignment, MAX_TASKS};

/// The longest a `KvGet` may wait, whatever the caller asks.
pub(crate) const MAX_KV_WAIT: Duration = Duration::from_secs(600);

/// Slack on top of the start timeout before a waiting `Register` gives up by itself (the
/// deadline task normally answers first).
const REGISTER_SLACK: Duration = Duration::from_secs(5);

/// How many missing task indices an error message lists.
const LISTED_MISSING: usize = 16;

/// How many ranks a `SilentRanks` reply lists, at most (the reply also says how many in all).
pub(crate) const LISTED_SILENT: usize = 16;

#[derive(Debug, Clone)]
struct Registered {
    host_hash: String,
    hostname: String,
    data_addr: SocketAddr,
    pid: u32,
    /// The client's id for this registration call (the same on each of its retries; 0 from a
    /// client that sends none).
    registration_id: u64,
}

/// Where the current round's registration stands.
#[derive(Debug, Clone)]
pub(crate) enum Phase {
    Waiting,
    /// Every task registered; the assignment is the round's `completed` one.
    Complete,
    TimedOut(String),
}

/// The current registration round.
#[derive(Debug, Clone)]
pub(crate) struct Round {
    /// 0 for the first registration of every task; one more each time they join again.
    generation: u32,
    phase: Phase,
    /// When the round opened (its start deadline counts from here).
    opened: Instant,
    /// The latest completed round: its generation and assignment.
    completed: Option<(u32, Arc<Vec<PeerAssignment>>)>,
    /// The latest completed round's task index of each rank, so that checking a heartbeat's
    /// sender is O(1) (a scan of the assignment made heartbeats O(n^2) per interval).
    task_of_rank: Arc<HashMap<u32, u32>>,
    /// The latest completed round's peers in rank order, encoded once as a `PeerList` that
    /// every registration reply shares (so handing out the assignment is O(1) per task).
    peer_list: Bytes,
    /// Elastic jobs: why the latest completed round is over (a member left), once one did.
    invalidated: Option<AbortCause>,
    /// Elastic jobs: the host update log's cursor when the latest round completed (its workers
    /// get the updates from there on).
    completed_updates: u64,
}

/// What an elastic worker's watch stream should tell it now ([`JobState::elastic_news`]).
#[derive(Debug)]
pub(crate) struct ElasticNews {
    /// Host updates it has not had yet.
    pub(crate) updates: Vec<HostUpdate>,
    /// The cursor after them.
    pub(crate) cursor: u64,
    /// The task is no longer live (a final abort for this worker).
    pub(crate) removed: bool,
    /// Its round is over, with the cause.
    pub(crate) over: Option<AbortCause>,
}

#[derive(Debug, Default)]
struct Inner {
    tasks: BTreeMap<u32, Registered>,
    /// Last heartbeat per rank, for ranks still expected to send them.
    last_seen: HashMap<u32, Instant>,
    /// Tasks known to have finished cleanly (their heartbeats are not expected).
    finished_tasks: BTreeSet<u32>,
    /// The live tasks: `0..num_tasks` for a fixed job; elastic jobs add and remove.
    members: BTreeSet<u32>,
    /// Elastic jobs: host hashes in the order hosts first joined (Horovod's host order).
    host_order: Vec<String>,
    /// Elastic jobs: since when fewer than `min_np` tasks are live.
    below_min_since: Option<Instant>,
    /// Elastic jobs: the host updates recorded so far (bounded).
    updates: HostUpdateLog,
    /// Elastic jobs: tasks the launcher added that have not registered yet, with when they
    /// were added (not members: no round waits for them, no update announced them).
    joining: BTreeMap<u32, Instant>,
    /// Gaps between consecutive heartbeats of each rank, as received (fixed size).
    gaps: HeartbeatGaps,
}

/// Everything the driver knows about one job.
#[derive(Debug)]
pub(crate) struct JobState {
    num_tasks: usize,
    elastic: Option<ElasticConfig>,
    job_id: JobId,
    start_timeout: Duration,
    heartbeat_timeout: Duration,
    abort_if_nobody_registers: bool,
    inner: Mutex<Inner>,
    /// Changed under the `inner` lock (its `tasks` belong to this round).
    round: watch::Sender<Round>,
    abort: watch::Sender<Option<AbortCause>>,
    kv_version: watch::Sender<u64>,
    /// Bumped (under the `inner` lock) when elastic membership or host updates change.
    membership: watch::Sender<u64>,
    shutdown: watch::Sender<bool>,
    /// The key-value space, under its own lock (not `inner`'s, which heartbeats take).
    kv: Mutex<KvSpace>,
    /// Driver-bound task events (`Post`), oldest first, until the launcher drains them.
    events: EventQueue,
    /// Elastic jobs: the task runners' watch streams (see [`crate::control::runner_watch`]).
    runners: Mutex<RunnerLeases>,
}

/// The task index of each rank of an assignment.
fn rank_task_map(peers: &[PeerAssignment]) -> Arc<HashMap<u32, u32>> {
    Arc::new(peers.iter().map(|p| (p.rank, p.task_index)).collect())
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The state stays consistent under every early exit, so a poisoned lock is still usable.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl JobState {
    pub(crate) fn new(config: &DriverConfig) -> Self {
        Self {
            num_tasks: config.num_tasks,
            elastic: config.elastic,
            job_id: config.job_id,
            start_timeout: config.start_timeout,
            heartbeat_timeout: config.heartbeat_timeout,
            abort_if_nobody_registers: config.abort_if_nobody_registers,
            inner: Mutex::new(Inner {
                members: (0..config.num_tasks as u32).collect(),
                ..Inner::default()
            }),
            round: watch::channel(Round {
                generation: 0,
                phase: Phase::Waiting,
                opened: Instant::now(),
                completed: None,
                task_of_rank: Arc::default(),
                peer_list: Bytes::new(),
                invalidated: None,
                completed_updates: 0,
            })
            .0,
            membership: watch::channel(0).0,
            abort: watch::channel(None).0,
            kv_version: watch::channel(0).0,
            shutdown: watch::channel(false).0,
            kv: Mutex::new(KvSpace::default()),
            events: EventQueue::default(),
            runners: Mutex::new(RunnerLeases::default()),
        }
    }

    /// The current round's generation, its start deadline (when its registration must be
    /// complete), and whether it still waits for tasks.
    pub(crate) fn round_deadline(&self) -> (u32, Instant, bool) {
        let round = self.round.borrow();
        let timeout = match &self.elastic {
            Some(elastic) if round.generation > 0 => {
                elastic.elastic_timeout.max(self.start_timeout)
            }
            _ => self.start_timeout,
        };
        (
            round.generation,
            round.opened + timeout,
            matches!(round.phase, Phase::Waiting),
        )
    }

    /// A receiver that changes whenever the round or its phase does.
    pub(crate) fn subscribe_rounds(&self) -> watch::Receiver<Round> {
        self.round.subscribe()
    }

    pub(crate) fn heartbeat_timeout(&self) -> Duration {
        self.heartbeat_timeout
    }

    /// Records a registration (validated); completes the assignment when it is the last one of
    /// its round. A registration for the round after a completed one opens that round. Returns
    /// the round the task registered for.
    pub(crate) fn register(&self, request: &RegisterRequest) -> Result<u32, Status> {
        if let Some(cause) = self.abort_cause() {
            return Err(Status::aborted(format!("cannot join the job: {cause}")));
        }
        if self.elastic.is_some() {
            return self.register_elastic(request);
        }
        let index = request.task_index;
        if index as usize >= self.num_tasks {
            return Err(Status::invalid_argument(format!(
                "task index {index} is out of range: this job has {} task(s), indices 0..={}",
                self.num_tasks,
                self.num_tasks - 1
            )));
        }
        let entry = Registered::from_request(request)?;
        let mut inner = lock(&self.inner);
        let (current, complete) = {
            let round = self.round.borrow();
            (round.generation, matches!(round.phase, Phase::Complete))
        };
        let generation = request.generation;
        if generation == current.wrapping_add(1) && complete {
            inner.tasks.clear();
            self.round.send_modify(|round| {
                round.generation = generation;
                round.phase = Phase::Waiting;
                round.opened = Instant::now();
            });
            log::info!(
                "job driver: task {index} joins again (init after shutdown); registration round \
                 {generation} opened, waiting for all {} task(s)",
                self.num_tasks
            );
        } else if generation != current {
            return Err(Status::failed_precondition(format!(
                "task {index} registers for round {generation} (it called init() {generation} time(s) \
                 before), but the job is in registration round {current}{}; every worker must \
                 call init() and shutdown() alike",
                if complete { "" } else { ", which not every task has joined yet" }
            )));
        }
        if let Some(existing) = inner.tasks.get(&index) {
            if existing.is_same_worker(&entry) {
                return Ok(generation); // A retried call: registration is idempotent.
            }
            return Err(Status::invalid_argument(format!(
                "task index {index} is already registered (pid {} on host {}); every worker \
                 needs its own KOLO_TASK_INDEX",
                existing.pid, existing.hostname
            )));
        }
        if let Phase::TimedOut(message) = &self.round.borrow().phase {
            return Err(Status::deadline_exceeded(message.clone()));
        }
        inner.tasks.insert(index, entry);
        log::debug!(
            "task {index} registered (host {}, pid {}); {} of {}",
            request.hostname,
            request.pid,
            inner.tasks.len(),
            self.num_tasks
        );
        if inner.tasks.len() == self.num_tasks {
            let peers = self.assign(&inner.tasks, &[]);
            let now = Instant::now();
            for peer in &peers {
                if !inner.finished_tasks.contains(&peer.task_index) {
                    inner.last_seen.insert(peer.rank, now);
                }
            }
            log::info!(
                "job driver: all {} task(s) registered on {} host(s); ranks assigned (round {})",
                self.num_tasks,
                peers.iter().filter(|p| p.local_rank == 0).count(),
                generation
            );
            let peer_list = encode_peer_list(&peers);
            let task_of_rank = rank_task_map(&peers);
            let peers = Arc::new(peers);
            self.round.send_modify(|round| {
                round.phase = Phase::Complete;
                round.completed = Some((round.generation, peers));
                round.task_of_rank = task_of_rank;
                round.peer_list = peer_list;
            });
        }
        Ok(generation)
    }

    /// [`JobState::register`] for an elastic job: the task must be live; the first
    /// registration after a completed round opens the next one (counting a reset).
    fn register_elastic(&self, request: &RegisterRequest) -> Result<u32, Status> {
        let index = request.task_index;
        let entry = Registered::from_request(request)?;
        let mut inner = lock(&self.inner);
        if inner.joining.remove(&index).is_some() {
            self.admit_joining(&mut inner, index);
        }
        if !inner.members.contains(&index) {
            return Err(Status::failed_precondition(format!(
                "task {index} is not a live task of this elastic job (it failed or was removed, or \
                 the launcher never added it); live tasks: {:?}",
                inner.members.iter().take(LISTED_MISSING).collect::<Vec<_>>()
            )));
        }
        let (current, phase) = {
            let round = self.round.borrow();
            (round.generation, round.phase.clone())
        };
        let generation = match phase {
            Phase::TimedOut(message) => return Err(Status::deadline_exceeded(message)),
            Phase::Waiting => current,
            Phase::Complete => {
                // A retry of the call that completed this round (its answer was lost with its
                // connection) gets this round's assignment. Anything else opens the next round:
                // a worker that joins again may get its old data port back, so only the
                // registration id (fresh for each call, the same on its retries) tells a
                // retry from a new join.
                if inner
                    .tasks
                    .get(&index)
                    .is_some_and(|existing| existing.is_retry_of(&entry))
                {
                    log::debug!(
                        "task {index} retried its registration for the completed elastic round \
                         {current}"
                    );
                    return Ok(current);
                }
                let next = current.wrapping_add(1);
                self.check_reset_limit(next)?;
                inner.tasks.clear();
                self.round.send_modify(|round| {
                    round.generation = next;
                    round.phase = Phase::Waiting;
                    round.opened = Instant::now();
                });
                log::info!(
                    "job driver: task {index} joins again; elastic registration round {next} \
                     opened, waiting for the {} live task(s)",
                    inner.members.len()
                );
                next
            }
        };
        if let Some(existing) = inner.tasks.get(&index) {
            if existing.is_same_worker(&entry) {
                return Ok(generation);
            }
            return Err(Status::invalid_argument(format!(
                "task index {index} is already registered (pid {} on host {}); every worker \
                 needs its own KOLO_TASK_INDEX",
                existing.pid, existing.hostname
            )));
        }
        inner.tasks.insert(index, entry);
        log::debug!(
            "task {index} registered for elastic round {generation} (host {}, pid {}); {} of {} \
             live",
            request.hostname,
            request.pid,
            inner.tasks.len(),
            inner.members.len()
        );
        self.try_complete_elastic(&mut inner);
        Ok(generation)
    }

    /// Completes the waiting elastic round when every live task (at least `min_np`) registered.
    fn try_complete_elastic(&self, inner: &mut Inner) {
        let Some(elastic) = &self.elastic else {
            return;
        };
        let ready = matches!(self.round.borrow().phase, Phase::Waiting)
            && !inner.tasks.is_empty()
            && inner.members.len() >= elastic.min_np
            && inner.tasks.len() == inner.members.len()
            && inner.members.iter().all(|m| inner.tasks.contains_key(m));
        if !ready {
            return;
        }
        // Horovod's host order: hosts of the last round keep their order, hosts no task of
        // this round runs on drop out (coming back later, they are new), new hosts follow.
        let hashes: Vec<String> = inner.tasks.values().map(|t| t.host_hash.clone()).collect();
        inner.host_order.retain(|hash| hashes.contains(hash));
        for hash in hashes {
            if !inner.host_order.contains(&hash) {
                inner.host_order.push(hash);
            }
        }
        let peers = self.assign(&inner.tasks, &inner.host_order);
        let now = Instant::now();
        inner.last_seen.clear();
        for peer in &peers {
            if !inner.finished_tasks.contains(&peer.task_index) {
                inner.last_seen.insert(peer.rank, now);
            }
        }
        let cursor = inner.updates.next_seq();
        let peer_list = encode_peer_list(&peers);
        let task_of_rank = rank_task_map(&peers);
        let peers = Arc::new(peers);
        self.round.send_modify(|round| {
            log::info!(
                "job driver: elastic round {} complete: {} task(s) on {} host(s)",
                round.generation,
                peers.len(),
                peers.iter().filter(|p| p.local_rank == 0).count()
            );
            round.phase = Phase::Complete;
            round.completed = Some((round.generation, Arc::clone(&peers)));
            round.task_of_rank = task_of_rank;
            round.peer_list = peer_list;
            round.invalidated = None;
            round.completed_updates = cursor;
        });
    }

    /// Aborts the job when round `next` would be a reset past the limit (Horovod: with
    /// `reset_limit` N, N resets run and the next one stops the job).
    fn check_reset_limit(&self, next: u32) -> Result<(), Status> {
        let Some(limit) = self.elastic.and_then(|e| e.reset_limit) else {
            return Ok(());
        };
        if next <= limit {
            return Ok(());
        }
        let message = format!(
            "the number of resets of this elastic job exceeded its limit of {limit} (--reset-limit \
             {limit}); kolo stopped the job instead of resetting again"
        );
        self.abort(AbortCause {
            rank: None,
            host: String::new(),
            message: message.clone(),
        });
        Err(Status::aborted(format!(
            "cannot join the job: job aborted: {message}"
        )))
    }

    /// Elastic jobs: `task_index` leaves the live tasks (it failed, or the launcher removed it);
    /// the latest completed round is over if it was in it. False when it was not live.
    fn remove_member(&self, task_index: u32, message: String) -> bool {
        let mut inner = lock(&self.inner);
        if inner.joining.remove(&task_index).is_some() {
            // The running ranks never heard of it: nothing to interrupt or announce.
            log::warn!(
                "job driver: added task {task_index} left the elastic job before it registered: \
                 {message}"
            );
            self.note_if_short(&mut inner);
            self.membership.send_modify(|version| *version += 1);
            return true;
        }
        if !inner.members.remove(&task_index) {
            return false;
        }
        inner.tasks.remove(&task_index);
        inner.finished_tasks.remove(&task_index);
        inner.updates.record(HostUpdate::now(REMOVED));
        self.note_if_short(&mut inner);
        let (completed, current) = {
            let round = self.round.borrow();
            (round.completed.clone(), round.generation)
        };
        let mut over_limit = false;
        match completed.as_ref().and_then(|(done, peers)| {
            Some((*done, peers.iter().find(|p| p.task_index == task_index)?))
        }) {
            Some((done, peer)) => {
                let cause = AbortCause {
                    rank: Some(peer.rank),
                    host: peer.hostname.clone(),
                    message: message.clone(),
                };
                log::warn!(
                    "job driver: task {task_index} left the elastic job ({}); {} live task(s) \
                     remain, round {done} is over",
                    cause.message,
                    inner.members.len()
                );
                // The survivors stop heartbeating while they reset; the next round's deadline
                // bounds that.
                inner.last_seen.clear();
                self.round.send_modify(|round| {
                    if round.invalidated.is_none() {
                        round.invalidated = Some(cause);
                    }
                });
                over_limit =
                    current == done && self.check_reset_limit(done.wrapping_add(1)).is_err();
            }
            None => log::warn!(
                "job driver: task {task_index} left the elastic job before its round completed: \
                 {message}"
            ),
        }
        if !over_limit {
            self.try_complete_elastic(&mut inner);
        }
        self.membership.send_modify(|version| *version += 1);
        true
    }

    /// Elastic jobs: starts the `--elastic-timeout` clock when fewer than `min_np` tasks are
    /// live (members and joining tasks: the launcher supplied those processes).
    fn note_if_short(&self, inner: &mut Inner) {
        let min_np = self.elastic.map_or(1, |e| e.min_np);
        if inner.members.len() + inner.joining.len() < min_np && inner.below_min_since.is_none() {
            inner.below_min_since = Some(Instant::now());
        }
    }

    /// Elastic jobs: the launcher added tasks (see [`crate::control::DriverService::add_tasks`]).
    pub(crate) fn add_tasks(&self, task_indices: &[u32]) -> crate::Result<()> {
        let Some(elastic) = self.elastic else {
            return Err(crate::Error::Config(
                "add_tasks needs an elastic job (DriverConfig::elastic, kolorun --min-np/--max-np)"
                    .into(),
            ));
        };
        let mut inner = lock(&self.inner);
        let mut fresh = BTreeSet::new();
        for &index in task_indices {
            if index as usize >= MAX_TASKS {
                return Err(crate::Error::InvalidArgument(format!(
                    "task index {index} is out of range (at most {})",
                    MAX_TASKS - 1
                )));
            }
            if inner.members.contains(&index)
                || inner.joining.contains_key(&index)
                || !fresh.insert(index)
            {
                return Err(crate::Error::InvalidArgument(format!(
                    "task {index} is already a live task of this job; new tasks need new indices"
                )));
            }
        }
        let live = inner.members.len() + inner.joining.len();
        if live + fresh.len() > elastic.max_np {
            return Err(crate::Error::InvalidArgument(format!(
                "adding {} task(s) to the {live} live one(s) would pass max_np {} (--max-np)",
                fresh.len(),
                elastic.max_np
            )));
        }
        if fresh.is_empty() {
            return Ok(());
        }
        let now = Instant::now();
        inner
            .joining
            .extend(fresh.iter().map(|&index| (index, now)));
        // The launcher supplied the processes: the job is no longer short of them (a joining
        // task that never registers counts again when it is dropped).
        if inner.members.len() + inner.joining.len() >= elastic.min_np {
            inner.below_min_since = None;
        }
        log::info!(
            "job driver: task(s) {fresh:?} added; the running ranks hear of them when they \
             register ({} member(s), {} joining)",
            inner.members.len(),
            inner.joining.len()
        );
        // Launchers watching `live_tasks` see them at once.
        self.membership.send_modify(|version| *version += 1);
        Ok(())
    }

    /// Elastic jobs: joining task `index` registered: it becomes a live member and the running
    /// ranks get the "added" host update (they reset at their next commit and find it waiting).
    fn admit_joining(&self, inner: &mut Inner, index: u32) {
        inner.members.insert(index);
        inner.updates.record(HostUpdate::now(ADDED));
        log::info!(
            "job driver: added task {index} registered; announcing it to the running ranks \
             ({} live task(s))",
            inner.members.len()
        );
        self.membership.send_modify(|version| *version += 1);
    }

    /// Elastic jobs: drops the joining tasks that did not register within the start timeout
    /// (their launcher sees them leave `live_tasks` and stops their processes).
    pub(crate) fn check_joining(&self) {
        if self.elastic.is_none() {
            return;
        }
        let mut inner = lock(&self.inner);
        let late: Vec<u32> = inner
            .joining
            .iter()
            .filter(|(_, added)| added.elapsed() > self.start_timeout)
            .map(|(index, _)| *index)
            .collect();
        if late.is_empty() {
            return;
        }
        for index in &late {
            inner.joining.remove(index);
        }
        self.note_if_short(&mut inner);
        log::warn!(
            "job driver: added task(s) {late:?} did not register within the start timeout ({} \
             s; kolorun --start-timeout, or {}): they leave the job, the running ranks were \
             never interrupted for them",
            crate::control::env::format_seconds(self.start_timeout),
            crate::control::env::START_TIMEOUT
        );
        self.membership.send_modify(|version| *version += 1);
    }

    /// Elastic jobs: the launcher removed task `task_index`.
    pub(crate) fn remove_task(&self, task_index: u32, reason: String) -> crate::Result<bool> {
        if self.elastic.is_none() {
            return Err(crate::Error::Config(
                "remove_task needs an elastic job; a fixed job reports failures with \
                 report_task_failure (which aborts it)"
                    .into(),
            ));
        }
        Ok(self.remove_member(task_index, reason))
    }

    /// Whether `task_index` was added and has not registered yet.
    pub(crate) fn is_joining(&self, task_index: u32) -> bool {
        lock(&self.inner).joining.contains_key(&task_index)
    }

    /// The live task indices, ascending: the members and the tasks still joining.
    pub(crate) fn live_tasks(&self) -> Vec<u32> {
        let inner = lock(&self.inner);
        let mut live: Vec<u32> = inner
            .members
            .iter()
            .chain(inner.joining.keys())
            .copied()
            .collect();
        live.sort_unstable();
        live
    }

    /// How many rounds after the first completed.
    pub(crate) fn resets(&self) -> u32 {
        self.round
            .borrow()
            .completed
            .as_ref()
            .map_or(0, |(generation, _)| *generation)
    }

    /// Elastic jobs: aborts the job when fewer than `min_np` tasks were live for longer than
    /// the elastic timeout.
    pub(crate) fn check_elastic_timeout(&self) {
        let Some(elastic) = self.elastic else {
            return;
        };
        if self.abort.borrow().is_some() {
            return;
        }
        let (live, since) = {
            let inner = lock(&self.inner);
            (
                inner.members.len() + inner.joining.len(),
                inner.below_min_since,
            )
        };
        let Some(since) = since else {
            return;
        };
        if since.elapsed() < elastic.elastic_timeout {
            return;
        }
        self.abort(AbortCause {
            rank: None,
            host: String::new(),
            message: format!(
                "only {live} of the minimum {} processes (--min-np) were available for {} s \
                 (--elastic-timeout); add hosts or lower --min-np",
                elastic.min_np,
                crate::control::env::format_seconds(elastic.elastic_timeout)
            ),
        });
    }

    /// Elastic jobs: what a watcher of `task_index` in round `generation` should learn now:
    /// host updates from `cursor` on (its round's start when `None`), whether the task is
    /// still live, and the cause when its round is over.
    pub(crate) fn elastic_news(
        &self,
        task_index: u32,
        generation: u32,
        cursor: Option<u64>,
    ) -> ElasticNews {
        let inner = lock(&self.inner);
        let round = self.round.borrow();
        let from = cursor.unwrap_or(match &round.completed {
            Some((done, _)) if *done == generation => round.completed_updates,
            _ => inner.updates.next_seq(),
        });
        let (updates, next) = inner.updates.since(from);
        let over = match &round.completed {
            Some((done, _)) if *done == generation => round.invalidated.clone(),
            Some((done, _)) if *done > generation => Some(AbortCause {
                rank: None,
                host: String::new(),
                message: format!("registration round {done} completed without this worker"),
            }),
            _ => None,
        };
        ElasticNews {
            updates,
            cursor: next,
            removed: !inner.members.contains(&task_index),
            over,
        }
    }

    pub(crate) fn is_elastic(&self) -> bool {
        self.elastic.is_some()
    }

    pub(crate) fn subscribe_membership(&self) -> watch::Receiver<u64> {
        self.membership.subscribe()
    }

    /// True when `rank` of the latest completed round is task `task_index` of round
    /// `generation` (elastic jobs check heartbeats and leaves with it; fixed jobs and clients
    /// that send no task index always match).
    fn is_current(&self, rank: u32, task_index: Option<u32>, generation: u32) -> bool {
        let (Some(task_index), true) = (task_index, self.elastic.is_some()) else {
            return true;
        };
        let round = self.round.borrow();
        match &round.completed {
            Some((done, _)) => {
                *done == generation && round.task_of_rank.get(&rank) == Some(&task_index)
            }
            None => false,
        }
    }

    fn assign(
        &self,
        tasks: &BTreeMap<u32, Registered>,
        host_order: &[String],
    ) -> Vec<PeerAssignment> {
        let input: Vec<(u32, String)> = tasks
            .iter()
            .map(|(index, task)| (*index, task.host_hash.clone()))
            .collect();
        assign_ranks_in_host_order(&input, host_order)
            .into_iter()
            .zip(tasks.values())
            .map(|(a, task)| PeerAssignment {
                task_index: a.task_index,
                rank: a.rank,
                size: a.size,
                local_rank: a.local_rank,
                local_size: a.local_size,
                cross_rank: a.cross_rank,
                cross_size: a.cross_size,
                host_hash: task.host_hash.clone(),
                hostname: task.hostname.clone(),
                data_addr: task.data_addr,
                pid: task.pid,
            })
            .collect()
    }

    /// Waits until round `generation` is complete (then answers `task_index`'s registration),
    /// its start deadline passed, the job was aborted or the driver shuts down.
    pub(crate) async fn await_assignment(
        &self,
        task_index: u32,
        generation: u32,
    ) -> Result<RegisterReply, Status> {
        let mut round = self.round.subscribe();
        let mut abort = self.abort.subscribe();
        let mut shutdown = self.shutdown.subscribe();
        let (_, deadline, _) = self.round_deadline();
        let limit = deadline + REGISTER_SLACK;
        let waited = tokio::time::timeout_at(limit, async {
            tokio::select! {
                _ = round.wait_for(|r| r.generation != generation || !matches!(r.phase, Phase::Waiting)) => {}
                _ = abort.wait_for(Option::is_some) => {}
                _ = shutdown.wait_for(|down| *down) => {}
            }
        })
        .await;
        let current = self.round.borrow().clone();
        if let Some((done, peers)) = &current.completed {
            if *done == generation {
                return self.reply(task_index, *done, peers, &current.peer_list);
            }
        }
        if current.generation == generation {
            if let Phase::TimedOut(message) = current.phase {
                return Err(Status::deadline_exceeded(message));
            }
        }
        if let Some(cause) = self.abort_cause() {
            return Err(Status::aborted(format!(
                "the job was aborted while waiting for every task to register: {cause}"
            )));
        }
        if *self.shutdown.borrow() {
            return Err(Status::unavailable(
                "the job driver shut down before every task registered",
            ));
        }
        match waited {
            Err(_) => Err(Status::deadline_exceeded(
                self.timeout_message(&lock(&self.inner)),
            )),
            Ok(()) => Err(Status::internal(
                "registration wait ended without a result (this is a bug in kolo)",
            )),
        }
    }

    /// Task `task_index`'s answer from completed round `generation` (its `peers`, and their
    /// shared `peer_list`): O(n) to find the task, nothing rebuilt per task.
    fn reply(
        &self,
        task_index: u32,
        generation: u32,
        peers: &[PeerAssignment],
        peer_list: &Bytes,
    ) -> Result<RegisterReply, Status> {
        let elastic = self.elastic.is_some();
        let me = peers
            .iter()
            .find(|p| p.task_index == task_index)
            .ok_or_else(|| {
                if elastic {
                    Status::failed_precondition(format!(
                        "task {task_index} left the elastic job (it was reported failed or removed) \
                         while it waited for the other tasks to register"
                    ))
                } else {
                    Status::internal(format!(
                        "task {task_index} has no assignment (this is a bug in kolo)"
                    ))
                }
            })?;
        Ok(RegisterReply {
            rank: me.rank,
            size: me.size,
            local_rank: me.local_rank,
            local_size: me.local_size,
            cross_rank: me.cross_rank,
            cross_size: me.cross_size,
            peer_list: peer_list.clone(),
            job_id: self.job_id.0.to_vec(),
            generation,
            elastic,
        })
    }

    fn timeout_message(&self, inner: &Inner) -> String {
        let n = inner.members.len();
        let missing: Vec<String> = inner
            .members
            .iter()
            .filter(|index| !inner.tasks.contains_key(index))
            .map(|index| index.to_string())
            .collect();
        let mut listed = missing
            .iter()
            .take(LISTED_MISSING)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if missing.len() > LISTED_MISSING {
            listed.push_str(&format!(", ... ({} more)", missing.len() - LISTED_MISSING));
        }
        let generation = self.round.borrow().generation;
        let again = if generation == 0 {
            String::new()
        } else {
            format!(" again (registration round {generation}: a task called init() after shutdown(), so every task must)")
        };
        format!(
            "timed out after {}s waiting for every task to register with the job driver{again}: {} \
             of {n} registered; missing task indices: [{listed}]. Check that every process called \
             hvd.init() and that none failed at startup (see its output); if startup is just \
             slow, raise the start timeout (kolorun --start-timeout SECONDS, or {})",
            crate::control::env::format_seconds(self.start_timeout),
            inner.tasks.len(),
            crate::control::env::START_TIMEOUT,
        )
    }

    /// Called at the start deadline of round `generation`: if its registration is incomplete,
    /// fails every waiting and later registration, and aborts the job when anyone is waiting.
    pub(crate) fn on_start_deadline(&self, generation: u32) {
        let inner = lock(&self.inner);
        {
            let round = self.round.borrow();
            if round.generation != generation || !matches!(round.phase, Phase::Waiting) {
                return;
            }
        }
        let message = self.timeout_message(&inner);
        let registered = inner.tasks.len();
        self.round
            .send_modify(|round| round.phase = Phase::TimedOut(message.clone()));
        drop(inner);
        if registered > 0 || self.abort_if_nobody_registers {
            self.abort(AbortCause {
                rank: None,
                host: String::new(),
                message,
            });
        }
    }

    /// Marks the job aborted; true when this was the first cause.
    pub(crate) fn abort(&self, cause: AbortCause) -> bool {
        let first = self.abort.send_if_modified(|current| {
            if current.is_none() {
                *current = Some(cause.clone());
                true
            } else {
                false
            }
        });
        if first {
            log::warn!("job driver: job aborted: {cause}");
        }
        first
    }

    pub(crate) fn abort_cause(&self) -> Option<AbortCause> {
        self.abort.borrow().clone()
    }

    pub(crate) fn subscribe_abort(&self) -> watch::Receiver<Option<AbortCause>> {
        self.abort.subscribe()
    }

    /// Waits for the abort (its cause) or the driver's shutdown (`None`).
    pub(crate) async fn next_abort(&self) -> Option<AbortCause> {
        let mut abort = self.abort.subscribe();
        let mut shutdown = self.shutdown.subscribe();
        tokio::select! {
            biased;
            cause = abort.wait_for(Option::is_some) => cause.ok().and_then(|cause| cause.clone()),
            _ = shutdown.wait_for(|down| *down) => None,
        }
    }

    /// The assignment of the latest completed round (ranks are the same in every round).
    pub(crate) fn assignment(&self) -> Option<Arc<Vec<PeerAssignment>>> {
        self.round
            .borrow()
            .completed
            .as_ref()
            .map(|(_, peers)| Arc::clone(peers))
    }

    fn hostname_of_rank(&self, rank: u32) -> String {
        self.assignment()
            .and_then(|peers| {
                peers
                    .iter()
                    .find(|p| p.rank == rank)
                    .map(|p| p.hostname.clone())
            })
            .unwrap_or_default()
    }

    pub(crate) fn registered_tasks(&self) -> Vec<u32> {
        lock(&self.inner).tasks.keys().copied().collect()
    }

    /// Records a heartbeat (elastic jobs: only from the task that holds `rank` in the latest
    /// round); answers whether the job is aborted.
    pub(crate) fn heartbeat(&self, rank: u32, task_index: Option<u32>, generation: u32) -> bool {
        let mut guard = lock(&self.inner);
        let inner = &mut *guard;
        if self.is_current(rank, task_index, generation) {
            if let Some(seen) = inner.last_seen.get_mut(&rank) {
                let now = Instant::now();
                inner.gaps.record(now.duration_since(*seen));
                *seen = now;
            }
        }
        drop(guard);
        self.abort.borrow().is_some()
    }

    /// The gaps between consecutive heartbeats of each rank so far.
    pub(crate) fn heartbeat_gaps(&self) -> HeartbeatGaps {
        lock(&self.inner).gaps.clone()
    }

    /// The ranks still expected to send heartbeats whose last one is at least `at_least` old,
    /// the most silent first (at most [`LISTED_SILENT`], with the total count), each with
    /// its host and data address from the assignment.
    pub(crate) fn silent_ranks(&self, at_least: Duration) -> SilentRanksReply {
        let now = Instant::now();
        let mut silent: Vec<(u32, Duration)> = lock(&self.inner)
            .last_seen
            .iter()
            .map(|(rank, seen)| (*rank, now.duration_since(*seen)))
            .filter(|(_, silence)| *silence >= at_least)
            .collect();
        silent.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let total = u32::try_from(silent.len()).unwrap_or(u32::MAX);
        let peers = self.assignment();
        let ranks = silent
            .into_iter()
            .take(LISTED_SILENT)
            .map(|(rank, silence)| {
                let peer = peers
                    .as_ref()
                    .and_then(|peers| peers.iter().find(|p| p.rank == rank));
                SilentRank {
                    rank,
                    hostname: peer.map(|p| p.hostname.clone()).unwrap_or_default(),
                    data_addr: peer.map(|p| p.data_addr.to_string()).unwrap_or_default(),
                    silent_ms: u64::try_from(silence.as_millis()).unwrap_or(u64::MAX),
                }
            })
            .collect();
        SilentRanksReply { ranks, total }
    }

    /// How many ranks joined the current round and have not left yet.
    pub(crate) fn active_ranks(&self) -> usize {
        lock(&self.inner).last_seen.len()
    }

    /// Stops expecting heartbeats from `rank` (it finished cleanly, or resets).
    pub(crate) fn leave(&self, rank: u32, task_index: Option<u32>, generation: u32) {
        let mut inner = lock(&self.inner);
        if self.is_current(rank, task_index, generation) {
            inner.last_seen.remove(&rank);
        }
    }

    /// The task index of `rank` in the latest completed round.
    fn task_of_rank(&self, rank: u32) -> Option<u32> {
        self.round.borrow().task_of_rank.get(&rank).copied()
    }

    /// Stops expecting heartbeats from the task `task_index` (its process exited cleanly).
    pub(crate) fn task_finished(&self, task_index: u32) {
        let rank = self.assignment().and_then(|peers| {
            peers
                .iter()
                .find(|p| p.task_index == task_index)
                .map(|p| p.rank)
        });
        let mut inner = lock(&self.inner);
        inner.finished_tasks.insert(task_index);
        if let Some(rank) = rank {
            inner.last_seen.remove(&rank);
        }
    }

    /// Aborts the job if a rank has been silent longer than the heartbeat timeout.
    pub(crate) fn check_heartbeats(&self) {
        if self.abort.borrow().is_some() {
            return;
        }
        let now = Instant::now();
        let lost = lock(&self.inner)
            .last_seen
            .iter()
            .filter(|(_, seen)| now.duration_since(**seen) > self.heartbeat_timeout)
            .map(|(rank, seen)| (*rank, now.duration_since(*seen)))
            .min_by_key(|(rank, _)| *rank);
        if let Some((rank, silent)) = lost {
            let message = format!(
                "stopped sending heartbeats to the job driver ({:.1}s without one; the process \
                 hung, was killed, or its host lost the network)",
                silent.as_secs_f64()
            );
            if self.elastic.is_some() {
                match self.task_of_rank(rank) {
                    Some(task) => {
                        self.remove_member(task, message);
                    }
                    None => {
                        lock(&self.inner).last_seen.remove(&rank);
                    }
                }
                return;
            }
            self.abort(AbortCause {
                rank: Some(rank),
                host: self.hostname_of_rank(rank),
                message,
            });
        }
    }

    /// A worker reported a failure: aborts the job with its message.
    pub(crate) fn report_failure(&self, rank: u32, message: String) {
        if self.elastic.is_some() {
            // Elastic jobs: the task leaves (a rank of an earlier round is ignored).
            if let Some(task) = self.task_of_rank(rank) {
                self.remove_member(task, message);
            }
            return;
        }
        let host = self.hostname_of_rank(rank);
        self.abort(AbortCause {
            rank: Some(rank),
            host,
            message,
        });
    }

    /// A launcher-side reporter (the Spark task runner) says task `task_index` failed: aborts
    /// the job with its message, naming the task's rank when ranks are assigned.
    pub(crate) fn report_task_failure(&self, task_index: u32, message: String) {
        if self.elastic.is_some() {
            self.remove_member(task_index, message);
            return;
        }
        let peer = self
            .assignment()
            .and_then(|peers| peers.iter().find(|p| p.task_index == task_index).cloned());
        let (rank, host) = match peer {
            Some(peer) => (Some(peer.rank), peer.hostname),
            None => (None, String::new()),
        };
        let message = match rank {
            Some(_) => message,
            None => format!("task {task_index} (before ranks were assigned): {message}"),
        };
        self.abort(AbortCause {
            rank,
            host,
            message,
        });
    }

    /// Queues driver-bound events from task `task_index` (kept in arrival order; bounded, see
    /// [`EventQueue`]).
    pub(crate) async fn post(&self, task_index: u32, events: Vec<TaskEvent>) -> Result<(), Status> {
        let exited = events
            .iter()
            .any(|event| matches!(event.kind, Some(task_event::Kind::Exited(_))));
        if exited {
            lock(&self.runners).exited(task_index);
        }
        self.events
            .post(task_index, events)
            .await
            .map_err(Status::resource_exhausted)
    }

    /// The runner of task `task_index` opened its watch stream; returns the watch's lease for
    /// [`JobState::runner_watch_ended`].
    pub(crate) fn runner_watch_opened(&self, task_index: u32) -> u64 {
        lock(&self.runners).opened(task_index)
    }

    /// The runner watch `lease` of task `task_index` ended at `ended`, and [`RUNNER_GRACE`]
    /// has passed. Unless the runner opened a new watch, posted its rank's exit, or the task's
    /// rank sent a heartbeat since `ended`, the task is lost: the driver records its exit
    /// (`was lost with its task runner: ...`, for the launcher, which then does not wait for
    /// it). An elastic job removes the task, so the survivors' next round does not wait for it;
    /// a fixed job is aborted naming it (unless something aborted it already: the survivors
    /// usually see the broken connection first).
    pub(crate) async fn runner_watch_ended(&self, task_index: u32, lease: u64, ended: Instant) {
        let aborted = self.abort_cause().is_some();
        if (self.elastic.is_some() && aborted) || *self.shutdown.borrow() {
            return;
        }
        let rank = self.assignment().and_then(|peers| {
            peers
                .iter()
                .find(|p| p.task_index == task_index)
                .map(|p| p.rank)
        });
        let heard = rank.is_some_and(|rank| {
            lock(&self.inner)
                .last_seen
                .get(&rank)
                .is_some_and(|seen| *seen > ended)
        });
        if heard {
            log::debug!(
                "job driver: the runner watch of task {task_index} ended but its rank still                  sends heartbeats; it stays"
            );
            return;
        }
        if !lock(&self.runners).lost(task_index, lease) {
            return;
        }
        let description = format!(
            "{LOST_WITH_RUNNER}: the task runner's connection to the job driver closed without \
             reporting an exit and stayed closed for {:.1} s (its executor died, or the task \
             was killed)",
            RUNNER_GRACE.as_secs_f64()
        );
        if self.elastic.is_none() && !aborted {
            // Aborted before the exit is recorded: a launcher that sees the exit sees why.
            let peer = self.assignment().and_then(|peers| {
                peers
                    .iter()
                    .find(|p| p.task_index == task_index)
                    .map(|p| (p.rank, p.hostname.clone()))
            });
            let (rank, host) = peer.map_or((None, String::new()), |(r, h)| (Some(r), h));
            self.abort(AbortCause {
                rank,
                host,
                message: format!("task {task_index}'s rank process {description}"),
            });
        }
        let exited = TaskEvent {
            kind: Some(task_event::Kind::Exited(TaskExited {
                success: false,
                description: description.clone(),
            })),
        };
        // An elastic job drops the task before its exit is recorded: whoever sees the exit
        // sees the task gone from the live ones.
        if self.elastic.is_some() {
            self.remove_member(task_index, format!("its rank process {description}"));
        }
        if let Err(err) = self.events.post(task_index, vec![exited]).await {
            log::warn!("job driver: cannot record the loss of task {task_index}: {err}");
        }
    }

    /// Takes every queued event, waiting up to `timeout` for the first one.
    pub(crate) async fn take_events(&self, timeout: Duration) -> Vec<(u32, TaskEvent)> {
        self.events.take(timeout).await
    }

    /// Stores `value` under `key`; `Err` names the cap it would pass (see [`KvSpace`]).
    pub(crate) fn kv_put(&self, key: String, value: KvValue) -> Result<(), String> {
        lock(&self.kv).put(key, value)?;
        self.kv_version.send_modify(|version| *version += 1);
        Ok(())
    }

    pub(crate) fn kv_value(&self, key: &str) -> Option<KvValue> {
        lock(&self.kv).get(key)
    }

    /// Waits up to `timeout` (at most [`MAX_KV_WAIT`]) for `key`.
    pub(crate) async fn kv_get(&self, key: &str, timeout: Duration) -> Result<KvValue, Status> {
        let timeout = timeout.min(MAX_KV_WAIT);
        let deadline = Instant::now() + timeout;
        let mut version = self.kv_version.subscribe();
        let mut abort = self.abort.subscribe();
        let mut shutdown = self.shutdown.subscribe();
        loop {
            version.borrow_and_update();
            if let Some(value) = self.kv_value(key) {
                return Ok(value);
            }
            if let Some(cause) = self.abort_cause() {
                return Err(Status::aborted(cause.to_string()));
            }
            if *self.shutdown.borrow() {
                return Err(Status::unavailable("the job driver is shutting down"));
            }
            tokio::select! {
                changed = tokio::time::timeout_at(deadline, version.changed()) => match changed {
                    Err(_) => {
                        return Err(Status::not_found(format!(
                            "key {key:?} was not set within {}ms",
                            timeout.as_millis()
                        )))
                    }
                    Ok(Err(_)) => return Err(Status::unavailable("the job driver is shutting down")),
                    Ok(Ok(())) => {}
                },
                _ = abort.wait_for(Option::is_some) => {}
                _ = shutdown.wait_for(|down| *down) => {}
            }
        }
    }

    pub(crate) fn begin_shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    pub(crate) fn subscribe_shutdown(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }
}

impl Registered {
    /// What a registration records of its task (its data address checked).
    fn from_request(request: &RegisterRequest) -> Result<Self, Status> {
        Ok(Registered {
            host_hash: request.host_hash.clone(),
            hostname: request.hostname.clone(),
            data_addr: parse_data_addr(&request.data_addr)?,
            pid: request.pid,
            registration_id: request.registration_id,
        })
    }

    /// The same worker process at the same data address (a repeated registration of it is
    /// idempotent while its round waits; another process under its task index is refused).
    fn is_same_worker(&self, other: &Registered) -> bool {
        self.host_hash == other.host_hash
            && self.hostname == other.hostname
            && self.data_addr == other.data_addr
            && self.pid == other.pid
    }

    /// `other` is a retry of this very registration call: the same worker and the same
    /// (non-zero) registration id.
    fn is_retry_of(&self, other: &Registered) -> bool {
        self.registration_id != 0
            && self.registration_id == other.registration_id
            && self.is_same_worker(other)
    }
}

/// `peers` in rank order as an encoded [`PeerList`] (built once per completed round).
fn encode_peer_list(peers: &[PeerAssignment]) -> Bytes {
    let mut by_rank: Vec<&PeerAssignment> = peers.iter().collect();
    by_rank.sort_by_key(|p| p.rank);
    let list = PeerList {
        peers: by_rank
            .into_iter()
            .map(|p| Peer {
                rank: p.rank,
                task_index: p.task_index,
                host_hash: p.host_hash.clone(),
                hostname: p.hostname.clone(),
                data_addr: p.data_addr.to_string(),
            })
            .collect(),
    };
    Bytes::from(list.encode_to_vec())
}

fn parse_data_addr(text: &str) -> Result<SocketAddr, Status> {
    let addr: SocketAddr = text.parse().map_err(|_| {
        Status::invalid_argument(format!(
            "data_addr {text:?} is not an ip:port socket address"
        ))
    })?;
    if addr.ip().is_unspecified() || addr.port() == 0 {
        return Err(Status::invalid_argument(format!(
            "data_addr {addr} is not an address peers can connect to; listen on a concrete \
             interface address and port (see control::data_plane_ip)"
        )));
    }
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(task_index: u32) -> RegisterRequest {
        let host = format!("host-{}", task_index / 8);
        RegisterRequest {
            task_index,
            host_hash: crate::control::host_hash::host_hash_for(&host, "ns", None),
            hostname: host,
            data_addr: format!("10.0.{}.{}:4000", task_index / 250, task_index % 250 + 1),
            pid: 1_000 + task_index,
            generation: 0,
            registration_id: 7_000 + u64::from(task_index),
        }
    }

    fn decoded_peers(reply: &RegisterReply) -> Vec<Peer> {
        PeerList::decode(reply.peer_list.clone()).unwrap().peers
    }

    /// Handing out a completed assignment costs each registration a constant amount of work:
    /// the rank-ordered peer list is built and encoded once per round, not once per task
    /// (before, 4,096 tasks cost 4,096 sorts and 16.8 million peer copies: seconds of the
    /// driver's CPU and hundreds of MiB at once, while every heartbeat waited behind them).
    #[test]
    fn every_task_gets_the_assignment_without_rebuilding_the_peer_list() {
        const TASKS: u32 = 4_096;
        let state = JobState::new(&DriverConfig::new(TASKS as usize));
        for task in 0..TASKS {
            state.register(&request(task)).unwrap();
        }
        let started = std::time::Instant::now();
        let replies = kolo_runtime::block_on(async {
            let mut replies = Vec::with_capacity(TASKS as usize);
            for task in 0..TASKS {
                replies.push(state.await_assignment(task, 0).await.unwrap());
            }
            replies
        })
        .unwrap();
        let took = started.elapsed();
        let shared = replies[0].peer_list.as_ptr();
        assert!(replies.iter().all(|r| r.peer_list.as_ptr() == shared));
        assert!(
            took < Duration::from_millis(1_500),
            "{TASKS} assignments took {took:?}"
        );
        // Decoding is each worker's own O(n) work: check a sample.
        for (task, reply) in (0..TASKS).zip(&replies).step_by(97) {
            let peers = decoded_peers(reply);
            assert_eq!(peers.len(), TASKS as usize);
            let me = &peers[reply.rank as usize];
            assert_eq!((me.rank, me.task_index), (reply.rank, task));
            assert_eq!(me.data_addr, request(task).data_addr);
        }
    }

    /// An elastic job of `tasks` tasks whose round 0 completed.
    fn elastic_job(tasks: u32) -> JobState {
        let config = DriverConfig {
            elastic: Some(crate::control::ElasticConfig::new(
                tasks as usize,
                tasks as usize,
            )),
            ..DriverConfig::new(tasks as usize)
        };
        let state = JobState::new(&config);
        for task in 0..tasks {
            state.register(&request(task)).unwrap();
        }
        let (generation, _, waiting) = state.round_deadline();
        assert_eq!((generation, waiting), (0, false), "round 0 completed");
        state
    }

    /// An elastic job counts a heartbeat (and a leave) only from the task that holds the rank
    /// in the latest completed round, for that round's generation: one from the round before a
    /// reset, from another task, or for an unknown rank is refused.
    #[test]
    fn elastic_heartbeats_count_only_from_the_current_rounds_task_of_the_rank() {
        let state = elastic_job(16);
        let peers = state.assignment().unwrap();
        let (me, other) = (&peers[3], &peers[9]);
        let counted = || state.heartbeat_gaps().count();
        state.heartbeat(me.rank, Some(me.task_index), 0);
        assert_eq!(counted(), 1, "a current heartbeat counts");
        state.heartbeat(me.rank, Some(other.task_index), 0);
        state.heartbeat(me.rank, Some(me.task_index), 1);
        state.heartbeat(99, Some(me.task_index), 0);
        assert_eq!(
            counted(),
            1,
            "another task's, a future round's, an unknown rank's"
        );
        // A reset: every task registers for round 1, which completes.
        for task in 0..16 {
            state
                .register(&RegisterRequest {
                    generation: 1,
                    registration_id: 9_000 + u64::from(task), // a new call, not a retry
                    ..request(task)
                })
                .unwrap();
        }
        let (generation, _, waiting) = state.round_deadline();
        assert_eq!((generation, waiting), (1, false), "round 1 completed");
        let peers = state.assignment().unwrap();
        let now = peers
            .iter()
            .find(|p| p.task_index == me.task_index)
            .unwrap();
        state.heartbeat(now.rank, Some(now.task_index), 0);
        assert_eq!(
            counted(),
            1,
            "a heartbeat of the round before the reset is stale"
        );
        state.heartbeat(now.rank, Some(now.task_index), 1);
        assert_eq!(counted(), 2, "the current round's counts");
        state.leave(now.rank, Some(now.task_index), 0);
        assert_eq!(state.active_ranks(), 16, "a stale leave is refused");
        state.leave(now.rank, Some(now.task_index), 1);
        assert_eq!(state.active_ranks(), 15);
    }

    /// A heartbeat of an elastic job costs the driver O(1), not a scan of the assignment:
    /// 8,192 ranks heartbeating 16 times each took ~1 s of scanning before (O(n) per
    /// heartbeat, O(n^2) per interval), a few tens of ms with the rank-to-task map.
    #[test]
    fn elastic_heartbeats_do_not_scan_the_assignment() {
        const TASKS: u32 = 8_192;
        let state = elastic_job(TASKS);
        let peers = state.assignment().unwrap();
        let started = std::time::Instant::now();
        for _ in 0..16 {
            for peer in peers.iter() {
                state.heartbeat(peer.rank, Some(peer.task_index), 0);
            }
        }
        let took = started.elapsed();
        assert_eq!(state.heartbeat_gaps().count(), 16 * u64::from(TASKS));
        assert!(
            took < Duration::from_millis(250),
            "{} heartbeats took {took:?}",
            16 * TASKS
        );
    }

    /// A registration call retried after its round completed (the reply was lost with its
    /// connection) gets that round's assignment: it neither opens a new round (a reset every
    /// surviving rank would pay for) nor is refused. The same worker registering anew (a fresh
    /// id: init() after shutdown()) still opens the next round, its retries there are
    /// idempotent, and another process under its task index is still refused.
    #[test]
    fn an_elastic_registration_retried_after_its_round_completed_is_not_a_new_join() {
        let state = elastic_job(4);
        assert_eq!(
            state.register(&request(2)).unwrap(),
            0,
            "the completed round"
        );
        let (generation, _, waiting) = state.round_deadline();
        assert_eq!((generation, waiting), (0, false), "no new round opened");
        let rejoin = RegisterRequest {
            registration_id: 99,
            ..request(2)
        };
        assert_eq!(state.register(&rejoin).unwrap(), 1, "a new call joins anew");
        assert_eq!(
            state.register(&rejoin).unwrap(),
            1,
            "its retry is idempotent"
        );
        let impostor = RegisterRequest {
            pid: 4242,
            ..rejoin
        };
        let err = state.register(&impostor).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        assert!(
            err.message().contains("task index 2 is already registered"),
            "{err:?}"
        );
        let (generation, _, waiting) = state.round_deadline();
        assert_eq!((generation, waiting), (1, true));
    }
}
