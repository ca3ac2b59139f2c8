//! Forming the mesh: connect to lower ranks, accept higher ranks, handshake on every
//! connection.

use std::collections::BTreeSet;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::poll::{self, Interest};
use super::{DataListener, Link, Mesh, MeshConfig, TICK};
use crate::abort::AbortSignal;
use crate::error::{Error, Result};
use crate::wire::{self, Hello, HEADER_LEN, HELLO_LEN};

/// Bytes of a whole `Hello` frame.
const HELLO_FRAME_LEN: usize = HEADER_LEN + HELLO_LEN;
/// At most this many unidentified connections wait for their handshake at once; older ones
/// are dropped first, so a flood of junk connections cannot exhaust file descriptors.
const MAX_PENDING: usize = 64;

pub(super) fn establish(
    listener: DataListener,
    config: MeshConfig,
    abort: AbortSignal,
) -> Result<Mesh> {
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
    for (peer, stream) in accepted.into_iter().chain(connected) {
        let addr = stream.peer_addr().unwrap_or(config.peers[peer]);
        configure(&stream)?;
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
    Ok(Mesh {
        rank: config.rank,
        size,
        check: wire::job_check(&config.job_id),
        op_timeout: config.op_timeout,
        abort,
        links,
        hosts: Vec::new(),
        closing: Arc::new(AtomicBool::new(false)),
        broken: None,
        shm: None,
    })
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
    if let Some(cause) = abort.cause() {
        return Err(Error::Aborted(cause));
    }
    if stop.load(Ordering::Acquire) {
        return Err(Error::Closed(
            "mesh setup stopped because another part of it failed".into(),
        ));
    }
    Ok(())
}

/// Connects to every lower rank in turn and checks its answer to our `Hello`.
fn connect_lower(
    config: &MeshConfig,
    abort: &AbortSignal,
    stop: &AtomicBool,
    deadline: Instant,
) -> Result<Vec<(usize, TcpStream)>> {
    let rank = config.rank;
    let mut out = Vec::with_capacity(rank);
    for peer in 0..rank {
        let addr = config.peers[peer];
        let mut last_error: Option<io::Error> = None;
        let mut stream = loop {
            check_wait(abort, stop)?;
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
            match TcpStream::connect_timeout(&addr, (deadline - now).min(Duration::from_secs(2))) {
                Ok(stream) => break stream,
                Err(e) => {
                    last_error = Some(e);
                    thread::sleep(
                        Duration::from_millis(20)
                            .min(deadline.saturating_duration_since(Instant::now())),
                    );
                }
            }
        };
        let hello = Hello {
            job_id: config.job_id,
            from: rank as u32,
            to: peer as u32,
            size: config.peers.len() as u32,
        };
        stream.set_write_timeout(Some(TICK))?;
        write_all_until(&mut stream, &hello.encode_frame(), abort, stop, deadline)
            .map_err(|e| handshake_error(rank, peer, addr, e))?;
        let mut reply = [0u8; HELLO_FRAME_LEN];
        stream.set_read_timeout(Some(TICK))?;
        read_exact_until(&mut stream, &mut reply, abort, stop, deadline)
            .map_err(|e| handshake_error(rank, peer, addr, e))?;
        let answer = Hello::decode_frame(&reply, &config.job_id).map_err(|e| {
            Error::Rendezvous(format!(
                "rank {rank}: the process at rank {peer}'s data address {addr} answered the handshake with \
                 something else: {e}; is another job or program using that address?"
            ))
        })?;
        let expected = Hello {
            from: peer as u32,
            to: rank as u32,
            ..hello
        };
        if answer != expected {
            return Err(Error::Rendezvous(format!(
                "rank {rank}: the process at {addr} claims to be rank {} of {} (talking to rank {}), but rank \
                 {peer} of {} was expected; the ranks disagree about the job's addresses",
                answer.from, answer.size, answer.to, expected.size
            )));
        }
        out.push((peer, stream));
    }
    Ok(out)
}

fn handshake_error(rank: usize, peer: usize, addr: SocketAddr, e: Error) -> Error {
    match e {
        Error::Io(source) => Error::Peer {
            rank: peer,
            during: format!("rank {rank}'s handshake with {addr}"),
            source,
        },
        other => other,
    }
}

fn write_all_until(
    stream: &mut TcpStream,
    mut bytes: &[u8],
    abort: &AbortSignal,
    stop: &AtomicBool,
    deadline: Instant,
) -> Result<()> {
    while !bytes.is_empty() {
        check_wait(abort, stop)?;
        if Instant::now() >= deadline {
            return Err(Error::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                "handshake timed out",
            )));
        }
        match stream.write(bytes) {
            Ok(0) => return Err(Error::Io(io::ErrorKind::WriteZero.into())),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if retry_later(&e) => {}
            Err(e) => return Err(Error::Io(e)),
        }
    }
    Ok(())
}

