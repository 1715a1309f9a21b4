//! Locks through a fault proxy that drops every other reply on average (each with
//! probability 1/2: the request ran; the client sees a reset connection and retries). Not
//! strictly every second one: the guard's keep-alives share the proxy, and a strict
//! alternation can line up so that every attempt of one call is the dropped one: the oncekv client's 100 lock/unlock cycles leave
//! exactly 100 lock keys, created in order and each deleted, and nothing behind; an
//! untracked client doing the same leaves orphans.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{LEADER_WAIT, Proxy, TestCluster};
use oncekv_client::{Client, ClientConfig, EventType, GetOptions, WatchOptions};
use oncekv_proto::v3lockpb::LockRequest;
use oncekv_proto::v3lockpb::lock_client::LockClient;

const CYCLES: usize = 100;

/// A client whose first endpoint is the proxy in front of the leader, warmed up.
async fn behind_proxy(cluster: &TestCluster, config: ClientConfig) -> (Client, Proxy) {
    let leader = cluster.wait_leader(LEADER_WAIT).await;
    let proxy = Proxy::start(cluster.configs[leader].client_addr).await;
    // The proxy only: with the other members listed, the client would move to one of them
    // after the first reset and the faults would be over.
    let client = Client::connect([proxy.url()], config).unwrap();
    client.put("warm-up", "1").await.unwrap();
    (client, proxy)
}

/// What history holds under `prefix` after `from`: the create revisions of the keys put
/// there (in order) and how many keys were deleted.
async fn history(client: &Client, prefix: &str, from: i64) -> (Vec<i64>, usize) {
    let now = client
        .range("warm-up", GetOptions::new())
        .await
        .unwrap()
        .header
        .revision;
    let options = WatchOptions::new().with_prefix().with_start_revision(from);
    let mut watcher = client.watch(prefix, options).await.unwrap();
    let (mut created, mut deleted) = (Vec::new(), 0);
    while watcher.next_revision() <= now {
        let resp = tokio::time::timeout(Duration::from_secs(10), watcher.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        for e in resp.events {
            match e.kind {
                EventType::Put if e.kv.create_revision == e.kv.mod_revision => {
                    created.push(e.kv.create_revision);
                }
                EventType::Put => {}
                EventType::Delete => deleted += 1,
            }
        }
    }
    watcher.cancel().await;
    (created, deleted)
}

fn config(exactly_once: bool) -> ClientConfig {
    ClientConfig {
        attempt_timeout: Duration::from_millis(500),
        exactly_once,
        ..ClientConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_cycles_through_lost_replies_leave_exactly_their_keys() {
    let cluster = TestCluster::start(3, |_| {}).await;
    let (client, proxy) = behind_proxy(&cluster, config(true)).await;
    let start = client.get("warm-up").await.unwrap().unwrap().mod_revision + 1;

    proxy.0.set_drop_replies(0.5);
    let mut tokens = Vec::with_capacity(CYCLES);
    for _ in 0..CYCLES {
        let guard = client.lock("cycle").await.unwrap();
        tokens.push(guard.fencing_token());
        guard.unlock().await.unwrap();
    }
    proxy.0.heal();
    let stats = client.stats();
    assert!(
        stats.retries >= CYCLES as u64,
        "the proxy must have cost retries: {stats:?}"
    );
    assert!(proxy.0.stats().replies_dropped >= CYCLES as u64);

    let (created, deleted) = history(&client, "cycle/", start).await;
    assert_eq!(created, tokens, "exactly one key per cycle, in order");
    assert!(created.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(deleted, CYCLES, "every key released");
    assert!(
        client
            .range("cycle/", GetOptions::new().with_prefix())
            .await
            .unwrap()
            .kvs
            .is_empty()
    );
    assert!(
        client.lease_leases().await.unwrap().is_empty(),
        "no lease left"
    );
}

// The same cycles untracked: a retried lease grant grants a second lease nobody will
// revoke (left to expire), and etcd's Lock without a lease, retried, queues a second waiter
// behind a first that nobody knows of: it holds the lock until its lease expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untracked_lock_cycles_leave_orphans() {
    let cluster = TestCluster::start(3, |_| {}).await;
    let (client, proxy) = behind_proxy(&cluster, config(false)).await;

    proxy.0.set_drop_replies(0.5);
    for _ in 0..20 {
        let guard = client.lock("cycle").await.unwrap();
        guard.unlock().await.unwrap();
    }
    proxy.0.heal();
    let orphan_leases = client.lease_leases().await.unwrap();
    assert!(
        !orphan_leases.is_empty(),
        "retried grants must have left leases behind"
    );

    // etcd's own Lock with lease 0 (what etcd clients send when given no lease): its reply
    // lost, then retried as an etcd user would.
    proxy.0.set_drop_replies(1.0);
    let req = || LockRequest {
        name: "raw".into(),
        lease: 0,
    };
    let mut lock = LockClient::connect(proxy.url()).await.unwrap();
    assert!(lock.lock(req()).await.is_err(), "the reply was dropped");
    proxy.0.heal();
    let mut lock = LockClient::connect(proxy.url()).await.unwrap();
    let retry = tokio::spawn(async move { lock.lock(req()).await });
    let started = tokio::time::Instant::now();
    let keys = loop {
        let keys = client
            .range("raw/", GetOptions::new().with_prefix())
            .await
            .unwrap()
            .kvs;
        if keys.len() >= 2 || started.elapsed() > Duration::from_secs(10) {
            break keys;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(keys.len(), 2, "the retry queued a second waiter: {keys:?}");
    assert!(
        !retry.is_finished(),
        "the retry waits behind the first copy's key, whose lease nobody keeps or revokes"
    );
    retry.abort();
    // The same through a session: the retry gets the first answer (see the server's
    // lock_election test, which sends one Lock twice with one seq).
}
