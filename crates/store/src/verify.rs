//! `verify`: check that every snapshot can be restored, and name what
//! cannot.
//!
//! Always: every index file and manifest (envelope checksums), every chunk
//! a manifest names is in the index, every pack the index names exists
//! with at least its sealed length, and the trash lists are sound. With `read_data`: every record the
//! index names is read, its CRC checked, decoded and hashed against its id
//! (all packs in parallel, or a subset of them: [`DataSubset`]), and so
//! is every other copy of a chunk stored twice
//! ([`crate::index::ChunkIndex::other_copies`]): a damaged copy whose
//! other copy is sound affects no snapshot, since restore reads the sound
//! one, but it is damage all the same. A copy that could not be read
//! (an I/O or network error) is not known to be damaged: it is never
//! named damaged, nor taken for a damaged record. The length of every
//! chunk read sound is kept (about 30 bytes a chunk) and each manifest's
//! extents are checked against it: an extent that says a chunk holds
//! more or fewer bytes than it does makes its snapshot unrestorable.
//! Each problem lists the images, snapshots and offsets it affects.

use crate::error::Result;
use crate::id::{ChunkId, PackId, PREFIX_LEN};
use crate::index::{IdHash, Location, MAX_24};
use crate::manifest::Extent;
use crate::pack;
use crate::pack::RecordDecoder;
use crate::reader::PackReader;
use crate::repo::Repository;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// An entry sound once its record's own length is taken: its chunk,
/// where it says, the record's length, and whether it is another copy.
type WrongLength = (ChunkId, Location, u32, bool);

/// A decoded record's chunk table, or why it could not be decoded.
type Decoded = std::result::Result<Vec<(ChunkId, u32, u32)>, String>;

/// How to verify.
#[derive(Default)]
pub struct VerifyOptions<'a> {
    /// Read and check every stored chunk (of the packs `subset` picks).
    pub read_data: bool,
    /// With `read_data`, which packs are read.
    pub subset: DataSubset,
    /// Threads reading packs.
    pub threads: usize,
    /// Called with (bytes checked, bytes to check) while reading packs.
    pub progress: Option<&'a (dyn Fn(u64, u64) + Sync)>,
}

/// Which packs `verify` reads, as restic's `check --read-data-subset`:
/// a big remote repository is read a part at a time (each part in its
/// own run), or a sample of it each time.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum DataSubset {
    /// Every pack.
    #[default]
    All,
    /// Part `n` of `of` (1-based): the packs whose id, read as a number,
    /// is `n - 1` modulo `of`. The parts 1..=`of` together are every pack,
    /// each once, whatever the order of the runs.
    Part {
        /// Which part.
        n: u32,
        /// Of how many.
        of: u32,
    },
    /// This share of the packs (0 to 1, at least one pack), chosen at
    /// random anew on each run.
    Fraction(f64),
    /// Packs chosen at random until this many bytes are chosen (the
    /// last one may go past it).
    Bytes(u64),
}

impl DataSubset {
    /// The packs of `packs` (index number, path, length) it picks, in
    /// their order; `id(n)` is pack `n`'s id.
    fn pick<T>(
        self,
        packs: Vec<(usize, T, u64)>,
        id: impl Fn(usize) -> PackId,
    ) -> Vec<(usize, T, u64)> {
        let random_order = |mut packs: Vec<(usize, T, u64)>| {
            let seed = crate::id::random16();
            let mut keyed: Vec<(u64, (usize, T, u64))> = packs
                .drain(..)
                .map(|p| {
                    let mut h = blake3::Hasher::new();
                    h.update(&seed);
                    h.update(&id(p.0).0);
                    let mut k = [0u8; 8];
                    k.copy_from_slice(&h.finalize().as_bytes()[..8]);
                    (u64::from_le_bytes(k), p)
                })
                .collect();
            keyed.sort_unstable_by_key(|(k, _)| *k);
            keyed.into_iter().map(|(_, p)| p).collect::<Vec<_>>()
        };
        let mut picked = match self {
            DataSubset::All => return packs,
            DataSubset::Part { n, of } => packs
                .into_iter()
                .filter(|p| {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(&id(p.0).0[..8]);
                    u64::from_be_bytes(b) % u64::from(of.max(1)) == u64::from(n.saturating_sub(1))
                })
                .collect(),
            DataSubset::Fraction(f) => {
                let want = ((packs.len() as f64 * f.clamp(0.0, 1.0)).ceil() as usize).max(1);
                let mut v = random_order(packs);
                v.truncate(want);
                v
            }
            DataSubset::Bytes(limit) => {
                let mut total = 0u64;
                random_order(packs)
                    .into_iter()
                    .take_while(|p| {
                        let under = total < limit;
                        total += p.2;
                        under
                    })
                    .collect()
            }
        };
        picked.sort_unstable_by_key(|p| p.0);
        picked
    }
}

/// A place in an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Affected {
    /// Image name.
    pub image: String,
    /// Snapshot number.
    pub snapshot: u64,
    /// Offset of the chunk in the image.
    pub offset: u64,
}

/// One thing that is wrong.
#[derive(Debug, Clone)]
pub struct Problem {
    /// What kind: `index`, `key`, `manifest`, `pack`, `garbage`,
    /// `reserve`, `missing-chunk`, `damaged-chunk`, `unread-chunk` (in a
    /// pack that could not be read: an I/O or network error),
    /// `damaged-copy` (a damaged copy of a chunk stored twice whose other
    /// copy is sound), `unread-copy` (a copy of a chunk stored twice that
    /// could not be read, whose other copy is sound: not known damaged),
    /// `vanished-snapshot` (a snapshot this machine saw is gone with no
    /// removal record), `unreadable-removal-record` (one it saw is gone
    /// and its removal record could not be read: not known lost).
    pub kind: &'static str,
    /// One line saying what and where.
    pub message: String,
    /// The chunk, when the problem is one chunk.
    pub chunk: Option<ChunkId>,
    /// Where the problem shows in images.
    pub affected: Vec<Affected>,
}

