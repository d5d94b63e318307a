//! Inflating one DEFLATE stream (a gzip member written by gzip or pigz) on
//! every core.
//!
//! The stream is cut into chunks of [`CHUNK`] compressed bytes. A worker
//! takes chunk `k`, looks for the first block that starts in it
//! ([`marker::find_block`]) and decodes from there without the window
//! before it, writing markers for the bytes it cannot know
//! ([`marker::MarkerDecoder`]). As soon as the last 32 KiB it decoded hold
//! no marker, it hands the rest of the chunk to zlib-rs with that output as
//! the dictionary, at library speed. A worker stops at the first dynamic
//! block that starts at or after the next chunk's first bit: exactly where
//! the next chunk's search begins its decoding, when that search found the
//! true block.
//!
//! The reader of the output (the splitter's thread) takes the chunks in
//! order. A chunk whose start is where the one before ended is stitched
//! on: its markers are replaced by the bytes of the 32 KiB before it, and
//! its bytes pass through. A chunk that starts elsewhere (a false guess, a
//! stretch with no dynamic block) is thrown away and its part decoded again
//! from where the output stands, with the window known. The CRC and size
//! are checked over the whole member by the caller, so neither a guess nor
//! damage can go unnoticed.
//!
//! Why hand-written: no crate decodes DEFLATE without its window, and the
//! libraries cannot be started at a guessed block. What is written here is
//! that first stage and the chunking; the bulk of the bytes goes through
//! zlib-rs. The design is rapidgzip's (Knespel and Brunst, 2023).

pub mod marker;
mod zstream;

use crate::error::{CodecError, Result};
use crate::input::SharedBytes;
use crossbeam_channel::{bounded, Receiver, Sender};
use marker::{Bits, BlockEnd, MarkerDecoder};
use std::collections::VecDeque;
use std::thread::JoinHandle;
use zstream::ZInflate;

const NAME: &str = "gzip";

/// Compressed bytes per chunk.
pub const CHUNK: usize = 8 << 20;

/// Bytes of output per piece handed to the writer.
const PIECE: usize = 2 << 20;

/// Marker-stage output at which a chunk gives up waiting for a clean window
/// and leaves the rest to the sequential path (bounds its memory).
const MARKER_CAP: usize = 32 << 20;

/// Bits before `stop` from which a chunk's inflate stops at every block
/// to look for the end (longer than any block zlib writes).
const NEAR: usize = (256 << 10) * 8;

/// Pieces a chunk may have decoded ahead of the reader.
const AHEAD: usize = 8;

/// Where a chunk's decoding starts.
enum Start {
    /// At this bit, with this window (the stream's start, or a restart).
    Known { bit: usize, window: Vec<u8> },
    /// At the first block found from this bit on.
    Find { from: usize },
}

struct Task {
    start: Start,
    /// The chunk ends at the first dynamic block starting at or after this
    /// bit.
    stop: usize,
    tx: Sender<Piece>,
}

/// What a chunk sends the reader, in order: `Start`, at most one
/// `Markers`, `Bytes`, then `End`.
enum Piece {
    /// Where the chunk's first block starts; `None` when none was found.
    Start(Option<usize>),
    /// Output with markers, to resolve against the window.
    Markers(Vec<u16>),
    /// Output bytes, with their CRC.
    Bytes(Vec<u8>, crc32fast::Hasher),
    End(End),
}

