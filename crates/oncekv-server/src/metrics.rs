//! A member's Prometheus metrics, served at `/metrics` on the client port (and on
//! `--listen-metrics-urls`).
//!
//! Where etcd has a metric with the same meaning, it has etcd's name, type and buckets, so
//! dashboards and alerts written for etcd read oncekv unchanged. oncekv's own
//! (exactly-once) metrics are under `oncekv_`.
//!
//! Most figures are read from raft and the applied state when scraped
//! ([`NodeMetrics::render`]); only events that leave no trace in that state (an fsync's
//! duration, a leader change seen, a gRPC call) are counted as they happen. Every member
//! of one process (`oncekv dev`) has its own registry.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use oncekv_core::SessionError;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The content type of [`NodeMetrics::render`]'s text (Prometheus text format 0.0.4).
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// One member's metrics.
#[derive(Debug)]
pub struct NodeMetrics {
    registry: Registry,
    has_leader: IntGauge,
    is_leader: IntGauge,
    leader_changes: IntCounter,
    proposals_committed: IntGauge,
    proposals_applied: IntGauge,
    proposals_pending: IntGauge,
    proposals_failed: IntCounter,
    read_rounds: IntCounter,
    lease_reads: IntCounter,
    wal_fsync: Histogram,
    snapshot_save: Histogram,
    db_total_size: IntGauge,
    db_in_use: IntGauge,
    keys: IntGauge,
    current_revision: IntGauge,
    compact_revision: IntGauge,
    leases: IntGauge,
    grpc_started: IntCounterVec,
    grpc_handled: IntCounterVec,
    /// With `--metrics extensive` (etcd's flag): how long each gRPC call took.
    grpc_handling: Option<HistogramVec>,
    sessions: IntGauge,
    duplicates: MonotonicCounter,
    executed: MonotonicCounter,
    puts: MonotonicCounter,
    deletes: MonotonicCounter,
    session_errors: Vec<MonotonicCounter>,
    saved_replies: IntGauge,
    saved_reply_bytes: IntGauge,
    in_flight: IntGauge,
}

/// A Prometheus counter that follows a count kept elsewhere (the state machine's): it adds
/// what the source gained since the last scrape. The source can restart from zero (its
/// counters are not replicated, and a snapshot install replaces the state machine); the
/// counter then adds the new count instead of going backwards.
#[derive(Debug)]
struct MonotonicCounter {
    counter: IntCounter,
    last: AtomicU64,
}

impl MonotonicCounter {
    fn follow(&self, now: u64) {
        let last = self.last.swap(now, Ordering::Relaxed);
        let gained = if now >= last { now - last } else { now };
        self.counter.inc_by(gained);
    }
}

/// etcd's buckets for disk durations: 1 ms to about 8 s, doubling.
fn disk_buckets() -> Vec<f64> {
    prometheus::exponential_buckets(0.001, 2.0, 14).unwrap_or_default()
}

impl NodeMetrics {
    /// A registry with every metric registered. Registration fails only for a name
    /// registered twice, which is a programming error caught by the tests.
    pub fn new() -> Result<NodeMetrics, prometheus::Error> {
        NodeMetrics::with_handling_times(false)
    }

