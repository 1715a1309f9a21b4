//! etcd's v3lock service (`/v3/lock/lock`, `/v3/lock/unlock`).

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{MethodRouter, post};
use bytes::Bytes;
use serde_json::Value;

use super::call::{Gateway, unary};
use super::json::{Obj, bytes_of, header, header_only, int_of};
use crate::etcd::LockService;
use crate::pb::v3lockpb as lockpb;
use crate::pb::v3lockpb::lock_server::Lock;

/// The paths this service answers at, under `/v3` and `/v3beta`.
pub(super) fn rpcs() -> Vec<(&'static str, MethodRouter<Gateway>)> {
    vec![("lock/lock", post(lock)), ("lock/unlock", post(unlock))]
}

/// `{"name", "lease"}` → `{"header", "key"}`, once the lock is the caller's: the request
/// waits for its turn, as etcd's does.
async fn lock(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let l = LockService { node: g.core };
    let build = |v: &Value| {
        Ok(lockpb::LockRequest {
            name: bytes_of(v, "name")?,
            lease: int_of(v, "lease")?,
        })
    };
    let write = |r: &lockpb::LockResponse| {
        Obj::default()
            .value("header", header(&r.header))
            .bytes("key", &r.key)
            .done()
    };
    unary(&headers, &body, build, |r| l.lock(r), write).await
}

async fn unlock(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let l = LockService { node: g.core };
    let build = |v: &Value| {
        Ok(lockpb::UnlockRequest {
            key: bytes_of(v, "key")?,
        })
    };
    let write = |r: &lockpb::UnlockResponse| header_only(&r.header);
    unary(&headers, &body, build, |r| l.unlock(r), write).await
}
