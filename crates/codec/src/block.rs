//! Block codecs: pure functions over buffers with a reusable context.
//!
//! A [`BlockCodec`] compresses one buffer into another and back. The context
//! (hash tables, window, work memory) lives in the codec value, so a worker
//! that keeps its codec never reallocates per block; output is appended to a
//! caller-owned `Vec` whose capacity is reused too.

use crate::buf::{check_len, compress_into, decompress_into};
use crate::error::{CodecError, Result};
use std::fmt;
use std::str::FromStr;

/// The block codecs cairn knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CodecKind {
    /// Stored as is.
    None,
    /// LZ4 block format.
    Lz4,
    /// Snappy raw format.
    Snappy,
    /// LZO1X.
    Lzo,
    /// Zstandard frame.
    Zstd,
    /// Raw DEFLATE (libdeflate).
    Deflate,
    /// A bzip2 stream.
    Bzip2,
    /// Raw LZMA2.
    Xz,
}

impl CodecKind {
    /// Every codec, in a stable order.
    pub const ALL: [CodecKind; 8] = [
        CodecKind::None,
        CodecKind::Lz4,
        CodecKind::Snappy,
        CodecKind::Lzo,
        CodecKind::Zstd,
        CodecKind::Deflate,
        CodecKind::Bzip2,
        CodecKind::Xz,
    ];

    /// The codec's name as written on the command line.
    pub fn name(self) -> &'static str {
        match self {
            CodecKind::None => "none",
            CodecKind::Lz4 => "lz4",
            CodecKind::Snappy => "snappy",
            CodecKind::Lzo => "lzo",
            CodecKind::Zstd => "zstd",
            CodecKind::Deflate => "deflate",
            CodecKind::Bzip2 => "bzip2",
            CodecKind::Xz => "xz",
        }
    }

    /// Accepted levels, inclusive.
    pub fn level_range(self) -> (i32, i32) {
        match self {
            CodecKind::None | CodecKind::Snappy => (0, 1),
            // 0 and 1 the fast coder, 3-12 LZ4 HC (as `lz4 -3`..`-12`).
            CodecKind::Lz4 => (0, 12),
            CodecKind::Lzo => (1, 9),
            CodecKind::Zstd => (-50, 22),
            CodecKind::Deflate => (0, 12),
            CodecKind::Bzip2 => (1, 9),
            CodecKind::Xz => (0, 9),
        }
    }

    /// The level used when none is given.
    pub fn default_level(self) -> i32 {
        match self {
            CodecKind::None | CodecKind::Lz4 | CodecKind::Snappy | CodecKind::Lzo => 1,
            CodecKind::Zstd => 3,
            CodecKind::Deflate => 6,
            CodecKind::Bzip2 => 9,
            CodecKind::Xz => 6,
        }
    }
}

impl fmt::Display for CodecKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CodecKind {
    type Err = CodecError;
    fn from_str(s: &str) -> Result<Self> {
        CodecKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| CodecError::Invalid(format!("unknown codec {s:?}")))
    }
}

/// A codec with its level, checked against the codec's range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodecSpec {
    kind: CodecKind,
    level: i32,
}

impl CodecSpec {
    /// A codec at `level`, or an error naming the accepted range.
    pub fn new(kind: CodecKind, level: i32) -> Result<Self> {
        let (lo, hi) = kind.level_range();
        if level < lo || level > hi {
            return Err(CodecError::Invalid(format!(
                "{kind}: level {level} is out of range {lo}..={hi}"
            )));
        }
        Ok(CodecSpec { kind, level })
    }

    /// The codec at its default level.
    pub fn default_for(kind: CodecKind) -> Self {
        CodecSpec {
            kind,
            level: kind.default_level(),
        }
    }

    /// Which codec.
    pub fn kind(self) -> CodecKind {
        self.kind
    }

    /// Which level.
    pub fn level(self) -> i32 {
        self.level
    }

