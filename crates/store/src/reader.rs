//! The one way records come out of packs. Restore, the served volumes,
//! verify and gc all read through a [`PackReader`]: it knows which
//! backend holds each pack an index names and under which key, checks a
//! pack's header the first time it is read, and reads records or whole
//! packs, a short read being damage named by pack and offset. Decoding is
//! [`crate::pack::RecordDecoder`]'s; [`PackReader::load_group`] gives a
//! decoded record whose chunks are checked against their ids when first
//! used ([`Group`]), what a served image caches.
//!
//! It reads through [`ReadBackend`]s (one per target: striping is a
//! backend per disk), never by path, so an object store comes in here.
//! The one other read of a pack, of a pack no index names yet (salvage),
//! is [`read_unindexed`], beside it.

use crate::backend::{Key, ReadBackend};
use crate::crypt::Crypt;
use crate::error::{Result, StoreError};
use crate::id::{ChunkId, PackId, RepoId, PREFIX_LEN};
use crate::index::{ChunkIndex, Location};
use crate::pack::{check_pack_header, header_damaged, RecordDecoder, PACK_HEADER_LEN};
use crate::repo::Repository;
use cairn_codec::lz4_ffi::{self, Compressor};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

/// The whole of a pack no index names yet (salvage, and gc keeping a pack
/// off a trash list), or `None` if it is gone: the one read of a pack
/// that is not through a [`PackReader`], since there is no index entry to
/// read it by.
pub(crate) fn read_unindexed(target: &dyn ReadBackend, id: PackId) -> Result<Option<Vec<u8>>> {
    target.get(&Key::pack(id))
}

/// Records found damaged whose chunks were read from other copies of
/// theirs (see `ChunkIndex::other_copies`), shared by the readers of one
/// restore, diff, copy or served image: each is said once, and a reader
/// can send a record's chunks straight to their copies. Looking costs one atomic
/// load while nothing is damaged.
#[derive(Debug, Default)]
pub struct DamagedRecords {
    records: Mutex<std::collections::HashSet<(u32, u32)>>,
    any: AtomicBool,
}

impl DamagedRecords {
    /// Note the record at `loc`; whether it is new (to be said).
    pub fn note(&self, loc: Location) -> bool {
        self.any.store(true, Ordering::Relaxed);
        self.records
            .lock()
            .is_ok_and(|mut r| r.insert((loc.pack, loc.offset)))
    }

    /// The chunk of prefix `prefix`, whose record at `first` is damaged,
    /// from the first of its other copies in `index` that `read` reads
    /// (`None` when none does); `first` is then noted, and, if it was not
    /// noted before, `say` is told the copy read from.
    pub fn from_other_copy<T>(
        &self,
        index: &ChunkIndex,
        prefix: [u8; PREFIX_LEN],
        first: Location,
        mut read: impl FnMut(Location) -> Option<T>,
        say: impl FnOnce(Location),
    ) -> Option<T> {
        let (other, found) = index
            .other_copies_of(prefix)
            .find_map(|other| read(other).map(|found| (other, found)))?;
        if self.note(first) {
            say(other);
        }
        Some(found)
    }

    /// Whether the record at `loc` was noted.
    pub fn contains(&self, loc: Location) -> bool {
        self.any.load(Ordering::Relaxed)
            && self
                .records
                .lock()
                .is_ok_and(|r| r.contains(&(loc.pack, loc.offset)))
    }
}

/// Where one pack is.
#[derive(Debug)]
struct Place {
    backend: usize,
    key: Key,
    /// Its header was read and is this repository's.
    checked: AtomicBool,
}

/// Reads records from the packs an index names.
#[derive(Debug)]
pub struct PackReader {
    repo: RepoId,
    /// Packs hold sealed records (an encrypted repository).
    sealed: bool,
    /// The repository's keys, for the decoders of what is read.
    crypt: Option<Arc<crate::crypt::Crypt>>,
    backends: Vec<Arc<dyn ReadBackend>>,
    /// Each pack number's place, or why it has none.
    places: Vec<std::result::Result<Place, String>>,
}

impl PackReader {
    /// A reader of the packs `index` names in `repo`.
    pub fn new(repo: &Repository, index: &ChunkIndex) -> PackReader {
        let backends: Vec<Arc<dyn ReadBackend>> = (0..repo.target_count() as u16)
            .filter_map(|t| repo.target(t).ok())
            .map(|t| t.clone() as Arc<dyn ReadBackend>)
            .collect();
        let places = index
            .packs()
            .iter()
            .map(|p| {
                let backend = usize::from(p.target);
                if backend >= backends.len() {
                    return Err(format!(
                        "pack {} names target {}, the repository has {}",
                        p.id,
                        p.target,
                        backends.len()
                    ));
                }
                Ok(Place {
                    backend,
                    key: Key::pack(p.id),
                    checked: AtomicBool::new(false),
                })
            })
            .collect();
        PackReader {
            repo: repo.id(),
            sealed: repo.sealed(),
            crypt: repo.crypt().cloned(),
            backends,
            places,
        }
    }

