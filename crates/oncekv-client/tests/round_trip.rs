//! Every call of the client against a real three-member cluster, without faults.
#![allow(clippy::unwrap_used)]

mod common;

use common::{LEADER_WAIT, TestCluster};
use oncekv_client::{
    Client, ClientConfig, Compare, CompareOp, DeleteOptions, Error, GetOptions, PutOptions, TxnOp,
    TxnOpResponse,
};

// The typed KV API must say what etcd would say, or ported code breaks subtly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_calls_round_trip_through_the_client() {
    let cluster = TestCluster::start(3, |_| {}).await;
    cluster.wait_leader(LEADER_WAIT).await;
    let client = Client::connect(cluster.endpoints(), ClientConfig::default()).unwrap();

    let first = client.put("app/a", "1").await.unwrap();
    assert!(first.header.revision > 0);
    assert_eq!(first.prev_kv, None);
    let kv = client.get("app/a").await.unwrap().unwrap();
    assert_eq!((&kv.value[..], kv.version), (&b"1"[..], 1));

    let second = client
        .put_with("app/a", "2", PutOptions::new().with_prev_kv())
        .await
        .unwrap();
    assert_eq!(second.prev_kv.unwrap().value, "1");
    assert!(second.header.revision > first.header.revision);
    client.put("app/b", "3").await.unwrap();
    client.put("zzz", "4").await.unwrap();

    let page = client
        .range("app/", GetOptions::new().with_prefix().with_limit(1))
        .await
        .unwrap();
    assert_eq!((page.kvs.len(), page.more, page.count), (1, true, 2));
    let counted = client
        .range("app/", GetOptions::new().with_prefix().with_count_only())
        .await
        .unwrap();
    assert_eq!((counted.kvs.len(), counted.count), (0, 2));
    let keys = client
        .range("app/", GetOptions::new().with_prefix().with_keys_only())
        .await
        .unwrap();
    assert!(keys.kvs.iter().all(|kv| kv.value.is_empty()));
    let from = client
        .range(
            "app/b",
            GetOptions::new().with_from_key().with_serializable(),
        )
        .await
        .unwrap();
    let from_keys: Vec<_> = from.kvs.iter().map(|kv| kv.key.clone()).collect();
    assert_eq!(from_keys, vec!["app/b", "zzz"]);

    let deleted = client
        .delete_with("app/", DeleteOptions::new().with_prefix().with_prev_kv())
        .await
        .unwrap();
    assert_eq!((deleted.deleted, deleted.prev_kvs.len()), (2, 2));
    assert_eq!(client.get("app/a").await.unwrap(), None);
    assert_eq!(client.delete("app/a").await.unwrap().deleted, 0);

    // Create-if-absent: the second run sees the key and takes the failure branch.
    let create = |v: &'static str| {
        client.txn(
            vec![Compare::version("lock", CompareOp::Equal, 0)],
            vec![TxnOp::put("lock", v, PutOptions::new())],
            vec![TxnOp::get("lock", GetOptions::new())],
        )
    };
    let won = create("me").await.unwrap();
    assert!(won.succeeded);
    assert!(matches!(won.responses[..], [TxnOpResponse::Put(_)]));
    let lost = create("you").await.unwrap();
    assert!(!lost.succeeded);
    match &lost.responses[..] {
        [TxnOpResponse::Get(r)] => assert_eq!(r.kvs[0].value, "me"),
        other => panic!("unexpected {other:?}"),
    }

    // A refused txn is an answer, not a reason to retry.
    let dup = client
        .txn(
            vec![],
            vec![
                TxnOp::put("x", "1", PutOptions::new()),
                TxnOp::put("x", "2", PutOptions::new()),
            ],
            vec![],
        )
        .await
        .unwrap_err();
    assert!(matches!(dup, Error::InvalidArgument(_)), "{dup:?}");
    assert!(dup.is_answer());

    let stats = client.stats();
    assert_eq!(
        (
            stats.sessions_registered,
            stats.retries,
            stats.outcome_unknown
        ),
        (1, 0, 0)
    );
    assert!(stats.requests >= 14, "{stats:?}");
}

// Leases are where etcd's answers (not found, already exists) matter most to callers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_calls_round_trip_through_the_client() {
    let cluster = TestCluster::start(3, |_| {}).await;
    cluster.wait_leader(LEADER_WAIT).await;
    let client = Client::connect(cluster.endpoints(), ClientConfig::default()).unwrap();

    let lease = client.lease_grant(30, 0x1234).await.unwrap();
    assert_eq!((lease.id, lease.ttl), (0x1234, 30));
    let again = client.lease_grant(30, 0x1234).await.unwrap_err();
    assert_eq!(
        again,
        Error::LeaseAlreadyExists,
        "a new grant of a taken ID is refused"
    );

    client
        .put_with("worker", "up", PutOptions::new().with_lease(lease.id))
        .await
        .unwrap();
    assert_eq!(client.get("worker").await.unwrap().unwrap().lease, lease.id);
    let ttl = client.lease_time_to_live(lease.id, true).await.unwrap();
    assert_eq!(ttl.granted_ttl, 30);
    assert!(ttl.ttl > 0 && ttl.ttl <= 30, "{ttl:?}");
    assert_eq!(ttl.keys, vec!["worker"]);
    assert_eq!(client.lease_leases().await.unwrap(), vec![lease.id]);
    let renewed = client.lease_keep_alive(lease.id).await.unwrap();
    assert_eq!((renewed.id, renewed.ttl), (lease.id, 30));

    client.lease_revoke(lease.id).await.unwrap();
    assert_eq!(
        client.get("worker").await.unwrap(),
        None,
        "revoking deletes the lease's keys"
    );
    assert_eq!(
        client.lease_revoke(lease.id).await.unwrap_err(),
        Error::LeaseNotFound
    );
    assert_eq!(
        client.lease_keep_alive(lease.id).await.unwrap_err(),
        Error::LeaseNotFound
    );
    assert_eq!(
        client
            .lease_time_to_live(lease.id, false)
            .await
            .unwrap()
            .ttl,
        -1
    );
    assert!(client.lease_leases().await.unwrap().is_empty());

    let picked = client.lease_grant(10, 0).await.unwrap();
    assert_ne!(picked.id, 0, "the cluster picks an ID");
}

// Tools built on the client (the demo, health checks) need membership and leadership.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_list_and_status_describe_the_cluster() {
    let cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(LEADER_WAIT).await;
    let client = Client::connect(cluster.endpoints(), ClientConfig::default()).unwrap();

    let members = client.member_list().await.unwrap();
    let mut names: Vec<_> = members.iter().map(|m| m.name.clone()).collect();
    names.sort();
    assert_eq!(names, vec!["n1", "n2", "n3"]);
    assert!(
        members
            .iter()
            .all(|m| m.client_urls.len() == 1 && m.peer_urls.len() == 1)
    );

    for (i, endpoint) in cluster.endpoints().iter().enumerate() {
        let status = client.status(endpoint).await.unwrap();
        assert_eq!(status.header.member_id, cluster.node(i).core.id());
        assert_eq!(status.is_leader(), i == leader, "member {i}: {status:?}");
        assert_eq!(status.leader, cluster.node(leader).core.id());
    }
    // An endpoint outside the client's list works too; a dead one is an error, not a hang.
    let dead = format!("127.0.0.1:{}", common::free_port());
    let err = client.status(&dead).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
}
