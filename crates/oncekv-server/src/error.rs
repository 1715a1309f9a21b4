//! The errors of a node's request path, and how each reaches the client.
//!
//! Three kinds, kept apart so a caller knows from the error alone what to do:
//! - [`ProposeError`]: the request got no answer (no leader, timeout, stopping). The
//!   outcome is unknown; a tracked request may be retried, the session absorbs a
//!   duplicate. [`ProposeError::Internal`] is a bug and is never retried.
//! - [`ApiError`]: everything a handler can refuse with, including the state machine's
//!   answers (`SessionExpired`, `Stale`, `LeaseNotFound`, ...), which are final.
//! - [`StartError`]: why a node could not start.
//!
//! `From<ApiError> for Status` gives every refusal the gRPC code and message etcd sends,
//! plus oncekv's machine-readable [`ErrorDetail`].

use std::net::SocketAddr;

use oncekv_core::waiting_list::WaitError;
use oncekv_core::{OpError, SessionError};
use oncekv_proto::ErrorDetail;
use oncekv_proto::metadata::MetadataError;
use tonic::{Code, Status};

use crate::types::NodeId;

/// Why a proposal got no response. Each leaves the command's outcome unknown: an entry
/// appended by a leader that then lost leadership may still commit. Only a tracked command
/// can be retried safely (the session rules absorb a duplicate).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum ProposeError {
    #[error("etcdserver: not leader (leader is {leader:?})")]
    NotLeader { leader: Option<NodeId> },
    #[error("etcdserver: no leader")]
    NoLeader,
    #[error("etcdserver: request timed out")]
    Timeout,
    #[error("etcdserver: server stopped")]
    Stopped,
    /// The leader's peer address could not be dialed.
    #[error("oncekv: cannot reach the leader: {0}")]
    PeerUnreachable(String),
    #[error("etcdserver: {0}")]
    Internal(String),
}

/// A waiting-list failure as the error the client sees.
impl From<WaitError<ProposeError>> for ProposeError {
    fn from(e: WaitError<ProposeError>) -> ProposeError {
        match e {
            WaitError::Failed(e) => e,
            WaitError::Timeout => ProposeError::Timeout,
            WaitError::QuorumUnreachable => ProposeError::NoLeader,
            WaitError::Closed => ProposeError::Stopped,
        }
    }
}

