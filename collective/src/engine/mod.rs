//! The background engine: one thread per process that agrees with the other ranks on which
//! submitted tensors are ready, fuses small allreduces, and runs the collectives, so callers
//! submit ops and get handles at once (Horovod's design).
//!
//! A cycle starts when ops were submitted and the submissions paused for
//! [`EngineConfig::submit_quiet_time`] (so a lone op does not wait and a burst still fuses),
//! when another rank started one (at once if this rank has ops waiting, else once its caller
//! submits or after a short grace), or, while ops wait, at the latest
//! [`EngineConfig::cycle_time`] after the last one. Each cycle the thread takes the ops submitted since the last cycle and, for every
//! process set this rank belongs to (in id order, the same on every rank), sends each member
//! one [`message::CycleMessage`]: response-cache bits for tensors that ran before with the same
//! arguments, full descriptors for the others. Every member runs the same
//! [`coordinator::Coordinator`] on the same messages, so all reach the same decision — which
//! tensors are now submitted everywhere, in which order, which disagree — without a second
//! round trip. The agreed allreduces are fused by dtype and op up to the fusion
//! threshold and run; handles complete. Group rank 0 also runs the stall inspector and, on
//! global rank 0, the [`timeline::Timeline`].

pub mod affinity;
pub mod autotune;
mod cache;
pub mod config;
mod coordinator;
mod cpu_clock;
pub mod deferral;
pub mod device;
mod execute;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod handles;
pub mod host_news;
mod message;
pub mod negotiation;
pub mod request;
mod stats;
pub mod timeline;
mod wake;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::collectives::allgather::check_first_dim;
use crate::collectives::alltoall::check_splits;
use crate::collectives::{check_tensor, AlignedBuf, Group, Session};
use crate::communicator::Communicator;
use crate::control::host_updates::{news_snapshot, process_news, HostNews};
use crate::dtype::ReduceOp;
use crate::error::{Error, Result};
use crate::reduce;
use crate::transport::Layout;
use crate::wire::OpKind;
use autotune::runtime::{Coordinating, Tuning};
pub use autotune::{AppliedTrial, TunedParams};
pub use config::EngineConfig;
use coordinator::{Coordinator, Senders};
pub use execute::recycle_output;
use execute::{Executor, Local, SetAction};
use handles::{Handles, Region};
use host_news::{Agreement, HostsUpdated};
use message::{CycleMessage, FLAG_JOINED, FLAG_SHUTDOWN, FLAG_STALL_ABORT, MAX_MESSAGE_LEN};
use negotiation::SessionLinks;
pub use request::{Output, RawTensor, Submission};
use stats::{CycleCause, Stats};
use timeline::Timeline;
use wake::Wake;

/// How long [`Engine::shutdown`] waits for the other ranks to agree before closing anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The longest an engine with nothing waiting waits for its caller's submissions before it joins
/// a cycle another rank started (see `wait_for_next_cycle`). Joining with nothing ends that
/// cycle with the peer's ops undecided (on 2 training ranks, 4 of 11 cycles per step were such
/// joins, counted by `cycles_peer_grace`), but a longer grace delays every op of a process set
/// by that much while a rank outside the set idles: each cycle starts with the global set's
/// exchange, which that rank must join. At 50 ms, ops on a 2-rank set of a 3-rank job took
/// 50.8 ms each against 7 ms at 1 ms.
const PEER_JOIN_GRACE: Duration = Duration::from_millis(1);

/// The longest single wait of an idle engine (it then checks for an abort or shutdown).
const IDLE_TICK: Duration = Duration::from_millis(100);

/// How often the engine thread, asleep on the shared-memory phase counters between cycles, also
/// looks at its peers' sockets (a dead peer, a lazy mesh's new connection, a cycle started over
/// TCP): every millisecond while it has ops waiting for the others, every
/// [`IDLE_SOCKET_CHECK`] when it has none and the global set negotiates all-to-all (over
/// shared memory on one host: a peer starts every cycle with the global set's exchange, so the
/// counters wake the thread at once whatever the sockets say). Each look woke the idle thread
/// (about 600 times a second, 20-30 us of CPU each on a loaded 2-core machine: 1.5-2 % of a
/// training rank's core, taken from its compute).
const SOCKET_CHECK: Duration = Duration::from_millis(1);
const IDLE_SOCKET_CHECK: Duration = Duration::from_millis(25);

/// Ops checked and given handles but not yet submitted (see [`Engine::hold`]).
#[derive(Debug, Default)]
pub struct HeldOps(Vec<(u64, Submission)>);

impl HeldOps {
    /// The handles of the held ops, in the order they were held.
    pub fn handles(&self) -> Vec<u64> {
        self.0.iter().map(|(handle, _)| *handle).collect()
    }
}

#[derive(Debug)]
enum Item {
    Op(u64, Submission),
    Join(u64, u32),
}

#[derive(Debug, Default)]
struct Inbox {
    items: Vec<Item>,
    shutdown: bool,
    /// When the latest item was submitted.
    last_submit: Option<Instant>,
    /// When the oldest item of `items` was submitted.
    first_submit: Option<Instant>,
}

impl Inbox {
    /// Adds `item`; true when the inbox was empty. Only that push needs to wake the engine
    /// thread: once it has seen a non-empty inbox it sleeps until the submit quiet time or the
    /// cycle time, and later pushes only move the first of those later (it reads them when
    /// it wakes). Waking it for each op of a burst cost a context switch per op.
    fn push(&mut self, item: Item) -> bool {
        let now = Instant::now();
        let first = self.items.is_empty();
        if first {
            self.first_submit = Some(now);
        }
        self.items.push(item);
        self.last_submit = Some(now);
        first
    }

    /// Takes every item submitted so far.
    fn take(&mut self) -> Vec<Item> {
        self.first_submit = None;
        std::mem::take(&mut self.items)
    }
}

