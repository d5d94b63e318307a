//! Test instrumentation: read errors injected into the real local backend.
//!
//! [`Faulty`] is not a mock. It is a [`LocalDir`] — the backend every
//! local repository uses — doing all the work (files, renames, locks,
//! holds, listings), wrapped so that reads of chosen objects, or of
//! chosen byte ranges of them, fail as a disk's EIO does
//! ([`StoreError::Io`] with `EIO`, naming the file). Nothing else is
//! changed: what a read that is let through returns is what the file
//! holds. It exists because a local read cannot be made to fail by other
//! means in the tests (they run as root, so permissions do not stop a
//! read), and an I/O error is not damage: verify, restore and repair must
//! tell the two apart.
//!
//! The faults are shared by a backend and its children (a repository's
//! targets), and are named by the object's path as
//! [`ReadBackend::locate`] gives it, so a test names a pack by the path
//! verify reports.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use crate::backend::{
    Held, Key, Listed, Liveness, LocalDir, ObjectWriter, ReadBackend, WriteBackend,
};
use crate::error::{Result, StoreError};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// One injected fault: reads of `path` that touch `range` fail, but for
/// the first `spared` of them; or (`cut`) the next read of `path` finds
/// it cut to that length.
#[derive(Debug)]
struct Rule {
    path: PathBuf,
    range: Range<u64>,
    spared: u64,
    cut: Option<u64>,
}

/// The faults of a [`Faulty`] backend and its children, changed while it
/// is in use.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    rules: Mutex<Vec<Rule>>,
    injected: AtomicU64,
}

impl Faults {
    /// Every read of the object at `path` fails.
    pub(crate) fn fail(&self, path: &Path) {
        self.fail_range_after(path, 0..u64::MAX, 0);
    }

    /// Reads of the object at `path` touching bytes `range` fail (a read
    /// of other bytes of it succeeds).
    pub(crate) fn fail_range(&self, path: &Path, range: Range<u64>) {
        self.fail_range_after(path, range, 0);
    }

    /// Reads of `path` touching `range` fail, once `spared` of them have
    /// succeeded (a disk that goes bad between two reads).
    pub(crate) fn fail_range_after(&self, path: &Path, range: Range<u64>, spared: u64) {
        self.lock().push(Rule {
            path: path.to_path_buf(),
            range,
            spared,
            cut: None,
        });
    }

    /// The next read of the file at `path` finds it cut to `len` bytes
    /// (as if something cut it after a listing said its length): the file
    /// is truncated then, and the real backend reads what is left. Once.
    pub(crate) fn cut_before_read(&self, path: &Path, len: u64) {
        self.lock().push(Rule {
            path: path.to_path_buf(),
            range: 0..u64::MAX,
            spared: 0,
            cut: Some(len),
        });
    }

    /// No more faults.
    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    /// How many reads failed so far (a test checks that its fault was
    /// met).
    pub(crate) fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Rule>> {
        self.rules.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The error of a read of `bytes` of `path`, if a fault takes it.
    fn check(&self, path: &Path, bytes: Range<u64>) -> Result<()> {
        let mut rules = self.lock();
        let at = rules
            .iter()
            .position(|r| r.path == path && r.range.start < bytes.end && bytes.start < r.range.end);
        if let Some(len) = at.and_then(|i| rules[i].cut) {
            rules.remove(at.unwrap());
            self.injected.fetch_add(1, Ordering::Relaxed);
            let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            f.set_len(len).unwrap();
            return Ok(());
        }
        match at.map(|i| &mut rules[i]) {
            None => Ok(()),
            Some(r) if r.spared > 0 => {
                r.spared -= 1;
                Ok(())
            }
            Some(_) => {
                self.injected.fetch_add(1, Ordering::Relaxed);
                Err(StoreError::Io {
                    path: path.to_path_buf(),
                    what: "read",
                    source: std::io::Error::from_raw_os_error(libc::EIO),
                })
            }
        }
    }
}

/// A [`LocalDir`] whose reads fail where its [`Faults`] say (see the
/// module's doc: instrumentation around the real backend, not a mock).
#[derive(Debug)]
pub(crate) struct Faulty {
    dir: LocalDir,
    faults: Arc<Faults>,
}

impl Faulty {
    /// The backend of directory `root`, and its faults (none yet).
    pub(crate) fn new(root: &Path) -> (Arc<Faulty>, Arc<Faults>) {
        let faults = Arc::new(Faults::default());
        let b = Arc::new(Faulty {
            dir: LocalDir::new(root),
            faults: faults.clone(),
        });
        (b, faults)
    }

