//! Snapshots that vanish without being removed.
//!
//! A manifest lost to damage, deleted by hand or by a stray sync, or taken
//! back by someone who can write to the store (an older copy of the
//! repository, or of its `snapshots/`, put back) would otherwise just be
//! gone: listings would show one snapshot fewer, and the next `gc` would
//! free its chunks. Two records make such a loss loud
//! (`docs/format/repository.md`, "Removal records"):
//!
//! - **Removal records** in the repository (`removed/DIR/NNNNNNNNNN.rm`,
//!   metadata kind 7): every removal of a snapshot (`rm`, `forget`)
//!   writes one before it deletes the manifest. In an encrypted
//!   repository the record is sealed, so only a holder of the key can
//!   make one; in a plain one it tells a removal from a loss.
//! - **The snapshots this machine has seen**, kept locally (kind 8, in
//!   the state directory of the repository's id, one file per path or
//!   URL the repository is reached by): every listing adds what it finds.
//!
//! A snapshot seen before, absent now, without a removal record naming it
//! is *vanished*: every listing warns of it, `verify` reports it as a
//! problem, and `gc` deletes nothing while one is known (it would free the
//! chunks of a snapshot that may yet be put back). `verify
//! --accept-vanished` forgets them on this machine.
//!
//! Snapshot numbers are never given twice: a backup numbers its snapshot
//! after the image's last snapshot, its last removal record, and the
//! highest number this machine saw of it (one lost is not given again,
//! which would hide the loss), so a record names one snapshot only.
//!
//! The cairn binary keeps the record ([`crate::keep_seen_records`]); a
//! program using the library keeps none unless it asks.
//!
//! What this cannot see: a snapshot this machine never listed, and a loss
//! on a machine that keeps no state (no state directory). Written by hand:
//! no crate keeps such a record for a store of this layout.

use crate::backend::{Key, LocalDir, ReadBackend, WriteBackend};
use crate::bytes::{Reader, Writer};
use crate::crypt::Crypt;
use crate::error::{IoContext, Result, StoreError};
use crate::meta::{self, Kind};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The removal record's body version.
pub(crate) const REMOVAL_VERSION: u32 = 1;

/// The local record's body version.
const SEEN_VERSION: u32 = 1;

/// What a removal record says: which snapshot was removed, when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removal {
    /// The image's name, as the removal named it (in an encrypted
    /// repository, `#` and its folder for an image whose manifests could
    /// not be read).
    pub name: String,
    /// The snapshot's number.
    pub snapshot: u64,
    /// Its creation time (Unix seconds; 0 when its manifest could not be
    /// read).
    pub created: i64,
    /// Its logical size (0 when its manifest could not be read).
    pub size: u64,
    /// When it was removed (Unix seconds).
    pub removed: i64,
}

impl Removal {
    /// The record, sealed under `crypt` if the repository is encrypted.
    pub fn encode(&self, crypt: Option<&Crypt>) -> Result<Vec<u8>> {
        let mut w = Writer::default();
        w.str16(&self.name);
        w.u64(self.snapshot);
        w.i64(self.created);
        w.u64(self.size);
        w.i64(self.removed);
        meta::seal_with(Kind::Removal, REMOVAL_VERSION, &w.buf, crypt)
    }

    /// Read a record (`path` for messages): damaged, forged or of another
    /// repository's key is an error.
    pub fn decode(path: &Path, data: &[u8], crypt: Option<&Crypt>) -> Result<Removal> {
        let (_, body) = meta::open_with(path, data, Kind::Removal, REMOVAL_VERSION, crypt)?;
        let mut r = Reader::new(&body);
        let bad = |at: usize| StoreError::corrupt(path, at as u64, "removal record is truncated");
        let rec = Removal {
            name: r.str16().map_err(bad)?,
            snapshot: r.u64().map_err(bad)?,
            created: r.i64().map_err(bad)?,
            size: r.u64().map_err(bad)?,
            removed: r.i64().map_err(bad)?,
        };
        if r.remaining() > 0 {
            return Err(StoreError::corrupt(
                path,
                r.pos() as u64,
                format!("removal record has {} bytes past its end", r.remaining()),
            ));
        }
        Ok(rec)
    }
}

/// A snapshot by its place: the image's folder under `snapshots/` (its
/// name, or the keyed hash of it in an encrypted repository) and number.
pub type Place = (String, u64);

