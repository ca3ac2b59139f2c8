//! The framed binary protocol of the data plane.
//!
//! Every frame is a fixed [`HEADER_LEN`]-byte header followed by `len` payload bytes:
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0  | 4 | magic `b"KOLO"` |
//! | 4  | 1 | protocol version ([`VERSION`]) |
//! | 5  | 1 | kind ([`FrameKind`]) |
//! | 6  | 2 | flags, must be 0 |
//! | 8  | 4 | tag (u32 LE): the low 32 bits of the collective's sequence number; 0 for `Hello` |
//! | 12 | 8 | job check: the first 8 bytes of the 16-byte job id |
//! | 20 | 8 | payload length (u64 LE) |
//!
//! Frame kinds and their payloads:
//!
//! - `Hello` (once per connection, each way): [`Hello`] — the full job id, sender and
//!   receiver rank, job size and the sender's fresh nonce.
//! - `Proof` (once per connection, each way, after both `Hello`s): an HMAC-SHA256 tag of
//!   [`PROOF_LEN`] bytes over both `Hello`s, keyed from the job secret (see
//!   `transport::handshake`); the job id alone cannot produce it.
//! - `Descriptor` (once per collective, to every peer): an [`OpDescriptor`] that lets every
//!   rank check that all ranks called the same collective with compatible arguments.
//! - `Data`: raw tensor bytes of one block of a collective; the receiver knows the exact length
//!   it expects and rejects anything else.
//! - `Fail`: the sender gave up (it failed, was shut down, or dropped its communicator); the
//!   payload is a UTF-8 reason of at most [`MAX_FAIL_LEN`] bytes.
//!
//! Decoders never panic and never allocate from a length they have not checked against a cap.

mod descriptor;

pub use descriptor::{OpDescriptor, OpKind, MAX_DIMS, MAX_INVALID_LEN, MAX_NAME_LEN};

use std::fmt;

use subtle::ConstantTimeEq;

/// The first four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"KOLO";
/// The protocol version this build speaks.
pub const VERSION: u8 = 1;
/// Bytes in a frame header.
pub const HEADER_LEN: usize = 28;
/// Bytes in a `Hello` payload.
pub const HELLO_LEN: usize = 32 + NONCE_LEN;
/// Bytes of the nonce in a `Hello`.
pub const NONCE_LEN: usize = crate::control::mac::TAG_LEN;
/// Bytes in a `Proof` payload (an HMAC-SHA256 tag).
pub const PROOF_LEN: usize = crate::control::mac::TAG_LEN;
/// The most payload bytes a `Fail` frame may carry.
pub const MAX_FAIL_LEN: usize = 4096;

/// A job id: 16 random bytes chosen by the driver, the same on every rank of a job.
pub type JobId = [u8; 16];

/// The 8-byte job check every header carries (the first half of the job id).
pub fn job_check(job_id: &JobId) -> [u8; 8] {
    let mut check = [0u8; 8];
    check.copy_from_slice(&job_id[..8]);
    check
}

