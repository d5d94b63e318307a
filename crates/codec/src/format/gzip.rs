//! gzip (RFC 1952) written as independent members, each carrying its own
//! total length in an FEXTRA subfield, in the manner of BGZF.
//!
//! Every gunzip reads a multi-member file as the concatenation of the
//! members and skips unknown FEXTRA subfields, so the output is plain gzip.
//! cairn reads the subfield (ours, `CN` with a 4-byte length, or BGZF's
//! `BC` with a 2-byte length) to hop from member to member without
//! inflating, and inflates the members on all cores with libdeflate.
//! Members without a length (pigz, gzip, concatenations of those) are
//! inflated on all cores too ([`crate::inflate`]: chunks decoded from
//! guessed block starts, stitched in order): in place when the input is a
//! file, a segment at a time when it is a pipe
//! ([`crate::inflate::segmented`]). They are inflated in the splitter as a
//! stream (zlib-rs) when one thread is asked for, when the member is short,
//! or when a pipe's stream has no block to cut a segment at; so are members
//! whose extra field is malformed or whose length is not plausible: like
//! gzip, cairn never refuses a member for its extra field.
//!
//! Member layout: `1f 8b 08 04 | mtime 0 | xfl | os 3 | xlen 8 | 'C' 'N' 4 0
//! | member length u32le | raw deflate | crc32 | isize`.
//!
//! Since layout 2 ([`Framer`]) the members stand between an empty start
//! member (subfield `CS`) and an empty end member (subfield `CE`, the
//! stream's total length). Any prefix of a multi-member file that ends
//! between members is itself a valid gzip file, so a writer killed there
//! (`cairn pack -c` to a pipe) left a file that `gzip -t` and cairn took
//! as whole; cairn now refuses a stream that has begun with a start
//! member and ends without its end member, as htslib warns of a BGZF file
//! without its end-of-file block.

use super::{le32, pass_plain, BlockMeta, Mark, Marks, Unit, UnitKind, MAX_UNIT, PLAIN_UNIT};
use crate::block::{BlockCodec, DeflateCodec};
use crate::error::{CodecError, Result};
use crate::inflate::index::GzipIndex;
use crate::inflate::segmented::{self, Opened, Segmented};
use crate::inflate::whole::{Outcome, Whole};
use crate::inflate::zstream::ZInflate;
use crate::inflate::{ParallelInflate, Resume, Workers, CHUNK};
use crate::input::{begins_like, Input};
use std::sync::{Arc, Mutex};

const NAME: &str = "gzip";
pub(crate) const TRAILER_LEN: usize = 8;
const FTEXT: u8 = 1;
const FHCRC: u8 = 2;
const FEXTRA: u8 = 4;
const FNAME: u8 = 8;
const FCOMMENT: u8 = 16;

/// Compresses blocks into self-sizing gzip members.
pub struct Encoder {
    deflate: DeflateCodec,
    level: i32,
}

impl Encoder {
    /// An encoder at libdeflate `level` (1-12).
    pub fn new(level: i32) -> Self {
        Encoder {
            deflate: DeflateCodec::new(level),
            level,
        }
    }
}

impl super::BlockEncoder for Encoder {
    fn encode(&mut self, src: &[u8], out: &mut Vec<u8>) -> Result<BlockMeta> {
        let start = out.len();
        let xfl = match self.level {
            1 => 4,
            9.. => 2,
            _ => 0,
        };
        // The member's length is known once it is compressed.
        member_head(xfl, 8, 0, out);
        self.deflate.compress(src, out)?;
        let crc = crc32fast::hash(src);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&(src.len() as u32).to_le_bytes());
        let member_len = out.len() - start;
        let len32 = u32::try_from(member_len).map_err(|_| CodecError::Compress {
            codec: NAME,
            reason: format!("member of {member_len} bytes does not fit the length field"),
        })?;
        out[start + CN_AT..start + CN_AT + 4].copy_from_slice(&len32.to_le_bytes());
        Ok(BlockMeta {
            raw_len: src.len() as u64,
            packed_len: member_len as u64,
            check: u64::from(crc),
        })
    }
}

/// Subfield of the start member: the layout version, u16le.
const START_ID: [u8; 2] = *b"CS";
/// Subfield of the end member: the stream's decoded length, u64le.
const END_ID: [u8; 2] = *b"CE";
/// The layout the start member names.
const LAYOUT: u16 = 2;
/// How a reader names gzip's start and end members.
pub(crate) const GZIP_MARKS: super::MarkNames = super::MarkNames {
    format: NAME,
    start: "start member",
    end: "end member",
    pieces: "members",
    end_alone_ok: false,
};

/// Writes layout 2's start and end members around the blocks (see the
/// module's doc).
#[derive(Default)]
pub struct Framer {
    total: u64,
    /// The input's name and time, kept in the start member as gzip keeps
    /// them (FNAME, MTIME).
    origin: Option<super::Origin>,
    /// A comment kept there too (FCOMMENT, `pigz -C`).
    comment: Option<Vec<u8>>,
}

impl Framer {
    /// A framer whose start member keeps `comment` (FCOMMENT).
    pub fn with_comment(comment: Option<Vec<u8>>) -> Framer {
        Framer {
            comment,
            ..Framer::default()
        }
    }
}

/// Where in a member [`member_head`] puts the member's length.
const CN_AT: usize = 16;

/// The header every member cairn writes starts with: gzip's 10 bytes
/// (extra flags `xfl`, OS Unix), FEXTRA's length `xlen`, and the subfield
/// `CN` with the member's length `len` (its first subfield, at
/// [`CN_AT`]).
fn member_head(xfl: u8, xlen: u16, len: u32, out: &mut Vec<u8>) {
    out.extend_from_slice(&[0x1f, 0x8b, 8, FEXTRA, 0, 0, 0, 0, xfl, 3]);
    out.extend_from_slice(&xlen.to_le_bytes());
    out.extend_from_slice(&[b'C', b'N', 4, 0]);
    out.extend_from_slice(&len.to_le_bytes());
}

/// An empty member (no data: a final fixed block of no symbols) whose
/// FEXTRA holds its own length (`CN`) and the subfield `id` with `data`.
fn empty_member(id: [u8; 2], data: &[u8], out: &mut Vec<u8>) {
    let xlen = 8 + 4 + data.len();
    let len = 10 + 2 + xlen + 2 + TRAILER_LEN;
    member_head(0, xlen as u16, len as u32, out);
    out.extend_from_slice(&id);
    out.extend_from_slice(&(data.len() as u16).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&[3, 0]);
    out.extend_from_slice(&[0; TRAILER_LEN]);
}

