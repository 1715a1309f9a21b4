//! The peer port serves only members of its cluster: a stranger's raft messages are
//! refused from their headers, before the body is read, so four concurrent 200 MiB
//! garbage AppendEntries leave the member's memory where it was (before the gate, the
//! same took a member from 27 MiB to 635 MiB); a sender of another cluster is refused
//! with a reason; raw garbage on the port closes the connection; the member goes on
//! serving.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;

use common::{etcdctl_put, rss, serve_single, wait_serving};
use oncekv_proto::oncekv::RaftRequest;
use oncekv_proto::oncekv::raft_client::RaftClient;

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
    let mut calls = Vec::new();
    for _ in 0..4 {
        let (peer, payload) = (peer.clone(), garbage.clone());
        calls.push(tokio::spawn(async move {
            let mut raft = RaftClient::connect(peer)
                .await
                .unwrap()
                .max_encoding_message_size(usize::MAX);
            raft.append_entries(RaftRequest { payload }).await
        }));
    }
    for call in calls {
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
