//! Whatever the input, every format encodes it and decodes it back to the
//! same bytes, with a block size taken from the input.
#![no_main]
use cairn_codec::{decode_all, encode_all, Format};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let format = Format::ALL[usize::from(pick) % Format::ALL.len()];
    let block = 1 + usize::from(pick) * 97;
    let packed = match encode_all(format, format.default_level(), block, rest) {
        Ok(p) => p,
        Err(e) => panic!("{format}: encode failed: {e}"),
    };
    match decode_all(&packed) {
        Ok(back) => assert!(back == rest, "{format}: round trip differs"),
        Err(e) => panic!("{format}: decode of own output failed: {e}"),
    }
});