impl super::Framer for Framer {
    fn origin(&mut self, origin: &super::Origin) {
        self.origin = Some(origin.clone());
    }

    fn header(&mut self, out: &mut Vec<u8>) {
        let start = out.len();
        empty_member(START_ID, &LAYOUT.to_le_bytes(), out);
        if self.origin.is_none() && self.comment.is_none() {
            return;
        }
        // FNAME, then FCOMMENT, after FEXTRA, each ended by a NUL, and the
        // member's length (CN) grown by them.
        let mut at = out.len() - 2 - TRAILER_LEN;
        let name = self
            .origin
            .as_ref()
            .map(|o| &o.name[..])
            .filter(|n| !n.is_empty());
        for (flag, text) in [(FNAME, name), (FCOMMENT, self.comment.as_deref())] {
            let Some(text) = text else { continue };
            let mut field: Vec<u8> = text.iter().copied().filter(|&b| b != 0).collect();
            field.push(0);
            let len = field.len();
            out.splice(at..at, field);
            at += len;
            out[start + 3] |= flag;
        }
        if let Some(origin) = &self.origin {
            out[start + 4..start + 8].copy_from_slice(&origin.mtime.to_le_bytes());
        }
        let len = (out.len() - start) as u32;
        out[start + CN_AT..start + CN_AT + 4].copy_from_slice(&len.to_le_bytes());
    }

    fn block(&mut self, meta: &BlockMeta) {
        self.total += meta.raw_len;
    }

    fn trailer(&mut self, out: &mut Vec<u8>) -> Result<()> {
        empty_member(END_ID, &self.total.to_le_bytes(), out);
        Ok(())
    }
}

/// Parsed fixed part of a member header.
pub(crate) struct Header {
    /// Bytes of header (through FHCRC).
    pub(crate) len: usize,
    /// Total member length, when a size subfield says so.
    pub(crate) member_len: Option<usize>,
    /// A start or end member's subfield.
    pub(crate) mark: Option<Mark>,
    /// FNAME's bytes (without the NUL), and MTIME.
    pub(crate) origin: super::Origin,
    /// FCOMMENT's bytes (without the NUL), if it has one.
    pub(crate) comment: Option<Vec<u8>>,
    /// Bytes of the header already consumed from the input: a name or
    /// comment too long to hold in its buffer is read through (0 for any
    /// other header, which is left in the input whole).
    pub(crate) consumed: usize,
}

/// A header's name or comment is read through, hashed for FHCRC, once the
/// input holds more than this of the header; the first [`MAX_KEPT_FIELD`]
/// bytes of each are kept. gzip reads fields of any length.
const MAX_HEADER_BUFFER: usize = 1 << 20;
/// The most of a name or comment kept (a longer one is cut there: no file
/// name is that long, and a listing shows no more).
const MAX_KEPT_FIELD: usize = 1 << 20;

/// Parse the member header at the start of `input`, filling as needed.
pub(crate) fn parse_header(input: &mut Input) -> Result<Header> {
    let off = input.offset();
    let head = input.need_start(10, NAME, |b| begins_like(b, b"\x1f\x8b"))?;
    if head[0] != 0x1f || head[1] != 0x8b {
        return Err(CodecError::TrailingGarbage {
            format: NAME,
            offset: off,
        });
    }
    if head[2] != 8 {
        return Err(CodecError::corrupt(
            NAME,
            off + 2,
            format!("unknown compression method {}", head[2]),
        ));
    }
    let flags = head[3];
    let mut origin = super::Origin {
        name: Vec::new(),
        mtime: u32::from_le_bytes([head[4], head[5], head[6], head[7]]),
    };
    if flags & 0xe0 != 0 {
        return Err(CodecError::corrupt(
            NAME,
            off + 3,
            format!("reserved header flags set ({flags:#04x})"),
        ));
    }
    let _ = FTEXT;
    let mut len = 10;
    let mut member_len = None;
    let mut mark = None;
    if flags & FEXTRA != 0 {
        let b = input.need(len + 2, NAME)?;
        let xlen = usize::from(u16::from_le_bytes([b[len], b[len + 1]]));
        len += 2;
        let b = input.need(len + xlen, NAME)?;
        let extra = &b[len..len + xlen];
        let mut i = 0;
        while i + 4 <= extra.len() {
            let (s1, s2) = (extra[i], extra[i + 1]);
            let sl = usize::from(u16::from_le_bytes([extra[i + 2], extra[i + 3]]));
            let data = extra.get(i + 4..i + 4 + sl);
            match (s1, s2, data) {
                (b'C', b'N', Some(d)) if sl == 4 => member_len = Some(le32(d, 0) as usize),
                (b'C', b'S', Some(_)) if sl == 2 => mark = Some(Mark::Start),
                (b'C', b'E', Some(d)) if sl == 8 => {
                    let mut total = [0; 8];
                    total.copy_from_slice(d);
                    mark = Some(Mark::End(u64::from_le_bytes(total)));
                }
                (b'B', b'C', Some(d)) if sl == 2 => {
                    member_len = Some(usize::from(u16::from_le_bytes([d[0], d[1]])) + 1)
                }
                _ => {}
            }
            i += 4 + sl;
        }
        len += xlen;
    }
    let mut comment = None;
    // Header bytes let go of (a field too long to hold), and their CRC.
    let mut consumed = 0usize;
    let mut crc = crc32fast::Hasher::new();
    for flag in [FNAME, FCOMMENT] {
        if flags & flag == 0 {
            continue;
        }
        let mut field = Vec::new();
        let keep = |field: &mut Vec<u8>, bytes: &[u8]| {
            let room = MAX_KEPT_FIELD.saturating_sub(field.len());
            field.extend_from_slice(&bytes[..bytes.len().min(room)]);
        };
        loop {
            let avail = input.fill(len + 1)?;
            if avail <= len {
                return Err(CodecError::Truncated {
                    format: NAME,
                    offset: off + (consumed + avail) as u64,
                });
            }
            let b = input.peek();
            if let Some(z) = b[len..].iter().position(|&c| c == 0) {
                keep(&mut field, &b[len..len + z]);
                len += z + 1;
                break;
            }
            let have = b.len();
            if have > MAX_HEADER_BUFFER {
                keep(&mut field, &b[len..]);
                crc.update(b);
                input.consume(have);
                consumed += have;
                len = 0;
            } else if input.fill(have + 1)? <= have {
                return Err(CodecError::Truncated {
                    format: NAME,
                    offset: off + (consumed + have) as u64,
                });
            }
        }
        match flag {
            FNAME => origin.name = field,
            _ => comment = Some(field),
        }
    }
    if flags & FHCRC != 0 {
        // The low 16 bits of the CRC-32 of the header before it, checked
        // as gzip checks them.
        let b = input.need(len + 2, NAME)?;
        let want = u16::from_le_bytes([b[len], b[len + 1]]);
        crc.update(&b[..len]);
        let got = crc.finalize() as u16;
        if got != want {
            return Err(CodecError::corrupt(
                NAME,
                off + (consumed + len) as u64,
                format!("header checksum {want:#06x} != computed {got:#06x}"),
            ));
        }
        len += 2;
    }
    Ok(Header {
        len: consumed + len,
        member_len,
        mark,
        origin,
        comment,
        consumed,
    })
}

