//! [`DriverClient`]: the worker side of the driver service — connect, register, share small
//! values, report failures, and keep a heartbeat and an abort watcher running in the
//! background.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use prost::Message;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};

use crate::abort::{AbortCause, AbortSignal};
use crate::control::env::{DRIVER_ADDR, JOB_SECRET};
use crate::control::handlers::{KIND_HOSTS_UPDATED, KIND_RESET};
use crate::control::handshake::{control_key, prove_to_driver, DriverNotProven};
use crate::control::host_updates::{record_news, HostUpdate, HostUpdateQueue, MAX_HOST_UPDATES};
use crate::control::ids::{JobId, JobSecret};
use crate::control::mac::MacKey;
use crate::control::proto::driver_client::DriverClient as RawClient;
use crate::control::proto::{
    AbortEvent, FailureReport, HeartbeatRequest, KvChunk, KvGetRequest, KvPutRequest, LeaveRequest,
    PeerList, PostRequest, RegisterReply, RegisterRequest, SilentRanksReply, SilentRanksRequest,
    TaskEvent, WatchAbortRequest,
};
use crate::control::runner_watch::RUNNER_RANK;
use crate::error::{Error, Result};

/// The bound on short calls (put, failure report, heartbeat, leave).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a rank's goodbye (`Leave`) waits: a tiny call that a live driver answers at once, so
/// a driver silent this long is gone or partitioned, and the rank exits without it.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(2);
/// Extra time a client allows on top of the server-side bound of a waiting call.
const CALL_SLACK: Duration = Duration::from_secs(15);
/// Pause between attempts to re-open a broken abort stream.
const RETRY_PAUSE: Duration = Duration::from_millis(250);

/// Client timing knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientOptions {
    /// How long [`DriverClient::connect`] keeps retrying an unreachable driver.
    pub connect_timeout: Duration,
    /// How often the background task sends a heartbeat.
    pub heartbeat_interval: Duration,
    /// How long the driver may stay unreachable before the worker aborts itself.
    pub lost_after: Duration,
}

impl Default for ClientOptions {
    /// Connect for up to 30 s; heartbeat every second; give up on the driver after 5 s.
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(1),
            lost_after: Duration::from_secs(5),
        }
    }
}

/// What a worker tells the driver about itself when it registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskInfo {
    /// Its task index (`KOLO_TASK_INDEX`).
    pub task_index: u32,
    /// Its host hash ([`crate::control::host_hash`]).
    pub host_hash: String,
    /// Its hostname, for messages.
    pub hostname: String,
    /// Where its data plane listens (a concrete address peers can reach).
    pub data_addr: SocketAddr,
    /// Its process id.
    pub pid: u32,
    /// The registration round: how many times this process joined the job before (0 at the
    /// first `init()`; one more for each `init()` after a `shutdown()`).
    pub generation: u32,
}

/// One peer in the job, as registration reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// Its rank.
    pub rank: u32,
    /// Its task index.
    pub task_index: u32,
    /// Its host hash.
    pub host_hash: String,
    /// Its hostname.
    pub hostname: String,
    /// Where its data plane listens.
    pub data_addr: SocketAddr,
}

/// A worker's assignment: its rank values, every peer in rank order, and the job id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// Global rank.
    pub rank: u32,
    /// Number of ranks.
    pub size: u32,
    /// Position among the ranks on this host.
    pub local_rank: u32,
    /// Number of ranks on this host.
    pub local_size: u32,
    /// Ordinal of this host among the hosts with this local rank.
    pub cross_rank: u32,
    /// Number of hosts with this local rank.
    pub cross_size: u32,
    /// Every rank (including this one), indexed by rank.
    pub peers: Vec<PeerInfo>,
    /// The job id.
    pub job_id: JobId,
    /// The registration round this assignment belongs to.
    pub generation: u32,
    /// The job is elastic (`size` follows the live tasks, not the launch's task count).
    pub elastic: bool,
}

