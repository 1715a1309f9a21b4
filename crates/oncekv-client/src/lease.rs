//! The lease calls: grant, revoke, one keep-alive round, time-to-live, list.

use oncekv_proto::etcdserverpb::lease_client::LeaseClient;
use oncekv_proto::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseLeasesRequest, LeaseRevokeRequest,
    LeaseTimeToLiveRequest,
};
use tonic::{Request, Status};

use crate::client::{Client, Kind};
use crate::error::Error;
use crate::responses::{
    LeaseGrantResponse, LeaseKeepAliveResponse, LeaseRevokeResponse, LeaseTimeToLiveResponse,
};

impl Client {
    /// Grants a lease of `ttl` seconds. `id` 0 lets the cluster pick the ID. Exactly once:
    /// a retried grant with an explicit `id` succeeds once, never "lease already exists".
    pub async fn lease_grant(&self, ttl: i64, id: i64) -> Result<LeaseGrantResponse, Error> {
        let req = LeaseGrantRequest { ttl, id };
        self.call(Kind::Write, "lease grant", req, |ch, r| async move {
            Ok(LeaseClient::new(ch).lease_grant(r).await?.into_inner())
        })
        .await
        .map(LeaseGrantResponse::from)
    }

    /// Revokes lease `id` and deletes its keys. [`Error::LeaseNotFound`] if it does not
    /// exist (a retry of a revoke that took effect answers success, not that).
    pub async fn lease_revoke(&self, id: i64) -> Result<LeaseRevokeResponse, Error> {
        let req = LeaseRevokeRequest { id };
        self.call(Kind::Write, "lease revoke", req, |ch, r| async move {
            Ok(LeaseClient::new(ch).lease_revoke(r).await?.into_inner())
        })
        .await
        .map(|r| LeaseRevokeResponse {
            header: r.header.into(),
        })
    }

    /// Renews lease `id` once (one round on the `LeaseKeepAlive` stream).
    /// [`Error::LeaseNotFound`] if the lease is gone.
    pub async fn lease_keep_alive(&self, id: i64) -> Result<LeaseKeepAliveResponse, Error> {
        let req = LeaseKeepAliveRequest { id };
        let resp = self
            .call(Kind::Write, "lease keep-alive", req, |ch, r| async move {
                // etcd sends no response headers before its first reply, so the request
                // must already be in the stream when the call is awaited.
                let (metadata, extensions, message) = r.into_parts();
                let request =
                    Request::from_parts(metadata, extensions, tokio_stream::once(message));
                let mut replies = LeaseClient::new(ch)
                    .lease_keep_alive(request)
                    .await?
                    .into_inner();
                match replies.message().await? {
                    Some(reply) => Ok(reply),
                    None => Err(Status::unavailable(
                        "the lease keep-alive stream ended without a reply",
                    )),
                }
            })
            .await?;
        if resp.ttl <= 0 {
            return Err(Error::LeaseNotFound);
        }
        Ok(LeaseKeepAliveResponse {
            header: resp.header.into(),
            id: resp.id,
            ttl: resp.ttl,
        })
    }

    /// Lease `id`'s remaining and granted TTL, and its keys if `keys`. A lease that does
    /// not exist answers `ttl == -1` (as etcd does).
    pub async fn lease_time_to_live(
        &self,
        id: i64,
        keys: bool,
    ) -> Result<LeaseTimeToLiveResponse, Error> {
        let req = LeaseTimeToLiveRequest { id, keys };
        self.call(Kind::Read, "lease time-to-live", req, |ch, r| async move {
            Ok(LeaseClient::new(ch)
                .lease_time_to_live(r)
                .await?
                .into_inner())
        })
        .await
        .map(LeaseTimeToLiveResponse::from)
    }

    /// The IDs of every lease.
    pub async fn lease_leases(&self) -> Result<Vec<i64>, Error> {
        self.call(
            Kind::Read,
            "lease leases",
            LeaseLeasesRequest {},
            |ch, r| async move { Ok(LeaseClient::new(ch).lease_leases(r).await?.into_inner()) },
        )
        .await
        .map(|r| r.leases.into_iter().map(|l| l.id).collect())
    }
}
