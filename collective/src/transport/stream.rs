//! The single-threaded, non-blocking engine that moves a collective's bytes.
//!
//! A collective step is a *stream*: a sequence of blocks sent to one peer and a sequence of
//! blocks received from another (possibly the same socket), each block one `Data` frame. The
//! engine writes and reads both directions concurrently from one thread (non-blocking sockets
//! and `poll`), so large messages cannot deadlock on full socket buffers and small ones pay no
//! thread hand-off. Received blocks are either stored in place or reduced chunk by chunk from
//! an aligned scratch buffer. A sent block may *forward* a received one: its bytes go out only
//! once they arrived and were reduced, which pipelines a ring at chunk granularity.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::time::Instant;

use super::poll::{self, Interest};
use super::{eof, io_failure, Failure, Mesh, TICK};
use crate::error::{Error, Result};
use crate::wire::{self, FrameError, FrameKind, Header, HEADER_LEN};

/// Bytes reduced at a time (the scratch buffer must hold one chunk).
pub(crate) const CHUNK: usize = 256 * 1024;
/// The smallest write issued while more of the block is still to come.
const SEND_MIN: usize = 64 * 1024;
/// Bytes moved in one direction before giving the other direction a turn (so a freshly
/// reduced chunk is forwarded while it is still in cache).
const TURN_BUDGET: usize = 1 << 20;

/// One received block: where it goes and whether it is reduced into what is there.
#[derive(Debug, Clone)]
pub(crate) struct RecvBlock {
    pub range: Range<usize>,
    pub reduce: bool,
}

/// One sent block: where it comes from, and the received block it forwards, if any (its bytes
/// are sent only once they arrived there and were reduced).
#[derive(Debug, Clone)]
pub(crate) struct SendBlock {
    pub range: Range<usize>,
    pub after: Option<usize>,
}

/// What one stream step sends and receives.
#[derive(Debug)]
pub(crate) struct StreamPlan<'p> {
    /// The collective's tag (sequence number).
    pub tag: u32,
    pub send_to: Option<usize>,
    pub recv_from: Option<usize>,
    /// Ranges of the send buffer, one frame each, in order.
    pub send_blocks: &'p [SendBlock],
    /// Ranges of the receive buffer, one frame each, in order.
    pub recv_blocks: &'p [RecvBlock],
}

/// The memory a stream sends from and receives into.
#[derive(Debug)]
pub(crate) enum Buffers<'b> {
    /// Send and receive ranges refer to the same buffer.
    InPlace(&'b mut [u8]),
    /// Separate input and output buffers.
    Split { send: &'b [u8], recv: &'b mut [u8] },
}

impl Buffers<'_> {
    fn send(&self) -> &[u8] {
        match self {
            Buffers::InPlace(b) => b,
            Buffers::Split { send, .. } => send,
        }
    }

    fn recv(&mut self) -> &mut [u8] {
        match self {
            Buffers::InPlace(b) => b,
            Buffers::Split { recv, .. } => recv,
        }
    }
}

struct SendSide<'p> {
    peer: usize,
    blocks: &'p [SendBlock],
    block: usize,
    header: [u8; HEADER_LEN],
    header_sent: usize,
    pos: usize,
}

