//! Where bytes come from and go to: files, stdin, stdout, and output files
//! that appear only when complete (written under a temporary name in the
//! same directory and renamed on success, removed on failure).

use crate::{Error, Hooks, Result};
use std::fs::File;
use std::io::{IsTerminal, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

/// An input: a named file or standard input.
#[derive(Clone)]
pub enum Source {
    /// Standard input.
    Stdin,
    /// A named file.
    File(PathBuf),
}

/// What standard input is called where an input is named (messages,
/// summaries).
pub const STDIN_NAME: &str = "(stdin)";

impl Source {
    /// `-` is stdin, anything else a file.
    pub fn from_arg(p: &Path) -> Source {
        if p.as_os_str() == "-" {
            Source::Stdin
        } else {
            Source::File(p.to_path_buf())
        }
    }

    /// The input's name as messages show it.
    pub fn name(&self) -> String {
        match self {
            Source::Stdin => STDIN_NAME.to_string(),
            Source::File(p) => p.display().to_string(),
        }
    }

    /// Open for reading; returns the reader and the size when known.
    /// Standard input is a dup of fd 0: unbuffered, no lock.
    pub fn open(&self) -> Result<(File, Option<u64>)> {
        match self {
            Source::Stdin => {
                let f = std_file(std::io::stdin().as_fd(), "stdin")?;
                let size = regular_size(&f);
                Ok((f, size))
            }
            Source::File(p) => {
                let open_error = |source| Error::Open {
                    path: p.clone(),
                    source,
                };
                let f = File::open(p).map_err(open_error)?;
                let meta = f.metadata().map_err(open_error)?;
                if meta.is_dir() {
                    return Err(Error::IsDirectory { path: p.clone() });
                }
                let size = regular_size(&f);
                Ok((f, size))
            }
        }
    }
}

fn regular_size(f: &File) -> Option<u64> {
    f.metadata().ok().filter(|m| m.is_file()).map(|m| m.len())
}

/// An output: stdout, a regular file committed on success, or a special
/// file (a character device such as /dev/null, a FIFO) written in place.
pub enum Sink<'h> {
    /// Standard output.
    Stdout(File),
    /// A new regular file.
    File(PendingFile<'h>),
    /// A device or FIFO, and its path.
    Special(File, PathBuf),
}

/// Whether `path` exists and is neither a regular file nor a directory: a
/// device, a FIFO or a socket. Such an output is written in place; a
/// temporary file renamed over it would replace the device itself.
pub fn is_special(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir())
}

/// Open a special file (see [`is_special`]) for writing.
pub fn open_special(path: &Path) -> Result<File> {
    let f = open_in_place(path, false)?;
    cairn_blockdev::grow_pipe(&f);
    Ok(f)
}

/// Open an existing output at `path` to write it in place, emptied first
/// if `truncate`.
fn open_in_place(path: &Path, truncate: bool) -> Result<File> {
    std::fs::OpenOptions::new()
        .write(true)
        .truncate(truncate)
        .open(path)
        .map_err(|source| Error::CreateOutput {
            action: "open",
            path: path.to_path_buf(),
            source,
        })
}

/// Standard output as a `File` of its own (a dup of fd 1): unbuffered, no
/// lock, and no `LineWriter` looking for a newline in every write; a pipe
/// behind it is grown ([`cairn_blockdev::grow_pipe`]).
pub fn stdout_file() -> Result<File> {
    std_file(std::io::stdout().as_fd(), "stdout")
}

/// A standard stream as a `File` of its own: a dup, its pipe grown.
fn std_file(fd: std::os::fd::BorrowedFd<'_>, stream: &'static str) -> Result<File> {
    let fd = fd
        .try_clone_to_owned()
        .map_err(|source| Error::Duplicate { stream, source })?;
    let f = File::from(fd);
    cairn_blockdev::grow_pipe(&f);
    Ok(f)
}

/// Refuse, as gzip and zstd do, to write compressed data to a terminal
/// unless forced: it is unreadable there and may upset the terminal.
pub fn refuse_terminal_stdout(force: bool) -> Result<()> {
    if !force && std::io::stdout().is_terminal() {
        return Err(Error::TerminalOutput);
    }
    Ok(())
}