/// Why a frame was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Fewer bytes than the frame needs.
    #[error("frame truncated: needed {needed} bytes but got {got}")]
    Truncated {
        /// Bytes needed.
        needed: usize,
        /// Bytes available.
        got: usize,
    },
    /// The first four bytes are not `KOLO`: the peer does not speak kolo's data protocol.
    #[error("not a kolo data-plane frame (magic {0:02x?})")]
    BadMagic([u8; 4]),
    /// The peer speaks another protocol version (a different kolo release).
    #[error("unsupported protocol version {0} (this build speaks {VERSION}); use the same kolo release on every host")]
    UnsupportedVersion(u8),
    /// The kind byte names no frame kind.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// Reserved flag bits are set.
    #[error("reserved frame flags {0:#06x} are set")]
    BadFlags(u16),
    /// The frame belongs to another job.
    #[error("frame belongs to another job (job id prefix {got}, expected {expected})")]
    WrongJob {
        /// Hex of the expected job check.
        expected: String,
        /// Hex of the job check received.
        got: String,
    },
    /// The payload length exceeds what the receiver accepts for this kind of frame.
    #[error("{kind} frame announces {len} payload bytes but at most {max} are accepted")]
    TooLong {
        /// The frame kind.
        kind: FrameKind,
        /// The announced length.
        len: u64,
        /// The largest length accepted.
        max: u64,
    },
    /// The payload length differs from the exact length the receiver expects.
    #[error("{kind} frame announces {len} payload bytes but exactly {expected} were expected")]
    WrongLength {
        /// The frame kind.
        kind: FrameKind,
        /// The announced length.
        len: u64,
        /// The expected length.
        expected: u64,
    },
    /// A frame of another kind arrived than the receiver expects at this point.
    #[error("expected a {expected} frame but got a {got} frame")]
    UnexpectedKind {
        /// The kind expected.
        expected: FrameKind,
        /// The kind received.
        got: FrameKind,
    },
    /// The frame belongs to another collective: the ranks are out of step.
    #[error("frame for collective #{got} arrived during collective #{expected}; the ranks are out of step")]
    BadTag {
        /// The tag expected.
        expected: u32,
        /// The tag received.
        got: u32,
    },
    /// The payload is not well formed.
    #[error("malformed {kind} payload: {what}")]
    Malformed {
        /// The frame kind.
        kind: FrameKind,
        /// What is wrong.
        what: String,
    },
}

/// The kind of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// Connection handshake.
    Hello = 1,
    /// A collective's descriptor.
    Descriptor = 2,
    /// Tensor bytes.
    Data = 3,
    /// The sender gave up; the payload says why.
    Fail = 4,
    /// The handshake's keyed proof of the job secret.
    Proof = 5,
}

impl FrameKind {
    /// The kind with code `code`.
    pub fn from_code(code: u8) -> Option<FrameKind> {
        match code {
            1 => Some(FrameKind::Hello),
            2 => Some(FrameKind::Descriptor),
            3 => Some(FrameKind::Data),
            4 => Some(FrameKind::Fail),
            5 => Some(FrameKind::Proof),
            _ => None,
        }
    }
}

impl fmt::Display for FrameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FrameKind::Hello => "hello",
            FrameKind::Descriptor => "descriptor",
            FrameKind::Data => "data",
            FrameKind::Fail => "fail",
            FrameKind::Proof => "proof",
        })
    }
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the payload is.
    pub kind: FrameKind,
    /// The collective's sequence number (low 32 bits); 0 for `Hello`.
    pub tag: u32,
    /// Payload bytes following the header.
    pub len: u64,
}

impl Header {
    /// The header's bytes for a job whose id starts with `check`.
    pub fn encode(&self, check: &[u8; 8]) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..4].copy_from_slice(&MAGIC);
        out[4] = VERSION;
        out[5] = self.kind as u8;
        // out[6..8]: flags, zero.
        out[8..12].copy_from_slice(&self.tag.to_le_bytes());
        out[12..20].copy_from_slice(check);
        out[20..28].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    /// Decodes and checks a header: magic, version, kind, flags and job check. The length is
    /// not checked here; use [`Header::expect`] or [`Header::check_max`].
    pub fn decode(bytes: &[u8], check: &[u8; 8]) -> Result<Header, FrameError> {
        let bytes: &[u8; HEADER_LEN] = bytes
            .get(..HEADER_LEN)
            .and_then(|b| b.try_into().ok())
            .ok_or(FrameError::Truncated {
                needed: HEADER_LEN,
                got: bytes.len(),
            })?;
        let magic = [bytes[0], bytes[1], bytes[2], bytes[3]];
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        if bytes[4] != VERSION {
            return Err(FrameError::UnsupportedVersion(bytes[4]));
        }
        let kind = FrameKind::from_code(bytes[5]).ok_or(FrameError::UnknownKind(bytes[5]))?;
        let flags = u16::from_le_bytes([bytes[6], bytes[7]]);
        if flags != 0 {
            return Err(FrameError::BadFlags(flags));
        }
        let got_check = &bytes[12..20];
        if !bool::from(got_check.ct_eq(check)) {
            return Err(FrameError::WrongJob {
                expected: hex::encode(check),
                got: hex::encode(got_check),
            });
        }
        let tag = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        let mut len = [0u8; 8];
        len.copy_from_slice(&bytes[20..28]);
        Ok(Header {
            kind,
            tag,
            len: u64::from_le_bytes(len),
        })
    }

    /// Checks that the payload length is at most `max`; returns it as `usize`.
    pub fn check_max(&self, max: usize) -> Result<usize, FrameError> {
        match usize::try_from(self.len) {
            Ok(len) if len <= max => Ok(len),
            _ => Err(FrameError::TooLong {
                kind: self.kind,
                len: self.len,
                max: max as u64,
            }),
        }
    }

    /// Checks that this is a `kind` frame of collective `tag` with exactly `len` payload bytes.
    pub fn expect(&self, kind: FrameKind, tag: u32, len: usize) -> Result<(), FrameError> {
        if self.kind != kind {
            return Err(FrameError::UnexpectedKind {
                expected: kind,
                got: self.kind,
            });
        }
        if self.tag != tag {
            return Err(FrameError::BadTag {
                expected: tag,
                got: self.tag,
            });
        }
        if self.len != len as u64 {
            return Err(FrameError::WrongLength {
                kind,
                len: self.len,
                expected: len as u64,
            });
        }
        Ok(())
    }
}

