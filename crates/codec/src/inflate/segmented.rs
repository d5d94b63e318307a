//! Inflating one DEFLATE stream that is read from a pipe on every core,
//! one segment at a time.
//!
//! A pipe cannot be mapped, and its length is unknown until it ends. So it
//! is read into memory a segment at a time (four chunks per thread, at
//! least eight), and each segment is inflated by a [`ParallelInflate`] of
//! its own, cut at a block that the block search finds near the segment's
//! end ([`super::find_cut`]). Its output reaches that block (or the first
//! block boundary after it, should the found block be a false start) with
//! the window known; the next segment starts there, with the bytes from the
//! cut on, copied aside when the segment was made, and what has been read
//! from the pipe since (a megabyte per piece handed out, so the next
//! segment is mostly read while this one is inflated).
//!
//! The segments share one [`Crew`] (the worker threads and their buffers).
//! As soon as a segment has handed out its last chunk, the next one is
//! made ahead ([`SegmentStart::Ahead`]): its chunks queue behind this one's
//! and its first chunk is decoded with markers like any other, so no core
//! idles while a segment ends. Memory is about three segments of input
//! plus the inflate's buffers, whatever the stream's length; a segment's
//! buffer is reused two segments later.
//!
//! Input that arrives slowly (the reads of one segment's bytes wait more
//! than half a second in all: under about 128 MiB/s, what one core
//! inflates) goes to one core too, from where the output stands, so that
//! a live stream's output is not held back until whole segments are in.
//!
//! A stream in which no block can be cut at within [`MAX_GROWTH`]
//! segments (long runs of stored or fixed-code blocks) is inflated on one
//! core from where the output stands ([`Step::OneCore`]); so is one that
//! ends within its first segment below the caller's minimum.

use super::{find_cut, Crew, Cut, ParallelInflate, Resume, SegmentStart, Workers};
use crate::error::{CodecError, Result};
use crate::input::SharedBytes;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a segmented inflate reads from: a stream whose bytes can be put
/// back.
pub trait Source {
    /// Append up to `max` bytes to `dst`, fewer only where the stream
    /// ends; returns how many were appended.
    fn read_up_to(&mut self, dst: &mut Vec<u8>, max: usize) -> Result<usize>;

    /// Put `bytes`, just read, back in front of the stream.
    fn unread(&mut self, bytes: &[u8]);
}

/// Segments a segment may grow to while no block to cut it at is found;
/// past that the stream is inflated on one core.
pub const MAX_GROWTH: usize = 4;

/// Bytes read ahead for the next segment per piece handed out.
const READ_AHEAD: usize = 1 << 20;

/// How long the reads of one segment's bytes may wait for input in all
/// before the input counts as slow (a producer on a network link, a live
/// log): then one core inflates what arrives as it arrives, instead of the
/// output waiting for whole segments. 64 MiB in half a second of waiting is
/// 128 MiB/s of compressed input, about what one core inflates; `cat` of a
/// file in the page cache gives 64 MiB in a few tens of milliseconds.
const SLOW: Duration = Duration::from_millis(500);

/// How [`fill`] ended.
#[derive(Debug, PartialEq, Eq)]
enum Filled {
    Full,
    Eof,
    /// Not full, and the segment's reads have waited [`SLOW`].
    Slow,
}

/// Read until `dst` holds `len` bytes or the source ends, a megabyte at a
/// time, adding the time the reads take to `spent`; gives up once that
/// passes [`SLOW`].
fn fill(
    src: &mut dyn Source,
    dst: &mut Vec<u8>,
    len: usize,
    spent: &mut Duration,
) -> Result<Filled> {
    while dst.len() < len {
        let want = READ_AHEAD.min(len - dst.len());
        let started = Instant::now();
        let got = src.read_up_to(dst, want)?;
        *spent += started.elapsed();
        if got < want {
            return Ok(Filled::Eof);
        }
        if dst.len() < len && *spent > SLOW {
            return Ok(Filled::Slow);
        }
    }
    Ok(Filled::Full)
}

