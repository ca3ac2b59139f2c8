//! [`DriverService`]: the job driver (tonic gRPC server on the global runtime) that workers
//! register with, and its configuration.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::Server;

use crate::abort::AbortCause;
use crate::control::driver_state::JobState;
use crate::control::handlers::Handlers;
use crate::control::handshake::{authenticated_incoming, control_key};
use crate::control::ids::{JobId, JobSecret};
use crate::control::proto::driver_server::DriverServer;
use crate::control::proto::TaskEvent;
use crate::error::{Error, Result};

/// How long a shutdown waits for the server to finish in-flight calls before cutting it off.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// The most tasks one job may have (ranks are `u32` on the wire; this bound keeps every
/// per-task table the driver holds small enough to allocate).
pub const MAX_TASKS: usize = 1 << 20;

/// The longest interval between two heartbeat checks.
const MAX_CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// How to run one job's driver.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// Where to listen (port 0 picks a free port; see [`DriverService::addr`]).
    pub bind: SocketAddr,
    /// How many tasks must register before anyone gets an assignment.
    pub num_tasks: usize,
    /// The job secret every connection must prove knowledge of (it is never sent).
    pub secret: JobSecret,
    /// The job id handed to workers with their assignment.
    pub job_id: JobId,
    /// Registration must complete this long after [`DriverService::start`].
    pub start_timeout: Duration,
    /// A registered rank silent this long gets the job aborted.
    pub heartbeat_timeout: Duration,
    /// When true, the job also aborts if the start timeout passes with no task registered at
    /// all (Spark, Ray and `mpirun` tasks always register). kolorun turns it off: its ranks may
    /// be programs that never call `init()`, as under horovodrun.
    pub abort_if_nobody_registers: bool,
    /// Elastic mode (`None`: a fixed job, where any task failure aborts it). See
    /// [`ElasticConfig`].
    pub elastic: Option<ElasticConfig>,
}

/// Horovod's elastic semantics for one job (`horovodrun --min-np/--max-np/--elastic-timeout/
/// --reset-limit`). A failed task (its exit reported by the launcher, lost heartbeats, a failure
/// report) leaves the job instead of aborting it: the survivors' collectives fail with
/// [`crate::Error::MembershipChanged`] and they `shutdown()` + `init()` into the next
/// registration round, which completes when every live task registered, with ranks re-assigned
/// densely (existing hosts keep their order, new hosts come last). The launcher announces new
/// tasks with [`DriverService::add_tasks`] and lost ones with [`DriverService::remove_task`];
/// workers see both as host updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElasticConfig {
    /// The fewest live tasks the job may run with (`--min-np`).
    pub min_np: usize,
    /// The most live tasks the job may have (`--max-np`); [`DriverService::add_tasks`] refuses
    /// more.
    pub max_np: usize,
    /// How long the job may have fewer than `min_np` live tasks before it aborts
    /// (`--elastic-timeout`; Horovod's default 600 s). Rounds after the first also wait this
    /// long for every live task to register.
    pub elastic_timeout: Duration,
    /// How many resets (registration rounds after the first) the job may go through before it
    /// aborts (`--reset-limit`; `None`: no limit). As in Horovod, the reset that would pass the
    /// limit aborts the job: with a limit of 2, the third reset does.
    pub reset_limit: Option<u32>,
}

impl ElasticConfig {
    /// Horovod's defaults: an elastic timeout of 600 s and no reset limit.
    pub fn new(min_np: usize, max_np: usize) -> Self {
        Self {
            min_np,
            max_np,
            elastic_timeout: Duration::from_secs(600),
            reset_limit: None,
        }
    }

