//! Recovery: reading what a cache device holds, telling a torn tail from
//! damage, and nothing else. [`scan`] only reads; [`erase_stale`] makes
//! the only writes recovery ever makes (zeroing the headers of stale
//! segments and plog records), and `open` calls it only after the scan
//! found no damage or the caller accepted the loss.
//!
//! A crash can tear only what was being written: the newest segments (not
//! yet followed by a cache device flush) and the newest plog record. So:
//!
//! - the log of segments ends at the first one that fails its checks;
//!   that is a torn tail, unless a later segment is intact (format
//!   version 3 on): segments are written one at a time, each once the one
//!   before it is written, so a crash of the process leaves at most the
//!   last one torn. A later intact segment is damage then, whether it
//!   says (in its header) that the failed one was durable before it was
//!   sealed, or says nothing: a FLUSH acknowledged after both were
//!   written, whose flush mark was not written yet, made the failed one
//!   durable too, and nothing on the device says so (found by a
//!   black-box test: a bit flipped in a middle segment was read as the
//!   end of the log and flushed writes were dropped without a word). The
//!   one crash that can leave this without damage, a power cut on a disk
//!   that kept the later write and not the earlier one, loses only writes
//!   no FLUSH had completed for, and accepting the loss says so;
//! - the same test catches a watermark that went back in time (its newest
//!   slot damaged after the ring moved on): the slot after it holds a newer
//!   segment, and later intact segments claim it durable;
//! - plog records are written one at a time, each followed by a cache
//!   flush before the next, so an intact record after a failed one means
//!   the failed one had been flushed: damage;
//! - from version 3 on, `format` writes a first watermark, so a cache with
//!   neither watermark slot readable is damaged.

use super::{Loc, Meta, OpenSeg, Written, B, BU};
use crate::error::{Place, Result, WbError};
use crate::format::{
    self, segment_offset, segment_slot, FlushMark, PlogHeader, SegmentHeader, Superblock,
    Watermark, PLOG_OFFSET, RING_OFFSET,
};
use cairn_blockdev::BlockDev;
use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;

/// One piece of damage: where, and what it costs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// Where on the cache device.
    pub place: Place,
    /// What is wrong and what would be lost.
    pub what: String,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.place, self.what)
    }
}

/// What a cache device holds, as recovery reads it.
pub(crate) struct Scan {
    pub sb: Superblock,
    pub wm: Watermark,
    pub index: HashMap<u64, Loc>,
    pub written: VecDeque<Written>,
    /// The last segment of the log.
    pub last: u64,
    /// The open segment, with the plog records of its id replayed.
    pub open: OpenSeg,
    /// Plog records accepted (the last one's sequence number).
    pub plog_seq: u64,
    /// Where the next plog record goes.
    pub plog_pos: u64,
    /// The newest flush mark (None: a version before marks, or neither
    /// slot readable).
    pub mark: Option<FlushMark>,
    /// Offsets of headers to zero before anything is written: stale
    /// segments past the log, stale plog records past the accepted ones.
    pub stale: Vec<(u64, Place)>,
    /// Damage found (empty: every failure was a torn tail).
    pub damage: Vec<Damage>,
    /// Things found that cost nothing (a torn watermark write).
    pub notes: Vec<String>,
}

