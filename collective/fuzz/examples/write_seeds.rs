//! Writes the seed corpora (a few valid encodings per target) under `corpus/<target>/seed-*`.
//! Run from anywhere: `cargo run --manifest-path collective/fuzz/Cargo.toml --example write_seeds`.

use std::fs;
use std::path::Path;

use kolo_collective::wire::{
    encode_frame, job_check, FrameKind, Hello, JobId, OpDescriptor, OpKind,
};
use kolo_collective::{DType, ReduceOp};

/// The job id the frame target decodes for (the same constant as in fuzz_targets/frame.rs).
const JOB: JobId = *b"kolo-fuzz-job-id";

fn descriptors() -> Vec<OpDescriptor> {
    let allreduce = OpDescriptor {
        dtype: DType::F32,
        shape: vec![4, 3],
        op: Some(ReduceOp::Average),
        prescale: 0.5,
        ..OpDescriptor::new(OpKind::Allreduce, "grad.layer1.weight")
    };
    let alltoall = OpDescriptor {
        dtype: DType::I64,
        shape: vec![6],
        splits: vec![1, 2, 3],
        ..OpDescriptor::new(OpKind::Alltoall, "a2a")
    };
    let broadcast = OpDescriptor {
        dtype: DType::BF16,
        shape: vec![2, 2, 2],
        root: 1,
        device: true,
        ..OpDescriptor::new(OpKind::Broadcast, "bcast")
    };
    let invalid = OpDescriptor {
        invalid: Some("shape mismatch on rank 2".into()),
        ..OpDescriptor::new(OpKind::Allgather, "ag")
    };
    vec![
        allreduce,
        alltoall,
        broadcast,
        invalid,
        OpDescriptor::new(OpKind::Barrier, ""),
    ]
}

fn cycle_message(flags: u8, bits: &[u64], requests: &[OpDescriptor]) -> Vec<u8> {
    let mut out = vec![flags];
    out.extend_from_slice(&(bits.len() as u32).to_le_bytes());
    for word in bits {
        out.extend_from_slice(&word.to_le_bytes());
    }
    out.extend_from_slice(&(requests.len() as u32).to_le_bytes());
    for desc in requests {
        let bytes = desc.encode();
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(&bytes);
    }
    out
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join(format!("seed-{name}")), bytes).unwrap();
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let descs = descriptors();
    let size = 4u8;

    // descriptor: job size, then the payload.
    for (i, desc) in descs.iter().enumerate() {
        let mut input = vec![size];
        input.extend_from_slice(&desc.encode());
        write(
            &root.join("descriptor"),
            &format!("{i}-{}", desc.kind),
            &input,
        );
    }

    // frame: payload cap (u16 LE), then whole frames.
    let check = job_check(&JOB);
    let cap = 4096u16.to_le_bytes();
    let hello = Hello {
        job_id: JOB,
        from: 1,
        to: 0,
        size: 4,
        round: 0,
        nonce: [7; 32],
    };
    let frames: Vec<(&str, Vec<u8>)> = vec![
        ("hello", hello.encode_frame()),
        (
            "descriptor",
            encode_frame(FrameKind::Descriptor, 7, &check, &descs[0].encode()),
        ),
        (
            "data",
            encode_frame(FrameKind::Data, 7, &check, &[1, 2, 3, 4, 5, 6, 7, 8]),
        ),
        (
            "fail",
            encode_frame(
                FrameKind::Fail,
                9,
                &check,
                "rank 3 failed: out of memory".as_bytes(),
            ),
        ),
    ];
    for (name, frame) in frames {
        let mut input = cap.to_vec();
        input.extend_from_slice(&frame);
        write(&root.join("frame"), name, &input);
    }

    // cycle_message: job size, cache capacity (u16 LE), then the message.
    let capacity = 1024u16.to_le_bytes();
    let messages: Vec<(&str, Vec<u8>)> = vec![
        ("empty", cycle_message(0, &[], &[])),
        ("cached", cycle_message(0, &[0b1011, 1 << 63], &[])),
        ("requests", cycle_message(1, &[4], &descs)),
        ("shutdown", cycle_message(2 | 4, &[], &descs[4..])),
    ];
    for (name, message) in messages {
        let mut input = vec![size];
        input.extend_from_slice(&capacity);
        input.extend_from_slice(&message);
        write(&root.join("cycle_message"), name, &input);
    }
}
