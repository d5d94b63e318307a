//! `restore`: a snapshot back into a file, a device or a stream.
//!
//! The extent list is cut into batches of about 8 MiB; workers read the
//! records from the packs (so every target is read at once), check and
//! decode them on all cores, and either write at the image offset (files
//! and devices: no waiting for order, holes skipped in a fresh file so it
//! stays sparse; each run of bytes is written in one call, its whole
//! blocks with `O_DIRECT` where the destination allows it, by one writer
//! thread while the workers decode on: `WriteBehind`) or hand the bytes to
//! the calling thread, which writes them in order (streams). A stream's
//! batch is not copied together: it holds on to the decoded groups its
//! chunks lie in and is written from them with `writev` (see [`Piece`]);
//! into a pipe, where huge pages make it pay, the groups are decoded into
//! buffers of their own that are frozen and handed to the pipe by
//! reference (`vmsplice`: no copy into the pipe, see [`GroupBuf`]).

use crate::error::{Result, StoreError};
use crate::id::ChunkId;
use crate::index::{ChunkIndex, Location};
use crate::manifest::{Extent, Manifest};
use crate::pack::{check_chunk, RecordDecoder};
use crate::reader::{DamagedRecords, PackReader};
use crate::repo::Repository;
use cairn_blockdev::{
    reopen_direct, splice_all, write_blocks_at, AlignedBuf, SpliceBuf, SpliceBytes, Spliced,
    DIRECT_ALIGN,
};
use cairn_pipeline::{Config, Fill, Slot};
use crossbeam_channel::{unbounded, Receiver, Sender};
use std::collections::HashMap;
use std::fs::File;
use std::io::IoSlice;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use std::time::Instant;

const BATCH: u64 = 8 << 20;
/// Holes shorter than this at a batch's end are taken into it with the
/// rest of its last record (zero runs left out of a group's chunks); a
/// batch may end at a longer one (free space). In a stream a long hole
/// is cut into batch-sized pieces, and its last piece may be short
/// enough to come along whole: the output is the same.
const ZERO_RUN_IN_GROUP: u64 = 1 << 20;
/// A batch from a remote store into a file (see [`restore`]), and how
/// many such batches are worked on per core. Measured once on SeaweedFS
/// (os2.img, 576 MiB, 2 cores, 40 MiB spans, medians of 5 restores):
/// 128 MiB batches 0.76 s with 3 workers, 0.77 s with 4, 0.82 s with 8;
/// 64 MiB and 4 workers 0.80 s; 256 MiB and 4 workers 0.89 s. Two per
/// core: while one waits on its GETs the other decodes.
const REMOTE_BATCH: u64 = 128 << 20;
const REMOTE_WORKERS_PER_CORE: usize = 2;
/// Extents in a batch at most ([`REMOTE_BATCH`]es may have more).
const MAX_BATCH_EXTENTS: usize = 4096;
/// Zeros to write from (in the binary's read-only data).
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
/// A stream's batch holds on to at most this many bytes of decoded groups
/// (and [`MAX_PINS`] groups); the chunks of any further group are copied
/// into it. A batch whose chunks lie together holds a few groups; one of
/// chunks deduplicated against many others' groups would otherwise keep
/// them all.
const PIN_LIMIT: usize = 4 * BATCH as usize;
const MAX_PINS: usize = 64;
/// Slices handed to one `writev` at most (Linux's `IOV_MAX`).
const MAX_IOV: usize = 1024;

/// Where restored bytes go.
pub enum Destination<'a> {
    /// A file or device written at offsets. `zeroed`: it reads as zeros
    /// already (a fresh file of the right length), so holes are skipped.
    At {
        /// The open file.
        file: &'a File,
        /// Whether holes can be skipped.
        zeroed: bool,
    },
    /// A stream written in order.
    Stream(&'a mut dyn Write),
    /// A pipe, written in order and handed the decoded groups by
    /// reference (see [`cairn_blockdev::splice_all`]); for a pipe where
    /// [`cairn_blockdev::splice_pays`] says so (else a `Stream`).
    Pipe(&'a File),
}

/// How to restore.
pub struct RestoreOptions<'a> {
    /// Worker threads.
    pub threads: usize,
    /// Write zeros where a chunk is missing or damaged (and list the
    /// ranges) instead of failing.
    pub zero_damaged: bool,
    /// Called in order with the number of image bytes done.
    pub progress: Option<&'a (dyn Fn(u64) + Sync)>,
}

/// A range of the image that could not be restored.
#[derive(Debug, Clone)]
pub struct Damaged {
    /// Offset in the image.
    pub offset: u64,
    /// Length.
    pub len: u64,
    /// The chunks that should be there, in order.
    pub chunks: Vec<ChunkId>,
    /// Why it is not.
    pub reason: String,
}

/// What a restore did.
#[derive(Debug, Clone, Default)]
pub struct RestoreReport {
    /// Image bytes written.
    pub size: u64,
    /// Bytes read from packs.
    pub stored_read: u64,
    /// Wall time.
    pub seconds: f64,
    /// Ranges written as zeros because their chunk was damaged or missing.
    pub damaged: Vec<Damaged>,
    /// Chunks whose copy the index names is damaged or unreadable, read
    /// from another copy of theirs (each damaged record was said with a
    /// warning).
    pub recovered: u64,
}

#[derive(Default)]
struct Work {
    extents: Vec<(u64, Extent)>,
}

/// A decoded group's bytes: a buffer that is reused once no batch holds
/// it, or (restoring into a pipe) frozen memory handed to the pipe by
/// reference, never written again: each group decoded into a pipe gets a
/// fresh buffer (on huge pages, a page fault per 2 MiB).
enum GroupBuf {
    Heap(Vec<u8>),
    Frozen(SpliceBytes),
}

impl Default for GroupBuf {
    fn default() -> Self {
        GroupBuf::Heap(Vec::new())
    }
}

impl std::ops::Deref for GroupBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            GroupBuf::Heap(v) => v,
            GroupBuf::Frozen(b) => b,
        }
    }
}

/// A stretch of a stream's batch, in order.
enum Piece {
    /// Bytes of a decoded group, which the batch holds on to until it is
    /// written: not copied (profiled: the copy of every chunk into its
    /// batch and the fresh pages it filled were an eighth of a restore's
    /// CPU).
    Group {
        data: Arc<GroupBuf>,
        start: usize,
        len: usize,
    },
    /// Bytes copied into [`Out::bytes`], from `start`.
    Copied { start: usize, len: usize },
    /// Zeros, written from [`ZEROS`] (161 MB of os2.img's 604).
    Zeros(u64),
}

#[derive(Default)]
struct Out {
    /// A stream's batch: its pieces, in order.
    pieces: Vec<Piece>,
    /// Chunks of groups past [`PIN_LIMIT`] or [`MAX_PINS`].
    bytes: Vec<u8>,
    /// The groups the pieces hold (their addresses, only compared) and
    /// their bytes.
    pins: Vec<usize>,
    pinned: usize,
    done: u64,
    stored: u64,
    damaged: Vec<Damaged>,
    /// Chunks read from another copy than the index's.
    recovered: u64,
}

impl Out {
    /// Append `len` bytes of `group` from `start`.
    fn push_group(&mut self, group: &Arc<GroupBuf>, start: usize, len: usize) {
        if let Some(Piece::Group {
            data,
            start: s,
            len: l,
        }) = self.pieces.last_mut()
        {
            if Arc::ptr_eq(data, group) && *s + *l == start {
                *l += len;
                return;
            }
        }
        let addr = Arc::as_ptr(group) as usize;
        if !self.pins.contains(&addr) {
            if self.pins.len() >= MAX_PINS || self.pinned + group.len() > PIN_LIMIT {
                self.push_copy(&group[start..start + len]);
                return;
            }
            self.pins.push(addr);
            self.pinned += group.len();
        }
        self.pieces.push(Piece::Group {
            data: Arc::clone(group),
            start,
            len,
        });
    }