/// The snapshots this machine has seen in one repository, and those found
/// vanished in this process.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// Where the record is kept; `None`: nowhere (no state directory, or
    /// records not kept by this program), and nothing is checked.
    file: Option<(LocalDir, Key)>,
    /// The record's modification time when `entries` was read or written
    /// from it (`None`: not yet): read again when it changed, by another
    /// process.
    stamp: Option<std::time::SystemTime>,
    /// Every snapshot seen, by place, with its image's name.
    entries: BTreeMap<Place, String>,
    /// Vanished snapshots found, with their image's name.
    vanished: BTreeMap<Place, String>,
    /// Vanished snapshots already warned of in this process.
    warned: BTreeSet<Place>,
    /// Missing snapshots whose removal record could not be read (an I/O
    /// or network error): neither removed nor vanished until it is, and
    /// gc frees nothing meanwhile. With the image's name and the error.
    pub(crate) unchecked: BTreeMap<Place, (String, String)>,
    /// Warnings of vanished snapshots held back (while they are accepted).
    pub(crate) quiet: bool,
    /// A failure to read or write the record was already said.
    complained: bool,
    /// The record was found damaged or deleted while this process knew
    /// entries: the next change writes them even if it adds nothing.
    rewrite: bool,
}

/// The record file as read.
enum Record {
    /// Read and decoded.
    Sound(BTreeMap<Place, String>),
    /// Absent (never written, or deleted) or damaged.
    Lost,
}

/// What a listing found missing: places seen before, now absent.
pub(crate) struct Missing(pub Vec<(Place, String)>);

impl Seen {
    /// The record in folder `dir` under file name `file`.
    pub(crate) fn at(dir: Option<PathBuf>, file: String) -> Seen {
        Seen {
            file: dir.map(|d| (LocalDir::new(&d), Key::new(file))),
            ..Seen::default()
        }
    }

    /// Whether a record is kept at all.
    pub(crate) fn kept(&self) -> bool {
        self.file.is_some()
    }

    /// The record's modification time, `None` when it does not exist.
    fn file_stamp(&self) -> Option<std::time::SystemTime> {
        let (dir, key) = self.file.as_ref()?;
        std::fs::metadata(dir.locate(key))
            .and_then(|m| m.modified())
            .ok()
    }

    /// Read the record if it changed since it was last read or written.
    /// A record found damaged or deleted leaves what this process knew in
    /// place: read as empty, it would make every snapshot found vanished
    /// look settled by another process ([`Seen::drop_settled`]).
    fn load(&mut self) {
        let stamp = self.file_stamp();
        if stamp.is_some() && stamp == self.stamp {
            return;
        }
        match self.read() {
            Some(Record::Sound(entries)) => self.entries = entries,
            Some(Record::Lost) => self.rewrite = !self.entries.is_empty(),
            None => {}
        }
        self.stamp = stamp;
    }

    /// The record as the file holds it; `None` when it cannot be read,
    /// which is said once, as damage is.
    fn read(&mut self) -> Option<Record> {
        let (dir, key) = self.file.as_ref()?;
        let path = dir.locate(key);
        match dir.get(key) {
            Ok(Some(data)) => match decode_seen(&path, &data) {
                Ok(entries) => Some(Record::Sound(entries)),
                Err(e) => {
                    self.say(&format!("{e}; it is written again from what is listed"));
                    Some(Record::Lost)
                }
            },
            Ok(None) => Some(Record::Lost),
            Err(e) => {
                self.say(&format!("{e}"));
                None
            }
        }
    }

    fn say(&mut self, what: &str) {
        if !self.complained {
            self.complained = true;
            tracing::warn!(
                "the record of the snapshots seen on this machine: {what} (snapshots lost from \
                 the repository are not noticed until it can be read and written)"
            );
        }
    }

    /// Seen places under `scope` (one image's folder; `None`: every image)
    /// that are not in `present`.
    pub(crate) fn missing(
        &mut self,
        scope: Option<&str>,
        present: &BTreeMap<String, Vec<u64>>,
    ) -> Missing {
        if !self.kept() {
            return Missing(Vec::new());
        }
        self.load();
        Missing(
            self.entries
                .iter()
                .filter(|((dir, _), _)| scope.is_none_or(|s| s == dir))
                .filter(|((dir, n), _)| !present.get(dir).is_some_and(|v| v.contains(n)))
                .map(|(p, name)| (p.clone(), name.clone()))
                .collect(),
        )
    }

