//! The promise end to end, through the project's fault proxy: lost replies and a leader
//! killed between commit and reply never make a put count twice.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{LEADER_WAIT, TestCluster};
use oncekv_client::{Client, ClientConfig};
use oncekv_testkit::fault_proxy::FaultProxy;

async fn proxies(cluster: &TestCluster, drop: f64, seed: u64) -> Vec<FaultProxy> {
    let mut out = Vec::new();
    for (i, cfg) in cluster.configs.iter().enumerate() {
        let listen = SocketAddr::from(([127, 0, 0, 1], 0));
        let p = FaultProxy::start_with_seed(listen, cfg.client_addr, seed + i as u64)
            .await
            .unwrap();
        p.set_drop_replies(drop);
        out.push(p);
    }
    out
}

fn fast_retries(mut config: ClientConfig) -> ClientConfig {
    config.backoff_base = Duration::from_millis(1);
    config.backoff_cap = Duration::from_millis(20);
    config.max_attempts = 100;
    config
}

// The headline: with 30 % of replies lost, N puts through the oncekv client leave
// version == N; the same retries without a session overshoot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_puts_through_thirty_percent_reply_loss_leave_version_exactly_1000() {
    let cluster = TestCluster::start(3, |_| {}).await;
    cluster.wait_leader(LEADER_WAIT).await;
    let proxies = proxies(&cluster, 0.3, 7).await;
    let endpoints: Vec<String> = proxies
        .iter()
        .map(|p| format!("http://{}", p.addr()))
        .collect();
    let once = Client::connect(&endpoints, fast_retries(ClientConfig::default())).unwrap();
    let etcd_style = Client::connect(&endpoints, fast_retries(ClientConfig::untracked())).unwrap();

    let tracked = tokio::spawn({
        let c = once.clone();
        async move {
            for i in 0..1000 {
                c.put("once", i.to_string()).await.unwrap();
            }
        }
    });
    let untracked = tokio::spawn({
        let c = etcd_style.clone();
        async move {
            for i in 0..1000 {
                c.put("etcd-style", i.to_string()).await.unwrap();
            }
        }
    });
    tracked.await.unwrap();
    untracked.await.unwrap();

    let dropped: u64 = proxies.iter().map(|p| p.stats().replies_dropped).sum();
    assert!(dropped > 300, "the proxies dropped only {dropped} replies");
    let direct = Client::connect(cluster.endpoints(), ClientConfig::default()).unwrap();
    let once_version = direct.get("once").await.unwrap().unwrap().version;
    let etcd_version = direct.get("etcd-style").await.unwrap().unwrap().version;
    assert_eq!(
        once_version, 1000,
        "the exactly-once client's puts were applied {once_version} times"
    );
    assert!(
        etcd_version > 1000,
        "the untracked client never applied a retry twice ({etcd_version})"
    );
    assert!(once.stats().retries > 0);
    eprintln!(
        "replies dropped {dropped}; versions: oncekv {once_version}, etcd-style {etcd_version}"
    );
}

// The hardest lost reply: the leader commits and applies, then dies before answering. The
// retry goes to the new leader, which must answer from the replicated session table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_across_a_leader_kill_between_commit_and_reply_gets_the_saved_response() {
    let mut cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(LEADER_WAIT).await;
    let proxies = proxies(&cluster, 0.0, 11).await;
    // The leader's endpoint first, so the first attempt goes there.
    let mut endpoints = vec![format!("http://{}", proxies[leader].addr())];
    endpoints.extend(
        (0..3)
            .filter(|i| *i != leader)
            .map(|i| format!("http://{}", proxies[i].addr())),
    );
    let client = Client::connect(&endpoints, fast_retries(ClientConfig::default())).unwrap();
    let first = client.put("k", "before").await.unwrap();

    proxies[leader].set_drop_replies(1.0);
    let put = tokio::spawn({
        let c = client.clone();
        async move {
            c.put_with("k", "v", oncekv_client::PutOptions::new().with_prev_kv())
                .await
        }
    });
    // Wait until every member has applied the put (committed), then kill the leader
    // before its reply can get through.
    let target = first.header.revision + 1;
    cluster
        .wait_for("the put to apply everywhere", LEADER_WAIT, |c| {
            c.running()
                .all(|(_, n)| n.core.applied().read().sm.revision() >= target)
        })
        .await;
    cluster.stop(leader).await;
    let resp = put.await.unwrap().unwrap();

    assert_eq!(
        resp.header.revision, target,
        "the retry was executed again instead of answered"
    );
    assert_eq!(
        resp.prev_kv.map(|kv| kv.value.to_vec()),
        Some(b"before".to_vec())
    );
    let new_leader = cluster.wait_leader(LEADER_WAIT).await;
    assert_ne!(new_leader, leader);
    let dups = cluster
        .node(new_leader)
        .core
        .applied()
        .read()
        .sm
        .stats()
        .duplicates;
    assert!(
        dups >= 1,
        "the new leader never saw the retry as a duplicate"
    );
    let kv = client.get("k").await.unwrap().unwrap();
    assert_eq!(kv.version, 2);
}

// A hedge is a second copy of the same (client id, seq): however many go out while the
// leader stalls, each put must count once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hedged_writes_apply_once_while_the_leader_stalls() {
    let cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(LEADER_WAIT).await;
    let mut proxies = Vec::new();
    let mut order: Vec<usize> = (0..3).collect();
    order.sort_by_key(|&i| i != leader);
    for &i in &order {
        let p = FaultProxy::in_front_of(&cluster.endpoint(i)).await.unwrap();
        if i == leader {
            p.set_delay(oncekv_testkit::fault_proxy::Delay::stalls(
                4,
                Duration::from_millis(200),
            ));
        }
        proxies.push(p);
    }
    let config = ClientConfig {
        hedge_writes: true,
        ..ClientConfig::default()
    };
    let urls: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
    let client = Client::connect(&urls, config).unwrap();
    for i in 0..60 {
        client.put("hedged", i.to_string()).await.unwrap();
    }
    assert!(
        client.stats().hedges > 0,
        "the stalls never triggered a hedge"
    );
    let kv = client.get("hedged").await.unwrap().unwrap();
    assert_eq!(kv.version, 60, "a hedged put counted twice");
}
