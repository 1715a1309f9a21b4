//! What the proxy counts, and its HTTP routes: `/metrics` (Prometheus text) and
//! `/health` (etcd's body), on the gRPC port and on `--metrics-addr`.

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
use prometheus::{Encoder, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};

use crate::upstream::Upstream;

/// The proxy's counters. Names start `oncekv_proxy_`.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    /// Relayed unary calls, by method.
    pub(crate) requests: IntCounterVec,
    /// Writes whose outcome the proxy could not learn within its retry budget.
    pub(crate) outcome_unknown: IntCounter,
    /// Watchers downstream clients hold on the proxy.
    pub(crate) downstream_watchers: IntGauge,
    /// Watch streams the proxy holds on the cluster (coalesced ones count once).
    pub(crate) upstream_watches: IntGauge,
    /// Keep-alives answered from another caller's keep-alive of the same lease.
    pub(crate) keepalives_coalesced: IntCounter,
    /// Keep-alives sent to the cluster.
    pub(crate) keepalives_sent: IntCounter,
    /// Clients toward the cluster (one per downstream auth token).
    pub(crate) upstream_clients: IntGauge,
}

impl Metrics {
    pub(crate) fn new() -> Arc<Metrics> {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "oncekv_proxy_requests_total",
                "Unary calls relayed to the cluster, by method.",
            ),
            &["method"],
        )
        .unwrap_or_else(|e| unreachable_metric(e));
        let counter = |name: &str, help: &str| {
            IntCounter::new(name, help).unwrap_or_else(|e| unreachable_metric(e))
        };
        let gauge = |name: &str, help: &str| {
            IntGauge::new(name, help).unwrap_or_else(|e| unreachable_metric(e))
        };
        let metrics = Metrics {
            requests,
            outcome_unknown: counter(
                "oncekv_proxy_outcome_unknown_total",
                "Writes whose outcome the proxy could not learn (answered 'request timed out').",
            ),
            downstream_watchers: gauge(
                "oncekv_proxy_downstream_watchers",
                "Watchers held by downstream clients.",
            ),
            upstream_watches: gauge(
                "oncekv_proxy_upstream_watches",
                "Watches the proxy holds on the cluster (coalesced watchers share one).",
            ),
            keepalives_coalesced: counter(
                "oncekv_proxy_lease_keepalives_coalesced_total",
                "Lease keep-alives answered from a concurrent keep-alive of the same lease.",
            ),
            keepalives_sent: counter(
                "oncekv_proxy_lease_keepalives_sent_total",
                "Lease keep-alives sent to the cluster.",
            ),
            upstream_clients: gauge(
                "oncekv_proxy_upstream_clients",
                "Clients toward the cluster, one per downstream auth token.",
            ),
            registry,
        };
        let r = &metrics.registry;
        let collectors: [Box<dyn prometheus::core::Collector>; 7] = [
            Box::new(metrics.requests.clone()),
            Box::new(metrics.outcome_unknown.clone()),
            Box::new(metrics.downstream_watchers.clone()),
            Box::new(metrics.upstream_watches.clone()),
            Box::new(metrics.keepalives_coalesced.clone()),
            Box::new(metrics.keepalives_sent.clone()),
            Box::new(metrics.upstream_clients.clone()),
        ];
        for c in collectors {
            // Names are distinct constants: registration cannot collide.
            let _ = r.register(c);
        }
        Arc::new(metrics)
    }

    /// The Prometheus text exposition of every metric.
    pub(crate) fn render(&self) -> String {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8_lossy(&out).into_owned()
    }
}

/// The metric definitions above are constants known to be valid; prometheus only refuses
/// invalid names or label sets.
fn unreachable_metric(e: prometheus::Error) -> ! {
    panic!("oncekv-proxy: invalid metric definition: {e}")
}

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
