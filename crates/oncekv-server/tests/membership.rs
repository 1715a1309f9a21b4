//! etcd's Cluster service: a member added after the log was compacted gets the state,
//! sessions and saved replies included, from the leader's snapshot; learners; etcd's
//! refusals; a member that starts to join without being added is told what to do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{TestCluster, put, register, tracked};
use oncekv_server::pb::etcdserverpb::cluster_client::ClusterClient;
use oncekv_server::pb::etcdserverpb::{
    MemberAddRequest, MemberListRequest, MemberPromoteRequest, MemberRemoveRequest,
    MemberUpdateRequest, PutRequest,
};
use tonic::Code;

async fn cluster_client(endpoint: &str) -> ClusterClient<tonic::transport::Channel> {
    ClusterClient::connect(endpoint.to_string()).await.unwrap()
}

fn add(peer_url: &str, learner: bool) -> MemberAddRequest {
    MemberAddRequest {
        peer_ur_ls: vec![peer_url.to_string()],
        is_learner: learner,
    }
}

// A tracked put answered before a member joined, retried against the new member after it
// installed a snapshot: the saved reply, not a second execution.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_reaching_a_new_member_gets_the_saved_reply() {
    let mut cluster = TestCluster::start(3, |c| c.snapshot_count = 20).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let session = register(&cluster.endpoint(leader)).await;
    let req = || PutRequest {
        key: b"once".to_vec().into(),
        value: b"1".to_vec().into(),
        ..Default::default()
    };
    let mut kv = cluster.kv(leader).await;
    let first = kv
        .put(tracked(&session, 1, req()))
        .await
        .unwrap()
        .into_inner();
    // Enough entries after it that the log is compacted past it on every member.
    for i in 0..60 {
        put(&mut kv, &format!("fill{i}"), "x").await.unwrap();
    }
    cluster
        .wait_for(
            "the log purged past the put",
            Duration::from_secs(10),
            |c| {
                c.running()
                    .all(|(_, n)| n.core.metrics().purged.is_some_and(|p| p.index > 20))
            },
        )
        .await;

    let template = cluster.configs[0].clone();
    let joining = cluster.prepare_member(&template).await.unwrap();
    let mut members = cluster_client(&cluster.endpoint(leader)).await;
    let added = members
        .member_add(add(&joining.peer_url(), false))
        .await
        .unwrap()
        .into_inner();
    let new_id = added.member.as_ref().unwrap().id;
    assert_eq!(added.members.len(), 4);
    // Not started yet: listed without a name, as etcd lists an unstarted member.
    assert!(added.member.unwrap().name.is_empty());
    let i = cluster.join(joining).await.unwrap();
    assert_eq!(cluster.node(i).core.id(), new_id);
    cluster
        .wait_for(
            "the new member has the session",
            Duration::from_secs(20),
            |c| c.has_session(i, session.0),
        )
        .await;

    let mut on_new = cluster.kv(i).await;
    let retry = on_new
        .put(tracked(&session, 1, req()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        retry.header.as_ref().map(|h| h.revision),
        first.header.as_ref().map(|h| h.revision),
        "the retry must answer the original's revision"
    );
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    cluster
        .wait_caught_up(leader, Duration::from_secs(10))
        .await;
    let got = common::get(&mut on_new, "once").await.unwrap();
    assert_eq!(got, Some(("1".to_string(), 1)), "applied once");
    cluster.inner.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn learners_and_etcds_refusals() {
    let mut cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let follower = (leader + 1) % 3;
    // Through a follower: changes are forwarded to the leader.
    let mut members = cluster_client(&cluster.endpoint(follower)).await;

    let taken = cluster.configs[leader].initial_cluster[leader]
        .peer_url
        .clone();
    let err = members.member_add(add(&taken, false)).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(err.message(), "etcdserver: Peer URLs already exists");
    let err = members
        .member_remove(MemberRemoveRequest { id: 42 })
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (Code::NotFound, "etcdserver: member not found")
    );
    let voter = cluster.node(leader).core.id();
    let err = members
        .member_promote(MemberPromoteRequest { id: voter })
        .await
        .unwrap_err();
    assert_eq!(
        err.message(),
        "etcdserver: can only promote a learner member"
    );

    let template = cluster.configs[0].clone();
    let joining = cluster.prepare_member(&template).await.unwrap();
    let learner = members
        .member_add(add(&joining.peer_url(), true))
        .await
        .unwrap()
        .into_inner()
        .member
        .unwrap();
    assert!(learner.is_learner);
    let err = members
        .member_add(add("http://127.0.0.1:9", true))
        .await
        .unwrap_err();
    assert_eq!(
        err.message(),
        "etcdserver: too many learner members in cluster"
    );
    // Not started, so far behind the leader's log.
    let err = members
        .member_promote(MemberPromoteRequest { id: learner.id })
        .await
        .unwrap_err();
    assert_eq!(
        err.message(),
        "etcdserver: can only promote a learner member which is in sync with leader"
    );

    let i = cluster.join(joining).await.unwrap();
    let leader_applied = cluster
        .node(leader)
        .core
        .applied()
        .read()
        .sm
        .applied_index();
    cluster
        .wait_for("the learner catches up", Duration::from_secs(20), |c| {
            c.node(i).core.applied().read().sm.applied_index() >= leader_applied
        })
        .await;
    let mut promoted = None;
    for _ in 0..50 {
        match members
            .member_promote(MemberPromoteRequest { id: learner.id })
            .await
        {
            Ok(r) => {
                promoted = Some(r.into_inner());
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let promoted = promoted.expect("the caught-up learner is promoted");
    assert!(
        promoted
            .members
            .iter()
            .all(|m| !m.is_learner && m.peer_ur_ls.len() == 1)
    );
    let listed = members
        .member_list(MemberListRequest::default())
        .await
        .unwrap()
        .into_inner()
        .members;
    assert_eq!(listed.len(), 4);

    // MemberUpdate: another member's URL is refused, an unknown member too; its own URL
    // is accepted.
    let update = |id: u64, url: &str| MemberUpdateRequest {
        id,
        peer_ur_ls: vec![url.to_string()],
    };
    let err = members
        .member_update(update(learner.id, &taken))
        .await
        .unwrap_err();
    assert_eq!(err.message(), "etcdserver: Peer URLs already exists");
    let err = members
        .member_update(update(42, "http://127.0.0.1:9"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let own = learner.peer_ur_ls[0].clone();
    let updated = members
        .member_update(update(learner.id, &own))
        .await
        .unwrap()
        .into_inner();
    assert!(
        updated
            .members
            .iter()
            .any(|m| m.id == learner.id && m.peer_ur_ls == [own.clone()])
    );
    cluster.inner.shutdown().await;
}

// A member started with --initial-cluster-state existing that no one added: a start error
// that says to add it first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joining_without_being_added_is_refused_with_the_fix() {
    let mut cluster = TestCluster::start(1, |_| {}).await;
    cluster.wait_leader(Duration::from_secs(10)).await;
    let template = cluster.configs[0].clone();
    let joining = cluster.prepare_member(&template).await.unwrap();
    let url = joining.peer_url();
    let err = cluster.join(joining).await.unwrap_err().to_string();
    assert!(
        err.contains(&format!("member add NAME --peer-urls={url}")) && err.contains("not a member"),
        "{err}"
    );
    cluster.inner.shutdown().await;
}