/// What verify found.
#[derive(Debug, Clone, Default)]
pub struct VerifyReport {
    /// Images.
    pub images: usize,
    /// Snapshots.
    pub snapshots: usize,
    /// Chunks in the index.
    pub chunks: usize,
    /// Packs in the index.
    pub packs: usize,
    /// Bytes of packs read (with `read_data`): not those of reads that
    /// failed.
    pub bytes_read: u64,
    /// Packs read (with `read_data`: all of them, or the subset's), but
    /// those whose read failed.
    pub packs_read: usize,
    /// Everything wrong; empty when the repository is sound.
    pub problems: Vec<Problem>,
    /// Packs on disk that no index names (left by an interrupted backup
    /// or gc: reused by the next backup, removed by gc). Not a problem.
    pub unindexed_packs: Vec<PathBuf>,
    /// Records the index names that are certainly damaged or gone (a
    /// missing or short pack, a bad pack header, a record that fails its
    /// CRC, does not decode or holds a chunk that does not hash to its
    /// id): what `repair` drops from the index. (pack, record offset).
    pub damaged_records: Vec<(PackId, u32, u32)>,
    /// Packs that could not be read (an I/O or network error), each its
    /// error: their records are neither known sound nor known damaged.
    pub unread_packs: Vec<String>,
    /// Packs whose header is damaged (a problem of its own): their
    /// records were checked on their own, and `repair` rewrites them.
    pub damaged_headers: Vec<PackId>,
    /// Chunks whose copy the index uses is damaged but that have another
    /// copy found sound (`damaged-copy` problems): `repair` has the index
    /// use those.
    pub recoverable: usize,
    /// Packs longer than they were sealed (bytes appended by something
    /// else: a problem of its own, no record lost): `repair` rewrites
    /// them.
    pub overlong_packs: Vec<PackId>,
    /// Index entries whose record length is wrong while the record at
    /// their offset is sound and holds their chunk (`index-entry`
    /// problems: a hand edit of a plain repository's index, or a writer's
    /// bug): `repair` corrects them.
    pub misindexed: Vec<WrongEntry>,
}

/// An index entry that gives its record a wrong length
/// ([`VerifyReport::misindexed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WrongEntry {
    /// Where the entry says its chunk is: pack, record offset, offset
    /// in the decoded group.
    pub pack: PackId,
    /// Record offset.
    pub offset: u32,
    /// Offset of the chunk in the decoded group.
    pub slice: u32,
    /// The record length the entry says.
    pub says: u32,
    /// The length of the record at that offset (its header's).
    pub own: u32,
}