    /// Whether `place` was found vanished in this process already (no
    /// removal record can come for it since: a record is written before
    /// its manifest is deleted).
    pub(crate) fn is_vanished(&self, place: &Place) -> bool {
        self.vanished.contains_key(place)
    }

    /// The highest number seen in image folder `dir`, vanished ones
    /// included: a new snapshot is numbered after it, so that a number
    /// lost is not given again (which would hide its loss).
    pub(crate) fn highest(&mut self, dir: &str) -> Option<u64> {
        if !self.kept() {
            return None;
        }
        self.load();
        self.entries
            .range((dir.to_string(), 0)..=(dir.to_string(), u64::MAX))
            .map(|((_, n), _)| *n)
            .next_back()
    }

    /// Take in a listing: `removed` places (a removal record names them)
    /// are forgotten, `vanished` ones kept and warned of (once per
    /// process), `present` ones (with their image's name) added; the record
    /// is written if it changed.
    pub(crate) fn take(
        &mut self,
        removed: &[Place],
        vanished: Vec<(Place, String)>,
        present: impl IntoIterator<Item = (Place, String)>,
        location: &str,
    ) {
        if !self.kept() {
            return;
        }
        self.load();
        let gone: Vec<Place> = removed
            .iter()
            .filter(|p| self.entries.contains_key(*p))
            .cloned()
            .collect();
        for p in removed {
            self.vanished.remove(p);
        }
        let mut added = Vec::new();
        for (p, name) in present {
            self.vanished.remove(&p);
            if self.entries.get(&p) != Some(&name) {
                added.push((p, name));
            }
        }
        for (p, name) in vanished {
            if !self.quiet && self.warned.insert(p.clone()) {
                tracing::warn!(
                    "{}. gc deletes nothing until `cairn verify --accept-vanished` forgets it",
                    gone_without_record(&[(name.clone(), p.1)], location)
                );
            }
            self.vanished.insert(p, name);
        }
        self.change(&gone, added);
    }

    /// Vanished snapshots found so far: (image name, number).
    pub(crate) fn vanished(&self) -> Vec<(String, u64)> {
        self.vanished
            .iter()
            .map(|(p, name)| (name.clone(), p.1))
            .collect()
    }

    /// Forget the vanished snapshots: they are no longer expected.
    pub(crate) fn accept_vanished(&mut self) -> Vec<(String, u64)> {
        let gone = std::mem::take(&mut self.vanished);
        let places: Vec<Place> = gone.keys().cloned().collect();
        self.change(&places, Vec::new());
        gone.into_iter().map(|(p, name)| (name, p.1)).collect()
    }

    /// Apply a change to the record: the file is locked, read again (other
    /// processes may have written it since), changed and written whole, so
    /// that one process's change is not undone by another's older copy.
    fn change(&mut self, remove: &[Place], add: Vec<(Place, String)>) {
        if remove.is_empty() && add.is_empty() && !self.rewrite {
            return;
        }
        for p in remove {
            self.entries.remove(p);
        }
        for (p, name) in &add {
            self.entries.insert(p.clone(), name.clone());
        }
        let Some((dir, key)) = &self.file else {
            return;
        };
        let path = dir.locate(key);
        let lock_path = path.with_extension("lock");
        let locked = path
            .parent()
            .map_or(Ok(()), meta::create_dirs)
            .and_then(|()| {
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&lock_path)
                    .ctx(&lock_path, "open")?;
                cairn_blockdev::flock(&f, libc::LOCK_EX).ctx(&lock_path, "lock")?;
                Ok(f)
            });
        let _lock = match locked {
            Ok(f) => f,
            Err(e) => return self.say(&format!("{e}")),
        };
        // A damaged or missing record is written again from what this
        // process knows (`entries`, changed above).
        let mut merged = match self.read() {
            Some(Record::Sound(m)) => m,
            Some(Record::Lost) => self.entries.clone(),
            None => return,
        };
        for p in remove {
            merged.remove(p);
        }
        for (p, name) in add {
            merged.insert(p, name);
        }
        let (dir, key) = match &self.file {
            Some(f) => f,
            None => return,
        };
        match dir.put(key, &encode_seen(&merged)) {
            Ok(()) => {
                self.entries = merged;
                self.stamp = self.file_stamp();
                self.rewrite = false;
            }
            Err(e) => self.say(&format!("{e}")),
        }
    }

    /// Drop the unchecked and vanished places the record no longer holds:
    /// settled meanwhile by another process (a listing there read the
    /// removal record, or `verify --accept-vanished` forgot them).
    pub(crate) fn drop_settled(&mut self) {
        let entries = &self.entries;
        self.unchecked.retain(|p, _| entries.contains_key(p));
        self.vanished.retain(|p, _| entries.contains_key(p));
    }

    /// Forget `place`, removed by this process without a removal record.
    pub(crate) fn forget(&mut self, place: &Place) {
        if self.kept() {
            self.load();
            self.vanished.remove(place);
            self.change(std::slice::from_ref(place), Vec::new());
        }
    }

    /// Add a snapshot this process made (`place`, of image `name`).
    pub(crate) fn add(&mut self, place: Place, name: String) {
        if self.kept() {
            self.load();
            if self.entries.get(&place) != Some(&name) {
                self.change(&[], vec![(place, name)]);
            }
        }
    }
}

