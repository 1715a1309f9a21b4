//! etcd's JSON gateway: the v3 API as HTTP+JSON on the client port, for curl and clients
//! that speak no gRPC (`POST /v3/kv/put` and so on).
//!
//! The mapping is grpc-gateway's as etcd configures it: proto field names (`range_end`,
//! `create_revision`), bytes as base64, 64-bit integers as strings (numbers are taken
//! too), fields with zero values left out, enums by name or number. A watch, a lease
//! keep-alive and a snapshot are POSTs whose response is a stream of `{"result": ...}`
//! objects, one per line. Errors come as `{"error", "message", "code"}` with the HTTP
//! status etcd 3.4's grpc-gateway gives the gRPC code.
//!
//! etcd's v3lock and v3election services are served too (`/v3/lock/lock`,
//! `/v3/election/campaign` and so on, as etcd 3.4 registers them beside the KV gateway);
//! an election's observe is a stream of lines like a watch.
//!
//! Every request runs through the same service code as its gRPC twin. The oncekv session
//! headers (`oncekv-client-id`, `oncekv-session-secret`, `oncekv-seq`,
//! `oncekv-first-incomplete`) are passed on as gRPC metadata, so a gateway write can be
//! exactly-once too.
//!
//! The mapping is not written here: oncekv-proto's `json` feature generates serde impls for
//! the prost types with pbjson-build (proto field names kept), and `json` reads requests
//! and writes answers through them. `call` runs one RPC through its service, `reply`
//! writes answers and errors, `body_stream` reads bodies that stream; one file per service
//! holds its handlers and the paths they answer at.

mod auth;
mod body_stream;
mod call;
mod cluster;
mod election;
mod json;
mod kv;
mod lease;
mod lock;
mod maintenance;
mod reply;
mod slots;
mod watch;

use std::sync::Arc;

use axum::Router;

use crate::request_path::NodeCore;
use call::Gateway;

/// The gateway's routes: every v3 RPC at its path in etcd's `rpc.proto` (and the lock and
/// election services at theirs in `v3lock.proto` and `v3election.proto`), under `/v3` and
/// again under `/v3beta`, as etcd 3.4 serves them (it answers 404 under `/v3alpha`).
pub fn routes(core: Arc<NodeCore>, stop: tokio::sync::watch::Receiver<bool>) -> Router {
    let rpcs = [
        kv::rpcs(),
        watch::rpcs(),
        lease::rpcs(),
        cluster::rpcs(),
        maintenance::rpcs(),
        auth::rpcs(),
        lock::rpcs(),
        election::rpcs(),
    ];
    let mut router = Router::new();
    for (path, handler) in rpcs.into_iter().flatten() {
        router = router
            .route(&format!("/v3/{path}"), handler.clone())
            .route(&format!("/v3beta/{path}"), handler);
    }
    let limit = slots::slots(core.config().max_concurrent_streams);
    let router = router.with_state(Gateway { core, stop });
    match limit {
        Some(slots) => router.layer(axum::middleware::from_fn_with_state(slots, slots::limit)),
        None => router,
    }
}
