//! The Lease service (`/v3/lease/...`, and the older `/v3/kv/lease/...` paths etcd 3.4
//! keeps): grant, revoke, time-to-live, the list, and keep-alives as a stream of lines.

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{MethodRouter, post};
use bytes::Bytes;
use futures::StreamExt;

use super::body_stream::{KEEP_ALIVE_OBJECT_MAX, grpc_frame, json_objects};
use super::call::{Gateway, request, unary};
use super::json::from_value;
use super::reply::{error, lines};
use crate::etcd::LeaseService;
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::lease_server::Lease;

/// The paths this service answers at, under `/v3` and `/v3beta`.
pub(super) fn rpcs() -> Vec<(&'static str, MethodRouter<Gateway>)> {
    vec![
        ("lease/grant", post(lease_grant)),
        ("lease/revoke", post(lease_revoke)),
        ("kv/lease/revoke", post(lease_revoke)),
        ("lease/keepalive", post(lease_keep_alive)),
        ("lease/timetolive", post(lease_time_to_live)),
        ("kv/lease/timetolive", post(lease_time_to_live)),
        ("lease/leases", post(lease_leases)),
        ("kv/lease/leases", post(lease_leases)),
    ]
}

async fn lease_grant(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let lease = LeaseService {
        node: g.core,
        stop: g.stop,
    };
    unary(&headers, &body, |r| lease.lease_grant(r)).await
}

async fn lease_revoke(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let lease = LeaseService {
        node: g.core,
        stop: g.stop,
    };
    unary(&headers, &body, |r| lease.lease_revoke(r)).await
}

async fn lease_time_to_live(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let lease = LeaseService {
        node: g.core,
        stop: g.stop,
    };
    unary(&headers, &body, |r| lease.lease_time_to_live(r)).await
}

async fn lease_leases(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let lease = LeaseService {
        node: g.core,
        stop: g.stop,
    };
    unary(&headers, &body, |r| lease.lease_leases(r)).await
}

/// `POST /v3/lease/keepalive` with one or more `{"ID": ...}` objects in the body: a
/// `{"result": ...}` line per keep-alive, in order, from the service's keep-alive stream.
/// The body is read as it comes, as etcd's gateway reads it: a client may hold one
/// request open and send a keep-alive whenever its lease needs one, each answered at
/// once. A malformed first object is a 400 (nothing was answered yet); a later one ends
/// the stream with an error line.
async fn lease_keep_alive(State(g): State<Gateway>, headers: HeaderMap, body: Body) -> Response {
    use tonic::codec::Codec as _;
    // Fused: when the body held no object, the chain below polls it again after its end.
    let mut requests = Box::pin(
        json_objects(body, KEEP_ALIVE_OBJECT_MAX)
            .fuse()
            .map(|v| v.and_then(from_value::<pb::LeaseKeepAliveRequest>)),
    );
    let first = match requests.next().await {
        Some(Ok(first)) => Some(first),
        Some(Err(s)) => return error(&s),
        None => None,
    };
    let frames = futures::stream::iter(first.map(Ok))
        .chain(requests)
        .map(|r| r.map(|req| http_body::Frame::data(grpc_frame(&req))));
    let decoder = oncekv_proto::codec::Codec::<
        pb::LeaseKeepAliveResponse,
        pb::LeaseKeepAliveRequest,
    >::default()
    .decoder();
    let requests =
        tonic::Streaming::new_request(decoder, http_body_util::StreamBody::new(frames), None, None);
    let lease = LeaseService {
        node: g.core,
        stop: g.stop,
    };
    match lease.lease_keep_alive(request(&headers, requests)).await {
        Ok(responses) => lines(responses.into_inner()),
        Err(s) => error(&s),
    }
}