    /// A fresh codec context.
    pub fn build(self) -> Box<dyn BlockCodec> {
        match self.kind {
            CodecKind::None => Box::new(NoneCodec),
            CodecKind::Lz4 => Box::new(Lz4Codec::with_level(self.level.max(1))),
            CodecKind::Snappy => Box::new(SnappyCodec::default()),
            CodecKind::Lzo => Box::new(LzoCodec::new(self.level)),
            CodecKind::Zstd => Box::new(ZstdCodec::for_blocks(self.level)),
            CodecKind::Deflate => Box::new(DeflateCodec::new(self.level)),
            CodecKind::Bzip2 => Box::new(Bzip2Codec {
                enc: crate::bz2::encode::Encoder::new(self.level),
                decoder: Default::default(),
            }),
            CodecKind::Xz => Box::new(XzCodec { level: self.level }),
        }
    }
}

impl fmt::Display for CodecSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind, self.level)
    }
}

impl FromStr for CodecSpec {
    type Err = CodecError;
    /// `zstd`, `zstd:19`, `zstd:-5`.
    fn from_str(s: &str) -> Result<Self> {
        match s.split_once(':') {
            None => Ok(CodecSpec::default_for(s.parse()?)),
            Some((name, level)) => {
                let kind: CodecKind = name.parse()?;
                let level = level
                    .parse()
                    .map_err(|_| CodecError::Invalid(format!("{kind}: bad level {level:?}")))?;
                CodecSpec::new(kind, level)
            }
        }
    }
}

/// One-shot compression of whole buffers with a reusable context.
///
/// A block carries no checksum of its own: its user checks what it
/// decodes (a repository record has a CRC-32C over its stored bytes and a
/// BLAKE3 id for every chunk, hashed before any chunk is used). So zstd
/// blocks are frames without XXH64, and one found in an older block is not
/// computed (4.6 % of a restore's CPU, profiled).
pub trait BlockCodec: Send {
    /// Which codec this is.
    fn kind(&self) -> CodecKind;
    /// Compress `src`, appending to `dst`.
    fn compress(&mut self, src: &[u8], dst: &mut Vec<u8>) -> Result<()>;
    /// Decompress `src`, which must expand to exactly `raw_len` bytes,
    /// appending them to `dst`.
    fn decompress(&mut self, src: &[u8], dst: &mut Vec<u8>, raw_len: usize) -> Result<()>;
    /// Decompress `src`, which must expand to exactly `dst.len()` bytes,
    /// into `dst` (memory the caller made, such as a buffer to be handed
    /// to a pipe). The codecs a repository is written with by default
    /// decode in place; the others decode aside and copy.
    fn decompress_into(&mut self, src: &[u8], dst: &mut [u8]) -> Result<()> {
        let mut out = Vec::with_capacity(dst.len());
        self.decompress(src, &mut out, dst.len())?;
        check_len(self.kind().name(), out.len(), dst.len())?;
        dst.copy_from_slice(&out);
        Ok(())
    }
}

struct NoneCodec;

impl BlockCodec for NoneCodec {
    fn kind(&self) -> CodecKind {
        CodecKind::None
    }
    fn compress(&mut self, src: &[u8], dst: &mut Vec<u8>) -> Result<()> {
        dst.extend_from_slice(src);
        Ok(())
    }
    fn decompress(&mut self, src: &[u8], dst: &mut Vec<u8>, raw_len: usize) -> Result<()> {
        check_len("none", src.len(), raw_len)?;
        dst.extend_from_slice(src);
        Ok(())
    }
    fn decompress_into(&mut self, src: &[u8], dst: &mut [u8]) -> Result<()> {
        check_len("none", src.len(), dst.len())?;
        dst.copy_from_slice(src);
        Ok(())
    }
}

/// LZ4 block format (liblz4; no dictionary).
#[derive(Default)]
pub(crate) struct Lz4Codec {
    state: crate::lz4_ffi::Compressor,
}

impl Lz4Codec {
    /// A codec compressing at `level` (1-2 fast, 3-12 LZ4 HC).
    pub(crate) fn with_level(level: i32) -> Self {
        Lz4Codec {
            state: crate::lz4_ffi::Compressor::with_level(level),
        }
    }

