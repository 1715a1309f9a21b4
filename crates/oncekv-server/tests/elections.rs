//! A request that meets an election waits for it instead of failing at once with "no
//! leader" (etcd's clients do not retry that); a member cut off from the majority still
//! says "no leader" after about two election timeouts, not after the whole request timeout.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{TestCluster, get, put};
use oncekv_server::pb::etcdserverpb::kv_client::KvClient;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_without_a_majority_waits_for_an_election_then_says_no_leader() {
    let mut cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let survivor = (leader + 1) % 3;
    let mut kv = KvClient::connect(cluster.endpoint(survivor)).await.unwrap();
    put(&mut kv, "before", "v").await.unwrap();
    for i in (0..3).filter(|i| *i != survivor) {
        cluster.stop(i).await;
    }
    // Once the survivor stands for election it knows no leader.
    let start = Instant::now();
    while cluster.node(survivor).core.leader().is_some() {
        assert!(start.elapsed() < Duration::from_secs(10), "still follows");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let config = cluster.node(survivor).core.config().clone();
    let election = Duration::from_millis(config.election_timeout_ms);

    let sent = Instant::now();
    let err = put(&mut kv, "during", "v").await.unwrap_err();
    let waited = sent.elapsed();
    assert!(err.message().contains("no leader"), "{err:?}");
    assert!(
        waited >= election,
        "answered after {waited:?}, before an election could have ended"
    );
    assert!(
        waited < config.request_timeout,
        "held for {waited:?}: a client cut off from the majority should hear sooner"
    );
}

// A follower still names a leader that just went down until the others elect a new one;
// a write it cannot forward (no connection to the old leader could be made, so the write
// was not sent) goes to the new leader instead of failing with "no leader".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_sent_as_the_leader_goes_down_goes_to_the_next_leader() {
    let mut cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let follower = (leader + 1) % 3;
    let mut kv = KvClient::connect(cluster.endpoint(follower)).await.unwrap();
    put(&mut kv, "before", "v").await.unwrap();
    let leader_id = cluster.node(leader).core.id();
    cluster.stop(leader).await;
    assert_eq!(
        cluster.node(follower).core.leader(),
        Some(leader_id),
        "the follower should still name the stopped leader (no election yet)"
    );

    // If the follower still held a connection to the old leader, the first write may have
    // gone out on it before it broke: that one is answered "no leader" (it may have been
    // sent, so it is not sent again). The next finds no connection to make, so it must
    // wait for the new leader and succeed (without the wait it fails at once, as the
    // election takes longer than an election timeout).
    let sent = Instant::now();
    let mut revision = put(&mut kv, "after", "v").await;
    if let Err(e) = &revision {
        assert!(e.message().contains("no leader"), "{e:?}");
        revision = put(&mut kv, "after", "v").await;
    }
    assert!(revision.is_ok(), "{revision:?} after {:?}", sent.elapsed());
    let value = common::get(&mut kv, "after").await.unwrap();
    assert_eq!(value.map(|(v, _)| v).as_deref(), Some("v"));
}

// A cluster whose members all stopped cleanly comes back under the leader it had, in the
// same term, without an election: the leader's log was closed whole (the clean-stop mark),
// so it may resume its term at once. A leader that crashed may not (it could have lost
// entries its followers hold; see `LogStore::read_vote`), which the simulation checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_stopped_cleanly_restarts_under_its_leader_without_an_election() {
    // A long election timeout: a follower that starts and does not hear from the
    // restarted leader soon (a slow machine) must not campaign before it does.
    let mut cluster = TestCluster::start(3, |c| c.election_timeout_ms = 2_000).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let mut kv = KvClient::connect(cluster.endpoint(leader)).await.unwrap();
    put(&mut kv, "before", "v").await.unwrap();
    let term = cluster.node(leader).core.metrics().current_term;
    // Followers first: a follower left running without its leader would campaign.
    let order = [(leader + 1) % 3, (leader + 2) % 3, leader];
    for i in order {
        cluster.stop(i).await;
    }
    for i in order.into_iter().rev() {
        cluster.restart(i).await;
    }
    assert_eq!(cluster.wait_leader(Duration::from_secs(10)).await, leader);
    for i in 0..3 {
        assert_eq!(
            cluster.node(i).core.metrics().current_term,
            term,
            "member {i} is in another term: the restart held an election"
        );
    }
    let mut kv = KvClient::connect(cluster.endpoint(leader)).await.unwrap();
    put(&mut kv, "after", "v").await.unwrap();
    assert_eq!(
        get(&mut kv, "before")
            .await
            .unwrap()
            .map(|(v, _)| v)
            .as_deref(),
        Some("v"),
        "the value put before the restart is gone"
    );
}

// Followers that crashed and restart know no leader and stand for election after half to
// one election timeout; two of them are a majority without the leader. The leader, which
// kept trying them while they were down, must reach them first: their restart must not
// depose a healthy leader (a new term, an election's pause, requests in flight failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_followers_that_restart_follow_the_leader_they_find() {
    let mut cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let mut kv = KvClient::connect(cluster.endpoint(leader)).await.unwrap();
    put(&mut kv, "before", "v").await.unwrap();
    let term = cluster.node(leader).core.metrics().current_term;
    let election = Duration::from_millis(cluster.node(leader).core.config().election_timeout_ms);
    let followers = [(leader + 1) % 3, (leader + 2) % 3];
    for round in 0..5 {
        for f in followers {
            cluster.stop(f).await;
        }
        // Long enough for the leader's tries to fail and it to back off.
        tokio::time::sleep(election / 2).await;
        for f in followers {
            cluster.restart(f).await;
        }
        // Past the restarted members' longest timeout, with room to spare.
        tokio::time::sleep(election * 2).await;
        for i in 0..3 {
            assert_eq!(
                cluster.node(i).core.metrics().current_term,
                term,
                "round {round}: member {i} is in another term: the restarted followers held an election"
            );
        }
    }
    put(&mut kv, "after", "v").await.unwrap();
}

// A new cluster elects one leader in term 1 and keeps it: founders that all campaigned at
// once used to split term 1 (openraft lets a higher id take over within a term), so the
// first leader stepped down and a write right after the cluster was up met "no leader".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_cluster_elects_one_leader_in_term_one() {
    let cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    // Long enough for a split term 1 to have shown (a second election, a new leader).
    let election = cluster.node(leader).core.config().election_timeout_ms;
    tokio::time::sleep(Duration::from_millis(2 * election)).await;
    for i in 0..3 {
        let m = cluster.node(i).core.metrics();
        assert_eq!(m.current_term, 1, "member {i}: {m:?}");
        assert_eq!(
            m.current_leader,
            cluster.node(leader).core.metrics().current_leader
        );
    }
}