/// Verify the repository.
pub fn verify(repo: &Repository, opts: &VerifyOptions) -> Result<VerifyReport> {
    let _session = repo.session("cairn verify")?;
    let mut report = VerifyReport::default();
    let loaded = repo.load_index()?;
    // Without an index file's entries its chunks would be reported
    // missing: a read that failed is the check's error, no finding.
    loaded.check_read()?;
    let index = &loaded.index;
    report.chunks = index.len();
    report.packs = index.packs().len();
    for e in &loaded.damaged {
        report.problems.push(Problem {
            kind: "index",
            message: format!("{e} (the chunks it lists count as missing)"),
            chunk: None,
            affected: Vec::new(),
        });
    }

    // Every key file (of an encrypted repository) sound: a damaged one
    // locks out whoever holds its password, though this one opens.
    let (_, damaged_keys) = repo.key_list()?;
    for (id, why) in damaged_keys {
        report.problems.push(Problem {
            kind: "key",
            message: format!(
                "key {id}: {why} (its password no longer opens the repository; `cairn key \
                 add` with another key, then `cairn key remove {id}`)"
            ),
            chunk: None,
            affected: Vec::new(),
        });
    }

    // The trash lists: sound, naming only index files and packs. (A chunk
    // a snapshot uses may be on one only: a snapshot committed beside a
    // gc; the collection keeps its pack, so that is no damage.)
    if let Err(e) = repo.trash_lists() {
        report.problems.push(Problem {
            kind: "garbage",
            message: e.to_string(),
            chunk: None,
            affected: Vec::new(),
        });
    }

    // The reserve (no data, but damage there is damage the disk did).
    if let Err(e) = repo.check_reserve(opts.read_data) {
        report.problems.push(Problem {
            kind: "reserve",
            message: format!(
                "{e}; the reserve holds no data, so no snapshot is affected, and gc writes it \
                 anew"
            ),
            chunk: None,
            affected: Vec::new(),
        });
    }

    // Chunks known to be bad, by prefix, with the reason.
    let mut bad: HashMap<[u8; PREFIX_LEN], (ChunkId, &'static str, String), IdHash> =
        HashMap::default();

    // Packs: present, long enough, and (read_data) every record sound.
    let on_disk: HashMap<_, _> = repo.pack_files()?.into_iter().map(|p| (p.id, p)).collect();
    for p in on_disk.values() {
        if index.pack_number(&p.id).is_none() {
            report.unindexed_packs.push(p.path.clone());
        }
    }
    report.unindexed_packs.sort();
    // Each pack's records: the copies the index uses, and (`true`) the
    // other copies of chunks stored twice, which restore turns to when the
    // first is damaged.
    let mut by_pack: Vec<Vec<([u8; PREFIX_LEN], Location, bool)>> =
        vec![Vec::new(); index.packs().len()];
    let copies = index.other_locations().map(|(p, l)| (p, l, true));
    for (prefix, loc, copy) in index.locations().map(|(p, l)| (p, l, false)).chain(copies) {
        if let Some(v) = by_pack.get_mut(loc.pack as usize) {
            v.push((prefix, loc, copy));
        }
    }
    let reader = PackReader::new(repo, index);
    let mut readable = Vec::new();
    let mut damaged_records: HashSet<(PackId, u32, u32)> = HashSet::new();
    for (n, info) in index.packs().iter().enumerate() {
        let path = reader.path(n as u32)?;
        let problem = match on_disk.get(&info.id) {
            None => Some(format!("pack {} is missing", path.display())),
            Some(f) if f.len < info.len => Some(format!(
                "pack {} is {} bytes, it was sealed at {}",
                path.display(),
                f.len,
                info.len
            )),
            Some(_) => None,
        };
        match problem {
            Some(msg) => {
                // (The index uses another copy of a chunk where one is on
                // disk, and keeps none that is not: `load_index`.)
                for (prefix, loc, _) in by_pack[n].iter().filter(|e| !e.2) {
                    if u64::from(loc.offset) + u64::from(loc.len)
                        > on_disk.get(&info.id).map_or(0, |f| f.len)
                    {
                        bad.insert(*prefix, (ChunkId([0; 32]), "pack", msg.clone()));
                        damaged_records.insert((info.id, loc.offset, loc.slice));
                    }
                }
                report.problems.push(Problem {
                    kind: "pack",
                    message: msg,
                    chunk: None,
                    affected: Vec::new(),
                });
            }
            None => {
                // Bytes past the sealed end: nothing cairn wrote (a sealed
                // pack never grows), its records unaffected; repair copies
                // them into a new pack.
                if let Some(f) = on_disk.get(&info.id).filter(|f| f.len > info.len) {
                    report.problems.push(Problem {
                        kind: "pack-tail",
                        message: format!(
                            "pack {} is {} bytes, it was sealed at {}: the {} bytes past its \
                             end are none of cairn's (its records are unaffected; `cairn \
                             repair` rewrites the pack)",
                            path.display(),
                            f.len,
                            info.len,
                            f.len - info.len
                        ),
                        chunk: None,
                        affected: Vec::new(),
                    });
                    report.overlong_packs.push(info.id);
                }
                readable.push((n, path, info.len))
            }
        }
    }

    // What the read of the packs found: the records the index uses that
    // are damaged and the other copies that are, by chunk, with why; the
    // chunks with another copy found sound; the packs read.
    let mut found_primary: Vec<([u8; PREFIX_LEN], ChunkId, String)> = Vec::new();
    let mut found_other: Vec<([u8; PREFIX_LEN], ChunkId, String)> = Vec::new();
    let mut sound: HashSet<[u8; PREFIX_LEN], IdHash> = HashSet::default();
    let mut read_packs: HashSet<u32> = HashSet::new();
    let mut unread: HashSet<[u8; PREFIX_LEN], IdHash> = HashSet::default();
    let mut unread_copies: Vec<([u8; PREFIX_LEN], String)> = Vec::new();
    let mut chunk_lengths: HashMap<[u8; PREFIX_LEN], u32, IdHash> = HashMap::default();
    if opts.read_data {
        let readable = opts.subset.pick(readable, |n| index.packs()[n].id);
        read_packs.extend(readable.iter().map(|r| r.0 as u32));
        let total: u64 = readable.iter().map(|r| r.2).sum();
        let done = AtomicU64::new(0);
        let next = AtomicUsize::new(0);
        let found: Mutex<Vec<([u8; PREFIX_LEN], ChunkId, String)>> = Mutex::default();
        // Other copies found damaged, and those found sound.
        let found_copies: Mutex<Vec<([u8; PREFIX_LEN], ChunkId, String)>> = Mutex::default();
        let sound_copies: Mutex<HashSet<[u8; PREFIX_LEN], IdHash>> = Mutex::default();
        let found_records: Mutex<Vec<(PackId, u32, u32)>> = Mutex::default();
        let found_lengths: Mutex<Vec<WrongLength>> = Mutex::default();
        let bad_headers: Mutex<Vec<(PackId, String)>> = Mutex::default();
        let io_errors: Mutex<Vec<String>> = Mutex::default();
        let packs_read = AtomicUsize::new(0);
        // The length of each chunk read sound, for the manifests' extents.
        let lengths: Mutex<HashMap<[u8; PREFIX_LEN], u32, IdHash>> = Mutex::default();
        // Chunks of packs that could not be read: not known damaged.
        let unread_chunks: Mutex<HashSet<[u8; PREFIX_LEN], IdHash>> = Mutex::default();
        // Other copies in packs that could not be read, with why.
        let unread_others: Mutex<Vec<([u8; PREFIX_LEN], String)>> = Mutex::default();
        std::thread::scope(|s| {
            // (A remote store is kept busy by several packs in flight.)
            for _ in 0..opts.threads.max(1) * reader.reads_per_core() {
                s.spawn(|| {
                    let mut dec = reader.record_decoder();
                    let mut group = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some((n, path, len)) = readable.get(i) else {
                            break;
                        };
                        let data = match reader.read_pack(*n as u32, *len) {
                            Ok(d) => d,
                            // Not an I/O error (a pack cut short since the
                            // listing, a store sending more than asked
                            // for): its chunks are damage, never silent,
                            // but which records is not known (the read
                            // does not say where the pack ends now), so
                            // none is taken for repair to drop, and the
                            // pack stops repair as an unread one does:
                            // the next run lists its length anew and
                            // takes only the records past its end.
                            Err(e) if !e.is_read_failure() => {
                                let why = format!(
                                    "{e} (the pack changed since verify listed it: run verify \
                                     again before `cairn repair`, which stops until then)"
                                );
                                if let (Ok(mut v), Ok(mut c)) = (found.lock(), found_copies.lock())
                                {
                                    for (prefix, _, copy) in &by_pack[*n] {
                                        let to = if *copy { &mut c } else { &mut v };
                                        to.push((*prefix, ChunkId([0; 32]), why.clone()));
                                    }
                                }
                                if let Ok(mut v) = io_errors.lock() {
                                    v.push(format!(
                                        "{e} (changed since verify listed it: run again)"
                                    ));
                                }
                                continue;
                            }
                            Err(e) => {
                                let why = e.to_string();
                                if let (Ok(mut v), Ok(mut u), Ok(mut o)) =
                                    (found.lock(), unread_chunks.lock(), unread_others.lock())
                                {
                                    for (prefix, _, copy) in &by_pack[*n] {
                                        if *copy {
                                            o.push((*prefix, why.clone()));
                                        } else {
                                            v.push((*prefix, ChunkId([0; 32]), why.clone()));
                                            u.insert(*prefix);
                                        }
                                    }
                                }
                                if let Ok(mut v) = io_errors.lock() {
                                    v.push(why);
                                }
                                continue;
                            }
                        };
                        let mut header_err =
                            pack::check_pack_header(path, &data, repo.id(), repo.sealed()).err();
                        // A damaged header is a problem of its own; the
                        // records after it are checked as any others.
                        if let Some(e) = header_err.take_if(|_| pack::header_damaged(&data)) {
                            if let Ok(mut v) = bad_headers.lock() {
                                v.push((index.packs()[*n].id, e.to_string()));
                            }
                        }
                        // Entries sorted by record (and the length each
                        // gives it), so each record is decoded once.
                        let mut entries = by_pack[*n].clone();
                        entries.sort_unstable_by_key(|(_, l, _)| (l.offset, l.len, l.slice));
                        // The record last decoded, by (offset, length the
                        // entries give), and its own length where that
                        // differs and it decodes at that one.
                        let mut last: Option<((u32, u32), Decoded, Option<u32>)> = None;
                        let mut sizes = Vec::new();
                        for (prefix, loc, copy) in &entries {
                            if last.as_ref().map(|l| l.0) != Some((loc.offset, loc.len)) {
                                let (decoded, own) = match &header_err {
                                    Some(e) => (Err(e.to_string()), None),
                                    None => decode_record(&mut dec, path, &data, *loc, &mut group),
                                };
                                last = Some(((loc.offset, loc.len), decoded, own));
                            }
                            let verdict = match last.as_ref() {
                                Some((_, decoded, _)) => {
                                    chunk_verdict(&mut dec, path, *loc, prefix, decoded, &group)
                                        .map(Some)
                                }
                                None => Ok(None),
                            };
                            // Sound at the record's own length, not the
                            // entry's: the entry is wrong, not the data
                            // (and no copy restore can read until
                            // repair corrects it).
                            let mut wrong = false;
                            if let (Ok(Some(_)), Some((_, Ok(table), Some(own)))) =
                                (&verdict, last.as_ref())
                            {
                                wrong = true;
                                let id = table.iter().find(|(_, at, _)| *at == loc.slice);
                                if let (Some((id, _, _)), Ok(mut v)) = (id, found_lengths.lock()) {
                                    v.push((*id, *loc, *own, *copy));
                                }
                            }
                            let verdict_failed = verdict.is_err();
                            if let Ok(Some(n)) = verdict {
                                sizes.push((*prefix, n));
                            }
                            match (verdict, copy) {
                                (Ok(_), false) => {}
                                (Ok(_), true) if wrong => {}
                                (Ok(_), true) => {
                                    if let Ok(mut v) = sound_copies.lock() {
                                        v.insert(*prefix);
                                    }
                                }
                                (Err((id, why)), copy) => {
                                    let to = if *copy { &found_copies } else { &found };
                                    if let Ok(mut v) = to.lock() {
                                        v.push((*prefix, id, why));
                                    }
                                }
                            }
                            if verdict_failed {
                                if let Ok(mut v) = found_records.lock() {
                                    v.push((index.packs()[*n].id, loc.offset, loc.slice));
                                }
                            }
                        }
                        if let Ok(mut l) = lengths.lock() {
                            l.extend(sizes);
                        }
                        packs_read.fetch_add(1, Ordering::Relaxed);
                        let d = done.fetch_add(*len, Ordering::Relaxed) + len;
                        if let Some(p) = opts.progress {
                            p(d, total);
                        }
                    }
                });
            }
        });
        // (Only the packs read: not those whose read failed.)
        report.bytes_read = done.load(Ordering::Relaxed);
        report.packs_read = packs_read.load(Ordering::Relaxed);
        damaged_records.extend(found_records.into_inner().unwrap_or_default());
        for (id, why) in bad_headers.into_inner().unwrap_or_default() {
            report.problems.push(Problem {
                kind: "pack-header",
                message: format!(
                    "{why} (its records were checked on their own; `cairn repair` rewrites the \
                     pack)"
                ),
                chunk: None,
                affected: Vec::new(),
            });
            report.damaged_headers.push(id);
        }
        report.unread_packs = io_errors.into_inner().unwrap_or_default();
        report.unread_packs.sort();
        for msg in &report.unread_packs {
            report.problems.push(Problem {
                kind: "pack",
                message: msg.clone(),
                chunk: None,
                affected: Vec::new(),
            });
        }
        unread = unread_chunks.into_inner().unwrap_or_default();
        unread_copies = unread_others.into_inner().unwrap_or_default();
        found_primary = found.into_inner().unwrap_or_default();
        found_other = found_copies.into_inner().unwrap_or_default();
        sound = sound_copies.into_inner().unwrap_or_default();
        chunk_lengths = lengths.into_inner().unwrap_or_default();
        let mut wrong = found_lengths.into_inner().unwrap_or_default();
        wrong.sort_unstable_by_key(|(id, loc, _, _)| (loc.pack, loc.offset, loc.slice, *id));
        for (id, loc, own, copy) in wrong {
            let pack = index.packs()[loc.pack as usize].id;
            report.misindexed.push(WrongEntry {
                pack,
                offset: loc.offset,
                slice: loc.slice,
                says: loc.len,
                own,
            });
            let why = format!(
                "the index says its record at offset {} of pack {pack} is {} bytes; the record \
                 there is {own} bytes and holds the chunk sound (`cairn repair` corrects the \
                 index)",
                loc.offset, loc.len
            );
            // Restore reads another copy that is sound: then no snapshot
            // is affected.
            let note = match (copy, sound.contains(&id.prefix())) {
                (true, _) => " (a second copy, not the one the index uses)",
                (false, true) => "; another copy of it is sound, and restore reads that one",
                (false, false) => {
                    bad.insert(id.prefix(), (id, "index-entry", why));
                    continue;
                }
            };
            report.problems.push(Problem {
                kind: "index-entry",
                message: format!("chunk {id}: {why}{note}"),
                chunk: Some(id),
                affected: Vec::new(),
            });
        }
    }

    // A chunk whose record the index uses is damaged affects no snapshot
    // where another copy is sound: restore reads that one. A copy in a
    // pack this run did not read (not in the subset) is read now.
    let mut copy = CopyRecord {
        dec: reader.record_decoder(),
        at: None,
        path: PathBuf::new(),
        table: Ok(Vec::new()),
        rec: Vec::new(),
        group: Vec::new(),
        unread: false,
    };
    for (prefix, _, _) in &found_primary {
        for loc in index.other_copies_of(*prefix) {
            if sound.contains(prefix) {
                break;
            }
            if read_packs.contains(&loc.pack) {
                continue;
            }
            match copy.check(&reader, loc, prefix, &mut report.bytes_read) {
                Ok(_) => {
                    sound.insert(*prefix);
                }
                // An I/O or network error: the copy is not known damaged.
                Err((_, why)) if copy.unread => unread_copies.push((*prefix, why)),
                Err((id, why)) => {
                    found_other.push((*prefix, id, why));
                    damaged_records.insert((
                        index.packs()[loc.pack as usize].id,
                        loc.offset,
                        loc.slice,
                    ));
                }
            }
        }
    }
    let mut copy_problems = Vec::new();
    for (prefix, id, why) in found_primary {
        if !sound.contains(&prefix) {
            // A network error says nothing of the chunk: a problem of
            // its own kind, which repair does not act on.
            let (kind, why) = match unread.contains(&prefix) {
                true => (
                    "unread-chunk",
                    format!("{why} (not read, so not known to be damaged: run verify again)"),
                ),
                false => ("damaged-chunk", why),
            };
            bad.insert(prefix, (id, kind, why));
            continue;
        }
        if unread.contains(&prefix) {
            // Nothing for repair to do: the copy is not known damaged.
            copy_problems.push(Problem {
                kind: "unread-copy",
                message: format!(
                    "chunk {}: {why} (the copy the index uses; not read, so not known to be \
                     damaged: another copy of it is sound, and restore reads that one; run \
                     verify again)",
                    shown(&prefix, named(id))
                ),
                chunk: named(id),
                affected: Vec::new(),
            });
            continue;
        }
        report.recoverable += 1;
        copy_problems.push(Problem {
            kind: "damaged-copy",
            message: format!(
                "chunk {}: {why}; another copy of it is sound, and restore reads that one \
                 (`cairn repair` has the index use it)",
                shown(&prefix, named(id))
            ),
            chunk: named(id),
            affected: Vec::new(),
        });
    }
    for (prefix, id, why) in found_other {
        // Both copies damaged: one problem, the chunk's.
        if let Some((_, _, first)) = bad.get_mut(&prefix) {
            first.push_str(&format!("; its other copy is damaged too: {why}"));
            continue;
        }
        copy_problems.push(Problem {
            kind: "damaged-copy",
            message: format!(
                "chunk {}: {why} (a second copy, not the one the index uses: no snapshot is \
                 affected; `cairn repair` drops it)",
                shown(&prefix, named(id))
            ),
            chunk: named(id),
            affected: Vec::new(),
        });
    }
    for (prefix, why) in unread_copies {
        if let Some((_, _, first)) = bad.get_mut(&prefix) {
            first.push_str(&format!("; its other copy could not be read: {why}"));
            continue;
        }
        copy_problems.push(Problem {
            kind: "unread-copy",
            message: format!(
                "chunk {}: {why} (a second copy, not the one the index uses; not read, so not \
                 known to be damaged: no snapshot is affected if the copy the index uses is \
                 sound; run verify again)",
                shown(&prefix, None)
            ),
            chunk: None,
            affected: Vec::new(),
        });
    }
    copy_problems.sort_by(|a, b| a.message.cmp(&b.message));
    report.problems.append(&mut copy_problems);

    // Manifests: readable, every chunk present and not bad.
    let mut missing: HashMap<[u8; PREFIX_LEN], (ChunkId, Vec<Affected>), IdHash> =
        HashMap::default();
    let mut hit: HashMap<[u8; PREFIX_LEN], (ChunkId, Vec<Affected>), IdHash> = HashMap::default();
    let images = repo.images()?;
    report.images = images.len();
    for (name, snapshot) in repo.vanished() {
        report.problems.push(Problem {
            kind: "vanished-snapshot",
            message: format!(
                "{}; `cairn verify --accept-vanished` forgets it",
                crate::seen::gone_without_record(&[(name, snapshot)], repo.location())
            ),
            chunk: None,
            affected: Vec::new(),
        });
    }
    for (name, snapshot, error) in repo.unreadable_removals() {
        report.problems.push(Problem {
            kind: "unreadable-removal-record",
            message: format!(
                "snapshot {name}@{snapshot} was seen on this machine and is gone from {}, and \
                 its removal record cannot be read ({error}): whether it was removed or lost is \
                 not known, and gc deletes nothing until it is",
                repo.location()
            ),
            chunk: None,
            affected: Vec::new(),
        });
    }
    for (name, snaps) in &images {
        for &snap in snaps {
            report.snapshots += 1;
            let m = match repo.read_manifest_if_present(name, snap) {
                Ok(Some(m)) => m,
                Ok(None) => {
                    report.snapshots -= 1;
                    continue;
                }
                Err(e) => {
                    report.problems.push(Problem {
                        kind: "manifest",
                        message: format!("{name}@{snap} cannot be restored: {e}"),
                        chunk: None,
                        affected: vec![Affected {
                            image: name.clone(),
                            snapshot: snap,
                            offset: 0,
                        }],
                    });
                    continue;
                }
            };
            let mut seen: HashSet<[u8; PREFIX_LEN], IdHash> = HashSet::default();
            let mut told = false;
            for (off, e) in m.with_offsets() {
                let Extent::Data { id, len } = e else {
                    continue;
                };
                let prefix = id.prefix();
                // A chunk read sound is as long as its extents say, or
                // the snapshot restores wrong (the restore blames the
                // pack): said once per snapshot.
                if let Some(&n) = chunk_lengths.get(&prefix).filter(|&&n| n != *len) {
                    if !told {
                        told = true;
                        report.problems.push(Problem {
                            kind: "manifest",
                            message: format!(
                                "{name}@{snap} cannot be restored: its extent at offset {off} \
                                 says chunk {id} holds {len} bytes, the chunk read holds {n}"
                            ),
                            chunk: Some(*id),
                            affected: vec![Affected {
                                image: name.clone(),
                                snapshot: snap,
                                offset: off,
                            }],
                        });
                    }
                }
                let place = Affected {
                    image: name.clone(),
                    snapshot: snap,
                    offset: off,
                };
                if bad.contains_key(&prefix) {
                    hit.entry(prefix)
                        .or_insert_with(|| (*id, Vec::new()))
                        .1
                        .push(place);
                } else if seen.contains(&prefix) {
                } else if !index.contains(id) {
                    missing
                        .entry(prefix)
                        .or_insert_with(|| (*id, Vec::new()))
                        .1
                        .push(place);
                } else {
                    seen.insert(prefix);
                }
            }
        }
    }
    let mut missing: Vec<_> = missing.into_values().collect();
    missing.sort_by_key(|m| m.0);
    for (id, affected) in missing {
        report.problems.push(Problem {
            kind: "missing-chunk",
            message: format!("chunk {id} is not in the index (its pack or index file is lost)"),
            chunk: Some(id),
            affected,
        });
    }
    report.damaged_records = damaged_records.into_iter().collect();
    report.damaged_records.sort_unstable();
    let mut damaged: Vec<_> = bad.into_iter().collect();
    damaged.sort_by_key(|d| d.0);
    for (prefix, (id, kind, why)) in damaged {
        let (full, affected) = match hit.remove(&prefix) {
            Some((full, aff)) => (Some(full), aff),
            None => (named(id), Vec::new()),
        };
        let kind = if kind == "pack" {
            "damaged-chunk"
        } else {
            kind
        };
        let unused = if affected.is_empty() {
            " (no snapshot uses it)"
        } else {
            ""
        };
        let shown = shown(&prefix, full);
        report.problems.push(Problem {
            kind,
            message: format!("chunk {shown}: {why}{unused}"),
            chunk: full,
            affected,
        });
    }
    Ok(report)
}

