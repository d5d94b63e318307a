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
//! of the backing's identity (a file's device and inode; a block device's
//! backing file, dm uuid or WWID, see `cache_cmd::file_owner`). See
//! docs/format/wbcache.md, "Bindings".
//!
//! Plain use of a file or device (`serve --file` without `cache=`,
//! `backup`) and use with another cache are refused while the bound cache
//! holds dirty blocks, and while it is not where it was (moved, deleted,
//! replaced by another cache or a blank file: device names change after a
//! reboot, so a missing cache is no proof its blocks are gone). Only a
//! detach, or `cairn cache unbind` once the cache holds nothing for the
//! backing or is lost for good, removes a binding.

use anyhow::{bail, Context, Result};
use cairn_wbcache::Owner;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The version of an entry.
const VERSION: u32 = 1;

/// One binding: a backing and its cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    version: u32,
    /// The backing's identity: the base of its owner key
    /// ([`Owner::base_key`]; a loop device's is its file's).
    key: String,
    /// The backing's path when it was bound (for messages).
    backing: PathBuf,
    /// The cache's path.
    cache: PathBuf,
    /// The cache's id (hex), which a cache put in its place lacks.
    cache_id: String,
    /// A regular file's birth time (`secs.nanos`): a file made later that
    /// was given the inode of a deleted one is not it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    born: Option<String>,
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

/// When the regular file at `path` was made, where the filesystem says.
fn born(path: &Path) -> Option<String> {
    let m = std::fs::metadata(path).ok().filter(|m| m.is_file())?;
    let t = m
        .created()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    Some(format!("{}.{:09}", t.as_secs(), t.subsec_nanos()))
}

/// The entry of `key` at `at`, unless it is of a file that is gone (its
/// inode now another file's, `path`): that one is removed.
fn entry_of(at: &Path, key: &str, path: &Path) -> Result<Option<Entry>> {
    let now = born(path);
    match read(at)? {
        Some(e) if e.key != key => Ok(None),
        Some(e) if e.born.is_some() && now.is_some() && e.born != now => {
            let _ = std::fs::remove_file(at);
            Ok(None)
        }
        other => Ok(other),
    }
}

