//! `backup`: a stream into a new snapshot.
//!
//! ```text
//! reader thread: read 8 MiB batches, cut them into chunks (sequential: cuts
//!                depend on the bytes before them); in a sparse file's
//!                holes, whole zero chunks are recorded unread
//!     -> N workers: zero test, BLAKE3, dedup against the index and the
//!                   chunks claimed by this backup, compress new chunks into
//!                   a batch of pack records
//!         -> one pack writer per target, each with its own short queue;
//!            a worker hands each batch of records to the least busy
//!            target (fewest bytes queued, then fewest bytes stored), so a
//!            faster disk takes more batches and idle disks fill evenly
//!     -> calling thread, in order: the image's extent list, progress
//! ```
//!
//! Commit: the writers seal and fsync their packs, then the index file for
//! them is written, then the manifest. A crash before the manifest leaves
//! no snapshot, only packs that the next backup salvages and reuses.

use crate::backend::WriteBackend;
use crate::chunker::{Chunker, ChunkerSpec};
use crate::crypt::Crypt;
use crate::error::{Result, StoreError};
use crate::id::{ChunkId, PREFIX_LEN};
use crate::index::{ChunkIndex, IdHash, IndexFile, Location, PackInfo};
use crate::manifest::{Extent, ExtentList, Manifest, SnapshotStats};
use crate::pack::{encode_record, PackWriter, MAX_GROUP_RAW};
use crate::repo::{now_secs, validate_name, Repository, Salvaged, Session};
use cairn_blockdev::{is_zero, AlignedBuf, SparseRead, DIRECT_ALIGN};
use cairn_codec::{BlockCodec, CodecSpec, Probe};
use cairn_pipeline::{Config, Fill, Slot};
use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Bytes read per batch.
const BATCH: usize = 8 << 20;

/// Default size of a compression group, chosen by measurement (see
/// `docs/benchmarks.md`): zstd -3 on the Debian image stores 63.1 MB with
/// each 32 KiB chunk alone, 58.0 with 256 KiB groups, 54.5 with 1 MiB,
/// 52.8 with 2 MiB and 51.8 with 4 MiB (borg, 2 MiB chunks: 54.5 MB);
/// bigger groups cost random reads more (a whole group is decoded).
pub const DEFAULT_GROUP_SIZE: usize = 2 << 20;

/// What to back up and how.
pub struct BackupOptions<'a> {
    /// Image name.
    pub name: String,
    /// Codec for new chunks.
    pub codec: CodecSpec,
    /// How to cut the stream.
    pub chunker: ChunkerSpec,
    /// Worker threads (hashing and compressing).
    pub threads: usize,
    /// New chunks are compressed together in groups of about this many
    /// bytes ([`DEFAULT_GROUP_SIZE`]; 0: each chunk alone), at most a
    /// quarter of the repository's pack size.
    pub group_size: usize,
    /// A label for the source, recorded in the manifest.
    pub source: String,
    /// Called in stream order after each batch.
    pub progress: Option<&'a (dyn Fn(&Progress) + Sync)>,
    /// The snapshot's time (Unix seconds) when not now: imports of older
    /// backups, and tests of retention.
    pub time: Option<i64>,
    /// Tags recorded in the manifest (each checked by
    /// `validate_tag`).
    pub tags: Vec<String>,
}

/// Running totals of a backup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// Bytes of the source covered (read, or skipped in holes).
    pub bytes_in: u64,
    /// Bytes of chunks stored for the first time (uncompressed).
    pub new_raw: u64,
    /// What the new chunks take in packs.
    pub new_stored: u64,
    /// Bytes of chunks the repository already had.
    pub dedup: u64,
    /// Bytes of all-zero chunks (never stored).
    pub zero: u64,
    /// Of `zero`, the bytes of a sparse file's holes that were never read.
    pub skipped: u64,
    /// Data chunks.
    pub chunks: u64,
    /// New chunks.
    pub new_chunks: u64,
}

impl Progress {
    fn add(&mut self, o: &Progress) {
        self.bytes_in += o.bytes_in;
        self.new_raw += o.new_raw;
        self.new_stored += o.new_stored;
        self.dedup += o.dedup;
        self.zero += o.zero;
        self.skipped += o.skipped;
        self.chunks += o.chunks;
        self.new_chunks += o.new_chunks;
    }
}

/// What a backup did.
#[derive(Debug, Clone)]
pub struct BackupReport {
    /// Image name.
    pub name: String,
    /// The new snapshot's number.
    pub snapshot: u64,
    /// Totals.
    pub totals: Progress,
    /// Wall time in seconds.
    pub seconds: f64,
    /// Packs of an interrupted earlier run taken back into the index.
    pub salvaged: Salvaged,
    /// Damaged index files set aside (their packs were indexed again).
    pub quarantined: Vec<std::path::PathBuf>,
    /// Packs that are missing or cut short: their chunks were stored again
    /// where this backup needed them.
    pub lost_packs: Vec<String>,
    /// Packs written.
    pub packs: usize,
}

#[derive(Default)]
pub(crate) struct Batch {
    /// The batch's bytes are `data[..len]`. The buffer stays initialised
    /// at its full size, so reads fill it without zeroing it first.
    pub(crate) data: Vec<u8>,
    /// Or, from a source that hands over its read buffers
    /// ([`SparseRead::swap_block`]), `block[start..start + len]`: the bytes
    /// carried over from the batch before, then the block read.
    block: Option<AlignedBuf>,
    start: usize,
    pub(crate) len: usize,
    /// Chunk ends in [`Batch::bytes`].
    pub(crate) ends: Vec<u32>,
    /// Zero bytes before `data`: whole zero chunks of a hole, recorded
    /// without being read.
    pub(crate) zeros_before: u64,
}