    fn place(&self, pack: u32) -> Result<(&Place, &dyn ReadBackend)> {
        match self.places.get(pack as usize) {
            Some(Ok(p)) => Ok((p, &*self.backends[p.backend])),
            Some(Err(why)) => Err(StoreError::Invalid(why.clone())),
            None => Err(StoreError::Invalid(format!(
                "index names unknown pack number {pack}"
            ))),
        }
    }

    /// A decoder of the records read (with the repository's keys).
    pub(crate) fn record_decoder(&self) -> RecordDecoder {
        RecordDecoder::new(self.crypt.clone())
    }

    /// The repository's keys, if it is encrypted.
    pub(crate) fn crypt(&self) -> Option<&Crypt> {
        self.crypt.as_deref()
    }

    /// Buffers for [`PackReader::load_group`], to keep and reuse; the
    /// groups it loads take their byte buffers from `buffers`, and give
    /// them back when dropped, if it is given.
    pub fn scratch(&self, buffers: Option<Arc<GroupBuffers>>) -> GroupScratch {
        GroupScratch {
            rec: Vec::new(),
            dec: self.record_decoder(),
            buffers,
        }
    }

    /// Read, check (CRC, lengths, authentication) and decode the record at
    /// `loc`.
    pub fn load_group(&self, loc: Location, s: &mut GroupScratch) -> Result<Group> {
        let path = self.read_record(loc, &mut s.rec)?;
        let pool = s.buffers.as_deref();
        let (rec, data) =
            s.dec
                .decode_with(&path, u64::from(loc.offset), &s.rec, |len| match pool {
                    Some(p) => p.take(len),
                    None => Vec::with_capacity(len),
                })?;
        let chunks = rec
            .chunks()
            .map(|(id, offset, len)| GroupChunk {
                offset,
                len,
                id,
                state: AtomicU8::new(UNCHECKED),
            })
            .collect();
        Ok(Group {
            data,
            chunks,
            crypt: self.crypt.clone(),
            recycle: s.buffers.clone(),
        })
    }

    /// How many readers keep the backends busy per core (see
    /// [`ReadBackend::reads_per_core`]).
    pub fn reads_per_core(&self) -> usize {
        self.backends
            .iter()
            .map(|b| b.reads_per_core())
            .max()
            .unwrap_or(1)
    }

    /// Where pack number `pack` is (a path, for messages).
    pub fn path(&self, pack: u32) -> Result<PathBuf> {
        let (p, b) = self.place(pack)?;
        Ok(b.locate(&p.key))
    }

    /// Read the record at `loc` into `buf` (replacing its contents);
    /// returns its pack's path, for the decoder's errors.
    pub fn read_record(&self, loc: Location, buf: &mut Vec<u8>) -> Result<PathBuf> {
        self.read_span(loc.pack, u64::from(loc.offset), loc.len as usize, buf)
    }

    /// Read `len` bytes of pack `pack` from `offset` into `buf` (replacing
    /// its contents): one record, or several neighbours at once (one
    /// request to a remote store instead of one each); returns the pack's
    /// path, for the decoder's errors.
    pub fn read_span(
        &self,
        pack: u32,
        offset: u64,
        len: usize,
        buf: &mut Vec<u8>,
    ) -> Result<PathBuf> {
        let (p, b) = self.place(pack)?;
        if !p.checked.load(Ordering::Acquire) {
            let mut header = [0u8; PACK_HEADER_LEN];
            b.read_at(&p.key, 0, &mut header)?;
            let path = b.locate(&p.key);
            if let Err(e) = check_pack_header(&path, &header, self.repo, self.sealed) {
                // A damaged header holds no data: the records go on being
                // read, each checked on its own. Said once per pack.
                if !header_damaged(&header) {
                    return Err(e);
                }
                tracing::warn!(
                    "{e}: its records are read and checked on their own (`cairn repair` \
                     rewrites the pack)"
                );
            }
            p.checked.store(true, Ordering::Release);
        }
        // Every byte is overwritten by the read: only a grown tail is
        // zeroed (a reused buffer is not cleared first).
        buf.resize(len, 0);
        b.read_at(&p.key, offset, buf)?;
        Ok(b.locate(&p.key))
    }

    /// The whole of pack `pack`, `len` bytes (its sealed length), for
    /// verify and gc, which use every record of it once. The header is not
    /// checked here: verify checks it and reports a bad one as damage of
    /// every chunk in the pack.
    pub fn read_pack(&self, pack: u32, len: u64) -> Result<Vec<u8>> {
        let (p, b) = self.place(pack)?;
        b.read_prefix(&p.key, len)
    }
}