impl Registration {
    fn from_reply(reply: RegisterReply, addr: &str) -> Result<Self> {
        let bad = |what: String| Error::Rendezvous(format!("the job driver at {addr} sent {what}"));
        let job_id = JobId::from_slice(&reply.job_id)
            .ok_or_else(|| bad(format!("a job id of {} bytes", reply.job_id.len())))?;
        let list = PeerList::decode(reply.peer_list)
            .map_err(|err| bad(format!("a peer list that does not decode ({err})")))?;
        let peers = list
            .peers
            .into_iter()
            .map(|peer| {
                let data_addr = peer.data_addr.parse().map_err(|_| {
                    bad(format!(
                        "an invalid data address {:?} for rank {}",
                        peer.data_addr, peer.rank
                    ))
                })?;
                Ok(PeerInfo {
                    rank: peer.rank,
                    task_index: peer.task_index,
                    host_hash: peer.host_hash,
                    hostname: peer.hostname,
                    data_addr,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let in_rank_order = peers.iter().enumerate().all(|(i, p)| p.rank as usize == i);
        if peers.len() != reply.size as usize || !in_rank_order || reply.rank >= reply.size {
            return Err(bad(format!(
                "an inconsistent peer list ({} peers for size {})",
                peers.len(),
                reply.size
            )));
        }
        Ok(Self {
            rank: reply.rank,
            size: reply.size,
            local_rank: reply.local_rank,
            local_size: reply.local_size,
            cross_rank: reply.cross_rank,
            cross_size: reply.cross_size,
            peers,
            job_id,
            generation: reply.generation,
            elastic: reply.elastic,
        })
    }
}

type Raw = RawClient<Channel>;

/// A connection to the job driver; every connection proves the job secret (without sending
/// it) and checks the driver's proof before any call. Cheap to clone (clones
/// share the connection and the background tasks' stop switch).
#[derive(Debug, Clone)]
pub struct DriverClient {
    addr: String,
    raw: Raw,
    options: ClientOptions,
    stop: Arc<watch::Sender<bool>>,
    /// `(task index, round)` of the latest registration through this client: heartbeats,
    /// leave and the watch carry it, so an elastic driver can tell rounds apart.
    joined: Arc<Mutex<Option<(u32, u32)>>>,
    /// Elastic jobs: host updates the watch stream delivered, until taken.
    host_updates: Arc<Mutex<HostUpdateQueue>>,
}

impl DriverClient {
    /// Connects to the driver at `addr` (`host:port`), retrying until
    /// `options.connect_timeout`; a `Rendezvous` error names the address when it stays
    /// unreachable. Must run on the global runtime (e.g. inside [`kolo_runtime::block_on`]).
    pub async fn connect(addr: &str, secret: &JobSecret, options: ClientOptions) -> Result<Self> {
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|err| {
                Error::Config(format!(
                    "{DRIVER_ADDR}={addr:?} is not a usable address: {err}"
                ))
            })?
            .connect_timeout(options.connect_timeout.min(Duration::from_secs(5)))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(10))
            .keep_alive_while_idle(true);
        let deadline = Instant::now() + options.connect_timeout;
        let mut pause = Duration::from_millis(50);
        let connector = ProvingConnector::new(addr, control_key(secret));
        let channel = loop {
            match endpoint.connect_with_connector(connector.clone()).await {
                Ok(channel) => break channel,
                Err(err) if is_unproven_driver(&err) => {
                    return Err(Error::Rendezvous(format!(
                        "the process at {addr} could not prove it knows this job's secret, so this \
                         worker sent it nothing: it is not this job's driver (another job's, or an \
                         impostor), or {JOB_SECRET} in this process belongs to another job"
                    )));
                }
                Err(err) if Instant::now() + pause >= deadline => {
                    return Err(Error::Rendezvous(format!(
                        "could not reach the job driver at {addr} within {:?}: {}. Check that the \
                         launcher (kolorun, or the Spark/Ray driver) is still running and that \
                         this host can reach {addr} (firewall; kolorun --network-interface)",
                        options.connect_timeout,
                        error_chain(&err)
                    )));
                }
                Err(err) => log::debug!(
                    "job driver at {addr} not reachable yet: {}",
                    error_chain(&err)
                ),
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        };
        let raw = RawClient::new(channel);
        Ok(Self {
            addr: addr.to_owned(),
            raw,
            options,
            stop: Arc::new(watch::channel(false).0),
            joined: Arc::default(),
            host_updates: Arc::default(),
        })
    }

    /// The driver's address as given to [`DriverClient::connect`].
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Registers `task` and waits (up to `start_timeout` plus slack) until every task has
    /// registered for round `task.generation`; returns this worker's assignment. Errors are
    /// `Rendezvous` with the driver's explanation (wrong secret, start timeout naming the
    /// missing tasks, duplicate index, a round the job is not in).
    ///
    /// A call that the network loses (its connection reset or closed, the reconnection's
    /// handshake timed out: a driver under heavy load) is sent again after a bounded, jittered
    /// exponential pause ([`RegisterRetry`]) until the same overall deadline; every attempt
    /// carries the same registration id, so the driver counts the task once (see
    /// [`crate::control::proto::RegisterRequest::registration_id`]). What the driver itself
    /// answers (a refusal, its start timeout) is not retried.
    pub async fn register(&self, task: &TaskInfo, start_timeout: Duration) -> Result<Registration> {
        let request = RegisterRequest {
            task_index: task.task_index,
            host_hash: task.host_hash.clone(),
            hostname: task.hostname.clone(),
            data_addr: task.data_addr.to_string(),
            pid: task.pid,
            generation: task.generation,
            registration_id: rand::random::<u64>().max(1),
        };
        let bound = start_timeout + CALL_SLACK;
        let deadline = Instant::now() + bound;
        let mut retry = RegisterRetry::default();
        let reply = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let attempt = self
                .call_raw(
                    left,
                    self.raw.clone().register(timed(request.clone(), left)),
                )
                .await;
            match attempt {
                Ok(reply) => break reply,
                Err(CallError::Status(status)) if is_lost_in_transit(&status) => {
                    let pause = retry.next_pause();
                    if Instant::now() + pause >= deadline {
                        return Err(self.map_call_error(
                            CallError::Status(status),
                            "registering",
                            bound,
                        ));
                    }
                    log::info!(
                        "task {}: registration attempt {} with the job driver at {} was lost \
                         ({}: {}); retrying in {pause:?}",
                        task.task_index,
                        retry.attempts,
                        self.addr,
                        status.code(),
                        status.message()
                    );
                    tokio::time::sleep(pause).await;
                }
                Err(err) => return Err(self.map_call_error(err, "registering", bound)),
            }
        };
        let registration = Registration::from_reply(reply, &self.addr)?;
        *lock(&self.joined) = Some((task.task_index, registration.generation));
        Ok(registration)
    }

    /// Elastic jobs: takes the host updates (Horovod's `HostsUpdated` notifications) the driver
    /// sent this worker since the last call, oldest first (bounded: see
    /// [`crate::control::host_updates::MAX_HOST_UPDATES`]).
    pub fn take_host_updates(&self) -> Vec<HostUpdate> {
        lock(&self.host_updates).drain()
    }

    fn identity(&self) -> (Option<u32>, u32) {
        match *lock(&self.joined) {
            Some((task, generation)) => (Some(task), generation),
            None => (None, 0),
        }
    }

    /// Stores `value` under `key` in the job's key-value space.
    pub async fn kv_put(&self, key: &str, value: Vec<u8>) -> Result<()> {
        let request = KvPutRequest {
            key: key.to_owned(),
            value,
        };
        self.call(
            CALL_TIMEOUT,
            "storing a key",
            self.raw.clone().kv_put(timed(request, CALL_TIMEOUT)),
        )
        .await?;
        Ok(())
    }

    /// The value of `key`, waiting up to `timeout` for someone to put it (the driver bounds
    /// the wait at 10 minutes); `Error::Timeout` when it stays unset.
    pub async fn kv_get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let request = KvGetRequest {
            key: key.to_owned(),
            timeout_ms,
        };
        let bound = timeout.min(crate::control::driver_state::MAX_KV_WAIT) + CALL_SLACK;
        match self
            .call_raw(bound, self.raw.clone().kv_get(timed(request, bound)))
            .await
        {
            Ok(reply) => Ok(reply.value),
            Err(CallError::Status(status)) if status.code() == Code::NotFound => {
                Err(Error::Timeout {
                    what: format!("waiting for key {key:?} in the job driver's key-value store"),
                    after: timeout,
                })
            }
            Err(err) => Err(self.map_call_error(err, "reading a key", bound)),
        }
    }

    /// Reports that `rank` failed with `message`; the driver aborts the job with it.
    pub async fn report_failure(&self, rank: u32, message: &str) -> Result<()> {
        self.send_failure(FailureReport {
            rank,
            message: message.to_owned(),
            task_index: None,
        })
        .await
    }

    /// Reports that task `task_index` failed (for a launcher's task side that does not know the
    /// rank); the driver names the task's rank and host and aborts the job.
    pub async fn report_task_failure(&self, task_index: u32, message: &str) -> Result<()> {
        self.send_failure(FailureReport {
            rank: 0,
            message: message.to_owned(),
            task_index: Some(task_index),
        })
        .await
    }

    /// Sends driver-bound events of task `task_index` (delivered in order); answers whether the
    /// job is aborted.
    pub async fn post(&self, task_index: u32, events: Vec<TaskEvent>) -> Result<bool> {
        let request = PostRequest { task_index, events };
        let reply = self
            .call(
                CALL_TIMEOUT,
                "sending events",
                self.raw.clone().post(timed(request, CALL_TIMEOUT)),
            )
            .await?;
        Ok(reply.aborted)
    }

    /// Stores `value` (any size: it travels in 1 MiB chunks) under `key`, allowing `timeout`.
    pub async fn kv_put_stream(&self, key: &str, value: &[u8], timeout: Duration) -> Result<()> {
        let mut chunks: Vec<KvChunk> = value
            .chunks(crate::control::handlers::KV_CHUNK)
            .map(|piece| KvChunk {
                key: String::new(),
                data: piece.to_vec(),
            })
            .collect();
        if chunks.is_empty() {
            chunks.push(KvChunk::default());
        }
        chunks[0].key = key.to_owned();
        let stream = tokio_stream::iter(chunks);
        self.call(
            timeout,
            "storing a value",
            self.raw.clone().kv_put_stream(timed(stream, timeout)),
        )
        .await?;
        Ok(())
    }

    /// The value of `key` (any size), waiting up to `timeout` for someone to put it and for it
    /// to arrive; `Error::Timeout` when it stays unset.
    pub async fn kv_get_stream(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let request = KvGetRequest {
            key: key.to_owned(),
            timeout_ms,
        };
        let bound = timeout.min(crate::control::driver_state::MAX_KV_WAIT) + CALL_SLACK;
        let received = tokio::time::timeout(bound, async {
            let mut stream = self
                .raw
                .clone()
                .kv_get_stream(timed(request, bound))
                .await?
                .into_inner();
            let mut value = Vec::new();
            while let Some(chunk) = stream.message().await? {
                value.extend_from_slice(&chunk.data);
            }
            Ok::<_, Status>(value)
        })
        .await;
        match received {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(status)) if status.code() == Code::NotFound => Err(Error::Timeout {
                what: format!("waiting for key {key:?} in the job driver's key-value store"),
                after: timeout,
            }),
            Ok(Err(status)) => {
                Err(self.map_call_error(CallError::Status(status), "reading a value", bound))
            }
            Err(_) => Err(self.map_call_error(CallError::NoAnswer, "reading a value", bound)),
        }
    }

