//! Newtype ids: [`ChunkId`] (BLAKE3-256 of a chunk's uncompressed bytes),
//! [`PackId`] and [`RepoId`] (random 128-bit names).

use std::fmt;

/// BLAKE3-256 of a chunk's uncompressed bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkId(pub [u8; 32]);

/// How many leading bytes of a [`ChunkId`] the in-memory index keeps.
///
/// 152 bits: among 2^40 chunks (32 PiB of 32 KiB chunks) the chance that
/// two distinct chunks share a prefix is below 2^-72. Even then nothing
/// is silently wrong: the full id is stored in every pack record and every
/// manifest, and restore checks the BLAKE3 of what it decoded against the
/// full id.
pub const PREFIX_LEN: usize = 19;

impl ChunkId {
    /// Hash `data`.
    pub fn of(data: &[u8]) -> ChunkId {
        ChunkId(*blake3::hash(data).as_bytes())
    }

    /// The leading [`PREFIX_LEN`] bytes.
    pub fn prefix(&self) -> [u8; PREFIX_LEN] {
        let mut p = [0u8; PREFIX_LEN];
        p.copy_from_slice(&self.0[..PREFIX_LEN]);
        p
    }
}

impl fmt::Display for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(&self.0))
    }
}

impl fmt::Debug for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChunkId({})", hex(&self.0[..8]))
    }
}

/// A random 128-bit name.
macro_rules! random_id {
    ($name:ident, $doc:literal) => {
        #[doc = $doc]
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub [u8; 16]);

        impl $name {
            /// A fresh random id.
            pub fn random() -> $name {
                $name(random16())
            }

            /// Parse 32 hex digits.
            pub fn from_hex(s: &str) -> Option<$name> {
                let mut out = [0u8; 16];
                unhex(s, &mut out).then_some($name(out))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&hex(&self.0))
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), hex(&self.0))
            }
        }
    };
}

random_id!(PackId, "Name of a pack file.");
random_id!(
    RepoId,
    "Identity of a repository, written into every target and pack."
);

/// 16 random bytes from the operating system; if it has none to give
/// (no getrandom, no /dev/urandom), a hash of the time, the process id and
/// a counter, which is unique enough for names inside one repository.
pub(crate) fn random16() -> [u8; 16] {
    let mut out = [0u8; 16];
    if getrandom::fill(&mut out).is_ok() {
        return out;
    }
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = blake3::Hasher::new();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    h.update(&now.to_le_bytes());
    h.update(&std::process::id().to_le_bytes());
    h.update(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    out.copy_from_slice(&h.finalize().as_bytes()[..16]);
    out
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// Parse exactly `out.len() * 2` hex digits into `out`.
pub fn unhex(s: &str, out: &mut [u8]) -> bool {
    let s = s.as_bytes();
    if s.len() != out.len() * 2 {
        return false;
    }
    fn digit(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    for (i, o) in out.iter_mut().enumerate() {
        match (digit(s[2 * i]), digit(s[2 * i + 1])) {
            (Some(h), Some(l)) => *o = (h << 4) | l,
            _ => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_rejects_junk() {
        let id = PackId::random();
        assert_eq!(PackId::from_hex(&id.to_string()), Some(id));
        assert_eq!(PackId::from_hex("zz"), None);
        assert_eq!(PackId::from_hex(&"g".repeat(32)), None);
        assert_ne!(PackId::random(), PackId::random());
    }

    #[test]
    fn chunk_id_is_blake3() {
        let id = ChunkId::of(b"abc");
        assert_eq!(
            id.to_string(),
            "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"
        );
        assert_eq!(&id.prefix()[..], &id.0[..PREFIX_LEN]);
    }
}
