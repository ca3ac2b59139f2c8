//! The direct TCP data plane between ranks: at most one connection per pair of ranks, over
//! which the collectives run.
//!
//! Every rank binds a [`DataListener`] first and publishes its address (through the driver);
//! once every rank knows every address, the ranks connect (the higher rank of each pair
//! connects, the lower accepts) and check each connection with a keyed handshake
//! ([`handshake`]): both sides prove the job secret, and the connection must come from the
//! claimed rank's registered address. Connections that fail it are logged and dropped, the
//! listener keeps accepting (a bounded number of handshakes at a time, each with a deadline)
//! until the real peers arrived, and is closed once they have. [`Mesh::establish`] makes every
//! connection at once (`KOLO_CONNECT=eager`); [`Mesh::connect_lazily`] makes each when a
//! collective first needs it ([`lazy`], the default).
//!
//! All waits are bounded: sockets are non-blocking and every wait ticks at least every
//! 100 ms to check the job's [`AbortSignal`]; an operation that makes no progress for the
//! configured `op_timeout` fails with [`Error::Timeout`]. When a peer's connection breaks,
//! the mesh tells its other peers (a `Fail` frame), waits briefly for the driver's abort
//! broadcast to learn the root cause, and stays unusable afterwards so later collectives fail
//! fast instead of hanging.

pub mod handshake;
mod lazy;
mod plane;
mod poll;
mod setup;
pub(crate) mod shm;
mod stream;

pub(crate) use lazy::ConnectionStats;
pub use lazy::{ConnectMode, ConnectionCounts, CONNECT};
pub(crate) use plane::{Hosts, Layout, ShmPlane};
pub use plane::{TransportChoice, TRANSPORT};
pub(crate) use poll::wait_readable;
pub(crate) use stream::{Buffers, RecvBlock, SendBlock, StreamPlan, CHUNK};

use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::abort::AbortSignal;
use crate::control::mac::MacKey;
use crate::control::silence;
use crate::error::{Error, Result};
use crate::wire::{self, FrameError, FrameKind, JobId};
use shm::ShmNode;
pub(crate) use shm::{futex_wake, wait_in_background};

/// How often blocking waits wake up to check the abort signal and shutdown.
pub(crate) const TICK: Duration = Duration::from_millis(100);
/// How long a rank that lost a peer waits for the driver's abort broadcast (the root cause)
/// before reporting the broken connection itself.
const ABORT_GRACE: Duration = Duration::from_secs(2);
/// How long closing the mesh reads what peers still send (so the close does not reset a
/// connection under a `Fail` frame in flight), at most.
const CLOSE_DRAIN: Duration = Duration::from_millis(200);
/// How many bytes closing the mesh reads from each peer, at most.
const CLOSE_DRAIN_BYTES: usize = 1 << 20;

/// A bound, not yet connected data-plane listener. Bind it before publishing the address.
#[derive(Debug)]
pub struct DataListener {
    listener: TcpListener,
    addr: SocketAddr,
}

impl DataListener {
    /// Binds a TCP listener on `ip` with a port chosen by the OS.
    pub fn bind(ip: IpAddr) -> Result<Self> {
        let listener = TcpListener::bind((ip, 0))?;
        let addr = listener.local_addr()?;
        Ok(DataListener { listener, addr })
    }

