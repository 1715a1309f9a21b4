//! The Auth service (`/v3/auth/...`): turning auth on and off, authenticating, and the
//! users and roles with their permissions.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{MethodRouter, post};
use bytes::Bytes;

use super::call::{Gateway, unary};
use crate::etcd::AuthService;
use crate::pb::etcdserverpb::auth_server::Auth;

/// The paths this service answers at, under `/v3` and `/v3beta`.
pub(super) fn rpcs() -> Vec<(&'static str, MethodRouter<Gateway>)> {
    vec![
        ("auth/enable", post(auth_enable)),
        ("auth/disable", post(auth_disable)),
        ("auth/status", post(auth_status)),
        ("auth/authenticate", post(authenticate)),
        ("auth/user/add", post(user_add)),
        ("auth/user/get", post(user_get)),
        ("auth/user/list", post(user_list)),
        ("auth/user/delete", post(user_delete)),
        ("auth/user/changepw", post(user_change_password)),
        ("auth/user/grant", post(user_grant_role)),
        ("auth/user/revoke", post(user_revoke_role)),
        ("auth/role/add", post(role_add)),
        ("auth/role/get", post(role_get)),
        ("auth/role/list", post(role_list)),
        ("auth/role/delete", post(role_delete)),
        ("auth/role/grant", post(role_grant_permission)),
        ("auth/role/revoke", post(role_revoke_permission)),
    ]
}

async fn auth_enable(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    unary(&headers, &body, |r| auth.auth_enable(r)).await
}

async fn auth_disable(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    unary(&headers, &body, |r| auth.auth_disable(r)).await
}

async fn auth_status(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    unary(&headers, &body, |r| auth.auth_status(r)).await
}

/// `{"name", "password"}` → `{"header", "token"}`; the token then goes in the
/// `Authorization` header of later requests, as with etcd's gateway.
async fn authenticate(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    unary(&headers, &body, |r| auth.authenticate(r)).await
}

async fn user_add(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    unary(&headers, &body, |r| auth.user_add(r)).await
}

async fn user_get(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    unary(&headers, &body, |r| auth.user_get(r)).await
}

async fn user_list(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    unary(&headers, &body, |r| auth.user_list(r)).await
}

async fn user_delete(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    unary(&headers, &body, |r| auth.user_delete(r)).await
}

async fn user_change_password(
    State(g): State<Gateway>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let auth = AuthService { node: g.core };
    unary(&headers, &body, |r| auth.user_change_password(r)).await
}

async fn user_grant_role(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    unary(&headers, &body, |r| auth.user_grant_role(r)).await
}

async fn user_revoke_role(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    unary(&headers, &body, |r| auth.user_revoke_role(r)).await
}

async fn role_add(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    unary(&headers, &body, |r| auth.role_add(r)).await
}

async fn role_get(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    unary(&headers, &body, |r| auth.role_get(r)).await
}

async fn role_list(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    unary(&headers, &body, |r| auth.role_list(r)).await
}

async fn role_delete(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    unary(&headers, &body, |r| auth.role_delete(r)).await
}

/// `{"name", "perm": {"permType", "key", "range_end"}}`.
async fn role_grant_permission(
    State(g): State<Gateway>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let auth = AuthService { node: g.core };
    unary(&headers, &body, |r| auth.role_grant_permission(r)).await
}

async fn role_revoke_permission(
    State(g): State<Gateway>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let auth = AuthService { node: g.core };
    unary(&headers, &body, |r| auth.role_revoke_permission(r)).await
}