    async fn send_failure(&self, request: FailureReport) -> Result<()> {
        self.call(
            CALL_TIMEOUT,
            "reporting a failure",
            self.raw
                .clone()
                .report_failure(timed(request, CALL_TIMEOUT)),
        )
        .await?;
        Ok(())
    }

    /// Asks which ranks the driver has not heard a heartbeat from for `silent_for` (the most
    /// silent first, at most 16, with the total count); `rank` is the asking rank. The call
    /// gives up after `bound`.
    pub async fn silent_ranks(
        &self,
        rank: u32,
        silent_for: Duration,
        bound: Duration,
    ) -> Result<SilentRanksReply> {
        let request = SilentRanksRequest {
            rank,
            silent_for_ms: u64::try_from(silent_for.as_millis()).unwrap_or(u64::MAX),
        };
        self.call(
            bound,
            "asking which ranks went silent",
            self.raw.clone().silent_ranks(timed(request, bound)),
        )
        .await
    }

    /// How often this client's background task sends a heartbeat.
    pub fn heartbeat_interval(&self) -> Duration {
        self.options.heartbeat_interval
    }

    /// Stops the background tasks and tells the driver that `rank` finished cleanly (so its
    /// silence is not a failure). Call at shutdown.
    pub async fn leave(&self, rank: u32) -> Result<()> {
        self.stop_background();
        let (task_index, generation) = self.identity();
        let request = LeaveRequest {
            rank,
            task_index,
            generation,
        };
        self.call(
            LEAVE_TIMEOUT,
            "leaving the job",
            self.raw.clone().leave(timed(request, LEAVE_TIMEOUT)),
        )
        .await?;
        Ok(())
    }

