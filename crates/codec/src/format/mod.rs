//! Stream formats: the standard file framings, written so that the standard
//! tool reads them and split so that cairn decodes them in parallel.
//!
//! Encoding is split three ways so the pipeline can run it on many cores:
//! a [`BlockEncoder`] per worker turns one input block into self-contained
//! bytes of the format (a gzip member, a zstd frame, a run of lz4 blocks...),
//! and a [`Framer`] on the writing side adds the stream header and the
//! trailer (seek table, index, end mark) from each block's [`BlockMeta`].
//!
//! Decoding mirrors it: a [`Splitter`] reads the stream and cuts it into
//! [`Unit`]s that decode independently, and a [`UnitDecoder`] per worker
//! decodes them. Where a stream cannot be cut (one big gzip member, a zstd
//! frame with no size), the splitter decodes it itself, sequentially, and
//! hands out [`UnitKind::Plain`] units: never wrong, and with reading,
//! decoding and writing still overlapped on different threads.

use crate::error::{CodecError, Result};
use crate::inflate::index::GzipIndex;
use crate::input::Input;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

pub mod bzip2;
pub mod gzip;
pub mod gzip_range;
pub mod lz4;
pub mod lzma;
pub mod lzop;
pub mod snappy;
pub mod xz;
pub mod xz_filters;
pub mod zstd;

/// Largest unit a splitter hands to a worker, compressed or decoded. It
/// bounds memory per slot; bigger frames are decoded as a stream.
pub const MAX_UNIT: usize = 64 << 20;

/// Size of the plain units a sequential (fallback) decode hands out.
pub const PLAIN_UNIT: usize = 1 << 20;

/// The name and modification time of what a stream was packed from, as
/// gzip's FNAME and MTIME (and lzop's) keep them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origin {
    /// The file's base name, as stored (no NUL; empty: none).
    pub name: Vec<u8>,
    /// Seconds since the Unix epoch (0: none, as gzip reads it).
    pub mtime: u32,
}

/// The longest gzip header comment cairn writes, in bytes: a header
/// with it and a file name fits the 64 KiB the listings and `-N` read.
pub const MAX_COMMENT: usize = 32 << 10;

/// What an encoder may be asked beyond format and level (each refused by
/// a format that lacks it, see [`Format::check_options`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncodeOptions {
    /// zstd's long-distance matching over a window of `2^N` bytes.
    pub long: Option<u32>,
    /// xz's extreme presets (`xz -e`): slower, sometimes smaller.
    pub extreme: bool,
    /// The integrity check each block or frame carries.
    pub check: IntegrityCheck,
    /// lz4's legacy frame format (`lz4 -l`): 8 MiB blocks, no checksums,
    /// what Linux kernel images and initramfs archives are packed in.
    pub legacy: bool,
    /// lz4's `--favor-decSpeed`: LZ4 HC's optimal parser (levels 10-12)
    /// prefers matches that decode faster, as lz4 sets it on frames (a
    /// legacy frame's blocks are written without it, as by lz4).
    pub favor_dec_speed: bool,
    /// xz's custom filter chain (`xz --x86 --lzma2=dict=32MiB`): each
    /// block goes through it instead of the level's preset.
    pub filters: Option<xz_filters::FilterChain>,
    /// zstd's dictionary (`zstd -D DICT`): every frame is packed with it.
    pub zstd_dictionary: Option<zstd::Dictionary>,
    /// zstd's `--no-dictID`: frames packed with a dictionary do not name
    /// its ID (their reader must know which to use).
    pub zstd_no_dict_id: bool,
    /// zstd's advanced parameters and frame options (`--zstd=`,
    /// `--no-content-size`...).
    pub zstd_tuning: zstd::Tuning,
    /// A comment for the gzip header (FCOMMENT, `pigz -C`; its bytes
    /// without the NUL, which ends it: NULs in it are dropped).
    pub gzip_comment: Option<Vec<u8>>,
}

/// The integrity check a stream carries (`xz --check=`, `zstd
/// --no-check`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum IntegrityCheck {
    /// The format's own: gzip's CRC-32, zstd's XXH64, xz's CRC64...
    #[default]
    Default,
    /// None at all (xz, zstd and lzop only; lzop keeps one at levels
    /// 7-9 anyway, as lzop -F).
    None,
    /// CRC-32 (xz; lzop's --crc32).
    Crc32,
    /// CRC-64 (xz; its default).
    Crc64,
    /// SHA-256 (xz).
    Sha256,
}

impl fmt::Display for IntegrityCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IntegrityCheck::Default => "default",
            IntegrityCheck::None => "none",
            IntegrityCheck::Crc32 => "crc32",
            IntegrityCheck::Crc64 => "crc64",
            IntegrityCheck::Sha256 => "sha256",
        })
    }
}

impl FromStr for IntegrityCheck {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "none" => IntegrityCheck::None,
            "crc32" => IntegrityCheck::Crc32,
            "crc64" => IntegrityCheck::Crc64,
            "sha256" => IntegrityCheck::Sha256,
            _ => {
                return Err(format!(
                    "unsupported check {s:?}: none, crc32, crc64 or sha256"
                ))
            }
        })
    }
}

/// The stream formats cairn writes and reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// gzip members with a size field in FEXTRA.
    Gzip,
    /// zstd frames plus the seekable-format seek table.
    Zstd,
    /// LZ4 frame with independent blocks.
    Lz4,
    /// Snappy framing format.
    Snappy,
    /// lzop.
    Lzop,
    /// Concatenated bzip2 streams.
    Bzip2,
    /// xz with one block per input block and the index.
    Xz,
    /// The legacy `.lzma` format (LZMA_Alone): one LZMA1 stream, written
    /// and read on one core.
    Lzma,
}

impl Format {
    /// Every format written in independent blocks (all but `.lzma`, one
    /// stream: see [`Format::EVERY`]).
    pub const ALL: [Format; 7] = [
        Format::Gzip,
        Format::Zstd,
        Format::Lz4,
        Format::Snappy,
        Format::Lzop,
        Format::Bzip2,
        Format::Xz,
    ];

