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
//!   and a backup no longer evicts the machine's working set ([`pack`]).
//! - **Self-describing records.** Every record carries its chunk id,
//!   codec, lengths and CRC-32C: packs can be walked without the index,
//!   which is how an interrupted backup's packs are salvaged and reused,
//!   and how `verify --read-data` works.
//! - **32 bytes per chunk in memory.** The index is a sorted table of
//!   160-bit id prefixes with their location ([`index`]); on disk the full
//!   ids are kept.
//! - **Commit by creating the manifest.** Packs are fsync'd, then the
//!   index file, then the manifest is created where no other writer has
//!   taken its number: a snapshot exists whole or not at all ([`meta`],
//!   [`backup`](mod@backup)). No global lock: backups run side by side,
//!   readers and writers register sessions instead of locking, and gc
//!   deletes in two phases, once every session that could still use what
//!   it superseded has ended (`docs/format/repository.md`).
//! - **Images change by copy-on-write snapshots.** [`edit`] commits a
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

pub mod backend;
pub mod backup;
mod bytes;
pub mod cache;
pub mod chunker;
pub mod copy;
pub mod crypt;
pub mod diff;
mod direct;
pub mod edit;
pub mod error;
pub mod gc;
pub mod id;
pub mod index;
pub mod manifest;
pub mod meta;
pub mod pack;
pub mod reader;
pub mod repo;
pub mod restore;
pub mod retention;
pub mod s3;
pub mod stats;
pub mod verify;

pub use backup::{backup, BackupOptions, BackupReport};
pub use cairn_blockdev::{SparseFile, SparseRead};
pub use chunker::{ChunkerSpec, DEFAULT_CHUNKER};
pub use edit::{EditReport, ImageEditor, Span};
pub use error::{Result, StoreError};
pub use gc::{gc, GcOptions, GcReport};
pub use id::{ChunkId, PackId, RepoId};
pub use manifest::{Extent, Manifest};
pub use reader::PackReader;
pub use repo::{ImageLock, Repository, Session};
pub use restore::{restore, Destination, RestoreOptions, RestoreReport};
pub use retention::{KeepPolicy, Verdict};
pub use s3::S3Backend;
pub use verify::{verify, VerifyOptions, VerifyReport};
