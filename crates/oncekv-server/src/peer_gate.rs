//! Who may talk to the peer port, decided from the request headers before the body is
//! read.
//!
//! Every peer request carries the sender's cluster id and member id
//! ([`PeerChannels::tag`](crate::network::PeerChannels::tag)). The gate, a layer in front
//! of the peer service:
//!
//! - refuses a request naming another cluster (PermissionDenied), without reading its
//!   body;
//! - lets a request naming this cluster through, its body capped at the raft message
//!   limit;
//! - lets anyone else (a member still joining, which does not know the cluster yet, or a
//!   stranger) send only `Forward`, capped at [`MAX_OUTSIDER_BYTES`], where the peer
//!   service answers only `Identify` (who has a peer URL) to them.
//!
//! So garbage from a sender that does not name the cluster costs the member at most
//! [`MAX_OUTSIDER_BYTES`] per stream (plus HTTP/2's flow-control window), and raft
//! messages are decoded only from senders naming this cluster.
//!
//! The sender's member id is not checked against this member's configuration: that view
//! can be stale (a member restarted after being down while a member it has never heard of
//! took over the lead must still accept that leader's appends), and the cluster id is
//! not a secret (it is in every response header). Proving who a peer is takes peer TLS
//! with a cluster CA; this gate only keeps strangers and other clusters out cheaply.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body_util::Limited;

use crate::network::{PEER_CLUSTER_KEY, PEER_MEMBER_KEY, peer_message_limit};
use crate::request_path::NodeCore;

/// The most an outsider's request body may hold: an `Identify` is a few hundred bytes.
pub const MAX_OUTSIDER_BYTES: usize = 64 * 1024;

/// The only method an outsider may call.
const FORWARD_PATH: &str = "/oncekv.Raft/Forward";

/// Put into the extensions of a request from a sender that is not a member.
#[derive(Debug, Clone, Copy)]
pub struct Outsider;

/// What the gate decided for a request.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Member,
    Outsider,
    Refuse(String),
}

fn header_id(headers: &http::HeaderMap, key: &str) -> Option<u64> {
    let v = headers.get(key)?.to_str().ok()?;
    u64::from_str_radix(v, 16).ok()
}

fn judge(core: &NodeCore, headers: &http::HeaderMap, path: &str) -> Verdict {
    let cluster = header_id(headers, PEER_CLUSTER_KEY);
    let member = header_id(headers, PEER_MEMBER_KEY);
    if let Some(cluster) = cluster
        && cluster != core.cluster_id()
    {
        return Verdict::Refuse(format!(
            "oncekv: the sender belongs to cluster {cluster:x}, this member to cluster {:x}",
            core.cluster_id()
        ));
    }
    // Raft messages only from senders naming this cluster; anyone may ask Identify.
    if cluster.is_some() && member.is_some() {
        Verdict::Member
    } else if path == FORWARD_PATH {
        Verdict::Outsider
    } else {
        Verdict::Refuse("oncekv: only members of this cluster may send raft messages (the request names no cluster)".into())
    }
}

/// The gate, as a tower layer for tonic's server.
#[derive(Debug, Clone)]
pub struct PeerGate {
    pub core: Arc<NodeCore>,
}

impl<S> tower::Layer<S> for PeerGate {
    type Service = PeerGateService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PeerGateService {
            inner,
            core: self.core.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct PeerGateService<S> {
    inner: S,
    core: Arc<NodeCore>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for PeerGateService<S>
where
    S: tower::Service<http::Request<Limited<B>>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let verdict = judge(&self.core, req.headers(), req.uri().path());
        let (mut parts, body) = req.into_parts();
        let limit = match verdict {
            Verdict::Refuse(why) => {
                tracing::debug!("peer port: refused a request: {why}");
                let resp = tonic::Status::permission_denied(why).into_http();
                return Box::pin(async move { Ok(resp) });
            }
            Verdict::Outsider => {
                parts.extensions.insert(Outsider);
                MAX_OUTSIDER_BYTES
            }
            // A little over the largest message, for gRPC's framing.
            Verdict::Member => peer_message_limit(self.core.config()) + 1024,
        };
        let req = http::Request::from_parts(parts, Limited::new(body, limit));
        Box::pin(self.inner.call(req))
    }
}