impl Batch {
    /// What [`Batch::ends`] cut: its chunks are `bytes()[end before..end]`.
    fn bytes(&self) -> &[u8] {
        match &self.block {
            Some(b) => &b.as_slice()[self.start..],
            None => &self.data,
        }
    }
}

#[derive(Default)]
struct Done {
    extents: Vec<Extent>,
    totals: Progress,
}

/// Records for the pack writers: bytes, and for each chunk (id, record
/// offset, record length, offset in the record's group).
#[derive(Default)]
pub(crate) struct Blob {
    pub(crate) bytes: Vec<u8>,
    pub(crate) records: Vec<(ChunkId, u32, u32, u32)>,
}

/// The group size a backup or edit uses: `group` (0 stays 0), at most a
/// quarter of the pack size. A pack is sealed before a record that would
/// take it past the pack size (see [`append_blob`]), so records of a
/// quarter of the pack at most fill every pack to at least three quarters;
/// a 2 MiB group in 1 MiB packs would make every pack one oversized record.
pub(crate) fn group_for_packs(group: usize, pack_size: u64) -> usize {
    group.min(usize::try_from(pack_size / 4).unwrap_or(usize::MAX))
}

/// Append the records of `blob` to packs of at most `pack_size` bytes,
/// filling the open pack `current` (a writer and its slot in the index
/// file being built), sealing it with `seal` before a record that does
/// not fit and opening the next with `create`. A record larger than a
/// pack gets a pack of its own. The records' index entries go to
/// `entries`, numbered with the slot of the pack that holds them.
///
/// A blob is a worker's whole batch (up to 8 MiB read, so several MiB
/// of records): appended whole, it made `--pack-size 1M` packs of 4 to
/// 8 MB.
pub(crate) fn append_blob(
    blob: &Blob,
    pack_size: u64,
    current: &mut Option<(PackWriter, u32)>,
    mut create: impl FnMut() -> Result<(PackWriter, u32)>,
    mut seal: impl FnMut((PackWriter, u32)) -> Result<()>,
    entries: &mut Vec<(ChunkId, Location)>,
) -> Result<()> {
    let recs = &blob.records;
    let mut i = 0;
    while i < recs.len() {
        let start = u64::from(recs[i].1);
        let first_len = u64::from(recs[i].2);
        if let Some((w, _)) = current.as_ref() {
            if !w.is_empty() && w.len() + first_len > pack_size {
                if let Some(full) = current.take() {
                    seal(full)?;
                }
            }
        }
        let (w, slot) = match current {
            Some(c) => c,
            None => current.insert(create()?),
        };
        let room = pack_size.saturating_sub(w.len());
        // The entries of whole records from i on that fit (at least one
        // record); a record's chunks are consecutive entries.
        let mut end = start;
        let mut j = i;
        while j < recs.len() {
            let (_, at, len, _) = recs[j];
            let rec_end = u64::from(at) + u64::from(len);
            let new_record = j > i && at != recs[j - 1].1;
            if new_record && rec_end - start > room {
                break;
            }
            end = end.max(rec_end);
            j += 1;
        }
        let bytes = blob
            .bytes
            .get(start as usize..end as usize)
            .ok_or_else(|| {
                StoreError::Aborted("internal: a record lies outside its batch".into())
            })?;
        let base = w.append(bytes)?;
        for &(id, at, len, slice) in &recs[i..j] {
            entries.push((
                id,
                Location {
                    pack: *slot,
                    offset: (base + u64::from(at) - start) as u32,
                    len,
                    slice,
                },
            ));
        }
        i = j;
        if w.len() >= pack_size {
            if let Some(full) = current.take() {
                seal(full)?;
            }
        }
    }
    Ok(())
}

/// How busy each target is. Each blob goes to the target with the fewest
/// bytes queued or being written, ties broken by the fewest bytes stored
/// there (packs already in the repository plus this backup's), then by
/// target number. A shared queue that every writer pulls from would also
/// favour a fast disk, but leaves the choice to thread wake-up order: small
/// backups could land on one disk every time.
struct TargetLoad {
    busy: Vec<AtomicU64>,
    stored: Vec<AtomicU64>,
}

impl TargetLoad {
    fn new(stored: Vec<u64>) -> TargetLoad {
        TargetLoad {
            busy: stored.iter().map(|_| AtomicU64::new(0)).collect(),
            stored: stored.into_iter().map(AtomicU64::new).collect(),
        }
    }

    /// The least busy target, now charged with `len` bytes.
    fn take(&self, len: u64) -> usize {
        let t = (0..self.busy.len())
            .min_by_key(|&t| {
                (
                    self.busy[t].load(Ordering::Relaxed),
                    self.stored[t].load(Ordering::Relaxed),
                    t,
                )
            })
            .unwrap_or(0);
        self.busy[t].fetch_add(len, Ordering::Relaxed);
        self.stored[t].fetch_add(len, Ordering::Relaxed);
        t
    }

    /// Target `t` has written `len` bytes it was handed.
    fn written(&self, t: usize, len: u64) {
        self.busy[t].fetch_sub(len, Ordering::Relaxed);
    }
}

