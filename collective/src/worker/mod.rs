//! Joining a job as one rank: register with the job driver, then connect the data-plane mesh.
//! The Python binding's `init()` calls [`Worker::join_from_env`]; Spark and Ray workers join
//! the same way.
//!
//! [`session`] is the worker's side of a Spark or Ray launch ([`WorkerSession`]: early
//! registration, payload, result, failure report), the counterpart of
//! [`crate::control::launch`].

pub mod session;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::abort::AbortSignal;
use crate::communicator::{Communicator, RankInfo};
use crate::control::client::{DriverClient, Registration};
use crate::control::env::{parse_seconds, WorkerEnv};
use crate::control::{data_plane_ip, join_job, silence};
use crate::engine::{Engine, EngineConfig};
use crate::error::{Error, Result};
use crate::transport::{
    ConnectMode, DataListener, Mesh, MeshConfig, SilenceProbe, TransportChoice,
};
pub use session::{rank_env, WorkerSession};

/// Environment variable: how long a collective may wait without progress before it fails.
pub const COLLECTIVE_TIMEOUT: &str = "KOLO_COLLECTIVE_TIMEOUT_SECONDS";
/// Default of [`COLLECTIVE_TIMEOUT`]: 30 minutes (long evaluation steps on one rank are fine).
pub const DEFAULT_COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(1800);
/// How many registration rounds [`Worker::join`] tries in an elastic job whose membership keeps
/// changing while the peers connect, before it returns the `MembershipChanged` error.
pub const MAX_ELASTIC_JOIN_ATTEMPTS: usize = 5;

/// A registration made before `init()`, waiting to be adopted by it (see [`register_early`]).
#[derive(Debug)]
struct EarlyJoin {
    env: WorkerEnv,
    listener: DataListener,
    registration: Registration,
    driver: DriverClient,
    abort: AbortSignal,
}

impl EarlyJoin {
    /// True when `env` (what `init()` reads) describes this registration: the same job and
    /// task. The early registration put the hostname it registered under into the process
    /// environment (`HOROVOD_HOSTNAME`, [`session::rank_env`]), so that name counts as the
    /// unset one it was read as.
    fn is_for(&self, env: &WorkerEnv) -> bool {
        if self.env == *env {
            return true;
        }
        let registered = self
            .registration
            .peers
            .get(self.registration.rank as usize)
            .map(|me| me.hostname.clone());
        self.env.hostname.is_none()
            && env.hostname == registered
            && WorkerEnv {
                hostname: None,
                ..env.clone()
            } == self.env
    }
}

static EARLY: Mutex<Option<EarlyJoin>> = Mutex::new(None);

fn take_early(env: &WorkerEnv) -> Option<EarlyJoin> {
    let mut slot = EARLY.lock().unwrap_or_else(PoisonError::into_inner);
    match slot.take() {
        Some(early) if early.is_for(env) => Some(early),
        other => {
            *slot = other;
            None
        }
    }
}

/// Registers this process with the job named by `env` now, before `init()`: binds the
/// data-plane listener, joins (rank assignment, heartbeats, abort watcher) and keeps all of it
/// for the next [`Worker::join`] with the same `env` to adopt, so `init()` gets this very
/// assignment instead of registering again. Returns the assignment and a client for the
/// process's own driver calls (fetching its function, returning its result). Launchers whose
/// ranks need the rank environment before user code is loaded (the Spark child) call it at
/// start; a process whose code never calls `init()` calls [`leave_early`] at the end.
pub fn register_early(env: &WorkerEnv) -> Result<(Registration, DriverClient)> {
    // The round this registration joins includes the host changes heard of so far; those
    // heard of later (until `init()` adopts it) are news to it.
    crate::control::host_updates::mark_all_news_handled();
    let abort = AbortSignal::new();
    let listener = DataListener::bind(data_plane_ip(env)?)?;
    let (registration, driver) = join_job(env, listener.local_addr(), abort.clone())?;
    let early = EarlyJoin {
        env: env.clone(),
        listener,
        registration: registration.clone(),
        driver: driver.clone(),
        abort,
    };
    *EARLY.lock().unwrap_or_else(PoisonError::into_inner) = Some(early);
    Ok((registration, driver))
}