    fn push_copy(&mut self, data: &[u8]) {
        let at = self.bytes.len();
        self.bytes.extend_from_slice(data);
        if let Some(Piece::Copied { start, len }) = self.pieces.last_mut() {
            if *start + *len == at {
                *len += data.len();
                return;
            }
        }
        self.pieces.push(Piece::Copied {
            start: at,
            len: data.len(),
        });
    }

    fn push_zeros(&mut self, n: u64) {
        if let Some(Piece::Zeros(z)) = self.pieces.last_mut() {
            *z += n;
        } else {
            self.pieces.push(Piece::Zeros(n));
        }
    }

    fn clear(&mut self) {
        self.pieces.clear();
        self.bytes.clear();
        self.pins.clear();
        self.pinned = 0;
        self.done = 0;
        self.stored = 0;
        self.damaged.clear();
        self.recovered = 0;
    }
}

/// Decoded groups a worker keeps. An image backed up after another one
/// interleaves its new chunks (its own groups, in stream order) with
/// chunks the first image stored (that image's groups, also roughly in
/// order), so a reader moving through the image needs a few groups at
/// once; keeping only the last one decoded the same groups again and
/// again. Measured on os2.img restored from a repository holding os.img
/// too (576 MiB image, 142 MiB of packs, 2 threads): 636 MB read from
/// packs keeping 1 group, 239 MB keeping 4, 217 MB keeping 8 (46 MiB peak
/// RSS), 198 MB keeping 64.
const KEPT_GROUPS: usize = 8;

/// Buffers of decoded groups that stream batches held and let go of last,
/// for workers to decode into again: a fresh buffer per group cost a page
/// fault per 4 KiB (a restore of os2.img took 21k faults, 11k with these
/// kept).
#[derive(Default)]
struct Spares(Mutex<Vec<Vec<u8>>>);

impl Spares {
    /// Buffers kept at most.
    const MAX: usize = 32;

    fn take(&self) -> Vec<u8> {
        self.lock().pop().unwrap_or_default()
    }

    /// Take back the groups of `pieces` no one else holds.
    fn give_back(&self, pieces: &mut Vec<Piece>) {
        let mut spare = self.lock();
        for piece in pieces.drain(..) {
            if let Piece::Group { data, .. } = piece {
                if let Ok(GroupBuf::Heap(buf)) = Arc::try_unwrap(data) {
                    Self::keep(&mut spare, buf);
                }
            }
        }
    }

    /// Take back `group` if no one else holds it.
    fn give(&self, group: Arc<GroupBuf>) {
        if let Ok(GroupBuf::Heap(buf)) = Arc::try_unwrap(group) {
            self.put(buf);
        }
    }

    /// Take back `buf`.
    fn put(&self, buf: Vec<u8>) {
        Self::keep(&mut self.lock(), buf);
    }

    fn keep(spare: &mut Vec<Vec<u8>>, buf: Vec<u8>) {
        if spare.len() < Self::MAX && buf.capacity() > 0 {
            spare.push(buf);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The groups the workers of a restore have decoded, for one another: a
/// chunk deduplicated within an image lies in a group that the other
/// worker may have decoded (os2.img, two workers: 6 % of the records were
/// read and decoded by both). Held weakly: a group lives as long as a
/// worker keeps it or a batch holds it, and is decoded again after.
#[derive(Default)]
struct Decoded(Mutex<HashMap<(u32, u32), SharedGroup>>);

/// A group one worker decoded, and its pack's path.
type SharedGroup = (std::sync::Weak<GroupBuf>, PathBuf);

impl Decoded {
    /// Entries past which the dead ones are dropped.
    const PRUNE: usize = 256;

    fn get(&self, key: (u32, u32)) -> Option<(Arc<GroupBuf>, PathBuf)> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (group, path) = map.get(&key)?;
        Some((group.upgrade()?, path.clone()))
    }

    fn put(&self, key: (u32, u32), group: &Arc<GroupBuf>, path: &std::path::Path) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= Self::PRUNE {
            map.retain(|_, (g, _)| g.strong_count() > 0);
        }
        map.insert(key, (Arc::downgrade(group), path.to_path_buf()));
    }
}

/// A decoded group: its record (pack, offset), the pack's path, its bytes
/// (shared with the stream batches that hold on to them; a slot whose
/// bytes are still held decodes its next group into a fresh buffer) and
/// when it was last used.
struct Kept {
    key: (u32, u32),
    path: PathBuf,
    data: Arc<GroupBuf>,
    used: u64,
}

/// Records of one pack nearer than this are fetched together from a
/// remote store: one request instead of several round trips, for at most
/// this many bytes of the gap between them (measured on SeaweedFS: 256
/// KiB took os2.img from 347 requests to 165, 1 MiB to fewer; a store
/// that keeps objects in 4 MiB blocks reads a whole block per request
/// anyway).
const SPAN_GAP: u64 = 1 << 20;
/// The longest span fetched at once: a whole pack of the default size
/// (32 MiB) fits. Fewer, longer GETs cost the store less: SeaweedFS
/// restored os2.img in 0.79 s with 40 MiB spans against 0.87 s with 16
/// MiB and 0.83 s with 4 MiB (64 MiB batches, 8 workers, medians of 4).
const SPAN_MAX: u64 = 64 << 20;

/// Reads and checks chunks: one per worker, with its buffers and the last
/// few groups it decoded ([`KEPT_GROUPS`], least recently used evicted),
/// so each group is usually decoded once.
pub(crate) struct Fetcher<'a> {
    files: &'a PackReader,
    index: &'a ChunkIndex,
    rec: Vec<u8>,
    dec: RecordDecoder,
    kept: Vec<Kept>,
    clock: u64,
    /// Spans fetched ahead for a batch ([`Fetcher::prefetch`]), with their
    /// pack's path, and where each record is in them.
    spans: Vec<(Vec<u8>, PathBuf)>,
    /// How many of `spans` the current batch uses (the rest are buffers
    /// kept for the next).
    used_spans: usize,
    fetched: HashMap<(u32, u32), (usize, usize)>,
    /// Where a slot whose buffer a batch still holds takes another.
    spares: Option<&'a Spares>,
    /// The groups the other workers decoded.
    decoded: Option<&'a Decoded>,
    /// Decode into frozen buffers, for a pipe (see [`GroupBuf`]).
    frozen: bool,
    /// Records that could not be read or decoded, why, and whether it was
    /// an I/O error (not known damaged): their chunks are read from their
    /// other copies without reading them again (see
    /// [`Fetcher::other_copy`]).
    damaged: HashMap<(u32, u32), (String, bool)>,
    /// Damaged records said in a warning (shared by a restore's workers,
    /// a diff's two sides, a copy's snapshots: each is said once).
    said: Arc<DamagedRecords>,
    /// Chunks read from another copy since [`Fetcher::take_recovered`].
    recovered: u64,
}

impl<'a> Fetcher<'a> {
    /// Warn of each damaged record once across every fetcher given the
    /// same `said` (a restore's workers, a diff's two sides, a copy's
    /// snapshots), not once per fetcher.
    pub fn sharing_warnings(mut self, said: &Arc<DamagedRecords>) -> Self {
        self.said = said.clone();
        self
    }

    pub fn new(files: &'a PackReader, index: &'a ChunkIndex) -> Self {
        Fetcher {
            files,
            index,
            rec: Vec::new(),
            dec: files.record_decoder(),
            kept: Vec::with_capacity(KEPT_GROUPS),
            clock: 0,
            spans: Vec::new(),
            used_spans: 0,
            fetched: HashMap::new(),
            spares: None,
            decoded: None,
            frozen: false,
            damaged: HashMap::new(),
            said: Arc::default(),
            recovered: 0,
        }
    }

    /// How many chunks were read from another copy than the index's
    /// (theirs damaged) since the last call.
    pub(crate) fn take_recovered(&mut self) -> u64 {
        std::mem::take(&mut self.recovered)
    }

