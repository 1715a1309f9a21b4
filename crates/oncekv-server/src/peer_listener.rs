//! The receiving side of the peer port: raft messages and forwarded requests from other
//! members, answered by the node.
//!
//! Connections are told apart by their first bytes: framed ones (see
//! [`crate::peer_wire`]) are served in the connection's own task, the rest go to tonic
//! with those bytes put back, where `PeerService` answers the same calls over gRPC.
//! Both end in one function, so a call means the same whichever way it came. The sending
//! side, [`crate::peer_wire`] and [`crate::network`], needs nothing of the node.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufStream};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::error::ProposeError;
use crate::forwarder::{Forwarded, ForwardedReply};
use crate::pb::oncekv::raft_server::Raft as RaftRpc;
use crate::pb::oncekv::{ForwardReply, ForwardRequest, RaftReply, RaftRequest};
use crate::peer_wire::{MAGIC, Method, OK};
use crate::request_path::NodeCore;

/// How long a framed connection may sit idle on the receiving side before it is closed:
/// a caller that vanished without closing (a partition, a killed host) must not hold a
/// task and a connection slot for good. A caller notices the close before reusing it.
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// A connection whose first bytes were read to tell framed from gRPC, handed to the gRPC
/// server with those bytes put back in front.
#[derive(Debug)]
pub struct Sniffed<IO> {
    prefix: Vec<u8>,
    read: usize,
    io: IO,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Sniffed<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.read < this.prefix.len() {
            let rest = &this.prefix[this.read..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.read += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

crate::conn_guard::write_through!(Sniffed, io);

/// Reads up to [`MAGIC`]'s length from `io`, stopping at the first byte that differs
/// from it. `true` when the whole magic came.
async fn sniff<IO: AsyncRead + Unpin>(io: &mut IO, got: &mut Vec<u8>) -> io::Result<bool> {
    let mut buf = [0u8; 8];
    while got.len() < MAGIC.len() {
        let want = MAGIC.len() - got.len();
        let n = io.read(&mut buf[..want]).await?;
        if n == 0 {
            return Ok(false);
        }
        got.extend_from_slice(&buf[..n]);
        if got[..] != MAGIC[..got.len().min(MAGIC.len())] {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The peer port's connections, framed ones served here and the rest (gRPC) passed on
/// for tonic with their first bytes put back.
pub fn split<S, IO>(
    incoming: S,
    core: Arc<NodeCore>,
    stop: watch::Receiver<bool>,
) -> Pin<Box<dyn futures::Stream<Item = io::Result<Sniffed<IO>>> + Send>>
where
    S: futures::Stream<Item = io::Result<IO>> + Send + 'static,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    crate::conn_guard::prepare_each(incoming, move |mut io: IO| {
        let (core, stop) = (core.clone(), stop.clone());
        async move {
            let mut prefix = Vec::with_capacity(MAGIC.len());
            let sniffed = tokio::time::timeout(
                crate::conn_guard::FIRST_BYTES_TIMEOUT,
                sniff(&mut io, &mut prefix),
            )
            .await;
            match sniffed {
                Ok(Ok(true)) => {
                    serve_framed(io, core, stop).await;
                    None
                }
                Ok(Err(e)) => {
                    tracing::debug!("peer connection failed before a request: {e}");
                    None
                }
                // Not ours, or silent: gRPC's server decides what it is.
                Ok(Ok(false)) | Err(_) => Some(Sniffed {
                    prefix,
                    read: 0,
                    io,
                }),
            }
        }
    })
}

/// Serves one framed connection (its magic already read) until the caller closes it,
/// breaks the protocol, idles past [`IDLE_TIMEOUT`], or the node stops.
async fn serve_framed<IO>(io: IO, core: Arc<NodeCore>, mut stop: watch::Receiver<bool>)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut conn = BufStream::new(io);
    let limit = crate::network::peer_message_limit(core.config());
    let served = async {
        // The opening follows the magic at once; a sender that stops there, or in the
        // middle of a frame, must not hold the connection's slot for good.
        let stalled = || io::Error::new(io::ErrorKind::TimedOut, "the sender stalled");
        let mut hello = [0u8; 16];
        tokio::time::timeout(
            crate::conn_guard::FIRST_BYTES_TIMEOUT,
            conn.read_exact(&mut hello),
        )
        .await
        .map_err(|_| stalled())??;
        let cluster = u64::from_le_bytes(hello[..8].try_into().unwrap_or_default());
        if cluster != core.cluster_id() {
            let refusal = tonic::Status::permission_denied(format!(
                "oncekv: the sender belongs to cluster {cluster:x}, this member to cluster {:x}",
                core.cluster_id()
            ));
            return write_reply(&mut conn, Err(refusal)).await;
        }
        loop {
            let mut head = [0u8; 5];
            match tokio::time::timeout(IDLE_TIMEOUT, conn.read_exact(&mut head)).await {
                Ok(read) => read?,
                Err(_) => return Ok(()),
            };
            let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
            if len > limit {
                let refusal = tonic::Status::resource_exhausted(format!(
                    "oncekv: a peer message of {len} bytes is over this member's limit of {limit}"
                ));
                return write_reply(&mut conn, Err(refusal)).await;
            }
            let mut payload = vec![0u8; len];
            tokio::time::timeout(IDLE_TIMEOUT, conn.read_exact(&mut payload))
                .await
                .map_err(|_| stalled())??;
            let reply = match Method::from_u8(head[4]) {
                Some(method) => serve_peer_call(&core, method, &payload, false).await,
                None => Err(tonic::Status::unimplemented(format!(
                    "oncekv: unknown peer method {}",
                    head[4]
                ))),
            };
            write_reply(&mut conn, reply).await?;
        }
    };
    tokio::select! {
        result = served => {
            if let Err(e) = result
                && e.kind() != io::ErrorKind::UnexpectedEof
            {
                tracing::debug!("framed peer connection ended: {e}");
            }
        }
        _ = stop.wait_for(|s| *s) => {}
    }
}

async fn write_reply<IO: AsyncWrite + AsyncRead + Unpin>(
    conn: &mut BufStream<IO>,
    reply: Result<Vec<u8>, tonic::Status>,
) -> io::Result<()> {
    let (code, payload) = match reply {
        Ok(payload) => (OK, payload),
        Err(status) => (
            status.code() as i32 as u8,
            status.message().as_bytes().to_vec(),
        ),
    };
    let len = u32::try_from(payload.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "reply over 4 GiB"))?;
    conn.write_all(&len.to_le_bytes()).await?;
    conn.write_all(&[code]).await?;
    conn.write_all(&payload).await?;
    conn.flush().await
}

/// The receiving side of [`crate::network::PeerClient`] over gRPC (the framed
/// connections of [`crate::peer_wire`] carry the same calls).
#[derive(Debug)]
pub(crate) struct PeerService {
    pub(crate) core: Arc<NodeCore>,
}

fn decode<T: serde::de::DeserializeOwned>(payload: &[u8]) -> Result<T, Status> {
    postcard::from_bytes(payload)
        .map_err(|e| Status::invalid_argument(format!("undecodable raft message: {e}")))
}

fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, Status> {
    oncekv_core::encoding::encode(value)
        .map_err(|e| Status::internal(format!("encoding raft reply: {e}")))
}

/// Serves one peer call, whichever way it came: `payload` is the postcard request of
/// `method`, the result the postcard answer. An `outsider` (a sender naming no cluster)
/// may only ask `Identify`.
async fn serve_peer_call(
    core: &NodeCore,
    method: Method,
    payload: &[u8],
    outsider: bool,
) -> Result<Vec<u8>, Status> {
    match method {
        Method::Append => encode(&core.raft().append_entries(decode(payload)?).await),
        Method::Vote => {
            if !core.voting_allowed() {
                return Err(Status::unavailable(
                    "this member has just started and votes for nobody yet (leader-lease reads)",
                ));
            }
            encode(&core.raft().vote(decode(payload)?).await)
        }
        Method::Snapshot => encode(&core.raft().install_snapshot(decode(payload)?).await),
        Method::Forward => {
            let req: Forwarded = decode(payload)?;
            if outsider && !matches!(req, Forwarded::Identify { .. }) {
                return Err(Status::permission_denied(
                    "oncekv: only members of this cluster may forward requests",
                ));
            }
            encode(&answer_forwarded(core, req).await)
        }
    }
}

impl PeerService {
    async fn serve(
        &self,
        method: Method,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        let payload = serve_peer_call(&self.core, method, &request.into_inner().payload, false)
            .await?
            .into();
        Ok(Response::new(RaftReply { payload }))
    }
}

#[tonic::async_trait]
impl RaftRpc for PeerService {
    async fn append_entries(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        self.serve(Method::Append, request).await
    }

