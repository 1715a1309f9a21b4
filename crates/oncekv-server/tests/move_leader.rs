//! etcd's MoveLeader: the leader hands leadership to the member named, and writes go on
//! afterwards; a follower refuses it as etcd does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{TestCluster, put};
use oncekv_server::pb::etcdserverpb::MoveLeaderRequest;
use oncekv_server::pb::etcdserverpb::maintenance_client::MaintenanceClient;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_hands_over_to_the_named_member() {
    let cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let mut kv = cluster.kv(leader).await;
    put(&mut kv, "before", "1").await.unwrap();
    cluster
        .wait_caught_up(leader, Duration::from_secs(10))
        .await;

    for round in 0..2 {
        let leader = cluster.wait_leader(Duration::from_secs(10)).await;
        let target = (leader + 1 + round) % 3;
        let target_id = cluster.node(target).core.id();
        // A follower refuses.
        let mut follower = MaintenanceClient::connect(cluster.endpoint(target))
            .await
            .unwrap();
        let err = follower
            .move_leader(MoveLeaderRequest { target_id })
            .await
            .unwrap_err();
        assert_eq!(err.message(), "etcdserver: not leader");

        let mut m = MaintenanceClient::connect(cluster.endpoint(leader))
            .await
            .unwrap();
        m.move_leader(MoveLeaderRequest { target_id })
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(cluster.node(leader).core.leader(), Some(target_id));
        let now = cluster.wait_leader(Duration::from_secs(10)).await;
        assert_eq!(now, target, "round {round}");
        let mut kv = cluster.kv(target).await;
        put(&mut kv, &format!("after{round}"), "1").await.unwrap();
    }
    cluster.inner.shutdown().await;
}

/// A leader stopped as `oncekv serve` stops on SIGTERM hands leadership over first: when
/// its shutdown returns, another member already leads (an election after a plain stop
/// would take at least an election timeout to start), and writes go on there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_leader_hands_over_before_it_stops() {
    let mut cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let old_id = cluster.node(leader).core.id();
    let mut kv = cluster.kv(leader).await;
    put(&mut kv, "before", "1").await.unwrap();
    cluster
        .wait_caught_up(leader, Duration::from_secs(10))
        .await;

    cluster.inner.stop_gracefully(leader).await;
    let leading: Vec<usize> = cluster
        .running()
        .filter(|(_, n)| n.core.leader() == Some(n.core.id()))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        leading.len(),
        1,
        "right after the old leader stopped, one running member leads"
    );
    let new_leader = leading[0];
    assert_ne!(cluster.node(new_leader).core.id(), old_id);
    let mut kv = cluster.kv(new_leader).await;
    put(&mut kv, "after", "1").await.unwrap();
    let before = common::get(&mut kv, "before").await.unwrap();
    assert_eq!(before.map(|(v, _)| v).as_deref(), Some("1"));
    cluster.inner.shutdown().await;
}