    /// Fetch the records of `extents` that are not decoded already,
    /// neighbours in a pack together (see [`SPAN_GAP`]): for a remote
    /// store, whose every request is a round trip (and, for some, a read
    /// of a whole stored block), a few long reads instead of one per
    /// record. Returns the bytes read.
    pub(crate) fn prefetch(&mut self, extents: &[(u64, Extent)]) -> Result<u64> {
        // The span buffers stay allocated from batch to batch: a fresh
        // buffer of several MiB per span cost page faults and zeroing
        // (profiled: an eighth of a remote restore's CPU).
        self.used_spans = 0;
        self.fetched.clear();
        let mut locs: Vec<Location> = extents
            .iter()
            .filter_map(|(_, e)| match e {
                Extent::Data { id, .. } => self.index.get(id),
                Extent::Hole { .. } => None,
            })
            .filter(|l| !self.kept.iter().any(|k| k.key == (l.pack, l.offset)))
            .collect();
        locs.sort_by_key(|l| (l.pack, l.offset));
        locs.dedup_by_key(|l| (l.pack, l.offset));
        let mut read = 0;
        let mut i = 0;
        while i < locs.len() {
            let first = locs[i];
            let start = u64::from(first.offset);
            let mut end = start + u64::from(first.len);
            let mut j = i + 1;
            while j < locs.len()
                && locs[j].pack == first.pack
                && u64::from(locs[j].offset) <= end + SPAN_GAP
                && u64::from(locs[j].offset) + u64::from(locs[j].len) - start <= SPAN_MAX
            {
                end = end.max(u64::from(locs[j].offset) + u64::from(locs[j].len));
                j += 1;
            }
            // A lone record is read when it is needed, as without prefetch.
            if j - i > 1 {
                let n = self.used_spans;
                if n == self.spans.len() {
                    self.spans.push((Vec::new(), PathBuf::new()));
                }
                let (buf, path) = &mut self.spans[n];
                // A span that cannot be read is no error yet: its records
                // are read one by one when needed, and one that fails
                // then is read from another copy, or is the error.
                match self
                    .files
                    .read_span(first.pack, start, (end - start) as usize, buf)
                {
                    Ok(p) => *path = p,
                    Err(_) => {
                        i = j;
                        continue;
                    }
                }
                self.used_spans += 1;
                read += end - start;
                for l in &locs[i..j] {
                    self.fetched.insert(
                        (l.pack, l.offset),
                        (n, (u64::from(l.offset) - start) as usize),
                    );
                }
            }
            i = j;
        }
        Ok(read)
    }

    /// The slot of the kept group of record `loc`, decoded now if it is
    /// not kept; also the bytes read from its pack (0 if it was kept).
    fn group(&mut self, loc: Location) -> Result<(usize, u64)> {
        self.clock += 1;
        let key = (loc.pack, loc.offset);
        if let Some(i) = self.kept.iter().position(|k| k.key == key) {
            self.kept[i].used = self.clock;
            return Ok((i, 0));
        }
        // Reuse the least recently used slot's buffer once all are taken.
        let slot = if self.kept.len() < KEPT_GROUPS {
            // (Keyed once decoded: a failed read leaves nothing to hit.)
            self.kept.push(Kept {
                key: (u32::MAX, u32::MAX),
                path: PathBuf::new(),
                data: Arc::default(),
                used: 0,
            });
            self.kept.len() - 1
        } else {
            (0..self.kept.len())
                .min_by_key(|&i| self.kept[i].used)
                .unwrap_or(0)
        };
        if let Some((data, path)) = self.decoded.and_then(|d| d.get(key)) {
            let k = &mut self.kept[slot];
            let old = std::mem::replace(&mut k.data, data);
            if let Some(spares) = self.spares {
                spares.give(old);
            }
            k.key = key;
            k.path = path;
            k.used = self.clock;
            return Ok((slot, 0));
        }
        let prefetched = self.fetched.contains_key(&key);
        let (path, raw): (PathBuf, &[u8]) = match self.fetched.get(&key) {
            Some(&(n, at)) => {
                let (span, path) = &self.spans[n];
                let raw = span.get(at..at + loc.len as usize).ok_or_else(|| {
                    StoreError::corrupt(path, u64::from(loc.offset), "record past its span")
                })?;
                (path.clone(), raw)
            }
            None => {
                let path = self.files.read_record(loc, &mut self.rec)?;
                (path, &self.rec)
            }
        };
        let k = &mut self.kept[slot];
        // Until decoded, the slot holds nothing a later lookup could hit.
        k.key = (u32::MAX, u32::MAX);
        let old = Arc::try_unwrap(std::mem::take(&mut k.data));
        let at = u64::from(loc.offset);
        // A frozen buffer is never reused (a pipe may still hold its
        // pages); a buffer that may be is reused or taken from the spares.
        let mut buf = match old {
            Ok(GroupBuf::Heap(buf)) => buf,
            _ => self.spares.map(Spares::take).unwrap_or_default(),
        };
        k.data = Arc::new(if self.frozen {
            let map = |source| StoreError::Io {
                path: path.clone(),
                what: "map a buffer for the pipe",
                source,
            };
            // Groups too small for a huge page are written: a mapping of
            // their own would cost more than the copy it saves.
            let frozen = |n: usize| match SpliceBuf::pays(n) {
                true => SpliceBuf::new(n).map(Some).map_err(map),
                false => Ok(None),
            };
            match self.dec.decode_into(&path, at, raw, frozen, &mut buf)? {
                Some(b) => {
                    if let Some(spares) = self.spares {
                        spares.put(buf);
                    }
                    GroupBuf::Frozen(b.freeze().map_err(map)?)
                }
                None => GroupBuf::Heap(buf),
            }
        } else {
            self.dec.decode(&path, at, raw, &mut buf)?;
            GroupBuf::Heap(buf)
        });
        k.key = key;
        k.path = path;
        k.used = self.clock;
        if let Some(d) = self.decoded {
            d.put(key, &k.data, &k.path);
        }
        // (What was prefetched was counted when it was read.)
        let read = if prefetched { 0 } else { u64::from(loc.len) };
        Ok((slot, read))
    }

    /// Append chunk `id` (`len` bytes, at image `offset`) to `out`;
    /// returns the bytes read from its pack (0 when its group was decoded
    /// already).
    pub fn fetch(&mut self, id: &ChunkId, len: u32, offset: u64, out: &mut Vec<u8>) -> Result<u64> {
        let (data, read) = self.chunk(id, len, offset)?;
        out.extend_from_slice(data);
        Ok(read)
    }

    /// Chunk `id` (`len` bytes, at image offset `offset`, for messages),
    /// checked against its id, where it lies in its decoded group (valid
    /// until the next call), and the stored bytes read for it.
    pub fn chunk(&mut self, id: &ChunkId, len: u32, offset: u64) -> Result<(&[u8], u64)> {
        let (group, start, read) = self.checked(id, len, offset)?;
        Ok((&group.data[start..start + len as usize], read))
    }

    /// As [`Fetcher::chunk`]: the decoded group chunk `id` lies in (shared:
    /// held on to, it stays as it is) and where in it.
    fn shared_chunk(
        &mut self,
        id: &ChunkId,
        len: u32,
        offset: u64,
    ) -> Result<(&Arc<GroupBuf>, usize, u64)> {
        let (group, start, read) = self.checked(id, len, offset)?;
        Ok((&group.data, start, read))
    }

