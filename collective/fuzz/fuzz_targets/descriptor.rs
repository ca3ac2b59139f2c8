//! The collective descriptor (`OpDescriptor::decode`), which every rank decodes from every
//! peer before any tensor bytes move.
//!
//! Input: one byte of job size (which bounds the splits), then the payload.
#![no_main]

use kolo_collective::wire::OpDescriptor;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&size, payload)) = data.split_first() else {
        return;
    };
    let size = usize::from(size);
    if let Ok(desc) = OpDescriptor::decode(payload, size) {
        // What decodes is canonical: encoding gives back the same bytes, within the bound the
        // receiver allocates for, and decodes to the same descriptor (NaN scales bit for bit,
        // which the byte equality covers).
        let bytes = desc.encode();
        assert_eq!(bytes, payload);
        assert!(bytes.len() <= OpDescriptor::max_encoded_len(size));
        assert!(desc.splits.len() <= size);
        let again = OpDescriptor::decode(&bytes, size).expect("an encoded descriptor decodes");
        assert_eq!(again.encode(), bytes);
    }
});