/// Bytes per segment for `threads` workers and chunks of `chunk` bytes:
/// four chunks per worker, at least eight.
pub fn segment_bytes(threads: usize, chunk: usize) -> usize {
    chunk.max(1).saturating_mul((4 * threads).max(8))
}

/// What [`Segmented::next_piece`] did.
#[derive(Debug)]
pub enum Step {
    /// A piece of output was appended to `out`.
    Piece,
    /// The stream's final block ended: the CRC-32 and size of all output.
    /// What followed the stream has been put back into the source.
    End {
        /// CRC-32 of the whole output.
        crc: u32,
        /// Length of the whole output.
        size: u64,
    },
    /// The rest is to be inflated on one core, for the reason given: the
    /// source's next byte holds bit `bit` of `Resume`, where a block
    /// starts, after the output the rest of `Resume` describes.
    OneCore(Resume, &'static str),
}

/// Why a stream goes to one core: it ends within the caller's minimum.
pub const SHORT: &str = "the stream is short";
/// Why a stream goes to one core: its input arrives slowly.
pub const SLOW_INPUT: &str = "the pipe is slow";
/// Why a stream goes to one core: no block to cut a segment at.
pub const NO_CUT: &str = "no block to cut a segment at";

/// How [`Segmented::start`] went.
pub enum Opened {
    /// Inflating in parallel.
    Parallel(Box<Segmented>),
    /// Inflate on one core instead, for the reason given (everything read
    /// was put back).
    OneCore(Resume, &'static str),
}

/// A DEFLATE stream read from a [`Source`], inflated a segment at a time.
pub struct Segmented {
    crew: Arc<Crew>,
    /// Bytes per segment.
    segment: usize,
    cur: Seg,
    /// The next segment, made ahead once this one has handed out its last
    /// chunk (when a block to cut it at was found by then).
    upcoming: Option<Seg>,
    /// Segments so far, this one included.
    segments: usize,
    /// A segment's buffer to read the one after next into (no page faults
    /// on fresh memory for every segment).
    spare: Option<Vec<u8>>,
    /// The input has turned slow: the rest goes to one core at the next
    /// segment.
    slow: bool,
}

/// One segment.
struct Seg {
    p: ParallelInflate,
    /// The segment's bytes.
    data: SharedBytes,
    /// The same, to take back once the segment is done.
    buffer: Arc<Vec<u8>>,
    /// Offset of `data`'s first byte in the stream.
    base: u64,
    /// Where the segment is cut; `None` for the last.
    cut: Option<Cut>,
    /// The next segment's bytes: this one's from the cut's byte on, then
    /// what has been read since.
    next: Vec<u8>,
    /// The source has ended.
    eof: bool,
    /// Time the reads into `next` have waited.
    waited: Duration,
}

impl Seg {
    /// The segment's buffer, once nothing else holds it.
    fn into_buffer(self) -> Option<Vec<u8>> {
        let Seg {
            p, data, buffer, ..
        } = self;
        drop(p);
        drop(data);
        Arc::try_unwrap(buffer).ok()
    }

    /// Bytes read past the end of `data`, in `next`.
    fn past(&self) -> &[u8] {
        match self.cut {
            Some(cut) => {
                let past = self.data.as_slice().len() - cut.bit / 8;
                &self.next[past.min(self.next.len())..]
            }
            None => &[],
        }
    }
}

impl Segmented {
    /// Read the first segment of a stream from `src` and start inflating
    /// it on `threads` workers in chunks of `chunk` bytes. A stream that
    /// ends within `min_len` bytes, or has no block to cut at, is left to
    /// one core.
    pub fn start(
        src: &mut dyn Source,
        workers: impl Into<Workers>,
        chunk: usize,
        min_len: usize,
    ) -> Result<Opened> {
        let workers = workers.into();
        let segment = segment_bytes(workers.threads, chunk);
        let mut data = Vec::with_capacity(segment);
        let mut waited = Duration::ZERO;
        let eof = match fill(src, &mut data, segment, &mut waited)? {
            Filled::Full => false,
            Filled::Eof => true,
            Filled::Slow => {
                src.unread(&data);
                return Ok(Opened::OneCore(Resume::default(), SLOW_INPUT));
            }
        };
        if eof && data.len() < min_len {
            src.unread(&data);
            return Ok(Opened::OneCore(Resume::default(), SHORT));
        }
        let crew = Crew::new(workers, chunk);
        match open(src, &crew, segment, data, 0, eof, Resume::default())? {
            Ok(cur) => Ok(Opened::Parallel(Box::new(Segmented {
                crew,
                segment,
                cur,
                upcoming: None,
                segments: 1,
                spare: None,
                slow: false,
            }))),
            Err((from, why)) => Ok(Opened::OneCore(from, why)),
        }
    }

