//! The parallel inflater's first stage on arbitrary bytes: the marker
//! decoder from the first bit, the block finder from the middle, the
//! parallel inflater itself with tiny chunks, and the same read as from a
//! pipe, a segment at a time: an error or output, never a panic or a hang.
#![no_main]
use cairn_codec::inflate::segmented::{Opened, Segmented, Source, Step};
use cairn_codec::inflate::{marker, ParallelInflate};
use cairn_codec::input::SharedBytes;
use libfuzzer_sys::fuzz_target;

#[path = "drain.rs"]
mod drain;

/// The bytes as a pipe would give them; a put-back that is not what was
/// read panics.
struct Slice<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Source for Slice<'_> {
    fn read_up_to(&mut self, dst: &mut Vec<u8>, max: usize) -> cairn_codec::Result<usize> {
        let n = max.min(self.data.len() - self.pos);
        dst.extend_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }

    fn unread(&mut self, bytes: &[u8]) {
        assert!(
            self.data[..self.pos].ends_with(bytes),
            "put back what was not read"
        );
        self.pos -= bytes.len();
    }
}

fuzz_target!(|data: &[u8]| {
    let mut dec = marker::MarkerDecoder::default();
    let mut bits = marker::Bits::new(data, 0);
    while dec.output().len() < 1 << 24 {
        match dec.block(&mut bits) {
            Ok(marker::BlockEnd::More) => continue,
            _ => break,
        }
    }
    let _ = marker::find_block(&mut dec, data, data.len() * 4, usize::MAX);
    let mut p = ParallelInflate::with_chunk(SharedBytes::from_vec(data.to_vec()), 2, 97, 1000);
    let _ = drain::drain(&mut p);
    let mut src = Slice { data, pos: 0 };
    if let Ok(Opened::Parallel(mut s)) = Segmented::start(&mut src, 2, 97, 0) {
        let mut out = Vec::new();
        let mut total = 0usize;
        while total < 1 << 26 {
            out.clear();
            let mut lent = None;
            match s.next_piece(&mut src, &mut out, &mut lent) {
                Ok(Step::Piece) => total += out.len() + lent.map_or(0, |l| l.as_slice().len()) + 1,
                _ => break,
            }
        }
    }
});