    /// The kept group chunk `id` is in, checked against its id, the
    /// chunk's start in it and the stored bytes read for it. Where the
    /// copy the index names is damaged or cannot be read, the chunk's
    /// other copies are tried ([`ChunkIndex::other_copies`]), as restic
    /// tries every pack that holds a blob; only if none is sound is it the
    /// first copy's error.
    fn checked(&mut self, id: &ChunkId, len: u32, offset: u64) -> Result<(&Kept, usize, u64)> {
        let loc = self
            .index
            .get(id)
            .ok_or(StoreError::MissingChunk { chunk: *id, offset })?;
        // (A record found damaged before goes straight to the copies.)
        let known = match self.damaged.is_empty() {
            true => None,
            false => self.damaged.get(&(loc.pack, loc.offset)).cloned(),
        };
        let first = match known {
            None => Some(self.checked_at(loc, id, len)),
            Some(_) => None,
        };
        let (slot, start, read) = match first {
            Some(Ok(found)) => found,
            first => {
                let (why, unread) = match (&first, known) {
                    (Some(Err(err)), _) => (err.to_string(), err.is_read_failure()),
                    (_, why) => why.unwrap_or_default(),
                };
                match (self.other_copy(loc, id, len, &why, unread), first) {
                    (Some(found), _) => found,
                    (None, Some(Err(err))) => return Err(err),
                    // No other copy is sound: the first copy's error, read
                    // anew (or the chunk, if it is only its record's
                    // other chunks that are damaged).
                    (None, _) => self.checked_at(loc, id, len)?,
                }
            }
        };
        Ok((&self.kept[slot], start, read))
    }

    /// Chunk `id` from its record at `loc`: the kept slot, the chunk's
    /// start in it and the bytes read.
    fn checked_at(&mut self, loc: Location, id: &ChunkId, len: u32) -> Result<(usize, usize, u64)> {
        let files = self.files;
        let (slot, read) = self.group(loc).inspect_err(|e| {
            // The whole record is unusable: its other chunks go straight
            // to their other copies.
            self.damaged
                .insert((loc.pack, loc.offset), (e.to_string(), e.is_read_failure()));
        })?;
        let group = &self.kept[slot];
        let (s, e) = (loc.slice as usize, loc.slice as usize + len as usize);
        let Some(data) = group.data.get(s..e) else {
            return Err(StoreError::BadChunk {
                chunk: *id,
                path: group.path.clone(),
                offset: u64::from(loc.offset),
                reason: format!(
                    "{len} bytes at {s} run past the end of a {}-byte group",
                    group.data.len()
                ),
            });
        };
        check_chunk(files.crypt(), &group.path, u64::from(loc.offset), id, data)?;
        Ok((slot, s, read))
    }

    /// The first sound other copy of chunk `id`, whose copy at `first`
    /// failed with `why` (`unread`: an I/O error); says so, once per
    /// record.
    fn other_copy(
        &mut self,
        first: Location,
        id: &ChunkId,
        len: u32,
        why: &str,
        unread: bool,
    ) -> Option<(usize, usize, u64)> {
        let (index, said, files) = (self.index, self.said.clone(), self.files);
        let found = said.from_other_copy(
            index,
            id.prefix(),
            first,
            |other| self.checked_at(other, id, len).ok(),
            |other| {
                let path = files.path(other.pack).unwrap_or_default();
                tracing::warn!("{}", other_copy_note(why, unread, id, &path, other.offset));
            },
        )?;
        self.recovered += 1;
        Some(found)
    }
}

/// The warning that chunk `id`, whose copy the index names failed with
/// `why`, was read from its other copy at `offset` of `path`: damage is
/// for `cairn repair`, a read that failed (`unread`) is not.
fn other_copy_note(why: &str, unread: bool, id: &ChunkId, path: &Path, offset: u32) -> String {
    let path = path.display();
    match unread {
        true => format!(
            "{why}: could not be read (I/O error), so chunk {id} was read from its other copy \
             in {path} at offset {offset}"
        ),
        false => format!(
            "{why}; chunk {id} read from its other copy in {path} at offset {offset} (`cairn \
             repair` has the index use the sound copies)"
        ),
    }
}