/// The pack writers' queues, one per target.
struct Dispatch<'a> {
    queues: Vec<Sender<Blob>>,
    load: &'a TargetLoad,
}

impl Dispatch<'_> {
    /// Queue `blob` for the least busy target; false if its writer stopped.
    fn send(&self, blob: Blob) -> bool {
        let t = self.load.take(blob.bytes.len() as u64);
        self.queues.get(t).is_some_and(|q| q.send(blob).is_ok())
    }
}

/// Bytes each target holds, by the index's pack table.
pub(crate) fn stored_per_target(index: &ChunkIndex, targets: usize) -> Vec<u64> {
    let mut stored = vec![0u64; targets];
    for p in index.packs() {
        if let Some(s) = stored.get_mut(usize::from(p.target)) {
            *s += p.len;
        }
    }
    stored
}

/// Back up `source` as a new snapshot of `opts.name`.
pub fn backup(
    repo: &Repository,
    session: &Session,
    source: &mut dyn SparseRead,
    opts: &BackupOptions,
) -> Result<BackupReport> {
    let chunker = check_options(opts)?.build(&repo.gear_table());
    backup_batches(repo, session, reader(source, chunker), opts)
}

/// Check what `opts` asks for; returns the chunker.
pub(crate) fn check_options(opts: &BackupOptions) -> Result<ChunkerSpec> {
    validate_name(&opts.name)?;
    for t in &opts.tags {
        crate::manifest::validate_tag(t)?;
    }
    if opts.tags.len() > usize::from(u16::MAX) {
        return Err(StoreError::Invalid(format!(
            "{} tags: at most {} are allowed",
            opts.tags.len(),
            u16::MAX
        )));
    }
    if opts.group_size > MAX_GROUP_RAW {
        return Err(StoreError::Invalid(format!(
            "group size {} is over the limit of {MAX_GROUP_RAW}",
            opts.group_size
        )));
    }
    opts.chunker.validate()
}