/// Why a request failed, before it becomes a gRPC status.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Op(#[from] OpError),
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error(transparent)]
    Propose(#[from] ProposeError),
    #[error(transparent)]
    Auth(#[from] oncekv_core::AuthError),
    #[error("etcdserver: request is too large")]
    TooLarge,
    #[error("{0}")]
    InvalidArgument(String),
    #[error("oncekv: unexpected response from the state machine: {0}")]
    Internal(String),
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Status {
        let msg = e.to_string();
        let (code, detail) = match &e {
            ApiError::Op(op) => (op_code(op), op_detail(op)),
            ApiError::Session(s) => match s {
                SessionError::SessionExpired { .. } => {
                    (Code::FailedPrecondition, ErrorDetail::SessionExpired)
                }
                SessionError::PermissionDenied { .. } => {
                    (Code::PermissionDenied, ErrorDetail::PermissionDenied)
                }
                SessionError::Stale { .. } => (Code::FailedPrecondition, ErrorDetail::Stale),
                SessionError::WindowExceeded { .. } => {
                    (Code::ResourceExhausted, ErrorDetail::WindowExceeded)
                }
                SessionError::SeqReused { .. } => {
                    (Code::FailedPrecondition, ErrorDetail::SeqReused)
                }
            },
            ApiError::Propose(p) => match p {
                ProposeError::NotLeader { .. } => (Code::Unavailable, ErrorDetail::NotLeader),
                ProposeError::NoLeader => (Code::Unavailable, ErrorDetail::NoLeader),
                // etcd sends its "request timed out" as Unavailable too.
                ProposeError::Timeout => (Code::Unavailable, ErrorDetail::Timeout),
                ProposeError::PeerUnreachable(_) => {
                    (Code::Unavailable, ErrorDetail::PeerUnreachable)
                }
                ProposeError::Stopped => (Code::Unavailable, ErrorDetail::Stopping),
                ProposeError::Internal(_) => (Code::Internal, ErrorDetail::Bug),
            },
            ApiError::Auth(a) => {
                use oncekv_core::AuthError as A;
                match a {
                    A::PermissionDenied => (Code::PermissionDenied, ErrorDetail::PermissionDenied),
                    A::UserEmpty | A::RoleEmpty | A::AuthFailed | A::AuthOldRevision => {
                        (Code::InvalidArgument, ErrorDetail::Auth)
                    }
                    A::InvalidAuthToken => (Code::Unauthenticated, ErrorDetail::Auth),
                    _ => (Code::FailedPrecondition, ErrorDetail::Auth),
                }
            }
            ApiError::TooLarge | ApiError::InvalidArgument(_) => {
                (Code::InvalidArgument, ErrorDetail::InvalidArgument)
            }
            ApiError::Internal(_) => (Code::Internal, ErrorDetail::Bug),
        };
        let mut status = Status::new(code, msg);
        detail.attach(&mut status);
        status
    }
}

impl From<MetadataError> for ApiError {
    fn from(e: MetadataError) -> ApiError {
        ApiError::InvalidArgument(e.to_string())
    }
}

/// The machine-readable detail of a store refusal (etcd clients match on the message;
/// oncekv's client reads this instead).
fn op_detail(e: &OpError) -> ErrorDetail {
    match e {
        OpError::LeaseNotFound => ErrorDetail::LeaseNotFound,
        OpError::LeaseAlreadyExists => ErrorDetail::LeaseAlreadyExists,
        OpError::LeaseTtlTooLarge => ErrorDetail::LeaseTtlTooLarge,
        OpError::KeyNotFound => ErrorDetail::KeyNotFound,
        OpError::LeaseProvided => ErrorDetail::LeaseProvided,
        OpError::ValueProvided => ErrorDetail::ValueProvided,
        OpError::Compacted => ErrorDetail::Compacted,
        OpError::FutureRevision => ErrorDetail::FutureRevision,
        OpError::DuplicateKey => ErrorDetail::DuplicateKey,
        OpError::TooManyOps => ErrorDetail::TooManyOps,
        OpError::EmptyKey => ErrorDetail::EmptyKey,
        OpError::NoSpace => ErrorDetail::NoSpace,
        OpError::Corrupt => ErrorDetail::Corrupt,
        OpError::AuthOldRevision => ErrorDetail::Auth,
    }
}

/// The gRPC code etcd uses for each store refusal.
fn op_code(e: &OpError) -> Code {
    match e {
        OpError::LeaseNotFound => Code::NotFound,
        OpError::LeaseAlreadyExists => Code::FailedPrecondition,
        OpError::LeaseTtlTooLarge | OpError::Compacted | OpError::FutureRevision => {
            Code::OutOfRange
        }
        OpError::KeyNotFound
        | OpError::LeaseProvided
        | OpError::ValueProvided
        | OpError::DuplicateKey
        | OpError::TooManyOps
        | OpError::EmptyKey
        | OpError::AuthOldRevision => Code::InvalidArgument,
        OpError::NoSpace => Code::ResourceExhausted,
        OpError::Corrupt => Code::DataLoss,
    }
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("member {0:?} is not in --initial-cluster")]
    NotAMember(String),
    #[error("opening the log: {0}")]
    Log(#[from] crate::log_store::LogError),
    #[error("opening the state machine: {0}")]
    StateMachine(String),
    #[error("this member's identity file: {0}")]
    Identity(String),
    /// An etcd data directory (`member/snap/db`) could not be imported.
    #[error("importing etcd's data directory: {0}")]
    Import(String),
    /// The log is not where this start looks for it (`--wal-dir` changed or dropped).
    #[error("{0}")]
    WalDir(String),
    #[error(
        "joining the cluster (--initial-cluster-state existing): no member of --initial-cluster \
         knows a member with peer URL {peer_url}; add it first (etcdctl member add NAME \
         --peer-urls={peer_url}). Answers: {answers}"
    )]
    Join { peer_url: String, answers: String },
    #[error(
        "the log was compacted through index {purged}, but the snapshot holding those entries \
         ({}) is {}; this member cannot rebuild its state from its own data. Put the snapshot \
         file back, or, if the rest of the cluster is healthy, remove this member's data \
         directory and re-add it (member remove, then member add and start it with \
         --initial-cluster-state existing) so that it gets the leader's snapshot",
        snapshot.display(),
        match applied { Some(a) => format!("only at index {a}"), None => "missing".to_string() }
    )]
    MissingSnapshot {
        snapshot: std::path::PathBuf,
        purged: u64,
        applied: Option<u64>,
    },
    #[error("raft: {0}")]
    Raft(String),
    #[error("TLS on the {port} port: {source}")]
    Tls {
        port: &'static str,
        source: oncekv_proto::tls::TlsError,
    },
    #[error("listening on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("listening on unix socket {}: {source}", path.display())]
    ListenUnix {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}
