//! zstd as independent frames followed by a seek table in a skippable
//! frame: the public "zstd seekable format". `zstd -d` decodes the frames
//! and skips the table; cairn walks the frames' block headers (no decoding
//! needed) to cut the stream, so it splits any multi-frame zstd, from a
//! pipe too. Frames without a content size, or bigger than [`MAX_UNIT`],
//! are decoded as a stream in the splitter.
//!
//! Seek table: skippable frame `5E 2A 4D 18 | size u32le | per frame:
//! compressed u32le, decompressed u32le, xxh64-low32 u32le | frame count
//! u32le | descriptor 0x80 | B1 EA 92 8F`.
//!
//! Layout 2 begins with an empty frame (the 13 bytes `zstd` writes for no
//! input, so that the file still begins with a frame's magic: GNU tar and
//! `file` tell zstd by it) and a start frame (a skippable frame `5C 2A 4D
//! 18 | 8 | "CAIRNZ" | layout u16le`), both listed in the seek table: a
//! stream with a start frame must end with its seek table, whose
//! decompressed sizes must add up to what its frames decoded to. Every
//! prefix of a multi-frame file that ends between frames is a valid zstd
//! file, so a writer killed there left a file that `zstd -t` and cairn
//! took as whole; cairn now refuses it.

use super::{
    at_offset, le32, pass_plain, BlockMeta, Mark, MarkNames, Marks, Unit, UnitKind, MAX_UNIT,
    PLAIN_UNIT,
};
use crate::block::ZstdCodec;
use crate::error::{CodecError, Result};
use crate::input::{begins_like, Input};
use zstd::stream::raw::{Decoder as RawDecoder, InBuffer, Operation, OutBuffer};

const NAME: &str = "zstd";

/// A zstd dictionary (`zstd -D DICT`, made by `zstd --train`): frames
/// packed with it name its ID in their headers (unless `--no-dictID`) and
/// are decoded with the same dictionary only. Shared by the workers.
#[derive(Clone, PartialEq, Eq)]
pub struct Dictionary {
    bytes: std::sync::Arc<[u8]>,
}

impl Dictionary {
    /// A dictionary of these bytes: zstd's own format (its magic and ID
    /// first), or any bytes, taken as raw content to refer back to (as
    /// zstd takes a file without the magic).
    pub fn new(bytes: Vec<u8>) -> Self {
        Dictionary {
            bytes: bytes.into(),
        }
    }

    /// A dictionary of at most `max_size` bytes trained on `samples`
    /// with zstd's trainer (as `zstd --train`; each sample one file).
    pub fn train(samples: &[Vec<u8>], max_size: usize) -> Result<Self> {
        zstd::dict::from_samples(samples, max_size)
            .map(Dictionary::new)
            .map_err(|e| {
                CodecError::Invalid(format!(
                    "zstd dictionary training on {} samples: {e}",
                    samples.len()
                ))
            })
    }

    /// The dictionary's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Its ID, from its header (`None` for raw content, whose frames name
    /// no dictionary).
    pub fn id(&self) -> Option<u32> {
        zstd::zstd_safe::get_dict_id_from_dict(&self.bytes).map(|id| id.get())
    }
}

impl std::fmt::Debug for Dictionary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dictionary")
            .field("len", &self.bytes.len())
            .field("id", &self.id())
            .finish()
    }
}
/// Magic of a zstd frame.
pub const FRAME_MAGIC: u32 = 0xFD2F_B528;
const SEEK_TABLE_MAGIC: u32 = 0x184D_2A5E;
const SEEKABLE_FOOTER_MAGIC: u32 = 0x8F92_EAB1;
/// Magic of layout 2's start frame (a skippable frame).
const START_MAGIC: u32 = 0x184D_2A5C;
/// The start frame's content: who wrote it, and the layout.
const START_BODY: [u8; 8] = *b"CAIRNZ\x02\x00";
/// The start frame, whole.
const START_FRAME_LEN: u32 = 16;
/// The low 32 bits of XXH64 of no bytes: the checksum in the seek table
/// of the empty frame and the start frame (they decode to nothing).
const XXH64_EMPTY_LOW: u32 = 0x51D8_E999;
/// The frame `zstd` writes for no input (single segment, content size 0,
/// one empty raw block, the checksum): layout 2's first frame. Without
/// the checksum (`--no-check`, FHD `0x20`), its first 9 bytes.
const EMPTY_FRAME: [u8; 13] = [
    0x28, 0xb5, 0x2f, 0xfd, 0x24, 0x00, 0x01, 0x00, 0x00, 0x99, 0xe9, 0xd8, 0x51,
];
/// Largest seek table read to check a stream's length (12 bytes a frame).
const MAX_TABLE: u32 = 64 << 20;
/// How a reader names zstd's start frame and seek table.
const ZSTD_MARKS: MarkNames = MarkNames {
    format: NAME,
    start: "start frame",
    end: "seek table",
    pieces: "frames",
    end_alone_ok: true,
};

/// Is `head` (at least 4 bytes) the magic of a skippable frame?
pub fn is_skippable_magic(head: &[u8]) -> bool {
    le32(head, 0) & 0xFFFF_FFF0 == 0x184D_2A50
}

/// Whether `have` (fewer than 4 bytes) could begin a skippable frame
/// (`0x184D2A5?`, the same in zstd and lz4 streams).
pub(crate) fn could_start_skippable(have: &[u8]) -> bool {
    have.first().is_some_and(|b| b & 0xf0 == 0x50) && begins_like(&have[1..], &[0x2a, 0x4d, 0x18])
}

/// Whether `have` (fewer than 4 bytes) could begin a frame or a skippable
/// frame.
fn could_start_frame(have: &[u8]) -> bool {
    begins_like(have, &FRAME_MAGIC.to_le_bytes()) || could_start_skippable(have)
}

/// One of zstd's advanced compression parameters, as `zstd --zstd=`
/// names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    /// `windowLog`, `wlog`.
    WindowLog,
    /// `hashLog`, `hlog`.
    HashLog,
    /// `chainLog`, `clog`.
    ChainLog,
    /// `searchLog`, `slog`.
    SearchLog,
    /// `minMatch`, `mml`.
    MinMatch,
    /// `targetLength`, `tlen`.
    TargetLength,
    /// `strategy`, `strat` (1 fast .. 9 btultra2).
    Strategy,
    /// `overlapLog`, `ovlog`: the overlap of zstd's multi-threaded jobs;
    /// cairn's frames are independent, so it is taken and changes nothing.
    OverlapLog,
    /// `ldmHashLog`, `lhlog`.
    LdmHashLog,
    /// `ldmMinMatch`, `lmml`.
    LdmMinMatch,
    /// `ldmBucketSizeLog`, `lblog`.
    LdmBucketSizeLog,
    /// `ldmHashRateLog`, `lhrlog`.
    LdmHashRateLog,
}

