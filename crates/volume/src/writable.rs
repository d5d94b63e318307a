//! A repository image as a writable block device: writes land in a
//! durable overlay on local disk over the latest snapshot, a FLUSH makes
//! them durable there, and a commit turns them into the image's next
//! snapshot (copy-on-write: earlier snapshots never change).
//!
//! - **A FLUSH is durable, not a snapshot.** Writes go to the overlay's
//!   data file, at their own offsets, and a FLUSH syncs it and appends a
//!   record of the changed blocks to the overlay's log (see
//!   [`crate::overlay`] and `docs/format/overlay.md`): the cost of a
//!   qcow2 or raw file's flush, not of a backup. What the server acked as
//!   flushed survives a crash or SIGKILL: the next open replays the log.
//! - **Snapshots when the caller commits.** [`WritableVolume::commit`]
//!   makes what was written so far the image's next snapshot, the one
//!   `restore`, `ls` and read-only exports see. `cairn serve` commits on
//!   a schedule, on request and when it stops (its `--help` and
//!   `docs/serve.md` say when); a session that dies before its commit
//!   commits at the next open.
//! - **Writes go on during a commit.** A commit seals the live overlay
//!   generation, starts the next one over it, and makes the sealed one a
//!   snapshot while the live one takes writes; reads look in the live
//!   generation, the sealed one, then the snapshot.
//! - **A commit rewrites each touched chunk once.** A manifest names
//!   whole chunks, so each run of changed blocks is widened to the chunks
//!   it touches (not into holes, which can be cut anywhere), their old
//!   bytes read once and patched from the overlay, and the store cuts them
//!   again with the image's chunker: the unchanged parts dedup against
//!   what is stored. Chunks entirely zeroed become holes without being
//!   read.
//! - **The image's lock for the device's whole life.** One writable open
//!   of an image at a time (a second `serve` of it fails with the holder's
//!   name); backups, gc and other images go on beside it, and gc deletes
//!   nothing the device's session may use.

use crate::overlay::{self, Gen, Header, Mark, RunMap, BS};
use crate::{RepoView, Volume, VolumeOptions};
use cairn_blockdev::{
    check_range, BlockDev, BlockError, BlockSizes, Caps, ErrorKind, Extent, Op, ZeroFlags,
};
use cairn_store::LoadedIndex;
use cairn_store::{EditReport, ImageEditor, Repository, Span, StoreError};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// Commit figures of a writable image.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WritableStats {
    /// Snapshots committed.
    pub commits: u64,
    /// The latest snapshot.
    pub snapshot: u64,
    /// Bytes of chunks stored by the commits (uncompressed).
    pub new_raw: u64,
    /// Bytes the commits rewrote that the repository already had.
    pub dedup: u64,
    /// Bytes written (or zeroed) in the overlay and not yet committed.
    pub uncommitted: u64,
}

/// Where a piece of a read comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Src {
    Live(Mark),
    Sealed(Mark),
    Base,
}

/// What reads and writes see; replaced whole, under the lock, by a
/// commit's seal and its end.
struct State {
    volume: Arc<Volume>,
    live: Arc<Gen>,
    sealed: Option<Arc<Gen>>,
}

/// A repository image open for writing (see the module docs).
pub struct WritableVolume {
    name: String,
    size: u64,
    opts: VolumeOptions,
    dir: PathBuf,
    /// Held by writes for their whole length, so a seal waits for the
    /// writes in flight; reads and flushes take a copy and let go.
    state: RwLock<State>,
    editor: Mutex<ImageEditor>,
    /// One commit at a time.
    committing: Mutex<()>,
    /// Read-modify-writes of partial blocks, one at a time, so two that
    /// change parts of one block both land.
    rmw: Mutex<()>,
    commits: AtomicU64,
    new_raw: AtomicU64,
    dedup: AtomicU64,
    /// The step of a commit after which it stops as if the process died
    /// there (tests of the crash protocol).
    #[cfg(test)]
    crash_after: std::sync::atomic::AtomicU8,
    /// The overlay directory's lock, held while the image is open.
    _lock: std::fs::File,
}

