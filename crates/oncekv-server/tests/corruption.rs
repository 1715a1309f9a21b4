//! The corruption check and cluster health, both fan-outs through the waiting list's
//! quorum mode: a value flipped in one member's state (bypassing the log) is found by
//! comparing HashKV at one revision, the CORRUPT alarm goes up for that member and stops
//! reads and writes; the periodic check finds it by itself; `/health?cluster` reports
//! every member.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;
use std::time::Duration;

use common::{TestCluster, put};
use oncekv_core::AlarmKind;
use oncekv_server::fanout::{CheckOutcome, corruption_check};

async fn cluster_with_data(tweak: impl Fn(&mut oncekv_server::NodeConfig)) -> (TestCluster, usize) {
    let cluster = TestCluster::start(3, tweak).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let mut kv = cluster.kv(leader).await;
    for i in 0..20 {
        put(&mut kv, &format!("k{i:02}"), "v").await.unwrap();
    }
    cluster
        .wait_caught_up(leader, Duration::from_secs(10))
        .await;
    (cluster, leader)
}

fn curl(url: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "10", "-w", "\n%{http_code}", url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.trim().parse().unwrap_or(0), body.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_value_raises_corrupt_for_that_member() {
    let (cluster, leader) = cluster_with_data(|_| {}).await;
    let checker = cluster.node(leader).core.clone();
    let outcome = corruption_check(&checker).await;
    assert!(
        matches!(outcome, CheckOutcome::Consistent { .. }),
        "{outcome:?}"
    );

    let victim = (leader + 1) % 3;
    assert!(
        cluster
            .node(victim)
            .core
            .corrupt_value_for_test(b"k07", b"flipped")
    );
    let victim_id = cluster.node(victim).core.id();
    match corruption_check(&checker).await {
        CheckOutcome::Corrupt {
            alarmed, hashes, ..
        } => {
            assert_eq!(alarmed, vec![victim_id], "{hashes:?}");
            assert_eq!(hashes.len(), 3);
        }
        other => panic!("not found: {other:?}"),
    }
    // The alarm is replicated: every member refuses writes and reads now.
    cluster
        .wait_for("every member has the alarm", Duration::from_secs(10), |c| {
            c.running()
                .all(|(_, n)| n.core.alarms().contains(&(victim_id, AlarmKind::Corrupt)))
        })
        .await;
    let mut kv = cluster.kv(leader).await;
    let err = put(&mut kv, "after", "x").await.unwrap_err();
    assert_eq!(err.message(), "etcdserver: corrupt cluster");
    let err = common::get(&mut kv, "k01").await.unwrap_err();
    assert_eq!(err.message(), "etcdserver: corrupt cluster");
    let (status, body) = curl(&format!("{}/readyz", cluster.endpoint(leader)));
    assert_eq!(status, 503);
    assert!(body.contains("[-]data_corruption failed"), "{body}");
    cluster.inner.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_periodic_check_finds_it_by_itself() {
    let (cluster, leader) = cluster_with_data(|c| {
        c.corrupt_check_time = Some(Duration::from_millis(300));
    })
    .await;
    let victim = (leader + 2) % 3;
    cluster
        .node(victim)
        .core
        .corrupt_value_for_test(b"k03", b"x");
    let victim_id = cluster.node(victim).core.id();
    cluster
        .wait_for(
            "the periodic check raises CORRUPT",
            Duration::from_secs(15),
            |c| {
                c.node(leader)
                    .core
                    .alarms()
                    .contains(&(victim_id, AlarmKind::Corrupt))
            },
        )
        .await;
    cluster.inner.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_health_asks_every_member() {
    let (mut cluster, leader) = cluster_with_data(|_| {}).await;
    let url = format!("{}/health?cluster", cluster.endpoint(leader));
    let (status, body) = curl(&url);
    assert_eq!((status, body.as_str()), (200, r#"{"health":"true"}"#));
    let down = (leader + 1) % 3;
    let down_id = cluster.node(down).core.id();
    cluster.stop(down).await;
    let (status, body) = curl(&url);
    assert_eq!(status, 503, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["members"][format!("{down_id:x}")], "no answer", "{body}");
    cluster.inner.shutdown().await;
}
