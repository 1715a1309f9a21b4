//! Put, DeleteRange and Txn: previous values, leases on overwrite, compares, branches.

use super::*;

// --- Put ----------------------------------------------------------------------------------

// prev_kv is what `etcdctl put --prev-kv` prints; it must be the value before this put.
#[test]
fn put_returns_prev_kv_only_when_asked() {
    let mut r = replica();
    let first = r.ok(put_with("k", "1", |p| p.prev_kv = true));
    assert_eq!(first, OpResponse::Put(PutResponse { prev_kv: None }));
    let second = r.ok(put_with("k", "2", |p| p.prev_kv = true));
    let prev = KeyValue {
        key: b("k"),
        create_revision: 2,
        mod_revision: 2,
        version: 1,
        value: b("1"),
        lease: 0,
    };
    assert_eq!(
        second,
        OpResponse::Put(PutResponse {
            prev_kv: Some(Box::new(prev))
        })
    );
    let third = r.ok(Op::put("k", "3"));
    assert_eq!(third, OpResponse::Put(PutResponse { prev_kv: None }));
    assert_eq!(r.sm.revision(), 4);
    assert_eq!(r.untracked(Op::put("", "x")).result, Err(OpError::EmptyKey));
}

// ignore_value rewrites the key (new version) keeping its value; etcd's checks apply.
#[test]
fn put_ignore_value_keeps_the_value_and_bumps_the_version() {
    let mut r = replica();
    let missing = r.untracked(put_with("k", "", |p| p.ignore_value = true));
    assert_eq!(missing.result, Err(OpError::KeyNotFound));
    r.ok(Op::put("k", "kept"));
    let provided = r.untracked(put_with("k", "new", |p| p.ignore_value = true));
    assert_eq!(provided.result, Err(OpError::ValueProvided));
    r.ok(put_with("k", "", |p| p.ignore_value = true));
    assert_eq!(r.value("k"), Some(b("kept")));
    assert_eq!(r.version("k"), Some(2));
}

// ignore_lease keeps the key on its lease (so it still expires with it).
#[test]
fn put_ignore_lease_keeps_the_lease() {
    let mut r = replica();
    r.ok(Op::LeaseGrant { id: 1, ttl: 60 });
    let missing = r.untracked(put_with("k", "v", |p| p.ignore_lease = true));
    assert_eq!(missing.result, Err(OpError::KeyNotFound));
    r.ok(put_with("k", "v", |p| p.lease = 1));
    let provided = r.untracked(put_with("k", "w", |p| {
        p.ignore_lease = true;
        p.lease = 1;
    }));
    assert_eq!(provided.result, Err(OpError::LeaseProvided));
    r.ok(put_with("k", "w", |p| p.ignore_lease = true));
    assert_eq!(r.sm.kv().get(b"k").map(|v| v.lease), Some(1));
    assert_eq!(r.value("k"), Some(b("w")));
    r.ok(Op::LeaseRevoke { id: 1 });
    assert_eq!(r.version("k"), None, "the key left its lease");
}

// Overwriting a key moves it between leases; a stale attachment would delete a key that no
// longer belongs to the lease when it expires.
#[test]
fn put_attaches_and_detaches_leases_on_overwrite() {
    let mut r = replica();
    r.ok(Op::LeaseGrant { id: 1, ttl: 60 });
    r.ok(Op::LeaseGrant { id: 2, ttl: 60 });
    let attached = |r: &Replica, id| {
        r.sm.leases()
            .get(id)
            .map(|l| l.keys.iter().cloned().collect::<Vec<_>>())
    };
    r.ok(put_with("k", "v", |p| p.lease = 1));
    assert_eq!(attached(&r, 1), Some(vec![b("k")]));
    r.ok(put_with("k", "v", |p| p.lease = 2));
    assert_eq!(
        (attached(&r, 1), attached(&r, 2)),
        (Some(vec![]), Some(vec![b("k")]))
    );
    r.ok(Op::put("k", "v"));
    assert_eq!(attached(&r, 2), Some(vec![]));
    let revision = r.sm.revision();
    r.ok(Op::LeaseRevoke { id: 2 });
    assert_eq!(r.version("k"), Some(3), "a detached key was deleted");
    assert_eq!(
        r.sm.revision(),
        revision,
        "revoking a lease without keys bumped"
    );
}

