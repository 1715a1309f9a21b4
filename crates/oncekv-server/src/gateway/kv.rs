//! The KV service (`/v3/kv/...`): range, put, delete, txn and compaction.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{MethodRouter, post};
use bytes::Bytes;

use super::call::{Gateway, unary};
use crate::etcd::KvService;
use crate::pb::etcdserverpb::kv_server::Kv;

/// The paths this service answers at, under `/v3` and `/v3beta`.
pub(super) fn rpcs() -> Vec<(&'static str, MethodRouter<Gateway>)> {
    vec![
        ("kv/range", post(range)),
        ("kv/put", post(put)),
        ("kv/deleterange", post(delete_range)),
        ("kv/txn", post(txn)),
        ("kv/compaction", post(compaction)),
    ]
}

async fn range(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let kv = KvService { node: g.core };
    unary(&headers, &body, |r| kv.range(r)).await
}

async fn put(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let kv = KvService { node: g.core };
    unary(&headers, &body, |r| kv.put(r)).await
}

async fn delete_range(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let kv = KvService { node: g.core };
    unary(&headers, &body, |r| kv.delete_range(r)).await
}

async fn txn(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let kv = KvService { node: g.core };
    unary(&headers, &body, |r| kv.txn(r)).await
}

async fn compaction(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let kv = KvService { node: g.core };
    unary(&headers, &body, |r| kv.compact(r)).await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::super::json::parse;
    use bytes::Bytes;

    use crate::pb::etcdserverpb as pb;

    #[test]
    fn fields_are_read_by_proto_or_camel_case_names() {
        let range: pb::RangeRequest = parse(&Bytes::from_static(
            br#"{"range_end": "YQ==", "maxCreateRevision": "5"}"#,
        ))
        .unwrap();
        assert_eq!(
            (&range.range_end[..], range.max_create_revision),
            (&b"a"[..], 5)
        );
        // A txn as Go's jsonpb writes it by default (etcd's e2e curl test sends this).
        let txn: pb::TxnRequest = parse(&Bytes::from_static(
            br#"{
                "compare": [{"key": "Zm9v", "target": "CREATE", "createRevision": "0"}],
                "success": [{"requestPut": {"key": "Zm9v", "value": "YmFy"}}]
            }"#,
        ))
        .unwrap();
        assert!(matches!(
            txn.compare[0].target_union,
            Some(pb::compare::TargetUnion::CreateRevision(0))
        ));
        assert!(matches!(
            &txn.success[0].request,
            Some(pb::request_op::Request::RequestPut(p)) if p.value.as_ref() == b"bar"
        ));
    }
}