/// The largest payload [`decode_frame`] accepts for each kind, given the caller's cap for
/// descriptor and data frames.
fn max_payload(kind: FrameKind, cap: usize) -> usize {
    match kind {
        FrameKind::Hello => HELLO_LEN,
        FrameKind::Fail => MAX_FAIL_LEN,
        FrameKind::Proof => PROOF_LEN,
        FrameKind::Descriptor | FrameKind::Data => cap,
    }
}

/// Decodes one whole frame from the start of `bytes`: the header, checked against `check`,
/// and its payload (at most `cap` bytes for descriptor and data frames). Returns the header,
/// the payload and the bytes consumed.
pub fn decode_frame<'b>(
    bytes: &'b [u8],
    check: &[u8; 8],
    cap: usize,
) -> Result<(Header, &'b [u8], usize), FrameError> {
    let header = Header::decode(bytes, check)?;
    let len = header.check_max(max_payload(header.kind, cap))?;
    let end = HEADER_LEN + len;
    let payload = bytes.get(HEADER_LEN..end).ok_or(FrameError::Truncated {
        needed: end,
        got: bytes.len(),
    })?;
    Ok((header, payload, end))
}

/// Encodes a whole frame: header and payload.
pub fn encode_frame(kind: FrameKind, tag: u32, check: &[u8; 8], payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(
        &Header {
            kind,
            tag,
            len: payload.len() as u64,
        }
        .encode(check),
    );
    out.extend_from_slice(payload);
    out
}

/// A `Fail` frame's payload: the reason, cut to [`MAX_FAIL_LEN`] bytes at a character boundary.
pub fn encode_fail(reason: &str) -> Vec<u8> {
    let mut end = reason.len().min(MAX_FAIL_LEN);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason.as_bytes()[..end].to_vec()
}

/// The reason carried by a `Fail` frame (invalid UTF-8 is replaced, never rejected).
pub fn decode_fail(payload: &[u8]) -> String {
    String::from_utf8_lossy(&payload[..payload.len().min(MAX_FAIL_LEN)]).into_owned()
}

/// The connection handshake: sent by the connecting rank, answered by the accepting rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The full job id.
    pub job_id: JobId,
    /// The rank sending this frame.
    pub from: u32,
    /// The rank the sender believes it is talking to.
    pub to: u32,
    /// The number of ranks in the job.
    pub size: u32,
    /// The sender's registration round (elastic jobs: the membership it belongs to; a round
    /// starts at every reset), so a rank of one round never connects into another.
    pub round: u32,
    /// The sender's fresh random challenge for this connection.
    pub nonce: [u8; NONCE_LEN],
}