enum End {
    /// The chunk's output ends at this bit, a block boundary.
    Boundary(usize),
    /// The stream's final block ends at this bit.
    Last(usize),
    /// The data is not valid DEFLATE at about this bit.
    Failed(usize, &'static str),
    /// The data ends inside the stream.
    Truncated(usize),
}

/// A member being inflated by the workers; the reader side.
pub struct ParallelInflate {
    data: SharedBytes,
    work: Option<Sender<Task>>,
    workers: Vec<JoinHandle<()>>,
    /// Chunks handed out, in order: their first bit and their output.
    queue: VecDeque<(usize, Receiver<Piece>)>,
    /// Next chunk to hand out.
    next_chunk: usize,
    /// The chunk being read.
    current: Option<Receiver<Piece>>,
    /// Bit where the output read so far ends.
    pos: usize,
    /// The last 32 KiB (or fewer) of output.
    window: Vec<u8>,
    crc: crc32fast::Hasher,
    size: u64,
    end: Option<usize>,
    depth: usize,
    /// Compressed bytes per chunk.
    chunk: usize,
}

impl ParallelInflate {
    /// Inflate the raw DEFLATE stream at the start of `data` on `threads`
    /// workers.
    pub fn new(data: SharedBytes, threads: usize) -> Self {
        Self::with_chunk(data, threads, CHUNK)
    }

    /// Like [`Self::new`] with chunks of `chunk` compressed bytes.
    pub fn with_chunk(data: SharedBytes, threads: usize, chunk: usize) -> Self {
        let threads = threads.max(1);
        let (work, rx) = bounded::<Task>(threads * 2);
        let workers = (0..threads)
            .map(|_| {
                let rx = rx.clone();
                let data = data.clone();
                std::thread::spawn(move || {
                    for task in rx {
                        run_chunk(data.as_slice(), task);
                    }
                })
            })
            .collect();
        let mut p = ParallelInflate {
            data,
            work: Some(work),
            workers,
            queue: VecDeque::new(),
            next_chunk: 0,
            current: None,
            pos: 0,
            window: Vec::with_capacity(marker::WINDOW),
            crc: crc32fast::Hasher::new(),
            size: 0,
            end: None,
            depth: threads + 1,
            chunk: chunk.max(1),
        };
        p.fill_queue();
        p
    }

    fn bits(&self) -> usize {
        self.data.as_slice().len() * 8
    }

    /// Hand out chunks until `depth` are waiting.
    fn fill_queue(&mut self) {
        let Some(work) = &self.work else { return };
        while self.queue.len() < self.depth {
            let from = self.next_chunk * self.chunk * 8;
            if from >= self.data.as_slice().len() * 8 {
                return;
            }
            let (tx, rx) = bounded(AHEAD);
            let start = if self.next_chunk == 0 {
                Start::Known {
                    bit: 0,
                    window: Vec::new(),
                }
            } else {
                Start::Find { from }
            };
            let task = Task {
                start,
                stop: from + self.chunk * 8,
                tx,
            };
            if work.send(task).is_err() {
                return;
            }
            self.queue.push_back((from, rx));
            self.next_chunk += 1;
        }
    }

    /// Decode the next piece of output into `out` (empty on entry);
    /// `false` once the final block has been read.
    pub fn next_piece(&mut self, out: &mut Vec<u8>) -> Result<bool> {
        loop {
            if self.end.is_some() {
                return Ok(false);
            }
            let Some(rx) = &self.current else {
                self.next_chunk_in_order()?;
                continue;
            };
            let piece = rx.recv().map_err(|_| self.lost())?;
            match piece {
                Piece::Start(_) => return Err(self.lost()),
                Piece::Markers(m) => {
                    let at = (self.pos / 8) as u64;
                    marker::resolve(&m, &self.window, out, at)?;
                    self.crc.update(out);
                    self.took(out);
                    return Ok(true);
                }
                Piece::Bytes(mut b, crc) => {
                    std::mem::swap(out, &mut b);
                    self.crc.combine(&crc);
                    self.took(out);
                    return Ok(true);
                }
                Piece::End(End::Boundary(bit)) => {
                    self.pos = bit;
                    self.current = None;
                }
                Piece::End(End::Last(bit)) => {
                    self.pos = bit;
                    self.current = None;
                    self.end = Some(bit);
                }
                Piece::End(End::Failed(bit, reason)) => {
                    return Err(CodecError::corrupt(NAME, (bit / 8) as u64, reason));
                }
                Piece::End(End::Truncated(bit)) => {
                    return Err(CodecError::Truncated {
                        format: NAME,
                        offset: (bit / 8) as u64,
                    });
                }
            }
        }
    }