    /// The address peers connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Everything [`Mesh::establish`] and [`Mesh::connect_lazily`] need to know about the job.
#[derive(Debug, Clone)]
pub struct MeshConfig {
    /// The job id shared by all ranks (from the driver). Not a secret: it only tells jobs'
    /// frames apart.
    pub job_id: JobId,
    /// The data plane's key, derived from the job secret ([`handshake::data_key`]): every
    /// connection proves it both ways.
    pub key: MacKey,
    /// This rank.
    pub rank: usize,
    /// The registration round this mesh belongs to (the driver's generation: 0, then one more
    /// at every elastic reset or `init()` after `shutdown()`). Every handshake carries and
    /// proves it, so a connection from a rank of another round is refused.
    pub round: u32,
    /// The data address of every rank, indexed by rank (this rank's own included).
    pub peers: Vec<SocketAddr>,
    /// How long to keep connecting and accepting until every peer is connected (eager), or
    /// until a peer a collective needs is connected (lazy).
    pub connect_timeout: Duration,
    /// How long a collective may go without any progress before it fails.
    pub op_timeout: Duration,
}

/// One connection to a peer.
#[derive(Debug)]
struct Link {
    stream: TcpStream,
    addr: SocketAddr,
    /// True while a frame is partly written: no other frame (e.g. `Fail`) may follow.
    mid_frame: bool,
}

/// The data plane of one rank: a TCP connection to every other rank it talks to.
#[derive(Debug)]
pub struct Mesh {
    rank: usize,
    size: usize,
    check: [u8; 8],
    op_timeout: Duration,
    abort: AbortSignal,
    /// Indexed by peer rank; `None` at this rank's own index.
    links: Vec<Option<Link>>,
    /// Hostname of each rank, for error messages (may be empty).
    hosts: Vec<String>,
    /// Set by the communicator's shutdown; running waits give up at the next tick.
    closing: Arc<AtomicBool>,
    /// Why the mesh became unusable, once it did.
    broken: Option<String>,
    /// The shared-memory plane among this host's ranks, when collectives use it.
    shm: Option<ShmPlane>,
    /// Asked, when a collective fails, which ranks the job driver lost (launched jobs only).
    silence: Option<SilenceProbe>,
    /// Connections on demand; `None` when every connection was made at setup (eager).
    lazy: Option<Lazy>,
    /// How many connections this rank made and holds.
    stats: Arc<ConnectionStats>,
    /// A clone of every connection, for the engine to wait on between cycles ([`Watch`]).
    watched: Arc<Mutex<Vec<TcpStream>>>,
}

/// What a lazy mesh needs to make connections later.
#[derive(Debug)]
struct Lazy {
    config: MeshConfig,
    acceptor: lazy::Acceptor,
    /// Readable when the acceptor took a new connection (the read end; see [`Watch`]).
    arrivals: UnixStream,
}

/// Asks someone outside the data plane (the job driver, which hears every rank's heartbeats)
/// which ranks went silent; its sentence is added to a collective's timeout or lost-peer error,
/// so the error names the lost host even when the peer this rank waited on is only blocked
/// behind it. `None`: no answer (the error is raised without it).
#[derive(Clone)]
pub(crate) struct SilenceProbe(Arc<dyn Fn() -> Option<silence::Verdict> + Send + Sync>);

impl SilenceProbe {
    /// A probe that calls `ask` (which must bound its own wait).
    pub(crate) fn new(ask: impl Fn() -> Option<silence::Verdict> + Send + Sync + 'static) -> Self {
        SilenceProbe(Arc::new(ask))
    }
}

impl std::fmt::Debug for SilenceProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SilenceProbe")
    }
}

/// A mesh's peers as the engine watches them between cycles (see [`Mesh::watch`]): every
/// connection the mesh has (connections made later included) and, in a lazy mesh, the signal
/// that a peer just connected.
#[derive(Debug)]
pub(crate) struct Watch {
    streams: Arc<Mutex<Vec<TcpStream>>>,
    arrivals: Option<UnixStream>,
    /// False once `arrivals` read end-of-stream (see [`lazy::Drained::open`]).
    arrivals_open: AtomicBool,
    node: Option<Arc<ShmNode>>,
}

/// What wakes the engine thread between cycles: the read end of its wake-up socket, and a
/// futex word with the value it had when the engine last looked (see
/// `engine::wake::Wake::rearm`).
#[derive(Debug)]
pub(crate) struct WakeSignal<'a> {
    pub fd: RawFd,
    pub word: &'a AtomicU32,
    pub seen: u32,
}

