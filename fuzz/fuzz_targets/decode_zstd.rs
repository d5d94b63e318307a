//! The zstd splitter and unit decoder on arbitrary bytes behind a valid
//! magic, seeded by a real cairn stream: an error or output, never a panic.
//! The bytes are decoded twice: from memory (frames found by walking block
//! headers) and from a regular file, where a seek table at the end, when
//! its sizes add up, cuts the frames; both must give the same output.
#![no_main]
use cairn_codec::{Format, Input};
use libfuzzer_sys::fuzz_target;
use std::io::{Seek, Write};

const LIMIT: usize = 64 << 20;

fuzz_target!(|data: &[u8]| {
    let from_memory = cairn_codec::format::decode_as(Format::Zstd, data, LIMIT);
    let Ok(mut f) = tempfile::tempfile() else {
        return;
    };
    if f.write_all(data).and_then(|()| f.rewind()).is_err() {
        return;
    }
    let from_file =
        cairn_codec::format::decode_input(Format::Zstd, Input::with_prefix_file(&[], f), LIMIT);
    if let (Ok(a), Ok(b)) = (&from_memory, &from_file) {
        assert_eq!(a, b, "memory and file decodes differ");
    }
    assert_eq!(
        from_memory.is_ok(),
        from_file.is_ok(),
        "{from_memory:?} vs {from_file:?}"
    );
});