    async fn vote(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        self.serve(Method::Vote, request).await
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        self.serve(Method::Snapshot, request).await
    }

    async fn forward(
        &self,
        request: Request<ForwardRequest>,
    ) -> Result<Response<ForwardReply>, Status> {
        let outsider = request
            .extensions()
            .get::<crate::peer_gate::Outsider>()
            .is_some();
        let payload = serve_peer_call(
            &self.core,
            Method::Forward,
            &request.into_inner().payload,
            outsider,
        )
        .await?
        .into();
        Ok(Response::new(ForwardReply { payload }))
    }
}

/// Serves a request forwarded by a follower. Proposes only on this node: a forwarded
/// request is never forwarded again.
async fn answer_forwarded(core: &NodeCore, req: Forwarded) -> ForwardedReply {
    match req {
        Forwarded::ReadIndex => match core.read_index_for_follower().await {
            Ok(index) => ForwardedReply::ReadIndex(index),
            Err(e) => ForwardedReply::Error(e),
        },
        Forwarded::ProposeBatch(commands) => {
            ForwardedReply::Responses(core.propose_forwarded(commands).await)
        }
        Forwarded::Publish {
            id,
            name,
            client_url,
        } => match core.publish_local(id, name, client_url).await {
            Ok(changed) => ForwardedReply::Published { changed },
            Err(e) => ForwardedReply::Error(e),
        },
        Forwarded::ChangeMembers(change) => {
            ForwardedReply::Members(core.change_members_local(change).await)
        }
        Forwarded::Identify { peer_url } => ForwardedReply::Identified(core.identify(&peer_url)),
        Forwarded::HashKv { revision } => {
            ForwardedReply::HashKv(crate::fanout::hash_kv_when_applied(core, revision).await)
        }
        Forwarded::HoldElections { ms } => {
            let raft = core.raft().clone();
            raft.runtime_config().elect(false);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                raft.runtime_config().elect(true);
            });
            ForwardedReply::Done
        }
        Forwarded::Campaign => match core.raft().trigger().elect().await {
            Ok(()) => ForwardedReply::Done,
            Err(_) => ForwardedReply::Error(ProposeError::Stopped),
        },
        Forwarded::Health => ForwardedReply::Health(match crate::fanout::own_health(core).await {
            Ok(()) => "ok".to_string(),
            Err(reason) => reason,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sniffing_tells_framed_from_http2_and_gives_the_bytes_back() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        a.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .expect("write");
        let mut prefix = Vec::new();
        assert!(!sniff(&mut b, &mut prefix).await.expect("sniff"));
        assert_eq!(
            prefix, b"PRI * HT",
            "read no further than the magic's length"
        );
        let mut sniffed = Sniffed {
            prefix,
            read: 0,
            io: b,
        };
        let mut all = vec![0u8; 24];
        sniffed.read_exact(&mut all).await.expect("read");
        assert_eq!(&all, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");

        // The magic split over two writes is still the magic.
        let (mut a, mut b) = tokio::io::duplex(1024);
        a.write_all(&MAGIC[..3]).await.expect("write");
        let writer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            a.write_all(&MAGIC[3..]).await
        });
        let mut prefix = Vec::new();
        assert!(sniff(&mut b, &mut prefix).await.expect("sniff"));
        writer.await.expect("join").expect("write");

        // A prefix of the magic, then something else: not framed.
        let (mut a, mut b) = tokio::io::duplex(1024);
        a.write_all(b"OKVPEERX").await.expect("write");
        let mut prefix = Vec::new();
        assert!(!sniff(&mut b, &mut prefix).await.expect("sniff"));
        assert_eq!(prefix, b"OKVPEERX");
    }
}
