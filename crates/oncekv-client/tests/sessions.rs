//! The session lifecycle: lazy registration, keep-alive, expiry before and during a
//! write, and stopping the keep-alive with the client.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::Proxy;
use common::{LEADER_WAIT, TestCluster};
use oncekv_client::{Client, ClientConfig, Error};

fn short_ttl(ttl_ms: u64) -> impl Fn(&mut oncekv_server::NodeConfig) {
    move |c| c.settings.session_ttl_ms = ttl_ms
}

fn no_keep_alive() -> ClientConfig {
    ClientConfig {
        keep_alive: false,
        ..ClientConfig::default()
    }
}

// Reads must not create server state; a session costs the cluster memory until it expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_is_registered_by_the_first_write_only() {
    let cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(LEADER_WAIT).await;
    let client = Client::connect(cluster.endpoints(), ClientConfig::default()).unwrap();

    assert_eq!(client.get("k").await.unwrap(), None);
    assert_eq!(client.session_id(), None);
    assert_eq!(cluster.sessions(leader), 0);

    client.put("k", "v").await.unwrap();
    let id = client.session_id().unwrap();
    assert!(cluster.has_session(leader, id));
    client.close().await.unwrap();
    assert!(
        !cluster.has_session(leader, id),
        "close frees the session on the server"
    );
}

// A registration whose reply is lost is retried with the same nonce and gets the session
// it opened: no orphan session lingers on the server until its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_register_reply_leaves_no_orphan_session() {
    let cluster = TestCluster::start(1, |_| {}).await;
    let leader = cluster.wait_leader(LEADER_WAIT).await;
    let proxy = Proxy::start(cluster.node(leader).client_addr).await;
    let client = Client::connect([proxy.url()], ClientConfig::default()).unwrap();
    // Reply turns from here: 1 the get (passes), 2 the registration (swallowed), 3 its
    // retry (passes), 4 the put (swallowed), 5 its retry (passes).
    proxy.0.set_swallow_every(2);
    assert_eq!(client.get("k").await.unwrap(), None);
    client.put("k", "v").await.unwrap();
    assert!(proxy.0.stats().replies_swallowed >= 2);
    assert_eq!(
        cluster.sessions(leader),
        1,
        "the retried registration opened a second session"
    );
    assert!(cluster.has_session(leader, client.session_id().unwrap()));
    assert_eq!(client.stats().sessions_registered, 1);
}

// If nothing of a request can have run under the expired session, re-sending it under a
// new one is safe, so the caller should not see an error at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_attempt_meeting_an_expired_session_reregisters_and_succeeds() {
    let cluster = TestCluster::start(3, short_ttl(400)).await;
    let leader = cluster.wait_leader(LEADER_WAIT).await;
    let client = Client::connect(cluster.endpoints(), no_keep_alive()).unwrap();

    client.put("k", "1").await.unwrap();
    let old = client.session_id().unwrap();
    cluster
        .wait_for("session expiry", Duration::from_secs(5), |c| {
            !c.has_session(leader, old)
        })
        .await;

    client.put("k", "2").await.unwrap();
    let new = client.session_id().unwrap();
    assert_ne!(new, old, "the write went out under a new session");
    client.put("k", "3").await.unwrap();
    assert_eq!(
        client.session_id(),
        Some(new),
        "later calls keep using the new session"
    );

    assert_eq!(client.get("k").await.unwrap().unwrap().version, 3);
    let stats = client.stats();
    assert_eq!(
        (stats.sessions_registered, stats.outcome_unknown),
        (2, 0),
        "{stats:?}"
    );
}

// Without the keep-alive an idle client would lose its session (and its dedup state)
// after one TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_holds_an_idle_session_open() {
    let cluster = TestCluster::start(3, short_ttl(600)).await;
    let leader = cluster.wait_leader(LEADER_WAIT).await;
    let client = Client::connect(cluster.endpoints(), ClientConfig::default()).unwrap();

    client.put("k", "1").await.unwrap();
    let id = client.session_id().unwrap();
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert!(
        cluster.has_session(leader, id),
        "the session outlived three TTLs"
    );
    client.put("k", "2").await.unwrap();
    assert_eq!(client.session_id(), Some(id));
    assert_eq!(client.stats().sessions_registered, 1);
}