    /// Spawns, on the global runtime, the heartbeat loop and the abort watcher for `rank`:
    /// an abort broadcast sets `abort` with the driver's cause; a driver that stays unreachable
    /// for `lost_after` (or whose abort stream ends) sets it with "lost connection to the job
    /// driver at ADDR". Both stop at [`DriverClient::stop_background`] / [`DriverClient::leave`]
    /// or once `abort` is set.
    pub fn start_background(&self, rank: u32, abort: AbortSignal) -> Result<()> {
        let runtime = kolo_runtime::handle()?;
        runtime.spawn(heartbeat_loop(self.clone(), rank, abort.clone()));
        runtime.spawn(abort_watcher(self.clone(), rank, None, abort));
        Ok(())
    }

    /// Spawns only the abort watcher (no heartbeats): for a launcher's task side that is not
    /// itself a rank (the Spark task runner) but must stop its child when the job is aborted
    /// or the driver goes away. Stops at [`DriverClient::stop_background`].
    pub fn start_abort_watcher(&self, abort: AbortSignal) -> Result<()> {
        kolo_runtime::handle()?.spawn(abort_watcher(self.clone(), RUNNER_RANK, None, abort));
        Ok(())
    }

    /// [`DriverClient::start_abort_watcher`] for the runner of task `task_index`, which
    /// supervises that task's rank process: the driver also takes the watch's end, unless the
    /// runner posted the rank's exit before, as the loss of the task (see
    /// [`crate::control::runner_watch`]), so the runner must post the exit first and keep the
    /// watch open while its rank process runs (after an abort too: the watch stays open until
    /// [`DriverClient::stop_background`]).
    pub fn start_task_watcher(&self, task_index: u32, abort: AbortSignal) -> Result<()> {
        kolo_runtime::handle()?.spawn(abort_watcher(
            self.clone(),
            RUNNER_RANK,
            Some(task_index),
            abort,
        ));
        Ok(())
    }

