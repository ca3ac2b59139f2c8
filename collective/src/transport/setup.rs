//! Forming the mesh: connect to lower ranks, accept higher ranks, handshake on every
//! connection.

use std::collections::BTreeSet;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};
use subtle::ConstantTimeEq;

use super::handshake::{
    self, decode_proof, proof, proof_frame, source_matches, Dial, DialError, Role, ACCEPT_DEADLINE,
    HELLO_FRAME_LEN, PROOF_FRAME_LEN,
};
use super::poll::{self, Interest};
use super::{DataListener, Link, Mesh, MeshConfig, TICK};
use crate::abort::AbortSignal;
use crate::control::mac::nonce;
use crate::error::{Error, Result};
use crate::wire::{self, Hello, HEADER_LEN, HELLO_LEN, NONCE_LEN, PROOF_LEN};

/// At most this many accepted connections run their handshake at once. When all slots are
/// taken, new connections wait in the kernel's backlog until a slot frees: every slot frees
/// within [`ACCEPT_DEADLINE`], so a flood of silent connections delays a real peer (whose
/// connector retries) but can never evict one that is proving itself.
pub(super) const MAX_PENDING: usize = 128;
/// The connector's first pause between attempts; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// Checks that `config` describes a mesh this rank is part of.
pub(super) fn validate(listener: &DataListener, config: &MeshConfig) -> Result<()> {
    let size = config.peers.len();
    if size == 0 || config.rank >= size {
        return Err(Error::InvalidArgument(format!(
            "mesh config: rank {} is not among the {size} peer addresses; pass one data address per rank, \
             indexed by rank",
            config.rank
        )));
    }
    if u32::try_from(size).is_err() {
        return Err(Error::InvalidArgument(format!(
            "mesh config: {size} ranks are too many"
        )));
    }
    if config.peers[config.rank] != listener.addr {
        log::debug!(
            "rank {}: own data address listed as {} but the listener is bound to {}",
            config.rank,
            config.peers[config.rank],
            listener.addr
        );
    }
    Ok(())
}

pub(super) fn establish(
    listener: DataListener,
    config: MeshConfig,
    abort: AbortSignal,
) -> Result<Mesh> {
    validate(&listener, &config)?;
    let size = config.peers.len();
    let deadline = Instant::now() + config.connect_timeout;
    let stop = AtomicBool::new(false);
    let (accepted, connected) = thread::scope(|scope| {
        let connector = scope.spawn(|| {
            let result = connect_lower(&config, &abort, &stop, deadline);
            if result.is_err() {
                stop.store(true, Ordering::Release);
            }
            result
        });
        let accepted = accept_higher(&listener.listener, &config, &abort, &stop, deadline);
        // Close the listener as soon as every higher rank is in: no later connection can even
        // be accepted (the kernel refuses it).
        drop(listener);
        if accepted.is_err() {
            stop.store(true, Ordering::Release);
        }
        let connected = connector
            .join()
            .unwrap_or_else(|_| Err(Error::Internal("the mesh connector thread panicked".into())));
        (accepted, connected)
    });
    // Report the root cause rather than "stopped because the other half failed".
    let (accepted, connected) = match (accepted, connected) {
        (Ok(a), Ok(c)) => (a, c),
        (Err(Error::Closed(_)), Err(e)) | (Err(e), _) | (_, Err(e)) => return Err(e),
    };
    let mut links: Vec<Option<Link>> = (0..size).map(|_| None).collect();
    let mut watched = Vec::with_capacity(size);
    for (peer, stream) in accepted.into_iter().chain(connected) {
        let addr = stream.peer_addr().unwrap_or(config.peers[peer]);
        configure(&stream)?;
        watched.push(stream.try_clone()?);
        links[peer] = Some(Link {
            stream,
            addr,
            mid_frame: false,
        });
    }
    log::debug!(
        "rank {}: data-plane mesh of {size} ranks established",
        config.rank
    );
    Ok(Mesh::assemble(
        &config,
        abort,
        links,
        Arc::new(Mutex::new(watched)),
        None,
    ))
}

