//! Connections on demand (`KOLO_CONNECT=lazy`, the default): a rank connects to a peer when a
//! collective first sends to or receives from it, not to every rank at `init()`.
//!
//! The direction of every connection is fixed: the higher rank of a pair dials, the lower
//! accepts (as in the eager mesh). Two ranks that need each other at the same moment therefore
//! never race: one dials, the other waits for that dial, and the pair ends with exactly one
//! connection. Dialing runs in the collective's own thread; accepting runs in a background
//! thread per mesh ([`Acceptor`]) that answers handshakes whatever the rank is doing, so a dial
//! only needs the peer's process, never its collective thread: a rank waiting for a peer's
//! dial can never be part of a cycle of ranks waiting for one another.
//!
//! The acceptor is bounded the same way as the eager mesh's setup: at most
//! [`MAX_PENDING`](super::setup::MAX_PENDING) handshakes at a time, each dropped after the
//! handshake deadline; nothing is read from a connection beyond the fixed-size handshake frames
//! before it proved the job secret; at most one proven connection per higher rank (a second
//! connection claiming a rank already connected is dropped before it is answered). Once every
//! higher rank is connected, the listener is closed.

use std::collections::BTreeSet;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Instant;

use super::setup::Accepting;
use super::{MeshConfig, TICK};
use crate::error::{Error, Result};

/// The environment variable choosing when data-plane connections are made.
pub const CONNECT: &str = "KOLO_CONNECT";

/// When a rank connects to its peers (`KOLO_CONNECT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectMode {
    /// When a collective first needs the peer (the default): a rank holds connections only to
    /// the peers its collectives use.
    Lazy,
    /// To every peer at `init()`: a full mesh of n·(n−1)/2 connections.
    Eager,
}

impl ConnectMode {
    /// The mode `KOLO_CONNECT` names (unset: [`ConnectMode::Lazy`]).
    pub fn from_env() -> Result<Self> {
        match std::env::var(CONNECT) {
            Ok(text) => Self::parse(&text),
            Err(_) => Ok(ConnectMode::Lazy),
        }
    }

    /// Parses `lazy` or `eager` (any case; empty means `lazy`).
    pub fn parse(text: &str) -> Result<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "lazy" | "" => Ok(ConnectMode::Lazy),
            "eager" => Ok(ConnectMode::Eager),
            _ => Err(Error::Config(format!(
                "{CONNECT}={text:?} is not a connection mode; use lazy (connect to a peer when a \
                 collective first needs it) or eager (connect to every peer at init)"
            ))),
        }
    }
}

/// How many data-plane connections a rank made and holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectionCounts {
    /// Connections made (dialed or accepted, and proven) since the mesh was formed.
    pub opened: u64,
    /// Connections held now (zero once the mesh is closed).
    pub open: u64,
}

/// A mesh's connection counters, readable without the communicator's lock.
#[derive(Debug, Default)]
pub(crate) struct ConnectionStats {
    opened: AtomicU64,
    open: AtomicU64,
}

