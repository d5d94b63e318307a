//! The committed repository `tests/fixtures/repository-v1/`: written by
//! the first repository format (version 1 of every file), every later
//! cairn must still open it, restore every snapshot to the same bytes and
//! verify it clean, without writing anything; and it must find every kind
//! of damage to it, naming exactly the images, snapshots and offsets that
//! the damage reaches.
//!
//! - `repo/`: the repository (default target `data`, stored relative, so
//!   it opens from anywhere): `alpha@1`, `alpha@2` (shares most chunks
//!   with `alpha@1`) and `beta@1`, each with a hole, stored with different
//!   codecs and compression groups.
//! - `images.tsv`: size and BLAKE3 (`b3sum`) of every snapshot.
//! - `damaged/<kind>/files/`: one damaged file each (a pack, an index
//!   file, a manifest with one flipped byte), laid over a copy of `repo/`;
//!   `damaged/<kind>/expect.tsv` lists what the damage reaches.
//!
//! Damage of every other kind is generated at test time on copies.
//!
//! `CAIRN_BLESS=1 cargo test -p cairn-store --test fixtures` writes the
//! fixture anew (only after an intended format change, which must come
//! with a new format version and a new `repository-vN` directory; the old
//! one stays, and stays readable).

#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests fail loudly by design.

use cairn_codec::CodecSpec;
use cairn_store::internals::{Layout, Place};
use cairn_store::Extent;
use cairn_store::Problem;
use cairn_store::{
    backup, restore, verify, BackupOptions, ChunkId, Destination, Repository, RestoreOptions,
    StoreError, VerifyOptions,
};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Once;

/// The fixture's directory; with `CAIRN_BLESS=1`, written anew first
/// (once, before any test reads it).
fn root() -> PathBuf {
    static BLESSED: Once = Once::new();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/repository-v1");
    if std::env::var("CAIRN_BLESS").as_deref() == Ok("1") {
        BLESSED.call_once(|| write_fixture(&dir));
    }
    dir
}

// ---------------------------------------------------------------- blessing

/// Text-like bytes: words drawn at random from a seed.
fn text(len: usize, seed: u64) -> Vec<u8> {
    let words: [&[u8]; 8] = [
        b"cairn ", b"keeps ", b"every ", b"image ", b"whole ", b"\n", b"block ", b"7 ",
    ];
    let mut x = seed | 1;
    let mut v = Vec::new();
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(words[(x % 8) as usize]);
    }
    v.truncate(len);
    v
}

use cairn_testkit::noise;

/// The snapshots: (name, bytes, codec, compression group size).
fn images() -> Vec<(&'static str, Vec<u8>, &'static str, usize)> {
    let mut a1 = text(3_000, 1);
    a1.extend(noise(1_200, 2));
    a1.resize(a1.len() + 12_000, 0); // a hole (the chunker's MAX is 4K)
    a1.extend(text(3_000, 3));
    let mut a2 = a1.clone();
    a2[100..140].copy_from_slice(&noise(40, 4));
    a2.extend(text(900, 5));
    a2.extend(noise(6_000, 8)); // its last chunk is stored as is (codec 0)
    let mut b1 = noise(700, 6);
    b1.resize(b1.len() + 9_000, 0);
    b1.extend(text(2_500, 7));
    vec![
        ("alpha", a1, "zstd:3", 2048),
        ("alpha", a2, "lz4", 0),
        ("beta", b1, "deflate:6", 1 << 20),
    ]
}

const CHUNKER: &str = "cdc:256,1K,4K";

/// Write the fixture anew.
fn write_fixture(dir: &Path) {
    for sub in ["repo", "damaged"] {
        let _ = fs::remove_dir_all(dir.join(sub));
    }
    let repo_dir = dir.join("repo");
    let repo = Repository::init(&repo_dir, &[], None).unwrap();
    let table = store_images(&repo);
    fs::write(dir.join("images.tsv"), table).unwrap();
    // Neutral lock file; no empty directories (git does not keep them,
    // so the test must pass without them).
    fs::write(repo_dir.join("lock"), b"").unwrap();
    for e in fs::read_dir(repo_dir.join("data/packs")).unwrap() {
        let _ = fs::remove_dir(e.unwrap().path());
    }

    // One committed damaged file per kind, with what it reaches.
    let lay = layout(&repo_dir);
    let pack = pack_of(&lay, "alpha", 1);
    let records = lay.records_in(&pack);
    let rec = &records[records.len() / 2];
    let data = fs::read(&rec.pack).unwrap();
    let (header, stored) = record_layout(&data, rec.offset);
    let places = lay.places_of(&lay.chunks_of(rec));
    damaged_fixture(
        dir,
        "pack-flipped-byte",
        &repo_dir,
        &rec.pack,
        rec.offset + header + stored / 2,
        &places,
    );
    let idx = lay.index_of[&pack].clone();
    let places = lay.places_of(&lay.chunks_in(&pack, 0));
    let len = fs::metadata(&idx).unwrap().len();
    damaged_fixture(dir, "index-flipped-byte", &repo_dir, &idx, len / 2, &places);
    let m = repo_dir.join("snapshots/alpha/0000000002.snap");
    let len = fs::metadata(&m).unwrap().len();
    let whole = BTreeSet::from([Place {
        image: "alpha".into(),
        snap: 2,
        offset: 0,
        len: 0,
    }]);
    damaged_fixture(dir, "manifest-flipped-byte", &repo_dir, &m, len / 2, &whole);
}

