//! The Auth service (`/v3/auth/...`): turning auth on and off, authenticating, and the
//! users and roles with their permissions.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{MethodRouter, post};
use bytes::Bytes;
use serde_json::Value;
use tonic::Status;

use super::call::{Gateway, empty, unary};
use super::json::{Obj, bool_of, bytes_of, enum_of, header, header_only, text_of, texts};
use crate::etcd::AuthService;
use crate::pb::authpb;
use crate::pb::etcdserverpb as pb;
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

const PERM_TYPES: &[&str] = &["READ", "WRITE", "READWRITE"];

fn permission(p: &authpb::Permission) -> Value {
    Obj::default()
        .enumerated("permType", p.perm_type, PERM_TYPES)
        .bytes("key", &p.key)
        .bytes("range_end", &p.range_end)
        .done()
}

async fn auth_enable(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let write = |r: &pb::AuthEnableResponse| header_only(&r.header);
    unary(&headers, &body, empty, |r| auth.auth_enable(r), write).await
}

async fn auth_disable(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let write = |r: &pb::AuthDisableResponse| header_only(&r.header);
    unary(&headers, &body, empty, |r| auth.auth_disable(r), write).await
}

async fn auth_status(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let write = |r: &pb::AuthStatusResponse| {
        Obj::default()
            .value("header", header(&r.header))
            .flag("enabled", r.enabled)
            .uint("authRevision", r.auth_revision)
            .done()
    };
    unary(&headers, &body, empty, |r| auth.auth_status(r), write).await
}

/// `{"name", "password"}` → `{"header", "token"}`; the token then goes in the
/// `Authorization` header of later requests, as with etcd's gateway.
async fn authenticate(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::AuthenticateRequest {
            name: text_of(v, "name")?,
            password: text_of(v, "password")?,
        })
    };
    let write = |r: &pb::AuthenticateResponse| {
        Obj::default()
            .value("header", header(&r.header))
            .text("token", &r.token)
            .done()
    };
    unary(&headers, &body, build, |r| auth.authenticate(r), write).await
}

async fn user_add(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let build = |v: &Value| {
        let options = v.get("options").filter(|o| !o.is_null());
        Ok(pb::AuthUserAddRequest {
            name: text_of(v, "name")?,
            password: text_of(v, "password")?,
            options: options.map(|o| authpb::UserAddOptions {
                no_password: bool_of(o, "no_password"),
            }),
            hashed_password: text_of(v, "hashedPassword")?,
        })
    };
    let write = |r: &pb::AuthUserAddResponse| header_only(&r.header);
    unary(&headers, &body, build, |r| auth.user_add(r), write).await
}

async fn user_get(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::AuthUserGetRequest {
            name: text_of(v, "name")?,
        })
    };
    let write = |r: &pb::AuthUserGetResponse| {
        Obj::default()
            .value("header", header(&r.header))
            .list("roles", texts(&r.roles))
            .done()
    };
    unary(&headers, &body, build, |r| auth.user_get(r), write).await
}

async fn user_list(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let write = |r: &pb::AuthUserListResponse| {
        Obj::default()
            .value("header", header(&r.header))
            .list("users", texts(&r.users))
            .done()
    };
    unary(&headers, &body, empty, |r| auth.user_list(r), write).await
}

async fn user_delete(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::AuthUserDeleteRequest {
            name: text_of(v, "name")?,
        })
    };
    let write = |r: &pb::AuthUserDeleteResponse| header_only(&r.header);
    unary(&headers, &body, build, |r| auth.user_delete(r), write).await
}

async fn user_change_password(
    State(g): State<Gateway>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let auth = AuthService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::AuthUserChangePasswordRequest {
            name: text_of(v, "name")?,
            password: text_of(v, "password")?,
            hashed_password: text_of(v, "hashedPassword")?,
        })
    };
    let write = |r: &pb::AuthUserChangePasswordResponse| header_only(&r.header);
    unary(
        &headers,
        &body,
        build,
        |r| auth.user_change_password(r),
        write,
    )
    .await
}

async fn user_grant_role(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::AuthUserGrantRoleRequest {
            user: text_of(v, "user")?,
            role: text_of(v, "role")?,
        })
    };
    let write = |r: &pb::AuthUserGrantRoleResponse| header_only(&r.header);
    unary(&headers, &body, build, |r| auth.user_grant_role(r), write).await
}

async fn user_revoke_role(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::AuthUserRevokeRoleRequest {
            name: text_of(v, "name")?,
            role: text_of(v, "role")?,
        })
    };
    let write = |r: &pb::AuthUserRevokeRoleResponse| header_only(&r.header);
    unary(&headers, &body, build, |r| auth.user_revoke_role(r), write).await
}

async fn role_add(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::AuthRoleAddRequest {
            name: text_of(v, "name")?,
        })
    };
    let write = |r: &pb::AuthRoleAddResponse| header_only(&r.header);
    unary(&headers, &body, build, |r| auth.role_add(r), write).await
}

async fn role_get(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::AuthRoleGetRequest {
            role: text_of(v, "role")?,
        })
    };
    let write = |r: &pb::AuthRoleGetResponse| {
        Obj::default()
            .value("header", header(&r.header))
            .list("perm", r.perm.iter().map(permission).collect())
            .done()
    };
    unary(&headers, &body, build, |r| auth.role_get(r), write).await
}

async fn role_list(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let write = |r: &pb::AuthRoleListResponse| {
        Obj::default()
            .value("header", header(&r.header))
            .list("roles", texts(&r.roles))
            .done()
    };
    unary(&headers, &body, empty, |r| auth.role_list(r), write).await
}

async fn role_delete(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::AuthRoleDeleteRequest {
            role: text_of(v, "role")?,
        })
    };
    let write = |r: &pb::AuthRoleDeleteResponse| header_only(&r.header);
    unary(&headers, &body, build, |r| auth.role_delete(r), write).await
}

/// `{"name", "perm": {"permType", "key", "range_end"}}`.
async fn role_grant_permission(
    State(g): State<Gateway>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let auth = AuthService { node: g.core };
    let build = |v: &Value| {
        let perm = v.get("perm").filter(|p| !p.is_null());
        let perm = perm
            .map(|p| -> Result<_, Status> {
                Ok(authpb::Permission {
                    perm_type: enum_of(p, "permType", PERM_TYPES)?,
                    key: bytes_of(p, "key")?,
                    range_end: bytes_of(p, "range_end")?,
                })
            })
            .transpose()?;
        Ok(pb::AuthRoleGrantPermissionRequest {
            name: text_of(v, "name")?,
            perm,
        })
    };
    let write = |r: &pb::AuthRoleGrantPermissionResponse| header_only(&r.header);
    unary(
        &headers,
        &body,
        build,
        |r| auth.role_grant_permission(r),
        write,
    )
    .await
}

async fn role_revoke_permission(
    State(g): State<Gateway>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let auth = AuthService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::AuthRoleRevokePermissionRequest {
            role: text_of(v, "role")?,
            key: bytes_of(v, "key")?,
            range_end: bytes_of(v, "range_end")?,
        })
    };
    let write = |r: &pb::AuthRoleRevokePermissionResponse| header_only(&r.header);
    unary(
        &headers,
        &body,
        build,
        |r| auth.role_revoke_permission(r),
        write,
    )
    .await
}