/// Read the cache device and rebuild what the log holds, writing nothing.
pub(crate) fn scan(cache: &dyn BlockDev, backing_size: u64) -> Result<Scan> {
    let mut sbuf = vec![0u8; BU];
    cache
        .read_at(&mut sbuf, 0)
        .map_err(|e| WbError::io(Place::Superblock, e))?;
    let sb = Superblock::decode(&sbuf)?;
    if backing_size != sb.backing_size {
        return Err(WbError::BackingSizeMismatch {
            formatted: sb.backing_size,
            actual: backing_size,
        });
    }
    let count = sb.segment_count;
    let needed = RING_OFFSET + count * format::SEGMENT_BYTES;
    if cache.size() < needed {
        return Err(WbError::CacheTooSmall {
            size: cache.size(),
            needed,
        });
    }
    let cid = sb.cache_id;
    let evident = sb.version >= format::DAMAGE_EVIDENT_VERSION;
    let mut damage = Vec::new();
    let mut notes = Vec::new();

    // The watermark: the valid slot with the highest sequence number.
    let mut wm = Watermark {
        seq: 0,
        clean_id: 0,
    };
    let mut valid = [false; 2];
    for (slot, off) in format::WATERMARK_OFFSETS.iter().enumerate() {
        let mut b = vec![0u8; BU];
        cache
            .read_at(&mut b, *off)
            .map_err(|e| WbError::io(Place::Watermark { slot, seq: 0 }, e))?;
        if let Some(w) = Watermark::decode(&b, &cid) {
            valid[slot] = true;
            if w.seq > wm.seq {
                wm = w;
            }
        }
    }
    match valid {
        [false, false] if evident => damage.push(Damage {
            place: Place::Watermark { slot: 0, seq: 0 },
            what: "neither watermark slot is readable: which segments are written back is \
                   unknown"
                .into(),
        }),
        [true, false] | [false, true] if wm.seq > 1 => notes.push(format!(
            "watermark slot {} unreadable (a torn write, or damage that cost nothing); \
             sequence {} in the other is used",
            if valid[0] { "B" } else { "A" },
            wm.seq
        )),
        _ => {}
    }

    // The flush mark (version 4): the valid slot with the highest
    // sequence number says what completed FLUSHes made durable.
    let mut mark = None;
    if sb.version >= format::MARKED_VERSION {
        let mut readable = [false; 2];
        for (slot, off) in format::MARK_OFFSETS.iter().enumerate() {
            let mut b = vec![0u8; BU];
            cache
                .read_at(&mut b, *off)
                .map_err(|e| WbError::io(Place::FlushMark { slot, seq: 0 }, e))?;
            if let Some(m) = FlushMark::decode(&b, &cid) {
                readable[slot] = true;
                if mark.is_none_or(|best: FlushMark| m.seq > best.seq) {
                    mark = Some(m);
                }
            }
        }
        match (mark, readable) {
            (None, _) => damage.push(Damage {
                place: Place::FlushMark { slot: 0, seq: 0 },
                what: "neither flush mark slot (A nor B) is readable: which writes were \
                       flushed is unknown"
                    .into(),
            }),
            (Some(m), [true, false] | [false, true]) if m.seq > 1 => notes.push(format!(
                "flush mark slot {} unreadable (a torn write, or damage); sequence {} in the \
                 other is used",
                if readable[0] { "B" } else { "A" },
                m.seq
            )),
            _ => {}
        }
    }
    let marked = mark.unwrap_or_default();

    // The log: the segments after the watermark, up to the first failure.
    let blocks = backing_size.div_ceil(B);
    let mut index: HashMap<u64, Loc> = HashMap::default();
    let mut written = VecDeque::new();
    let mut last = wm.clean_id;
    for id in wm.clean_id + 1..=wm.clean_id + count {
        let Some((h, _)) = read_segment(cache, &cid, id, count, blocks)? else {
            break;
        };
        let mut entries = Vec::with_capacity(h.entries.len());
        let mut d = 0u16;
        for e in &h.entries {
            let data = if e.zero {
                None
            } else {
                d += 1;
                Some(d - 1)
            };
            index.insert(
                e.lba,
                Loc {
                    seg: id,
                    data,
                    dirty: e.dirty,
                    trim: false,
                },
            );
            entries.push(Meta {
                lba: e.lba,
                dirty: e.dirty,
                data,
                trim: false,
            });
        }
        written.push_back(Written { id, entries });
        last = id;
    }

    // Every other slot: a segment past the end of the log is stale (to be
    // erased), unless it proves the end of the log is damage.
    let mut stale = Vec::new();
    let first_missing = last + 1;
    let first_slot = segment_slot(first_missing, count);
    let mut in_first_slot = None;
    // The first intact segment past the log: its id, slot, and whether it
    // says the failed one was durable when it was sealed.
    let mut proof: Option<(u64, u64, bool)> = None;
    for slot in 0..count {
        let off = RING_OFFSET + slot * format::SEGMENT_BYTES;
        let mut hb = vec![0u8; BU];
        let place = Place::Segment { id: 0, slot };
        cache
            .read_at(&mut hb, off)
            .map_err(|e| WbError::io(place, e))?;
        let Some(id) = SegmentHeader::peek_id(&hb, &cid) else {
            continue;
        };
        if slot == first_slot {
            in_first_slot = Some(id);
        }
        if id <= last {
            continue;
        }
        let place = Place::Segment { id, slot };
        if evident && proof.is_none_or(|(m, _, _)| id < m) {
            if let Some(h) = SegmentHeader::decode(&hb, &cid, id, blocks) {
                let mut data = vec![0u8; h.data_blocks() * BU];
                cache
                    .read_at(&mut data, off + B)
                    .map_err(|e| WbError::io(place, e))?;
                if h.check_crc(&data) {
                    proof = Some((id, slot, h.durable() >= first_missing));
                }
            }
        }
        // Stale only where new segments will be written before this one
        // would be reached: every slot past the log is.
        stale.push((off, place));
    }
    // Segments a flush mark claims durable must be there.
    let marked_lost = marked.durable_id >= first_missing;
    let segments_lost = proof.is_some() || marked_lost;
    if segments_lost {
        let place = Place::Segment {
            id: first_missing,
            slot: first_slot,
        };
        // New segments reuse slots in id order, so a watermark that went
        // back shows first in the slot after it: that slot was reused
        // (and the log from the old watermark on is empty, so accepting
        // the loss replays nothing that could be older than what the
        // backing device holds).
        let what = if let Some(newer) = in_first_slot.filter(|&i| i > first_missing) {
            format!(
                "the watermark says segment {first_missing} comes next, but its slot holds \
                 segment {newer}, written after it was written back: the newest watermark is \
                 lost, and writes flushed to segments after {} would be lost",
                wm.clean_id
            )
        } else if let Some((m, slot, true)) = proof {
            format!(
                "unreadable, but segment {m} (slot {slot}), written after it was flushed, is \
                 intact: writes flushed to segments {first_missing}..={m}, and every write \
                 flushed after them, would be lost"
            )
        } else if marked_lost {
            format!(
                "unreadable, but the flush mark (sequence {}) says segments up to {} were \
                 flushed: writes flushed to segments {first_missing}..={}, and every write \
                 flushed after them, would be lost",
                marked.seq, marked.durable_id, marked.durable_id
            )
        } else {
            let (m, slot) = proof.map_or((first_missing, first_slot), |(m, s, _)| (m, s));
            format!(
                "unreadable, but segment {m} (slot {slot}), written after it, is intact: \
                 segments are written one at a time, so a crash leaves only the last one torn, \
                 and this is damage (unless the power was cut on a disk that kept the later \
                 write and lost this one before any FLUSH completed: then nothing flushed is \
                 lost); writes to segments {first_missing}..={m}, and every write after them, \
                 would be lost"
            )
        };
        damage.push(Damage { place, what });
    }

    // The plog of the segment after the log, and the stale records after
    // what was accepted.
    let mut open = OpenSeg::with_buf(last + 1, super::segment_buf(&mut Vec::new()));
    let plog = scan_plog(cache, &cid, blocks, &mut open, &mut index)?;
    stale.extend(plog.stale);
    // Intact records after the first failed one, or a flush mark claiming
    // records past it, prove the failed one had been flushed.
    let mut lost_to = plog.later_intact.unwrap_or(0);
    if marked.plog_segment == open.id {
        lost_to = lost_to.max(marked.plog_seq);
    }
    // With segments lost, the log ends before the segment the plog holds
    // records of: what is in the region then are leftovers of an earlier
    // segment id, not damage (and the plog's own records go with the
    // segments, as the message above says).
    if !segments_lost && lost_to > plog.seq {
        let because = match plog.later_intact {
            Some(later) => format!("record {later} after it is intact"),
            None => format!(
                "the flush mark (sequence {}) says records up to {} were flushed",
                marked.seq, marked.plog_seq
            ),
        };
        damage.push(Damage {
            place: Place::Plog {
                segment: open.id,
                seq: plog.seq + 1,
            },
            what: format!(
                "unreadable, but {because}: writes flushed in records {}..={lost_to} would be \
                 lost",
                plog.seq + 1
            ),
        });
    }

    Ok(Scan {
        sb,
        wm,
        index,
        written,
        last,
        open,
        plog_seq: plog.seq,
        plog_pos: plog.pos,
        mark,
        stale,
        damage,
        notes,
    })
}