    /// [`NodeMetrics::new`], with `grpc_server_handling_seconds` when `extensive` (etcd's
    /// `--metrics extensive`: a clock read per call, and a histogram per method).
    pub fn with_handling_times(extensive: bool) -> Result<NodeMetrics, prometheus::Error> {
        let registry = Registry::new();
        let r = &registry;
        let gauge = |name: &str, help: &str| -> Result<IntGauge, prometheus::Error> {
            let g = IntGauge::new(name, help)?;
            r.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let counter = |name: &str, help: &str| -> Result<IntCounter, prometheus::Error> {
            let c = IntCounter::new(name, help)?;
            r.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let histogram = |name: &str, help: &str| -> Result<Histogram, prometheus::Error> {
            let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(disk_buckets()))?;
            r.register(Box::new(h.clone()))?;
            Ok(h)
        };
        let follow = |name: &str, help: &str| -> Result<MonotonicCounter, prometheus::Error> {
            Ok(MonotonicCounter {
                counter: counter(name, help)?,
                last: AtomicU64::new(0),
            })
        };

        // etcd's version gauges: one series, labeled with the version, set to 1.
        let labeled_one = |name: &str, help: &str, label: &str, value: &str| {
            let g = IntGaugeVec::new(Opts::new(name, help), &[label])?;
            r.register(Box::new(g.clone()))?;
            g.with_label_values(&[value]).set(1);
            Ok::<_, prometheus::Error>(())
        };
        labeled_one(
            "etcd_server_version",
            "Which version is running. 1 for 'server_version' label with current version.",
            "server_version",
            crate::compat::ETCD_API_VERSION,
        )?;
        labeled_one(
            "etcd_cluster_version",
            "Which version is running. 1 for 'cluster_version' label with current cluster version",
            "cluster_version",
            crate::compat::ETCD_CLUSTER_VERSION,
        )?;

        let grpc_labels = ["grpc_type", "grpc_service", "grpc_method"];
        let grpc_started = IntCounterVec::new(
            Opts::new(
                "grpc_server_started_total",
                "Total number of RPCs started on the server.",
            ),
            &grpc_labels,
        )?;
        r.register(Box::new(grpc_started.clone()))?;
        let grpc_handled = IntCounterVec::new(
            Opts::new(
                "grpc_server_handled_total",
                "Total number of RPCs completed on the server, regardless of success or failure.",
            ),
            &["grpc_type", "grpc_service", "grpc_method", "grpc_code"],
        )?;
        r.register(Box::new(grpc_handled.clone()))?;
        let grpc_handling = if extensive {
            // Prometheus's default buckets, as etcd's (go-grpc-prometheus) histogram has.
            let h = HistogramVec::new(
                HistogramOpts::new(
                    "grpc_server_handling_seconds",
                    "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
                ),
                &grpc_labels,
            )?;
            r.register(Box::new(h.clone()))?;
            Some(h)
        } else {
            None
        };

        let session_errors_vec = IntCounterVec::new(
            Opts::new(
                "oncekv_session_errors_total",
                "Tracked requests this member's state machine refused, by reason: an expired or unknown session, a wrong secret, a stale seq, a seq past the window, a seq reused for another request.",
            ),
            &["kind"],
        )?;
        r.register(Box::new(session_errors_vec.clone()))?;
        let session_errors = SessionError::KINDS
            .iter()
            .map(|kind| MonotonicCounter {
                counter: session_errors_vec.with_label_values(&[kind]),
                last: AtomicU64::new(0),
            })
            .collect();

        #[cfg(target_os = "linux")]
        r.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;

        Ok(NodeMetrics {
            has_leader: gauge(
                "etcd_server_has_leader",
                "Whether or not a leader exists. 1 is existence, 0 is not.",
            )?,
            is_leader: gauge(
                "etcd_server_is_leader",
                "Whether or not this member is a leader. 1 if is, 0 otherwise.",
            )?,
            leader_changes: counter(
                "etcd_server_leader_changes_seen_total",
                "The number of leader changes seen.",
            )?,
            proposals_committed: gauge(
                "etcd_server_proposals_committed_total",
                "The total number of consensus proposals committed.",
            )?,
            proposals_applied: gauge(
                "etcd_server_proposals_applied_total",
                "The total number of consensus proposals applied.",
            )?,
            proposals_pending: gauge(
                "etcd_server_proposals_pending",
                "The current number of pending proposals to commit.",
            )?,
            proposals_failed: counter(
                "etcd_server_proposals_failed_total",
                "The total number of failed proposals seen.",
            )?,
            read_rounds: counter(
                "oncekv_read_index_rounds_total",
                "Leadership confirmations this member ran as leader for linearizable reads (each a round of heartbeats a quorum answered, shared by the reads waiting for it).",
            )?,
            lease_reads: counter(
                "oncekv_lease_reads_total",
                "Linearizable reads (or followers' read-index requests) this leader answered under its leader lease, without a round (--leader-lease-reads).",
            )?,
            wal_fsync: histogram(
                "etcd_disk_wal_fsync_duration_seconds",
                "The latency distributions of fsync called by WAL.",
            )?,
            snapshot_save: histogram(
                "etcd_debugging_snap_save_total_duration_seconds",
                "The total latency distributions of save called by snapshot.",
            )?,
            db_total_size: gauge(
                "etcd_mvcc_db_total_size_in_bytes",
                "Total size of the underlying database physically allocated in bytes.",
            )?,
            db_in_use: gauge(
                "etcd_mvcc_db_total_size_in_use_in_bytes",
                "Total size of the underlying database logically in use in bytes.",
            )?,
            keys: gauge("etcd_debugging_mvcc_keys_total", "Total number of keys.")?,
            current_revision: gauge(
                "etcd_debugging_mvcc_current_revision",
                "The current revision of store.",
            )?,
            compact_revision: gauge(
                "etcd_debugging_mvcc_compact_revision",
                "The revision of the last compaction in store.",
            )?,
            leases: gauge(
                "etcd_debugging_lease_total",
                "The number of leases granted and not yet revoked or expired.",
            )?,
            sessions: gauge(
                "oncekv_sessions",
                "Client sessions registered and not yet closed or expired.",
            )?,
            duplicates: follow(
                "oncekv_duplicates_absorbed_total",
                "Tracked requests this member's state machine answered with the saved response instead of executing them again.",
            )?,
            executed: follow(
                "oncekv_tracked_executed_total",
                "Tracked requests this member's state machine executed (once each).",
            )?,
            puts: follow(
                "etcd_mvcc_put_total",
                "Total number of puts seen by this member.",
            )?,
            deletes: follow(
                "etcd_mvcc_delete_total",
                "Total number of deletes seen by this member.",
            )?,
            session_errors,
            saved_replies: gauge(
                "oncekv_saved_replies",
                "Responses saved for retries across all sessions.",
            )?,
            saved_reply_bytes: gauge(
                "oncekv_saved_reply_bytes",
                "Encoded size of the saved responses (what they take in a snapshot).",
            )?,
            in_flight: gauge(
                "oncekv_requests_in_flight",
                "Tracked requests being proposed through this member (retries joined to them included).",
            )?,
            grpc_started,
            grpc_handled,
            grpc_handling,
            registry,
        })
    }

    /// Called by the log writer after each fdatasync of the log.
    pub fn observe_fsync(&self, took: Duration) {
        self.wal_fsync.observe(took.as_secs_f64());
    }

    /// Called after each snapshot file is written and synced.
    pub fn observe_snapshot_save(&self, took: Duration) {
        self.snapshot_save.observe(took.as_secs_f64());
    }

    /// Called when this member sees the leader change (a new leader or none).
    pub fn leader_changed(&self) {
        self.leader_changes.inc();
    }

    /// A leadership confirmation for reads succeeded on this leader.
    pub fn read_round(&self) {
        self.read_rounds.inc();
    }

    /// A read was answered under the leader lease.
    pub fn lease_read(&self) {
        self.lease_reads.inc();
    }

    /// Called when a proposal this member made fails (timeout, lost leadership).
    pub fn proposal_failed(&self) {
        self.proposals_failed.inc();
    }

    /// A gRPC call started: counted, and its start time kept when calls are timed.
    pub fn grpc_started(&self, call: &mut GrpcCall) {
        self.grpc_started
            .with_label_values(&[call.kind, call.service, call.method])
            .inc();
        if self.times_grpc() {
            call.started = Some(std::time::Instant::now());
        }
    }

    /// Whether calls are timed (`--metrics extensive`).
    pub fn times_grpc(&self) -> bool {
        self.grpc_handling.is_some()
    }

    /// A gRPC call finished with `code` (its `grpc-status`, as a name).
    pub fn grpc_handled(&self, call: &GrpcCall, code: &str) {
        self.grpc_handled
            .with_label_values(&[call.kind, call.service, call.method, code])
            .inc();
        if let (Some(h), Some(started)) = (&self.grpc_handling, call.started) {
            h.with_label_values(&[call.kind, call.service, call.method])
                .observe(started.elapsed().as_secs_f64());
        }
    }

    /// The text exposition of every metric, after setting the scrape-time ones from
    /// `now`.
    pub fn render(&self, now: &Scrape) -> String {
        self.refresh(now);
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::warn!("encoding metrics: {e}");
        }
        String::from_utf8(out).unwrap_or_default()
    }

