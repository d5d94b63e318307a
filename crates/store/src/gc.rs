//! `gc`: reclaim chunks no snapshot uses, and repack packs that are mostly
//! garbage.
//!
//! Order of work, so that a kill at any moment loses nothing, and a
//! backup or reader running beside it loses nothing either:
//!
//! 1. finish earlier trash lists that nothing can need any more; salvage
//!    unindexed packs (and set aside damaged index files, whose packs
//!    salvage re-indexed);
//! 2. mark the chunks every manifest uses (one bit per index entry);
//! 3. copy the live records of sparse packs, verbatim, into new packs —
//!    a kill here leaves unindexed packs, salvaged later;
//! 4. write new index files naming only live chunks — a kill here leaves
//!    old and new index files side by side, both right;
//! 5. write a trash list (the old index files it loaded, dead and
//!    repacked packs), then record in it every session running;
//! 6. delete what it names once all those sessions have ended — at once
//!    when there were none, else by the next writer ([`collect_trash`]).
//!    A session that began before the list may have deduplicated against
//!    a chunk on it and committed a snapshot using it: so before deleting,
//!    every chunk a snapshot uses that would be left without a copy is
//!    found, and its pack kept and indexed again. A session that began
//!    after the list never uses what it names (writers load the index
//!    without it). A record that is gone (past the end of a cut pack) or
//!    that `repair` dropped as damaged is no reason to keep its pack.
//!
//! A pack cut short (its records past the cut are not in the loaded
//! index) or holding entries `repair` drops is repacked whatever its live
//! share: its sound live records are copied out and the pack goes, so
//! the index never keeps naming a pack that verify reports as cut.

use crate::backend::{Key, Liveness};
use crate::backup::{group_for_packs, DEFAULT_GROUP_SIZE};
use crate::error::{Result, StoreError};
use crate::id::{ChunkId, PackId};
use crate::index::{ChunkIndex, IndexFile, Location, PackInfo};
use crate::manifest::Extent;
use crate::pack::{encode_record, open_record, PackWriter, RecordDecoder, MAX_GROUP_RAW};
use crate::reader::PackReader;
use crate::repo::{Garbage, PackFile, Repository, Salvaged, Session};
use cairn_codec::{BlockCodec, CodecKind, CodecSpec, Probe};
use std::collections::{BTreeMap, HashMap, HashSet};

/// How to collect.
pub struct GcOptions<'a> {
    /// Repack a pack whose live bytes are below this fraction of its size.
    pub repack_below: f64,
    /// Called with a short description of each step.
    pub progress: Option<&'a (dyn Fn(&str) + Sync)>,
    /// Index entries (pack, record offset, slice) known damaged
    /// ([`crate::repair`]): their chunks count as dead, so the new index
    /// leaves them out and the next backup stores them again.
    pub drop_records: HashSet<(PackId, u32, u32)>,
    /// Packs to repack whatever their live share: those whose header is
    /// damaged ([`crate::repair`]), their sound records copied into new
    /// packs.
    pub rewrite_packs: HashSet<PackId>,
    /// Index entries whose record length is wrong while the record is
    /// sound ([`crate::repair`]), by (pack, record offset, offset in the
    /// group, length the entry says): the record's own length, which the
    /// new index gives them.
    pub fix_lengths: HashMap<(PackId, u32, u32, u32), u32>,
}

impl Default for GcOptions<'_> {
    fn default() -> Self {
        GcOptions {
            repack_below: 0.5,
            progress: None,
            drop_records: HashSet::new(),
            rewrite_packs: HashSet::new(),
            fix_lengths: HashMap::new(),
        }
    }
}

