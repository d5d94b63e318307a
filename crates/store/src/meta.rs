//! The envelope around every metadata file (config, target marker, index,
//! manifest, trash list), and crash-safe replacement of files.
//!
//! ```text
//! offset  size  field
//! 0       8     magic "CAIRNMET"
//! 8       4     kind (u32 LE): 1 config, 2 target marker, 3 index, 4 manifest, 5 trash list,
//!               6 key, 7 removal record, 8 seen snapshots (local); plus SEALED (0x100) when the body is encrypted
//! 12      4     format version of the body (u32 LE)
//! 16      8     body length N (u64 LE)
//! 24      N     body
//! 24+N    32    BLAKE3-256 of bytes 0 .. 24+N
//! ```
//!
//! In an encrypted repository the bodies of index files, manifests and
//! trash lists are *sealed*: the kind has [`SEALED`] added, and the body is
//! `nonce (12) || ciphertext || tag (16)` of the plain body under the
//! repository's key ([`crate::crypt`]), with bytes 0..24 (magic, kind,
//! version, body length) as associated data. The BLAKE3 trailer stays, so
//! damage is told apart from a wrong key.
//!
//! A file is written whole to a temporary name in the same directory,
//! fsync'd, renamed over its final name, and the directory fsync'd: after a
//! crash the name holds either the old file or the new one, never a mix.

use crate::crypt::{Crypt, SEAL_OVERHEAD};
use crate::error::{IoContext, Result, StoreError};
use std::borrow::Cow;
use std::fs::{self, File};
use std::path::Path;

const MAGIC: &[u8; 8] = b"CAIRNMET";
const HEADER: usize = 24;
const TRAILER: usize = 32;

/// What a metadata file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Kind {
    /// `REPO/config`.
    Config = 1,
    /// `TARGET/cairn-target`.
    TargetMarker = 2,
    /// `REPO/index/*.idx`.
    Index = 3,
    /// `REPO/snapshots/NAME/*.snap`.
    Manifest = 4,
    /// `REPO/trash/*` (and `REPO/garbage` of version 1).
    Garbage = 5,
    /// `REPO/keys/*`.
    Key = 6,
    /// `REPO/removed/DIR/*.rm` (`seen.rs`).
    Removal = 7,
    /// The snapshots seen, kept on the machine, not in a repository
    /// (`seen.rs`).
    Seen = 8,
}

/// Added to the kind of a file whose body is encrypted.
pub const SEALED: u32 = 0x100;

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Config => "config",
            Kind::TargetMarker => "target marker",
            Kind::Index => "index",
            Kind::Manifest => "manifest",
            Kind::Garbage => "trash list",
            Kind::Key => "key",
            Kind::Removal => "removal record",
            Kind::Seen => "record of seen snapshots",
        }
    }
}

/// Wrap `body` in the envelope.
pub fn seal(kind: Kind, version: u32, body: &[u8]) -> Vec<u8> {
    let mut out = header(kind as u32, version, body.len());
    out.extend_from_slice(body);
    trail(out)
}

fn header(kind: u32, version: u32, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + len + TRAILER);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(len as u64).to_le_bytes());
    out
}

fn trail(mut out: Vec<u8>) -> Vec<u8> {
    let sum = blake3::hash(&out);
    out.extend_from_slice(sum.as_bytes());
    out
}

/// Wrap `body` in the envelope, encrypted under `crypt` if there is one.
pub fn seal_with(kind: Kind, version: u32, body: &[u8], crypt: Option<&Crypt>) -> Result<Vec<u8>> {
    let Some(crypt) = crypt else {
        return Ok(seal(kind, version, body));
    };
    let mut out = header(kind as u32 | SEALED, version, body.len() + SEAL_OVERHEAD);
    let aad: [u8; HEADER] = out[..HEADER].try_into().unwrap_or([0; HEADER]);
    crypt.seal_to(&aad, body, &mut out)?;
    Ok(trail(out))
}

/// [`open`] in a repository that may be encrypted: with `crypt`, the body
/// must be sealed and is decrypted; without, it must be plain.
pub fn open_with<'a>(
    path: &Path,
    data: &'a [u8],
    kind: Kind,
    supported: u32,
    crypt: Option<&Crypt>,
) -> Result<(u32, Cow<'a, [u8]>)> {
    let (found, version, body) = open_any(path, data, kind)?;
    // Authenticated before its version is believed: in an encrypted
    // repository a planted file claiming a newer version (whose checksum
    // anyone can make) would stop every writer with "upgrade cairn".
    match (found & SEALED != 0, crypt) {
        (false, None) => Ok((
            check_version(path, version, supported)?,
            Cow::Borrowed(body),
        )),
        (true, Some(c)) => {
            let mut plain = Vec::new();
            if !c.open_to(&data[..HEADER], body, &mut plain) {
                return Err(StoreError::corrupt(
                    path,
                    HEADER as u64,
                    format!(
                        "{} does not decrypt with this repository's key (forged, or of another repository)",
                        kind.name()
                    ),
                ));
            }
            Ok((check_version(path, version, supported)?, Cow::Owned(plain)))
        }
        (true, None) => Err(StoreError::corrupt(
            path,
            8,
            format!("{} is encrypted in a repository that is not", kind.name()),
        )),
        (false, Some(_)) => Err(StoreError::corrupt(
            path,
            8,
            format!(
                "{} is not encrypted in an encrypted repository (planted?)",
                kind.name()
            ),
        )),
    }
}