/// The local record: u64 count, then per snapshot str16 folder, u64
/// number, str16 image name; sorted, in the metadata envelope (kind 8).
pub fn encode_seen(entries: &BTreeMap<Place, String>) -> Vec<u8> {
    let mut w = Writer::default();
    w.u64(entries.len() as u64);
    for ((dir, n), name) in entries {
        w.str16(dir);
        w.u64(*n);
        w.str16(name);
    }
    meta::seal(Kind::Seen, SEEN_VERSION, &w.buf)
}

/// Read the local record (`path` for messages).
pub fn decode_seen(path: &Path, data: &[u8]) -> Result<BTreeMap<Place, String>> {
    let (_, body) = meta::open(path, data, Kind::Seen, SEEN_VERSION)?;
    let mut r = Reader::new(body);
    let bad =
        |at: usize| StoreError::corrupt(path, at as u64, "record of seen snapshots is truncated");
    let count = r.u64().map_err(bad)?;
    let mut out = BTreeMap::new();
    for _ in 0..count {
        let dir = r.str16().map_err(bad)?;
        let n = r.u64().map_err(bad)?;
        let name = r.str16().map_err(bad)?;
        out.insert((dir, n), name);
    }
    if r.remaining() > 0 {
        return Err(StoreError::corrupt(
            path,
            r.pos() as u64,
            format!(
                "record of seen snapshots has {} bytes past its end",
                r.remaining()
            ),
        ));
    }
    Ok(out)
}

