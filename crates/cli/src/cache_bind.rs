//! Which write-back cache a file or device is bound to, so that it is not
//! used without it while the cache holds writes not yet written back.
//!
//! A cache records what it is in front of (its owner block), but the
//! backing file knows nothing of its cache: after a server with dirty
//! blocks was killed, `serve --file F` without the cache served the old
//! blocks, and the cache, once opened again, wrote its blocks over what
//! had been written to F meanwhile. Repository images keep the binding in
//! their overlay; a file or device has it here: one entry per backing, in
//! `wbcache/` under the state directory (`$CAIRN_STATE_DIR`, else
//! `$XDG_STATE_HOME/cairn`, else `~/.local/state/cairn`), named by a hash
//! of the backing's identity (device and inode, or device number). See
//! docs/format/wbcache.md, "Bindings".
//!
//! Plain use of a file or device (`serve --file` without `cache=`,
//! `backup`) and use with another cache are refused while the bound cache
//! holds dirty blocks; an entry whose cache is gone, formatted for another
//! backing, or clean is no obstacle (the first two are removed).

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The version of an entry.
const VERSION: u32 = 1;

/// One binding: a backing and its cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    version: u32,
    /// The backing's identity (`file:DEV:INO`, `device:RDEV`), as the
    /// cache's owner block has it.
    key: String,
    /// The backing's path when it was bound (for messages).
    backing: PathBuf,
    /// The cache's path.
    cache: PathBuf,
    /// CRC-32C of this entry's JSON with `check` 0.
    check: u32,
}

impl Entry {
    fn sum(&self) -> u32 {
        let plain = Entry {
            check: 0,
            ..self.clone()
        };
        crc32c::crc32c(&serde_json::to_vec(&plain).unwrap_or_default())
    }
}

/// The directory of the entries; `None` when no state directory is set.
fn dir() -> Option<PathBuf> {
    Some(cairn_store::state_root()?.join("wbcache"))
}

fn entry_path(dir: &Path, key: &str) -> PathBuf {
    let h = blake3::hash(key.as_bytes()).to_hex();
    dir.join(format!("{}.json", &h[..32]))
}

/// Record that the cache at `cache` is in front of `backing` (whose
/// identity is `key`). Failing to record it is said, not fatal: the cache
/// works, only the refusal of plain use is lost.
pub(crate) fn bind(key: &str, backing: &Path, cache: &Path) {
    let Some(dir) = dir() else {
        errln!(
            "cairn: warning: no state directory (set CAIRN_STATE_DIR or HOME): {} is not \
             recorded as bound to the cache {}",
            backing.display(),
            cache.display()
        );
        return;
    };
    let abs = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let mut e = Entry {
        version: VERSION,
        key: key.to_string(),
        backing: abs(backing),
        cache: abs(cache),
        check: 0,
    };
    e.check = e.sum();
    let path = entry_path(&dir, key);
    if read(&path).ok().flatten().as_ref() == Some(&e) {
        return;
    }
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(&dir)?;
        let tmp = path.with_extension("tmp");
        let body = serde_json::to_vec(&e).map_err(std::io::Error::other)?;
        let f = std::fs::File::create(&tmp)?;
        std::io::Write::write_all(&mut &f, &body)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(&dir)?.sync_all()
    };
    if let Err(err) = write() {
        errln!(
            "cairn: warning: {}: {err}: {} is not recorded as bound to the cache {}",
            path.display(),
            backing.display(),
            cache.display()
        );
    }
}

/// Forget the binding of the backing with identity `key` (its cache was
/// detached).
pub(crate) fn unbind(key: &str) {
    if let Some(dir) = dir() {
        let _ = std::fs::remove_file(entry_path(&dir, key));
    }
}

/// The entry at `path`: `None` when there is none; an error when it is
/// damaged.
fn read(path: &Path) -> Result<Option<Entry>> {
    let body = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| path.display().to_string()),
    };
    let e: Entry = serde_json::from_slice(&body)
        .with_context(|| format!("{}: not a cache binding", path.display()))?;
    if e.version != VERSION {
        bail!(
            "{}: cache binding version {} (this cairn reads {VERSION})",
            path.display(),
            e.version
        );
    }
    if e.check != e.sum() {
        bail!("{}: cache binding damaged (checksum)", path.display());
    }
    Ok(Some(e))
}

/// Refuse to use the file or device at `path` (identity `key`, `size`
/// bytes) without its cache, or with a cache other than `with`, while its
/// bound cache holds writes not yet written back.
pub(crate) fn check(path: &Path, key: &str, size: u64, with: Option<&Path>) -> Result<()> {
    let Some(dir) = dir() else {
        return Ok(());
    };
    let at = entry_path(&dir, key);
    let Some(e) = read(&at)? else {
        return Ok(());
    };
    if e.key != key {
        return Ok(());
    }
    let same = |c: &Path| std::fs::canonicalize(c).is_ok_and(|c| c == e.cache);
    if with.is_some_and(same) {
        return Ok(());
    }
    let stale = || {
        let _ = std::fs::remove_file(&at);
        Ok(())
    };
    if !e.cache.exists() {
        return stale();
    }
    let i = cairn_wbcache::WbCache::inspect_path(&e.cache, size).with_context(|| {
        format!(
            "{} is bound to the write-back cache {}, which cannot be read (see `cairn cache \
             status --cache {} --backing {}`)",
            path.display(),
            e.cache.display(),
            e.cache.display(),
            path.display()
        )
    })?;
    if i.owner.as_ref().is_some_and(|o| o.key != key) {
        // Formatted or opened for another backing since.
        return stale();
    }
    let dirty = i.dirty_blocks > 0 || i.dirty_segments > 0 || i.plog_records > 0;
    if !dirty {
        return Ok(());
    }
    bail!(
        "{}: the write-back cache {} holds {} block(s) written to it and not yet written back: \
         use it with cache={} (serve), or write them back first with `cairn cache drain --cache \
         {} --backing {}`",
        path.display(),
        e.cache.display(),
        i.dirty_blocks,
        e.cache.display(),
        e.cache.display(),
        path.display()
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // Tests fail loudly by design.
    use super::*;

    /// An entry reads back as written; one with a byte changed, another
    /// version or no JSON is refused, named; none is `None`.
    #[test]
    fn entries_read_back_and_damage_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.json");
        assert!(read(&path).unwrap().is_none());
        let mut e = Entry {
            version: VERSION,
            key: "file:1:2".into(),
            backing: "/b".into(),
            cache: "/c".into(),
            check: 0,
        };
        e.check = e.sum();
        std::fs::write(&path, serde_json::to_vec(&e).unwrap()).unwrap();
        assert_eq!(read(&path).unwrap(), Some(e.clone()));
        let changed = Entry {
            cache: "/d".into(),
            ..e.clone()
        };
        std::fs::write(&path, serde_json::to_vec(&changed).unwrap()).unwrap();
        let err = read(&path).unwrap_err().to_string();
        assert!(err.contains("damaged") && err.contains("e.json"), "{err}");
        let mut newer = Entry {
            version: VERSION + 1,
            ..e
        };
        newer.check = newer.sum();
        std::fs::write(&path, serde_json::to_vec(&newer).unwrap()).unwrap();
        assert!(read(&path).unwrap_err().to_string().contains("version"));
        std::fs::write(&path, b"{").unwrap();
        assert!(read(&path).is_err());
    }
}
