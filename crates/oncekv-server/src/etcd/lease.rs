//! etcd's Lease service. Grants, revokes and keep-alives go through the log (expiry is
//! decided by cluster time, on every replica alike); TimeToLive and Leases read.

use std::sync::Arc;

use futures::StreamExt;
use oncekv_core::{Op, OpError};
use tokio::sync::watch;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::{Caller, Need};
use crate::error::ApiError;
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::lease_server::Lease;
use crate::request_path::{
    Answered, LeaseGranted, LeaseKept, LeaseRevoked, NodeCore, Permit, answer,
};
use oncekv_proto::SessionMeta;

#[derive(Debug, Clone)]
pub struct LeaseService {
    pub node: Arc<NodeCore>,
    /// The server's stop: a keep-alive stream ends there. Clients hold theirs open for as
    /// long as they run, and the graceful shutdown would otherwise wait out its grace.
    pub stop: watch::Receiver<bool>,
}

#[tonic::async_trait]
impl Lease for LeaseService {
    async fn lease_grant(
        &self,
        request: Request<pb::LeaseGrantRequest>,
    ) -> Result<Response<pb::LeaseGrantResponse>, Status> {
        let meta = SessionMeta::from_metadata(request.metadata()).map_err(ApiError::from)?;
        let caller = Caller::of(&request);
        let r = request.into_inner();
        let op = Op::LeaseGrant {
            id: r.id,
            ttl: r.ttl,
        };
        let permit = self.node.authorize_op(&caller, &op, meta.as_ref()).await?;
        let granted: Answered<LeaseGranted> = self.node.execute_as(op, meta, permit).await?;
        Ok(Response::new(pb::LeaseGrantResponse {
            header: self.node.header(granted.revision),
            id: granted.answer.id,
            ttl: granted.answer.ttl,
            error: String::new(),
        }))
    }

    async fn lease_revoke(
        &self,
        request: Request<pb::LeaseRevokeRequest>,
    ) -> Result<Response<pb::LeaseRevokeResponse>, Status> {
        let meta = SessionMeta::from_metadata(request.metadata()).map_err(ApiError::from)?;
        let caller = Caller::of(&request);
        let r = request.into_inner();
        let op = Op::LeaseRevoke { id: r.id };
        let permit = if self.node.applied().auth_enabled() {
            // Revoking deletes the lease's keys: etcd asks for write permission on each.
            let keys = {
                let inner = self.node.applied().read();
                let now = inner.sm.cluster_time();
                inner
                    .sm
                    .leases()
                    .status(r.id, true, now)
                    .map(|s| s.keys)
                    .unwrap_or_default()
            };
            let no_end = bytes::Bytes::new();
            let mut needs: Vec<Need<'_>> = keys.iter().map(|k| Need::Write(k, &no_end)).collect();
            needs.push(Need::Anyone);
            self.node
                .authorize_tracked(&caller, &needs, meta.as_ref())
                .await?
        } else {
            Permit::UNCHECKED
        };
        let revoked: Answered<LeaseRevoked> = self.node.execute_as(op, meta, permit).await?;
        Ok(Response::new(pb::LeaseRevokeResponse {
            header: self.node.header(revoked.revision),
        }))
    }

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<pb::LeaseKeepAliveRequest>>,
    ) -> Result<Response<BoxStream<pb::LeaseKeepAliveResponse>>, Status> {
        let node = self.node.clone();
        // A stream has one set of metadata: with a session, its seq numbers the stream's
        // first keep-alive (the oncekv client opens a stream per keep-alive); later ones
        // on the same stream are untracked, as etcd's are.
        let mut meta = SessionMeta::from_metadata(request.metadata()).map_err(ApiError::from)?;
        let caller = Caller::of(&request);
        let op = Op::LeaseKeepAlive { id: 0 };
        // The stream is checked once, as it opens. Its keep-alives are not checked again at
        // apply: a stream outlives auth changes, and etcd renews leases outside its log.
        let _checked_at_open = self.node.authorize_op(&caller, &op, meta.as_ref()).await?;
        let incoming = request
            .into_inner()
            .take_until(crate::runtime::stopped(self.stop.clone()));
        // One response per request, in order. A lease that is gone answers TTL 0, as etcd
        // does, rather than ending the stream.
        let out = incoming.then(move |req| {
            let node = node.clone();
            let meta = meta.take();
            async move {
                let req = req?;
                let reply = node
                    .execute(Op::LeaseKeepAlive { id: req.id }, meta, Permit::UNCHECKED)
                    .await?;
                let ttl = match reply.result {
                    Err(OpError::LeaseNotFound) => 0,
                    result => answer::<LeaseKept>(result)?.ttl,
                };
                Ok(pb::LeaseKeepAliveResponse {
                    header: node.header(reply.revision),
                    id: req.id,
                    ttl,
                })
            }
        });
        Ok(Response::new(Box::pin(out)))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<pb::LeaseTimeToLiveRequest>,
    ) -> Result<Response<pb::LeaseTimeToLiveResponse>, Status> {
        self.node
            .authorize(&Caller::of(&request), &[Need::Anyone])
            .await?;
        let r = request.into_inner();
        self.node.read_index().await.map_err(ApiError::from)?;
        let inner = self.node.applied().read();
        let now = inner
            .sm
            .cluster_time()
            .max(self.node.config().clock.now_ms());
        let revision = inner.sm.revision();
        // etcd answers an unknown lease with TTL -1 rather than an error.
        let resp = match inner.sm.leases().status(r.id, r.keys, now) {
            Some(s) => pb::LeaseTimeToLiveResponse {
                header: self.node.header(revision),
                id: r.id,
                ttl: s.ttl,
                granted_ttl: s.granted_ttl,
                keys: s.keys,
            },
            None => pb::LeaseTimeToLiveResponse {
                header: self.node.header(revision),
                id: r.id,
                ttl: -1,
                granted_ttl: 0,
                keys: Vec::new(),
            },
        };
        Ok(Response::new(resp))
    }

    async fn lease_leases(
        &self,
        request: Request<pb::LeaseLeasesRequest>,
    ) -> Result<Response<pb::LeaseLeasesResponse>, Status> {
        self.node
            .authorize(&Caller::of(&request), &[Need::Anyone])
            .await?;
        self.node.read_index().await.map_err(ApiError::from)?;
        let inner = self.node.applied().read();
        let leases = inner
            .sm
            .leases()
            .iter()
            .map(|(id, _)| pb::LeaseStatus { id: *id })
            .collect();
        Ok(Response::new(pb::LeaseLeasesResponse {
            header: self.node.header(inner.sm.revision()),
            leases,
        }))
    }
}