impl Param {
    fn named(name: &str) -> Option<Param> {
        Some(match name {
            "windowLog" | "wlog" => Param::WindowLog,
            "hashLog" | "hlog" => Param::HashLog,
            "chainLog" | "clog" => Param::ChainLog,
            "searchLog" | "slog" => Param::SearchLog,
            "minMatch" | "mml" => Param::MinMatch,
            "targetLength" | "tlen" => Param::TargetLength,
            "strategy" | "strat" => Param::Strategy,
            "overlapLog" | "ovlog" => Param::OverlapLog,
            "ldmHashLog" | "lhlog" => Param::LdmHashLog,
            "ldmMinMatch" | "lmml" => Param::LdmMinMatch,
            "ldmBucketSizeLog" | "lblog" => Param::LdmBucketSizeLog,
            "ldmHashRateLog" | "lhrlog" => Param::LdmHashRateLog,
            _ => return None,
        })
    }
}

/// What of a zstd frame `zstd` lets one set beyond the level: its
/// advanced parameters (`--zstd=wlog=23,strategy=7`), frames without
/// their decoded size (`--no-content-size`), the row match finder
/// (`--[no-]row-match-finder`) and a target size of compressed blocks
/// (`--target-compressed-block-size`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tuning {
    /// Parameters in the order given (a later one wins).
    pub params: Vec<(Param, u32)>,
    /// Frame headers without the decoded size.
    pub no_content_size: bool,
    /// The row-based match finder forced on or off (`None`: zstd's
    /// choice by level).
    pub row_match_finder: Option<bool>,
    /// Compressed blocks of about this size (0: none asked).
    pub target_block: u32,
}

impl Tuning {
    /// Whether a window size is set (not 0, zstd's "from the level").
    pub(crate) fn sets_window(&self) -> bool {
        self.params
            .iter()
            .rev()
            .find(|(p, _)| *p == Param::WindowLog)
            .is_some_and(|&(_, v)| v != 0)
    }

    /// `--zstd=`'s list (`wlog=23,hlog=22`) added to the parameters; an
    /// empty list or item is refused, as zstd refuses it.
    pub fn add_params(&mut self, list: &str) -> std::result::Result<(), String> {
        for item in list.split(',') {
            let (name, value) = item
                .split_once('=')
                .ok_or_else(|| format!("--zstd={list}: {item:?} is no NAME=VALUE"))?;
            let param = Param::named(name)
                .ok_or_else(|| format!("--zstd={list}: no parameter named {name:?}"))?;
            let value = number(value)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| format!("--zstd={list}: {value:?} is no number"))?;
            self.params.push((param, value));
        }
        Ok(())
    }

    /// Set on `c` (after its level and long-distance matching).
    pub(crate) fn apply(&self, c: &mut zstd::bulk::Compressor<'_>) -> std::io::Result<()> {
        use zstd::zstd_safe::{CParameter, ParamSwitch, Strategy};
        c.include_contentsize(!self.no_content_size)?;
        for &(param, v) in &self.params {
            let p = match param {
                Param::WindowLog => CParameter::WindowLog(v),
                Param::HashLog => CParameter::HashLog(v),
                Param::ChainLog => CParameter::ChainLog(v),
                Param::SearchLog => CParameter::SearchLog(v),
                Param::MinMatch => CParameter::MinMatch(v),
                Param::TargetLength => CParameter::TargetLength(v),
                // 0: the level's (zstd's "default").
                Param::Strategy if v == 0 => continue,
                Param::Strategy => CParameter::Strategy(match v {
                    1 => Strategy::ZSTD_fast,
                    2 => Strategy::ZSTD_dfast,
                    3 => Strategy::ZSTD_greedy,
                    4 => Strategy::ZSTD_lazy,
                    5 => Strategy::ZSTD_lazy2,
                    6 => Strategy::ZSTD_btlazy2,
                    7 => Strategy::ZSTD_btopt,
                    8 => Strategy::ZSTD_btultra,
                    9 => Strategy::ZSTD_btultra2,
                    _ => {
                        return Err(std::io::Error::other(format!(
                            "strategy {v}: zstd's strategies are 1 (fast) to 9 (btultra2)"
                        )))
                    }
                }),
                Param::OverlapLog => continue,
                Param::LdmHashLog => CParameter::LdmHashLog(v),
                Param::LdmMinMatch => CParameter::LdmMinMatch(v),
                Param::LdmBucketSizeLog => CParameter::LdmBucketSizeLog(v),
                Param::LdmHashRateLog => CParameter::LdmHashRateLog(v),
            };
            c.set_parameter(p)
                .map_err(|e| std::io::Error::other(format!("--zstd: {param:?} {v}: {e}")))?;
        }
        if let Some(on) = self.row_match_finder {
            let s = if on {
                ParamSwitch::Enable
            } else {
                ParamSwitch::Disable
            };
            c.set_parameter(CParameter::UseRowMatchFinder(s))?;
        }
        if self.target_block > 0 {
            c.set_parameter(CParameter::TargetCBlockSize(self.target_block))?;
        }
        Ok(())
    }

    /// Whether anything is asked beyond zstd's defaults.
    pub fn is_default(&self) -> bool {
        *self == Tuning::default()
    }

    /// Refused where zstd would refuse it (a value out of its range), by
    /// a trial context at `level`, before any block is packed.
    pub fn check(&self, level: i32) -> Result<()> {
        let mut c = zstd::bulk::Compressor::new(level)
            .map_err(|e| CodecError::Invalid(format!("zstd level {level}: {e}")))?;
        self.apply(&mut c)
            .map_err(|e| CodecError::Invalid(e.to_string()))
    }
}

/// A number as zstd's options take it: digits, then K, KB or KiB
/// (times 1024), or M, MB or MiB (times 2^20).
pub fn number(s: &str) -> Option<u64> {
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let n: u64 = s[..digits].parse().ok()?;
    let shift = match &s[digits..] {
        "" => 0,
        "K" | "KB" | "KiB" => 10,
        "M" | "MB" | "MiB" => 20,
        _ => return None,
    };
    n.checked_mul(1 << shift)
}

/// Compresses blocks into frames with content size and checksum.
pub struct Encoder {
    codec: ZstdCodec,
}

impl Encoder {
    /// An encoder at zstd `level`.
    pub fn new(level: i32) -> Self {
        Encoder::with(level, None, true)
    }

