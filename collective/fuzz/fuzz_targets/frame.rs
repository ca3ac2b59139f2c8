//! The data-plane frame decoder: `Header::decode`, `decode_frame`, `Hello` and `Fail` payloads.
//!
//! Input: two bytes of payload cap (u16 LE) for descriptor and data frames, then the bytes on
//! the wire. The job id is fixed (the seeds carry its check, which the decoder compares in
//! constant time, so the fuzzer could not find it by comparison tracing).
#![no_main]

use kolo_collective::wire::{
    decode_fail, decode_frame, encode_fail, encode_frame, job_check, FrameKind, Header, Hello,
    JobId, HEADER_LEN, HELLO_LEN, MAX_FAIL_LEN, PROOF_LEN,
};
use libfuzzer_sys::fuzz_target;

/// The job id every seed was written for.
const JOB: JobId = *b"kolo-fuzz-job-id";

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let cap = usize::from(u16::from_le_bytes([data[0], data[1]]));
    let bytes = &data[2..];
    let check = job_check(&JOB);

    if let Ok(header) = Header::decode(bytes, &check) {
        // A header that decodes is canonical: encoding it gives back the same 28 bytes.
        assert_eq!(&header.encode(&check)[..], &bytes[..HEADER_LEN]);
        if let Ok(len) = header.check_max(cap) {
            assert!(len <= cap && len as u64 == header.len);
        }
        let _ = header.expect(header.kind, header.tag, cap);
    }

    if let Ok((header, payload, used)) = decode_frame(bytes, &check, cap) {
        assert_eq!(used, HEADER_LEN + payload.len());
        assert_eq!(header.len, payload.len() as u64);
        let max = match header.kind {
            FrameKind::Hello => HELLO_LEN,
            FrameKind::Proof => PROOF_LEN,
            FrameKind::Fail => MAX_FAIL_LEN,
            FrameKind::Descriptor | FrameKind::Data => cap,
        };
        assert!(payload.len() <= max, "{} > {max}", payload.len());
        // decode → encode gives the same bytes.
        assert_eq!(
            encode_frame(header.kind, header.tag, &check, payload),
            &bytes[..used]
        );
        match header.kind {
            FrameKind::Hello => {
                if let Ok(hello) = Hello::decode(payload) {
                    assert_eq!(&hello.encode()[..], payload);
                }
            }
            FrameKind::Fail => {
                let reason = decode_fail(payload);
                let again = encode_fail(&reason);
                assert!(again.len() <= MAX_FAIL_LEN);
                if reason.len() <= MAX_FAIL_LEN {
                    assert_eq!(decode_fail(&again), reason);
                }
            }
            FrameKind::Descriptor | FrameKind::Data | FrameKind::Proof => {}
        }
    }

    if let Ok(hello) = Hello::decode_frame(bytes, &JOB) {
        assert_eq!(hello.job_id, JOB);
        assert_eq!(hello.encode_frame(), &bytes[..HEADER_LEN + HELLO_LEN]);
    }
});
