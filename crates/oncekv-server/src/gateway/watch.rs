//! `POST /v3/watch`: a body of watch requests read as they come, the watch stream's
//! responses written back as lines.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{MethodRouter, post};
use futures::StreamExt;
use serde_json::Value;
use tonic::Status;

use super::body_stream::{KEEP_ALIVE_OBJECT_MAX, json_objects};
use super::call::Gateway;
use super::json::from_value;
use super::reply::{error, lines};
use crate::pb::etcdserverpb as pb;

/// The paths this service answers at, under `/v3` and `/v3beta`.
pub(super) fn rpcs() -> Vec<(&'static str, MethodRouter<Gateway>)> {
    vec![("watch", post(watch))]
}

/// `POST /v3/watch` with one or more `{"create_request": ...}`, `{"cancel_request": ...}`
/// or `{"progress_request": {}}` objects in the body: the watch stream's responses as
/// `{"result": ...}` lines, until the client goes away. As with etcd's gateway the body
/// is read as it comes, so a client may hold it open and create or cancel watches later,
/// and the watches go on after it ends. A malformed first object is a 400; a later one
/// ends the stream with an error line.
async fn watch(State(g): State<Gateway>, headers: HeaderMap, body: Body) -> Response {
    // A create request carries its key and range end in base64: up to 4/3 of the largest
    // request, and the field names.
    let limit = g.core.config().max_request_bytes / 3 * 4 + KEEP_ALIVE_OBJECT_MAX;
    let mut requests = Box::pin(
        json_objects(body, limit)
            .fuse()
            .map(|v| v.and_then(watch_req)),
    );
    let first = match requests.next().await {
        Some(Ok(first)) => first,
        Some(Err(s)) => return error(&s),
        None => {
            return error(&Status::invalid_argument(
                "expected {\"create_request\": {...}} in the body",
            ));
        }
    };
    // The watch task ends quietly at an error of its request stream (a gRPC client sees
    // its call fail); here the error is kept and written as the stream's last line.
    let failed = Arc::new(std::sync::Mutex::new(None::<Status>));
    let keep = failed.clone();
    let requests = futures::stream::iter([Ok(first)]).chain(requests.inspect(move |r| {
        if let (Err(s), Ok(mut slot)) = (r, keep.lock()) {
            *slot = Some(s.clone());
        }
    }));
    let caller = crate::auth::Caller::of_http(&headers);
    let responses = crate::etcd::watch_stream(g.core, g.stop, Box::pin(requests), false, caller);
    let last = futures::stream::once(async move {
        failed.lock().ok().and_then(|mut slot| slot.take()).map(Err)
    })
    .filter_map(futures::future::ready);
    lines(responses.chain(last))
}

/// One request of a watch stream, as grpc-gateway reads `WatchRequest` from JSON; one
/// that asks for nothing is refused.
fn watch_req(v: Value) -> Result<pb::WatchRequest, Status> {
    let req: pb::WatchRequest = from_value(v)?;
    if req.request_union.is_none() {
        return Err(Status::invalid_argument(
            "expected {\"create_request\": {...}}, {\"cancel_request\": {...}} or {\"progress_request\": {}}",
        ));
    }
    Ok(req)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    // A watch body's requests: create, cancel and progress, as grpc-gateway reads them.
    #[test]
    fn watch_requests_are_read_as_the_gateway_reads_them() {
        use pb::watch_request::RequestUnion;
        let create = watch_req(json!({"create_request": {
            "key": "YQ==", "range_end": "Yg==", "start_revision": "3",
            "filters": ["NODELETE"], "prev_kv": true, "watch_id": 9}}))
        .unwrap();
        match create.request_union {
            Some(RequestUnion::CreateRequest(c)) => {
                assert_eq!((&c.key[..], &c.range_end[..]), (&b"a"[..], &b"b"[..]));
                assert_eq!((c.start_revision, c.watch_id), (3, 9));
                assert_eq!(c.filters, [1]);
                assert!(c.prev_kv && !c.progress_notify);
            }
            other => panic!("{other:?}"),
        }
        let cancel = watch_req(json!({"cancel_request": {"watch_id": "9"}})).unwrap();
        assert!(matches!(
            cancel.request_union,
            Some(RequestUnion::CancelRequest(pb::WatchCancelRequest {
                watch_id: 9
            }))
        ));
        let progress = watch_req(json!({"progress_request": {}})).unwrap();
        assert!(matches!(
            progress.request_union,
            Some(RequestUnion::ProgressRequest(_))
        ));
        assert!(watch_req(json!({})).is_err());
        assert!(watch_req(json!({"create_request": null})).is_err());
        assert!(watch_req(json!({"create_request": {"key": "%%"}})).is_err());
    }
}
