//! The durable overlay of a writable image: client writes kept on local
//! disk between commits, so that a FLUSH costs an `fdatasync` and not a
//! snapshot. The format and its crash protocol are in
//! `docs/format/overlay.md`.
//!
//! An overlay directory holds generations. A generation is two files:
//! `G.data`, a sparse file of the image's size holding written blocks at
//! their own offsets, and `G.log`, a header naming the image and the
//! snapshot the generation lies over, then one checksummed record per
//! FLUSH listing the blocks that became data or zeroes since the last.
//! Its block map lives in RAM, rebuilt from the log on open.
//!
//! The live generation takes writes. A commit seals it and starts the
//! next one over it, so writes go on while the sealed one becomes a
//! snapshot; then the live one is rebased onto that snapshot (a record)
//! and the sealed one deleted.

use cairn_blockdev::{BlockDev, BlockError, ErrorKind, FileDev, FileOptions, Op};
use cairn_store::sync_dir;
use cairn_store::StoreError;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};

/// Size of the overlay's blocks.
pub(crate) const BS: u64 = 4096;

const MAGIC: &[u8; 8] = b"CAIRNOVL";
const VERSION: u32 = 1;
/// Record kinds.
const CHANGES: u8 = 1;
const REBASE: u8 = 2;
/// Bytes of a record's head: length, kind, and their checksum.
const HEAD: usize = 4 + 1 + 4;
/// Bytes of a record around its payload: head and checksum.
const FRAME: usize = HEAD + 4;
/// Bytes of one run in a changes record.
const RUN: usize = 8 + 4 + 1;

/// What a block of the overlay holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mark {
    /// Its bytes, in the data file.
    Data,
    /// Zeroes.
    Zero,
}

impl Mark {
    fn code(self) -> u8 {
        match self {
            Mark::Data => 1,
            Mark::Zero => 2,
        }
    }

    fn from_code(c: u8) -> Option<Mark> {
        match c {
            1 => Some(Mark::Data),
            2 => Some(Mark::Zero),
            _ => None,
        }
    }
}

/// Block runs with their marks, `start -> (end, mark)`: apart, and
/// neighbours with the same mark merged. It grows with the runs, not the
/// blocks, so a TRIM of a whole device (as `mkfs` sends) is one entry.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct RunMap {
    runs: BTreeMap<u64, (u64, Mark)>,
    blocks: u64,
}

impl RunMap {
    /// Mark blocks `first..first + n`.
    pub fn insert(&mut self, first: u64, n: u64, mark: Mark) {
        if n == 0 {
            return;
        }
        let end = first + n;
        // A run from before `first` into the range: keep its head (and
        // its tail past `end`).
        if let Some((&s, &(e, m))) = self.runs.range(..first).next_back() {
            if e > first {
                self.runs.insert(s, (first, m));
                self.blocks -= e - first;
                if e > end {
                    self.runs.insert(end, (e, m));
                    self.blocks += e - end;
                }
            }
        }
        // Runs starting inside: drop them (keeping a tail past `end`).
        while let Some((&s, &(e, m))) = self.runs.range(first..end).next() {
            self.runs.remove(&s);
            self.blocks -= e - s;
            if e > end {
                self.runs.insert(end, (e, m));
                self.blocks += e - end;
            }
        }
        // Merge with neighbours of the same mark.
        let (mut a, mut z) = (first, end);
        if let Some((&s, &(e, m))) = self.runs.range(..first).next_back() {
            if e == first && m == mark {
                self.runs.remove(&s);
                self.blocks -= e - s;
                a = s;
            }
        }
        if let Some(&(e, m)) = self.runs.get(&end) {
            if m == mark {
                self.runs.remove(&end);
                self.blocks -= e - end;
                z = e;
            }
        }
        self.runs.insert(a, (z, mark));
        self.blocks += z - a;
    }

    /// The mark of block `b`.
    #[cfg(test)]
    pub fn get(&self, b: u64) -> Option<Mark> {
        self.runs
            .range(..=b)
            .next_back()
            .filter(|(_, &(e, _))| e > b)
            .map(|(_, &(_, m))| m)
    }