/// Back up [`images`] into `repo`; returns the lines of `images.tsv`.
fn store_images(repo: &Repository) -> String {
    store_images_counting(repo).0
}

/// [`store_images`], and how many chunks the backups added.
fn store_images_counting(repo: &Repository) -> (String, u64) {
    let mut new_chunks = 0;
    let mut table = String::from("# image\tsnapshot\tsize\tblake3\n");
    for (name, data, codec, group) in images() {
        let lock = repo.session("bless").unwrap();
        let r = backup(
            repo,
            &lock,
            &mut Cursor::new(data.clone()),
            &BackupOptions {
                name: name.into(),
                codec: codec.parse::<CodecSpec>().unwrap(),
                chunker: CHUNKER.parse().unwrap(),
                threads: 1,
                group_size: group,
                source: "fixture".into(),
                progress: None,
                time: None,
                tags: Vec::new(),
            },
        )
        .unwrap();
        assert!(r.totals.zero > 0, "{name}: no hole");
        new_chunks += r.totals.new_chunks;
        table.push_str(&format!(
            "{name}\t{}\t{}\t{}\n",
            r.snapshot,
            data.len(),
            blake3::hash(&data).to_hex()
        ));
    }
    (table, new_chunks)
}

fn damaged_fixture(
    dir: &Path,
    kind: &str,
    repo: &Path,
    file: &Path,
    at: u64,
    places: &BTreeSet<Place>,
) {
    let rel = file.strip_prefix(repo).unwrap();
    let dest = dir.join("damaged").join(kind).join("files").join(rel);
    fs::create_dir_all(dest.parent().unwrap()).unwrap();
    let mut d = fs::read(file).unwrap();
    d[at as usize] ^= 0x10;
    fs::write(&dest, d).unwrap();
    let mut t = String::from("# image\tsnapshot\toffset\tlength (0: the whole snapshot)\n");
    for p in places {
        t.push_str(&format!(
            "{}\t{}\t{}\t{}\n",
            p.image, p.snap, p.offset, p.len
        ));
    }
    fs::write(dir.join("damaged").join(kind).join("expect.tsv"), t).unwrap();
}

// ---------------------------------------------------------------- helpers

/// Where everything is, read from an intact repository.
fn layout(root: &Path) -> Layout {
    Layout::read(&Repository::open(root).unwrap()).unwrap()
}

/// The pack holding the first chunk of `name@snap`.
fn pack_of(lay: &Layout, name: &str, snap: u64) -> PathBuf {
    let id = lay
        .places
        .iter()
        .find(|(_, ps)| ps.iter().any(|p| p.image == name && p.snap == snap))
        .map(|(id, _)| *id)
        .unwrap();
    lay.records[&id].pack.clone()
}

/// Header length and stored length of the record at `at`, as the format
/// document gives them: 20 bytes (chunk count u16 at 6, stored length
/// u32 at 12), 36 bytes per chunk, the stored bytes.
fn record_layout(pack: &[u8], at: u64) -> (u64, u64) {
    let at = at as usize;
    let count = u64::from(u16::from_le_bytes([pack[at + 6], pack[at + 7]]));
    let stored = u64::from(u32::from_le_bytes(
        pack[at + 12..at + 16].try_into().unwrap(),
    ));
    (20 + 36 * count, stored)
}

/// Copy a repository that other tests may have open: a session file one
/// of them removes between the listing and the copy is left out (it was
/// never part of the fixture).
fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dest);
        } else if let Err(err) = fs::copy(e.path(), &dest) {
            assert!(
                err.kind() == std::io::ErrorKind::NotFound && from.ends_with("sessions"),
                "copying {}: {err}",
                e.path().display()
            );
        }
    }
}