/// Segment `id` from its slot if it is intact: header and data.
fn read_segment(
    cache: &dyn BlockDev,
    cid: &[u8; 16],
    id: u64,
    count: u64,
    blocks: u64,
) -> Result<Option<(SegmentHeader, Vec<u8>)>> {
    let place = Place::Segment {
        id,
        slot: segment_slot(id, count),
    };
    let off = segment_offset(id, count);
    let mut hb = vec![0u8; BU];
    cache
        .read_at(&mut hb, off)
        .map_err(|e| WbError::io(place, e))?;
    let Some(h) = SegmentHeader::decode(&hb, cid, id, blocks) else {
        return Ok(None);
    };
    let mut data = vec![0u8; h.data_blocks() * BU];
    cache
        .read_at(&mut data, off + B)
        .map_err(|e| WbError::io(place, e))?;
    Ok(h.check_crc(&data).then_some((h, data)))
}

/// What the plog region holds for the open segment.
struct PlogScan {
    seq: u64,
    pos: u64,
    stale: Vec<(u64, Place)>,
    /// The highest sequence number of an intact record of the open
    /// segment after the first failed one (records are flushed one by
    /// one, so the failed one had been flushed: damage).
    later_intact: Option<u64>,
}

/// Replay the plog records of segment `open.id` (seq 1, 2, ... up to the
/// first that fails) into the open segment and the index; find the stale
/// record headers after them, and an intact record after a failed one.
fn scan_plog(
    cache: &dyn BlockDev,
    cid: &[u8; 16],
    blocks: u64,
    open: &mut OpenSeg,
    index: &mut HashMap<u64, Loc>,
) -> Result<PlogScan> {
    let mut region = vec![0u8; (RING_OFFSET - PLOG_OFFSET) as usize];
    cache
        .read_at(&mut region, PLOG_OFFSET)
        .map_err(|e| WbError::io(Place::Plog { segment: 0, seq: 0 }, e))?;
    let mut pos = 0usize;
    let mut seq = 0u64;
    while pos + BU <= region.len() {
        let Some(h) = PlogHeader::decode(&region[pos..pos + BU], cid, blocks) else {
            break;
        };
        if h.segment_id != open.id || h.seq != seq + 1 {
            break;
        }
        let end = pos + (1 + h.data_blocks()) * BU;
        if end > region.len() || !h.check_crc(&region[pos + BU..end]) {
            break;
        }
        let new = h
            .entries
            .iter()
            .filter(|e| !open.map.contains_key(&e.lba))
            .count();
        if open.entries.len() + new > format::DATA_BLOCKS {
            break;
        }
        let mut at = pos + BU;
        for e in &h.entries {
            let block = if e.zero {
                None
            } else {
                at += BU;
                Some(&region[at - BU..at])
            };
            open.put_replayed(e, block, index);
        }
        seq = h.seq;
        pos = end;
    }
    let mut stale = Vec::new();
    let mut later_intact: Option<u64> = None;
    let mut p = pos;
    while p + BU <= region.len() {
        let segment = PlogHeader::peek_segment(&region[p..p + BU], cid);
        if segment.is_some_and(|s| s >= open.id) {
            if segment == Some(open.id) {
                if let Some(h) = PlogHeader::decode(&region[p..p + BU], cid, blocks) {
                    let end = p + (1 + h.data_blocks()) * BU;
                    if h.seq > seq + 1 && end <= region.len() && h.check_crc(&region[p + BU..end]) {
                        later_intact = later_intact.max(Some(h.seq));
                    }
                }
            }
            stale.push((
                PLOG_OFFSET + p as u64,
                Place::Plog {
                    segment: open.id,
                    seq: 0,
                },
            ));
        }
        p += BU;
    }
    Ok(PlogScan {
        seq,
        pos: PLOG_OFFSET + pos as u64,
        stale,
        later_intact,
    })
}