    /// Every format cairn reads and writes: [`Format::ALL`] and `.lzma`.
    pub const EVERY: [Format; 8] = {
        let mut every = [Format::Lzma; 8];
        let mut i = 0;
        while i < Format::ALL.len() {
            every[i] = Format::ALL[i];
            i += 1;
        }
        every
    };

    /// Name on the command line and in messages.
    pub fn name(self) -> &'static str {
        match self {
            Format::Gzip => "gzip",
            Format::Zstd => "zstd",
            Format::Lz4 => "lz4",
            Format::Snappy => "snappy",
            Format::Lzop => "lzop",
            Format::Bzip2 => "bzip2",
            Format::Xz => "xz",
            Format::Lzma => "lzma",
        }
    }

    /// The usual file-name suffix, with its dot.
    pub fn suffix(self) -> &'static str {
        match self {
            Format::Gzip => ".gz",
            Format::Zstd => ".zst",
            Format::Lz4 => ".lz4",
            Format::Snappy => ".sz",
            Format::Lzop => ".lzo",
            Format::Bzip2 => ".bz2",
            Format::Xz => ".xz",
            Format::Lzma => ".lzma",
        }
    }

    /// Accepted levels, inclusive.
    pub fn level_range(self) -> (i32, i32) {
        match self {
            Format::Gzip => (0, 12),
            Format::Zstd => (-50, 22),
            Format::Lz4 => (crate::lz4_ffi::MIN_LEVEL, crate::lz4_ffi::MAX_LEVEL),
            Format::Snappy => (1, 1),
            Format::Lzop => (1, 9),
            Format::Bzip2 => (1, 9),
            Format::Xz | Format::Lzma => (0, 9),
        }
    }

    /// Level when none is given (the standard tool's default).
    pub fn default_level(self) -> i32 {
        match self {
            Format::Gzip => 6,
            Format::Zstd => 3,
            Format::Lz4 | Format::Snappy => 1,
            Format::Lzop => 3,
            Format::Bzip2 => 9,
            Format::Xz | Format::Lzma => 6,
        }
    }

    /// Clamp a level the way the standard tools do (`lz4 -9` is accepted).
    pub fn clamp_level(self, level: i32) -> i32 {
        let (lo, hi) = self.level_range();
        level.clamp(lo, hi)
    }

    /// Input block size used when none is given, for what `opts` asks: as
    /// [`Format::default_block_size`], and for lz4's legacy frames their
    /// 8 MiB blocks, so that every block but the last is full, as `lz4
    /// -l` writes them.
    pub fn default_block_size_with(self, level: i32, opts: &EncodeOptions) -> usize {
        match self {
            Format::Lz4 if opts.legacy => lz4::LEGACY_BLOCK,
            Format::Xz if opts.filters.is_some() => opts
                .filters
                .map_or(xz::block_size(level), |c| xz::chain_block_size(&c)),
            _ => self.default_block_size(level),
        }
    }

    /// Input block size used when none is given: big enough that per-block
    /// overhead and lost cross-block matches cost well under 1%, small
    /// enough that several blocks per thread stay in flight.
    pub fn default_block_size(self, level: i32) -> usize {
        match self {
            Format::Gzip => 1 << 20,
            Format::Zstd => {
                if level >= 10 {
                    8 << 20
                } else {
                    4 << 20
                }
            }
            Format::Lz4 | Format::Snappy | Format::Lzop => 4 << 20,
            Format::Bzip2 => bzip2::block_size(level),
            Format::Xz => xz::block_size(level),
            // Read in units of this size, packed as one stream.
            Format::Lzma => 1 << 20,
        }
    }

    /// The format whose magic `head` starts with. Needs up to 13 bytes.
    pub fn detect(head: &[u8]) -> Option<Format> {
        if head.starts_with(&[0x1f, 0x8b]) {
            Some(Format::Gzip)
        } else if head.starts_with(&zstd::FRAME_MAGIC.to_le_bytes())
            || (head.len() >= 4 && zstd::is_skippable_magic(head))
        {
            Some(Format::Zstd)
        } else if head.starts_with(&lz4::MAGIC.to_le_bytes())
            || head.starts_with(&lz4::LEGACY_MAGIC.to_le_bytes())
        {
            Some(Format::Lz4)
        } else if head.starts_with(snappy::STREAM_ID) {
            Some(Format::Snappy)
        } else if head.starts_with(lzop::MAGIC) {
            Some(Format::Lzop)
        } else if head.len() >= 4 && head.starts_with(b"BZh") && (b'1'..=b'9').contains(&head[3]) {
            Some(Format::Bzip2)
        } else if head.starts_with(xz::HEADER_MAGIC) {
            Some(Format::Xz)
        } else if lzma::is_header(head) {
            // No magic: a header that makes sense, as liblzma's automatic
            // decoder takes one (13 bytes).
            Some(Format::Lzma)
        } else {
            None
        }
    }

    /// The smallest window (log2, at least zstd's 10) that holds a block of
    /// `block_size` bytes.
    pub fn window_log_for(block_size: usize) -> u32 {
        block_size.max(1 << 10).next_power_of_two().trailing_zeros()
    }

    /// Refuse what `opts` asks of a format that lacks it: long-distance
    /// matching (`--long=N`) but for zstd, xz's extreme presets (`-e`)
    /// but for xz, and a check other than the format's own (xz: none,
    /// CRC32, CRC64 or SHA-256; zstd: XXH64 or none; lzop: Adler-32,
    /// CRC-32 or none; the others always
    /// carry theirs), lz4's legacy frames and favoring decompression
    /// speed but for lz4.
    pub fn check_options(self, opts: &EncodeOptions) -> Result<()> {
        if opts.legacy && self != Format::Lz4 {
            return Err(CodecError::Invalid(format!(
                "--legacy is lz4's legacy frame format (lz4 -l); {self} has none"
            )));
        }
        if opts.favor_dec_speed && self != Format::Lz4 {
            return Err(CodecError::Invalid(format!(
                "--favor-decSpeed is lz4's (LZ4 HC); {self} has no such option"
            )));
        }
        if !opts.zstd_tuning.is_default() && self != Format::Zstd {
            return Err(CodecError::Invalid(format!(
                "--zstd=, --no-content-size and the match finder are zstd's; {self} has none"
            )));
        }
        if opts.gzip_comment.is_some() && self != Format::Gzip {
            return Err(CodecError::Invalid(format!(
                "--comment is kept in a gzip header; {self} has no comment"
            )));
        }
        if let Some(n) = opts
            .gzip_comment
            .as_ref()
            .map(Vec::len)
            .filter(|&n| n > MAX_COMMENT)
        {
            return Err(CodecError::Invalid(format!(
                "--comment of {n} bytes: cairn keeps at most {MAX_COMMENT} in a gzip header \
                 (its listings read the header from the first 64 KiB)"
            )));
        }
        if opts.zstd_dictionary.is_some() && self != Format::Zstd {
            return Err(CodecError::Invalid(format!(
                "-D DICT is a zstd dictionary; {self} takes none"
            )));
        }
        if let Some(n) = opts.long.filter(|_| self != Format::Zstd) {
            return Err(CodecError::Invalid(format!(
                "--long={n} is zstd's long-distance matching; {self} has none"
            )));
        }
        if let Some(chain) = opts.filters {
            match self {
                Format::Xz => chain.for_xz()?,
                Format::Lzma => {
                    chain.for_lzma()?;
                }
                _ => {
                    return Err(CodecError::Invalid(format!(
                        "a filter chain ({chain}) is xz's; {self} has none"
                    )))
                }
            }
        }
        if opts.extreme && !matches!(self, Format::Xz | Format::Lzma) {
            return Err(CodecError::Invalid(format!(
                "-e (--extreme) is xz's; {self} has no extreme presets"
            )));
        }
        let fits = match self {
            // xz takes a check for .lzma and writes none, as here.
            Format::Xz | Format::Lzma => true,
            Format::Zstd => matches!(opts.check, IntegrityCheck::Default | IntegrityCheck::None),
            // lzop's -F and --crc32 (Adler-32 by default).
            Format::Lzop => matches!(
                opts.check,
                IntegrityCheck::Default | IntegrityCheck::None | IntegrityCheck::Crc32
            ),
            // A legacy frame carries none anyway.
            Format::Lz4 if opts.legacy => {
                matches!(opts.check, IntegrityCheck::Default | IntegrityCheck::None)
            }
            _ => opts.check == IntegrityCheck::Default,
        };
        if !fits {
            let has = match self {
                Format::Lz4 if opts.legacy => "none (a legacy frame has no checksums)",
                Format::Zstd => "XXH64 or none",
                Format::Gzip => "always CRC-32",
                Format::Bzip2 => "always CRC-32",
                Format::Lz4 => "always XXH32",
                Format::Lzop => "Adler-32 (the default), CRC-32 or none",
                Format::Snappy => "always CRC-32C",
                Format::Xz | Format::Lzma => "",
            };
            return Err(CodecError::Invalid(format!(
                "{self} cannot carry the check {}: its check is {has}",
                opts.check
            )));
        }
        Ok(())
    }

    /// A worker-side encoder at `level` for blocks of up to `block_size`.
    pub fn encoder(self, level: i32, block_size: usize) -> Result<Box<dyn BlockEncoder>> {
        self.encoder_with(level, block_size, &EncodeOptions::default())
    }

    /// As [`Format::encoder`], with what `opts` asks (refused, by
    /// [`Format::check_options`], where the format lacks it): zstd's
    /// long-distance matching over a window of `2^N` bytes (as `zstd
    /// --long=N`), cut to the block, which is as far back as a block's
    /// frame can reach; xz's extreme presets; the check each block
    /// carries.
    pub fn encoder_with(
        self,
        level: i32,
        block_size: usize,
        opts: &EncodeOptions,
    ) -> Result<Box<dyn BlockEncoder>> {
        let level = self.clamp_level(level);
        self.check_options(opts)?;
        let checksum = opts.check != IntegrityCheck::None;
        if self == Format::Zstd && !opts.zstd_tuning.is_default() {
            opts.zstd_tuning.check(level)?;
        }
        Ok(match self {
            Format::Gzip => Box::new(gzip::Encoder::new(level)),
            Format::Zstd => Box::new(
                zstd::Encoder::with(
                    level,
                    opts.long.map(|n| n.min(Format::window_log_for(block_size))),
                    checksum,
                )
                .with_dictionary(opts.zstd_dictionary.clone(), !opts.zstd_no_dict_id)
                .with_tuning(opts.zstd_tuning.clone()),
            ),
            Format::Lz4 => Box::new(lz4::Encoder::with(level, opts.legacy, opts.favor_dec_speed)),
            Format::Snappy => Box::new(snappy::Encoder::default()),
            Format::Lzop => Box::new(lzop::Encoder::new(level, opts.check)),
            Format::Bzip2 => Box::new(bzip2::Encoder::new(level)),
            Format::Xz => Box::new(xz::Encoder::with(
                level,
                block_size,
                opts.extreme,
                xz::check_id(opts.check),
                opts.filters,
            )?),
            Format::Lzma => {
                return Err(CodecError::Invalid(
                    "the .lzma format is one stream: written by Format::lzma_encoder".into(),
                ))
            }
        })
    }

    /// Whether the format is written as one stream on one core
    /// ([`Format::lzma_encoder`]), not as independent blocks.
    pub fn is_one_stream(self) -> bool {
        self == Format::Lzma
    }

    /// The encoder of a `.lzma` stream at `level` (0-9, `-e` in `opts`),
    /// or with the LZMA1 options of `opts`' filter chain.
    pub fn lzma_encoder(self, level: i32, opts: &EncodeOptions) -> Result<lzma::StreamEncoder> {
        self.check_options(opts)?;
        let l = match opts.filters {
            Some(chain) => chain.for_lzma()?,
            None => xz_filters::Lzma::preset(
                u32::try_from(self.clamp_level(level).clamp(0, 9)).unwrap_or(6),
                opts.extreme,
            ),
        };
        lzma::StreamEncoder::new(&l.options(u32::MAX)?)
    }

    /// The writer-side framer, for blocks from [`Format::encoder_with`]
    /// given the same `opts`.
    pub fn framer(self, level: i32, opts: &EncodeOptions) -> Box<dyn Framer> {
        let level = self.clamp_level(level);
        let checksum = opts.check != IntegrityCheck::None;
        match self {
            Format::Gzip => Box::new(gzip::Framer::with_comment(opts.gzip_comment.clone())),
            Format::Zstd => Box::new(zstd::SeekTable::new(checksum)),
            Format::Lz4 if opts.legacy => Box::new(lz4::LegacyFramer),
            Format::Lz4 => Box::new(lz4::Framer),
            Format::Snappy => Box::new(snappy::Framer::default()),
            Format::Lzop => Box::new(lzop::Framer::new(level, opts.check)),
            Format::Bzip2 | Format::Lzma => Box::new(NoFraming),
            Format::Xz => Box::new(xz::Framer::new(xz::check_id(opts.check))),
        }
    }

    /// A splitter over `input`, which must start with this format's magic.
    pub fn splitter(self, input: Input) -> Box<dyn Splitter> {
        self.splitter_with(input, &DecodeOptions::default())
    }

    /// A splitter over `input`, with decoding limits.
    pub fn splitter_with(self, input: Input, opts: &DecodeOptions) -> Box<dyn Splitter> {
        match self {
            Format::Gzip => Box::new(
                gzip::Splitter::with_threads(input, opts.threads)
                    .with_index(opts.gzip_index.clone())
                    .with_memory(opts.memory),
            ),
            Format::Zstd => Box::new(
                zstd::Splitter::with_window_log_max(input, opts.zstd_window_log_max)
                    .with_dictionary(opts.zstd_dictionary.clone()),
            ),
            Format::Lz4 => Box::new(lz4::Splitter::new(input)),
            Format::Snappy => Box::new(snappy::Splitter::new(input)),
            Format::Lzop => {
                Box::new(lzop::Splitter::new(input).first_member(opts.lzop_first_member))
            }
            Format::Bzip2 => Box::new(bzip2::Splitter::new(input)),
            Format::Xz => Box::new(
                xz::Splitter::new(input)
                    .with_memory(opts.memory)
                    .single_stream(opts.single_stream)
                    .ignore_check(opts.ignore_check),
            ),
            Format::Lzma => Box::new(
                lzma::Splitter::new(input)
                    .with_memory(opts.memory)
                    .single_stream(opts.single_stream),
            ),
        }
    }

    /// A worker-side unit decoder.
    pub fn unit_decoder(self) -> Box<dyn UnitDecoder> {
        self.unit_decoder_with(&DecodeOptions::default())
    }

    /// A worker-side unit decoder, with what `opts` gives it (zstd's
    /// dictionary).
    pub fn unit_decoder_with(self, opts: &DecodeOptions) -> Box<dyn UnitDecoder> {
        match self {
            Format::Gzip => Box::new(gzip::Decoder::default()),
            Format::Zstd => Box::new(zstd::Decoder::with_dictionary(opts.zstd_dictionary.clone())),
            Format::Lz4 => Box::new(lz4::Decoder),
            Format::Snappy => Box::new(snappy::Decoder::default()),
            Format::Lzop => Box::new(lzop::Decoder::default()),
            Format::Bzip2 => Box::new(bzip2::Decoder::default()),
            Format::Xz => Box::new(xz::Decoder),
            Format::Lzma => Box::new(lzma::Decoder),
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Format {
    type Err = CodecError;
    fn from_str(s: &str) -> Result<Self> {
        let s = s.to_ascii_lowercase();
        let alias = match s.as_str() {
            "gz" => "gzip",
            "zst" => "zstd",
            "bz2" => "bzip2",
            "lzo" => "lzop",
            "sz" => "snappy",
            "alone" => "lzma",
            other => other,
        };
        Format::EVERY
            .into_iter()
            .find(|f| f.name() == alias)
            .ok_or_else(|| {
                CodecError::Invalid(format!(
                    "unknown format {s:?} (expected gzip, zstd, lz4, snappy, lzop, bzip2, xz or lzma)"
                ))
            })
    }
}

/// What the framer needs to know of an encoded block.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockMeta {
    /// Uncompressed bytes in the block.
    pub raw_len: u64,
    /// Encoded bytes, as the format's trailer counts them.
    pub packed_len: u64,
    /// A format-defined check value (zstd: XXH64 low bits; xz: unpadded size).
    pub check: u64,
}

/// Turns one input block into self-contained bytes of the format.
pub trait BlockEncoder: Send {
    /// Encode `src`, appending to `out`.
    fn encode(&mut self, src: &[u8], out: &mut Vec<u8>) -> Result<BlockMeta>;
}

/// Stream header and trailer, on the writing side, in block order.
pub trait Framer: Send {
    /// The input's name and modification time, for a format whose header
    /// keeps them (gzip, lzop): given before [`Framer::header`], as gzip
    /// and lzop keep them unless `-n`. Others ignore it.
    fn origin(&mut self, _origin: &Origin) {}
    /// Bytes before the first block.
    fn header(&mut self, out: &mut Vec<u8>);
    /// Note a block just written.
    fn block(&mut self, meta: &BlockMeta);
    /// Bytes after the last block.
    fn trailer(&mut self, out: &mut Vec<u8>) -> Result<()>;
}

/// What a start or end piece of a stream says (gzip's start and end
/// members, zstd's start frame and seek table): the reader checks that
/// they pair up ([`Marks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mark {
    /// A start piece: the stream's end piece must follow its data.
    Start,
    /// An end piece, with the bytes the stream's data decodes to.
    End(u64),
}