/// The backup itself, of the batches `fill` makes (cut by the chunker of
/// [`reader`], or at given places by `copy`): dedup, compression, packs,
/// index file and the commit of the manifest. `opts` must have passed
/// [`check_options`].
pub(crate) fn backup_batches(
    repo: &Repository,
    session: &Session,
    fill: impl FnMut(&mut Batch) -> Result<Fill> + Send,
    opts: &BackupOptions,
) -> Result<BackupReport> {
    let chunker = opts.chunker;
    let started = Instant::now();
    let created = opts.time.unwrap_or_else(now_secs);
    let writer_index = repo.writer_index(session)?;
    let index = &writer_index.index;

    let claimed: Mutex<HashSet<[u8; PREFIX_LEN], IdHash>> = Mutex::default();
    let failed = AtomicBool::new(false);
    let targets = (0..repo.target_count() as u16)
        .map(|t| repo.target(t).cloned())
        .collect::<Result<Vec<_>>>()?;
    let load = TargetLoad::new(stored_per_target(index, targets.len()));
    let (queues, receivers): (Vec<_>, Vec<_>) = targets.iter().map(|_| bounded::<Blob>(2)).unzip();
    let dispatch = Dispatch {
        queues,
        load: &load,
    };
    let (spare_tx, spare_rx) = unbounded::<Blob>();
    let mut list = ExtentList::default();
    let mut totals = Progress::default();

    let (run, written) = std::thread::scope(|s| {
        let writers: Vec<_> = targets
            .iter()
            .zip(receivers)
            .enumerate()
            .map(|(t, (dir, rx))| {
                let spare = spare_tx.clone();
                let failed = &failed;
                let load = &load;
                s.spawn(move || write_packs(repo, t as u16, &**dir, rx, load, spare, failed))
            })
            .collect();
        let run = cairn_pipeline::run(
            Config::new(opts.threads),
            fill,
            || {
                worker(
                    Group::new(repo, group_for_packs(opts.group_size, repo.pack_size())),
                    opts.codec,
                    index,
                    &claimed,
                    &dispatch,
                    &spare_rx,
                    &failed,
                )
            },
            |slot: &mut Slot<Batch, Done>| {
                for e in slot.output.extents.drain(..) {
                    list.push(e);
                }
                totals.add(&slot.output.totals);
                if let Some(p) = opts.progress {
                    p(&totals);
                }
                Ok(())
            },
            |slot: &mut Slot<Batch, Done>| {
                slot.input.len = 0;
                slot.input.zeros_before = 0;
                slot.input.ends.clear();
                slot.output.extents.clear();
                slot.output.totals = Progress::default();
            },
        );
        drop(dispatch);
        let written: Vec<Result<IndexFile>> = writers
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(StoreError::Aborted("a pack writer panicked".into())))
            })
            .collect();
        (run, written)
    });

    // A writer's error (disk full, I/O error) explains a stopped pipeline
    // better than the pipeline's own "writers stopped".
    let mut parts = Vec::new();
    let mut first_err = None;
    for w in written {
        match w {
            Ok(f) => parts.push(f),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    let combined = combine(parts);
    if let Some(e) = first_err.or(run.err()) {
        // Keep what reached disk findable without a scan; if even that
        // fails, the next backup salvages the packs.
        let _ = repo.write_index(session, &combined);
        return Err(e);
    }
    repo.write_index(session, &combined)?;
    let stats = SnapshotStats {
        chunks: totals.chunks,
        new_chunks: totals.new_chunks,
        zero_bytes: totals.zero,
        new_raw: totals.new_raw,
        new_stored: totals.new_stored,
        millis: started.elapsed().as_millis() as u64,
    };
    let mut manifest = Manifest {
        name: opts.name.clone(),
        snapshot: 0,
        created,
        size: list.size,
        chunker: chunker.to_string(),
        codec: opts.codec.to_string(),
        source: opts.source.clone(),
        stats,
        extents: list.extents,
        tags: opts.tags.clone(),
        group: u32::try_from(group_for_packs(opts.group_size, repo.pack_size())).ok(),
    };
    // Numbered at the commit: a concurrent backup of the same image may
    // have taken the next number since this one began.
    let snapshot = repo.commit_manifest(session, &mut manifest)?;
    Ok(BackupReport {
        name: opts.name.clone(),
        snapshot,
        totals,
        seconds: started.elapsed().as_secs_f64(),
        salvaged: writer_index.salvaged,
        quarantined: writer_index.quarantined.clone(),
        lost_packs: writer_index.lost_packs.clone(),
        packs: combined.packs.len(),
    })
}

/// The reader: fills batches and cuts them, carrying a chunk that may
/// still grow into the next batch.
///
/// In a hole of a [`crate::SparseFile`], whole zero chunks (those the
/// chunker cuts at a fixed length because MAX zeros follow their start)
/// are skipped unread and passed on as [`Batch::zeros_before`]; the cuts
/// are the same as if the zeros had been read (the reader stops a batch
/// MAX bytes into a hole, so the chunk that runs into it is cut on real
/// bytes and the carry is all zeros).
///
/// A source that reads into aligned buffers of its own (a `--direct`
/// reader) and whose blocks are at least a batch long hands each block
/// over whole ([`SparseRead::swap_block`]): the carry goes into the free
/// head in front of it and the chunks are cut where the disk put them,
/// with no copy (the copy was 12 % of a cold backup's CPU, on the thread
/// that limits it).
fn reader<'a>(
    source: &'a mut dyn SparseRead,
    chunker: Chunker,
) -> impl FnMut(&mut Batch) -> Result<Fill> + Send + 'a {
    let max = chunker.spec().max_chunk() as usize;
    let batch = BATCH.max(2 * max);
    let head = max.next_multiple_of(DIRECT_ALIGN);
    let whole_blocks = source.offer_blocks(head, batch);
    let mut carry: Vec<u8> = Vec::new();
    let mut eof = false;
    // Stream offset of the next chunk's start (`carry[0]`).
    let mut offset = 0u64;
    move |b: &mut Batch| {
        if eof && carry.is_empty() {
            return Ok(Fill::End);
        }
        let failed = |at: u64| {
            move |e| StoreError::Source {
                offset: at,
                source: e,
            }
        };
        if !eof && is_zero(&carry) {
            let ahead = source.zeros_ahead().map_err(failed(offset))?;
            let skip = chunker.zero_run(carry.len() as u64 + ahead);
            if skip > 0 {
                let from_carry = (skip as usize).min(carry.len());
                carry.drain(..from_carry);
                source
                    .skip_zeros(skip - from_carry as u64)
                    .map_err(failed(offset))?;
                b.zeros_before = skip;
                offset += skip;
            }
        }
        if let Some(block) = whole_blocks {
            let mut buf = b
                .block
                .take()
                .unwrap_or_else(|| AlignedBuf::new(head + block, DIRECT_ALIGN));
            let (start, len, used) = loop {
                let start = head - carry.len();
                let n = source.swap_block(&mut buf).map_err(failed(offset))?;
                eof = n == 0;
                let bytes = &mut buf.as_mut_slice()[start..head + n];
                bytes[..carry.len()].copy_from_slice(&carry);
                let used = chunker.cut(bytes, eof, &mut b.ends);
                // Fewer than MAX bytes and more to come (a read the kernel
                // cut short): carry them all into the next block.
                if used > 0 || eof {
                    break (start, bytes.len(), used);
                }
                carry.clear();
                carry.extend_from_slice(bytes);
            };
            carry.clear();
            carry.extend_from_slice(&buf.as_slice()[start + used..start + len]);
            b.block = Some(buf);
            b.start = start;
            b.len = used;
            offset += used as u64;
            if used == 0 && b.zeros_before == 0 {
                return Ok(Fill::End);
            }
            return Ok(Fill::Item);
        }
        if b.data.len() < batch {
            b.data.resize(batch, 0);
        }
        let mut len = carry.len();
        b.data[..len].copy_from_slice(&carry);
        carry.clear();
        while !eof && len < batch {
            let at = offset + len as u64;
            if source.zeros_ahead().map_err(failed(at))? >= 2 * max as u64 {
                // A hole worth skipping: take MAX of its zeros and stop.
                let n = max.min(batch - len);
                b.data[len..len + n].fill(0);
                source.skip_zeros(n as u64).map_err(failed(at))?;
                len += n;
                break;
            }
            match source.read(&mut b.data[len..batch]) {
                Ok(0) => eof = true,
                Ok(n) => len += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(failed(at)(e)),
            }
        }
        let used = chunker.cut(&b.data[..len], eof, &mut b.ends);
        carry.extend_from_slice(&b.data[used..len]);
        b.len = used;
        offset += used as u64;
        if used == 0 && b.zeros_before == 0 {
            return Ok(Fill::End);
        }
        Ok(Fill::Item)
    }
}

