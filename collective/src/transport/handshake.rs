//! The keyed handshake on every data-plane connection: mutual proof of the job secret.
//!
//! The connecting rank `c` sends `Hello{c → a, nonce_c}`; the accepting rank `a` answers with
//! `Hello{a → c, nonce_a}` and `Proof(tag("accept", …))`; `c` checks that proof, then sends
//! `Proof(tag("connect", …))`, which `a` checks before it takes the connection as rank `c`'s.
//! Both tags cover the job id, both ranks, the job size, the registration round and both
//! nonces, under a key derived from the job secret for the data plane only ([`data_key`]).
//! The round (an elastic job starts one at every reset, renumbering its ranks) keeps a rank of
//! one round from connecting into another: an acceptor answers a `Hello` of another round
//! with its own `Hello` and no proof, and the dialer stops with [`DialError::OtherRound`].
//! Someone who knows the job id (it appears in frame headers) but not the secret can claim no rank; a recorded handshake
//! cannot be replayed (the other side's nonce is fresh); and a tag made by one side can never
//! be reflected as the other's (the role is part of it).

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use subtle::ConstantTimeEq;

use crate::control::ids::JobSecret;
use crate::control::mac::{nonce, MacKey};
use crate::error::{Error, Result};
use crate::wire::{self, FrameKind, Hello, JobId, HEADER_LEN, HELLO_LEN, PROOF_LEN};

/// Bytes of a whole `Hello` frame.
pub(crate) const HELLO_FRAME_LEN: usize = HEADER_LEN + HELLO_LEN;
/// Bytes of a whole `Proof` frame.
pub(crate) const PROOF_FRAME_LEN: usize = HEADER_LEN + PROOF_LEN;

/// The data plane's key: its own purpose, so no control-plane tag is ever valid here.
pub fn data_key(secret: &JobSecret) -> MacKey {
    MacKey::derive(secret, "data plane")
}

/// Which side of the connection a tag proves.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Role {
    Accept,
    Connect,
}

/// The tag `role` sends on the connection from rank `from` (connecting) to rank `to`.
pub(crate) fn proof(
    key: &MacKey,
    role: Role,
    job_id: &JobId,
    connect: &Hello,
    accept_nonce: &[u8],
) -> [u8; PROOF_LEN] {
    let role: &[u8] = match role {
        Role::Accept => b"kolo data accept",
        Role::Connect => b"kolo data connect",
    };
    key.tag(&[
        role,
        job_id,
        &connect.from.to_le_bytes(),
        &connect.to.to_le_bytes(),
        &connect.size.to_le_bytes(),
        &connect.round.to_le_bytes(),
        &connect.nonce,
        accept_nonce,
    ])
}

/// The `Proof` frame carrying `tag`.
pub(crate) fn proof_frame(job_id: &JobId, tag: &[u8; PROOF_LEN]) -> Vec<u8> {
    wire::encode_frame(FrameKind::Proof, 0, &wire::job_check(job_id), tag)
}

/// Decodes a whole `Proof` frame of job `job_id`.
pub(crate) fn decode_proof(
    bytes: &[u8],
    job_id: &JobId,
) -> std::result::Result<[u8; PROOF_LEN], wire::FrameError> {
    let (header, payload, _) = wire::decode_frame(bytes, &wire::job_check(job_id), PROOF_LEN)?;
    header.expect(FrameKind::Proof, 0, PROOF_LEN)?;
    let mut tag = [0u8; PROOF_LEN];
    tag.copy_from_slice(payload);
    Ok(tag)
}

/// True when a connection from `actual` may be the rank registered at `registered`: the
/// same IP address (IPv4-mapped IPv6 compared as IPv4), or any address if the rank registered
/// the unspecified address.
pub(crate) fn source_matches(registered: SocketAddr, actual: SocketAddr) -> bool {
    let canonical = |ip: IpAddr| ip.to_canonical();
    let registered = canonical(registered.ip());
    registered.is_unspecified() || registered == canonical(actual.ip())
}