/// Restore `manifest` (whose chunks `index` locates) into `dest`.
pub fn restore(
    repo: &Repository,
    index: &ChunkIndex,
    manifest: &Manifest,
    dest: Destination,
    opts: &RestoreOptions,
) -> Result<RestoreReport> {
    let started = Instant::now();
    let files = PackReader::new(repo, index);
    // (A pipe is handed its batches by `splice_batch`, with nothing kept
    // back to flush.)
    let (positional, zeroed, mut stream, pipe) = match dest {
        Destination::At { file, zeroed } => (Some(file), zeroed, None, None),
        Destination::Stream(w) => (None, false, Some(w), None),
        Destination::Pipe(p) => (None, false, None, Some(p)),
    };
    let mut extents = manifest.with_offsets().peekable();
    // A hole longer than a batch is cut into batch-sized pieces so that a
    // stream never holds more than a batch of zeros.
    let mut hole_left: Option<(u64, u64)> = None;
    // From a remote store into a file, batches are longer: a batch holds
    // no bytes then (its chunks are written where they go), and the
    // longer it is, the more of a pack's records one span fetches.
    let remote = files.reads_per_core() > 1;
    let long_batches = remote && positional.is_some();
    // A remote store is kept busy by several requests in flight per core
    // (into a file: by a few long batches, see REMOTE_BATCH).
    let workers = if long_batches {
        opts.threads.max(1) * REMOTE_WORKERS_PER_CORE
    } else {
        opts.threads.max(1) * files.reads_per_core()
    };
    let (batch, max_extents) = if long_batches {
        // As long as can be, but every worker gets one: a worker decodes
        // only once its GETs are in, so fewer batches than workers would
        // leave cores idle (os.img, 256 MiB, took 1.18x the time in
        // batches of 128 MiB than in the earlier 64 MiB, paired).
        let data: u64 = manifest
            .extents
            .iter()
            .map(|e| match e {
                Extent::Data { len, .. } => u64::from(*len),
                Extent::Hole { .. } => 0,
            })
            .sum();
        let batch = (data / workers as u64).clamp(BATCH, REMOTE_BATCH);
        (batch, MAX_BATCH_EXTENTS * (batch / BATCH) as usize)
    } else {
        (BATCH, MAX_BATCH_EXTENTS)
    };
    // The record a data extent's chunk is in.
    let record = |e: &Extent| match e {
        Extent::Data { id, .. } => index.get(id).map(|l| (l.pack, l.offset)),
        Extent::Hole { .. } => None,
    };
    let source = |w: &mut Work| -> Result<Fill> {
        let mut size = 0u64;
        // The last chunk taken (its record is looked up once full).
        let mut last: Option<Extent> = None;
        loop {
            if size >= batch || w.extents.len() >= max_extents {
                let last = last.as_ref().and_then(record);
                // Full; but a batch ends where a record does: each worker
                // decodes the records of its batch, and a group cut in two
                // was decoded by two workers (os2.img: a third more bytes
                // read and decoded than the repository holds). So the rest
                // of the last chunk's record, and the zero runs between
                // its pieces, come along (up to twice the batch).
                let more = match (extents.peek(), hole_left) {
                    _ if last.is_none() || size >= 2 * batch => false,
                    (_, Some((_, left))) => left < ZERO_RUN_IN_GROUP,
                    (Some((_, e)), None) => match e {
                        Extent::Hole { len } => *len < ZERO_RUN_IN_GROUP,
                        data => record(data) == last,
                    },
                    (None, None) => false,
                };
                if !more || w.extents.len() >= 2 * max_extents {
                    break;
                }
            }
            if let Some((off, left)) = hole_left.take() {
                // (Past a full batch only a short hole comes along, whole.)
                let piece = if positional.is_some() || size >= batch {
                    left
                } else {
                    left.min(batch - size)
                };
                w.extents.push((off, Extent::Hole { len: piece }));
                if positional.is_none() {
                    size += piece;
                }
                if piece < left {
                    hole_left = Some((off + piece, left - piece));
                }
                continue;
            }
            let Some((off, e)) = extents.next() else {
                break;
            };
            match *e {
                Extent::Hole { len } => hole_left = Some((off, len)),
                Extent::Data { len, .. } => {
                    w.extents.push((off, *e));
                    size += u64::from(len);
                    last = Some(*e);
                }
            }
        }
        Ok(if w.extents.is_empty() {
            Fill::End
        } else {
            Fill::Item
        })
    };
    // Files and devices are written past the page cache where they allow
    // it: the restored image is fsync'd before the restore returns, so the
    // cache would only add a copy per byte, and a big restore would evict
    // the machine's working set.
    let direct = positional.and_then(reopen_direct);
    // Their whole blocks are written by one thread while the workers
    // decode on (see `WriteBehind`).
    let behind = direct
        .as_ref()
        .map(|_| WriteBehind::new(WRITE_BEHIND_SPARE));
    // A remote store is read in spans of neighbouring records.
    let spans = remote;
    let spares = Spares::default();
    let decoded = Decoded::default();
    let said = Arc::<DamagedRecords>::default();
    let make_worker = || {
        let mut fetcher = Fetcher::new(&files, index).sharing_warnings(&said);
        fetcher.spares = Some(&spares);
        fetcher.decoded = Some(&decoded);
        fetcher.frozen = pipe.is_some();
        // What a damaged chunk is written as into a file, with
        // --zero-damaged.
        let mut zeros = Vec::new();
        let mut run = positional.map(|f| Run::new(f, direct.as_ref(), behind.as_ref()));
        move |w: &mut Work, out: &mut Out| -> Result<()> {
            if spans {
                // Counted as read here; the records are then found fetched.
                out.stored += fetcher.prefetch(&w.extents)?;
            }
            for &(off, e) in &w.extents {
                match e {
                    Extent::Hole { len } => {
                        out.done += len;
                        match positional {
                            Some(f) => {
                                if let Some(run) = run.as_mut() {
                                    run.flush()?;
                                }
                                if !zeroed {
                                    write_zeros(f, off, len)?;
                                }
                            }
                            None => out.push_zeros(len),
                        }
                    }
                    Extent::Data { len, id } => {
                        out.done += u64::from(len);
                        // The chunk goes from its decoded group straight
                        // to the file's run, or into the stream's batch
                        // by reference.
                        let damaged = |err: StoreError, out: &mut Out| {
                            if !opts.zero_damaged {
                                return Err(with_image_offset(err, off));
                            }
                            out.damaged.push(Damaged {
                                offset: off,
                                len: u64::from(len),
                                chunks: vec![id],
                                reason: err.to_string(),
                            });
                            Ok(())
                        };
                        match run.as_mut() {
                            Some(run) => match fetcher.chunk(&id, len, off) {
                                Ok((data, stored)) => {
                                    out.stored += stored;
                                    run.push(off, data)?;
                                }
                                Err(err) => {
                                    damaged(err, out)?;
                                    zeros.resize(len as usize, 0);
                                    run.push(off, &zeros[..len as usize])?;
                                }
                            },
                            None => match fetcher.shared_chunk(&id, len, off) {
                                Ok((group, start, stored)) => {
                                    out.stored += stored;
                                    out.push_group(group, start, len as usize);
                                }
                                Err(err) => {
                                    damaged(err, out)?;
                                    out.push_zeros(u64::from(len));
                                }
                            },
                        }
                    }
                }
            }
            if let Some(run) = run.as_mut() {
                run.flush()?;
            }
            out.recovered += fetcher.take_recovered();
            Ok(())
        }
    };
    let mut report = RestoreReport::default();
    let ran = std::thread::scope(|scope| {
        if let (Some(wb), Some(d), Some(f)) = (&behind, &direct, positional) {
            scope.spawn(move || wb.run(d, f));
        }
        let ran = cairn_pipeline::run(
            Config::new(workers),
            source,
            make_worker,
            |slot: &mut Slot<Work, Out>| {
                match (pipe, stream.as_mut()) {
                    (Some(p), _) => splice_batch(p, &slot.output, report.size)?,
                    (None, Some(w)) => write_batch(w, &slot.output, report.size)?,
                    (None, None) => {}
                }
                report.size += slot.output.done;
                report.stored_read += slot.output.stored;
                report.damaged.append(&mut slot.output.damaged);
                report.recovered += slot.output.recovered;
                if let Some(p) = opts.progress {
                    p(report.size);
                }
                Ok(())
            },
            |slot: &mut Slot<Work, Out>| {
                slot.input.extents.clear();
                spares.give_back(&mut slot.output.pieces);
                slot.output.clear();
            },
        );
        // Every run is handed over once the workers are done.
        if let Some(wb) = &behind {
            wb.close();
        }
        ran
    });
    // A failed write is the cause of whatever the workers said after it.
    if let Some(err) = behind.and_then(WriteBehind::into_error) {
        return Err(err);
    }
    ran?;
    if let Some(w) = stream {
        w.flush().map_err(|e| StoreError::Dest {
            offset: report.size,
            source: e,
        })?;
    }
    report.damaged = merge_damaged(std::mem::take(&mut report.damaged));
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Runs shorter than this are written through the page cache even where
/// the destination takes `O_DIRECT`: a short direct write waits for the
/// disk on its own, and the runs between a memory dump's zero pages (holes
/// that restore skips) are a few pages each; the page cache gathers them
/// into large writes (a 512 MiB image with 30 % of its pages zero, at
/// random: 1.19-1.30 s with every run direct, 0.87-0.99 s so).
const DIRECT_MIN: usize = 256 << 10;

/// Consecutive restored bytes gathered before they are written: the whole
/// blocks in the middle go out with `O_DIRECT` in one call (from
/// [`DIRECT_MIN`] on), the partial blocks at either end (shared with the
/// neighbouring batches, which other workers write) through the buffered
/// handle.
struct Run<'a> {
    file: &'a File,
    direct: Option<&'a File>,
    behind: Option<&'a WriteBehind>,
    buf: cairn_blockdev::AlignedBuf,
    /// Image offset of the first byte, held at `buf[lead..]`.
    start: u64,
    lead: usize,
    len: usize,
}

impl<'a> Run<'a> {
    fn new(file: &'a File, direct: Option<&'a File>, behind: Option<&'a WriteBehind>) -> Self {
        Run {
            file,
            direct,
            behind,
            buf: run_buffer(),
            start: 0,
            lead: 0,
            len: 0,
        }
    }

    /// Add `bytes`, which belong at image offset `off`.
    fn push(&mut self, off: u64, mut bytes: &[u8]) -> Result<()> {
        let mut off = off;
        while !bytes.is_empty() {
            if self.len > 0 && off != self.start + self.len as u64 {
                self.flush()?;
            }
            if self.len == 0 {
                self.start = off;
                self.lead = (off % DIRECT_ALIGN as u64) as usize;
            }
            let room = self.buf.as_slice().len() - self.lead - self.len;
            if room == 0 {
                self.flush()?;
                continue;
            }
            let k = room.min(bytes.len());
            let at = self.lead + self.len;
            self.buf.as_mut_slice()[at..at + k].copy_from_slice(&bytes[..k]);
            self.len += k;
            off += k as u64;
            bytes = &bytes[k..];
        }
        Ok(())
    }

    /// Write what is gathered, or hand it to the writer.
    fn flush(&mut self) -> Result<()> {
        let (start, lead, len) = (self.start, self.lead, std::mem::take(&mut self.len));
        if len == 0 {
            return Ok(());
        }
        match self.behind {
            // A run with blocks to write directly goes to the writer whole
            // (its partial blocks too: written here, they would wait on
            // the file's lock for the writer's direct write). A short one
            // only copies into the page cache: the worker does that, so
            // the many short runs of a memory dump's restore are written
            // on every core (a 512 MiB image with 30 % of its pages zero
            // at random, paired: 0.64 s when the writer took them all,
            // 0.61 s so, 0.60 s before there was a writer).
            Some(wb) if direct_body(start, len) >= DIRECT_MIN => {
                wb.check(start)?;
                let full = std::mem::take(&mut self.buf);
                self.buf = wb.hand(full, lead, len, start);
                Ok(())
            }
            _ => {
                let data = &self.buf.as_slice()[lead..lead + len];
                write_run(self.file, self.direct, data, start)
            }
        }
    }
}

