//! A byte range of a gzip file's decoded output, read without decoding
//! what an index lets it skip (`cairn unpack --range`).
//!
//! The file is walked member by member:
//!
//! - a member with checkpoints in the index ([`GzipIndex`], made by a
//!   whole read with `--index`) is inflated from the last checkpoint at or
//!   before the range's start (zlib-rs primed at its bit, its 32 KiB window
//!   as the dictionary), or from its last checkpoint when the range starts
//!   after it, which finds its trailer in at most one index chunk; a
//!   checkpoint is used only where the data passes the checks a block
//!   found by the whole read's search passes ([`marker::find_block`] at
//!   exactly that bit), else the one before it, down to the member's start;
//! - any other member is inflated from its start, its CRC checked: on
//!   several threads as the whole read does when it has no size field and
//!   the range runs `PARALLEL_OUTPUT` (64 MiB) or more into it, else on one.
//!
//! Size fields (cairn's `CN`, BGZF's `BC`) are not used to hop members:
//! nothing but inflating a member checks its size field and its trailer's
//! length, and a wrong one would shift the output silently.
//!
//! Reading stops as soon as the range is written. What is checked: the
//! DEFLATE structure of everything inflated; the CRC and length of every
//! member inflated from its first bit to its trailer; the length of every
//! member inflated from a checkpoint to its trailer, against its trailer
//! and the index. What is not: the bytes of a member inflated from a
//! checkpoint (its CRC covers the part not decoded), and of a member the
//! range ends in. So a range read trusts that the index's windows are this
//! file's: the index is checksummed against damage and the caller refuses
//! one older than the file, but an index of another file whose checkpoints
//! fall on true block starts can make a range read write wrong bytes (a
//! whole read compares every window with the output and cannot be fooled
//! that way). docs/format/gzip-index.md says so too.

use super::gzip::{parse_header, GZIP_MARKS, PARALLEL_MIN, TRAILER_LEN};
use super::Marks;
use super::{at_offset, le32};
use crate::error::{CodecError, Result};
use crate::inflate::index::{Checkpoint, GzipIndex, MemberIndex};
use crate::inflate::marker::{self, MarkerDecoder};
use crate::inflate::zstream::ZInflate;
use crate::inflate::{ParallelInflate, Workers};
use crate::input::{Input, SharedBytes};

const NAME: &str = "gzip";
/// Output bytes inflated per call.
const PIECE: usize = 1 << 20;
/// Output a range must run into a member (from its start) before the
/// member is inflated on several threads: more than the chunks they start
/// with decode to.
const PARALLEL_OUTPUT: u64 = 64 << 20;

/// Decoded bytes `start` up to `end` (exclusive; `None`: to the end).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteRange {
    /// First byte.
    pub start: u64,
    /// One past the last byte, if not the end of the output.
    pub end: Option<u64>,
}

impl ByteRange {
    fn done(&self, pos: u64) -> bool {
        self.end.is_some_and(|e| pos >= e)
    }
}

/// What a range read did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RangeStats {
    /// Bytes written (fewer than asked when the output ends first).
    pub written: u64,
    /// Bytes of the file read up to, about: where the walk stopped (a
    /// member inflated on several threads counts to the chunk its output
    /// had reached).
    pub read_to: u64,
    /// Members inflated, whole or in part.
    pub inflated: u64,
    /// Of those, how many started at an index checkpoint.
    pub from_checkpoint: u64,
    /// Of those, how many were inflated on several threads.
    pub parallel: u64,
    /// Members inflated from their first bit to their trailer, CRC checked.
    pub crc_checked: u64,
    /// Bytes inflated in all, written or not.
    pub decoded: u64,
}