/// Every file under `dir` with its contents and modification time.
fn snapshot_tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>, std::time::SystemTime)> {
    let mut v = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let m = e.metadata().unwrap().modified().unwrap();
                v.push((p.clone(), fs::read(&p).unwrap(), m));
            }
        }
    }
    v.sort();
    v
}

/// A fresh copy of the committed repository.
fn fresh_copy() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    copy_tree(&root().join("repo"), &repo);
    (dir, repo)
}

/// (name, snapshot) -> (size, BLAKE3 hex), from `images.tsv`.
fn expected_images() -> BTreeMap<(String, u64), (u64, String)> {
    let path = root().join("images.tsv");
    let text = fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with CAIRN_BLESS=1)", path.display()));
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (
                (f[0].to_string(), f[1].parse().unwrap()),
                (f[2].parse().unwrap(), f[3].to_string()),
            )
        })
        .collect()
}

fn opts(zero_damaged: bool) -> RestoreOptions<'static> {
    RestoreOptions {
        threads: 2,
        zero_damaged,
        progress: None,
    }
}

/// (offset, length) of ranges written as zeros.
type Ranges = Vec<(u64, u64)>;

/// Restore `name@snap` to memory, with the ranges written as zeros.
fn restore_stream(
    repo: &Repository,
    name: &str,
    snap: u64,
    zero_damaged: bool,
) -> cairn_store::Result<(Vec<u8>, Ranges)> {
    let m = repo.read_manifest(name, snap)?;
    let loaded = repo.load_index()?;
    let mut out = Vec::new();
    let r = restore(
        repo,
        &loaded.index,
        &m,
        Destination::Stream(&mut out),
        &opts(zero_damaged),
    )?;
    assert_eq!(r.size, out.len() as u64);
    Ok((out, r.damaged.iter().map(|d| (d.offset, d.len)).collect()))
}

fn verify_all(repo: &Repository) -> cairn_store::VerifyReport {
    verify(
        repo,
        &VerifyOptions {
            read_data: true,
            threads: 2,
            progress: None,
            ..Default::default()
        },
    )
    .unwrap()
}

/// The places the problems name: chunk places with their offsets, and
/// whole snapshots (length 0) for manifests.
fn named(problems: &[Problem], lay: &Layout) -> BTreeSet<Place> {
    let mut v = BTreeSet::new();
    for p in problems {
        for a in &p.affected {
            let len = match p.kind {
                "manifest" => 0,
                _ => lay
                    .places
                    .values()
                    .flatten()
                    .find(|x| x.image == a.image && x.snap == a.snapshot && x.offset == a.offset)
                    .map_or(u64::MAX, |x| x.len),
            };
            v.insert(Place {
                image: a.image.clone(),
                snap: a.snapshot,
                offset: a.offset,
                len,
            });
        }
    }
    v
}

/// Check a damaged copy: verify names exactly `places`; every snapshot
/// they touch fails to restore, and restores with zeros in exactly its
/// ranges when asked; every other snapshot restores to its bytes.
fn check(what: &str, repo_dir: &Path, lay: &Layout, places: &BTreeSet<Place>, kinds: &[&str]) {
    let expected = expected_images();
    let pristine = Repository::open(&root().join("repo")).unwrap();
    let repo = Repository::open(repo_dir).unwrap();
    let report = verify_all(&repo);
    assert!(!report.problems.is_empty(), "{what}: verify found nothing");
    for kind in kinds {
        assert!(
            report.problems.iter().any(|p| p.kind == *kind),
            "{what}: no {kind} problem: {:?}",
            report.problems
        );
    }
    assert_eq!(&named(&report.problems, lay), places, "{what}");
    for ((name, snap), (size, hash)) in &expected {
        let here: Vec<&Place> = places
            .iter()
            .filter(|p| p.image == *name && p.snap == *snap)
            .collect();
        if here.is_empty() {
            let (bytes, damaged) = restore_stream(&repo, name, *snap, false)
                .unwrap_or_else(|e| panic!("{what}: {name}@{snap}: {e}"));
            assert!(damaged.is_empty());
            assert_eq!(bytes.len() as u64, *size);
            assert_eq!(blake3::hash(&bytes).to_hex().as_str(), hash, "{what}");
        } else if here.iter().any(|p| p.len == 0) {
            let e = restore_stream(&repo, name, *snap, true).unwrap_err();
            assert!(matches!(e, StoreError::Corrupt { .. }), "{what}: {e}");
        } else {
            let e = restore_stream(&repo, name, *snap, false).unwrap_err();
            let text = e.to_string();
            assert!(
                here.iter()
                    .any(|p| text.contains(&format!("image offset {}", p.offset))),
                "{what}: {name}@{snap}: {text}"
            );
            let (bytes, damaged) = restore_stream(&repo, name, *snap, true).unwrap();
            // Neighbouring ranges lost together are listed as one.
            let want = merged(here.iter().map(|p| (p.offset, p.len)));
            let got = merged(damaged);
            assert_eq!(got, want, "{what}: {name}@{snap}");
            let (mut good, _) = restore_stream(&pristine, name, *snap, false).unwrap();
            for p in &here {
                good[p.offset as usize..(p.offset + p.len) as usize].fill(0);
            }
            assert!(bytes == good, "{what}: {name}@{snap} outside the damage");
        }
    }
}

