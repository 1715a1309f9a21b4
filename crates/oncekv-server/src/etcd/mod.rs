//! The etcd v3 gRPC API (KV, Lease, Cluster, Maintenance) and oncekv's Session service.
//!
//! Handlers translate requests to core ops, propose or read through [`NodeCore`], and map
//! every refusal to the gRPC status etcd would send, with etcd's message (see
//! [`crate::error`]).

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

use std::sync::Arc;

use oncekv_core::{Command, Op, OpReply, Response, Tracked};

use crate::error::{ApiError, ProposeError};
use crate::node::NodeCore;
use crate::pb::etcdserverpb::ResponseHeader;
use crate::transport::MessageKind;

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
                Err(e) => Err(e.into()),
            };
        }
        // Held while proposing so the key is visibly in flight; dropped on every path.
        let _marker = self.in_flight.register(key, None);
        let result = self.propose(command).await;
        self.in_flight.complete(&key, result.clone());
        result
    }
}