    /// A codec at `level` whose LZ4 HC favors decompression speed (`lz4
    /// --favor-decSpeed`; a change from level 10 on).
    pub(crate) fn favoring_decompression_speed(level: i32) -> Self {
        Lz4Codec {
            state: crate::lz4_ffi::Compressor::favoring_decompression_speed(level),
        }
    }
}

impl BlockCodec for Lz4Codec {
    fn kind(&self) -> CodecKind {
        CodecKind::Lz4
    }
    fn compress(&mut self, src: &[u8], dst: &mut Vec<u8>) -> Result<()> {
        self.state
            .compress_append(src, dst)
            .map(|_| ())
            .ok_or_else(|| CodecError::Compress {
                codec: "lz4",
                reason: format!("input of {} bytes is too large", src.len()),
            })
    }
    fn decompress(&mut self, src: &[u8], dst: &mut Vec<u8>, raw_len: usize) -> Result<()> {
        let n = crate::lz4_ffi::decompress_append(src, dst, raw_len, &[])
            .ok_or_else(|| CodecError::corrupt("lz4", 0, "invalid LZ4 block"))?;
        check_len("lz4", n, raw_len)
    }
    fn decompress_into(&mut self, src: &[u8], dst: &mut [u8]) -> Result<()> {
        let n = crate::lz4_ffi::decompress_into(src, dst)
            .ok_or_else(|| CodecError::corrupt("lz4", 0, "invalid LZ4 block"))?;
        check_len("lz4", n, dst.len())
    }
}

/// Snappy raw format with reused encoder and decoder state.
pub(crate) struct SnappyCodec {
    enc: snap::raw::Encoder,
    dec: snap::raw::Decoder,
}

impl Default for SnappyCodec {
    fn default() -> Self {
        SnappyCodec {
            enc: snap::raw::Encoder::new(),
            dec: snap::raw::Decoder::new(),
        }
    }
}

impl BlockCodec for SnappyCodec {
    fn kind(&self) -> CodecKind {
        CodecKind::Snappy
    }
    fn compress(&mut self, src: &[u8], dst: &mut Vec<u8>) -> Result<()> {
        let bound = snap::raw::max_compress_len(src.len());
        if bound == 0 && !src.is_empty() {
            return Err(CodecError::Compress {
                codec: "snappy",
                reason: format!("input of {} bytes is too large", src.len()),
            });
        }
        let enc = &mut self.enc;
        compress_into("snappy", dst, bound, |tail| enc.compress(src, tail))
    }
    fn decompress(&mut self, src: &[u8], dst: &mut Vec<u8>, raw_len: usize) -> Result<()> {
        let declared = snap::raw::decompress_len(src)
            .map_err(|e| CodecError::corrupt("snappy", 0, e.to_string()))?;
        check_len("snappy", declared, raw_len)?;
        let dec = &mut self.dec;
        decompress_into("snappy", dst, raw_len, |tail| dec.decompress(src, tail))
    }
}

/// LZO1X through the `lzo1x` crate, a safe Rust port of liblzo2's LZO1X
/// compressors and its checked decoder. It replaced the C library
/// (lzo-sys), whose build needs cmake: a fresh machine with only a Rust
/// toolchain and a C compiler could not build cairn. Its streams are the
/// reference's: lzop and liblzo2 read them, and it reads theirs.
pub(crate) struct LzoCodec {
    level: lzo1x::CompressLevel,
}

impl LzoCodec {
    /// An encoder at lzop's `level`: 1-6 are LZO1X-1 and 7-9 LZO1X-999
    /// at liblzo2's levels 7-9 (the port numbers LZO1X-1 with dictionary
    /// sizes 2^11..2^15 as its levels 1-4, and LZO1X-999's nine levels as
    /// 5-13). lzop -1 means LZO1X-1(15); the port's 2^15 dictionary ran at
    /// half the speed of its 2^14 one and of liblzo2 on a 117 MB shared
    /// library (0.47 s against 0.27 s and lzop's 0.23 s) while the 2^14
    /// one packed it smaller than lzop -1 did (50.31 MB against 50.65 MB).
    pub(crate) fn new(level: i32) -> Self {
        let port_level = match level {
            ..=6 => 3,
            7 => 11,
            8 => 12,
            _ => 13,
        };
        LzoCodec {
            level: lzo1x::CompressLevel::new(port_level),
        }
    }
}