/// Every snapshot restores to its bytes.
fn check_intact(what: &str, repo_dir: &Path) {
    let repo = Repository::open(repo_dir).unwrap();
    for ((name, snap), (_, hash)) in expected_images() {
        let (bytes, damaged) = restore_stream(&repo, &name, snap, false)
            .unwrap_or_else(|e| panic!("{what}: {name}@{snap}: {e}"));
        assert!(damaged.is_empty());
        assert_eq!(blake3::hash(&bytes).to_hex().as_str(), hash, "{what}");
    }
}

fn flip(path: &Path, at: u64) {
    let mut d = fs::read(path).unwrap();
    d[at as usize] ^= 0x01;
    fs::write(path, d).unwrap();
}

/// Move a path from the intact layout to the copy at `to`.
fn moved(p: &Path, to: &Path) -> PathBuf {
    let rel = p.strip_prefix(root().join("repo")).unwrap();
    to.join(rel)
}

// ---------------------------------------------------------------- tests

#[test]
fn version_1_repository_restores_and_verifies_without_writing() {
    let repo_dir = root().join("repo");
    let before = snapshot_tree(&repo_dir);
    let repo = Repository::open(&repo_dir)
        .unwrap_or_else(|e| panic!("{e} (run with CAIRN_BLESS=1 to create the fixture)"));
    assert_eq!(repo.target_dirs(), &[repo_dir.join("data")]);

    // Version 1 of every file: envelope version at 12..16, pack version
    // at 8..12.
    let mut files = vec![repo_dir.join("config"), repo_dir.join("data/cairn-target")];
    files.extend(repo.index_files().unwrap().iter().map(|k| repo.locate(k)));
    let expected = expected_images();
    for (name, snap) in expected.keys() {
        files.push(repo.manifest_path(name, *snap));
    }
    for f in &files {
        let d = fs::read(f).unwrap();
        assert_eq!(&d[..8], b"CAIRNMET", "{}", f.display());
        assert_eq!(&d[12..16], &1u32.to_le_bytes(), "{}", f.display());
    }
    let lay = layout(&repo_dir);
    for p in lay.packs() {
        let d = fs::read(&p).unwrap();
        assert_eq!(&d[..8], b"CAIRNPAK");
        assert_eq!(&d[8..12], &1u32.to_le_bytes(), "{}", p.display());
    }

    // Every snapshot, to a stream and to a file, byte for byte.
    let images: Vec<(String, u64)> = repo
        .images()
        .unwrap()
        .into_iter()
        .flat_map(|(n, snaps)| snaps.into_iter().map(move |s| (n.clone(), s)))
        .collect();
    assert_eq!(images, expected.keys().cloned().collect::<Vec<_>>());
    let loaded = repo.load_index().unwrap();
    assert!(loaded.damaged.is_empty());
    for ((name, snap), (size, hash)) in &expected {
        let (bytes, damaged) = restore_stream(&repo, name, *snap, false).unwrap();
        assert!(damaged.is_empty());
        assert_eq!(bytes.len() as u64, *size, "{name}@{snap}");
        assert_eq!(
            blake3::hash(&bytes).to_hex().as_str(),
            hash,
            "{name}@{snap} restores to other bytes"
        );
        let m = repo.read_manifest(name, *snap).unwrap();
        assert!(m.extents.iter().any(|e| matches!(e, Extent::Hole { .. })));
        let f = tempfile::tempfile().unwrap();
        f.set_len(m.size).unwrap();
        restore(
            &repo,
            &loaded.index,
            &m,
            Destination::At {
                file: &f,
                zeroed: true,
            },
            &opts(false),
        )
        .unwrap();
        let mut again = Vec::new();
        std::io::Read::read_to_end(&mut &f, &mut again).unwrap();
        assert!(again == bytes, "{name}@{snap}: positional restore differs");
    }
    // alpha@2 shares chunks with alpha@1; records hold several chunks.
    assert!(lay.places.values().any(|p| p.len() > 1));
    assert!(lay.records.values().any(|r| lay.chunks_of(r).len() > 1));

    let report = verify_all(&repo);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert!(report.unindexed_packs.is_empty());
    assert_eq!(report.images, 2);
    assert_eq!(report.snapshots, 3);
    assert!(report.bytes_read > 0);

    drop(repo);
    assert!(
        snapshot_tree(&repo_dir) == before,
        "opening, restoring or verifying changed the committed repository"
    );
}