/// What the first member header of a gzip stream keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// Its name and time (FNAME and MTIME, as `gunzip -N` restores them).
    pub origin: super::Origin,
    /// Its comment (FCOMMENT, as `pigz -lv` prints it), if it has one.
    pub comment: Option<Vec<u8>>,
    /// The length of the header (as `gzip -l` leaves it out of the
    /// ratio).
    pub header_len: usize,
}

/// What the first member of a gzip stream keeps, from `prefix`, the
/// stream's first bytes; `None` when they hold no whole, valid member
/// header.
pub fn kept(prefix: &[u8]) -> Option<Kept> {
    let mut input = Input::new(Box::new(std::io::Cursor::new(prefix.to_vec())));
    parse_header(&mut input).ok().map(|h| Kept {
        origin: h.origin,
        comment: h.comment,
        header_len: h.len,
    })
}

/// State of a member being inflated in the splitter.
struct Streaming {
    inflate: ZInflate,
    crc: crc32fast::Hasher,
    size: u64,
}

impl Streaming {
    /// Inflate on from `from`: the input's next byte holds `from.bit`,
    /// where a block starts (the member's first, or where a parallel
    /// inflate stopped), after the output the rest of `from` describes.
    fn resume(input: &mut Input, from: Resume) -> Result<Self> {
        let off = input.offset();
        input.need(1, NAME)?;
        let (inflate, at) = ZInflate::starting_at(input.peek(), from.bit, &from.window)
            .map_err(|reason| CodecError::corrupt(NAME, off, reason))?;
        input.consume(at);
        Ok(Streaming {
            inflate,
            crc: from.crc,
            size: from.size,
        })
    }
}

/// What [`Splitter::start_parallel`] found.
enum Parallel {
    /// The member is being inflated in parallel, in place.
    Mapped,
    /// The input is not a file that maps (a pipe).
    Pipe,
    /// Not worth it, or one thread: why.
    No(&'static str),
}

/// Finds member boundaries; inflates members that carry no length.
pub struct Splitter {
    input: Input,
    streaming: Option<Streaming>,
    /// The member being inflated in parallel, and the offset of its
    /// DEFLATE data (its key in the index).
    parallel: Option<(ParallelInflate, u64)>,
    /// The same for a member read from a pipe, a segment at a time.
    piped: Option<(Box<Segmented>, u64)>,
    threads: usize,
    /// Most cores a member inflated here has used (see
    /// [`super::Splitter::cores`]).
    cores: usize,
    /// Most bytes the parallel inflater's buffers may take.
    budget: Option<u64>,
    members: u64,
    index: Option<Arc<Mutex<GzipIndex>>>,
    /// Start and end members seen.
    marks: Marks,
    /// An error met after part of a plain unit was inflated.
    deferred: super::Deferred,
}

/// Why a member is inflated on one core when the memory budget
/// ([`crate::DecodeOptions::memory`]) leaves room for one worker only.
const MEMORY: &str = "the memory limit leaves room for one worker (unpack -M raises it)";

/// Smallest member body (bytes left in the file) worth inflating in
/// parallel: two chunks.
pub(crate) const PARALLEL_MIN: usize = 2 * crate::inflate::CHUNK;

impl Splitter {
    /// A splitter over `input` that inflates members without a length on
    /// one thread.
    pub fn new(input: Input) -> Self {
        Splitter::with_threads(input, 1)
    }

    /// A splitter that inflates a member without a length on `threads`
    /// threads when the input is a file.
    pub fn with_threads(input: Input, threads: usize) -> Self {
        Splitter {
            input,
            streaming: None,
            parallel: None,
            piped: None,
            threads,
            cores: 1,
            budget: None,
            members: 0,
            index: None,
            marks: Marks::new(GZIP_MARKS),
            deferred: super::Deferred::default(),
        }
    }

    /// Fit the parallel inflater's buffers to `budget` bytes
    /// ([`crate::DecodeOptions::memory`]; `None`: the default share of the
    /// memory this process may use).
    pub fn with_memory(mut self, budget: Option<u64>) -> Self {
        self.budget = crate::memlimit::budget(budget);
        self
    }

    /// Use and extend a checkpoint index ([`crate::DecodeOptions::gzip_index`]).
    pub fn with_index(mut self, index: Option<Arc<Mutex<GzipIndex>>>) -> Self {
        self.index = index;
        self
    }