/// How a format's reader names its start and end pieces.
#[derive(Clone, Copy)]
pub(crate) struct MarkNames {
    pub(crate) format: &'static str,
    pub(crate) start: &'static str,
    pub(crate) end: &'static str,
    pub(crate) pieces: &'static str,
    /// An end piece with no start piece before it is a stream of an
    /// earlier layout or another writer (zstd's seek table), not damage.
    pub(crate) end_alone_ok: bool,
}

/// The start and end pieces a reader has met: a stream that began with
/// a start piece must end with its end piece, which must give the length
/// the stream's data decoded to. Without it, a file cut where one piece
/// ends (a killed writer) would read as whole, as every prefix of a
/// multi-member gzip or multi-frame zstd file does.
pub(crate) struct Marks {
    names: MarkNames,
    /// The open stream's start piece: its offset, and the output's length
    /// there.
    open: Option<(u64, u64)>,
    /// Bytes of output so far (told by [`Marks::decoded`]).
    out: u64,
}

impl Marks {
    pub(crate) fn new(names: MarkNames) -> Self {
        Marks {
            names,
            open: None,
            out: 0,
        }
    }

    /// The pieces read since the last call decode to `n` more bytes.
    pub(crate) fn decoded(&mut self, n: u64) {
        self.out += n;
    }