// A dropped client must not keep a session alive forever from a leaked task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_client_stops_its_keep_alive() {
    let cluster = TestCluster::start(3, short_ttl(600)).await;
    let leader = cluster.wait_leader(LEADER_WAIT).await;
    let client = Client::connect(cluster.endpoints(), ClientConfig::default()).unwrap();
    client.put("k", "1").await.unwrap();
    let id = client.session_id().unwrap();
    let clone = client.clone();
    drop(client);
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!(
        cluster.has_session(leader, id),
        "a live clone keeps the session"
    );

    drop(clone);
    cluster
        .wait_for("session expiry after drop", Duration::from_secs(5), |c| {
            !c.has_session(leader, id)
        })
        .await;
}

// A write that was sent, lost its reply, and then found its session gone may or may not
// have run: the client must say so rather than guess (and here it did run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_expiring_while_a_write_is_in_flight_is_outcome_unknown() {
    let cluster = TestCluster::start(3, short_ttl(500)).await;
    let leader = cluster.wait_leader(LEADER_WAIT).await;
    let proxy = Proxy::start(cluster.configs[leader].client_addr).await;
    let mut endpoints = vec![proxy.url()];
    endpoints.extend((0..3).filter(|i| *i != leader).map(|i| cluster.endpoint(i)));
    let config = ClientConfig {
        keep_alive: false,
        request_timeout: Duration::from_millis(300),
        // The retry comes 1.5-3 s later, long after the 500 ms session TTL.
        backoff_base: Duration::from_secs(3),
        backoff_cap: Duration::from_secs(3),
        ..ClientConfig::default()
    };
    let client = Client::connect(endpoints, config).unwrap();
    client.put("k", "1").await.unwrap();
    let old = client.session_id().unwrap();

    proxy.swallow_replies(true);
    let err = client.put("k", "2").await.unwrap_err();
    assert!(matches!(err, Error::OutcomeUnknown { .. }), "{err:?}");
    assert!(err.to_string().contains("expired"), "{err}");
    assert_eq!(client.session_id(), None, "the expired session is dropped");
    let kv = client.get("k").await.unwrap().unwrap();
    assert_eq!(
        (kv.version, &kv.value[..]),
        (2, &b"2"[..]),
        "the unknown write did run"
    );

    client.put("k", "3").await.unwrap();
    assert_ne!(client.session_id(), Some(old));
    let stats = client.stats();
    assert_eq!(
        (stats.outcome_unknown, stats.sessions_registered),
        (1, 2),
        "{stats:?}"
    );
}

/// Records what expired on one member, and at which log index.
#[derive(Debug, Default)]
struct ExpiryRecorder(std::sync::Mutex<Vec<oncekv_core::Expired>>);

impl oncekv_server::sm_store::ApplyObserver for ExpiryRecorder {
    fn prepare(&self, sm: &mut oncekv_core::StateMachine) {
        sm.record_expiries(true);
    }

    fn applied(&self, sm: &mut oncekv_core::StateMachine) {
        let mut log = self.0.lock().unwrap();
        log.extend(sm.take_expired());
    }
}

// Expiry is decided by cluster time in the log, so every replica must drop an idle session
// while applying the same entry; otherwise replicas could answer a retry differently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_session_expires_on_every_replica_at_the_same_log_index() {
    let recorders: Vec<std::sync::Arc<ExpiryRecorder>> =
        (0..3).map(|_| Default::default()).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let cluster = TestCluster::start(3, |c| {
        c.settings.session_ttl_ms = 1_000;
        let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        c.observer = Some(recorders[i].clone());
    })
    .await;
    cluster.wait_leader(LEADER_WAIT).await;
    let config = ClientConfig {
        keep_alive: false,
        ..ClientConfig::default()
    };
    let client = Client::connect(cluster.endpoints(), config).unwrap();
    client.put("k", "v").await.unwrap();
    let id = client.session_id().unwrap();

    let expired_at = |r: &ExpiryRecorder| {
        r.0.lock().unwrap().iter().find_map(|e| match e {
            oncekv_core::Expired::Session { index, client_id } if *client_id == id => Some(*index),
            _ => None,
        })
    };
    cluster
        .wait_for(
            "the session to expire everywhere",
            Duration::from_secs(10),
            |_| recorders.iter().all(|r| expired_at(r).is_some()),
        )
        .await;
    let indexes: Vec<_> = recorders.iter().map(|r| expired_at(r).unwrap()).collect();
    assert!(
        indexes.iter().all(|i| *i == indexes[0]),
        "expired at different log indexes: {indexes:?}"
    );
}