/// A record read buffer and decoder contexts, reused between
/// [`PackReader::load_group`]s.
pub struct GroupScratch {
    rec: Vec<u8>,
    dec: RecordDecoder,
    buffers: Option<Arc<GroupBuffers>>,
}

/// Byte buffers of dropped [`Group`]s, for the next groups decoded.
///
/// A served image whose working set overflows its cache decodes a group
/// and drops another, a few MiB each, thousands of times a second, on many
/// threads. Left to glibc, whose arenas keep what one thread frees for
/// that thread, the process held twice the cache (520 MiB for 255 MiB of
/// groups, docs/benchmarks.md, "Memory of a served image"); giving every
/// such buffer back to the kernel instead faults a fresh one in per decode
/// (a third of the throughput). Here a dropped group's buffer goes to the
/// next decode of its size class. Measured on a served os2.img whose
/// decoded cache churns (groups of a few bytes to 2.1 MB): a decode found a
/// buffer for 43 % of its groups when any at most a sixteenth bigger would
/// do, 75 % with classes of 64 KiB and 8 kept, 86 % with 16 (32 MiB).
pub struct GroupBuffers {
    /// Oldest first.
    free: Mutex<Vec<Vec<u8>>>,
    max_bytes: usize,
}

/// Group buffers of this size or more are sized in multiples of
/// [`GROUP_BUFFER_STEP`] and kept for reuse; smaller groups (the last of
/// an image, `--group 0`) get buffers of their own size.
pub const GROUP_BUFFER_MIN: usize = 1 << 20;
/// The size class step of pooled group buffers.
pub const GROUP_BUFFER_STEP: usize = 64 << 10;

impl GroupBuffers {
    /// A pool of free buffers of at most `max_bytes` in all (memory
    /// besides what a cache holds).
    pub fn new(max_bytes: usize) -> Arc<GroupBuffers> {
        Arc::new(GroupBuffers {
            free: Mutex::new(Vec::new()),
            max_bytes,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A buffer for `len` bytes: for a group of [`GROUP_BUFFER_MIN`] or
    /// more, a free one of its size class, or a new one of that size;
    /// classes are multiples of [`GROUP_BUFFER_STEP`], so groups of about
    /// one size share buffers and a group is charged at most a step more
    /// than it holds (a cache counts a group by its buffer). A smaller
    /// group gets a buffer of exactly its size.
    fn take(&self, len: usize) -> Vec<u8> {
        if len < GROUP_BUFFER_MIN {
            return Vec::with_capacity(len);
        }
        let size = len.next_multiple_of(GROUP_BUFFER_STEP);
        let mut free = self.lock();
        match free.iter().position(|v| v.capacity() == size) {
            Some(i) => free.remove(i),
            None => Vec::with_capacity(size),
        }
    }

    /// Keep `buf` for a later group if it is of a class; past `max_bytes`
    /// kept, those kept longest are freed (a size nobody asks for again
    /// leaves), after the lock is let go.
    fn give(&self, mut buf: Vec<u8>) {
        let cap = buf.capacity();
        if cap < GROUP_BUFFER_MIN || cap % GROUP_BUFFER_STEP != 0 || cap > self.max_bytes {
            return;
        }
        buf.clear();
        let mut freed = Vec::new();
        {
            let mut free = self.lock();
            let mut held: usize = free.iter().map(Vec::capacity).sum();
            while held + cap > self.max_bytes && !free.is_empty() {
                let old = free.remove(0);
                held -= old.capacity();
                freed.push(old);
            }
            free.push(buf);
        }
        drop(freed);
    }

    /// Buffers kept now, and their bytes.
    pub fn held(&self) -> (usize, usize) {
        let free = self.lock();
        (free.len(), free.iter().map(Vec::capacity).sum())
    }
}

const UNCHECKED: u8 = 0;
const GOOD: u8 = 1;
const BAD: u8 = 2;

/// One chunk of a decoded group.
#[derive(Debug)]
struct GroupChunk {
    offset: u32,
    len: u32,
    id: ChunkId,
    /// Whether its id has been checked, and the answer.
    state: AtomicU8,
}

impl GroupChunk {
    /// The same chunk with what is known of its check now.
    fn copy(&self) -> GroupChunk {
        GroupChunk {
            state: AtomicU8::new(self.state.load(Ordering::Acquire)),
            ..*self
        }
    }
}

/// A decoded record: the group's bytes and its chunk table. Shared by the
/// readers of a served image, so each chunk is checked against its id
/// once, the first time it is asked for.
pub struct Group {
    data: Vec<u8>,
    chunks: Vec<GroupChunk>,
    /// The repository's keys (chunk ids are keyed), if it is encrypted.
    crypt: Option<Arc<Crypt>>,
    /// Where `data` goes when the group is dropped.
    recycle: Option<Arc<GroupBuffers>>,
}

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(pool) = self.recycle.take() {
            pool.give(std::mem::take(&mut self.data));
        }
    }
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("bytes", &self.data.len())
            .field("chunks", &self.chunks.len())
            .finish()
    }
}

