//! Encryption of a repository: the master key, authenticated encryption
//! of packs' records and of metadata files, keyed chunk ids, and the key
//! files that wrap the master key under a password.
//!
//! - **AEAD**: AES-256-GCM from `ring` (the crate the TLS and S3 code
//!   already build on; AES-NI and carry-less multiply where the CPU has
//!   them). Every sealed message carries a fresh random 96-bit nonce; NIST
//!   allows 2^32 such messages under one key, counted over every object
//!   ever sealed (docs/format/encryption.md says what that is in data).
//! - **Chunk ids**: keyed BLAKE3 under a second key, so an id tells nothing
//!   about a chunk's content (a plain BLAKE3 would let anyone holding a
//!   candidate file test whether the repository holds it).
//! - **Chunker secret**: 32 random bytes from which the content-defined
//!   chunker's gear table is derived ([`GearTable::keyed`]), so where the
//!   chunks are cut (and so the sizes of records) cannot be computed from
//!   a file by someone without the key. Repositories made before it have
//!   none and keep the public table.
//! - **Key files**: the 64-byte master key (AEAD key, id key), and the
//!   chunker secret, sealed under a key derived from a password by
//!   Argon2id (the `argon2` crate), with the repository id as associated
//!   data. Several key files may wrap the same keys (`cairn key add`).
//!
//! The formats and the threat model are in `docs/format/encryption.md`.

use crate::chunker::GearTable;
use crate::error::{Result, StoreError};
use crate::id::{hex, unhex, ChunkId, RepoId};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use serde::{Deserialize, Serialize};
use std::fmt;
use zeroize::Zeroizing;

/// The AEAD's name, as a config records it.
pub const AEAD_NAME: &str = "aes-256-gcm";
/// Bytes of an authentication tag.
pub const TAG_LEN: usize = 16;
/// Bytes a sealed message adds to its plaintext: nonce and tag.
pub const SEAL_OVERHEAD: usize = NONCE_LEN + TAG_LEN;
const MASTER_LEN: usize = 64;
const CHUNKER_SECRET_LEN: usize = 32;
/// Bytes a key file wraps since keyed chunkers: master key, chunker secret.
const WRAPPED_WITH_CHUNKER: usize = MASTER_LEN + CHUNKER_SECRET_LEN;

/// Where a repository's content-defined chunker cuts: its chunker secret,
/// or none (the public gear table: a plain repository, or an encrypted one
/// made before keyed chunkers). Held to give a new repository the same
/// cuts ([`crate::Repository::chunker_params`]).
#[derive(Clone, Default)]
pub struct ChunkerParams(Option<Zeroizing<[u8; CHUNKER_SECRET_LEN]>>);

impl ChunkerParams {
    /// Whether the gear table is keyed.
    pub fn keyed(&self) -> bool {
        self.0.is_some()
    }
}

impl fmt::Debug for ChunkerParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.keyed() {
            "ChunkerParams(keyed)"
        } else {
            "ChunkerParams(public)"
        })
    }
}

/// A repository's keys, unwrapped: seals and opens its objects, computes
/// its chunk ids and its chunker's gear table.
pub struct Crypt {
    aead: LessSafeKey,
    id_key: Zeroizing<[u8; 32]>,
    master: Zeroizing<[u8; MASTER_LEN]>,
    /// `None` in a repository made before keyed chunkers (key files of
    /// version 1).
    chunker: Option<Zeroizing<[u8; CHUNKER_SECRET_LEN]>>,
}

impl fmt::Debug for Crypt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Crypt(..)")
    }
}

fn random_bytes(out: &mut [u8]) -> Result<()> {
    getrandom::fill(out).map_err(|e| {
        StoreError::Invalid(format!(
            "the operating system gives no random bytes for keys: {e}"
        ))
    })
}

/// The nonce of message number `n` ([`Crypt::seal_numbered`]).
fn numbered(n: u64) -> Nonce {
    let mut b = [0u8; NONCE_LEN];
    b[..8].copy_from_slice(&n.to_le_bytes());
    Nonce::assume_unique_for_key(b)
}

impl Crypt {
    /// A fresh random master key and chunker secret.
    pub fn generate() -> Result<Crypt> {
        let mut chunker = Zeroizing::new([0u8; CHUNKER_SECRET_LEN]);
        random_bytes(&mut chunker[..])?;
        Crypt::generate_with(ChunkerParams(Some(chunker)))
    }