/// New chunks waiting to be compressed together into one record.
#[derive(Default)]
pub(crate) struct Group {
    pub(crate) raw: Vec<u8>,
    pub(crate) table: Vec<(ChunkId, u32)>,
    probe: Probe,
    /// The repository's keys: chunk ids are keyed and records sealed.
    crypt: Option<Arc<Crypt>>,
    /// Raw bytes at which [`Group::add`] flushes the group into a record
    /// (0: each chunk alone).
    size: usize,
}

impl Group {
    /// An empty group for the records of `repo`, flushed by
    /// [`Group::add`] once it holds `size` raw bytes.
    pub(crate) fn new(repo: &Repository, size: usize) -> Group {
        Group {
            crypt: repo.crypt().cloned(),
            size,
            ..Group::default()
        }
    }

    /// The id of a chunk in this repository.
    pub(crate) fn chunk_id(&self, data: &[u8]) -> ChunkId {
        crate::crypt::chunk_id(self.crypt.as_deref(), data)
    }

    /// Compress the group into a record at the end of `blob`.
    pub(crate) fn flush(
        &mut self,
        blob: &mut Blob,
        codec: &mut dyn BlockCodec,
        totals: &mut Progress,
    ) -> Result<()> {
        if self.table.is_empty() {
            return Ok(());
        }
        let at = blob.bytes.len();
        encode_record(
            &mut blob.bytes,
            &self.table,
            &self.raw,
            codec,
            &mut self.probe,
            self.crypt.as_deref(),
        )?;
        let len = (blob.bytes.len() - at) as u32;
        let mut slice = 0u32;
        for &(id, n) in &self.table {
            blob.records.push((id, at as u32, len, slice));
            slice += n;
        }
        totals.new_stored += u64::from(len);
        self.raw.clear();
        self.table.clear();
        Ok(())
    }

    /// Store a chunk as cut: its runs of zeros ([`zero_runs`]) become
    /// holes, and each piece between is a chunk of its own, new if
    /// `is_new` says so (it claims the id), added to this group and the
    /// group flushed into `blob` once it holds its size in bytes. The
    /// extents go to `extents`, the counts to `totals` (all but
    /// `bytes_in`). The one path of a backup's workers and of a served
    /// image's commit.
    pub(crate) fn add(
        &mut self,
        whole: &[u8],
        codec: &mut dyn BlockCodec,
        blob: &mut Blob,
        is_new: &mut dyn FnMut(&ChunkId) -> Result<bool>,
        extents: &mut Vec<Extent>,
        totals: &mut Progress,
    ) -> Result<()> {
        for piece in zero_runs(whole) {
            let chunk = match piece {
                Piece::Data(data) if !is_zero(data) => data,
                // A zero run, or a piece of zeros shorter than one (an
                // all-zero chunk shorter than a run): a hole.
                hole => {
                    let len = match hole {
                        Piece::Zeros(n) => n,
                        Piece::Data(data) => data.len() as u64,
                    };
                    extents.push(Extent::Hole { len });
                    totals.zero += len;
                    continue;
                }
            };
            let len = chunk.len() as u64;
            let id = self.chunk_id(chunk);
            extents.push(Extent::Data {
                len: chunk.len() as u32,
                id,
            });
            totals.chunks += 1;
            if !is_new(&id)? {
                totals.dedup += len;
                continue;
            }
            if self.raw.len() + chunk.len() > MAX_GROUP_RAW {
                self.flush(blob, codec, totals)?;
            }
            self.raw.extend_from_slice(chunk);
            self.table.push((id, chunk.len() as u32));
            totals.new_chunks += 1;
            totals.new_raw += len;
            if self.raw.len() >= self.size {
                self.flush(blob, codec, totals)?;
            }
        }
        Ok(())
    }
}

/// Zero runs at least this long inside a chunk are left out of it.
pub const ZERO_RUN: usize = 4096;

/// A piece of a chunk: bytes to store, or a run of zeros left out.
#[derive(Debug, PartialEq, Eq)]
enum Piece<'a> {
    Data(&'a [u8]),
    Zeros(u64),
}

/// `chunk` in pieces: every run of at least [`ZERO_RUN`] zero bytes is a
/// hole, and the bytes between are stored as chunks of their own. The
/// pieces depend on the chunk's bytes alone, not on where it sits in the
/// image, so a chunk seen again anywhere splits the same way and dedups;
/// a memory dump's zero pages are such runs wherever they are. A chunk
/// with no such run is one piece, itself (so its id, and its dedup, are
/// what they were); an all-zero chunk is one hole.
fn zero_runs(chunk: &[u8]) -> ZeroRuns<'_> {
    ZeroRuns {
        chunk,
        pos: 0,
        probe: 0,
        zeros: None,
    }
}

/// Every run of [`ZERO_RUN`] zeros holds a whole window of half that,
/// counted from the chunk's start: probing those windows finds them all.
const PROBE: usize = ZERO_RUN / 2;

/// See [`zero_runs`].
struct ZeroRuns<'a> {
    chunk: &'a [u8],
    /// Start of the next data piece.
    pos: usize,
    /// Next window to probe.
    probe: usize,
    /// A hole to give after the data piece just given.
    zeros: Option<u64>,
}

impl<'a> Iterator for ZeroRuns<'a> {
    type Item = Piece<'a>;