    /// An encoder at zstd `level`, with long-distance matching over a
    /// window of `2^window_log` bytes (`zstd --long`) if `long` says, and
    /// frames with or without XXH64 of their content (`zstd --no-check`).
    /// The window reaches back only within a block: each block is a frame
    /// of its own.
    pub fn with(level: i32, long: Option<u32>, checksum: bool) -> Self {
        Encoder {
            codec: ZstdCodec::for_files(level, long, checksum),
        }
    }

    /// Frames packed with `dictionary` (`zstd -D`), whose ID each frame
    /// header names unless `dict_id` is false (`zstd --no-dictID`).
    pub fn with_dictionary(mut self, dictionary: Option<Dictionary>, dict_id: bool) -> Self {
        self.codec.set_dictionary(dictionary, dict_id);
        self
    }

    /// Frames packed as `tuning` asks (see [`Tuning`]).
    pub fn with_tuning(mut self, tuning: Tuning) -> Self {
        self.codec.set_tuning(tuning);
        self
    }
}

impl super::BlockEncoder for Encoder {
    fn encode(&mut self, src: &[u8], out: &mut Vec<u8>) -> Result<BlockMeta> {
        let start = out.len();
        self.codec.compress_frame(src, out)?;
        let len = out.len() - start;
        // The frame ends with the low 32 bits of XXH64 of the content,
        // which is what the seek table stores: no second hash pass.
        let check = if len >= 4 && self.codec.checksum() {
            le32(out, out.len() - 4)
        } else {
            0
        };
        Ok(BlockMeta {
            raw_len: src.len() as u64,
            packed_len: len as u64,
            check: u64::from(check),
        })
    }
}

/// Collects frame sizes and writes the seek table.
pub struct SeekTable {
    entries: Vec<(u32, u32, u32)>,
    /// Entries carry each frame's checksum (the frames have one).
    checksum: bool,
}

impl Default for SeekTable {
    fn default() -> Self {
        SeekTable::new(true)
    }
}

impl SeekTable {
    /// A seek table whose entries carry the frames' checksums, or, for
    /// frames without one, do not.
    pub fn new(checksum: bool) -> Self {
        SeekTable {
            entries: Vec::new(),
            checksum,
        }
    }
}