/// Decode the record entry `loc` names in the whole pack `data` (its
/// group into `group`). Where that fails at the entry's length, the
/// record at the entry's offset is decoded at its own length (from its
/// header) and, when it decodes there, returned with that length: the
/// entry is wrong then, not the data.
fn decode_record(
    dec: &mut RecordDecoder,
    path: &Path,
    data: &[u8],
    loc: Location,
    group: &mut Vec<u8>,
) -> (Decoded, Option<u32>) {
    let decoded = decode_at(dec, path, data, loc.offset, loc.len as usize, group);
    if decoded.is_ok() {
        return (decoded, None);
    }
    let own = data
        .get(loc.offset as usize..)
        .and_then(|d| dec.length_at(d))
        .filter(|&len| len != loc.len as usize && len <= MAX_24 as usize);
    if let Some(len) = own {
        let table = decode_at(dec, path, data, loc.offset, len, group);
        if let (Ok(table), Ok(len)) = (table, u32::try_from(len)) {
            return (Ok(table), Some(len));
        }
    }
    (decoded, None)
}

/// Decode the `len` bytes at `offset` of the whole pack `data` as a
/// record (its group into `group`): its chunk table, or why not.
fn decode_at(
    dec: &mut RecordDecoder,
    path: &Path,
    data: &[u8],
    offset: u32,
    len: usize,
    group: &mut Vec<u8>,
) -> Decoded {
    let start = offset as usize;
    match data.get(start..start.saturating_add(len)) {
        None => Err("record runs past the end of the pack".to_string()),
        Some(rec) => dec
            .decode(path, u64::from(offset), rec, group)
            .map(|r| r.chunks().collect())
            .map_err(|e| e.to_string()),
    }
}