    /// Stops the background tasks (idempotent).
    pub fn stop_background(&self) {
        self.stop.send_replace(true);
    }

    async fn call<T>(
        &self,
        bound: Duration,
        during: &str,
        call: impl std::future::Future<Output = std::result::Result<tonic::Response<T>, Status>>,
    ) -> Result<T> {
        self.call_raw(bound, call)
            .await
            .map_err(|err| self.map_call_error(err, during, bound))
    }

    async fn call_raw<T>(
        &self,
        bound: Duration,
        call: impl std::future::Future<Output = std::result::Result<tonic::Response<T>, Status>>,
    ) -> std::result::Result<T, CallError> {
        match tokio::time::timeout(bound, call).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(CallError::Status(status)),
            Err(_) => Err(CallError::NoAnswer),
        }
    }

    fn map_call_error(&self, err: CallError, during: &str, bound: Duration) -> Error {
        let addr = &self.addr;
        let status = match err {
            CallError::NoAnswer => {
                return Error::Timeout {
                    what: format!("{during} with the job driver at {addr}"),
                    after: bound,
                }
            }
            CallError::Status(status) => status,
        };
        match status.code() {
            Code::DeadlineExceeded
            | Code::Aborted
            | Code::FailedPrecondition
            | Code::InvalidArgument
            | Code::ResourceExhausted => Error::Rendezvous(status.message().to_owned()),
            Code::Unavailable => Error::Rendezvous(format!(
                "the job driver at {addr} is unavailable while {during}: {}",
                status.message()
            )),
            _ => Error::Status(status),
        }
    }
}

/// The pauses between attempts of a registration lost in transit: exponential from
/// [`RegisterRetry::FIRST`] up to [`RegisterRetry::LONGEST`], each drawn uniformly from its
/// upper half so that a thousand workers that lost their calls at once do not all come back
/// at the same instant.
#[derive(Debug, Default)]
pub struct RegisterRetry {
    /// Attempts that failed so far.
    pub attempts: u32,
}