impl ConnectionStats {
    pub(super) fn add(&self, n: u64) {
        self.opened.fetch_add(n, Ordering::Relaxed);
        self.open.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn all_closed(&self) {
        self.open.store(0, Ordering::Relaxed);
    }

    /// The counts now.
    pub(crate) fn counts(&self) -> ConnectionCounts {
        ConnectionCounts {
            opened: self.opened.load(Ordering::Relaxed),
            open: self.open.load(Ordering::Relaxed),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the acceptor thread and the mesh share.
#[derive(Debug)]
struct Shared {
    /// Proven connections not yet taken by the mesh, indexed by rank.
    ready: Mutex<Vec<Option<TcpStream>>>,
    arrived: Condvar,
    stop: AtomicBool,
    /// Why the acceptor thread stopped before every higher rank connected, if it did.
    failed: Mutex<Option<String>>,
}

/// The accepting side of a lazy mesh: a thread that accepts connections, runs the keyed
/// handshake and keeps each proven connection for the mesh to take ([`Acceptor::take`]).
#[derive(Debug)]
pub(super) struct Acceptor {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// Written to stop the thread at once (it also looks at `stop` every tick).
    stop: UnixStream,
}

impl Acceptor {
    /// Starts accepting on `listener` for the mesh `config` describes. Each proven connection
    /// is also handed to `watch` (a clone, so the engine wakes when it is readable) and
    /// announced by a byte on `arrivals`.
    pub(super) fn start(
        listener: TcpListener,
        config: MeshConfig,
        watch: Arc<Mutex<Vec<TcpStream>>>,
        arrivals: UnixStream,
    ) -> Result<Self> {
        listener.set_nonblocking(true)?;
        let size = config.peers.len();
        let shared = Arc::new(Shared {
            ready: Mutex::new((0..size).map(|_| None).collect()),
            arrived: Condvar::new(),
            stop: AtomicBool::new(false),
            failed: Mutex::new(None),
        });
        let (stop, stopped) = arrivals_pipe()?;
        let thread = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name(format!("kolo-accept-{}", config.rank))
                .spawn(move || {
                    accept_loop(&listener, &config, &shared, &watch, &arrivals, &stopped)
                })?
        };
        Ok(Acceptor {
            shared,
            thread: Some(thread),
            stop,
        })
    }

    /// Waits until `peer` (a higher rank) connected and proved itself, and takes that
    /// connection. Returns `Ok(None)` when `deadline` passed first; `check` runs at every tick
    /// and ends the wait with its error.
    pub(super) fn take<E>(
        &self,
        peer: usize,
        deadline: Instant,
        check: impl Fn() -> std::result::Result<(), E>,
    ) -> std::result::Result<Option<TcpStream>, AcceptError<E>> {
        let mut ready = lock(&self.shared.ready);
        loop {
            if let Some(stream) = ready.get_mut(peer).and_then(Option::take) {
                return Ok(Some(stream));
            }
            check().map_err(AcceptError::Stopped)?;
            if let Some(why) = lock(&self.shared.failed).clone() {
                return Err(AcceptError::Failed(why));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            ready = self
                .shared
                .arrived
                .wait_timeout(ready, TICK.min(deadline - now))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// Why [`Acceptor::take`] gave up before its deadline.
pub(super) enum AcceptError<E> {
    /// The caller's check failed.
    Stopped(E),
    /// The acceptor thread stopped: why.
    Failed(String),
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let _ = (&self.stop).write(&[1]);
        if let Some(thread) = self.thread.take() {
            // It wakes on the byte just written, or looks at `stop` within a tick.
            let _ = thread.join();
        }
    }
}

/// The acceptor thread: runs until every higher rank connected or the mesh stops it.
fn accept_loop(
    listener: &TcpListener,
    config: &MeshConfig,
    shared: &Shared,
    watch: &Mutex<Vec<TcpStream>>,
    mut arrivals: &UnixStream,
    stopped: &UnixStream,
) {
    let rank = config.rank;
    let mut missing: BTreeSet<usize> = (rank + 1..config.peers.len()).collect();
    let mut accepting = Accepting::default();
    let mut accept_failing = false;
    while !missing.is_empty() && !shared.stop.load(Ordering::Acquire) {
        // A failing accept (out of file descriptors, say) leaves the connection in the
        // backlog: try again next tick, and say so once.
        match accepting.accept_new(listener, config) {
            Ok(()) => accept_failing = false,
            Err(e) if !accept_failing => {
                accept_failing = true;
                log::warn!(
                    "rank {rank}: accepting data connections failed ({e}); retrying every {TICK:?}"
                );
            }
            Err(_) => {}
        }
        let proven = accepting.advance(config, &mut missing);
        if !proven.is_empty() {
            let mut ready = lock(&shared.ready);
            let mut watched = lock(watch);
            for (peer, stream) in proven {
                match stream.try_clone() {
                    Ok(clone) => watched.push(clone),
                    Err(e) => log::warn!(
                        "rank {rank}: cannot watch the connection from rank {peer} between cycles: {e}"
                    ),
                }
                ready[peer] = Some(stream);
            }
            drop(watched);
            drop(ready);
            shared.arrived.notify_all();
            // Wakes an idle engine: a peer that connects is starting something. A full pipe
            // already says so.
            let _ = arrivals.write(&[1]);
        }
        if missing.is_empty() {
            break;
        }
        let wait = if accept_failing {
            thread::sleep(TICK);
            Ok(())
        } else {
            accepting.wait(listener, Some(stopped.as_raw_fd()), Instant::now() + TICK)
        };
        if let Err(e) = wait {
            let why = format!("rank {rank}'s data-plane listener failed: {e}");
            log::error!("{why}");
            *lock(&shared.failed) = Some(why);
            shared.arrived.notify_all();
            break;
        }
    }
    log::debug!(
        "rank {rank}: the data-plane listener closes ({} handshake(s) under way dropped)",
        accepting.pending()
    );
    accepting.finish(rank);
}

/// What [`drain`] found in the arrivals pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Drained {
    /// The acceptor announced at least one connection.
    pub(super) arrived: bool,
    /// The acceptor's end is still open. Once its thread ended (every awaited peer connected,
    /// at once on the highest rank) the pipe reads end-of-stream, and so polls readable,
    /// forever: it must no longer be watched.
    pub(super) open: bool,
}

/// Empties the arrivals pipe (non-blocking) after it woke a wait.
pub(super) fn drain(mut arrivals: &UnixStream) -> Drained {
    let mut sink = [0u8; 64];
    let mut arrived = false;
    loop {
        match arrivals.read(&mut sink) {
            Ok(0) => {
                return Drained {
                    arrived,
                    open: false,
                }
            }
            Ok(_) => arrived = true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => {
                return Drained {
                    arrived,
                    open: true,
                }
            }
        }
    }
}

/// A connected pair of non-blocking Unix sockets: the acceptor writes, the watch reads.
pub(super) fn arrivals_pipe() -> io::Result<(UnixStream, UnixStream)> {
    let (write, read) = UnixStream::pair()?;
    write.set_nonblocking(true)?;
    read.set_nonblocking(true)?;
    Ok((write, read))
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    use std::time::Duration;

    use super::*;
    use crate::abort::AbortSignal;
    use crate::collectives::{self, allreduce::Reduction, Algorithm, AlgorithmChoices, Session};
    use crate::control::JobSecret;
    use crate::dtype::{DType, ReduceOp};
    use crate::transport::handshake::data_key;
    use crate::transport::{DataListener, Mesh};
    use crate::wire::OpKind;

    #[test]
    fn connect_mode_parses_lazy_and_eager_and_names_the_knob_otherwise() {
        assert_eq!(ConnectMode::parse("").unwrap(), ConnectMode::Lazy);
        assert_eq!(ConnectMode::parse(" Lazy ").unwrap(), ConnectMode::Lazy);
        assert_eq!(ConnectMode::parse("EAGER").unwrap(), ConnectMode::Eager);
        let err = ConnectMode::parse("mesh").unwrap_err();
        assert!(
            matches!(&err, Error::Config(m) if m.contains("KOLO_CONNECT=\"mesh\"")),
            "{err}"
        );
    }

    /// The engine runs a collective with descriptors it agreed on beforehand (no descriptor
    /// exchange with every member); so does this test, to see the ring's own connections.
    #[test]
    fn a_ring_allreduce_connects_each_rank_to_its_two_neighbours_only() {
        for n in [2usize, 3, 8] {
            let key = data_key(&JobSecret::generate());
            let listeners: Vec<DataListener> = (0..n)
                .map(|_| DataListener::bind(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap())
                .collect();
            let peers: Vec<SocketAddr> = listeners.iter().map(DataListener::local_addr).collect();
            // No rank dials before every rank has checked that it starts with no connections.
            let all_checked = &std::sync::Barrier::new(n);
            let connected: Vec<Vec<usize>> = thread::scope(|s| {
                let handles: Vec<_> = listeners
                    .into_iter()
                    .enumerate()
                    .map(|(rank, listener)| {
                        let config = MeshConfig {
                            job_id: [n as u8; 16],
                            key: key.clone(),
                            rank,
                            round: 0,
                            peers: peers.clone(),
                            connect_timeout: Duration::from_secs(10),
                            op_timeout: Duration::from_secs(10),
                        };
                        s.spawn(move || {
                            let mesh =
                                Mesh::connect_lazily(listener, config, AbortSignal::new()).unwrap();
                            assert_eq!(mesh.connections(), ConnectionCounts::default());
                            all_checked.wait();
                            let mut session = Session::new(Some(mesh), rank, n);
                            // A 256-byte allreduce would take recursive doubling by default.
                            session.set_algorithms(AlgorithmChoices {
                                allreduce: Some(Algorithm::Ring),
                                ..AlgorithmChoices::default()
                            });
                            let reduction = Reduction {
                                op: ReduceOp::Sum,
                                prescale: 1.0,
                                postscale: 1.0,
                            };
                            let desc =
                                reduction.descriptor(OpKind::Allreduce, "ring", DType::F32, &[64]);
                            session.set_agreed(vec![desc; n]);
                            let mut buf: Vec<u8> =
                                (0..64).flat_map(|_| (rank as f32).to_le_bytes()).collect();
                            collectives::allreduce(
                                &mut session,
                                "ring",
                                &mut buf,
                                &[64],
                                DType::F32,
                                reduction,
                            )
                            .unwrap();
                            let total = (n * (n - 1) / 2) as f32;
                            assert!(buf
                                .chunks_exact(4)
                                .all(|c| f32::from_le_bytes(c.try_into().unwrap()) == total));
                            let mesh = session.mesh.as_ref().unwrap();
                            let linked: Vec<usize> =
                                (0..n).filter(|&p| mesh.links[p].is_some()).collect();
                            assert_eq!(mesh.connections().opened, linked.len() as u64);
                            linked
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for (rank, linked) in connected.into_iter().enumerate() {
                let mut neighbours = vec![(rank + 1) % n, (rank + n - 1) % n];
                neighbours.sort_unstable();
                neighbours.dedup();
                assert_eq!(linked, neighbours, "rank {rank} of {n}");
            }
        }
    }
}
