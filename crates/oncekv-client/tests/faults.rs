//! Exactly-once through the client under faults: a leader stopped mid-stream, a lost
//! reply, a full window, and the untracked client for contrast.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::Proxy;
use common::{LEADER_WAIT, TestCluster};
use oncekv_client::{Client, ClientConfig};

// The headline promise: N puts leave version == N even when the leader dies under them
// (retries that reach the new leader must be absorbed, not re-applied).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn puts_across_a_leader_stop_each_count_once() {
    let mut cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(LEADER_WAIT).await;
    let client = Client::connect(cluster.endpoints(), ClientConfig::default()).unwrap();

    let done = Arc::new(AtomicU64::new(0));
    let writer = {
        let (client, done) = (client.clone(), done.clone());
        tokio::spawn(async move {
            for i in 0..200 {
                client.put("counter", format!("{i}")).await.unwrap();
                done.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    while done.load(Ordering::SeqCst) < 50 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    cluster.stop(leader).await;
    tokio::time::timeout(Duration::from_secs(12), writer)
        .await
        .unwrap()
        .unwrap();

    let kv = client.get("counter").await.unwrap().unwrap();
    assert_eq!(kv.version, 200, "every put applied exactly once");
    assert_eq!(kv.value, "199");
    let stats = client.stats();
    eprintln!("after the leader stop: {stats:?}");
    assert!(
        stats.retries > 0,
        "the stopped leader must have cost retries: {stats:?}"
    );
    assert_eq!(
        (stats.outcome_unknown, stats.sessions_registered),
        (0, 1),
        "{stats:?}"
    );
}

/// A client whose first endpoint is a proxy to the leader, warmed up (session registered,
/// connection open, the proxy endpoint current) by one put to `key`.
async fn client_behind_a_proxy(
    cluster: &TestCluster,
    config: ClientConfig,
    key: &str,
) -> (Client, Proxy) {
    let leader = cluster.wait_leader(LEADER_WAIT).await;
    let proxy = Proxy::start(cluster.configs[leader].client_addr).await;
    let mut endpoints = vec![proxy.url()];
    endpoints.extend((0..3).filter(|i| *i != leader).map(|i| cluster.endpoint(i)));
    let client = Client::connect(endpoints, config).unwrap();
    client.put(key, "warm-up").await.unwrap();
    (client, proxy)
}

fn lossy_config(exactly_once: bool) -> ClientConfig {
    ClientConfig {
        request_timeout: Duration::from_millis(800),
        exactly_once,
        ..ClientConfig::default()
    }
}

// A lost reply is the case exactly-once exists for: the put ran, the client cannot know,
// and its retry must get the saved answer instead of running again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_a_lost_reply_returns_the_saved_response() {
    let cluster = TestCluster::start(3, |_| {}).await;
    let (client, proxy) = client_behind_a_proxy(&cluster, lossy_config(true), "k").await;

    proxy.swallow_replies(true);
    let put = client.put("k", "v").await.unwrap();
    let kv = client.get("k").await.unwrap().unwrap();
    assert_eq!(
        kv.version, 2,
        "warm-up + one put, although the put was sent twice"
    );
    assert_eq!(
        put.header.revision, kv.mod_revision,
        "the retry answered the first execution's revision"
    );
    assert!(client.stats().retries >= 1);
}

// DESIGN section 4: a retried grant with an explicit ID must succeed once, never answer
// "lease already exists" (which would tell the caller its own grant failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_lease_grant_with_an_explicit_id_succeeds_once() {
    let cluster = TestCluster::start(3, |_| {}).await;
    let (client, proxy) = client_behind_a_proxy(&cluster, lossy_config(true), "k").await;

    proxy.swallow_replies(true);
    let lease = client.lease_grant(30, 0x77).await.unwrap();
    assert_eq!(lease.id, 0x77);
    assert!(client.stats().retries >= 1, "the grant was sent twice");
    assert_eq!(client.lease_leases().await.unwrap(), vec![0x77]);
}

// The contrast the demo shows: without a session the same lost reply turns into a
// duplicate, and the untracked client never registers a session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untracked_client_sends_no_session_and_duplicates_a_retried_put() {
    let cluster = TestCluster::start(3, |_| {}).await;
    let (client, proxy) = client_behind_a_proxy(&cluster, lossy_config(false), "k").await;

    proxy.swallow_replies(true);
    client.put("k", "v").await.unwrap();
    let kv = client.get("k").await.unwrap().unwrap();
    assert_eq!(kv.version, 3, "the retried put applied twice");
    assert_eq!(client.session_id(), None);
    assert_eq!(client.stats().sessions_registered, 0);
    for (i, _) in cluster.running() {
        assert_eq!(cluster.sessions(i), 0, "member {i} saw a session");
    }
}

// A burst larger than the session window must queue on the client, not be refused by the
// server with WindowExceeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writes_beyond_the_window_wait_instead_of_failing() {
    let cluster = TestCluster::start(3, |c| c.settings.window = 4).await;
    cluster.wait_leader(LEADER_WAIT).await;
    let client = Client::connect(cluster.endpoints(), ClientConfig::default()).unwrap();

    let writers: Vec<_> = (0..32)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { client.put("burst", format!("{i}")).await })
        })
        .collect();
    for w in writers {
        w.await.unwrap().unwrap();
    }
    assert_eq!(client.get("burst").await.unwrap().unwrap().version, 32);
    assert_eq!(client.stats().sessions_registered, 1);
}