impl RegisterRetry {
    /// The first pause's upper bound.
    pub const FIRST: Duration = Duration::from_millis(100);
    /// The longest pause.
    pub const LONGEST: Duration = Duration::from_secs(2);

    /// The pause before the next attempt (counts the failed one).
    pub fn next_pause(&mut self) -> Duration {
        let ceiling = Self::FIRST
            .saturating_mul(1 << self.attempts.min(16))
            .min(Self::LONGEST);
        self.attempts += 1;
        let ceiling_us = u64::try_from(ceiling.as_micros()).unwrap_or(u64::MAX);
        Duration::from_micros(rand::random_range(ceiling_us / 2..=ceiling_us))
    }
}

/// True when `status` is the client's own report that a call was lost on the way (the
/// connection broke, or could not be re-established in time) rather than an answer from the
/// driver: tonic makes those from a transport error, which it keeps as the status's source;
/// a status the driver sent has none.
fn is_lost_in_transit(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::Cancelled | Code::Unknown
    ) && std::error::Error::source(status).is_some()
}

enum CallError {
    Status(Status),
    NoAnswer,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn timed<T>(message: T, bound: Duration) -> Request<T> {
    let mut request = Request::new(message);
    request.set_timeout(bound);
    request
}

fn lost_connection(addr: &str, reason: &str) -> AbortCause {
    AbortCause {
        rank: None,
        host: String::new(),
        message: format!("lost connection to the job driver at {addr}: {reason}"),
    }
}

fn cause_from(event: AbortEvent) -> AbortCause {
    AbortCause {
        rank: event.rank,
        host: event.host,
        message: event.message,
    }
}

/// Dials the driver over TCP and runs the mutual handshake ([`prove_to_driver`]) before tonic
/// speaks HTTP/2 on the connection; used for the first connection and every reconnection.
#[derive(Clone)]
struct ProvingConnector {
    addr: Arc<str>,
    key: Arc<MacKey>,
}

impl ProvingConnector {
    fn new(addr: &str, key: MacKey) -> Self {
        Self {
            addr: addr.into(),
            key: Arc::new(key),
        }
    }
}

impl tower_service::Service<tonic::transport::Uri> for ProvingConnector {
    type Response = hyper_util::rt::TokioIo<tokio::net::TcpStream>;
    type Error = std::io::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = std::io::Result<Self::Response>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: tonic::transport::Uri) -> Self::Future {
        let (addr, key) = (Arc::clone(&self.addr), Arc::clone(&self.key));
        Box::pin(async move {
            let mut stream = tokio::net::TcpStream::connect(&*addr).await?;
            stream.set_nodelay(true)?;
            prove_to_driver(&mut stream, &key).await?;
            Ok(hyper_util::rt::TokioIo::new(stream))
        })
    }
}

/// True when `err` (from connecting) says the driver could not prove the key.
fn is_unproven_driver(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(err);
    while let Some(err) = source {
        if err.is::<DriverNotProven>() {
            return true;
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io
                .get_ref()
                .is_some_and(|inner| inner.is::<DriverNotProven>())
            {
                return true;
            }
        }
        source = err.source();
    }
    false
}

/// An error with its sources, for messages (`transport error: ...: connection refused`).
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

async fn heartbeat_loop(client: DriverClient, rank: u32, abort: AbortSignal) {
    let mut stop = client.stop.subscribe();
    let interval = client.options.heartbeat_interval;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing_since: Option<Instant> = None;
    let (task_index, generation) = client.identity();
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
        if abort.is_aborted() {
            return;
        }
        let bound = (interval * 2).max(Duration::from_secs(2));
        let sent = client
            .call_raw(
                bound,
                client.raw.clone().heartbeat(timed(
                    HeartbeatRequest {
                        rank,
                        task_index,
                        generation,
                    },
                    bound,
                )),
            )
            .await;
        if *stop.borrow() {
            return;
        }
        let reason = match sent {
            Ok(_) => {
                failing_since = None;
                continue;
            }
            Err(CallError::Status(status)) => format!("heartbeats fail: {}", status.message()),
            Err(CallError::NoAnswer) => "heartbeats get no answer".to_owned(),
        };
        let since = *failing_since.get_or_insert_with(Instant::now);
        log::debug!("rank {rank}: {reason}");
        if since.elapsed() >= client.options.lost_after {
            abort.abort(lost_connection(
                &client.addr,
                &format!("{reason} (for {:?})", client.options.lost_after),
            ));
            return;
        }
    }
}

