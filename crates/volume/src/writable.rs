//! A repository image as a writable block device: writes collect in RAM
//! over the latest snapshot, and each `flush` commits them as the image's
//! next snapshot (copy-on-write: earlier snapshots never change).
//!
//! Meant to sit behind the write-back cache (`cairn serve --image
//! NAME,cache=CACHE`): the cache makes client writes durable in its log,
//! and its writeback sends a sorted batch here and then flushes, so every
//! writeback batch becomes one snapshot and the RAM held here is bounded
//! by the batch. Used alone, every FLUSH from a client is a snapshot.
//!
//! - **Blocks of 4 KiB in RAM.** A write lands in whole 4 KiB blocks
//!   (partial blocks are read, patched and kept whole); zeroes and trims
//!   mark blocks as zero without holding bytes. Reads take a block from
//!   RAM, or the snapshot underneath.
//! - **A commit rewrites whole chunks.** A manifest names whole chunks, so
//!   each run of changed blocks is widened to the chunks it touches (not
//!   into holes, which can be cut anywhere), their old bytes are read and
//!   patched, and the store cuts them again with the image's chunker: the
//!   unchanged parts dedup against what is stored. Chunks entirely zeroed
//!   become holes without being read.
//! - **The image's lock for the device's whole life.** One writable open
//!   of an image at a time (a second `serve` of it fails with the holder's
//!   name); backups, gc and other images go on beside it, and gc deletes
//!   nothing the device's session may use.
//! - **After a commit the snapshot underneath is reopened** from the
//!   editor's index (no reload from disk), and the RAM blocks dropped,
//!   in one step under the lock readers take, so a read sees either the
//!   blocks or the new snapshot holding them.

use crate::{RepoView, Volume, VolumeOptions};
use cairn_blockdev::{
    check_range, BlockDev, BlockError, BlockSizes, Caps, ErrorKind, Extent, Op, ZeroFlags,
};
use cairn_store::repo::LoadedIndex;
use cairn_store::{ImageEditor, Repository, Span, StoreError};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// Size of the blocks held in RAM between commits.
const BS: u64 = 4096;

/// A changed block.
enum Block {
    /// New contents (`BS` bytes; past the image's end, ignored).
    Data(Box<[u8]>),
    /// Zeroes.
    Zero,
}

struct State {
    volume: Arc<Volume>,
    blocks: BTreeMap<u64, Block>,
}

impl State {
    /// The piece of `at..end` that starts at `at` and is either within
    /// one changed block (returned) or has no changed block (`None`):
    /// where it ends.
    fn piece(&self, at: u64, end: u64) -> (u64, Option<&Block>) {
        let b = at / BS;
        match self.blocks.get(&b) {
            Some(block) => (((b + 1) * BS).min(end), Some(block)),
            None => {
                let next = self.blocks.range(b + 1..).next();
                (next.map_or(end, |(&n, _)| (n * BS).min(end)), None)
            }
        }
    }
}

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
}

/// A repository image open for writing (see the module docs).
pub struct WritableVolume {
    name: String,
    size: u64,
    opts: VolumeOptions,
    state: RwLock<State>,
    editor: Mutex<ImageEditor>,
    commits: AtomicU64,
    new_raw: AtomicU64,
    dedup: AtomicU64,
}