impl BlockCodec for LzoCodec {
    fn kind(&self) -> CodecKind {
        CodecKind::Lzo
    }
    fn compress(&mut self, src: &[u8], dst: &mut Vec<u8>) -> Result<()> {
        // lzop -7..-9 also run liblzo2's optimizer over LZO1X-999 output
        // (faster decoding, same size); the port's optimizer indexes out of
        // bounds on incompressible blocks, so it is not used.
        let packed = lzo1x::compress(src, self.level);
        dst.extend_from_slice(&packed);
        Ok(())
    }
    fn decompress(&mut self, src: &[u8], dst: &mut Vec<u8>, raw_len: usize) -> Result<()> {
        let start = dst.len();
        dst.resize(start + raw_len, 0);
        match lzo1x::decompress(src, &mut dst[start..]) {
            Ok(()) => Ok(()),
            Err(e) => {
                dst.truncate(start);
                Err(CodecError::corrupt("lzo", 0, format!("lzo1x decoder: {e}")))
            }
        }
    }
}

/// Run `write` on the spare capacity after `dst`'s bytes, with room for
/// `room` more: the zstd crate writes where a cursor stands, so output is
/// appended in place instead of through a scratch buffer and a copy.
fn append_to(
    dst: &mut Vec<u8>,
    room: usize,
    write: impl FnOnce(&mut std::io::Cursor<&mut Vec<u8>>) -> std::io::Result<usize>,
) -> std::io::Result<usize> {
    dst.reserve(room);
    let at = dst.len() as u64;
    let mut cursor = std::io::Cursor::new(dst);
    cursor.set_position(at);
    write(&mut cursor)
}

/// Zstandard frames with a reused compression and decompression context.
pub(crate) struct ZstdCodec {
    level: i32,
    /// Frames carry XXH64 of their content, checked when decoded: the
    /// `.zst` files of `cairn pack`, as zstd writes them. Not for blocks
    /// (see [`BlockCodec`]).
    checksum: bool,
    /// Long-distance matching with a window of 2^N bytes (`zstd --long`).
    long: Option<u32>,
    cctx: Option<zstd::bulk::Compressor<'static>>,
    dctx: Option<zstd::bulk::Decompressor<'static>>,
    /// Frames packed and decoded with a dictionary (`zstd -D`).
    dictionary: Option<crate::format::zstd::Dictionary>,
    /// Packed frames name the dictionary's ID (not with `--no-dictID`).
    dict_id: bool,
    /// zstd's advanced parameters and frame options (`--zstd=`...).
    tuning: crate::format::zstd::Tuning,
}

impl ZstdCodec {
    /// Checksummed frames, for a `.zst` file.
    pub(crate) fn new(level: i32) -> Self {
        ZstdCodec {
            level,
            checksum: true,
            long: None,
            cctx: None,
            dctx: None,
            dictionary: None,
            dict_id: true,
            tuning: crate::format::zstd::Tuning::default(),
        }
    }

    /// Pack frames as `tuning` asks (a context made before is made again).
    pub(crate) fn set_tuning(&mut self, tuning: crate::format::zstd::Tuning) {
        self.tuning = tuning;
        self.cctx = None;
    }

    /// Pack and decode frames with `dictionary`, naming its ID in the
    /// frames packed unless `dict_id` is false (a context made before is
    /// made again).
    pub(crate) fn set_dictionary(
        &mut self,
        dictionary: Option<crate::format::zstd::Dictionary>,
        dict_id: bool,
    ) {
        self.dictionary = dictionary;
        self.dict_id = dict_id;
        self.cctx = None;
        self.dctx = None;
    }