    /// A fresh random master key, with the chunker of another repository
    /// (`init --copy-chunker-params`: backups into either cut alike).
    pub fn generate_with(chunker: ChunkerParams) -> Result<Crypt> {
        let mut master = Zeroizing::new([0u8; MASTER_LEN]);
        random_bytes(&mut master[..])?;
        Crypt::from_master(master, chunker.0)
    }

    /// This repository's chunker, for another to share.
    pub fn chunker_params(&self) -> ChunkerParams {
        ChunkerParams(self.chunker.clone())
    }

    fn from_master(
        master: Zeroizing<[u8; MASTER_LEN]>,
        chunker: Option<Zeroizing<[u8; CHUNKER_SECRET_LEN]>>,
    ) -> Result<Crypt> {
        let key = UnboundKey::new(&AES_256_GCM, &master[..32])
            .map_err(|_| StoreError::Invalid("AES-256-GCM key rejected".into()))?;
        let mut id_key = Zeroizing::new([0u8; 32]);
        id_key.copy_from_slice(&master[32..]);
        Ok(Crypt {
            aead: LessSafeKey::new(key),
            id_key,
            master,
            chunker,
        })
    }

    /// The gear table of the repository's content-defined chunker: derived
    /// from its chunker secret, or `None` (the public table) in a
    /// repository made before keyed chunkers.
    pub fn gear_table(&self) -> Option<GearTable> {
        self.chunker.as_ref().map(|s| GearTable::keyed(s))
    }

    /// Whether there is a chunker secret (a repository made since keyed
    /// chunkers).
    pub fn has_chunker_secret(&self) -> bool {
        self.chunker.is_some()
    }

    /// The version of the key files that wrap these keys: 2 with a
    /// chunker secret, 1 without (so a cairn that knows no chunker secret
    /// refuses the key file as newer, instead of writing chunks cut with
    /// the public table into the repository).
    pub fn key_file_version(&self) -> u32 {
        if self.chunker.is_some() {
            2
        } else {
            1
        }
    }

    /// The name under which image `name` is stored (`snapshots/TAG/`,
    /// `locks/TAG`): 32 hex digits of a keyed hash, so the repository's
    /// listing does not tell its images' names.
    pub fn name_tag(&self, name: &str) -> String {
        let key = blake3::derive_key("cairn 2026-11 image names", &self.id_key[..]);
        hex(&blake3::keyed_hash(&key, name.as_bytes()).as_bytes()[..16])
    }

    /// The keyed id of a chunk.
    pub fn chunk_id(&self, data: &[u8]) -> ChunkId {
        ChunkId(*blake3::keyed_hash(&self.id_key, data).as_bytes())
    }

    /// Encrypt `buf[from..]` in place: the nonce is written into
    /// `buf[from - NONCE_LEN..from]` (which the caller reserved) and the
    /// tag appended. `aad` is authenticated with it.
    pub fn seal_in_place(&self, aad: &[u8], buf: &mut Vec<u8>, from: usize) -> Result<()> {
        debug_assert!(from >= NONCE_LEN);
        let mut nonce = [0u8; NONCE_LEN];
        random_bytes(&mut nonce)?;
        buf[from - NONCE_LEN..from].copy_from_slice(&nonce);
        let tag = self
            .aead
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut buf[from..],
            )
            .map_err(|_| StoreError::Invalid("encryption failed".into()))?;
        buf.extend_from_slice(tag.as_ref());
        Ok(())
    }

    /// Append `ciphertext || tag` of `plain` to `out`, sealed under the
    /// nonce made of `n` (little-endian, then four zero bytes): for
    /// messages numbered by the caller under a key of their own, where no
    /// number is ever sealed twice (a spill file's addresses; see
    /// [`crate::SpillKey`]). Opening with another number fails.
    pub fn seal_numbered(&self, n: u64, plain: &[u8], out: &mut Vec<u8>) -> Result<()> {
        let from = out.len();
        out.extend_from_slice(plain);
        let tag = self
            .aead
            .seal_in_place_separate_tag(numbered(n), Aad::empty(), &mut out[from..])
            .map_err(|_| StoreError::Invalid("encryption failed".into()))?;
        out.extend_from_slice(tag.as_ref());
        Ok(())
    }

    /// Open, in place, `ciphertext || tag` sealed by
    /// [`Crypt::seal_numbered`] under `n`: the plaintext, or `None` if it
    /// does not authenticate.
    pub fn open_numbered<'a>(&self, n: u64, sealed: &'a mut [u8]) -> Option<&'a [u8]> {
        self.aead
            .open_in_place(numbered(n), Aad::empty(), sealed)
            .ok()
            .map(|p| &*p)
    }

    /// Append `nonce || ciphertext || tag` of `plain` to `out`.
    pub fn seal_to(&self, aad: &[u8], plain: &[u8], out: &mut Vec<u8>) -> Result<()> {
        out.extend_from_slice(&[0u8; NONCE_LEN]);
        let from = out.len();
        out.extend_from_slice(plain);
        self.seal_in_place(aad, out, from)
    }

    /// Open `nonce || ciphertext || tag` into `out` (replacing its
    /// contents); `false` if it does not authenticate.
    pub fn open_to(&self, aad: &[u8], sealed: &[u8], out: &mut Vec<u8>) -> bool {
        out.clear();
        if sealed.len() < SEAL_OVERHEAD {
            return false;
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&sealed[..NONCE_LEN]);
        out.extend_from_slice(&sealed[NONCE_LEN..]);
        let n = match self.aead.open_in_place(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad),
            &mut out[..],
        ) {
            Ok(plain) => plain.len(),
            Err(_) => {
                out.clear();
                return false;
            }
        };
        out.truncate(n);
        true
    }
}