async fn abort_watcher(
    client: DriverClient,
    rank: u32,
    runner_task: Option<u32>,
    abort: AbortSignal,
) {
    let mut stop = client.stop.subscribe();
    let mut failing_since: Option<Instant> = None;
    let (task_index, generation) = if rank == RUNNER_RANK {
        (runner_task, 0)
    } else {
        client.identity()
    };
    let request = WatchAbortRequest {
        rank,
        task_index,
        generation,
    };
    loop {
        let mut raw = client.raw.clone();
        let opened = tokio::select! {
            opened = client.call_raw(CALL_TIMEOUT, raw.watch_abort(request)) => opened,
            _ = stop.wait_for(|stopped| *stopped) => return,
        };
        let reason = match opened {
            Ok(mut stream) => {
                failing_since = None;
                let broke = loop {
                    let next = tokio::select! {
                        next = stream.message() => next,
                        _ = stop.wait_for(|stopped| *stopped) => return,
                    };
                    match next {
                        Ok(Some(event)) if event.kind == KIND_HOSTS_UPDATED => {
                            let mut queue = lock(&client.host_updates);
                            for update in event.host_updates.iter().take(MAX_HOST_UPDATES) {
                                let update = HostUpdate {
                                    timestamp: update.timestamp,
                                    result: update.result,
                                };
                                record_news(update);
                                queue.push(update);
                            }
                        }
                        Ok(Some(event)) if event.kind == KIND_RESET => {
                            let cause = cause_from(event);
                            log::info!(
                                "rank {rank}: the elastic job's membership changed ({}); this \
                                 round is over",
                                cause.message
                            );
                            abort.interrupt(cause);
                            return;
                        }
                        Ok(Some(event)) => {
                            let cause = cause_from(event);
                            log::warn!("rank {rank}: the job driver broadcast an abort: {cause}");
                            abort.abort(cause);
                            if runner_task.is_some() {
                                // A task runner holds its watch until it posted its rank's exit
                                // and stops: the driver takes the watch's end before that as
                                // the task's loss (its executor died).
                                let _ = stop.wait_for(|stopped| *stopped).await;
                            }
                            return;
                        }
                        Ok(None) => {
                            abort.abort(lost_connection(&client.addr, "the driver shut down"));
                            return;
                        }
                        Err(status) => {
                            break format!("the abort stream broke: {}", status.message())
                        }
                    }
                };
                broke
            }
            Err(CallError::Status(status)) => {
                format!("cannot watch for aborts: {}", status.message())
            }
            Err(CallError::NoAnswer) => "no answer to the abort watch".to_owned(),
        };
        if abort.is_aborted() {
            return;
        }
        let since = *failing_since.get_or_insert_with(Instant::now);
        log::debug!("rank {rank}: {reason}");
        if since.elapsed() >= client.options.lost_after {
            abort.abort(lost_connection(&client.addr, &reason));
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(RETRY_PAUSE) => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pauses grow from 50–100 ms to at most 2 s and are jittered (a thousand workers that
    /// lost their calls together must not come back together).
    #[test]
    fn register_retry_pauses_are_bounded_exponential_and_jittered() {
        let mut retry = RegisterRetry::default();
        let pauses: Vec<Duration> = (0..10).map(|_| retry.next_pause()).collect();
        assert!(pauses[0] >= Duration::from_millis(50) && pauses[0] <= Duration::from_millis(100));
        assert!(pauses[3] >= Duration::from_millis(400) && pauses[3] <= Duration::from_millis(800));
        assert!(pauses.iter().all(|p| *p <= RegisterRetry::LONGEST));
        assert!(pauses[9] >= RegisterRetry::LONGEST / 2);
        assert_eq!(retry.attempts, 10);
        let firsts: std::collections::HashSet<Duration> = (0..32)
            .map(|_| RegisterRetry::default().next_pause())
            .collect();
        assert!(firsts.len() > 8, "no jitter: {firsts:?}");
    }
}