#[test]
fn committed_damaged_files_are_found() {
    let dir = root().join("damaged");
    let lay = layout(&root().join("repo"));
    let mut kinds = Vec::new();
    for e in fs::read_dir(&dir).unwrap() {
        kinds.push(e.unwrap().path());
    }
    kinds.sort();
    let names: Vec<String> = kinds
        .iter()
        .map(|k| k.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "index-flipped-byte",
            "manifest-flipped-byte",
            "pack-flipped-byte"
        ]
    );
    for kind in &kinds {
        let what = kind.file_name().unwrap().to_string_lossy().into_owned();
        let (_tmp, repo) = fresh_copy();
        copy_tree(&kind.join("files"), &repo);
        let text = fs::read_to_string(kind.join("expect.tsv")).unwrap();
        let places: BTreeSet<Place> = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| {
                let f: Vec<&str> = l.split('\t').collect();
                Place {
                    image: f[0].into(),
                    snap: f[1].parse().unwrap(),
                    offset: f[2].parse().unwrap(),
                    len: f[3].parse().unwrap(),
                }
            })
            .collect();
        let problem_kinds: &[&str] = match what.as_str() {
            "pack-flipped-byte" => &["damaged-chunk"],
            "index-flipped-byte" => &["index", "missing-chunk"],
            _ => &["manifest"],
        };
        // The damage reaches some snapshots, never all.
        assert!(!places.is_empty() && places.iter().all(|p| p.image == "alpha"));
        check(&what, &repo, &lay, &places, problem_kinds);
    }
}

