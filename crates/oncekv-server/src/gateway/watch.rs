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
use super::json::{Obj, bool_of, bytes_of, field, header, int_of};
use super::kv::kv;
use super::reply::{error, lines};
use crate::pb::etcdserverpb as pb;
use crate::pb::mvccpb;

/// The paths this service answers at, under `/v3` and `/v3beta`.
pub(super) fn rpcs() -> Vec<(&'static str, MethodRouter<Gateway>)> {
    vec![("watch", post(watch))]
}

fn event(e: &mvccpb::Event) -> Value {
    let kind = if e.r#type == mvccpb::event::EventType::Delete as i32 {
        Some(Value::String("DELETE".into()))
    } else {
        None
    };
    Obj::default()
        .value("type", kind)
        .value("kv", e.kv.as_ref().map(kv))
        .value("prev_kv", e.prev_kv.as_ref().map(kv))
        .done()
}

fn watch_resp(r: &pb::WatchResponse) -> Value {
    Obj::default()
        .value("header", header(&r.header))
        .int("watch_id", r.watch_id)
        .flag("created", r.created)
        .flag("canceled", r.canceled)
        .int("compact_revision", r.compact_revision)
        .text("cancel_reason", &r.cancel_reason)
        .flag("fragment", r.fragment)
        .list("events", r.events.iter().map(event).collect())
        .done()
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
            .map(|v| v.and_then(|v| watch_req(&v))),
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
    lines(responses.chain(last), watch_resp)
}

/// One request of a watch stream, as grpc-gateway reads `WatchRequest` from JSON.
fn watch_req(v: &Value) -> Result<pb::WatchRequest, Status> {
    use pb::watch_request::RequestUnion;
    let given = |name: &str| field(v, name).filter(|f| !f.is_null());
    let union = if let Some(c) = given("create_request") {
        let filters = c
            .get("filters")
            .and_then(Value::as_array)
            .map(|fs| {
                fs.iter()
                    .map(|f| match f.as_str() {
                        Some("NOPUT") => 0,
                        Some("NODELETE") => 1,
                        _ => f.as_i64().unwrap_or(0) as i32,
                    })
                    .collect()
            })
            .unwrap_or_default();
        RequestUnion::CreateRequest(pb::WatchCreateRequest {
            key: bytes_of(c, "key")?,
            range_end: bytes_of(c, "range_end")?,
            start_revision: int_of(c, "start_revision")?,
            progress_notify: bool_of(c, "progress_notify"),
            filters,
            prev_kv: bool_of(c, "prev_kv"),
            watch_id: int_of(c, "watch_id")?,
            fragment: bool_of(c, "fragment"),
        })
    } else if let Some(c) = given("cancel_request") {
        RequestUnion::CancelRequest(pb::WatchCancelRequest {
            watch_id: int_of(c, "watch_id")?,
        })
    } else if given("progress_request").is_some() {
        RequestUnion::ProgressRequest(pb::WatchProgressRequest {})
    } else {
        return Err(Status::invalid_argument(
            "expected {\"create_request\": {...}}, {\"cancel_request\": {...}} or {\"progress_request\": {}}",
        ));
    };
    Ok(pb::WatchRequest {
        request_union: Some(union),
    })
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
        let create = watch_req(&json!({"create_request": {
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
        let cancel = watch_req(&json!({"cancel_request": {"watch_id": "9"}})).unwrap();
        assert!(matches!(
            cancel.request_union,
            Some(RequestUnion::CancelRequest(pb::WatchCancelRequest {
                watch_id: 9
            }))
        ));
        let progress = watch_req(&json!({"progress_request": {}})).unwrap();
        assert!(matches!(
            progress.request_union,
            Some(RequestUnion::ProgressRequest(_))
        ));
        assert!(watch_req(&json!({})).is_err());
        assert!(watch_req(&json!({"create_request": null})).is_err());
        assert!(watch_req(&json!({"create_request": {"key": "%%"}})).is_err());
    }
}