    /// A start or end piece at `off`.
    pub(crate) fn see(&mut self, off: u64, mark: Mark) -> Result<()> {
        let (n, out) = (self.names, self.out);
        let why = match (mark, self.open) {
            (Mark::Start, None) => {
                self.open = Some((off, out));
                return Ok(());
            }
            (Mark::End(total), Some((_, from))) if out - from == total => {
                self.open = None;
                return Ok(());
            }
            (Mark::End(_), None) if n.end_alone_ok => return Ok(()),
            (Mark::Start, Some((start, _))) => format!(
                "a new stream starts before the one started at offset {start} ended: its {} \
                 is missing (cut short, then appended to?)",
                n.end
            ),
            (Mark::End(total), Some((start, from))) => format!(
                "the {} says the stream started at offset {start} holds {total} bytes, its \
                 {} hold {}",
                n.end,
                n.pieces,
                out - from
            ),
            (Mark::End(_), None) => format!("the {} has no {} before it", n.end, n.start),
        };
        Err(CodecError::corrupt(n.format, off, why))
    }

    /// `e`, an error met where the next piece was expected, as the reader
    /// reports it: bytes that are no piece inside an open stream (a cut
    /// stream followed by other data, a piece's damaged magic) are no
    /// "trailing garbage after the end", which gzip only warns of, but a
    /// stream without its end.
    pub(crate) fn cut(&self, e: CodecError) -> CodecError {
        match e {
            CodecError::TrailingGarbage { offset, .. } => match self.ended(offset) {
                Err(cut) => cut,
                Ok(()) => e,
            },
            e => e,
        }
    }

