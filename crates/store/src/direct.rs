//! A pack written past the page cache (its O_DIRECT primitives are
//! `cairn_blockdev`'s, which restore and the CLI use too).
//!
//! Packs and restored images are written once and fsync'd, so the page
//! cache would only add a copy per byte and a backlog of dirty pages. A
//! second handle with `O_DIRECT` takes the whole, aligned blocks; what is
//! not a whole block goes through the ordinary handle.

use crate::backend::ObjectWriter;
use crate::error::{IoContext, Result};
use cairn_blockdev::{reopen_direct, write_blocks_at, AlignedBuf, DIRECT_ALIGN};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// A new file written once, front to back, past the page cache where the
/// filesystem allows it (a pack in a local directory).
pub(crate) struct FileWriter {
    file: File,
    path: PathBuf,
    direct: Option<Direct>,
}

/// Bytes gathered before each `O_DIRECT` write.
const DIRECT_STAGE: usize = 4 << 20;

/// A second handle on the file, opened with `O_DIRECT`, and the aligned
/// buffer that cuts appends into whole blocks. The last, partial block
/// goes through the buffered handle when the file is finished.
struct Direct {
    file: File,
    stage: AlignedBuf,
    /// Bytes in `stage`, which belong at file offset `on_disk`.
    filled: usize,
    /// Bytes written through `file` (a multiple of [`DIRECT_ALIGN`]).
    on_disk: u64,
}

impl Direct {
    /// A second handle on `file` with `O_DIRECT`; `None` where refused.
    fn open(file: &File) -> Option<Direct> {
        Some(Direct {
            file: reopen_direct(file)?,
            stage: AlignedBuf::new(DIRECT_STAGE, DIRECT_ALIGN),
            filled: 0,
            on_disk: 0,
        })
    }

    /// Stage `bytes` and write every whole block at once: what a killed
    /// process leaves behind is then what the page cache would have kept,
    /// less the last partial block (the next backup salvages records up to
    /// there).
    fn append(&mut self, path: &Path, buffered: &File, mut bytes: &[u8]) -> Result<()> {
        while !bytes.is_empty() {
            let k = bytes.len().min(DIRECT_STAGE - self.filled);
            self.stage.as_mut_slice()[self.filled..self.filled + k].copy_from_slice(&bytes[..k]);
            self.filled += k;
            bytes = &bytes[k..];
            self.write_blocks(path, buffered)?;
        }
        Ok(())
    }

    /// Write the whole blocks in the stage; the partial block that is left
    /// moves to the front.
    fn write_blocks(&mut self, path: &Path, buffered: &File) -> Result<()> {
        let whole = self.filled - self.filled % DIRECT_ALIGN;
        if whole == 0 {
            return Ok(());
        }
        write_blocks_at(
            &self.file,
            buffered,
            &self.stage.as_slice()[..whole],
            self.on_disk,
        )
        .ctx(path, "write")?;
        self.on_disk += whole as u64;
        self.stage.as_mut_slice().copy_within(whole..self.filled, 0);
        self.filled -= whole;
        Ok(())
    }

    /// Write everything staged: whole blocks directly, the rest through
    /// `buffered`, a handle without `O_DIRECT`.
    fn flush(&mut self, path: &Path, buffered: &File) -> Result<()> {
        self.write_blocks(path, buffered)?;
        buffered
            .write_all_at(&self.stage.as_slice()[..self.filled], self.on_disk)
            .ctx(path, "write")?;
        self.on_disk += self.filled as u64;
        self.filled = 0;
        Ok(())
    }
}

impl FileWriter {
    /// Create `path`, which must not exist (its directory must).
    pub(crate) fn create(path: &Path) -> Result<FileWriter> {
        use std::os::unix::fs::OpenOptionsExt;
        // Private, as every repository file (see `LocalDir`).
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .ctx(path, "create")?;
        let direct = Direct::open(&file);
        Ok(FileWriter {
            file,
            path: path.to_path_buf(),
            direct,
        })
    }

    /// Whether the file is written with `O_DIRECT` (the filesystem allows
    /// it).
    #[cfg(test)]
    fn is_direct(&self) -> bool {
        self.direct.is_some()
    }
}

impl ObjectWriter for FileWriter {
    fn append(&mut self, bytes: &[u8]) -> Result<()> {
        match &mut self.direct {
            Some(d) => d.append(&self.path, &self.file, bytes),
            None => self.file.write_all(bytes).ctx(&self.path, "write"),
        }
    }

    /// Make the data and the name durable, and close the file.
    fn finish(mut self: Box<Self>) -> Result<()> {
        if let Some(d) = &mut self.direct {
            d.flush(&self.path, &self.file)?;
        }
        self.file.sync_all().ctx(&self.path, "fsync")?;
        if let Some(dir) = self.path.parent() {
            crate::meta::sync_dir(dir)?;
        }
        Ok(())
    }

    fn discard(mut self: Box<Self>) {
        self.direct = None;
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for FileWriter {
    /// A file abandoned unfinished (an error elsewhere stopped the backup)
    /// still gets its staged bytes written, as the page cache would have
    /// had them: the next backup salvages what is there.
    fn drop(&mut self) {
        if let Some(d) = &mut self.direct {
            let _ = d.flush(&self.path, &self.file);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    /// Appends of odd sizes across the staging buffer's edge, then
    /// finished, abandoned or discarded: the file holds exactly what was
    /// appended.
    #[test]
    fn files_hold_exactly_what_was_appended_direct_or_not() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..3 * DIRECT_STAGE as u32 + 12345)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let sizes = [
            1,
            4095,
            4096,
            4097,
            DIRECT_STAGE - 3,
            77,
            DIRECT_STAGE + 1,
            9,
        ];
        let path = dir.path().join("a");
        let mut w = Box::new(FileWriter::create(&path).unwrap());
        if std::env::var_os("CI").is_some() {
            // The CI machine's /tmp is ext4, as here: the direct path must run.
            assert!(
                w.is_direct(),
                "O_DIRECT refused in {}",
                dir.path().display()
            );
        }
        let mut at = 0;
        for &n in sizes.iter().cycle() {
            let n = n.min(data.len() - at);
            if n == 0 {
                break;
            }
            w.append(&data[at..at + n]).unwrap();
            at += n;
        }
        w.finish().unwrap();
        assert!(
            std::fs::read(&path).unwrap() == data,
            "finished file differs"
        );
        assert!(
            FileWriter::create(&path).is_err(),
            "an existing file is never replaced"
        );

        // Abandoned without finishing: what was appended still reaches the file.
        let path = dir.path().join("b");
        let mut w = FileWriter::create(&path).unwrap();
        w.append(&data[..DIRECT_STAGE + 100]).unwrap();
        drop(w);
        assert!(std::fs::read(&path).unwrap() == data[..DIRECT_STAGE + 100]);

        // Discarded: gone.
        let path = dir.path().join("c");
        let mut w = Box::new(FileWriter::create(&path).unwrap());
        w.append(&data[..10]).unwrap();
        w.discard();
        assert!(!path.exists());
    }
}
