//! etcd's Lock and Election services through the third-party `etcd-client` crate (an etcd
//! client that knows nothing of oncekv), and the same calls made exactly-once by oncekv
//! session metadata.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{TestCluster, register, tracked};
use etcd_client::{Client, GetOptions, LockOptions, ProclaimOptions, ResignOptions};
use tokio_stream::StreamExt;

/// One 3-member cluster at a time: two at once on a loaded 2-core machine made elections,
/// and the etcd-client crate does not retry a request that meets one.
static ONE_CLUSTER_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const WAIT: Duration = Duration::from_secs(15);

async fn cluster() -> TestCluster {
    let cluster = TestCluster::start(3, |_| {}).await;
    cluster.wait_leader(Duration::from_secs(10)).await;
    cluster
}

async fn keys_under(c: &mut Client, prefix: &str) -> Vec<String> {
    c.get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .unwrap()
        .kvs()
        .iter()
        .map(|kv| kv.key_str().unwrap().to_string())
        .collect()
}

/// Polls until `f` holds; panics after [`WAIT`].
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

// Two lockers on one name: the second gets the lock only once the first unlocks, with a
// key of its own lease and a later create revision; through different members.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_locker_waits_for_the_first_to_unlock() {
    let _serial = ONE_CLUSTER_AT_A_TIME.lock().await;
    let cluster = cluster().await;
    let eps = cluster.endpoints();
    let mut a = Client::connect([eps[0].clone()], None).await.unwrap();
    let mut b = Client::connect([eps[1].clone()], None).await.unwrap();
    let la = a.lease_grant(30, None).await.unwrap().id();
    let lb = b.lease_grant(30, None).await.unwrap().id();

    let first = a
        .lock("jobs", Some(LockOptions::new().with_lease(la)))
        .await
        .unwrap();
    assert_eq!(first.key(), format!("jobs/{la:x}").as_bytes());

    let released = Arc::new(AtomicBool::new(false));
    let waiter = {
        let released = released.clone();
        let mut b = b.clone();
        tokio::spawn(async move {
            let r = b
                .lock("jobs", Some(LockOptions::new().with_lease(lb)))
                .await
                .unwrap();
            (released.load(Ordering::SeqCst), r)
        })
    };
    // The waiter's key is queued (behind the first) before the first lets go.
    eventually("the second key is queued", || {
        let mut a = a.clone();
        async move { keys_under(&mut a, "jobs/").await.len() == 2 }
    })
    .await;
    released.store(true, Ordering::SeqCst);
    a.unlock(first.key()).await.unwrap();
    let (after_release, second) = tokio::time::timeout(WAIT, waiter).await.unwrap().unwrap();
    assert!(
        after_release,
        "the second locker got the lock while the first held it"
    );
    assert_eq!(second.key(), format!("jobs/{lb:x}").as_bytes());
    let create = |c: &mut Client, key: Vec<u8>| {
        let mut c = c.clone();
        async move { c.get(key, None).await.unwrap().kvs()[0].create_revision() }
    };
    assert!(create(&mut b, second.key().to_vec()).await > first.header().unwrap().revision());

    // Locking again with a lease that holds the lock is the same acquisition.
    let again = b
        .lock("jobs", Some(LockOptions::new().with_lease(lb)))
        .await
        .unwrap();
    assert_eq!(again.key(), second.key());
    assert_eq!(keys_under(&mut b, "jobs/").await.len(), 1);
}

// A holder that loses its lease loses the lock; a Lock with an unknown lease is NotFound;
// lease 0 gets a lease from the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_releases_the_lock_and_bad_leases_are_refused() {
    let _serial = ONE_CLUSTER_AT_A_TIME.lock().await;
    let cluster = cluster().await;
    let mut c = Client::connect(cluster.endpoints(), None).await.unwrap();
    let holder = c.lease_grant(30, None).await.unwrap().id();
    let waiter = c.lease_grant(30, None).await.unwrap().id();
    c.lock("l", Some(LockOptions::new().with_lease(holder)))
        .await
        .unwrap();
    let pending = {
        let mut c = c.clone();
        tokio::spawn(async move {
            c.lock("l", Some(LockOptions::new().with_lease(waiter)))
                .await
        })
    };
    eventually("the waiter is queued", || {
        let mut c = c.clone();
        async move { keys_under(&mut c, "l/").await.len() == 2 }
    })
    .await;
    c.lease_revoke(holder).await.unwrap();
    let got = tokio::time::timeout(WAIT, pending)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(got.key(), format!("l/{waiter:x}").as_bytes());

    let err = c
        .lock("l", Some(LockOptions::new().with_lease(0x7777)))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("requested lease not found"),
        "{err}"
    );

    let own = c.lock("free", None).await.unwrap();
    let key = String::from_utf8(own.key().to_vec()).unwrap();
    let lease = i64::from_str_radix(key.trim_start_matches("free/"), 16).unwrap();
    let ttl = c.lease_time_to_live(lease, None).await.unwrap();
    assert!(ttl.ttl() > 0 && ttl.granted_ttl() == 60, "{ttl:?}");
}

