//! `repair`: take out of the index what `verify --read-data` finds
//! damaged, so that nothing deduplicates against it any more and the next
//! backup of the same data stores it again.
//!
//! A damaged record stays in the index until something reads it: a backup
//! that meets one of its chunks again references it (deduplication reads
//! nothing), and writes a snapshot that cannot be restored. restic's
//! `repair packs` + `repair index` and borg's `check --repair` answer this
//! the same way: drop what is damaged, let the next backup supply it
//! again. Here: every index entry whose record is gone (a missing or
//! short pack, a pack of another repository), fails its CRC, does not decode, or
//! holds a chunk that does not hash to its id, is dropped through
//! [`crate::gc`] (which writes the new index files and deletes what is
//! then dead, under its crash protocol). Snapshots that use a dropped
//! chunk stay: `verify` names them (missing chunks) until a backup stores
//! those chunks again, which heals them, or until they are forgotten.
//!
//! A chunk stored twice (two backups that stored the same new data at
//! once, say) whose copy the index uses is damaged while the other copy
//! is sound loses nothing either: gc has the index use the sound copy
//! ([`crate::index::ChunkIndex::prefer`]), and the damaged one is dead.
//!
//! A pack whose header is damaged loses nothing: its header holds no
//! data, and its records carry their own checks. verify checks them as
//! any others and names the header; repair has gc copy the sound ones
//! into new packs (only those that fail their own checks are dropped).
//!
//! Before the check, packs that no index file names (its index file
//! lost or damaged, or a backup killed before writing one) are indexed
//! again from their records, as every writer does when it runs alone:
//! their chunks are not missing, only unnamed.
//!
//! Only what was read and found damaged is dropped: a pack that could not
//! be read (an I/O or network error), in the salvage or in the check,
//! stops the repair before it drops or switches anything. It runs alone (no
//! other cairn command on the repository), so no backup deduplicates
//! against a chunk between the check and the drop.

use crate::error::{Result, StoreError};
use crate::gc::{gc, GcOptions, GcReport};
use crate::repo::{Repository, Session};
use crate::verify::{verify, VerifyOptions, VerifyReport};
use std::collections::{BTreeSet, HashMap, HashSet};

/// How to repair.
pub struct RepairOptions<'a> {
    /// Only find and report what would be dropped.
    pub dry_run: bool,
    /// Threads reading packs.
    pub threads: usize,
    /// Called with (bytes checked, bytes to check) while reading packs.
    pub progress: Option<&'a (dyn Fn(u64, u64) + Sync)>,
}

/// What repair found and did.
#[derive(Debug, Clone)]
pub struct RepairReport {
    /// The check before the repair (`verify --read-data`).
    pub found: VerifyReport,
    /// Trash lists removed because they failed their checks (a list
    /// names only objects to delete: nothing is lost).
    pub trash_removed: Vec<std::path::PathBuf>,
    /// Index entries dropped (with `dry_run`: that would be dropped),
    /// those of `switched` included.
    pub dropped: u64,
    /// Chunks of damaged records the index now finds in another copy
    /// that is sound (with `dry_run`: would), so no snapshot loses them.
    pub switched: u64,
    /// Packs whose header is damaged, or with bytes past their sealed
    /// end, their sound records copied into new packs and the old ones
    /// removed (with `dry_run`: that would be).
    pub rewritten: u64,
    /// Index entries whose record length was wrong (the record sound),
    /// given the record's own (with `dry_run`: that would be).
    pub corrected: u64,
    /// Snapshots (image, number) that use a dropped chunk: they read as
    /// missing chunks until a backup stores those chunks again.
    pub affected: Vec<(String, u64)>,
    /// The index rewrite (None with `dry_run` or nothing to drop).
    pub gc: Option<GcReport>,
    /// Packs no index file named, indexed again from their records
    /// before the check (None with `dry_run`).
    pub salvaged: Option<crate::repo::Salvaged>,
}

