//! Cluster time: stamped by the leader, replayed from the log, advanced by a Tick only
//! when something is due.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{TestCluster, get, put};
use oncekv_server::pb::etcdserverpb::lease_client::LeaseClient;
use oncekv_server::pb::etcdserverpb::{LeaseGrantRequest, PutRequest};

fn last_log_index(cluster: &TestCluster, i: usize) -> u64 {
    cluster.node(i).core.metrics().last_log_index.unwrap_or(0)
}

// Ticks exist only to expire things; a quiet cluster must not fill its log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_cluster_writes_nothing() {
    let cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let mut kv = cluster.kv(leader).await;
    put(&mut kv, "k", "v").await.unwrap();
    let before = last_log_index(&cluster, leader);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        last_log_index(&cluster, leader),
        before,
        "an idle cluster appended entries"
    );
}

// Lease expiry is decided by cluster time in the log, so with no client traffic the
// leader must propose a Tick when the lease is due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_lease_expires_through_a_leader_tick_without_traffic() {
    let cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let mut lease = LeaseClient::connect(cluster.endpoint(leader))
        .await
        .unwrap();
    let g = lease
        .lease_grant(LeaseGrantRequest { ttl: 2, id: 0 })
        .await
        .unwrap()
        .into_inner();
    let mut kv = cluster.kv(leader).await;
    kv.put(PutRequest {
        key: "leased".into(),
        value: "v".into(),
        lease: g.id,
        ..Default::default()
    })
    .await
    .unwrap();
    let granted_at = Instant::now();
    let before = last_log_index(&cluster, leader);
    // Watch the applied state directly: reads through the API would not add entries, but
    // this keeps the test free of any traffic at all.
    loop {
        let gone = cluster
            .running()
            .all(|(_, n)| n.core.applied().read().sm.kv().get(b"leased").is_none());
        if gone {
            break;
        }
        assert!(
            granted_at.elapsed() < Duration::from_secs(8),
            "the lease never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        granted_at.elapsed() >= Duration::from_millis(1900),
        "expired early: {:?}",
        granted_at.elapsed()
    );
    let ticks = last_log_index(&cluster, leader) - before;
    assert!(
        (1..=3).contains(&ticks),
        "expected a tick or two to expire the lease, saw {ticks} entries"
    );
    assert_eq!(get(&mut kv, "leased").await.unwrap(), None);
    // Nothing is due any more: the cluster goes quiet again.
    let quiet = last_log_index(&cluster, leader);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(last_log_index(&cluster, leader), quiet);
}

// A new leader continues cluster time from the log; it must never run backwards, or a
// lease could outlive its TTL or a session expire twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_time_never_runs_backwards_across_a_failover() {
    let mut cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let mut kv = cluster.kv(leader).await;
    for i in 0..20 {
        put(&mut kv, &format!("k{i}"), "v").await.unwrap();
    }
    let before = cluster.node(leader).core.applied().read().sm.cluster_time();
    cluster.stop(leader).await;
    let new_leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let mut kv = cluster.kv(new_leader).await;
    put(&mut kv, "after", "v").await.unwrap();
    for (_, n) in cluster.running() {
        let t = n.core.applied().read().sm.cluster_time();
        assert!(t >= before, "cluster time went back from {before} to {t}");
    }
}

// The data size `endpoint status` reports is measured by the ticker, every heartbeat and
// once at start: a status before the first heartbeat names the log's size, not 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_the_data_size_before_the_first_heartbeat() {
    use oncekv_server::pb::etcdserverpb::StatusRequest;
    use oncekv_server::pb::etcdserverpb::maintenance_client::MaintenanceClient;

    let started = Instant::now();
    let cluster = TestCluster::start(1, |c| {
        c.heartbeat_ms = 5_000;
        c.election_timeout_ms = 15_000;
    })
    .await;
    let mut m = MaintenanceClient::connect(cluster.endpoint(0))
        .await
        .unwrap();
    let status = m.status(StatusRequest {}).await.unwrap().into_inner();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the first heartbeat may have passed; the check says nothing"
    );
    assert!(status.db_size > 0, "db size {}", status.db_size);
}