    /// The run holding block `b`, else the first one after it.
    pub fn at_or_after(&self, b: u64) -> Option<(u64, u64, Mark)> {
        if let Some((&s, &(e, m))) = self.runs.range(..=b).next_back() {
            if e > b {
                return Some((s, e, m));
            }
        }
        self.runs
            .range(b.saturating_add(1)..)
            .next()
            .map(|(&s, &(e, m))| (s, e, m))
    }

    /// The runs over blocks `a..z`, cut to them.
    pub fn within(&self, a: u64, z: u64) -> impl Iterator<Item = (u64, u64, Mark)> + '_ {
        let from = self
            .runs
            .range(..=a)
            .next_back()
            .filter(|(_, &(e, _))| e > a)
            .map_or(a, |(&s, _)| s);
        self.runs
            .range(from..z.max(from))
            .map(move |(&s, &(e, m))| (s.max(a), e.min(z), m))
    }

    /// Every run, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64, Mark)> + '_ {
        self.runs.iter().map(|(&s, &(e, m))| (s, e, m))
    }

    /// Blocks marked.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }
}

/// A generation's header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    /// The overlay's id, the same for all its generations.
    pub id: [u8; 16],
    /// The generation number (from 1).
    pub gen: u64,
    /// The image.
    pub name: String,
    /// The image's size.
    pub size: u64,
    /// The snapshot the generation lies over when it starts.
    pub base: u64,
    /// The sealed generation between this one and `base` (0: none).
    pub prev: u64,
}

impl Header {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(64 + self.name.len());
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes()); // length, below
        b.extend_from_slice(&self.id);
        b.extend_from_slice(&self.gen.to_le_bytes());
        b.extend_from_slice(&self.size.to_le_bytes());
        b.extend_from_slice(&self.base.to_le_bytes());
        b.extend_from_slice(&self.prev.to_le_bytes());
        b.extend_from_slice(&(self.name.len() as u16).to_le_bytes());
        b.extend_from_slice(self.name.as_bytes());
        let len = (b.len() + 4) as u32;
        b[12..16].copy_from_slice(&len.to_le_bytes());
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parse a header at the start of `b`: it and its length.
    fn decode(b: &[u8]) -> Result<(Header, usize), String> {
        if b.len() < 16 || &b[..8] != MAGIC {
            return Err("not an overlay log (no CAIRNOVL header)".into());
        }
        let version = le32(&b[8..12]);
        if version != VERSION {
            return Err(format!(
                "overlay log version {version}; this cairn reads version {VERSION}"
            ));
        }
        let len = le32(&b[12..16]) as usize;
        if len < 16 + 16 + 32 + 2 + 4 || len > b.len() {
            return Err(format!("header length {len} out of range"));
        }
        let crc = le32(&b[len - 4..len]);
        if crc32c::crc32c(&b[..len - 4]) != crc {
            return Err("header checksum mismatch".into());
        }
        let mut id = [0u8; 16];
        id.copy_from_slice(&b[16..32]);
        let name_len = u16::from_le_bytes([b[64], b[65]]) as usize;
        if 66 + name_len + 4 != len {
            return Err("header name length does not match".into());
        }
        let name = String::from_utf8(b[66..66 + name_len].to_vec())
            .map_err(|_| "header image name is not UTF-8".to_string())?;
        Ok((
            Header {
                id,
                gen: le64(&b[32..40]),
                size: le64(&b[40..48]),
                base: le64(&b[48..56]),
                prev: le64(&b[56..64]),
                name,
            },
            len,
        ))
    }
}

fn le32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

fn le64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

fn io_err(path: &Path, what: &'static str, source: std::io::Error) -> StoreError {
    StoreError::Io {
        path: path.to_path_buf(),
        what,
        source,
    }
}

fn corrupt(path: &Path, offset: u64, reason: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        path: path.to_path_buf(),
        offset,
        reason: reason.into(),
    }
}

/// One record: framed and checksummed (the head on its own too, so a
/// damaged length is told from a record cut short).
fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(payload.len() + FRAME);
    b.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    b.push(kind);
    let hcrc = crc32c::crc32c(&b);
    b.extend_from_slice(&hcrc.to_le_bytes());
    b.extend_from_slice(payload);
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// The payload length of the whole, sound record at the start of `b`
/// (its head and its body checksums right), if there is one.
fn sound_record(b: &[u8]) -> Option<usize> {
    if b.len() < FRAME || crc32c::crc32c(&b[..5]) != le32(&b[5..HEAD]) {
        return None;
    }
    let len = le32(b) as usize;
    if FRAME + len > b.len() || crc32c::crc32c(&b[..HEAD + len]) != le32(&b[HEAD + len..]) {
        return None;
    }
    Some(len)
}