    fn lock_index(&self) -> Option<std::sync::MutexGuard<'_, GzipIndex>> {
        // Nothing that can panic runs under this lock.
        self.index
            .as_ref()
            .map(|i| i.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Start inflating the member whose body starts at the input's offset
    /// on the workers, when that is possible and worth it.
    fn start_parallel(&mut self) -> Parallel {
        if self.threads < 2 {
            return Parallel::No("one thread");
        }
        let Some(rest) = self.input.mapped_rest() else {
            return Parallel::Pipe;
        };
        if rest.as_slice().len() < PARALLEL_MIN {
            return Parallel::No("under two chunks");
        }
        let workers = Workers::within(self.threads, self.budget);
        if workers.threads < 2 {
            return Parallel::No(MEMORY);
        }
        let key = self.input.offset();
        let known = self.lock_index().and_then(|i| i.members.get(&key).cloned());
        tracing::debug!(
            offset = key,
            threads = workers.threads,
            whole_buffers = workers.whole_buffers,
            budget = self.budget,
            checkpoints = known.as_ref().map(|m| m.points.len()),
            "gzip member without sizes: inflating in parallel"
        );
        let p = match known {
            Some(m) => ParallelInflate::with_index(rest, workers, m),
            None => ParallelInflate::new(rest, workers),
        };
        self.parallel = Some((p, key));
        self.cores = self.cores.max(workers.threads);
        Parallel::Mapped
    }

    /// Start inflating the member whose body starts at the input's
    /// offset, read from a pipe, a segment at a time; else on one core
    /// from where the segments left it.
    fn start_piped(&mut self) -> Result<()> {
        let base = self.input.offset();
        let workers = Workers::within_piped(self.threads, self.budget);
        if workers.threads < 2 {
            return self.one_core(Resume::default(), MEMORY);
        }
        let opened = Segmented::start(&mut self.input, workers, CHUNK, PARALLEL_MIN)
            .map_err(|e| super::at_offset(e, base))?;
        match opened {
            Opened::Parallel(s) => {
                tracing::debug!(
                    offset = base,
                    threads = workers.threads,
                    whole_buffers = workers.whole_buffers,
                    segment = segmented::segment_bytes(workers.threads, CHUNK),
                    "gzip member without sizes read from a pipe: inflating in parallel, a segment at a time"
                );
                self.piped = Some((s, base));
                self.cores = self.cores.max(workers.threads);
            }
            Opened::OneCore(from, why) => self.one_core(from, why)?,
        }
        Ok(())
    }

    /// Inflate the rest of the member on one core from `from`, saying why.
    fn one_core(&mut self, from: Resume, why: &'static str) -> Result<()> {
        tracing::debug!(
            offset = self.input.offset(),
            why,
            "gzip member without sizes: inflating on one core"
        );
        self.streaming = Some(Streaming::resume(&mut self.input, from)?);
        Ok(())
    }

    fn piped_some(&mut self, unit: &mut Unit) -> Result<()> {
        let Some((s, base)) = self.piped.as_mut() else {
            return Ok(());
        };
        let base = *base;
        unit.kind = UnitKind::Plain;
        unit.offset = base;
        let step = s
            .next_piece(&mut self.input, &mut unit.data, &mut unit.shared)
            .map_err(|e| super::at_offset(e, base))?;
        match step {
            segmented::Step::Piece => Ok(()),
            segmented::Step::End { crc, size } => {
                self.piped = None;
                self.check_trailer(crc, size)
            }
            segmented::Step::OneCore(from, why) => {
                self.piped = None;
                self.one_core(from, why)?;
                self.stream_held(unit)
            }
        }
    }

    fn parallel_some(&mut self, unit: &mut Unit) -> Result<()> {
        let Some((p, key)) = self.parallel.as_mut() else {
            return Ok(());
        };
        let base = *key;
        unit.kind = UnitKind::Plain;
        unit.offset = base;
        if p.next_piece_lent(&mut unit.data, &mut unit.shared)
            .map_err(|e| super::at_offset(e, base))?
        {
            return Ok(());
        }
        let (used, crc, size) = p.finish();
        let points = self.index.is_some().then(|| p.checkpoints());
        self.parallel = None;
        if self.input.take_shared(used)?.is_none() {
            return Err(CodecError::Truncated {
                format: NAME,
                offset: base + used as u64,
            });
        }
        self.check_trailer(crc, size)?;
        // Only a member whose CRC held is indexed.
        if let (Some(points), Some(mut index)) = (points, self.lock_index()) {
            if index.members.get(&base) != Some(&points) {
                index.members.insert(base, points);
                index.changed = true;
            }
        }
        Ok(())
    }

    /// Read and check a member's trailer against the CRC and size of what
    /// was inflated.
    fn check_trailer(&mut self, got: u32, size: u64) -> Result<()> {
        let off = self.input.offset();
        let t = self.input.need(TRAILER_LEN, NAME)?;
        let (crc, isize) = (le32(t, 0), le32(t, 4));
        if crc != got {
            return Err(CodecError::corrupt(
                NAME,
                off,
                format!("CRC mismatch: stored {crc:08x}, computed {got:08x}"),
            ));
        }
        if isize != size as u32 {
            return Err(CodecError::corrupt(
                NAME,
                off + 4,
                format!("length mismatch: stored {isize}, decoded {size}"),
            ));
        }
        self.input.consume(TRAILER_LEN);
        self.marks.decoded(size);
        Ok(())
    }

    /// Take the member at `off` whole as a unit for the workers, trusting
    /// the length `len` its FEXTRA subfield gives, if that length is
    /// plausible: it covers the header and trailer, stays within
    /// [`MAX_UNIT`], the trailer's size does too, and the member ends where
    /// the input ends or the next member (or zero padding) starts. The
    /// extra field is only a hint for splitting: gzip itself skips it, so
    /// a member whose hint is nonsense is not refused but inflated as a
    /// stream (returns false, nothing consumed). A hint that passes these
    /// checks and covers more than one member has them inflated one by
    /// one ([`Decoder`]); one that ends inside a member fails it: refused,
    /// never silently misread.
    fn take_sized_member(
        &mut self,
        off: u64,
        header: &Header,
        len: usize,
        unit: &mut Unit,
    ) -> Result<bool> {
        // (A header read through is no longer there to take whole.)
        if header.consumed > 0 || len < header.len + TRAILER_LEN || len > MAX_UNIT {
            return Ok(false);
        }
        let start = unit.data.len();
        match self.input.take(len, &mut unit.data, NAME) {
            Ok(()) => {}
            Err(CodecError::Truncated { .. }) => {
                self.input.unread(&unit.data[start..]);
                unit.data.truncate(start);
                return Ok(false);
            }
            Err(e) => return Err(e),
        }
        let isize = le32(&unit.data, start + len - 4) as usize;
        // The member must end at the input's end, at the next member's
        // magic, or at zero padding that runs to the end: a hint a byte
        // short or long (the trailer's last byte, a header's zero byte)
        // used to pass as "padding" and fail the member.
        let avail = self.input.fill(3)?.min(3);
        let next = &self.input.peek()[..avail];
        let ends_at_member = match next.first() {
            None => true,
            Some(0) => {
                let avail = self.input.fill(1 << 16)?;
                avail < (1 << 16) && self.input.peek()[..avail].iter().all(|&b| b == 0)
            }
            Some(_) => next == [0x1f, 0x8b, 8],
        };
        if isize > MAX_UNIT || !ends_at_member {
            self.input.unread(&unit.data[start..]);
            unit.data.truncate(start);
            return Ok(false);
        }
        unit.offset = off;
        unit.kind = UnitKind::Packed(header.len as u32);
        unit.raw_len = isize;
        self.marks.decoded(isize as u64);
        Ok(true)
    }

    /// [`Self::stream_some`], handing out what was inflated before an
    /// error first.
    fn stream_held(&mut self, unit: &mut Unit) -> Result<()> {
        let step = self.stream_some(unit);
        self.deferred.hold(step, unit)
    }

    /// Inflate up to [`PLAIN_UNIT`] bytes of the member in progress into
    /// `unit`, which holds only inflated bytes when this fails.
    fn stream_some(&mut self, unit: &mut Unit) -> Result<()> {
        let Some(st) = self.streaming.as_mut() else {
            return Ok(());
        };
        unit.kind = UnitKind::Plain;
        unit.offset = self.input.offset();
        unit.data.reserve(PLAIN_UNIT);
        loop {
            if self.input.fill(1)? == 0 {
                return Err(CodecError::Truncated {
                    format: NAME,
                    offset: self.input.offset(),
                });
            }
            let before_len = unit.data.len();
            unit.data.reserve(PLAIN_UNIT - before_len.min(PLAIN_UNIT));
            let step = st
                .inflate
                .inflate(self.input.peek(), &mut unit.data, false)
                .map_err(|reason| CodecError::corrupt(NAME, self.input.offset(), reason))?;
            let (consumed, produced) = (step.consumed, step.produced);
            st.crc.update(&unit.data[before_len..]);
            st.size += produced as u64;
            self.input.consume(consumed);
            if step.end {
                let off = self.input.offset();
                let st = self
                    .streaming
                    .take()
                    .ok_or_else(|| CodecError::corrupt(NAME, off, "internal: lost member state"))?;
                return self.check_trailer(st.crc.finalize(), st.size);
            }
            if unit.data.len() >= PLAIN_UNIT {
                return Ok(());
            }
            if consumed == 0 && produced == 0 {
                return Err(CodecError::corrupt(
                    NAME,
                    self.input.offset(),
                    "inflate made no progress",
                ));
            }
        }
    }
}

impl super::Splitter for Splitter {
    fn next_unit(&mut self, unit: &mut Unit) -> Result<bool> {
        self.deferred.take()?;
        if self.parallel.is_some() {
            self.parallel_some(unit)?;
            return Ok(true);
        }
        if self.piped.is_some() {
            self.piped_some(unit)?;
            return Ok(true);
        }
        if self.streaming.is_some() {
            self.stream_held(unit)?;
            return Ok(true);
        }
        if self.input.at_end()? {
            if self.members == 0 {
                return Err(CodecError::Truncated {
                    format: NAME,
                    offset: 0,
                });
            }
            self.marks.ended(self.input.offset())?;
            return Ok(false);
        }
        let off = self.input.offset();
        // Zero padding after the last member (tape blocking) is allowed by
        // gzip; anything else that is not a member is garbage.
        if self.members > 0 && self.input.peek().first() == Some(&0) {
            let avail = self.input.fill(1 << 16)?;
            if self.input.peek()[..avail].iter().all(|&b| b == 0) && avail < (1 << 16) {
                self.marks.ended(self.input.offset())?;
                self.input.consume(avail);
                return Ok(false);
            }
        }
        let header = parse_header(&mut self.input).map_err(|e| self.marks.cut(e))?;
        self.members += 1;
        if let Some(mark) = header.mark {
            self.marks.see(off, mark)?;
        }
        if let Some(len) = header.member_len {
            if self.take_sized_member(off, &header, len, unit)? {
                return Ok(true);
            }
        }
        self.input.consume(header.len - header.consumed);
        match self.start_parallel() {
            Parallel::Mapped => {
                self.parallel_some(unit)?;
                return Ok(true);
            }
            Parallel::Pipe => self.start_piped()?,
            Parallel::No(why) => self.one_core(Resume::default(), why)?,
        }
        if self.piped.is_some() {
            self.piped_some(unit)?;
        } else {
            self.stream_held(unit)?;
        }
        Ok(true)
    }

