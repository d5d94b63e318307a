//! `copy`: snapshots from one repository into another, without cutting
//! them again.
//!
//! Each source snapshot is written into the destination by the backup's
//! own machinery ([`crate::backup`]: dedup against the destination's
//! index, groups, pack writers, index file, commit of the manifest); only
//! the batches differ: instead of a stream cut by a chunker, they are the
//! source snapshot's chunks, read in order through the restore's
//! [`Fetcher`] (so checked against their source ids, decrypted with the
//! source's key), cut exactly where the source manifest's extents end,
//! with its holes passed on unread. The destination manifest therefore has
//! the same extents (lengths and holes) as the source; each chunk gets the
//! destination's id (keyed if it is encrypted), is stored there once, with
//! the source manifest's codec, sealed with the destination's key. Name,
//! creation time, chunker, codec, group size and tags are kept; the
//! snapshot number is the destination's next.
//!
//! A copied snapshot records where it came from in its `source`:
//! `copy of <source repository id> NAME@N (<the source's source>)`, so a
//! copy of a copy nests one in the other and the innermost `copy of`
//! names the original. That is a snapshot's identity ([`Identity`]): its
//! *origin* (the repository id and number of the original, read from that
//! chain; for a snapshot that is no copy, its own repository's id and
//! number), its name, its creation time and its size. A source snapshot
//! is skipped when the destination holds one of the same identity: a copy
//! of it, the original it is a copy of (a two-way sync), another copy of
//! the same original, or the same snapshot in a clone of the repository
//! (`cp -a`: the same id). The time and size guard against a number
//! reused after an `rm`; the name is part of it as everywhere in cairn (a
//! copy keeps its name, so the same data under another name is another
//! snapshot, copied again at the cost of no new chunk). Tags are not:
//! they are labels, and a snapshot retagged after a copy is not copied
//! again.

use crate::backup::{backup_batches, check_options, BackupOptions, Batch, Progress};
use crate::chunker::ChunkerSpec;
use crate::error::{Result, StoreError};
use crate::id::RepoId;
use crate::manifest::{Extent, Manifest};
use crate::reader::{DamagedRecords, PackReader};
use crate::repo::{validate_name, Repository, Session};
use crate::restore::{with_image_offset, Fetcher};
use cairn_codec::CodecSpec;
use cairn_pipeline::Fill;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// Bytes of chunks gathered per batch (a chunk may take it past).
const BATCH: usize = 8 << 20;
/// Holes up to this long go into a batch as a run of zeros, which the
/// backup's zero test turns back into the same hole; longer ones start a
/// batch of their own and are never read.
const SMALL_HOLE: u64 = 1 << 20;

/// What to copy and how.
pub struct CopyOptions<'a> {
    /// Images to copy (all their snapshots); empty: every image.
    pub names: Vec<String>,
    /// Worker threads (hashing, compressing).
    pub threads: usize,
    /// Compression groups, as [`BackupOptions::group_size`], for a
    /// snapshot that does not record its own (one written before manifest
    /// version 3); one that does keeps it.
    pub group_size: usize,
    /// Called as the copy goes on.
    pub progress: Option<&'a (dyn Fn(&CopyProgress) + Sync)>,
}

/// Running totals of a copy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyProgress {
    /// Image bytes of the snapshots to copy done so far.
    pub bytes_done: u64,
    /// Image bytes of all the snapshots to copy.
    pub bytes_total: u64,
    /// Bytes of chunks new in the destination (uncompressed).
    pub new_raw: u64,
    /// What they take in its packs.
    pub new_stored: u64,
}

/// One snapshot copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    /// Image name.
    pub name: String,
    /// Its number in the source.
    pub from: u64,
    /// Its number in the destination.
    pub to: u64,
    /// Its size.
    pub size: u64,
    /// Chunks new in the destination.
    pub new_chunks: u64,
    /// Their bytes, uncompressed.
    pub new_raw: u64,
    /// What they take in packs.
    pub new_stored: u64,
}