/// What replaying a log found.
#[derive(Debug, Default)]
pub(crate) struct Replay {
    pub map: RunMap,
    /// The latest rebase record, if any.
    pub rebased: Option<u64>,
    /// Where the valid records end.
    pub end: u64,
    /// Bytes of a torn last record dropped (a FLUSH that never returned).
    pub torn: u64,
    /// Whether that record's head was sound and its whole length there
    /// (only its body's checksum failed: a torn append whose later page
    /// landed first, or damage).
    pub torn_whole: bool,
}

/// Replay the records of a log (`data` is the whole file, `start` where
/// the header ends). A bad record with a sound one anywhere after it is
/// damage; else it is the torn tail of the last append.
pub(crate) fn replay(
    path: &Path,
    data: &[u8],
    start: usize,
    size: u64,
) -> Result<Replay, StoreError> {
    let mut r = Replay::default();
    let blocks = size.div_ceil(BS);
    let mut at = start;
    while at < data.len() {
        let rest = &data[at..];
        let torn = |r: &mut Replay| {
            r.torn = rest.len() as u64;
            r.torn_whole = rest.len() >= FRAME
                && crc32c::crc32c(&rest[..5]) == le32(&rest[5..HEAD])
                && FRAME + le32(rest) as usize <= rest.len();
        };
        let Some(len) = sound_record(rest) else {
            // A bad record is the torn tail of an append that never
            // finished (the unwritten part reads as zeroes, or as a prefix
            // of the record) only if no whole record follows it: one
            // append is in flight at a time. Else it is damage.
            if (at + 1..data.len()).any(|i| sound_record(&data[i..]).is_some()) {
                return Err(corrupt(
                    path,
                    at as u64,
                    "overlay log record damaged, with records after it (not a torn tail)",
                ));
            }
            torn(&mut r);
            break;
        };
        let kind = rest[4];
        let body = &rest[HEAD..HEAD + len];
        match kind {
            CHANGES => {
                if len < 4 || (len - 4) % RUN != 0 || le32(body) as usize != (len - 4) / RUN {
                    return Err(corrupt(path, at as u64, "changes record of a bad length"));
                }
                for run in body[4..].chunks_exact(RUN) {
                    let (first, n) = (le64(run), le32(&run[8..]) as u64);
                    let mark = Mark::from_code(run[12])
                        .ok_or_else(|| corrupt(path, at as u64, "unknown block mark"))?;
                    if n == 0 || first.checked_add(n).is_none_or(|e| e > blocks) {
                        return Err(corrupt(path, at as u64, "block run outside the image"));
                    }
                    r.map.insert(first, n, mark);
                }
            }
            REBASE if len == 8 => r.rebased = Some(le64(body)),
            REBASE => return Err(corrupt(path, at as u64, "rebase record of a bad length")),
            _ => {
                return Err(corrupt(
                    path,
                    at as u64,
                    format!("unknown record kind {kind}"),
                ))
            }
        }
        at += FRAME + len;
        r.end = at as u64;
    }
    if r.end == 0 {
        r.end = start as u64;
    }
    Ok(r)
}

/// The log writer: the file and where the next record goes.
struct Log {
    file: File,
    end: u64,
}

/// One generation (see the module docs).
pub(crate) struct Gen {
    pub header: Header,
    data: FileDev,
    data_path: PathBuf,
    log_path: PathBuf,
    log: Mutex<Log>,
    map: RwLock<RunMap>,
    /// Runs changed since the last FLUSH, in order.
    pending: Mutex<Vec<(u64, u32, Mark)>>,
    /// Held through a whole flush, so that a FLUSH returns only after
    /// every write before it is durable, even one another flush took.
    flushing: Mutex<()>,
    rebased: Mutex<Option<u64>>,
    /// The first failed flush (see [`Gen::fail`]).
    failed: Mutex<Option<String>>,
}