impl Group {
    /// Bytes this group holds in memory (what a cache counts).
    pub fn bytes(&self) -> usize {
        self.data.capacity()
            + self.chunks.capacity() * std::mem::size_of::<GroupChunk>()
            + std::mem::size_of::<Group>()
    }

    /// The chunk at group offset `slice`, `len` bytes long, whose id
    /// starts with `prefix`; its id is checked the first time it is asked
    /// for. `Err` says what is wrong.
    pub fn chunk(
        &self,
        slice: u32,
        len: u32,
        prefix: &[u8; PREFIX_LEN],
    ) -> std::result::Result<&[u8], String> {
        let c = &self.chunks[find(&self.chunks, slice, len, prefix)?];
        let data = self
            .data
            .get(slice as usize..slice as usize + len as usize)
            .ok_or_else(|| format!("chunk runs past the {}-byte group", self.data.len()))?;
        check(c, self.crypt.as_deref(), data)?;
        Ok(data)
    }

    /// The group kept smaller: each chunk an independent LZ4 block (or
    /// its bytes as they are, where LZ4 does not shrink them), with what
    /// is known of its check. `None` if the chunk table runs past the
    /// bytes (such a group's reads fail anyway).
    pub fn compact(&self, lz4: &mut Compressor) -> Option<CompactGroup> {
        let mut packed = Vec::new();
        let mut spans = Vec::with_capacity(self.chunks.len());
        for c in &self.chunks {
            let data = self
                .data
                .get(c.offset as usize..c.offset as usize + c.len as usize)?;
            let at = packed.len();
            match lz4.compress_append(data, &mut packed) {
                Some(n) if n < data.len() => {}
                _ => {
                    packed.truncate(at);
                    packed.extend_from_slice(data);
                }
            }
            spans.push((u32::try_from(at).ok()?, (packed.len() - at) as u32));
        }
        packed.shrink_to_fit();
        Some(CompactGroup {
            packed,
            spans,
            chunks: self.chunks.iter().map(GroupChunk::copy).collect(),
            crypt: self.crypt.clone(),
        })
    }
}

/// A decoded group compressed again chunk by chunk with LZ4, which a
/// served image keeps once its decoded copy is evicted: a read of a few
/// KiB then decodes the head of one chunk at LZ4's speed, not the whole
/// zstd group (see `cairn_volume`'s second cache tier).
pub struct CompactGroup {
    packed: Vec<u8>,
    /// Per chunk (as in `chunks`): start in `packed` and length there
    /// (equal to the chunk's length: stored as it is).
    spans: Vec<(u32, u32)>,
    chunks: Vec<GroupChunk>,
    crypt: Option<Arc<Crypt>>,
}

impl std::fmt::Debug for CompactGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompactGroup")
            .field("packed", &self.packed.len())
            .field("chunks", &self.chunks.len())
            .finish()
    }
}

impl CompactGroup {
    /// Bytes this group holds in memory (what a cache counts).
    pub fn bytes(&self) -> usize {
        self.packed.capacity()
            + self.chunks.capacity() * std::mem::size_of::<GroupChunk>()
            + self.spans.capacity() * std::mem::size_of::<(u32, u32)>()
            + std::mem::size_of::<CompactGroup>()
    }

    /// Copy bytes `from..from + dst.len()` of the chunk at group offset
    /// `slice` (`len` bytes, id starting with `prefix`) into `dst`. A
    /// chunk already checked decodes only as far as `dst` needs; one not
    /// yet checked is decoded whole and checked against its id first.
    /// `scratch` is a buffer to reuse. `Err` says what is wrong.
    pub fn read(
        &self,
        slice: u32,
        len: u32,
        prefix: &[u8; PREFIX_LEN],
        from: usize,
        dst: &mut [u8],
        scratch: &mut Vec<u8>,
    ) -> std::result::Result<(), String> {
        let i = find(&self.chunks, slice, len, prefix)?;
        let (at, plen) = self.spans[i];
        let src = self
            .packed
            .get(at as usize..at as usize + plen as usize)
            .ok_or("the compact chunk runs past its buffer")?;
        unpack_chunk(
            &self.chunks[i],
            self.crypt.as_deref(),
            src,
            from,
            dst,
            scratch,
        )
    }