/// Whether chunk `prefix` is sound at `loc`, in a record that decoded to
/// `table` (its chunks in `group`), or why not, with the id found there
/// (zeros where none is).
fn chunk_verdict(
    dec: &mut RecordDecoder,
    path: &Path,
    loc: Location,
    prefix: &[u8; PREFIX_LEN],
    table: &Decoded,
    group: &[u8],
) -> std::result::Result<u32, (ChunkId, String)> {
    let table = table
        .as_ref()
        .map_err(|why| (ChunkId([0; 32]), why.clone()))?;
    match table.iter().find(|(_, at, _)| *at == loc.slice) {
        Some((id, at, n)) if id.prefix() == *prefix => {
            let chunk = &group[*at as usize..(*at + *n) as usize];
            dec.check_chunk(path, u64::from(loc.offset), id, chunk)
                .map(|()| *n)
                .map_err(|e| (*id, e.to_string()))
        }
        Some((id, _, _)) => Err((
            *id,
            format!("record at offset {} holds another chunk there", loc.offset),
        )),
        None => Err((
            ChunkId([0; 32]),
            format!(
                "record at offset {} has no chunk at {}",
                loc.offset, loc.slice
            ),
        )),
    }
}

/// Records read one at a time for the other copies of damaged chunks:
/// the last one decoded (pack, offset, length), kept for the next chunk
/// in it (the chunks of a damaged record have their copies together,
/// mostly in one record), so it is read and decoded once.
struct CopyRecord {
    dec: RecordDecoder,
    at: Option<(u32, u32, u32)>,
    path: PathBuf,
    table: Decoded,
    rec: Vec<u8>,
    group: Vec<u8>,
    /// The last record could not be read (an I/O or network error): its
    /// chunks are not known to be damaged.
    unread: bool,
}

