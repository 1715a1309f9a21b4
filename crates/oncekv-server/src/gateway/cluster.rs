//! The Cluster service (`/v3/cluster/member/...`): adding, removing, updating, listing and
//! promoting members.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{MethodRouter, post};
use bytes::Bytes;

use super::call::{Gateway, unary};
use crate::etcd::ClusterService;
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

async fn member_add(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let c = ClusterService { node: g.core };
    unary(&headers, &body, |r| c.member_add(r)).await
}

async fn member_remove(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let c = ClusterService { node: g.core };
    unary(&headers, &body, |r| c.member_remove(r)).await
}

async fn member_update(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let c = ClusterService { node: g.core };
    unary(&headers, &body, |r| c.member_update(r)).await
}

async fn member_list(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let c = ClusterService { node: g.core };
    unary(&headers, &body, |r| c.member_list(r)).await
}

async fn member_promote(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let c = ClusterService { node: g.core };
    unary(&headers, &body, |r| c.member_promote(r)).await
}
