//! The KV service (`/v3/kv/...`): range, put, delete, txn and compaction, and the
//! `KeyValue` mapping the watch and election answers share.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{MethodRouter, post};
use bytes::Bytes;
use serde_json::{Value, json};
use tonic::Status;

use super::call::{Gateway, unary};
use super::json::{Obj, bool_of, bytes_of, enum_of, field, header, header_only, int_of};
use crate::etcd::KvService;
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::kv_server::Kv;
use crate::pb::mvccpb;

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

fn range_req(v: &Value) -> Result<pb::RangeRequest, Status> {
    Ok(pb::RangeRequest {
        key: bytes_of(v, "key")?,
        range_end: bytes_of(v, "range_end")?,
        limit: int_of(v, "limit")?,
        revision: int_of(v, "revision")?,
        sort_order: enum_of(v, "sort_order", &["NONE", "ASCEND", "DESCEND"])?,
        sort_target: enum_of(
            v,
            "sort_target",
            &["KEY", "VERSION", "CREATE", "MOD", "VALUE"],
        )?,
        serializable: bool_of(v, "serializable"),
        keys_only: bool_of(v, "keys_only"),
        count_only: bool_of(v, "count_only"),
        min_mod_revision: int_of(v, "min_mod_revision")?,
        max_mod_revision: int_of(v, "max_mod_revision")?,
        min_create_revision: int_of(v, "min_create_revision")?,
        max_create_revision: int_of(v, "max_create_revision")?,
    })
}

fn put_req(v: &Value) -> Result<pb::PutRequest, Status> {
    Ok(pb::PutRequest {
        key: bytes_of(v, "key")?,
        value: bytes_of(v, "value")?,
        lease: int_of(v, "lease")?,
        prev_kv: bool_of(v, "prev_kv"),
        ignore_value: bool_of(v, "ignore_value"),
        ignore_lease: bool_of(v, "ignore_lease"),
    })
}

fn delete_req(v: &Value) -> Result<pb::DeleteRangeRequest, Status> {
    Ok(pb::DeleteRangeRequest {
        key: bytes_of(v, "key")?,
        range_end: bytes_of(v, "range_end")?,
        prev_kv: bool_of(v, "prev_kv"),
    })
}

