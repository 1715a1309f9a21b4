//! etcd v3 KV and lease semantics: what an etcd client expects of Range, Put, DeleteRange,
//! Txn and leases, revision by revision.

#[path = "../common/mod.rs"]
mod common;

mod leases;
mod reads;
mod writes;

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