/// The chunk id of `data`: keyed BLAKE3 in an encrypted repository, plain
/// BLAKE3 otherwise.
pub fn chunk_id(crypt: Option<&Crypt>, data: &[u8]) -> ChunkId {
    match crypt {
        Some(c) => c.chunk_id(data),
        None => ChunkId::of(data),
    }
}

/// How hard a password is made to guess: Argon2id's cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KdfParams {
    /// Memory in KiB.
    pub memory_kib: u32,
    /// Passes over the memory.
    pub iterations: u32,
    /// Lanes.
    pub parallelism: u32,
}

impl Default for KdfParams {
    /// 19 MiB, 2 passes, 1 lane: the second of OWASP's Argon2id settings,
    /// which it rates as strong as the first (46 MiB, 1 pass). Every command
    /// that opens the repository pays it once: measured 26 ms here against
    /// 46 ms for 46 MiB and 1 pass (a smaller working set stays in the
    /// caches) and 0.41 s for RFC 9106's 64 MiB and 3 passes, which cost a
    /// backup of a 256 MiB image a third of its time. Whoever tries
    /// passwords pays 19 MiB of memory and two passes over it per guess.
    fn default() -> Self {
        KdfParams {
            memory_kib: 19 << 10,
            iterations: 2,
            parallelism: 1,
        }
    }
}

/// The most memory a key may make Argon2id use (4 GiB): a key file asking
/// for more is refused before anything is allocated.
pub const MAX_KDF_MEMORY_KIB: u32 = 4 << 20;
/// The most passes a key may ask for.
pub const MAX_KDF_ITERATIONS: u32 = 64;
/// The most lanes a key may ask for.
pub const MAX_KDF_PARALLELISM: u32 = 16;

impl KdfParams {
    fn check(&self) -> Result<argon2::Params> {
        if self.memory_kib > MAX_KDF_MEMORY_KIB
            || self.iterations > MAX_KDF_ITERATIONS
            || self.parallelism > MAX_KDF_PARALLELISM
        {
            return Err(StoreError::Invalid(format!(
                "Argon2id parameters m={} KiB, t={}, p={} are beyond what cairn allows (m <= {MAX_KDF_MEMORY_KIB} KiB, t <= {MAX_KDF_ITERATIONS}, p <= {MAX_KDF_PARALLELISM})",
                self.memory_kib, self.iterations, self.parallelism
            )));
        }
        argon2::Params::new(self.memory_kib, self.iterations, self.parallelism, Some(32)).map_err(
            |e| {
                StoreError::Invalid(format!(
                    "Argon2id parameters m={} KiB, t={}, p={}: {e}",
                    self.memory_kib, self.iterations, self.parallelism
                ))
            },
        )
    }
}

/// A key file's body (`keys/<hex>`, JSON in a metadata envelope).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeyFile {
    /// When it was made (Unix seconds).
    pub created: i64,
    /// The machine and user that made it.
    pub host: String,
    /// The user that made it.
    pub user: String,
    /// `argon2id`.
    pub kdf: String,
    /// Argon2id's cost.
    #[serde(flatten)]
    pub params: KdfParams,
    /// 32 random bytes, hex.
    pub salt: String,
    /// `aes-256-gcm`.
    pub aead: String,
    /// The master key, sealed under the derived key: hex of nonce,
    /// ciphertext and tag.
    pub master: String,
}