/// Refuse, as gzip and zstd do, to read compressed data from a terminal
/// unless forced: a user who forgot the file name would wait for nothing.
pub fn refuse_terminal_stdin(force: bool) -> Result<()> {
    if !force && std::io::stdin().is_terminal() {
        return Err(Error::TerminalInput);
    }
    Ok(())
}

impl<'h> Sink<'h> {
    /// Standard output; `binary` (compressed) data is refused on a terminal.
    pub fn stdout(force: bool, binary: bool) -> Result<Sink<'h>> {
        if binary {
            refuse_terminal_stdout(force)?;
        }
        Ok(Sink::Stdout(stdout_file()?))
    }

    /// An output file: a new regular file, renamed into place when
    /// complete (over what is there only with `force`); with `in_place`
    /// (an output the user named), a device or FIFO there (or behind a
    /// symlink there) is written in place instead.
    pub fn file(
        path: &Path,
        force: bool,
        in_place: bool,
        hooks: &'h dyn Hooks,
    ) -> Result<Sink<'h>> {
        if in_place && is_special(path) {
            return Ok(Sink::Special(open_special(path)?, path.to_path_buf()));
        }
        // A symbolic link named as the output is written through, as zstd
        // and xz write it: the file it points to is replaced, never the
        // link (`-f -o /dev/stdout > file` replaced /dev/stdout).
        let target;
        let path = match std::fs::symlink_metadata(path) {
            Ok(m) if in_place && m.file_type().is_symlink() => match std::fs::canonicalize(path) {
                Ok(t) => {
                    target = t;
                    target.as_path()
                }
                // A link to what has no name (`/proc/self/fd/1` of a
                // deleted file): written in place, never replaced.
                Err(_) if std::fs::metadata(path).is_ok() => {
                    if !force {
                        return Err(Error::Exists {
                            path: path.to_path_buf(),
                        });
                    }
                    let f = open_in_place(path, true)?;
                    return Ok(Sink::Special(f, path.to_path_buf()));
                }
                // A link to nowhere: replaced.
                Err(_) => path,
            },
            _ => path,
        };
        Ok(Sink::File(PendingFile::create(path, force, hooks)?))
    }

    /// One input's part of an output the inputs of a run are all written
    /// into (`out`, open for the run at `path`): written in place, at the
    /// end of what the inputs before it wrote.
    pub fn joined(out: &File, path: &Path) -> Result<Sink<'h>> {
        let f = out.try_clone().map_err(|source| Error::CreateOutput {
            action: "open",
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Sink::Special(f, path.to_path_buf()))
    }

    /// Output that is decoded only to be checked (`-t`, `-l`): /dev/null,
    /// written like any special file.
    pub fn nowhere() -> Result<Sink<'h>> {
        let null = Path::new("/dev/null");
        Ok(Sink::Special(open_special(null)?, null.to_path_buf()))
    }

    /// Give a new output file the mode, owner and times of its input, as
    /// gzip does; other outputs are left as they are.
    pub fn copy_metadata(&self, from: &std::fs::Metadata) {
        if let Sink::File(p) = self {
            copy_metadata(from, &p.file);
        }
    }

    /// Give a new output file the modification time `mtime` (gzip -N's
    /// restored time), after [`Sink::copy_metadata`]; others are left as
    /// they are. A failure is ignored, as for the copied times.
    pub fn set_modified(&self, mtime: std::time::SystemTime) {
        if let Sink::File(p) = self {
            let _ = p.file.set_modified(mtime);
        }
    }

    /// Where the data goes.
    pub fn writer(&mut self) -> &mut File {
        match self {
            Sink::Stdout(f) => f,
            Sink::File(p) => &mut p.file,
            Sink::Special(f, _) => f,
        }
    }

    /// A new regular file, empty until written (holes may be left in it).
    pub fn is_new_file(&self) -> bool {
        matches!(self, Sink::File(_))
    }

    /// The output's name as messages show it.
    pub fn name(&self) -> String {
        match self {
            Sink::Stdout(_) => "(stdout)".to_string(),
            Sink::File(p) => p.path.display().to_string(),
            Sink::Special(_, p) => p.display().to_string(),
        }
    }

    /// [`Sink::commit`], and durable: a file is synced before its rename
    /// and its directory after.
    pub fn commit_durable(self) -> Result<()> {
        match self {
            Sink::File(p) => {
                let dir = p
                    .path
                    .parent()
                    .filter(|d| !d.as_os_str().is_empty())
                    .unwrap_or(Path::new("."))
                    .to_path_buf();
                p.commit_durable()?;
                File::open(&dir)
                    .and_then(|d| d.sync_all())
                    .map_err(|source| Error::Commit {
                        action: "fsync the directory of".into(),
                        path: dir,
                        source,
                    })
            }
            // Standard output, a device or a FIFO: nothing to make durable.
            other => other.commit(),
        }
    }

    /// Make the output final: flush, and for files rename into place.
    pub fn commit(self) -> Result<()> {
        match self {
            Sink::Stdout(mut f) => f.flush().map_err(|source| Error::Write {
                name: "write to stdout".into(),
                source,
            }),
            Sink::File(p) => p.commit(),
            Sink::Special(mut f, p) => f.flush().map_err(|source| Error::Write {
                name: format!("write to {}", p.display()),
                source,
            }),
        }
    }
}

