//! # cairn-store
//!
//! The repository: a deduplicating, compressed store of images (disk and
//! memory images, streams), striped over several target directories, or
//! in an object store; every object is reached through the backend seam
//! ([`backend`]).
//!
//! ## Design decisions
//!
//! - **Content-defined chunks, BLAKE3 ids.** A stream is cut by FastCDC
//!   (or at fixed sizes), each chunk is named by the BLAKE3 of its bytes
//!   and stored once; all-zero chunks are never stored, only recorded as
//!   holes, so sparse images and kdump zero pages cost nothing.
//! - **Packs on every target, one writer each.** Compressed chunk records
//!   are appended to pack files; each target has its own writer thread,
//!   and each batch of records goes to the least busy target (fewest bytes
//!   queued, then fewest stored), so N disks give N times the bandwidth, a
//!   slower disk takes fewer batches and idle disks fill evenly (seed 000).
//! - **Packs are written past the page cache.** A pack is written once
//!   and fsync'd when sealed, so the page cache only adds a copy of every
//!   byte and a backlog of dirty pages; packs go out with `O_DIRECT`
//!   through an aligned buffer (buffered where the filesystem refuses it),
//!   and a backup no longer evicts the machine's working set (`pack.rs`).
//! - **Self-describing records.** Every record carries its chunk id,
//!   codec, lengths and CRC-32C: packs can be walked without the index,
//!   which is how an interrupted backup's packs are salvaged and reused,
//!   and how `verify --read-data` works.
//! - **33 bytes per chunk in memory.** The index is a sorted table of
//!   160-bit id prefixes with their location (32 bytes a chunk), and a
//!   table of where each run of ids with the same first bits starts (4
//!   bytes per 4-8 chunks), so a lookup reads one or two cache lines
//!   (`index.rs`); on disk the full ids are kept.
//! - **Commit by creating the manifest.** Packs are fsync'd, then the
//!   index file, then the manifest is created where no other writer has
//!   taken its number: a snapshot exists whole or not at all (`meta.rs`,
//!   `backup.rs`). No global lock: backups run side by side,
//!   readers and writers register sessions instead of locking, and gc
//!   deletes in two phases, once every session that could still use what
//!   it superseded has ended (`docs/format/repository.md`).
//! - **Images change by copy-on-write snapshots.** [`ImageEditor`] commits a
//!   set of replaced ranges of an image's latest snapshot as its next
//!   snapshot (the writable images of `cairn serve`): the touched chunks
//!   are cut again with the image's chunker, so unchanged parts dedup,
//!   and the commit order is a backup's.
//! - **Everything checksummed and versioned.** Metadata files sit in one
//!   envelope with a BLAKE3 trailer and a format version; a newer version
//!   is refused with a clear error. Formats: `docs/format/repository.md`.
//!
//! Written by hand: no crate offers a chunk store with these properties
//! (rustic_core and borg's formats are tied to encryption and their own
//! index designs, and neither stripes over disks). FastCDC, BLAKE3,
//! CRC-32C and the codecs come from crates.

//! ## The face
//!
//! What other crates use is re-exported here, and nothing else is
//! public: the [`Repository`] with its [`Session`]s and locks; snapshots
//! ([`Manifest`], [`Extent`], tags, retention); the writers ([`backup()`],
//! [`copy()`], [`ImageEditor`]) and the readers ([`restore()`],
//! [`verify()`], [`diff()`], [`PackReader`] with its [`Group`]s); [`gc()`];
//! typed errors ([`StoreError`]); and the backend seam ([`backend`]), the
//! one module left open, since a new store is added by implementing it.
//! Pack, index and metadata formats, the chunker, encryption and the
//! caches are private; `docs/store.md` draws the parts.

pub mod backend;
mod backup;
mod bytes;
mod cache;
mod chunker;
mod copy;
mod crypt;
mod diff;
mod direct;
mod edit;
mod error;
#[cfg(test)]
mod faults;
mod gc;
mod id;
mod index;
mod layout;
mod manifest;
mod meta;
mod pack;
mod reader;
mod repair;
mod repo;
mod reserve;
mod restore;
mod retention;
mod s3;
mod seen;
mod stats;
mod verify;

// The repository, its sessions, keys and local directories.
pub use crypt::{ChunkerParams, KdfParams};
pub use id::{hex, ChunkId, PackId, RepoId, PREFIX_LEN};
pub use repo::{
    cache_dir, cache_root, keep_seen_records, state_dir, state_root, validate_name, HoldEntry,
    ImageLock, InitOptions, KeyInfo, LoadedIndex, NoPassword, Password, PasswordSource, Repository,
    Session, SessionInfo, Unlocked, DEFAULT_PACK_SIZE, UNNAMED,
};
// Snapshots: their extents, tags, and which to keep.
pub use manifest::{parse_tags, tags_match, Extent, Manifest, SnapshotStats};
pub use retention::{
    apply as apply_retention, format_time, parse_span, parse_time, CalendarSpan, Dated, KeepPolicy,
    Verdict,
};
pub use stats::{list as list_snapshots, stats, RepoStats, SnapshotInfo, TargetStats};
// Writers.
pub use backup::{
    backup, BackupOptions, BackupReport, Progress as BackupProgress, DEFAULT_GROUP_SIZE,
};
pub use chunker::{ChunkerSpec, GearTable, DEFAULT_CHUNKER};
pub use copy::{copy, Copied, CopyOptions, CopyProgress, CopyReport, Skipped};
pub use edit::{EditReport, ImageEditor, Span};
// Readers.
pub use cairn_blockdev::{SparseFile, SparseRead};
pub use diff::{diff, DiffReport};
pub use index::{ChunkIndex, Location};
pub use reader::{
    CompactGroup, DamagedRecords, Group, GroupBuffers, GroupScratch, PackReader, SpillKey,
    SpilledGroup,
};
pub use restore::{restore, Damaged, Destination, RestoreOptions, RestoreReport};
pub use verify::{verify, Affected, DataSubset, Problem, VerifyOptions, VerifyReport, WrongEntry};
// Reclaiming space.
pub use gc::{gc, Collected, GcOptions, GcReport};
pub use repair::{repair, RepairOptions, RepairReport};
pub use reserve::{free_space, DEFAULT_RESERVE};
// Errors.
pub use error::{Result, StoreError};
// Durability: what the store does after creating or removing names.
pub use meta::{create_dirs, sync_dir};
// Backends.
pub use s3::{S3Backend, S3Config};

/// Parsers and envelopes reached by the fuzz targets (`fuzz/`) and by the
/// format fixtures and damage tests, which plant objects a writer would
/// not make. Not part of the face: no promise it stays.
#[doc(hidden)]
pub mod internals {
    pub use crate::crypt::{Crypt, KeyFile};
    pub use crate::index::IndexFile;
    pub use crate::layout::{Layout, Place, RecordAt};
    pub use crate::meta::{open, seal, Kind};
    pub use crate::pack::{
        check_chunk, check_pack_header, encode_pack_header, scan_records, walk_records,
        RecordDecoder, RecordHeader, RECORD_FIXED_LEN,
    };
    pub use crate::repo::check_trash_list;
    pub use crate::seen::{decode_seen, encode_seen, Removal};
}