impl Watch {
    /// Waits up to `timeout` until `wake` or, with `peers`, a peer's connection is readable
    /// (a message, end of stream or an error: whatever it is, the next collective reads it)
    /// or a peer published a shared-memory phase this rank has not joined. Returns whether a
    /// peer started something.
    ///
    /// With the flat shared-memory plane a peer starts a cycle by publishing a phase, not by
    /// sending, so the wait sleeps on the peers' phase counters and the wake word together
    /// (`futex_waitv`), and looks at the sockets (a dead peer, a subset's TCP cycle) at least
    /// every `socket_check`.
    pub(crate) fn wait_readable(
        &self,
        wake: &WakeSignal<'_>,
        peers: bool,
        timeout: Duration,
        socket_check: Duration,
    ) -> io::Result<bool> {
        let mut fds = vec![wake.fd];
        // The acceptor's pipe, while it is open (at index 1 of `fds`).
        let arrivals = self
            .arrivals
            .as_ref()
            .filter(|_| peers && self.arrivals_open.load(Ordering::Relaxed));
        if peers {
            if let Some(arrivals) = arrivals {
                fds.push(arrivals.as_raw_fd());
            }
            let streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
            fds.extend(streams.iter().map(AsRawFd::as_raw_fd));
        }
        // A peer that connected started something: report it once. The pipe's end-of-stream
        // (its acceptor finished) is no such news.
        let from_peer = |ready: &[bool]| {
            let mut sockets = &ready[1..];
            let mut arrived = false;
            if let Some(arrivals) = arrivals {
                if sockets.first().copied().unwrap_or(false) {
                    let drained = lazy::drain(arrivals);
                    arrived = drained.arrived;
                    if !drained.open {
                        self.arrivals_open.store(false, Ordering::Relaxed);
                    }
                }
                sockets = sockets.get(1..).unwrap_or_default();
            }
            arrived || sockets.iter().any(|&r| r)
        };
        let node = match &self.node {
            Some(node) if peers => node,
            _ => {
                let ready = poll::wait_readable(&fds, timeout)?;
                return Ok(from_peer(&ready));
            }
        };
        let deadline = Instant::now() + timeout;
        loop {
            if node.peer_ahead() {
                return Ok(true);
            }
            let ready = poll::wait_readable(&fds, Duration::ZERO)?;
            if ready.iter().any(|&r| r) {
                return Ok(from_peer(&ready) || node.peer_ahead());
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            let slice = (deadline - now).min(socket_check);
            if !node.sleep_until_peer_ahead(wake.word, wake.seen, slice) {
                // No futex_waitv (Linux < 5.16): poll the sockets for the slice instead.
                let ready = poll::wait_readable(&fds, slice)?;
                if ready.iter().any(|&r| r) {
                    return Ok(from_peer(&ready) || node.peer_ahead());
                }
            }
        }
    }
}

/// How a data-plane wait went wrong; turned into an [`Error`] by [`Mesh::fail`].
#[derive(Debug)]
pub(crate) enum Failure {
    /// Reading or writing a peer's socket failed, or it closed.
    Io { peer: usize, source: io::Error },
    /// A peer sent a frame that does not fit the protocol at this point.
    Frame { peer: usize, source: FrameError },
    /// A peer sent a `Fail` frame.
    GaveUp { peer: usize, reason: String },
    /// Nothing moved for `op_timeout`; waiting on these peers.
    Timeout { peers: Vec<usize> },
    /// The abort signal is set.
    Aborted,
    /// The communicator is shutting down.
    Closing,
    /// Waiting itself failed (poll).
    Local(io::Error),
    /// Processing received bytes failed (a bug, e.g. a reduction on inconsistent lengths).
    Other(Error),
}

impl Mesh {
    /// Connects to every peer: the higher rank of each pair connects (retrying until
    /// `connect_timeout`), the lower accepts. Fails on timeout, abort, or a peer answering with
    /// an invalid handshake (for example another job's process at that address).
    pub fn establish(
        listener: DataListener,
        config: MeshConfig,
        abort: AbortSignal,
    ) -> Result<Mesh> {
        setup::establish(listener, config, abort)
    }

    /// A mesh that connects to a peer only when a collective first sends to or receives from
    /// it (see [`lazy`]): returns at once, with a background thread accepting the higher
    /// ranks' connections on `listener`. Fails only on an invalid `config`.
    pub fn connect_lazily(
        listener: DataListener,
        config: MeshConfig,
        abort: AbortSignal,
    ) -> Result<Mesh> {
        setup::validate(&listener, &config)?;
        let watched = Arc::new(Mutex::new(Vec::new()));
        let (notify, arrivals) = lazy::arrivals_pipe()?;
        let acceptor = lazy::Acceptor::start(
            listener.listener,
            config.clone(),
            Arc::clone(&watched),
            notify,
        )?;
        let links = (0..config.peers.len()).map(|_| None).collect();
        let lazy = Lazy {
            config: config.clone(),
            acceptor,
            arrivals,
        };
        Ok(Mesh::assemble(&config, abort, links, watched, Some(lazy)))
    }

