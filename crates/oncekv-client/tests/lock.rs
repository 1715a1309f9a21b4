//! The client's locks and elections against a real cluster: mutual exclusion with fencing
//! tokens, cleanup of abandoned and released locks, lost locks, and elections handing over.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{LEADER_WAIT, TestCluster};
use oncekv_client::{Client, ClientConfig, Error, GetOptions, LockOptions};
use tokio_stream::StreamExt;

const WAIT: Duration = Duration::from_secs(15);

async fn keys_under(c: &Client, prefix: &str) -> Vec<String> {
    c.range(prefix, GetOptions::new().with_prefix())
        .await
        .unwrap()
        .kvs
        .iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .collect()
}

async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = tokio::time::Instant::now();
    while !f().await {
        assert!(start.elapsed() < WAIT, "not within {WAIT:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `tasks` tasks, each `rounds` times: lock, read the counter, write it + 1 (a lost update
/// if two ever overlap), unlock. Returns the fencing tokens in acquisition order.
async fn contend(clients: Vec<Client>, rounds: usize) -> Vec<i64> {
    let tokens = Arc::new(tokio::sync::Mutex::new(Vec::new()));
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|c| {
            let tokens = tokens.clone();
            tokio::spawn(async move {
                for _ in 0..rounds {
                    let guard = c.lock("counter-lock").await.unwrap();
                    tokens.lock().await.push(guard.fencing_token());
                    let n: u64 = match c.get("counter").await.unwrap() {
                        Some(kv) => String::from_utf8_lossy(&kv.value).parse().unwrap(),
                        None => 0,
                    };
                    tokio::task::yield_now().await;
                    c.put("counter", (n + 1).to_string()).await.unwrap();
                    guard.unlock().await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .unwrap()
            .unwrap();
    }
    Arc::try_unwrap(tokens).unwrap().into_inner()
}

fn assert_increasing(tokens: &[i64]) {
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens not increasing in acquisition order: {tokens:?}"
    );
}

// Three tasks through one Client, then three Clients: no increment is lost, and each
// holder's token is larger than the one before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn holders_exclude_each_other_and_tokens_increase() {
    let cluster = TestCluster::start(3, |_| {}).await;
    cluster.wait_leader(LEADER_WAIT).await;
    let shared = Client::connect(cluster.endpoints(), ClientConfig::default()).unwrap();
    let tokens = contend(vec![shared.clone(), shared.clone(), shared.clone()], 10).await;
    assert_eq!(tokens.len(), 30);
    assert_increasing(&tokens);
    let own: Vec<Client> = (0..3)
        .map(|i| Client::connect([cluster.endpoint(i)], ClientConfig::default()).unwrap())
        .collect();
    let tokens = contend(own, 10).await;
    assert_increasing(&tokens);
    let kv = shared.get("counter").await.unwrap().unwrap();
    assert_eq!(
        kv.value, "60",
        "an increment was lost: two holders overlapped"
    );
    assert!(keys_under(&shared, "counter-lock/").await.is_empty());
    assert!(
        shared.lease_leases().await.unwrap().is_empty(),
        "leases left"
    );
}

// A lock abandoned while it waits leaves nothing behind; unlock removes key and lease; a
// caller's lease is left alone; a guard whose lease is revoked from outside is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_released_and_lost_locks() {
    let cluster = TestCluster::start(3, |_| {}).await;
    cluster.wait_leader(LEADER_WAIT).await;
    let c = Client::connect(cluster.endpoints(), ClientConfig::default()).unwrap();
    let held = c.lock("l").await.unwrap();
    assert!(held.key().starts_with(b"l/"));
    assert_eq!(held.key(), format!("l/{:x}", held.lease()).as_bytes());

    let abandoned = tokio::time::timeout(Duration::from_millis(500), c.lock("l")).await;
    assert!(abandoned.is_err(), "l is held: the second lock must wait");
    eventually("the abandoned waiter's key and lease are gone", || {
        let c = c.clone();
        async move {
            keys_under(&c, "l/").await.len() == 1 && c.lease_leases().await.unwrap().len() == 1
        }
    })
    .await;

    let lease = held.lease();
    held.unlock().await.unwrap();
    assert!(keys_under(&c, "l/").await.is_empty());
    assert!(!c.lease_leases().await.unwrap().contains(&lease));

    let mine = c.lease_grant(30, 0).await.unwrap().id;
    let g = c
        .lock_with("m", LockOptions::new().with_lease(mine))
        .await
        .unwrap();
    assert_eq!(g.lease(), mine);
    g.unlock().await.unwrap();
    assert!(keys_under(&c, "m/").await.is_empty());
    assert!(
        c.lease_leases().await.unwrap().contains(&mine),
        "the caller's lease stays"
    );

    let g = c
        .lock_with("n", LockOptions::new().with_ttl(3))
        .await
        .unwrap();
    assert!(!g.is_lost());
    c.lease_revoke(g.lease()).await.unwrap();
    tokio::time::timeout(WAIT, g.lost()).await.unwrap();
    assert!(g.is_lost());
    g.unlock().await.unwrap();
}

// A campaign waits while another leads; the observer sees the first leader, its
// proclaimed value, then the next leader; the old leadership can no longer proclaim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elections_hand_over_and_observers_follow() {
    let cluster = TestCluster::start(3, |_| {}).await;
    cluster.wait_leader(LEADER_WAIT).await;
    let c = Client::connect(cluster.endpoints(), ClientConfig::default()).unwrap();
    let election = c.election("pick");
    assert_eq!(election.leader().await.unwrap(), None);
    let mut observer = election.observe();

    let first = election.campaign("a").await.unwrap();
    let elected = Arc::new(AtomicBool::new(false));
    let second = {
        let (election, elected) = (election.clone(), elected.clone());
        tokio::spawn(async move {
            let l = election.campaign("b").await.unwrap();
            elected.store(true, Ordering::SeqCst);
            l
        })
    };
    let mut next = async || {
        let kv = tokio::time::timeout(WAIT, observer.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        (
            String::from_utf8_lossy(&kv.key).into_owned(),
            String::from_utf8_lossy(&kv.value).into_owned(),
        )
    };
    let first_key = String::from_utf8_lossy(first.key()).into_owned();
    assert_eq!(next().await, (first_key.clone(), "a".into()));
    first.proclaim("a2").await.unwrap();
    assert_eq!(next().await, (first_key.clone(), "a2".into()));
    assert_eq!(election.leader().await.unwrap().unwrap().value, "a2");
    eventually("the second candidate is queued", || {
        let c = c.clone();
        async move { keys_under(&c, "pick/").await.len() == 2 }
    })
    .await;
    assert!(!elected.load(Ordering::SeqCst), "two leaders at once");

    first.resign().await.unwrap();
    let second = tokio::time::timeout(WAIT, second).await.unwrap().unwrap();
    let (key, value) = next().await;
    assert_eq!(key.as_bytes(), second.key());
    assert_eq!(value, "b");
    // A leader whose lease ends is no leader: it can no longer proclaim.
    c.lease_revoke(second.lease()).await.unwrap();
    assert!(matches!(
        second.proclaim("late").await,
        Err(Error::NotLeader(_))
    ));
    assert_eq!(election.leader().await.unwrap(), None);
    second.resign().await.unwrap();
}