impl SendSide<'_> {
    fn done(&self) -> bool {
        self.block >= self.blocks.len()
    }

    fn mid_frame(&self) -> bool {
        !self.done() && self.header_sent > 0
    }

    /// Writes what it may. Returns (made progress, blocked on the socket).
    fn step(
        &mut self,
        stream: &TcpStream,
        data: &[u8],
        recv: Option<&RecvSide<'_>>,
        tag: u32,
        check: &[u8; 8],
    ) -> Result<(bool, bool), Failure> {
        let mut moved = 0usize;
        loop {
            let Some(block) = self.blocks.get(self.block) else {
                return Ok((moved > 0, false));
            };
            let range = &block.range;
            let len = range.len();
            let remaining = len - self.pos;
            let ready = match (block.after, recv) {
                (None, _) => len,
                (Some(j), Some(recv)) => recv.processed_of(j).min(len),
                (Some(_), None) => 0,
            };
            let allowed = ready.saturating_sub(self.pos);
            if self.header_sent == 0 && allowed == 0 && remaining > 0 {
                // Start no frame before some payload can follow: an idle link stays at a frame
                // boundary, where a `Fail` frame can still be sent.
                return Ok((moved > 0, false));
            }
            if self.header_sent < HEADER_LEN {
                if self.header_sent == 0 {
                    self.header = Header {
                        kind: FrameKind::Data,
                        tag,
                        len: len as u64,
                    }
                    .encode(check);
                }
                match io_failure(
                    self.peer,
                    (&*stream).write(&self.header[self.header_sent..]),
                )? {
                    None => return Ok((moved > 0, true)),
                    Some(0) => return Err(eof(self.peer)),
                    Some(n) => {
                        self.header_sent += n;
                        moved += n;
                        continue;
                    }
                }
            }
            if remaining == 0 {
                self.block += 1;
                self.header_sent = 0;
                self.pos = 0;
                continue;
            }
            if moved >= TURN_BUDGET {
                return Ok((true, false));
            }
            if allowed == 0 || allowed < remaining.min(SEND_MIN) {
                return Ok((moved > 0, false));
            }
            let start = range.start + self.pos;
            match io_failure(self.peer, (&*stream).write(&data[start..start + allowed]))? {
                None => return Ok((moved > 0, true)),
                Some(0) => return Err(eof(self.peer)),
                Some(n) => {
                    self.pos += n;
                    moved += n;
                }
            }
        }
    }
}

struct RecvSide<'p> {
    peer: usize,
    blocks: &'p [RecvBlock],
    block: usize,
    header: [u8; HEADER_LEN],
    header_got: usize,
    pos: usize,
    chunk_start: usize,
}

impl RecvSide<'_> {
    fn done(&self) -> bool {
        self.block >= self.blocks.len()
    }

    /// Bytes of receive block `j` that arrived and were processed (reduced or stored).
    fn processed_of(&self, j: usize) -> usize {
        match j.cmp(&self.block) {
            std::cmp::Ordering::Less => self.blocks.get(j).map_or(0, |b| b.range.len()),
            std::cmp::Ordering::Equal if self.blocks.get(j).is_some_and(|b| b.reduce) => {
                self.chunk_start
            }
            std::cmp::Ordering::Equal => self.pos,
            std::cmp::Ordering::Greater => 0,
        }
    }

    /// Reads what is there, storing or reducing it. Returns whether anything moved.
    fn step<F>(
        &mut self,
        stream: &TcpStream,
        bufs: &mut Buffers<'_>,
        scratch: &mut [u8],
        sink: &mut F,
        tag: u32,
        check: &[u8; 8],
    ) -> Result<bool, Failure>
    where
        F: FnMut(usize, &mut [u8], &[u8]) -> Result<()>,
    {
        let peer = self.peer;
        let mut moved = 0usize;
        loop {
            let Some(block) = self.blocks.get(self.block) else {
                return Ok(moved > 0);
            };
            let len = block.range.len();
            if self.header_got < HEADER_LEN {
                match io_failure(peer, (&*stream).read(&mut self.header[self.header_got..]))? {
                    None => return Ok(moved > 0),
                    Some(0) => return Err(eof(peer)),
                    Some(n) => {
                        self.header_got += n;
                        moved += n;
                        if self.header_got < HEADER_LEN {
                            continue;
                        }
                    }
                }
                let header = Header::decode(&self.header, check)
                    .map_err(|source| Failure::Frame { peer, source })?;
                if header.kind == FrameKind::Fail {
                    return Err(Failure::GaveUp {
                        peer,
                        reason: Mesh::read_fail_reason(stream, header.len),
                    });
                }
                header
                    .expect(FrameKind::Data, tag, len)
                    .map_err(|source| Failure::Frame { peer, source })?;
            }
            if self.pos == len {
                self.block += 1;
                self.header_got = 0;
                self.pos = 0;
                self.chunk_start = 0;
                continue;
            }
            if moved >= TURN_BUDGET {
                return Ok(true);
            }
            if !block.reduce {
                let dst = &mut bufs.recv()[block.range.start + self.pos..block.range.end];
                match io_failure(peer, (&*stream).read(dst))? {
                    None => return Ok(moved > 0),
                    Some(0) => return Err(eof(peer)),
                    Some(n) => {
                        self.pos += n;
                        moved += n;
                    }
                }
            } else {
                let chunk_len = (len - self.chunk_start).min(CHUNK);
                let fill = self.pos - self.chunk_start;
                match io_failure(peer, (&*stream).read(&mut scratch[fill..chunk_len]))? {
                    None => return Ok(moved > 0),
                    Some(0) => return Err(eof(peer)),
                    Some(n) => {
                        self.pos += n;
                        moved += n;
                    }
                }
                if self.pos - self.chunk_start == chunk_len {
                    let at = block.range.start + self.chunk_start;
                    sink(
                        self.block,
                        &mut bufs.recv()[at..at + chunk_len],
                        &scratch[..chunk_len],
                    )
                    .map_err(Failure::Other)?;
                    self.chunk_start += chunk_len;
                }
            }
        }
    }
}