/// Write the bytes of `range` of the decoded output of the gzip file
/// `data` to `sink`, using `index` where it has the member; a long member
/// inflated from its start is inflated on `workers` (a thread count, or
/// workers fitted to a memory budget). A range past the end of the output
/// writes what there is.
pub fn read_range<E: From<CodecError>>(
    data: &SharedBytes,
    index: Option<&GzipIndex>,
    range: ByteRange,
    workers: impl Into<Workers>,
    sink: impl FnMut(&[u8]) -> Result<(), E>,
) -> Result<RangeStats, E> {
    let mut st = RangeStats::default();
    let r = walk(data, index, range, workers.into(), sink, &mut st);
    tracing::debug!(
        start = range.start,
        end = range.end,
        written = st.written,
        read_to = st.read_to,
        inflated = st.inflated,
        from_checkpoint = st.from_checkpoint,
        parallel = st.parallel,
        crc_checked = st.crc_checked,
        decoded = st.decoded,
        "gzip range read"
    );
    r.map(|()| st)
}

fn walk<E: From<CodecError>>(
    data: &SharedBytes,
    index: Option<&GzipIndex>,
    range: ByteRange,
    workers: Workers,
    mut sink: impl FnMut(&[u8]) -> Result<(), E>,
    st: &mut RangeStats,
) -> Result<(), E> {
    let buf = data.as_slice();
    // The member at `off` decodes to output offset `pos`.
    let (mut off, mut pos) = (0usize, 0u64);
    let mut marks = Marks::new(GZIP_MARKS);
    while !range.done(pos) && off < buf.len() {
        if buf[off] == 0 {
            // Zero padding after the last member, as gzip allows.
            return match buf[off..].iter().position(|&b| b != 0) {
                Some(z) => Err(marks
                    .cut(CodecError::TrailingGarbage {
                        format: NAME,
                        offset: (off + z) as u64,
                    })
                    .into()),
                None => Ok(marks.ended(off as u64)?),
            };
        }
        let rest = data.from_offset(off).ok_or(CodecError::Truncated {
            format: NAME,
            offset: off as u64,
        })?;
        let mut input = Input::with_buffer(Box::new(std::io::Cursor::new(rest)), 4096);
        let header = parse_header(&mut input).map_err(|e| marks.cut(at_offset(e, off as u64)))?;
        if let Some(mark) = header.mark {
            marks.see(off as u64, mark)?;
        }
        let body = off + header.len;
        let member = index.and_then(|i| i.members.get(&(body as u64)));
        let (bit, out, window) = match member {
            Some(m) => {
                let target = range.start.saturating_sub(pos).min(m.out_len);
                start_point(&buf[body..], &m.points, target)
            }
            None => (0, 0, &[][..]),
        };
        st.inflated += 1;
        st.from_checkpoint += u64::from(bit > 0);
        // Several threads pay off once there is more to inflate than the
        // chunks they start with (a range near the member's start is
        // inflated sooner on one), and only for a member without a size
        // field, as the whole read decides: one with a size field (cairn's
        // and BGZF's members) is short.
        let far = |to: u64| to.saturating_sub(pos) >= PARALLEL_OUTPUT;
        let long = range.end.is_none_or(far) || far(range.start);
        let sized = header.member_len.is_some();
        let end = if bit == 0
            && workers.threads > 1
            && long
            && !sized
            && buf.len() - body >= PARALLEL_MIN
        {
            let at = (data, body, member, workers);
            st.parallel += 1;
            inflate_parallel(at, pos, range, st, &mut sink)?
        } else {
            let from = (bit, pos.saturating_add(out), window);
            inflate_member(&buf[body..], body, from, range, st, &mut sink)?
        };
        let Some((at, (crc, reached))) = end else {
            return Ok(());
        };
        let t = body + at;
        st.read_to = (t + TRAILER_LEN).min(buf.len()) as u64;
        let trailer = buf.get(t..t + TRAILER_LEN).ok_or(CodecError::Truncated {
            format: NAME,
            offset: buf.len() as u64,
        })?;
        let len = reached - pos;
        if let Some(got) = crc {
            let stored = le32(trailer, 0);
            if stored != got {
                let why = format!("CRC mismatch: stored {stored:08x}, computed {got:08x}");
                return Err(CodecError::corrupt(NAME, t as u64, why).into());
            }
            st.crc_checked += 1;
        }
        let isize = le32(trailer, 4);
        if isize != len as u32 {
            let why = format!("length mismatch: stored {isize}, decoded {len}");
            return Err(CodecError::corrupt(NAME, t as u64 + 4, why).into());
        }
        if let Some(m) = member.filter(|m| m.out_len != len) {
            let why = format!(
                "the index says this member decodes to {} bytes, it decodes to {len} \
                 (an index of another file?)",
                m.out_len
            );
            return Err(CodecError::corrupt(NAME, body as u64, why).into());
        }
        pos += len;
        marks.decoded(len);
        off = t + TRAILER_LEN;
    }
    if !range.done(pos) {
        marks.ended(off as u64)?;
    }
    Ok(())
}