/// One snapshot skipped: the destination has it already.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Image name.
    pub name: String,
    /// Its number in the source.
    pub from: u64,
    /// The destination's snapshot that is its copy.
    pub to: u64,
}

/// What a copy did.
#[derive(Debug, Clone, Default)]
pub struct CopyReport {
    /// Snapshots copied, in order.
    pub copied: Vec<Copied>,
    /// Snapshots the destination had.
    pub skipped: Vec<Skipped>,
    /// Totals over `copied`.
    pub new_chunks: u64,
    /// Bytes of new chunks, uncompressed.
    pub new_raw: u64,
    /// What they take in packs.
    pub new_stored: u64,
    /// Wall time.
    pub seconds: f64,
}

/// The `source` a copy of `m` (snapshot of the repository `src`) records.
pub fn origin(src: &Repository, m: &Manifest) -> String {
    format!(
        "copy of {} {}@{} ({})",
        src.id(),
        m.name,
        m.snapshot,
        m.source
    )
}

/// What makes a snapshot the same snapshot in every repository it was
/// copied to (see the module's documentation).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    /// The repository the original was made in.
    pub repository: RepoId,
    /// The original's number there.
    pub snapshot: u64,
    /// Image name.
    pub name: String,
    /// Creation time (Unix seconds).
    pub created: i64,
    /// Image size.
    pub size: u64,
    /// Between a repository and a clone of it (the same id, so the same
    /// chunk ids), a digest of the snapshot's extents: each side numbers
    /// its own new snapshots, so two different ones may share id,
    /// number, name, second and size (one cron job backing up one disk
    /// to both). `None` across repositories, whose chunk ids differ.
    pub content: Option<[u8; 32]>,
}

/// A digest of `m`'s extents (chunk ids, lengths, holes).
fn extents_digest(m: &Manifest) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    for e in &m.extents {
        match e {
            crate::manifest::Extent::Data { len, id } => {
                h.update(&[0]);
                h.update(&len.to_le_bytes());
                h.update(&id.0);
            }
            crate::manifest::Extent::Hole { len } => {
                h.update(&[1]);
                h.update(&len.to_le_bytes());
            }
        }
    }
    *h.finalize().as_bytes()
}

/// [`identity`], with the extents' digest when `clone` (the two
/// repositories share an id).
fn identity_between(repo: RepoId, m: &Manifest, clone: bool) -> Identity {
    Identity {
        content: clone.then(|| extents_digest(m)),
        ..identity(repo, m)
    }
}

/// The identity of snapshot `m` of the repository whose id is `repo`.
pub fn identity(repo: RepoId, m: &Manifest) -> Identity {
    let (mut repository, mut snapshot) = (repo, m.snapshot);
    let mut source = m.source.as_str();
    while let Some((id, n, inner)) = copied_from(source, &m.name) {
        (repository, snapshot) = (id, n);
        source = inner;
    }
    Identity {
        repository,
        snapshot,
        name: m.name.clone(),
        created: m.created,
        size: m.size,
        content: None,
    }
}

/// A `source` that [`origin`] wrote for a copy of a snapshot of `name`:
/// the source repository's id, the snapshot's number there and its own
/// source. The closing parenthesis may be missing: a source is cut at
/// 65535 bytes when written (a chain of some hundreds of copies), and
/// the origin is at its start.
fn copied_from<'a>(source: &'a str, name: &str) -> Option<(RepoId, u64, &'a str)> {
    let rest = source.strip_prefix("copy of ")?;
    let id = RepoId::from_hex(rest.get(..32)?)?;
    let rest = rest
        .get(32..)?
        .strip_prefix(' ')?
        .strip_prefix(name)?
        .strip_prefix('@')?;
    let digits = rest.find(|c: char| !c.is_ascii_digit())?;
    let n = rest[..digits].parse().ok()?;
    let inner = rest[digits..].strip_prefix(" (")?;
    Some((id, n, inner.strip_suffix(')').unwrap_or(inner)))
}