impl Mesh {
    /// Runs one stream step (see the module docs). `sink(block, dst, src)` reduces a received
    /// chunk `src` into `dst`, the matching part of receive block `block`. On failure the mesh
    /// becomes unusable and the error names `what`.
    pub(crate) fn run_stream<F>(
        &mut self,
        what: &str,
        plan: &StreamPlan<'_>,
        mut bufs: Buffers<'_>,
        scratch: &mut [u8],
        mut sink: F,
    ) -> Result<()>
    where
        F: FnMut(usize, &mut [u8], &[u8]) -> Result<()>,
    {
        check_plan(plan, &mut bufs, scratch)?;
        let peers: Vec<usize> = plan.send_to.into_iter().chain(plan.recv_from).collect();
        self.ensure_links(&peers)
            .map_err(|failure| self.fail(failure, what))?;
        let mut send_mid_frame = false;
        let result = self.drive(plan, &mut bufs, scratch, &mut sink, &mut send_mid_frame);
        if let Some(link) = plan
            .send_to
            .and_then(|p| self.links.get_mut(p))
            .and_then(Option::as_mut)
        {
            link.mid_frame = send_mid_frame;
        }
        result.map_err(|failure| self.fail(failure, what))
    }

    fn drive<F>(
        &self,
        plan: &StreamPlan<'_>,
        bufs: &mut Buffers<'_>,
        scratch: &mut [u8],
        sink: &mut F,
        send_mid_frame: &mut bool,
    ) -> Result<(), Failure>
    where
        F: FnMut(usize, &mut [u8], &[u8]) -> Result<()>,
    {
        let send_stream = plan
            .send_to
            .map(|p| self.link(p).map(|l| &l.stream))
            .transpose()?;
        let recv_stream = plan
            .recv_from
            .map(|p| self.link(p).map(|l| &l.stream))
            .transpose()?;
        let mut send = plan.send_to.map(|peer| SendSide {
            peer,
            blocks: plan.send_blocks,
            block: 0,
            header: [0; HEADER_LEN],
            header_sent: 0,
            pos: 0,
        });
        let mut recv = plan.recv_from.map(|peer| RecvSide {
            peer,
            blocks: plan.recv_blocks,
            block: 0,
            header: [0; HEADER_LEN],
            header_got: 0,
            pos: 0,
            chunk_start: 0,
        });
        let mut last_progress = Instant::now();
        loop {
            self.check_interrupts()?;
            let mut progressed = false;
            let mut want_write = false;
            if let (Some(side), Some(stream)) = (recv.as_mut(), recv_stream) {
                progressed |= side.step(stream, bufs, scratch, sink, plan.tag, &self.check)?;
            }
            if let (Some(side), Some(stream)) = (send.as_mut(), send_stream) {
                let step = side.step(stream, bufs.send(), recv.as_ref(), plan.tag, &self.check);
                *send_mid_frame = side.mid_frame();
                let (moved, blocked) = step?;
                progressed |= moved;
                want_write = blocked;
            }
            let recv_done = recv.as_ref().is_none_or(RecvSide::done);
            let send_done = send.as_ref().is_none_or(SendSide::done);
            if recv_done && send_done {
                return Ok(());
            }
            let now = Instant::now();
            if progressed {
                last_progress = now;
                continue;
            }
            if now.duration_since(last_progress) >= self.op_timeout {
                let peer = match (&recv, &send) {
                    (Some(r), _) if !r.done() => r.peer,
                    (_, Some(s)) => s.peer,
                    _ => return Err(Failure::Timeout { peers: Vec::new() }),
                };
                return Err(Failure::Timeout { peers: vec![peer] });
            }
            let mut interests: Vec<Interest> = Vec::with_capacity(2);
            if let (false, Some(stream)) = (recv_done, recv_stream) {
                interests.push(Interest {
                    fd: stream.as_raw_fd(),
                    read: true,
                    write: false,
                });
            }
            if let (true, Some(stream)) = (want_write, send_stream) {
                match interests.iter_mut().find(|i| i.fd == stream.as_raw_fd()) {
                    Some(same) => same.write = true,
                    None => interests.push(Interest {
                        fd: stream.as_raw_fd(),
                        read: false,
                        write: true,
                    }),
                }
            }
            poll::wait(&interests, TICK).map_err(Failure::Local)?;
        }
    }