    fn next(&mut self) -> Option<Piece<'a>> {
        if let Some(n) = self.zeros.take() {
            return Some(Piece::Zeros(n));
        }
        let chunk = self.chunk;
        if self.pos >= chunk.len() {
            return None;
        }
        while let Some(window) = chunk.get(self.probe..self.probe + PROBE) {
            let at = self.probe;
            self.probe += PROBE;
            if !is_zero(window) {
                continue;
            }
            // The whole run around the window (not before `pos`: what
            // came before is given already, and ended on a non-zero byte
            // or a hole).
            let from = chunk[self.pos..at]
                .iter()
                .rposition(|&b| b != 0)
                .map_or(self.pos, |i| self.pos + i + 1);
            let to = chunk[at..]
                .iter()
                .position(|&b| b != 0)
                .map_or(chunk.len(), |i| at + i);
            self.probe = self.probe.max(to);
            if to - from < ZERO_RUN {
                continue;
            }
            let data = &chunk[self.pos..from];
            self.pos = to;
            self.probe = to;
            let zeros = (to - from) as u64;
            if data.is_empty() {
                return Some(Piece::Zeros(zeros));
            }
            self.zeros = Some(zeros);
            return Some(Piece::Data(data));
        }
        let data = &chunk[self.pos..];
        self.pos = chunk.len();
        Some(Piece::Data(data))
    }
}

/// A worker of a backup: chunks, hashes and compresses batches into
/// blobs; `group` is an empty group of the backup's group size.
fn worker<'a>(
    mut group: Group,
    codec: CodecSpec,
    index: &'a ChunkIndex,
    claimed: &'a Mutex<HashSet<[u8; PREFIX_LEN], IdHash>>,
    blobs: &'a Dispatch<'a>,
    spare: &'a Receiver<Blob>,
    failed: &'a AtomicBool,
) -> impl FnMut(&mut Batch, &mut Done) -> Result<()> + 'a {
    let mut codec = codec.build();
    move |b: &mut Batch, out: &mut Done| {
        let mut blob = spare.try_recv().unwrap_or_default();
        blob.bytes.clear();
        blob.records.clear();
        if b.zeros_before > 0 {
            out.extents.push(Extent::Hole {
                len: b.zeros_before,
            });
            out.totals.zero += b.zeros_before;
            out.totals.bytes_in += b.zeros_before;
            out.totals.skipped += b.zeros_before;
        }
        let mut prev = 0usize;
        let bytes = b.bytes();
        for &end in &b.ends {
            let whole = &bytes[prev..end as usize];
            prev = end as usize;
            out.totals.bytes_in += whole.len() as u64;
            group.add(
                whole,
                codec.as_mut(),
                &mut blob,
                &mut |id| {
                    Ok(!index.contains(id)
                        && claimed
                            .lock()
                            .map_err(|_| StoreError::Aborted("a worker panicked".into()))?
                            .insert(id.prefix()))
                },
                &mut out.extents,
                &mut out.totals,
            )?;
        }
        group.flush(&mut blob, codec.as_mut(), &mut out.totals)?;
        if !blob.records.is_empty() && (failed.load(Ordering::Relaxed) || !blobs.send(blob)) {
            return Err(StoreError::Aborted("the pack writers stopped".into()));
        }
        Ok(())
    }
}

/// One target's writer: append batches of records to packs, sealing each
/// at the repository's pack size. Returns the index of what it wrote.
///
/// A sealed pack is made durable (fsync of it and its directory) by a
/// second thread while this one goes on writing the next pack, so the
/// disk flush of one pack overlaps the writing of the next instead of
/// stalling the workers behind a full queue (a 1 GiB backup of random
/// data spent 0.86 s of 4.6 s in these fsyncs).
fn write_packs(
    repo: &Repository,
    target: u16,
    dir: &dyn WriteBackend,
    rx: Receiver<Blob>,
    load: &TargetLoad,
    spare: Sender<Blob>,
    failed: &AtomicBool,
) -> Result<IndexFile> {
    let mut out = IndexFile::default();
    let mut current: Option<(PackWriter, u32)> = None;
    let (seal_tx, seal_rx) = bounded::<(PackWriter, u32)>(2);
    let (result, sealed) = std::thread::scope(|s| {
        let syncer = s.spawn(move || -> Result<Vec<(u32, PackInfo)>> {
            let mut done = Vec::new();
            for (w, slot) in seal_rx.iter() {
                let (id, len) = w.finish()?;
                done.push((slot, PackInfo { id, target, len }));
            }
            Ok(done)
        });
        let result = (|| {
            let seal = |c| {
                seal_tx
                    .send(c)
                    .map_err(|_| StoreError::Aborted("the pack syncer stopped".into()))
            };
            for blob in rx.iter() {
                let packs = &mut out.packs;
                let create = || {
                    let w = PackWriter::create(dir, repo.id(), repo.sealed())?;
                    // Numbered now; its PackInfo is filled in once sealed.
                    packs.push(PackInfo {
                        id: w.id(),
                        target,
                        len: 0,
                    });
                    Ok((w, packs.len() as u32 - 1))
                };
                append_blob(
                    &blob,
                    repo.pack_size(),
                    &mut current,
                    create,
                    seal,
                    &mut out.entries,
                )?;
                load.written(usize::from(target), blob.bytes.len() as u64);
                let _ = spare.send(blob);
            }
            if let Some(c) = current.take() {
                seal(c)?;
            }
            Ok(())
        })();
        drop(seal_tx);
        let sealed = syncer
            .join()
            .unwrap_or_else(|_| Err(StoreError::Aborted("a pack syncer panicked".into())));
        (result, sealed)
    });
    // The syncer's own error (an fsync that failed) explains a stop
    // better than "the pack syncer stopped".
    let result = match (result, sealed) {
        (_, Err(e)) | (Err(e), Ok(_)) => Err(e),
        (Ok(()), Ok(sealed)) => {
            for (slot, info) in sealed {
                if let Some(p) = out.packs.get_mut(slot as usize) {
                    *p = info;
                }
            }
            Ok(())
        }
    };
    match result {
        Ok(()) => Ok(out),
        Err(e) => {
            failed.store(true, Ordering::Relaxed);
            // Drain so that workers blocked on a full queue see the failure.
            drop(rx);
            Err(e)
        }
    }
}