/// True for the socket errors that mean "nothing yet, try again" in a timed handshake loop.
fn retry_later(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

fn read_exact_until(
    stream: &mut TcpStream,
    buf: &mut [u8],
    abort: &AbortSignal,
    stop: &AtomicBool,
    deadline: Instant,
) -> Result<()> {
    let mut got = 0;
    while got < buf.len() {
        check_wait(abort, stop)?;
        if Instant::now() >= deadline {
            return Err(Error::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                "no handshake answer in time",
            )));
        }
        match stream.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(Error::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the connection closed during the handshake (the peer rejected it)",
                )))
            }
            Ok(n) => got += n,
            Err(e) if retry_later(&e) => {}
            Err(e) => return Err(Error::Io(e)),
        }
    }
    Ok(())
}

/// An accepted connection that has not identified itself yet.
struct Pending {
    stream: TcpStream,
    addr: SocketAddr,
    buf: [u8; HELLO_FRAME_LEN],
    got: usize,
}

/// Accepts connections until every higher rank has connected and identified itself; anything
/// else that connects is logged and dropped.
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
    let mut pending: Vec<Pending> = Vec::new();
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
        loop {
            match listener.accept() {
                Ok((stream, addr)) => {
                    stream.set_nonblocking(true)?;
                    if pending.len() >= MAX_PENDING {
                        let old = pending.remove(0);
                        log::warn!("rank {rank}: dropping unidentified data connection from {} (too many pending)", old.addr);
                    }
                    pending.push(Pending {
                        stream,
                        addr,
                        buf: [0; HELLO_FRAME_LEN],
                        got: 0,
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
        let mut i = 0;
        while i < pending.len() {
            match advance_handshake(&mut pending[i], config, &missing) {
                Ok(None) => i += 1,
                Ok(Some(peer)) => {
                    let done = pending.swap_remove(i);
                    missing.remove(&peer);
                    out.push((peer, done.stream));
                }
                Err(reason) => {
                    let bad = pending.swap_remove(i);
                    log::warn!(
                        "rank {rank}: dropping data connection from {}: {reason}",
                        bad.addr
                    );
                }
            }
        }
        if missing.is_empty() {
            break;
        }
        let mut interests = vec![Interest {
            fd: listener.as_raw_fd(),
            read: true,
            write: false,
        }];
        interests.extend(pending.iter().map(|p| Interest {
            fd: p.stream.as_raw_fd(),
            read: true,
            write: false,
        }));
        poll::wait(
            &interests,
            TICK.min(deadline.saturating_duration_since(Instant::now())),
        )?;
    }
    for p in pending {
        log::warn!(
            "rank {rank}: dropping data connection from {} that never identified itself",
            p.addr
        );
    }
    Ok(out)
}

/// Reads what a pending connection sent so far; once its `Hello` is complete and valid, answers
/// it and returns the peer's rank. `Err` says why the connection is dropped.
fn advance_handshake(
    p: &mut Pending,
    config: &MeshConfig,
    missing: &BTreeSet<usize>,
) -> Result<Option<usize>, String> {
    while p.got < HELLO_FRAME_LEN {
        match p.stream.read(&mut p.buf[p.got..]) {
            Ok(0) => {
                return Err(format!(
                    "it closed after {} bytes, before completing the handshake",
                    p.got
                ))
            }
            Ok(n) => p.got += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                break
            }
            Err(e) => return Err(format!("reading its handshake failed: {e}")),
        }
        // Reject junk as soon as the header is in, without waiting for a payload.
        if p.got >= HEADER_LEN {
            let header =
                wire::Header::decode(&p.buf[..HEADER_LEN], &wire::job_check(&config.job_id))
                    .map_err(|e| format!("invalid handshake: {e}"))?;
            header
                .expect(wire::FrameKind::Hello, 0, HELLO_LEN)
                .map_err(|e| format!("invalid handshake: {e}"))?;
        }
    }
    if p.got < HELLO_FRAME_LEN {
        return Ok(None);
    }
    let hello = Hello::decode_frame(&p.buf, &config.job_id)
        .map_err(|e| format!("invalid handshake: {e}"))?;
    let size = config.peers.len();
    if hello.to as usize != config.rank || hello.size as usize != size {
        return Err(format!(
            "it was meant for rank {} of {} but this is rank {} of {size}",
            hello.to, hello.size, config.rank
        ));
    }
    let peer = hello.from as usize;
    if !missing.contains(&peer) {
        return Err(format!(
            "it claims to be rank {peer}, which is not a higher rank still expected"
        ));
    }
    let reply = Hello {
        from: config.rank as u32,
        to: hello.from,
        ..hello
    };
    // The reply fits any socket buffer; a brief blocking write is fine.
    p.stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    p.stream
        .set_write_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    p.stream
        .write_all(&reply.encode_frame())
        .map_err(|e| format!("answering its handshake failed: {e}"))?;
    p.stream
        .set_write_timeout(None)
        .map_err(|e| e.to_string())?;
    Ok(Some(peer))
}