/// Write what of `piece`, the output from `here` on, falls in `range`,
/// and move `here` past it; whether the range is now written.
fn emit<E>(
    piece: &[u8],
    here: &mut u64,
    range: ByteRange,
    st: &mut RangeStats,
    sink: &mut impl FnMut(&[u8]) -> Result<(), E>,
) -> Result<bool, E> {
    st.decoded += piece.len() as u64;
    let next = here.saturating_add(piece.len() as u64);
    let lo = range.start.max(*here);
    let hi = range.end.map_or(next, |e| e.min(next));
    if lo < hi {
        sink(&piece[(lo - *here) as usize..(hi - *here) as usize])?;
        st.written += hi - lo;
    }
    *here = next;
    Ok(range.done(next))
}

/// Inflate the long member whose DEFLATE data starts at `body` of `data`
/// from its start on `workers`, as a whole read does (from the
/// index's checkpoints when `member` has them), writing what falls in
/// `range` of the output from `pos` on; `None` when the range was written
/// before the member's end.
fn inflate_parallel<E: From<CodecError>>(
    at: (&SharedBytes, usize, Option<&MemberIndex>, Workers),
    pos: u64,
    range: ByteRange,
    st: &mut RangeStats,
    sink: &mut impl FnMut(&[u8]) -> Result<(), E>,
) -> Result<Option<MemberEnd>, E> {
    let (data, body, member, workers) = at;
    let rest = data.from_offset(body).ok_or(CodecError::Truncated {
        format: NAME,
        offset: body as u64,
    })?;
    let mut p = match member {
        Some(m) => ParallelInflate::with_index(rest, workers, m.clone()),
        None => ParallelInflate::new(rest, workers),
    };
    let mut here = pos;
    let mut piece = Vec::new();
    while p
        .next_piece(&mut piece)
        .map_err(|e| at_offset(e, body as u64))?
    {
        if emit(&piece, &mut here, range, st, sink)? {
            // Where the range ends at the member's end, the next call says
            // so (and the trailer is checked); else the rest is not read.
            piece.clear();
            if !p
                .next_piece(&mut piece)
                .map_err(|e| at_offset(e, body as u64))?
            {
                break;
            }
            st.read_to = body as u64 + p.finish().0 as u64;
            return Ok(None);
        }
        piece.clear();
    }
    let (used, crc, size) = p.finish();
    Ok(Some((used, (Some(crc), pos + size))))
}

/// Where to start inflating the member `member` (its DEFLATE data) for
/// output offset `target`: the last checkpoint at or before it whose bit
/// passes [`marker::find_block`] exactly there, else the member's start.
fn start_point<'a>(member: &[u8], points: &'a [Checkpoint], target: u64) -> (usize, u64, &'a [u8]) {
    let mut dec = MarkerDecoder::default();
    for p in points.iter().rev().filter(|p| p.out <= target) {
        let bit = p.bit as usize;
        if marker::find_block(&mut dec, member, bit, bit + 1).is_some() {
            return (bit, p.out, &p.window);
        }
        tracing::debug!(
            bit,
            "the index's checkpoint is no block start here: not used"
        );
    }
    (0, 0, &[])
}

/// The end of a member inflated to its trailer: where the trailer starts
/// (from the member's DEFLATE data), the CRC when inflated from the first
/// bit, and the output offset reached.
type MemberEnd = (usize, (Option<u32>, u64));

