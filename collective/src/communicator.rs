//! What a rank holds after joining a job, and the API the Python binding calls.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::abort::AbortSignal;
use crate::collectives::{self, AlgorithmChoices, Session};
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};
use crate::transport::{ConnectionCounts, ConnectionStats, Mesh, WakeSignal, Watch};

/// Where this rank sits in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankInfo {
    /// This rank, `0..size`.
    pub rank: usize,
    /// The number of ranks.
    pub size: usize,
    /// Position among the ranks on this host.
    pub local_rank: usize,
    /// Ranks on this host.
    pub local_size: usize,
    /// Ordinal of this host among the hosts that have a rank with this `local_rank`.
    pub cross_rank: usize,
    /// Hosts that have a rank with this `local_rank`.
    pub cross_size: usize,
    /// Hostname of each rank, for error messages; may be empty.
    pub hosts: Vec<String>,
}

impl RankInfo {
    /// The one rank of a job without peers.
    pub fn single() -> Self {
        RankInfo {
            rank: 0,
            size: 1,
            local_rank: 0,
            local_size: 1,
            cross_rank: 0,
            cross_size: 1,
            hosts: Vec::new(),
        }
    }
}

#[derive(Debug)]
struct State {
    session: Session,
    /// Set once the communicator cannot be used: why.
    closed: Option<String>,
}

/// Runs collectives for one rank. `Send + Sync`: operations take `&self` and run one at a
/// time (a second caller waits for the first to finish).
///
/// Every operation checks its arguments (wrong buffer sizes and the like fail with
/// [`Error::InvalidArgument`]), agrees with the other ranks on what runs
/// ([`Error::Mismatch`] on every rank if they disagree), then moves the data. After a failure
/// of the data plane (a peer died, a timeout, an abort) the communicator is unusable and later
/// operations fail at once with [`Error::Closed`] or [`Error::Aborted`].
#[derive(Debug)]
pub struct Communicator {
    info: RankInfo,
    abort: AbortSignal,
    closing: Arc<AtomicBool>,
    state: Mutex<State>,
    /// What the engine waits on between cycles without taking `state`.
    watch: Option<Watch>,
    /// The mesh's connection counters (none for a single rank).
    connections: Option<Arc<ConnectionStats>>,
}

impl Communicator {
    /// A job of one rank: no sockets; collectives still validate and apply ops and scaling.
    pub fn single() -> Self {
        Communicator {
            info: RankInfo::single(),
            abort: AbortSignal::new(),
            closing: Arc::new(AtomicBool::new(false)),
            state: Mutex::new(State {
                session: Session::new(None, 0, 1),
                closed: None,
            }),
            watch: None,
            connections: None,
        }
    }

    /// A communicator over an established mesh. `info` must describe the mesh's rank and size;
    /// otherwise every operation fails with [`Error::Closed`] explaining the inconsistency.
    pub fn new(info: RankInfo, mut mesh: Mesh, abort: AbortSignal) -> Self {
        let closing = Arc::new(AtomicBool::new(false));
        let closed = if info.rank != mesh.rank() || info.size != mesh.size() {
            let message = format!(
                "the communicator's rank info says rank {} of {} but its data-plane mesh was built for rank {} of \
                 {}; this is a bug in the caller",
                info.rank,
                info.size,
                mesh.rank(),
                mesh.size()
            );
            log::error!("{message}");
            Some(message)
        } else {
            None
        };
        mesh.set_hosts(info.hosts.clone());
        mesh.set_closing_flag(Arc::clone(&closing));
        let watch = match mesh.watch() {
            Ok(watch) => Some(watch),
            Err(e) => {
                log::warn!("cannot watch the peers' connections between cycles: {e}");
                None
            }
        };
        let connections = Some(mesh.connection_stats());
        let session = Session::new(Some(mesh), info.rank, info.size);
        Communicator {
            info,
            abort,
            closing,
            state: Mutex::new(State { session, closed }),
            watch,
            connections,
        }
    }