impl super::Framer for SeekTable {
    fn header(&mut self, out: &mut Vec<u8>) {
        // The same check as the data frames (`zstd -l` shows the first's).
        let empty = if self.checksum {
            EMPTY_FRAME.to_vec()
        } else {
            [&EMPTY_FRAME[..4], &[0x20], &EMPTY_FRAME[5..9]].concat()
        };
        out.extend_from_slice(&empty);
        self.entries.push((empty.len() as u32, 0, XXH64_EMPTY_LOW));
        out.extend_from_slice(&START_MAGIC.to_le_bytes());
        out.extend_from_slice(&(START_FRAME_LEN - 8).to_le_bytes());
        out.extend_from_slice(&START_BODY);
        self.entries.push((START_FRAME_LEN, 0, XXH64_EMPTY_LOW));
    }
    fn block(&mut self, meta: &BlockMeta) {
        self.entries.push((
            meta.packed_len as u32,
            meta.raw_len as u32,
            meta.check as u32,
        ));
    }
    fn trailer(&mut self, out: &mut Vec<u8>) -> Result<()> {
        let n = self.entries.len();
        let entry = if self.checksum { 12 } else { 8 };
        let body = n * entry + 9;
        let size = u32::try_from(body).map_err(|_| {
            CodecError::Invalid(format!("zstd: {n} frames overflow the seek table"))
        })?;
        out.extend_from_slice(&SEEK_TABLE_MAGIC.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        for (c, d, x) in &self.entries {
            out.extend_from_slice(&c.to_le_bytes());
            out.extend_from_slice(&d.to_le_bytes());
            if self.checksum {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        out.extend_from_slice(&(n as u32).to_le_bytes());
        out.push(if self.checksum { 0x80 } else { 0 });
        out.extend_from_slice(&SEEKABLE_FOOTER_MAGIC.to_le_bytes());
        Ok(())
    }
}

/// What a frame header says.
struct FrameHeader {
    /// The window the frame asks for (single-segment frames: their size).
    window: Option<u64>,
    header_len: usize,
    content_size: Option<u64>,
    checksum: bool,
    /// The dictionary the frame was packed with, if it names one.
    dict_id: Option<u32>,
}

/// Where the content size field of a frame header whose descriptor byte
/// is `fhd` starts, and its length: the header ends right after it.
fn content_size_field(fhd: u8) -> (usize, usize) {
    let single = fhd & 0x20 != 0;
    let did_len = [0usize, 1, 2, 4][usize::from(fhd & 3)];
    let fcs_len = match (fhd >> 6, single) {
        (0, false) => 0,
        (0, true) => 1,
        (1, _) => 2,
        (2, _) => 4,
        _ => 8,
    };
    (5 + usize::from(!single) + did_len, fcs_len)
}

/// Length of a frame header whose descriptor byte is `fhd`.
fn header_len(fhd: u8) -> usize {
    let (at, len) = content_size_field(fhd);
    at + len
}

/// Parse the frame header at the start of `b` (which holds at least
/// [`header_len`] bytes); `off` is its stream offset, for errors.
fn frame_header(b: &[u8], off: u64) -> Result<FrameHeader> {
    let fhd = b[4];
    if fhd & 0x08 != 0 {
        return Err(CodecError::corrupt(
            NAME,
            off + 4,
            "reserved bit set in frame header",
        ));
    }
    let (p, fcs_len) = content_size_field(fhd);
    let header_len = p + fcs_len;
    let content_size = match fcs_len {
        0 => None,
        1 => Some(u64::from(b[p])),
        2 => Some(u64::from(u16::from_le_bytes([b[p], b[p + 1]])) + 256),
        4 => Some(u64::from(le32(b, p))),
        _ => {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[p..p + 8]);
            Some(u64::from_le_bytes(w))
        }
    };
    let window = if fhd & 0x20 == 0 {
        let wd = b[5];
        let base = 1u64 << (10 + (wd >> 3));
        Some(base + base / 8 * u64::from(wd & 7))
    } else {
        content_size
    };
    // The dictionary ID sits right before the content size.
    let did_len = [0usize, 1, 2, 4][usize::from(fhd & 3)];
    let dict_id = match did_len {
        0 => 0,
        n => b[p - n..p]
            .iter()
            .rev()
            .fold(0u32, |id, &byte| id << 8 | u32::from(byte)),
    };
    Ok(FrameHeader {
        window,
        header_len,
        content_size,
        checksum: fhd & 0x04 != 0,
        dict_id: (dict_id != 0).then_some(dict_id),
    })
}

fn parse_frame_header(input: &mut Input) -> Result<FrameHeader> {
    let off = input.offset();
    let fhd = input.need(5, NAME)?[4];
    let b = input.need(header_len(fhd), NAME)?;
    frame_header(b, off)
}

/// The body length of the block whose 3-byte header is at the start of `b`
/// (at stream offset `off`), and whether it is the frame's last block.
fn block_body(b: &[u8], off: u64) -> Result<(usize, bool)> {
    let bh = u32::from(b[0]) | u32::from(b[1]) << 8 | u32::from(b[2]) << 16;
    let size = (bh >> 3) as usize;
    let body = match (bh >> 1) & 3 {
        0 | 2 => size,
        1 => 1,
        _ => return Err(CodecError::corrupt(NAME, off, "reserved block type")),
    };
    if body > (128 << 10) {
        return Err(CodecError::corrupt(
            NAME,
            off,
            format!("block of {body} bytes exceeds the 128 KiB maximum"),
        ));
    }
    Ok((body, bh & 1 != 0))
}

/// Does `b` hold exactly one whole frame of `raw_len` decoded bytes? Walks
/// the block headers only, as [`Splitter::take_frame`] does.
fn is_one_frame(b: &[u8], raw_len: u64) -> bool {
    if b.len() < 5 || le32(b, 0) != FRAME_MAGIC || b.len() < header_len(b[4]) {
        return false;
    }
    let Ok(fh) = frame_header(b, 0) else {
        return false;
    };
    if fh.content_size != Some(raw_len) {
        return false;
    }
    let mut at = fh.header_len;
    loop {
        let Some(h) = b.get(at..at + 3) else {
            return false;
        };
        let Ok((body, last)) = block_body(h, 0) else {
            return false;
        };
        at += 3 + body;
        if last {
            return at + if fh.checksum { 4 } else { 0 } == b.len();
        }
    }
}

/// The frame sizes a seek table at the end of a regular file states, when
/// they add up to the file (from offset 0) and each frame fits a unit.
/// Anything else (no table, a table with checksums off or on, an
/// inconsistent one) gives `None`, and the splitter walks block headers.
fn read_seek_table(input: &Input) -> Option<Vec<(u32, u32)>> {
    let len = input.stream_len()?;
    let foot = input.read_tail(9)?;
    if le32(&foot, 5) != SEEKABLE_FOOTER_MAGIC || foot[4] & 0x7F != 0 {
        return None;
    }
    let count = u64::from(le32(&foot, 0));
    let entry = if foot[4] & 0x80 != 0 { 12 } else { 8 };
    let table = 8 + count * entry + 9;
    if table > len || table > 64 << 20 {
        return None;
    }
    let t = input.read_tail(table as usize)?;
    if le32(&t, 0) != SEEK_TABLE_MAGIC || u64::from(le32(&t, 4)) != table - 8 {
        return None;
    }
    let mut frames = Vec::with_capacity(count as usize);
    let mut sum = 0u64;
    for e in t[8..t.len() - 9].chunks_exact(entry as usize) {
        let (c, d) = (le32(e, 0), le32(e, 4));
        if c < 6 || c as usize > MAX_UNIT || d as usize > MAX_UNIT {
            return None;
        }
        sum += u64::from(c);
        frames.push((c, d));
    }
    (sum + table == len).then_some(frames)
}

/// Cuts a zstd stream at frame boundaries.
pub struct Splitter {
    /// For frames decoded as a stream (`zstd -d -D`).
    dictionary: Option<Dictionary>,
    input: Input,
    streaming: Option<Box<RawDecoder<'static>>>,
    frames: u64,
    /// Frame sizes from the seek table still to come, when the input is a
    /// regular file with a consistent table: each frame is then read
    /// straight into its unit in one call, with no block walk through the
    /// buffer (each frame is still checked to be whole and to end where
    /// the table says, and on a mismatch the table is dropped).
    table: Option<std::vec::IntoIter<(u32, u32)>>,
    table_read: bool,
    /// Largest window (log2) of a frame decoded as a stream.
    window_log_max: u32,
    /// Start frames and seek tables seen.
    marks: Marks,
    /// An error met after part of a frame was decoded.
    deferred: super::Deferred,
}

/// What the skippable frame `frame` (whole) says of the stream around it:
/// layout 2's start frame, or a seek table with the sum of its frames'
/// decompressed sizes; `None` for any other (or malformed) one.
fn mark_of(frame: &[u8]) -> Option<Mark> {
    match le32(frame, 0) {
        START_MAGIC => frame[8..]
            .starts_with(&START_BODY[..6])
            .then_some(Mark::Start),
        SEEK_TABLE_MAGIC if frame.len() >= 17 => {
            let foot = &frame[frame.len() - 9..];
            if le32(foot, 5) != SEEKABLE_FOOTER_MAGIC || foot[4] & 0x7F != 0 {
                return None;
            }
            let entry = if foot[4] & 0x80 != 0 { 12 } else { 8 };
            let entries = &frame[8..frame.len() - 9];
            if entries.len() != le32(foot, 0) as usize * entry {
                return None;
            }
            let total = entries
                .chunks_exact(entry)
                .map(|e| u64::from(le32(e, 4)))
                .sum();
            Some(Mark::End(total))
        }
        _ => None,
    }
}

impl Splitter {
    /// A splitter over `input`.
    pub fn new(input: Input) -> Self {
        Self::with_window_log_max(input, super::DecodeOptions::default().zstd_window_log_max)
    }

    /// A splitter that accepts windows up to `2^window_log_max` bytes.
    pub fn with_window_log_max(input: Input, window_log_max: u32) -> Self {
        Splitter {
            dictionary: None,
            input,
            streaming: None,
            frames: 0,
            table: None,
            table_read: false,
            window_log_max,
            marks: Marks::new(ZSTD_MARKS),
            deferred: super::Deferred::default(),
        }
    }

    /// Frames decoded as a stream (no content size, or too big to be a
    /// unit) are decoded with `dictionary` (`zstd -d -D`).
    pub fn with_dictionary(mut self, dictionary: Option<Dictionary>) -> Self {
        self.dictionary = dictionary;
        self
    }

    /// Whether frames are being cut by the seek table (for tests).
    pub fn by_table(&self) -> bool {
        self.table.is_some()
    }

    /// The next frame as the seek table states it, read whole into `unit`;
    /// `false` when there is no table (any more) or the frame does not match
    /// it, with the input as it was.
    fn frame_by_table(&mut self, unit: &mut Unit) -> Result<bool> {
        if !self.table_read {
            self.table_read = true;
            if self.input.offset() == 0 {
                self.table = read_seek_table(&self.input).map(Vec::into_iter);
            }
        }
        let Some(table) = self.table.as_mut() else {
            return Ok(false);
        };
        let Some((packed, raw)) = table.next() else {
            self.table = None;
            return Ok(false);
        };
        let off = self.input.offset();
        if raw == 0 && packed == START_FRAME_LEN {
            // The start frame, which decodes to nothing: no unit.
            let b = self.input.need(packed as usize, NAME)?;
            if le32(b, 4) == packed - 8 && mark_of(b) == Some(Mark::Start) {
                self.marks.see(off, Mark::Start)?;
                self.input.consume(packed as usize);
                self.frames += 1;
                return self.frame_by_table(unit);
            }
            self.table = None;
            return Ok(false);
        }
        unit.data.clear();
        // Frames that are mostly stored blocks (incompressible data) are
        // decoded in place from a map of the file: their decoding is a copy,
        // and reading them first would be a second one.
        unit.shared = if u64::from(raw) < u64::from(packed) + u64::from(packed) / 8 {
            self.input.take_shared(packed as usize)?
        } else {
            None
        };
        if unit.shared.is_none() {
            self.input.take(packed as usize, &mut unit.data, NAME)?;
        }
        if !is_one_frame(unit.bytes(), u64::from(raw)) {
            self.input.unread(unit.bytes());
            unit.data.clear();
            unit.shared = None;
            self.table = None;
            return Ok(false);
        }
        self.frames += 1;
        self.marks.decoded(u64::from(raw));
        unit.offset = off;
        unit.raw_len = raw as usize;
        unit.kind = UnitKind::Packed(0);
        Ok(true)
    }

    /// Copy one frame whose header is at the input's start into `unit`.
    fn take_frame(&mut self, fh: &FrameHeader, unit: &mut Unit) -> Result<()> {
        self.input.take(fh.header_len, &mut unit.data, NAME)?;
        loop {
            let off = self.input.offset();
            let (body, last) = block_body(self.input.need(3, NAME)?, off)?;
            if unit.data.len() + 3 + body > MAX_UNIT {
                return Err(CodecError::TooLarge {
                    format: NAME,
                    what: "frame",
                    offset: unit.offset,
                    size: (unit.data.len() + 3 + body) as u64,
                    limit: MAX_UNIT as u64,
                });
            }
            self.input.take(3 + body, &mut unit.data, NAME)?;
            if last {
                break;
            }
        }
        if fh.checksum {
            self.input.take(4, &mut unit.data, NAME)?;
        }
        Ok(())
    }

    /// Decode up to [`PLAIN_UNIT`] bytes of the frame in progress into
    /// `unit`, which holds only decoded bytes when this fails.
    fn stream_some(&mut self, unit: &mut Unit) -> Result<()> {
        let Some(dec) = self.streaming.as_mut() else {
            return Ok(());
        };
        unit.kind = UnitKind::Plain;
        unit.offset = self.input.offset();
        unit.data.resize(PLAIN_UNIT, 0);
        let mut produced = 0;
        let step = loop {
            match self.input.fill(1) {
                Ok(0) => {
                    break Err(CodecError::Truncated {
                        format: NAME,
                        offset: self.input.offset(),
                    })
                }
                Ok(_) => {}
                Err(e) => break Err(e),
            }
            let mut inb = InBuffer::around(self.input.peek());
            // A block's room at a time: a call that fails keeps back what
            // it decoded (the position is not moved). Full blocks then
            // come one per call, and all before a damaged one go out;
            // small blocks sharing a call with it are still lost.
            let room = (produced + BLOCK_ROOM).min(PLAIN_UNIT);
            let mut outb = OutBuffer::around_pos(&mut unit.data[..room], produced);
            let hint = dec.run(&mut inb, &mut outb);
            produced = outb.pos();
            let used = inb.pos();
            self.input.consume(used);
            match hint {
                Err(e) => {
                    break Err(CodecError::corrupt(
                        NAME,
                        self.input.offset(),
                        e.to_string(),
                    ))
                }
                Ok(0) => {
                    // End of frame.
                    self.streaming = None;
                    break Ok(());
                }
                Ok(_) if produced == PLAIN_UNIT => break Ok(()),
                Ok(_) => {}
            }
        };
        unit.data.truncate(produced);
        self.marks.decoded(produced as u64);
        step
    }

    /// The frame taken into `unit` stopped short with `e` (the input was
    /// cut, or a block header is damaged): what its whole blocks decode
    /// to is handed out as a plain unit, as `zstd -d` writes it, and `e`
    /// follows. Damage inside a whole frame surfaces on a worker instead.
    fn salvage(&mut self, unit: &mut Unit, e: CodecError) -> Result<()> {
        let mut out = Vec::new();
        let dictionary = self.dictionary.as_ref();
        decode_prefix(
            &unit.data,
            unit.raw_len,
            dictionary,
            self.window_log_max,
            &mut out,
        );
        unit.data = out;
        unit.kind = UnitKind::Plain;
        unit.raw_len = 0;
        self.deferred.hold(Err(e), unit)
    }

    /// Skip the skippable frame at the input's start (at `off`), taking
    /// note of a start frame or a seek table.
    fn skippable(&mut self, off: u64) -> Result<()> {
        let head = self.input.need(8, NAME)?;
        let (magic, size) = (le32(head, 0), le32(head, 4));
        // Only the two frames cairn reads are held whole; any other
        // writer's skippable frame is skipped unread, as before.
        if size > MAX_TABLE || (magic != START_MAGIC && magic != SEEK_TABLE_MAGIC) {
            self.input.consume(8);
            return self.input.skip(u64::from(size), NAME);
        }
        let whole = 8 + size as usize;
        let mark = mark_of(self.input.need(whole, NAME)?);
        if let Some(mark) = mark {
            self.marks.see(off, mark)?;
        }
        self.input.consume(whole);
        Ok(())
    }
}

/// Output room given to one call of a streaming decode: zstd's largest
/// block.
const BLOCK_ROOM: usize = 128 << 10;

/// The largest window a frame may have (zstd's limit in 64-bit builds),
/// for frames decoded whole: they state a size of at most [`MAX_UNIT`],
/// and zstd's buffer is never larger than the frame's size.
const WINDOW_LOG_ANY: u32 = 31;

/// A decoder for a frame decoded as a stream (at `off`), with `dictionary`
/// and windows up to `2^window_log_max` bytes.
fn stream_decoder(
    dictionary: Option<&Dictionary>,
    window_log_max: u32,
    off: u64,
) -> Result<Box<RawDecoder<'static>>> {
    let dictionary = dictionary.map_or(&[][..], |d| d.bytes());
    let mut dec = RawDecoder::with_dictionary(dictionary)
        .map_err(|e| CodecError::corrupt(NAME, off, format!("decoder setup: {e}")))?;
    dec.set_parameter(zstd::zstd_safe::DParameter::WindowLogMax(window_log_max))
        .map_err(|e| CodecError::corrupt(NAME, off, e.to_string()))?;
    Ok(Box::new(dec))
}

/// Append to `out` what the frame at the start of `frame` decodes to, at
/// most `room` bytes, until the frame ends, its bytes run out or damage
/// stops the decoder: what `zstd -d` writes of a cut or damaged frame
/// (its whole blocks before the cut or the damage).
fn decode_prefix(
    frame: &[u8],
    room: usize,
    dictionary: Option<&Dictionary>,
    window_log_max: u32,
    out: &mut Vec<u8>,
) {
    let start = out.len();
    out.resize(start + room, 0);
    let mut produced = 0;
    if let Ok(mut dec) = stream_decoder(dictionary, window_log_max, 0) {
        let mut inb = InBuffer::around(frame);
        // A block's room at a time: with room for the whole frame and
        // the whole frame there, zstd decodes it in one call, and a call
        // that fails gives back nothing of what it decoded.
        loop {
            let end = (produced + BLOCK_ROOM).min(room);
            let mut outb = OutBuffer::around(&mut out[start + produced..start + end]);
            let used = inb.pos();
            let step = dec.run(&mut inb, &mut outb);
            let made = outb.pos();
            produced += made;
            // Until the decoder refuses the bytes, ends the frame or stops
            // making progress (the bytes ran out, or the room).
            match step {
                Ok(hint) if hint != 0 && (made > 0 || inb.pos() != used) => {}
                _ => break,
            }
        }
    }
    out.truncate(start + produced);
}

impl super::Splitter for Splitter {
    fn next_unit(&mut self, unit: &mut Unit) -> Result<bool> {
        self.deferred.take()?;
        loop {
            if self.streaming.is_some() {
                let step = self.stream_some(unit);
                self.deferred.hold(step, unit)?;
                if unit.data.is_empty() && self.streaming.is_none() {
                    continue;
                }
                return Ok(true);
            }
            if self.frame_by_table(unit)? {
                return Ok(true);
            }
            if self.input.at_end()? {
                if self.frames == 0 {
                    return Err(CodecError::Truncated {
                        format: NAME,
                        offset: 0,
                    });
                }
                self.marks.ended(self.input.offset())?;
                return Ok(false);
            }
            let off = self.input.offset();
            let magic = match self.input.need_start(4, NAME, could_start_frame) {
                Ok(b) => le32(b, 0),
                Err(e) => return Err(self.marks.cut(e)),
            };
            if is_skippable_magic(self.input.peek()) {
                self.skippable(off)?;
                self.frames += 1;
                continue;
            }
            if magic != FRAME_MAGIC {
                return Err(self.marks.cut(CodecError::TrailingGarbage {
                    format: NAME,
                    offset: off,
                }));
            }
            self.frames += 1;
            let fh = parse_frame_header(&mut self.input)?;
            if let Some(id) = fh.dict_id {
                check_dictionary(id, self.dictionary.as_ref(), off)?;
            }
            // A frame of any size whose window is over the limit is refused,
            // as zstd refuses it (found outside: a frame of stated size went
            // to the workers unchecked, so `-M 1K` let a 1.9 MiB window by).
            let limit = 1u64 << self.window_log_max;
            if let Some(window) = fh.window.filter(|&w| w > limit) {
                return Err(CodecError::TooLarge {
                    format: NAME,
                    what: "frame window (unpack --long=N or -M SIZE raises the limit)",
                    offset: off,
                    size: window,
                    limit,
                });
            }
            match fh.content_size {
                Some(size) if size <= MAX_UNIT as u64 => {
                    unit.offset = off;
                    unit.raw_len = size as usize;
                    unit.kind = UnitKind::Packed(0);
                    match self.take_frame(&fh, unit) {
                        Ok(()) => {}
                        // Incompressible data near the limit: the frame's
                        // blocks outgrow a unit though its content does
                        // not. It is put back and decoded as a stream.
                        Err(CodecError::TooLarge { .. }) => {
                            self.input.unread(&unit.data);
                            unit.clear();
                            let dictionary = self.dictionary.as_ref();
                            let dec = stream_decoder(dictionary, self.window_log_max, off)?;
                            self.streaming = Some(dec);
                            continue;
                        }
                        Err(e) => {
                            self.salvage(unit, e)?;
                            return Ok(true);
                        }
                    }
                    self.marks.decoded(size);
                    return Ok(true);
                }
                _ => {
                    let dictionary = self.dictionary.as_ref();
                    self.streaming = Some(stream_decoder(dictionary, self.window_log_max, off)?);
                }
            }
        }
    }