    /// Segments inflated so far, this one included.
    pub fn segments(&self) -> usize {
        self.segments
    }

    /// Append the next piece of output to `out` (empty on entry), or lend
    /// it in `lent` ([`ParallelInflate::next_piece_lent`]).
    pub fn next_piece(
        &mut self,
        src: &mut dyn Source,
        out: &mut Vec<u8>,
        lent: &mut Option<SharedBytes>,
    ) -> Result<Step> {
        loop {
            let base = self.cur.base;
            let more = self
                .cur
                .p
                .next_piece_lent(out, lent)
                .map_err(|e| crate::format::at_offset(e, base))?;
            if more {
                self.prepare(src)?;
                return Ok(Step::Piece);
            }
            let Some(resume) = self.cur.p.resume() else {
                return Ok(self.end(src));
            };
            let Some(cut) = self.cur.cut else {
                return Err(CodecError::corrupt(
                    "gzip",
                    base,
                    "internal: a segment without a cut stopped early",
                ));
            };
            // The output stopped at the cut's block, or at the first
            // boundary after it: the next segment goes on from there.
            let at = cut.bit / 8 * 8;
            let from = Resume {
                bit: resume.bit - at,
                ..resume
            };
            self.segments += 1;
            if let Some(mut up) = self.upcoming.take() {
                up.p.begin(from);
                let done = std::mem::replace(&mut self.cur, up);
                self.spare = done.into_buffer();
                continue;
            }
            let mut data = std::mem::take(&mut self.cur.next);
            data.drain(..(from.bit / 8).min(data.len()));
            let base = base + (resume.bit / 8) as u64;
            let from = Resume {
                bit: from.bit % 8,
                ..from
            };
            let mut eof = self.cur.eof;
            if !eof && !self.slow {
                match fill(src, &mut data, self.segment, &mut self.cur.waited)? {
                    Filled::Full => {}
                    Filled::Eof => eof = true,
                    Filled::Slow => self.slow = true,
                }
            }
            if self.slow {
                src.unread(&data);
                return Ok(Step::OneCore(from, SLOW_INPUT));
            }
            match open(src, &self.crew, self.segment, data, base, eof, from)? {
                Ok(seg) => self.cur = seg,
                Err((from, why)) => return Ok(Step::OneCore(from, why)),
            }
        }
    }

    /// While a segment is inflated: read a little of the next one, or,
    /// once the segment has handed out its last chunk, read the rest of
    /// the next one and make it, so the workers go on to it while this one
    /// ends.
    fn prepare(&mut self, src: &mut dyn Source) -> Result<()> {
        if self.upcoming.is_none() && self.cur.p.handed_out_all() {
            self.make_upcoming(src)?;
        }
        let last = self.upcoming.as_mut().unwrap_or(&mut self.cur);
        if last.eof || last.cut.is_none() || last.next.len() >= self.segment {
            return Ok(());
        }
        let want = READ_AHEAD.min(self.segment - last.next.len());
        let started = Instant::now();
        last.eof = src.read_up_to(&mut last.next, want)? < want;
        last.waited += started.elapsed();
        if last.waited > SLOW && !last.eof {
            self.slow = true;
        }
        Ok(())
    }