    fn refresh(&self, now: &Scrape) {
        self.has_leader.set(i64::from(now.has_leader));
        self.is_leader.set(i64::from(now.is_leader));
        // openraft reports what this member knows to be committed only through what it
        // has applied, and the log's end; what is in the log past the applied index is
        // what is pending.
        self.proposals_committed.set(now.applied_index as i64);
        self.proposals_applied.set(now.applied_index as i64);
        self.proposals_pending
            .set(now.last_log_index.saturating_sub(now.applied_index) as i64);
        self.in_flight.set(now.in_flight as i64);

        self.db_total_size.set(now.db_size as i64);
        self.db_in_use.set(now.db_size as i64);
        self.keys.set(now.keys as i64);
        self.current_revision.set(now.revision);
        self.compact_revision.set(now.compacted_revision);
        self.leases.set(now.leases as i64);
        self.sessions.set(now.sessions as i64);
        self.duplicates.follow(now.stats.duplicates);
        self.executed.follow(now.stats.executed);
        self.puts.follow(now.stats.puts);
        self.deletes.follow(now.stats.deleted_keys);
        for (counter, n) in self.session_errors.iter().zip(now.stats.rejected_by_kind) {
            counter.follow(n);
        }
        self.saved_replies.set(now.saved_replies as i64);
        self.saved_reply_bytes.set(now.saved_reply_bytes as i64);
    }
}

