//! etcd's v3lock service (`/v3/lock/lock`, `/v3/lock/unlock`).

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{MethodRouter, post};
use bytes::Bytes;

use super::call::{Gateway, unary};
use crate::etcd::LockService;
use crate::pb::v3lockpb::lock_server::Lock;

/// The paths this service answers at, under `/v3` and `/v3beta`.
pub(super) fn rpcs() -> Vec<(&'static str, MethodRouter<Gateway>)> {
    vec![("lock/lock", post(lock)), ("lock/unlock", post(unlock))]
}

/// `{"name", "lease"}` → `{"header", "key"}`, once the lock is the caller's: the request
/// waits for its turn, as etcd's does.
async fn lock(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let l = LockService { node: g.core };
    unary(&headers, &body, |r| l.lock(r)).await
}

async fn unlock(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let l = LockService { node: g.core };
    unary(&headers, &body, |r| l.unlock(r)).await
}