    fn check(&self, num_tasks: usize) -> Result<()> {
        if self.min_np == 0 || self.min_np > self.max_np {
            return Err(Error::Config(format!(
                "elastic bounds must satisfy 1 <= min_np <= max_np, got min_np {} and max_np {} \
                 (--min-np / --max-np)",
                self.min_np, self.max_np
            )));
        }
        if num_tasks < self.min_np || num_tasks > self.max_np {
            return Err(Error::Config(format!(
                "an elastic job starts with between min_np {} and max_np {} tasks, not {num_tasks} \
                 (-np / --min-np / --max-np)",
                self.min_np, self.max_np
            )));
        }
        if self.max_np > MAX_TASKS {
            return Err(Error::InvalidArgument(format!(
                "max_np {} is more than kolo supports ({MAX_TASKS})",
                self.max_np
            )));
        }
        if self.elastic_timeout.is_zero() {
            return Err(Error::Config(
                "the elastic timeout must be positive (--elastic-timeout)".into(),
            ));
        }
        Ok(())
    }
}

impl DriverConfig {
    /// A configuration for `num_tasks` tasks on `127.0.0.1:0` with a fresh secret and job id,
    /// a 30 s start timeout and a 30 s heartbeat timeout, aborting if nobody registers.
    pub fn new(num_tasks: usize) -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            num_tasks,
            secret: JobSecret::generate(),
            job_id: JobId::generate(),
            start_timeout: Duration::from_secs(30),
            heartbeat_timeout: Duration::from_secs(30),
            abort_if_nobody_registers: true,
            elastic: None,
        }
    }
}

/// One registered task's place in the job, as the driver assigned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerAssignment {
    /// The task index the worker registered with.
    pub task_index: u32,
    /// Its global rank.
    pub rank: u32,
    /// Number of ranks.
    pub size: u32,
    /// Position among the ranks on its host.
    pub local_rank: u32,
    /// Number of ranks on its host.
    pub local_size: u32,
    /// Ordinal of its host among hosts with this local rank.
    pub cross_rank: u32,
    /// Number of hosts with this local rank.
    pub cross_size: u32,
    /// Its host hash.
    pub host_hash: String,
    /// Its hostname (as the worker reported it).
    pub hostname: String,
    /// Where its data plane listens.
    pub data_addr: SocketAddr,
    /// Its process id (on its host).
    pub pid: u32,
}

/// A running job driver service. Dropping it shuts it down.
///
/// Starting is synchronous and needs no runtime context: the server runs on kolo's global
/// runtime ([`kolo_runtime`]), so this works from plain threads and from async code alike.
///
/// ```
/// use kolo_collective::control::{DriverConfig, DriverService};
///
/// let driver = DriverService::start(DriverConfig::new(2)).unwrap();
/// assert_ne!(driver.addr().port(), 0);
/// assert!(driver.assignment().is_none());
/// driver.shutdown();
/// ```
#[derive(Debug)]
pub struct DriverService {
    state: Arc<JobState>,
    addr: SocketAddr,
    job_id: JobId,
    server: Mutex<Option<JoinHandle<()>>>,
}