    /// Account for output handed out: size and window.
    fn took(&mut self, out: &[u8]) {
        self.size += out.len() as u64;
        if out.len() >= marker::WINDOW {
            self.window.clear();
            self.window
                .extend_from_slice(&out[out.len() - marker::WINDOW..]);
        } else {
            let keep = (marker::WINDOW - out.len()).min(self.window.len());
            self.window.drain(..self.window.len() - keep);
            self.window.extend_from_slice(out);
        }
    }

    /// Make the chunk that continues at `pos` current: the next handed-out
    /// chunk if it starts there, else a restart from `pos` on a thread of
    /// its own (the pool keeps working ahead).
    fn next_chunk_in_order(&mut self) -> Result<()> {
        self.fill_queue();
        while let Some((_, rx)) = self.queue.pop_front() {
            let start = match rx.recv() {
                Ok(Piece::Start(s)) => s,
                _ => return Err(self.lost()),
            };
            self.fill_queue();
            match start {
                Some(s) if s == self.pos => {
                    self.current = Some(rx);
                    return Ok(());
                }
                Some(s) if s > self.pos => break,
                // Found nothing, or a block the output has passed.
                _ => continue,
            }
        }
        // Decode from `pos`, with the window known, up to where the next
        // handed-out chunk begins its search.
        let stop = match self.queue.front() {
            Some((from, _)) => *from,
            None => self.bits() + 1,
        };
        let (tx, rx) = bounded(AHEAD);
        let task = Task {
            start: Start::Known {
                bit: self.pos,
                window: self.window.clone(),
            },
            stop: stop.max(self.pos + 1),
            tx,
        };
        let data = self.data.clone();
        std::thread::spawn(move || run_chunk(data.as_slice(), task));
        match rx.recv() {
            Ok(Piece::Start(Some(_))) => {}
            _ => return Err(self.lost()),
        }
        self.current = Some(rx);
        Ok(())
    }

    fn lost(&self) -> CodecError {
        CodecError::corrupt(
            NAME,
            (self.pos / 8) as u64,
            "internal: a parallel inflate worker stopped",
        )
    }