fn poisoned(op: Op) -> BlockError {
    BlockError::new(
        op,
        0,
        0,
        ErrorKind::Io(std::io::Error::other(
            "a thread panicked while changing the overlay",
        )),
    )
}

/// The file names of generation `gen`.
pub(crate) fn gen_paths(dir: &Path, gen: u64) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("{gen:016x}.data")),
        dir.join(format!("{gen:016x}.log")),
    )
}

/// The generation files in `dir` (`G.data`, `G.log`, `G.log.tmp`, `G` in
/// 16 hex digits): each one's path, generation and extension.
fn gen_files(dir: &Path) -> Result<Vec<(PathBuf, u64, String)>, StoreError> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| io_err(dir, "list", e))? {
        let e = e.map_err(|e| io_err(dir, "list", e))?;
        let name = e.file_name();
        let Some((stem, ext)) = name.to_str().and_then(|n| n.split_once('.')) else {
            continue;
        };
        if stem.len() != 16 || !["data", "log", "log.tmp"].contains(&ext) {
            continue;
        }
        if let Ok(g) = u64::from_str_radix(stem, 16) {
            out.push((e.path(), g, ext.to_string()));
        }
    }
    Ok(out)
}

/// The generations in `dir` (those with a log), oldest first.
pub(crate) fn list_gens(dir: &Path) -> Result<Vec<u64>, StoreError> {
    let mut gens: Vec<u64> = gen_files(dir)?
        .into_iter()
        .filter(|(_, _, ext)| ext == "log")
        .map(|(_, g, _)| g)
        .collect();
    gens.sort_unstable();
    Ok(gens)
}

/// Remove every generation file in `dir` but those of generations `keep`.
pub(crate) fn remove_others(dir: &Path, keep: &[u64]) -> Result<(), StoreError> {
    let mut removed = false;
    for (p, g, _) in gen_files(dir)? {
        if !keep.contains(&g) {
            std::fs::remove_file(&p).map_err(|e| io_err(&p, "remove", e))?;
            removed = true;
        }
    }
    if removed {
        sync_dir(dir)?;
    }
    Ok(())
}

impl Gen {
    /// Make generation `header.gen` in `dir`: the data file, then the log
    /// (written aside and renamed, so a log that exists is whole).
    pub fn create(dir: &Path, header: Header) -> Result<Gen, StoreError> {
        if header.name.len() > usize::from(u16::MAX) {
            return Err(StoreError::Invalid(format!(
                "image name of {} bytes: too long for an overlay",
                header.name.len()
            )));
        }
        let (data_path, log_path) = gen_paths(dir, header.gen);
        let f = File::create(&data_path).map_err(|e| io_err(&data_path, "create", e))?;
        f.set_len(header.size)
            .map_err(|e| io_err(&data_path, "size", e))?;
        f.sync_all().map_err(|e| io_err(&data_path, "fsync", e))?;
        let tmp = log_path.with_extension("log.tmp");
        let head = header.encode();
        {
            let mut t = File::create(&tmp).map_err(|e| io_err(&tmp, "create", e))?;
            t.write_all(&head).map_err(|e| io_err(&tmp, "write", e))?;
            t.sync_all().map_err(|e| io_err(&tmp, "fsync", e))?;
        }
        std::fs::rename(&tmp, &log_path).map_err(|e| io_err(&log_path, "rename", e))?;
        sync_dir(dir)?;
        Self::open_files(
            header,
            data_path,
            log_path,
            Replay {
                end: head.len() as u64,
                ..Replay::default()
            },
        )
    }

