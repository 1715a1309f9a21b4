//! etcd v3 KV and lease semantics: what an etcd client expects of Range, Put, DeleteRange,
//! Txn and leases, revision by revision.

mod common;

use bytes::Bytes;
use common::{Replica, get_req, put_with, range};
use oncekv_core::txn::validate_txn;
use oncekv_core::{
    Compare, CompareResult, CompareTarget, DeleteRangeRequest, DeleteRangeResponse, KeyRange,
    KeyValue, Op, OpError, OpResponse, PutRequest, PutResponse, RangeRequest, RangeResponse,
    RequestOp, ResponseOp, Settings, SortOrder, SortTarget, StateMachine, TxnRequest, TxnResponse,
    command::MAX_LEASE_TTL_SECS, prefix_end,
};

fn replica() -> Replica {
    Replica::new(Settings::default())
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// Every key (what etcd clients send for an empty prefix).
fn all() -> KeyRange {
    range("\0", "\0")
}

fn keys(resp: &RangeResponse) -> Vec<String> {
    resp.kvs
        .iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .collect()
}

fn read(r: &Replica, req: &RangeRequest) -> RangeResponse {
    r.sm.range(req).expect("range is valid").1
}

fn txn_response(resp: OpResponse) -> TxnResponse {
    match resp {
        OpResponse::Txn(t) => t,
        other => panic!("not a txn response: {other:?}"),
    }
}

fn cmp(key: &str, result: CompareResult, target: CompareTarget) -> Compare {
    Compare {
        result,
        target,
        range: KeyRange::single(b(key)),
    }
}

fn put_op(key: &str, value: &str) -> RequestOp {
    RequestOp::Put(PutRequest {
        key: b(key),
        value: b(value),
        ..PutRequest::default()
    })
}

fn get_op(key: &str) -> RequestOp {
    RequestOp::Range(get_req(KeyRange::single(b(key))))
}

fn delete_op(range: KeyRange) -> RequestOp {
    RequestOp::DeleteRange(DeleteRangeRequest {
        range,
        prev_kv: false,
    })
}

fn txn(compare: Vec<Compare>, success: Vec<RequestOp>, failure: Vec<RequestOp>) -> TxnRequest {
    TxnRequest {
        compare,
        success,
        failure,
    }
}

/// Keys `a`..`e` with values that sort in the opposite order, written so that versions,
/// create and mod revisions all differ.
fn sortable() -> Replica {
    let mut r = replica();
    for (k, v) in [("c", "3"), ("a", "5"), ("e", "1"), ("b", "4"), ("d", "2")] {
        r.ok(Op::put(k, v));
    }
    // Versions: a=1, b=3, c=2, d=1, e=1; mod revisions now: c=7 < b=9 (rewritten last).
    r.ok(Op::put("c", "3"));
    r.ok(Op::put("b", "4"));
    r.ok(Op::put("b", "4"));
    r
}

// --- revisions ----------------------------------------------------------------------------

// etcd clients watch and compare on revisions: one bump per mutating request, none for a
// request that changed nothing.
#[test]
fn revision_bumps_once_per_change_and_never_for_no_change() {
    let mut r = replica();
    assert_eq!(r.sm.revision(), 1, "a fresh etcd is at revision 1");
    assert_eq!(r.untracked(Op::put("a", "1")).revision, 2);
    let several = txn(vec![], vec![put_op("b", "1"), put_op("c", "1")], vec![]);
    assert_eq!(r.untracked(Op::Txn(several)).revision, 3);
    assert_eq!(r.sm.kv().get(b"b").map(|v| v.mod_revision), Some(3));
    assert_eq!(r.sm.kv().get(b"c").map(|v| v.mod_revision), Some(3));
    let nothing = Op::DeleteRange(DeleteRangeRequest {
        range: KeyRange::single("zz"),
        prev_kv: false,
    });
    assert_eq!(r.untracked(nothing).revision, 3);
    let read_only = txn(vec![], vec![get_op("a")], vec![]);
    assert_eq!(r.untracked(Op::Txn(read_only)).revision, 3);
    assert_eq!(r.untracked(Op::LeaseGrant { id: 1, ttl: 60 }).revision, 3);
    let refused = r.untracked(put_with("d", "1", |p| p.lease = 99));
    assert_eq!(refused.result, Err(OpError::LeaseNotFound));
    assert_eq!(refused.revision, 3);
    let deleted = Op::DeleteRange(DeleteRangeRequest {
        range: range("a", "c"),
        prev_kv: false,
    });
    assert_eq!(r.untracked(deleted).revision, 4);
}

// version counts puts since creation; create_revision survives overwrites; a delete resets
// the key's life. Clients use these for optimistic concurrency.
#[test]
fn version_create_and_mod_revisions_follow_etcd() {
    let mut r = replica();
    r.ok(Op::put("k", "1"));
    r.ok(Op::put("other", "x"));
    r.ok(Op::put("k", "2"));
    let v = r.sm.kv().get(b"k").cloned().expect("k exists");
    assert_eq!(
        (v.create_revision, v.mod_revision, v.version),
        (2, 4, 2),
        "create stays, mod and version move"
    );
    r.ok(Op::DeleteRange(DeleteRangeRequest {
        range: KeyRange::single("k"),
        prev_kv: false,
    }));
    r.ok(Op::put("k", "3"));
    let v = r.sm.kv().get(b"k").cloned().expect("k exists");
    assert_eq!((v.create_revision, v.mod_revision, v.version), (6, 6, 1));
}

// --- Range --------------------------------------------------------------------------------

// `etcdctl get --prefix` relies on prefix_end; a wrong end leaks neighbouring keys.
#[test]
fn range_prefix_selects_exactly_the_prefixed_keys() {
    let mut r = replica();
    for k in ["a", "a/", "a/1", "a/2", "a0", "b"] {
        r.ok(Op::put(k, "v"));
    }
    r.ok(Op::Put(PutRequest {
        key: Bytes::from_static(b"a\xff\x01"),
        value: b("v"),
        ..PutRequest::default()
    }));
    let resp = read(&r, &get_req(KeyRange::prefix("a/")));
    assert_eq!(keys(&resp), ["a/", "a/1", "a/2"]);
    assert_eq!(prefix_end(b"a\xff").as_ref(), b"b");
    assert_eq!(prefix_end(b"\xff\xff").as_ref(), b"\0");
    let resp = read(&r, &get_req(KeyRange::prefix(Bytes::from_static(b"a\xff"))));
    assert_eq!(resp.count, 1);
    assert_eq!(read(&r, &get_req(KeyRange::prefix("a"))).count, 6);
}

// A single key (an empty range_end) is looked up, not scanned: it must find that key
// only, never a neighbour it prefixes, and see deletes and past revisions.
#[test]
fn a_single_key_read_finds_that_key_alone() {
    let mut r = replica();
    for k in ["a", "ab", "b"] {
        r.ok(Op::put(k, "v1"));
    }
    let before_delete = r.sm.revision();
    let single = |k: &str| get_req(KeyRange::single(b(k)));
    assert_eq!(keys(&read(&r, &single("a"))), ["a"]);
    assert_eq!(read(&r, &single("a")).count, 1);
    assert_eq!(read(&r, &single("aa")).count, 0, "no key between a and ab");
    r.ok(Op::DeleteRange(DeleteRangeRequest {
        range: KeyRange::single(b("a")),
        prev_kv: false,
    }));
    assert_eq!(read(&r, &single("a")).count, 0, "deleted");
    assert_eq!(keys(&read(&r, &single("ab"))), ["ab"]);
    let past = RangeRequest {
        revision: before_delete,
        ..single("a")
    };
    assert_eq!(keys(&read(&r, &past)), ["a"], "still there at its revision");
}

// `--from-key` is range_end "\0"; key "\0" with it means every key.
#[test]
fn range_from_key_reads_to_the_end() {
    let mut r = replica();
    for k in ["a", "b", "c"] {
        r.ok(Op::put(k, "v"));
    }
    assert_eq!(keys(&read(&r, &get_req(range("b", "\0")))), ["b", "c"]);
    assert_eq!(
        keys(&read(&r, &get_req(range("\0", "\0")))),
        ["a", "b", "c"]
    );
    // A plain range is half-open; an end at or before the key selects nothing.
    assert_eq!(keys(&read(&r, &get_req(range("a", "c")))), ["a", "b"]);
    assert_eq!(read(&r, &get_req(range("c", "a"))).count, 0);
    assert_eq!(keys(&read(&r, &get_req(KeyRange::single("b")))), ["b"]);
}

// Pagination (`--limit`) depends on `more` and on `count` being the full total.
#[test]
fn range_limit_sets_more_and_count_is_the_total() {
    let mut r = replica();
    for k in ["a", "b", "c", "d", "e"] {
        r.ok(Op::put(k, "v"));
    }
    let all = all();
    let limited = |limit| RangeRequest {
        limit,
        ..get_req(all.clone())
    };
    let resp = read(&r, &limited(2));
    assert_eq!(
        (keys(&resp), resp.more, resp.count),
        (vec!["a".into(), "b".into()], true, 5)
    );
    let resp = read(&r, &limited(5));
    assert_eq!((resp.kvs.len(), resp.more, resp.count), (5, false, 5));
    let resp = read(&r, &limited(0));
    assert_eq!((resp.kvs.len(), resp.more), (5, false));
}

// count_only and keys_only are how clients ask cheaply; they must not return values.
#[test]
fn range_count_only_and_keys_only() {
    let mut r = replica();
    for k in ["a", "b", "c"] {
        r.ok(Op::put(k, "value"));
    }
    let all = get_req(all());
    let resp = read(
        &r,
        &RangeRequest {
            count_only: true,
            ..all.clone()
        },
    );
    assert_eq!(
        resp,
        RangeResponse {
            kvs: vec![],
            more: false,
            count: 3
        }
    );
    let resp = read(
        &r,
        &RangeRequest {
            keys_only: true,
            ..all
        },
    );
    assert_eq!(keys(&resp), ["a", "b", "c"]);
    assert!(
        resp.kvs
            .iter()
            .all(|kv| kv.value.is_empty() && kv.version == 1)
    );
}

// Every sort target in both orders, and etcd's rule that a target without an order sorts
// ascending; the limit applies after sorting (top-N).
#[test]
fn range_sorts_by_every_target_in_both_orders() {
    let r = sortable();
    let sorted = |order, target, limit| {
        keys(&read(
            &r,
            &RangeRequest {
                sort_order: order,
                sort_target: target,
                limit,
                ..get_req(all())
            },
        ))
    };
    use SortOrder::{Ascend, Descend, None};
    use SortTarget::{Create, Key, Mod, Value, Version};
    assert_eq!(sorted(None, Key, 0), ["a", "b", "c", "d", "e"]);
    assert_eq!(sorted(Ascend, Key, 0), ["a", "b", "c", "d", "e"]);
    assert_eq!(sorted(Descend, Key, 0), ["e", "d", "c", "b", "a"]);
    assert_eq!(sorted(Ascend, Value, 0), ["e", "d", "c", "b", "a"]);
    assert_eq!(sorted(Descend, Value, 0), ["a", "b", "c", "d", "e"]);
    // Created in order c, a, e, b, d.
    assert_eq!(sorted(Ascend, Create, 0), ["c", "a", "e", "b", "d"]);
    assert_eq!(sorted(Descend, Create, 0), ["d", "b", "e", "a", "c"]);
    // Last modified in order a, e, d, c, b.
    assert_eq!(sorted(Ascend, Mod, 0), ["a", "e", "d", "c", "b"]);
    assert_eq!(sorted(Descend, Mod, 2), ["b", "c"]);
    // No order with a non-key target means ascending (etcd).
    assert_eq!(sorted(None, Mod, 0), ["a", "e", "d", "c", "b"]);
    let by_version = sorted(Descend, Version, 0);
    assert_eq!(&by_version[..2], ["b", "c"]);
    assert_eq!(sorted(Ascend, Version, 0)[4], "b");
}

// Mod/create revision filters narrow kvs but, as in etcd, count stays the range's total.
#[test]
fn range_mod_and_create_revision_filters() {
    let r = sortable();
    let filtered = |f: fn(&mut RangeRequest)| {
        let mut req = get_req(all());
        f(&mut req);
        read(&r, &req)
    };
    // Mod revisions: a=3, e=4, d=6, c=7, b=9. Create: c=2, a=3, e=4, b=5, d=6.
    let resp = filtered(|q| q.min_mod_revision = 6);
    assert_eq!(
        (keys(&resp), resp.count),
        (vec!["b".into(), "c".into(), "d".into()], 5)
    );
    assert_eq!(keys(&filtered(|q| q.max_mod_revision = 4)), ["a", "e"]);
    assert_eq!(
        keys(&filtered(|q| {
            q.min_mod_revision = 4;
            q.max_mod_revision = 7;
        })),
        ["c", "d", "e"]
    );
    assert_eq!(keys(&filtered(|q| q.min_create_revision = 5)), ["b", "d"]);
    assert_eq!(keys(&filtered(|q| q.max_create_revision = 3)), ["a", "c"]);
    let resp = filtered(|q| {
        q.min_mod_revision = 6;
        q.limit = 2;
    });
    assert_eq!((resp.kvs.len(), resp.more), (2, true));
}

// An older revision reads the value it had then; below the compacted revision a read says
// Compacted (never silently answers with newer data), past the current one FutureRevision.
#[test]
fn range_revision_zero_current_older_compacted_and_future() {
    let mut r = replica();
    r.ok(Op::put("a", "1"));
    r.ok(Op::put("a", "2"));
    let current = r.sm.revision();
    let value_at = |sm: &oncekv_core::StateMachine, rev| {
        sm.range(&RangeRequest {
            revision: rev,
            ..get_req(KeyRange::single("a"))
        })
        .map(|(rev, resp)| (rev, resp.kvs[0].value.clone()))
    };
    assert_eq!(value_at(&r.sm, 0), Ok((current, b("2"))));
    assert_eq!(value_at(&r.sm, current), Ok((current, b("2"))));
    // The header revision stays the store's; the data is the older revision's.
    assert_eq!(value_at(&r.sm, current - 1), Ok((current, b("1"))));
    assert_eq!(value_at(&r.sm, current + 1), Err(OpError::FutureRevision));
    r.ok(Op::Compact { revision: current });
    assert_eq!(value_at(&r.sm, current - 1), Err(OpError::Compacted));
    assert_eq!(value_at(&r.sm, current), Ok((current, b("2"))));
    assert_eq!(
        r.sm.range(&get_req(KeyRange::single(""))),
        Err(OpError::EmptyKey)
    );
}

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