    fn check(&self, key: &Key, bytes: Range<u64>) -> Result<()> {
        self.faults.check(&self.dir.locate(key), bytes)
    }
}

impl ReadBackend for Faulty {
    fn locate(&self, key: &Key) -> PathBuf {
        self.dir.locate(key)
    }

    fn read_at(&self, key: &Key, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check(key, offset..offset + buf.len() as u64)?;
        self.dir.read_at(key, offset, buf)
    }

    fn read_prefix(&self, key: &Key, len: u64) -> Result<Vec<u8>> {
        self.check(key, 0..len)?;
        self.dir.read_prefix(key, len)
    }

    fn get(&self, key: &Key) -> Result<Option<Vec<u8>>> {
        self.check(key, 0..u64::MAX)?;
        self.dir.get(key)
    }

    fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
        self.dir.list(prefix)
    }
}

impl WriteBackend for Faulty {
    fn child(&self, folder: &str) -> Arc<dyn WriteBackend> {
        Arc::new(Faulty {
            dir: LocalDir::new(&self.dir.root().join(folder)),
            faults: self.faults.clone(),
        })
    }

    fn put(&self, key: &Key, data: &[u8]) -> Result<()> {
        self.dir.put(key, data)
    }

    fn put_new(&self, key: &Key, data: &[u8]) -> Result<bool> {
        self.dir.put_new(key, data)
    }

    fn delete(&self, keys: &[Key]) -> Result<()> {
        self.dir.delete(keys)
    }

    fn create(&self, key: &Key) -> Result<Box<dyn ObjectWriter>> {
        self.dir.create(key)
    }

    fn hold(&self, key: &Key, data: &[u8]) -> Result<Box<dyn Held>> {
        self.dir.hold(key, data)
    }

    fn take_over(&self, key: &Key, data: &[u8], old: &[u8]) -> Result<Box<dyn Held>> {
        self.dir.take_over(key, data, old)
    }

    fn break_hold(&self, key: &Key, seen: &[u8]) -> Result<bool> {
        self.dir.break_hold(key, seen)
    }

    fn liveness(&self, key: &Key) -> Result<Liveness> {
        self.dir.liveness(key)
    }

    fn inspect(&self, key: &Key) -> Result<Option<(Liveness, Vec<u8>)>> {
        self.dir.inspect(key)
    }

    fn sweep(&self, folder: &str, age: std::time::Duration) -> Result<u64> {
        self.dir.sweep(folder, age)
    }
}

/// A plain repository in a temporary directory, opened through a
/// [`Faulty`] backend, holding image `a`: [`IMAGE_LEN`] bytes of noise in
/// packs of 1 MiB, a record per chunk.
pub(crate) struct FaultyRepo {
    pub dir: tempfile::TempDir,
    pub repo: crate::Repository,
    pub faults: Arc<Faults>,
    pub data: Vec<u8>,
}

/// The length of the image of a [`FaultyRepo`]: some packs' worth.
pub(crate) const IMAGE_LEN: usize = 3 << 20;

impl FaultyRepo {
    /// The repository, with image `a` backed up.
    pub(crate) fn new() -> FaultyRepo {
        let dir = tempfile::tempdir().unwrap();
        let (root, faults) = Faulty::new(&dir.path().join("repo"));
        let opts = crate::InitOptions {
            pack_size: Some(1 << 20),
            ..Default::default()
        };
        let repo = crate::Repository::init_remote("faulty", root, &opts).unwrap();
        let r = FaultyRepo {
            dir,
            repo,
            faults,
            data: cairn_testkit::noise(IMAGE_LEN, 7),
        };
        r.backup("a");
        r
    }