/// What gc did.
#[derive(Debug, Clone, Default)]
pub struct GcReport {
    /// Packs of interrupted runs taken into the index first.
    pub salvaged: Salvaged,
    /// Damaged index files set aside (their packs were indexed again).
    pub quarantined: Vec<std::path::PathBuf>,
    /// Packs the index named that are missing or cut short.
    pub lost_packs: Vec<String>,
    /// Snapshots that use chunks no index entry holds (or whose records
    /// this run drops as damaged), with how many of their extents do:
    /// they cannot be restored whole. Said on every run until they are
    /// forgotten or the chunks are stored again.
    pub missing: Vec<String>,
    /// Distinct chunks before and after.
    pub chunks_before: u64,
    /// Distinct chunks after.
    pub chunks_after: u64,
    /// Packs deleted because nothing in them is used.
    pub packs_deleted: u64,
    /// Packs whose live chunks were copied into new packs.
    pub packs_repacked: u64,
    /// Live chunks of repacked records that also held dead ones, compressed
    /// again into new records without those (the rest of a repacked pack's
    /// records are copied as they are).
    pub chunks_rewritten: u64,
    /// New packs written.
    pub packs_written: u64,
    /// Bytes of pack files before.
    pub bytes_before: u64,
    /// Bytes of pack files after (once the garbage is deleted).
    pub bytes_after: u64,
    /// Packs are still on a trash list because a session that began
    /// before it (a backup, a restore, a served image) is still running.
    pub deferred: bool,
    /// Packs on a trash list kept after all, since a snapshot committed
    /// beside the gc uses chunks in them.
    pub packs_kept: u64,
    /// Packs deleted from the trash lists of earlier gcs (deferred while
    /// a session they recorded ran), not counted in `packs_deleted`.
    pub earlier_packs_deleted: u64,
    /// Their bytes (counted in `bytes_before`, not in `bytes_after`).
    pub earlier_bytes_deleted: u64,
    /// Temporary files that killed writers left (an hour old or more).
    pub temporaries_removed: u64,
    /// Index entries left out because their record is damaged
    /// ([`GcOptions::drop_records`]).
    pub dropped: u64,
    /// Chunks of damaged records the index now finds in another, sound
    /// copy of theirs (not counted in `dropped`).
    pub switched: u64,
    /// Index entries given their record's own length
    /// ([`GcOptions::fix_lengths`]).
    pub corrected: u64,
    /// Damaged live records met while repacking (their packs were kept
    /// as they are): one line each, naming the pack and offset.
    pub damaged: Vec<String>,
}

fn bit(v: &[u64], i: usize) -> bool {
    v[i / 64] >> (i % 64) & 1 == 1
}

fn set(v: &mut [u64], i: usize) {
    v[i / 64] |= 1 << (i % 64);
}

/// Stored bytes per pack of what the live entries (`live(i)` for index
/// position `i`) take: each record's length times the share of its
/// chunks that are live. The index holds no chunk's length (manifests
/// do, of live chunks only), so the share is counted in chunks, which
/// content-defined chunking makes of like sizes. A record with a live
/// chunk counts at least one byte, so a pack is dead only when none is
/// live.
pub(crate) fn live_bytes_per_pack(index: &ChunkIndex, live: impl Fn(usize) -> bool) -> Vec<u64> {
    // (length, entries, live entries) per record.
    let mut records: HashMap<(u32, u32), (u32, u32, u32)> = HashMap::new();
    for i in 0..index.len() {
        let Some(loc) = index.location_at(i) else {
            continue;
        };
        let r = records
            .entry((loc.pack, loc.offset))
            .or_insert((loc.len, 0, 0));
        r.1 += 1;
        r.2 += u32::from(live(i));
    }
    let mut bytes = vec![0u64; index.packs().len()];
    for ((pack, _), (len, all, live)) in records {
        if live > 0 {
            bytes[pack as usize] += (u64::from(len) * u64::from(live) / u64::from(all)).max(1);
        }
    }
    bytes
}