    /// Bytes [`CompactGroup::seal`] writes.
    pub fn sealed_len(&self) -> usize {
        self.packed.len() + self.spans.len() * crate::crypt::TAG_LEN
    }

    /// Seal the copy for a place on local disk whose address is `at`:
    /// each chunk's bytes encrypted and authenticated apart under `key`,
    /// its own address (`at` plus its start) the nonce, so bytes read
    /// back from anywhere else, or rewritten since, do not open. No
    /// address may be sealed twice under one key. Appends
    /// [`CompactGroup::sealed_len`] bytes to `out`; what stays in memory
    /// is returned.
    pub fn seal(&self, key: &SpillKey, at: u64, out: &mut Vec<u8>) -> Result<SpilledGroup> {
        let base = out.len();
        let mut spans = Vec::with_capacity(self.spans.len());
        for &(a, n) in &self.spans {
            let start = out.len() - base;
            let src = self
                .packed
                .get(a as usize..a as usize + n as usize)
                .ok_or_else(|| {
                    StoreError::Invalid("a compact chunk runs past its buffer".into())
                })?;
            key.0.seal_numbered(at + start as u64, src, out)?;
            spans.push((start as u32, (out.len() - base - start) as u32));
        }
        Ok(SpilledGroup {
            at,
            len: (out.len() - base) as u64,
            spans,
            chunks: self.chunks.iter().map(GroupChunk::copy).collect(),
            crypt: self.crypt.clone(),
        })
    }
}

/// An ephemeral key for what a process keeps of a repository on local
/// disk for itself alone (the spilled compact copies of a served image):
/// a random AES-256-GCM key, made when it is needed and never stored, so
/// the bytes are unreadable to anyone else and useless after it ends, and
/// every read of them is authenticated, so a flipped bit on that disk is
/// found, never served. Its nonces are the bytes' addresses, each sealed
/// once ([`CompactGroup::seal`]), so no count of messages wears it out.
pub struct SpillKey(Crypt);

impl SpillKey {
    /// A fresh random key.
    pub fn new() -> Result<SpillKey> {
        Ok(SpillKey(Crypt::generate()?))
    }
}

impl std::fmt::Debug for SpillKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SpillKey(..)")
    }
}

/// A compact copy sealed onto local disk ([`CompactGroup::seal`]): what
/// stays in memory is its chunk table and where each chunk's sealed bytes
/// lie; its reader fetches those ([`SpilledGroup::locate`]) and hands them
/// to [`SpilledGroup::read`].
pub struct SpilledGroup {
    at: u64,
    len: u64,
    /// Per chunk (as in `chunks`): start of its sealed bytes after `at`,
    /// and their length.
    spans: Vec<(u32, u32)>,
    chunks: Vec<GroupChunk>,
    crypt: Option<Arc<Crypt>>,
}

impl std::fmt::Debug for SpilledGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpilledGroup")
            .field("at", &self.at)
            .field("len", &self.len)
            .field("chunks", &self.chunks.len())
            .finish()
    }
}

impl SpilledGroup {
    /// Its address on disk, as given to [`CompactGroup::seal`].
    pub fn at(&self) -> u64 {
        self.at
    }

    /// Bytes it takes on disk.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it holds no bytes on disk.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes it holds in memory.
    pub fn bytes(&self) -> usize {
        self.chunks.capacity() * std::mem::size_of::<GroupChunk>()
            + self.spans.capacity() * std::mem::size_of::<(u32, u32)>()
            + std::mem::size_of::<SpilledGroup>()
    }

    /// The chunk at group offset `slice` (`len` bytes, id starting with
    /// `prefix`): its number, and where its sealed bytes lie (start after
    /// [`SpilledGroup::at`], length).
    pub fn locate(
        &self,
        slice: u32,
        len: u32,
        prefix: &[u8; PREFIX_LEN],
    ) -> std::result::Result<(usize, u32, u32), String> {
        let i = find(&self.chunks, slice, len, prefix)?;
        let (a, n) = self.spans[i];
        Ok((i, a, n))
    }

    /// Copy bytes `from..from + dst.len()` of chunk `i` (from
    /// [`SpilledGroup::locate`]), whose sealed bytes read back from disk
    /// are `sealed` (opened in place), into `dst`, as
    /// [`CompactGroup::read`] does. `Ok(false)`: the bytes do not open
    /// under `key` (damaged, or not these bytes: nothing is copied).
    /// `scratch` is a buffer to reuse.
    pub fn read(
        &self,
        i: usize,
        sealed: &mut [u8],
        key: &SpillKey,
        from: usize,
        dst: &mut [u8],
        scratch: &mut Vec<u8>,
    ) -> std::result::Result<bool, String> {
        let (a, _) = self.spans[i];
        let Some(plain) = key.0.open_numbered(self.at + u64::from(a), sealed) else {
            return Ok(false);
        };
        unpack_chunk(
            &self.chunks[i],
            self.crypt.as_deref(),
            plain,
            from,
            dst,
            scratch,
        )?;
        Ok(true)
    }
}

