//! The lz4 splitter and unit decoder on arbitrary bytes behind a valid
//! magic, seeded by a real cairn stream: an error or output, never a panic.
#![no_main]
use cairn_codec::Format;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cairn_codec::format::decode_as(Format::Lz4, data, 64 << 20);
});
