//! The Cluster service (`/v3/cluster/member/...`): adding, removing, updating, listing and
//! promoting members.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{MethodRouter, post};
use bytes::Bytes;
use serde_json::Value;

use super::call::{Gateway, empty, unary};
use super::json::{Obj, bool_of, header, texts, texts_of, uint_of};
use crate::etcd::ClusterService;
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::cluster_server::Cluster;

/// The paths this service answers at, under `/v3` and `/v3beta`.
pub(super) fn rpcs() -> Vec<(&'static str, MethodRouter<Gateway>)> {
    vec![
        ("cluster/member/add", post(member_add)),
        ("cluster/member/remove", post(member_remove)),
        ("cluster/member/update", post(member_update)),
        ("cluster/member/list", post(member_list)),
        ("cluster/member/promote", post(member_promote)),
    ]
}

fn member(m: &pb::Member) -> Value {
    Obj::default()
        .uint("ID", m.id)
        .text("name", &m.name)
        .list("peerURLs", texts(&m.peer_ur_ls))
        .list("clientURLs", texts(&m.client_ur_ls))
        .flag("isLearner", m.is_learner)
        .done()
}

/// A member-change response: `{"header", "members"}`.
fn members(h: &Option<pb::ResponseHeader>, members: &[pb::Member]) -> Value {
    Obj::default()
        .value("header", header(h))
        .list("members", members.iter().map(member).collect())
        .done()
}

async fn member_add(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let c = ClusterService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::MemberAddRequest {
            peer_ur_ls: texts_of(v, "peerURLs")?,
            is_learner: bool_of(v, "isLearner"),
        })
    };
    let write = |r: &pb::MemberAddResponse| {
        Obj::default()
            .value("header", header(&r.header))
            .value("member", r.member.as_ref().map(member))
            .list("members", r.members.iter().map(member).collect())
            .done()
    };
    unary(&headers, &body, build, |r| c.member_add(r), write).await
}

async fn member_remove(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let c = ClusterService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::MemberRemoveRequest {
            id: uint_of(v, "ID")?,
        })
    };
    let write = |r: &pb::MemberRemoveResponse| members(&r.header, &r.members);
    unary(&headers, &body, build, |r| c.member_remove(r), write).await
}

async fn member_update(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let c = ClusterService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::MemberUpdateRequest {
            id: uint_of(v, "ID")?,
            peer_ur_ls: texts_of(v, "peerURLs")?,
        })
    };
    let write = |r: &pb::MemberUpdateResponse| members(&r.header, &r.members);
    unary(&headers, &body, build, |r| c.member_update(r), write).await
}

async fn member_list(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let c = ClusterService { node: g.core };
    let write = |r: &pb::MemberListResponse| members(&r.header, &r.members);
    unary(&headers, &body, empty, |r| c.member_list(r), write).await
}

async fn member_promote(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let c = ClusterService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::MemberPromoteRequest {
            id: uint_of(v, "ID")?,
        })
    };
    let write = |r: &pb::MemberPromoteResponse| members(&r.header, &r.members);
    unary(&headers, &body, build, |r| c.member_promote(r), write).await
}
