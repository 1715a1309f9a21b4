//! etcd's KV service.

use std::sync::Arc;

use oncekv_core::{self as core, Op, validate_txn};
use tonic::{Request, Response, Status};

use super::convert;
use crate::auth::{Caller, Need};
use crate::error::ApiError;
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::kv_server::Kv;
use crate::request_path::{Answered, Compacted, NodeCore};
use oncekv_proto::SessionMeta;

#[derive(Debug, Clone)]
pub struct KvService {
    pub node: Arc<NodeCore>,
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn range(
        &self,
        request: Request<pb::RangeRequest>,
    ) -> Result<Response<pb::RangeResponse>, Status> {
        let caller = Caller::of(&request);
        let r = request.into_inner();
        self.node.check_size(&r)?;
        let req = convert::range_request(&r)?;
        if !r.serializable {
            // As etcd: a linearizable read's permissions are checked on state at least as
            // new as the read, so an auth change applied before it was sent counts.
            self.node.read_index().await.map_err(ApiError::from)?;
        }
        self.node
            .authorize(&caller, &[Need::Read(&req.range.key, &req.range.range_end)])
            .await?;
        // Caught up above when linearizable: the range itself need not wait again.
        let (revision, resp) = self.node.range(&req, true).await?;
        Ok(Response::new(convert::range_response(
            resp,
            self.node.header(revision),
        )))
    }

    async fn put(
        &self,
        request: Request<pb::PutRequest>,
    ) -> Result<Response<pb::PutResponse>, Status> {
        let meta = SessionMeta::from_metadata(request.metadata()).map_err(ApiError::from)?;
        let caller = Caller::of(&request);
        let r = request.into_inner();
        self.node.check_size(&r)?;
        let op = Op::Put(convert::put_request(r));
        let permit = self.node.authorize_op(&caller, &op, meta.as_ref()).await?;
        let done: Answered<core::PutResponse> = self.node.execute_as(op, meta, permit).await?;
        Ok(Response::new(convert::put_response(
            done.answer,
            self.node.header(done.revision),
        )))
    }

    async fn delete_range(
        &self,
        request: Request<pb::DeleteRangeRequest>,
    ) -> Result<Response<pb::DeleteRangeResponse>, Status> {
        let meta = SessionMeta::from_metadata(request.metadata()).map_err(ApiError::from)?;
        let caller = Caller::of(&request);
        let r = request.into_inner();
        self.node.check_size(&r)?;
        let op = Op::DeleteRange(convert::delete_request(r));
        let permit = self.node.authorize_op(&caller, &op, meta.as_ref()).await?;
        let done: Answered<core::DeleteRangeResponse> =
            self.node.execute_as(op, meta, permit).await?;
        Ok(Response::new(convert::delete_response(
            done.answer,
            self.node.header(done.revision),
        )))
    }

    async fn txn(
        &self,
        request: Request<pb::TxnRequest>,
    ) -> Result<Response<pb::TxnResponse>, Status> {
        let meta = SessionMeta::from_metadata(request.metadata()).map_err(ApiError::from)?;
        let caller = Caller::of(&request);
        let r = request.into_inner();
        self.node.check_size(&r)?;
        let txn = convert::txn_request(r)?;
        validate_txn(&txn, self.node.config().max_txn_ops).map_err(ApiError::from)?;
        let op = Op::Txn(txn);
        let permit = self.node.authorize_op(&caller, &op, meta.as_ref()).await?;
        let done: Answered<core::TxnResponse> = self.node.execute_as(op, meta, permit).await?;
        Ok(Response::new(convert::txn_response(
            done.answer,
            self.node.header(done.revision),
        )))
    }

    async fn compact(
        &self,
        request: Request<pb::CompactionRequest>,
    ) -> Result<Response<pb::CompactionResponse>, Status> {
        let meta = SessionMeta::from_metadata(request.metadata()).map_err(ApiError::from)?;
        let caller = Caller::of(&request);
        let r = request.into_inner();
        // Compaction is a log entry, so every replica drops the same history. `physical`
        // needs no extra wait: etcd's asks to wait for its backend's background cleanup,
        // but here the history is dropped in the state machine as the entry is applied,
        // and the answer comes only after that (through a follower, after the leader's
        // apply; the follower applies the same entry next, and a linearizable read there
        // waits for it).
        let op = Op::Compact {
            revision: r.revision,
        };
        let permit = self.node.authorize_op(&caller, &op, meta.as_ref()).await?;
        let done: Answered<Compacted> = self.node.execute_as(op, meta, permit).await?;
        Ok(Response::new(pb::CompactionResponse {
            header: self.node.header(done.revision),
        }))
    }
}
