//! Errors of the log store.

use std::io;
use std::path::PathBuf;

use openraft::{AnyError, ErrorSubject, ErrorVerb, NodeId, StorageError, StorageIOError};

/// Everything that can go wrong in the log store. All variants are fatal for the node:
/// openraft shuts a node down on any [`StorageError`], and that is the intent.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// A file operation failed.
    #[error("raft log: cannot {op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// A segment holds damage that is not a torn, unacknowledged tail: acknowledged data
    /// was altered on disk. Refuse to start; restore this node from its peers.
    #[error(
        "raft log is corrupt in {} at offset {offset}: {reason}; refusing to start \
         (wipe this node's data directory and let it rejoin from its peers)",
        path.display()
    )]
    Corrupt {
        /// The segment file.
        path: PathBuf,
        /// Byte offset of the damaged record or header.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// An append would leave a hole or rewrite purged entries.
    #[error("raft log: {0}")]
    Inconsistent(String),
    /// An entry or record could not be encoded.
    #[error("raft log: cannot encode a record: {0}")]
    Encode(#[from] postcard::Error),
    /// A record read back for replication failed its checksum or could not be decoded.
    #[error("raft log: bad record read back from {} at offset {offset}: {reason}", path.display())]
    BadRead {
        /// The segment file.
        path: PathBuf,
        /// Byte offset of the payload.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// The writer thread hit an I/O error earlier; the log accepts no more writes.
    #[error("raft log writer failed earlier and accepts no more writes: {0}")]
    WriterFailed(String),
    /// The writer thread is gone (it panicked or the store is shutting down).
    #[error("raft log writer thread is gone")]
    WriterGone,
}

impl LogError {
    pub(super) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> LogError {
        LogError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// Converts into openraft's error, naming what was being done.
    pub(super) fn into_storage<NID: NodeId>(
        self,
        subject: ErrorSubject<NID>,
        verb: ErrorVerb,
    ) -> StorageError<NID> {
        StorageIOError::new(subject, verb, AnyError::new(&self)).into()
    }
}

impl<NID: NodeId> From<LogError> for StorageError<NID> {
    fn from(e: LogError) -> Self {
        e.into_storage(ErrorSubject::Logs, ErrorVerb::Write)
    }
}