    fn make_upcoming(&mut self, src: &mut dyn Source) -> Result<()> {
        let Some(cut) = self.cur.cut else {
            return Ok(());
        };
        if self.slow {
            return Ok(());
        }
        let mut data = std::mem::take(&mut self.cur.next);
        let mut eof = self.cur.eof;
        if !eof {
            match fill(src, &mut data, self.segment, &mut self.cur.waited)? {
                Filled::Full => {}
                Filled::Eof => eof = true,
                Filled::Slow => {
                    // Left to the segment's end, which goes on on one core.
                    self.cur.next = data;
                    self.slow = true;
                    return Ok(());
                }
            }
        }
        let first = cut.bit % 8;
        let up_cut = match eof {
            true => None,
            false => match find_cut(&data, self.crew.chunk, first) {
                Some(c) => Some(c),
                None => {
                    // Left to the segment's end, which reads on.
                    self.cur.next = data;
                    self.cur.eof = eof;
                    return Ok(());
                }
            },
        };
        let up = seg(
            &self.crew,
            self.segment,
            data,
            self.cur.base + (cut.bit / 8) as u64,
            eof,
            SegmentStart::Ahead(first),
            up_cut,
            self.spare.take(),
        );
        self.upcoming = Some(up);
        Ok(())
    }