    /// Frames for a `.zst` file: with long-distance matching over a
    /// window of `2^N` bytes if `long` says, as `zstd --long=N` does, and
    /// with a checksum unless `checksum` is false (`zstd --no-check`).
    pub(crate) fn for_files(level: i32, long: Option<u32>, checksum: bool) -> Self {
        ZstdCodec {
            long,
            checksum,
            ..ZstdCodec::new(level)
        }
    }

    /// Whether frames carry a checksum.
    pub(crate) fn checksum(&self) -> bool {
        self.checksum
    }

    /// Frames without a checksum, one ignored where present: blocks, whose
    /// user checks them.
    fn for_blocks(level: i32) -> Self {
        ZstdCodec {
            checksum: false,
            ..ZstdCodec::new(level)
        }
    }

    /// Compress with the frame's content size (unless the tuning says
    /// `--no-content-size`) and checksum (unless
    /// [`ZstdCodec::for_blocks`]) recorded.
    pub(crate) fn compress_frame(&mut self, src: &[u8], dst: &mut Vec<u8>) -> Result<()> {
        let err = |e: std::io::Error| CodecError::Compress {
            codec: "zstd",
            reason: e.to_string(),
        };
        if self.cctx.is_none() {
            let dictionary = self.dictionary.as_ref().map_or(&[][..], |d| d.bytes());
            let mut c =
                zstd::bulk::Compressor::with_dictionary(self.level, dictionary).map_err(err)?;
            c.include_checksum(self.checksum).map_err(err)?;
            c.include_dictid(self.dict_id).map_err(err)?;
            self.tuning.apply(&mut c).map_err(err)?;
            // --long's window unless --zstd= set one, as zstd has it.
            if let Some(window_log) = self.long {
                use zstd::zstd_safe::CParameter;
                c.set_parameter(CParameter::EnableLongDistanceMatching(true))
                    .map_err(err)?;
                if !self.tuning.sets_window() {
                    c.set_parameter(CParameter::WindowLog(window_log))
                        .map_err(err)?;
                }
            }
            self.cctx = Some(c);
        }
        let cctx = self.cctx.as_mut().ok_or_else(|| CodecError::Compress {
            codec: "zstd",
            reason: "no context".into(),
        })?;
        let bound = zstd::zstd_safe::compress_bound(src.len());
        append_to(dst, bound, |buf| cctx.compress_to_buffer(src, buf)).map_err(err)?;
        Ok(())
    }

    /// Decompress one frame of known content size.
    pub(crate) fn decompress_frame(
        &mut self,
        src: &[u8],
        dst: &mut Vec<u8>,
        raw_len: usize,
    ) -> Result<()> {
        let dctx = self.dctx()?;
        let corrupt = |e: std::io::Error| CodecError::corrupt("zstd", 0, e.to_string());
        let n =
            append_to(dst, raw_len, |buf| dctx.decompress_to_buffer(src, buf)).map_err(corrupt)?;
        check_len("zstd", n, raw_len)
    }

    /// The decompression context, made on first use.
    fn dctx(&mut self) -> Result<&mut zstd::bulk::Decompressor<'static>> {
        if self.dctx.is_none() {
            let err = |e: std::io::Error| CodecError::corrupt("zstd", 0, e.to_string());
            let dictionary = self.dictionary.as_ref().map_or(&[][..], |d| d.bytes());
            let mut d = zstd::bulk::Decompressor::with_dictionary(dictionary).map_err(err)?;
            if !self.checksum {
                d.set_parameter(zstd::zstd_safe::DParameter::ForceIgnoreChecksum(true))
                    .map_err(err)?;
            }
            self.dctx = Some(d);
        }
        self.dctx
            .as_mut()
            .ok_or_else(|| CodecError::corrupt("zstd", 0, "no context"))
    }
}

