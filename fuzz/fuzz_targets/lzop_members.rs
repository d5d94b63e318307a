//! `lzop -l`'s walk of a file (each member's header, its blocks' sizes)
//! on arbitrary bytes behind the lzop magic, passing over block data by
//! seeking as it does on a file: members or an error, never a panic, an
//! overflow or an allocation the bytes ask for.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut file = cairn_codec::format::lzop::MAGIC.to_vec();
    file.extend_from_slice(data);
    let mut r = std::io::Cursor::new(file);
    let _ = cairn_codec::format::lzop::members(&mut r, |r, n| {
        let at = r.position().saturating_add(n);
        r.set_position(at);
        Ok(())
    });
});
