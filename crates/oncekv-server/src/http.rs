//! HTTP beside gRPC on the client port, as etcd serves it: `/metrics`, `/health`,
//! `/livez`, `/readyz` and `/version`. The same routes serve `--listen-metrics-urls`.
//!
//! Also the layer that counts gRPC calls for `/metrics` (grpc-go's
//! `grpc_server_started_total` and `grpc_server_handled_total`).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use http_body::Frame;

use crate::metrics::{GrpcCall, SharedMetrics, grpc_code_name};
use crate::request_path::NodeCore;

/// The HTTP routes of one member.
pub fn routes(core: Arc<NodeCore>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/version", get(version))
        .with_state(core)
}

/// What a path no route serves gets: gRPC's "unimplemented" for a gRPC request (what
/// tonic answers), and Go's plain 404 for anything else, as etcd's HTTP mux.
pub async fn not_found(req: axum::extract::Request) -> Response {
    let grpc = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if grpc {
        tonic::Status::unimplemented("").into_http::<axum::body::Body>()
    } else {
        (StatusCode::NOT_FOUND, "404 page not found\n").into_response()
    }
}

async fn metrics(State(core): State<Arc<NodeCore>>) -> Response {
    let text = core.node_metrics().render(&core.scrape());
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
        )],
        text,
    )
        .into_response()
}

async fn version() -> Response {
    // etcd's answer: the server's release, and the cluster's version as major.minor.0.
    let cluster = format!("{}.0", crate::compat::ETCD_CLUSTER_VERSION);
    json(
        StatusCode::OK,
        serde_json::json!({ "etcdserver": crate::compat::ETCD_API_VERSION, "etcdcluster": cluster }),
    )
}

fn json(status: StatusCode, body: serde_json::Value) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body.to_string(),
    )
        .into_response()
}

/// Why `/health` answered false (an oncekv header; etcd 3.4's body has no reason).
const HEALTH_REASON: &str = "x-oncekv-health-reason";

/// etcd's `/health`: `{"health":"true"}` with 200 when no alarm is raised, the member
/// has a leader, and a linearizable read succeeds within a second; otherwise
/// `{"health":"false"}` with 503 and the reason in [`HEALTH_REASON`].
#[derive(Debug, serde::Deserialize, Default)]
struct HealthQuery {
    /// `?cluster`: every member's health, asked by this one (oncekv's; etcdctl's
    /// `endpoint health --cluster` as one request).
    cluster: Option<String>,
}

async fn health(State(core): State<Arc<NodeCore>>, Query(q): Query<HealthQuery>) -> Response {
    if q.cluster.is_some() {
        return match crate::fanout::cluster_health(&core).await {
            Ok(()) => json(StatusCode::OK, serde_json::json!({ "health": "true" })),
            Err(report) => {
                let members: serde_json::Map<String, serde_json::Value> = report
                    .into_iter()
                    .map(|(id, r)| (format!("{id:x}"), serde_json::Value::String(r)))
                    .collect();
                json(
                    StatusCode::SERVICE_UNAVAILABLE,
                    serde_json::json!({
                        "health": "false",
                        "reason": "not every member is healthy",
                        "members": members,
                    }),
                )
            }
        };
    }
    // etcd 3.4's body exactly (scripts match it as a string); the reason, which 3.4 does
    // not give, goes in a header of oncekv's own and the log.
    match crate::fanout::own_health(&core).await {
        Ok(()) => json(StatusCode::OK, serde_json::json!({ "health": "true" })),
        Err(reason) => {
            tracing::warn!(%reason, "/health error");
            let mut response = json(
                StatusCode::SERVICE_UNAVAILABLE,
                serde_json::json!({ "health": "false" }),
            );
            if let Ok(value) = HeaderValue::from_str(&reason) {
                response.headers_mut().insert(HEALTH_REASON, value);
            }
            response
        }
    }
}

#[derive(Debug, serde::Deserialize, Default)]
struct CheckQuery {
    verbose: Option<String>,
    /// A check to skip (`?exclude=linearizable_read`), as etcd 3.6's `/readyz`.
    #[serde(default)]
    exclude: Option<String>,
}