    fn offset(&self) -> u64 {
        // A member inflated in parallel is consumed from the input once it
        // ends: until then, how far its output has come.
        match &self.parallel {
            Some((p, key)) => key + p.input_read(),
            None => self.input.offset(),
        }
    }

    fn cores(&self) -> usize {
        self.cores
    }
}

/// Inflates self-sizing members with libdeflate.
pub struct Decoder {
    inflate: Option<Whole>,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder {
            inflate: Whole::new(),
        }
    }
}

/// Most bytes the members of one unit may inflate to when its length hint
/// turned out to cover more than one ([`Decoder::members_one_by_one`]).
const HINT_OVER_MEMBERS_MAX: usize = 2 * MAX_UNIT;

impl super::UnitDecoder for Decoder {
    fn decode(&mut self, unit: &mut Unit, out: &mut Vec<u8>) -> Result<()> {
        let UnitKind::Packed(header_len) = unit.kind else {
            pass_plain(unit, out);
            return Ok(());
        };
        let data = &unit.data;
        let body = &data[header_len as usize..data.len() - TRAILER_LEN];
        let t = data.len() - TRAILER_LEN;
        let (crc, isize) = (le32(data, t), le32(data, t + 4) as usize);
        let start = out.len();
        let inflate = self
            .inflate
            .as_mut()
            .ok_or_else(|| CodecError::corrupt(NAME, unit.offset, "libdeflate: out of memory"))?;
        out.reserve_exact(isize);
        match inflate.inflate(body, out) {
            Outcome::Done { used } if used == body.len() => {}
            // The DEFLATE stream ends before the trailer the length hint
            // points at, or inflates to more than that trailer's size:
            // the hint covers more than one member (a hint the splitter's
            // checks cannot catch when members follow each other). Taking
            // the last trailer for the first stream's would skip members
            // whose trailer happens to be the same (runs of equal blocks).
            Outcome::Done { .. } | Outcome::NoSpace => {
                out.truncate(start);
                return Self::members_one_by_one(unit, out);
            }
            Outcome::Bad => {
                out.truncate(start);
                return Err(CodecError::corrupt(
                    NAME,
                    unit.offset + u64::from(header_len),
                    "invalid DEFLATE data",
                ));
            }
        }
        let got_len = out.len() - start;
        if got_len != isize {
            out.truncate(start);
            return Err(CodecError::corrupt(
                NAME,
                unit.offset + t as u64 + 4,
                format!("length mismatch: stored {isize}, decoded {got_len}"),
            ));
        }
        let got = crc32fast::hash(&out[start..]);
        if got != crc {
            out.truncate(start);
            return Err(CodecError::corrupt(
                NAME,
                unit.offset + t as u64,
                format!("CRC mismatch: stored {crc:08x}, computed {got:08x}"),
            ));
        }
        Ok(())
    }
}

impl Decoder {
    /// The members in `unit`, one after another, each checked against its
    /// own trailer, as gzip reads them: for a unit whose length hint
    /// covered more than one member.
    fn members_one_by_one(unit: &Unit, out: &mut Vec<u8>) -> Result<()> {
        use std::io::Read;
        tracing::debug!(
            "gzip member at byte {}: its length hint covers more than one member; \
             inflating them one by one",
            unit.offset
        );
        let start = out.len();
        let mut members = flate2::read::MultiGzDecoder::new(&unit.data[..])
            .take(HINT_OVER_MEMBERS_MAX as u64 + 1);
        if let Err(e) = members.read_to_end(out) {
            out.truncate(start);
            return Err(CodecError::corrupt(NAME, unit.offset, e.to_string()));
        }
        if out.len() - start > HINT_OVER_MEMBERS_MAX {
            out.truncate(start);
            return Err(CodecError::corrupt(
                NAME,
                unit.offset,
                format!(
                    "the members under one length hint inflate to more than {} MiB",
                    HINT_OVER_MEMBERS_MAX >> 20
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // Tests fail loudly by design.

    use super::*;
    use std::io::Write;

    /// A gzip member of `data` whose header carries `extra` as its FEXTRA
    /// field (and a header CRC when `hcrc`), as any gzip writer may emit.
    fn member(data: &[u8], extra: &[u8], hcrc: bool) -> Vec<u8> {
        let flags = FEXTRA | if hcrc { FHCRC } else { 0 };
        let mut out = vec![0x1f, 0x8b, 8, flags, 0, 0, 0, 0, 0, 3];
        out.extend_from_slice(&(extra.len() as u16).to_le_bytes());
        out.extend_from_slice(extra);
        if hcrc {
            let crc = crc32fast::hash(&out) as u16;
            out.extend_from_slice(&crc.to_le_bytes());
        }
        let mut deflate =
            flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::new(6));
        deflate.write_all(data).unwrap();
        out.extend(deflate.finish().unwrap());
        out.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out
    }

    /// A length hint that covers two whole members (BGZF's BSIZE here):
    /// the first member's stream ends before the trailer the hint points
    /// at. Taken as the first member's trailer, a second member with the
    /// same trailer (equal blocks) was skipped, exit 0; one with another
    /// trailer failed a CRC gzip does not fail. Both decode as gzip does.
    #[test]
    fn a_length_hint_over_two_members_loses_neither() {
        let bgzf = |data: &[u8], covers: Option<usize>| {
            let mut m = member(data, b"BC\x02\x00\x00\x00", false);
            let size = covers.unwrap_or(m.len());
            m[16..18].copy_from_slice(&((size - 1) as u16).to_le_bytes());
            m
        };
        let block: Vec<u8> = (0..30_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let other: Vec<u8> = block.iter().map(|b| b ^ 0x5a).collect();
        for second in [&block, &other] {
            let plain_second = bgzf(second, None);
            let first = bgzf(&block, Some(bgzf(&block, None).len() + plain_second.len()));
            let mut file = first.clone();
            file.extend_from_slice(&plain_second);
            file.extend_from_slice(&bgzf(&block, None));
            let mut want = block.clone();
            want.extend_from_slice(second);
            want.extend_from_slice(&block);
            let got = crate::decode_all(&file).unwrap();
            assert_eq!(got.len(), want.len());
            assert!(got == want);
            // Damage inside the covered members is still found.
            let mut bad = file.clone();
            let at = first.len() + plain_second.len() - 6;
            bad[at] ^= 1;
            assert!(crate::decode_all(&bad).is_err());
        }
    }

    /// A length hint a little off (as a hand-edited or badly written file
    /// has): gzip skips the subfield and so must cairn, alone and before a
    /// member split by its (right) length. One byte short used to pass as
    /// zero padding (the trailer's last byte) and fail the member.
    /// The start member keeps the name, the time and a comment (pigz
    /// -C), each where given, and its length (CN) counts them.
    #[test]
    fn the_start_member_keeps_a_comment() {
        use super::super::Framer as _;
        let origin = super::super::Origin {
            name: b"f.txt".to_vec(),
            mtime: 7,
        };
        for (comment, with_origin) in [
            (Some(&b"a note"[..]), true),
            (Some(b"x\0y"), false),
            (Some(b""), true),
            (None, true),
        ] {
            let mut f = Framer::with_comment(comment.map(<[u8]>::to_vec));
            if with_origin {
                f.origin(&origin);
            }
            let mut head = Vec::new();
            f.header(&mut head);
            let k = kept(&head).unwrap();
            let want_name = if with_origin { &b"f.txt"[..] } else { b"" };
            // (A NUL would end the comment: it is dropped.)
            let want_comment =
                comment.map(|c| c.iter().copied().filter(|&b| b != 0).collect::<Vec<u8>>());
            assert_eq!(
                (k.origin.name.as_slice(), k.comment),
                (want_name, want_comment)
            );
            assert_eq!(k.origin.mtime, if with_origin { 7 } else { 0 });
            assert_eq!(le32(&head, CN_AT) as usize, head.len());
        }
    }

    #[test]
    fn headers_are_measured_with_what_they_keep() {
        let fixed = [0x1f, 0x8b, 8, 0, 4, 3, 2, 1, 0, 3];
        let k = kept(&fixed).unwrap();
        assert_eq!(
            (
                k.origin.name.as_slice(),
                k.origin.mtime,
                k.header_len,
                k.comment
            ),
            (&b""[..], 0x01020304, 10, None)
        );
        let mut named = fixed.to_vec();
        named[3] = FNAME;
        named.extend_from_slice(b"a\0");
        let k = kept(&named).unwrap();
        assert_eq!((k.origin.name.as_slice(), k.header_len), (&b"a"[..], 12));
        // A comment after the name (pigz -C), an empty one too.
        for comment in [&b"note"[..], b""] {
            let mut noted = named.clone();
            noted[3] |= FCOMMENT;
            noted.extend_from_slice(&[comment, b"\0"].concat());
            let k = kept(&noted).unwrap();
            assert_eq!(
                (k.origin.name.as_slice(), k.comment.as_deref(), k.header_len),
                (&b"a"[..], Some(comment), 13 + comment.len())
            );
        }
        // An extra field and a header CRC (its low 16 bits).
        let mut extra = fixed.to_vec();
        extra[3] = FEXTRA | FHCRC;
        extra.extend_from_slice(&[3, 0, 1, 2, 3]);
        let crc = crc32fast::hash(&extra) as u16;
        extra.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(kept(&extra).map(|k| k.header_len), Some(17));
        // A wrong header CRC, cut short, or no gzip at all.
        let last = extra.len() - 1;
        extra[last] ^= 1;
        assert_eq!(kept(&extra), None);
        assert_eq!(kept(&named[..11]), None);
        assert_eq!(kept(b"BZh91AY&SY"), None);
    }

    #[test]
    fn gzip_length_hint_a_little_off_is_decoded_sequentially() {
        let data: Vec<u8> = (0..300_000u32)
            .map(|i| (i % 251) as u8 ^ (i >> 9) as u8)
            .collect();
        let tail = crate::encode_all(crate::Format::Gzip, 6, 50_000, &data[..120_000]).unwrap();
        let real = member(&data, b"CN\x04\x00\x00\x00\x00\x00", false).len() as i64;
        for delta in [-1i64, 1, -8, 8, -4] {
            let mut extra = b"CN\x04\x00".to_vec();
            extra.extend_from_slice(&((real + delta) as u32).to_le_bytes());
            let m = member(&data, &extra, false);
            let back = crate::decode_all(&m).unwrap_or_else(|e| panic!("{delta}: {e}"));
            assert!(back == data, "{delta}: wrong output");
            let two = [&m[..], &tail[..]].concat();
            let back = crate::decode_all(&two).unwrap_or_else(|e| panic!("{delta} + more: {e}"));
            assert!(
                back == [&data[..], &data[..120_000]].concat(),
                "{delta} + more"
            );
        }
    }

    /// A name and a comment of megabytes, as gzip reads them: read
    /// through in bounded memory (the first MiB of each kept), the header
    /// CRC checked over all of them; the member behind decodes, and one
    /// after it, and so does one with a length hint, also a hint that
    /// would pass for one counted from where the read-through left the
    /// input. Cut inside the name or the comment it is cut short; a wrong
    /// header CRC is damage.
    #[test]
    fn names_and_comments_of_megabytes_are_read_through() {
        let data = b"behind a long header ".repeat(20_000);
        let long_of = |data: &[u8], extra: &[u8], hcrc: bool| {
            let m = member(data, extra, false);
            // The fixed part and the extra field, then the name and the
            // comment, the header CRC, and the member's deflate and
            // trailer.
            let fixed_extra = 12 + extra.len();
            let mut out = m[..fixed_extra].to_vec();
            out[3] |= FNAME | FCOMMENT | if hcrc { FHCRC } else { 0 };
            out.extend(std::iter::repeat_n(b'n', 3 << 20));
            out.push(0);
            out.extend(std::iter::repeat_n(b'c', (1 << 20) + 7));
            out.push(0);
            if hcrc {
                let crc = crc32fast::hash(&out) as u16;
                out.extend_from_slice(&crc.to_le_bytes());
            }
            out.extend_from_slice(&m[fixed_extra..]);
            out
        };
        let long = |extra: &[u8], hcrc: bool| long_of(&data, extra, hcrc);
        let tail = crate::encode_all(crate::Format::Gzip, 6, 50_000, b"and after").unwrap();
        // Where the comment begins: the fixed part, the empty extra
        // field, the name and its NUL.
        let comment_at = 12 + (3 << 20) + 1;
        for hcrc in [true, false] {
            let m = long(b"", hcrc);
            let both = [&m[..], &tail[..]].concat();
            let back = crate::decode_all(&both).unwrap();
            assert!(back == [&data[..], b"and after"].concat(), "{hcrc}");
            // Cut inside the name, and inside the comment past a MiB.
            for at in [2 << 20, comment_at + (1 << 20) + 3] {
                let cut = crate::decode_all(&m[..at]).unwrap_err();
                assert!(matches!(cut, CodecError::Truncated { .. }), "{at}: {cut}");
            }
        }
        // A length hint over a header read through: decoded as a stream.
        let mut hint = b"CN\x04\x00".to_vec();
        hint.extend_from_slice(
            &(long(b"CN\x04\x00\x00\x00\x00\x00", true).len() as u32).to_le_bytes(),
        );
        let hinted = long(&hint, true);
        assert!(crate::decode_all(&hinted).unwrap() == data);
        // A hint that counts the member from where the read-through left
        // the input (its length less the header bytes let go of) ends
        // right where the member does, and passes every other check on a
        // hint when taken from there: the unit would begin inside the
        // header and inflate from the wrong place. A header read through
        // is decoded as a stream whatever its hint says. (Incompressible
        // data, so the member's deflate data outruns what was let go of
        // and the hint covers the header.)
        let noise = crate::testutil::noise(5 << 20, 11);
        let with_hint = |n: u32| {
            let mut extra = b"CN\x04\x00".to_vec();
            extra.extend_from_slice(&n.to_le_bytes());
            long_of(&noise, &extra, true)
        };
        // (The header bytes let go of, as decode_all's input reads them.)
        let placeholder = with_hint(0);
        let header = parse_header(&mut Input::new(Box::new(std::io::Cursor::new(
            placeholder.clone(),
        ))))
        .unwrap();
        assert!(header.consumed > 0);
        let from_there = placeholder.len() - header.consumed;
        assert!(from_there >= header.len + TRAILER_LEN && from_there <= MAX_UNIT);
        let off_by_consumed = with_hint(from_there as u32);
        let after = [&off_by_consumed[..], &tail[..]].concat();
        for (what, m, want) in [
            ("alone", &off_by_consumed, noise.clone()),
            (
                "a member after",
                &after,
                [&noise[..], b"and after"].concat(),
            ),
        ] {
            let back = crate::decode_all(m).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(back == want, "{what}: wrong output");
        }
        let mut bad = long(b"", true);
        let at = comment_at + (1 << 20) + 8;
        bad[at] ^= 1;
        let e = crate::decode_all(&bad).unwrap_err().to_string();
        assert!(e.contains("header checksum"), "{e}");
    }

    /// A header checksum (FHCRC) that does not match is damage, as gzip
    /// says; a right one decodes.
    #[test]
    fn gzip_header_checksum_is_checked() {
        let data = b"hello, header checksum".repeat(100);
        let good = member(&data, b"", true);
        assert!(crate::decode_all(&good).unwrap() == data);
        // 10 fixed bytes, an empty extra field (its 2-byte length), then
        // the header checksum.
        let mut bad = good.clone();
        bad[12] ^= 1;
        let e = crate::decode_all(&bad).unwrap_err().to_string();
        assert!(e.contains("header checksum"), "{e}");
    }

    /// Malformed extra fields that gzip skips: each must decode (as a
    /// stream), alone and followed by a member cairn split by its length.
    #[test]
    fn gzip_malformed_extra_subfield_is_decoded_sequentially() {
        let data: Vec<u8> = (0..300_000u32)
            .map(|i| (i % 251) as u8 ^ (i >> 9) as u8)
            .collect();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            (
                "subfield length past the extra field",
                b"AB\xff\x00xyz".to_vec(),
            ),
            ("extra field too short for a subfield", b"CN\x04".to_vec()),
            ("CN length zero", b"CN\x04\x00\x00\x00\x00\x00".to_vec()),
            ("CN length too long", b"CN\x04\x00\x00\x00\x10\x00".to_vec()),
            ("CN length just short", {
                let mut e = b"CN\x04\x00".to_vec();
                e.extend_from_slice(&1000u32.to_le_bytes());
                e
            }),
            (
                "CN length beyond any unit",
                b"CN\x04\x00\xff\xff\xff\xff".to_vec(),
            ),
            ("BC size wrong", b"BC\x02\x00\x10\x00".to_vec()),
            (
                "CN then a subfield past the end",
                b"CN\x04\x00\x00\x00\x00\x00ZZ\x09\x00".to_vec(),
            ),
        ];
        let tail = crate::encode_all(crate::Format::Gzip, 6, 50_000, &data[..120_000]).unwrap();
        for (what, extra) in cases {
            for hcrc in [false, true] {
                let m = member(&data, &extra, hcrc);
                let back = crate::decode_all(&m).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(back == data, "{what}: wrong output");
                let mut two = m.clone();
                two.extend_from_slice(&tail);
                let back = crate::decode_all(&two).unwrap_or_else(|e| panic!("{what} + more: {e}"));
                assert!(
                    back == [&data[..], &data[..120_000]].concat(),
                    "{what} + more"
                );
            }
        }
    }

    /// The members of a layout-2 stream: start, data..., end.
    fn members(stream: &[u8]) -> Vec<&[u8]> {
        let mut v = Vec::new();
        let mut at = 0;
        while at < stream.len() {
            let len = le32(stream, at + 16) as usize;
            v.push(&stream[at..at + len]);
            at += len;
        }
        v
    }

    /// Layout 2 is refused wherever its start and end members do not pair
    /// up, and read wherever they do: alone, two streams concatenated (as
    /// `cat a.gz b.gz`), after a layout-1 or foreign member, with zero
    /// padding after it.
    #[test]
    fn start_and_end_members_pair_up() {
        let data: Vec<u8> = (0..200_000u32)
            .map(|i| (i % 251) as u8 ^ (i >> 11) as u8)
            .collect();
        let a = crate::encode_all(crate::Format::Gzip, 6, 50_000, &data).unwrap();
        let m = members(&a);
        assert_eq!(m.len(), 6, "start, four blocks, end");
        let join = |parts: &[&[u8]]| parts.concat();
        let decode = |s: &[u8]| crate::decode_all(s).map_err(|e| e.to_string());
        let twice = [&data[..], &data[..]].concat();
        assert_eq!(decode(&a).unwrap(), data);
        assert_eq!(decode(&join(&[&a, &a])).unwrap(), twice);
        let foreign = member(&data, b"", false);
        assert_eq!(decode(&join(&[&foreign, &a])).unwrap(), twice);
        assert_eq!(decode(&join(&[&a, &foreign])).unwrap(), twice);
        assert_eq!(decode(&join(&[&a, &[0; 100]])).unwrap(), data);
        let refused = [
            (
                "cut before the end",
                join(&m[..5]),
                "without its end member",
            ),
            (
                "cut, then padded",
                join(&[&join(&m[..5]), &[0; 100][..]]),
                "without its end member",
            ),
            (
                "cut after the start",
                join(&m[..1]),
                "without its end member",
            ),
            (
                "cut, then another stream",
                join(&[&join(&m[..3]), &a]),
                "a new stream starts",
            ),
            (
                "a member lost",
                join(&[m[0], m[1], m[3], m[4], m[5]]),
                "its members hold 150000",
            ),
            ("no start", join(&m[1..]), "has no start member"),
            // What follows a cut is no member: not "trailing garbage",
            // which gzip only warns of (outside QA: a cut stream read
            // with exit 2 and the input removed).
            (
                "cut, then garbage",
                join(&[&join(&m[..5]), b"hello garbage"]),
                "without its end member",
            ),
            (
                "cut, padded, then a stream",
                join(&[&join(&m[..5]), &[0; 512][..], &a]),
                "without its end member",
            ),
            (
                "a member's magic damaged",
                {
                    let mut b = a.clone();
                    b[m[0].len() + m[1].len()] ^= 1;
                    b
                },
                "without its end member",
            ),
        ];
        for (what, stream, says) in refused {
            let e = decode(&stream).expect_err(what);
            assert!(e.contains(says), "{what}: {e}");
        }
    }
}