#[test]
fn generated_damage_of_every_kind_is_found() {
    let intact = root().join("repo");
    let lay = layout(&intact);
    let repo0 = Repository::open(&intact).unwrap();
    let mut cases = 0;
    let mut raw_records = 0;

    // A flipped byte in the stored bytes and in the header of every
    // record: the record's chunks are lost, nothing else.
    for pack in lay.packs() {
        let data = fs::read(&pack).unwrap();
        for rec in lay.records_in(&pack) {
            let (header, stored) = record_layout(&data, rec.offset);
            assert_eq!(header + stored, rec.len);
            let places = lay.places_of(&lay.chunks_of(&rec));
            for (part, at) in [
                ("stored bytes", rec.offset + header + stored / 2),
                ("chunk count", rec.offset + 6),
                ("chunk table", rec.offset + 20 + 33),
            ] {
                let (_tmp, repo) = fresh_copy();
                flip(&moved(&pack, &repo), at);
                let what = format!("{part} of record at {} in {}", rec.offset, pack.display());
                check(&what, &repo, &lay, &places, &["damaged-chunk"]);
                cases += 1;
            }

            // A stored byte changed and the CRC fixed up to match: only
            // the BLAKE3 of each chunk can tell.
            let (_tmp, repo) = fresh_copy();
            let p = moved(&pack, &repo);
            let mut d = fs::read(&p).unwrap();
            let (r, end) = (rec.offset as usize, (rec.offset + rec.len) as usize);
            let pos = stored / 2;
            d[(rec.offset + header + pos) as usize] ^= 0x01;
            let crc = crc32c::crc32c_append(crc32c::crc32c(&d[r..r + 16]), &d[r + 20..end]);
            d[r + 16..r + 20].copy_from_slice(&crc.to_le_bytes());
            fs::write(&p, &d).unwrap();
            let what = format!("CRC-fixed record at {} in {}", rec.offset, pack.display());
            if data[r + 4] == 0 {
                // Stored as is: exactly the chunk holding that byte.
                raw_records += 1;
                let mut slice = 0;
                let mut hit = None;
                for i in 0..(header as usize - 20) / 36 {
                    let e = r + 20 + 36 * i;
                    let len = u64::from(u32::from_le_bytes(d[e + 32..e + 36].try_into().unwrap()));
                    if (slice..slice + len).contains(&pos) {
                        hit = Some(ChunkId(d[e..e + 32].try_into().unwrap()));
                    }
                    slice += len;
                }
                let places = lay.places_of(&[hit.unwrap()]);
                check(&what, &repo, &lay, &places, &["damaged-chunk"]);
            } else {
                // Compressed: the group no longer decodes, or some of its
                // chunks decode to other bytes; verify and restore agree.
                let report = verify_all(&Repository::open(&repo).unwrap());
                let found = named(&report.problems, &lay);
                assert!(found.is_subset(&places), "{what}: {found:?}");
                if found.is_empty() {
                    // The flip changed nothing the decoder produces.
                    check_intact(&what, &repo);
                } else {
                    check(&what, &repo, &lay, &found, &["damaged-chunk"]);
                }
            }
            cases += 1;
        }
        // Truncated in its last record, and deleted.
        let last = lay.records_in(&pack).pop().unwrap();
        let cut = last.offset + last.len / 2;
        let (_tmp, repo) = fresh_copy();
        let f = fs::OpenOptions::new()
            .write(true)
            .open(moved(&pack, &repo))
            .unwrap();
        f.set_len(cut).unwrap();
        let places = lay.places_of(&lay.chunks_in(&pack, cut));
        check("truncated pack", &repo, &lay, &places, &["pack"]);
        let (_tmp, repo) = fresh_copy();
        fs::remove_file(moved(&pack, &repo)).unwrap();
        let places = lay.places_of(&lay.chunks_in(&pack, 0));
        check("deleted pack", &repo, &lay, &places, &["pack"]);
        cases += 2;
    }

    // Index files: a flipped byte, and deleted.
    for (pack, idx) in &lay.index_of {
        let places = lay.places_of(&lay.chunks_in(pack, 0));
        let (_tmp, repo) = fresh_copy();
        let len = fs::metadata(idx).unwrap().len();
        flip(&moved(idx, &repo), len / 3);
        check("flipped index byte", &repo, &lay, &places, &["index"]);
        let (_tmp, repo) = fresh_copy();
        fs::remove_file(moved(idx, &repo)).unwrap();
        check("deleted index", &repo, &lay, &places, &["missing-chunk"]);
        cases += 2;
    }

    // Manifests: a flipped byte in each.
    for (name, snaps) in repo0.images().unwrap() {
        for snap in snaps {
            let m = repo0.manifest_path(&name, snap);
            let (_tmp, repo) = fresh_copy();
            let len = fs::metadata(&m).unwrap().len();
            flip(&moved(&m, &repo), len - 40);
            let whole = BTreeSet::from([Place {
                image: name.clone(),
                snap,
                offset: 0,
                len: 0,
            }]);
            check("flipped manifest byte", &repo, &lay, &whole, &["manifest"]);
            cases += 1;
        }
    }
    assert!(cases > 20, "only {cases} cases");
    assert!(raw_records > 0, "no record stored as is");
}

/// Rewrite the version of a metadata file and seal it again (BLAKE3 of
/// everything before the 32-byte trailer).
fn reseal(path: &Path, version: u32) {
    let mut d = fs::read(path).unwrap();
    d[12..16].copy_from_slice(&version.to_le_bytes());
    let end = d.len() - 32;
    let sum = *blake3::hash(&d[..end]).as_bytes();
    d[end..].copy_from_slice(&sum);
    fs::write(path, d).unwrap();
}

fn is_newer(e: &StoreError) -> bool {
    is_newer_than(e, 2, 1)
}

fn is_newer_than(e: &StoreError, version: u32, newest: u32) -> bool {
    matches!(
        e,
        StoreError::NewerVersion {
            found,
            supported,
            ..
        } if (*found, *supported) == (version, newest)
    ) && e.to_string().contains(&format!(
        "format version {version} is newer than this cairn supports"
    ))
}

