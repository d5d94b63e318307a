//! Where bytes come from and go to: files, stdin, stdout, and output files
//! that appear only when complete (written under a temporary name in the
//! same directory and renamed on success, removed on failure).

use anyhow::{bail, Context, Result};
use std::fs::File;
use std::io::{IsTerminal, Read, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

/// An input: a named file or standard input.
pub enum Source {
    Stdin,
    File(PathBuf),
}

impl Source {
    pub fn from_arg(p: &Path) -> Source {
        if p.as_os_str() == "-" {
            Source::Stdin
        } else {
            Source::File(p.to_path_buf())
        }
    }

    pub fn name(&self) -> String {
        match self {
            Source::Stdin => "(stdin)".to_string(),
            Source::File(p) => p.display().to_string(),
        }
    }

    /// Open for reading; returns the reader and the size when known.
    pub fn open(&self) -> Result<(File, Option<u64>)> {
        match self {
            Source::Stdin => {
                // A dup of fd 0 as a File: unbuffered, no lock, no LineWriter.
                let fd = std::io::stdin()
                    .as_fd()
                    .try_clone_to_owned()
                    .context("cannot duplicate stdin")?;
                let f = File::from(fd);
                let size = regular_size(&f);
                Ok((f, size))
            }
            Source::File(p) => {
                let f = File::open(p).with_context(|| format!("{}", p.display()))?;
                let meta = f.metadata().with_context(|| format!("{}", p.display()))?;
                if meta.is_dir() {
                    bail!("{}: is a directory", p.display());
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

/// Read until `buf` holds `want` bytes or the input ends.
pub fn read_full(r: &mut impl Read, buf: &mut Vec<u8>, want: usize) -> std::io::Result<usize> {
    buf.clear();
    buf.reserve(want);
    let mut got = 0;
    // `take` + `read_to_end` fills spare capacity without zeroing it first.
    while got < want {
        let n = Read::by_ref(r).take((want - got) as u64).read_to_end(buf)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(got)
}

/// An output: stdout, a regular file committed on success, or a special
/// file (a character device such as /dev/null, a FIFO) written in place.
pub enum Sink {
    Stdout(File),
    File(PendingFile),
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
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))
}

impl Sink {
    pub fn stdout(force: bool, binary: bool) -> Result<Sink> {
        let out = std::io::stdout();
        if binary && !force && out.is_terminal() {
            bail!("compressed data not written to a terminal; use -f to force, or redirect");
        }
        let fd = out
            .as_fd()
            .try_clone_to_owned()
            .context("cannot duplicate stdout")?;
        Ok(Sink::Stdout(File::from(fd)))
    }

    pub fn file(path: &Path, force: bool) -> Result<Sink> {
        if is_special(path) {
            return Ok(Sink::Special(open_special(path)?, path.to_path_buf()));
        }
        Ok(Sink::File(PendingFile::create(path, force)?))
    }

    pub fn writer(&mut self) -> &mut File {
        match self {
            Sink::Stdout(f) => f,
            Sink::File(p) => &mut p.file,
            Sink::Special(f, _) => f,
        }
    }

    pub fn name(&self) -> String {
        match self {
            Sink::Stdout(_) => "(stdout)".to_string(),
            Sink::File(p) => p.path.display().to_string(),
            Sink::Special(_, p) => p.display().to_string(),
        }
    }

    /// Make the output final: flush, and for files rename into place.
    pub fn commit(self) -> Result<()> {
        match self {
            Sink::Stdout(mut f) => f.flush().context("write to stdout"),
            Sink::File(p) => p.commit(),
            Sink::Special(mut f, p) => f
                .flush()
                .with_context(|| format!("write to {}", p.display())),
        }
    }
}

/// A file written under a temporary name and renamed when complete; if
/// dropped uncommitted (an error), the temporary file is removed, so a
/// failed run never leaves a partial output behind.
pub struct PendingFile {
    path: PathBuf,
    tmp: PathBuf,
    file: File,
    committed: bool,
}

impl PendingFile {
    pub fn create(path: &Path, force: bool) -> Result<PendingFile> {
        if !force && path.symlink_metadata().is_ok() {
            bail!("{} already exists; use -f to overwrite", path.display());
        }
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let name = path
            .file_name()
            .with_context(|| format!("{}: not a file name", path.display()))?;
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".cairn-tmp-{}", std::process::id()));
        let tmp = dir.join(tmp_name);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .with_context(|| format!("cannot create {}", path.display()))?;
        crate::signals::register(&tmp);
        Ok(PendingFile {
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
        self.file
            .sync_all()
            .with_context(|| format!("fsync {}", self.tmp.display()))?;
        self.commit()
    }

    fn commit(mut self) -> Result<()> {
        self.file
            .flush()
            .with_context(|| format!("{}", self.tmp.display()))?;
        std::fs::rename(&self.tmp, &self.path)
            .with_context(|| format!("rename {} to {}", self.tmp.display(), self.path.display()))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for PendingFile {
    fn drop(&mut self) {
        if !self.committed {
            crate::signals::unregister();
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Copy permissions and times of `from` onto `to`, as gzip does.
pub fn copy_metadata(from: &Path, to: &Path) {
    if let Ok(meta) = std::fs::metadata(from) {
        let _ = std::fs::set_permissions(to, meta.permissions());
        if let (Ok(atime), Ok(mtime)) = (meta.accessed(), meta.modified()) {
            if let Ok(f) = File::options().write(true).open(to) {
                let times = std::fs::FileTimes::new()
                    .set_accessed(atime)
                    .set_modified(mtime);
                let _ = f.set_times(times);
            }
        }
    }
}
