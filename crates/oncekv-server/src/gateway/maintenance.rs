//! The Maintenance service (`/v3/maintenance/...`): alarms, status, defragment, hashes,
//! leadership transfer, and the snapshot as a stream of lines.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{MethodRouter, post};
use bytes::Bytes;
use serde_json::Value;

use super::call::{Gateway, empty, request, unary};
use super::json::{Obj, enum_of, header, header_only, int_of, parse, texts, uint_of};
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

const ALARM_ACTIONS: &[&str] = &["GET", "ACTIVATE", "DEACTIVATE"];

const ALARM_TYPES: &[&str] = &["NONE", "NOSPACE", "CORRUPT"];

async fn alarm(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let m = MaintenanceService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::AlarmRequest {
            action: enum_of(v, "action", ALARM_ACTIONS)?,
            member_id: uint_of(v, "memberID")?,
            alarm: enum_of(v, "alarm", ALARM_TYPES)?,
        })
    };
    let write = |r: &pb::AlarmResponse| {
        let alarms = r
            .alarms
            .iter()
            .map(|a| {
                Obj::default()
                    .uint("memberID", a.member_id)
                    .enumerated("alarm", a.alarm, ALARM_TYPES)
                    .done()
            })
            .collect();
        Obj::default()
            .value("header", header(&r.header))
            .list("alarms", alarms)
            .done()
    };
    unary(&headers, &body, build, |r| m.alarm(r), write).await
}

async fn status(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let m = MaintenanceService { node: g.core };
    let write = |r: &pb::StatusResponse| {
        Obj::default()
            .value("header", header(&r.header))
            .text("version", &r.version)
            .int("dbSize", r.db_size)
            .uint("leader", r.leader)
            .uint("raftIndex", r.raft_index)
            .uint("raftTerm", r.raft_term)
            .uint("raftAppliedIndex", r.raft_applied_index)
            .list("errors", texts(&r.errors))
            .int("dbSizeInUse", r.db_size_in_use)
            .flag("isLearner", r.is_learner)
            .done()
    };
    unary(&headers, &body, empty, |r| m.status(r), write).await
}

async fn defragment(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let m = MaintenanceService { node: g.core };
    let write = |r: &pb::DefragmentResponse| header_only(&r.header);
    unary(&headers, &body, empty, |r| m.defragment(r), write).await
}

async fn hash(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let m = MaintenanceService { node: g.core };
    let write = |r: &pb::HashResponse| {
        Obj::default()
            .value("header", header(&r.header))
            .uint32("hash", r.hash)
            .done()
    };
    unary(&headers, &body, empty, |r| m.hash(r), write).await
}

async fn hash_kv(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let m = MaintenanceService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::HashKvRequest {
            revision: int_of(v, "revision")?,
        })
    };
    let write = |r: &pb::HashKvResponse| {
        Obj::default()
            .value("header", header(&r.header))
            .uint32("hash", r.hash)
            .int("compact_revision", r.compact_revision)
            .done()
    };
    unary(&headers, &body, build, |r| m.hash_kv(r), write).await
}

async fn move_leader(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let m = MaintenanceService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::MoveLeaderRequest {
            target_id: uint_of(v, "targetID")?,
        })
    };
    let write = |r: &pb::MoveLeaderResponse| header_only(&r.header);
    unary(&headers, &body, build, |r| m.move_leader(r), write).await
}

/// `POST /v3/maintenance/snapshot`: the database file as `{"result": {"blob", ...}}`
/// lines, one per chunk.
async fn snapshot(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let m = MaintenanceService { node: g.core };
    let chunks = async {
        parse(&body)?;
        m.snapshot(request(&headers, pb::SnapshotRequest {})).await
    };
    match chunks.await {
        Ok(chunks) => lines(chunks.into_inner(), |c| {
            Obj::default()
                .value("header", header(&c.header))
                .uint("remaining_bytes", c.remaining_bytes)
                .bytes("blob", &c.blob)
                .done()
        }),
        Err(s) => error(&s),
    }
}