/// Writes a stream into a new, empty regular file, leaving a hole for
/// every whole 4 KiB block of zeros (at a file offset that is a multiple
/// of 4 KiB, within one write), as `zstd -d` and `cp --sparse=auto` do: an unpacked disk
/// image takes only the space of its data, and its zeros cost no writes.
#[derive(Debug, Default)]
pub struct HoleWriter {
    /// File offset of the next byte.
    at: u64,
    /// Bytes of zero blocks passed over since the last write: the file's
    /// offset moves over them (leaving a hole) before the next write, or
    /// in [`HoleWriter::finish`].
    skipped: u64,
}

const HOLE_BLOCK: u64 = 4096;

impl HoleWriter {
    /// Write `buf` from the file's offset on, moving it as a plain write
    /// does (so that a shell's other writers to the same standard output
    /// follow it, and an error leaves it after what was written): runs of
    /// data with `write`, whole zero blocks passed over with `lseek`.
    pub fn write(&mut self, file: &File, buf: &[u8]) -> std::io::Result<()> {
        let mut run: Option<usize> = None;
        let mut i = 0;
        while i < buf.len() {
            let at = self.at + i as u64;
            let end = (i + (HOLE_BLOCK - at % HOLE_BLOCK) as usize).min(buf.len());
            let seg = &buf[i..end];
            if seg.len() as u64 == HOLE_BLOCK && cairn_blockdev::is_zero(seg) {
                if let Some(s) = run.take() {
                    self.put(file, &buf[s..i])?;
                }
                self.skipped += HOLE_BLOCK;
            } else if run.is_none() {
                run = Some(i);
            }
            i = end;
        }
        if let Some(s) = run {
            self.put(file, &buf[s..])?;
        }
        self.at += buf.len() as u64;
        Ok(())
    }

    /// `data` written after the zero blocks passed over.
    fn put(&mut self, mut file: &File, data: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        self.pass_over(file)?;
        file.write_all(data)
    }

    /// Move the offset over the zero blocks passed over; the offset.
    fn pass_over(&mut self, mut file: &File) -> std::io::Result<u64> {
        use std::io::Seek;
        let skip = i64::try_from(std::mem::take(&mut self.skipped))
            .map_err(|_| std::io::Error::other("a hole too long to seek over"))?;
        file.seek(std::io::SeekFrom::Current(skip))
    }

    /// Pass over the zero blocks at the end and give the file its whole
    /// length (it may end in a hole), so that what is written to it next
    /// comes after. Called on failure too: the output stops where the
    /// bytes decoded before it did, as with plain writes.
    pub fn finish(mut self, file: &mut File) -> std::io::Result<()> {
        let end = self.pass_over(file)?;
        if file.metadata()?.len() < end {
            file.set_len(end)?;
        }
        Ok(())
    }