/// Collect garbage.
pub fn gc(repo: &Repository, session: &Session, opts: &GcOptions) -> Result<GcReport> {
    let say = |s: &str| {
        if let Some(p) = opts.progress {
            p(s);
        }
    };
    let mut report = GcReport::default();
    // Damaged index files are set aside only after every pack they could
    // name has been indexed again from its records: nothing is lost track of.
    let w = repo.writer_index(session)?;
    // The entries of a damaged index file left in place are not in the
    // index: the chunks it lists would look unused, and their packs dead.
    if let Some(p) = w.damaged_left.first() {
        return Err(StoreError::Invalid(format!(
            "index file {} is damaged, and another cairn command is running, so the packs it \
             names cannot be indexed again from their records: gc deletes nothing until it runs \
             alone (or run `cairn repair` then)",
            p.display()
        )));
    }
    report.salvaged = w.salvaged;
    report.quarantined = w.quarantined;
    report.lost_packs = w.lost_packs;
    report.packs_kept = w.collected.packs_kept;
    report.deferred = w.collected.lists_waiting > 0;
    // Lists of earlier gcs worked off before this one's listing: their
    // packs were on disk when it began.
    let (earlier_packs, earlier_bytes) = w.collected.deleted_but(None);
    report.earlier_packs_deleted = earlier_packs;
    report.earlier_bytes_deleted = earlier_bytes;
    let mut index = w.index;
    report.chunks_before = index.len() as u64;
    if !opts.fix_lengths.is_empty() {
        let packs: Vec<PackId> = index.packs().iter().map(|p| p.id).collect();
        report.corrected = index.correct_lengths(|loc| {
            let pack = packs.get(loc.pack as usize)?;
            let key = (*pack, loc.offset, loc.slice, loc.len);
            opts.fix_lengths.get(&key).copied()
        }) as u64;
    }
    // A damaged record's chunks stored twice (see
    // `ChunkIndex::other_copies`) stay, in their sound copies: the index
    // uses those from now on, and the damaged ones are dead.
    if !opts.drop_records.is_empty() {
        let packs: Vec<PackId> = index.packs().iter().map(|p| p.id).collect();
        let damaged = |loc: Location| {
            packs
                .get(loc.pack as usize)
                .is_some_and(|id| opts.drop_records.contains(&(*id, loc.offset, loc.slice)))
        };
        report.switched = index.prefer(|loc| !damaged(loc)) as u64;
    }

    say("marking");
    // Entries of damaged records are never marked: they leave the index.
    let mut dropped = vec![0u64; index.len().div_ceil(64)];
    if !opts.drop_records.is_empty() {
        for i in 0..index.len() {
            let Some(loc) = index.location_at(i) else {
                continue;
            };
            if index
                .pack(loc.pack)
                .is_some_and(|p| opts.drop_records.contains(&(p.id, loc.offset, loc.slice)))
            {
                set(&mut dropped, i);
                report.dropped += 1;
            }
        }
    }
    let mut live = vec![0u64; index.len().div_ceil(64)];
    // Snapshots using chunks this run drops, or that its index lacks.
    let mut absent: Vec<(String, u64, Vec<ChunkId>)> = Vec::new();
    // How the live chunks were stored: the newest snapshot's codec spec
    // of each kind and the largest group, for records gc rewrites.
    let mut specs: HashMap<CodecKind, (i64, CodecSpec)> = HashMap::new();
    let mut group: Option<usize> = None;
    let images = repo.images()?;
    // A snapshot lost with no removal record (found by this listing or
    // one before) may be put back: its chunks stay until it is accepted
    // as gone.
    repo.refuse_vanished("gc")?;
    for (name, snaps) in images {
        for snap in snaps {
            // One removed since the listing (a forget or rm running
            // beside) uses nothing any more.
            let m = match repo.read_manifest_if_present(&name, snap) {
                Ok(Some(m)) => m,
                Ok(None) => continue,
                Err(e) => {
                    return Err(StoreError::Invalid(format!(
                        "gc refuses to run: {e}; remove the snapshot or repair it first"
                    )))
                }
            };
            if let Ok(spec) = m.codec.parse::<CodecSpec>() {
                let newest = specs.entry(spec.kind()).or_insert((m.created, spec));
                if m.created >= newest.0 {
                    *newest = (m.created, spec);
                }
            }
            let g = m.group.map_or(DEFAULT_GROUP_SIZE, |g| g as usize);
            group = Some(group.map_or(g, |was: usize| was.max(g)));
            let (mut dropped_here, mut unindexed) = (0u64, Vec::new());
            for e in &m.extents {
                if let Extent::Data { id, .. } = e {
                    match index.position(id) {
                        Some(i) if bit(&dropped, i) => dropped_here += 1,
                        Some(i) => set(&mut live, i),
                        None => unindexed.push(*id),
                    }
                }
            }
            if dropped_here > 0 || !unindexed.is_empty() {
                absent.push((format!("{name}@{snap}"), dropped_here, unindexed));
            }
        }
    }

    // The index was loaded before the manifests were listed: a backup
    // that committed in between (its index file, then its manifest) uses
    // chunks this index lacks and that are stored. Only what the index
    // files written since (not loaded here, named by no trash list) lack
    // too is missing; a record in a pack gone or cut short stays missing.
    // (The packs as they are on disk, listed once for this and for the
    // live bytes below.)
    let files = repo.pack_files()?;
    let on_disk: HashMap<PackId, u64> = files.iter().map(|f| (f.id, f.len)).collect();
    if absent.iter().any(|(_, _, u)| !u.is_empty()) {
        let trashed = repo.all_trash()?;
        let mut since: HashSet<ChunkId> = HashSet::new();
        for key in repo.index_files()? {
            let listed = key
                .as_str()
                .strip_prefix("index/")
                .is_some_and(|n| trashed.index_files.iter().any(|t| t == n));
            if w.files.contains(&key) || listed {
                continue;
            }
            // One that cannot be read leaves its chunks reported as
            // missing (the next writer sets it aside and says so).
            let Ok(Some(f)) = repo.read_index_file(&key) else {
                continue;
            };
            for (id, loc) in &f.entries {
                let stored = f.packs.get(loc.pack as usize).is_some_and(|p| {
                    on_disk
                        .get(&p.id)
                        .is_some_and(|&len| u64::from(loc.offset) + u64::from(loc.len) <= len)
                });
                if stored {
                    since.insert(*id);
                }
            }
        }
        for (_, _, unindexed) in &mut absent {
            unindexed.retain(|id| !since.contains(id));
        }
    }
    for (snapshot, dropped_here, unindexed) in absent {
        let n = dropped_here + unindexed.len() as u64;
        if n > 0 {
            report.missing.push(format!("{snapshot} ({n} extent(s))"));
        }
    }

    // Live bytes per pack (each record's share of live chunks), and the
    // files as they are on disk.
    let npacks = index.packs().len();
    let live_bytes = live_bytes_per_pack(&index, |i| bit(&live, i));
    let dead_entries = (0..index.len())
        .filter(|&i| !bit(&live, i) && index.location_at(i).is_some())
        .count() as u64;
    report.bytes_before = files.iter().map(|f| f.len).sum::<u64>() + earlier_bytes;
    // Packs that lost records (cut short, or damaged ones dropped): their
    // live records move out whatever the threshold, so the index no
    // longer names a pack that verify reports as cut, and the damaged
    // bytes go with the pack.
    let mut damaged = vec![false; index.packs().len()];
    for (n, p) in index.packs().iter().enumerate() {
        damaged[n] = on_disk.get(&p.id).is_some_and(|&len| len < p.len)
            || opts.rewrite_packs.contains(&p.id);
    }
    for i in 0..index.len() {
        if bit(&dropped, i) {
            if let Some(loc) = index.location_at(i) {
                damaged[loc.pack as usize] = true;
            }
        }
    }
    // (Damaged copies are in no entry: one whose chunk the index now
    // finds elsewhere, or never used.)
    let holding: HashSet<PackId> = opts.drop_records.iter().map(|r| r.0).collect();
    for (n, p) in index.packs().iter().enumerate() {
        damaged[n] |= holding.contains(&p.id);
    }
    let mut dead = Vec::new();
    let mut sparse = Vec::new();
    for (n, p) in index.packs().iter().enumerate() {
        let size = on_disk.get(&p.id).copied().unwrap_or(p.len).max(1);
        // Only the records count: a pack all live is not "below 1".
        let records = size.saturating_sub(crate::pack::PACK_HEADER_LEN as u64);
        if live_bytes[n] == 0 {
            dead.push(n);
        } else if damaged[n]
            || (live_bytes[n] < records && (live_bytes[n] as f64) < opts.repack_below * size as f64)
        {
            sparse.push(n);
        }
    }
    // Only the files loaded: one a concurrent writer wrote since is none
    // of gc's business.
    let old_files = w.files;
    // (Entries of cut or missing packs are not in `index` any more, but
    // in the index files still: those are written anew.)
    if dead.is_empty()
        && sparse.is_empty()
        && dead_entries == 0
        && old_files.len() <= 8
        && report.salvaged.empty.is_empty()
        && report.lost_packs.is_empty()
        && opts.drop_records.is_empty()
        && opts.rewrite_packs.is_empty()
        && report.corrected == 0
    {
        report.chunks_after = report.chunks_before;
        report.bytes_after = report.bytes_before - earlier_bytes;
        return Ok(report);
    }

    // Repack: copy the live records of sparse packs; a record whose
    // chunks are all live is copied verbatim, one with dead chunks is
    // decoded and its live chunks (each checked against its id) are
    // compressed again into new records, so that the dead ones go.
    say("repacking");
    let mut repacked = vec![false; npacks];
    let mut by_pack: HashMap<u32, Vec<(usize, Location)>> = HashMap::new();
    for i in 0..index.len() {
        if let Some(loc) = index.location_at(i) {
            if bit(&live, i) && sparse.contains(&(loc.pack as usize)) {
                by_pack.entry(loc.pack).or_default().push((i, loc));
            }
        }
    }
    let group = group_for_packs(group.unwrap_or(DEFAULT_GROUP_SIZE), repo.pack_size());
    let mut out = Repacker::new(repo, &specs, group);
    let reader = PackReader::new(repo, &index);
    let mut decoder = RecordDecoder::new(repo.crypt().cloned());
    let mut plain = Vec::new();
    let mut decoded = Vec::new();
    for &n in &sparse {
        let info = index.packs()[n];
        let path = reader.path(n as u32)?;
        // A cut pack is read as far as it goes (its records past the cut
        // are not in `index`).
        let len = on_disk.get(&info.id).map_or(info.len, |&l| l.min(info.len));
        let data = reader.read_pack(n as u32, len)?;
        let mut by_record: BTreeMap<u32, Vec<Location>> = BTreeMap::new();
        for (_, loc) in by_pack.get(&(n as u32)).map(|v| &v[..]).unwrap_or(&[]) {
            by_record.entry(loc.offset).or_default().push(*loc);
        }
        // Every live record is checked before anything is written.
        let mut whole = Vec::new();
        let mut loose = Vec::new();
        let mut damage = None;
        for (offset, locs) in &by_record {
            let (s, e) = (*offset as usize, *offset as usize + locs[0].len as usize);
            let Some(rec) = data.get(s..e) else {
                damage = Some(format!(
                    "{}: live record at offset {offset} runs past the end of the pack",
                    path.display()
                ));
                break;
            };
            let Some((r, _)) = open_record(rec, repo.crypt().map(|c| &**c), &mut plain)
                .ok()
                .filter(|(_, len)| *len == rec.len())
            else {
                damage = Some(format!(
                    "{}: live record at offset {offset} is damaged",
                    path.display()
                ));
                break;
            };
            let kind = r.header.codec;
            let chunks: Vec<(ChunkId, u32, u32)> = r.chunks().collect();
            let is_live = |slice: u32| locs.iter().any(|l| l.slice == slice);
            if chunks.iter().all(|c| is_live(c.1)) {
                let ids = chunks.iter().map(|&(id, slice, _)| (id, slice)).collect();
                whole.push((rec, ids));
                continue;
            }
            let at = u64::from(*offset);
            if let Err(e) = decoder.decode(&path, at, rec, &mut decoded) {
                damage = Some(format!("{e}"));
                break;
            }
            for &(id, slice, len) in chunks.iter().filter(|c| is_live(c.1)) {
                let Some(bytes) = decoded.get(slice as usize..(slice + len) as usize) else {
                    damage = Some(format!(
                        "{}: live record at offset {offset}: chunk {id} lies past the group",
                        path.display()
                    ));
                    break;
                };
                if let Err(e) = decoder.check_chunk(&path, at, &id, bytes) {
                    damage = Some(e.to_string());
                    break;
                }
                loose.push((kind, id, bytes.to_vec()));
            }
            if damage.is_some() {
                break;
            }
        }
        if let Some(d) = damage {
            // A damaged live record: keep the pack as it is, so that
            // nothing is lost that is not already lost; and say so.
            report.damaged.push(d);
            continue;
        }
        for (rec, ids) in whole {
            out.put(rec, ids)?;
        }
        for (kind, id, bytes) in loose {
            out.put_chunk(kind, id, &bytes)?;
            report.chunks_rewritten += 1;
        }
        repacked[n] = true;
        report.packs_repacked += 1;
    }
    let moved = out.finish()?;
    report.packs_written = moved.packs.len() as u64;

    // New index: live entries in kept packs, read back from the old files
    // for their full ids, plus the moved ones.
    say("writing the index");
    let mut fresh = moved;
    let mut table: HashMap<u32, u32> = HashMap::new();
    let mut emitted = vec![0u64; live.len()];
    let is_dead: Vec<bool> = (0..npacks).map(|n| dead.contains(&n)).collect();
    for key in &old_files {
        let Some(f) = repo.read_index_file(key)? else {
            continue;
        };
        for (id, loc) in &f.entries {
            let Some(i) = index.position(id) else {
                continue;
            };
            let Some(here) = index.location_at(i) else {
                continue;
            };
            let Some(global) = index.pack_number(&f.packs[loc.pack as usize].id) else {
                continue;
            };
            if !bit(&live, i)
                || bit(&emitted, i)
                || here.pack != global
                || here.offset != loc.offset
            {
                continue;
            }
            if is_dead[global as usize] || repacked[global as usize] {
                continue;
            }
            set(&mut emitted, i);
            let local = *table.entry(global).or_insert_with(|| {
                fresh.packs.push(index.packs()[global as usize]);
                fresh.packs.len() as u32 - 1
            });
            // (The location in memory: an entry repair corrects has its
            // record's length there, not the file's.)
            fresh.entries.push((
                *id,
                Location {
                    pack: local,
                    ..here
                },
            ));
        }
    }
    report.chunks_after = fresh.entries.len() as u64;
    let new_files = repo.write_index(session, &fresh)?;

    say("deleting");
    let mut garbage = Garbage::default();
    for key in &old_files {
        if !new_files.contains(key) {
            if let Some(n) = key.as_str().strip_prefix("index/") {
                garbage.index_files.push(n.to_string());
            }
        }
    }
    for (n, p) in index.packs().iter().enumerate() {
        if is_dead[n] || repacked[n] {
            garbage.packs.push((p.target, p.id.to_string()));
            if is_dead[n] {
                report.packs_deleted += 1;
            }
        }
    }
    for (t, id) in &report.salvaged.empty {
        garbage.packs.push((*t, id.to_string()));
    }
    garbage.dropped = opts
        .drop_records
        .iter()
        .map(|(id, offset, slice)| (id.to_string(), *offset, *slice))
        .collect();
    garbage.dropped.sort_unstable();
    let trash = repo.write_trash(session, garbage)?;
    // Temporaries of killed writers: a put's lives for milliseconds, so
    // one an hour old is abandoned.
    for folder in [
        "index",
        "snapshots",
        "removed",
        "trash",
        "sessions",
        "locks",
    ] {
        report.temporaries_removed += repo
            .backend()
            .sweep(folder, std::time::Duration::from_secs(3600))?;
    }
    let collected = collect_trash(repo, session, &opts.drop_records)?;
    report.packs_kept += collected.packs_kept;
    // Earlier gcs' lists whose sessions ended meanwhile (this one's own
    // is counted as its dead and repacked packs).
    let (later_packs, later_bytes) = collected.deleted_but(Some(&trash.key));
    report.earlier_packs_deleted += later_packs;
    report.earlier_bytes_deleted += later_bytes;
    report.deferred |= repo.trash_lists()?.iter().any(|t| t.key == trash.key);
    report.bytes_after = repo.pack_files()?.iter().map(|f| f.len).sum::<u64>();
    if report.deferred {
        let doomed: u64 = index
            .packs()
            .iter()
            .enumerate()
            .filter(|(n, _)| is_dead[*n] || repacked[*n])
            .map(|(_, p)| on_disk.get(&p.id).copied().unwrap_or(0))
            .sum();
        report.bytes_after = report.bytes_after.saturating_sub(doomed);
    }
    Ok(report)
}