// --- DeleteRange --------------------------------------------------------------------------

// `etcdctl del --prev-kv` prints what was deleted; the count is what `del` prints.
#[test]
fn delete_range_returns_deleted_count_and_prev_kvs() {
    let mut r = replica();
    r.ok(Op::LeaseGrant { id: 1, ttl: 60 });
    r.ok(put_with("a", "1", |p| p.lease = 1));
    r.ok(Op::put("b", "2"));
    r.ok(Op::put("c", "3"));
    let resp = r.ok(Op::DeleteRange(DeleteRangeRequest {
        range: range("a", "c"),
        prev_kv: true,
    }));
    let OpResponse::DeleteRange(DeleteRangeResponse { deleted, prev_kvs }) = resp else {
        panic!("not a delete response");
    };
    assert_eq!(deleted, 2);
    assert_eq!(
        prev_kvs
            .iter()
            .map(|kv| kv.value.clone())
            .collect::<Vec<_>>(),
        [b("1"), b("2")]
    );
    assert_eq!(prev_kvs[0].lease, 1);
    assert!(r.sm.leases().get(1).is_some_and(|l| l.keys.is_empty()));
    let resp = r.ok(Op::DeleteRange(DeleteRangeRequest {
        range: KeyRange::single("c"),
        prev_kv: false,
    }));
    assert_eq!(
        resp,
        OpResponse::DeleteRange(DeleteRangeResponse {
            deleted: 1,
            prev_kvs: vec![]
        })
    );
    let empty = r.untracked(Op::DeleteRange(DeleteRangeRequest::default()));
    assert_eq!(empty.result, Err(OpError::EmptyKey));
}

// --- Txn ----------------------------------------------------------------------------------

// Compares are the basis of every etcd lock and election: each target and result, including
// the rule that a missing key compares as zero except for its value (always false).
#[test]
fn txn_compares_every_target_including_missing_keys() {
    let mut r = replica();
    r.ok(Op::LeaseGrant { id: 7, ttl: 60 });
    r.ok(put_with("k", "m", |p| p.lease = 7)); // create = mod = 2, version 1
    r.ok(Op::put("k2", "x"));
    r.ok(Op::put("k", "m")); // mod 4, version 2; lease dropped
    use CompareResult::{Equal, Greater, Less, NotEqual};
    use CompareTarget::{CreateRevision, Lease, ModRevision, Value, Version};
    let cases: Vec<(&str, CompareResult, CompareTarget, bool)> = vec![
        ("k", Equal, Value(b("m")), true),
        ("k", Greater, Value(b("l")), true),
        ("k", Less, Value(b("n")), true),
        ("k", NotEqual, Value(b("m")), false),
        ("k", Equal, Version(2), true),
        ("k", Greater, Version(2), false),
        ("k", Less, Version(3), true),
        ("k", Equal, CreateRevision(2), true),
        ("k", NotEqual, CreateRevision(2), false),
        ("k", Equal, ModRevision(4), true),
        ("k", Greater, ModRevision(3), true),
        ("k", Equal, Lease(0), true),
        ("k", Equal, Lease(7), false),
        ("missing", Equal, Version(0), true),
        ("missing", Equal, CreateRevision(0), true),
        ("missing", Equal, ModRevision(0), true),
        ("missing", Equal, Lease(0), true),
        ("missing", Greater, Version(0), false),
        ("missing", Equal, Value(b("")), false),
        ("missing", NotEqual, Value(b("x")), false),
    ];
    for (key, result, target, holds) in cases {
        let t = txn(vec![cmp(key, result, target.clone())], vec![], vec![]);
        let resp = txn_response(r.ok(Op::Txn(t)));
        assert_eq!(resp.succeeded, holds, "{key} {result:?} {target:?}");
    }
    // A range compare holds only if every key in it does.
    let over = |target| Compare {
        result: Equal,
        target,
        range: KeyRange::prefix("k"),
    };
    let all_x = txn(vec![over(Value(b("x")))], vec![], vec![]);
    assert!(!txn_response(r.ok(Op::Txn(all_x))).succeeded);
    let all_young = txn(vec![over(Version(1))], vec![], vec![]);
    assert!(!txn_response(r.ok(Op::Txn(all_young))).succeeded);
    let none_leased = txn(vec![over(Lease(0))], vec![], vec![]);
    assert!(txn_response(r.ok(Op::Txn(none_leased))).succeeded);
}