fn store_error(op: Op, offset: u64, len: u64, e: &StoreError) -> BlockError {
    let kind = match e {
        StoreError::Io { source, .. } if source.kind() == std::io::ErrorKind::StorageFull => {
            ErrorKind::NoSpace
        }
        _ => ErrorKind::Io(std::io::Error::other(e.to_string())),
    };
    BlockError::new(op, offset, len, kind)
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

impl WritableVolume {
    /// Open image `name` (its latest snapshot) of `repo` for writing,
    /// taking the image's lock.
    pub fn open(
        repo: Arc<Repository>,
        name: &str,
        opts: &VolumeOptions,
    ) -> cairn_store::Result<WritableVolume> {
        if name.contains('@') {
            return Err(StoreError::Invalid(format!(
                "{name}: a writable image starts from its latest snapshot; give NAME, not NAME@SNAPSHOT"
            )));
        }
        let editor = ImageEditor::open(repo, name, None)?;
        let volume = Self::reopen(&editor, opts)?;
        Ok(WritableVolume {
            name: name.to_string(),
            size: volume.size(),
            opts: *opts,
            state: RwLock::new(State {
                volume: Arc::new(volume),
                blocks: BTreeMap::new(),
            }),
            editor: Mutex::new(editor),
            commits: AtomicU64::new(0),
            new_raw: AtomicU64::new(0),
            dedup: AtomicU64::new(0),
        })
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

    /// The snapshot reads fall through to (the latest commit).
    pub fn snapshot(&self) -> u64 {
        // A poisoned lock still holds a whole state: a panic never leaves
        // `volume` half-replaced.
        self.state
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .volume
            .snapshot()
    }

    /// Commit figures so far.
    pub fn stats(&self) -> WritableStats {
        WritableStats {
            commits: self.commits.load(Ordering::Relaxed),
            snapshot: self.snapshot(),
            new_raw: self.new_raw.load(Ordering::Relaxed),
            dedup: self.dedup.load(Ordering::Relaxed),
        }
    }

    /// Bytes of block `b` that lie inside the image.
    fn block_len(&self, b: u64) -> usize {
        (self.size - b * BS).min(BS) as usize
    }

    /// Block `b` as it reads now.
    fn current_block(&self, st: &State, b: u64, op: Op) -> cairn_blockdev::Result<Box<[u8]>> {
        let mut buf = vec![0u8; BS as usize].into_boxed_slice();
        match st.blocks.get(&b) {
            Some(Block::Data(d)) => buf.copy_from_slice(d),
            Some(Block::Zero) => {}
            None => {
                let n = self.block_len(b);
                st.volume
                    .read_at(&mut buf[..n], b * BS)
                    .map_err(|e| BlockError::new(op, b * BS, n as u64, e.kind))?;
            }
        }
        Ok(buf)
    }

    /// Change `offset..offset + len`: with `data`, to those bytes, else to
    /// zeroes.
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
        let mut st = self.state.write().map_err(|_| poisoned(op, offset, len))?;
        let end = offset + len;
        for b in offset / BS..end.div_ceil(BS) {
            let (bs, be) = (b * BS, (b * BS + self.block_len(b) as u64));
            let (from, to) = (offset.max(bs), end.min(be));
            let whole = from == bs && to == be;
            let block = match data {
                None if whole => Block::Zero,
                Some(d) if whole => {
                    let mut buf = vec![0u8; BS as usize].into_boxed_slice();
                    let src = &d[(from - offset) as usize..(to - offset) as usize];
                    buf[..src.len()].copy_from_slice(src);
                    Block::Data(buf)
                }
                _ => {
                    let mut buf = self.current_block(&st, b, op)?;
                    let dst = &mut buf[(from - bs) as usize..(to - bs) as usize];
                    match data {
                        Some(d) => dst
                            .copy_from_slice(&d[(from - offset) as usize..(to - offset) as usize]),
                        None => dst.fill(0),
                    }
                    Block::Data(buf)
                }
            };
            st.blocks.insert(b, block);
        }
        Ok(())
    }

    /// The changed blocks as spans the store can commit: runs of blocks
    /// widened to the chunks they touch, with their full new bytes.
    fn spans(&self, st: &State) -> cairn_blockdev::Result<Vec<Span>> {
        // Runs of consecutive changed blocks, in bytes, widened.
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        let mut run: Option<(u64, u64)> = None;
        for &b in st.blocks.keys() {
            run = match run {
                Some((s, e)) if e == b => Some((s, b + 1)),
                other => {
                    if let Some(r) = other {
                        self.widen(st, r, &mut ranges);
                    }
                    Some((b, b + 1))
                }
            };
        }
        if let Some(r) = run {
            self.widen(st, r, &mut ranges);
        }

        let mut spans: Vec<Span> = Vec::new();
        for (a, z) in ranges {
            let mut at = a;
            while at < z {
                let (_, e, hole) = st.volume.extent_at(at);
                let (ps, pe) = (at, e.min(z));
                // Zeroed entirely (or, in a hole, not changed at all: only
                // possible where two widened runs met).
                let zeroed = (ps / BS..pe.div_ceil(BS)).all(|b| match st.blocks.get(&b) {
                    Some(Block::Zero) => true,
                    Some(Block::Data(_)) => false,
                    None => hole,
                });
                if zeroed {
                    match spans.last_mut() {
                        Some(last) if last.end() == ps && last.data.is_none() => {
                            last.len += pe - ps
                        }
                        _ => spans.push(Span {
                            offset: ps,
                            len: pe - ps,
                            data: None,
                        }),
                    }
                } else {
                    let mut buf = vec![0u8; (pe - ps) as usize];
                    if !hole {
                        st.volume
                            .read_at(&mut buf, ps)
                            .map_err(|e| BlockError::new(Op::Flush, ps, pe - ps, e.kind))?;
                    }
                    for (&b, block) in st.blocks.range(ps / BS..pe.div_ceil(BS)) {
                        let (from, to) = ((b * BS).max(ps), ((b + 1) * BS).min(pe));
                        let dst = &mut buf[(from - ps) as usize..(to - ps) as usize];
                        match block {
                            Block::Data(d) => dst.copy_from_slice(
                                &d[(from - b * BS) as usize..(to - b * BS) as usize],
                            ),
                            Block::Zero => dst.fill(0),
                        }
                    }
                    match spans.last_mut() {
                        Some(Span {
                            offset,
                            len,
                            data: Some(d),
                        }) if *offset + *len == ps => {
                            d.extend_from_slice(&buf);
                            *len += pe - ps;
                        }
                        _ => spans.push(Span {
                            offset: ps,
                            len: pe - ps,
                            data: Some(buf),
                        }),
                    }
                }
                at = pe;
            }
        }
        Ok(spans)
    }

    /// Add the byte range of blocks `b0..b1`, widened to whole chunks at
    /// both ends (not into holes), merging with the last range if they meet.
    fn widen(&self, st: &State, (b0, b1): (u64, u64), ranges: &mut Vec<(u64, u64)>) {
        let a = b0 * BS;
        let z = (b1 * BS).min(self.size);
        let (s, _, hole) = st.volume.extent_at(a);
        let a = if hole { a } else { s };
        let (_, e, hole) = st.volume.extent_at(z - 1);
        let z = if hole { z } else { e };
        match ranges.last_mut() {
            Some(last) if last.1 >= a => last.1 = last.1.max(z),
            _ => ranges.push((a, z)),
        }
    }

    /// Commit the changed blocks as a new snapshot.
    fn commit(&self) -> cairn_blockdev::Result<()> {
        let mut st = self.state.write().map_err(|_| poisoned(Op::Flush, 0, 0))?;
        if st.blocks.is_empty() {
            return Ok(());
        }
        let spans = self.spans(&st)?;
        let mut editor = self.editor.lock().map_err(|_| poisoned(Op::Flush, 0, 0))?;
        let source = format!(
            "writes to {}@{} (cairn serve)",
            self.name,
            editor.base().snapshot
        );
        let report = editor
            .commit(&spans, &source)
            .map_err(|e| store_error(Op::Flush, 0, 0, &e))?;
        let volume =
            Self::reopen(&editor, &self.opts).map_err(|e| store_error(Op::Flush, 0, 0, &e))?;
        st.volume = Arc::new(volume);
        st.blocks.clear();
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.new_raw.fetch_add(report.new_raw, Ordering::Relaxed);
        self.dedup.fetch_add(report.dedup, Ordering::Relaxed);
        Ok(())
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
        let st = self
            .state
            .read()
            .map_err(|_| poisoned(Op::Read, offset, len))?;
        let end = offset + len;
        let mut at = offset;
        while at < end {
            let (to, block) = st.piece(at, end);
            let dst = &mut buf[(at - offset) as usize..(to - offset) as usize];
            match block {
                Some(Block::Data(d)) => {
                    let b = at / BS * BS;
                    dst.copy_from_slice(&d[(at - b) as usize..(to - b) as usize])
                }
                Some(Block::Zero) => dst.fill(0),
                None => st.volume.read_at(dst, at)?,
            }
            at = to;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> cairn_blockdev::Result<()> {
        self.change(Op::Write, offset, buf.len() as u64, Some(buf))?;
        if fua {
            self.commit()?;
        }
        Ok(())
    }

    fn flush(&self) -> cairn_blockdev::Result<()> {
        self.commit()
    }

    fn trim(&self, offset: u64, len: u64, fua: bool) -> cairn_blockdev::Result<()> {
        self.change(Op::Trim, offset, len, None)?;
        if fua {
            self.commit()?;
        }
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> cairn_blockdev::Result<()> {
        self.change(Op::WriteZeroes, offset, len, None)?;
        if flags.fua {
            self.commit()?;
        }
        Ok(())
    }

    fn extents(&self, offset: u64, len: u64) -> cairn_blockdev::Result<Vec<Extent>> {
        check_range(self.size, Op::Extents, offset, len)?;
        let st = self
            .state
            .read()
            .map_err(|_| poisoned(Op::Extents, offset, len))?;
        let end = offset + len;
        let mut out: Vec<Extent> = Vec::new();
        let push = |out: &mut Vec<Extent>, e: Extent| match out.last_mut() {
            Some(last) if last.hole == e.hole && last.zero == e.zero => last.len += e.len,
            _ => out.push(e),
        };
        let mut at = offset;
        // As the read-only volume: a bounded answer covering a prefix of
        // the range (callers ask again from where it ends), so a query
        // over a huge image written in many places stays small.
        while at < end && out.len() < crate::MAX_EXTENTS {
            let (to, block) = st.piece(at, end);
            match block {
                Some(Block::Data(_)) => push(&mut out, Extent::data(to - at)),
                Some(Block::Zero) => push(&mut out, Extent::hole(to - at)),
                None => {
                    let mut n = 0;
                    for e in st.volume.extents(at, to - at)? {
                        n += e.len;
                        push(&mut out, e);
                    }
                    if n < to - at {
                        // The volume stopped early: so do we.
                        break;
                    }
                }
            }
            at = to;
        }
        Ok(out)
    }
}