    /// The input ends at `off`: the open stream, if any, was cut short.
    pub(crate) fn ended(&self, off: u64) -> Result<()> {
        match self.open {
            Some((start, _)) => Err(CodecError::corrupt(
                self.names.format,
                off,
                format!(
                    "the stream started at offset {start} ends without its {}: truncated (a \
                     writer stopped?) or damaged",
                    self.names.end
                ),
            )),
            None => Ok(()),
        }
    }
}

/// Framing for formats that need none (bzip2 streams).
struct NoFraming;

impl Framer for NoFraming {
    fn header(&mut self, _out: &mut Vec<u8>) {}
    fn block(&mut self, _meta: &BlockMeta) {}
    fn trailer(&mut self, _out: &mut Vec<u8>) -> Result<()> {
        Ok(())
    }
}

/// How a unit's bytes are to be treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnitKind {
    /// Already decoded by the splitter: pass through.
    #[default]
    Plain,
    /// Compressed; the tag is format-defined (flags from a stream header).
    Packed(u32),
}

/// A whole-content check that spans units (the lz4 content checksum): the
/// writing side hashes the decoded bytes in order and compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ContentCheck {
    /// Nothing to do.
    #[default]
    None,
    /// Start a new XXH32 over this unit's output (a new frame begins).
    StartXxh32,
    /// Start (if not started) and hash this unit's output; then the hash of
    /// everything since the start must equal the value.
    EndXxh32(u32),
    /// Hash this unit's output into the running hash.
    Continue,
}

/// Limits a decoder applies to what a stream may ask of it, and how it may
/// go about it.
#[derive(Debug, Clone)]
pub struct DecodeOptions {
    /// Largest zstd window, as a power of two, a frame decoded as a stream
    /// may use (`zstd -d --long=N`; zstd's default is 27, 128 MiB). A
    /// bigger window is refused: a few header bytes must not make cairn
    /// reserve gigabytes.
    pub zstd_window_log_max: u32,
    /// Threads a splitter may use for a stream it cannot cut (one gzip
    /// member without sizes, inflated in parallel from a mapped file).
    pub threads: usize,
    /// A gzip file's checkpoint index: members inflated in parallel start
    /// their chunks at its checkpoints, and members not in it are added
    /// once their CRC has been checked (`changed` is then set).
    pub gzip_index: Option<Arc<Mutex<GzipIndex>>>,
    /// Most bytes a decoder's buffers may take (`unpack -M`): a gzip
    /// member inflated in parallel runs on as many workers, with as many
    /// whole-chunk buffers, as fit; an xz block whose LZMA2 dictionary is
    /// bigger is refused (zstd's window has its own limit,
    /// `zstd_window_log_max`, which `-M` sets). `None`: half of the memory this
    /// process may use ([`crate::memlimit::default_budget`]).
    pub memory: Option<u64>,
    /// xz and `.lzma`: decode the first stream only and ignore whatever
    /// follows it (`xz --single-stream`).
    pub single_stream: bool,
    /// xz: do not verify the blocks' checks (`xz --ignore-check`).
    pub ignore_check: bool,
    /// lzop: decode the first member only, ending where a second
    /// begins ([`Members::next_at`]), as `lzop -d` writes the
    /// members of a file of parts to files of their own.
    pub lzop_first_member: bool,
    /// zstd's dictionary (`zstd -d -D DICT`), for frames packed with it.
    pub zstd_dictionary: Option<zstd::Dictionary>,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions {
            zstd_window_log_max: 27,
            threads: 1,
            gzip_index: None,
            memory: None,
            single_stream: false,
            ignore_check: false,
            lzop_first_member: false,
            zstd_dictionary: None,
        }
    }
}