impl BlockCodec for ZstdCodec {
    fn kind(&self) -> CodecKind {
        CodecKind::Zstd
    }
    fn compress(&mut self, src: &[u8], dst: &mut Vec<u8>) -> Result<()> {
        self.compress_frame(src, dst)
    }
    fn decompress(&mut self, src: &[u8], dst: &mut Vec<u8>, raw_len: usize) -> Result<()> {
        self.decompress_frame(src, dst, raw_len)
    }
    fn decompress_into(&mut self, src: &[u8], dst: &mut [u8]) -> Result<()> {
        let n = self
            .dctx()?
            .decompress_to_buffer(src, dst)
            .map_err(|e| CodecError::corrupt("zstd", 0, e.to_string()))?;
        check_len("zstd", n, dst.len())
    }
}

/// Raw DEFLATE through libdeflate, the fastest whole-buffer deflate there is.
pub(crate) struct DeflateCodec {
    comp: libdeflater::Compressor,
    decomp: libdeflater::Decompressor,
}

impl DeflateCodec {
    pub(crate) fn new(level: i32) -> Self {
        let level = libdeflater::CompressionLvl::new(level.clamp(0, 12))
            .unwrap_or_else(|_| libdeflater::CompressionLvl::default());
        DeflateCodec {
            comp: libdeflater::Compressor::new(level),
            decomp: libdeflater::Decompressor::new(),
        }
    }
}

impl BlockCodec for DeflateCodec {
    fn kind(&self) -> CodecKind {
        CodecKind::Deflate
    }
    fn compress(&mut self, src: &[u8], dst: &mut Vec<u8>) -> Result<()> {
        let bound = self.comp.deflate_compress_bound(src.len());
        let comp = &mut self.comp;
        compress_into("deflate", dst, bound, |tail| {
            comp.deflate_compress(src, tail)
        })
    }
    fn decompress(&mut self, src: &[u8], dst: &mut Vec<u8>, raw_len: usize) -> Result<()> {
        let decomp = &mut self.decomp;
        decompress_into("deflate", dst, raw_len, |tail| {
            decomp.deflate_decompress(src, tail)
        })
    }
}

/// A whole bzip2 stream per block, by the native encoder and decoder,
/// whose buffers the codec keeps from block to block.
pub(crate) struct Bzip2Codec {
    pub(crate) enc: crate::bz2::encode::Encoder,
    pub(crate) decoder: crate::bz2::decode::StreamDecoder,
}

impl BlockCodec for Bzip2Codec {
    fn kind(&self) -> CodecKind {
        CodecKind::Bzip2
    }
    fn compress(&mut self, src: &[u8], dst: &mut Vec<u8>) -> Result<()> {
        self.enc.compress(src, dst)
    }
    fn decompress(&mut self, src: &[u8], dst: &mut Vec<u8>, raw_len: usize) -> Result<()> {
        let start = dst.len();
        dst.reserve(raw_len);
        self.decoder.decode(src, dst, raw_len)?;
        check_len("bzip2", dst.len() - start, raw_len)
    }
}

/// Compress `src` into one complete bzip2 stream appended to `dst`, with a
/// fresh encoder: a one-off for tests (a worker keeps a
/// [`crate::bz2::encode::Encoder`] instead).
#[cfg(test)]
pub(crate) fn bzip2_compress_stream(level: i32, src: &[u8], dst: &mut Vec<u8>) -> Result<()> {
    crate::bz2::encode::Encoder::new(level).compress(src, dst)
}

/// Raw LZMA2 at an xz preset.
pub(crate) struct XzCodec {
    pub(crate) level: i32,
}

/// A raw LZMA2 encoder of preset `level` (its extreme variant if
/// `extreme`, as `xz -e`) whose dictionary is no larger than `max_dict` (a
/// dictionary bigger than the block buys nothing).
pub(crate) fn lzma2_options(
    level: i32,
    extreme: bool,
    max_dict: usize,
) -> Result<liblzma::stream::LzmaOptions> {
    let mut preset = u32::try_from(level.clamp(0, 9)).unwrap_or(6);
    if extreme {
        preset |= liblzma::stream::PRESET_EXTREME;
    }
    let mut opts =
        liblzma::stream::LzmaOptions::new_preset(preset).map_err(|e| CodecError::Compress {
            codec: "xz",
            reason: e.to_string(),
        })?;
    opts.dict_size(lzma2_block_dict(level, max_dict));
    Ok(opts)
}

