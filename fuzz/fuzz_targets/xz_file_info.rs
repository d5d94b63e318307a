//! `xz -l`'s walk of a file from its end (footers, indexes, headers) on
//! arbitrary bytes behind the stream magic: counts or an error, never a
//! panic or an overflow.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut file = cairn_codec::format::xz::HEADER_MAGIC.to_vec();
    file.extend_from_slice(data);
    let size = file.len() as u64;
    let _ = cairn_codec::format::xz::file_info(&mut std::io::Cursor::new(file), size);
});