/// Bytes `from..from + dst.len()` of chunk `c` into `dst`, from `src`,
/// its compact form (an LZ4 block, or its bytes as they are when of the
/// chunk's length): decoded only as far as `dst` needs if the chunk is
/// known good, else whole and checked against its id first.
fn unpack_chunk(
    c: &GroupChunk,
    crypt: Option<&Crypt>,
    src: &[u8],
    from: usize,
    dst: &mut [u8],
    scratch: &mut Vec<u8>,
) -> std::result::Result<(), String> {
    let len = c.len as usize;
    let end = from + dst.len();
    if end > len {
        return Err(format!("bytes {from}..{end} asked of a {len}-byte chunk"));
    }
    let data = if src.len() == len {
        src
    } else {
        let want = if c.state.load(Ordering::Acquire) == GOOD {
            end
        } else {
            len
        };
        scratch.clear();
        match lz4_ffi::decompress_prefix_append(src, scratch, want, len) {
            Some(n) if n >= want => &scratch[..],
            _ => return Err("the compact copy of the chunk does not decode".into()),
        }
    };
    if data.len() == len {
        check(c, crypt, data)?;
    }
    dst.copy_from_slice(&data[from..end]);
    Ok(())
}

/// The index in `chunks` of the chunk at group offset `slice`, `len`
/// bytes long, whose id starts with `prefix`.
fn find(
    chunks: &[GroupChunk],
    slice: u32,
    len: u32,
    prefix: &[u8; PREFIX_LEN],
) -> std::result::Result<usize, String> {
    let i = chunks
        .binary_search_by_key(&slice, |c| c.offset)
        .map_err(|_| format!("the record holds no chunk at group offset {slice}"))?;
    let c = &chunks[i];
    if c.len != len || c.id.prefix() != *prefix {
        return Err(format!(
            "the record holds chunk {} of {} bytes at group offset {slice}, not this one of {len}",
            c.id, c.len
        ));
    }
    Ok(i)
}