/// The dictionary size [`lzma2_options`] picks for `level` and `max_dict`
/// (the xz block header must announce at least this much).
pub(crate) fn lzma2_block_dict(level: i32, max_dict: usize) -> u32 {
    let cap = u32::try_from(max_dict.max(4096)).unwrap_or(u32::MAX);
    lzma2_dict_size(level).min(cap)
}

/// The dictionary size of xz preset `level`.
pub(crate) fn lzma2_dict_size(level: i32) -> u32 {
    const MIB: u32 = 1 << 20;
    match level.clamp(0, 9) {
        0 => 256 << 10,
        1 => MIB,
        2 => 2 * MIB,
        3 | 4 => 4 * MIB,
        5 | 6 => 8 * MIB,
        7 => 16 * MIB,
        8 => 32 * MIB,
        _ => 64 * MIB,
    }
}

/// Run a liblzma raw stream over `src` to completion, appending to `dst`.
/// `limit` caps the output (decoding) so damaged data cannot balloon.
pub(crate) fn lzma_run(
    stream: &mut liblzma::stream::Stream,
    src: &[u8],
    dst: &mut Vec<u8>,
    limit: usize,
    what: &'static str,
) -> Result<()> {
    let start = dst.len();
    loop {
        let consumed = usize::try_from(stream.total_in()).unwrap_or(usize::MAX);
        let rest = src.get(consumed..).unwrap_or(&[]);
        if dst.capacity() == dst.len() {
            dst.reserve(64 << 10);
        }
        let before = dst.len();
        let status = stream
            .process_vec(rest, dst, liblzma::stream::Action::Finish)
            .map_err(|e| CodecError::corrupt(what, stream.total_in(), e.to_string()))?;
        if dst.len() - start > limit {
            return Err(CodecError::corrupt(
                what,
                stream.total_in(),
                format!("data expands beyond {limit} bytes"),
            ));
        }
        match status {
            liblzma::stream::Status::StreamEnd => return Ok(()),
            _ => {
                let now = usize::try_from(stream.total_in()).unwrap_or(usize::MAX);
                if dst.len() == before && now == consumed && now >= src.len() {
                    return Err(CodecError::Truncated {
                        format: what,
                        offset: stream.total_in(),
                    });
                }
            }
        }
    }
}