/// What `collect_trash` did.
#[derive(Debug, Default, Clone)]
pub struct Collected {
    /// Trash lists deleted whole.
    pub lists_done: u64,
    /// Trash lists left, a session that began before each still running.
    pub lists_waiting: u64,
    /// Packs kept off the trash, since a snapshot uses chunks in them.
    pub packs_kept: u64,
    /// Per list worked off: its key, the packs it deleted and their
    /// bytes (as listed just before).
    pub deleted: Vec<(Key, u64, u64)>,
}

impl Collected {
    /// Packs and bytes deleted from lists other than `own`.
    pub fn deleted_but(&self, own: Option<&Key>) -> (u64, u64) {
        self.deleted
            .iter()
            .filter(|(k, _, _)| Some(k) != own)
            .fold((0, 0), |(p, b), (_, np, nb)| (p + np, b + nb))
    }
}

/// Delete what the trash lists name, for each list once every session it
/// recorded has ended (the protocol in this module's doc). Chunks a
/// snapshot uses that would be left without any copy keep their packs:
/// those are taken off the list and indexed again from their records.
pub(crate) fn collect_trash(
    repo: &Repository,
    session: &Session,
    dropped: &HashSet<(PackId, u32, u32)>,
) -> Result<Collected> {
    let mut out = Collected::default();
    let mut ready = Vec::new();
    for t in repo.trash_lists()? {
        let waiting = match &t.garbage.recording {
            None => {
                let mut live = false;
                for s in &t.garbage.sessions {
                    if s != session.id() && repo.session_liveness(s)? == Liveness::Live {
                        live = true;
                        break;
                    }
                }
                live
            }
            // Its gc is listing the sessions to wait for.
            Some(w) if repo.session_liveness(w)? == Liveness::Live => true,
            // Its gc died before it recorded them: any session running
            // then may use what it names, so wait until none but this one
            // runs.
            Some(_) => repo.others_running(session)?,
        };
        if waiting {
            out.lists_waiting += 1;
        } else {
            ready.push(t);
        }
    }
    if ready.is_empty() {
        return Ok(out);
    }
    // Manifests first, then the index: a snapshot read here had its index
    // files written before it, so they are in the listing that follows.
    let mut manifests = Vec::new();
    for (name, snaps) in repo.images()? {
        for snap in snaps {
            if let Some(m) = repo.read_manifest_if_present(&name, snap)? {
                manifests.push(m);
            }
        }
    }
    for mut t in ready {
        // A copy in a pack that any list will delete is no copy: another
        // gc's list may delete it (it cannot know this list counts on it).
        let doomed = repo.all_trash()?;
        let doomed_packs = doomed.pack_set();
        let after = repo.load_index_without(&doomed)?;
        // Without a file's entries its chunks would look missing, and
        // the trash list's packs be kept for them: stop instead.
        after.check_read()?;
        let after = after.index;
        let mut missing: HashSet<ChunkId> = HashSet::new();
        for m in &manifests {
            for e in &m.extents {
                if let Extent::Data { id, .. } = e {
                    if !after.contains(id) {
                        missing.insert(*id);
                    }
                }
            }
        }
        if !missing.is_empty() {
            // The records this collector was told are damaged, and those
            // the repair that wrote the list dropped.
            let dropped: HashSet<(PackId, u32, u32)> =
                dropped.union(&t.garbage.dropped_set()).copied().collect();
            let stored: HashMap<PackId, PackFile> =
                repo.pack_files()?.into_iter().map(|p| (p.id, p)).collect();
            let mine = t.garbage.pack_set();
            // Every copy of each, wherever an index file (this list's old
            // ones, if still there, and every other) puts it; not a record
            // that is gone (past the end of its pack) or that repair
            // dropped as damaged: it cannot be used again.
            let mut copies: HashMap<ChunkId, Vec<(u16, PackId)>> = HashMap::new();
            let mut keys = repo.index_files()?;
            for name in &t.garbage.index_files {
                let key = Key::new(format!("index/{name}"));
                if !keys.contains(&key) {
                    keys.push(key);
                }
            }
            for key in &keys {
                let Some(f) = repo.read_index_file(key)? else {
                    continue;
                };
                for (id, loc) in &f.entries {
                    if !missing.contains(id) {
                        continue;
                    }
                    let Some(p) = f.packs.get(loc.pack as usize) else {
                        continue;
                    };
                    let on_disk = stored
                        .get(&p.id)
                        .filter(|s| s.target == p.target)
                        .map_or(0, |f| f.len);
                    if dropped.contains(&(p.id, loc.offset, loc.slice))
                        || u64::from(loc.offset) + u64::from(loc.len) > on_disk
                    {
                        continue;
                    }
                    copies.entry(*id).or_default().push((p.target, p.id));
                }
            }
            // One copy kept per chunk: in a pack of this list (taken off
            // it), else in a pack no list names (its index entry was on
            // this list's files: indexed again). A chunk whose copies are
            // all on other lists is theirs to keep: each list keeps one
            // of its own, so two lists at once never both delete theirs.
            let mut keep: HashSet<(u16, PackId)> = HashSet::new();
            for c in copies.values() {
                let pick = c
                    .iter()
                    .find(|p| mine.contains(p))
                    .or_else(|| c.iter().find(|p| !doomed_packs.contains(p)));
                keep.extend(pick.copied());
            }
            tracing::debug!(
                list = t.key.as_str(),
                missing = missing.len(),
                found = copies.len(),
                keep = keep.len(),
                "trash list: chunks in use kept"
            );
            if copies.len() < missing.len() {
                tracing::warn!(
                    "trash list {}: {} chunk(s) that snapshots use have no sound copy in any \
                     pack (`cairn verify` names the snapshots; backing their sources up again \
                     stores the chunks again)",
                    t.key.as_str(),
                    missing.len() - copies.len()
                );
            }
            let mut found = IndexFile::default();
            let mut ignored = Salvaged::default();
            for (target, id) in &keep {
                let Some(pf) = stored.get(id).filter(|p| p.target == *target) else {
                    continue;
                };
                let Some((info, entries)) = repo.index_pack(pf, &mut ignored)? else {
                    continue;
                };
                let n = found.packs.len() as u32;
                let pack = info.id;
                found.packs.push(info);
                found.entries.extend(
                    entries
                        .into_iter()
                        .filter(|(_, loc)| !dropped.contains(&(pack, loc.offset, loc.slice)))
                        .map(|(id, loc)| (id, Location { pack: n, ..loc })),
                );
            }
            repo.write_index(session, &found)?;
            let before = t.garbage.packs.len();
            t.garbage.packs.retain(|(tg, id)| {
                PackId::from_hex(id).is_none_or(|id| !keep.contains(&(*tg, id)))
            });
            out.packs_kept += (before - t.garbage.packs.len()) as u64;
        }
        // A pack an index file outside every list still names stays: a
        // gc beside this one kept it (its view differed) and wrote an
        // index file naming it. Deleting it left that file naming a
        // missing pack (verify's false alarm, with warnings on every
        // command) until the next gc; that gc collects it instead.
        // (`after` was loaded from exactly those files; its pack table
        // keeps every pack they name, entries in doomed packs or not.)
        let named: HashSet<(u16, PackId)> =
            after.packs().iter().map(|p| (p.target, p.id)).collect();
        let before = t.garbage.packs.len();
        t.garbage
            .packs
            .retain(|(tg, id)| PackId::from_hex(id).is_none_or(|id| !named.contains(&(*tg, id))));
        out.packs_kept += (before - t.garbage.packs.len()) as u64;
        let packs: Vec<(u16, PackId)> = t.garbage.pack_set().into_iter().collect();
        tracing::debug!(list = t.key.as_str(), index_files = ?t.garbage.index_files,
            packs = packs.len(), "trash list worked off");
        let sizes: HashMap<(u16, PackId), u64> = repo
            .pack_files()?
            .into_iter()
            .map(|p| ((p.target, p.id), p.len))
            .collect();
        let present: Vec<u64> = packs.iter().filter_map(|p| sizes.get(p).copied()).collect();
        repo.delete_objects(&t.garbage.index_files, &packs)?;
        out.deleted
            .push((t.key.clone(), present.len() as u64, present.iter().sum()));
        t.garbage = Garbage::default();
        repo.rewrite_trash(&t)?;
        out.lists_done += 1;
    }
    Ok(out)
}