// An etcd client that gives up on a Lock while it waits leaves no key behind: the server
// leaves the queue for it, as etcd's does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_untracked_lock_leaves_no_waiter() {
    let _serial = ONE_CLUSTER_AT_A_TIME.lock().await;
    let cluster = cluster().await;
    let mut c = Client::connect(cluster.endpoints(), None).await.unwrap();
    let holder = c.lease_grant(30, None).await.unwrap().id();
    let quitter = c.lease_grant(30, None).await.unwrap().id();
    c.lock("q", Some(LockOptions::new().with_lease(holder)))
        .await
        .unwrap();
    let mut q = c.clone();
    let attempt = tokio::time::timeout(
        Duration::from_millis(500),
        q.lock("q", Some(LockOptions::new().with_lease(quitter))),
    )
    .await;
    assert!(attempt.is_err(), "the lock was held: the call must wait");
    eventually("the abandoned waiter's key is deleted", || {
        let mut c = c.clone();
        async move { keys_under(&mut c, "q/").await == [format!("q/{holder:x}")] }
    })
    .await;
}

// Campaign / Leader / Proclaim / Observe / Resign: the second campaigner leads only after
// the first resigns; the observer sees the first leader, its proclaimed value and the next
// leader, in that order; etcd's errors for "no leader" and "not leader".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elections_hand_over_on_resign_and_observers_follow() {
    let _serial = ONE_CLUSTER_AT_A_TIME.lock().await;
    let cluster = cluster().await;
    let eps = cluster.endpoints();
    let mut c = Client::connect([eps[0].clone()], None).await.unwrap();
    let mut other = Client::connect([eps[2].clone()], None).await.unwrap();

    let err = c.leader("e").await.unwrap_err();
    assert!(err.to_string().contains("election: no leader"), "{err}");

    let mut observer = other.observe("e").await.unwrap();
    let l1 = c.lease_grant(30, None).await.unwrap().id();
    let l2 = c.lease_grant(30, None).await.unwrap().id();
    let first = c.campaign("e", "v1", l1).await.unwrap();
    let leader1 = first.leader().unwrap().clone();
    assert_eq!(leader1.key(), format!("e/{l1:x}").as_bytes());
    assert_eq!(leader1.lease(), l1);

    let elected = Arc::new(AtomicBool::new(false));
    let second = {
        let (mut other, elected) = (other.clone(), elected.clone());
        tokio::spawn(async move {
            let r = other.campaign("e", "w1", l2).await.unwrap();
            elected.store(true, Ordering::SeqCst);
            r
        })
    };
    async fn next(o: &mut etcd_client::ObserveStream) -> (String, String) {
        let r = tokio::time::timeout(WAIT, o.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let kv = r.kv().unwrap();
        (
            kv.key_str().unwrap().to_string(),
            kv.value_str().unwrap().to_string(),
        )
    }
    let e1 = format!("e/{l1:x}");
    assert_eq!(next(&mut observer).await, (e1.clone(), "v1".to_string()));

    c.proclaim(
        "v2",
        Some(ProclaimOptions::new().with_leader(leader1.clone())),
    )
    .await
    .unwrap();
    assert_eq!(next(&mut observer).await, (e1.clone(), "v2".to_string()));
    let leader = c.leader("e").await.unwrap();
    assert_eq!(leader.kv().unwrap().value(), b"v2");
    eventually("the second candidate is queued", || {
        let mut c = c.clone();
        async move { keys_under(&mut c, "e/").await.len() == 2 }
    })
    .await;
    assert!(!elected.load(Ordering::SeqCst), "two leaders at once");

    c.resign(Some(ResignOptions::new().with_leader(leader1.clone())))
        .await
        .unwrap();
    let second = tokio::time::timeout(WAIT, second).await.unwrap().unwrap();
    let leader2 = second.leader().unwrap().clone();
    assert_eq!(
        next(&mut observer).await,
        (format!("e/{l2:x}"), "w1".to_string())
    );

    // The old leadership can neither proclaim nor resign the new one away.
    let err = c
        .proclaim(
            "v3",
            Some(ProclaimOptions::new().with_leader(leader1.clone())),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("election: not leader"), "{err}");
    c.resign(Some(ResignOptions::new().with_leader(leader1)))
        .await
        .unwrap();
    assert_eq!(c.leader("e").await.unwrap().kv().unwrap().value(), b"w1");

    // A leader that loses its lease loses leadership.
    c.lease_revoke(leader2.lease()).await.unwrap();
    let err = c.leader("e").await.unwrap_err();
    assert!(err.to_string().contains("election: no leader"), "{err}");
}