    /// Once [`Self::next_piece`] said `false`: the bytes the DEFLATE
    /// stream took (through its last byte), the CRC-32 and the size of the
    /// output.
    pub fn finish(&self) -> (usize, u32, u64) {
        let end = self.end.unwrap_or(self.pos);
        (end.div_ceil(8), self.crc.clone().finalize(), self.size)
    }
}

impl Drop for ParallelInflate {
    fn drop(&mut self) {
        // Closing the channels makes every worker's next send fail and the
        // pool's loop end.
        self.work = None;
        self.queue.clear();
        self.current = None;
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Decode one chunk, sending its pieces; returns early when the reader has
/// gone (a send fails).
fn run_chunk(data: &[u8], task: Task) {
    let Task { start, stop, tx } = task;
    match start {
        Start::Known { bit, window } => {
            if tx.send(Piece::Start(Some(bit))).is_ok() {
                inflate_known(data, bit, &window, stop, &tx);
            }
        }
        Start::Find { from } => {
            let mut dec = MarkerDecoder::default();
            let Some((first, end, next)) = marker::find_block(&mut dec, data, from, stop) else {
                let _ = tx.send(Piece::Start(None));
                return;
            };
            if tx.send(Piece::Start(Some(first))).is_err() {
                return;
            }
            let mut pos = next;
            let mut last = end == BlockEnd::Last;
            let end = loop {
                if last {
                    break End::Last(pos);
                }
                if pos >= stop && marker::starts_dynamic(data, pos) {
                    break End::Boundary(pos);
                }
                if dec.window_known() {
                    let window = dec.window();
                    if tx
                        .send(Piece::Markers(std::mem::take(&mut dec.out)))
                        .is_ok()
                    {
                        inflate_known(data, pos, &window, stop, &tx);
                    }
                    return;
                }
                if dec.out.len() >= MARKER_CAP {
                    break End::Boundary(pos);
                }
                let mark = dec.out.len();
                let mut bits = Bits::new(data, pos);
                match dec.block(&mut bits) {
                    Ok(e) => {
                        pos = bits.pos();
                        last = e == BlockEnd::Last;
                    }
                    Err(e) => {
                        dec.out.truncate(mark);
                        break match e {
                            marker::Stop::OutOfData => End::Truncated(pos),
                            marker::Stop::Invalid(r) => End::Failed(pos, r),
                        };
                    }
                }
            };
            if tx.send(Piece::Markers(dec.out)).is_ok() {
                let _ = tx.send(Piece::End(end));
            }
        }
    }
}

/// Inflate from bit `bit` with `window` before it, with zlib-rs, sending
/// pieces of bytes, until the first dynamic block at or after `stop`, or
/// the final block's end.
fn inflate_known(data: &[u8], bit: usize, window: &[u8], stop: usize, tx: &Sender<Piece>) {
    let end = match inflate_known_inner(data, bit, window, stop, tx) {
        Ok(Some(end)) => end,
        Ok(None) => return,
        Err(e) => e,
    };
    let _ = tx.send(Piece::End(end));
}

fn inflate_known_inner(
    data: &[u8],
    bit: usize,
    window: &[u8],
    stop: usize,
    tx: &Sender<Piece>,
) -> std::result::Result<Option<End>, End> {
    let mut z = ZInflate::new().ok_or(End::Failed(bit, "out of memory for inflate"))?;
    let mut at = bit / 8;
    let skip = bit % 8;
    if skip != 0 {
        let byte = *data.get(at).ok_or(End::Truncated(bit))?;
        if !z.prime(8 - skip as u32, u32::from(byte >> skip)) {
            return Err(End::Failed(bit, "inflate refused a start position"));
        }
        at += 1;
    }
    if !window.is_empty() && !z.set_dictionary(window) {
        return Err(End::Failed(bit, "inflate refused a window"));
    }
    let mut piece: Vec<u8> = Vec::with_capacity(PIECE);
    let mut crc = crc32fast::Hasher::new();
    let mut crc_done = 0;
    let send = |piece: &mut Vec<u8>, crc: &mut crc32fast::Hasher, crc_done: &mut usize| {
        crc.update(&piece[*crc_done..]);
        *crc_done = 0;
        let full = std::mem::replace(piece, Vec::with_capacity(PIECE));
        let c = std::mem::replace(crc, crc32fast::Hasher::new());
        tx.send(Piece::Bytes(full, c)).is_ok()
    };
    loop {
        if piece.len() >= PIECE {
            if !send(&mut piece, &mut crc, &mut crc_done) {
                return Ok(None);
            }
        } else if piece.capacity() - piece.len() < 64 << 10 {
            // A long block: hash what is there, then grow.
            crc.update(&piece[crc_done..]);
            crc_done = piece.len();
            piece.reserve(PIECE);
        }
        // Far from `stop`, inflate without stopping at each block (zlib
        // then updates its window once per call, not once per block).
        let near = (stop.saturating_sub(NEAR) / 8).min(data.len());
        let (input, block) = if at < near {
            (&data[at..near], false)
        } else {
            (&data[at.min(data.len())..], true)
        };
        let step = z
            .inflate(input, &mut piece, block)
            .map_err(|reason| End::Failed(at * 8, reason))?;
        at += step.consumed;
        let here = at * 8 - step.unused_bits as usize;
        if step.end {
            if !piece.is_empty() && !send(&mut piece, &mut crc, &mut crc_done) {
                return Ok(None);
            }
            return Ok(Some(End::Last(here)));
        }
        if block && step.at_block_end && here >= stop && marker::starts_dynamic(data, here) {
            if !piece.is_empty() && !send(&mut piece, &mut crc, &mut crc_done) {
                return Ok(None);
            }
            return Ok(Some(End::Boundary(here)));
        }
        if block && step.consumed == 0 && step.produced == 0 && at >= data.len() {
            return Err(End::Truncated(at * 8));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // Tests fail loudly by design.

    use super::*;
    use proptest::prelude::*;
    use std::io::Write;

    /// Data with what a disk image has: text-like runs that repeat at
    /// distances near and far (so chunks start with back-references into
    /// the unknown window), zero runs, and incompressible stretches (stored
    /// blocks).
    fn image_like(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let words: Vec<Vec<u8>> = (0..300)
            .map(|i| format!("w{}{} ", i * 7919 % 1000, ["ab", "xyz", "q"][i % 3]).into_bytes())
            .collect();
        let mut v = Vec::with_capacity(len);
        while v.len() < len {
            match rnd() % 10 {
                0 => v.resize(v.len() + (rnd() % 70_000) as usize, 0),
                1 => {
                    let n = (rnd() % 40_000) as usize;
                    v.extend((0..n).map(|_| rnd() as u8));
                }
                2 if v.len() > 40_000 => {
                    let from = v.len() - 1 - (rnd() % 32_000) as usize;
                    let n = (rnd() % 3_000) as usize;
                    for k in 0..n {
                        let b = v[from + k % (v.len() - from)];
                        v.push(b);
                    }
                }
                _ => {
                    for _ in 0..(rnd() % 2_000) {
                        v.extend_from_slice(&words[(rnd() % 300) as usize]);
                    }
                }
            }
        }
        v.truncate(len);
        v
    }

    fn deflate(data: &[u8], level: u32) -> Vec<u8> {
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::new(level));
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    /// Every block boundary of a stream as (bit, output offset), by zlib.
    fn boundaries(stream: &[u8]) -> Vec<(usize, usize)> {
        let mut z = ZInflate::new().unwrap();
        let mut out = Vec::with_capacity(1 << 20);
        let mut at = 0;
        let mut total = 0;
        let mut v = Vec::new();
        loop {
            out.clear();
            let step = z.inflate(&stream[at..], &mut out, true).unwrap();
            at += step.consumed;
            total += step.produced;
            if step.end {
                return v;
            }
            if step.at_block_end {
                v.push((at * 8 - step.unused_bits as usize, total));
            }
        }
    }

    #[test]
    fn the_marker_decoder_reads_a_whole_stream_from_its_start() {
        let data = image_like(3 << 20, 7);
        let stream = deflate(&data, 6);
        let mut dec = MarkerDecoder::default();
        let mut bits = Bits::new(&stream, 0);
        while dec.block(&mut bits).unwrap() == BlockEnd::More {}
        let mut got = Vec::new();
        marker::resolve(&dec.out, &[], &mut got, 0).unwrap();
        assert!(got == data);
    }

    #[test]
    fn zlib_resumes_at_every_block_boundary_with_the_window() {
        let data = image_like(2 << 20, 11);
        let stream = deflate(&data, 6);
        let b = boundaries(&stream);
        assert!(b.len() > 10, "{} blocks", b.len());
        for &(bit, off) in b.iter().step_by(3) {
            let mut z = ZInflate::new().unwrap();
            let mut at = bit / 8;
            if bit % 8 != 0 {
                assert!(z.prime(8 - (bit % 8) as u32, u32::from(stream[at] >> (bit % 8))));
                at += 1;
            }
            assert!(z.set_dictionary(&data[off.saturating_sub(marker::WINDOW)..off]));
            let mut out = Vec::with_capacity(data.len() - off + 1);
            let step = z.inflate(&stream[at..], &mut out, false).unwrap();
            assert!(step.end, "stream did not end from bit {bit}");
            assert!(out == data[off..], "output differs from bit {bit}");
        }
    }

    #[test]
    fn found_blocks_are_true_boundaries_and_their_markers_resolve() {
        let data = image_like(4 << 20, 3);
        let stream = deflate(&data, 6);
        let b = boundaries(&stream);
        let mut dec = MarkerDecoder::default();
        let mut found = 0;
        for from in (1..8).map(|k| k * stream.len() * 8 / 8) {
            let Some((bit, _, next)) = marker::find_block(&mut dec, &stream, from, usize::MAX)
            else {
                continue;
            };
            found += 1;
            let off = b.iter().find(|x| x.0 == bit).expect("a true boundary").1;
            let end = b
                .iter()
                .find(|x| x.0 == next)
                .map(|x| x.1)
                .unwrap_or(data.len());
            let mut got = Vec::new();
            let window = &data[off.saturating_sub(marker::WINDOW)..off];
            marker::resolve(&dec.out, window, &mut got, 0).unwrap();
            assert!(got == data[off..end]);
        }
        assert!(found >= 5);
    }

    fn parallel(stream: &[u8], threads: usize, chunk: usize) -> Result<(Vec<u8>, usize, u32)> {
        let mut p =
            ParallelInflate::with_chunk(SharedBytes::from_vec(stream.to_vec()), threads, chunk);
        let mut out = Vec::new();
        let mut piece = Vec::new();
        while p.next_piece(&mut piece)? {
            out.extend_from_slice(&piece);
            piece.clear();
        }
        let (used, crc, size) = p.finish();
        assert_eq!(size, out.len() as u64);
        Ok((out, used, crc))
    }

    #[test]
    fn parallel_inflate_equals_the_stream_for_chunk_sizes_and_levels() {
        let data = image_like(6 << 20, 5);
        for level in [1, 6, 9] {
            let mut stream = deflate(&data, level);
            let len = stream.len();
            // What follows a member (its trailer) is not read.
            stream.extend_from_slice(b"trailer!");
            for (threads, chunk) in [(2, 64 << 10), (3, 200_000), (2, 1 << 20), (1, 300_000)] {
                let (out, used, crc) = parallel(&stream, threads, chunk).unwrap();
                assert!(out == data, "level {level} threads {threads} chunk {chunk}");
                assert_eq!(used, len);
                assert_eq!(crc, crc32fast::hash(&data));
            }
        }
    }

    #[test]
    fn parallel_inflate_reads_libdeflate_streams() {
        // libdeflate writes much longer blocks than zlib.
        let data = image_like(3 << 20, 9);
        let mut c = libdeflater::Compressor::new(libdeflater::CompressionLvl::new(9).unwrap());
        let mut stream = vec![0; c.deflate_compress_bound(data.len())];
        let n = c.deflate_compress(&data, &mut stream).unwrap();
        stream.truncate(n);
        let (out, used, _) = parallel(&stream, 2, 64 << 10).unwrap();
        assert!(out == data);
        assert_eq!(used, n);
    }

    #[test]
    fn damage_and_truncation_are_errors_or_a_wrong_crc_never_a_hang() {
        let data = image_like(3 << 20, 13);
        let stream = deflate(&data, 6);
        let good = crc32fast::hash(&data);
        let cut = &stream[..stream.len() * 2 / 3];
        assert!(matches!(
            parallel(cut, 2, 100_000),
            Err(CodecError::Truncated { .. })
        ));
        for k in 1..12 {
            let mut bad = stream.clone();
            let at = bad.len() * k / 12;
            bad[at] ^= 0x5a;
            if let Ok((out, _, crc)) = parallel(&bad, 2, 100_000) {
                assert!(crc != good || out == data, "damage at {at} went unnoticed");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn parallel_inflate_round_trips(seed in 1u64.., len in 0usize..600_000, chunk in 2_000usize..80_000, level in 0u32..10) {
            let data = image_like(len, seed);
            let stream = deflate(&data, level);
            let (out, used, crc) = parallel(&stream, 2, chunk).unwrap();
            prop_assert!(out == data);
            prop_assert_eq!(used, stream.len());
            prop_assert_eq!(crc, crc32fast::hash(&data));
        }
    }
}
