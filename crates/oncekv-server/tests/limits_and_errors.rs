//! etcd's limits and error codes: clients branch on them, so each must be the code and
//! message etcd sends.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::TestCluster;
use oncekv_server::pb::etcdserverpb::lease_client::LeaseClient;
use oncekv_server::pb::etcdserverpb::request_op::Request;
use oncekv_server::pb::etcdserverpb::{LeaseRevokeRequest, PutRequest, RequestOp, TxnRequest};
use tonic::Code;

fn put_op(key: &str) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestPut(PutRequest {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: "v".into(),
            ..Default::default()
        })),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_and_refusals_get_etcds_codes_and_messages() {
    let cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let mut kv = cluster.kv(leader).await;

    // 2 MB > --max-request-bytes (1.5 MiB), but within gRPC's allowance on top of it.
    let big = PutRequest {
        key: "big".into(),
        value: vec![b'x'; 2_000_000].into(),
        ..Default::default()
    };
    let err = kv.put(big).await.unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (Code::InvalidArgument, "etcdserver: request is too large")
    );
    assert_eq!(
        common::get(&mut kv, "big").await.unwrap(),
        None,
        "a refused request was applied"
    );

    let too_many = TxnRequest {
        success: (0..129).map(|i| put_op(&format!("k{i}"))).collect(),
        ..Default::default()
    };
    let err = kv.txn(too_many).await.unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (
            Code::InvalidArgument,
            "etcdserver: too many operations in txn request"
        )
    );
    let at_limit = TxnRequest {
        success: (0..128).map(|i| put_op(&format!("k{i}"))).collect(),
        ..Default::default()
    };
    kv.txn(at_limit).await.unwrap();

    let dup = TxnRequest {
        success: vec![put_op("same"), put_op("same")],
        ..Default::default()
    };
    let err = kv.txn(dup).await.unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (
            Code::InvalidArgument,
            "etcdserver: duplicate key given in txn request"
        )
    );

    let mut lease = LeaseClient::connect(cluster.endpoint(leader))
        .await
        .unwrap();
    let err = lease
        .lease_revoke(LeaseRevokeRequest { id: 424242 })
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (Code::NotFound, "etcdserver: requested lease not found")
    );
    let err = kv
        .put(PutRequest {
            key: "k".into(),
            value: "v".into(),
            lease: 424242,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (Code::NotFound, "etcdserver: requested lease not found")
    );
}

// Without a quorum nothing can commit; clients must get Unavailable (retryable), not a
// hang or a misleading answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_quorum_writes_are_unavailable() {
    let mut cluster = TestCluster::start(3, |c| c.request_timeout = Duration::from_secs(2)).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let survivor = (leader + 1) % 3;
    for i in (0..3).filter(|i| *i != survivor) {
        cluster.stop(i).await;
    }
    let mut kv = cluster.kv(survivor).await;
    let started = std::time::Instant::now();
    let err = common::put(&mut kv, "k", "v").await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
}

/// A txn whose success branch is a txn, `depth` levels deep, with a put at the bottom.
fn nested_txn(depth: usize) -> TxnRequest {
    let mut txn = TxnRequest {
        success: vec![put_op("deep")],
        ..Default::default()
    };
    for _ in 1..depth {
        txn = TxnRequest {
            success: vec![RequestOp {
                request: Some(Request::RequestTxn(txn)),
            }],
            ..Default::default()
        };
    }
    txn
}

// A txn nested past the decoder's limit is the caller's mistake: InvalidArgument with one
// short line naming the limit, not Internal with the decoder's 2,000-character field path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_txn_nested_deeper_than_the_decoder_allows_is_invalid_argument() {
    let cluster = TestCluster::start(1, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let mut kv = cluster.kv(leader).await;
    let limit = oncekv_proto::codec::MAX_TXN_DEPTH;
    let ok = kv.txn(nested_txn(limit)).await.unwrap().into_inner();
    assert!(ok.succeeded, "{limit} levels are within the limit");
    let err = kv.txn(nested_txn(limit + 1)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert_eq!(
        err.message(),
        format!("oncekv: the request nests txns deeper than {limit} levels")
    );
    let err = kv.txn(nested_txn(130)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
}