// Through a session, Lock and Campaign are tracked commands: the same seq sent twice (a
// retry after a lost reply) answers the same key and queues nothing more, even with lease 0
// (where an untracked retry would get a second lease and key). A tracked Lock abandoned
// while waiting keeps its key, so that its retry still finds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracked_lock_and_campaign_retries_queue_once() {
    use oncekv_server::pb::v3electionpb::CampaignRequest;
    use oncekv_server::pb::v3electionpb::election_client::ElectionClient;
    use oncekv_server::pb::v3lockpb::LockRequest;
    use oncekv_server::pb::v3lockpb::lock_client::LockClient;

    let _serial = ONE_CLUSTER_AT_A_TIME.lock().await;
    let cluster = cluster().await;
    let eps = cluster.endpoints();
    let session = register(&eps[0]).await;
    let mut lock = LockClient::connect(eps[1].clone()).await.unwrap();
    let mut election = ElectionClient::connect(eps[2].clone()).await.unwrap();
    let mut c = Client::connect(cluster.endpoints(), None).await.unwrap();

    let req = || LockRequest {
        name: "x".into(),
        lease: 0,
    };
    let first = lock.lock(tracked(&session, 1, req())).await.unwrap();
    let retry = lock.lock(tracked(&session, 1, req())).await.unwrap();
    assert_eq!(first.get_ref().key, retry.get_ref().key);
    assert_eq!(keys_under(&mut c, "x/").await.len(), 1);
    assert_eq!(c.leases().await.unwrap().leases().len(), 1);

    let campaign = || CampaignRequest {
        name: "e".into(),
        lease: 0,
        value: "v".into(),
    };
    let first = election
        .campaign(tracked(&session, 2, campaign()))
        .await
        .unwrap();
    let retry = election
        .campaign(tracked(&session, 2, campaign()))
        .await
        .unwrap();
    assert_eq!(first.get_ref().leader, retry.get_ref().leader);
    assert_eq!(keys_under(&mut c, "e/").await.len(), 1);
    assert_eq!(c.leases().await.unwrap().leases().len(), 2);

    // Untracked, the same lease-0 Lock twice is two leases and two waiters (etcd's
    // behaviour, which the session above avoids).
    let holder = c.lock("u", None).await.unwrap();
    let mut u = c.clone();
    let second = tokio::time::timeout(Duration::from_millis(300), u.lock("u", None)).await;
    assert!(second.is_err(), "u is held");
    eventually("the abandoned untracked waiter leaves", || {
        let mut c = c.clone();
        async move { keys_under(&mut c, "u/").await.len() == 1 }
    })
    .await;
    assert_eq!(
        keys_under(&mut c, "u/").await,
        [String::from_utf8(holder.key().to_vec()).unwrap()]
    );

    // Tracked and abandoned: the key stays for the retry, which gets the lock once the
    // holder lets go.
    let held = c.lock("y", None).await.unwrap();
    let y = || LockRequest {
        name: "y".into(),
        lease: 0,
    };
    let abandoned = tokio::time::timeout(
        Duration::from_millis(300),
        lock.lock(tracked(&session, 3, y())),
    )
    .await;
    assert!(abandoned.is_err(), "y is held");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        keys_under(&mut c, "y/").await.len(),
        2,
        "the tracked waiter kept its key"
    );
    let retry = {
        let mut lock = lock.clone();
        let session = session.clone();
        tokio::spawn(async move { lock.lock(tracked(&session, 3, y())).await })
    };
    c.unlock(held.key()).await.unwrap();
    let got = tokio::time::timeout(WAIT, retry)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        keys_under(&mut c, "y/").await,
        [String::from_utf8(got.get_ref().key.to_vec()).unwrap()]
    );
}

// An observer (`etcdctl elect -l`) holds its stream open for as long as it likes; a member
// that stops ends it rather than waiting out its shutdown grace (the request timeout, 5 s
// here) for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_stops_without_waiting_for_its_observers() {
    let _serial = ONE_CLUSTER_AT_A_TIME.lock().await;
    let mut cluster = TestCluster::start(1, |_| {}).await;
    cluster.wait_leader(Duration::from_secs(10)).await;
    let mut c = Client::connect([cluster.endpoint(0)], None).await.unwrap();
    let lease = c.lease_grant(30, None).await.unwrap().id();
    c.campaign("e", "v1", lease).await.unwrap();
    let mut observer = c.observe("e").await.unwrap();
    let first = tokio::time::timeout(WAIT, observer.next()).await.unwrap();
    assert!(matches!(first, Some(Ok(_))), "{first:?}");

    let started = std::time::Instant::now();
    cluster.stop(0).await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "the stop took {took:?}");
    let end = tokio::time::timeout(WAIT, observer.next()).await.unwrap();
    assert!(!matches!(end, Some(Ok(_))), "{end:?}");
}