    /// The stream ended in this segment: put back what follows it.
    fn end(&mut self, src: &mut dyn Source) -> Step {
        let (used, crc, size) = self.cur.p.finish();
        if let Some(up) = self.upcoming.take() {
            // Its bytes begin inside this segment's.
            src.unread(up.past());
            let data = up.data.as_slice();
            let inside = self.cur.data.as_slice().len() - up.base.abs_diff(self.cur.base) as usize;
            src.unread(&data[inside.min(data.len())..]);
        } else {
            src.unread(self.cur.past());
        }
        let data = self.cur.data.as_slice();
        src.unread(&data[used.min(data.len())..]);
        Step::End { crc, size }
    }
}

/// Start inflating `data` (at `base` in the stream) from `from`, whose
/// window is known: cut near its end unless the source has ended, reading
/// more while no block to cut at is found; `Err` with everything read put
/// back when none is found within [`MAX_GROWTH`] segments.
fn open(
    src: &mut dyn Source,
    crew: &Arc<Crew>,
    segment: usize,
    mut data: Vec<u8>,
    base: u64,
    mut eof: bool,
    from: Resume,
) -> Result<std::result::Result<Seg, (Resume, &'static str)>> {
    let cut = loop {
        if eof {
            break None;
        }
        if let Some(cut) = find_cut(&data, crew.chunk, from.bit) {
            break Some(cut);
        }
        if data.len() >= MAX_GROWTH * segment {
            src.unread(&data);
            return Ok(Err((from, NO_CUT)));
        }
        let len = data.len() + segment;
        let mut waited = Duration::ZERO;
        match fill(src, &mut data, len, &mut waited)? {
            Filled::Full => {}
            Filled::Eof => eof = true,
            Filled::Slow => {
                src.unread(&data);
                return Ok(Err((from, SLOW_INPUT)));
            }
        }
    };
    let start = SegmentStart::Known(from);
    Ok(Ok(seg(crew, segment, data, base, eof, start, cut, None)))
}

/// A segment of `data`, cut at `cut`; the bytes from the cut on are
/// copied into `spare` (or a new buffer) for the next.
#[allow(clippy::too_many_arguments)]
fn seg(
    crew: &Arc<Crew>,
    segment: usize,
    data: Vec<u8>,
    base: u64,
    eof: bool,
    start: SegmentStart,
    cut: Option<Cut>,
    spare: Option<Vec<u8>>,
) -> Seg {
    let mut next = spare.unwrap_or_default();
    next.clear();
    if let Some(cut) = cut {
        next.reserve(segment.max(data.len() - cut.bit / 8));
        next.extend_from_slice(&data[cut.bit / 8..]);
    }
    let buffer = Arc::new(data);
    let data = SharedBytes::from_arc(buffer.clone());
    let p = ParallelInflate::segment(data.clone(), crew, start, cut);
    Seg {
        p,
        data,
        buffer,
        base,
        cut,
        next,
        eof,
        waited: Duration::ZERO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inflate::zstream::ZInflate;
    use crate::testutil::image_like;
    use std::time::Duration;

    /// A stream in memory, read in the sizes asked for.
    struct Slice {
        data: Vec<u8>,
        pos: usize,
        /// From this byte on, each read takes `SLOW_READ` (a producer that
        /// slows down).
        slow_from: usize,
    }

    const SLOW_READ: Duration = Duration::from_millis(200);

    impl Source for Slice {
        fn read_up_to(&mut self, dst: &mut Vec<u8>, max: usize) -> Result<usize> {
            if self.pos >= self.slow_from {
                std::thread::sleep(SLOW_READ);
            }
            let n = max.min(self.data.len() - self.pos);
            dst.extend_from_slice(&self.data[self.pos..self.pos + n]);
            self.pos += n;
            Ok(n)
        }

        fn unread(&mut self, bytes: &[u8]) {
            assert!(bytes.len() <= self.pos, "more put back than was read");
            assert!(
                self.data[self.pos - bytes.len()..self.pos] == *bytes,
                "put back bytes that were not the ones read"
            );
            self.pos -= bytes.len();
        }
    }

    fn deflate(data: &[u8], level: u32) -> Vec<u8> {
        use std::io::Write;
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::new(level));
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    /// Inflate `stream` (followed by `tail`) as a pipe would be: output,
    /// CRC, where the source stands after it, and whether one core took
    /// over.
    fn inflate(stream: &[u8], tail: &[u8], threads: usize, chunk: usize) -> Result<Outcome> {
        inflate_slowing(stream, tail, threads, chunk, usize::MAX)
    }

    /// Like [`inflate`], with each read from byte `slow_from` on slow.
    fn inflate_slowing(
        stream: &[u8],
        tail: &[u8],
        threads: usize,
        chunk: usize,
        slow_from: usize,
    ) -> Result<Outcome> {
        let mut src = Slice {
            data: [stream, tail].concat(),
            pos: 0,
            slow_from,
        };
        let mut out = Vec::new();
        let mut piece = Vec::new();
        let mut s = match Segmented::start(&mut src, threads, chunk, 0)? {
            Opened::Parallel(s) => s,
            Opened::OneCore(r, _) => return one_core(&mut src, r, out, false, 0),
        };
        loop {
            let mut lent = None;
            match s.next_piece(&mut src, &mut piece, &mut lent)? {
                Step::Piece => {
                    out.extend_from_slice(&piece);
                    out.extend_from_slice(lent.as_ref().map_or(&[], |l| l.as_slice()));
                    piece.clear();
                }
                Step::End { crc, size } => {
                    assert_eq!(size, out.len() as u64);
                    return Ok(Outcome {
                        out,
                        crc,
                        pos: src.pos,
                        one_core: false,
                        segments: s.segments(),
                    });
                }
                Step::OneCore(r, _) => return one_core(&mut src, r, out, true, s.segments()),
            }
        }
    }

    struct Outcome {
        out: Vec<u8>,
        crc: u32,
        pos: usize,
        one_core: bool,
        segments: usize,
    }

    /// The rest on one core, as the gzip splitter does it.
    fn one_core(
        src: &mut Slice,
        r: Resume,
        mut out: Vec<u8>,
        took_over: bool,
        segments: usize,
    ) -> Result<Outcome> {
        assert_eq!(r.size, out.len() as u64);
        let rest = &src.data[src.pos..];
        let (mut z, mut at) = ZInflate::starting_at(rest, r.bit, &r.window)
            .map_err(|e| CodecError::corrupt("gzip", 0, e))?;
        let mut crc = r.crc;
        loop {
            out.reserve(1 << 20);
            let before = out.len();
            let step = z
                .inflate(&rest[at..], &mut out, false)
                .map_err(|e| CodecError::corrupt("gzip", 0, e))?;
            crc.update(&out[before..]);
            at += step.consumed;
            if step.end {
                break;
            }
            if step.consumed == 0 && step.produced == 0 {
                return Err(CodecError::Truncated {
                    format: "gzip",
                    offset: at as u64,
                });
            }
        }
        Ok(Outcome {
            out,
            crc: crc.finalize(),
            pos: src.pos + at,
            one_core: took_over,
            segments,
        })
    }

    fn crc(data: &[u8]) -> u32 {
        let mut c = crc32fast::Hasher::new();
        c.update(data);
        c.finalize()
    }

    #[test]
    fn a_piped_stream_is_inflated_segment_by_segment_and_what_follows_is_put_back() {
        let data = image_like(6 << 20, 31);
        let tail = b"trailer and the next member".to_vec();
        // zlib-rs writes level 1 with fixed codes only: nothing to cut at,
        // so one core inflates it, from the start.
        for level in [1, 4, 6, 9] {
            let stream = deflate(&data, level);
            for (threads, chunk) in [(2, 64 << 10), (3, 100_000), (2, 300_000)] {
                let o = inflate(&stream, &tail, threads, chunk).unwrap();
                assert!(
                    o.out == data,
                    "level {level} threads {threads} chunk {chunk}"
                );
                assert_eq!(o.crc, crc(&data));
                assert_eq!(
                    o.pos,
                    stream.len(),
                    "the bytes after the stream are put back"
                );
                assert!(!o.one_core);
                let segment = segment_bytes(threads, chunk);
                let cuts = if level == 1 {
                    0
                } else {
                    stream.len() / segment
                };
                assert!(
                    o.segments >= cuts,
                    "level {level} chunk {chunk}: {} segments of {segment} bytes for {}",
                    o.segments,
                    stream.len()
                );
            }
        }
    }

    /// A cut the search got wrong (no block starts there) is passed at the
    /// next block boundary, of whatever kind: before, the chunk went on
    /// looking for a block of a kind the search finds and ran into the end
    /// of the segment's data (a valid `.gz` from a pipe was refused as
    /// truncated).
    #[test]
    fn a_wrong_cut_ends_the_segment_at_the_next_boundary() {
        let (data, stream) = crate::testutil::stored_then_fixed(1 << 20, 2 << 20, 7);
        // Inside the fixed-code blocks, where no block the search finds
        // starts; the segment holds 256 KiB after it.
        let wrong = (stream.len() / 2) * 8 + 3;
        let held = stream[..wrong / 8 + (256 << 10)].to_vec();
        let chunk = 64 << 10;
        let crew = Crew::new(2, chunk);
        let cut = Cut {
            chunk: wrong / 8 / chunk,
            bit: wrong,
        };
        let mut p = ParallelInflate::segment(
            SharedBytes::from_vec(held),
            &crew,
            SegmentStart::Known(Resume::default()),
            Some(cut),
        );
        let mut out = Vec::new();
        let mut piece = Vec::new();
        while p.next_piece(&mut piece).unwrap() {
            out.extend_from_slice(&piece);
            piece.clear();
        }
        let r = p.resume().expect("the segment ended at its cut");
        assert!(r.bit > wrong, "{} is not past the cut {wrong}", r.bit);
        assert_eq!(r.size, out.len() as u64);
        assert!(out == data[..out.len()]);
        // The next block starts there: the rest follows from it.
        let window = &out[out.len() - super::super::marker::WINDOW..];
        let (mut z, mut at) = ZInflate::starting_at(&stream, r.bit, window).unwrap();
        let mut tail = Vec::with_capacity(data.len() - out.len() + 1);
        while tail.len() < data.len() - out.len() {
            let step = z.inflate(&stream[at..], &mut tail, false).unwrap();
            at += step.consumed;
            assert!(step.consumed + step.produced > 0, "stalled");
        }
        assert!(tail == data[out.len()..]);
    }

    #[test]
    fn a_stream_with_no_block_to_cut_at_goes_on_on_one_core() {
        // Fixed-code blocks have no header the block search can check:
        // after a start of stored blocks (cut where one ends), no segment
        // can be cut.
        let (data, stream) = crate::testutil::stored_then_fixed(1 << 20, 3 << 20, 5);
        let o = inflate(&stream, b"after", 2, 32 << 10).unwrap();
        assert!(o.out == data);
        assert_eq!(o.crc, crc(&data));
        assert_eq!(o.pos, stream.len());
        assert!(
            o.one_core,
            "3 MiB of fixed-code blocks is past 4 segments of 512 KiB"
        );
        assert!(o.segments >= 1, "the stored start went parallel");
    }

    /// Input that arrives slowly (a network link, a live log) is inflated
    /// on one core as it arrives, from the start or from the segment where
    /// it turned slow, rather than held back until whole segments are in.
    #[test]
    fn a_slow_input_goes_to_one_core() {
        // Compressible stretches with incompressible ones between them
        // (short enough that every segment has blocks to cut at).
        let mut data = Vec::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for i in 0..64 {
            data.extend(image_like(100_000, 41 + i));
            data.extend((0..100_000).map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            }));
        }
        let stream = deflate(&data, 6);
        // Segments of 4 MiB: reading one takes four reads.
        let chunk = 512 << 10;
        assert!(stream.len() > 3 * segment_bytes(2, chunk) / 2);
        let o = inflate_slowing(&stream, b"", 2, chunk, 0).unwrap();
        assert!(o.out == data && o.crc == crc(&data));
        assert_eq!(
            (o.segments, o.one_core),
            (0, false),
            "one core from the start"
        );
        let o = inflate_slowing(&stream, b"", 2, chunk, segment_bytes(2, chunk) + 1).unwrap();
        assert!(o.out == data && o.crc == crc(&data));
        assert_eq!(o.pos, stream.len());
        assert!(o.one_core && o.segments >= 1, "parallel, then one core");
    }