    /// Sends `payload` as a `Descriptor` frame to each of `peers` (global ranks, not this one)
    /// and receives one from each (at most `max_len` bytes). Returns the payloads in the order
    /// of `peers`. On failure the mesh becomes unusable and the error names `what`.
    pub(crate) fn exchange(
        &mut self,
        what: &str,
        tag: u32,
        payload: &[u8],
        max_len: usize,
        peers: &[usize],
    ) -> Result<Vec<Vec<u8>>> {
        let both: Vec<(usize, bool, bool)> = peers.iter().map(|&p| (p, true, true)).collect();
        self.transfer(what, tag, payload, max_len, &both)
    }

    /// [`Mesh::exchange`] with a direction per peer: `(rank, send, receive)`. Sends `payload`
    /// to the peers marked `send` and returns, in `peers` order, what each peer marked
    /// `receive` sent (empty for the others). The engine's negotiation tree sends to its
    /// parent or children only with this.
    pub(crate) fn transfer(
        &mut self,
        what: &str,
        tag: u32,
        payload: &[u8],
        max_len: usize,
        peers: &[(usize, bool, bool)],
    ) -> Result<Vec<Vec<u8>>> {
        let ranks: Vec<usize> = peers.iter().map(|&(rank, _, _)| rank).collect();
        self.ensure_links(&ranks)
            .map_err(|failure| self.fail(failure, what))?;
        let frame = wire::encode_frame(FrameKind::Descriptor, tag, &self.check, payload);
        let mut peers: Vec<ExchangePeer> = peers
            .iter()
            .map(|&(rank, send, recv)| ExchangePeer {
                rank,
                sent: if send { 0 } else { frame.len() },
                recv,
                header: [0; HEADER_LEN],
                header_got: 0,
                body: Vec::new(),
                body_len: if recv { None } else { Some(0) },
            })
            .collect();
        let result = self.drive_exchange(&frame, tag, max_len, &mut peers);
        for p in &peers {
            if let Some(link) = self.links.get_mut(p.rank).and_then(Option::as_mut) {
                link.mid_frame = p.sent > 0 && p.sent < frame.len();
            }
        }
        result.map_err(|failure| self.fail(failure, what))?;
        Ok(peers.into_iter().map(|p| p.body).collect())
    }

    fn drive_exchange(
        &self,
        frame: &[u8],
        tag: u32,
        max_len: usize,
        peers: &mut [ExchangePeer],
    ) -> Result<(), Failure> {
        let streams: Vec<&TcpStream> = peers
            .iter()
            .map(|p| self.link(p.rank).map(|l| &l.stream))
            .collect::<Result<_, _>>()?;
        let mut last_progress = Instant::now();
        loop {
            self.check_interrupts()?;
            let mut progressed = false;
            for (p, stream) in peers.iter_mut().zip(&streams) {
                progressed |= p.step(stream, frame, tag, &self.check, max_len)?;
            }
            if peers.iter().all(|p| p.sent == frame.len() && p.received()) {
                return Ok(());
            }
            let now = Instant::now();
            if progressed {
                last_progress = now;
                continue;
            }
            if now.duration_since(last_progress) >= self.op_timeout {
                let mut waiting: Vec<usize> = peers
                    .iter()
                    .filter(|p| !p.received())
                    .map(|p| p.rank)
                    .collect();
                if waiting.is_empty() {
                    waiting = peers
                        .iter()
                        .filter(|p| p.sent < frame.len())
                        .map(|p| p.rank)
                        .collect();
                }
                return Err(Failure::Timeout { peers: waiting });
            }
            let interests: Vec<Interest> = peers
                .iter()
                .zip(&streams)
                .filter(|(p, _)| !p.received() || p.sent < frame.len())
                .map(|(p, s)| Interest {
                    fd: s.as_raw_fd(),
                    read: !p.received(),
                    write: p.sent < frame.len(),
                })
                .collect();
            poll::wait(&interests, TICK).map_err(Failure::Local)?;
        }
    }
}

