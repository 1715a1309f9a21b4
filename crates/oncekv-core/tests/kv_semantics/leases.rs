//! Leases: ids, revocation and the keys attached.

use super::*;

// --- leases -------------------------------------------------------------------------------

// etcd's server picks an id for a grant with ID 0; every replica must pick the same one.
#[test]
fn lease_grant_with_id_zero_picks_the_same_free_id_everywhere() {
    let mut r = replica();
    r.ok(Op::put("x", "y")); // index 1
    let granted = r.ok(Op::LeaseGrant { id: 0, ttl: 10 }); // index 2
    assert_eq!(granted, OpResponse::LeaseGrant { id: 2, ttl: 10 });
    r.ok(Op::LeaseGrant { id: 4, ttl: 10 }); // index 3
    let granted = r.ok(Op::LeaseGrant { id: 0, ttl: 10 }); // index 4: 4 is taken
    assert_eq!(granted, OpResponse::LeaseGrant { id: 5, ttl: 10 });
    let mut other = StateMachine::new(Settings::default());
    // Same log, another replica.
    let mut again = Replica::new(Settings::default());
    again.ok(Op::put("x", "y"));
    again.ok(Op::LeaseGrant { id: 0, ttl: 10 });
    again.ok(Op::LeaseGrant { id: 4, ttl: 10 });
    again.ok(Op::LeaseGrant { id: 0, ttl: 10 });
    assert_eq!(again.snapshot(), r.snapshot());
    other.apply_empty(1);
    assert_eq!(other.leases().free_id(4), 4);
}

// Revoking a lease deletes its keys in one revision, as etcd does; revoking an unknown
// lease says so.
#[test]
fn lease_revoke_deletes_attached_keys_in_one_revision() {
    let mut r = replica();
    r.ok(Op::LeaseGrant { id: 1, ttl: 60 });
    for k in ["a", "b", "c"] {
        r.ok(put_with(k, "v", |p| p.lease = 1));
    }
    r.ok(Op::put("d", "v"));
    let revision = r.sm.revision();
    let reply = r.untracked(Op::LeaseRevoke { id: 1 });
    assert_eq!(reply.result, Ok(OpResponse::LeaseRevoke));
    assert_eq!(reply.revision, revision + 1);
    assert_eq!(keys(&read(&r, &get_req(all()))), ["d"]);
    assert_eq!(
        r.untracked(Op::LeaseRevoke { id: 1 }).result,
        Err(OpError::LeaseNotFound)
    );
    assert_eq!(
        r.untracked(Op::LeaseKeepAlive { id: 1 }).result,
        Err(OpError::LeaseNotFound)
    );
    assert_eq!(
        r.untracked(put_with("e", "v", |p| p.lease = 1)).result,
        Err(OpError::LeaseNotFound)
    );
}

// etcd caps TTLs (9e9 s) and raises tiny ones to its minimum so a lease cannot expire
// before its first keep-alive could arrive.
#[test]
fn lease_ttl_is_capped_and_raised_to_the_minimum() {
    let mut r = replica();
    let too_large = r.untracked(Op::LeaseGrant {
        id: 1,
        ttl: MAX_LEASE_TTL_SECS + 1,
    });
    assert_eq!(too_large.result, Err(OpError::LeaseTtlTooLarge));
    assert!(r.sm.leases().get(1).is_none());
    let largest = r.ok(Op::LeaseGrant {
        id: 1,
        ttl: MAX_LEASE_TTL_SECS,
    });
    assert_eq!(
        largest,
        OpResponse::LeaseGrant {
            id: 1,
            ttl: MAX_LEASE_TTL_SECS
        }
    );
    let min = Settings::default().min_lease_ttl_secs;
    for (id, ttl) in [(2, 1), (3, 0), (4, -5)] {
        let raised = r.ok(Op::LeaseGrant { id, ttl });
        assert_eq!(raised, OpResponse::LeaseGrant { id, ttl: min });
        let deadline = r.sm.leases().get(id).map(|l| l.deadline);
        assert_eq!(deadline, Some(r.sm.cluster_time() + min as u64 * 1_000));
    }
}