impl BlockCodec for XzCodec {
    fn kind(&self) -> CodecKind {
        CodecKind::Xz
    }
    fn compress(&mut self, src: &[u8], dst: &mut Vec<u8>) -> Result<()> {
        let opts = lzma2_options(self.level, false, src.len())?;
        let mut filters = liblzma::stream::Filters::new();
        filters.lzma2(&opts);
        let mut enc = liblzma::stream::Stream::new_raw_encoder(&filters).map_err(|e| {
            CodecError::Compress {
                codec: "xz",
                reason: e.to_string(),
            }
        })?;
        dst.reserve(src.len() + src.len() / 64 + 1024);
        lzma_run(&mut enc, src, dst, usize::MAX, "xz")
    }
    fn decompress(&mut self, src: &[u8], dst: &mut Vec<u8>, raw_len: usize) -> Result<()> {
        let opts = lzma2_options(self.level, false, raw_len)?;
        let mut filters = liblzma::stream::Filters::new();
        filters.lzma2(&opts);
        let mut dec = liblzma::stream::Stream::new_raw_decoder(&filters)
            .map_err(|e| CodecError::corrupt("xz", 0, e.to_string()))?;
        let start = dst.len();
        dst.reserve(raw_len);
        lzma_run(&mut dec, src, dst, raw_len, "xz")?;
        check_len("xz", dst.len() - start, raw_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(n: usize) -> Vec<u8> {
        let mut x: u32 = 12345;
        (0..n)
            .map(|i| {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                if i % 7 < 3 {
                    (x >> 24) as u8
                } else {
                    b"cairn stores"[i % 12]
                }
            })
            .collect()
    }

    #[test]
    fn every_codec_round_trips_sizes() {
        for kind in CodecKind::ALL {
            let (lo, hi) = kind.level_range();
            for level in [lo.max(kind.default_level().min(hi)), hi.min(3).max(lo)] {
                let spec = CodecSpec::new(kind, level).unwrap_or(CodecSpec::default_for(kind));
                let mut c = spec.build();
                for n in [0usize, 1, 100, 65536, 300_001] {
                    let src = sample(n);
                    let mut packed = vec![7u8; 3];
                    c.compress(&src, &mut packed).unwrap();
                    assert_eq!(&packed[..3], &[7, 7, 7], "{spec} appends");
                    let mut out = vec![1u8];
                    c.decompress(&packed[3..], &mut out, n).unwrap();
                    assert_eq!(&out[1..], &src[..], "{spec} n={n}");
                    // In place, into exactly the decoded length; a wrong
                    // length is damage, not a short or an overrun copy.
                    let mut into = vec![0u8; n];
                    c.decompress_into(&packed[3..], &mut into).unwrap();
                    assert!(into == src, "{spec} n={n} in place");
                    for wrong in [n + 1, n.saturating_sub(1)] {
                        if wrong != n {
                            let mut into = vec![0u8; wrong];
                            assert!(
                                c.decompress_into(&packed[3..], &mut into).is_err(),
                                "{spec} n={n} into {wrong}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Bit 2 of a zstd frame's header descriptor: the frame ends in XXH64.
    fn has_checksum(frame: &[u8]) -> bool {
        assert_eq!(frame[..4], [0x28, 0xb5, 0x2f, 0xfd], "a zstd frame");
        frame[4] & 4 != 0
    }

    #[test]
    fn zstd_blocks_carry_no_checksum_and_ignore_one_from_before() {
        let src = sample(100_000);
        let mut block = Vec::new();
        let mut c = CodecSpec::default_for(CodecKind::Zstd).build();
        c.compress(&src, &mut block).unwrap();
        assert!(!has_checksum(&block));
        // A `.zst` file's frame keeps its checksum, checked when decoded.
        let mut file = ZstdCodec::new(3);
        let mut framed = Vec::new();
        file.compress_frame(&src, &mut framed).unwrap();
        assert!(has_checksum(&framed));
        // A block written before (with a checksum) still decodes, even one
        // whose checksum is wrong: the block's user checks the content.
        let last = framed.len() - 1;
        framed[last] ^= 1;
        let mut out = Vec::new();
        c.decompress(&framed, &mut out, src.len()).unwrap();
        assert_eq!(out, src);
        assert!(file.decompress_frame(&framed, &mut out, src.len()).is_err());
    }

    #[test]
    fn wrong_length_is_an_error() {
        for kind in CodecKind::ALL {
            let mut c = CodecSpec::default_for(kind).build();
            let src = sample(5000);
            let mut packed = Vec::new();
            c.compress(&src, &mut packed).unwrap();
            let mut out = Vec::new();
            assert!(
                c.decompress(&packed, &mut out, 4999).is_err(),
                "{kind} accepted a short length"
            );
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for kind in CodecKind::ALL {
            let mut c = CodecSpec::default_for(kind).build();
            let src = sample(5000);
            let mut packed = Vec::new();
            c.compress(&src, &mut packed).unwrap();
            for i in (0..packed.len()).step_by(97) {
                let mut bad = packed.clone();
                bad[i] ^= 0x5a;
                let mut out = Vec::new();
                // Either an error or (for stored/self-synchronizing codecs)
                // some output; never a panic.
                let _ = c.decompress(&bad, &mut out, 5000);
            }
        }
    }

    #[test]
    fn spec_parsing() {
        assert_eq!(
            "zstd:-5".parse::<CodecSpec>().unwrap(),
            CodecSpec::new(CodecKind::Zstd, -5).unwrap()
        );
        assert!("zstd:99".parse::<CodecSpec>().is_err());
        assert!("nope".parse::<CodecSpec>().is_err());
        assert_eq!("lz4".parse::<CodecSpec>().unwrap().level(), 1);
    }
}
