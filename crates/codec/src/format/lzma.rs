//! The legacy `.lzma` format (LZMA_Alone, what `xz --format=lzma`, `lzma`
//! and LZMA Utils write): a 13-byte header, then one LZMA1 stream.
//!
//! Header: `properties (lc + lp * 9 + pb * 45) | dictionary size u32le |
//! uncompressed size u64le (all ones: unknown, the stream then ends with
//! an end marker)`. There is no magic number: a header is recognised as
//! liblzma's automatic decoder recognises one (in its picky mode):
//! properties of at most 224, a dictionary of 2^n or 2^n + 2^(n-1) bytes
//! (or all ones), and a size either unknown or under 256 GiB.
//!
//! One LZMA1 stream cannot be cut, so it is decoded here, on the reading
//! side, into plain units, and written by one encoder over the whole
//! input ([`StreamEncoder`]), as xz does. Anything after the stream is
//! trailing garbage, as xz says of it ("Compressed data is corrupt"),
//! unless only the first stream is wanted (`--single-stream`).

use super::{pass_plain, Unit, UnitKind, PLAIN_UNIT};
use crate::error::{CodecError, Result};
use crate::input::Input;
use liblzma::stream::{Action, LzmaOptions, Status, Stream};

const NAME: &str = "lzma";
/// Bytes of the header.
pub const HEADER_LEN: usize = 13;

/// Whether `head` starts with a `.lzma` header (see the module's notes).
pub fn is_header(head: &[u8]) -> bool {
    let Some(h) = head.get(..HEADER_LEN) else {
        return false;
    };
    if h[0] > (4 * 5 + 4) * 9 + 8 {
        return false;
    }
    let dict = u32::from_le_bytes([h[1], h[2], h[3], h[4]]);
    let mut d = dict.wrapping_sub(1);
    d |= d >> 2;
    d |= d >> 3;
    d |= d >> 4;
    d |= d >> 8;
    d |= d >> 16;
    let d = d.wrapping_add(1);
    if dict != u32::MAX && d != dict {
        return false;
    }
    let size = u64::from_le_bytes([h[5], h[6], h[7], h[8], h[9], h[10], h[11], h[12]]);
    size == u64::MAX || size < 1 << 38
}

/// The dictionary size a `.lzma` header declares.
fn dict_of(head: &[u8]) -> u64 {
    head.get(1..5).map_or(0, |d| {
        u64::from(u32::from_le_bytes([d[0], d[1], d[2], d[3]]))
    })
}

/// Decodes `.lzma` streams into plain units.
pub struct Splitter {
    input: Input,
    dec: Option<Stream>,
    /// Streams begun.
    streams: u64,
    /// Largest dictionary accepted.
    budget: Option<u64>,
    /// Stop after the first stream, ignoring what follows.
    single_stream: bool,
    done: bool,
    /// An error met after part of a unit was decoded.
    deferred: super::Deferred,
}

impl Splitter {
    /// A splitter over `input`, which starts with a `.lzma` header.
    pub fn new(input: Input) -> Self {
        Splitter {
            input,
            dec: None,
            streams: 0,
            budget: None,
            single_stream: false,
            done: false,
            deferred: super::Deferred::default(),
        }
    }

    /// Refuse a dictionary over `budget` bytes (`None`: the default share
    /// of this process's memory), as `xz --memlimit-decompress`.
    pub fn with_memory(mut self, budget: Option<u64>) -> Self {
        self.budget = crate::memlimit::budget(budget);
        self
    }

    /// Ignore whatever follows the first stream (`xz --single-stream`).
    pub fn single_stream(mut self, single: bool) -> Self {
        self.single_stream = single;
        self
    }

    fn start(&mut self) -> Result<Stream> {
        let off = self.input.offset();
        let h = self.input.need(HEADER_LEN, NAME)?;
        if !is_header(h) {
            return Err(CodecError::corrupt(NAME, off, "not a .lzma header"));
        }
        let dict = dict_of(h);
        if let Some(limit) = self.budget.filter(|&l| dict > l) {
            return Err(CodecError::TooLarge {
                format: NAME,
                what: "stream's LZMA dictionary (unpack -M SIZE raises the limit)",
                offset: off + 1,
                size: dict,
                limit,
            });
        }
        self.streams += 1;
        Stream::new_lzma_decoder(u64::MAX)
            .map_err(|e| CodecError::corrupt(NAME, off, format!("LZMA decoder: {e}")))
    }

