//! etcd's auto-compaction: the leader compacts history by itself, through the log, so every
//! member compacts at the same revision; reads below it are then refused as compacted.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{TestCluster, put};
use oncekv_server::compactor::AutoCompaction;
use oncekv_server::pb::etcdserverpb::RangeRequest;

fn compacted(cluster: &TestCluster, i: usize) -> i64 {
    cluster
        .node(i)
        .core
        .applied()
        .read()
        .sm
        .compacted_revision()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revision_mode_keeps_the_last_revisions_on_every_member() {
    let cluster = TestCluster::start(3, |c| {
        c.auto_compaction = AutoCompaction::Revision {
            keep: 5,
            every: Duration::from_millis(200),
        };
    })
    .await;
    cluster.wait_leader(Duration::from_secs(10)).await;
    let mut kv = cluster.kv(0).await;
    let mut last = 0;
    for i in 0..20 {
        last = put(&mut kv, &format!("k{i}"), "v").await.unwrap();
    }
    cluster
        .wait_for("every member compacted", Duration::from_secs(10), |c| {
            (0..3).all(|i| compacted(c, i) == last - 5)
        })
        .await;
    let at = |revision| RangeRequest {
        key: b"k0".to_vec().into(),
        revision,
        ..Default::default()
    };
    let refused = kv.range(at(last - 6)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::OutOfRange);
    assert_eq!(
        refused.message(),
        "etcdserver: mvcc: required revision has been compacted"
    );
    let kept = kv.range(at(last - 5)).await.unwrap().into_inner();
    assert_eq!(kept.kvs.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_mode_compacts_what_is_older_than_the_retention() {
    let cluster = TestCluster::start(1, |c| {
        c.auto_compaction = AutoCompaction::Periodic {
            retention: Duration::from_millis(1000),
        };
    })
    .await;
    cluster.wait_leader(Duration::from_secs(10)).await;
    let mut kv = cluster.kv(0).await;
    let first = put(&mut kv, "k", "1").await.unwrap();
    put(&mut kv, "k", "2").await.unwrap();
    cluster
        .wait_for(
            "compacted past the first put",
            Duration::from_secs(10),
            |c| compacted(c, 0) > first,
        )
        .await;
    let refused = kv
        .range(RangeRequest {
            key: b"k".to_vec().into(),
            revision: first,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::OutOfRange);
}