/// Whether `data` is a whole sealed (encrypted) metadata file of `kind`:
/// its envelope sound (magic, kind, length, checksum), the sealed bit set.
/// A damaged plain file (one bit of its kind flipped) is not one.
pub fn is_sealed(path: &Path, data: &[u8], kind: Kind) -> bool {
    // The kind word first: a plain file (every one, in a plain
    // repository's index load) is not hashed a second time here.
    let sealed_kind = (kind as u32 | SEALED).to_le_bytes();
    data.get(8..12) == Some(&sealed_kind[..])
        && matches!(open_any(path, data, kind), Ok((found, _, _)) if found == kind as u32 | SEALED)
}

/// Check the envelope of `data` (read from `path`) and return the body's
/// version and the body. Versions above `supported` are refused.
pub fn open<'a>(
    path: &Path,
    data: &'a [u8],
    kind: Kind,
    supported: u32,
) -> Result<(u32, &'a [u8])> {
    let (found, version, body) = open_any(path, data, kind)?;
    if found & SEALED != 0 {
        return Err(StoreError::corrupt(
            path,
            8,
            format!("{} is encrypted where a plain one belongs", kind.name()),
        ));
    }
    Ok((check_version(path, version, supported)?, body))
}

/// `version`, unless it is above `supported`.
fn check_version(path: &Path, version: u32, supported: u32) -> Result<u32> {
    if version > supported {
        return Err(StoreError::NewerVersion {
            path: path.to_path_buf(),
            found: version,
            supported,
        });
    }
    Ok(version)
}

/// Check the envelope, sealed or not: (kind as found, version, body). The
/// version is not checked: callers do, once they trust the file.
fn open_any<'a>(path: &Path, data: &'a [u8], kind: Kind) -> Result<(u32, u32, &'a [u8])> {
    if data.len() < HEADER + TRAILER {
        return Err(StoreError::corrupt(
            path,
            data.len() as u64,
            format!("{} file is truncated ({} bytes)", kind.name(), data.len()),
        ));
    }
    if &data[..8] != MAGIC {
        return Err(StoreError::corrupt(
            path,
            0,
            "bad magic (not a cairn metadata file)",
        ));
    }
    let mut word = [0u8; 4];
    word.copy_from_slice(&data[8..12]);
    let found_kind = u32::from_le_bytes(word);
    word.copy_from_slice(&data[12..16]);
    let version = u32::from_le_bytes(word);
    let mut dword = [0u8; 8];
    dword.copy_from_slice(&data[16..24]);
    let len = u64::from_le_bytes(dword);
    if found_kind & !SEALED != kind as u32 {
        return Err(StoreError::corrupt(
            path,
            8,
            format!("holds kind {found_kind}, expected a {} file", kind.name()),
        ));
    }
    let expect = (data.len() - HEADER - TRAILER) as u64;
    if len != expect {
        return Err(StoreError::corrupt(
            path,
            16,
            format!("body length {len} does not match the file ({expect} bytes of body)"),
        ));
    }
    let end = data.len() - TRAILER;
    if blake3::hash(&data[..end]).as_bytes() != &data[end..] {
        return Err(StoreError::corrupt(
            path,
            end as u64,
            format!("{} checksum mismatch (the file is damaged)", kind.name()),
        ));
    }
    Ok((found_kind, version, &data[HEADER..end]))
}

/// Read `path` and check its envelope; returns (version, body).
pub fn read(path: &Path, kind: Kind, supported: u32) -> Result<(u32, Vec<u8>)> {
    let data = fs::read(path).ctx(path, "read")?;
    let (version, body) = open(path, &data, kind, supported)?;
    Ok((version, body.to_vec()))
}

/// fsync a directory, so that names created or removed in it are durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .ctx(dir, "fsync directory")
}