    fn open_files(
        header: Header,
        data_path: PathBuf,
        log_path: PathBuf,
        replay: Replay,
    ) -> Result<Gen, StoreError> {
        let data = FileDev::open(&data_path, FileOptions::default())
            .map_err(|e| io_err(&data_path, "open", std::io::Error::other(e.to_string())))?;
        if data.size() != header.size {
            return Err(corrupt(
                &data_path,
                0,
                format!("{} bytes; the log says {}", data.size(), header.size),
            ));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&log_path)
            .map_err(|e| io_err(&log_path, "open", e))?;
        if replay.torn_whole {
            // Its head sound and its whole length there, only its body's
            // checksum wrong: a crash does not leave that where a file's
            // length reaches the disk only after its data (ext4's ordered
            // data, XFS), and a killed process leaves whole appends. It
            // is the record of a FLUSH that returned, damaged since, and
            // its writes would be lost: refused (it was cut off with a
            // warning, and acknowledged writes lost: found by a black-box
            // test), with the one step that goes on without them.
            return Err(corrupt(
                &log_path,
                replay.end,
                format!(
                    "the last record ({} bytes) is whole but its checksum fails: damage to the \
                     record of an acknowledged FLUSH, whose writes would be lost; refusing to \
                     open it. To go on without them: truncate -s {} {}",
                    replay.torn,
                    replay.end,
                    log_path.display()
                ),
            ));
        }
        if replay.torn > 0 {
            // The FLUSH that was writing it never returned: said, never
            // dropped in silence.
            tracing::warn!(
                "overlay log {}: the last {} bytes (offset {}) are not a sound record, taken as \
                 the torn append of a FLUSH that never returned and cut off",
                log_path.display(),
                replay.torn,
                replay.end,
            );
            file.set_len(replay.end)
                .and_then(|_| file.sync_data())
                .map_err(|e| io_err(&log_path, "truncate the torn tail", e))?;
        }
        Ok(Gen {
            header,
            data,
            data_path,
            log_path,
            log: Mutex::new(Log {
                file,
                end: replay.end,
            }),
            map: RwLock::new(replay.map),
            pending: Mutex::new(Vec::new()),
            flushing: Mutex::new(()),
            rebased: Mutex::new(replay.rebased),
            failed: Mutex::new(None),
        })
    }

    /// Open generation `gen` of `dir`, replaying its log (a torn last
    /// record is cut off).
    pub fn open(dir: &Path, gen: u64) -> Result<Gen, StoreError> {
        let (data_path, log_path) = gen_paths(dir, gen);
        let bytes = std::fs::read(&log_path).map_err(|e| io_err(&log_path, "read", e))?;
        let (header, start) = Header::decode(&bytes).map_err(|r| corrupt(&log_path, 0, r))?;
        if header.gen != gen {
            return Err(corrupt(
                &log_path,
                0,
                format!("holds generation {}", header.gen),
            ));
        }
        if !data_path.exists() {
            return Err(corrupt(
                &data_path,
                0,
                "the data file of a logged generation is missing",
            ));
        }
        let replay = replay(&log_path, &bytes, start, header.size)?;
        Self::open_files(header, data_path, log_path, replay)
    }

    /// The snapshot this generation lies over now (its latest rebase, or
    /// its header's base).
    pub fn base(&self) -> u64 {
        self.rebased
            .lock()
            .map(|r| r.unwrap_or(self.header.base))
            .unwrap_or(self.header.base)
    }

    /// Whether the generation was rebased since it began.
    pub fn was_rebased(&self) -> bool {
        self.rebased.lock().map(|r| r.is_some()).unwrap_or(false)
    }

    /// The map, for reading.
    pub fn map(&self) -> std::sync::RwLockReadGuard<'_, RunMap> {
        self.map.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Blocks held.
    pub fn blocks(&self) -> u64 {
        self.map().blocks()
    }

    fn note(&self, first: u64, n: u64, mark: Mark, op: Op) -> cairn_blockdev::Result<()> {
        {
            let mut map = self.map.write().map_err(|_| poisoned(op))?;
            map.insert(first, n, mark);
        }
        let mut p = self.pending.lock().map_err(|_| poisoned(op))?;
        match p.last_mut() {
            Some((f, c, m))
                if *m == mark && *f + *c as u64 == first && (*c as u64) + n <= u32::MAX as u64 =>
            {
                *c += n as u32
            }
            _ => {
                let mut b = first;
                while b < first + n {
                    let c = (first + n - b).min(u32::MAX as u64);
                    p.push((b, c as u32, mark));
                    b += c;
                }
            }
        }
        Ok(())
    }

    /// Write `data` at block-aligned `offset` (whole blocks, or up to the
    /// image's end).
    pub fn write(&self, data: &[u8], offset: u64) -> cairn_blockdev::Result<()> {
        debug_assert_eq!(offset % BS, 0);
        self.data.write_at(data, offset, false)?;
        let n = (data.len() as u64).div_ceil(BS);
        self.note(offset / BS, n, Mark::Data, Op::Write)
    }