impl CopyRecord {
    /// Check chunk `prefix` at `loc`, reading its record unless it is the
    /// one read last (counted in `bytes_read` once read).
    fn check(
        &mut self,
        reader: &PackReader,
        loc: Location,
        prefix: &[u8; PREFIX_LEN],
        bytes_read: &mut u64,
    ) -> std::result::Result<u32, (ChunkId, String)> {
        if self.at != Some((loc.pack, loc.offset, loc.len)) {
            self.at = Some((loc.pack, loc.offset, loc.len));
            self.unread = false;
            self.table = match reader.read_record(loc, &mut self.rec) {
                Ok(path) => {
                    *bytes_read += u64::from(loc.len);
                    let table = self
                        .dec
                        .decode(&path, u64::from(loc.offset), &self.rec, &mut self.group)
                        .map(|r| r.chunks().collect())
                        .map_err(|e| e.to_string());
                    self.path = path;
                    table
                }
                Err(e) => {
                    self.unread = e.is_read_failure();
                    Err(e.to_string())
                }
            };
        }
        chunk_verdict(
            &mut self.dec,
            &self.path,
            loc,
            prefix,
            &self.table,
            &self.group,
        )
    }
}

/// A chunk id the check could tell (the zeros stand for none).
fn named(id: ChunkId) -> Option<ChunkId> {
    (id != ChunkId([0; 32])).then_some(id)
}