/// Leaves the job for a process whose early registration ([`register_early`]) was never
/// adopted by `init()`: stops its heartbeats and tells the driver the rank finished cleanly.
/// Returns false when there was nothing to leave (`init()` adopted it; its `shutdown()` leaves).
pub fn leave_early() -> Result<bool> {
    let early = EARLY.lock().unwrap_or_else(PoisonError::into_inner).take();
    let Some(early) = early else {
        return Ok(false);
    };
    kolo_runtime::block_on(early.driver.leave(early.registration.rank))??;
    Ok(true)
}

/// One rank of a job: its communicator, the engine that runs collectives on it, and, when
/// launched, its link to the job driver.
#[derive(Debug)]
pub struct Worker {
    comm: Arc<Communicator>,
    engine: Engine,
    driver: Option<DriverClient>,
    homogeneous: bool,
}

impl Worker {
    /// Joins the job described by the `KOLO_*` environment, or becomes a single rank when the
    /// process was not launched by kolo. Blocks until every rank joined (bounded by the start
    /// timeout); call it without holding the GIL.
    pub fn join_from_env() -> Result<Self> {
        let config = EngineConfig::from_env()?;
        match WorkerEnv::from_env()? {
            Some(env) => Self::join(&env, config),
            None => Self::single(config),
        }
    }

    /// A job of one rank, with no driver and no sockets.
    pub fn single(config: EngineConfig) -> Result<Self> {
        let comm = Arc::new(Communicator::single());
        Ok(Self {
            engine: Engine::start(Arc::clone(&comm), config)?,
            comm,
            driver: None,
            homogeneous: true,
        })
    }

    /// Registers with the driver named by `env`, connects to every peer and starts the engine.
    /// Adopts the registration [`register_early`] made for the same `env`, if any. In an
    /// elastic job, a membership change while the peers connect (a task failed meanwhile)
    /// joins the next round, up to [`MAX_ELASTIC_JOIN_ATTEMPTS`] times.
    pub fn join(env: &WorkerEnv, engine_config: EngineConfig) -> Result<Self> {
        let mut attempt = 1;
        loop {
            match Self::join_once(env, engine_config.clone()) {
                Err(Error::MembershipChanged(cause)) if attempt < MAX_ELASTIC_JOIN_ATTEMPTS => {
                    log::info!(
                        "the elastic job's membership changed while joining ({}); joining its \
                         next round",
                        cause.message
                    );
                    attempt += 1;
                }
                joined => return joined,
            }
        }
    }

