//! etcd's Lock service (`v3lockpb.Lock`): a lock is the queue of keys under `name/`
//! (see [`super::queue`]); the holder is the key with the smallest create revision, and
//! that revision is the holder's fencing token.
//!
//! Lock is one write and a wait: [`Op::Enqueue`] puts the caller's key `name/<lease hex>`
//! (a lease the call names, or one granted in the same command), then the call waits for
//! its turn. Through an oncekv session the write is tracked, so a Lock retried after a lost
//! reply gets the saved key and waits for that, never queueing a second key; untracked (an
//! etcd client) it behaves as etcd's does, including the second waiter a retry with lease 0
//! leaves. Unlock is a plain delete of the key, as in etcd.

use std::sync::Arc;

use bytes::Bytes;
use oncekv_core::{DeleteRangeRequest, DeleteRangeResponse, EnqueueRequest, KeyRange, Op};
use oncekv_proto::SessionMeta;
use tonic::{Request, Response, Status};

use super::queue;
use crate::auth::{Caller, Need};
use crate::error::ApiError;
use crate::pb::v3lockpb as pb;
use crate::pb::v3lockpb::lock_server::Lock;
use crate::request_path::{Answered, NodeCore, Permit};

#[derive(Debug, Clone)]
pub struct LockService {
    pub node: Arc<NodeCore>,
}

fn delete_key(key: Bytes) -> Op {
    Op::DeleteRange(DeleteRangeRequest {
        range: KeyRange::single(key),
        prev_kv: false,
    })
}

/// Lock and Campaign write a key under `name/` and read the queue there (Leader and
/// Observe only read it): what they need with auth on, and, tracked, the session's owner.
pub(super) async fn authorize_queue(
    node: &NodeCore,
    caller: &Caller,
    name: &Bytes,
    meta: Option<&SessionMeta>,
    write: bool,
) -> Result<Permit, Status> {
    if !node.applied().auth_enabled() {
        return Ok(Permit::UNCHECKED);
    }
    let (start, end) = crate::auth::queue_range(name);
    let mut needs = vec![Need::Read(&start, &end)];
    if write {
        needs.push(Need::Write(&start, &end));
    }
    Ok(node.authorize_tracked(caller, &needs, meta).await?)
}

#[tonic::async_trait]
impl Lock for LockService {
    async fn lock(
        &self,
        request: Request<pb::LockRequest>,
    ) -> Result<Response<pb::LockResponse>, Status> {
        let meta = SessionMeta::from_metadata(request.metadata()).map_err(ApiError::from)?;
        let caller = Caller::of(&request);
        let r = request.into_inner();
        self.node.check_size(&r)?;
        let permit = authorize_queue(&self.node, &caller, &r.name, meta.as_ref(), true).await?;
        let req = EnqueueRequest {
            name: r.name,
            lease: r.lease,
            value: Bytes::new(),
            proclaim: false,
        };
        let (queued, revision) = queue::enqueue_and_wait(&self.node, req, (meta, permit), |q| {
            delete_key(q.key.clone())
        })
        .await?;
        Ok(Response::new(pb::LockResponse {
            header: self.node.header(revision),
            key: queued.key,
        }))
    }

    async fn unlock(
        &self,
        request: Request<pb::UnlockRequest>,
    ) -> Result<Response<pb::UnlockResponse>, Status> {
        let meta = SessionMeta::from_metadata(request.metadata()).map_err(ApiError::from)?;
        let caller = Caller::of(&request);
        let r = request.into_inner();
        self.node.check_size(&r)?;
        let op = delete_key(r.key);
        let permit = self.node.authorize_op(&caller, &op, meta.as_ref()).await?;
        let deleted: Answered<DeleteRangeResponse> = self.node.execute_as(op, meta, permit).await?;
        Ok(Response::new(pb::UnlockResponse {
            header: self.node.header(deleted.revision),
        }))
    }
}
