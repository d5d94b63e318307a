//! Errors of the store: each names what it was doing and where (repository
//! path, file, offset, chunk id, image), so a one-line message is enough to
//! find the damage.

use crate::id::ChunkId;
use std::io;
use std::path::PathBuf;

/// What went wrong in the repository.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An operating-system call on a file failed.
    #[error("{path}: {what}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What cairn was doing (`read`, `create`, `fsync`, ...).
        what: &'static str,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// Reading the source of a backup failed.
    #[error("reading the source at offset {offset}: {source}")]
    Source {
        /// Byte offset in the source.
        offset: u64,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// Writing the destination of a restore failed.
    #[error("writing the destination at offset {offset}: {source}")]
    Dest {
        /// Byte offset in the image.
        offset: u64,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// A metadata file or pack is damaged or not what its format allows.
    #[error("{path}: corrupt at offset {offset}: {reason}")]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// Where in it.
        offset: u64,
        /// What exactly is wrong.
        reason: String,
    },
    /// A stored chunk does not decode to the data its id names.
    #[error("chunk {chunk} in {path} at offset {offset}: {reason}")]
    BadChunk {
        /// The chunk.
        chunk: ChunkId,
        /// The pack holding it.
        path: PathBuf,
        /// Record offset in the pack.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// An image refers to a chunk the index does not know.
    #[error("chunk {chunk} (image offset {offset}) is missing from the repository")]
    MissingChunk {
        /// The chunk.
        chunk: ChunkId,
        /// Offset in the image being read.
        offset: u64,
    },
    /// A file was written by a newer cairn.
    #[error("{path}: format version {found} is newer than this cairn supports ({supported}); upgrade cairn")]
    NewerVersion {
        /// The file.
        path: PathBuf,
        /// Version in the file.
        found: u32,
        /// Newest version this build reads.
        supported: u32,
    },
    /// The path is not a cairn repository.
    #[error("{0}: not a cairn repository (no config file; create one with `cairn init`)")]
    NotARepository(PathBuf),
    /// `init` on a path that already holds something.
    #[error("{0}: already exists and is not empty")]
    AlreadyExists(PathBuf),
    /// Another process holds a lock (an image open for writing).
    #[error("{path} is locked by another writer ({holder}); retry when it is done")]
    Locked {
        /// What is locked.
        path: PathBuf,
        /// Who holds it, as recorded in the lock.
        holder: String,
    },
    /// No such image or snapshot.
    #[error("{0}")]
    NotFound(String),
    /// An encrypted repository opened without a password.
    #[error("{0}: the repository is encrypted; give its password (CAIRN_PASSWORD_FILE, CAIRN_PASSWORD, --password-file or --password-command)")]
    KeyNeeded(String),
    /// No key of the repository opens with the password given.
    #[error("{0}: wrong password (no key of the repository opens with it)")]
    WrongPassword(String),
    /// The password could not be had (its file, its command).
    #[error("password: {0}")]
    Password(String),
    /// A bad argument (name, chunker parameters, ...).
    #[error("{0}")]
    Invalid(String),
    /// A codec refused (compressing) or a stored chunk failed to decode.
    #[error(transparent)]
    Codec(#[from] cairn_codec::CodecError),
    /// An error while reading or writing an image, with the image offset.
    #[error("image offset {offset}: {source}")]
    InImage {
        /// Offset in the image.
        offset: u64,
        /// What went wrong there.
        #[source]
        source: Box<StoreError>,
    },
    /// An error while copying a snapshot, naming it (`NAME@N`).
    #[error("{snapshot}: {source}")]
    InSnapshot {
        /// The snapshot.
        snapshot: String,
        /// What went wrong.
        #[source]
        source: Box<StoreError>,
    },
    /// The operation was cancelled (a writer thread stopped).
    #[error("{0}")]
    Aborted(String),
    /// A held remote object (a session) was not refreshed for so long that
    /// another process may take its lease as lost.
    #[error("{path}: not refreshed for {age_secs} s, too close to its {lease_secs} s lease{why}")]
    LeaseLost {
        /// The object's URL.
        path: PathBuf,
        /// Seconds since the last successful refresh.
        age_secs: u64,
        /// The lease, in seconds.
        lease_secs: u64,
        /// The last refresh's error, as `: <error>`, or empty.
        why: String,
    },
    /// A held remote object (a session, a lock) was removed or replaced
    /// by another process (`cairn unlock --remove-all`, or a taker that
    /// found its lease run out): what it guarded may be gone.
    #[error(
        "{path}: removed or taken over by another process (cairn unlock --remove-all, \
         or a lease taken for dead); nothing is committed on it"
    )]
    HoldTaken {
        /// The object's URL.
        path: PathBuf,
    },
}

/// Results of the store.
pub type Result<T> = std::result::Result<T, StoreError>;

/// Attach a path and an action to an `io::Error`.
pub(crate) trait IoContext<T> {
    fn ctx(self, path: impl Into<PathBuf>, what: &'static str) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx(self, path: impl Into<PathBuf>, what: &'static str) -> Result<T> {
        self.map_err(|source| StoreError::Io {
            path: path.into(),
            what,
            source,
        })
    }
}

impl StoreError {
    /// Whether the error is a full disk (ENOSPC), here or in a cause.
    pub fn is_no_space(&self) -> bool {
        match self {
            StoreError::Io { source, .. }
            | StoreError::Source { source, .. }
            | StoreError::Dest { source, .. } => {
                source.raw_os_error() == Some(libc::ENOSPC)
                    || source.kind() == io::ErrorKind::StorageFull
            }
            StoreError::InImage { source, .. } | StoreError::InSnapshot { source, .. } => {
                source.is_no_space()
            }
            _ => false,
        }
    }

    /// Whether a read's error is a failure to read (an I/O or network
    /// error: what was asked for is not known to be damaged) rather than
    /// damage found in what was read. verify, repair and restore tell
    /// the two apart by this alone.
    pub fn is_read_failure(&self) -> bool {
        matches!(self, StoreError::Io { .. })
    }

    /// A `Corrupt` error.
    pub(crate) fn corrupt(
        path: impl Into<PathBuf>,
        offset: u64,
        reason: impl Into<String>,
    ) -> Self {
        StoreError::Corrupt {
            path: path.into(),
            offset,
            reason: reason.into(),
        }
    }
}