    fn join_once(env: &WorkerEnv, engine_config: EngineConfig) -> Result<Self> {
        let (listener, registration, driver, abort) = match take_early(env) {
            Some(early) => {
                log::debug!(
                    "init() adopts the early registration as rank {}",
                    early.registration.rank
                );
                (
                    early.listener,
                    early.registration,
                    early.driver,
                    early.abort,
                )
            }
            None => {
                // A new round already includes the host changes heard of so far (not those
                // an adopted early registration heard of after its round: they stay news).
                crate::control::host_updates::mark_all_news_handled();
                let abort = AbortSignal::new();
                let listener = DataListener::bind(data_plane_ip(env)?)?;
                let (registration, driver) = join_job(env, listener.local_addr(), abort.clone())?;
                (listener, registration, driver, abort)
            }
        };
        let rank = registration.rank;
        let config = MeshConfig {
            job_id: registration.job_id.0,
            key: crate::transport::handshake::data_key(&env.secret),
            rank: rank as usize,
            round: registration.generation,
            peers: registration
                .peers
                .iter()
                .map(|peer| peer.data_addr)
                .collect(),
            connect_timeout: env.start_timeout,
            op_timeout: collective_timeout()?,
        };
        let key = config.key.clone();
        let hashes: Vec<String> = registration
            .peers
            .iter()
            .map(|peer| peer.host_hash.clone())
            .collect();
        let established = TransportChoice::from_env().and_then(|choice| {
            let mut mesh = match ConnectMode::from_env()? {
                ConnectMode::Eager => Mesh::establish(listener, config, abort.clone())?,
                ConnectMode::Lazy => Mesh::connect_lazily(listener, config, abort.clone())?,
            };
            mesh.setup_shm(&key, &hashes, choice)?;
            let asker = driver.clone();
            mesh.set_silence_probe(SilenceProbe::new(move || silence::ask(&asker, rank)));
            Ok(mesh)
        });
        let mesh = match established {
            Ok(mesh) => mesh,
            Err(err) => {
                if matches!(err, Error::MembershipChanged(_)) {
                    // Not this worker's failure: its round ended while it connected.
                    let _ = kolo_runtime::block_on(driver.leave(rank));
                } else {
                    let message = format!("could not connect to its peers: {err}");
                    let _ = kolo_runtime::block_on(driver.report_failure(rank, &message));
                    driver.stop_background();
                }
                return Err(err);
            }
        };
        let mut ranks_per_host: HashMap<&str, usize> = HashMap::new();
        for peer in &registration.peers {
            *ranks_per_host.entry(peer.host_hash.as_str()).or_default() += 1;
        }
        let mut counts = ranks_per_host.values();
        let first = counts.next().copied();
        let homogeneous = counts.all(|count| Some(*count) == first);
        let info = RankInfo {
            rank: rank as usize,
            size: registration.size as usize,
            local_rank: registration.local_rank as usize,
            local_size: registration.local_size as usize,
            cross_rank: registration.cross_rank as usize,
            cross_size: registration.cross_size as usize,
            hosts: registration
                .peers
                .iter()
                .map(|peer| peer.hostname.clone())
                .collect(),
        };
        let comm = Arc::new(Communicator::new(info, mesh, abort));
        let engine = match Engine::start(Arc::clone(&comm), engine_config) {
            Ok(engine) => engine,
            Err(err) => {
                driver.stop_background();
                return Err(err);
            }
        };
        Ok(Self {
            comm,
            engine,
            driver: Some(driver),
            homogeneous,
        })
    }

    /// Where this rank sits in the job.
    pub fn info(&self) -> &crate::communicator::RankInfo {
        self.comm.info()
    }

    /// The engine that runs this rank's collectives.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Elastic jobs: takes the host updates (Horovod's `HostsUpdated(timestamp, result)`) the
    /// driver sent this worker since the last call, oldest first; empty for a single rank.
    pub fn take_host_updates(&self) -> Vec<crate::control::HostUpdate> {
        self.driver
            .as_ref()
            .map(DriverClient::take_host_updates)
            .unwrap_or_default()
    }

    /// True when every host runs the same number of ranks.
    pub fn is_homogeneous(&self) -> bool {
        self.homogeneous
    }

    /// Leaves the job: tells the driver this rank is done (so its silence is not a failure),
    /// stops the heartbeats and closes the peer connections.
    pub fn shutdown(&self) {
        self.engine.shutdown();
        if let Some(driver) = &self.driver {
            let rank = self.comm.info().rank as u32;
            let left = kolo_runtime::block_on(driver.leave(rank));
            if let Err(err) = left.map_err(Error::from).and_then(|left| left) {
                log::warn!("rank {rank} could not tell the job driver it left: {err}");
            }
        }
        self.comm.shutdown();
    }
}

fn collective_timeout() -> Result<Duration> {
    match std::env::var(COLLECTIVE_TIMEOUT) {
        Ok(text) => parse_seconds(COLLECTIVE_TIMEOUT, &text),
        Err(_) => Ok(DEFAULT_COLLECTIVE_TIMEOUT),
    }
}
