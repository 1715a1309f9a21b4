//! Revisions, and Range: prefixes, single keys, limits, sorting, filters, old revisions.

use super::*;

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
