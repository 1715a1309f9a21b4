//! Exactly-once over the wire with hand-made gRPC requests: the session metadata, the
//! errors of rules 1–6, and the leader's coalescing of an in-flight retry.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::TestCluster;
use oncekv_server::pb::etcdserverpb::kv_client::KvClient;
use oncekv_server::pb::etcdserverpb::{PutRequest, PutResponse};
use oncekv_server::pb::oncekv::RegisterRequest;
use oncekv_server::pb::oncekv::session_client::SessionClient;
use tonic::transport::Channel;

#[derive(Clone, Copy)]
struct Session {
    client_id: u64,
    secret: [u8; 16],
}

async fn register(endpoint: String) -> Session {
    let mut s = SessionClient::connect(endpoint).await.unwrap();
    let r = s
        .register(RegisterRequest::default())
        .await
        .unwrap()
        .into_inner();
    Session {
        client_id: r.client_id,
        secret: r.secret.as_ref().try_into().unwrap(),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn tracked_put(
    s: &Session,
    seq: u64,
    first_incomplete: u64,
    key: &str,
    value: &str,
) -> tonic::Request<PutRequest> {
    let mut req = tonic::Request::new(PutRequest {
        key: Bytes::copy_from_slice(key.as_bytes()),
        value: Bytes::copy_from_slice(value.as_bytes()),
        ..Default::default()
    });
    let md = req.metadata_mut();
    md.insert("oncekv-client-id", s.client_id.to_string().parse().unwrap());
    md.insert("oncekv-session-secret", hex(&s.secret).parse().unwrap());
    md.insert("oncekv-seq", seq.to_string().parse().unwrap());
    md.insert(
        "oncekv-first-incomplete",
        first_incomplete.to_string().parse().unwrap(),
    );
    req
}

async fn version(kv: &mut KvClient<Channel>, key: &str) -> i64 {
    common::get(kv, key).await.unwrap().map_or(0, |(_, v)| v)
}

fn detail(status: &tonic::Status) -> &str {
    status
        .metadata()
        .get("oncekv-error")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

// The session rules must reach clients as distinct errors, and a refused request must
// change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_window_and_wrong_secret_get_their_errors_and_change_nothing() {
    let cluster = TestCluster::start(3, |c| c.settings.window = 4).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let s = register(cluster.endpoint(leader)).await;
    let mut kv = cluster.kv(leader).await;

    let first: PutResponse = kv
        .put(tracked_put(&s, 1, 1, "k", "one"))
        .await
        .unwrap()
        .into_inner();
    // A retry of seq 1 returns the saved response, byte for byte, and changes nothing.
    let again = kv
        .put(tracked_put(&s, 1, 1, "k", "one"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first, again);
    assert_eq!(version(&mut kv, "k").await, 1);

    // Wrong secret: PermissionDenied, and the saved response is not revealed.
    let thief = Session {
        client_id: s.client_id,
        secret: [7; 16],
    };
    let err = kv
        .put(tracked_put(&thief, 1, 1, "k", "stolen"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    assert_eq!(detail(&err), "permission-denied");
    let err = kv
        .put(tracked_put(&thief, 2, 1, "k", "stolen"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    assert_eq!(version(&mut kv, "k").await, 1);

    // Window 4 with acked_below 1: seq 5 is past it.
    let err = kv.put(tracked_put(&s, 5, 1, "k", "far")).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert_eq!(detail(&err), "window-exceeded");
    assert_eq!(version(&mut kv, "k").await, 1);

    // Acknowledge everything below 3, then seq 1 and 2 are stale.
    kv.put(tracked_put(&s, 3, 3, "k", "three")).await.unwrap();
    let err = kv.put(tracked_put(&s, 1, 3, "k", "one")).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert_eq!(detail(&err), "stale");
    assert_eq!(version(&mut kv, "k").await, 2);

    // An unknown session: SessionExpired.
    let ghost = Session {
        client_id: 999_999,
        secret: s.secret,
    };
    let err = kv
        .put(tracked_put(&ghost, 1, 1, "k", "ghost"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert_eq!(detail(&err), "session-expired");
    assert_eq!(version(&mut kv, "k").await, 2);
}

// Half a session's metadata must be refused, never silently treated as untracked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_session_metadata_is_invalid_argument() {
    let cluster = TestCluster::start(1, |_| {}).await;
    cluster.wait_leader(Duration::from_secs(10)).await;
    let s = register(cluster.endpoint(0)).await;
    let mut kv = cluster.kv(0).await;
    let cases: Vec<(&str, &str)> = vec![
        ("oncekv-seq", "not-a-number"),
        ("oncekv-session-secret", "abc"),
        ("oncekv-first-incomplete", "0"),
    ];
    for (key, bad) in cases {
        let mut req = tracked_put(&s, 1, 1, "k", "v");
        req.metadata_mut().insert(key, bad.parse().unwrap());
        let err = kv.put(req).await.unwrap_err();
        assert_eq!(
            err.code(),
            tonic::Code::InvalidArgument,
            "{key}={bad}: {err:?}"
        );
    }
    let mut req = tracked_put(&s, 1, 1, "k", "v");
    req.metadata_mut().remove("oncekv-seq");
    assert_eq!(
        kv.put(req).await.unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
    assert_eq!(
        version(&mut kv, "k").await,
        0,
        "no malformed request may be applied"
    );
}

/// Sends one tracked put to `leader`, and once it is in flight there, the same put again
/// to `second`, while the members in `stopped` are down so that nothing commits; then
/// restarts them. Returns both answers and the leader's apply stats.
async fn same_put_twice_while_uncommitted(
    cluster: &mut TestCluster,
    leader: usize,
    second: usize,
    stopped: &[usize],
) -> (PutResponse, PutResponse, oncekv_core::Stats) {
    let s = register(cluster.endpoint(leader)).await;
    for f in stopped {
        cluster.stop(*f).await;
    }
    let mut kv1 = cluster.kv(leader).await;
    let mut kv2 = cluster.kv(second).await;
    let original = tokio::spawn(async move { kv1.put(tracked_put(&s, 1, 1, "k", "v")).await });
    let core = cluster.node(leader).core.clone();
    let key = (s.client_id, 1, oncekv_core::Op::put("k", "v").fingerprint());
    while !core.is_in_flight(&key) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let copy = tokio::spawn(async move { kv2.put(tracked_put(&s, 1, 1, "k", "v")).await });
    while core.in_flight_waiters() < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for f in stopped {
        cluster.restart(*f).await;
    }
    let a = original.await.unwrap().unwrap().into_inner();
    let b = copy.await.unwrap().unwrap().into_inner();
    let stats = core.applied().read().sm.stats();
    (a, b, stats)
}

// The request waiting list on the leader: a retry of a request still in flight joins it
// instead of being proposed a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_of_an_in_flight_request_joins_the_original() {
    let mut cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    // With both followers down nothing commits, so the first request stays in flight.
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let (a, b, stats) =
        same_put_twice_while_uncommitted(&mut cluster, leader, leader, &followers).await;
    assert_eq!(a, b);
    assert_eq!(
        (stats.executed, stats.duplicates),
        (1, 0),
        "the retry was proposed again: {stats:?}"
    );
    let mut kv = cluster.kv(leader).await;
    assert_eq!(version(&mut kv, "k").await, 1);
}

// A hedge (the same tracked request sent to a second member while the first copy is in
// flight) reaches the leader as a follower's forward, and joins the original there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_forwarded_by_a_follower_joins_the_in_flight_original() {
    let mut cluster = TestCluster::start(5, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    // The leader and one follower are no quorum of five: nothing commits, and the follower
    // can still forward.
    let others: Vec<usize> = (0..5).filter(|i| *i != leader).collect();
    let (forwarder, stopped) = (others[0], &others[1..]);
    let (a, b, stats) =
        same_put_twice_while_uncommitted(&mut cluster, leader, forwarder, stopped).await;
    assert_eq!(a.header.unwrap().revision, b.header.unwrap().revision);
    assert_eq!(
        (stats.executed, stats.duplicates),
        (1, 0),
        "the forwarded copy was proposed again: {stats:?}"
    );
}

// A seq reused for a different request (a client bug, or a forged retry) must never be
// answered with the other request's saved reply, and never run: it gets FailedPrecondition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seq_reused_for_another_key_or_operation_is_refused() {
    let cluster = TestCluster::start(1, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let s = register(cluster.endpoint(leader)).await;
    let mut kv = cluster.kv(leader).await;
    let first = kv.put(tracked_put(&s, 1, 1, "k", "v")).await.unwrap();
    let retry = kv.put(tracked_put(&s, 1, 1, "k", "v")).await.unwrap();
    assert_eq!(
        first.into_inner(),
        retry.into_inner(),
        "a true retry is absorbed"
    );

    let other_key = kv
        .put(tracked_put(&s, 1, 1, "other", "v"))
        .await
        .unwrap_err();
    let mut delete = tonic::Request::new(oncekv_server::pb::etcdserverpb::DeleteRangeRequest {
        key: "k".into(),
        ..Default::default()
    });
    *delete.metadata_mut() = tracked_put(&s, 1, 1, "k", "v").metadata().clone();
    let other_op = kv.delete_range(delete).await.unwrap_err();
    for err in [other_key, other_op] {
        assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
        assert_eq!(
            err.message(),
            "oncekv: seq 1 was already used for a different request"
        );
        assert_eq!(
            err.metadata().get("oncekv-error").unwrap(),
            "seq-reused",
            "the client must recognise it as an answer"
        );
    }
    assert_eq!(version(&mut kv, "k").await, 1, "the delete did not run");
    assert_eq!(
        version(&mut kv, "other").await,
        0,
        "the other put did not run"
    );
}

// A retried registration whose first reply was lost returns the same session, so no
// orphan session is left behind to linger until its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_registration_with_the_same_nonce_returns_the_same_session() {
    let cluster = TestCluster::start(1, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let mut s = SessionClient::connect(cluster.endpoint(leader))
        .await
        .unwrap();
    let nonce = Bytes::from_static(&[7; 16]);
    let request = || RegisterRequest {
        nonce: nonce.clone(),
    };
    let a = s.register(request()).await.unwrap().into_inner();
    let b = s.register(request()).await.unwrap().into_inner();
    assert_eq!((a.client_id, &a.secret), (b.client_id, &b.secret));
    assert_eq!(cluster.sessions(leader), 1);
    let c = s
        .register(RegisterRequest {
            nonce: Bytes::from_static(&[8; 16]),
        })
        .await
        .unwrap()
        .into_inner();
    assert_ne!(c.client_id, a.client_id);
    let bad = s
        .register(RegisterRequest {
            nonce: Bytes::from_static(&[1; 5]),
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
}

// The session table lives in snapshots: after compaction has removed the log entry that
// executed a request and every member has restarted, a retry still gets the saved
// response instead of running again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedup_survives_snapshot_compaction_and_a_restart_of_every_member() {
    let mut cluster = TestCluster::start(3, |c| c.snapshot_count = 20).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let s = register(cluster.endpoint(leader)).await;
    let mut kv = cluster.kv(leader).await;
    kv.put(PutRequest {
        key: "k".into(),
        value: "before".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let first = kv
        .put(tracked_put_with_prev(&s))
        .await
        .unwrap()
        .into_inner();
    for i in 0..100 {
        common::put(&mut kv, &format!("filler{i}"), "x")
            .await
            .unwrap();
    }
    drop(kv);
    // Snapshots are asked for by each member's ticker, a heartbeat after they are due.
    cluster
        .wait_for(
            "the log compacted past the request",
            Duration::from_secs(10),
            |c| {
                c.node(leader)
                    .core
                    .metrics()
                    .purged
                    .is_some_and(|p| p.index > 5)
            },
        )
        .await;
    for i in 0..3 {
        cluster.stop(i).await;
    }
    for i in 0..3 {
        cluster.restart(i).await;
    }
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let mut kv = cluster.kv(leader).await;
    let again = loop {
        match kv.put(tracked_put_with_prev(&s)).await {
            Err(e) if e.code() == tonic::Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => break other.unwrap().into_inner(),
        }
    };
    let header = |r: &PutResponse| r.header.map(|h| h.revision);
    assert_eq!(
        header(&again),
        header(&first),
        "the retry ran again after the restart"
    );
    assert_eq!(again.prev_kv, first.prev_kv);
    assert_eq!(version(&mut kv, "k").await, 2);
}

fn tracked_put_with_prev(s: &Session) -> tonic::Request<PutRequest> {
    let mut req = tracked_put(s, 1, 1, "k", "once");
    req.get_mut().prev_kv = true;
    req
}
