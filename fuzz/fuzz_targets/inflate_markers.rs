//! The parallel inflater's first stage on arbitrary bytes: the marker
//! decoder from the first bit, the block finder from the middle, and the
//! parallel inflater itself with tiny chunks: an error or output, never a
//! panic or a hang.
#![no_main]
use cairn_codec::inflate::{marker, ParallelInflate};
use cairn_codec::input::SharedBytes;
use libfuzzer_sys::fuzz_target;

#[path = "drain.rs"]
mod drain;

fuzz_target!(|data: &[u8]| {
    let mut dec = marker::MarkerDecoder::default();
    let mut bits = marker::Bits::new(data, 0);
    while dec.out.len() < 1 << 24 {
        match dec.block(&mut bits) {
            Ok(marker::BlockEnd::More) => continue,
            _ => break,
        }
    }
    let _ = marker::find_block(&mut dec, data, data.len() * 4, usize::MAX);
    let mut p = ParallelInflate::with_chunk(SharedBytes::from_vec(data.to_vec()), 2, 97, 1000);
    let _ = drain::drain(&mut p);
});
