//! The .lzma splitter on arbitrary bytes: an error or output, never a
//! panic, and never more output than the limit.
#![no_main]
use cairn_codec::Format;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if !cairn_codec::format::lzma::is_header(data) {
        return;
    }
    let _ = cairn_codec::format::decode_as(Format::Lzma, data, 64 << 20);
});