/// One independently decodable piece of a stream.
#[derive(Debug, Default)]
pub struct Unit {
    /// Compressed bytes (or decoded bytes when `kind` is `Plain`), unless
    /// `shared` holds them.
    pub data: Vec<u8>,
    /// The compressed bytes, when they are read in place from a mapped
    /// input file instead of copied into `data`.
    pub shared: Option<crate::input::SharedBytes>,
    /// Offset of the unit in the compressed stream, for error messages.
    pub offset: u64,
    /// Decoded size when the format states it, else 0.
    pub raw_len: usize,
    /// How to decode it.
    pub kind: UnitKind,
    /// Whole-content check to run on the writing side.
    pub content: ContentCheck,
}

impl Unit {
    /// What decoding the unit into `out` gave: `out`, or a plain unit's
    /// shared bytes, which [`UnitDecoder::decode`] does not copy (a whole
    /// chunk's output lent by the parallel gunzip).
    pub fn decoded<'a>(&'a self, out: &'a [u8]) -> &'a [u8] {
        match (&self.kind, &self.shared) {
            (UnitKind::Plain, Some(s)) if out.is_empty() => s.as_slice(),
            _ => out,
        }
    }

    /// The unit's bytes: `shared` when set, else `data`.
    pub fn bytes(&self) -> &[u8] {
        match &self.shared {
            Some(s) => s.as_slice(),
            None => &self.data,
        }
    }

    /// Reset for reuse, keeping the buffer's capacity.
    pub fn clear(&mut self) {
        self.data.clear();
        self.shared = None;
        self.offset = 0;
        self.raw_len = 0;
        self.kind = UnitKind::Plain;
        self.content = ContentCheck::None;
    }
}

/// Cuts a compressed stream into units.
pub trait Splitter: Send {
    /// Fill `unit` (cleared by the caller) with the next unit; `false` at a
    /// clean end of the stream.
    fn next_unit(&mut self, unit: &mut Unit) -> Result<bool>;
    /// Compressed bytes consumed so far.
    fn offset(&self) -> u64;
    /// Cores the splitter's own decoding has used so far, for the units it
    /// hands out decoded ([`UnitKind::Plain`]): one, its own thread, unless
    /// it decodes in parallel itself (a gzip member without sizes).
    fn cores(&self) -> usize {
        1
    }
    /// What was seen of the members of a format whose files join members
    /// as parts of one file (lzop); `None` for the others.
    fn members(&self) -> Option<Members> {
        None
    }
}

/// The members a splitter has seen, where a format's files join several
/// as the parts of one file (lzop's `-d` writes each apart, `-dc` joins
/// them with a warning).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Members {
    /// Members begun so far.
    pub begun: u64,
    /// Where the member not read begins, when the splitter was told to end
    /// before it (`DecodeOptions::lzop_first_member`) and did.
    pub next_at: Option<u64>,
    /// Whether a member read so far that is a part (after the first, or
    /// marked as one) keeps no file name.
    pub nameless_part: bool,
}

/// Decodes units on a worker.
pub trait UnitDecoder: Send {
    /// Decode `unit`, appending the output to `out`. `Plain` units are
    /// moved, or left where they are when their bytes are shared: read the
    /// output with [`Unit::decoded`].
    fn decode(&mut self, unit: &mut Unit, out: &mut Vec<u8>) -> Result<()>;

    /// After [`Self::decode`] failed on `unit` and `out` was put back as
    /// it was: append what the unit decodes to before the damage, where
    /// the format's tool writes that before its error (zstd's blocks
    /// before a damaged one, xz's bytes of a block whose check fails).
    /// The caller writes those bytes, then reports the error. Nothing by
    /// default.
    fn salvage(&mut self, _unit: &Unit, _out: &mut Vec<u8>) {}
}

/// Move a plain unit's bytes to `out` without copying when `out` is empty
/// (shared bytes stay in the unit, see [`Unit::decoded`]).
pub(crate) fn pass_plain(unit: &mut Unit, out: &mut Vec<u8>) {
    match &unit.shared {
        Some(_) if out.is_empty() => {}
        Some(s) => out.extend_from_slice(s.as_slice()),
        None if out.is_empty() => std::mem::swap(&mut unit.data, out),
        None => out.extend_from_slice(&unit.data),
    }
}

/// An error a splitter met after it had filled part of a unit (bytes it
/// decoded itself, or whole lzop or lz4 blocks), held back until that unit is
/// handed out: gzip, xz, zstd, lzop and lz4 write what they decoded before a
/// cut or damage (`gunzip -c` of a truncated dump keeps all it could
/// read), and so does cairn. The error still comes, on the next call, so
/// the run fails as theirs do.
#[derive(Debug, Default)]
pub(crate) struct Deferred(Option<CodecError>);

impl Deferred {
    /// The error held back by the call before, if any.
    pub(crate) fn take(&mut self) -> Result<()> {
        self.0.take().map_or(Ok(()), Err)
    }

    /// Hold `e` back: the unit filled before it goes out first.
    pub(crate) fn later(&mut self, e: CodecError) {
        self.0 = Some(e);
    }

    /// The outcome of filling the plain `unit`, whose data holds only
    /// decoded bytes even on failure: an error after some were decoded is
    /// held back and the unit handed out.
    pub(crate) fn hold(&mut self, step: Result<()>, unit: &Unit) -> Result<()> {
        match step {
            Err(e) if unit.kind == UnitKind::Plain && !unit.bytes().is_empty() => {
                self.later(e);
                Ok(())
            }
            other => other,
        }
    }
}

