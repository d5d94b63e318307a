//! `lz4 --list`'s walk of a file (each frame's header, its blocks' sizes,
//! legacy and skippable frames) on arbitrary bytes, behind an LZ4 frame
//! magic or not, passing over block data by seeking as it does on a file
//! (its size known) and by reading as from a stream: frames or an error,
//! never a panic, an overflow or an allocation the bytes ask for.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for magic in [&cairn_codec::format::lz4::MAGIC.to_le_bytes()[..], &[]] {
        let file = [magic, data].concat();
        let size = file.len() as u64;
        let mut r = std::io::Cursor::new(file);
        let _ = cairn_codec::format::lz4::frames(
            &mut r,
            Some(size),
            |r, n| {
                r.set_position(r.position().saturating_add(n));
                Ok(n)
            },
            &mut |_| {},
        );
        // And read as a stream: passed over by reading, its size unknown.
        let mut r = std::io::Cursor::new([magic, data].concat());
        let _ = cairn_codec::format::lz4::frames(
            &mut r,
            None,
            |r, n| std::io::copy(&mut std::io::Read::take(r, n), &mut std::io::sink()),
            &mut |_| {},
        );
    }
});