/// Whether `data`, all of chunk `c`, hashes to its id: checked the first
/// time, the answer kept.
fn check(c: &GroupChunk, crypt: Option<&Crypt>, data: &[u8]) -> std::result::Result<(), String> {
    let ok = match c.state.load(Ordering::Acquire) {
        GOOD => true,
        BAD => false,
        _ => {
            // Two threads may hash the same chunk at once; both get the
            // same answer, so no lock is needed.
            let ok = crate::crypt::chunk_id(crypt, data) == c.id;
            c.state
                .store(if ok { GOOD } else { BAD }, Ordering::Release);
            ok
        }
    };
    if ok {
        Ok(())
    } else {
        Err("decoded bytes do not hash to the chunk id".into())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn group(data: Vec<u8>, cuts: &[(u32, u32, ChunkId)]) -> Group {
        Group {
            data,
            chunks: cuts
                .iter()
                .map(|&(offset, len, id)| GroupChunk {
                    offset,
                    len,
                    id,
                    state: AtomicU8::new(UNCHECKED),
                })
                .collect(),
            crypt: None,
            recycle: None,
        }
    }

    /// `n` bytes LZ4 cannot shrink (xorshift32).
    fn noise(n: usize) -> Vec<u8> {
        let mut x = 0x2545_f491_u32;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect()
    }

    #[test]
    fn a_dropped_groups_buffer_goes_to_the_next_group_of_its_size_class() {
        const MIN: usize = GROUP_BUFFER_MIN;
        const STEP: usize = GROUP_BUFFER_STEP;
        let pool = GroupBuffers::new(2 * MIN + 3 * STEP);
        let mut g = group(pool.take(MIN + 1000), &[]);
        assert_eq!(g.data.capacity(), MIN + STEP);
        g.recycle = Some(pool.clone());
        let at = g.data.as_ptr();
        drop(g);
        assert_eq!(pool.held(), (1, MIN + STEP));
        // Another class: a new buffer; a small group: its own size, and
        // not kept.
        assert_eq!(pool.take(MIN + STEP + 1).capacity(), MIN + 2 * STEP);
        let small = pool.take(5000);
        assert_eq!(small.capacity(), 5000);
        pool.give(small);
        assert_eq!(pool.held().0, 1);
        // The same class: the same buffer, empty.
        let again = pool.take(MIN + STEP - 5);
        assert_eq!(
            (again.as_ptr(), again.capacity(), again.len()),
            (at, MIN + STEP, 0)
        );
        assert_eq!(pool.held(), (0, 0));
        // At most `max_bytes` are kept, the oldest leave; a buffer not of a
        // class is not kept.
        for n in [0, 1, 2] {
            pool.give(Vec::with_capacity(MIN + n * STEP));
        }
        pool.give(Vec::with_capacity(MIN + 1));
        assert_eq!(pool.held(), (2, 2 * MIN + 3 * STEP));
        assert_eq!(pool.take(MIN).capacity(), MIN);
        // A group without a pool frees its buffer.
        drop(group(vec![0u8; 10], &[]));
        assert_eq!(pool.held(), (2, 2 * MIN + 3 * STEP));
    }

    #[test]
    fn a_group_gives_its_chunks_and_refuses_what_it_does_not_hold() {
        let (a, b) = (vec![1u8; 100], vec![2u8; 50]);
        let (ia, ib) = (ChunkId::of(&a), ChunkId::of(&b));
        let g = group(
            [a.clone(), b.clone()].concat(),
            &[(0, 100, ia), (100, 50, ib)],
        );
        assert_eq!(g.chunk(0, 100, &ia.prefix()).unwrap(), &a[..]);
        assert_eq!(g.chunk(100, 50, &ib.prefix()).unwrap(), &b[..]);
        // Asked again: the answer is kept, not recomputed wrongly.
        assert_eq!(g.chunk(100, 50, &ib.prefix()).unwrap(), &b[..]);
        assert!(
            g.chunk(50, 50, &ib.prefix()).is_err(),
            "no chunk starts there"
        );
        assert!(g.chunk(0, 99, &ia.prefix()).is_err(), "wrong length");
        assert!(g.chunk(0, 100, &ib.prefix()).is_err(), "another chunk's id");
    }

    #[test]
    fn a_chunk_whose_bytes_do_not_hash_to_its_id_is_damage_every_time() {
        let a = vec![7u8; 64];
        let id = ChunkId::of(&a);
        let mut bytes = a.clone();
        bytes[10] ^= 1;
        let g = group(bytes, &[(0, 64, id)]);
        for _ in 0..2 {
            let e = g.chunk(0, 64, &id.prefix()).unwrap_err();
            assert!(e.contains("do not hash"), "{e}");
        }
        // A table running past the bytes is refused, not a panic.
        let g = group(a, &[(0, 65, id)]);
        assert!(g.chunk(0, 65, &id.prefix()).is_err());
    }

    #[test]
    fn a_compact_group_reads_any_range_of_its_chunks() {
        // One compressible chunk, one that LZ4 cannot shrink (kept as it
        // is), one small.
        let a: Vec<u8> = (0..70_000u32).map(|i| (i / 300) as u8).collect();
        let b = noise(40_000);
        let c = vec![3u8; 10];
        let ids = [ChunkId::of(&a), ChunkId::of(&b), ChunkId::of(&c)];
        let g = group(
            [a.clone(), b.clone(), c.clone()].concat(),
            &[
                (0, 70_000, ids[0]),
                (70_000, 40_000, ids[1]),
                (110_000, 10, ids[2]),
            ],
        );
        // The first chunk is checked before compaction, the others after.
        g.chunk(0, 70_000, &ids[0].prefix()).unwrap();
        let cg = g.compact(&mut Compressor::new()).unwrap();
        assert!(cg.bytes() < 70_000, "{cg:?}: {}", cg.bytes());
        let mut scratch = Vec::new();
        for (k, (slice, data)) in [(0u32, &a), (70_000, &b), (110_000, &c)].iter().enumerate() {
            let len = data.len();
            for (from, n) in [(0, len), (0, 1), (len - 1, 1), (len / 3, len / 2), (len, 0)] {
                // Twice: once unchecked (decoded whole), once checked.
                for _ in 0..2 {
                    let mut dst = vec![0u8; n];
                    cg.read(
                        *slice,
                        len as u32,
                        &ids[k].prefix(),
                        from,
                        &mut dst,
                        &mut scratch,
                    )
                    .unwrap();
                    assert_eq!(dst, data[from..from + n], "chunk {k} {from}+{n}");
                }
            }
        }
        // A compressed chunk not checked before compaction: its first
        // read, of a few bytes, decodes and hashes it whole.
        let g = group(
            [a.clone(), b.clone()].concat(),
            &[(0, 70_000, ids[0]), (70_000, 40_000, ids[1])],
        );
        let cg2 = g.compact(&mut Compressor::new()).unwrap();
        let mut dst = [0u8; 3];
        cg2.read(0, 70_000, &ids[0].prefix(), 50_000, &mut dst, &mut scratch)
            .unwrap();
        assert_eq!(dst, a[50_000..50_003]);
        assert_eq!(scratch.len(), 70_000, "decoded whole to be checked");
        let mut dst = [0u8; 2];
        assert!(cg
            .read(0, 70_000, &ids[0].prefix(), 69_999, &mut dst, &mut scratch)
            .is_err());
        assert!(cg
            .read(0, 70_000, &ids[1].prefix(), 0, &mut dst, &mut scratch)
            .is_err());
        assert!(cg
            .read(5, 70_000, &ids[0].prefix(), 0, &mut dst, &mut scratch)
            .is_err());
    }

    #[test]
    fn a_sealed_copy_opens_only_where_it_was_sealed_for() {
        // One chunk LZ4 shrinks, one it cannot (kept as it is: its bytes
        // would show in the file if sealing did not encrypt them).
        let a: Vec<u8> = (0..70_000u32).map(|i| (i / 300) as u8).collect();
        let b = noise(5_000);
        let ids = [ChunkId::of(&a), ChunkId::of(&b)];
        let g = group(
            [a.clone(), b.clone()].concat(),
            &[(0, 70_000, ids[0]), (70_000, 5_000, ids[1])],
        );
        let cg = g.compact(&mut Compressor::new()).unwrap();
        assert!(cg.packed.windows(64).any(|w| w == &b[1000..1064]));
        let key = SpillKey::new().unwrap();
        let at = 3 << 30;
        // Appended after what the buffer holds.
        let mut disk = vec![9u8; 100];
        let sg = cg.seal(&key, at, &mut disk).unwrap();
        assert_eq!(disk.len() - 100, cg.sealed_len());
        assert_eq!((sg.at(), sg.len()), (at, cg.sealed_len() as u64));
        assert!(sg.bytes() < 1000, "{}", sg.bytes());
        let disk = &disk[100..];
        assert!(!disk.windows(64).any(|w| w == &b[1000..1064]));
        let mut scratch = Vec::new();
        // The same copy sealed again further on (addresses never sealed
        // twice under one key).
        let moved = cg
            .seal(&key, at + cg.sealed_len() as u64, &mut Vec::new())
            .unwrap();
        for (k, (slice, data)) in [(0u32, &a), (70_000, &b)].iter().enumerate() {
            let len = data.len() as u32;
            let (i, start, n) = sg.locate(*slice, len, &ids[k].prefix()).unwrap();
            let sealed = &disk[start as usize..(start + n) as usize];
            let mut dst = vec![0u8; 100];
            assert!(sg
                .read(i, &mut sealed.to_vec(), &key, 10, &mut dst, &mut scratch)
                .unwrap());
            assert_eq!(dst, data[10..110]);
            // A flipped bit, another key, or the bytes of another place
            // do not open, and nothing is copied.
            let mut flipped = sealed.to_vec();
            flipped[n as usize / 2] ^= 4;
            let mut dst = vec![0u8; 100];
            assert!(!sg
                .read(i, &mut flipped, &key, 10, &mut dst, &mut scratch)
                .unwrap());
            let other = SpillKey::new().unwrap();
            assert!(!sg
                .read(i, &mut sealed.to_vec(), &other, 10, &mut dst, &mut scratch)
                .unwrap());
            assert!(!moved
                .read(i, &mut sealed.to_vec(), &key, 10, &mut dst, &mut scratch)
                .unwrap());
            assert_eq!(dst, vec![0u8; 100]);
        }
        // Asked for a chunk it does not hold.
        assert!(sg.locate(1, 70_000, &ids[0].prefix()).is_err());
    }

    #[test]
    fn a_compact_group_keeps_damage_visible() {
        let a: Vec<u8> = (0..50_000u32).map(|i| (i / 100) as u8).collect();
        let id = ChunkId::of(&a);
        let mut bytes = a.clone();
        bytes[40_000] ^= 1;
        // Never checked before compaction: the first read of any part
        // decodes the whole chunk and finds the damage.
        let g = group(bytes.clone(), &[(0, 50_000, id)]);
        let cg = g.compact(&mut Compressor::new()).unwrap();
        let mut dst = [0u8; 16];
        for _ in 0..2 {
            let e = cg
                .read(0, 50_000, &id.prefix(), 0, &mut dst, &mut Vec::new())
                .unwrap_err();
            assert!(e.contains("do not hash"), "{e}");
        }
        // Found bad before compaction: stays bad.
        let g = group(bytes, &[(0, 50_000, id)]);
        assert!(g.chunk(0, 50_000, &id.prefix()).is_err());
        let cg = g.compact(&mut Compressor::new()).unwrap();
        assert!(cg
            .read(0, 50_000, &id.prefix(), 0, &mut dst, &mut Vec::new())
            .is_err());
        // A table past the bytes is not compacted.
        let g = group(a, &[(0, 50_001, id)]);
        assert!(g.compact(&mut Compressor::new()).is_none());
    }
}