    fn offset(&self) -> u64 {
        self.input.offset()
    }
}

/// A frame packed with dictionary `id`, at `offset`, decoded with
/// `given`: the same, or the error that says which is missing.
fn check_dictionary(id: u32, given: Option<&Dictionary>, offset: u64) -> Result<()> {
    match given {
        Some(d) if d.id() == Some(id) => Ok(()),
        given => Err(CodecError::Dictionary {
            offset,
            id,
            given: match given {
                Some(_) => "the dictionary given (-D) is another",
                None => "give it with -D DICT",
            },
        }),
    }
}

/// Decodes whole frames on a worker.
pub struct Decoder {
    codec: ZstdCodec,
    /// Frames that name a dictionary are checked against it.
    dictionary: Option<Dictionary>,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder::with_dictionary(None)
    }
}

impl Decoder {
    /// A decoder of frames packed with `dictionary` (`zstd -d -D`); frames
    /// packed without one decode as well.
    pub fn with_dictionary(dictionary: Option<Dictionary>) -> Self {
        let mut codec = ZstdCodec::new(3);
        codec.set_dictionary(dictionary.clone(), true);
        Decoder { codec, dictionary }
    }
}

impl super::UnitDecoder for Decoder {
    fn decode(&mut self, unit: &mut Unit, out: &mut Vec<u8>) -> Result<()> {
        match unit.kind {
            UnitKind::Plain => {
                pass_plain(unit, out);
                Ok(())
            }
            UnitKind::Packed(_) => {
                // (Frames cut by a seek table were not looked at.)
                let bytes = unit.bytes();
                let whole_header = bytes
                    .get(4)
                    .is_some_and(|&fhd| bytes.len() >= header_len(fhd));
                let named = whole_header
                    .then(|| frame_header(bytes, 0).ok())
                    .flatten()
                    .and_then(|h| h.dict_id);
                if let Some(id) = named {
                    check_dictionary(id, self.dictionary.as_ref(), unit.offset)?;
                }
                self.codec
                    .decompress_frame(bytes, out, unit.raw_len)
                    .map_err(|e| at_offset(e, unit.offset))
            }
        }
    }