    /// A writer from `file`'s offset on, if it is a regular file not
    /// opened to append, whose offset is at its end or past it (standard
    /// output redirected to a file, `> out` or `{ head; unpack; } > out`);
    /// else `None`. Only there is a hole sure to read as the zeros it
    /// stands for: over the old bytes of a file opened without truncating
    /// (`1<> out`) it would leave them, and with `O_APPEND` every write
    /// lands at the end whatever the offset.
    pub fn at_end_of(file: &mut File) -> Option<HoleWriter> {
        use std::io::Seek;
        use std::os::fd::AsRawFd;
        let meta = file.metadata().ok()?;
        if !meta.file_type().is_file() {
            return None;
        }
        // SAFETY: F_GETFL on a descriptor the File owns reads its flags.
        let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        if flags < 0 || flags & libc::O_APPEND != 0 {
            return None;
        }
        let at = file.stream_position().ok()?;
        (at >= meta.len()).then_some(HoleWriter { at, skipped: 0 })
    }
}

/// The temporary name an output `name` is written under, beside it:
/// `.NAME.cairn-tmp-PID`, within the 255 bytes a name may have (a long
/// `NAME` is cut, and a hash of all of it keeps apart the names it was
/// cut from).
fn temp_name(name: &std::ffi::OsStr) -> std::ffi::OsString {
    use std::hash::{Hash, Hasher};
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    const NAME_MAX: usize = 255;
    let tail = format!(".cairn-tmp-{}", std::process::id());
    let bytes = name.as_bytes();
    let mut tmp = vec![b'.'];
    if 1 + bytes.len() + tail.len() <= NAME_MAX {
        tmp.extend_from_slice(bytes);
    } else {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        bytes.hash(&mut h);
        let mark = format!("~{:016x}", h.finish());
        let keep = NAME_MAX - 1 - tail.len() - mark.len();
        tmp.extend_from_slice(&bytes[..keep.min(bytes.len())]);
        tmp.extend_from_slice(mark.as_bytes());
    }
    tmp.extend_from_slice(tail.as_bytes());
    std::ffi::OsString::from_vec(tmp)
}

/// A file written under a temporary name and renamed when complete; if
/// dropped uncommitted (an error), the temporary file is removed, so a
/// failed run never leaves a partial output behind.
pub struct PendingFile<'h> {
    hooks: &'h dyn Hooks,
    path: PathBuf,
    tmp: PathBuf,
    file: File,
    committed: bool,
}

impl<'h> PendingFile<'h> {
    /// Start writing `path` (refused if it exists, unless `force`); `hooks`
    /// hears of the temporary file while it exists.
    pub fn create(path: &Path, force: bool, hooks: &'h dyn Hooks) -> Result<PendingFile<'h>> {
        if !force && path.symlink_metadata().is_ok() {
            return Err(Error::Exists {
                path: path.to_path_buf(),
            });
        }
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let name = path.file_name().ok_or_else(|| Error::NotAFileName {
            path: path.to_path_buf(),
        })?;
        let tmp = dir.join(temp_name(name));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|source| Error::CreateOutput {
                action: "create",
                path: path.to_path_buf(),
                source,
            })?;
        hooks.temp_created(&tmp);
        Ok(PendingFile {
            hooks,
            path: path.to_path_buf(),
            tmp,
            file,
            committed: false,
        })
    }

    /// The temporary file being written.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Flush to disk, then rename into place.
    pub fn commit_durable(self) -> Result<()> {
        self.file.sync_all().map_err(|source| Error::Commit {
            action: "fsync".into(),
            path: self.tmp.clone(),
            source,
        })?;
        self.commit()
    }

    fn commit(mut self) -> Result<()> {
        self.file.flush().map_err(|source| Error::Write {
            name: self.tmp.display().to_string(),
            source,
        })?;
        std::fs::rename(&self.tmp, &self.path).map_err(|source| Error::Commit {
            action: format!("rename {} to", self.tmp.display()),
            path: self.path.clone(),
            source,
        })?;
        self.committed = true;
        self.hooks.temp_gone();
        Ok(())
    }
}

