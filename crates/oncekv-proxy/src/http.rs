//! The proxy's HTTP routes: `/metrics` (Prometheus text) and `/health` (etcd's body), on
//! the gRPC port and on `--metrics-addr`.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use oncekv_client::CallKind;
use oncekv_proto::etcdserverpb::RangeRequest;
use oncekv_proto::etcdserverpb::kv_client::KvClient;

use crate::upstream::Upstream;

/// `/metrics` and `/health`.
pub(crate) fn routes(upstream: Arc<Upstream>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .with_state(upstream)
}

async fn metrics(State(upstream): State<Arc<Upstream>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        upstream.metrics.render(),
    )
}

/// etcd's proxy answers healthy when a linearizable read through it succeeds.
async fn health(State(upstream): State<Arc<Upstream>>) -> impl IntoResponse {
    let healthy = async {
        let client = upstream.client_for_token(None).ok()?;
        let read = upstream.call(
            client,
            CallKind::Read,
            "health",
            RangeRequest {
                key: "health".into(),
                ..Default::default()
            },
            |ch, r| async move { Ok(KvClient::new(ch).range(r).await?.into_inner()) },
        );
        tokio::time::timeout(Duration::from_secs(3), read)
            .await
            .ok()?
            .ok()
    }
    .await
    .is_some();
    let (code, body) = if healthy {
        (StatusCode::OK, r#"{"health":"true"}"#)
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, r#"{"health":"false"}"#)
    };
    (code, [(header::CONTENT_TYPE, "application/json")], body)
}