    /// A mesh of `config`'s ranks over `links` (the connections open so far, also in
    /// `watched`), connecting the rest on demand when `lazy` is given.
    fn assemble(
        config: &MeshConfig,
        abort: AbortSignal,
        links: Vec<Option<Link>>,
        watched: Arc<Mutex<Vec<TcpStream>>>,
        lazy: Option<Lazy>,
    ) -> Mesh {
        let stats = Arc::new(ConnectionStats::default());
        stats.add(watched.lock().unwrap_or_else(PoisonError::into_inner).len() as u64);
        Mesh {
            rank: config.rank,
            size: config.peers.len(),
            check: wire::job_check(&config.job_id),
            op_timeout: config.op_timeout,
            abort,
            links,
            hosts: Vec::new(),
            closing: Arc::new(AtomicBool::new(false)),
            broken: None,
            shm: None,
            silence: None,
            lazy,
            stats,
            watched,
        }
    }

    /// The connection counters, shared (they stay readable after the mesh moved).
    pub(crate) fn connection_stats(&self) -> Arc<ConnectionStats> {
        Arc::clone(&self.stats)
    }

    /// How many connections this rank made and holds.
    pub fn connections(&self) -> ConnectionCounts {
        self.stats.counts()
    }

    /// Makes sure this rank is connected to each of `peers` (global ranks; this rank's own is
    /// skipped): in a lazy mesh, dials the lower ranks not connected yet, then waits for the
    /// higher ones to dial (each within the connect timeout). An eager mesh has every
    /// connection already.
    pub(crate) fn ensure_links(&mut self, peers: &[usize]) -> Result<(), Failure> {
        let Some(lazy) = &self.lazy else {
            return Ok(());
        };
        let mut wanted: Vec<usize> = peers
            .iter()
            .copied()
            .filter(|&p| p != self.rank && p < self.size && self.links[p].is_none())
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        wanted.sort_unstable();
        wanted.dedup();
        // A dial needs only the peer's acceptor thread: the connect timeout bounds it. Waiting
        // for a higher rank's dial is waiting for that rank to reach this collective: bounded
        // like any collective wait (or by the connect timeout, if longer).
        let now = Instant::now();
        let dial_deadline = now + lazy.config.connect_timeout;
        let accept_wait = lazy.config.connect_timeout.max(self.op_timeout);
        let accept_deadline = now + accept_wait;
        let mut made: Vec<(usize, TcpStream, bool)> = Vec::with_capacity(wanted.len());
        let mut outcome = Ok(());
        // Dials first: a dial needs only the peer's acceptor thread, never its collective
        // thread, so dialing cannot wait on a rank that waits on this one.
        for &peer in wanted.iter().filter(|&&p| p < self.rank) {
            let check = || self.interrupt_error();
            match setup::dial_peer(&lazy.config, peer, dial_deadline, &check) {
                Ok(stream) => made.push((peer, stream, true)),
                Err(error) => {
                    outcome = Err(self
                        .check_interrupts()
                        .err()
                        .unwrap_or(Failure::Other(error)));
                    break;
                }
            }
        }
        if outcome.is_ok() {
            for &peer in wanted.iter().filter(|&&p| p > self.rank) {
                match lazy
                    .acceptor
                    .take(peer, accept_deadline, || self.check_interrupts())
                {
                    Ok(Some(stream)) => made.push((peer, stream, false)),
                    Ok(None) => {
                        outcome = Err(Failure::Other(Error::Timeout {
                            what: format!(
                                "rank {} waiting for {} to connect to its data address {} (it has not \
                                 reached a collective with this rank; is it stuck, or can it not reach this \
                                 host?)",
                                self.rank,
                                self.peer_name(peer),
                                lazy.config.peers[self.rank]
                            ),
                            after: accept_wait,
                        }));
                        break;
                    }
                    Err(lazy::AcceptError::Stopped(failure)) => {
                        outcome = Err(failure);
                        break;
                    }
                    Err(lazy::AcceptError::Failed(why)) => {
                        outcome = Err(Failure::Other(Error::Io(io::Error::other(why))));
                        break;
                    }
                }
            }
        }
        // Connections made before a failure are kept: the failure's `Fail` frame reaches
        // those peers too.
        for (peer, stream, dialed) in made {
            self.install(peer, stream, dialed).map_err(Failure::Local)?;
        }
        outcome
    }