/// Make directory `dir` and the missing ones above it, private to the
/// user (0700: they may hold images and keys), and the new names durable
/// (each new directory's parent synced, as a file's is after a rename).
pub fn create_dirs(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut missing = vec![dir];
    while let Some(up) = missing.last().and_then(|d| d.parent()) {
        if up.as_os_str().is_empty() || up.is_dir() {
            break;
        }
        missing.push(up);
    }
    {
        use std::os::unix::fs::DirBuilderExt;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .ctx(dir, "create directory")?;
    }
    for d in missing {
        match d.parent() {
            Some(up) if !up.as_os_str().is_empty() => sync_dir(up)?,
            _ => sync_dir(Path::new("."))?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_directories_are_made_private() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("a/b/c");
        create_dirs(&d).unwrap();
        create_dirs(&d).unwrap();
        for p in [t.path().join("a"), t.path().join("a/b"), d] {
            let mode = fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", p.display());
        }
        // A file in the way is an error naming the path.
        let f = t.path().join("file");
        fs::write(&f, b"x").unwrap();
        let e = create_dirs(&f.join("sub")).unwrap_err().to_string();
        assert!(e.contains("file/sub") || e.contains("file"), "{e}");
    }

    #[test]
    fn seal_open_round_trip() {
        let p = Path::new("x");
        let sealed = seal(Kind::Index, 1, b"hello");
        let (v, body) = open(p, &sealed, Kind::Index, 1).unwrap();
        assert_eq!((v, body), (1, &b"hello"[..]));
    }

    #[test]
    fn every_damage_is_caught() {
        let p = Path::new("x");
        let sealed = seal(Kind::Manifest, 1, b"some body bytes");
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 0x40;
            assert!(open(p, &bad, Kind::Manifest, 1).is_err(), "flip at {i}");
        }
        for n in 0..sealed.len() {
            assert!(
                open(p, &sealed[..n], Kind::Manifest, 1).is_err(),
                "cut at {n}"
            );
        }
        assert!(matches!(
            open(p, &sealed, Kind::Index, 1),
            Err(StoreError::Corrupt { .. })
        ));
        let newer = seal(Kind::Manifest, 7, b"");
        assert!(matches!(
            open(p, &newer, Kind::Manifest, 1),
            Err(StoreError::NewerVersion { found: 7, .. })
        ));
    }

    #[test]
    fn sealed_bodies_round_trip_and_refuse_the_wrong_key_or_mode() {
        let p = Path::new("x");
        let c = Crypt::generate().unwrap();
        let sealed = seal_with(Kind::Index, 1, b"secret body", Some(&c)).unwrap();
        assert!(!sealed.windows(6).any(|w| w == b"secret"));
        let (v, body) = open_with(p, &sealed, Kind::Index, 1, Some(&c)).unwrap();
        assert_eq!((v, &body[..]), (1, &b"secret body"[..]));
        let other = Crypt::generate().unwrap();
        assert!(open_with(p, &sealed, Kind::Index, 1, Some(&other)).is_err());
        assert!(open_with(p, &sealed, Kind::Index, 1, None).is_err());
        assert!(open(p, &sealed, Kind::Index, 1).is_err());
        let plain = seal(Kind::Index, 1, b"secret body");
        assert!(open_with(p, &plain, Kind::Index, 1, Some(&c)).is_err());
        assert!(open_with(p, &sealed, Kind::Manifest, 1, Some(&c)).is_err());
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 0x40;
            assert!(
                open_with(p, &bad, Kind::Index, 1, Some(&c)).is_err(),
                "flip at {i}"
            );
        }
        // A planted file claiming a newer version is damage, not a reason
        // to upgrade, until it is authenticated: plain, or sealed under
        // another key. One sealed under this key is newer.
        let corrupt =
            |r: Result<(u32, Cow<'_, [u8]>)>| matches!(r, Err(StoreError::Corrupt { .. }));
        assert!(corrupt(open_with(
            p,
            &seal(Kind::Index, 9, b"x"),
            Kind::Index,
            1,
            Some(&c)
        )));
        let forged = seal_with(Kind::Index, 9, b"x", Some(&other)).unwrap();
        assert!(corrupt(open_with(p, &forged, Kind::Index, 1, Some(&c))));
        // A whole sealed file is told from a plain one with its kind's
        // sealed bit flipped (damage: its checksum fails).
        assert!(is_sealed(p, &sealed, Kind::Index));
        assert!(!is_sealed(p, &sealed, Kind::Manifest));
        let mut flipped = seal(Kind::Index, 1, b"plain");
        flipped[9] ^= (SEALED >> 8) as u8;
        assert!(!is_sealed(p, &flipped, Kind::Index));
        assert!(!is_sealed(p, &seal(Kind::Index, 1, b"plain"), Kind::Index));
        let newer = seal_with(Kind::Index, 9, b"x", Some(&c)).unwrap();
        assert!(matches!(
            open_with(p, &newer, Kind::Index, 1, Some(&c)),
            Err(StoreError::NewerVersion { found: 9, .. })
        ));
    }
}