    /// Mark blocks `first..first + n` as zeroes (and free their space).
    pub fn zero(&self, first: u64, n: u64, op: Op) -> cairn_blockdev::Result<()> {
        self.note(first, n, Mark::Zero, op)?;
        let off = first * BS;
        let len = (n * BS).min(self.header.size - off);
        // Only space: the map already reads these as zeroes.
        let _ = self.data.trim(off, len, false);
        Ok(())
    }

    /// Read `buf` from the data file at `offset`.
    pub fn read(&self, buf: &mut [u8], offset: u64) -> cairn_blockdev::Result<()> {
        self.data.read_at(buf, offset)
    }

    fn append(&self, record: &[u8], op: Op) -> cairn_blockdev::Result<()> {
        let mut log = self.log.lock().map_err(|_| poisoned(op))?;
        let at = log.end;
        let io = |e: std::io::Error| {
            BlockError::new(
                op,
                at,
                record.len() as u64,
                ErrorKind::Io(std::io::Error::new(
                    e.kind(),
                    format!("{}: {e}", self.log_path.display()),
                )),
            )
        };
        let r = log
            .file
            .write_all_at(record, at)
            .and_then(|_| log.file.sync_data());
        if let Err(e) = r {
            // Take the partial record back, so the log ends at its last
            // whole record (best effort: the generation is failed now).
            let _ = log.file.set_len(at);
            return Err(self.fail(io(e)));
        }
        log.end += record.len() as u64;
        Ok(())
    }

    /// Remember that a flush failed: the changes it took are durable or
    /// not, nobody knows, and a retried `fdatasync` after an error proves
    /// nothing; every later flush of this generation fails too (as Linux
    /// reports a writeback error to fsync once and then forgets it, this
    /// must not).
    pub(crate) fn fail(&self, e: BlockError) -> BlockError {
        if let Ok(mut f) = self.failed.lock() {
            f.get_or_insert_with(|| e.to_string());
        }
        e
    }

    /// The first failed flush of this generation, if one failed.
    pub fn failure(&self) -> Option<String> {
        match self.failed.lock() {
            Ok(f) => f.clone(),
            Err(_) => Some("a thread panicked while flushing the overlay".into()),
        }
    }

    /// The error of an earlier failed flush, if any.
    fn check_failed(&self, op: Op) -> cairn_blockdev::Result<()> {
        match self.failed.lock().map_err(|_| poisoned(op))?.as_ref() {
            Some(first) => Err(BlockError::new(
                op,
                0,
                0,
                ErrorKind::Io(std::io::Error::other(format!(
                    "an earlier flush of the overlay failed ({first}); its writes may be lost, \
                     so no flush succeeds until the server restarts"
                ))),
            )),
            None => Ok(()),
        }
    }

    /// Make every change so far durable: the data, then a record of
    /// which blocks changed.
    pub fn flush(&self) -> cairn_blockdev::Result<()> {
        let _f = self.flushing.lock().map_err(|_| poisoned(Op::Flush))?;
        self.check_failed(Op::Flush)?;
        let runs = std::mem::take(&mut *self.pending.lock().map_err(|_| poisoned(Op::Flush))?);
        if runs.is_empty() {
            return Ok(());
        }
        self.data.flush().map_err(|e| self.fail(e))?;
        let mut payload = Vec::with_capacity(4 + runs.len() * RUN);
        payload.extend_from_slice(&(runs.len() as u32).to_le_bytes());
        for (first, n, mark) in &runs {
            payload.extend_from_slice(&first.to_le_bytes());
            payload.extend_from_slice(&n.to_le_bytes());
            payload.push(mark.code());
        }
        self.append(&frame(CHANGES, &payload), Op::Flush)
    }

    /// Record that the generation now lies over `snapshot`.
    pub fn rebase(&self, snapshot: u64) -> Result<(), StoreError> {
        self.append(&frame(REBASE, &snapshot.to_le_bytes()), Op::Flush)
            .map_err(|e| {
                io_err(
                    &self.log_path,
                    "append a rebase record",
                    std::io::Error::other(e.to_string()),
                )
            })?;
        if let Ok(mut r) = self.rebased.lock() {
            *r = Some(snapshot);
        }
        Ok(())
    }