/// Write flush mark `m` to its slot (odd sequence numbers in A), with FUA
/// if `fua`.
pub(crate) fn put_mark(
    cache: &dyn BlockDev,
    cid: &[u8; 16],
    m: &FlushMark,
    fua: bool,
) -> Result<()> {
    let slot = Watermark::slot(m.seq);
    cache
        .write_at(&m.encode(cid), format::MARK_OFFSETS[slot], fua)
        .map_err(|e| WbError::io(Place::FlushMark { slot, seq: m.seq }, e))
}

/// The owner block (None: none written, or not this cache's).
pub(crate) fn read_owner(cache: &dyn BlockDev, cid: &[u8; 16]) -> Result<Option<format::Owner>> {
    let mut b = vec![0u8; BU];
    cache
        .read_at(&mut b, format::OWNER_OFFSET)
        .map_err(|e| WbError::io(Place::Owner, e))?;
    Ok(format::Owner::decode(&b, cid))
}

/// The owner to record for an opener that names `given`: None when it is
/// recorded already (or the version has no owner block);
/// [`WbError::OtherOwner`] when the cache holds writes not yet written
/// back (segments after the watermark, or plog records) for another.
pub(crate) fn owner_to_write(
    cache: &dyn BlockDev,
    scan: &Scan,
    given: &format::Owner,
) -> Result<Option<format::Owner>> {
    if scan.sb.version < format::MARKED_VERSION {
        return Ok(None);
    }
    let dirty = scan.last > scan.wm.clean_id || scan.plog_seq > 0;
    match read_owner(cache, &scan.sb.cache_id)? {
        Some(s) if s.same_backing(given) => Ok(None),
        Some(s) if dirty => Err(WbError::OtherOwner {
            owner: s.description,
            given: given.description.clone(),
        }),
        _ => Ok(Some(given.clone())),
    }
}