/// What is said of vanished snapshots, wherever it is said (a listing's
/// warning, verify's problem, gc's refusal): which, seen where, gone how.
/// Names five at most.
pub(crate) fn gone_without_record(snapshots: &[(String, u64)], location: &str) -> String {
    let mut named: Vec<String> = snapshots
        .iter()
        .take(5)
        .map(|(n, s)| format!("{n}@{s}"))
        .collect();
    if snapshots.len() > 5 {
        named.push(format!("and {} more", snapshots.len() - 5));
    }
    let (what, verb) = match snapshots.len() {
        1 => ("snapshot", "was"),
        _ => ("snapshots", "were"),
    };
    format!(
        "{what} {} {verb} seen on this machine and {} gone from {location} with no removal \
         record: damaged, deleted by hand, or the repository was rolled back",
        named.join(", "),
        if snapshots.len() == 1 { "is" } else { "are" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_record_round_trips_and_damage_is_refused() {
        let mut e = BTreeMap::new();
        e.insert(("img".to_string(), 3), "img".to_string());
        e.insert(("0123".to_string(), 10), "secret name".to_string());
        let data = encode_seen(&e);
        assert_eq!(decode_seen(Path::new("s"), &data).unwrap(), e);
        for at in [0, 9, 30, data.len() - 1] {
            let mut bad = data.clone();
            bad[at] ^= 1;
            assert!(decode_seen(Path::new("s"), &bad).is_err(), "flip at {at}");
        }
        assert!(decode_seen(Path::new("s"), &data[..data.len() - 3]).is_err());
        // A byte past the last entry, in a sound envelope.
        let (_, body) = meta::open(Path::new("s"), &data, Kind::Seen, 1).unwrap();
        let mut longer = body.to_vec();
        longer.push(0);
        let longer = meta::seal(Kind::Seen, 1, &longer);
        assert!(decode_seen(Path::new("s"), &longer).is_err());
    }

    #[test]
    fn a_removal_record_round_trips_plain() {
        let r = Removal {
            name: "img".into(),
            snapshot: 7,
            created: 1_700_000_000,
            size: 1 << 30,
            removed: 1_700_000_100,
        };
        let data = r.encode(None).unwrap();
        assert_eq!(Removal::decode(Path::new("r"), &data, None).unwrap(), r);
        let mut bad = data.clone();
        bad[30] ^= 4;
        assert!(Removal::decode(Path::new("r"), &bad, None).is_err());
        let (_, body) = meta::open(Path::new("r"), &data, Kind::Removal, 1).unwrap();
        let mut longer = body.to_vec();
        longer.push(0);
        let longer = meta::seal(Kind::Removal, 1, &longer);
        assert!(Removal::decode(Path::new("r"), &longer, None).is_err());
    }

    #[test]
    fn a_sealed_removal_record_opens_only_with_its_key() {
        let r = Removal {
            name: "secret".into(),
            snapshot: 3,
            created: 5,
            size: 6,
            removed: 7,
        };
        let key = Crypt::generate().unwrap();
        let data = r.encode(Some(&key)).unwrap();
        assert!(!data.windows(6).any(|w| w == b"secret"));
        assert_eq!(
            Removal::decode(Path::new("r"), &data, Some(&key)).unwrap(),
            r
        );
        let other = Crypt::generate().unwrap();
        assert!(Removal::decode(Path::new("r"), &data, Some(&other)).is_err());
        // A plain record in an encrypted repository is planted.
        let plain = r.encode(None).unwrap();
        assert!(Removal::decode(Path::new("r"), &plain, Some(&key)).is_err());
    }

    /// The committed fixtures of version 1 (`tests/fixtures/removal-v1/`):
    /// a removal record of a plain repository and a local record of seen
    /// snapshots. `CAIRN_BLESS=1` writes them anew (only after an intended
    /// format change, which must come with a new version).
    #[test]
    fn version_1_fixtures_read() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/removal-v1");
        let rec = Removal {
            name: "img".into(),
            snapshot: 7,
            created: 1_764_000_000,
            size: 1 << 30,
            removed: 1_764_600_000,
        };
        let mut seen = BTreeMap::new();
        seen.insert(("img".to_string(), 8), "img".to_string());
        seen.insert(("vm-disk".to_string(), 1), "vm-disk".to_string());
        if std::env::var_os("CAIRN_BLESS").is_some() {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("0000000007.rm"), rec.encode(None).unwrap()).unwrap();
            std::fs::write(dir.join("seen"), encode_seen(&seen)).unwrap();
        }
        let path = dir.join("0000000007.rm");
        let data = std::fs::read(&path).unwrap();
        assert_eq!(Removal::decode(&path, &data, None).unwrap(), rec);
        let path = dir.join("seen");
        assert_eq!(
            decode_seen(&path, &std::fs::read(&path).unwrap()).unwrap(),
            seen
        );
    }

    #[test]
    fn missing_vanished_and_removed_are_told_apart() {
        let t = tempfile::tempdir().unwrap();
        let mut s = Seen::at(Some(t.path().join("state")), "seen-x".into());
        let present = |v: &[(&str, u64)]| {
            let mut m: BTreeMap<String, Vec<u64>> = BTreeMap::new();
            for (d, n) in v {
                m.entry(d.to_string()).or_default().push(*n);
            }
            m
        };
        let place = |d: &str, n: u64| (d.to_string(), n);
        // First listing: three seen, nothing missing.
        assert!(s.missing(None, &present(&[])).0.is_empty());
        s.take(
            &[],
            vec![],
            [("a", 1), ("a", 2), ("b", 1)].map(|(d, n)| (place(d, n), d.to_string())),
            "R",
        );
        // Read again from the file by a new process.
        let mut s = Seen::at(Some(t.path().join("state")), "seen-x".into());
        let now = present(&[("a", 1), ("b", 1)]);
        let m = s.missing(None, &now);
        assert_eq!(m.0, vec![(place("a", 2), "a".to_string())]);
        // Scoped to b: nothing missing there.
        assert!(s.missing(Some("b"), &now).0.is_empty());
        s.take(&[], m.0, [], "R");
        assert_eq!(s.vanished(), vec![("a".to_string(), 2)]);
        // Still missing in the next process, until accepted.
        let mut s2 = Seen::at(Some(t.path().join("state")), "seen-x".into());
        assert_eq!(s2.missing(None, &now).0.len(), 1);
        assert_eq!(s.accept_vanished(), vec![("a".to_string(), 2)]);
        let mut s3 = Seen::at(Some(t.path().join("state")), "seen-x".into());
        assert!(s3.missing(None, &now).0.is_empty());
        // A removal record's place is forgotten, not reported.
        let gone = present(&[("a", 1)]);
        let m = s3.missing(None, &gone);
        assert_eq!(m.0, vec![(place("b", 1), "b".to_string())]);
        s3.take(&[place("b", 1)], vec![], [], "R");
        assert!(s3.vanished().is_empty());
        let mut s4 = Seen::at(Some(t.path().join("state")), "seen-x".into());
        assert!(s4.missing(None, &gone).0.is_empty());
        // No state directory: nothing is kept or missed.
        let mut none = Seen::at(None, "seen-x".into());
        assert!(!none.kept());
        none.take(&[], vec![], [(place("a", 1), "a".into())], "R");
        assert!(none.missing(None, &present(&[])).0.is_empty());
    }

    /// A record damaged or deleted while a process runs does not make the
    /// snapshots it found vanished look settled (gc would then free their
    /// chunks), and is written again with them; one another process
    /// rewrote soundly without them does.
    #[test]
    fn a_record_lost_meanwhile_settles_nothing() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("state").join("seen-x");
        let place = |d: &str, n: u64| (d.to_string(), n);
        let listed = |v: &[u64]| {
            let mut m: BTreeMap<String, Vec<u64>> = BTreeMap::new();
            m.insert("a".into(), v.to_vec());
            m
        };
        let names = |v: &[u64]| {
            v.iter()
                .map(|&n| (place("a", n), "a".to_string()))
                .collect::<Vec<_>>()
        };
        let mut first = Seen::at(Some(t.path().join("state")), "seen-x".into());
        first.missing(None, &listed(&[]));
        first.take(&[], vec![], names(&[1, 2, 3]), "R");
        let mut s = Seen::at(Some(t.path().join("state")), "seen-x".into());
        let m = s.missing(None, &listed(&[1, 3]));
        s.take(&[], m.0, names(&[1, 3]), "R");
        assert_eq!(s.vanished(), vec![("a".to_string(), 2)]);
        // A later mtime than the last write, so that the file is read again.
        let touch = |data: Option<&[u8]>| {
            match data {
                Some(d) => std::fs::write(&file, d).unwrap(),
                None => std::fs::remove_file(&file).unwrap(),
            }
            if data.is_some() {
                let f = std::fs::File::options().write(true).open(&file).unwrap();
                f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(60))
                    .unwrap();
            }
        };
        for damage in [Some(&b"not a record"[..]), None] {
            touch(damage);
            let m = s.missing(None, &listed(&[1, 3, 4]));
            assert_eq!(m.0, names(&[2]), "{damage:?}");
            s.drop_settled();
            assert_eq!(s.vanished(), vec![("a".to_string(), 2)], "{damage:?}");
            s.take(&[], m.0, names(&[1, 3, 4]), "R");
            // Written again whole, the vanished snapshot in it.
            let data = std::fs::read(&file).unwrap();
            let back = decode_seen(&file, &data).unwrap();
            assert_eq!(
                back.keys().cloned().collect::<Vec<_>>(),
                [1, 2, 3, 4].map(|n| place("a", n)).to_vec(),
                "{damage:?}"
            );
        }
        // Another process accepts it: settled.
        let mut other = Seen::at(Some(t.path().join("state")), "seen-x".into());
        let m = other.missing(None, &listed(&[1, 3, 4]));
        other.take(&[], m.0, [], "R");
        assert_eq!(other.accept_vanished(), vec![("a".to_string(), 2)]);
        let f = std::fs::File::options().write(true).open(&file).unwrap();
        f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(120))
            .unwrap();
        assert!(s.missing(None, &listed(&[1, 3, 4])).0.is_empty());
        s.drop_settled();
        assert!(s.vanished().is_empty());
    }

    #[test]
    fn one_sentence_names_one_or_many() {
        let one = gone_without_record(&[("a".into(), 2)], "/r");
        assert_eq!(
            one,
            "snapshot a@2 was seen on this machine and is gone from /r with no removal record: \
             damaged, deleted by hand, or the repository was rolled back"
        );
        let many: Vec<(String, u64)> = (1..=7).map(|n| ("b".to_string(), n)).collect();
        let m = gone_without_record(&many, "/r");
        assert!(
            m.starts_with("snapshots b@1, b@2, b@3, b@4, b@5, and 2 more were seen on this machine and are gone"),
            "{m}"
        );
    }
}
