//! etcd's Lease service, relayed. Grant and revoke are tracked writes (a grant with an
//! explicit ID retried after a lost reply succeeds once, never "lease already exists").
//!
//! **Keep-alives are coalesced**, as etcd's proxy coalesces them: many downstream
//! streams often keep the same lease alive (every replica of an application, every
//! retry of a client that reconnected). While a keep-alive of a lease is on its way to
//! the cluster, another one for the same lease from the same user joins it and gets its
//! answer, so the cluster sees one renewal where downstream sent many. A renewal answered
//! to several callers is still a renewal for each: the lease's TTL restarts when the
//! cluster applies it, after every joined request was sent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use oncekv_client::{CallKind, Client};
use oncekv_proto::etcdserverpb::lease_client::LeaseClient;
use oncekv_proto::etcdserverpb::lease_server::Lease;
use oncekv_proto::etcdserverpb::*;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::relay::relay;
use crate::upstream::{Upstream, token_of};

type Renewal = Shared<BoxFuture<'static, Result<LeaseKeepAliveResponse, Status>>>;

/// Keep-alive replies a downstream stream may have queued before the proxy stops reading
/// its requests (a client that never reads its replies holds no more than this).
const STREAM_QUEUE: usize = 64;

#[derive(Debug)]
pub(crate) struct LeaseProxy {
    pub(crate) up: Arc<Upstream>,
    renewals: Arc<Renewals>,
}

/// The renewals on their way to the cluster, by (token, lease id).
#[derive(Default)]
struct Renewals(Mutex<HashMap<(Option<String>, i64), Renewal>>);

impl std::fmt::Debug for Renewals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renewals").finish_non_exhaustive()
    }
}

impl LeaseProxy {
    pub(crate) fn new(up: Arc<Upstream>) -> LeaseProxy {
        LeaseProxy {
            up,
            renewals: Arc::default(),
        }
    }
}

/// Renews lease `id` for the user of `token`, joining a renewal already on its way.
async fn renew(
    up: &Arc<Upstream>,
    renewals: &Renewals,
    client: Client,
    token: Option<String>,
    id: i64,
) -> Result<LeaseKeepAliveResponse, Status> {
    let key = (token, id);
    let renewal = {
        let mut map = renewals.0.lock().unwrap_or_else(PoisonError::into_inner);
        match map.get(&key) {
            Some(r) => {
                up.metrics.keepalives_coalesced.inc();
                r.clone()
            }
            None => {
                up.metrics.keepalives_sent.inc();
                let up = up.clone();
                let r = async move {
                    up.call(
                        client,
                        CallKind::Write,
                        "lease keep-alive",
                        LeaseKeepAliveRequest { id },
                        |ch, r| async move {
                            // etcd sends no response headers before its first reply,
                            // so the request must be in the stream before the call
                            // is awaited.
                            let (md, ext, msg) = r.into_parts();
                            let r = Request::from_parts(md, ext, tokio_stream::once(msg));
                            let mut replies =
                                LeaseClient::new(ch).lease_keep_alive(r).await?.into_inner();
                            replies.message().await?.ok_or_else(|| {
                                Status::unavailable("the lease keep-alive stream ended")
                            })
                        },
                    )
                    .await
                }
                .boxed()
                .shared();
                map.insert(key.clone(), r.clone());
                r
            }
        }
    };
    let result = renewal.clone().await;
    let mut map = renewals.0.lock().unwrap_or_else(PoisonError::into_inner);
    if map.get(&key).is_some_and(|r| r.ptr_eq(&renewal)) {
        map.remove(&key);
    }
    result
}

#[tonic::async_trait]
impl Lease for LeaseProxy {
    async fn lease_grant(
        &self,
        request: Request<LeaseGrantRequest>,
    ) -> Result<Response<LeaseGrantResponse>, Status> {
        relay!(
            self,
            request,
            CallKind::Write,
            "lease grant",
            LeaseClient::lease_grant
        )
    }

    async fn lease_revoke(
        &self,
        request: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        relay!(
            self,
            request,
            CallKind::Write,
            "lease revoke",
            LeaseClient::lease_revoke
        )
    }

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<tonic::codegen::BoxStream<LeaseKeepAliveResponse>>, Status> {
        let token = token_of(&request)?;
        let client = self.up.client_for(&request)?;
        let mut requests = request.into_inner();
        let (out, replies) = mpsc::channel(STREAM_QUEUE);
        let up = self.up.clone();
        let renewals = self.renewals.clone();
        tokio::spawn(async move {
            // One renewal at a time per stream, in order, as etcd answers a stream: a
            // client sends its next keep-alive after the reply to the last.
            while let Ok(Some(req)) = requests.message().await {
                let reply = renew(&up, &renewals, client.clone(), token.clone(), req.id).await;
                let end = reply.is_err();
                if out.send(reply).await.is_err() || end {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(replies))))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        relay!(
            self,
            request,
            CallKind::Read,
            "lease time-to-live",
            LeaseClient::lease_time_to_live
        )
    }

    async fn lease_leases(
        &self,
        request: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        relay!(
            self,
            request,
            CallKind::Read,
            "lease leases",
            LeaseClient::lease_leases
        )
    }
}