/// The member's state the scrape-time metrics show, read at one moment by the node
/// (which owns it) and handed to [`NodeMetrics::render`].
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    pub has_leader: bool,
    pub is_leader: bool,
    pub applied_index: u64,
    pub last_log_index: u64,
    /// Tracked requests being proposed through this member.
    pub in_flight: usize,
    pub db_size: u64,
    pub keys: usize,
    pub revision: i64,
    pub compacted_revision: i64,
    pub leases: usize,
    pub sessions: usize,
    pub stats: oncekv_core::Stats,
    pub saved_replies: u64,
    pub saved_reply_bytes: u64,
}

/// Labels of one gRPC call, from its path. Only the services this server registers get
/// their own labels: a client sending made-up paths must not grow the registry.
#[derive(Debug, Clone, Copy)]
pub struct GrpcCall {
    pub kind: &'static str,
    pub service: &'static str,
    pub method: &'static str,
    /// When the call arrived, if calls are timed ([`NodeMetrics::times_grpc`]).
    pub started: Option<std::time::Instant>,
}

/// Every registered gRPC service, and its streaming methods with their gRPC type.
const SERVICES: &[(&str, &[(&str, &str)])] = &[
    ("etcdserverpb.KV", &[]),
    ("etcdserverpb.Watch", &[("Watch", "bidi_stream")]),
    ("etcdserverpb.Lease", &[("LeaseKeepAlive", "bidi_stream")]),
    ("etcdserverpb.Cluster", &[]),
    ("etcdserverpb.Maintenance", &[("Snapshot", "server_stream")]),
    ("etcdserverpb.Auth", &[]),
    ("v3lockpb.Lock", &[]),
    ("v3electionpb.Election", &[("Observe", "server_stream")]),
    ("oncekv.Session", &[]),
];

/// At most this many distinct method names per service get a label of their own.
const MAX_METHOD_LEN: usize = 64;

impl GrpcCall {
    /// The labels for a request to `path` (`/package.Service/Method`), or `None` for a
    /// path of a service not served here.
    pub fn from_path(path: &str) -> Option<GrpcCall> {
        let rest = path.strip_prefix('/')?;
        let (service, method) = rest.split_once('/')?;
        let (service, streams) = SERVICES.iter().find(|(s, _)| *s == service)?;
        if method.is_empty()
            || method.len() > MAX_METHOD_LEN
            || !method.bytes().all(|b| b.is_ascii_alphanumeric())
        {
            return None;
        }
        let kind = streams
            .iter()
            .find(|(m, _)| *m == method)
            .map_or("unary", |(_, k)| *k);
        Some(GrpcCall {
            kind,
            service,
            method: intern(method),
            started: None,
        })
    }
}