/// The whole blocks of `len` bytes at `start`: their length.
fn direct_body(start: u64, len: usize) -> usize {
    let lead = (start % DIRECT_ALIGN as u64) as usize;
    let head = ((DIRECT_ALIGN - lead) % DIRECT_ALIGN).min(len);
    (len - head) / DIRECT_ALIGN * DIRECT_ALIGN
}

/// Write `data`, restored bytes that belong at `start`, lying in an
/// aligned buffer at `start`'s offset within a block: its whole blocks in
/// one call through `direct` (from [`DIRECT_MIN`] on), the partial blocks
/// at either end (shared with the neighbouring runs) through `file`.
fn write_run(file: &File, direct: Option<&File>, data: &[u8], start: u64) -> Result<()> {
    let dest = |at: u64| {
        move |e| StoreError::Dest {
            offset: at,
            source: e,
        }
    };
    let len = data.len();
    let lead = (start % DIRECT_ALIGN as u64) as usize;
    let head = ((DIRECT_ALIGN - lead) % DIRECT_ALIGN).min(len);
    let body = direct_body(start, len);
    match direct {
        Some(d) if body >= DIRECT_MIN => {
            let (mid, tail) = (start + head as u64, start + (head + body) as u64);
            file.write_all_at(&data[..head], start)
                .map_err(dest(start))?;
            write_blocks_at(d, file, &data[head..head + body], mid).map_err(dest(mid))?;
            file.write_all_at(&data[head + body..], tail)
                .map_err(dest(tail))
        }
        _ => file.write_all_at(data, start).map_err(dest(start)),
    }
}

/// A [`Run`]'s buffer: a batch, aligned for `O_DIRECT`.
fn run_buffer() -> cairn_blockdev::AlignedBuf {
    cairn_blockdev::AlignedBuf::new(BATCH as usize + DIRECT_ALIGN, DIRECT_ALIGN)
}

/// Buffers of whole blocks that may wait for the writer beyond the one
/// each worker fills. Two let the writer take one while a worker hands
/// over the next, but a direct write into new blocks of a file sometimes
/// waits on ext4's allocation, and the workers then wait for a buffer:
/// os2.img into a new file, paired in one run (`bench/restore-zstd.py
/// --dest file`, 7 rounds, medians, `bench/runs/2026-11-27-restore-zstd-6`):
/// 0.387 s with 2, 0.358 with 4, 0.348 with 6, 0.362 with 12. 32 MiB more
/// memory while restoring into a file.
const WRITE_BEHIND_SPARE: usize = 6;

/// One thread that writes the workers' runs (as [`write_run`]: whole
/// blocks with `O_DIRECT`, the partial ones at the ends through the page
/// cache), in the order they come, while the workers decode on; a worker
/// hands over its full buffer and goes on with a free one.
///
/// Why one thread, not a write from each worker or a deep io_uring queue
/// (measured on ext4 on this VM's disk, os2.img restored from tmpfs, 2
/// cores): each worker writing its own runs left its core idle for the
/// write (0.14 s of 0.41 s per worker in `pwrite`); two workers per core
/// did not overlap them, because ext4 serialises writes into a file's
/// unallocated blocks (0.60 s in `pwrite` in all, against 0.32); a worker
/// that still wrote the partial blocks at its runs' ends itself waited
/// for the writer's direct writes on the same lock (0.05 s per worker);
/// and one 8 MiB write at a time already reaches the disk's speed (fio,
/// 8 MiB direct writes: 2.3-2.7 GB/s at depths 1, 4 and 16 alike).
struct WriteBehind {
    jobs: (Sender<Option<Job>>, Receiver<Option<Job>>),
    free: (Sender<AlignedBuf>, Receiver<AlignedBuf>),
    /// The first write that failed; nothing is written after it.
    failed: Mutex<Option<StoreError>>,
}

/// `buf[at..at + len]`, a run, to be written at `offset` (`at` is
/// `offset`'s place within a block).
struct Job {
    buf: AlignedBuf,
    at: usize,
    len: usize,
    offset: u64,
}

impl WriteBehind {
    fn new(spare: usize) -> Self {
        let free = unbounded();
        for _ in 0..spare {
            let _ = free.0.send(run_buffer());
        }
        WriteBehind {
            jobs: unbounded(),
            free,
            failed: Mutex::new(None),
        }
    }

    /// The writer's loop, until [`WriteBehind::close`].
    fn run(&self, direct: &File, buffered: &File) {
        while let Ok(Some(job)) = self.jobs.1.recv() {
            // Not held while writing: the workers' checks would wait.
            if self.lock().is_none() {
                let run = &job.buf.as_slice()[job.at..job.at + job.len];
                if let Err(e) = write_run(buffered, Some(direct), run, job.offset) {
                    *self.lock() = Some(e);
                }
            }
            let _ = self.free.0.send(job.buf);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<StoreError>> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An error if a write has failed (the restore stops).
    fn check(&self, offset: u64) -> Result<()> {
        if self.lock().is_some() {
            return Err(StoreError::Dest {
                offset,
                source: std::io::Error::other("an earlier direct write failed"),
            });
        }
        Ok(())
    }

    /// Hand `buf[at..at + len]` over to be written at `offset`; returns a
    /// free buffer (waiting for one when all are queued).
    fn hand(&self, buf: AlignedBuf, at: usize, len: usize, offset: u64) -> AlignedBuf {
        // Both ends of both channels live in `self`: neither call can fail.
        // Sent first: with no spare the writer gives this very buffer back.
        let _ = self.jobs.0.send(Some(Job {
            buf,
            at,
            len,
            offset,
        }));
        self.free.1.recv().unwrap_or_else(|_| run_buffer())
    }

    /// No more jobs: the writer ends once it has written the queued ones.
    fn close(&self) {
        let _ = self.jobs.0.send(None);
    }

    fn into_error(self) -> Option<StoreError> {
        self.failed.into_inner().unwrap_or_else(|p| p.into_inner())
    }
}

/// Merge neighbouring damaged ranges with the same cause (the chunks of
/// one lost group) into one.
fn merge_damaged(mut v: Vec<Damaged>) -> Vec<Damaged> {
    v.sort_by_key(|d| d.offset);
    let mut out: Vec<Damaged> = Vec::with_capacity(v.len());
    for d in v {
        match out.last_mut() {
            Some(last) if last.offset + last.len == d.offset && last.reason == d.reason => {
                last.len += d.len;
                last.chunks.extend(d.chunks);
            }
            _ => out.push(d),
        }
    }
    out
}

/// Write a stream's batch that starts at image offset `at`: its pieces,
/// [`MAX_IOV`] slices per `writev`.
fn write_batch(w: &mut dyn Write, out: &Out, at: u64) -> Result<()> {
    let mut offset = at;
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(out.pieces.len().min(MAX_IOV));
    for piece in &out.pieces {
        match piece {
            Piece::Group { data, start, len } => {
                slices.push(IoSlice::new(&data[*start..*start + *len]))
            }
            Piece::Copied { start, len } => {
                slices.push(IoSlice::new(&out.bytes[*start..*start + *len]))
            }
            Piece::Zeros(n) => {
                for z in zero_pieces(*n) {
                    if slices.len() == MAX_IOV {
                        write_slices(w, &mut slices, &mut offset)?;
                    }
                    slices.push(IoSlice::new(z));
                }
            }
        }
        if slices.len() == MAX_IOV {
            write_slices(w, &mut slices, &mut offset)?;
        }
    }
    write_slices(w, &mut slices, &mut offset)
}

/// Hand a batch that starts at image offset `at` to pipe `pipe`: the
/// frozen groups and zeros by reference, what was copied into the batch
/// (and the groups not frozen) written, each run of either kind in as few
/// calls as it takes.
fn splice_batch(pipe: &File, out: &Out, at: u64) -> Result<()> {
    let mut offset = at;
    let mut parts: Vec<Spliced<'_>> = Vec::new();
    let mut slices: Vec<IoSlice<'_>> = Vec::new();
    let mut w = pipe;
    // Hand over what is gathered of the other kind first.
    let splice = |parts: &mut Vec<Spliced<'_>>, offset: &mut u64| {
        let r = splice_all(pipe, parts, offset);
        parts.clear();
        r.map_err(|source| StoreError::Dest {
            offset: *offset,
            source,
        })
    };
    for piece in &out.pieces {
        let bytes = match piece {
            Piece::Group { data, start, len } => match &**data {
                GroupBuf::Frozen(b) => {
                    write_slices(&mut w, &mut slices, &mut offset)?;
                    parts.push(b.range(*start, *len));
                    continue;
                }
                GroupBuf::Heap(v) => &v[*start..*start + *len],
            },
            Piece::Zeros(n) => {
                if let Some(zeros) = Spliced::zeros(*n) {
                    write_slices(&mut w, &mut slices, &mut offset)?;
                    parts.extend(zeros);
                    continue;
                }
                splice(&mut parts, &mut offset)?;
                for z in zero_pieces(*n) {
                    if slices.len() == MAX_IOV {
                        write_slices(&mut w, &mut slices, &mut offset)?;
                    }
                    slices.push(IoSlice::new(z));
                }
                continue;
            }
            Piece::Copied { start, len } => &out.bytes[*start..*start + *len],
        };
        if bytes.is_empty() {
            continue;
        }
        splice(&mut parts, &mut offset)?;
        if slices.len() == MAX_IOV {
            write_slices(&mut w, &mut slices, &mut offset)?;
        }
        slices.push(IoSlice::new(bytes));
    }
    write_slices(&mut w, &mut slices, &mut offset)?;
    splice(&mut parts, &mut offset)
}

/// Write all of `slices` (emptied), counting `offset` on.
fn write_slices(w: &mut dyn Write, slices: &mut Vec<IoSlice<'_>>, offset: &mut u64) -> Result<()> {
    let mut left = &mut slices[..];
    while !left.is_empty() {
        match w.write_vectored(left) {
            Ok(0) => {
                return Err(StoreError::Dest {
                    offset: *offset,
                    source: std::io::ErrorKind::WriteZero.into(),
                })
            }
            Ok(n) => {
                *offset += n as u64;
                IoSlice::advance_slices(&mut left, n);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(StoreError::Dest {
                    offset: *offset,
                    source: e,
                })
            }
        }
    }
    slices.clear();
    Ok(())
}

/// `len` zeros as slices of [`ZEROS`].
fn zero_pieces(len: u64) -> impl Iterator<Item = &'static [u8]> {
    let step = ZEROS.len() as u64;
    (0..len.div_ceil(step)).map(move |k| &ZEROS[..(len - k * step).min(step) as usize])
}

