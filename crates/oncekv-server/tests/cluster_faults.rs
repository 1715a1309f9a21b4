//! The store under member failures, on real sockets: full restart and snapshot catch-up
//! of a lagging follower (leader loss under load is in `leader_failover.rs`).
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{TestCluster, get, put};

const LEADER_WAIT: Duration = Duration::from_secs(10);

// Durability: acknowledged writes are on disk, and the revision sequence continues.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_members_restarted_keep_every_acknowledged_write_and_revisions_continue() {
    // Snapshots every 64 entries, so restart has to combine a snapshot with the log after it.
    let mut cluster = TestCluster::start(3, |c| c.snapshot_count = 64).await;
    let leader = cluster.wait_leader(LEADER_WAIT).await;
    let mut kv = cluster.kv(leader).await;
    let mut written = BTreeMap::new();
    let mut last_revision = 0;
    for i in 0..200 {
        let key = format!("k{i:03}");
        let value = format!("v{i}");
        last_revision = put(&mut kv, &key, &value).await.unwrap();
        written.insert(key, value);
    }
    // Overwrite some keys so versions are above 1.
    for i in 0..20 {
        let key = format!("k{i:03}");
        last_revision = put(&mut kv, &key, "again").await.unwrap();
        written.insert(key, "again".to_string());
    }
    drop(kv);
    for i in 0..3 {
        cluster.stop(i).await;
    }
    for i in 0..3 {
        cluster.restart(i).await;
    }
    let leader = cluster.wait_leader(LEADER_WAIT).await;
    for (_, n) in cluster.running() {
        let snapshot = n.core.metrics().snapshot;
        assert!(
            snapshot.is_some_and(|s| s.index >= 64),
            "restarted without a snapshot: {snapshot:?}"
        );
    }
    let mut kv = cluster.kv(leader).await;
    for (key, value) in &written {
        let (got, version) = get(&mut kv, key)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{key} lost in restart"));
        assert_eq!(&got, value, "{key}");
        let want_version = if value == "again" { 2 } else { 1 };
        assert_eq!(version, want_version, "{key}");
    }
    let next = put(&mut kv, "after-restart", "x").await.unwrap();
    assert_eq!(
        next,
        last_revision + 1,
        "revisions must continue where they stopped"
    );
}

// A member that missed entries the leader has already compacted away can only catch up
// from a snapshot; it must end with the same state, session table included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_down_past_a_snapshot_catches_up_by_snapshot_install() {
    let mut cluster = TestCluster::start(3, |c| c.snapshot_count = 50).await;
    let leader = cluster.wait_leader(LEADER_WAIT).await;
    let follower = (leader + 1) % 3;
    cluster.stop(follower).await;

    // Sessions and tracked writes, so the session table has saved responses to carry over.
    let mut sessions =
        oncekv_server::pb::oncekv::session_client::SessionClient::connect(cluster.endpoint(leader))
            .await
            .unwrap();
    for _ in 0..3 {
        sessions
            .register(oncekv_server::pb::oncekv::RegisterRequest::default())
            .await
            .unwrap();
    }
    let mut kv = cluster.kv(leader).await;
    for i in 0..300 {
        put(&mut kv, &format!("s{i}"), "v").await.unwrap();
    }
    // Snapshots are asked for by each member's ticker, a heartbeat after they are due;
    // without a purged log the follower would catch up from the log instead.
    cluster
        .wait_for(
            "the leader snapshotted and purged its log",
            Duration::from_secs(10),
            |c| {
                let m = c.node(leader).core.metrics();
                m.snapshot.is_some_and(|s| s.index >= 50) && m.purged.is_some_and(|p| p.index > 0)
            },
        )
        .await;

    cluster.restart(follower).await;
    cluster
        .wait_caught_up(leader, Duration::from_secs(20))
        .await;

    let f = cluster.node(follower);
    let installed = f.core.metrics().snapshot.map_or(0, |s| s.index);
    assert!(installed > 0, "the follower caught up without a snapshot");
    // Compare at equal applied index: wait for quiet, then compare whole-state hashes.
    cluster
        .wait_caught_up(leader, Duration::from_secs(10))
        .await;
    let (lh, ls, li) = {
        let l = cluster.node(leader).core.applied().read();
        (
            l.sm.state_hash(),
            l.sm.sessions().len(),
            l.sm.applied_index(),
        )
    };
    let (fh, fs, fi) = {
        let f = f.core.applied().read();
        (
            f.sm.state_hash(),
            f.sm.sessions().len(),
            f.sm.applied_index(),
        )
    };
    assert_eq!(ls, 3);
    assert_eq!((fi, fs), (li, ls));
    assert_eq!(
        fh, lh,
        "follower state differs from the leader's at index {li}"
    );
}
