//! The etcd v3 gRPC API (KV, Lease, Cluster, Maintenance) and oncekv's Session service.
//!
//! Handlers translate requests to core ops, propose or read through [`NodeCore`], and map
//! every refusal to the gRPC status etcd would send, with etcd's message.

mod cluster;
pub mod convert;
mod kv;
mod lease;
mod session;

pub use cluster::{ClusterService, MaintenanceService};
pub use kv::KvService;
pub use lease::LeaseService;
pub use oncekv_proto::SessionMeta;
pub use session::SessionService;

use oncekv_core::{Command, Op, OpError, OpReply, Response, SessionError, Tracked};
use oncekv_proto::ErrorDetail;
use oncekv_proto::metadata::MetadataError;

use tonic::{Code, Status};

use std::sync::Arc;

use crate::node::NodeCore;
use crate::pb::etcdserverpb::ResponseHeader;
use crate::proposer::ProposeError;
use crate::transport::MessageKind;

/// Why a request failed, before it becomes a gRPC status.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Op(#[from] OpError),
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error(transparent)]
    Propose(#[from] ProposeError),
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
        | OpError::EmptyKey => Code::InvalidArgument,
    }
}

impl NodeCore {
    /// etcd's response header at `revision`.
    pub fn header(&self, revision: i64) -> Option<ResponseHeader> {
        Some(ResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.id,
            revision,
            raft_term: self.term(),
        })
    }

    /// Refuses a request whose encoding exceeds `--max-request-bytes`.
    pub fn check_size(&self, req: &impl prost::Message) -> Result<(), ApiError> {
        if req.encoded_len() > self.config.max_request_bytes {
            return Err(ApiError::TooLarge);
        }
        Ok(())
    }

    /// Proposes `op`, tracked under the session in `meta` if there is one (exactly once),
    /// untracked otherwise (etcd behaviour).
    pub async fn execute(
        self: &Arc<Self>,
        op: Op,
        meta: Option<SessionMeta>,
    ) -> Result<OpReply, ApiError> {
        if let Some(delay) = self.peers.duplicate(MessageKind::ClientWrite) {
            // The network delivered this request twice; the copy's reply goes nowhere.
            let (node, op) = (self.clone(), op.clone());
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = node.execute_once(op, meta).await;
            });
        }
        self.execute_once(op, meta).await
    }

    async fn execute_once(&self, op: Op, meta: Option<SessionMeta>) -> Result<OpReply, ApiError> {
        let response = match meta {
            Some(m) => {
                let key = (m.client_id, m.seq, op.fingerprint());
                let command = Command::Tracked(Tracked {
                    client_id: m.client_id,
                    secret: m.secret,
                    seq: m.seq,
                    first_incomplete: m.first_incomplete,
                    op,
                });
                self.propose_tracked(key, command).await?
            }
            None => self.propose(Command::Untracked(op)).await?,
        };
        match response {
            Response::Op(Ok(reply)) => Ok(reply),
            Response::Op(Err(e)) => Err(ApiError::Session(e)),
            other => Err(ApiError::Internal(format!("{other:?}"))),
        }
    }

    /// Proposes a tracked command, or, if the same request (`(client_id, seq)` and op
    /// fingerprint) is already being
    /// proposed through this node, waits for that one's response (the request waiting
    /// list). Correctness does not depend on this: a duplicate that does get proposed is
    /// answered from the session's saved response by the state machine.
    async fn propose_tracked(
        &self,
        key: (u64, u64, u64),
        command: Command,
    ) -> Result<Response, ProposeError> {
        if self.in_flight.contains_key(&key) {
            let deadline = tokio::time::Instant::now().into_std() + self.config.request_timeout;
            return match self.in_flight.register(key, Some(deadline)).await {
                Ok(result) => result,
                Err(e) => Err(crate::node::wait_error(e)),
            };
        }
        // Held while proposing so the key is visibly in flight; dropped on every path.
        let _marker = self.in_flight.register(key, None);
        let result = self.propose(command).await;
        self.in_flight.complete(&key, result.clone());
        result
    }
}