/// The key Argon2id derives from `password`. Its working memory (the
/// blocks, derived from the password) is wiped before it is freed, as
/// are the derived key's copies (argon2's `zeroize` feature).
fn derive(password: &[u8], salt: &[u8], params: &KdfParams) -> Result<Zeroizing<[u8; 32]>> {
    let params = params.check()?;
    let mut blocks = Zeroizing::new(vec![argon2::Block::default(); params.block_count()]);
    let argon = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
    let mut out = Zeroizing::new([0u8; 32]);
    argon
        .hash_password_into_with_memory(password, salt, &mut out[..], &mut blocks[..])
        .map_err(|e| StoreError::Invalid(format!("Argon2id: {e}")))?;
    Ok(out)
}

fn key_aad(repo: RepoId) -> Vec<u8> {
    let mut aad = b"cairn key v1 ".to_vec();
    aad.extend_from_slice(&repo.0);
    aad
}

impl KeyFile {
    /// Whether this cairn can use the key file: its KDF and AEAD, and its
    /// cost within bounds (checked before anything is allocated).
    pub fn check(&self) -> Result<()> {
        if self.kdf != "argon2id" || self.aead != AEAD_NAME {
            return Err(StoreError::Invalid(format!(
                "key uses {} and {}, this cairn knows argon2id and {AEAD_NAME}",
                self.kdf, self.aead
            )));
        }
        self.params.check().map(|_| ())
    }

    /// Wrap `crypt`'s master key under `password`.
    pub fn wrap(
        crypt: &Crypt,
        repo: RepoId,
        password: &[u8],
        params: KdfParams,
        host: String,
        user: String,
        created: i64,
    ) -> Result<KeyFile> {
        let mut salt = [0u8; 32];
        random_bytes(&mut salt)?;
        let kek = Crypt::from_master(
            {
                let mut m = Zeroizing::new([0u8; MASTER_LEN]);
                m[..32].copy_from_slice(&derive(password, &salt, &params)?[..]);
                m
            },
            None,
        )?;
        let mut secrets = Zeroizing::new(Vec::with_capacity(WRAPPED_WITH_CHUNKER));
        secrets.extend_from_slice(&crypt.master[..]);
        if let Some(c) = &crypt.chunker {
            secrets.extend_from_slice(&c[..]);
        }
        let mut sealed = Vec::new();
        kek.seal_to(&key_aad(repo), &secrets, &mut sealed)?;
        Ok(KeyFile {
            created,
            host,
            user,
            kdf: "argon2id".into(),
            params,
            salt: hex(&salt),
            aead: AEAD_NAME.into(),
            master: hex(&sealed),
        })
    }