#[test]
fn newer_versions_are_refused_by_name() {
    // Target markers have a version 2 (naming the repository's home).
    // (Configs of version 2 are encrypted repositories'.)
    for (file, version, newest) in [("config", 3, 2), ("data/cairn-target", 3, 2)] {
        let (_tmp, repo) = fresh_copy();
        reseal(&repo.join(file), version);
        let e = Repository::open(&repo).unwrap_err();
        assert!(is_newer_than(&e, version, newest), "{file}: {e}");
    }

    // Manifests have a version 2 (with tags) and 3 (with the group size).
    let (_tmp, dir) = fresh_copy();
    reseal(&dir.join("snapshots/alpha/0000000002.snap"), 4);
    let repo = Repository::open(&dir).unwrap();
    let e = repo.read_manifest("alpha", 2).unwrap_err();
    assert!(is_newer_than(&e, 4, 3), "{e}");
    let report = verify_all(&repo);
    assert_eq!(report.problems.len(), 1);
    assert!(report.problems[0]
        .message
        .contains("newer than this cairn supports"));

    let lay = layout(&root().join("repo"));
    let (_tmp, dir) = fresh_copy();
    let idx = lay.index_of.values().next().unwrap();
    reseal(&moved(idx, &dir), 2);
    let repo = Repository::open(&dir).unwrap();
    let loaded = repo.load_index().unwrap();
    assert_eq!(loaded.damaged.len(), 1);
    assert!(is_newer(&loaded.damaged[0]), "{}", loaded.damaged[0]);

    // A pack header of version 3 (CRC-32C of bytes 0..60 at 60); version
    // 2 is the sealed packs of an encrypted repository.
    let (_tmp, dir) = fresh_copy();
    let pack = lay.packs().into_iter().next().unwrap();
    let p = moved(&pack, &dir);
    let mut d = fs::read(&p).unwrap();
    d[8..12].copy_from_slice(&3u32.to_le_bytes());
    let crc = crc32c::crc32c(&d[..60]);
    d[60..64].copy_from_slice(&crc.to_le_bytes());
    fs::write(&p, d).unwrap();
    let repo = Repository::open(&dir).unwrap();
    let report = verify_all(&repo);
    assert!(!report.problems.is_empty());
    assert!(
        report
            .problems
            .iter()
            .all(|p| p.message.contains("format version 3 is newer")),
        "{:?}",
        report.problems
    );
}

/// Ranges with neighbours joined.
fn merged(ranges: impl IntoIterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = ranges.into_iter().collect();
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (o, l) in v {
        match out.last_mut() {
            Some(last) if last.0 + last.1 == o => last.1 += l,
            _ => out.push((o, l)),
        }
    }
    out
}

// ------------------------------------------------- the encrypted fixture

/// The password of `tests/fixtures/repository-encrypted-v*/`.
const FIXTURE_PASSWORD: &str = "cairn fixture password";

/// A committed encrypted repository (version 2 config, sealed records
/// and metadata, keyed ids, hashed names), of the same images as
/// `repository-v1`:
///
/// - `repository-encrypted-v1`: key files of version 1 (the master key
///   alone: written before keyed chunkers, so cut with the public gear
///   table). Not written anew: this cairn makes such a repository only
///   when told to cut as one (`--copy-chunker-params`).
/// - `repository-encrypted-v2`: key files of version 2 (master key and
///   chunker secret); with `CAIRN_BLESS=1`, written anew first.
fn encrypted_root(key_version: u32) -> PathBuf {
    static BLESSED: Once = Once::new();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!(
        "../../tests/fixtures/repository-encrypted-v{key_version}"
    ));
    if key_version == 2 && std::env::var("CAIRN_BLESS").as_deref() == Ok("1") {
        BLESSED.call_once(|| {
            let _ = fs::remove_dir_all(dir.join("repo"));
            let opts = cairn_store::InitOptions {
                encryption: Some((
                    cairn_store::Password::new(FIXTURE_PASSWORD),
                    // Cheap, so the test is quick; the cost is in the key.
                    cairn_store::KdfParams {
                        memory_kib: 256,
                        iterations: 1,
                        parallelism: 1,
                    },
                )),
                ..Default::default()
            };
            let repo = Repository::init_with(&dir.join("repo"), &opts).unwrap();
            store_images(&repo);
            for e in fs::read_dir(dir.join("repo/data/packs")).unwrap() {
                let _ = fs::remove_dir(e.unwrap().path());
            }
        });
    }
    dir
}

#[test]
fn encrypted_repository_v1_restores_and_verifies_without_writing() {
    check_encrypted_fixture(1);
}

#[test]
fn encrypted_repository_v2_restores_and_verifies_without_writing() {
    check_encrypted_fixture(2);
}

/// The lengths of `name@snap`'s chunks.
fn chunk_lengths(repo: &Repository, name: &str, snap: u64) -> Vec<u32> {
    let m = repo.read_manifest(name, snap).unwrap();
    m.extents
        .iter()
        .filter_map(|e| match e {
            Extent::Data { len, .. } => Some(*len),
            Extent::Hole { .. } => None,
        })
        .collect()
}