/// Shift the offsets of errors raised inside a unit to stream offsets.
pub(crate) fn at_offset(e: CodecError, base: u64) -> CodecError {
    map_offset(e, |offset| base + offset)
}

/// Apply `f` to the offset of a `Corrupt`, `Truncated` or
/// `TrailingGarbage` error.
pub(crate) fn map_offset(e: CodecError, f: impl FnOnce(u64) -> u64) -> CodecError {
    match e {
        CodecError::Corrupt {
            format,
            offset,
            reason,
        } => CodecError::Corrupt {
            format,
            offset: f(offset),
            reason,
        },
        CodecError::Truncated { format, offset } => CodecError::Truncated {
            format,
            offset: f(offset),
        },
        CodecError::TrailingGarbage { format, offset } => CodecError::TrailingGarbage {
            format,
            offset: f(offset),
        },
        other => other,
    }
}

/// Like [`at_offset`], and name the container `format` rather than the
/// inner codec (`gzip` for a deflate error, `lzop` for an lzo one), with the
/// codec kept in the reason.
pub(crate) fn in_stream(e: CodecError, format: &'static str, base: u64) -> CodecError {
    match at_offset(e, base) {
        CodecError::Corrupt {
            format: inner,
            offset,
            reason,
        } if inner != format => CodecError::Corrupt {
            format,
            offset,
            reason: format!("{inner}: {reason}"),
        },
        CodecError::Truncated { offset, .. } => CodecError::Truncated { format, offset },
        other => other,
    }
}

/// Little-endian u32 at `at` (the caller has checked the length).
/// Read from `r` until `b` holds `n` bytes, short only at the end of the
/// input; `at` is where `b` begins in the stream, for the error.
pub(crate) fn read_up_to<R: std::io::Read>(
    r: &mut R,
    b: &mut Vec<u8>,
    n: usize,
    at: u64,
) -> Result<()> {
    let have = b.len();
    b.resize(n.max(have), 0);
    let mut got = have;
    while got < n {
        match r.read(&mut b[got..]) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(CodecError::Io {
                    offset: at + got as u64,
                    source,
                })
            }
        }
    }
    b.truncate(got);
    Ok(())
}

pub(crate) fn le32(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

/// Big-endian u32 at `at` (the caller has checked the length).
pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_be_bytes(w)
}

/// Encode everything in `data` with `format` in one thread (tests, fuzzing
/// and small inputs): header, blocks of `block_size`, trailer.
pub fn encode_all(format: Format, level: i32, block_size: usize, data: &[u8]) -> Result<Vec<u8>> {
    encode_all_with(format, level, block_size, &EncodeOptions::default(), data)
}

/// As [`encode_all`], with what `opts` asks.
pub fn encode_all_with(
    format: Format,
    level: i32,
    block_size: usize,
    opts: &EncodeOptions,
    data: &[u8],
) -> Result<Vec<u8>> {
    let block_size = block_size.max(1);
    let mut enc = format.encoder_with(level, block_size, opts)?;
    let mut framer = format.framer(level, opts);
    let mut out = Vec::new();
    framer.header(&mut out);
    let mut chunks: Vec<&[u8]> = data.chunks(block_size).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    for chunk in chunks {
        let meta = enc.encode(chunk, &mut out)?;
        framer.block(&meta);
    }
    framer.trailer(&mut out)?;
    Ok(out)
}

/// Decode a whole stream in one thread (tests, fuzzing, small inputs).
pub fn decode_all(data: &[u8]) -> Result<Vec<u8>> {
    let format = Format::detect(data).ok_or(CodecError::UnknownFormat)?;
    decode_as(format, data, usize::MAX)
}

/// Decode `data` as `format` in one thread, whatever its first bytes say,
/// failing once the output would pass `limit` bytes (fuzzing feeds
/// decompression bombs; a stream decoder must not be asked to hold them).
pub fn decode_as(format: Format, data: &[u8], limit: usize) -> Result<Vec<u8>> {
    let input = Input::new(Box::new(std::io::Cursor::new(data.to_vec())));
    decode_input(format, input, limit)
}

/// Decode `input` as `format` in one thread, as [`decode_as`] does.
pub fn decode_input(format: Format, input: Input, limit: usize) -> Result<Vec<u8>> {
    // The decoders' memory held to the output allowed, and to 1 GiB: an
    // LZMA dictionary or a buffer bigger than all the output may reach is
    // never needed, and a header may ask for 4 GiB (found by fuzzing
    // .lzma: liblzma allocates the whole dictionary first).
    let opts = DecodeOptions {
        memory: Some((limit as u64).min(1 << 30)),
        ..DecodeOptions::default()
    };
    let mut splitter = format.splitter_with(input, &opts);
    let mut dec = format.unit_decoder();
    let mut checker = ContentChecker::default();
    let mut out = Vec::new();
    let mut unit = Unit::default();
    let mut piece = Vec::new();
    loop {
        unit.clear();
        if !splitter.next_unit(&mut unit)? {
            break;
        }
        piece.clear();
        dec.decode(&mut unit, &mut piece)?;
        let piece = unit.decoded(&piece);
        checker.feed(format, unit.offset, unit.content, piece)?;
        if out.len() + piece.len() > limit {
            return Err(CodecError::TooLarge {
                format: format.name(),
                what: "decoded output",
                offset: unit.offset,
                size: (out.len() + piece.len()) as u64,
                limit: limit as u64,
            });
        }
        out.extend_from_slice(piece);
    }
    Ok(out)
}

/// Runs [`ContentCheck`]s on the writing side, in stream order.
#[derive(Default)]
pub struct ContentChecker {
    xxh32: Option<crate::lz4_ffi::Xxh32>,
}

impl ContentChecker {
    fn new_hash(format: Format, offset: u64) -> Result<crate::lz4_ffi::Xxh32> {
        crate::lz4_ffi::Xxh32::new().ok_or_else(|| {
            CodecError::corrupt(format.name(), offset, "out of memory for the content hash")
        })
    }

