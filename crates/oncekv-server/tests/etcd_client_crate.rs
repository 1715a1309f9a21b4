//! The third-party `etcd-client` crate against an oncekv cluster: the same operations
//! etcdctl covers, from a Rust etcd client library that knows nothing of oncekv.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::TestCluster;
use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, EventType, GetOptions, LeaseTimeToLiveOptions,
    PutOptions, Txn, TxnOp, WatchOptions,
};

/// The tests here each run a 3-member cluster with fast election timeouts, and the
/// etcd-client crate does not retry a request that meets an election ("no leader"): two
/// clusters at once on a loaded 2-core machine made elections, and these tests, flaky.
static ONE_CLUSTER_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_client_crate_works_unchanged() {
    let _serial = ONE_CLUSTER_AT_A_TIME.lock().await;
    let cluster = TestCluster::start(3, |_| {}).await;
    cluster.wait_leader(Duration::from_secs(10)).await;
    let mut c = Client::connect(cluster.endpoints(), None).await.unwrap();

    // put / get / prefix / from-key
    let r = c.put("greeting", "hello", None).await.unwrap();
    let rev = r.header().unwrap().revision();
    c.put("group/a", "1", None).await.unwrap();
    c.put("group/b", "2", None).await.unwrap();
    let r = c.get("greeting", None).await.unwrap();
    assert_eq!(r.kvs()[0].value(), b"hello");
    assert_eq!(r.kvs()[0].create_revision(), rev);
    let r = c
        .get("group/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    let keys: Vec<_> = r
        .kvs()
        .iter()
        .map(|kv| kv.key_str().unwrap().to_string())
        .collect();
    assert_eq!(keys, ["group/a", "group/b"]);
    // Every key at or after "group/a" in byte order ("greeting" sorts before it).
    let r = c
        .get("group/a", Some(GetOptions::new().with_from_key()))
        .await
        .unwrap();
    assert_eq!(r.count(), 2);
    let r = c
        .get(
            "group/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap();
    assert_eq!((r.count(), r.kvs().len()), (2, 0));
    let r = c
        .get(
            "group/",
            Some(GetOptions::new().with_prefix().with_limit(1)),
        )
        .await
        .unwrap();
    assert!(r.more() && r.kvs().len() == 1);

    // prev_kv and versions
    let r = c
        .put("greeting", "hi", Some(PutOptions::new().with_prev_key()))
        .await
        .unwrap();
    assert_eq!(r.prev_key().unwrap().value(), b"hello");
    assert_eq!(c.get("greeting", None).await.unwrap().kvs()[0].version(), 2);

    // delete
    let r = c
        .delete(
            "group/",
            Some(DeleteOptions::new().with_prefix().with_prev_key()),
        )
        .await
        .unwrap();
    assert_eq!(r.deleted(), 2);
    assert_eq!(r.prev_kvs().len(), 2);

    // txn
    let txn = Txn::new()
        .when([Compare::value("greeting", CompareOp::Equal, "hi")])
        .and_then([
            TxnOp::put("outcome", "yes", None),
            TxnOp::get("greeting", None),
        ])
        .or_else([TxnOp::put("outcome", "no", None)]);
    let r = c.txn(txn).await.unwrap();
    assert!(r.succeeded());
    assert_eq!(r.op_responses().len(), 2);
    assert_eq!(
        c.get("outcome", None).await.unwrap().kvs()[0].value(),
        b"yes"
    );

    // leases
    let g = c.lease_grant(60, None).await.unwrap();
    assert_eq!(g.ttl(), 60);
    c.put("leased", "v", Some(PutOptions::new().with_lease(g.id())))
        .await
        .unwrap();
    let t = c
        .lease_time_to_live(g.id(), Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .unwrap();
    assert_eq!(t.granted_ttl(), 60);
    assert!(t.ttl() > 50 && t.ttl() <= 60, "remaining ttl {}", t.ttl());
    assert_eq!(t.keys(), [b"leased".to_vec()]);
    let leases = c.leases().await.unwrap();
    assert_eq!(
        leases.leases().iter().map(|l| l.id()).collect::<Vec<_>>(),
        [g.id()]
    );
    let (mut keeper, mut stream) = c.lease_keep_alive(g.id()).await.unwrap();
    keeper.keep_alive().await.unwrap();
    let ka = stream.message().await.unwrap().unwrap();
    assert_eq!((ka.id(), ka.ttl()), (g.id(), 60));
    let explicit = c
        .lease_grant(
            30,
            Some(etcd_client::LeaseGrantOptions::new().with_id(4242)),
        )
        .await
        .unwrap();
    assert_eq!(explicit.id(), 4242);
    let again = c
        .lease_grant(
            30,
            Some(etcd_client::LeaseGrantOptions::new().with_id(4242)),
        )
        .await;
    let status = match again {
        Err(etcd_client::Error::GRpcStatus(s)) => s,
        other => panic!("granting an existing lease id must fail: {other:?}"),
    };
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert_eq!(status.message(), "etcdserver: lease already exists");
    c.lease_revoke(g.id()).await.unwrap();
    assert_eq!(c.get("leased", None).await.unwrap().count(), 0);

    // cluster views
    let members = c.member_list().await.unwrap();
    assert_eq!(members.members().len(), 3);
    let status = c.status().await.unwrap();
    assert!(status.leader() != 0 && status.raft_term() >= 1);
    assert!(status.raft_index() >= status.raft_applied_index() || status.raft_applied_index() > 0);

    // Maintenance as etcd answers it (the crate's own tests check these): deactivating a
    // NONE alarm is a no-op, a Get names one type, and Defragment and MoveLeader carry no
    // header.
    use etcd_client::{AlarmAction, AlarmOptions, AlarmType};
    let none = c
        .alarm(
            AlarmAction::Deactivate,
            AlarmType::None,
            Some(AlarmOptions::new()),
        )
        .await
        .unwrap();
    assert!(none.alarms().is_empty());
    let leader = status.leader();
    let mut on_leader = AlarmOptions::new();
    on_leader.with_member(leader);
    c.alarm(
        AlarmAction::Activate,
        AlarmType::Corrupt,
        Some(on_leader.clone()),
    )
    .await
    .unwrap();
    let nospace = c
        .alarm(AlarmAction::Get, AlarmType::Nospace, None)
        .await
        .unwrap();
    assert!(
        nospace.alarms().is_empty(),
        "a CORRUPT alarm listed as NOSPACE"
    );
    let corrupt = c
        .alarm(AlarmAction::Get, AlarmType::Corrupt, None)
        .await
        .unwrap();
    assert_eq!(corrupt.alarms().len(), 1);
    assert_eq!(
        c.alarm(AlarmAction::Get, AlarmType::None, None)
            .await
            .unwrap()
            .alarms()
            .len(),
        1
    );
    c.alarm(AlarmAction::Deactivate, AlarmType::Corrupt, Some(on_leader))
        .await
        .unwrap();
    let leader_index = cluster.wait_leader(Duration::from_secs(10)).await;
    let mut leader_client = Client::connect([cluster.endpoint(leader_index)], None)
        .await
        .unwrap();
    assert!(leader_client.defragment().await.unwrap().header().is_none());
    assert!(
        leader_client
            .move_leader(leader)
            .await
            .unwrap()
            .header()
            .is_none()
    );
}

// The etcd-client crate's watch against a follower: replay from an old revision with
// previous values, live events, a second watcher on the same stream, cancel, and a watch
// from a compacted revision cancelled with `compact_revision`; plus Compact's refusals
// and reads at past revisions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_client_crate_watch_and_compact() {
    let _serial = ONE_CLUSTER_AT_A_TIME.lock().await;
    let cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let follower = (leader + 1) % 3;
    let mut writer = Client::connect([cluster.endpoint(leader)], None)
        .await
        .unwrap();
    let mut c = Client::connect([cluster.endpoint(follower)], None)
        .await
        .unwrap();
    let r1 = writer
        .put("w/a", "1", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    writer.put("w/a", "2", None).await.unwrap();
    let r3 = writer
        .delete("w/a", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();

    // Range at a past revision.
    let r = c
        .get("w/a", Some(GetOptions::new().with_revision(r1)))
        .await
        .unwrap();
    assert_eq!(r.kvs()[0].value(), b"1");
    assert_eq!(c.get("w/a", None).await.unwrap().count(), 0);

    let mut stream = c
        .watch(
            "w/",
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(r1)
                    .with_prev_key(),
            ),
        )
        .await
        .unwrap();
    let created = stream.message().await.unwrap().unwrap();
    assert!(created.created());
    let id = created.watch_id();
    let mut events = Vec::new();
    while events.len() < 3 {
        let r = stream.message().await.unwrap().unwrap();
        assert_eq!(r.watch_id(), id);
        events.extend(r.events().iter().map(|e| {
            let kv = e.kv().unwrap();
            (
                e.event_type(),
                kv.value().to_vec(),
                kv.mod_revision(),
                e.prev_kv().map(|p| p.value().to_vec()),
            )
        }));
    }
    assert_eq!(
        events,
        [
            (EventType::Put, b"1".to_vec(), r1, None),
            (EventType::Put, b"2".to_vec(), r1 + 1, Some(b"1".to_vec())),
            (EventType::Delete, Vec::new(), r3, Some(b"2".to_vec())),
        ]
    );

    // A live write through the leader, and a second watcher on the same stream.
    stream
        .watch("w/b", Some(WatchOptions::new().with_watch_id(9)))
        .await
        .unwrap();
    let created = stream.message().await.unwrap().unwrap();
    assert!(created.created() && created.watch_id() == 9);
    let r4 = writer
        .put("w/b", "x", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 2 {
        let r = stream.message().await.unwrap().unwrap();
        assert_eq!(r.events().len(), 1);
        assert_eq!(r.events()[0].kv().unwrap().mod_revision(), r4);
        seen.insert(r.watch_id());
    }
    assert_eq!(seen, [id, 9].into());
    stream.cancel(9).await.unwrap();
    let r = stream.message().await.unwrap().unwrap();
    assert!(r.canceled() && r.watch_id() == 9);

    // Compact, its refusals, and a watch from a compacted revision.
    c.compact(r3, None).await.unwrap();
    for (rev, msg) in [
        (r3, "etcdserver: mvcc: required revision has been compacted"),
        (
            r4 + 100,
            "etcdserver: mvcc: required revision is a future revision",
        ),
    ] {
        match c.compact(rev, None).await {
            Err(etcd_client::Error::GRpcStatus(s)) => {
                assert_eq!((s.code(), s.message()), (tonic::Code::OutOfRange, msg));
            }
            other => panic!("compact({rev}) must be refused: {other:?}"),
        }
    }
    match c
        .get("w/a", Some(GetOptions::new().with_revision(r1)))
        .await
    {
        Err(etcd_client::Error::GRpcStatus(s)) => assert_eq!(s.code(), tonic::Code::OutOfRange),
        other => panic!("a read below the compacted revision must fail: {other:?}"),
    }
    let mut old = c
        .watch(
            "w/",
            Some(WatchOptions::new().with_prefix().with_start_revision(r1)),
        )
        .await
        .unwrap();
    assert!(old.message().await.unwrap().unwrap().created());
    let r = old.message().await.unwrap().unwrap();
    assert!(r.canceled(), "{r:?}");
    assert_eq!(r.compact_revision(), r3);
}

/// Clients hold lease keep-alive and watch streams open for as long as they run (every
/// Kubernetes API server does); a member that stops ends them instead of waiting out its
/// shutdown grace (the request timeout, 5 s here) for their clients to close them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_stops_without_waiting_for_open_client_streams() {
    let _serial = ONE_CLUSTER_AT_A_TIME.lock().await;
    let mut cluster = TestCluster::start(1, |_| {}).await;
    cluster.wait_leader(Duration::from_secs(10)).await;
    let mut c = Client::connect([cluster.endpoint(0)], None).await.unwrap();
    let lease = c.lease_grant(30, None).await.unwrap().id();
    let (mut keeper, mut answers) = c.lease_keep_alive(lease).await.unwrap();
    keeper.keep_alive().await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), answers.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.ttl(), 30);
    let mut events = c.watch("k", None).await.unwrap();
    c.put("k", "v", None).await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(10), events.message())
        .await
        .unwrap()
        .unwrap();
    assert!(seen.is_some());

    let started = std::time::Instant::now();
    cluster.stop(0).await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "the stop took {took:?}");
}
