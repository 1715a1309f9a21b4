//! A request that meets an election waits for it instead of failing at once with "no
//! leader" (etcd's clients do not retry that); a member cut off from the majority still
//! says "no leader" after about two election timeouts, not after the whole request timeout.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{TestCluster, put};
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