/// Method names as `'static` labels. The set is bounded: only methods of the services in
/// [`SERVICES`] reach here, and a made-up method of a real service is labeled
/// `unknown` once the table holds every real one.
fn intern(method: &str) -> &'static str {
    use std::sync::{Mutex, OnceLock};
    /// More than every real method of [`SERVICES`] put together.
    const MAX_METHODS: usize = 128;
    static NAMES: OnceLock<Mutex<Vec<&'static str>>> = OnceLock::new();
    let names = NAMES.get_or_init(|| Mutex::new(Vec::new()));
    let Ok(mut names) = names.lock() else {
        return "unknown";
    };
    if let Some(n) = names.iter().find(|n| **n == method) {
        return n;
    }
    if names.len() >= MAX_METHODS {
        return "unknown";
    }
    let leaked: &'static str = Box::leak(method.to_string().into_boxed_str());
    names.push(leaked);
    leaked
}

/// A shared handle, as nodes and the gRPC layer hold it.
pub type SharedMetrics = Arc<NodeMetrics>;

/// gRPC status codes by number, as grpc-go names them in `grpc_code` labels.
pub fn grpc_code_name(code: i32) -> &'static str {
    match code {
        0 => "OK",
        1 => "Canceled",
        2 => "Unknown",
        3 => "InvalidArgument",
        4 => "DeadlineExceeded",
        5 => "NotFound",
        6 => "AlreadyExists",
        7 => "PermissionDenied",
        8 => "ResourceExhausted",
        9 => "FailedPrecondition",
        10 => "Aborted",
        11 => "OutOfRange",
        12 => "Unimplemented",
        13 => "Internal",
        14 => "Unavailable",
        15 => "DataLoss",
        16 => "Unauthenticated",
        _ => "Unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_of_served_services_get_labels_and_others_none() {
        let call = GrpcCall::from_path("/etcdserverpb.KV/Range").expect("labels");
        assert_eq!(
            (call.kind, call.service, call.method),
            ("unary", "etcdserverpb.KV", "Range")
        );
        let watch = GrpcCall::from_path("/etcdserverpb.Watch/Watch").expect("labels");
        assert_eq!(watch.kind, "bidi_stream");
        assert!(GrpcCall::from_path("/evil.Service/Range").is_none());
        assert!(GrpcCall::from_path("/metrics").is_none());
        assert!(GrpcCall::from_path("/etcdserverpb.KV/Ra nge").is_none());
    }

    #[test]
    fn a_counter_following_a_restarted_source_never_goes_back() {
        let m = MonotonicCounter {
            counter: IntCounter::new("x_total", "x").expect("counter"),
            last: AtomicU64::new(0),
        };
        m.follow(10);
        m.follow(15);
        assert_eq!(m.counter.get(), 15);
        m.follow(3); // the source restarted (a snapshot install)
        assert_eq!(m.counter.get(), 18);
    }

    // --metrics extensive adds etcd's handling-time histogram, fed by timed calls.
    #[test]
    fn extensive_metrics_time_grpc_calls() {
        let basic = NodeMetrics::new().expect("registry");
        assert!(!basic.times_grpc());
        let m = NodeMetrics::with_handling_times(true).expect("registry");
        assert!(m.times_grpc());
        let mut call = GrpcCall::from_path("/etcdserverpb.KV/Put").expect("a KV call");
        m.grpc_started(&mut call);
        assert!(call.started.is_some());
        m.grpc_handled(&call, "OK");
        let families = m.registry.gather();
        let family = families
            .iter()
            .find(|f| f.name() == "grpc_server_handling_seconds")
            .expect("the histogram is registered");
        let histogram = family.get_metric()[0].get_histogram();
        assert_eq!(histogram.get_sample_count(), 1);
        assert!(
            !basic
                .registry
                .gather()
                .iter()
                .any(|f| f.name() == "grpc_server_handling_seconds")
        );
    }

    #[test]
    fn every_metric_registers_once() {
        let m = NodeMetrics::new().expect("registry");
        let names: Vec<String> = m
            .registry
            .gather()
            .iter()
            .map(|f| f.name().to_string())
            .collect();
        for want in [
            "etcd_server_has_leader",
            "etcd_server_leader_changes_seen_total",
            "etcd_server_proposals_committed_total",
            "etcd_disk_wal_fsync_duration_seconds",
            "etcd_mvcc_db_total_size_in_bytes",
            "oncekv_sessions",
            "oncekv_duplicates_absorbed_total",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
        }
    }
}