fn check_encrypted_fixture(key_version: u32) {
    let repo_dir = encrypted_root(key_version).join("repo");
    let before = snapshot_tree(&repo_dir);
    let password = cairn_store::Password::new(FIXTURE_PASSWORD);
    let repo = Repository::open_with(&repo_dir, &password)
        .unwrap_or_else(|e| panic!("{e} (run with CAIRN_BLESS=1 to create the fixture)"));
    assert_eq!(repo.encryption(), Some("aes-256-gcm"));

    // Config version 2; index files and manifests sealed (kind + 0x100);
    // packs of version 2; key files of the fixture's version; no image
    // name in any path or file.
    let config = fs::read(repo_dir.join("config")).unwrap();
    assert_eq!(&config[12..16], &2u32.to_le_bytes());
    let mut key_files = 0;
    for e in fs::read_dir(repo_dir.join("keys")).unwrap() {
        let d = fs::read(e.unwrap().path()).unwrap();
        assert_eq!(&d[12..16], &key_version.to_le_bytes());
        key_files += 1;
    }
    assert_eq!(key_files, 1);
    let expected = expected_images();

    // Version 1 keeps the public gear table: its images were cut where
    // the plain fixture's were. Version 2 cuts with its secret's table.
    let plain = Repository::open(&root().join("repo")).unwrap();
    assert_eq!(
        repo.gear_table() == cairn_store::GearTable::public(),
        key_version == 1
    );
    let mut cut_alike = 0;
    for (name, snap) in expected.keys() {
        let lengths = chunk_lengths(&repo, name, *snap);
        assert!(lengths.len() > 3, "{name}@{snap}: {lengths:?}");
        if lengths == chunk_lengths(&plain, name, *snap) {
            cut_alike += 1;
        }
    }
    assert_eq!(cut_alike, if key_version == 1 { expected.len() } else { 0 });

    let mut sealed = repo
        .index_files()
        .unwrap()
        .iter()
        .map(|k| repo.locate(k))
        .collect::<Vec<_>>();
    for (name, snap) in expected.keys() {
        let p = repo.manifest_path(name, *snap);
        assert!(
            !p.to_string_lossy().contains(name.as_str()),
            "{}",
            p.display()
        );
        sealed.push(p);
    }
    for f in &sealed {
        let d = fs::read(f).unwrap();
        assert_eq!(&d[..8], b"CAIRNMET", "{}", f.display());
        assert_eq!(d[9], 1, "{}: not sealed", f.display());
        if key_version == 1 {
            // Written then (the newer fixture has the manifests of now).
            assert_eq!(&d[12..16], &1u32.to_le_bytes(), "{}", f.display());
        }
    }
    let mut packs = 0;
    for (p, d, _) in &before {
        if p.extension().is_some_and(|e| e == "pack") {
            assert_eq!(&d[8..12], &2u32.to_le_bytes(), "{}", p.display());
            packs += 1;
        }
        for name in ["alpha", "beta", "cairn keeps"] {
            assert!(
                !d.windows(name.len()).any(|w| w == name.as_bytes()),
                "{} holds {name:?}",
                p.display()
            );
        }
    }
    assert!(packs > 0);

    // Every snapshot restores to the bytes of the plain fixture's.
    let images: Vec<(String, u64)> = repo
        .images()
        .unwrap()
        .into_iter()
        .flat_map(|(n, snaps)| snaps.into_iter().map(move |s| (n.clone(), s)))
        .collect();
    assert_eq!(images, expected.keys().cloned().collect::<Vec<_>>());
    for ((name, snap), (size, hash)) in &expected {
        let (bytes, damaged) = restore_stream(&repo, name, *snap, false).unwrap();
        assert!(damaged.is_empty());
        assert_eq!(bytes.len() as u64, *size, "{name}@{snap}");
        assert_eq!(
            blake3::hash(&bytes).to_hex().as_str(),
            hash,
            "{name}@{snap}"
        );
    }
    let report = verify_all(&repo);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!((report.images, report.snapshots), (2, 3));

    // Without the password, or with another, it does not open.
    assert!(matches!(
        Repository::open(&repo_dir),
        Err(StoreError::KeyNeeded(_))
    ));
    assert!(matches!(
        Repository::open_with(&repo_dir, &cairn_store::Password::new("nope")),
        Err(StoreError::WrongPassword(_))
    ));
    drop(repo);
    assert!(
        snapshot_tree(&repo_dir) == before,
        "opening, restoring or verifying changed the committed repository"
    );

    // A copy takes the same images again without a new chunk: the table
    // a backup cuts with is the one the repository was cut with.
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&repo_dir, &dir.path().join("repo"));
    let copy = Repository::open_with(&dir.path().join("repo"), &password).unwrap();
    assert_eq!(store_images_counting(&copy).1, 0);
}