    /// Decode into `out[*len..]` until it is full (`false`) or the stream
    /// ends (`true`); `*len` counts the bytes decoded, on failure too.
    fn decode_some(&mut self, dec: &mut Stream, out: &mut [u8], len: &mut usize) -> Result<bool> {
        loop {
            let avail = self.input.fill(1)?;
            let (in0, out0) = (dec.total_in(), dec.total_out());
            let action = if avail == 0 {
                Action::Finish
            } else {
                Action::Run
            };
            let status = dec.process(&self.input.peek()[..avail], &mut out[*len..], action);
            let used = (dec.total_in() - in0) as usize;
            let made = (dec.total_out() - out0) as usize;
            self.input.consume(used);
            *len += made;
            let status = status
                .map_err(|e| CodecError::corrupt(NAME, self.input.offset(), e.to_string()))?;
            if status == Status::StreamEnd {
                return Ok(true);
            }
            if *len == out.len() {
                return Ok(false);
            }
            if used == 0 && made == 0 && avail == 0 {
                return Err(CodecError::Truncated {
                    format: NAME,
                    offset: self.input.offset(),
                });
            }
        }
    }
}

impl super::Splitter for Splitter {
    fn next_unit(&mut self, unit: &mut Unit) -> Result<bool> {
        self.deferred.take()?;
        if self.done {
            return Ok(false);
        }
        let mut dec = match self.dec.take() {
            Some(d) => d,
            None => self.start()?,
        };
        unit.kind = UnitKind::Plain;
        unit.offset = self.input.offset();
        unit.data.resize(PLAIN_UNIT, 0);
        let mut len = 0;
        let step = self.decode_some(&mut dec, &mut unit.data, &mut len);
        unit.data.truncate(len);
        let ended = match step {
            Ok(ended) => ended,
            Err(e) => {
                // What was decoded before the cut or damage goes out
                // first, as xz writes it.
                self.done = true;
                self.deferred.hold(Err(e), unit)?;
                return Ok(true);
            }
        };
        if !ended {
            self.dec = Some(dec);
            return Ok(true);
        }
        self.done = true;
        if !self.single_stream && !self.input.at_end()? {
            // The stream's last bytes go out first, as xz writes them.
            let garbage = CodecError::TrailingGarbage {
                format: NAME,
                offset: self.input.offset(),
            };
            self.deferred.hold(Err(garbage), unit)?;
        }
        Ok(true)
    }

    fn offset(&self) -> u64 {
        self.input.offset()
    }
}

/// Passes the splitter's plain units through.
pub struct Decoder;

impl super::UnitDecoder for Decoder {
    fn decode(&mut self, unit: &mut Unit, out: &mut Vec<u8>) -> Result<()> {
        pass_plain(unit, out);
        Ok(())
    }
}

/// One encoder over a whole input: a `.lzma` header (size unknown, as xz
/// writes it) and an LZMA1 stream with an end marker.
pub struct StreamEncoder {
    enc: Stream,
}

impl StreamEncoder {
    /// An encoder with LZMA1 options `opts`.
    pub fn new(opts: &LzmaOptions) -> Result<Self> {
        let enc = Stream::new_lzma_encoder(opts).map_err(|e| CodecError::Compress {
            codec: NAME,
            reason: e.to_string(),
        })?;
        Ok(StreamEncoder { enc })
    }

    fn run(&mut self, mut src: &[u8], out: &mut Vec<u8>, action: Action) -> Result<()> {
        loop {
            if out.capacity() - out.len() < 64 << 10 {
                out.reserve(256 << 10);
            }
            let before = self.enc.total_in();
            let status =
                self.enc
                    .process_vec(src, out, action)
                    .map_err(|e| CodecError::Compress {
                        codec: NAME,
                        reason: e.to_string(),
                    })?;
            let used = (self.enc.total_in() - before) as usize;
            src = &src[used..];
            match action {
                Action::Finish if status == Status::StreamEnd => return Ok(()),
                Action::Finish => {}
                _ if src.is_empty() => return Ok(()),
                _ => {}
            }
        }
    }

    /// Compress `src`, appending what is ready to `out`.
    pub fn write(&mut self, src: &[u8], out: &mut Vec<u8>) -> Result<()> {
        self.run(src, out, Action::Run)
    }