/// Writes gc's new packs: records copied as they are, and chunks of
/// records with dead ones, grouped again by codec kind and compressed.
struct Repacker<'a> {
    repo: &'a Repository,
    specs: &'a HashMap<CodecKind, (i64, CodecSpec)>,
    /// Raw bytes per new group (0: each chunk alone).
    group: usize,
    writer: Option<(PackWriter, u16)>,
    /// Packs opened so far, for spreading them over the targets.
    opened: usize,
    /// The new packs and their entries.
    moved: IndexFile,
    /// Chunks waiting to be grouped, per codec kind.
    pending: Vec<Waiting>,
    codecs: Vec<(CodecKind, Box<dyn BlockCodec>)>,
    probe: Probe,
    record: Vec<u8>,
}

/// Chunks waiting to be grouped into a record of codec kind `kind`: their
/// ids and lengths, and their bytes one after another.
struct Waiting {
    kind: CodecKind,
    table: Vec<(ChunkId, u32)>,
    raw: Vec<u8>,
}

impl<'a> Repacker<'a> {
    fn new(
        repo: &'a Repository,
        specs: &'a HashMap<CodecKind, (i64, CodecSpec)>,
        group: usize,
    ) -> Repacker<'a> {
        Repacker {
            repo,
            specs,
            group,
            writer: None,
            opened: 0,
            moved: IndexFile::default(),
            pending: Vec::new(),
            codecs: Vec::new(),
            probe: Probe::new(),
            record: Vec::new(),
        }
    }

    /// Append the record `rec` holding the chunks `ids` (id and offset in
    /// its group) to the open pack, sealed first if the record would take
    /// it past the pack size (as a backup does).
    fn put(&mut self, rec: &[u8], ids: Vec<(ChunkId, u32)>) -> Result<()> {
        let repo = self.repo;
        if self
            .writer
            .as_ref()
            .is_some_and(|(w, _)| !w.is_empty() && w.len() + rec.len() as u64 > repo.pack_size())
        {
            self.seal()?;
        }
        let (w, _) = match &mut self.writer {
            Some(w) => w,
            None => {
                let t = (self.opened % repo.target_count()) as u16;
                self.opened += 1;
                self.writer.insert((
                    PackWriter::create(&**repo.target(t)?, repo.id(), repo.sealed())?,
                    t,
                ))
            }
        };
        let at = w.append(rec)?;
        let pack = self.moved.packs.len() as u32;
        for (id, slice) in ids {
            self.moved.entries.push((
                id,
                Location {
                    pack,
                    offset: at as u32,
                    len: rec.len() as u32,
                    slice,
                },
            ));
        }
        if w.len() >= repo.pack_size() {
            self.seal()?;
        }
        Ok(())
    }

    /// Add chunk `id` (`bytes`), last stored with a codec of `kind`, to
    /// the group of its kind, writing the group first if it is full.
    fn put_chunk(&mut self, kind: CodecKind, id: ChunkId, bytes: &[u8]) -> Result<()> {
        let i = match self.pending.iter().position(|p| p.kind == kind) {
            Some(i) => i,
            None => {
                self.pending.push(Waiting {
                    kind,
                    table: Vec::new(),
                    raw: Vec::new(),
                });
                self.pending.len() - 1
            }
        };
        let w = &self.pending[i];
        if !w.table.is_empty()
            && (w.raw.len() + bytes.len() > self.group.min(MAX_GROUP_RAW)
                || w.table.len() == usize::from(u16::MAX))
        {
            self.write_group(i)?;
        }
        let w = &mut self.pending[i];
        w.table.push((id, bytes.len() as u32));
        w.raw.extend_from_slice(bytes);
        Ok(())
    }

    /// Compress and append the waiting group `i`.
    fn write_group(&mut self, i: usize) -> Result<()> {
        let w = &mut self.pending[i];
        let (kind, table, raw) = (
            w.kind,
            std::mem::take(&mut w.table),
            std::mem::take(&mut w.raw),
        );
        if table.is_empty() {
            return Ok(());
        }
        let c = match self.codecs.iter().position(|c| c.0 == kind) {
            Some(c) => c,
            None => {
                let spec = self
                    .specs
                    .get(&kind)
                    .map_or_else(|| CodecSpec::default_for(kind), |s| s.1);
                self.codecs.push((kind, spec.build()));
                self.codecs.len() - 1
            }
        };
        let mut record = std::mem::take(&mut self.record);
        record.clear();
        encode_record(
            &mut record,
            &table,
            &raw,
            self.codecs[c].1.as_mut(),
            &mut self.probe,
            self.repo.crypt().map(|c| &**c),
        )?;
        let mut slice = 0u32;
        let ids = table
            .iter()
            .map(|&(id, len)| {
                slice += len;
                (id, slice - len)
            })
            .collect();
        self.put(&record, ids)?;
        self.record = record;
        Ok(())
    }

    fn seal(&mut self) -> Result<()> {
        if let Some((w, target)) = self.writer.take() {
            let (id, len) = w.finish()?;
            self.moved.packs.push(PackInfo { id, target, len });
        }
        Ok(())
    }

    /// Write the waiting groups, seal the last pack, and give back the
    /// new packs and their entries.
    fn finish(mut self) -> Result<IndexFile> {
        for i in 0..self.pending.len() {
            self.write_group(i)?;
        }
        self.seal()?;
        Ok(self.moved)
    }
}