    /// Back up the image again as `name`.
    pub(crate) fn backup(&self, name: &str) {
        self.backup_of(name, &self.data, 0);
    }

    /// Back up `data` as `name`, in groups of `group_size` (0: a record
    /// per chunk).
    pub(crate) fn backup_of(&self, name: &str, data: &[u8], group_size: usize) {
        let session = self.repo.session("test").unwrap();
        let opts = crate::BackupOptions {
            name: name.into(),
            codec: "lz4".parse().unwrap(),
            chunker: "cdc:4K,16K,64K".parse().unwrap(),
            threads: 2,
            group_size,
            source: "test".into(),
            progress: None,
            time: None,
            tags: Vec::new(),
        };
        let mut src = std::io::Cursor::new(data);
        crate::backup(&self.repo, &session, &mut src, &opts).unwrap();
    }

    /// The path of pack number `n` of `index`.
    pub(crate) fn pack_path(&self, index: &crate::ChunkIndex, n: u32) -> PathBuf {
        crate::PackReader::new(&self.repo, index).path(n).unwrap()
    }

    /// Every file under the repository with its bytes: what a command
    /// that changes nothing leaves as it found.
    pub(crate) fn tree(&self) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
        files_under(self.dir.path())
            .into_iter()
            .map(|p| {
                let bytes = std::fs::read(&p).unwrap();
                (p, bytes)
            })
            .collect()
    }

    /// Image `name` restored (through the faults), with the report.
    pub(crate) fn restore(&self, name: &str) -> Result<(Vec<u8>, crate::RestoreReport)> {
        let loaded = self.repo.load_index()?;
        let m = self.repo.read_manifest(name, 1)?;
        let mut out = Vec::new();
        let opts = crate::RestoreOptions {
            threads: 2,
            zero_damaged: false,
            progress: None,
        };
        let report = crate::restore(
            &self.repo,
            &loaded.index,
            &m,
            crate::Destination::Stream(&mut out),
            &opts,
        )?;
        Ok((out, report))
    }

    /// `verify --read-data`.
    pub(crate) fn verify(&self) -> crate::VerifyReport {
        self.verify_subset(crate::DataSubset::All)
    }

    /// `verify --read-data-subset`.
    pub(crate) fn verify_subset(&self, subset: crate::DataSubset) -> crate::VerifyReport {
        let opts = crate::VerifyOptions {
            read_data: true,
            subset,
            threads: 2,
            progress: None,
        };
        crate::verify(&self.repo, &opts).unwrap()
    }
}

/// Every file under `dir`, its subdirectories' too.
pub(crate) fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                todo.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out
}

/// A [`FaultyRepo`] whose first pack's chunks are stored twice (the pack
/// set aside while image `b`, the same bytes, was backed up, so they were
/// stored again; then put back), as two backups that store the same new
/// data at once leave them; and the path and id of a pack holding copies
/// the index uses, of which every chunk has another copy.
pub(crate) fn stored_twice() -> (FaultyRepo, PathBuf, crate::PackId) {
    let r = FaultyRepo::new();
    let first = {
        let loaded = r.repo.load_index().unwrap();
        r.pack_path(&loaded.index, 0)
    };
    let aside = r.dir.path().join("aside");
    std::fs::rename(&first, &aside).unwrap();
    r.backup("b");
    std::fs::rename(&aside, &first).unwrap();
    let loaded = r.repo.load_index().unwrap();
    let index = &loaded.index;
    let (prefix, _) = index
        .other_locations()
        .next()
        .expect("a chunk stored twice");
    let (_, used) = index.locations().find(|(p, _)| *p == prefix).unwrap();
    assert!(
        index
            .locations()
            .filter(|(_, l)| l.pack == used.pack)
            .all(|(p, _)| index.other_copies_of(p).next().is_some()),
        "every chunk of the pack used has another copy"
    );
    let id = index.packs()[used.pack as usize].id;
    let used = r.pack_path(index, used.pack);
    (r, used, id)
}