// The success branch runs iff every compare holds, otherwise the failure branch; responses
// follow the branch's ops one for one.
#[test]
fn txn_runs_success_or_failure_branch() {
    let mut r = replica();
    let cas = |expect: &str, new: &str| {
        txn(
            vec![cmp(
                "k",
                CompareResult::Equal,
                CompareTarget::Value(b(expect)),
            )],
            vec![put_op("k", new)],
            vec![get_op("k")],
        )
    };
    r.ok(Op::put("k", "1"));
    let won = txn_response(r.ok(Op::Txn(cas("1", "2"))));
    assert!(won.succeeded);
    assert_eq!(won.responses, [ResponseOp::Put(PutResponse::default())]);
    let lost = txn_response(r.ok(Op::Txn(cas("1", "3"))));
    assert!(!lost.succeeded);
    let [ResponseOp::Range(got)] = &lost.responses[..] else {
        panic!("failure branch answered {:?}", lost.responses);
    };
    assert_eq!(got.kvs[0].value, b("2"));
    assert_eq!(r.value("k"), Some(b("2")));
}

// A range inside a txn sees the txn's earlier writes (etcd reads through its write txn),
// at the revision the txn will commit.
#[test]
fn txn_reads_see_its_own_writes() {
    let mut r = replica();
    r.ok(Op::put("b", "old"));
    let t = txn(
        vec![],
        vec![
            put_op("a", "1"),
            get_op("a"),
            delete_op(KeyRange::single("b")),
            get_op("b"),
        ],
        vec![],
    );
    let resp = txn_response(r.ok(Op::Txn(t)));
    let ResponseOp::Range(seen) = &resp.responses[1] else {
        panic!("not a range: {:?}", resp.responses[1]);
    };
    assert_eq!(seen.kvs[0].value, b("1"));
    assert_eq!(seen.kvs[0].mod_revision, 3);
    let ResponseOp::Range(after_delete) = &resp.responses[3] else {
        panic!("not a range: {:?}", resp.responses[3]);
    };
    assert_eq!(after_delete.count, 0);
    assert_eq!(r.sm.revision(), 3);
}

// etcd decides every branch of a txn, nested ones included, against the state before the
// txn (compareToPath), then applies; a replica that re-evaluated nested compares after the
// outer branch's writes would answer differently from etcd.
#[test]
fn nested_txn_compares_see_the_state_before_the_txn() {
    let mut r = replica();
    let inner = txn(
        vec![cmp("a", CompareResult::Equal, CompareTarget::Value(b("1")))],
        vec![put_op("b", "saw-a")],
        vec![put_op("c", "no-a")],
    );
    let outer = txn(
        vec![],
        vec![put_op("a", "1"), RequestOp::Txn(inner)],
        vec![],
    );
    let resp = txn_response(r.ok(Op::Txn(outer)));
    assert_eq!(
        resp.responses,
        [
            ResponseOp::Put(PutResponse::default()),
            ResponseOp::Txn(TxnResponse {
                succeeded: false,
                responses: vec![ResponseOp::Put(PutResponse::default())],
            }),
        ]
    );
    assert_eq!((r.value("b"), r.value("c")), (None, Some(b("no-a"))));
    assert_eq!(r.sm.revision(), 2, "one revision for the whole txn");

    // Deciding late could also pick a branch that was never checked, whose put is invalid
    // (unknown lease): the txn would then be half-applied.
    let inner = txn(
        vec![cmp("x", CompareResult::Equal, CompareTarget::Version(0))],
        vec![put_op("y", "checked")],
        vec![RequestOp::Put(PutRequest {
            key: b("z"),
            lease: 404,
            ..PutRequest::default()
        })],
    );
    let outer = txn(
        vec![],
        vec![put_op("x", "1"), RequestOp::Txn(inner)],
        vec![],
    );
    let resp = txn_response(r.ok(Op::Txn(outer)));
    assert!(matches!(&resp.responses[1], ResponseOp::Txn(t) if t.succeeded));
    assert_eq!(r.value("y"), Some(b("checked")));
}

