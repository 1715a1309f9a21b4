//! One RPC through its service's gRPC code: the state every handler shares, the request
//! built with the HTTP headers passed on as gRPC metadata, and the unary round trip from
//! a JSON body to a JSON answer.

use std::sync::Arc;

use axum::http::{HeaderMap, header};
use axum::response::Response;
use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tonic::Status;

use super::json::{parse, to_json};
use super::reply::answer;
use crate::request_path::NodeCore;

/// What every handler is given: the member, and its stop signal, which ends the streams
/// (watch, keep-alive, observe) that would otherwise outlive it.
#[derive(Clone, Debug)]
pub(super) struct Gateway {
    pub(super) core: Arc<NodeCore>,
    pub(super) stop: watch::Receiver<bool>,
}

/// The session headers a gateway request may carry, passed on as gRPC metadata.
const SESSION_HEADERS: [&str; 4] = [
    oncekv_proto::metadata::CLIENT_ID_KEY,
    oncekv_proto::metadata::SECRET_KEY,
    oncekv_proto::metadata::SEQ_KEY,
    oncekv_proto::metadata::FIRST_INCOMPLETE_KEY,
];

pub(super) fn request<T>(headers: &HeaderMap, message: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    for name in SESSION_HEADERS {
        if let Some(v) = headers.get(name)
            && let Ok(v) = v.to_str()
            && let Ok(v) = v.parse()
        {
            req.metadata_mut().insert(name, v);
        }
    }
    // etcd's gateway takes the token from `Authorization` (with auth on).
    if let Some(token) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|t| t.trim_start_matches("Bearer ").parse().ok())
    {
        req.metadata_mut()
            .insert(crate::auth::TOKEN_METADATA, token);
    }
    req
}

/// One unary RPC: the body read as its request message, the request (the headers passed
/// on as metadata) run through the service's gRPC code by `call`, the answer written back
/// as JSON.
pub(super) async fn unary<Req, Resp, Fut>(
    headers: &HeaderMap,
    body: &Bytes,
    call: impl FnOnce(tonic::Request<Req>) -> Fut,
) -> Response
where
    Req: DeserializeOwned,
    Resp: Serialize,
    Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
{
    answer(
        async {
            let req = parse(body)?;
            let resp = call(request(headers, req)).await?.into_inner();
            to_json(&resp)
        }
        .await,
    )
}