/// Where a snapshot of a given identity is, or will be, in the
/// destination.
#[derive(Clone, Copy)]
enum Held {
    /// It has it as this number.
    At(u64),
    /// This entry of the copy's list of snapshots to copy brings it.
    Coming(usize),
}

/// Copy the snapshots of `opts.names` (every image if none) from `src`
/// into `dest`, where `session` is registered; snapshots the destination
/// has already are skipped.
pub fn copy(
    src: &Repository,
    dest: &Repository,
    session: &Session,
    opts: &CopyOptions,
) -> Result<CopyReport> {
    let started = Instant::now();
    // Registered before the index is loaded: no gc of the source deletes
    // a pack this copy may read.
    let _reading = src.session(&format!("cairn copy to {}", dest.location()))?;
    let images = src.images()?;
    for n in &opts.names {
        validate_name(n)?;
        if !images.iter().any(|(m, _)| m == n) {
            return Err(StoreError::NotFound(format!(
                "no image named {n:?} in {}",
                src.location()
            )));
        }
    }
    let mut sources = Vec::new();
    for (name, snaps) in &images {
        if !opts.names.is_empty() && !opts.names.contains(name) {
            continue;
        }
        for &n in snaps {
            if let Some(m) = src.read_manifest_if_present(name, n)? {
                sources.push(m);
            }
        }
    }
    // What the destination holds of those images, each identity at its
    // first snapshot.
    let mut held: HashMap<Identity, Held> = HashMap::new();
    let clone = src.id() == dest.id();
    let mut names: Vec<&str> = sources.iter().map(|m| m.name.as_str()).collect();
    names.dedup();
    for name in names {
        for n in dest.snapshots(name)? {
            if let Some(d) = dest.read_manifest_if_present(name, n)? {
                held.entry(identity_between(dest.id(), &d, clone))
                    .or_insert(Held::At(n));
            }
        }
    }
    let mut todo: Vec<Manifest> = Vec::new();
    let mut report = CopyReport::default();
    // Skipped because an earlier snapshot of this copy brings them (the
    // source holds one snapshot twice): (entry of `report.skipped`, entry
    // of `todo`), whose number is known once it is copied.
    let mut pending = Vec::new();
    for m in sources {
        let id = identity_between(src.id(), &m, clone);
        let (name, from) = (m.name.clone(), m.snapshot);
        match held.get(&id) {
            Some(&Held::At(to)) => report.skipped.push(Skipped { name, from, to }),
            Some(&Held::Coming(i)) => {
                pending.push((report.skipped.len(), i));
                report.skipped.push(Skipped { name, from, to: 0 });
            }
            None => {
                held.insert(id, Held::Coming(todo.len()));
                todo.push(m);
            }
        }
    }
    if todo.is_empty() {
        report.seconds = started.elapsed().as_secs_f64();
        return Ok(report);
    }
    let loaded = src.load_index()?;
    loaded.check_read()?;
    if let Some(e) = loaded.damaged.into_iter().next() {
        return Err(e);
    }
    let index = loaded.index;
    let files = PackReader::new(src, &index);
    // A damaged record several snapshots read is warned of once.
    let said = Arc::<DamagedRecords>::default();
    let mut totals = CopyProgress {
        bytes_total: todo.iter().map(|m| m.size).sum(),
        ..CopyProgress::default()
    };
    for m in &todo {
        let bad = |what: &str, e: String| {
            StoreError::Invalid(format!("{}@{}: its {what} {e}", m.name, m.snapshot))
        };
        let chunker: ChunkerSpec = m
            .chunker
            .parse()
            .map_err(|e: StoreError| bad("chunker", e.to_string()))?;
        let codec: CodecSpec = m
            .codec
            .parse()
            .map_err(|e: cairn_codec::CodecError| bad("codec", e.to_string()))?;
        let base = totals;
        let progress = |p: &Progress| {
            if let Some(f) = opts.progress {
                f(&CopyProgress {
                    bytes_done: base.bytes_done + p.bytes_in,
                    new_raw: base.new_raw + p.new_raw,
                    new_stored: base.new_stored + p.new_stored,
                    ..base
                });
            }
        };
        let bopts = BackupOptions {
            name: m.name.clone(),
            codec,
            chunker,
            threads: opts.threads,
            // The snapshot's own trade of size against random reads.
            group_size: m.group.map_or(opts.group_size, |g| g as usize),
            source: origin(src, m),
            progress: Some(&progress),
            time: Some(m.created),
            tags: m.tags.clone(),
        };
        check_options(&bopts)?;
        let fetcher = Fetcher::new(&files, &index).sharing_warnings(&said);
        let spans = files.reads_per_core() > 1;
        let r = backup_batches(dest, session, batches(m, fetcher, spans), &bopts).map_err(|e| {
            StoreError::InSnapshot {
                snapshot: format!("{}@{}", m.name, m.snapshot),
                source: Box::new(e),
            }
        })?;
        let t = r.totals;
        let c = Copied {
            name: m.name.clone(),
            from: m.snapshot,
            to: r.snapshot,
            size: m.size,
            new_chunks: t.new_chunks,
            new_raw: t.new_raw,
            new_stored: t.new_stored,
        };
        totals.bytes_done += c.size;
        totals.new_raw += c.new_raw;
        totals.new_stored += c.new_stored;
        report.copied.push(c);
    }
    for (s, c) in pending {
        if let (Some(c), Some(s)) = (report.copied.get(c), report.skipped.get_mut(s)) {
            s.to = c.to;
        }
    }
    let copied = &report.copied;
    report.new_chunks = copied.iter().map(|c| c.new_chunks).sum();
    report.new_raw = copied.iter().map(|c| c.new_raw).sum();
    report.new_stored = copied.iter().map(|c| c.new_stored).sum();
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// The backup's batches for snapshot `m`: its chunks in order, one chunk
/// end per data extent (and per short hole, as zeros), a long hole as the
/// zeros before a batch of its own. From a remote store (`spans`), each
/// batch's records are fetched first, neighbours in a pack together, as
/// restore does.
fn batches<'a>(
    m: &'a Manifest,
    mut fetcher: Fetcher<'a>,
    spans: bool,
) -> impl FnMut(&mut Batch) -> Result<Fill> + Send + 'a {
    let mut extents = m.with_offsets().peekable();
    let mut plan: Vec<(u64, Extent)> = Vec::new();
    move |b: &mut Batch| {
        b.data.clear();
        b.ends.clear();
        b.zeros_before = 0;
        // What goes into this batch.
        plan.clear();
        let mut size = 0usize;
        while let Some(&(off, e)) = extents.peek() {
            match *e {
                Extent::Hole { len } if size == 0 && len > SMALL_HOLE => {
                    b.zeros_before = len;
                    extents.next();
                    break;
                }
                _ => {
                    let len = usize::try_from(e.len()).unwrap_or(usize::MAX);
                    if size > 0 && size.saturating_add(len) > BATCH {
                        break;
                    }
                    size += len;
                    plan.push((off, *e));
                    extents.next();
                }
            }
        }
        if spans {
            fetcher.prefetch(&plan)?;
        }
        for &(off, e) in &plan {
            match e {
                Extent::Hole { len } => b.data.resize(b.data.len() + len as usize, 0),
                Extent::Data { len, id } => {
                    fetcher
                        .fetch(&id, len, off, &mut b.data)
                        .map_err(|err| with_image_offset(err, off))?;
                }
            }
            b.ends.push(b.data.len() as u32);
        }
        b.len = b.data.len();
        Ok(if b.len == 0 && b.zeros_before == 0 {
            Fill::End
        } else {
            Fill::Item
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::backup;
    use crate::repo::{InitOptions, Password};
    use crate::restore::{restore, Destination, RestoreOptions};
    use std::path::Path;

    fn repo(dir: &Path, name: &str, password: Option<&str>) -> Repository {
        repo_cutting_as(dir, name, password, None)
    }

    /// A repository whose chunker cuts as `chunker` says (a new one if
    /// `None`).
    fn repo_cutting_as(
        dir: &Path,
        name: &str,
        password: Option<&str>,
        chunker: Option<crate::ChunkerParams>,
    ) -> Repository {
        let opts = InitOptions {
            targets: Vec::new(),
            pack_size: Some(1 << 20),
            encryption: password.map(|p| {
                (
                    Password::new(p),
                    crate::crypt::KdfParams {
                        memory_kib: 1024,
                        iterations: 1,
                        parallelism: 1,
                    },
                )
            }),
            reserve: 0,
            chunker,
        };
        Repository::init_with(&dir.join(name), &opts).unwrap()
    }

    fn image(len: usize, seed: u64) -> Vec<u8> {
        // Compressible: every third byte from a small alphabet.
        let mut v = cairn_testkit::noise(len, seed);
        for (i, b) in v.iter_mut().enumerate().step_by(3) {
            *b = b'a' + (*b % 4) + (i % 2) as u8;
        }
        // A long hole and a short one.
        v[len / 4..len / 4 + (len / 2).min(3 << 20)].fill(0);
        v[len - 200_000..len - 100_000].fill(0);
        v
    }

    fn put(r: &Repository, name: &str, data: &[u8], tags: &[&str], time: i64) {
        let lock = r.session("test").unwrap();
        let opts = BackupOptions {
            name: name.into(),
            codec: "zstd:1".parse().unwrap(),
            chunker: crate::DEFAULT_CHUNKER,
            threads: 2,
            group_size: 256 << 10,
            source: "/dev/test".into(),
            progress: None,
            time: Some(time),
            tags: tags.iter().map(|t| t.to_string()).collect(),
        };
        backup(r, &lock, &mut std::io::Cursor::new(data.to_vec()), &opts).unwrap();
    }

    fn load(r: &Repository, name: &str, n: u64) -> Vec<u8> {
        let index = r.load_index().unwrap().index;
        let m = r.read_manifest(name, n).unwrap();
        let mut out = Vec::new();
        restore(
            r,
            &index,
            &m,
            Destination::Stream(&mut out),
            &RestoreOptions {
                threads: 2,
                zero_damaged: false,
                progress: None,
            },
        )
        .unwrap();
        out
    }

    fn run(src: &Repository, dest: &Repository, names: &[&str]) -> CopyReport {
        let lock = dest.session("test copy").unwrap();
        copy(
            src,
            dest,
            &lock,
            &CopyOptions {
                names: names.iter().map(|n| n.to_string()).collect(),
                threads: 2,
                // Not the sources' 256 KiB: their recorded group is kept.
                group_size: 64 << 10,
                progress: None,
            },
        )
        .unwrap()
    }

    /// A copy that fails on damage in the source names the snapshot it
    /// was copying (user audit: the error named only the pack and offset).
    #[test]
    fn a_copy_stopped_by_damage_names_the_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let (src, dest) = (
            repo(dir.path(), "src", None),
            repo(dir.path(), "dest", None),
        );
        put(&src, "a", &image(3 << 20, 41), &[], 1_700_000_000);
        for f in src.pack_files().unwrap() {
            let mut bytes = std::fs::read(&f.path).unwrap();
            let mid = bytes.len() / 2;
            bytes[mid] ^= 0x55;
            std::fs::write(&f.path, bytes).unwrap();
        }
        let lock = dest.session("test copy").unwrap();
        let opts = CopyOptions {
            names: Vec::new(),
            threads: 2,
            group_size: 64 << 10,
            progress: None,
        };
        let err = copy(&src, &dest, &lock, &opts).unwrap_err().to_string();
        assert!(err.starts_with("a@1: "), "{err}");
        assert!(dest.images().unwrap().is_empty(), "nothing committed");
    }

    fn lengths(m: &Manifest) -> Vec<(bool, u64)> {
        m.extents.iter().map(|e| (e.is_hole(), e.len())).collect()
    }

    #[test]
    fn copies_keep_extents_rekey_chunks_and_skip_what_was_copied() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // Source and destination encrypted or not, the destination cutting
        // as the source does (`init --copy-chunker-params`) or not (a
        // plain repository cannot keep a keyed source's secret).
        for (from, to, shared) in [
            (Some("one"), Some("two"), true),
            (Some("one"), Some("two"), false),
            (None, Some("two"), true),
            (Some("one"), None, false),
        ] {
            let tag = format!("{}-{}-{shared}", from.is_some(), to.is_some());
            let src = repo(d, &format!("src-{tag}"), from);
            let dest = repo_cutting_as(
                d,
                &format!("dest-{tag}"),
                to,
                shared.then(|| src.chunker_params()),
            );
            let a1 = image(6 << 20, 1);
            let mut a2 = a1.clone();
            a2[100..5000].fill(7);
            let b1 = image(2 << 20, 9);
            put(&src, "a", &a1, &["daily"], 1_700_000_000);
            put(&src, "a", &a2, &[], 1_700_086_400);
            put(&src, "b", &b1, &["x", "y"], 1_700_000_100);
            // Something in the destination already: numbers go on after it.
            put(&dest, "a", &b1, &[], 1_600_000_000);

            let r = run(&src, &dest, &["a"]);
            assert_eq!(r.copied.len(), 2, "{tag}");
            assert!(r.skipped.is_empty());
            assert_eq!(
                r.copied.iter().map(|c| (c.from, c.to)).collect::<Vec<_>>(),
                vec![(1, 2), (2, 3)]
            );
            // The second snapshot shares nearly all of the first's chunks.
            assert!(r.copied[1].new_raw < r.copied[0].new_raw / 4, "{r:?}");
            assert!(dest.snapshots("b").unwrap().is_empty());
            for (c, data) in r.copied.iter().zip([&a1, &a2]) {
                let s = src.read_manifest("a", c.from).unwrap();
                let m = dest.read_manifest("a", c.to).unwrap();
                assert_eq!(lengths(&s), lengths(&m), "{tag}");
                assert_eq!(
                    (m.created, &m.chunker, &m.codec, &m.tags, m.group),
                    (s.created, &s.chunker, &s.codec, &s.tags, Some(256 << 10))
                );
                assert_eq!(m.source, origin(&src, &s));
                assert!(m.source.ends_with("(/dev/test)"), "{}", m.source);
                let ids = |m: &Manifest| {
                    m.extents
                        .iter()
                        .filter_map(|e| match e {
                            Extent::Data { id, .. } => Some(*id),
                            Extent::Hole { .. } => None,
                        })
                        .collect::<Vec<_>>()
                };
                // Keyed ids differ between repositories; plain ones do not
                // between two plain ones (not tested here: one side is keyed).
                let (si, di) = (ids(&s), ids(&m));
                assert_eq!(si.len(), di.len());
                assert!(si.iter().zip(&di).all(|(x, y)| x != y), "{tag}");
                assert!(load(&dest, "a", c.to) == *data, "{tag}");
            }
            let v = crate::verify::verify(
                &dest,
                &crate::verify::VerifyOptions {
                    read_data: true,
                    threads: 2,
                    progress: None,
                    ..Default::default()
                },
            )
            .unwrap();
            assert!(v.problems.is_empty(), "{:?}", v.problems);

            // Again: everything of a is skipped, b is copied, nothing of a
            // is stored again.
            let packs = dest.pack_files().unwrap().len();
            let r = run(&src, &dest, &[]);
            assert_eq!(
                r.skipped.iter().map(|s| (s.from, s.to)).collect::<Vec<_>>(),
                vec![(1, 2), (2, 3)]
            );
            assert_eq!(r.copied.len(), 1);
            assert_eq!(r.copied[0].name, "b");
            let m = dest.read_manifest("b", 1).unwrap();
            assert_eq!(m.tags, vec!["x".to_string(), "y".to_string()]);
            // b1 is also dest's a@1: all its chunks are there already,
            // if both cut alike; otherwise each cut it with its own table.
            if shared {
                assert_eq!(r.new_chunks, 0, "{tag}: {r:?}");
            } else {
                assert!(r.new_chunks > 20, "{tag}: {r:?}");
            }
            let packs = if shared {
                packs
            } else {
                dest.pack_files().unwrap().len()
            };
            let r = run(&src, &dest, &[]);
            assert_eq!((r.copied.len(), r.skipped.len()), (0, 3));
            assert_eq!(dest.pack_files().unwrap().len(), packs);
        }
    }

    /// A repository and its clone number their new snapshots alike:
    /// two different ones sharing number, name, second and size are told
    /// apart by their extents (found in review: the source's was skipped
    /// and its data never copied); across repositories the extents are
    /// not compared (their chunk ids differ).
    #[test]
    fn a_clones_snapshots_of_the_same_number_and_second_differ_by_content() {
        let r = RepoId([3; 16]);
        let m = |id: u8| crate::manifest::Manifest {
            name: "disk".into(),
            snapshot: 3,
            created: 1_700_000_000,
            size: 10,
            chunker: "fixed:4096".into(),
            codec: "zstd:3".into(),
            source: "/dev/sda".into(),
            stats: Default::default(),
            extents: vec![Extent::Data {
                len: 10,
                id: crate::id::ChunkId([id; 32]),
            }],
            tags: Vec::new(),
            group: Some(0),
        };
        assert_ne!(
            identity_between(r, &m(1), true),
            identity_between(r, &m(2), true)
        );
        assert_eq!(
            identity_between(r, &m(1), true),
            identity_between(r, &m(1), true)
        );
        assert_eq!(
            identity_between(r, &m(1), false),
            identity_between(r, &m(2), false)
        );
    }

    #[test]
    fn the_origin_is_read_through_a_chain_of_copies() {
        let (a, b) = (RepoId([1; 16]), RepoId([2; 16]));
        let mut m = crate::manifest::Manifest {
            name: "vm".into(),
            snapshot: 7,
            created: 1_700_000_000,
            size: 10,
            chunker: "fixed:4096".into(),
            codec: "zstd:3".into(),
            source: "/dev/sda (x)".into(),
            stats: Default::default(),
            extents: vec![Extent::Hole { len: 10 }],
            tags: Vec::new(),
            group: Some(0),
        };
        let own = identity(b, &m);
        assert_eq!((own.repository, own.snapshot), (b, 7));
        // b's vm@7 copied from a's vm@3, itself a copy of b's vm@2.
        let chain = format!("copy of {a} vm@3 (copy of {b} vm@2 (/dev/sda (x)))");
        assert_eq!(
            copied_from(&chain, "vm").map(|(r, n, _)| (r, n)),
            Some((a, 3))
        );
        m.source = chain.clone();
        let id = identity(b, &m);
        assert_eq!((id.repository, id.snapshot), (b, 2));
        assert_eq!(
            (id.name.as_str(), id.created, id.size),
            ("vm", m.created, 10)
        );
        // Cut at the end (a source longer than a str16): the same origin.
        m.source = chain[..chain.len() - 12].to_string();
        assert_eq!(identity(b, &m), id);
        // Not a copy's source: another name, a bad id, no number, no
        // parenthesis; the snapshot is its own origin.
        for s in [
            format!("copy of {a} db@3 (x)"),
            format!("copy of {}z vm@3 (x)", &a.to_string()[..31]),
            format!("copy of {a} vm@ (x)"),
            format!("copy of {a} vm@3 x"),
            "copy of".to_string(),
            String::new(),
        ] {
            m.source = s.clone();
            let id = identity(b, &m);
            assert_eq!((id.repository, id.snapshot), (b, 7), "{s:?}");
        }
    }

    /// Copies both ways, round after round, and along a ring of three,
    /// leave every repository with one snapshot per original.
    #[test]
    fn syncing_both_ways_copies_each_snapshot_once() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let ra = repo(d, "ra", Some("one"));
        let rb = repo(d, "rb", None);
        let rc = repo(d, "rc", Some("two"));
        let one = image(3 << 20, 3);
        let two = image(2 << 20, 4);
        put(&ra, "s", &one, &[], 1_700_000_000);
        put(&rb, "s", &two, &[], 1_700_000_500);
        put(&rb, "t", &two, &[], 1_700_000_600);
        let count = |r: &Repository| (r.snapshots("s").unwrap(), r.snapshots("t").unwrap());
        let first = run(&ra, &rb, &[]);
        assert_eq!((first.copied.len(), first.skipped.len()), (1, 0));
        let back = run(&rb, &ra, &[]);
        // rb's s@1 (its own) and t@1 come over; ra's s@1 does not come back.
        assert_eq!(back.copied.len(), 2, "{back:?}");
        assert_eq!(
            back.skipped,
            vec![Skipped {
                name: "s".into(),
                from: 2,
                to: 1
            }]
        );
        let third = run(&ra, &rc, &[]);
        assert_eq!((third.copied.len(), third.skipped.len()), (3, 0));
        for _ in 0..3 {
            for (x, y) in [(&ra, &rb), (&rb, &ra), (&rc, &rb), (&rb, &rc), (&rc, &ra)] {
                let r = run(x, y, &[]);
                assert_eq!((r.copied.len(), r.skipped.len()), (0, 3), "{r:?}");
            }
        }
        for r in [&ra, &rb, &rc] {
            assert_eq!(count(r), (vec![1, 2], vec![1]));
        }
        // Each holds both images' data, once.
        let s_of = |r: &Repository, data: &[u8]| {
            r.snapshots("s")
                .unwrap()
                .into_iter()
                .filter(|&n| load(r, "s", n) == data)
                .count()
        };
        for r in [&ra, &rb, &rc] {
            assert_eq!((s_of(r, &one), s_of(r, &two)), (1, 1));
            assert!(load(r, "t", 1) == two);
        }
    }

    /// A source that holds one snapshot twice (made by a copy before it
    /// knew the way back) brings it once; the second is skipped as the
    /// destination's copy of the first.
    #[test]
    fn a_snapshot_held_twice_by_the_source_is_copied_once() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let ra = repo(d, "ra", None);
        let rd = repo(d, "rd", Some("x"));
        let data = image(2 << 20, 5);
        put(&ra, "s", &data, &[], 1_700_000_000);
        let mut twice = ra.read_manifest("s", 1).unwrap();
        twice.source = format!("copy of {} s@1 ({})", RepoId([9; 16]), origin(&ra, &twice));
        let lock = ra.session("t").unwrap();
        assert_eq!(ra.commit_manifest(&lock, &mut twice).unwrap(), 2);
        drop(lock);
        let r = run(&ra, &rd, &[]);
        assert_eq!(r.copied.len(), 1);
        assert_eq!(
            r.skipped,
            vec![Skipped {
                name: "s".into(),
                from: 2,
                to: r.copied[0].to
            }]
        );
        assert_eq!(rd.snapshots("s").unwrap(), vec![1]);
        assert!(load(&rd, "s", 1) == data);
        let r = run(&ra, &rd, &[]);
        assert_eq!((r.copied.len(), r.skipped.len()), (0, 2));
    }

    #[test]
    fn an_unknown_image_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let src = repo(dir.path(), "src", None);
        let dest = repo(dir.path(), "dest", None);
        let lock = dest.session("t").unwrap();
        let e = copy(
            &src,
            &dest,
            &lock,
            &CopyOptions {
                names: vec!["nope".into()],
                threads: 1,
                group_size: 0,
                progress: None,
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("no image named \"nope\""), "{e}");
    }
}
