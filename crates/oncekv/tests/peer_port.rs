//! The peer port serves only members of its cluster: a stranger's raft messages are
//! refused from their headers, before the body is read, so four concurrent 200 MiB
//! garbage AppendEntries leave the member's memory where it was (before the gate, the
//! same took a member from 27 MiB to 635 MiB); a sender naming this cluster gets no
//! message past the member's limit (a few MiB) read; a sender of another cluster is
//! refused with a reason; raw garbage on the port closes the connection; the member goes
//! on serving.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;

use common::{etcdctl_put, rss, serve_single, wait_serving};
use oncekv_proto::etcdserverpb::StatusRequest;
use oncekv_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use oncekv_proto::oncekv::RaftRequest;
use oncekv_proto::oncekv::raft_client::RaftClient;

/// Four concurrent AppendEntries of `payload` to `peer`, naming `cluster` (and member 1)
/// if given.
fn appends(
    peer: &str,
    payload: &bytes::Bytes,
    cluster: Option<u64>,
) -> Vec<
    tokio::task::JoinHandle<
        Result<tonic::Response<oncekv_proto::oncekv::RaftReply>, tonic::Status>,
    >,
> {
    (0..4)
        .map(|_| {
            let (peer, payload) = (peer.to_string(), payload.clone());
            tokio::spawn(async move {
                let mut raft = RaftClient::connect(peer)
                    .await
                    .unwrap()
                    .max_encoding_message_size(usize::MAX);
                let mut request = tonic::Request::new(RaftRequest { payload });
                if let Some(cluster) = cluster {
                    let md = request.metadata_mut();
                    md.insert(
                        "oncekv-peer-cluster",
                        format!("{cluster:x}").parse().unwrap(),
                    );
                    md.insert("oncekv-peer-member", "1".parse().unwrap());
                }
                raft.append_entries(request).await
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_are_refused_before_their_messages_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let (members, ports) = serve_single(dir.path(), &[]);
    let pid = members.0[0].id();
    let client = format!("127.0.0.1:{}", ports.0);
    wait_serving(&client);
    let before = rss(pid);

    let peer = format!("http://127.0.0.1:{}", ports.1);
    let garbage = bytes::Bytes::from(vec![0xa5u8; 200 << 20]);
    for call in appends(&peer, &garbage, None) {
        let status = call
            .await
            .unwrap()
            .expect_err("a stranger's append is refused");
        assert!(
            status.code() == tonic::Code::PermissionDenied
                || status.code() == tonic::Code::Unavailable
                || status.code() == tonic::Code::Internal,
            "{status:?}"
        );
    }
    // Forward, the one method an outsider may call, is capped far below that.
    let mut raft = RaftClient::connect(peer.clone())
        .await
        .unwrap()
        .max_encoding_message_size(usize::MAX);
    let err = raft
        .forward(oncekv_proto::oncekv::ForwardRequest {
            payload: garbage.clone(),
        })
        .await
        .unwrap_err();
    assert_ne!(err.code(), tonic::Code::Ok);
    // A sender naming this cluster (its id is no secret: every response header carries
    // it) passes the gate, but no message past the member's limit (a few MiB) is read.
    let cluster_id = cluster_id(&client).await;
    for call in appends(&peer, &garbage, Some(cluster_id)) {
        let status = call
            .await
            .unwrap()
            .expect_err("an oversized append is refused");
        assert_ne!(status.code(), tonic::Code::Ok);
    }
    let after = rss(pid);
    assert!(
        after < before + (64 << 20),
        "a stranger's messages cost the member {} MiB",
        (after.saturating_sub(before)) >> 20
    );

    // A sender naming another cluster gets the reason.
    let mut request = tonic::Request::new(RaftRequest {
        payload: bytes::Bytes::from_static(b"x"),
    });
    request
        .metadata_mut()
        .insert("oncekv-peer-cluster", "1234".parse().unwrap());
    request
        .metadata_mut()
        .insert("oncekv-peer-member", "5678".parse().unwrap());
    let err = raft.vote(request).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    assert!(
        err.message().contains("belongs to cluster 1234"),
        "{}",
        err.message()
    );

    // Raw garbage: the connection is closed, nothing else happens.
    let mut raw = std::net::TcpStream::connect(format!("127.0.0.1:{}", ports.1)).unwrap();
    let _ = raw.write_all(&[0x17; 4096]);
    drop(raw);
    assert!(etcdctl_put(&client), "the member stopped serving");
}

/// The cluster id a member at `client` reports (no secret: every response carries it).
async fn cluster_id(client: &str) -> u64 {
    MaintenanceClient::connect(format!("http://{client}"))
        .await
        .unwrap()
        .status(StatusRequest {})
        .await
        .unwrap()
        .into_inner()
        .header
        .unwrap()
        .cluster_id
}

/// A framed peer connection (`oncekv_server::peer_wire`) to `port`, opened as a sender
/// naming `cluster` and member 1.
fn framed(port: u16, cluster: u64) -> std::net::TcpStream {
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    let mut opening = b"OKVPEER1".to_vec();
    opening.extend_from_slice(&cluster.to_le_bytes());
    opening.extend_from_slice(&1u64.to_le_bytes());
    conn.write_all(&opening).unwrap();
    conn
}

/// Sends a frame announcing `len` payload bytes of `method` (only `payload` follows) and
/// reads the reply: its code (0 = an answer, else a gRPC code) and payload.
fn frame_call(
    conn: &mut std::net::TcpStream,
    method: u8,
    len: u32,
    payload: &[u8],
) -> (u8, Vec<u8>) {
    use std::io::Read;
    let mut frame = len.to_le_bytes().to_vec();
    frame.push(method);
    frame.extend_from_slice(payload);
    conn.write_all(&frame).unwrap();
    let mut head = [0u8; 5];
    conn.read_exact(&mut head).unwrap();
    let mut reply = vec![0u8; u32::from_le_bytes(head[..4].try_into().unwrap()) as usize];
    conn.read_exact(&mut reply).unwrap();
    (head[4], reply)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framed_peer_connections_refuse_strangers_oversized_and_unknown_frames() {
    let dir = tempfile::tempdir().unwrap();
    let (members, ports) = serve_single(dir.path(), &[]);
    let pid = members.0[0].id();
    let client = format!("127.0.0.1:{}", ports.0);
    wait_serving(&client);
    let cluster_id = cluster_id(&client).await;
    let before = rss(pid);

    // Another cluster: refused with the reason, before any request is read.
    let mut other = framed(ports.1, 0x1234);
    let (code, reason) = frame_call(&mut other, 2, 1, b"x");
    assert_eq!(code, tonic::Code::PermissionDenied as u8);
    let reason = String::from_utf8_lossy(&reason);
    assert!(reason.contains("belongs to cluster 1234"), "{reason}");

    // This cluster: an undecodable message is refused and the connection goes on; an
    // unknown method likewise.
    let mut conn = framed(ports.1, cluster_id);
    let (code, _) = frame_call(&mut conn, 1, 7, b"garbage");
    assert_eq!(code, tonic::Code::InvalidArgument as u8);
    let (code, _) = frame_call(&mut conn, 99, 1, b"x");
    assert_eq!(code, tonic::Code::Unimplemented as u8);
    // A frame announcing 200 MiB is refused from its length, nothing allocated for it.
    for _ in 0..4 {
        let mut conn = framed(ports.1, cluster_id);
        let (code, reason) = frame_call(&mut conn, 1, 200 << 20, b"");
        assert_eq!(code, tonic::Code::ResourceExhausted as u8);
        assert!(String::from_utf8_lossy(&reason).contains("over this member's limit"));
    }
    // A sender that stops after the magic is cut off (10 s), not kept for good.
    let mut stalled = std::net::TcpStream::connect(("127.0.0.1", ports.1)).unwrap();
    stalled.write_all(b"OKVPEER1").unwrap();
    stalled
        .set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    let mut byte = [0u8; 1];
    let closed = std::io::Read::read(&mut stalled, &mut byte);
    assert!(
        matches!(closed, Ok(0)),
        "a stalled opening was kept: {closed:?}"
    );
    let after = rss(pid);
    assert!(
        after < before + (64 << 20),
        "oversized frames cost the member {} MiB",
        (after.saturating_sub(before)) >> 20
    );
    assert!(etcdctl_put(&client), "the member stopped serving");
}

/// etcd's `--listen-peer-urls` may name several URLs, every one serving peers: here n1
/// listens on two ports and the cluster knows it by the second, so a two-member cluster
/// (whose writes need both) forms and writes only if the second port serves peers.
#[test]
fn every_listening_peer_url_serves_peers() {
    let dir = tempfile::tempdir().unwrap();
    let (c1, first, second) = (
        common::free_port(),
        common::free_port(),
        common::free_port(),
    );
    let (c2, p2) = (common::free_port(), common::free_port());
    let cluster = format!("n1=http://127.0.0.1:{second},n2=http://127.0.0.1:{p2}");
    let n1 = common::serve_member_with(
        dir.path(),
        "n1",
        (c1, first),
        &cluster,
        false,
        std::process::Stdio::null(),
        &[
            "--listen-peer-urls",
            &format!("http://127.0.0.1:{first},http://127.0.0.1:{second}"),
            "--initial-advertise-peer-urls",
            &format!("http://127.0.0.1:{second}"),
        ],
    );
    let n2 = common::serve_member(
        dir.path(),
        "n2",
        (c2, p2),
        &cluster,
        false,
        std::process::Stdio::null(),
    );
    let _members = common::Members(vec![n1, n2]);
    wait_serving(&format!("127.0.0.1:{c1}"));
    assert!(etcdctl_put(&format!("127.0.0.1:{c2}")));
}