    #[test]
    fn a_short_stream_is_left_to_one_core_whole() {
        let data = image_like(100_000, 2);
        let stream = deflate(&data, 6);
        let mut src = Slice {
            data: stream.clone(),
            pos: 0,
            slow_from: usize::MAX,
        };
        match Segmented::start(&mut src, 2, 64 << 10, 1 << 20).unwrap() {
            Opened::OneCore(r, why) => {
                assert_eq!(why, SHORT);
                assert_eq!((r.bit, r.size), (0, 0));
                assert_eq!(src.pos, 0, "everything read is put back");
            }
            Opened::Parallel(_) => panic!("a stream below the minimum went parallel"),
        }
    }

    #[test]
    fn damage_in_a_piped_stream_is_an_error_or_a_wrong_crc() {
        let data = image_like(3 << 20, 13);
        let stream = deflate(&data, 6);
        for (i, at) in [
            1000usize,
            200_000,
            700_000,
            stream.len() / 2,
            stream.len() - 10,
        ]
        .into_iter()
        .enumerate()
        {
            let mut bad = stream.clone();
            bad[at] ^= 1 << (i % 8);
            match inflate(&bad, b"", 2, 48 << 10) {
                Ok(o) => assert!(o.out != data || o.crc != crc(&data) || bad == stream),
                Err(e) => assert!(!e.to_string().is_empty()),
            }
        }
        // Cut short: never a hang.
        let short = &stream[..stream.len() * 2 / 3];
        assert!(inflate(short, b"", 2, 48 << 10).is_err());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
        #[test]
        fn piped_inflate_round_trips(seed in 1u64.., len in 0usize..900_000, chunk in 4_000usize..60_000, level in 0u32..10, threads in 2usize..4) {
            let data = image_like(len, seed);
            let stream = deflate(&data, level);
            let o = inflate(&stream, b"xyz", threads, chunk).unwrap();
            proptest::prop_assert!(o.out == data);
            proptest::prop_assert_eq!(o.crc, crc(&data));
            proptest::prop_assert_eq!(o.pos, stream.len());
        }
    }
}