/// Socket options of an established data connection. The kernel's buffer autotuning is kept:
/// it grows the buffers up to `tcp_rmem`/`tcp_wmem` as needed, whereas setting `SO_RCVBUF`
/// explicitly would switch it off and cap the buffer at `rmem_max` (and measured slower over
/// loopback, where smaller in-flight data stays in cache).
fn configure(stream: &TcpStream) -> Result<()> {
    stream.set_nodelay(true)?;
    stream.set_nonblocking(true)?;
    Ok(())
}

fn check_wait(abort: &AbortSignal, stop: &AtomicBool) -> Result<()> {
    if let Some(error) = abort.error() {
        return Err(error);
    }
    if stop.load(Ordering::Acquire) {
        return Err(Error::Closed(
            "mesh setup stopped because another part of it failed".into(),
        ));
    }
    Ok(())
}

/// Connects to every lower rank in turn and runs the keyed handshake with it (see
/// [`dial_peer`]).
fn connect_lower(
    config: &MeshConfig,
    abort: &AbortSignal,
    stop: &AtomicBool,
    deadline: Instant,
) -> Result<Vec<(usize, TcpStream)>> {
    let check = || check_wait(abort, stop);
    (0..config.rank)
        .map(|peer| dial_peer(config, peer, deadline, &check).map(|stream| (peer, stream)))
        .collect()
}

