//! The Maintenance service (`/v3/maintenance/...`): alarms, status, defragment, hashes,
//! leadership transfer, and the snapshot as a stream of lines.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{MethodRouter, post};
use bytes::Bytes;

use super::call::{Gateway, request, unary};
use super::json::parse;
use super::reply::{error, lines};
use crate::etcd::MaintenanceService;
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::maintenance_server::Maintenance;

/// The paths this service answers at, under `/v3` and `/v3beta`.
pub(super) fn rpcs() -> Vec<(&'static str, MethodRouter<Gateway>)> {
    vec![
        ("maintenance/alarm", post(alarm)),
        ("maintenance/status", post(status)),
        ("maintenance/defragment", post(defragment)),
        ("maintenance/hash", post(hash)),
        ("maintenance/hashkv", post(hash_kv)),
        ("maintenance/snapshot", post(snapshot)),
        ("maintenance/transfer-leadership", post(move_leader)),
    ]
}

async fn alarm(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let m = MaintenanceService { node: g.core };
    unary(&headers, &body, |r| m.alarm(r)).await
}

async fn status(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let m = MaintenanceService { node: g.core };
    unary(&headers, &body, |r| m.status(r)).await
}

async fn defragment(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let m = MaintenanceService { node: g.core };
    unary(&headers, &body, |r| m.defragment(r)).await
}

async fn hash(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let m = MaintenanceService { node: g.core };
    unary(&headers, &body, |r| m.hash(r)).await
}

async fn hash_kv(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let m = MaintenanceService { node: g.core };
    unary(&headers, &body, |r| m.hash_kv(r)).await
}

async fn move_leader(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let m = MaintenanceService { node: g.core };
    unary(&headers, &body, |r| m.move_leader(r)).await
}

/// `POST /v3/maintenance/snapshot`: the database file as `{"result": {"blob", ...}}`
/// lines, one per chunk.
async fn snapshot(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let m = MaintenanceService { node: g.core };
    let chunks = async {
        let req: pb::SnapshotRequest = parse(&body)?;
        m.snapshot(request(&headers, req)).await
    };
    match chunks.await {
        Ok(chunks) => lines(chunks.into_inner()),
        Err(s) => error(&s),
    }
}
