//! Growing a 3-member cluster to 5 and shrinking it back to 3, the leader removed on the
//! way, while an oncekv client writes through its session: no acknowledged write is lost,
//! none is applied twice, and every member lists the same members.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{LEADER_WAIT, TestCluster};
use oncekv_client::{Client, ClientConfig};
use oncekv_core::{KeyRange, RangeRequest};
use oncekv_proto::etcdserverpb::cluster_client::ClusterClient;
use oncekv_proto::etcdserverpb::{
    Member, MemberAddRequest, MemberListRequest, MemberRemoveRequest,
};
use oncekv_server::Stopped;

async fn cluster_client(endpoint: &str) -> ClusterClient<tonic::transport::Channel> {
    ClusterClient::connect(endpoint.to_string()).await.unwrap()
}

/// MemberAdd through `endpoint`, retried while the cluster is busy with a previous change
/// (an operator would retry too).
async fn member_add(endpoint: &str, peer_url: &str) -> u64 {
    let mut cluster = cluster_client(endpoint).await;
    for _ in 0..50 {
        match cluster
            .member_add(MemberAddRequest {
                peer_ur_ls: vec![peer_url.to_string()],
                is_learner: false,
            })
            .await
        {
            Ok(r) => return r.into_inner().member.expect("the added member").id,
            Err(e) => {
                eprintln!("member add: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    panic!("member add {peer_url} kept failing");
}

async fn member_remove(endpoint: &str, id: u64) {
    let mut cluster = cluster_client(endpoint).await;
    for _ in 0..50 {
        match cluster.member_remove(MemberRemoveRequest { id }).await {
            Ok(_) => return,
            Err(e) => {
                eprintln!("member remove: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    panic!("member remove {id:x} kept failing");
}

/// `(name, id, is_learner)` of every member `endpoint` lists.
async fn member_list(endpoint: &str) -> Option<BTreeSet<(String, u64, bool)>> {
    let mut cluster = ClusterClient::connect(endpoint.to_string()).await.ok()?;
    let members: Vec<Member> = cluster
        .member_list(MemberListRequest::default())
        .await
        .ok()?
        .into_inner()
        .members;
    Some(
        members
            .into_iter()
            .map(|m| (m.name, m.id, m.is_learner))
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn growing_to_five_and_back_to_three_loses_and_repeats_nothing() {
    let mut cluster = TestCluster::start(3, |_| {}).await;
    cluster.wait_leader(LEADER_WAIT).await;
    let template = cluster.configs[0].clone();
    let n4 = cluster.prepare_member(&template).await.unwrap();

    // A writer through an oncekv session, on every member that will ever exist (those
    // not started yet refuse connections until they are).
    let mut endpoints = cluster.endpoints();
    endpoints.push(n4.client_url());
    let client = Client::connect(&endpoints, ClientConfig::default()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn({
        let (client, stop) = (client.clone(), stop.clone());
        async move {
            let mut acknowledged = Vec::new();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("w{i:05}");
                match client.put(key.clone(), i.to_string()).await {
                    Ok(_) => acknowledged.push((key, i)),
                    // The outcome is unknown; a later read says whether it happened.
                    Err(e) => eprintln!("put {key}: {e}"),
                }
                i += 1;
            }
            acknowledged
        }
    });

    // Grow: n4, then n5, each added as a voter before it starts.
    let e0 = cluster.endpoint(0);
    let n4_id = member_add(&e0, &n4.peer_url()).await;
    let i4 = cluster.join(n4).await.unwrap();
    let n5 = cluster.prepare_member(&template).await.unwrap();
    let n5_id = member_add(&cluster.endpoint(1), &n5.peer_url()).await;
    let i5 = cluster.join(n5).await.unwrap();
    assert_eq!(cluster.node(i4).core.id(), n4_id);
    assert_eq!(cluster.node(i5).core.id(), n5_id);
    let five = |c: &TestCluster| {
        c.running().all(|(_, n)| {
            let m = n.core.membership();
            m.len() == 5
                && m.values()
                    .all(|m| !m.name.is_empty() && !m.client_url.is_empty())
        })
    };
    cluster
        .wait_for("five members, all started", Duration::from_secs(20), five)
        .await;
    for i in 0..5 {
        let list = member_list(&cluster.endpoint(i)).await.unwrap();
        let names: Vec<&str> = list.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(names.len(), 5, "member {i}: {list:?}");
        assert!(list.iter().all(|(_, _, learner)| !learner));
    }

    // Shrink: the leader first, then another founder.
    let leader = cluster.wait_leader(LEADER_WAIT).await;
    let leader_id = cluster.node(leader).core.id();
    let other = (0..3).find(|&i| i != leader).unwrap();
    member_remove(&cluster.endpoint(other), leader_id).await;
    let removed = tokio::time::timeout(Duration::from_secs(20), cluster.node(leader).failed())
        .await
        .expect("the removed leader notices");
    assert_eq!(removed, Stopped::Removed);
    cluster.stop(leader).await;
    let new_leader = cluster.wait_leader(LEADER_WAIT).await;
    assert_ne!(new_leader, leader);
    let second = (0..3)
        .find(|&i| i != leader && i != new_leader)
        .unwrap_or(i4);
    let second_id = cluster.node(second).core.id();
    let via = cluster
        .running()
        .map(|(i, _)| i)
        .find(|&i| i != second)
        .unwrap();
    member_remove(&cluster.endpoint(via), second_id).await;
    let removed = tokio::time::timeout(Duration::from_secs(20), cluster.node(second).failed())
        .await
        .expect("the removed member notices");
    assert_eq!(removed, Stopped::Removed);
    cluster.stop(second).await;

    // Let the writer go on a little in the shrunk cluster, then stop it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let acknowledged = writer.await.unwrap();
    assert!(
        acknowledged.len() > 20,
        "too few writes: {}",
        acknowledged.len()
    );
    client.close().await.unwrap();

    // Every remaining member: the same three members, every acknowledged write once.
    let leader = cluster.wait_leader(LEADER_WAIT).await;
    cluster
        .wait_caught_up(leader, Duration::from_secs(10))
        .await;
    let remaining: Vec<usize> = cluster.running().map(|(i, _)| i).collect();
    assert_eq!(remaining.len(), 3);
    let expected: BTreeSet<u64> = remaining
        .iter()
        .map(|&i| cluster.node(i).core.id())
        .collect();
    for &i in &remaining {
        let list = member_list(&cluster.endpoint(i)).await.unwrap();
        let ids: BTreeSet<u64> = list.iter().map(|(_, id, _)| *id).collect();
        assert_eq!(ids, expected, "member {i} lists {list:?}");
        let inner = cluster.node(i).core.applied().read();
        let all = RangeRequest {
            range: KeyRange::prefix(&b"w"[..]),
            ..Default::default()
        };
        let (_, resp) = inner.sm.range(&all).unwrap();
        for kv in &resp.kvs {
            assert_eq!(kv.version, 1, "member {i}: {:?} applied twice", kv.key);
        }
        let present: std::collections::HashMap<&[u8], &[u8]> = resp
            .kvs
            .iter()
            .map(|kv| (kv.key.as_ref(), kv.value.as_ref()))
            .collect();
        for (key, n) in &acknowledged {
            assert_eq!(
                present.get(key.as_bytes()).copied(),
                Some(n.to_string().as_bytes()),
                "member {i}: acknowledged {key} lost"
            );
        }
    }
    cluster.inner.shutdown().await;
}
