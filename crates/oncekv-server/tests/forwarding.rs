//! Writes sent to a follower reach the leader in shared batches, and every command of a
//! batch still gets its own answer.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::TestCluster;
use oncekv_server::pb::etcdserverpb::PutRequest;
use tonic::Code;

// 96 concurrent puts through one follower: the ones naming a missing lease fail alone
// with etcd's error, the others succeed with distinct revisions and are readable, and
// the follower needed fewer forward RPCs than puts.
#[tokio::test]
async fn concurrent_puts_through_a_follower_share_forward_batches() {
    let cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let follower = (leader + 1) % 3;
    let kv = cluster.kv(follower).await;
    // A first write through the follower settles who the leader is from its side.
    common::put(&mut kv.clone(), "warm-up", "x").await.unwrap();
    let before = cluster.node(follower).core.forwarded();

    let n = 96;
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let mut kv = kv.clone();
            tokio::spawn(async move {
                let lease = if i % 8 == 3 { 424_242 } else { 0 };
                let r = kv
                    .put(PutRequest {
                        key: format!("k{i:03}").into_bytes().into(),
                        value: format!("v{i}").into_bytes().into(),
                        lease,
                        ..Default::default()
                    })
                    .await;
                (
                    i,
                    r.map(|r| r.into_inner().header.map_or(0, |h| h.revision)),
                )
            })
        })
        .collect();
    let mut revisions = Vec::new();
    for t in tasks {
        let (i, r) = t.await.unwrap();
        if i % 8 == 3 {
            let status = r.unwrap_err();
            assert_eq!(status.code(), Code::NotFound, "put {i}");
            assert_eq!(status.message(), "etcdserver: requested lease not found");
        } else {
            revisions.push(r.unwrap_or_else(|s| panic!("put {i}: {s}")));
        }
    }
    revisions.sort_unstable();
    revisions.dedup();
    assert_eq!(
        revisions.len(),
        n - n / 8,
        "every successful put has its own revision"
    );

    let mut leader_kv = cluster.kv(leader).await;
    for i in (0..n).step_by(7) {
        let got = common::get(&mut leader_kv, &format!("k{i:03}"))
            .await
            .unwrap();
        if i % 8 == 3 {
            assert_eq!(got, None, "k{i:03}");
        } else {
            assert_eq!(got, Some((format!("v{i}"), 1)), "k{i:03}");
        }
    }

    let after = cluster.node(follower).core.forwarded();
    let (batches, commands) = (after.0 - before.0, after.1 - before.1);
    assert_eq!(commands, n as u64, "every put was forwarded");
    assert!(
        batches < commands,
        "{commands} forwarded puts took {batches} RPCs: no batching"
    );
    println!("{commands} forwarded puts in {batches} RPCs");
}