    /// Feed one unit's decoded output with its check instruction.
    pub fn feed(
        &mut self,
        format: Format,
        offset: u64,
        check: ContentCheck,
        data: &[u8],
    ) -> Result<()> {
        match check {
            ContentCheck::None => {}
            ContentCheck::StartXxh32 => {
                let mut h = Self::new_hash(format, offset)?;
                h.update(data);
                self.xxh32 = Some(h);
            }
            ContentCheck::Continue => {
                if let Some(h) = self.xxh32.as_mut() {
                    h.update(data);
                }
            }
            ContentCheck::EndXxh32(want) => {
                let mut h = match self.xxh32.take() {
                    Some(h) => h,
                    None => Self::new_hash(format, offset)?,
                };
                h.update(data);
                let got = h.digest();
                if got != want {
                    return Err(CodecError::corrupt(
                        format.name(),
                        offset,
                        format!("content checksum mismatch: stored {want:08x}, computed {got:08x}"),
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_window_is_cut_to_the_block_and_other_formats_refuse_it() {
        assert_eq!(Format::window_log_for(1), 10);
        assert_eq!(Format::window_log_for(4 << 20), 22);
        assert_eq!(Format::window_log_for((4 << 20) + 1), 23);
        let long = EncodeOptions {
            long: Some(27),
            ..EncodeOptions::default()
        };
        assert!(Format::Zstd.encoder_with(3, 1 << 20, &long).is_ok());
        for f in [Format::Gzip, Format::Xz, Format::Lz4] {
            let e = f
                .encoder_with(3, 1 << 20, &long)
                .err()
                .map(|e| e.to_string());
            assert!(e.is_some_and(|e| e.contains("has none")), "{f}");
        }
    }

    pub(crate) fn sample(n: usize, seed: u32) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                match i % 11 {
                    0..=3 => (x >> 24) as u8,
                    4..=5 => 0,
                    _ => b"the quick brown fox "[i % 20],
                }
            })
            .collect()
    }

    /// Formats whose encoder and splitter are implemented in this module's
    /// siblings; every one must round-trip.
    fn formats() -> Vec<Format> {
        Format::ALL.to_vec()
    }

    #[test]
    fn round_trip_edge_sizes() {
        let block = 1000;
        for format in formats() {
            for n in [0, 1, block - 1, block, block + 1, 7 * block + 3] {
                let data = sample(n, n as u32 + 7);
                let packed = encode_all(format, format.default_level(), block, &data)
                    .unwrap_or_else(|e| panic!("{format} n={n}: {e}"));
                assert_eq!(Format::detect(&packed), Some(format), "{format} magic");
                let back = decode_all(&packed).unwrap_or_else(|e| panic!("{format} n={n}: {e}"));
                assert_eq!(back, data, "{format} n={n}");
            }
        }
    }

    #[test]
    fn truncation_is_an_error_everywhere() {
        for format in formats() {
            let data = sample(5000, 3);
            let packed = encode_all(format, format.default_level(), 1500, &data).unwrap();
            for cut in 1..packed.len() {
                if let Ok(back) = decode_all(&packed[..cut]) {
                    // A cut at a member/stream boundary is a valid shorter
                    // stream; it must then decode to a prefix.
                    assert!(
                        data.starts_with(&back),
                        "{format}: cut at {cut} decoded to something else"
                    );
                    assert!(
                        matches!(
                            format,
                            Format::Gzip | Format::Bzip2 | Format::Zstd | Format::Xz
                        ) || back.len() < data.len(),
                        "{format}: cut at {cut} of {} accepted",
                        packed.len()
                    );
                }
            }
        }
    }

    #[test]
    fn flipped_bytes_never_decode_to_wrong_data() {
        for format in formats() {
            let data = sample(20_000, 5);
            let packed = encode_all(format, format.default_level(), 6000, &data).unwrap();
            for i in 0..packed.len() {
                let mut bad = packed.clone();
                bad[i] ^= 0x10;
                if let Ok(back) = decode_all(&bad) {
                    assert_eq!(back, data, "{format}: flip at {i} gave wrong data");
                }
            }
        }
    }

    #[test]
    fn trailing_garbage_is_rejected() {
        for format in formats() {
            let data = sample(3000, 9);
            let mut packed = encode_all(format, format.default_level(), 1000, &data).unwrap();
            packed.extend_from_slice(b"garbage!");
            assert!(
                decode_all(&packed).is_err(),
                "{format} accepted trailing garbage"
            );
        }
    }

    #[test]
    fn garbage_shorter_than_a_header_is_called_garbage_not_a_cut() {
        let data = sample(3000, 9);
        for format in formats() {
            let packed = encode_all(format, format.default_level(), 1000, &data).unwrap();
            for junk in [&b"j"[..], b"junk\n", b"garbage!"] {
                let bad = [&packed[..], junk].concat();
                // Garbage (or, in snappy, a reserved chunk), never a cut.
                let err = decode_all(&bad).err();
                assert!(
                    err.as_ref()
                        .is_some_and(|e| !matches!(e, CodecError::Truncated { .. })),
                    "{format} {junk:?}: {err:?}"
                );
            }
        }
    }

    #[test]
    fn concatenated_streams_decode_to_the_concatenation() {
        for format in formats() {
            if format == Format::Snappy {
                // Concatenated snappy streams are valid too (repeated
                // stream identifiers), covered by the same rule.
            }
            let a = sample(2500, 1);
            let b = sample(1700, 2);
            let mut packed = encode_all(format, format.default_level(), 1000, &a).unwrap();
            packed.extend(encode_all(format, format.default_level(), 1000, &b).unwrap());
            let back = decode_all(&packed).unwrap_or_else(|e| panic!("{format}: {e}"));
            assert_eq!(back, [a, b].concat(), "{format}");
        }
    }

    #[test]
    fn detection_and_names() {
        assert_eq!(Format::detect(b"nothing"), None);
        assert_eq!("gz".parse::<Format>().unwrap(), Format::Gzip);
        assert!("rar".parse::<Format>().is_err());
        for f in Format::ALL {
            assert_eq!(f.name().parse::<Format>().unwrap(), f);
        }
    }
}