    /// How many data-plane connections this rank made and holds: with connections on demand
    /// (`KOLO_CONNECT=lazy`), only those to the peers its collectives used so far.
    pub fn connections(&self) -> ConnectionCounts {
        self.connections
            .as_ref()
            .map(|stats| stats.counts())
            .unwrap_or_default()
    }

    /// Where this rank sits in the job.
    pub fn info(&self) -> &RankInfo {
        &self.info
    }

    /// Forces the TCP algorithm of allreduce, allgather and broadcast (`None` fields: chosen
    /// by size and rank count), replacing `KOLO_*_ALGORITHM`. Every rank must pass the same
    /// choices before its next collective.
    pub fn set_algorithms(&self, choices: AlgorithmChoices) {
        self.lock_even_if_poisoned().session.set_algorithms(choices);
    }

    /// How many times this rank ran each TCP algorithm (`("allreduce_ring", 3)`, ...,
    /// sorted by name); collectives on shared memory are not counted.
    pub fn algorithm_runs(&self) -> Vec<(String, u64)> {
        self.lock_even_if_poisoned().session.runs.snapshot()
    }

    /// The job's abort signal (shared with the driver client that sets it).
    pub fn abort_signal(&self) -> &AbortSignal {
        &self.abort
    }

    /// Reduces `buf` across all ranks, in place: `buf` holds this rank's input and receives
    /// the result. Every input is multiplied by `prescale` first and the result by
    /// `postscale` (and divided by the number of ranks for [`ReduceOp::Average`]).
    #[expect(
        clippy::too_many_arguments,
        reason = "mirrors Horovod's allreduce(tensor, name, op, prescale, postscale)"
    )]
    pub fn allreduce(
        &self,
        name: &str,
        buf: &mut [u8],
        shape: &[i64],
        dtype: DType,
        op: ReduceOp,
        prescale: f64,
        postscale: f64,
    ) -> Result<()> {
        let reduction = collectives::allreduce::Reduction {
            op,
            prescale,
            postscale,
        };
        self.run(|s| collectives::allreduce(s, name, buf, shape, dtype, reduction))
    }

    /// Concatenates every rank's `input` along the first dimension, in rank order. Ranks may
    /// differ in the first dimension; the others must agree. `alloc` is called once with the
    /// first-dimension size of every rank (indexed by rank) and returns the output buffer of
    /// `sum(rows) * row_bytes` bytes. Returns those first dimensions.
    pub fn allgather<'a>(
        &self,
        name: &str,
        input: &[u8],
        shape: &[i64],
        dtype: DType,
        alloc: impl FnOnce(&[u64]) -> Result<&'a mut [u8]>,
    ) -> Result<Vec<u64>> {
        self.run(|s| collectives::allgather(s, name, input, shape, dtype, alloc))
    }

    /// Copies `root`'s `buf` into every other rank's `buf`.
    pub fn broadcast(
        &self,
        name: &str,
        buf: &mut [u8],
        shape: &[i64],
        dtype: DType,
        root: usize,
    ) -> Result<()> {
        self.run(|s| collectives::broadcast(s, name, buf, shape, dtype, root))
    }

    /// Sends `splits[j]` rows of `input` (first dimension, in order) to rank j and receives
    /// rows from every rank. `alloc` gets the rows received from each rank (indexed by rank)
    /// and returns the output buffer for all of them, in rank order. Returns the received
    /// splits.
    pub fn alltoall<'a>(
        &self,
        name: &str,
        input: &[u8],
        shape: &[i64],
        dtype: DType,
        splits: &[u64],
        alloc: impl FnOnce(&[u64]) -> Result<&'a mut [u8]>,
    ) -> Result<Vec<u64>> {
        self.run(|s| collectives::alltoall(s, name, input, shape, dtype, splits, alloc))
    }

    /// Reduces `input` across all ranks and leaves this rank's part of the result in `output`.
    /// The first dimension is split across ranks the Horovod way: rank r gets `rows / size`
    /// rows, plus one if `r < rows % size` (see
    /// [`reducescatter_rows`](crate::collectives::reducescatter_rows)). Scaling as in
    /// [`allreduce`](Self::allreduce).
    #[expect(
        clippy::too_many_arguments,
        reason = "mirrors Horovod's reducescatter(tensor, name, op, prescale, postscale)"
    )]
    pub fn reducescatter(
        &self,
        name: &str,
        input: &[u8],
        output: &mut [u8],
        shape: &[i64],
        dtype: DType,
        op: ReduceOp,
        prescale: f64,
        postscale: f64,
    ) -> Result<()> {
        let reduction = collectives::allreduce::Reduction {
            op,
            prescale,
            postscale,
        };
        self.run(|s| collectives::reducescatter(s, name, input, output, shape, dtype, reduction))
    }

    /// Returns once every rank called `barrier`.
    pub fn barrier(&self) -> Result<()> {
        self.run(collectives::barrier)
    }

    /// Closes the data plane: peers waiting on this rank fail at once, and later operations
    /// here fail with [`Error::Closed`]. An operation running in another thread stops within
    /// a tick. Idempotent; dropping the communicator does the same.
    pub fn shutdown(&self) {
        self.closing.store(true, Ordering::Release);
        let mut state = self.lock_even_if_poisoned();
        if state.closed.is_none() {
            state.closed = Some(
                "the communicator was shut down (shutdown() was called or it was dropped); no more collectives can \
                 run on it"
                    .into(),
            );
        }
        if let Some(mut mesh) = state.session.mesh.take() {
            mesh.close(&format!(
                "rank {} shut down its communicator",
                self.info.rank
            ));
        }
    }

    /// Waits up to `timeout` until `wake` is readable or, with `peers`, another rank sent
    /// something; returns whether another rank did. Sleeping on the shared-memory counters,
    /// it looks at the peers' sockets every `socket_check`. Fails like an operation would when the
    /// communicator is closed, broken or the job aborted (the engine waits here between
    /// cycles, so it notices those while idle).
    pub(crate) fn wait_readable(
        &self,
        wake: &WakeSignal<'_>,
        peers: bool,
        timeout: std::time::Duration,
        socket_check: std::time::Duration,
    ) -> Result<bool> {
        // Fails like an operation would; the wait itself does not hold the lock, so a caller
        // may run a cycle meanwhile (`Engine::wait`).
        self.run(|_| Ok(()))?;
        let ready = match &self.watch {
            Some(watch) => watch.wait_readable(wake, peers, timeout, socket_check)?,
            None => {
                crate::transport::wait_readable(&[wake.fd], timeout)?;
                false
            }
        };
        Ok(ready)
    }

    fn lock_even_if_poisoned(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs one operation with the lock held, after checking that the communicator is usable.
    pub(crate) fn run<T>(&self, op: impl FnOnce(&mut Session) -> Result<T>) -> Result<T> {
        let mut state = self.state.lock().map_err(|_| {
            Error::Internal("an earlier collective on this communicator panicked".into())
        })?;
        if let Some(reason) = &state.closed {
            return Err(Error::Closed(reason.clone()));
        }
        if let Some(error) = self.abort.error() {
            if let Some(mesh) = state.session.mesh.as_mut() {
                let why = if self.abort.is_interrupted() {
                    "the job's membership changed"
                } else {
                    "the job was aborted"
                };
                mesh.break_links(&format!("rank {} stopped because {why}", self.info.rank));
                return Err(mesh.aborted_naming_silent());
            }
            return Err(error);
        }
        if let Some(broken) = state.session.mesh.as_ref().and_then(Mesh::broken) {
            return Err(Error::Closed(format!(
                "this communicator can no longer run collectives because an earlier one failed ({broken}); the job \
                 has to be restarted"
            )));
        }
        op(&mut state.session)
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        self.shutdown();
    }
}
