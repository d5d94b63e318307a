//! Any bytes through format detection, splitting and decoding: an error
//! or output, never a panic, hang or unbounded allocation.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(format) = cairn_codec::Format::detect(data) {
        let _ = cairn_codec::format::decode_as(format, data, 64 << 20);
    }
});