#[derive(Debug)]
struct Shared {
    comm: Arc<Communicator>,
    config: EngineConfig,
    handles: Handles,
    inbox: Mutex<Inbox>,
    /// Wakes the engine thread between cycles when something was submitted.
    wake: Wake,
    stats: Stats,
    timeline: Timeline,
    /// The tunable setting in force (the configured one unless autotuning).
    tuning: Tuning,
    /// Members (global ranks) of every registered process set.
    sets: Mutex<BTreeMap<u32, Vec<usize>>>,
    /// Why the engine stopped, once it did.
    stopped: Mutex<Option<Error>>,
    /// Counts add_process_set calls, to name them alike on every rank.
    set_ops: Mutex<u64>,
    /// What cycles work on. The engine thread locks it for each cycle; a caller waiting for a
    /// handle runs a cycle itself when it is free (see [`Engine::wait`]).
    cycles: Mutex<CycleState>,
    /// When the latest cycle started, on whichever thread.
    last_cycle: Mutex<Instant>,
    /// Whether the engine thread defers starts for this rank's ops while the rank computes
    /// ([`deferral`]).
    lazy: bool,
    /// A caller polled a handle whose op is not in a cycle yet: start without deferring.
    urged: AtomicBool,
}

/// The state cycles carry from one to the next.
#[derive(Debug)]
struct CycleState {
    sets: BTreeMap<u32, SetRuntime>,
    next_set_id: u32,
    fusion: AlignedBuf,
    /// What commits agree on about host updates (see [`host_news`]).
    news: Agreement,
    /// Global rank 0's autotuner, when autotuning.
    autotune: Option<Coordinating>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The engine of one process. Dropping it shuts it down.
#[derive(Debug)]
pub struct Engine {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Engine {
    /// Starts the engine thread over `comm`, which it then uses exclusively.
    pub fn start(comm: Arc<Communicator>, config: EngineConfig) -> Result<Engine> {
        let info = comm.info().clone();
        let timeline = Timeline::new();
        if let (Some(path), 0) = (&config.timeline, info.rank) {
            timeline.start(path, config.timeline_mark_cycles)?;
        }
        let mut sets = BTreeMap::new();
        sets.insert(0, (0..info.size).collect());
        let mut runtimes = BTreeMap::new();
        if let Some(group) = Group::new(0, (0..info.size).collect(), info.rank) {
            runtimes.insert(0, SetRuntime::new(group, config.cache_capacity));
        }
        let autotune = if config.autotune.enabled && info.rank == 0 {
            let hierarchical = comm
                .run(|s| Ok(matches!(s.shm_layout(), Some(Layout::Hierarchical(_)))))
                .unwrap_or(false);
            Some(Coordinating::new(&config, hierarchical)?)
        } else {
            None
        };
        let cycles = Mutex::new(CycleState {
            sets: runtimes,
            next_set_id: 1,
            fusion: AlignedBuf::default(),
            news: Agreement::default(),
            autotune,
        });
        let tuning = Tuning::new(&config);
        let lazy = config
            .background_cycles
            .lazy(crate::transport::shm::usable_cores(), info.local_size);
        let shared = Arc::new(Shared {
            comm,
            tuning,
            config,
            handles: Handles::default(),
            inbox: Mutex::new(Inbox::default()),
            wake: Wake::new().map_err(Error::Io)?,
            stats: Stats::default(),
            timeline,
            sets: Mutex::new(sets),
            stopped: Mutex::new(None),
            set_ops: Mutex::new(0),
            cycles,
            last_cycle: Mutex::new(Instant::now()),
            lazy,
            urged: AtomicBool::new(false),
        });
        let worker = Arc::clone(&shared);
        let affinity = shared.config.thread_affinity.clone();
        let (local_size, local_rank) = (info.local_size, info.local_rank);
        let thread = std::thread::Builder::new()
            .name("kolo-engine".into())
            .spawn(move || {
                crate::transport::wait_in_background();
                if let Some(text) = affinity {
                    affinity::apply(&text, local_size, local_rank);
                }
                worker.run()
            })
            .map_err(Error::Io)?;
        Ok(Engine {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Submits `sub` and returns its handle at once. Invalid arguments fail here, before any
    /// other rank is involved.
    pub fn submit(&self, sub: Submission) -> Result<u64> {
        self.submit_with(sub, true)
    }

    /// [`Engine::submit`]; `wake: false` leaves the engine thread asleep, for a caller that
    /// waits for the handle right away and so runs the cycle itself (see [`Engine::wait`]):
    /// waking a thread it does not need costs a context switch, which on a rank pinned to one
    /// core doubles a small collective's latency. Unwoken, the op still runs at the engine's
    /// next cycle at the latest (one cycle time).
    pub fn submit_with(&self, sub: Submission, wake: bool) -> Result<u64> {
        self.enqueue(sub, wake, true)
    }

    /// [`Engine::submit`] without this rank's own argument checks: what a broken or hostile
    /// peer running a modified kolo sends. Only for tests that prove the other ranks (and this
    /// one) then fail the op with a typed error, never abort or hang.
    ///
    /// # Safety
    /// As for [`RawTensor::new`]; in addition the engine may read and write up to the bytes
    /// the submission's shape claims if the other ranks accept it.
    #[doc(hidden)]
    pub unsafe fn submit_unchecked(&self, sub: Submission) -> Result<u64> {
        self.enqueue(sub, true, false)
    }

    /// [`Engine::submit`] for several ops that must enter the same cycle: Horovod's grouped
    /// ops (`grouped_allreduce`, a `DistributedGradientTape`'s gradients), which every rank
    /// submits alike and which therefore become ready, and fuse, together (one at a time,
    /// a cycle could start between two of them and split the group). All or none: when one
    /// fails its checks, none is submitted.
    pub fn submit_group(&self, subs: Vec<Submission>, wake: bool) -> Result<Vec<u64>> {
        let mut held = HeldOps::default();
        let mut handles = Vec::with_capacity(subs.len());
        for sub in subs {
            match self.hold(&mut held, sub) {
                Ok(handle) => handles.push(handle),
                Err(error) => {
                    self.discard(held);
                    return Err(error);
                }
            }
        }
        self.release(held, wake);
        Ok(handles)
    }

    /// Checks `sub` and opens its handle like [`Engine::submit`], but holds it in `held`
    /// instead of submitting it: [`Engine::release`] submits everything held at once (into
    /// one cycle), [`Engine::discard`] forgets it.
    pub fn hold(&self, held: &mut HeldOps, sub: Submission) -> Result<u64> {
        let handle = self.admit(&sub, true)?;
        held.0.push((handle, sub));
        Ok(handle)
    }

    /// Submits every op in `held` at once: they enter the same cycle.
    pub fn release(&self, held: HeldOps, wake: bool) {
        if held.0.is_empty() {
            return;
        }
        let mut inbox = lock(&self.shared.inbox);
        let mut first = false;
        for (handle, sub) in held.0 {
            first |= inbox.push(Item::Op(handle, sub));
        }
        drop(inbox);
        if wake && first {
            self.shared.wake.notify();
        }
    }

    /// Forgets every op in `held`: their handles no longer exist and their names are free.
    pub fn discard(&self, held: HeldOps) {
        for (handle, _) in held.0 {
            self.shared.handles.discard(handle);
        }
    }

    fn enqueue(&self, sub: Submission, wake: bool, check: bool) -> Result<u64> {
        let handle = self.admit(&sub, check)?;
        let first = lock(&self.shared.inbox).push(Item::Op(handle, sub));
        if wake && first {
            self.shared.wake.notify();
        }
        Ok(handle)
    }

    /// Checks `sub` (its process set, and its arguments when `check`) and opens its handle.
    fn admit(&self, sub: &Submission, check: bool) -> Result<u64> {
        self.check_running()?;
        let me = self.shared.comm.info().rank;
        let size = {
            let sets = lock(&self.shared.sets);
            let members = sets
                .get(&sub.process_set)
                .ok_or_else(|| no_such_set(sub.process_set))?;
            if !members.contains(&me) {
                return Err(Error::InvalidArgument(format!(
                    "rank {me} is not in process set {} (ranks {members:?}); only its members may run collectives on it",
                    sub.process_set
                )));
            }
            members.len()
        };
        if check {
            validate(sub, size)?;
        }
        let region = Region {
            start: sub.tensor.addr(),
            end: sub.tensor.addr().saturating_add(sub.tensor.len() as u64),
            writes: matches!(sub.kind, OpKind::Allreduce | OpKind::Broadcast),
        };
        self.shared
            .handles
            .open(sub.process_set, &sub.name, Some(region))
    }

    /// Submits this rank's join on the global set: from now on it contributes identities to
    /// the others' allreduces; the handle completes with [`Output::LastJoined`] once every rank
    /// joined.
    pub fn join(&self) -> Result<u64> {
        self.check_running()?;
        let handle = self.shared.handles.open(0, "", None)?;
        lock(&self.shared.inbox).push(Item::Join(handle, 0));
        self.shared.wake.notify();
        Ok(handle)
    }

    /// Registers a process set of `members` (global ranks) on every rank; every rank must call
    /// it alike. `initializing`: part of `init` (allowed without dynamic process sets). The
    /// handle completes with [`Output::ProcessSet`].
    pub fn add_process_set(&self, members: &[usize], initializing: bool) -> Result<u64> {
        self.add_process_set_as(members, initializing, None)
    }

    /// [`Engine::add_process_set`] under id `id` when it is free and not below the next id
    /// (else the next id): an elastic job registers its sets again after a reset and keeps the
    /// ids of those that still fit even when an earlier one no longer does.
    pub fn add_process_set_as(
        &self,
        members: &[usize],
        initializing: bool,
        id: Option<u32>,
    ) -> Result<u64> {
        self.require_dynamic(initializing, "add_process_set")?;
        let size = self.shared.comm.info().size;
        let mut sorted = members.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.is_empty() || sorted.len() != members.len() || sorted[sorted.len() - 1] >= size {
            return Err(Error::InvalidArgument(format!(
                "a process set needs distinct ranks between 0 and {} (the job has {size}); got {members:?}",
                size - 1
            )));
        }
        // An elastic round's set may come to hold every rank; it keeps its own id.
        let duplicate = lock(&self.shared.sets)
            .iter()
            .find(|(set, m)| **m == sorted && !(id.is_some() && **set == 0))
            .map(|(set, _)| *set);
        if let Some(id) = duplicate {
            return Err(Error::InvalidArgument(format!(
                "process set {id} already has ranks {sorted:?}; a set can be registered once"
            )));
        }
        let name = self.set_op_name("add");
        let mut sub = Submission::new(OpKind::AddProcessSet, &name);
        sub.splits = sorted.iter().map(|&r| r as u64).collect();
        // The wanted id travels in `root` (0: the next one), so ranks that disagree fail.
        sub.root = id.unwrap_or(0) as usize;
        self.submit(sub)
    }

    /// Removes process set `id` on every rank (every rank must call it alike).
    pub fn remove_process_set(&self, id: u32) -> Result<u64> {
        self.require_dynamic(false, "remove_process_set")?;
        if id == 0 {
            return Err(Error::InvalidArgument(
                "the global process set (id 0) cannot be removed".into(),
            ));
        }
        self.members(id)?;
        let name = self.set_op_name("remove");
        let mut sub = Submission::new(OpKind::RemoveProcessSet, &name);
        sub.root = id as usize;
        self.submit(sub)
    }

    /// The members (global ranks) of process set `id`.
    pub fn members(&self, id: u32) -> Result<Vec<usize>> {
        lock(&self.shared.sets)
            .get(&id)
            .cloned()
            .ok_or_else(|| no_such_set(id))
    }

    /// True once `handle` completed. While the engine thread defers its starts
    /// ([`deferral`]), polling an op that is not in a cycle yet makes it start at once: a
    /// caller that polls rather than waits would otherwise see it only after the deferral.
    pub fn poll(&self, handle: u64) -> Result<bool> {
        let done = self.shared.handles.poll(handle)?;
        let shared = &self.shared;
        if !done && shared.lazy && shared.new_work_pending() && !shared.urged.swap(true, Relaxed) {
            shared.wake.notify();
        }
        Ok(done)
    }

    /// Waits up to `timeout` for `handle`: its result (the handle is then consumed), or `None`
    /// while it is still running.
    ///
    /// While the handle is pending and ops were submitted since the last cycle, the caller runs
    /// the next cycle itself (after the one running on another thread, if any): it would only
    /// sleep otherwise, and its op, with whatever else was submitted, is negotiated and run at
    /// once on this thread instead of after the submit quiet time and two thread wake-ups.
    /// That is what makes a lone small collective take microseconds.
    pub fn wait(&self, handle: u64, timeout: Duration) -> Option<Result<Output>> {
        let shared = &self.shared;
        let deadline = Instant::now() + timeout;
        while shared.wants_cycle_for(handle) {
            let seen = shared.handles.cycles_ended();
            match shared.cycles.try_lock() {
                Ok(mut state) => {
                    shared.run_cycle(&mut state, CycleCause::Caller);
                }
                // A cycle runs on another thread: once it ends, look again.
                Err(TryLockError::WouldBlock) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    shared.handles.wait_for_cycle_end(handle, seen, left);
                }
                Err(TryLockError::Poisoned(_)) => break,
            }
            if Instant::now() >= deadline {
                break;
            }
        }
        shared
            .handles
            .wait(handle, deadline.saturating_duration_since(Instant::now()))
    }

    /// Elastic jobs: whether this commit must raise `HostsUpdatedInterrupt`, the same answer on
    /// every rank and without a collective (see [`host_news`]). First waits up to `timeout` until
    /// every op this rank submitted to the global process set was decided (it fails when the
    /// engine stopped before they were; once they were, it answers even after a peer that
    /// finished shut the engine down). When it raises, this
    /// process marks the update handled (rank 0's mark is what every rank reads next).
    pub fn check_host_updates(&self, timeout: Duration) -> Result<Option<HostsUpdated>> {
        let shared = &self.shared;
        let deadline = Instant::now() + timeout;
        loop {
            {
                let mut state = lock(&shared.cycles);
                let undecided = state
                    .sets
                    .get(&0)
                    .is_some_and(|set| !set.pending.is_empty() || set.join.is_some())
                    || lock(&shared.inbox).items.iter().any(|item| match item {
                        Item::Op(_, sub) => sub.process_set == 0,
                        Item::Join(_, id) => *id == 0,
                    });
                if !undecided {
                    let raised = state.news.check();
                    if let Some(raised) = raised {
                        lock(process_news()).mark_handled(raised.timestamp);
                    }
                    return Ok(raised);
                }
            }
            // Only a commit with undecided collectives fails with the engine: one whose
            // collectives all ran still answers after a finished peer shut the engine down.
            if let Some(error) = lock(&shared.stopped).as_ref() {
                return Err(error.replicate());
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: "a commit waited for the collectives submitted before it to be agreed \
                           on every rank (some rank did not submit them: is it running the same \
                           steps?)"
                        .into(),
                    after: timeout,
                });
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// The counters: cycles, tensors, collectives, shm_collectives, fused_tensors, cache_hits, cache_misses,
    /// negotiation_ns, negotiated_tensors, what started the cycles (`cycles_*`), cycles_undecided,
    /// engine_wakeups, engine_wakeups_by_peers, engine_deferrals (see [`stats::CycleCause`]).
    /// With autotuning, also `autotune_trials` (settings applied), `autotune_active` (1 while
    /// searching), and the setting in force: `fusion_threshold` (bytes), `cycle_time_us`,
    /// `cache_enabled`, `hierarchical_allreduce`, `hierarchical_allgather`.
    /// Always `connections_opened` and `connections_open`: the data-plane (TCP) connections
    /// this rank made since `init` and holds now.
    pub fn stats(&self) -> Vec<(&'static str, u64)> {
        let mut stats = self.shared.stats.snapshot();
        let connections = self.shared.comm.connections();
        stats.extend([
            ("connections_opened", connections.opened),
            ("connections_open", connections.open),
        ]);
        if self.shared.config.autotune.enabled {
            let p = self.shared.tuning.current();
            stats.extend([
                ("autotune_trials", self.shared.tuning.trials().len() as u64),
                ("autotune_active", u64::from(p.active)),
                ("fusion_threshold", p.fusion_threshold as u64),
                (
                    "cycle_time_us",
                    u64::try_from(p.cycle_time.as_micros()).unwrap_or(u64::MAX),
                ),
                ("cache_enabled", u64::from(p.cache_enabled)),
                (
                    "hierarchical_allreduce",
                    u64::from(p.hierarchical_allreduce),
                ),
                (
                    "hierarchical_allgather",
                    u64::from(p.hierarchical_allgather),
                ),
            ]);
        }
        stats
    }

    /// The autotuner's settings this rank applied, in order (empty without autotuning). Every
    /// rank applies the same ones at the same cycles.
    pub fn autotune_trials(&self) -> Vec<AppliedTrial> {
        self.shared.tuning.trials()
    }

    /// The tunable setting in force on this rank.
    pub fn tuned_params(&self) -> TunedParams {
        self.shared.tuning.current()
    }

    /// Starts writing the timeline to `path` (rank 0 only; other ranks ignore it).
    pub fn start_timeline(&self, path: &Path, mark_cycles: bool) -> Result<()> {
        if self.shared.comm.info().rank == 0 {
            self.shared.timeline.start(path, mark_cycles)?;
        }
        Ok(())
    }

    /// Stops the timeline and completes its file.
    pub fn stop_timeline(&self) -> Result<()> {
        self.shared.timeline.stop()
    }

    /// Stops the engine: tells the other ranks (their engines stop too, failing what they
    /// still wait for), waits up to 10 s for that cycle, fails what is left here.
    pub fn shutdown(&self) {
        lock(&self.shared.inbox).shutdown = true;
        self.shared.wake.notify();
        let Some(thread) = lock(&self.thread).take() else {
            return;
        };
        let deadline = Instant::now() + SHUTDOWN_GRACE;
        while !thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        if !thread.is_finished() {
            log::warn!("the engine did not stop within {SHUTDOWN_GRACE:?}; closing the data plane");
            self.shared.comm.shutdown();
        }
        if thread.join().is_err() {
            log::error!("the engine thread panicked");
        }
        // The NCCL communicators belong to this engine's membership: a later init (an elastic
        // reset) must not find them by their member list and pair with the old round's peers.
        #[cfg(feature = "cuda")]
        device::nccl::reset();
        self.shared.stop(Error::Closed(
            "kolo was shut down on this rank; call init() again to run more collectives".into(),
        ));
        if let Err(e) = self.shared.timeline.stop() {
            log::warn!("could not complete the timeline file: {e}");
        }
    }

    fn check_running(&self) -> Result<()> {
        match &*lock(&self.shared.stopped) {
            Some(error) => Err(error.replicate()),
            None => Ok(()),
        }
    }

    fn require_dynamic(&self, initializing: bool, what: &str) -> Result<()> {
        if initializing || self.shared.config.dynamic_process_sets {
            return Ok(());
        }
        Err(Error::Config(format!(
            "{what} after init needs dynamic process sets: set KOLO_DYNAMIC_PROCESS_SETS=1 (or \
             HOROVOD_DYNAMIC_PROCESS_SETS=1) on every rank, or pass the sets to init(process_sets=...)"
        )))
    }

    fn set_op_name(&self, what: &str) -> String {
        let mut n = lock(&self.shared.set_ops);
        *n += 1;
        format!("kolo.{what}_process_set.{n}")
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// How often group rank 0 runs the stall inspector, for stall warning time `warn_after`.
fn stall_check_every(warn_after: Duration) -> Duration {
    (warn_after / 4).clamp(Duration::from_millis(100), Duration::from_secs(5))
}

fn no_such_set(id: u32) -> Error {
    Error::InvalidArgument(format!(
        "process set {id} does not exist (it was never added, or was removed)"
    ))
}

/// Checks a submission's arguments against its process set of `size` ranks.
fn validate(sub: &Submission, size: usize) -> Result<()> {
    let kind = sub.kind;
    let len = sub.tensor.len();
    let check = match kind {
        OpKind::Allreduce => check_tensor(&sub.name, len, &sub.shape, sub.dtype, "input")
            .and_then(|()| reduce::check_reduction(sub.dtype, sub.op, sub.prescale, sub.postscale))
            .and_then(|()| match sub.op {
                // Every rank of the set refuses it here, at the call: none starts it.
                ReduceOp::Adasum => {
                    crate::collectives::adasum_size_refusal(size).map_or(Ok(()), Err)
                }
                _ => Ok(()),
            }),
        OpKind::Reducescatter => check_first_dim(&sub.shape)
            .and_then(|()| check_tensor(&sub.name, len, &sub.shape, sub.dtype, "input"))
            .and_then(|()| reduce::check_reduction(sub.dtype, sub.op, sub.prescale, sub.postscale))
            .and_then(|()| match sub.op {
                ReduceOp::Adasum => Err("op Adasum is not supported by reducescatter; use Sum or \
                                         Average"
                    .to_owned()),
                _ => Ok(()),
            }),
        OpKind::Broadcast => {
            if sub.root >= size {
                Err(format!(
                    "root rank {} is out of range; the process set has {size} ranks (0 to {})",
                    sub.root,
                    size - 1
                ))
            } else {
                check_tensor(&sub.name, len, &sub.shape, sub.dtype, "tensor")
            }
        }
        OpKind::Allgather => check_first_dim(&sub.shape)
            .and_then(|()| check_tensor(&sub.name, len, &sub.shape, sub.dtype, "input")),
        OpKind::Alltoall => check_first_dim(&sub.shape)
            .and_then(|()| check_tensor(&sub.name, len, &sub.shape, sub.dtype, "input"))
            .and_then(|()| check_splits(&sub.splits, &sub.shape, size)),
        OpKind::Barrier | OpKind::AddProcessSet | OpKind::RemoveProcessSet => Ok(()),
    };
    check.map_err(|m| {
        let what = crate::collectives::label(kind, &sub.name);
        Error::InvalidArgument(format!("{what}: {m}"))
    })
}

/// The engine thread's state of one process set this rank belongs to.
#[derive(Debug)]
struct SetRuntime {
    group: Group,
    coordinator: Coordinator,
    pending: HashMap<String, Local>,
    fresh: Vec<String>,
    join: Option<u64>,
    stall_abort: bool,
    warned: HashSet<String>,
    last_stall_check: Instant,
}

impl SetRuntime {
    fn new(group: Group, cache_capacity: usize) -> Self {
        let size = group.members.len();
        SetRuntime {
            group,
            coordinator: Coordinator::new(size, cache_capacity),
            pending: HashMap::new(),
            fresh: Vec::new(),
            join: None,
            stall_abort: false,
            warned: HashSet::new(),
            last_stall_check: Instant::now(),
        }
    }
}

/// What a cycle ended with.
enum Flow {
    Continue,
    /// A rank asked to shut down.
    Stop(usize),
}

impl Shared {
    /// Stops the engine and fails every pending handle with the first error it stopped for.
    fn stop(&self, error: Error) {
        let first = lock(&self.stopped)
            .get_or_insert_with(|| error.replicate())
            .replicate();
        self.handles.fail_all(&first);
    }

    fn run(&self) {
        // How many cycles had ended when the wait decided to start one. The first cycle runs
        // at once, unless a caller's cycle ran before this thread got to it: that one did the
        // start-up's exchange, and a late start cycle would only take the ops just submitted
        // into a cycle the other ranks are not in (a thread scheduled late, on a loaded host).
        let mut decided_at = 0;
        let mut cause = CycleCause::Start;
        loop {
            {
                let mut state = lock(&self.cycles);
                if lock(&self.stopped).is_some() {
                    return;
                }
                // A caller ran a cycle after the wait decided (it held the lock meanwhile):
                // that cycle took what the decision was about, so wait again.
                let stale =
                    decided_at != self.handles.cycles_ended() && !lock(&self.inbox).shutdown;
                if !stale && !self.run_cycle(&mut state, cause) {
                    return;
                }
            }
            match self.wait_for_next_cycle() {
                Ok((seen, why)) => (decided_at, cause) = (seen, why),
                Err(error) => {
                    // The wait fails once the communicator broke. A caller's cycle that broke
                    // it (a timeout) holds the cycle lock until it stopped the engine with
                    // that error: taking the lock first keeps this one, "an earlier one
                    // failed", from failing the handles in its place.
                    let _cycle = lock(&self.cycles);
                    log::error!(
                        "rank {}: the engine stopped: {error}",
                        self.comm.info().rank
                    );
                    self.stop(error);
                    return;
                }
            }
        }
    }

    /// True when `handle` is pending, something was submitted since the last cycle, and the
    /// engine runs: a waiting caller should run a cycle itself. (Without new submissions a
    /// cycle could not change anything before the other ranks start one.)
    fn wants_cycle_for(&self, handle: u64) -> bool {
        matches!(self.handles.poll(handle), Ok(false)) && self.new_work_pending()
    }

    /// True when something was submitted since the last cycle and the engine runs.
    fn new_work_pending(&self) -> bool {
        !lock(&self.inbox).items.is_empty() && lock(&self.stopped).is_none()
    }

    /// Runs one cycle; false once the engine stopped (a rank shut down, or it failed).
    fn run_cycle(&self, state: &mut CycleState, cause: CycleCause) -> bool {
        let me = self.comm.info().rank;
        *lock(&self.last_cycle) = Instant::now();
        self.stats.cycle(cause);
        self.timeline.mark_cycle();
        let outcome = self.comm.run(|session| self.cycle(session, state));
        self.handles.cycle_ended();
        match outcome {
            Ok(Flow::Continue) => true,
            Ok(Flow::Stop(rank)) => {
                let why = if rank == me {
                    "kolo was shut down on this rank; call init() again to run more collectives"
                        .to_owned()
                } else {
                    format!(
                        "rank {rank} shut down kolo (it finished, or failed and called shutdown), so no more \
                         collectives can run; this happens when ranks run different numbers of steps — \
                         use hvd.join() to let ranks finish early"
                    )
                };
                self.stop(Error::Closed(why));
                false
            }
            Err(error) => {
                log::error!("rank {me}: the engine stopped: {error}");
                self.stop(error);
                false
            }
        }
    }

    /// Waits until the next cycle should start (cycles that callers ran count as started):
    /// - ops were submitted and no more came for the submit quiet time: a lone op starts
    ///   negotiating at once, while ops submitted in a burst still go into one cycle and fuse;
    /// - another rank started a cycle (its message arrived) and this rank has ops waiting for
    ///   the others (submitted, or negotiated in earlier cycles, or a join): it joins at once,
    ///   after the quiet time of a burst still being submitted;
    /// - another rank started a cycle and this rank has nothing waiting: it joins once
    ///   something is submitted (after the quiet time), else [`PEER_JOIN_GRACE`] after the
    ///   peer started. Joining with nothing would end the peer's cycle with its ops
    ///   undecided: this rank's caller, a moment behind, then needs a second cycle and
    ///   two more thread wake-ups on the peer (the per-step cost of small steps);
    /// - one cycle time after the oldest op not yet in a cycle was submitted (Horovod's
    ///   cycle), or, for ops negotiated earlier that still wait for the others, half a stall
    ///   check after the latest cycle started (see `negotiated_recheck`: such cycles decide
    ///   nothing). Counting from the latest cycle for a new op would start a cycle at its
    ///   submission whenever the caller computed for longer than a cycle time, splitting the
    ///   burst it is about to submit; an idle rank runs no timed cycles at all (they would
    ///   decide nothing);
    /// - shutdown was requested.
    ///
    /// Returns how many cycles had ended when it decided (see [`Handles::cycles_ended`]) and
    /// why it starts one.
    fn wait_for_next_cycle(&self) -> Result<(u64, CycleCause)> {
        let mut peer_started: Option<Instant> = None;
        let mut cycles_seen = self.handles.cycles_ended();
        let mut probe = self.lazy.then(deferral::BusyProbe::default);
        // Until when a start for this rank's ops is held back while the rank computes.
        let mut deferred: Option<Instant> = None;
        loop {
            let wake = self.wake.rearm();
            // A cycle a caller ran meanwhile answered the peer's start this wait saw.
            let cycles = self.handles.cycles_ended();
            if cycles != cycles_seen {
                cycles_seen = cycles;
                peer_started = None;
            }
            let now = Instant::now();
            let (submitted, first_submit, last_submit) = {
                let inbox = lock(&self.inbox);
                if inbox.shutdown {
                    return Ok((cycles_seen, CycleCause::Start));
                }
                (
                    !inbox.items.is_empty(),
                    inbox.first_submit,
                    inbox.last_submit,
                )
            };
            let cycle_time = self.tuning.current().cycle_time;
            // An op waits at most one cycle time from its submission; ops negotiated earlier
            // that wait for the others get a cycle for the stall inspector only.
            let due = match first_submit {
                Some(at) if submitted => Some((at + cycle_time, CycleCause::CycleTime)),
                _ => self.handles.any_pending().then(|| {
                    let at = *lock(&self.last_cycle) + self.negotiated_recheck(cycle_time);
                    (at, CycleCause::Recheck)
                }),
            };
            let waiting = submitted || due.is_some();
            let start_at = match (submitted, peer_started) {
                // A burst goes into one cycle (the caller usually runs it itself).
                (true, _) => last_submit
                    .map(|at| (at + self.config.submit_quiet_time, CycleCause::Submitted)),
                (false, Some(_)) if waiting => Some((now, CycleCause::PeerWaiting)),
                (false, Some(at)) => Some((at + PEER_JOIN_GRACE, CycleCause::PeerGrace)),
                (false, None) => None,
            };
            let (mut until, why) = match (start_at, due) {
                (Some(a), Some(b)) => std::cmp::min_by_key(a, b, |(at, _)| *at),
                (a, b) => a.or(b).unwrap_or((now + IDLE_TICK, CycleCause::Start)),
            };
            let own_ops = submitted && matches!(why, CycleCause::Submitted | CycleCause::CycleTime);
            if !submitted {
                // A caller's cycle took the ops a poll urged.
                self.urged.store(false, Relaxed);
            }
            if !own_ops || self.urged.load(Relaxed) {
                deferred = None;
            }
            if let Some(at) = deferred {
                until = until.max(at);
            }
            if now >= until {
                let oldest = first_submit.unwrap_or(now);
                let latest = oldest + deferral::MAX_DEFERRAL;
                let defer = (own_ops && !self.urged.load(Relaxed) && now < latest)
                    .then(|| probe.as_mut().and_then(deferral::BusyProbe::defer_for))
                    .flatten();
                if let Some(defer) = defer {
                    self.stats.deferred();
                    deferred = Some((now + defer).min(latest));
                    continue;
                }
                self.urged.store(false, Relaxed);
                return Ok((cycles_seen, why));
            }
            // Bounded, so an abort or a closing communicator is noticed while idle.
            let timeout = (until - now).min(IDLE_TICK);
            let socket_check = if waiting || !self.starts_over_shared_memory() {
                SOCKET_CHECK
            } else {
                IDLE_SOCKET_CHECK
            };
            // While ops of this rank's own are in the inbox a peer's start changes nothing
            // (they start at the quiet time or the cycle time either way): being woken for
            // it would only take a core from a computation.
            let watch_peers = peer_started.is_none() && !submitted;
            let peer = self
                .comm
                .wait_readable(&wake, watch_peers, timeout, socket_check)?;
            self.stats.woke(peer);
            if peer {
                peer_started.get_or_insert_with(Instant::now);
            }
        }
    }

    /// How long after the latest cycle an engine whose ops were all negotiated, and still wait
    /// for the other ranks, starts another. Such a cycle decides nothing: the coordinator keeps
    /// what each rank submitted across cycles, the last rank to submit a tensor starts the
    /// cycle that runs it, and a rank with ops waiting joins that cycle at once. It carries
    /// only the stall inspector (and its abort flag), so it runs twice per stall check, never
    /// more often than the cycle time. Every cycle time, as before, it cost both ranks a
    /// cycle per millisecond whenever one rank's gradients were ready before the other's.
    fn negotiated_recheck(&self, cycle_time: Duration) -> Duration {
        let every = self
            .config
            .stall_warning
            .map_or(IDLE_TICK, stall_check_every);
        cycle_time.max(every / 2)
    }

    /// Whether a peer starting a cycle moves this rank's shared-memory counters (where the
    /// data plane has them): the global set, which every cycle negotiates first, exchanges
    /// all-to-all (the tree protocol sends over TCP).
    fn starts_over_shared_memory(&self) -> bool {
        self.config.negotiation.protocol(self.comm.info().size) == negotiation::Protocol::AllToAll
    }

    fn cycle(&self, session: &mut Session, state: &mut CycleState) -> Result<Flow> {
        let CycleState {
            sets,
            next_set_id,
            fusion,
            news,
            autotune,
        } = state;
        let (items, shutdown) = {
            let mut inbox = lock(&self.inbox);
            (inbox.take(), inbox.shutdown)
        };
        for item in items {
            match item {
                Item::Op(handle, sub) => match sets.get_mut(&sub.process_set) {
                    Some(set) => {
                        if self.timeline.is_on() {
                            self.timeline.negotiate_start(&sub.name, sub.kind);
                        }
                        set.fresh.push(sub.name.clone());
                        set.pending.insert(sub.name.clone(), Local { handle, sub });
                    }
                    None => self.handles.complete(
                        handle,
                        Err(Error::InvalidArgument(format!(
                            "process set {} was removed before '{}' could run",
                            sub.process_set, sub.name
                        ))),
                    ),
                },
                Item::Join(handle, id) => match sets.get_mut(&id) {
                    Some(set) if set.join.is_none() => set.join = Some(handle),
                    _ => self.handles.complete(
                        handle,
                        Err(Error::InvalidArgument(
                            "join() is already in progress on this rank".into(),
                        )),
                    ),
                },
            }
        }
        let world = session.size;
        let ids: Vec<u32> = sets.keys().copied().collect();
        let mut actions = Vec::new();
        let mut decided = false;
        for id in ids {
            let Some(set) = sets.get_mut(&id) else {
                continue;
            };
            // Only global rank 0's news is read: the others send none, so that members' messages
            // agree (and merge) in the negotiation.
            let mut msg = CycleMessage {
                news: if id == 0 && set.group.rank == 0 {
                    news_snapshot()
                } else {
                    HostNews::default()
                },
                ..CycleMessage::default()
            };
            if set.join.is_some() {
                msg.flags |= FLAG_JOINED;
            }
            if shutdown && id == 0 {
                msg.flags |= FLAG_SHUTDOWN;
                log::debug!("rank {}: the engine asks every rank to stop", session.rank);
            }
            if set.stall_abort {
                msg.flags |= FLAG_STALL_ABORT;
                set.stall_abort = false;
            }
            if id == 0 {
                if let Some(trial) = autotune.as_mut().and_then(Coordinating::take_outgoing) {
                    msg.carry(trial);
                }
            }
            // With the cache switched off (autotune), every tensor goes in full; the
            // coordinator accepts bits and full descriptors alike.
            let use_cache = self.tuning.current().cache_enabled;
            for name in set.fresh.drain(..) {
                let Some(local) = set.pending.get(&name) else {
                    continue;
                };
                msg.announce(
                    local.sub.descriptor(),
                    use_cache.then_some(&mut set.coordinator.cache),
                );
            }
            let started = Instant::now();
            let capacity = set.coordinator.cache.capacity();
            let payload = msg.encode();
            let protocol = self.config.negotiation.protocol(set.group.members.len());
            let digest = session.with_group(&mut set.group, |s| {
                negotiation::negotiate(
                    &mut SessionLinks::new(s),
                    protocol,
                    payload,
                    MAX_MESSAGE_LEN,
                )
            })?;
            let mut groups = Vec::with_capacity(digest.entries.len());
            for entry in digest.entries {
                let first = entry.ranks.first().map_or(0, |r| r.start);
                let decoded =
                    CycleMessage::decode(&entry.payload, world, capacity).map_err(|e| {
                        Error::Internal(format!(
                            "rank {} sent an unreadable cycle message: {e}",
                            set.group.members[first]
                        ))
                    })?;
                groups.push(Senders {
                    msg: decoded,
                    ranks: entry.ranks,
                });
            }
            let (first_params, first_news) = groups
                .iter()
                .find(|g| g.ranks.first().is_some_and(|r| r.start == 0))
                .map(|g| (g.msg.params, g.msg.news))
                .unwrap_or_default();
            // Global rank 0's autotune setting takes effect here, at this same cycle on every
            // rank, before anything of the cycle runs.
            if id == 0 {
                if let Some(trial) = first_params {
                    self.tuning.apply(trial);
                }
            }
            let now = Instant::now();
            let decision = set.coordinator.decide_grouped(&groups, now);
            if id == 0 && !decision.responses.is_empty() {
                news.observe(first_news);
            }
            // Idle cycles (nothing submitted anywhere) are not negotiation.
            if groups
                .iter()
                .any(|g| !g.msg.bits.is_empty() || !g.msg.requests.is_empty())
            {
                self.stats.negotiation(started.elapsed());
            }
            let agreed: Vec<(String, u64)> = match autotune {
                Some(tuner) if id == 0 && tuner.searching() => decision
                    .responses
                    .iter()
                    .filter_map(|r| match r {
                        coordinator::Response::Run { descs, .. } => Some((
                            descs[0].name.clone(),
                            execute::tensor_bytes(&descs[0]) as u64,
                        )),
                        _ => None,
                    })
                    .collect(),
                _ => Vec::new(),
            };
            let mut executor = Executor {
                handles: &self.handles,
                stats: &self.stats,
                timeline: &self.timeline,
                fusion,
                fusion_threshold: self.tuning.current().fusion_threshold,
                stall_shutdown: self.config.stall_shutdown.unwrap_or_default(),
            };
            let SetRuntime {
                group,
                pending,
                join,
                ..
            } = set;
            decided |= !decision.responses.is_empty();
            let done = session.with_group(group, |s| {
                executor.run(s, decision.responses, pending, join)
            })?;
            actions.extend(done);
            if let (Some(tuner), false) = (autotune.as_mut(), agreed.is_empty()) {
                tuner.observe(&agreed, Instant::now());
            }
            if let Some(rank) = decision.shutdown_by {
                log::debug!(
                    "rank {}: the engine stops (rank {} asked)",
                    session.rank,
                    set.group.members[rank]
                );
                return Ok(Flow::Stop(set.group.members[rank]));
            }
            self.inspect_stalls(id, set, now);
        }
        if !decided {
            self.stats.undecided();
        }
        for action in actions {
            self.apply(action, sets, next_set_id, session.rank);
        }
        Ok(Flow::Continue)
    }

    fn apply(
        &self,
        action: SetAction,
        sets: &mut BTreeMap<u32, SetRuntime>,
        next_set_id: &mut u32,
        me: usize,
    ) {
        match action {
            SetAction::Add {
                members,
                handle,
                wanted,
            } => {
                let id = (*next_set_id).max(wanted);
                *next_set_id = id.saturating_add(1);
                lock(&self.sets).insert(id, members.clone());
                if let Some(group) = Group::new(id, members, me) {
                    sets.insert(id, SetRuntime::new(group, self.config.cache_capacity));
                }
                if let Some(handle) = handle {
                    self.handles.complete(handle, Ok(Output::ProcessSet(id)));
                }
            }
            SetAction::Remove { id, handle } => {
                lock(&self.sets).remove(&id);
                if let Some(set) = sets.remove(&id) {
                    for (name, local) in set.pending {
                        self.handles.complete(
                            local.handle,
                            Err(Error::InvalidArgument(format!(
                                "process set {id} was removed while '{name}' waited on it"
                            ))),
                        );
                    }
                }
                if let Some(handle) = handle {
                    self.handles.complete(handle, Ok(Output::Done));
                }
            }
        }
    }

    /// Group rank 0 warns about tensors that some members have not submitted for longer than
    /// the stall warning time, and asks every member to fail them after the shutdown time.
    fn inspect_stalls(&self, id: u32, set: &mut SetRuntime, now: Instant) {
        let Some(warn_after) = self.config.stall_warning else {
            return;
        };
        let every = stall_check_every(warn_after);
        if set.group.rank != 0 || now.duration_since(set.last_stall_check) < every {
            return;
        }
        set.last_stall_check = now;
        let stalled = set.coordinator.stall_report(now, warn_after);
        set.warned.retain(|n| stalled.iter().any(|(s, _)| s == n));
        let fresh: Vec<&(String, Vec<usize>)> = stalled
            .iter()
            .filter(|(name, _)| !set.warned.contains(name))
            .collect();
        if !fresh.is_empty() {
            let mut by_rank: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
            for (name, missing) in &fresh {
                for &r in missing {
                    by_rank.entry(set.group.members[r]).or_default().push(name);
                }
            }
            let lines: Vec<String> = by_rank
                .iter()
                .map(|(rank, names)| format!("{rank}: [{}]", names.join(", ")))
                .collect();
            log::warn!(
                "stall: one or more tensors were submitted by some ranks of process set {id} but not by others for \
                 more than {warn_after:?}; this usually means ranks run different collectives or different numbers \
                 of steps, and the job will wait forever. Missing ranks (rank: [tensors]):\n{}",
                lines.join("\n")
            );
            for (name, _) in fresh {
                set.warned.insert(name.clone());
            }
        }
        if let Some(limit) = self.config.stall_shutdown {
            if !set.coordinator.stall_report(now, limit).is_empty() {
                log::error!(
                    "stall: tensors waited more than {limit:?} (KOLO_STALL_SHUTDOWN_TIME_SECONDS); failing them on \
                     every rank"
                );
                set.stall_abort = true;
            }
        }
    }
}