impl Drop for PendingFile<'_> {
    fn drop(&mut self) {
        if !self.committed {
            self.hooks.temp_gone();
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Copy owner (when root), mode and times of `from` onto the open file
/// `to`, through its descriptor (fchown, fchmod, futimens) and before it
/// is renamed into place: a call by path could follow a symlink swapped in
/// at the destination and change its target instead. Failures are ignored,
/// as gzip ignores them: the data is what the run is for.
fn copy_metadata(from: &std::fs::Metadata, to: &File) {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        // First, since changing the owner clears set-user-ID bits.
        let _ = std::os::unix::fs::fchown(to, Some(from.uid()), Some(from.gid()));
    }
    // Never set-user-ID, set-group-ID or sticky: an input that has them
    // is packed only where a tool packs it (zstd, pigz, bzip2, lz4; xz
    // and cairn with -f), and every such tool leaves them off its output.
    let mode = from.mode() & 0o777;
    let _ = to.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode));
    if let (Ok(atime), Ok(mtime)) = (from.accessed(), from.modified()) {
        let times = std::fs::FileTimes::new()
            .set_accessed(atime)
            .set_modified(mtime);
        let _ = to.set_times(times);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests fail loudly by design.
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn hole_writer_writes_the_bytes_and_leaves_zero_blocks_out() {
        // Data, a long zero run that starts and ends off the 4 KiB grid,
        // data, trailing zeros; written in pieces that cut blocks anywhere.
        let mut bytes: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8 | 1).collect();
        bytes.resize(bytes.len() + 3_000_000, 0);
        bytes.extend((0..5000u32).map(|i| (i % 7) as u8 + 1));
        bytes.resize(bytes.len() + 1_000_001, 0);
        // (A block is left out when it lies within one write, as the
        // decoded units of unpack, 64 KiB to MiBs, always hold many.)
        for piece in [65_537usize, 1 << 20, bytes.len()] {
            let mut f = tempfile::tempfile().unwrap();
            let mut w = HoleWriter::default();
            for chunk in bytes.chunks(piece) {
                w.write(&f, chunk).unwrap();
            }
            w.finish(&mut f).unwrap();
            let meta = f.metadata().unwrap();
            assert_eq!(meta.len(), bytes.len() as u64, "piece {piece}");
            // finish leaves the offset at the end, for what follows.
            let at = std::io::Seek::stream_position(&mut f).unwrap();
            assert_eq!(at, bytes.len() as u64, "piece {piece}: offset");
            std::io::Seek::rewind(&mut f).unwrap();
            let mut back = Vec::new();
            std::io::Read::read_to_end(&mut &f, &mut back).unwrap();
            assert!(back == bytes, "piece {piece}: bytes differ");
            assert!(
                meta.blocks() * 512 < 1 << 20,
                "piece {piece}: {} bytes allocated",
                meta.blocks() * 512
            );
        }
    }

    #[test]
    fn holes_only_where_they_read_as_zeros() {
        use std::io::{Seek, SeekFrom, Write};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        // At the end (`> out`, or after what came before it): holes.
        let mut f = File::create(&path).unwrap();
        f.write_all(b"head").unwrap();
        assert_eq!(HoleWriter::at_end_of(&mut f).map(|w| w.at), Some(4));
        // Past the end: holes too.
        f.seek(SeekFrom::Start(100)).unwrap();
        assert_eq!(HoleWriter::at_end_of(&mut f).map(|w| w.at), Some(100));
        // Over old bytes (`1<> out`): none, they would show through.
        f.seek(SeekFrom::Start(2)).unwrap();
        assert!(HoleWriter::at_end_of(&mut f).is_none());
        // Opened to append (`>> out`): none, writes land at the end.
        let mut a = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        a.seek(SeekFrom::End(0)).unwrap();
        assert!(HoleWriter::at_end_of(&mut a).is_none());
        // Not a regular file.
        let mut null = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .unwrap();
        assert!(HoleWriter::at_end_of(&mut null).is_none());
    }

    #[test]
    fn temporary_names_fit_in_a_name() {
        use std::os::unix::ffi::OsStrExt;
        let short = temp_name(std::ffi::OsStr::new("x.gz"));
        assert_eq!(
            short,
            format!(".x.gz.cairn-tmp-{}", std::process::id()).as_str()
        );
        let a = "a".repeat(250);
        let b = format!("{}b", "a".repeat(249));
        let (ta, tb) = (temp_name(a.as_ref()), temp_name(b.as_ref()));
        assert!(ta.as_bytes().len() <= 255 && tb.as_bytes().len() <= 255);
        assert_ne!(ta, tb, "two long names cut alike");
        // Written and renamed into place under a 250-byte name.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(&a);
        let hooks = crate::NoHooks;
        let p = PendingFile::create(&path, false, &hooks).unwrap();
        p.commit_durable().unwrap();
        assert!(path.is_file());
    }
}