fn txn_req(v: &Value) -> Result<pb::TxnRequest, Status> {
    use pb::compare::TargetUnion;
    let list = |name: &str| -> Vec<Value> {
        field(v, name)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let compare = list("compare")
        .iter()
        .map(|c| {
            let target = enum_of(c, "target", &["VERSION", "CREATE", "MOD", "VALUE", "LEASE"])?;
            let union = if field(c, "version").is_some() {
                Some(TargetUnion::Version(int_of(c, "version")?))
            } else if field(c, "create_revision").is_some() {
                Some(TargetUnion::CreateRevision(int_of(c, "create_revision")?))
            } else if field(c, "mod_revision").is_some() {
                Some(TargetUnion::ModRevision(int_of(c, "mod_revision")?))
            } else if field(c, "value").is_some() {
                Some(TargetUnion::Value(bytes_of(c, "value")?))
            } else if field(c, "lease").is_some() {
                Some(TargetUnion::Lease(int_of(c, "lease")?))
            } else {
                None
            };
            Ok(pb::Compare {
                result: enum_of(c, "result", &["EQUAL", "GREATER", "LESS", "NOT_EQUAL"])?,
                target,
                key: bytes_of(c, "key")?,
                range_end: bytes_of(c, "range_end")?,
                target_union: union,
            })
        })
        .collect::<Result<_, Status>>()?;
    let ops = |name: &str| -> Result<Vec<pb::RequestOp>, Status> {
        list(name).iter().map(request_op).collect()
    };
    Ok(pb::TxnRequest {
        compare,
        success: ops("success")?,
        failure: ops("failure")?,
    })
}

fn request_op(v: &Value) -> Result<pb::RequestOp, Status> {
    use pb::request_op::Request as R;
    let request = if let Some(r) = field(v, "request_range") {
        R::RequestRange(range_req(r)?)
    } else if let Some(r) = field(v, "request_put") {
        R::RequestPut(put_req(r)?)
    } else if let Some(r) = field(v, "request_delete_range") {
        R::RequestDeleteRange(delete_req(r)?)
    } else if let Some(r) = field(v, "request_txn") {
        R::RequestTxn(txn_req(r)?)
    } else {
        return Err(Status::invalid_argument(
            "a txn op needs request_range, request_put, request_delete_range or request_txn",
        ));
    };
    Ok(pb::RequestOp {
        request: Some(request),
    })
}

pub(super) fn kv(kv: &mvccpb::KeyValue) -> Value {
    Obj::default()
        .bytes("key", &kv.key)
        .int("create_revision", kv.create_revision)
        .int("mod_revision", kv.mod_revision)
        .int("version", kv.version)
        .bytes("value", &kv.value)
        .int("lease", kv.lease)
        .done()
}

fn range_resp(r: &pb::RangeResponse) -> Value {
    Obj::default()
        .value("header", header(&r.header))
        .list("kvs", r.kvs.iter().map(kv).collect())
        .flag("more", r.more)
        .int("count", r.count)
        .done()
}

fn put_resp(r: &pb::PutResponse) -> Value {
    Obj::default()
        .value("header", header(&r.header))
        .value("prev_kv", r.prev_kv.as_ref().map(kv))
        .done()
}

fn delete_resp(r: &pb::DeleteRangeResponse) -> Value {
    Obj::default()
        .value("header", header(&r.header))
        .int("deleted", r.deleted)
        .list("prev_kvs", r.prev_kvs.iter().map(kv).collect())
        .done()
}

fn txn_resp(r: &pb::TxnResponse) -> Value {
    use pb::response_op::Response as R;
    let responses = r
        .responses
        .iter()
        .map(|op| match &op.response {
            Some(R::ResponseRange(r)) => json!({ "response_range": range_resp(r) }),
            Some(R::ResponsePut(r)) => json!({ "response_put": put_resp(r) }),
            Some(R::ResponseDeleteRange(r)) => {
                json!({ "response_delete_range": delete_resp(r) })
            }
            Some(R::ResponseTxn(r)) => json!({ "response_txn": txn_resp(r) }),
            None => json!({}),
        })
        .collect();
    Obj::default()
        .value("header", header(&r.header))
        .flag("succeeded", r.succeeded)
        .list("responses", responses)
        .done()
}

async fn range(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let kv = KvService { node: g.core };
    unary(&headers, &body, range_req, |r| kv.range(r), range_resp).await
}

async fn put(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let kv = KvService { node: g.core };
    unary(&headers, &body, put_req, |r| kv.put(r), put_resp).await
}

async fn delete_range(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let kv = KvService { node: g.core };
    unary(
        &headers,
        &body,
        delete_req,
        |r| kv.delete_range(r),
        delete_resp,
    )
    .await
}

async fn txn(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let kv = KvService { node: g.core };
    unary(&headers, &body, txn_req, |r| kv.txn(r), txn_resp).await
}

async fn compaction(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let kv = KvService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::CompactionRequest {
            revision: int_of(v, "revision")?,
            physical: bool_of(v, "physical"),
        })
    };
    let write = |r: &pb::CompactionResponse| header_only(&r.header);
    unary(&headers, &body, build, |r| kv.compact(r), write).await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn fields_are_read_by_proto_or_camel_case_names() {
        let v = json!({"range_end": "YQ==", "rangeEnd": "Yg==", "createRevision": "5"});
        // The proto name first, as grpc-gateway takes it.
        assert_eq!(bytes_of(&v, "range_end").unwrap().as_ref(), b"a");
        assert_eq!(int_of(&v, "create_revision").unwrap(), 5);
        assert_eq!(field(&v, "key"), None);
        // A txn as Go's jsonpb writes it by default (etcd's e2e curl test sends this).
        let txn = txn_req(&json!({
            "compare": [{"key": "Zm9v", "target": "CREATE", "createRevision": "0"}],
            "success": [{"requestPut": {"key": "Zm9v", "value": "YmFy"}}]
        }))
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