/// Drop the damaged records [`verify`] finds from the index.
pub fn repair(repo: &Repository, session: &Session, opts: &RepairOptions) -> Result<RepairReport> {
    if repo.others_running(session)? {
        return Err(StoreError::Invalid(
            "another cairn command is using the repository (see `cairn stats`); repair runs \
             alone"
                .into(),
        ));
    }
    // First what gc and every writer do before they load the index: take
    // in packs no index file names (a lost or damaged index file, a
    // killed backup) from their records, and set aside damaged index
    // files once those packs are indexed again. A check (`dry_run`)
    // writes nothing: verify names them.
    // A damaged trash list stops every writer; it names only objects to
    // delete, so it goes first (nothing is lost).
    let trash_removed = if opts.dry_run {
        Vec::new()
    } else {
        repo.remove_damaged_trash_lists()?
    };
    let salvaged = if opts.dry_run {
        None
    } else {
        // Trash collection runs first (deleting only what nothing can
        // need), and salvage deletes, as it goes, files in packs/ too
        // short to hold a pack header; it indexes again no pack, and no
        // damaged index file is set aside, until every pack is read: a
        // read that fails stops it having dropped nothing.
        let index = repo.writer_index_with(session, true).map_err(|e| match e {
            StoreError::Io {
                what: "read" | "get" | "open",
                ref path,
                ..
            } => {
                let (what, advice) = match path.extension().and_then(|x| x.to_str()) {
                    Some("pack") => (
                        "a pack",
                        "; one that stays unreadable is moved out of packs/ by hand, then it \
                         counts as missing",
                    ),
                    Some("idx") => (
                        "an index file",
                        "; one that stays unreadable is renamed to end in .damaged by hand",
                    ),
                    _ => ("a file of the repository", ""),
                };
                StoreError::Invalid(format!(
                    "{e}: {what} could not be read, and what cannot be read is not known to be \
                     damaged: repair dropped nothing, and drops nothing until it can be read \
                     (run it again{advice})"
                ))
            }
            e => e,
        })?;
        Some(index.salvaged)
    };
    let found = verify(
        repo,
        &VerifyOptions {
            read_data: true,
            threads: opts.threads,
            progress: opts.progress,
            ..Default::default()
        },
    )?;
    if let Some(first) = found.unread_packs.first() {
        return Err(StoreError::Invalid(format!(
            "{} pack(s) could not be read ({first}{}), so what they hold is not known to be \
             damaged: repair dropped nothing, and drops nothing until every pack can be read \
             (run it again; one that stays unreadable is moved out of packs/ by hand, then it \
             counts as missing)",
            found.unread_packs.len(),
            match found.unread_packs.len() {
                1 => "",
                _ => "; `cairn verify --read-data` names the others",
            }
        )));
    }
    let drop: HashSet<(crate::id::PackId, u32, u32)> =
        found.damaged_records.iter().copied().collect();
    let affected: Vec<(String, u64)> = found
        .problems
        .iter()
        .filter(|p| p.kind == "damaged-chunk")
        .flat_map(|p| p.affected.iter().map(|a| (a.image.clone(), a.snapshot)))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let fix: HashMap<(crate::id::PackId, u32, u32, u32), u32> = found
        .misindexed
        .iter()
        .map(|w| ((w.pack, w.offset, w.slice, w.says), w.own))
        .collect();
    let rewrite: HashSet<crate::id::PackId> = found
        .damaged_headers
        .iter()
        .chain(&found.overlong_packs)
        .copied()
        .collect();
    let mut report = RepairReport {
        trash_removed,
        dropped: drop.len() as u64,
        switched: found.recoverable as u64,
        rewritten: rewrite.len() as u64,
        corrected: found.misindexed.len() as u64,
        affected,
        found,
        gc: None,
        salvaged,
    };
    if (drop.is_empty() && rewrite.is_empty() && fix.is_empty()) || opts.dry_run {
        return Ok(report);
    }
    // No repacking but of packs whose header is damaged (their sound
    // records copied into new packs): a pack's sound records stay where
    // they are, only the index changes, and packs left with nothing live
    // go.
    let g = gc(
        repo,
        session,
        &GcOptions {
            repack_below: 0.0,
            progress: None,
            drop_records: drop.clone(),
            rewrite_packs: rewrite,
            fix_lengths: fix.clone(),
        },
    )?;
    // (`g.dropped` counts the entries gc still had in memory: those of a
    // cut or missing pack were left out when the index was loaded, and go
    // with the index files now. The check below says all went.)
    report.switched = g.switched;
    report.corrected = g.corrected;
    let deferred = g.deferred;
    report.gc = Some(g);
    if deferred {
        // A command that began meanwhile still runs: the old index files
        // stay until it ends (they are on the trash list, which records
        // the dropped records, so whoever works it off keeps them out).
        // Until then the index still finds the damaged entries in them.
        return Ok(report);
    }
    // gc keeps a pack a snapshot still needs and indexes its sound records
    // again: a record whose CRC holds but whose chunk does not hash to its
    // id would come back. Say so rather than claim it is gone.
    let loaded = repo.load_index()?;
    loaded.check_read()?;
    let index = &loaded.index;
    let still = index
        .locations()
        .filter(|(_, loc)| {
            index.pack(loc.pack).is_some_and(|p| {
                drop.contains(&(p.id, loc.offset, loc.slice))
                    || fix.contains_key(&(p.id, loc.offset, loc.slice, loc.len))
            })
        })
        .count();
    if still > 0 {
        return Err(StoreError::Invalid(format!(
            "{still} damaged index entr{} still indexed after the repair (a record that passes \
             its CRC but holds a chunk that does not hash to its id, indexed again for a \
             snapshot that uses it); `cairn forget` the affected snapshots, then repair again",
            if still == 1 { "y is" } else { "ies are" }
        )));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use crate::faults::{files_under, stored_twice, FaultyRepo};

    fn run(r: &FaultyRepo) -> Result<RepairReport> {
        let session = r.repo.session("test").unwrap();
        let opts = RepairOptions {
            dry_run: false,
            threads: 2,
            progress: None,
        };
        repair(&r.repo, &session, &opts)
    }

    /// A pack that cannot be read (EIO) is not damage: repair stops with
    /// an error naming it and saying that nothing was dropped, and
    /// changes nothing on disk, whether the read fails at once (salvage
    /// reads every pack before the check) or only in the check. Here the
    /// pack holds the used copies of chunks stored twice, whose other
    /// copies are sound: nothing is switched to them either.
    #[test]
    fn repair_drops_nothing_of_a_pack_that_cannot_be_read() {
        let (r, used, _) = stored_twice();
        let copies = r.repo.load_index().unwrap().index.other_locations().count();
        let before = r.tree();
        for spared in [0, 1] {
            r.faults.clear();
            r.faults.fail_range_after(&used, 0..u64::MAX, spared);
            let met = r.faults.injected();
            let e = run(&r).unwrap_err().to_string();
            assert!(r.faults.injected() > met, "the fault was met");
            assert!(e.contains(&used.display().to_string()), "{e}");
            assert!(e.contains("dropped nothing"), "{e}");
            assert!(
                r.tree() == before,
                "spared {spared}: repair changed the repository"
            );
        }
        // Readable again: all there, both copies, and nothing to repair.
        r.faults.clear();
        assert!(r.verify().problems.is_empty());
        let loaded = r.repo.load_index().unwrap();
        assert_eq!(loaded.index.other_locations().count(), copies);
        let report = run(&r).unwrap();
        assert_eq!((report.dropped, report.switched), (0, 0), "{report:?}");
    }

    /// A damaged index file that cannot be read again when it is to be
    /// set aside stops repair with an error naming it as an index file,
    /// not a pack.
    #[test]
    fn repair_says_what_could_not_be_read() {
        let r = FaultyRepo::new();
        let idx = files_under(&r.dir.path().join("repo/index"))
            .into_iter()
            .find(|p| p.extension().is_some_and(|x| x == "idx"))
            .unwrap();
        let mut bytes = std::fs::read(&idx).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x40;
        std::fs::write(&idx, bytes).unwrap();
        // Read (damaged) when the index is loaded, not when read again.
        r.faults.fail_range_after(&idx, 0..u64::MAX, 1);
        let e = run(&r).unwrap_err().to_string();
        assert!(r.faults.injected() > 0, "the fault was met");
        assert!(e.contains(&idx.display().to_string()), "{e}");
        assert!(e.contains("an index file could not be read"), "{e}");
        assert!(e.contains("dropped nothing"), "{e}");
        assert!(!e.contains("pack"), "{e}");
    }

    /// Image `b` (grouped records) backed up beside `a`, and two of its
    /// index entries given wrong record lengths: the first entry of one
    /// record one byte short, a later entry of another running past its
    /// pack's end. Returns the image and the packs `b`'s index file does
    /// not name (only `a`'s chunks are in them).
    fn with_wrong_lengths(r: &FaultyRepo) -> (Vec<u8>, Vec<crate::PackId>) {
        let grouped = cairn_testkit::noise(1 << 20, 8);
        r.backup_of("b", &grouped, 256 << 10);
        let mut files = Vec::new();
        for path in files_under(&r.dir.path().join("repo/index")) {
            let bytes = std::fs::read(&path).unwrap();
            files.push((
                crate::index::IndexFile::decode(&path, &bytes).unwrap(),
                path,
            ));
        }
        // Records of several chunks, by index file.
        for (file, path) in &mut files {
            let mut records: std::collections::BTreeMap<(u32, u32), Vec<usize>> =
                Default::default();
            for (i, (_, loc)) in file.entries.iter().enumerate() {
                records.entry((loc.pack, loc.offset)).or_default().push(i);
            }
            let mut several: Vec<Vec<usize>> =
                records.into_values().filter(|v| v.len() > 2).collect();
            if several.len() < 2 {
                continue;
            }
            for v in &mut several {
                v.sort_by_key(|&i| file.entries[i].1.slice);
            }
            file.entries[several[0][0]].1.len -= 1;
            let loc = &mut file.entries[several[1][1]].1;
            let pack_len = file.packs[loc.pack as usize].len as u32;
            loc.len = pack_len - loc.offset + 7;
            std::fs::write(&*path, file.encode()).unwrap();
            let b_packs: Vec<_> = file.packs.iter().map(|p| p.id).collect();
            let only_a = files
                .iter()
                .flat_map(|(f, _)| f.packs.iter().map(|p| p.id))
                .filter(|id| !b_packs.contains(id))
                .collect();
            return (grouped, only_a);
        }
        panic!("no index file with two records of several chunks");
    }

    /// An index entry whose record length is wrong while its record is
    /// sound (a hand edit of a plain repository's index, with its
    /// checksum made to match) is an entry to correct, not damage: verify
    /// said the whole record damaged when the wrong entry came first in
    /// it (and repair dropped every chunk of it, the sound entries'
    /// too), and said nothing when it did not (while restore failed).
    /// Now verify names both entries, repair gives them their records'
    /// lengths and drops nothing, and both images restore.
    #[test]
    fn an_index_entry_with_a_wrong_length_is_corrected_not_dropped() {
        let r = FaultyRepo::new();
        let (grouped, _) = with_wrong_lengths(&r);
        assert!(r.restore("b").is_err(), "restore reads the forged lengths");

        let v = r.verify();
        let kinds: Vec<&str> = v.problems.iter().map(|p| p.kind).collect();
        assert_eq!(kinds, ["index-entry", "index-entry"], "{:?}", v.problems);
        assert!(v.damaged_records.is_empty(), "{:?}", v.damaged_records);
        assert_eq!(v.misindexed.len(), 2, "{:?}", v.misindexed);
        assert!(
            v.problems.iter().all(|p| !p.affected.is_empty()),
            "the snapshot that reads them is named: {:?}",
            v.problems
        );

        let report = run(&r).unwrap();
        assert_eq!(
            (report.dropped, report.corrected),
            (0, 2),
            "{:?}",
            report.gc
        );
        assert!(report.affected.is_empty(), "{:?}", report.affected);
        let after = r.verify();
        assert!(after.problems.is_empty(), "{:?}", after.problems);
        assert_eq!(r.restore("b").unwrap().0, grouped);
        assert_eq!(r.restore("a").unwrap().0, r.data);
    }

    /// With a pack lost elsewhere, an entry that runs past its own whole
    /// pack's end is still corrected, not left out of the index (the
    /// writer's index left out every entry past its pack's end, in every
    /// pack, once one pack was lost, and repair said it had corrected the
    /// entry while its chunk went).
    #[test]
    fn a_wrong_length_is_corrected_beside_a_lost_pack() {
        let r = FaultyRepo::new();
        let (grouped, only_a) = with_wrong_lengths(&r);
        let lost = only_a[0].to_string();
        let path = files_under(&r.dir.path().join("repo"))
            .into_iter()
            .find(|p| p.to_string_lossy().contains(&lost))
            .unwrap();
        std::fs::remove_file(path).unwrap();
        let v = r.verify();
        let wrong = v.problems.iter().filter(|p| p.kind == "index-entry");
        assert_eq!(wrong.count(), 2, "{:?}", v.problems);

        let report = run(&r).unwrap();
        assert_eq!(report.corrected, 2, "{:?}", report.gc);
        assert!(report.dropped > 0, "a's lost chunks are dropped");
        let names: Vec<&str> = report.affected.iter().map(|a| a.0.as_str()).collect();
        assert_eq!(names, ["a"], "{:?}", report.affected);
        let after = r.verify();
        assert!(
            after
                .problems
                .iter()
                .all(|p| p.kind == "missing-chunk" && p.affected.iter().all(|a| a.image == "a")),
            "{:?}",
            after.problems
        );
        assert_eq!(r.restore("b").unwrap().0, grouped);
    }
}