fn hex(id: &[u8; 16]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// Record that the cache at `cache` (id `cache_id`) is in front of
/// `backing` (`owner`). Failing to record it is said, not fatal: the cache
/// works, only the refusal of plain use is lost.
pub(crate) fn bind(owner: &Owner, backing: &Path, cache: &Path, cache_id: [u8; 16]) {
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
        key: owner.base_key().to_string(),
        backing: abs(backing),
        cache: abs(cache),
        cache_id: hex(&cache_id),
        born: born(backing),
        check: 0,
    };
    e.check = e.sum();
    let path = entry_path(&dir, &e.key);
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

/// Forget the binding of the backing `owner` (its cache was detached).
pub(crate) fn unbind(owner: &Owner) {
    if let Some(dir) = dir() {
        let _ = std::fs::remove_file(entry_path(&dir, owner.base_key()));
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

/// The bound cache, as found now.
enum Found {
    /// Nothing at its path.
    Gone,
    /// Another cache, or a blank file, at its path.
    Replaced(String),
    /// It cannot be read (damaged, in use): the error.
    Unreadable(anyhow::Error),
    /// It holds this many blocks not yet written back.
    Dirty(u64),
    /// It holds nothing for the backing.
    Clean,
}

fn find(e: &Entry, base_key: &str, size: u64) -> Found {
    if !e.cache.exists() {
        return Found::Gone;
    }
    let i = match cairn_wbcache::WbCache::inspect_path(&e.cache, size) {
        Ok(i) => i,
        Err(cairn_wbcache::WbError::Blank(_)) => return Found::Replaced("a blank file".into()),
        Err(err) => return Found::Unreadable(err.into()),
    };
    if hex(&i.cache_id) != e.cache_id {
        return Found::Replaced(format!("another cache (id {})", hex(&i.cache_id)));
    }
    // Opened for another backing since: that needs it clean first.
    if i.owner.as_ref().is_some_and(|o| o.base_key() != base_key) {
        return Found::Clean;
    }
    if i.dirty_blocks > 0 || i.dirty_segments > 0 || i.plog_records > 0 {
        Found::Dirty(i.dirty_blocks)
    } else {
        Found::Clean
    }
}

/// Refuse to use the file or device at `path` (`owner`, `size` bytes)
/// without its cache, or with a cache other than `with`, while its bound
/// cache holds writes not yet written back or is not where it was.
pub(crate) fn check(path: &Path, owner: &Owner, size: u64, with: Option<&Path>) -> Result<()> {
    let Some(dir) = dir() else {
        return Ok(());
    };
    let key = owner.base_key();
    let at = entry_path(&dir, key);
    let e = match entry_of(&at, key, path) {
        Ok(Some(e)) => e,
        Ok(None) => return Ok(()),
        // With a cache, the cache's own owner block guards it; the record
        // is written anew once it is open.
        Err(err) if with.is_some() => {
            errln!("cairn: warning: {err}; it is written anew");
            return Ok(());
        }
        Err(err) => bail!(
            "{}: {err}: use it with its write-back cache (cache=CACHE), or if it has none, \
             `cairn cache unbind --backing {}`",
            path.display(),
            path.display()
        ),
    };
    let same = with.is_some_and(|c| std::fs::canonicalize(c).is_ok_and(|c| c == e.cache));
    let (p, c) = (path.display(), e.cache.display());
    let unbind = format!("`cairn cache unbind --backing {p}`");
    match find(&e, key, size) {
        Found::Clean => Ok(()),
        Found::Dirty(_) if same => Ok(()),
        Found::Dirty(n) => bail!(
            "{p}: the write-back cache {c} holds {n} block(s) written to it and not yet written \
             back: use it with cache={c} (serve), or write them back first with `cairn cache \
             drain --cache {c} --backing {p}`"
        ),
        Found::Gone => bail!(
            "{p} is bound to the write-back cache {c}, which is not there (moved, deleted, or a \
             device not yet attached?): put it back, or if its blocks are lost for good, {unbind}"
        ),
        Found::Replaced(what) => bail!(
            "{p} is bound to the write-back cache {c} (id {}), but {c} is {what} now: put that \
             cache back, or if its blocks are lost for good, {unbind}",
            e.cache_id
        ),
        Found::Unreadable(err) => Err(err.context(format!(
            "{p} is bound to the write-back cache {c}, which cannot be read (see `cairn cache \
             status --cache {c} --backing {p}`)"
        ))),
    }
}

/// `cairn cache unbind --backing PATH`: forget PATH's binding, unless its
/// cache is there and holds PATH's blocks. What was done, for the user.
pub(crate) fn release(path: &Path, owner: &Owner, size: u64) -> Result<String> {
    let Some(dir) = dir() else {
        bail!("no state directory (set CAIRN_STATE_DIR or HOME): no binding to remove");
    };
    let key = owner.base_key();
    let at = entry_path(&dir, key);
    let (p, what) = match entry_of(&at, key, path) {
        Ok(None) => return Ok(format!("{} is bound to no cache", path.display())),
        Err(err) => (path.display(), format!("a damaged record ({err})")),
        Ok(Some(e)) => {
            if let Found::Dirty(n) = find(&e, key, size) {
                bail!(
                    "{}: the write-back cache {} holds {n} block(s) for it: `cairn cache drain` \
                     or `detach` it first (or delete it, if those writes are to be lost)",
                    path.display(),
                    e.cache.display()
                );
            }
            (path.display(), format!("the cache {}", e.cache.display()))
        }
    };
    std::fs::remove_file(&at).with_context(|| at.display().to_string())?;
    Ok(format!("{p}: no longer bound to {what}"))
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
            cache_id: "00".repeat(16),
            born: None,
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