/// What the connecting side of one handshake knows.
#[derive(Debug, Clone, Copy)]
pub struct Dial<'a> {
    /// The data plane's key ([`data_key`]).
    pub key: &'a MacKey,
    /// The job id.
    pub job_id: &'a JobId,
    /// This (connecting) rank.
    pub from: u32,
    /// The rank connected to.
    pub to: u32,
    /// The job size.
    pub size: u32,
    /// The registration round of this rank's membership ([`super::MeshConfig::round`]).
    pub round: u32,
}

/// Why a connecting handshake failed.
#[derive(Debug)]
pub enum DialError {
    /// The connection broke or went silent (dropped by a busy or restarting acceptor): worth
    /// retrying on a new connection.
    Dropped(io::Error),
    /// The other side answered, but not as the expected rank of this job: not worth retrying.
    Rejected(String),
    /// Stopped by `check` (abort, or the other half of setup failed).
    Stopped(Error),
    /// The other side is a rank of this job, but of another registration round (an elastic
    /// reset happened in between): not worth retrying.
    OtherRound {
        /// This (connecting) rank's round.
        ours: u32,
        /// The round the other side answered with.
        theirs: u32,
    },
}

/// Runs the connecting side of the handshake on `stream` until `deadline`; `check` is called
/// at every wait tick and stops the handshake when it fails.
pub fn dial(
    stream: &mut TcpStream,
    dial: Dial<'_>,
    deadline: Instant,
    check: &dyn Fn() -> Result<()>,
) -> std::result::Result<(), DialError> {
    let hello = Hello {
        job_id: *dial.job_id,
        from: dial.from,
        to: dial.to,
        size: dial.size,
        round: dial.round,
        nonce: nonce(),
    };
    let tick = Some(super::TICK);
    stream.set_write_timeout(tick).map_err(DialError::Dropped)?;
    stream.set_read_timeout(tick).map_err(DialError::Dropped)?;
    write_all_until(stream, &hello.encode_frame(), deadline, check)?;
    let mut reply = [0u8; HELLO_FRAME_LEN + PROOF_FRAME_LEN];
    let junk = |e: wire::FrameError| {
        DialError::Rejected(format!(
            "it answered the handshake with something else: {e}"
        ))
    };
    let check_header = |bytes: &[u8], kind: FrameKind, len: usize| {
        wire::Header::decode(bytes, &wire::job_check(dial.job_id))
            .and_then(|header| header.expect(kind, 0, len))
            .map_err(junk)
    };
    // Each header is checked as soon as it is in, so junk is rejected without waiting.
    read_exact_until(stream, &mut reply[..HEADER_LEN], deadline, check)?;
    check_header(&reply[..HEADER_LEN], FrameKind::Hello, HELLO_LEN)?;
    read_exact_until(
        stream,
        &mut reply[HEADER_LEN..HELLO_FRAME_LEN],
        deadline,
        check,
    )?;
    let answer = Hello::decode_frame(&reply[..HELLO_FRAME_LEN], dial.job_id).map_err(junk)?;
    if answer.round != dial.round {
        return Err(DialError::OtherRound {
            ours: dial.round,
            theirs: answer.round,
        });
    }
    if (answer.from, answer.to, answer.size) != (dial.to, dial.from, dial.size) {
        return Err(DialError::Rejected(format!(
            "it claims to be rank {} of {} (talking to rank {}), but rank {} of {} was expected; the ranks \
             disagree about the job's addresses",
            answer.from, answer.size, answer.to, dial.to, dial.size
        )));
    }
    let proof_bytes = &mut reply[HELLO_FRAME_LEN..];
    read_exact_until(stream, &mut proof_bytes[..HEADER_LEN], deadline, check)?;
    check_header(&proof_bytes[..HEADER_LEN], FrameKind::Proof, PROOF_LEN)?;
    read_exact_until(stream, &mut proof_bytes[HEADER_LEN..], deadline, check)?;
    let tag = decode_proof(proof_bytes, dial.job_id).map_err(junk)?;
    let expected = proof(dial.key, Role::Accept, dial.job_id, &hello, &answer.nonce);
    if !bool::from(expected.ct_eq(&tag)) {
        return Err(DialError::Rejected(
            "it could not prove it knows this job's secret (another job's process, or an impostor)"
                .into(),
        ));
    }
    let ours = proof(dial.key, Role::Connect, dial.job_id, &hello, &answer.nonce);
    write_all_until(stream, &proof_frame(dial.job_id, &ours), deadline, check)
}