    /// Delete the generation's files: the data file first, so no data
    /// file outlives its log unseen (a log without its data file is
    /// damage, unless the generation above was rebased past it, which is
    /// when a generation is removed).
    pub fn remove(&self, dir: &Path) -> Result<(), StoreError> {
        for p in [&self.data_path, &self.log_path] {
            match std::fs::remove_file(p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(p, "remove", e)),
            }
        }
        sync_dir(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The run map against a map of single blocks: the same marks,
        /// runs apart and merged, the same count.
        #[test]
        fn run_map_is_a_map_of_blocks(ops in proptest::collection::vec((0u64..200, 1u64..40, any::<bool>()), 1..60)) {
            let mut runs = RunMap::default();
            let mut blocks = BTreeMap::new();
            for (first, n, zero) in ops {
                let mark = if zero { Mark::Zero } else { Mark::Data };
                runs.insert(first, n, mark);
                for b in first..first + n {
                    blocks.insert(b, mark);
                }
            }
            for b in 0..260 {
                prop_assert_eq!(runs.get(b), blocks.get(&b).copied(), "block {}", b);
            }
            prop_assert_eq!(runs.blocks(), blocks.len() as u64);
            let all: Vec<_> = runs.iter().collect();
            for w in all.windows(2) {
                prop_assert!(w[0].1 < w[1].0 || (w[0].1 == w[1].0 && w[0].2 != w[1].2), "{:?}", w);
            }
            // `within` cuts to the range and `at_or_after` finds the next.
            let inside: u64 = runs.within(50, 120).map(|(s, e, _)| e - s).sum();
            prop_assert_eq!(inside, blocks.range(50..120).count() as u64);
            for b in 0..260 {
                let want = blocks.range(b..).next().map(|(&k, _)| k);
                let got = runs.at_or_after(b).map(|(s, _, _)| s.max(b));
                prop_assert_eq!(got, want, "after {}", b);
            }
        }
    }

    /// A TRIM of a whole 1 TiB device (as mkfs sends) is one run, not
    /// 268 million entries.
    #[test]
    fn a_whole_device_trim_is_one_run() {
        let dir = tempfile::tempdir().unwrap();
        let size = 1u64 << 40;
        let g = Gen::create(dir.path(), Header { size, ..header(1) }).unwrap();
        g.zero(0, size / BS, Op::Trim).unwrap();
        g.write(&[1u8; BS as usize], 5 * BS).unwrap();
        g.flush().unwrap();
        assert_eq!(g.blocks(), size / BS);
        assert_eq!(g.map().iter().count(), 3);
        drop(g);
        let g = Gen::open(dir.path(), 1).unwrap();
        assert_eq!(g.map().iter().count(), 3);
        assert_eq!(g.map().get(5), Some(Mark::Data));
        assert_eq!(g.map().get(size / BS - 1), Some(Mark::Zero));
    }

    fn header(gen: u64) -> Header {
        Header {
            id: [7; 16],
            gen,
            name: "vm".into(),
            size: 10 * BS + 100,
            base: 3,
            prev: 0,
        }
    }