impl DriverService {
    /// Binds `config.bind` and starts serving on the global runtime; also starts the start
    /// deadline and heartbeat watchdogs. Errors: invalid config, bind failure.
    pub fn start(config: DriverConfig) -> Result<Self> {
        if config.num_tasks == 0 {
            return Err(Error::Config(
                "a job needs at least one task (num_tasks = 0)".into(),
            ));
        }
        if config.num_tasks > MAX_TASKS {
            return Err(Error::InvalidArgument(format!(
                "a job of {} tasks is more than kolo supports ({MAX_TASKS}); check num_proc / \
                 num_workers / -np",
                config.num_tasks
            )));
        }
        if config.start_timeout.is_zero() || config.heartbeat_timeout.is_zero() {
            return Err(Error::Config(
                "the start and heartbeat timeouts must be positive".into(),
            ));
        }
        if let Some(elastic) = &config.elastic {
            elastic.check(config.num_tasks)?;
        }
        let runtime = kolo_runtime::handle()?;
        let listener = crate::control::net::listen(config.bind).map_err(|err| {
            Error::Config(format!(
                "cannot start the job driver on {}: {err}",
                config.bind
            ))
        })?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let _context = runtime.enter();
        let state = Arc::new(JobState::new(&config));
        let incoming = authenticated_incoming(
            tokio::net::TcpListener::from_std(listener)?,
            control_key(&config.secret),
            state.subscribe_shutdown(),
        );
        let service = DriverServer::new(Handlers {
            state: Arc::clone(&state),
        });
        let mut stop = state.subscribe_shutdown();
        let server = runtime.spawn(async move {
            let stopped = async move {
                let _ = stop.wait_for(|down| *down).await;
            };
            let served = Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, stopped)
                .await;
            if let Err(err) = served {
                log::error!("the job driver at {addr} stopped with an error: {err}");
            }
        });
        runtime.spawn(start_deadline(Arc::clone(&state)));
        runtime.spawn(heartbeat_watchdog(Arc::clone(&state)));
        log::info!(
            "job driver for job {} listening on {addr}, expecting {} task(s) within {:?}",
            config.job_id,
            config.num_tasks,
            config.start_timeout
        );
        Ok(Self {
            state,
            addr,
            job_id: config.job_id,
            server: Mutex::new(Some(server)),
        })
    }

    /// The address the service listens on (with the real port when bound to port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The job id.
    pub fn job_id(&self) -> JobId {
        self.job_id
    }

    /// Aborts the job: every `WatchAbort` stream yields `cause`, waiting registrations and key
    /// lookups fail. Idempotent; the first cause wins. Returns true when this call set it.
    pub fn abort(&self, cause: AbortCause) -> bool {
        self.state.abort(cause)
    }

    /// The abort cause, once the job is aborted (by [`DriverService::abort`], a worker's
    /// `ReportFailure`, a lost heartbeat, or the start timeout with tasks waiting).
    pub fn abort_cause(&self) -> Option<AbortCause> {
        self.state.abort_cause()
    }

    /// A receiver that changes to `Some(cause)` when the job is aborted for any reason —
    /// how a launcher learns about failure reports and lost heartbeats.
    pub fn failures(&self) -> watch::Receiver<Option<AbortCause>> {
        self.state.subscribe_abort()
    }

    /// Every task's assignment, indexed by task index, once all tasks registered.
    pub fn assignment(&self) -> Option<Vec<PeerAssignment>> {
        self.state.assignment().map(|peers| peers.as_ref().clone())
    }

    /// The task indices registered so far, ascending (for progress messages).
    pub fn registered_tasks(&self) -> Vec<u32> {
        self.state.registered_tasks()
    }

    /// How regularly heartbeats arrive: the gaps between each rank's consecutive heartbeats
    /// as the driver received them (a gap near the heartbeat timeout means they are starved).
    pub fn heartbeat_gaps(&self) -> crate::control::HeartbeatGaps {
        self.state.heartbeat_gaps()
    }

    /// How many ranks joined (in the current registration round) and have not left yet.
    pub fn active_ranks(&self) -> usize {
        self.state.active_ranks()
    }

    /// Tells the driver that task `task_index` exited cleanly, so its missing heartbeats are
    /// not a failure (launchers call this when a worker process exits with status 0).
    pub fn task_finished(&self, task_index: u32) {
        self.state.task_finished(task_index);
    }

    /// Elastic jobs: announces new tasks (the launcher starts processes for these task indices,
    /// e.g. on hosts discovery added, or replacing lost ones). They are live at once
    /// ([`DriverService::live_tasks`]) but *joining*: each becomes a member at its first
    /// registration, and only then do the running workers get an "added" host update (so they
    /// keep training while the new process starts, and their next round never waits for its
    /// imports). One that does not register within the start timeout leaves the job.
    /// Errors: `Config` when the job is not elastic; `InvalidArgument` when an index is already
    /// a live task or the job would pass `max_np`.
    pub fn add_tasks(&self, task_indices: &[u32]) -> Result<()> {
        self.state.add_tasks(task_indices)
    }

    /// Elastic jobs: task `task_index` is gone (its process exited, its host was removed): it
    /// leaves the membership as a failed task would, with `reason` in the survivors' error, and
    /// every worker gets a "removed" host update. Returns false when it was not a live task.
    /// Errors: `Config` when the job is not elastic (use [`DriverService::report_task_failure`]).
    pub fn remove_task(&self, task_index: u32, reason: impl Into<String>) -> Result<bool> {
        self.state.remove_task(task_index, reason.into())
    }

    /// Elastic jobs: whether task `task_index` was added ([`DriverService::add_tasks`]) and has
    /// not registered yet (its launcher sets [`crate::control::env::ELASTIC_JOINING`] for it).
    pub fn is_joining(&self, task_index: u32) -> bool {
        self.state.is_joining(task_index)
    }

    /// Elastic jobs: the live task indices, ascending, added tasks that have not registered yet
    /// included (every task index for a fixed job).
    pub fn live_tasks(&self) -> Vec<u32> {
        self.state.live_tasks()
    }

    /// How many registration rounds after the first completed (resets).
    pub fn resets(&self) -> u32 {
        self.state.resets()
    }

    /// Stores a value in the job's key-value space (as a worker's `KvPut` would). Errors:
    /// `InvalidArgument` naming the cap of [`crate::control::kv_space`] the value would pass.
    pub fn kv_put(&self, key: impl Into<String>, value: Vec<u8>) -> Result<()> {
        self.state
            .kv_put(key.into(), value.into())
            .map_err(Error::InvalidArgument)
    }

    /// The value of `key` in the job's key-value space, if set (shared, not copied).
    pub fn kv_value(&self, key: &str) -> Option<crate::control::kv_space::KvValue> {
        self.state.kv_value(key)
    }

    /// Takes every driver-bound task event (`Post`) queued so far, in arrival order, waiting
    /// up to `timeout` for the first one (an empty list when none came).
    pub async fn take_events(&self, timeout: Duration) -> Vec<(u32, TaskEvent)> {
        self.state.take_events(timeout).await
    }

    /// Aborts the job on behalf of task `task_index` (its rank and host when assigned), as a
    /// task runner's failure report would. Returns nothing; the first cause wins.
    pub fn report_task_failure(&self, task_index: u32, message: impl Into<String>) {
        self.state.report_task_failure(task_index, message.into());
    }

    /// Stops the service without blocking: ends every `WatchAbort` stream (workers that still
    /// watch see the driver go away), fails waiting calls, stops accepting connections, and
    /// cuts the server off if in-flight calls have not finished within a few seconds.
    /// Idempotent.
    pub fn shutdown(&self) {
        self.state.begin_shutdown();
        let server = self
            .server
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let (Some(mut server), Ok(runtime)) = (server, kolo_runtime::handle()) {
            let addr = self.addr;
            runtime.spawn(async move {
                if tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await.is_err() {
                    log::warn!("the job driver at {addr} did not stop within {SHUTDOWN_GRACE:?}; cutting it off");
                    server.abort();
                }
            });
            log::info!("job driver at {} shutting down", self.addr);
        }
    }
}

impl Drop for DriverService {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Times out every registration round (the first, and each one opened by workers that call
/// `init()` again after `shutdown()`) that is still waiting at its start deadline.
async fn start_deadline(state: Arc<JobState>) {
    let mut stop = state.subscribe_shutdown();
    let mut rounds = state.subscribe_rounds();
    loop {
        rounds.borrow_and_update();
        let (generation, deadline, waiting) = state.round_deadline();
        let expired = async {
            if waiting {
                tokio::time::sleep_until(deadline).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = expired => state.on_start_deadline(generation),
            changed = rounds.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = stop.wait_for(|down| *down) => return,
        }
    }
}

async fn heartbeat_watchdog(state: Arc<JobState>) {
    let period =
        (state.heartbeat_timeout() / 4).clamp(Duration::from_millis(10), MAX_CHECK_INTERVAL);
    let mut stop = state.subscribe_shutdown();
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                state.check_heartbeats();
                state.check_elastic_timeout();
                state.check_joining();
            }
            _ = stop.wait_for(|down| *down) => return,
        }
    }
}