/// Connects to `peer` (a lower rank: the higher rank of a pair dials) and runs the keyed
/// handshake. A connection that is refused, dropped or left unanswered is retried with backoff
/// until `deadline`; an answer that is not the expected rank's (or cannot prove the secret)
/// fails at once. `check` is called at every wait and stops the dial when it fails.
pub(super) fn dial_peer(
    config: &MeshConfig,
    peer: usize,
    deadline: Instant,
    check: &dyn Fn() -> Result<()>,
) -> Result<TcpStream> {
    let rank = config.rank;
    let addr = config.peers[peer];
    let mut last_error: Option<io::Error> = None;
    let mut backoff = FIRST_BACKOFF;
    loop {
        check()?;
        let now = Instant::now();
        if now >= deadline {
            let last = last_error
                .map(|e| format!(" (last error: {e})"))
                .unwrap_or_default();
            return Err(Error::Timeout {
                what: format!(
                    "rank {rank} connecting to rank {peer}'s data address {addr}{last}; is that rank \
                     running and reachable from this host?"
                ),
                after: config.connect_timeout,
            });
        }
        let attempt = connect_from(
            config.peers[rank].ip(),
            addr,
            (deadline - now).min(Duration::from_secs(2)),
        )
        .map_err(DialError::Dropped)
        .and_then(|mut stream| {
            let dial = Dial {
                key: &config.key,
                job_id: &config.job_id,
                from: rank as u32,
                to: peer as u32,
                size: config.peers.len() as u32,
                round: config.round,
            };
            handshake::dial(&mut stream, dial, deadline, check).map(|()| stream)
        });
        match attempt {
            Ok(stream) => return Ok(stream),
            Err(DialError::Dropped(e)) => {
                log::debug!(
                    "rank {rank}: data connection to rank {peer} at {addr} failed ({e}); retrying"
                );
                last_error = Some(e);
                thread::sleep(backoff.min(deadline.saturating_duration_since(Instant::now())));
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            Err(DialError::Rejected(why)) => {
                return Err(Error::Rendezvous(format!(
                    "rank {rank}: the process at rank {peer}'s data address {addr} failed the handshake: \
                     {why}; is another job or program using that address?"
                )))
            }
            Err(DialError::Stopped(e)) => return Err(e),
            Err(DialError::OtherRound { ours, theirs }) => {
                return Err(Error::Rendezvous(format!(
                    "rank {rank}: rank {peer} at {addr} belongs to registration round {theirs} of \
                     this job, but this rank to round {ours}: an elastic reset happened between \
                     their registrations, and a connection never crosses rounds (this rank will \
                     reset too)"
                )))
            }
        }
    }
}

/// A TCP connection to `to` from this rank's own registered data address `from` (any port):
/// on a host with several addresses the kernel could otherwise pick another source, and the
/// peer refuses a connection that does not come from the address this rank registered.
fn connect_from(from: IpAddr, to: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    if from.is_unspecified() || from.is_ipv4() != to.is_ipv4() {
        return TcpStream::connect_timeout(&to, timeout);
    }
    let socket = Socket::new(Domain::for_address(to), Type::STREAM, Some(Protocol::TCP))?;
    if let Err(e) = socket.bind(&SocketAddr::new(from, 0).into()) {
        // Not an address of this host (e.g. one published through NAT): let the kernel pick.
        log::debug!("cannot connect from {from} ({e}); connecting from any address");
        return TcpStream::connect_timeout(&to, timeout);
    }
    socket.connect_timeout(&to.into(), timeout)?;
    Ok(socket.into())
}

/// An accepted connection whose handshake is under way.
struct Pending {
    stream: TcpStream,
    addr: SocketAddr,
    /// When the connection is dropped if its handshake is not complete.
    expires: Instant,
    buf: [u8; HELLO_FRAME_LEN],
    got: usize,
    /// Set once its `Hello` was valid and answered: what its proof must cover.
    answered: Option<(Hello, [u8; NONCE_LEN])>,
}

/// What one step of a pending handshake came to.
enum Step {
    /// Waiting for more bytes.
    Wait,
    /// Proven: the connection is this rank's.
    Proven(usize),
    /// Dropped: why, and whether it is worth a warning (an impostor or a misdirected rank) or
    /// only a debug line (silence, a closed connection).
    Drop(String, bool),
}

/// Accepts connections until every higher rank has connected and proven itself; anything else
/// that connects is logged and dropped.
fn accept_higher(
    listener: &TcpListener,
    config: &MeshConfig,
    abort: &AbortSignal,
    stop: &AtomicBool,
    deadline: Instant,
) -> Result<Vec<(usize, TcpStream)>> {
    let rank = config.rank;
    let size = config.peers.len();
    let mut missing: BTreeSet<usize> = (rank + 1..size).collect();
    let mut out = Vec::with_capacity(missing.len());
    if missing.is_empty() {
        return Ok(out);
    }
    listener.set_nonblocking(true)?;
    let mut accepting = Accepting::default();
    while !missing.is_empty() {
        check_wait(abort, stop)?;
        if Instant::now() >= deadline {
            let ranks: Vec<String> = missing.iter().map(|r| format!("rank {r}")).collect();
            return Err(Error::Timeout {
                what: format!(
                    "rank {rank} waiting for data connections from {} at {}; did those ranks start, and can they \
                     reach this host?",
                    ranks.join(", "),
                    config.peers[rank]
                ),
                after: config.connect_timeout,
            });
        }
        accepting.accept_new(listener, config)?;
        for (peer, stream) in accepting.advance(config, &mut missing) {
            out.push((peer, stream));
        }
        if missing.is_empty() {
            break;
        }
        accepting.wait(listener, None, deadline)?;
    }
    accepting.finish(rank);
    Ok(out)
}

/// The accepting side of the handshakes: the accepted connections whose handshake is under
/// way (at most [`MAX_PENDING`], each with a deadline).
#[derive(Default)]
pub(super) struct Accepting {
    pending: Vec<Pending>,
    quietly_dropped: usize,
}

impl Accepting {
    /// Accepts the connections waiting in the listener's backlog while slots are free.
    pub(super) fn accept_new(&mut self, listener: &TcpListener, config: &MeshConfig) -> Result<()> {
        while self.pending.len() < MAX_PENDING {
            match listener.accept() {
                Ok((stream, addr)) => {
                    stream.set_nonblocking(true)?;
                    self.pending.push(Pending {
                        stream,
                        addr,
                        expires: Instant::now() + ACCEPT_DEADLINE.min(config.connect_timeout),
                        buf: [0; HELLO_FRAME_LEN],
                        got: 0,
                        answered: None,
                    });
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) =>
                {
                    break
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
                    ) => {}
                Err(e) => return Err(Error::Io(e)),
            }
        }
        Ok(())
    }

    /// Advances every pending handshake as far as the bytes received allow; returns the
    /// connections proven as one of the `missing` ranks (removed from it) and drops those that
    /// failed or expired.
    pub(super) fn advance(
        &mut self,
        config: &MeshConfig,
        missing: &mut BTreeSet<usize>,
    ) -> Vec<(usize, TcpStream)> {
        let rank = config.rank;
        let mut out = Vec::new();
        let now = Instant::now();
        let mut i = 0;
        while i < self.pending.len() {
            let step = if now >= self.pending[i].expires {
                Step::Drop("it did not complete the handshake in time".into(), false)
            } else {
                advance_handshake(&mut self.pending[i], config, missing)
            };
            match step {
                Step::Wait => i += 1,
                Step::Proven(peer) => {
                    let done = self.pending.swap_remove(i);
                    missing.remove(&peer);
                    log::debug!("rank {rank}: rank {peer} connected from {}", done.addr);
                    out.push((peer, done.stream));
                }
                Step::Drop(reason, loud) => {
                    let bad = self.pending.swap_remove(i);
                    if loud {
                        log::warn!(
                            "rank {rank}: dropping data connection from {}: {reason}",
                            bad.addr
                        );
                    } else {
                        self.quietly_dropped += 1;
                        log::debug!(
                            "rank {rank}: dropping data connection from {}: {reason}",
                            bad.addr
                        );
                    }
                }
            }
        }
        out
    }

    /// Waits (at most a tick, and not past `deadline` or the next handshake's expiry) until the
    /// listener, a pending connection or `also` is readable.
    pub(super) fn wait(
        &self,
        listener: &TcpListener,
        also: Option<std::os::fd::RawFd>,
        deadline: Instant,
    ) -> Result<()> {
        let mut interests = Vec::with_capacity(self.pending.len() + 2);
        interests.extend(also.map(|fd| Interest {
            fd,
            read: true,
            write: false,
        }));
        if self.pending.len() < MAX_PENDING {
            interests.push(Interest {
                fd: listener.as_raw_fd(),
                read: true,
                write: false,
            });
        }
        interests.extend(self.pending.iter().map(|p| Interest {
            fd: p.stream.as_raw_fd(),
            read: true,
            write: false,
        }));
        let next_expiry = self
            .pending
            .iter()
            .map(|p| p.expires)
            .min()
            .unwrap_or(deadline)
            .min(deadline);
        poll::wait(
            &interests,
            TICK.min(next_expiry.saturating_duration_since(Instant::now())),
        )?;
        Ok(())
    }

    /// How many handshakes are under way.
    pub(super) fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Drops the handshakes still under way and logs how many connections never completed one.
    pub(super) fn finish(self, rank: usize) {
        let quietly_dropped = self.quietly_dropped + self.pending.len();
        if quietly_dropped > 0 {
            log::warn!(
                "rank {rank}: dropped {quietly_dropped} data connection(s) that never completed the handshake \
                 (silent or closed early)"
            );
        }
    }
}

/// Reads `want` more bytes of a pending connection into `p.buf[..want]` as far as they are
/// available; `Err` says why the connection is dropped.
fn fill(p: &mut Pending, want: usize) -> std::result::Result<bool, Step> {
    while p.got < want {
        match p.stream.read(&mut p.buf[p.got..want]) {
            Ok(0) => {
                return Err(Step::Drop(
                    format!(
                        "it closed after {} bytes, before completing the handshake",
                        p.got
                    ),
                    false,
                ))
            }
            Ok(n) => p.got += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                return Ok(false)
            }
            Err(e) => {
                return Err(Step::Drop(
                    format!("reading its handshake failed: {e}"),
                    false,
                ))
            }
        }
    }
    Ok(true)
}