/// A chunk as a problem names it: its id, or its prefix where the id is
/// not known.
fn shown(prefix: &[u8; PREFIX_LEN], id: Option<ChunkId>) -> String {
    id.map_or_else(
        || format!("{}...", crate::id::hex(prefix)),
        |f| f.to_string(),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use crate::faults::{stored_twice, FaultyRepo};

    /// The problems of `kind`.
    fn of_kind<'a>(r: &'a VerifyReport, kind: &str) -> Vec<&'a Problem> {
        r.problems.iter().filter(|p| p.kind == kind).collect()
    }

    /// A [`FaultyRepo`], its index, its first pack's path and how many
    /// chunks the index uses there (some).
    fn first_pack() -> (FaultyRepo, crate::repo::LoadedIndex, PathBuf, usize) {
        let r = FaultyRepo::new();
        let loaded = r.repo.load_index().unwrap();
        let pack = r.pack_path(&loaded.index, 0);
        let chunks = (loaded.index.locations())
            .filter(|(_, l)| l.pack == 0)
            .count();
        assert!(chunks > 0);
        (r, loaded, pack, chunks)
    }

    /// A manifest whose extent says a chunk is longer (or shorter) than
    /// the chunk read (a sound envelope: a writer's bug, or a hand edit
    /// of a plain repository) cannot be restored: `--read-data` says so,
    /// once for that snapshot (it said ok, and restore blamed the pack).
    #[test]
    fn an_extent_longer_than_its_chunk_is_a_damaged_snapshot() {
        let r = FaultyRepo::new();
        for (name, delta) in [("b", 100i64), ("c", -1)] {
            let mut m = r.repo.read_manifest("a", 1).unwrap();
            let at = m.extents.iter().position(|e| !e.is_hole()).unwrap();
            for e in m.extents[at..].iter_mut().filter(|e| !e.is_hole()).take(2) {
                if let Extent::Data { len, .. } = e {
                    *len = (i64::from(*len) + delta) as u32;
                }
            }
            m.size = (m.size as i64 + 2 * delta) as u64;
            m.name = name.into();
            let session = r.repo.session("test").unwrap();
            assert!(r.repo.write_manifest(&session, &m).unwrap());
        }
        let v = r.verify();
        let bad = of_kind(&v, "manifest");
        assert_eq!(bad.len(), 2, "{:?}", v.problems);
        for (p, name) in bad.iter().zip(["b", "c"]) {
            assert_eq!(p.affected[0].image, name, "{p:?}");
            assert!(p.message.contains("cannot be restored"), "{}", p.message);
        }
        assert_eq!(v.problems.len(), 2, "{:?}", v.problems);
        // Without reading the chunks it is not known.
        let quick = crate::verify(&r.repo, &VerifyOptions::default()).unwrap();
        assert!(quick.problems.is_empty(), "{:?}", quick.problems);
    }

    /// A pack that cannot be read (EIO) says nothing of its chunks: they
    /// are `unread-chunk` problems, with the snapshots using them, never
    /// `damaged-chunk`; the pack is named, no record is taken for
    /// damaged, and nothing on disk changes. (Fails without 22a3b25:
    /// `damaged-chunk`.)
    #[test]
    fn a_pack_that_cannot_be_read_is_unread_not_damaged() {
        let (r, loaded, pack, chunks) = first_pack();
        r.faults.fail(&pack);
        let before = r.tree();
        let v = r.verify();
        assert!(r.faults.injected() > 0, "the fault was met");
        assert!(!v.problems.is_empty(), "verify fails");
        let unread = of_kind(&v, "unread-chunk");
        assert_eq!(unread.len(), chunks, "{:?}", v.problems);
        for p in &unread {
            assert!(
                p.message.contains("not known to be damaged"),
                "{}",
                p.message
            );
            assert!(p.affected.iter().any(|a| a.image == "a"), "{p:?}");
        }
        let packs = of_kind(&v, "pack");
        assert_eq!(packs.len(), 1, "{:?}", v.problems);
        assert!(
            packs[0].message.contains(&pack.display().to_string()),
            "{}",
            packs[0].message
        );
        assert_eq!(v.problems.len(), chunks + 1, "{:?}", v.problems);
        assert_eq!(v.unread_packs.len(), 1);
        assert!(v.damaged_records.is_empty(), "{:?}", v.damaged_records);
        assert_eq!(v.recoverable, 0);
        // Only the packs read are counted.
        assert_eq!(v.packs_read, v.packs - 1);
        let others: u64 = loaded.index.packs()[1..].iter().map(|p| p.len).sum();
        assert_eq!(v.bytes_read, others);
        assert!(r.tree() == before, "verify changed the repository");
        // Readable again: sound.
        r.faults.clear();
        let v = r.verify();
        assert!(v.problems.is_empty(), "{:?}", v.problems);
    }

    /// A pack cut short after verify listed it (its read ends early: not
    /// an I/O error) is damage, never silent: its chunks are
    /// `damaged-chunk` with the snapshots using them, never
    /// `unread-chunk`. Which of its records are past its new end the read
    /// does not say, so none is taken for damaged (`repair` would drop
    /// sound ones) and the pack counts as unread, which stops `repair`
    /// until a run lists its length anew.
    #[test]
    fn a_pack_cut_short_after_the_listing_is_damaged_not_unread() {
        let (r, loaded, pack, chunks) = first_pack();
        let index = &loaded.index;
        r.faults.cut_before_read(&pack, index.packs()[0].len / 2);
        let v = r.verify();
        assert!(r.faults.injected() > 0, "the fault was met");
        assert!(of_kind(&v, "unread-chunk").is_empty(), "{:?}", v.problems);
        assert_eq!(v.unread_packs.len(), 1, "{:?}", v.unread_packs);
        let damaged = of_kind(&v, "damaged-chunk");
        assert_eq!(damaged.len(), chunks, "{:?}", v.problems);
        assert!(damaged[0].affected.iter().any(|a| a.image == "a"));
        let packs = of_kind(&v, "pack");
        assert_eq!(packs.len(), 1, "{:?}", v.problems);
        assert!(packs[0].message.contains("shorter"), "{}", packs[0].message);
        assert!(v.damaged_records.is_empty(), "{:?}", v.damaged_records);
        assert_eq!(v.packs_read, v.packs - 1);
        // The next run lists the pack's new length: only the records past
        // it are damaged, and repair may drop those.
        let again = r.verify();
        assert!(again.unread_packs.is_empty(), "{:?}", again.unread_packs);
        let past = index
            .locations()
            .filter(|(_, l)| {
                l.pack == 0 && u64::from(l.offset) + u64::from(l.len) > index.packs()[0].len / 2
            })
            .count();
        assert!(past > 0 && past < chunks, "{past} of {chunks}");
        assert_eq!(of_kind(&again, "damaged-chunk").len(), past);
    }

    /// A chunk stored twice whose copy the index uses cannot be read
    /// (EIO), while its other copy is sound: an `unread-copy` problem
    /// affecting no snapshot, never `damaged-copy` (which `repair` would
    /// act on), and nothing on disk changes.
    #[test]
    fn a_copy_that_cannot_be_read_is_unread_not_damaged() {
        let (r, used, id) = stored_twice();
        let loaded = r.repo.load_index().unwrap();
        let index = &loaded.index;
        let n = index.pack_number(&id).unwrap();
        let chunks = index.locations().filter(|(_, l)| l.pack == n).count();
        let other = other_copies_pack(index, n);
        r.faults.fail(&used);
        let before = r.tree();
        // Every pack read, and (the other copies read on their own) only
        // the part holding the unread one.
        let part = part_apart(id, other);
        for subset in [DataSubset::All, part] {
            let v = r.verify_subset(subset);
            assert!(r.faults.injected() > 0, "the fault was met");
            let copies = of_kind(&v, "unread-copy");
            assert_eq!(copies.len(), chunks, "{subset:?}: {:?}", v.problems);
            for p in &copies {
                assert!(p.affected.is_empty(), "{p:?}");
                assert!(
                    p.message.contains("not known to be damaged"),
                    "{}",
                    p.message
                );
            }
            assert!(
                v.problems
                    .iter()
                    .all(|p| p.kind == "unread-copy" || p.kind == "pack"),
                "{subset:?}: {:?}",
                v.problems
            );
            assert_eq!(v.unread_packs.len(), 1);
            assert_eq!(v.recoverable, 0, "nothing for repair to switch");
            assert!(v.damaged_records.is_empty(), "{:?}", v.damaged_records);
        }
        assert!(r.tree() == before, "verify changed the repository");
        r.faults.clear();
        let v = r.verify();
        assert!(v.problems.is_empty(), "{:?}", v.problems);
    }

    /// The id of the pack holding the other copies of pack `n`'s chunks.
    fn other_copies_pack(index: &crate::ChunkIndex, n: u32) -> PackId {
        let (prefix, _) = index.locations().find(|(_, l)| l.pack == n).unwrap();
        let other = index.other_copies_of(prefix).next().unwrap();
        index.packs()[other.pack as usize].id
    }

    /// A part (of a subset) that reads pack `a` and not pack `b`.
    fn part_apart(a: PackId, b: PackId) -> DataSubset {
        let part = |id: PackId, of: u32| {
            let mut n = [0u8; 8];
            n.copy_from_slice(&id.0[..8]);
            (u64::from_be_bytes(n) % u64::from(of)) as u32 + 1
        };
        let of = (2..64).find(|&of| part(a, of) != part(b, of)).unwrap();
        DataSubset::Part { n: part(a, of), of }
    }

    /// A second copy (not the one the index uses) that cannot be read is
    /// `unread-copy`, affecting no snapshot, and not damage: with every
    /// pack read, and with only the part holding a damaged used copy
    /// read (the other copy, read on its own then, fails): that chunk is
    /// `damaged-chunk`, its other copy said unread, and only the damaged
    /// record is taken for damaged (not the unread one, which `repair`
    /// would drop).
    #[test]
    fn a_second_copy_that_cannot_be_read_is_unread_not_damaged() {
        let (r, used, id) = stored_twice();
        let loaded = r.repo.load_index().unwrap();
        let index = &loaded.index;
        let n = index.pack_number(&id).unwrap();
        let other = other_copies_pack(index, n);
        let o = index.pack_number(&other).unwrap();
        let copies = index.other_locations().filter(|(_, l)| l.pack == o).count();
        let other_path = r.pack_path(index, o);
        r.faults.fail(&other_path);
        let v = r.verify();
        assert!(r.faults.injected() > 0, "the fault was met");
        let unread = of_kind(&v, "unread-copy");
        assert_eq!(unread.len(), copies, "{:?}", v.problems);
        assert!(unread[0]
            .message
            .contains("affected if the copy the index uses is sound"));
        assert_eq!(of_kind(&v, "pack").len(), 1, "{:?}", v.problems);
        assert_eq!(v.problems.len(), copies + 1, "{:?}", v.problems);
        assert!(v.damaged_records.is_empty(), "{:?}", v.damaged_records);
        // The used copy of one chunk damaged; only its part read.
        let (prefix, rec) = index.locations().find(|(_, l)| l.pack == n).unwrap();
        let mut bytes = std::fs::read(&used).unwrap();
        bytes[(rec.offset + rec.len / 2) as usize] ^= 0x40;
        std::fs::write(&used, bytes).unwrap();
        let part = part_apart(id, other);
        let v = r.verify_subset(part);
        let damaged = of_kind(&v, "damaged-chunk");
        assert_eq!(damaged.len(), 1, "{:?}", v.problems);
        assert!(
            damaged[0]
                .message
                .contains("its other copy could not be read"),
            "{}",
            damaged[0].message
        );
        assert!(
            v.problems.iter().all(|p| p.kind == "damaged-chunk"),
            "{:?}",
            v.problems
        );
        assert_eq!(
            v.damaged_records,
            vec![(id, rec.offset, rec.slice)],
            "only the damaged record"
        );
        // The copy not read is not counted read: readable, it is.
        r.faults.clear();
        let sound = r.verify_subset(part);
        let copy = index.other_copies_of(prefix).next().unwrap();
        assert_eq!(sound.bytes_read - v.bytes_read, u64::from(copy.len));
    }

    #[test]
    fn subsets_pick_parts_shares_and_sizes() {
        let ids: Vec<PackId> = (0..100).map(|_| PackId::random()).collect();
        let packs = || -> Vec<(usize, (), u64)> { (0..100).map(|n| (n, (), 10)).collect() };
        let id = |n: usize| ids[n];
        assert_eq!(DataSubset::All.pick(packs(), id).len(), 100);
        // The parts of 7 are every pack, each once.
        let mut seen = vec![0; 100];
        for n in 1..=7 {
            for p in (DataSubset::Part { n, of: 7 }).pick(packs(), id) {
                seen[p.0] += 1;
            }
        }
        assert!(seen.iter().all(|&c| c == 1), "{seen:?}");
        // A share rounds up, and is never nothing; picks are in order.
        let some = DataSubset::Fraction(0.125).pick(packs(), id);
        assert_eq!(some.len(), 13);
        assert!(some.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(DataSubset::Fraction(0.0001).pick(packs(), id).len(), 1);
        // A size: packs until it is reached (the last may pass it).
        assert_eq!(DataSubset::Bytes(35).pick(packs(), id).len(), 4);
        assert_eq!(DataSubset::Bytes(1).pick(packs(), id).len(), 1);
        assert!(DataSubset::Part { n: 1, of: 1 }
            .pick(Vec::<(usize, (), u64)>::new(), id)
            .is_empty());
    }
}