    fn salvage(&mut self, unit: &Unit, out: &mut Vec<u8>) {
        if let UnitKind::Packed(_) = unit.kind {
            // The window needs no limit here: a frame decoded whole states
            // its size (at most MAX_UNIT), and zstd's buffer is no larger.
            let dictionary = self.dictionary.as_ref();
            decode_prefix(unit.bytes(), unit.raw_len, dictionary, WINDOW_LOG_ANY, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{decode_input, encode_all, Format, Splitter as _, UnitDecoder as _};
    use super::*;
    use crate::testutil::noise;
    use std::io::{Read, Seek, Write};

    /// `bytes` in a temporary file, opened as the CLI opens one.
    fn file_input(bytes: &[u8]) -> Input {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        f.rewind().unwrap();
        let mut head = [0u8; 16];
        let n = f.read(&mut head).unwrap();
        Input::with_prefix_file(&head[..n], f)
    }

    /// Decode every unit; returns the output and, per unit, whether the seek
    /// table was still in use after it.
    fn split_and_decode(bytes: &[u8]) -> Result<(Vec<u8>, Vec<bool>)> {
        let mut s = Splitter::new(file_input(bytes));
        let mut dec = Decoder::default();
        let (mut out, mut by_table, mut unit) = (Vec::new(), Vec::new(), Unit::default());
        loop {
            unit.clear();
            if !s.next_unit(&mut unit)? {
                return Ok((out, by_table));
            }
            by_table.push(s.by_table());
            dec.decode(&mut unit, &mut out)?;
        }
    }

    /// `bytes` cut and decoded with `dictionary`, as `zstd -d -D` would.
    fn decode_with(bytes: &[u8], dictionary: Option<&Dictionary>) -> Result<Vec<u8>> {
        let mut s = Splitter::new(file_input(bytes)).with_dictionary(dictionary.cloned());
        let mut dec = Decoder::with_dictionary(dictionary.cloned());
        let (mut out, mut unit) = (Vec::new(), Unit::default());
        loop {
            unit.clear();
            if !s.next_unit(&mut unit)? {
                return Ok(out);
            }
            dec.decode(&mut unit, &mut out)?;
        }
    }

    #[test]
    fn frames_packed_with_a_dictionary_are_read_with_it_alone() {
        let samples: Vec<Vec<u8>> = (0..400)
            .map(|i| {
                format!("{{\"id\": {i}, \"name\": \"user{i}\", \"mail\": \"u{i}@example.com\"}}\n")
            })
            .map(String::into_bytes)
            .collect();
        let dict = Dictionary::new(zstd::dict::from_samples(&samples, 2048).unwrap());
        let id = dict.id().unwrap();
        let other = Dictionary::new(zstd::dict::from_samples(&samples[..200], 1024).unwrap());
        assert_ne!(other.id(), Some(id));
        let data = samples.concat();
        // Two frames of known size, as cairn packs them, then one of no
        // stated size (decoded as a stream), as zstd packs a pipe.
        let mut packed = Vec::new();
        let mut enc = Encoder::with(3, None, true).with_dictionary(Some(dict.clone()), true);
        let (a, b) = data.split_at(data.len() / 2);
        for part in [a, b] {
            super::super::BlockEncoder::encode(&mut enc, part, &mut packed).unwrap();
        }
        let mut streamed =
            zstd::stream::Encoder::with_dictionary(Vec::new(), 3, dict.bytes()).unwrap();
        std::io::Write::write_all(&mut streamed, b).unwrap();
        packed.extend(streamed.finish().unwrap());
        let want = [a, b, b].concat();
        assert!(decode_with(&packed, Some(&dict)).unwrap() == want);
        // The frames name the dictionary; without it, or with another,
        // the error says so, for either kind of frame.
        for given in [None, Some(&other)] {
            match decode_with(&packed, given) {
                Err(CodecError::Dictionary {
                    id: named,
                    offset: 0,
                    ..
                }) => assert_eq!(named, id),
                other => panic!("{other:?}"),
            }
        }
        // Packed without its ID (`--no-dictID`), a frame still decodes with
        // the dictionary, and without it fails as damage would.
        let mut bare = Vec::new();
        let mut enc = Encoder::with(3, None, true).with_dictionary(Some(dict.clone()), false);
        super::super::BlockEncoder::encode(&mut enc, &data, &mut bare).unwrap();
        assert!(decode_with(&bare, Some(&dict)).unwrap() == data);
        assert!(decode_with(&bare, None).is_err());
    }

    fn sample() -> (Vec<u8>, Vec<u8>) {
        let mut data = noise(200_000, 7);
        data.extend(std::iter::repeat_n(b'z', 150_000));
        data.extend(noise(50_001, 8));
        let packed = encode_all(Format::Zstd, 3, 64 << 10, &data).unwrap();
        (data, packed)
    }

    /// Byte offset of seek table entry `i` in `packed`.
    fn entry_at(packed: &[u8], i: usize) -> usize {
        let count = le32(packed, packed.len() - 9) as usize;
        packed.len() - 9 - 12 * count + 12 * i
    }

    #[test]
    fn incompressible_frames_are_decoded_in_place() {
        // Noise frames are taken from the map of the file, the run of `z`
        // is read into the unit; the bytes come out the same either way.
        let (data, packed) = sample();
        let mut s = Splitter::new(file_input(&packed));
        let mut dec = Decoder::default();
        let (mut out, mut mapped, mut unit) = (Vec::new(), Vec::new(), Unit::default());
        loop {
            unit.clear();
            if !s.next_unit(&mut unit).unwrap() {
                break;
            }
            mapped.push(unit.shared.is_some());
            dec.decode(&mut unit, &mut out).unwrap();
        }
        assert!(out == data);
        assert_eq!(mapped.first(), Some(&true), "{mapped:?}");
        assert!(mapped.contains(&false), "{mapped:?}");
    }

    #[test]
    fn a_regular_file_is_cut_by_its_seek_table() {
        let (data, packed) = sample();
        let (out, by_table) = split_and_decode(&packed).unwrap();
        assert_eq!(out, data);
        assert!(
            by_table.len() >= 3 && by_table.iter().all(|t| *t),
            "{by_table:?}"
        );
    }

    #[test]
    fn a_table_that_lies_is_dropped_and_the_frames_walked() {
        let (data, packed) = sample();
        // Two frame sizes swapped: the sum still matches the file.
        let size = |i| le32(&packed, entry_at(&packed, i));
        // Past the empty frame (entry 0) and the start frame (entry 1).
        let i = (2..).find(|&i| size(i) != size(i + 1)).unwrap();
        let mut swapped = packed.clone();
        let (a, b) = (entry_at(&packed, i), entry_at(&packed, i + 1));
        swapped[a..a + 4].copy_from_slice(&packed[b..b + 4]);
        swapped[b..b + 4].copy_from_slice(&packed[a..a + 4]);
        let (out, by_table) = split_and_decode(&swapped).unwrap();
        assert_eq!(out, data);
        // Entry 1 is the start frame, which makes no unit.
        let u = i - 1;
        assert!(
            by_table[..u].iter().all(|t| *t) && !by_table[u],
            "{by_table:?}"
        );
        // A wrong decoded size: the table is not used to cut, and as the
        // end of a layout-2 stream it says another length than its frames
        // decode to, which is refused; zstd skips the table and reads on.
        let mut wrong = packed.clone();
        let d = entry_at(&packed, 1) + 4;
        wrong[d] ^= 1;
        let e = split_and_decode(&wrong).unwrap_err().to_string();
        assert!(e.contains("the seek table says"), "{e}");
    }

    #[test]
    fn a_frame_whose_blocks_outgrow_a_unit_is_streamed() {
        // Raw blocks of incompressible bytes make the frame a little
        // bigger than its content, which is the most a unit holds (this
        // failed as "frame too large").
        let data = crate::testutil::noise(MAX_UNIT, 7);
        let frame = zstd::bulk::compress(&data, 1).unwrap();
        assert!(frame.len() > MAX_UNIT);
        let (out, _) = split_and_decode(&frame).unwrap();
        assert!(out == data);
    }

    #[test]
    fn damage_that_zstd_ignores_is_ignored_and_other_damage_still_fails() {
        let (data, packed) = sample();
        // A table whose sizes do not add up to the file: not used.
        let mut off = packed.clone();
        let e = entry_at(&packed, 3);
        off[e] = off[e].wrapping_add(1);
        let (out, by_table) = split_and_decode(&off).unwrap();
        assert_eq!(out, data);
        assert!(by_table.iter().all(|t| !t));
        // Truncated: no table, and the walk reports the truncation.
        let cut = &packed[..packed.len() / 2];
        assert!(matches!(
            split_and_decode(cut),
            Err(CodecError::Truncated { .. })
        ));
        // Garbage after the table: no table, and the walk reports it.
        let mut tail = packed.clone();
        tail.extend_from_slice(b"garbage!");
        assert!(matches!(
            split_and_decode(&tail),
            Err(CodecError::TrailingGarbage { .. })
        ));
        // A flipped byte inside a frame: the table is used, the decoder fails.
        let mut flip = packed.clone();
        flip[100] ^= 0x55;
        assert!(super::super::decode_all(&flip).is_err());
        assert!(split_and_decode(&flip).is_err());
    }

    /// A frame that asks for a 2 GiB window (7 bytes found by the fuzzer)
    /// is refused up front unless the limit is raised, as `zstd -d` does.
    #[test]
    fn a_window_over_the_limit_is_refused_unless_raised() {
        let head = [0x28, 0xb5, 0x2f, 0xfd, 0x00, 0xa8, 0x8f];
        let input = || Input::new(Box::new(std::io::Cursor::new(head.to_vec())));
        let mut unit = Unit::default();
        let err = Splitter::new(input()).next_unit(&mut unit).unwrap_err();
        assert!(
            matches!(err, CodecError::TooLarge { size, limit, .. }
                if size == 1 << 31 && limit == 1 << 27),
            "{err}"
        );
        // Raised: the window is accepted, and the missing blocks found.
        let mut s = Splitter::with_window_log_max(input(), 31);
        assert!(matches!(
            s.next_unit(&mut unit),
            Err(CodecError::Truncated { .. })
        ));
    }

    #[test]
    fn decode_input_reads_a_file_as_decode_as_reads_memory() {
        let (data, packed) = sample();
        let out = decode_input(Format::Zstd, file_input(&packed), usize::MAX).unwrap();
        assert_eq!(out, data);
    }

    /// Layout 2's start frame and seek table pair up: a stream cut after
    /// any frame is refused, from a file (cut by its table: none) and from
    /// a pipe; two streams concatenated, and frames without a start frame
    /// (layout 1, other writers) before or after, read as ever.
    #[test]
    fn the_start_frame_and_seek_table_pair_up() {
        let (data, packed) = sample();
        let count = le32(&packed, packed.len() - 9) as usize;
        let table_at = entry_at(&packed, 0) - 8;
        let ends: Vec<usize> = (0..count)
            .scan(0, |at, i| {
                *at += le32(&packed, entry_at(&packed, i)) as usize;
                Some(*at)
            })
            .collect();
        assert_eq!(ends[count - 1], table_at);
        let decode = |b: &[u8]| -> std::result::Result<Vec<u8>, String> {
            let piped = crate::decode_all(b).map_err(|e| e.to_string());
            let file = split_and_decode(b)
                .map(|(out, _)| out)
                .map_err(|e| e.to_string());
            assert_eq!(piped, file, "a pipe and a file read alike");
            piped
        };
        // Cut after the empty frame: an empty file, as before the start
        // frame was written (both are written in one call).
        assert_eq!(decode(&packed[..ends[0]]).unwrap(), b"");
        for &end in &ends[1..] {
            let e = decode(&packed[..end]).unwrap_err();
            assert!(e.contains("without its seek table"), "cut at {end}: {e}");
        }
        let twice = [&data[..], &data[..]].concat();
        assert_eq!(decode(&[&packed[..], &packed[..]].concat()).unwrap(), twice);
        // Without the start frame (whose table, not adding up now, is not
        // used to cut): as layout 1 was read.
        let start = ends[0]..ends[1];
        assert_eq!(start.len(), START_FRAME_LEN as usize);
        let layout1 = &[&packed[..start.start], &packed[start.end..]].concat();
        assert_eq!(decode(layout1).unwrap(), data);
        assert_eq!(decode(&[layout1, &packed[..]].concat()).unwrap(), twice);
        assert_eq!(decode(&[&packed[..], layout1].concat()).unwrap(), twice);
        assert!(
            packed.starts_with(&FRAME_MAGIC.to_le_bytes()),
            "a frame first"
        );
        let e = decode(&[&packed[..ends[2]], &packed[..]].concat()).unwrap_err();
        assert!(e.contains("a new stream starts"), "{e}");
        // Bytes that are no frame after a cut: the stream's end is missing.
        let e = decode(&[&packed[..ends[2]], b"garbage!"].concat()).unwrap_err();
        assert!(e.contains("without its seek table"), "{e}");
    }
}