    /// Takes a proven connection to `peer` into the mesh.
    fn install(&mut self, peer: usize, stream: TcpStream, dialed: bool) -> io::Result<()> {
        stream.set_nodelay(true)?;
        stream.set_nonblocking(true)?;
        if dialed {
            // The acceptor already handed accepted connections to the watch.
            let clone = stream.try_clone()?;
            self.watched
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(clone);
        }
        let addr = stream
            .peer_addr()
            .unwrap_or_else(|_| self.lazy_peer_addr(peer));
        log::debug!(
            "rank {}: connected to rank {peer} ({addr}) on demand",
            self.rank
        );
        self.links[peer] = Some(Link {
            stream,
            addr,
            mid_frame: false,
        });
        self.stats.add(1);
        Ok(())
    }

    fn lazy_peer_addr(&self, peer: usize) -> SocketAddr {
        self.lazy
            .as_ref()
            .map(|l| l.config.peers[peer])
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    /// The abort's or shutdown's error, if either happened (for waits outside collectives).
    fn interrupt_error(&self) -> Result<()> {
        if let Some(error) = self.abort.error() {
            return Err(error);
        }
        if self.closing.load(Ordering::Acquire) {
            return Err(Error::Closed(
                "the communicator was shut down while connecting to a peer".into(),
            ));
        }
        Ok(())
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    pub(crate) fn set_hosts(&mut self, hosts: Vec<String>) {
        self.hosts = hosts;
    }

    /// Who to ask, when a collective fails, which ranks are lost (see [`SilenceProbe`]).
    pub(crate) fn set_silence_probe(&mut self, probe: SilenceProbe) {
        self.silence = Some(probe);
    }

    /// "; <what the probe says>" to append to an error, or nothing.
    fn silence_note(&self) -> String {
        self.silence
            .as_ref()
            .and_then(|probe| (probe.0)())
            .map(|verdict| format!("; {}", verdict.sentence))
            .unwrap_or_default()
    }

    /// The abort's error. When the abort blames a rank's failure (say a survivor that exited
    /// after its own timeout) while the driver has lost other ranks, the driver's view is added
    /// to the cause, so a rank told of that exit first still names the lost host.
    pub(crate) fn aborted_naming_silent(&self) -> Error {
        if self.abort.is_interrupted() {
            // An elastic job's membership changed: the survivors reset, nobody is lost.
            return self.abort_error();
        }
        let Some(mut cause) = self.abort.cause() else {
            return self.abort_error();
        };
        let Some(blamed) = cause.rank else {
            // The driver itself is lost or the operator aborted: nobody to ask, or no need.
            return Error::Aborted(cause);
        };
        let verdict = self.silence.as_ref().and_then(|probe| (probe.0)());
        if let Some(verdict) = verdict.filter(|v| v.silent.iter().any(|&r| r != blamed)) {
            cause.message = format!("{}; {}", cause.message, verdict.sentence);
        }
        Error::Aborted(cause)
    }

    pub(crate) fn set_closing_flag(&mut self, closing: Arc<AtomicBool>) {
        self.closing = closing;
    }

    /// Why the mesh is unusable, if it is.
    pub(crate) fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    /// "rank 1 (host h, 10.0.0.2:4000)" for messages.
    pub(crate) fn peer_name(&self, peer: usize) -> String {
        let host = self.hosts.get(peer).filter(|h| !h.is_empty());
        let addr = self
            .links
            .get(peer)
            .and_then(|l| l.as_ref())
            .map(|l| l.addr);
        match (host, addr) {
            (Some(host), Some(addr)) => format!("rank {peer} (host {host}, {addr})"),
            (Some(host), None) => format!("rank {peer} (host {host})"),
            (None, Some(addr)) => format!("rank {peer} ({addr})"),
            (None, None) => format!("rank {peer}"),
        }
    }

    fn link(&self, peer: usize) -> Result<&Link, Failure> {
        self.links
            .get(peer)
            .and_then(|l| l.as_ref())
            .ok_or_else(|| Failure::Io {
                peer,
                source: io::Error::new(io::ErrorKind::NotConnected, "no connection to this rank"),
            })
    }

    /// Checks the abort signal and shutdown flag; called at every wait tick.
    fn check_interrupts(&self) -> Result<(), Failure> {
        if self.abort.is_aborted() {
            return Err(Failure::Aborted);
        }
        if self.closing.load(Ordering::Acquire) {
            return Err(Failure::Closing);
        }
        Ok(())
    }

    /// Turns a failure during `what` into the error to report, after making the mesh unusable
    /// and telling every peer (so they stop waiting for this rank too).
    pub(crate) fn fail(&mut self, failure: Failure, what: &str) -> Error {
        let rank = self.rank;
        match failure {
            Failure::Aborted => {
                self.break_links(&format!(
                    "rank {rank} stopped {what} because the job was aborted"
                ));
                self.aborted_naming_silent()
            }
            Failure::Closing => {
                self.break_links(&format!(
                    "rank {rank} shut down its communicator during {what}"
                ));
                Error::Closed(format!(
                    "the communicator was shut down while {what} was running"
                ))
            }
            Failure::Timeout { peers } => {
                let names: Vec<String> = peers.iter().map(|p| self.peer_name(*p)).collect();
                let waiting = if names.is_empty() {
                    "its peers".to_owned()
                } else {
                    names.join(", ")
                };
                // The peer waited on may only be blocked behind the rank that went away: the
                // driver's view names that one (asked before the peers are told, so they read it).
                let note = self.silence_note();
                self.break_links(&format!(
                    "rank {rank} timed out waiting for {waiting} in {what}{note}"
                ));
                Error::Timeout {
                    what: format!(
                        "waiting for {waiting} in {what} (no bytes moved; is that rank stuck, or did it skip this \
                         collective?){note}"
                    ),
                    after: self.op_timeout,
                }
            }
            Failure::Local(source) => {
                self.break_links(&format!("rank {rank} failed during {what}: {source}"));
                Error::Io(source)
            }
            Failure::Other(error) => {
                self.break_links(&format!("rank {rank} failed during {what}: {error}"));
                error
            }
            Failure::Io { peer, source } => self.peer_failed(peer, what, source),
            Failure::Frame { peer, source } => self.peer_failed(
                peer,
                what,
                io::Error::new(io::ErrorKind::InvalidData, source),
            ),
            Failure::GaveUp { peer, reason } => self.peer_failed(
                peer,
                what,
                io::Error::other(format!("the peer gave up: {reason}")),
            ),
        }
    }

    fn peer_failed(&mut self, peer: usize, what: &str, source: io::Error) -> Error {
        let rank = self.rank;
        self.break_links(&format!(
            "rank {rank} lost its connection to rank {peer} during {what}"
        ));
        log::debug!(
            "rank {rank} lost rank {peer} during {what} ({source}); waiting up to \
             {ABORT_GRACE:?} for the job driver's abort"
        );
        // The driver broadcasts the root cause (e.g. "rank 1 on host x: killed by signal 9");
        // prefer it over a bare "connection reset".
        let deadline = Instant::now() + ABORT_GRACE;
        while Instant::now() < deadline {
            if self.abort.is_aborted() {
                return self.aborted_naming_silent();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // Add the driver's view of who went silent, unless the peer's own message carries it.
        let told = source.to_string();
        let source = if told.contains(silence::OPENING) {
            source
        } else {
            match self.silence_note() {
                note if note.is_empty() => source,
                note => io::Error::new(source.kind(), format!("{told}{note}")),
            }
        };
        let during = match self.hosts.get(peer).filter(|h| !h.is_empty()) {
            Some(host) => format!("{what} (rank {peer} is on host {host})"),
            None => what.to_owned(),
        };
        Error::Peer {
            rank: peer,
            during,
            source,
        }
    }

    pub(crate) fn abort_error(&self) -> Error {
        match self.abort.error() {
            Some(error) => error,
            None => Error::Internal("abort signal set without a cause".into()),
        }
    }

    /// Makes the mesh unusable: sends `Fail(reason)` on every connection not in the middle of
    /// a frame, then closes the sending side of each (the peer reads the reason, then EOF).
    pub(crate) fn break_links(&mut self, reason: &str) {
        if self.broken.is_none() {
            self.broken = Some(reason.to_owned());
        }
        let frame = wire::encode_frame(FrameKind::Fail, 0, &self.check, &wire::encode_fail(reason));
        for link in self.links.iter_mut().flatten() {
            if !link.mid_frame {
                // Best effort: a peer that stopped reading gets EOF instead.
                let _ = (&link.stream).write(&frame);
            }
            link.mid_frame = true;
            let _ = link.stream.shutdown(Shutdown::Write);
        }
    }

    /// Closes the mesh for good, telling peers `reason`; drains what they already sent so
    /// closing does not reset the connection under a `Fail` frame still in flight.
    pub(crate) fn close(&mut self, reason: &str) {
        self.break_links(reason);
        let mut sink = [0u8; 4096];
        // Bounded in time and bytes: a peer that keeps sending cannot hold the close.
        let deadline = Instant::now() + CLOSE_DRAIN;
        for link in self.links.iter_mut().flatten() {
            let mut drained = 0;
            while drained < CLOSE_DRAIN_BYTES && Instant::now() < deadline {
                match (&link.stream).read(&mut sink) {
                    Ok(n) if n > 0 => drained += n,
                    _ => break,
                }
            }
        }
        self.links.iter_mut().for_each(|l| *l = None);
        self.stats.all_closed();
        // Stops the acceptor (within a tick) and closes the listener.
        self.lazy = None;
    }

    /// What the engine waits on between cycles, usable without holding the communicator's
    /// lock (so that a caller can run a cycle meanwhile): a duplicate of every peer's socket
    /// and the flat shared-memory node.
    pub(crate) fn watch(&self) -> io::Result<Watch> {
        let arrivals = match &self.lazy {
            Some(lazy) => Some(lazy.arrivals.try_clone()?),
            None => None,
        };
        let node = match &self.shm {
            Some(plane) if matches!(plane.layout, Layout::Flat) => Some(Arc::clone(&plane.node)),
            _ => None,
        };
        Ok(Watch {
            streams: Arc::clone(&self.watched),
            arrivals,
            arrivals_open: AtomicBool::new(true),
            node,
        })
    }

    /// Reads the reason of a `Fail` frame whose header was just read (bounded wait).
    fn read_fail_reason(stream: &TcpStream, len: u64) -> String {
        let len = usize::try_from(len)
            .unwrap_or(usize::MAX)
            .min(wire::MAX_FAIL_LEN);
        let mut buf = vec![0u8; len];
        let mut got = 0;
        let deadline = Instant::now() + Duration::from_secs(1);
        while got < len && Instant::now() < deadline {
            match (&*stream).read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let reason = wire::decode_fail(&buf[..got]);
        if reason.is_empty() {
            "no reason given".to_owned()
        } else {
            reason
        }
    }
}

impl Drop for Mesh {
    fn drop(&mut self) {
        if self.links.iter().any(Option::is_some) || self.lazy.is_some() {
            let rank = self.rank;
            self.close(&format!("rank {rank} dropped its data-plane connections"));
        }
    }
}

/// Classifies a read/write error: `None` for "try again later".
fn io_failure(peer: usize, result: io::Result<usize>) -> Result<Option<usize>, Failure> {
    match result {
        Ok(n) => Ok(Some(n)),
        Err(e)
            if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted =>
        {
            Ok(None)
        }
        Err(source) => Err(Failure::Io { peer, source }),
    }
}

fn eof(peer: usize) -> Failure {
    Failure::Io {
        peer,
        source: io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the peer closed the connection (its process exited, crashed or dropped its communicator)",
        ),
    }
}