/// Inflate the DEFLATE data `member` (at file offset `base`) from `from`
/// (bit, output offset, window), writing what falls in `range`; `None`
/// when the range was written before the member's end.
fn inflate_member<E: From<CodecError>>(
    member: &[u8],
    base: usize,
    from: (usize, u64, &[u8]),
    range: ByteRange,
    st: &mut RangeStats,
    sink: &mut impl FnMut(&[u8]) -> Result<(), E>,
) -> Result<Option<MemberEnd>, E> {
    let (bit, mut here, window) = from;
    let corrupt = |at: usize, why: &str| CodecError::corrupt(NAME, (base + at) as u64, why);
    let (mut z, mut at) = ZInflate::starting_at(member, bit, window)
        .map_err(|why| corrupt(bit / 8, &format!("{why} (index checkpoint at bit {bit})")))?;
    let mut crc = (bit == 0).then(crc32fast::Hasher::new);
    let mut piece = Vec::with_capacity(PIECE);
    loop {
        piece.clear();
        let step = z
            .inflate(&member[at.min(member.len())..], &mut piece, false)
            .map_err(|why| corrupt(at, why))?;
        at += step.consumed;
        if let Some(c) = crc.as_mut() {
            c.update(&piece);
        }
        let done = emit(&piece, &mut here, range, st, sink)?;
        if step.end {
            return Ok(Some((at, (crc.map(|c| c.finalize()), here))));
        }
        if done {
            // The member's output may end where the range does: one more
            // call, with room for one byte, says whether it does, so that
            // its trailer is checked.
            let mut probe = Vec::with_capacity(1);
            let last = z.inflate(&member[at.min(member.len())..], &mut probe, false);
            if let Ok(step) = last.map_err(|_| ()).and_then(|s| {
                if s.end && s.produced == 0 {
                    Ok(s)
                } else {
                    Err(())
                }
            }) {
                let at = at + step.consumed;
                return Ok(Some((at, (crc.map(|c| c.finalize()), here))));
            }
            st.read_to = (base + at) as u64;
            return Ok(None);
        }
        if step.consumed == 0 && step.produced == 0 {
            return Err(if at >= member.len() {
                CodecError::Truncated {
                    format: NAME,
                    offset: (base + member.len()) as u64,
                }
            } else {
                corrupt(at, "inflate made no progress")
            }
            .into());
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // Tests fail loudly by design.

    use super::*;
    use crate::format::{gzip::Encoder, BlockEncoder};
    use crate::inflate::ParallelInflate;
    use crate::testutil::image_like;
    use proptest::prelude::*;
    use std::io::Write;

    fn gzip(data: &[u8], level: u32) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    /// What a whole read with `--index` records for the one-member file
    /// `gz` (flate2's 10-byte header), in chunks of 100 kB.
    fn index_of(gz: &[u8]) -> GzipIndex {
        let body = 10;
        let data = SharedBytes::from_vec(gz[body..].to_vec());
        let mut p = ParallelInflate::with_chunk(data, 2, 100_000, 1 << 20);
        let mut piece = Vec::new();
        while p.next_piece(&mut piece).unwrap() {
            piece.clear();
        }
        let mut index = GzipIndex::new(gz.len() as u64);
        index.members.insert(body as u64, p.checkpoints());
        index
    }

    fn read(
        gz: &[u8],
        index: Option<&GzipIndex>,
        start: u64,
        end: Option<u64>,
    ) -> Result<(Vec<u8>, RangeStats)> {
        let mut out = Vec::new();
        let range = ByteRange { start, end };
        let st = read_range(&SharedBytes::from_vec(gz.to_vec()), index, range, 1, |b| {
            out.extend_from_slice(b);
            Ok::<(), CodecError>(())
        })?;
        assert_eq!(st.written, out.len() as u64);
        Ok((out, st))
    }

    fn slice(data: &[u8], start: u64, end: Option<u64>) -> &[u8] {
        let len = data.len() as u64;
        let (s, e) = (
            start.min(len),
            end.map_or(len, |e| e.min(len)).max(start.min(len)),
        );
        &data[s as usize..e as usize]
    }

    #[test]
    fn a_range_of_one_member_starts_at_the_checkpoint_before_it() {
        let data = image_like(3 << 20, 7);
        let gz = gzip(&data, 6);
        let index = index_of(&gz);
        let points = &index.members[&10].points;
        assert!(points.len() >= 4, "{} checkpoints", points.len());
        let len = data.len() as u64;
        let mut ranges = vec![(0, Some(100)), (0, None), (len - 10, None), (len, None)];
        ranges.extend([(len + 5, Some(len + 9)), (12_345, Some(12_345))]);
        for p in points {
            ranges.extend([(p.out, Some(p.out + 1)), (p.out - 1, Some(p.out + 70_000))]);
        }
        for (start, end) in ranges {
            for idx in [None, Some(&index)] {
                let (out, st) = read(&gz, idx, start, end).unwrap();
                assert!(out == slice(&data, start, end), "{start}..{end:?} {idx:?}");
                // Without an index everything before the range is inflated;
                // with it, at most what lies after its last checkpoint.
                let before = points.iter().rev().find(|p| p.out <= start.min(len));
                match (idx, before) {
                    (Some(_), Some(p)) => {
                        assert_eq!(st.from_checkpoint, 1, "{start}");
                        assert!(st.decoded <= len - p.out, "{start}: {}", st.decoded);
                        assert_eq!(st.crc_checked, 0);
                    }
                    _ => assert_eq!(st.from_checkpoint, 0),
                }
                if idx.is_none() && start < len && end.is_none() {
                    assert_eq!(st.crc_checked, 1);
                }
            }
        }
    }

    #[test]
    fn any_member_mix_reads_right_and_a_lying_size_field_changes_nothing() {
        let data = image_like(2 << 20, 9);
        let mut gz = Vec::new();
        let mut enc = Encoder::new(6);
        for block in data[..1 << 20].chunks(100_000) {
            enc.encode(block, &mut gz).unwrap();
        }
        gz.extend(gzip(&data[1 << 20..], 6));
        gz.extend([0u8; 100]);
        for (start, end) in [(0, None), (950_000, Some(1_100_000)), (2_000_000, None)] {
            let (out, st) = read(&gz, None, start, end).unwrap();
            assert!(out == slice(&data, start, end), "{start}..{end:?}");
            // Members before the range are inflated, not hopped: all 12
            // here, as every range reaches the last member, which is
            // inflated whole in one call, so its CRC is checked too.
            assert_eq!((st.inflated, st.crc_checked), (12, 12), "{start}");
        }
        // cairn's size field of the first member made to cover the second:
        // gzip ignores it, and so does a range read.
        let mut lie = gz.clone();
        let first = u32::from_le_bytes(gz[16..20].try_into().unwrap());
        let second = u32::from_le_bytes(gz[first as usize + 16..][..4].try_into().unwrap());
        lie[16..20].copy_from_slice(&(first + second).to_le_bytes());
        let (out, _) = read(&lie, None, 150_000, Some(250_000)).unwrap();
        assert!(out == data[150_000..250_000]);
        // A wrong length in the first member's trailer is an error.
        let mut bad = gz.clone();
        bad[first as usize - 4] ^= 1;
        let err = read(&bad, None, 150_000, Some(250_000))
            .unwrap_err()
            .to_string();
        assert!(err.contains("length mismatch"), "{err}");
        // Bytes after the padding that are not zero are refused.
        let mut bad = gz.clone();
        *bad.last_mut().unwrap() = 1;
        let err = read(&bad, None, 2_000_000, None).unwrap_err();
        assert!(matches!(err, CodecError::TrailingGarbage { .. }), "{err}");
    }

    /// A layout-2 file cut after a member: a range that reaches past the
    /// cut is refused, one before it is read.
    #[test]
    fn a_range_past_a_cut_is_refused() {
        let data = image_like(1 << 20, 5);
        let gz = crate::encode_all(crate::Format::Gzip, 6, 100_000, &data).unwrap();
        let (out, _) = read(&gz, None, 0, None).unwrap();
        assert!(out == data);
        // The start member and three blocks.
        let mut cut = 0;
        for _ in 0..4 {
            cut += le32(&gz, cut + 16) as usize;
        }
        let gz = &gz[..cut];
        let (out, _) = read(gz, None, 1000, Some(250_000)).unwrap();
        assert!(out == data[1000..250_000]);
        // Garbage after the cut: the stream's end is missing. After a
        // whole stream: trailing garbage, at its offset (it said 0).
        let err = read(&[gz, b"garbage"].concat(), None, 0, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("without its end member"), "{err}");
        let whole = crate::encode_all(crate::Format::Gzip, 6, 100_000, &data).unwrap();
        match read(&[&whole[..], b"garbage"].concat(), None, 0, None) {
            Err(CodecError::TrailingGarbage { offset, .. }) => {
                assert_eq!(offset, whole.len() as u64)
            }
            other => panic!("{other:?}"),
        }
        for end in [None, Some(350_000)] {
            let err = read(gz, None, 1000, end).unwrap_err().to_string();
            assert!(err.contains("without its end member"), "{end:?}: {err}");
        }
    }

    #[test]
    fn damage_in_what_is_inflated_is_never_silent() {
        let data = image_like(1 << 20, 3);
        let gz = gzip(&data, 6);
        let index = index_of(&gz);
        let n = gz.len();
        // A wrong CRC: caught when the member is inflated whole.
        let mut bad = gz.clone();
        bad[n - 8] ^= 1;
        let err = read(&bad, None, 5, None).unwrap_err().to_string();
        assert!(err.contains("CRC mismatch"), "{err}");
        // A wrong length: caught from a checkpoint too.
        let mut bad = gz.clone();
        bad[n - 4] ^= 1;
        let err = read(&bad, Some(&index), 900_000, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("length mismatch"), "{err}");
        // An index whose member length is not this member's.
        let mut other = index.clone();
        other.members.get_mut(&10).unwrap().out_len += 1;
        let err = read(&gz, Some(&other), 900_000, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("the index says"), "{err}");
        // A cut file.
        let err = read(&gz[..n - 3], Some(&index), 900_000, None).unwrap_err();
        assert!(matches!(err, CodecError::Truncated { .. }), "{err}");
        // Damaged DEFLATE data after the checkpoint.
        let p = index.members[&10].points.last().unwrap().clone();
        let mut bad = gz.clone();
        let at = 10 + (p.bit / 8) as usize + 200;
        bad[at..at + 64].fill(0xff);
        let r = read(&bad, Some(&index), p.out, None);
        assert!(r.is_err(), "damage at {at} went unnoticed");
    }

    #[test]
    fn an_index_of_another_file_gives_its_bytes_or_an_error() {
        let data = image_like(3 << 20, 7);
        let gz = gzip(&data, 6);
        let index = index_of(&gz);
        let points: Vec<u64> = index.members[&10].points.iter().map(|p| p.out).collect();
        let (mut used, mut refused) = (0, 0);
        for seed in 1..6 {
            // Another file of the same kind, cut or zero-padded to the length.
            let other = image_like(3 << 20, 100 + seed);
            let mut ogz = gzip(&other, 6);
            ogz.resize(gz.len(), 0);
            for &at in &points {
                match read(&ogz, Some(&index), at + 10, Some(at + 5000)) {
                    Ok((out, st)) => {
                        used += st.from_checkpoint;
                        assert!(
                            out == slice(&other, at + 10, Some(at + 5000)),
                            "seed {seed} at {at}"
                        );
                    }
                    Err(_) => refused += 1,
                }
            }
        }
        // The bits are checked, so the reads start at the member's start.
        assert_eq!(used, 0, "{refused} refused");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn every_range_equals_the_slice(
            len in 1usize..600_000,
            seed in any::<u64>(),
            cuts in proptest::collection::vec((any::<u32>(), any::<u32>()), 4),
        ) {
            let data = image_like(len, seed);
            let gz = gzip(&data, 6);
            let index = index_of(&gz);
            for (a, b) in cuts {
                let start = u64::from(a) % (len as u64 + 10);
                let end = (b % 5 != 0).then(|| start + u64::from(b) % 300_000);
                let (out, _) = read(&gz, Some(&index), start, end).unwrap();
                prop_assert!(out == slice(&data, start, end));
            }
        }
    }
}
