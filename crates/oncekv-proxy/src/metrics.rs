//! What the proxy counts (served as Prometheus text by [`crate::http`]).

use std::sync::Arc;

use prometheus::{Encoder, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};

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