    /// The keys, if `password` opens this key file; `Ok(None)` if it does
    /// not, an error if the key file itself is malformed. The length of
    /// what it wraps (authenticated) tells whether a chunker secret is
    /// there; the envelope's version only warns older cairns off.
    pub fn unwrap(&self, repo: RepoId, password: &[u8]) -> Result<Option<Crypt>> {
        self.check()?;
        let mut salt = [0u8; 32];
        let mut sealed = vec![0u8; self.master.len() / 2];
        if !unhex(&self.salt, &mut salt) || !unhex(&self.master, &mut sealed) {
            return Err(StoreError::Invalid("key file: bad hex".into()));
        }
        let kek = Crypt::from_master(
            {
                let mut m = Zeroizing::new([0u8; MASTER_LEN]);
                m[..32].copy_from_slice(&derive(password, &salt, &self.params)?[..]);
                m
            },
            None,
        )?;
        // Room for all of it: a copy left behind by growing is not wiped.
        let mut plain = Zeroizing::new(Vec::with_capacity(sealed.len()));
        if !kek.open_to(&key_aad(repo), &sealed, &mut plain) {
            return Ok(None);
        }
        let chunker = match plain.len() {
            MASTER_LEN => None,
            WRAPPED_WITH_CHUNKER => {
                let mut c = Zeroizing::new([0u8; CHUNKER_SECRET_LEN]);
                c.copy_from_slice(&plain[MASTER_LEN..]);
                Some(c)
            }
            n => {
                return Err(StoreError::Invalid(format!(
                "key file: {n} bytes of keys where {MASTER_LEN} or {WRAPPED_WITH_CHUNKER} belong"
            )))
            }
        };
        let mut master = Zeroizing::new([0u8; MASTER_LEN]);
        master.copy_from_slice(&plain[..MASTER_LEN]);
        Ok(Some(Crypt::from_master(master, chunker)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fast() -> KdfParams {
        KdfParams {
            memory_kib: 256,
            iterations: 1,
            parallelism: 1,
        }
    }

    #[test]
    fn sealed_messages_open_and_every_flip_is_caught() {
        let c = Crypt::generate().unwrap();
        let mut sealed = Vec::new();
        c.seal_to(b"aad", b"hello world", &mut sealed).unwrap();
        assert_eq!(sealed.len(), 11 + SEAL_OVERHEAD);
        let mut out = Vec::new();
        assert!(c.open_to(b"aad", &sealed, &mut out));
        assert_eq!(out, b"hello world");
        assert!(!c.open_to(b"aae", &sealed, &mut out));
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 0x10;
            assert!(!c.open_to(b"aad", &bad, &mut out), "flip at {i}");
        }
        let other = Crypt::generate().unwrap();
        assert!(!other.open_to(b"aad", &sealed, &mut out));
        // Two seals of one message differ (fresh nonces).
        let mut again = Vec::new();
        c.seal_to(b"aad", b"hello world", &mut again).unwrap();
        assert_ne!(again, sealed);
    }

    #[test]
    fn chunk_ids_are_keyed() {
        let a = Crypt::generate().unwrap();
        let b = Crypt::generate().unwrap();
        assert_ne!(a.chunk_id(b"x"), ChunkId::of(b"x"));
        assert_ne!(a.chunk_id(b"x"), b.chunk_id(b"x"));
        assert_eq!(a.chunk_id(b"x"), chunk_id(Some(&a), b"x"));
        assert_eq!(chunk_id(None, b"x"), ChunkId::of(b"x"));
    }

    #[test]
    fn key_files_open_with_their_password_only() {
        let c = Crypt::generate().unwrap();
        let repo = RepoId::random();
        let k = KeyFile::wrap(&c, repo, b"secret", fast(), "h".into(), "u".into(), 0).unwrap();
        let back = k.unwrap(repo, b"secret").unwrap().unwrap();
        assert_eq!(back.chunk_id(b"q"), c.chunk_id(b"q"));
        assert!(k.unwrap(repo, b"Secret").unwrap().is_none());
        assert!(k.unwrap(RepoId::random(), b"secret").unwrap().is_none());
        let json = serde_json::to_string(&k).unwrap();
        assert!(json.contains("\"memory_kib\":256"), "{json}");
        let mut bad = k.clone();
        bad.master.replace_range(0..2, "zz");
        assert!(bad.unwrap(repo, b"secret").is_err());
    }

    /// A key file carries the chunker secret (version 2) and gives back
    /// the same gear table; one of a repository made before keyed chunkers
    /// (the master key alone, version 1) opens without one; anything else
    /// wrapped is refused.
    #[test]
    fn key_files_carry_the_chunker_secret_or_none() {
        let repo = RepoId::random();
        let c = Crypt::generate().unwrap();
        assert_eq!(c.key_file_version(), 2);
        let table = c.gear_table().unwrap();
        assert_ne!(table, GearTable::public());
        assert_ne!(Some(table.clone()), Crypt::generate().unwrap().gear_table());
        let k = KeyFile::wrap(&c, repo, b"pw", fast(), "h".into(), "u".into(), 0).unwrap();
        // Nonce, master key and secret, tag.
        assert_eq!(k.master.len(), 2 * (NONCE_LEN + 96 + TAG_LEN));
        assert_eq!(
            k.unwrap(repo, b"pw").unwrap().unwrap().gear_table(),
            Some(table)
        );

        let old = Crypt::from_master(c.master.clone(), None).unwrap();
        assert_eq!(old.key_file_version(), 1);
        let k = KeyFile::wrap(&old, repo, b"pw", fast(), "h".into(), "u".into(), 0).unwrap();
        assert_eq!(k.master.len(), 2 * (NONCE_LEN + 64 + TAG_LEN));
        let back = k.unwrap(repo, b"pw").unwrap().unwrap();
        assert_eq!(back.gear_table(), None);
        assert_eq!(back.chunk_id(b"q"), c.chunk_id(b"q"));

        // A wrap of 65 bytes, sealed under the right key: refused.
        let mut salt = [0u8; 32];
        unhex(&k.salt, &mut salt);
        let kek = Crypt::from_master(
            {
                let mut m = Zeroizing::new([0u8; MASTER_LEN]);
                m[..32].copy_from_slice(&derive(b"pw", &salt, &k.params).unwrap()[..]);
                m
            },
            None,
        )
        .unwrap();
        let mut sealed = Vec::new();
        kek.seal_to(&key_aad(repo), &[7u8; 65], &mut sealed)
            .unwrap();
        let bad = KeyFile {
            master: hex(&sealed),
            ..k
        };
        let e = bad.unwrap(repo, b"pw").unwrap_err().to_string();
        assert!(e.contains("65 bytes of keys"), "{e}");
    }
}