/// Advances a pending connection's handshake as far as the bytes it sent allow.
fn advance_handshake(p: &mut Pending, config: &MeshConfig, missing: &BTreeSet<usize>) -> Step {
    match advance(p, config, missing) {
        Ok(step) | Err(step) => step,
    }
}

fn advance(
    p: &mut Pending,
    config: &MeshConfig,
    missing: &BTreeSet<usize>,
) -> std::result::Result<Step, Step> {
    let check = wire::job_check(&config.job_id);
    let invalid = |e: wire::FrameError| Step::Drop(format!("invalid handshake: {e}"), true);
    if let Some((hello, ours)) = p.answered {
        // Waiting for its proof.
        if !fill(p, HEADER_LEN)? {
            return Ok(Step::Wait);
        }
        wire::Header::decode(&p.buf[..HEADER_LEN], &check)
            .and_then(|h| h.expect(wire::FrameKind::Proof, 0, PROOF_LEN))
            .map_err(invalid)?;
        if !fill(p, PROOF_FRAME_LEN)? {
            return Ok(Step::Wait);
        }
        let tag = decode_proof(&p.buf[..PROOF_FRAME_LEN], &config.job_id).map_err(invalid)?;
        let expected = proof(&config.key, Role::Connect, &config.job_id, &hello, &ours);
        if !bool::from(expected.ct_eq(&tag)) {
            return Err(Step::Drop(
                format!(
                    "it claims to be rank {} but cannot prove it knows this job's secret (an impostor, or a \
                     process of another job)",
                    hello.from
                ),
                true,
            ));
        }
        let peer = hello.from as usize;
        if !missing.contains(&peer) {
            return Err(Step::Drop(
                format!("rank {peer} is already connected"),
                true,
            ));
        }
        return Ok(Step::Proven(peer));
    }
    if !fill(p, HEADER_LEN)? {
        return Ok(Step::Wait);
    }
    // Reject junk as soon as the header is in, without waiting for a payload.
    wire::Header::decode(&p.buf[..HEADER_LEN], &check)
        .and_then(|h| h.expect(wire::FrameKind::Hello, 0, HELLO_LEN))
        .map_err(invalid)?;
    if !fill(p, HELLO_FRAME_LEN)? {
        return Ok(Step::Wait);
    }
    let hello = Hello::decode_frame(&p.buf, &config.job_id).map_err(invalid)?;
    if hello.round != config.round {
        // Our Hello (our round, no proof) tells the dialer why, so it stops instead of retrying.
        let reply = Hello {
            from: config.rank as u32,
            to: hello.from,
            round: config.round,
            nonce: [0; wire::NONCE_LEN],
            ..hello
        };
        let _ = p.stream.write(&reply.encode_frame());
        return Err(Step::Drop(
            format!(
                "it claims to be rank {} of registration round {}, but this mesh is round {}: a \
                 rank of another round is never accepted",
                hello.from, hello.round, config.round
            ),
            true,
        ));
    }
    let size = config.peers.len();
    if hello.to as usize != config.rank || hello.size as usize != size {
        return Err(Step::Drop(
            format!(
                "it was meant for rank {} of {} but this is rank {} of {size}",
                hello.to, hello.size, config.rank
            ),
            true,
        ));
    }
    let peer = hello.from as usize;
    if !missing.contains(&peer) {
        return Err(Step::Drop(
            format!("it claims to be rank {peer}, which is not a higher rank still expected"),
            true,
        ));
    }
    let registered = config.peers[peer];
    if !source_matches(registered, p.addr) {
        return Err(Step::Drop(
            format!(
                "it claims to be rank {peer}, whose registered data address is {registered}, but it comes from {}",
                p.addr
            ),
            true,
        ));
    }
    let ours = nonce();
    let reply = Hello {
        from: config.rank as u32,
        to: hello.from,
        nonce: ours,
        ..hello
    };
    let tag = proof(&config.key, Role::Accept, &config.job_id, &hello, &ours);
    let mut answer = reply.encode_frame();
    answer.extend_from_slice(&proof_frame(&config.job_id, &tag));
    // The answer (152 bytes) fits any fresh socket's send buffer: a non-blocking write
    // completes at once or the connection is useless.
    match p.stream.write(&answer) {
        Ok(n) if n == answer.len() => {}
        Ok(n) => {
            return Err(Step::Drop(
                format!(
                    "answering its handshake wrote only {n} of {} bytes",
                    answer.len()
                ),
                false,
            ))
        }
        Err(e) => {
            return Err(Step::Drop(
                format!("answering its handshake failed: {e}"),
                false,
            ))
        }
    }
    p.answered = Some((hello, ours));
    p.got = 0;
    Ok(Step::Wait)
}