// A txn is refused whole or applied whole: a bad op in the branch that runs leaves no
// half-written state.
#[test]
fn txn_with_an_invalid_op_changes_nothing() {
    let mut r = replica();
    let t = txn(
        vec![],
        vec![
            put_op("a", "1"),
            RequestOp::Put(PutRequest {
                key: b("b"),
                lease: 404,
                ..PutRequest::default()
            }),
        ],
        vec![],
    );
    let reply = r.untracked(Op::Txn(t));
    assert_eq!(
        (reply.result, reply.revision),
        (Err(OpError::LeaseNotFound), 1)
    );
    assert_eq!(r.version("a"), None);
    // An invalid op in the branch that does not run is harmless.
    let other_branch = txn(
        vec![],
        vec![put_op("a", "1")],
        vec![RequestOp::Put(PutRequest {
            key: b("b"),
            lease: 404,
            ..PutRequest::default()
        })],
    );
    assert!(r.untracked(Op::Txn(other_branch)).result.is_ok());
}

// etcd refuses a txn that writes a key twice in one branch (the outcome would depend on
// op order) or puts a key its own delete covers; nested txns count too.
#[test]
fn validate_txn_refuses_duplicate_keys_and_too_many_ops() {
    let dup = txn(vec![], vec![put_op("a", "1"), put_op("a", "2")], vec![]);
    assert_eq!(validate_txn(&dup, 128), Err(OpError::DuplicateKey));
    let put_in_deleted = txn(
        vec![],
        vec![delete_op(KeyRange::prefix("a")), put_op("ab", "1")],
        vec![],
    );
    assert_eq!(
        validate_txn(&put_in_deleted, 128),
        Err(OpError::DuplicateKey)
    );
    let from_key = txn(
        vec![],
        vec![put_op("z", "1"), delete_op(range("m", "\0"))],
        vec![],
    );
    assert_eq!(validate_txn(&from_key, 128), Err(OpError::DuplicateKey));
    let nested = txn(
        vec![],
        vec![
            put_op("a", "1"),
            RequestOp::Txn(txn(vec![], vec![], vec![put_op("a", "2")])),
        ],
        vec![],
    );
    assert_eq!(validate_txn(&nested, 128), Err(OpError::DuplicateKey));
    // The two branches never both run, so they may write the same key; so may the two
    // branches of a nested txn.
    let branches = txn(vec![], vec![put_op("a", "1")], vec![put_op("a", "2")]);
    assert_eq!(validate_txn(&branches, 128), Ok(()));
    let inner_branches = txn(vec![], vec![RequestOp::Txn(branches.clone())], vec![]);
    assert_eq!(validate_txn(&inner_branches, 128), Ok(()));
    let beside = txn(
        vec![],
        vec![delete_op(KeyRange::prefix("a")), put_op("b", "1")],
        vec![],
    );
    assert_eq!(validate_txn(&beside, 128), Ok(()));

    // etcd refuses an op without a key anywhere in a txn, reads included.
    let keyless_read = txn(vec![], vec![], vec![get_op("")]);
    assert_eq!(validate_txn(&keyless_read, 128), Err(OpError::EmptyKey));
    let keyless_put = txn(vec![], vec![put_op("", "1")], vec![]);
    assert_eq!(validate_txn(&keyless_put, 128), Err(OpError::EmptyKey));

    let three = txn(
        vec![],
        vec![put_op("a", "1"), put_op("b", "1"), put_op("c", "1")],
        vec![],
    );
    assert_eq!(validate_txn(&three, 2), Err(OpError::TooManyOps));
    assert_eq!(validate_txn(&three, 3), Ok(()));
    let compares = txn(
        vec![cmp("a", CompareResult::Equal, CompareTarget::Version(0)); 3],
        vec![],
        vec![],
    );
    assert_eq!(validate_txn(&compares, 2), Err(OpError::TooManyOps));
    let deep = txn(vec![], vec![RequestOp::Txn(three)], vec![]);
    assert_eq!(validate_txn(&deep, 2), Err(OpError::TooManyOps));

    // The state machine re-checks, so a txn from the log can never half-apply.
    let mut r = replica();
    let reply = r.untracked(Op::Txn(dup));
    assert_eq!(
        (reply.result, reply.revision),
        (Err(OpError::DuplicateKey), 1)
    );
    assert_eq!(r.version("a"), None);
}