/// The overlay directory's lock file (`flock`): one process writes its
/// generations at a time. The image's lock in the repository does not
/// cover two copies of one repository (a copy keeps the repository's id,
/// which names the default overlay directory) or one `overlay=DIR` given
/// to servers of two images.
fn lock_overlay(dir: &Path) -> cairn_store::Result<std::fs::File> {
    let path = dir.join(LOCK_FILE);
    let io = |source| StoreError::Io {
        path: path.clone(),
        what: "lock the overlay directory",
        source,
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(io)?;
    if !cairn_blockdev::flock(&file, libc::LOCK_EX | libc::LOCK_NB).map_err(io)? {
        return Err(StoreError::Invalid(format!(
            "overlay directory {} is in use by another process (a server of this image from a \
             copy of the repository, or of another image given the same overlay=DIR): stop it, \
             or give this one an overlay directory of its own",
            dir.display()
        )));
    }
    Ok(file)
}

/// The lock file's name in the overlay directory.
const LOCK_FILE: &str = "lock";

/// Bytes of a span the store is given to commit, at most, where the
/// snapshot's chunks allow a cut (a chunk is never cut).
const SPAN_MAX: u64 = 8 << 20;

/// Steps of a commit, for the crash tests.
const SEALED_STEP: u8 = 1;
const SNAPSHOT_WRITTEN_STEP: u8 = 2;
const REBASED_STEP: u8 = 3;

fn block_error(e: BlockError) -> StoreError {
    StoreError::Invalid(e.to_string())
}

fn poisoned(op: Op, offset: u64, len: u64) -> BlockError {
    BlockError::new(
        op,
        offset,
        len,
        ErrorKind::Io(std::io::Error::other(
            "a thread panicked while changing the image",
        )),
    )
}

fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// The `source` of a snapshot committed from generation `gen` of overlay
/// `id`, by which a later open knows the commit happened.
fn commit_source(name: &str, base: u64, id: &[u8; 16], gen: u64) -> String {
    format!(
        "writes to {name}@{base} (cairn serve, overlay {} generation {gen})",
        hex(id)
    )
}

impl WritableVolume {
    /// Open image `name` (its latest snapshot) of `repo` for writing,
    /// taking the image's lock, with its overlay in `dir` (made if
    /// missing). Writes flushed into the overlay by an earlier session
    /// that did not commit them are read back, and a generation it sealed
    /// and did not commit is committed now.
    pub fn open(
        repo: Arc<Repository>,
        name: &str,
        opts: &VolumeOptions,
        dir: &Path,
    ) -> cairn_store::Result<WritableVolume> {
        if name.contains('@') {
            return Err(StoreError::Invalid(format!(
                "{name}: a writable image starts from its latest snapshot; give NAME, not NAME@SNAPSHOT"
            )));
        }
        let editor = ImageEditor::open(repo, name, None)?;
        let (latest, size) = (editor.base().snapshot, editor.base().size);
        // Its name made durable too: a FLUSH acknowledged in a directory
        // whose name a power cut takes back would be lost.
        cairn_store::create_dirs(dir)?;
        let lock = lock_overlay(dir)?;
        let (live, sealed) = Self::recover(&editor, name, size, dir)?;
        let volume = Self::reopen(&editor, opts)?;
        debug_assert_eq!(volume.snapshot(), latest);
        let v = WritableVolume {
            name: name.to_string(),
            size,
            opts: opts.clone(),
            dir: dir.to_path_buf(),
            state: RwLock::new(State {
                volume: Arc::new(volume),
                live: Arc::new(live),
                sealed: sealed.map(Arc::new),
            }),
            editor: Mutex::new(editor),
            committing: Mutex::new(()),
            rmw: Mutex::new(()),
            commits: AtomicU64::new(0),
            new_raw: AtomicU64::new(0),
            dedup: AtomicU64::new(0),
            #[cfg(test)]
            crash_after: std::sync::atomic::AtomicU8::new(0),
            _lock: lock,
        };
        v.finish_commit(&|_, _| {})?;
        Ok(v)
    }

    /// The overlay's generations as the crash protocol of
    /// `docs/format/overlay.md` leaves them: the live one and a sealed
    /// one still to commit.
    fn recover(
        editor: &ImageEditor,
        name: &str,
        size: u64,
        dir: &Path,
    ) -> cairn_store::Result<(Gen, Option<Gen>)> {
        let latest = editor.base().snapshot;
        let gens = overlay::list_gens(dir)?;
        let Some(&newest) = gens.last() else {
            let mut id = [0u8; 16];
            getrandom::fill(&mut id).map_err(|e| StoreError::Io {
                path: dir.to_path_buf(),
                what: "draw an overlay id",
                source: std::io::Error::other(e.to_string()),
            })?;
            let live = Gen::create(
                dir,
                Header {
                    id,
                    gen: 1,
                    name: name.to_string(),
                    size,
                    base: latest,
                    prev: 0,
                },
            )?;
            return Ok((live, None));
        };
        let live = Gen::open(dir, newest)?;
        let h = live.header.clone();
        if h.name != name || h.size != size {
            return Err(StoreError::Invalid(format!(
                "the overlay {} holds writes to image {} of {} bytes, not to {name} of {size} bytes",
                dir.display(),
                h.name,
                h.size
            )));
        }
        let committed =
            |gen: u64, base: u64| editor.base().source == commit_source(name, base, &h.id, gen);
        let mut sealed = None;
        if h.prev != 0 && !live.was_rebased() {
            if gens.contains(&h.prev) {
                let s = Gen::open(dir, h.prev)?;
                if s.base() != h.base || s.header.id != h.id {
                    return Err(StoreError::Corrupt {
                        path: dir.to_path_buf(),
                        offset: 0,
                        reason: format!(
                            "generation {} does not lie over generation {}",
                            h.gen, h.prev
                        ),
                    });
                }
                if latest == h.base {
                    sealed = Some(s);
                } else if committed(h.prev, h.base) {
                    // Committed; the crash came before the rebase.
                    live.rebase(latest)?;
                    s.remove(dir)?;
                } else {
                    return Err(Self::moved_on(name, dir, h.base, latest));
                }
            } else if committed(h.prev, h.base) {
                live.rebase(latest)?;
            } else {
                return Err(StoreError::Corrupt {
                    path: dir.to_path_buf(),
                    offset: 0,
                    reason: format!("generation {} is missing and was not committed", h.prev),
                });
            }
        }
        if sealed.is_none() && live.base() != latest {
            return Err(Self::moved_on(name, dir, live.base(), latest));
        }
        // Files of generations not in use: left by a crash after a rebase
        // before their removal, or inside a seal (a data file or a log
        // still being written aside).
        let keep: Vec<u64> = std::iter::once(newest)
            .chain(sealed.as_ref().map(|s| s.header.gen))
            .collect();
        overlay::remove_others(dir, &keep)?;
        Ok((live, sealed))
    }

    fn moved_on(name: &str, dir: &Path, base: u64, latest: u64) -> StoreError {
        StoreError::Invalid(format!(
            "image {name}: the overlay {} holds flushed writes over snapshot {base}, but the \
             latest snapshot is {latest}, not made from them; move the overlay away to serve \
             snapshot {latest}, or forget the snapshots after {base} to keep the writes",
            dir.display()
        ))
    }

    /// The editor's latest snapshot as a volume.
    fn reopen(editor: &ImageEditor, opts: &VolumeOptions) -> cairn_store::Result<Volume> {
        let index = LoadedIndex {
            index: editor.index().clone(),
            ..LoadedIndex::default()
        };
        let view = RepoView::with_index(editor.repository().clone(), index)?;
        let base = editor.base();
        view.volume(&format!("{}@{}", base.name, base.snapshot), opts)
    }

    /// The image name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The overlay directory.
    pub fn overlay_dir(&self) -> &Path {
        &self.dir
    }

    fn read_state(&self) -> std::sync::RwLockReadGuard<'_, State> {
        // A poisoned lock still holds a whole state: a panic never leaves
        // it half-replaced.
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The snapshot reads fall through to (the latest commit).
    pub fn snapshot(&self) -> u64 {
        self.read_state().volume.snapshot()
    }

    /// Cache figures of the snapshot under the overlay (a commit starts
    /// a new one, its caches empty).
    pub fn volume_stats(&self) -> crate::VolumeStats {
        self.read_state().volume.stats()
    }

    /// Commit figures so far.
    pub fn stats(&self) -> WritableStats {
        let st = self.read_state();
        let blocks = st.live.blocks() + st.sealed.as_ref().map_or(0, |s| s.blocks());
        WritableStats {
            commits: self.commits.load(Ordering::Relaxed),
            snapshot: st.volume.snapshot(),
            new_raw: self.new_raw.load(Ordering::Relaxed),
            dedup: self.dedup.load(Ordering::Relaxed),
            uncommitted: blocks * BS,
        }
    }

    /// Where the pieces of `offset..end` come from, merged where
    /// neighbours come from the same place: at most `limit` of them,
    /// covering a prefix of the range when there are more. (A block
    /// status over an overlay of millions of runs built the list of all
    /// of them, some 200 MB, to answer its first 65,536.)
    fn pieces(
        live: &Gen,
        sealed: Option<&Gen>,
        offset: u64,
        end: u64,
        limit: usize,
    ) -> Vec<(u64, u64, Src)> {
        let lm = live.map();
        let sm = sealed.map(|s| s.map());
        let mut out: Vec<(u64, u64, Src)> = Vec::new();
        let mut at = offset;
        while at < end {
            let b = at / BS;
            let l = lm.at_or_after(b);
            let s = sm.as_ref().and_then(|m| m.at_or_after(b));
            let (to_block, src) = match (l, s) {
                (Some((ls, le, m)), _) if ls <= b => (le, Src::Live(m)),
                // The sealed run, up to where a live one begins.
                (l, Some((ss, se, m))) if ss <= b => {
                    (l.map_or(se, |r| r.0.min(se)), Src::Sealed(m))
                }
                (l, s) => match (l.map(|r| r.0), s.map(|r| r.0)) {
                    (Some(x), Some(y)) => (x.min(y), Src::Base),
                    (Some(x), None) | (None, Some(x)) => (x, Src::Base),
                    (None, None) => (u64::MAX, Src::Base),
                },
            };
            let to = to_block.saturating_mul(BS).min(end);
            match out.last_mut() {
                Some(last) if last.1 == at && last.2 == src => last.1 = to,
                _ => {
                    if out.len() >= limit {
                        break;
                    }
                    out.push((at, to, src));
                }
            }
            at = to;
        }
        out
    }

    /// Read `buf` at `offset` as the image reads now.
    fn read_layered(
        volume: &Volume,
        live: &Gen,
        sealed: Option<&Gen>,
        buf: &mut [u8],
        offset: u64,
    ) -> cairn_blockdev::Result<()> {
        let end = offset + buf.len() as u64;
        for (from, to, src) in Self::pieces(live, sealed, offset, end, usize::MAX) {
            let dst = &mut buf[(from - offset) as usize..(to - offset) as usize];
            match src {
                Src::Live(Mark::Data) => live.read(dst, from)?,
                Src::Sealed(Mark::Data) => match sealed {
                    Some(s) => s.read(dst, from)?,
                    None => dst.fill(0),
                },
                Src::Live(Mark::Zero) | Src::Sealed(Mark::Zero) => dst.fill(0),
                Src::Base => volume.read_at(dst, from)?,
            }
        }
        Ok(())
    }

    /// Change `offset..offset + len`: with `data`, to those bytes, else to
    /// zeroes. Whole blocks go straight to the overlay; a partial block
    /// at either end is read, patched and written whole.
    fn change(
        &self,
        op: Op,
        offset: u64,
        len: u64,
        data: Option<&[u8]>,
    ) -> cairn_blockdev::Result<()> {
        check_range(self.size, op, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let st = self.state.read().map_err(|_| poisoned(op, offset, len))?;
        let end = offset + len;
        // The whole blocks: from the first block start at or after
        // `offset` to the last block end at or before `end` (the image's
        // end counts as one).
        let a = offset.div_ceil(BS) * BS;
        let z = if end == self.size { end } else { end / BS * BS };
        let bytes =
            |from: u64, to: u64| data.map(|d| &d[(from - offset) as usize..(to - offset) as usize]);
        if a >= z {
            // No whole block: one or two partial ones.
            let mut at = offset;
            while at < end {
                let to = ((at / BS + 1) * BS).min(end);
                self.patch(&st, op, at, bytes(at, to), to - at)?;
                at = to;
            }
            return Ok(());
        }
        if offset < a {
            self.patch(&st, op, offset, bytes(offset, a), a - offset)?;
        }
        match bytes(a, z) {
            Some(d) => st.live.write(d, a)?,
            None => st.live.zero(a / BS, (z - a).div_ceil(BS), op)?,
        }
        if z < end {
            self.patch(&st, op, z, bytes(z, end), end - z)?;
        }
        Ok(())
    }

    /// Change `len` bytes at `at`, inside one block, to `data` or zeroes.
    fn patch(
        &self,
        st: &State,
        op: Op,
        at: u64,
        data: Option<&[u8]>,
        len: u64,
    ) -> cairn_blockdev::Result<()> {
        let _one = self.rmw.lock().map_err(|_| poisoned(op, at, len))?;
        let bs = at / BS * BS;
        let blen = BS.min(self.size - bs);
        let mut buf = vec![0u8; blen as usize];
        Self::read_layered(&st.volume, &st.live, st.sealed.as_deref(), &mut buf, bs)
            .map_err(|e| BlockError::new(op, at, len, e.kind))?;
        let dst = &mut buf[(at - bs) as usize..(at - bs + len) as usize];
        match data {
            Some(d) => dst.copy_from_slice(d),
            None => dst.fill(0),
        }
        st.live.write(&buf, bs)
    }

    /// Make every write so far durable in the overlay.
    fn flush_overlay(&self) -> cairn_blockdev::Result<()> {
        let (live, sealed) = {
            let st = self.read_state();
            (st.live.clone(), st.sealed.clone())
        };
        if let Some(s) = sealed {
            s.flush()?;
        }
        live.flush()
    }

    /// Make everything written so far the image's next snapshot (none when
    /// nothing was written since the last). Writes and reads go on
    /// meanwhile; what they change after the commit began goes into the
    /// next one.
    pub fn commit(&self) -> cairn_store::Result<Option<EditReport>> {
        self.commit_with(&|_, _| {})
    }

    /// [`WritableVolume::commit`], telling `progress` the bytes read for
    /// the snapshot so far and in all.
    pub fn commit_with(
        &self,
        progress: &dyn Fn(u64, u64),
    ) -> cairn_store::Result<Option<EditReport>> {
        let _one = self.one_commit()?;
        self.seal_live()?;
        self.finish_commit(progress)
    }

    /// Commit the generation an earlier commit sealed and did not finish,
    /// if there is one (and nothing else).
    pub fn commit_sealed(&self) -> cairn_store::Result<Option<EditReport>> {
        let _one = self.one_commit()?;
        self.finish_commit(&|_, _| {})
    }

    /// Seal the writes so far as the next snapshot's, without committing
    /// them yet ([`WritableVolume::commit`] does): what a write-back
    /// cache in front has drained into the image while it holds new
    /// writes back is then one moment of the image. Nothing changes when
    /// a generation is sealed already or nothing was written.
    pub fn seal(&self) -> cairn_store::Result<()> {
        let _one = self.one_commit()?;
        self.seal_live()
    }

    fn one_commit(&self) -> cairn_store::Result<std::sync::MutexGuard<'_, ()>> {
        self.committing
            .lock()
            .map_err(|_| StoreError::Invalid("a thread panicked while committing".into()))
    }

    /// [`WritableVolume::seal`], the caller holding `committing`.
    fn seal_live(&self) -> cairn_store::Result<()> {
        let sealed_left = self.read_state().sealed.is_some();
        if !sealed_left {
            let (live, base) = {
                let st = self.read_state();
                (st.live.clone(), st.volume.snapshot())
            };
            if live.blocks() == 0 {
                return Ok(());
            }
            let next = Gen::create(
                &self.dir,
                Header {
                    gen: live.header.gen + 1,
                    base,
                    prev: live.header.gen,
                    ..live.header.clone()
                },
            )?;
            {
                // Waits for the writes in flight: none lands in the
                // sealed generation after this.
                let mut st = self.state.write().map_err(|_| {
                    StoreError::Invalid("a thread panicked while changing the image".into())
                })?;
                st.sealed = Some(std::mem::replace(&mut st.live, Arc::new(next)));
            }
            live.flush().map_err(block_error)?;
            self.crash_point(SEALED_STEP)?;
        }
        Ok(())
    }

    /// In tests: stop here as if the process died, when asked to.
    fn crash_point(&self, _step: u8) -> cairn_store::Result<()> {
        #[cfg(test)]
        if self.crash_after.load(Ordering::Relaxed) == _step {
            return Err(StoreError::Invalid(format!("crashed after step {_step}")));
        }
        Ok(())
    }

    /// Commit the sealed generation, if any, and drop it.
    fn finish_commit(
        &self,
        progress: &dyn Fn(u64, u64),
    ) -> cairn_store::Result<Option<EditReport>> {
        let (volume, live, sealed) = {
            let st = self.read_state();
            (st.volume.clone(), st.live.clone(), st.sealed.clone())
        };
        let Some(sealed) = sealed else {
            return Ok(None);
        };
        if let Some(first) = sealed.failure() {
            // Its data may be lost (a failed fdatasync says nothing of
            // what reached the disk, and the page cache may have dropped
            // the pages since): committing it could make zeros or old
            // bytes a snapshot, and dropping it would let FLUSH succeed
            // again. It stays until the server restarts, when the
            // overlay's durable records are committed.
            return Err(StoreError::Invalid(format!(
                "image {}: the writes of overlay generation {} are not committed: a flush of \
                 them failed ({first}), so they may be lost; restart the server to commit what \
                 the overlay holds durably in {}",
                self.name,
                sealed.header.gen,
                self.dir.display()
            )));
        }
        let spans = self.spans(&volume, &sealed);
        let total: u64 = spans.iter().filter(|s| !s.zero).map(|s| s.len).sum();
        let mut done = 0u64;
        progress(0, total);
        let map = sealed.map();
        let mut fill = |span: &Span, buf: &mut [u8]| {
            Self::fill(&volume, &sealed, &map, span, buf).map_err(block_error)?;
            done += span.len;
            progress(done, total);
            Ok(())
        };
        let mut editor = self
            .editor
            .lock()
            .map_err(|_| StoreError::Invalid("a thread panicked while committing".into()))?;
        let report = if editor.base().snapshot != volume.snapshot() {
            // An earlier try made the snapshot and failed after it (the
            // editor's base moves only by committing the sealed
            // generation): do not commit it twice.
            EditReport {
                snapshot: editor.base().snapshot,
                ..EditReport::default()
            }
        } else {
            let source = commit_source(
                &self.name,
                volume.snapshot(),
                &sealed.header.id,
                sealed.header.gen,
            );
            editor.commit(&spans, &mut fill, &source)?
        };
        drop(map);
        self.crash_point(SNAPSHOT_WRITTEN_STEP)?;
        let volume = Self::reopen(&editor, &self.opts)?;
        live.rebase(editor.base().snapshot)?;
        self.crash_point(REBASED_STEP)?;
        {
            let mut st = self.state.write().map_err(|_| {
                StoreError::Invalid("a thread panicked while changing the image".into())
            })?;
            st.volume = Arc::new(volume);
            st.sealed = None;
        }
        sealed.remove(&self.dir)?;
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.new_raw.fetch_add(report.new_raw, Ordering::Relaxed);
        self.dedup.fetch_add(report.dedup, Ordering::Relaxed);
        Ok(Some(report))
    }

    /// The write-back cache the overlay is bound to, if any: while one is,
    /// writes may be in that cache's log and not yet here, so the image
    /// must be opened with that cache in front (see [`crate::CacheBinding`]).
    pub fn cache_binding(&self) -> cairn_store::Result<Option<crate::CacheBinding>> {
        crate::binding::read(&self.dir)
    }

    /// Bind the overlay to the cache `b` (durable before it returns): call
    /// before the cache takes writes.
    pub fn bind_cache(&self, b: &crate::CacheBinding) -> cairn_store::Result<()> {
        crate::binding::write(&self.dir, b)
    }

    /// Remove the binding: call once the cache is written back whole and
    /// closed.
    pub fn unbind_cache(&self) -> cairn_store::Result<()> {
        crate::binding::remove(&self.dir)
    }

    /// Commit what is left, and remove the overlay when nothing is: the
    /// end of a session. Writes after this are not committed. The reports
    /// of the snapshots it made, oldest first: none when nothing was left,
    /// two when an earlier commit sealed writes and did not finish (those,
    /// then the writes made since).
    pub fn close(&self) -> cairn_store::Result<Vec<EditReport>> {
        self.close_with(&|_, _| {})
    }

    /// [`WritableVolume::close`] with the commit's progress (see
    /// [`WritableVolume::commit_with`]).
    pub fn close_with(&self, progress: &dyn Fn(u64, u64)) -> cairn_store::Result<Vec<EditReport>> {
        let mut reports: Vec<EditReport> = self.commit_with(progress)?.into_iter().collect();
        let live_left = {
            let st = self.read_state();
            st.sealed.is_none() && st.live.blocks() > 0
        };
        if live_left {
            // The commit was of a generation an earlier commit sealed and
            // did not finish (a failed upload): the writes made since are
            // the session's too, and go into a snapshot of their own.
            reports.extend(self.commit_with(progress)?);
        }
        let st = self.read_state();
        if st.sealed.is_none() && st.live.blocks() == 0 {
            st.live.remove(&self.dir)?;
            // Only empty: anything else someone put there stays.
            // The lock file goes too (still held: a server that opens
            // the directory from now on finds no generation to take).
            let _ = std::fs::remove_file(self.dir.join(LOCK_FILE));
            let _ = std::fs::remove_dir(&self.dir);
        }
        Ok(reports)
    }

    /// The changed blocks of generation `g` over `volume` as spans the
    /// store can commit: runs of blocks widened to the chunks they touch,
    /// zero where every block is, cut where the snapshot allows so none
    /// is much over [`SPAN_MAX`] (the store holds one span at a time).
    fn spans(&self, volume: &Volume, g: &Gen) -> Vec<Span> {
        let map = g.map();
        // Runs of consecutive changed blocks, in bytes, widened.
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        let mut run: Option<(u64, u64)> = None;
        for (b, e, _) in map.iter() {
            run = match run {
                Some((s, z)) if z == b => Some((s, e)),
                other => {
                    if let Some(r) = other {
                        self.widen(volume, r, &mut ranges);
                    }
                    Some((b, e))
                }
            };
        }
        if let Some(r) = run {
            self.widen(volume, r, &mut ranges);
        }

        let mut spans: Vec<Span> = Vec::new();
        for (a, z) in ranges {
            let mut at = a;
            while at < z {
                let (_, e, hole) = volume.extent_at(at);
                // A hole can be cut anywhere; a chunk not at all.
                let pe = if hole {
                    e.min(z).min(at + SPAN_MAX)
                } else {
                    e.min(z)
                };
                let ps = at;
                // Zeroed entirely (or, in a hole, not changed at all: only
                // possible where two widened runs met).
                let (pb, pz) = (ps / BS, pe.div_ceil(BS));
                let (mut covered, mut data) = (0, false);
                for (s, e, m) in map.within(pb, pz) {
                    covered += e - s;
                    data |= m == Mark::Data;
                }
                let zero = !data && (hole || covered == pz - pb);
                match spans.last_mut() {
                    Some(last)
                        if last.end() == ps
                            && last.zero == zero
                            && (zero || last.len + (pe - ps) <= SPAN_MAX) =>
                    {
                        last.len += pe - ps
                    }
                    _ => spans.push(Span {
                        offset: ps,
                        len: pe - ps,
                        zero,
                    }),
                }
                at = pe;
            }
        }
        spans
    }

    /// The new bytes of `span`: the snapshot's, with the blocks of
    /// generation `g` over them.
    fn fill(
        volume: &Volume,
        g: &Gen,
        map: &RunMap,
        span: &Span,
        buf: &mut [u8],
    ) -> cairn_blockdev::Result<()> {
        let (ps, pe) = (span.offset, span.end());
        volume
            .read_at(buf, ps)
            .map_err(|e| BlockError::new(Op::Flush, ps, pe - ps, e.kind))?;
        for (b, e, mark) in map.within(ps / BS, pe.div_ceil(BS)) {
            let (from, to) = ((b * BS).max(ps), (e * BS).min(pe));
            let dst = &mut buf[(from - ps) as usize..(to - ps) as usize];
            match mark {
                Mark::Data => g.read(dst, from)?,
                Mark::Zero => dst.fill(0),
            }
        }
        Ok(())
    }

    /// Add the byte range of blocks `b0..b1`, widened to whole chunks at
    /// both ends (not into holes), merging with the last range if they meet.
    fn widen(&self, volume: &Volume, (b0, b1): (u64, u64), ranges: &mut Vec<(u64, u64)>) {
        let a = b0 * BS;
        let z = (b1 * BS).min(self.size);
        let (s, _, hole) = volume.extent_at(a);
        let a = if hole { a } else { s };
        let (_, e, hole) = volume.extent_at(z - 1);
        let z = if hole { z } else { e };
        match ranges.last_mut() {
            Some(last) if last.1 >= a => last.1 = last.1.max(z),
            _ => ranges.push((a, z)),
        }
    }
}

impl BlockDev for WritableVolume {
    fn size(&self) -> u64 {
        self.size
    }

    fn caps(&self) -> Caps {
        Caps {
            writable: true,
            flush: true,
            fua: true,
            trim: true,
            zeroes: true,
            fast_zero: true,
            extents: true,
            multi_conn: true,
            rotational: false,
        }
    }

    fn block_sizes(&self) -> BlockSizes {
        BlockSizes {
            minimum: 1,
            preferred: BS as u32,
            maximum: 32 << 20,
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> cairn_blockdev::Result<()> {
        let len = buf.len() as u64;
        check_range(self.size, Op::Read, offset, len)?;
        let (volume, live, sealed) = {
            let st = self.read_state();
            (st.volume.clone(), st.live.clone(), st.sealed.clone())
        };
        Self::read_layered(&volume, &live, sealed.as_deref(), buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> cairn_blockdev::Result<()> {
        self.change(Op::Write, offset, buf.len() as u64, Some(buf))?;
        if fua {
            self.flush_overlay()?;
        }
        Ok(())
    }

    fn flush(&self) -> cairn_blockdev::Result<()> {
        self.flush_overlay()
    }

    fn trim(&self, offset: u64, len: u64, fua: bool) -> cairn_blockdev::Result<()> {
        self.change(Op::Trim, offset, len, None)?;
        if fua {
            self.flush_overlay()?;
        }
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> cairn_blockdev::Result<()> {
        self.change(Op::WriteZeroes, offset, len, None)?;
        if flags.fua {
            self.flush_overlay()?;
        }
        Ok(())
    }

    fn extents(&self, offset: u64, len: u64) -> cairn_blockdev::Result<Vec<Extent>> {
        check_range(self.size, Op::Extents, offset, len)?;
        let (volume, live, sealed) = {
            let st = self.read_state();
            (st.volume.clone(), st.live.clone(), st.sealed.clone())
        };
        let mut out: Vec<Extent> = Vec::new();
        let push = |out: &mut Vec<Extent>, e: Extent| match out.last_mut() {
            Some(last) if last.hole == e.hole && last.zero == e.zero => last.len += e.len,
            _ => out.push(e),
        };
        // As the read-only volume: a bounded answer covering a prefix of
        // the range (callers ask again from where it ends), so a query
        // over a huge image written in many places stays small. Each
        // piece gives at least one extent unless it merges with the one
        // before, so no more pieces than that are looked up.
        let pieces = Self::pieces(
            &live,
            sealed.as_deref(),
            offset,
            offset + len,
            crate::MAX_EXTENTS,
        );
        for (from, to, src) in pieces {
            if out.len() >= crate::MAX_EXTENTS {
                break;
            }
            match src {
                Src::Live(Mark::Data) | Src::Sealed(Mark::Data) => {
                    push(&mut out, Extent::data(to - from))
                }
                Src::Live(Mark::Zero) | Src::Sealed(Mark::Zero) => {
                    push(&mut out, Extent::hole(to - from))
                }
                Src::Base => {
                    let mut n = 0;
                    for e in volume.extents(from, to - from)? {
                        n += e.len;
                        push(&mut out, e);
                    }
                    if n < to - from {
                        // The volume stopped early: so do we.
                        break;
                    }
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_store::{backup, BackupOptions};

    fn repo(dir: &Path, data: &[u8]) -> Arc<Repository> {
        repo_grouped(dir, data, 256 << 10)
    }

    /// A repository of 1 MiB packs with `data` as `img@1`, its chunks
    /// compressed in groups of `group` bytes.
    fn repo_grouped(dir: &Path, data: &[u8], group: usize) -> Arc<Repository> {
        let r = Repository::init(&dir.join("repo"), &[dir.join("t0")], Some(1 << 20)).unwrap();
        let session = r.session("test").unwrap();
        let opts = BackupOptions {
            name: "img".into(),
            codec: "zstd:1".parse().unwrap(),
            chunker: "fixed:16384".parse().unwrap(),
            threads: 1,
            group_size: group,
            source: "test".into(),
            progress: None,
            time: None,
            tags: Vec::new(),
        };
        backup(
            &r,
            &session,
            &mut std::io::Cursor::new(data.to_vec()),
            &opts,
        )
        .unwrap();
        Arc::new(r)
    }

    fn opts() -> VolumeOptions {
        VolumeOptions {
            cache_bytes: 1 << 20,
            compact_bytes: 1 << 20,
            spill_bytes: 0,
            spill_dir: None,
            readahead: 0,
            threads: 1,
        }
    }

    fn whole(dev: &dyn BlockDev) -> Vec<u8> {
        let mut b = vec![0u8; dev.size() as usize];
        dev.read_at(&mut b, 0).unwrap();
        b
    }

    fn snapshot_bytes(repo: &Arc<Repository>, snap: u64) -> Vec<u8> {
        whole(&Volume::open(repo.clone(), &format!("img@{snap}"), &opts()).unwrap())
    }

    /// An image of 300,000 bytes served writable, 8 KiB written at 40,960
    /// and flushed; what it should read (`model`).
    fn one_flushed_write() -> (
        tempfile::TempDir,
        Arc<Repository>,
        PathBuf,
        WritableVolume,
        Vec<u8>,
    ) {
        let t = tempfile::tempdir().unwrap();
        let mut model: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let repo = repo(t.path(), &model);
        let o = t.path().join("overlay");
        let dev = WritableVolume::open(repo.clone(), "img", &opts(), &o).unwrap();
        dev.write_at(&[1; 8192], 40_960, false).unwrap();
        model[40_960..49_152].fill(1);
        dev.flush().unwrap();
        (t, repo, o, dev, model)
    }

    /// A commit stopped after each of its steps, as by a crash: the next
    /// open gives back every flushed write, on top of the right snapshot,
    /// and commits what the dead session sealed exactly once.
    #[test]
    fn a_commit_cut_after_any_step_recovers() {
        for step in [SEALED_STEP, SNAPSHOT_WRITTEN_STEP, REBASED_STEP] {
            let (_t, repo, o, dev, mut model) = one_flushed_write();
            dev.crash_after.store(step, Ordering::Relaxed);
            assert!(dev.commit().is_err());
            // Writes after the seal go to the next generation.
            dev.write_at(&[2; 100], 1000, false).unwrap();
            model[1000..1100].fill(2);
            dev.trim(200_704, 16384, false).unwrap();
            model[200_704..217_088].fill(0);
            dev.flush().unwrap();
            assert!(whole(&dev) == model, "step {step}: before the crash");
            drop(dev);

            let dev = WritableVolume::open(repo.clone(), "img", &opts(), &o).unwrap();
            assert!(whole(&dev) == model, "step {step}: after the crash");
            let snaps = repo.snapshots("img").unwrap();
            assert_eq!(
                snaps,
                vec![1, 2],
                "step {step}: the sealed writes, committed once"
            );
            let mut first = snapshot_bytes(&repo, 1);
            first[40_960..49_152].fill(1);
            assert!(snapshot_bytes(&repo, 2) == first, "step {step}: snapshot 2");
            assert_eq!(overlay::list_gens(&o).unwrap().len(), 1, "step {step}");
            assert_eq!(dev.close().unwrap().len(), 1);
            assert!(snapshot_bytes(&repo, 3) == model, "step {step}: snapshot 3");
            assert!(!o.exists());
        }
    }

    /// A generation whose flush failed is never committed, so FLUSH
    /// keeps failing until the server restarts; the restart commits what
    /// its durable records hold.
    #[test]
    fn writes_whose_flush_failed_are_not_committed_later() {
        let (_t, repo, o, dev, model) = one_flushed_write();
        // The next flush's fdatasync fails (as an EIO from writeback).
        dev.write_at(&[2; 4096], 0, false).unwrap();
        let live = dev.read_state().live.clone();
        live.fail(BlockError::new(
            Op::Flush,
            0,
            0,
            ErrorKind::Io(std::io::Error::other("EIO")),
        ));
        assert!(dev.flush().is_err());
        // The first commit seals the generation and cannot flush it; no
        // later one commits it, and FLUSH still fails.
        for _ in 0..3 {
            let e = dev.commit().unwrap_err().to_string();
            assert!(e.contains("flush") && e.contains("EIO"), "{e}");
            assert!(dev.flush().is_err());
        }
        assert_eq!(repo.snapshots("img").unwrap(), vec![1]);
        drop(dev);
        // Restarted: the flushed write is committed, the other was never
        // durable (its data may or may not be in the file; no record
        // says it is).
        let dev = WritableVolume::open(repo.clone(), "img", &opts(), &o).unwrap();
        assert_eq!(repo.snapshots("img").unwrap(), vec![1, 2]);
        assert!(snapshot_bytes(&repo, 2) == model);
        assert!(whole(&dev) == model);
    }

    /// A close after a commit that sealed and did not finish commits the
    /// sealed writes and the ones made since, each as a snapshot, and
    /// leaves no overlay (it committed only the sealed ones, and left the
    /// rest in the overlay without a word).
    #[test]
    fn a_close_commits_an_unfinished_commit_and_the_writes_after_it() {
        let (_t, repo, o, dev, mut model) = one_flushed_write();
        dev.seal().unwrap();
        dev.write_at(&[3; 5000], 100_000, false).unwrap();
        model[100_000..105_000].fill(3);
        dev.flush().unwrap();
        let reports = dev.close().unwrap();
        assert_eq!(repo.snapshots("img").unwrap(), vec![1, 2, 3]);
        let made: Vec<u64> = reports.iter().map(|r| r.snapshot).collect();
        assert_eq!(made, [2, 3], "each snapshot the close made is reported");
        assert!(snapshot_bytes(&repo, 3) == model);
        assert!(!o.exists(), "a closed image leaves no directory");
    }

    /// The overlay directory is locked while an image is open on it: a
    /// second open (as from a copy of the repository, whose id names the
    /// same default directory) is refused, and the lock goes with the
    /// first.
    #[test]
    fn an_overlay_directory_serves_one_process_at_a_time() {
        let (_t, repo, o, dev, model) = one_flushed_write();
        let e = lock_overlay(&o).unwrap_err().to_string();
        assert!(e.contains("in use by another process"), "{e}");
        drop(dev);
        let dev = WritableVolume::open(repo.clone(), "img", &opts(), &o).unwrap();
        assert!(whole(&dev) == model);
        assert_eq!(dev.close().unwrap().len(), 1);
        assert!(!o.exists(), "a closed image leaves no directory");
    }

    /// A commit writes its new chunks in the group size of the snapshot
    /// it edits (the image's trade of size against random reads), not the
    /// default, and says so in the new manifest.
    #[test]
    fn a_commit_keeps_the_snapshots_group_size() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let repo = repo_grouped(dir, &data, 64 << 10);
        assert_eq!(repo.read_manifest("img", 1).unwrap().group, Some(64 << 10));
        let dev = WritableVolume::open(repo.clone(), "img", &opts(), &dir.join("o")).unwrap();
        dev.write_at(&[7; 40_000], 8192, true).unwrap();
        assert!(dev.commit().unwrap().is_some());
        assert_eq!(repo.read_manifest("img", 2).unwrap().group, Some(64 << 10));
    }

    /// Flushed writes over a snapshot that is no longer the latest, and
    /// not made from them, are refused with a line saying what to do.
    #[test]
    fn an_image_that_moved_on_is_not_written_over() {
        let t = tempfile::tempdir().unwrap();
        let data = vec![5u8; 100_000];
        let repo = repo(t.path(), &data);
        let o = t.path().join("overlay");
        let dev = WritableVolume::open(repo.clone(), "img", &opts(), &o).unwrap();
        dev.write_at(&[1; 4096], 0, true).unwrap();
        drop(dev);
        // A backup of other contents becomes snapshot 2 meanwhile.
        let session = repo.session("test").unwrap();
        let bo = BackupOptions {
            name: "img".into(),
            codec: "none".parse().unwrap(),
            chunker: "fixed:16384".parse().unwrap(),
            threads: 1,
            group_size: 256 << 10,
            source: "other".into(),
            progress: None,
            time: None,
            tags: Vec::new(),
        };
        backup(
            &repo,
            &session,
            &mut std::io::Cursor::new(vec![9u8; 100_000]),
            &bo,
        )
        .unwrap();
        drop(session);
        let err = WritableVolume::open(repo.clone(), "img", &opts(), &o)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("over snapshot 1") && err.contains("latest snapshot is 2"),
            "{err}"
        );
    }
}
