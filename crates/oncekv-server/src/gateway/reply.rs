//! How an answer goes back: a JSON body, a stream of `{"result": ...}` lines, and a gRPC
//! status as etcd 3.4's grpc-gateway writes it (its HTTP status and error object).

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde::Serialize;
use serde_json::{Value, json};
use tonic::Status;

use super::json::to_json;

/// grpc-gateway's HTTP status for a gRPC code.
fn http_status(code: tonic::Code) -> StatusCode {
    use tonic::Code as C;
    match code {
        C::Ok => StatusCode::OK,
        C::InvalidArgument | C::OutOfRange => StatusCode::BAD_REQUEST,
        // grpc-gateway v1's mapping, which etcd 3.4 uses (v2 changed it to 400).
        C::FailedPrecondition => StatusCode::PRECONDITION_FAILED,
        C::NotFound => StatusCode::NOT_FOUND,
        C::AlreadyExists | C::Aborted => StatusCode::CONFLICT,
        C::PermissionDenied => StatusCode::FORBIDDEN,
        C::Unauthenticated => StatusCode::UNAUTHORIZED,
        C::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        C::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        C::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        C::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        C::Cancelled => StatusCode::REQUEST_TIMEOUT,
        C::Unknown | C::Internal | C::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

pub(super) fn error(status: &Status) -> Response {
    let body = json!({
        "error": status.message(),
        "message": status.message(),
        "code": status.code() as i32,
    });
    reply(http_status(status.code()), body)
}

fn reply(status: StatusCode, body: Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

pub(super) fn answer(result: Result<Value, Status>) -> Response {
    match result {
        Ok(v) => reply(StatusCode::OK, v),
        Err(s) => error(&s),
    }
}

/// A streaming answer: each response as a `{"result": ...}` line, a failure as
/// grpc-gateway's `{"error": ...}` line.
pub(super) fn lines<T: Serialize + 'static>(
    responses: impl Stream<Item = Result<T, Status>> + Send + 'static,
) -> Response {
    // The first error is the last line, as a gRPC status ends a call (a service may go on
    // yielding after an error of its request stream).
    let lines = responses.scan(false, move |failed, r| {
        if *failed {
            return futures::future::ready(None);
        }
        let r = r.and_then(|resp| to_json(&resp));
        *failed = r.is_err();
        let v = match r {
            Ok(resp) => json!({ "result": resp }),
            Err(s) => {
                let http = http_status(s.code());
                json!({ "error": {
                    "grpc_code": s.code() as i32,
                    "http_code": http.as_u16(),
                    "message": s.message(),
                    "http_status": http.canonical_reason().unwrap_or_default(),
                } })
            }
        };
        futures::future::ready(Some(Ok::<_, std::convert::Infallible>(Bytes::from(
            format!("{v}\n"),
        ))))
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(lines),
    )
        .into_response()
}
