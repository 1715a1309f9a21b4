//! `Op::Enqueue`, the write half of etcd's Lock and Campaign: the queue key, create-revision
//! order, reuse of a lease's key, the lease granted for a call that named none, and a retry
//! through a session that must not leave a second lease or waiter behind.

mod common;

use bytes::Bytes;
use common::{Replica, tracked};
use oncekv_core::{
    CONCURRENCY_TTL_SECS, EnqueueRequest, Enqueued, Op, OpError, OpResponse, Response, Secret,
    Settings, queue_key,
};

const SECRET: Secret = Secret([0x3c; 16]);

fn lock(name: &str, lease: i64) -> Op {
    Op::Enqueue(EnqueueRequest {
        name: Bytes::copy_from_slice(name.as_bytes()),
        lease,
        value: Bytes::new(),
        proclaim: false,
    })
}

fn campaign(name: &str, lease: i64, value: &str) -> Op {
    Op::Enqueue(EnqueueRequest {
        name: Bytes::copy_from_slice(name.as_bytes()),
        lease,
        value: Bytes::copy_from_slice(value.as_bytes()),
        proclaim: true,
    })
}

fn enqueued(resp: OpResponse) -> Enqueued {
    match resp {
        OpResponse::Enqueue(e) => e,
        other => panic!("not an enqueue response: {other:?}"),
    }
}

fn grant(r: &mut Replica, id: i64) {
    r.ok(Op::LeaseGrant { id, ttl: 30 });
}

#[test]
fn queue_key_is_etcds_format() {
    assert_eq!(
        queue_key(b"jobs", 0x694d_77aa_9e38_260f),
        "jobs/694d77aa9e38260f"
    );
    assert_eq!(queue_key(b"a/b", 10), "a/b/a");
    assert_eq!(queue_key(b"", 1), "/1");
    assert_eq!(queue_key(b"n", -26), "n/-1a");
}

#[test]
fn waiters_are_ordered_by_create_revision_and_a_lease_keeps_its_place() {
    let mut r = Replica::new(Settings::default());
    grant(&mut r, 7);
    grant(&mut r, 8);
    let first = enqueued(r.ok(lock("jobs", 7)));
    assert_eq!(first.key, "jobs/7");
    assert_eq!(first.lease, 7);
    assert_eq!(first.create_revision, r.sm.revision());
    let second = enqueued(r.ok(lock("jobs", 8)));
    assert!(second.create_revision > first.create_revision);

    // Locking again with lease 7 reuses its key: same place, no new revision.
    let revision = r.sm.revision();
    let again = enqueued(r.ok(lock("jobs", 7)));
    assert_eq!(again, first);
    assert_eq!(r.sm.revision(), revision);

    // Both keys hang on their leases: revoking 7 removes its waiter.
    assert!(
        r.sm.leases()
            .get(7)
            .expect("lease 7")
            .keys
            .contains(&first.key)
    );
    r.ok(Op::LeaseRevoke { id: 7 });
    assert_eq!(r.value("jobs/7"), None);
    assert_eq!(r.value("jobs/8"), Some(Bytes::new()));
}

#[test]
fn campaign_proclaims_a_new_value_but_keeps_its_place() {
    let mut r = Replica::new(Settings::default());
    grant(&mut r, 5);
    let first = enqueued(r.ok(campaign("leader", 5, "a")));
    assert_eq!(r.value("leader/5"), Some(Bytes::from_static(b"a")));

    // The same value: nothing written.
    let revision = r.sm.revision();
    assert_eq!(enqueued(r.ok(campaign("leader", 5, "a"))), first);
    assert_eq!(r.sm.revision(), revision);

    // Another value: written at a new revision, same create revision (etcd's Campaign
    // proclaims the new value and keeps the candidacy).
    assert_eq!(enqueued(r.ok(campaign("leader", 5, "b"))), first);
    assert_eq!(r.sm.revision(), revision + 1);
    assert_eq!(r.value("leader/5"), Some(Bytes::from_static(b"b")));
    assert_eq!(r.version("leader/5"), Some(2));

    // A lock never overwrites: the key keeps its value.
    assert_eq!(enqueued(r.ok(lock("leader", 5))), first);
    assert_eq!(r.value("leader/5"), Some(Bytes::from_static(b"b")));
}

#[test]
fn an_unknown_lease_changes_nothing() {
    let mut r = Replica::new(Settings::default());
    let revision = r.sm.revision();
    let reply = r.untracked(lock("jobs", 99));
    assert_eq!(reply.result, Err(OpError::LeaseNotFound));
    assert_eq!(r.sm.revision(), revision);
    assert!(r.sm.leases().is_empty());
}

#[test]
fn lease_zero_grants_the_etcd_session_ttl_in_the_same_command() {
    let mut r = Replica::new(Settings::default());
    let e = enqueued(r.ok(lock("jobs", 0)));
    let lease = r.sm.leases().get(e.lease).expect("the granted lease");
    assert_eq!(lease.ttl, CONCURRENCY_TTL_SECS);
    assert!(lease.keys.contains(&e.key));
    assert_eq!(e.key, queue_key(b"jobs", e.lease));

    // Untracked (etcd's behaviour), a second call is a second lease and a second waiter.
    let other = enqueued(r.ok(lock("jobs", 0)));
    assert_ne!(other.lease, e.lease);
    assert!(other.create_revision > e.create_revision);
    assert_eq!(r.sm.leases().len(), 2);
}

#[test]
fn a_retried_enqueue_through_a_session_is_answered_not_applied_again() {
    let mut r = Replica::new(Settings::default());
    let client = r.register(SECRET);
    let first = r.one(tracked(client, SECRET, 1, 1, lock("jobs", 0)));
    let revision = r.sm.revision();
    let retry = r.one(tracked(client, SECRET, 1, 1, lock("jobs", 0)));
    assert_eq!(retry, first);
    assert_eq!(r.sm.revision(), revision);
    assert_eq!(r.sm.leases().len(), 1, "one lease, one waiter");
    match first {
        Response::Op(Ok(reply)) => {
            let e = enqueued(reply.result.expect("enqueued"));
            assert_eq!(e.create_revision, revision);
        }
        other => panic!("enqueue answered {other:?}"),
    }
}