impl Hello {
    /// The payload bytes.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut out = [0u8; HELLO_LEN];
        out[..16].copy_from_slice(&self.job_id);
        out[16..20].copy_from_slice(&self.from.to_le_bytes());
        out[20..24].copy_from_slice(&self.to.to_le_bytes());
        out[24..28].copy_from_slice(&self.size.to_le_bytes());
        out[28..32].copy_from_slice(&self.round.to_le_bytes());
        out[32..].copy_from_slice(&self.nonce);
        out
    }

    /// The whole frame (header and payload).
    pub fn encode_frame(&self) -> Vec<u8> {
        encode_frame(
            FrameKind::Hello,
            0,
            &job_check(&self.job_id),
            &self.encode(),
        )
    }

    /// Decodes a payload.
    pub fn decode(payload: &[u8]) -> Result<Hello, FrameError> {
        if payload.len() != HELLO_LEN {
            return Err(FrameError::WrongLength {
                kind: FrameKind::Hello,
                len: payload.len() as u64,
                expected: HELLO_LEN as u64,
            });
        }
        let mut job_id = [0u8; 16];
        job_id.copy_from_slice(&payload[..16]);
        let word = |at: usize| {
            u32::from_le_bytes([
                payload[at],
                payload[at + 1],
                payload[at + 2],
                payload[at + 3],
            ])
        };
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&payload[32..]);
        Ok(Hello {
            job_id,
            from: word(16),
            to: word(20),
            size: word(24),
            round: word(28),
            nonce,
        })
    }

    /// Decodes a whole `Hello` frame of job `job_id` from `bytes`, checking kind and length.
    pub fn decode_frame(bytes: &[u8], job_id: &JobId) -> Result<Hello, FrameError> {
        let (header, payload, _) = decode_frame(bytes, &job_check(job_id), HELLO_LEN)?;
        header.expect(FrameKind::Hello, 0, HELLO_LEN)?;
        let hello = Hello::decode(payload)?;
        if !bool::from(hello.job_id.ct_eq(job_id)) {
            return Err(FrameError::WrongJob {
                expected: hex::encode(job_id),
                got: hex::encode(hello.job_id),
            });
        }
        Ok(hello)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const JOB: JobId = *b"0123456789abcdef";

    fn kind_strategy() -> impl Strategy<Value = FrameKind> {
        prop_oneof![
            Just(FrameKind::Hello),
            Just(FrameKind::Descriptor),
            Just(FrameKind::Data),
            Just(FrameKind::Fail),
            Just(FrameKind::Proof)
        ]
    }

    #[test]
    fn header_layout_is_stable() {
        let bytes = Header {
            kind: FrameKind::Data,
            tag: 7,
            len: 0x0102,
        }
        .encode(&job_check(&JOB));
        assert_eq!(&bytes[..4], b"KOLO");
        assert_eq!(bytes[4], VERSION);
        assert_eq!(bytes[5], 3);
        assert_eq!(&bytes[8..12], &7u32.to_le_bytes());
        assert_eq!(&bytes[12..20], b"01234567");
        assert_eq!(&bytes[20..28], &0x0102u64.to_le_bytes());
    }

    #[test]
    fn decoder_rejects_bad_frames() {
        let check = job_check(&JOB);
        let good = encode_frame(FrameKind::Data, 1, &check, b"abcd");
        assert!(decode_frame(&good, &check, 4).is_ok());
        assert_eq!(
            decode_frame(&good, &check, 3).unwrap_err(),
            FrameError::TooLong {
                kind: FrameKind::Data,
                len: 4,
                max: 3
            }
        );
        assert!(matches!(
            decode_frame(&good[..30], &check, 4),
            Err(FrameError::Truncated { .. })
        ));
        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(matches!(
            Header::decode(&bad, &check),
            Err(FrameError::BadMagic(_))
        ));
        let mut bad = good.clone();
        bad[4] = 9;
        assert_eq!(
            Header::decode(&bad, &check),
            Err(FrameError::UnsupportedVersion(9))
        );
        let mut bad = good.clone();
        bad[5] = 77;
        assert_eq!(
            Header::decode(&bad, &check),
            Err(FrameError::UnknownKind(77))
        );
        let mut bad = good.clone();
        bad[6] = 1;
        assert_eq!(Header::decode(&bad, &check), Err(FrameError::BadFlags(1)));
        assert!(matches!(
            Header::decode(&good, b"otherjob"),
            Err(FrameError::WrongJob { .. })
        ));
        let header = Header::decode(&good, &check).unwrap();
        assert!(header.expect(FrameKind::Data, 1, 4).is_ok());
        assert!(matches!(
            header.expect(FrameKind::Data, 2, 4),
            Err(FrameError::BadTag { .. })
        ));
        assert!(matches!(
            header.expect(FrameKind::Data, 1, 5),
            Err(FrameError::WrongLength { .. })
        ));
        assert!(matches!(
            header.expect(FrameKind::Descriptor, 1, 4),
            Err(FrameError::UnexpectedKind { .. })
        ));
        // A huge announced length is rejected without allocating.
        let huge = Header {
            kind: FrameKind::Descriptor,
            tag: 0,
            len: u64::MAX,
        }
        .encode(&check);
        assert!(matches!(
            decode_frame(&huge, &check, 1 << 20),
            Err(FrameError::TooLong { .. })
        ));
    }

    #[test]
    fn hello_checks_the_full_job_id() {
        let hello = Hello {
            job_id: JOB,
            from: 3,
            to: 1,
            size: 4,
            round: 2,
            nonce: [9; NONCE_LEN],
        };
        assert_eq!(Hello::decode_frame(&hello.encode_frame(), &JOB), Ok(hello));
        let mut other = JOB;
        other[15] ^= 1;
        assert!(matches!(
            Hello::decode_frame(&hello.encode_frame(), &other),
            Err(FrameError::WrongJob { .. })
        ));
    }

    #[test]
    fn fail_reason_is_capped_at_a_char_boundary() {
        let long = "é".repeat(MAX_FAIL_LEN);
        let payload = encode_fail(&long);
        assert!(payload.len() <= MAX_FAIL_LEN);
        assert!(decode_fail(&payload).chars().all(|c| c == 'é'));
        assert_eq!(decode_fail(&[0xff, b'a']), "\u{fffd}a");
    }

    proptest! {
        #[test]
        fn frame_round_trips(kind in kind_strategy(), tag in any::<u32>(), job in any::<[u8; 16]>(),
                             payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let check = job_check(&job);
            let payload = match kind {
                FrameKind::Hello => vec![0; HELLO_LEN],
                FrameKind::Proof => vec![0; PROOF_LEN],
                _ => payload,
            };
            let bytes = encode_frame(kind, tag, &check, &payload);
            let (header, got, used) = decode_frame(&bytes, &check, 64).unwrap();
            prop_assert_eq!(header, Header { kind, tag, len: payload.len() as u64 });
            prop_assert_eq!(got, &payload[..]);
            prop_assert_eq!(used, bytes.len());
        }

        #[test]
        fn hello_round_trips(job in any::<[u8; 16]>(), from in any::<u32>(), to in any::<u32>(), size in any::<u32>(),
                             round in any::<u32>(), nonce in any::<[u8; 32]>()) {
            let hello = Hello { job_id: job, from, to, size, round, nonce };
            prop_assert_eq!(Hello::decode_frame(&hello.encode_frame(), &job), Ok(hello));
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..128),
                                                 cap in 0usize..256) {
            let _ = decode_frame(&bytes, &job_check(&JOB), cap);
            let _ = Hello::decode_frame(&bytes, &JOB);
            let _ = Hello::decode(&bytes);
            let _ = decode_fail(&bytes);
            if let Ok(header) = Header::decode(&bytes, &job_check(&JOB)) {
                let _ = header.check_max(cap);
            }
        }

        #[test]
        fn decoding_mutated_frames_never_panics(job in any::<[u8; 16]>(), at in 0usize..64, byte in any::<u8>(),
                                                payload in proptest::collection::vec(any::<u8>(), 0..68)) {
            // Mostly-valid frames reach deeper checks than random bytes do.
            let mut bytes = encode_frame(FrameKind::Hello, 0, &job_check(&job), &payload);
            if let Some(slot) = bytes.get_mut(at) {
                *slot = byte;
            }
            let _ = Hello::decode_frame(&bytes, &job);
            let _ = decode_frame(&bytes, &job_check(&job), 64);
        }
    }
}
