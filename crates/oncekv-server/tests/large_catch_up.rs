//! A follower that missed many large entries catches up although they add up to far more
//! than a peer message may carry: the leader's appends are split to fit the peer port's
//! limit (a few MiB, not the 256 MiB it once accepted from anyone naming the cluster).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use oncekv_proto::etcdserverpb::PutRequest;
use oncekv_testkit::local_cluster::TempCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_catches_up_on_entries_larger_than_a_message() {
    let mut cluster = TempCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let follower = (leader + 1) % 3;
    cluster.stop(follower).await;
    let limit = oncekv_server::network::peer_message_limit(cluster.node(leader).core.config());
    // One MiB values, each its own entry: 24 of them are several times the limit.
    let value = vec![0x5au8; 1 << 20];
    let count = 3 * limit / value.len();
    let mut kv = cluster.kv(leader).await;
    for i in 0..count {
        kv.put(PutRequest {
            key: format!("big/{i:03}").into_bytes().into(),
            value: value.clone().into(),
            ..PutRequest::default()
        })
        .await
        .unwrap();
    }
    cluster.restart(follower).await;
    cluster
        .wait_caught_up(leader, Duration::from_secs(30))
        .await;
    let state = cluster.node(follower).core.applied().read();
    for i in 0..count {
        let got = state.sm.kv().get(format!("big/{i:03}").as_bytes());
        assert_eq!(got.map(|v| v.value.len()), Some(value.len()), "key {i}");
    }
}
