//! The engine's cycle message (`CycleMessage::decode`, engine/message.rs), which every member
//! of a process set decodes from every other member once per cycle.
//!
//! Input: one byte of job size, two bytes of response-cache capacity (u16 LE), then the message.
#![no_main]

use kolo_collective::engine::fuzzing::CycleMessage;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let world = usize::from(data[0]);
    let capacity = usize::from(u16::from_le_bytes([data[1], data[2]]));
    let bytes = &data[3..];
    if let Ok(message) = CycleMessage::decode(bytes, world, capacity) {
        // What decodes is canonical: encoding gives back the same bytes.
        assert_eq!(message.encode(), bytes);
        assert!(message.bits().len() <= capacity.div_ceil(64));
        let indices = message.bit_indices();
        let set: u32 = message.bits().iter().map(|w| w.count_ones()).sum();
        assert_eq!(indices.len(), set as usize);
        assert!(indices.windows(2).all(|w| w[0] < w[1]));
        assert!(indices.iter().all(|&b| b < 64 * message.bits().len()));
        assert!(message.requests().iter().all(|d| d.splits.len() <= world));
    }
});