fn write_zeros(f: &File, off: u64, len: u64) -> Result<()> {
    let mut at = off;
    zero_pieces(len).try_for_each(|piece| {
        f.write_all_at(piece, at).map_err(|e| StoreError::Dest {
            offset: at,
            source: e,
        })?;
        at += piece.len() as u64;
        Ok(())
    })
}

/// Name the image offset in a chunk error that lacks it.
pub(crate) fn with_image_offset(err: StoreError, offset: u64) -> StoreError {
    match err {
        StoreError::MissingChunk { .. } => err,
        other => StoreError::InImage {
            offset,
            source: Box::new(other),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chunk stored twice whose copy the index uses cannot be read (an
    /// EIO, the whole pack or only that record's bytes): restore reads
    /// its other copy, the image comes back byte for byte, and the
    /// chunks so read are counted (`chunks_from_other_copies`).
    #[test]
    fn a_chunk_whose_copy_cannot_be_read_is_restored_from_its_other_copy() {
        let (r, used, id) = crate::faults::stored_twice();
        let loaded = r.repo.load_index().unwrap();
        let n = loaded.index.pack_number(&id).unwrap();
        let (_, rec) = loaded.index.locations().find(|(_, l)| l.pack == n).unwrap();
        // The whole pack: every chunk the image has in it.
        r.faults.fail(&used);
        for name in ["a", "b"] {
            let (out, report) = r.restore(name).unwrap();
            assert!(out == r.data, "{name} differs");
            assert!(report.recovered > 0, "{name}: {report:?}");
        }
        assert!(r.faults.injected() > 0, "the fault was met");
        // One record's bytes (its pack's header reads): that chunk only.
        r.faults.clear();
        let start = u64::from(rec.offset);
        r.faults
            .fail_range(&used, start..start + u64::from(rec.len));
        let met = r.faults.injected();
        let (out, report) = r.restore("a").unwrap();
        assert!(out == r.data, "a differs");
        assert_eq!(report.recovered, 1, "{report:?}");
        assert!(r.faults.injected() > met, "the fault was met");
    }

    /// The warning of a chunk read from its other copy sends to `cairn
    /// repair` only where the first copy is damaged; one that could not
    /// be read (EIO, as the fault backend fails it) is said to be so.
    #[test]
    fn the_other_copy_warning_tells_a_failed_read_from_damage() {
        let path = Path::new("p");
        let eio = StoreError::Io {
            path: path.into(),
            what: "read",
            source: std::io::Error::from_raw_os_error(libc::EIO),
        };
        let bad = StoreError::corrupt(path, 7, "bad CRC");
        let id = ChunkId([1; 32]);
        let note =
            |e: &StoreError| other_copy_note(&e.to_string(), e.is_read_failure(), &id, path, 9);
        let (eio, bad) = (note(&eio), note(&bad));
        assert!(eio.contains("could not be read (I/O error)"), "{eio}");
        assert!(!eio.contains("repair"), "{eio}");
        assert!(bad.contains("`cairn repair` has the index use"), "{bad}");
        assert!(!bad.contains("could not be read"), "{bad}");
    }

    /// Pieces at odd offsets and lengths, with gaps, across the run
    /// buffer's size: the file holds exactly them, written through
    /// `O_DIRECT` (when the filesystem allows it) or not.
    #[test]
    fn runs_write_exactly_their_bytes_direct_or_not() {
        let size = 3 * BATCH + 50_000;
        let data: Vec<u8> = (0..size as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8 | 1)
            .collect();
        // (offset, length) pieces; the gaps between them stay zero.
        let mut pieces = Vec::new();
        let mut off = 1usize;
        for (i, len) in [1, 4095, 4096, 4097, 70_000, BATCH as usize + 3, 12, 9000]
            .iter()
            .cycle()
            .enumerate()
        {
            if off + len > size as usize {
                break;
            }
            pieces.push((off, *len));
            off += len + if i % 3 == 0 { 0 } else { 777 };
        }
        for (use_direct, use_behind) in [(true, true), (true, false), (false, false)] {
            let file = tempfile::tempfile().unwrap();
            file.set_len(size).unwrap();
            let direct = if use_direct {
                let d = reopen_direct(&file);
                if std::env::var_os("CI").is_some() {
                    assert!(d.is_some(), "O_DIRECT refused on the CI machine's /tmp");
                }
                d
            } else {
                None
            };
            // A spare of 0: every hand-over waits for the writer to give a
            // buffer back, the tightest the pool can be.
            let behind = use_behind.then(|| WriteBehind::new(0));
            std::thread::scope(|scope| {
                if let (Some(wb), Some(d)) = (&behind, &direct) {
                    scope.spawn(|| wb.run(d, &file));
                }
                let mut run = Run::new(&file, direct.as_ref(), behind.as_ref());
                for &(off, len) in &pieces {
                    run.push(off as u64, &data[off..off + len]).unwrap();
                }
                run.flush().unwrap();
                if let Some(wb) = &behind {
                    wb.close();
                }
            });
            assert!(behind.and_then(WriteBehind::into_error).is_none());
            let mut want = vec![0u8; size as usize];
            for &(off, len) in &pieces {
                want[off..off + len].copy_from_slice(&data[off..off + len]);
            }
            let mut got = vec![0u8; size as usize];
            file.read_exact_at(&mut got, 0).unwrap();
            assert!(got == want, "direct: {}", direct.is_some());
        }
    }

    /// A group as a reusable buffer and as frozen memory for a pipe.
    fn both_kinds(bytes: &[u8]) -> [Arc<GroupBuf>; 2] {
        let mut b = SpliceBuf::new(bytes.len()).unwrap();
        b.as_mut_slice().copy_from_slice(bytes);
        [
            Arc::new(GroupBuf::Heap(bytes.to_vec())),
            Arc::new(GroupBuf::Frozen(b.freeze().unwrap())),
        ]
    }

    /// What a reader of a pipe gets of `out` handed over by `splice_batch`.
    fn spliced(out: &Out) -> Vec<u8> {
        let (rd, wr) = rustix::pipe::pipe().unwrap();
        let mut rd = File::from(rd);
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            std::io::Read::read_to_end(&mut rd, &mut got).unwrap();
            got
        });
        let wr = File::from(wr);
        splice_batch(&wr, out, 0).unwrap();
        drop(wr);
        reader.join().unwrap()
    }

    /// A stream's batch is written as its pieces say: groups' bytes,
    /// copies and zeros, in order; into a pipe too, whether its groups
    /// are frozen (spliced) or not (written).
    #[test]
    fn a_streams_batch_has_its_zeros_put_back_where_they_were() {
        for group in both_kinds(&(1..=200u8).collect::<Vec<u8>>()) {
            batch_of_one_group(&group);
        }
    }

    fn batch_of_one_group(group: &Arc<GroupBuf>) {
        let mut out = Out::default();
        let mut want = Vec::new();
        // Zeros first, twice in a row, longer than the zero buffer, and
        // last; pieces of one group in and out of order.
        let big = ZEROS.len() as u64 * 2 + 3;
        for (zeros, start, len) in [
            (5, 0, 10),
            (1, 10, 90),
            (2, 100, 3),
            (big, 50, 100),
            (7, 0, 0),
        ] {
            out.push_zeros(zeros);
            want.resize(want.len() + zeros as usize, 0);
            out.push_group(group, start, len);
            want.extend_from_slice(&group[start..start + len]);
        }
        // One group held however many of its chunks the batch takes.
        assert_eq!(out.pins.len(), 1);
        let mut got = Vec::new();
        write_batch(&mut got, &out, 0).unwrap();
        assert_eq!(got.len(), want.len());
        assert!(got == want);
        // A writer that takes a few bytes per call gets all of them.
        let mut slow = Trickle(Vec::new());
        write_batch(&mut slow, &out, 0).unwrap();
        assert!(slow.0 == want);
        assert!(spliced(&out) == want);
    }

    /// A writer that takes at most 7 bytes per call, of one slice.
    struct Trickle(Vec<u8>);

    impl Write for Trickle {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            let n = b.len().min(7);
            self.0.extend_from_slice(&b[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Past its limits a batch copies the chunks of further groups instead
    /// of holding them; the bytes written are the same, and more slices
    /// than one `writev` takes go out in several.
    #[test]
    fn a_batch_holds_few_groups_and_copies_the_rest() {
        let groups: Vec<Arc<GroupBuf>> = (0..3 * MAX_PINS)
            .map(|g| {
                let bytes: Vec<u8> = (0..5000u32).map(|i| (i * 7 + g as u32) as u8).collect();
                let [heap, frozen] = both_kinds(&bytes);
                if g % 2 == 0 {
                    heap
                } else {
                    frozen
                }
            })
            .collect();
        let mut out = Out::default();
        let mut want = Vec::new();
        for (k, g) in groups.iter().enumerate() {
            for piece in 0..4 {
                // Out of order within the group: pieces that do not merge.
                let start = (3 - piece) * 1000 + k % 7;
                out.push_group(g, start, 999);
                want.extend_from_slice(&g[start..start + 999]);
                out.push_zeros(1 + (k % 3) as u64);
                want.resize(want.len() + 1 + k % 3, 0);
            }
        }
        assert_eq!(out.pins.len(), MAX_PINS);
        assert!(out.pinned <= PIN_LIMIT);
        assert_eq!(out.bytes.len(), (3 * MAX_PINS - MAX_PINS) * 4 * 999);
        assert!(out.pieces.len() > MAX_IOV);
        let mut got = Vec::new();
        write_batch(&mut got, &out, 0).unwrap();
        assert!(got == want);
        // Into a pipe: frozen groups spliced, the others and the copies
        // written, in order.
        assert!(spliced(&out) == want);
        // Letting go of the batch leaves the groups to their owner alone.
        out.clear();
        assert!(groups.iter().all(|g| Arc::strong_count(g) == 1));
    }

    /// A worker needing a group another worker holds takes it, reading
    /// nothing; once no one holds it, it is read and decoded again.
    #[test]
    fn workers_share_the_groups_they_hold() {
        let dir = tempfile::tempdir().unwrap();
        let r = Repository::init(&dir.path().join("repo"), &[], None).unwrap();
        let mut x = 7u64;
        let data: Vec<u8> = (0..3 << 20)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 59) as u8
            })
            .collect();
        let lock = r.session("test").unwrap();
        let opts = crate::BackupOptions {
            name: "img".into(),
            codec: "lz4".parse().unwrap(),
            chunker: crate::ChunkerSpec::Fixed(65536),
            threads: 1,
            group_size: 1 << 20,
            source: "test".into(),
            progress: None,
            time: None,
            tags: Vec::new(),
        };
        crate::backup(&r, &lock, &mut std::io::Cursor::new(data.clone()), &opts).unwrap();
        let m = r.read_manifest("img", 1).unwrap();
        let index = r.load_index().unwrap().index;
        let files = PackReader::new(&r, &index);
        let (spares, decoded) = (Spares::default(), Decoded::default());
        let worker = || {
            let mut f = Fetcher::new(&files, &index);
            f.spares = Some(&spares);
            f.decoded = Some(&decoded);
            f
        };
        let (mut a, mut b) = (worker(), worker());
        let (off, &Extent::Data { id, len }) = m.with_offsets().next().unwrap() else {
            panic!("the image starts with data");
        };
        let (got, read) = a.chunk(&id, len, off).unwrap();
        assert!(got == &data[..len as usize] && read > 0);
        let (got, read) = b.chunk(&id, len, off).unwrap();
        assert!(got == &data[..len as usize]);
        assert_eq!(read, 0, "the other worker's group is taken, not read");
        // Neither holds it any more: read again.
        drop((a, b));
        let mut c = worker();
        let (_, read) = c.chunk(&id, len, off).unwrap();
        assert!(read > 0);
    }

    /// A direct write that fails stops the restore: the workers' next
    /// hand-over is refused, and the error is the write's, with its offset.
    #[test]
    fn a_failed_write_behind_is_the_restores_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("image");
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        // Opened for reading only: every write fails (EBADF).
        let read_only = File::open(&path).unwrap();
        let wb = WriteBehind::new(1);
        std::thread::scope(|scope| {
            scope.spawn(|| wb.run(&read_only, &read_only));
            assert!(wb.check(0).is_ok());
            let buf = run_buffer();
            let _fresh = wb.hand(buf, 0, 8192, 65_536);
            // The writer fails that write; the next check says so.
            let deadline = Instant::now() + std::time::Duration::from_secs(10);
            while wb.check(1).is_ok() {
                assert!(Instant::now() < deadline, "the failed write went unnoticed");
                std::thread::yield_now();
            }
            wb.close();
        });
        match wb.into_error() {
            Some(StoreError::Dest { offset, .. }) => assert_eq!(offset, 65_536),
            other => panic!("{other:?}"),
        }
    }
}