/// Concatenate the writers' index parts, renumbering packs.
fn combine(parts: Vec<IndexFile>) -> IndexFile {
    let mut all = IndexFile::default();
    for p in parts {
        let base = all.packs.len() as u32;
        all.packs.extend(p.packs);
        all.entries
            .extend(p.entries.into_iter().filter_map(|(id, mut loc)| {
                loc.pack += base;
                (loc.pack < all.packs.len() as u32).then_some((id, loc))
            }));
    }
    all
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    /// Run [`reader`] over `source` to the end, through three batches
    /// reused in turn as the pipeline does; the chunks it cut.
    fn cut_all(source: &mut dyn SparseRead, spec: ChunkerSpec) -> Vec<Vec<u8>> {
        let mut fill = reader(source, spec.build(&crate::chunker::GearTable::public()));
        let mut batches: Vec<Batch> = (0..3).map(|_| Batch::default()).collect();
        let mut chunks = Vec::new();
        for turn in 0.. {
            let b = &mut batches[turn % 3];
            b.len = 0;
            b.zeros_before = 0;
            b.ends.clear();
            if matches!(fill(b).unwrap(), Fill::End) {
                break;
            }
            assert_eq!(b.zeros_before, 0, "these sources have no holes");
            let mut prev = 0;
            for &end in &b.ends {
                chunks.push(b.bytes()[prev..end as usize].to_vec());
                prev = end as usize;
            }
            assert_eq!(prev, b.len);
        }
        chunks
    }

    /// Bytes that cut into chunks of every size: pseudo-random, with runs
    /// of zeros (longer than the largest chunk, too) and of one byte.
    fn varied(len: usize) -> Vec<u8> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut v: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        for (at, n, byte) in [
            (1 << 20, 300_000, 0u8),
            (5 << 20, 9000, 7),
            (9 << 20, 200, 0),
        ] {
            if at + n <= len {
                v[at..at + n].fill(byte);
            }
        }
        v
    }

    /// A source that hands over blocks of its own, some of them cut short
    /// (as the kernel may cut a read): the reader must carry a short
    /// block's bytes into the next one.
    struct ShortBlocks {
        data: Vec<u8>,
        at: usize,
        block: usize,
        head: usize,
        turn: usize,
    }

    impl SparseRead for ShortBlocks {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.data.len() - self.at);
            buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }

        fn offer_blocks(&mut self, head: usize, min_block: usize) -> Option<usize> {
            self.head = head;
            (self.block >= min_block).then_some(self.block)
        }

        fn swap_block(&mut self, buf: &mut AlignedBuf) -> std::io::Result<usize> {
            assert_eq!(buf.len(), self.head + self.block);
            self.turn += 1;
            let want = if self.turn % 3 == 0 { 4096 } else { self.block };
            let n = want.min(self.data.len() - self.at);
            let dst = &mut buf.as_mut_slice()[self.head..self.head + n];
            dst.copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    /// Blocks handed over whole (a `--direct` reader with blocks of at
    /// least a batch) are cut exactly as the same bytes read and copied:
    /// the same chunks, whatever the length, the chunker or the depth.
    #[test]
    fn blocks_handed_over_whole_cut_as_bytes_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("src");
        let specs = [
            crate::chunker::DEFAULT_CHUNKER,
            ChunkerSpec::Cdc {
                min: 64,
                avg: 256,
                max: 1024,
            },
            ChunkerSpec::Fixed(4096),
            ChunkerSpec::Fixed(5000),
            // MAX over half a block: batches are longer than a block, so
            // its blocks are copied out (whole blocks are not offered).
            ChunkerSpec::Fixed(5 << 20),
        ];
        for len in [
            0,
            1,
            4095,
            BATCH - 1,
            BATCH,
            BATCH + 1,
            2 * BATCH,
            2 * BATCH + 12_345,
        ] {
            let data = varied(len);
            std::fs::write(&p, &data).unwrap();
            for spec in specs {
                let mut copied = std::io::Cursor::new(data.clone());
                let want = cut_all(&mut copied, spec);
                assert_eq!(want.concat(), data);
                for (block, depth) in [(BATCH, 1), (BATCH, 3), (BATCH + 4096, 2)] {
                    let file = std::fs::File::open(&p).unwrap();
                    let mut r = cairn_blockdev::DirectReader::with_queue(file, block, depth);
                    let got = cut_all(&mut r, spec);
                    assert!(got == want, "len {len} {spec} block {block} x {depth}");
                }
                let mut short = ShortBlocks {
                    data: data.clone(),
                    at: 0,
                    block: BATCH,
                    head: 0,
                    turn: 0,
                };
                assert!(
                    cut_all(&mut short, spec) == want,
                    "len {len} {spec}, short blocks"
                );
            }
        }
    }

    /// The longest run of zeros in `d`.
    fn longest_zero_run(d: &[u8]) -> usize {
        d.split(|&b| b != 0).map(<[u8]>::len).max().unwrap_or(0)
    }

    proptest::proptest! {
        /// Whatever the bytes: the pieces join back into the chunk, every
        /// hole is a whole run of at least ZERO_RUN zeros (a non-zero byte
        /// or the chunk's edge on each side), no data piece holds such a
        /// run, and the same bytes behind a prefix split the same way.
        #[test]
        fn zero_runs_are_cut_out_whole(
            runs in proptest::collection::vec((0u8..3, 1usize..9000), 0..12),
            prefix in 0usize..5000,
        ) {
            let mut chunk = Vec::new();
            for (i, &(kind, n)) in runs.iter().enumerate() {
                let byte = match kind {
                    0 => 0,
                    1 => i as u8 | 1,
                    _ => 0x80,
                };
                chunk.extend(std::iter::repeat_n(byte, n));
            }
            let mut joined = Vec::new();
            let mut holes = Vec::new();
            for piece in zero_runs(&chunk) {
                match piece {
                    Piece::Zeros(n) => {
                        let n = n as usize;
                        proptest::prop_assert!(n >= ZERO_RUN);
                        let at = joined.len();
                        proptest::prop_assert!(at == 0 || chunk[at - 1] != 0);
                        proptest::prop_assert!(chunk.get(at + n).is_none_or(|&b| b != 0));
                        holes.push((at, n));
                        joined.resize(at + n, 0);
                    }
                    Piece::Data(d) => {
                        proptest::prop_assert!(!d.is_empty());
                        proptest::prop_assert!(longest_zero_run(d) < ZERO_RUN);
                        joined.extend_from_slice(d);
                    }
                }
            }
            proptest::prop_assert!(joined == chunk);
            // Not split by where it sits: the same bytes after a data
            // prefix (which ends on a non-zero byte) give the same holes.
            let mut shifted = vec![0x55u8; prefix];
            shifted.extend_from_slice(&chunk);
            let mut at = 0;
            let mut moved = Vec::new();
            for piece in zero_runs(&shifted) {
                match piece {
                    Piece::Zeros(n) => {
                        moved.push((at - prefix, n as usize));
                        at += n as usize;
                    }
                    Piece::Data(d) => at += d.len(),
                }
            }
            proptest::prop_assert_eq!(moved, holes);
        }
    }

    /// A chunk without a long zero run is one piece, itself; a zero page
    /// is cut out wherever it is, with the zeros around it.
    #[test]
    fn zero_runs_of_a_chunk() {
        let data = vec![5u8; 3 * ZERO_RUN];
        assert_eq!(zero_runs(&data).collect::<Vec<_>>(), [Piece::Data(&data)]);
        let mut c = vec![5u8; 4 * ZERO_RUN];
        c[ZERO_RUN - 7..3 * ZERO_RUN + 1].fill(0);
        let (from, to) = (ZERO_RUN - 7, 3 * ZERO_RUN + 1);
        assert_eq!(
            zero_runs(&c).collect::<Vec<_>>(),
            [
                Piece::Data(&c[..from]),
                Piece::Zeros((to - from) as u64),
                Piece::Data(&c[to..]),
            ]
        );
        // A run one byte short of ZERO_RUN stays in the data.
        let mut c = vec![5u8; 3 * ZERO_RUN];
        c[100..100 + ZERO_RUN - 1].fill(0);
        assert_eq!(zero_runs(&c).collect::<Vec<_>>(), [Piece::Data(&c)]);
        // All zeros: one hole; nothing: nothing.
        let z = vec![0u8; ZERO_RUN + 3];
        assert_eq!(
            zero_runs(&z).collect::<Vec<_>>(),
            [Piece::Zeros(z.len() as u64)]
        );
        assert_eq!(zero_runs(&[]).count(), 0);
    }

    /// Blocks smaller than a batch are read through the copy, unchanged.
    #[test]
    fn blocks_smaller_than_a_batch_are_copied_out() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("src");
        let data = varied(BATCH + 777);
        std::fs::write(&p, &data).unwrap();
        let file = std::fs::File::open(&p).unwrap();
        let mut r = cairn_blockdev::DirectReader::with_queue(file, 1 << 20, 4);
        let mut copied = std::io::Cursor::new(data.clone());
        let spec = crate::chunker::DEFAULT_CHUNKER;
        assert!(cut_all(&mut r, spec) == cut_all(&mut copied, spec));
    }

    /// Regression: with one shared queue, whichever writer woke first took
    /// every batch, so small backups all landed on one target.
    #[test]
    fn batches_go_to_the_least_busy_then_least_full_target() {
        let load = TargetLoad::new(vec![100, 0, 0]);
        // Idle targets: the emptier one first, ties by number.
        assert_eq!(load.take(10), 1);
        // Target 1 is busy now: the idle target 2 takes the next batch.
        assert_eq!(load.take(10), 2);
        // Both 1 and 2 are busy with 10; 0 is idle (though fuller).
        assert_eq!(load.take(10), 0);
        load.written(1, 10);
        load.written(2, 10);
        load.written(0, 10);
        // All idle again: 1 and 2 hold 10 each, 0 holds 110.
        assert_eq!(load.take(5), 1);
        load.written(1, 5);
        assert_eq!(load.take(5), 2);
    }
}