/// Zero the headers of stale segments and plog records, then flush: the
/// only writes recovery makes. Repeating it is harmless.
pub(crate) fn erase_stale(cache: &dyn BlockDev, stale: &[(u64, Place)]) -> Result<()> {
    if stale.is_empty() {
        return Ok(());
    }
    let zero = vec![0u8; BU];
    for (off, place) in stale {
        cache
            .write_at(&zero, *off, false)
            .map_err(|e| WbError::io(*place, e))?;
    }
    cache.flush().map_err(|e| WbError::io(Place::CacheFlush, e))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use crate::format::{finish_segment, Entry, SEGMENT_BYTES};
    use crate::{FormatOptions, WbCache};
    use cairn_blockdev::MemDev;

    const BACKING: u64 = 1 << 20;
    const ID: [u8; 16] = *b"recovery-test-01";

    fn formatted(count: u64) -> MemDev {
        let dev = MemDev::new((RING_OFFSET + count * SEGMENT_BYTES) as usize);
        let opts = FormatOptions {
            max_segments: Some(count),
            cache_id: Some(ID),
        };
        WbCache::format(&dev, BACKING, &opts).unwrap();
        dev
    }

    /// Segment `id` with one block (of `id`'s bytes) at lba `id`.
    fn put_segment(dev: &MemDev, count: u64, id: u64, durable: u64) {
        let entries = [Entry {
            lba: id,
            dirty: 0xff,
            zero: false,
        }];
        let mut img = vec![id as u8; 2 * BU];
        finish_segment(&ID, id, durable, &entries, &mut img);
        dev.write_at(&img, segment_offset(id, count), false)
            .unwrap();
    }

    fn flip(dev: &MemDev, off: u64) {
        let mut b = [0u8; 1];
        dev.read_at(&mut b, off).unwrap();
        b[0] ^= 0x10;
        dev.write_at(&b, off, false).unwrap();
    }

    fn put_watermark(dev: &MemDev, seq: u64, clean_id: u64) {
        let w = Watermark { seq, clean_id };
        let off = format::WATERMARK_OFFSETS[Watermark::slot(seq)];
        dev.write_at(&w.encode(&ID), off, false).unwrap();
    }

    #[test]
    fn a_torn_last_segment_is_the_end_of_the_log() {
        let dev = formatted(8);
        put_segment(&dev, 8, 1, 0);
        put_segment(&dev, 8, 2, 1);
        put_segment(&dev, 8, 3, 2);
        flip(&dev, segment_offset(3, 8) + 4096 + 5);
        let s = scan(&dev, BACKING).unwrap();
        assert_eq!(s.last, 2);
        assert!(s.damage.is_empty(), "{:?}", s.damage);
        assert_eq!(s.stale.len(), 1, "the torn segment's header is erased");
    }

    #[test]
    fn a_failed_segment_that_a_later_one_claims_durable_is_damage() {
        let dev = formatted(8);
        for id in 1..=4 {
            put_segment(&dev, 8, id, id - 1);
        }
        flip(&dev, segment_offset(2, 8) + 4096 + 5);
        let s = scan(&dev, BACKING).unwrap();
        assert_eq!(s.last, 1);
        assert_eq!(s.damage.len(), 1);
        let d = &s.damage[0];
        assert_eq!(d.place, Place::Segment { id: 2, slot: 1 });
        assert!(d.what.contains("segment 3 (slot 2)"), "{d}");
    }

    #[test]
    fn a_later_segment_that_claims_nothing_still_proves_damage() {
        // Segment 3 was sealed before segment 2 was flushed, then a FLUSH
        // made both durable and was acknowledged, and the process died
        // before the flush mark was written: 2 fails, 3 is intact. The
        // writer writes one segment at a time, so no crash of it tears 2
        // and leaves 3 whole: damage, which flushed writes are lost to,
        // is refused (it was read as a torn tail).
        let dev = formatted(8);
        put_segment(&dev, 8, 1, 0);
        put_segment(&dev, 8, 2, 1);
        put_segment(&dev, 8, 3, 1);
        flip(&dev, segment_offset(2, 8) + 4096 + 5);
        let s = scan(&dev, BACKING).unwrap();
        assert_eq!(s.last, 1);
        assert_eq!(s.damage.len(), 1, "{:?}", s.damage);
        let d = &s.damage[0];
        assert_eq!(d.place, Place::Segment { id: 2, slot: 1 });
        assert!(
            d.what.contains("segment 3 (slot 2), written after it, is"),
            "{d}"
        );
        assert_eq!(s.stale.len(), 2, "erased only if the loss is accepted");
    }

    #[test]
    fn a_watermark_that_went_back_is_damage() {
        // Four slots. Watermark sequence 3 (slot A) says 4 is clean;
        // sequence 4 (slot B) said 6, and then segments 9 and 10 reused
        // the slots of 5 and 6. Slot B is damaged.
        let dev = formatted(4);
        put_watermark(&dev, 3, 4);
        put_watermark(&dev, 4, 6);
        flip(&dev, format::WATERMARK_OFFSETS[1] + 30);
        for (id, durable) in [(7, 6), (8, 7), (9, 8), (10, 9)] {
            put_segment(&dev, 4, id, durable);
        }
        let s = scan(&dev, BACKING).unwrap();
        assert_eq!((s.wm.clean_id, s.last), (4, 4));
        assert_eq!(s.damage.len(), 1, "{:?}", s.damage);
        assert!(
            s.damage[0].what.contains("newest watermark is lost"),
            "{}",
            s.damage[0]
        );
    }

    #[test]
    fn a_torn_watermark_write_costs_nothing_and_is_noted() {
        let dev = formatted(4);
        put_watermark(&dev, 2, 1);
        put_segment(&dev, 4, 1, 0);
        put_segment(&dev, 4, 2, 1);
        put_watermark(&dev, 3, 2);
        flip(&dev, format::WATERMARK_OFFSETS[0] + 30);
        let s = scan(&dev, BACKING).unwrap();
        assert!(s.damage.is_empty(), "{:?}", s.damage);
        assert_eq!((s.wm.seq, s.wm.clean_id, s.last), (2, 1, 2));
        assert_eq!(s.notes.len(), 1);
    }

    #[test]
    fn no_readable_watermark_is_damage_from_version_3_on() {
        let dev = formatted(4);
        dev.write_at(&[0u8; BU], format::WATERMARK_OFFSETS[0], false)
            .unwrap();
        let s = scan(&dev, BACKING).unwrap();
        assert_eq!(s.damage.len(), 1);
        assert!(matches!(s.damage[0].place, Place::Watermark { .. }));
    }
}