    #[test]
    fn header_round_trips_and_any_flipped_byte_is_caught() {
        let h = header(5);
        let b = h.encode();
        assert_eq!(Header::decode(&b), Ok((h, b.len())));
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 0x10;
            assert!(Header::decode(&d).is_err(), "byte {i}");
        }
    }

    #[test]
    fn flushed_changes_come_back_and_a_torn_tail_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let g = Gen::create(dir.path(), header(1)).unwrap();
        g.write(&[1u8; 2 * BS as usize], 2 * BS).unwrap();
        g.zero(7, 2, Op::Trim).unwrap();
        g.flush().unwrap();
        g.write(&[2u8; 100], 10 * BS).unwrap(); // the short last block
        g.flush().unwrap();
        g.write(&[3u8; BS as usize], 0).unwrap(); // never flushed
        drop(g);
        let g = Gen::open(dir.path(), 1).unwrap();
        let runs: Vec<_> = g.map().iter().collect();
        assert_eq!(
            runs,
            vec![(2, 4, Mark::Data), (7, 9, Mark::Zero), (10, 11, Mark::Data)]
        );
        let mut b = [0u8; 100];
        g.read(&mut b, 10 * BS).unwrap();
        assert_eq!(b, [2u8; 100]);
        drop(g);

        // A record cut anywhere is a torn tail: dropped, and the log
        // truncated to the records before it.
        let (_, log) = gen_paths(dir.path(), 1);
        let whole = std::fs::read(&log).unwrap();
        let (_, start) = Header::decode(&whole).unwrap();
        let first_end = start + FRAME + 4 + 2 * RUN;
        for cut in first_end + 1..whole.len() {
            std::fs::write(&log, &whole[..cut]).unwrap();
            let g = Gen::open(dir.path(), 1).unwrap();
            assert_eq!(g.blocks(), 4, "cut at {cut}");
            drop(g);
            assert_eq!(std::fs::metadata(&log).unwrap().len(), first_end as u64);
        }
        // For the warning it gives, a dropped record that is whole (its
        // head sound and its length there, only its body's checksum
        // wrong: a later page landed first, or damage) is told from one
        // cut short.
        let size = Header::decode(&whole).unwrap().0.size;
        let cut = replay(&log, &whole[..whole.len() - 1], start, size).unwrap();
        assert!(cut.torn > 0 && !cut.torn_whole, "{cut:?}");
        let mut flipped = whole.clone();
        let n = flipped.len();
        flipped[n - 6] ^= 1;
        let bad = replay(&log, &flipped, start, size).unwrap();
        assert!(bad.torn > 0 && bad.torn_whole, "{bad:?}");
        // That one is refused, with the step that goes on without it.
        std::fs::write(&log, &flipped).unwrap();
        match Gen::open(dir.path(), 1) {
            Err(e @ StoreError::Corrupt { .. }) => {
                assert!(e.to_string().contains("truncate -s"), "{e}")
            }
            Err(e) => panic!("{e}"),
            Ok(g) => panic!("opened with {} blocks", g.blocks()),
        }
        assert_eq!(std::fs::read(&log).unwrap(), flipped, "nothing cut");
        // Zeroes after the last record (an extended, unwritten end) too,
        // and any bytes that hold no whole record (a page of an append
        // written while the one before it was not, or the rest of a
        // longer record whose append failed).
        for tail in [
            vec![0u8; 40],
            [vec![0u8; 4096], vec![0x5a; 300]].concat(),
            whole[start..start + 30].to_vec(),
        ] {
            let mut z = whole.clone();
            z.extend_from_slice(&tail);
            std::fs::write(&log, &z).unwrap();
            assert_eq!(Gen::open(dir.path(), 1).unwrap().blocks(), 5);
            assert_eq!(std::fs::metadata(&log).unwrap().len(), whole.len() as u64);
        }
    }

    #[test]
    fn a_damaged_record_before_others_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let g = Gen::create(dir.path(), header(1)).unwrap();
        g.write(&[1u8; BS as usize], 0).unwrap();
        g.flush().unwrap();
        g.write(&[1u8; BS as usize], BS).unwrap();
        g.flush().unwrap();
        g.rebase(9).unwrap();
        drop(g);
        let (_, log) = gen_paths(dir.path(), 1);
        let whole = std::fs::read(&log).unwrap();
        let (_, start) = Header::decode(&whole).unwrap();
        // Every byte of every record but the last.
        let last = whole.len() - FRAME - 8;
        for i in start..last {
            let mut d = whole.clone();
            d[i] ^= 0x01;
            std::fs::write(&log, &d).unwrap();
            match Gen::open(dir.path(), 1) {
                Err(StoreError::Corrupt { .. }) => {}
                Err(e) => panic!("byte {i}: {e}"),
                Ok(g) => panic!("byte {i}: opened with {} blocks", g.blocks()),
            }
        }
        std::fs::write(&log, &whole).unwrap();
        let g = Gen::open(dir.path(), 1).unwrap();
        assert_eq!(g.base(), 9);
        assert!(g.was_rebased());
    }

    #[test]
    fn a_missing_data_file_is_damage() {
        let dir = tempfile::tempdir().unwrap();
        drop(Gen::create(dir.path(), header(4)).unwrap());
        assert_eq!(list_gens(dir.path()).unwrap(), vec![4]);
        std::fs::remove_file(gen_paths(dir.path(), 4).0).unwrap();
        assert!(matches!(
            Gen::open(dir.path(), 4),
            Err(StoreError::Corrupt { .. })
        ));
    }
}