    /// End the stream, appending the rest to `out`.
    pub fn finish(&mut self, out: &mut Vec<u8>) -> Result<()> {
        self.run(&[], out, Action::Finish)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::sample;
    use super::super::{Splitter as _, UnitDecoder as _};
    use super::*;

    /// A header asking for a 4 GiB dictionary (found by fuzzing: liblzma
    /// allocates it whole before the first byte) is refused by a decode
    /// whose output may reach 64 MiB, before anything is allocated; one
    /// the output allows is decoded as before.
    #[test]
    fn a_dictionary_past_the_output_limit_is_refused_first() {
        let mut bomb = vec![0x5d, 0xff, 0xff, 0xff, 0xff];
        bomb.extend([0xff; 8]);
        bomb.extend([0xff; 200]);
        assert!(is_header(&bomb));
        match crate::format::decode_as(crate::Format::Lzma, &bomb, 64 << 20) {
            Err(CodecError::TooLarge { size, limit, .. }) => {
                assert_eq!((size, limit), (u64::from(u32::MAX), 64 << 20));
            }
            other => panic!("{other:?}"),
        }
        let data = sample(100_000, 7);
        let packed = encode(&data, 6);
        assert_eq!(
            crate::format::decode_as(crate::Format::Lzma, &packed, 64 << 20).unwrap(),
            data
        );
    }

    fn encode(data: &[u8], preset: u32) -> Vec<u8> {
        let opts = LzmaOptions::new_preset(preset).unwrap_or_else(|e| panic!("{e}"));
        let mut enc = StreamEncoder::new(&opts).unwrap_or_else(|e| panic!("{e}"));
        let mut out = Vec::new();
        for part in data.chunks(100_000) {
            enc.write(part, &mut out).unwrap_or_else(|e| panic!("{e}"));
        }
        enc.finish(&mut out).unwrap_or_else(|e| panic!("{e}"));
        out
    }

    fn decode(packed: &[u8], single: bool) -> Result<Vec<u8>> {
        let input = Input::new(Box::new(std::io::Cursor::new(packed.to_vec())));
        let mut s = Splitter::new(input).single_stream(single);
        let mut out = Vec::new();
        let mut unit = Unit::default();
        loop {
            unit.clear();
            if !s.next_unit(&mut unit)? {
                return Ok(out);
            }
            Decoder.decode(&mut unit, &mut out)?;
        }
    }

    #[test]
    fn round_trip_and_header() {
        for n in [0, 1, 5000, 3 << 20] {
            let data = sample(n, 3);
            let packed = encode(&data, 1);
            assert!(is_header(&packed), "n={n}");
            // Size unknown, as xz writes it.
            assert_eq!(packed[5..13], [0xff; 8]);
            assert_eq!(
                decode(&packed, false).unwrap_or_else(|e| panic!("{e}")),
                data
            );
        }
    }

    #[test]
    fn headers_are_told_as_liblzma_tells_them() {
        let mut h = [
            0x5d, 0, 0, 0x80, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        ];
        assert!(is_header(&h));
        h[3] = 0xc0; // 8 MiB + 4 MiB: 2^n + 2^(n-1)
        assert!(is_header(&h));
        h[3] = 0x90; // 8 MiB + 1 MiB
        assert!(!is_header(&h));
        h[3] = 0x80;
        h[0] = 225;
        assert!(!is_header(&h));
        h[0] = 0x5d;
        h[5..13].copy_from_slice(&(1u64 << 38).to_le_bytes());
        assert!(!is_header(&h));
        assert!(!is_header(&h[..12]));
        assert!(!is_header(b"Hello, world! This is text."));
    }

    #[test]
    fn trailing_data_is_refused_unless_single_stream() {
        let data = sample(10_000, 5);
        let mut packed = encode(&data, 6);
        packed.extend_from_slice(&packed.clone());
        assert!(matches!(
            decode(&packed, false),
            Err(CodecError::TrailingGarbage { format: NAME, .. })
        ));
        assert_eq!(
            decode(&packed, true).unwrap_or_else(|e| panic!("{e}")),
            data
        );
    }

    #[test]
    fn damage_fails_cleanly() {
        let data = sample(20_000, 7);
        let packed = encode(&data, 6);
        for i in 0..packed.len() {
            let mut bad = packed.clone();
            bad[i] ^= 0x40;
            if let Ok(out) = decode(&bad, false) {
                // A flip the stream cannot see (no check): same length.
                assert!(out.len() <= data.len() + PLAIN_UNIT, "flip at {i}");
            }
        }
        for cut in 0..packed.len() {
            assert!(decode(&packed[..cut], false).is_err(), "cut at {cut}");
        }
    }
}
