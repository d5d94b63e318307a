//! The gzip checkpoint index parser (`cairn unpack --index`) on arbitrary
//! bytes: an error or an index that writes back the same, never a panic;
//! and an index that parses, used on the same bytes as a DEFLATE stream,
//! gives an error or output, never a panic or a hang.
#![no_main]
use cairn_codec::inflate::ParallelInflate;
use cairn_codec::input::SharedBytes;
use cairn_codec::GzipIndex;
use libfuzzer_sys::fuzz_target;

#[path = "drain.rs"]
mod drain;

fuzz_target!(|data: &[u8]| {
    let Ok(index) = GzipIndex::decode(data) else {
        return;
    };
    assert_eq!(GzipIndex::decode(&index.encode()).ok(), Some(index.clone()));
    for (_, member) in index.members.into_iter().take(2) {
        if member.chunk_bits < 8 * 64 {
            continue;
        }
        let bytes = SharedBytes::from_vec(data.to_vec());
        let mut p = ParallelInflate::with_index(bytes, 2, member);
        drain::drain(&mut p);
    }
});