fn write_all_until(
    stream: &mut TcpStream,
    mut bytes: &[u8],
    deadline: Instant,
    check: &dyn Fn() -> Result<()>,
) -> std::result::Result<(), DialError> {
    while !bytes.is_empty() {
        check().map_err(DialError::Stopped)?;
        if Instant::now() >= deadline {
            return Err(DialError::Dropped(io::Error::new(
                io::ErrorKind::TimedOut,
                "handshake timed out",
            )));
        }
        match stream.write(bytes) {
            Ok(0) => return Err(DialError::Dropped(io::ErrorKind::WriteZero.into())),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if retry_later(&e) => {}
            Err(e) => return Err(DialError::Dropped(e)),
        }
    }
    Ok(())
}

fn read_exact_until(
    stream: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
    check: &dyn Fn() -> Result<()>,
) -> std::result::Result<(), DialError> {
    let mut got = 0;
    while got < buf.len() {
        check().map_err(DialError::Stopped)?;
        if Instant::now() >= deadline {
            return Err(DialError::Dropped(io::Error::new(
                io::ErrorKind::TimedOut,
                "no handshake answer in time",
            )));
        }
        match stream.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(DialError::Dropped(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the connection closed during the handshake",
                )))
            }
            Ok(n) => got += n,
            Err(e) if retry_later(&e) => {}
            Err(e) => return Err(DialError::Dropped(e)),
        }
    }
    Ok(())
}

/// True for the socket errors that mean "nothing yet, try again" in a timed handshake loop.
pub(crate) fn retry_later(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// How long an accepted connection may take to complete its handshake before it is dropped
/// (its slot freed for the next one).
pub(crate) const ACCEPT_DEADLINE: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_bind_role_ranks_round_nonces_and_key() {
        let secret = JobSecret::generate();
        let key = data_key(&secret);
        let job = [1u8; 16];
        let hello = Hello {
            job_id: job,
            from: 2,
            to: 0,
            size: 3,
            round: 4,
            nonce: [5; 32],
        };
        let tag = proof(&key, Role::Accept, &job, &hello, &[6; 32]);
        assert_eq!(tag, proof(&key, Role::Accept, &job, &hello, &[6; 32]));
        assert_ne!(tag, proof(&key, Role::Connect, &job, &hello, &[6; 32]));
        assert_ne!(tag, proof(&key, Role::Accept, &job, &hello, &[7; 32]));
        let other_rank = Hello { from: 1, ..hello };
        assert_ne!(tag, proof(&key, Role::Accept, &job, &other_rank, &[6; 32]));
        let other_round = Hello { round: 5, ..hello };
        assert_ne!(tag, proof(&key, Role::Accept, &job, &other_round, &[6; 32]));
        let control = MacKey::derive(&secret, "control plane");
        assert_ne!(tag, proof(&control, Role::Accept, &job, &hello, &[6; 32]));
        assert_eq!(decode_proof(&proof_frame(&job, &tag), &job), Ok(tag));
    }

    #[test]
    fn source_must_match_the_registered_ip() {
        let at = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(source_matches(at("127.0.0.1:5000"), at("127.0.0.1:41000")));
        assert!(!source_matches(at("127.0.0.1:5000"), at("127.0.0.2:41000")));
        assert!(!source_matches(at("10.0.0.1:5000"), at("127.0.0.1:41000")));
        assert!(source_matches(at("0.0.0.0:5000"), at("10.9.9.9:41000")));
        assert!(source_matches(
            at("127.0.0.1:5000"),
            at("[::ffff:127.0.0.1]:41000")
        ));
    }
}