/// One peer's side of a descriptor exchange.
struct ExchangePeer {
    rank: usize,
    sent: usize,
    /// Whether this peer's frame is to be received.
    recv: bool,
    header: [u8; HEADER_LEN],
    header_got: usize,
    body: Vec<u8>,
    body_len: Option<usize>,
}

impl ExchangePeer {
    fn received(&self) -> bool {
        self.body_len == Some(self.body.len())
    }

    fn step(
        &mut self,
        stream: &TcpStream,
        frame: &[u8],
        tag: u32,
        check: &[u8; 8],
        max_len: usize,
    ) -> Result<bool, Failure> {
        let peer = self.rank;
        let mut progressed = false;
        while self.sent < frame.len() {
            match io_failure(peer, (&*stream).write(&frame[self.sent..]))? {
                None => break,
                Some(0) => return Err(eof(peer)),
                Some(n) => {
                    self.sent += n;
                    progressed = true;
                }
            }
        }
        if !self.recv {
            return Ok(progressed);
        }
        while self.header_got < HEADER_LEN {
            match io_failure(peer, (&*stream).read(&mut self.header[self.header_got..]))? {
                None => return Ok(progressed),
                Some(0) => return Err(eof(peer)),
                Some(n) => {
                    self.header_got += n;
                    progressed = true;
                }
            }
            if self.header_got == HEADER_LEN {
                let header = Header::decode(&self.header, check)
                    .map_err(|source| Failure::Frame { peer, source })?;
                if header.kind == FrameKind::Fail {
                    return Err(Failure::GaveUp {
                        peer,
                        reason: Mesh::read_fail_reason(stream, header.len),
                    });
                }
                let frame_error = |source| Failure::Frame { peer, source };
                if header.kind != FrameKind::Descriptor {
                    return Err(frame_error(FrameError::UnexpectedKind {
                        expected: FrameKind::Descriptor,
                        got: header.kind,
                    }));
                }
                if header.tag != tag {
                    return Err(frame_error(FrameError::BadTag {
                        expected: tag,
                        got: header.tag,
                    }));
                }
                let len = header.check_max(max_len).map_err(frame_error)?;
                self.body = Vec::with_capacity(len);
                self.body_len = Some(len);
            }
        }
        let Some(len) = self.body_len else {
            return Ok(progressed);
        };
        let mut buf = [0u8; 4096];
        while self.body.len() < len {
            let want = (len - self.body.len()).min(buf.len());
            match io_failure(peer, (&*stream).read(&mut buf[..want]))? {
                None => break,
                Some(0) => return Err(eof(peer)),
                Some(n) => {
                    self.body.extend_from_slice(&buf[..n]);
                    progressed = true;
                }
            }
        }
        Ok(progressed)
    }
}

/// Checks that every block lies inside its buffer and the scratch holds a chunk, so the engine
/// never indexes out of bounds.
fn check_plan(plan: &StreamPlan<'_>, bufs: &mut Buffers<'_>, scratch: &[u8]) -> Result<()> {
    let send_len = bufs.send().len();
    let recv_len = bufs.recv().len();
    let recv_blocks = if plan.recv_from.is_some() {
        plan.recv_blocks
    } else {
        &[]
    };
    let bad_send = plan.send_to.is_some()
        && plan.send_blocks.iter().any(|b| {
            let forwards_too_little = b.after.is_some_and(|j| {
                recv_blocks
                    .get(j)
                    .is_none_or(|r| r.range.len() < b.range.len())
            });
            b.range.start > b.range.end || b.range.end > send_len || forwards_too_little
        });
    let bad_recv = recv_blocks
        .iter()
        .any(|b| b.range.start > b.range.end || b.range.end > recv_len);
    let needs_scratch = recv_blocks.iter().any(|b| b.reduce);
    if bad_send || bad_recv || (needs_scratch && scratch.len() < CHUNK) {
        return Err(Error::Internal(format!(
            "stream plan does not fit its buffers (send {send_len} bytes, receive {recv_len} bytes, scratch {} \
             bytes): {plan:?}",
            scratch.len()
        )));
    }
    Ok(())
}