/// The result of named checks, in etcd 3.6's (Kubernetes') `/livez` and `/readyz` form:
/// `ok` when all pass, and otherwise (or with `?verbose`) one line per check and a
/// summary; 503 when one failed.
fn checks(what: &str, results: Vec<(&str, Option<Result<(), String>>)>, verbose: bool) -> Response {
    let failed = results.iter().any(|(_, r)| matches!(r, Some(Err(_))));
    if !failed && !verbose {
        return (StatusCode::OK, "ok").into_response();
    }
    let mut out = String::new();
    for (name, r) in &results {
        match r {
            None => out.push_str(&format!("[+]{name} excluded: ok\n")),
            Some(Ok(())) => out.push_str(&format!("[+]{name} ok\n")),
            Some(Err(e)) => out.push_str(&format!("[-]{name} failed: {e}\n")),
        }
    }
    if failed {
        out.push_str(&format!("{what} check failed\n"));
        (StatusCode::SERVICE_UNAVAILABLE, out).into_response()
    } else {
        out.push_str(&format!("{what} check passed\n"));
        (StatusCode::OK, out).into_response()
    }
}

/// Whether this member's process is alive: its applied state can be read.
async fn livez(State(core): State<Arc<NodeCore>>, Query(q): Query<CheckQuery>) -> Response {
    let serializable = if q.exclude.as_deref() == Some("serializable_read") {
        None
    } else {
        Some(serializable_read(&core))
    };
    checks(
        "livez",
        vec![("serializable_read", serializable)],
        q.verbose.is_some(),
    )
}

fn serializable_read(core: &NodeCore) -> Result<(), String> {
    let req = oncekv_core::RangeRequest {
        range: oncekv_core::KeyRange::single(Bytes::from_static(b"health")),
        limit: 1,
        ..Default::default()
    };
    core.applied()
        .read()
        .sm
        .range(&req)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Whether this member should get traffic: no CORRUPT alarm, and serializable and
/// linearizable reads succeed.
async fn readyz(State(core): State<Arc<NodeCore>>, Query(q): Query<CheckQuery>) -> Response {
    let skip = |name: &str| q.exclude.as_deref() == Some(name);
    let corruption = (!skip("data_corruption")).then(|| {
        match core
            .alarms()
            .iter()
            .any(|(_, a)| *a == oncekv_core::AlarmKind::Corrupt)
        {
            true => Err("CORRUPT alarm raised".to_string()),
            false => Ok(()),
        }
    });
    let serializable = (!skip("serializable_read")).then(|| serializable_read(&core));
    let linearizable = if skip("linearizable_read") {
        None
    } else {
        Some(crate::fanout::linearizable_read(&core).await)
    };
    checks(
        "readyz",
        vec![
            ("data_corruption", corruption),
            ("serializable_read", serializable),
            ("linearizable_read", linearizable),
        ],
        q.verbose.is_some(),
    )
}

/// Counts every gRPC call for `/metrics`: started when the request arrives, handled with
/// its status code when the response ends.
#[derive(Debug, Clone)]
pub struct GrpcMetricsLayer {
    pub metrics: SharedMetrics,
}

impl<S> tower::Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetricsService {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct GrpcMetricsService<S> {
    inner: S,
    metrics: SharedMetrics,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for GrpcMetricsService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
{
    type Response = http::Response<CountedBody<ResBody>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        let mut call = GrpcCall::from_path(req.uri().path());
        if let Some(call) = &mut call {
            self.metrics.grpc_started(call);
        }
        let metrics = self.metrics.clone();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            let pending = call.map(|call| {
                // A trailers-only response (an immediate error) has its status in the
                // headers.
                match grpc_status(resp.headers()) {
                    Some(code) => {
                        metrics.grpc_handled(&call, grpc_code_name(code));
                        None
                    }
                    None => Some((metrics, call)),
                }
            });
            Ok(resp.map(|body| CountedBody {
                inner: Box::pin(body),
                pending: pending.flatten(),
            }))
        })
    }
}

fn grpc_status(headers: &http::HeaderMap) -> Option<i32> {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// A response body that records the call's status from its trailers when they pass (or
/// `Canceled` if the body is dropped first: the client went away).
pub struct CountedBody<B> {
    inner: Pin<Box<B>>,
    pending: Option<(SharedMetrics, GrpcCall)>,
}

impl<B> std::fmt::Debug for CountedBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountedBody").finish_non_exhaustive()
    }
}

impl<B> Drop for CountedBody<B> {
    fn drop(&mut self) {
        if let Some((metrics, call)) = self.pending.take() {
            metrics.grpc_handled(&call, "Canceled");
        }
    }
}

impl<B: http_body::Body<Data = Bytes>> http_body::Body for CountedBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let polled = self.inner.as_mut().poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(code) = frame.trailers_ref().and_then(grpc_status)
                    && let Some((metrics, call)) = self.pending.take()
                {
                    metrics.grpc_handled(&call, grpc_code_name(code));
                }
            }
            Poll::Ready(None) => {
                // Ended without trailers: not a well-formed gRPC response.
                if let Some((metrics, call)) = self.pending.take() {
                    metrics.grpc_handled(&call, "Unknown");
                }
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
