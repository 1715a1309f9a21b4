//! `oncekv bench`: a load generator that speaks the etcd v3 wire protocol, so the same tool
//! measures oncekv and etcd side by side (in the manner of etcd's own `benchmark` tool).
//!
//! `--clients` request loops share `--connections` gRPC channels, which are spread over the
//! endpoints (or all opened to the leader with `--leader-only`). Each request goes to a
//! random key of a fixed key space. The run stops after `--total` requests or `--duration`
//! seconds, whichever comes first; progress goes to stderr once a second and a summary
//! (throughput, latency percentiles, errors) to stdout at the end, as text or JSON.
//!
//! `--client tracked` (or `untracked`) sends the same requests through the oncekv Rust
//! client instead, to show what exactly-once sessions cost against the same cluster.
//!
//! `oncekv bench watch` ([`watch`]) measures watch fan-out instead: one writer, many
//! watchers of the key it writes. `oncekv bench compare` ([`compare`]) starts etcd and
//! oncekv clusters itself and runs these workloads against both, alternately.

mod compare;
mod watch;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Args, Subcommand, ValueEnum};
use oncekv_client::{ClientConfig, GetOptions};
use oncekv_proto::etcdserverpb::kv_client::KvClient;
use oncekv_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use oncekv_proto::etcdserverpb::{PutRequest, RangeRequest, StatusRequest};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::transport::{Channel, Endpoint};

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub kind: BenchKind,
}

#[derive(Debug, Subcommand)]
pub enum BenchKind {
    /// Put random keys of the key space (one value of --value-size bytes each).
    Put(PutArgs),
    /// Get random keys of the key space (linearizable unless --consistency s).
    Range(RangeArgs),
    /// One writer puts one key (or keys under a prefix) while many watchers watch it:
    /// events delivered per second, delivery latency, and every event exactly once.
    Watch(watch::WatchArgs),
    /// Start a 3-member etcd and a 3-member oncekv on this machine, run the put and range
    /// workloads against each in turn (alternating which goes first), and write a table
    /// and a chart of throughput and latency against the number of clients.
    Compare(compare::CompareArgs),
}

#[derive(Debug, Args)]
pub struct PutArgs {
    #[command(flatten)]
    pub common: Common,
    /// Size of each value, in bytes.
    #[arg(long, default_value_t = 256)]
    pub value_size: usize,
}

#[derive(Debug, Args)]
pub struct RangeArgs {
    #[command(flatten)]
    pub common: Common,
    /// l: linearizable (the default, as in etcd); s: serializable (served from the
    /// member's local state).
    #[arg(long, value_enum, default_value_t = Consistency::L)]
    pub consistency: Consistency,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Consistency {
    L,
    S,
}

/// What sends the requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ClientKind {
    /// Plain etcd v3 KV calls over the shared gRPC connections: what any etcd client
    /// sends (works against etcd and oncekv alike).
    Wire,
    /// The oncekv Rust client with exactly-once sessions: one client (one session) per
    /// connection, the loops sharing it; it sends every request to the leader.
    Tracked,
    /// The oncekv Rust client without sessions (etcd's semantics: a retried write may
    /// apply twice), for comparison with `tracked`.
    Untracked,
}

impl ClientKind {
    fn name(self) -> &'static str {
        match self {
            ClientKind::Wire => "wire",
            ClientKind::Tracked => "tracked",
            ClientKind::Untracked => "untracked",
        }
    }

    /// What `--connections` counts for this kind.
    fn connections(self) -> &'static str {
        match self {
            ClientKind::Wire => "connections",
            ClientKind::Tracked => "oncekv clients (exactly-once sessions)",
            ClientKind::Untracked => "oncekv clients (no sessions)",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WriteOut {
    Simple,
    Json,
}

/// Where every benchmark connects, and how it reports.
#[derive(Debug, Args)]
pub struct Target {
    /// Client endpoints (host:port or http://host:port), comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "127.0.0.1:2379,127.0.0.1:22379,127.0.0.1:32379"
    )]
    pub endpoints: Vec<String>,
    /// gRPC connections shared by the clients, or by the watch streams (default: one per
    /// endpoint given).
    #[arg(long)]
    pub connections: Option<usize>,
    /// Send every request (bench watch: every put) to the leader (found with
    /// Maintenance.Status) instead of spreading the connections over all endpoints.
    #[arg(long)]
    pub leader_only: bool,
    /// Per-request timeout, in seconds.
    #[arg(long, default_value_t = 10.0)]
    pub timeout: f64,
    /// A name for the target, repeated in the summary (e.g. "etcd" or "oncekv").
    #[arg(long)]
    pub label: Option<String>,
    /// Summary format.
    #[arg(short = 'w', long = "write-out", value_enum, default_value_t = WriteOut::Simple)]
    pub write_out: WriteOut,
}

impl Target {
    fn validate(&self) -> Result<(), String> {
        if self.endpoints.iter().all(|e| e.trim().is_empty()) {
            return Err("--endpoints: at least one endpoint is needed".into());
        }
        if self.endpoints.iter().any(|e| e.trim().is_empty()) {
            return Err("--endpoints: empty entry".into());
        }
        if self.connections == Some(0) {
            return Err("--connections must be at least 1".into());
        }
        Ok(())
    }

    /// The endpoints as URLs.
    fn urls(&self) -> Vec<String> {
        self.endpoints.iter().map(|e| url_of(e)).collect()
    }
}

/// Options shared by the put and range benchmarks.
#[derive(Debug, Args)]
pub struct Common {
    #[command(flatten)]
    pub target: Target,
    /// Concurrent request loops (each has one request outstanding at a time).
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// Stop after this many requests (0: no limit; then --duration is required).
    #[arg(long, default_value_t = 100_000)]
    pub total: u64,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Size of each key, in bytes (keys are zero-padded decimal numbers).
    #[arg(long, default_value_t = 8)]
    pub key_size: usize,
    /// Number of distinct keys requests are spread over.
    #[arg(long, default_value_t = 100_000)]
    pub key_space: u64,
    /// What sends the requests: the etcd wire protocol directly, or the oncekv client
    /// with (tracked) or without (untracked) exactly-once sessions.
    #[arg(long, value_enum, default_value_t = ClientKind::Wire)]
    pub client: ClientKind,
}

/// What each request does.
#[derive(Debug, Clone)]
enum Workload {
    Put { value: Bytes },
    Range { serializable: bool },
}

impl Workload {
    fn name(&self) -> &'static str {
        match self {
            Workload::Put { .. } => "put",
            Workload::Range { .. } => "range",
        }
    }
}

pub async fn run(args: BenchArgs) -> Result<(), String> {
    let (common, workload) = match args.kind {
        BenchKind::Put(p) => {
            let mut value = vec![0u8; p.value_size];
            rand::thread_rng().fill(&mut value[..]);
            (
                p.common,
                Workload::Put {
                    value: Bytes::from(value),
                },
            )
        }
        BenchKind::Range(r) => (
            r.common,
            Workload::Range {
                serializable: r.consistency == Consistency::S,
            },
        ),
        BenchKind::Watch(w) => return watch::run(w).await,
        BenchKind::Compare(c) => return compare::run(c).await,
    };
    let summary = measure(&common, workload, true).await?;
    match common.target.write_out {
        WriteOut::Simple => print!("{}", summary.text()),
        WriteOut::Json => println!("{}", summary.json()),
    }
    if summary.errors > 0 {
        return Err(format!(
            "{} of {} requests failed; the first: {}",
            summary.errors,
            summary.ok + summary.errors,
            summary.first_error.clone().unwrap_or_default()
        ));
    }
    if summary.ok == 0 {
        return Err("no request completed".into());
    }
    Ok(())
}

/// Runs one benchmark as `common` describes; requests that fail are counted in the
/// summary (an error here means the run could not start). `progress`: a line a second on
/// stderr.
async fn measure(common: &Common, workload: Workload, progress: bool) -> Result<Summary, String> {
    validate(common)?;
    let timeout = seconds("--timeout", common.target.timeout)?;
    let duration = common
        .duration
        .map(|s| seconds("--duration", s))
        .transpose()?;
    let endpoints: Vec<String> = common.target.urls();

    let targets = if common.target.leader_only {
        vec![find_leader(&endpoints, timeout).await?]
    } else {
        endpoints.clone()
    };
    let connections = common.target.connections.unwrap_or(endpoints.len());
    let mut drivers = Vec::with_capacity(connections);
    for i in 0..connections {
        drivers.push(match common.client {
            ClientKind::Wire => {
                let url = &targets[i % targets.len()];
                Driver::Wire(
                    KvClient::new(connect(url, Some(timeout)).await?)
                        .max_decoding_message_size(64 * 1024 * 1024),
                )
            }
            kind => {
                let mut config = if kind == ClientKind::Tracked {
                    ClientConfig::default()
                } else {
                    ClientConfig::untracked()
                };
                config.request_timeout = timeout;
                config.attempt_timeout = config.attempt_timeout.min(timeout);
                Driver::Oncekv(
                    oncekv_client::Client::connect(&targets, config)
                        .map_err(|e| format!("the oncekv client: {e}"))?,
                )
            }
        });
    }

    let shared = Arc::new(Shared {
        issued: AtomicU64::new(0),
        done: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        first_error: Mutex::new(None),
        stop: AtomicBool::new(false),
    });
    let plan = Arc::new(Plan {
        workload: workload.clone(),
        total: common.total,
        key_size: common.key_size,
        key_space: common.key_space,
    });

    let label = common
        .target
        .label
        .clone()
        .unwrap_or_else(|| targets.join(","));
    if progress {
        eprintln!(
            "bench {}: {} clients over {} {} to {}{}; {}",
            workload.name(),
            common.clients,
            connections,
            common.client.connections(),
            targets.join(","),
            if common.target.leader_only {
                " (the leader)"
            } else {
                ""
            },
            run_length(common.total, duration, "requests")
        );
    }

    let interrupt = {
        let shared = shared.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("bench: interrupted; finishing the requests in flight");
                shared.stop.store(true, Ordering::Relaxed);
            }
        })
    };
    let started = Instant::now();
    let deadline = duration.map(|d| started + d);
    let progress = progress.then(|| tokio::spawn(report_progress(shared.clone(), started)));
    let mut workers = Vec::with_capacity(common.clients);
    for i in 0..common.clients {
        workers.push(tokio::spawn(client_loop(
            plan.clone(),
            shared.clone(),
            drivers[i % drivers.len()].clone(),
            deadline,
            rand::random(),
        )));
    }
    let mut latencies: Vec<u64> = Vec::new();
    for w in workers {
        match w.await {
            Ok(mut l) => latencies.append(&mut l),
            Err(e) => shared.record_error(format!("client task failed: {e}")),
        }
    }
    let elapsed = started.elapsed();
    if let Some(progress) = progress {
        progress.abort();
    }
    interrupt.abort();

    let errors = shared.errors.load(Ordering::Relaxed);
    let first_error = shared.first_error.lock().ok().and_then(|g| g.clone());
    Ok(Summary::new(
        workload.name(),
        label,
        common,
        connections,
        elapsed,
        latencies,
        errors,
        first_error,
    ))
}

/// "N requests", "for S s" or "N requests or S s": how long a run goes on.
fn run_length(total: u64, duration: Option<Duration>, what: &str) -> String {
    match (total, duration) {
        (0, Some(d)) => format!("for {:.1} s", d.as_secs_f64()),
        (n, None) => format!("{n} {what}"),
        (n, Some(d)) => format!("{n} {what} or {:.1} s", d.as_secs_f64()),
    }
}

/// A positive number of seconds given as option `flag`.
fn seconds(flag: &str, s: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("{flag} {s}: expected a positive number"))
}

fn validate(c: &Common) -> Result<(), String> {
    c.target.validate()?;
    if c.clients == 0 {
        return Err("--clients must be at least 1".into());
    }
    if c.total == 0 && c.duration.is_none() {
        return Err("--total 0 (no limit) needs --duration".into());
    }
    if c.key_space == 0 {
        return Err("--key-space must be at least 1".into());
    }
    let digits = (c.key_space - 1).to_string().len();
    if c.key_size < digits {
        return Err(format!(
            "--key-size {} is too small for --key-space {} (keys are decimal: {digits} digits needed)",
            c.key_size, c.key_space
        ));
    }
    Ok(())
}

/// `host:port` → `http://host:port` (a URL is kept as given).
fn url_of(endpoint: &str) -> String {
    let e = endpoint.trim().trim_end_matches('/');
    if e.starts_with("http://") || e.starts_with("https://") {
        e.to_string()
    } else {
        format!("http://{e}")
    }
}

/// A channel to `url`; `timeout` bounds each request (a stream that lives for the whole
/// run, such as a watch, is opened on a channel without one).
async fn connect(url: &str, timeout: Option<Duration>) -> Result<Channel, String> {
    let mut endpoint = Endpoint::from_shared(url.to_string())
        .map_err(|e| format!("{url}: not a valid endpoint: {e}"))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true);
    if let Some(timeout) = timeout {
        endpoint = endpoint.timeout(timeout);
    }
    endpoint
        .connect()
        .await
        .map_err(|e| format!("connecting to {url}: {e}"))
}

/// Asks each endpoint for its status; the leader is the one whose member id is the leader
/// id it reports.
async fn find_leader(endpoints: &[String], timeout: Duration) -> Result<String, String> {
    let mut problems = Vec::new();
    for url in endpoints {
        let status = async {
            let channel = connect(url, Some(timeout)).await?;
            MaintenanceClient::new(channel)
                .status(StatusRequest {})
                .await
                .map(|r| r.into_inner())
                .map_err(|s| format!("{url}: status: {}", s.message()))
        }
        .await;
        match status {
            Ok(s) => {
                let member = s.header.map_or(0, |h| h.member_id);
                if member != 0 && member == s.leader {
                    return Ok(url.clone());
                }
            }
            Err(e) => problems.push(e),
        }
    }
    Err(format!(
        "--leader-only: no endpoint reports itself as the leader{}",
        if problems.is_empty() {
            String::new()
        } else {
            format!(" ({})", problems.join("; "))
        }
    ))
}

/// What every client loop shares (read-only).
#[derive(Debug)]
struct Plan {
    workload: Workload,
    total: u64,
    key_size: usize,
    key_space: u64,
}

/// Counters every client loop updates.
#[derive(Debug)]
struct Shared {
    /// Requests started (a client takes a ticket before sending).
    issued: AtomicU64,
    done: AtomicU64,
    errors: AtomicU64,
    first_error: Mutex<Option<String>>,
    stop: AtomicBool,
}

impl Shared {
    fn record_error(&self, message: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut first) = self.first_error.lock() {
            first.get_or_insert(message);
        }
    }
}

/// One client: a request at a time until the run is over. Returns its latencies (ns).
async fn client_loop(
    plan: Arc<Plan>,
    shared: Arc<Shared>,
    mut driver: Driver,
    deadline: Option<Instant>,
    seed: u64,
) -> Vec<u64> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut latencies = Vec::new();
    loop {
        if shared.stop.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        if plan.total > 0 && shared.issued.fetch_add(1, Ordering::Relaxed) >= plan.total {
            break;
        }
        let n = rng.gen_range(0..plan.key_space);
        let key = Bytes::from(format!("{n:0width$}", width = plan.key_size));
        let start = Instant::now();
        let result = driver.send(&plan.workload, key).await;
        let elapsed = start.elapsed();
        match result {
            Ok(()) => {
                latencies.push(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX));
                shared.done.fetch_add(1, Ordering::Relaxed);
            }
            Err(message) => shared.record_error(message),
        }
    }
    latencies
}

/// What a client loop sends its requests through.
#[derive(Debug, Clone)]
enum Driver {
    Wire(KvClient<Channel>),
    Oncekv(oncekv_client::Client),
}

impl Driver {
    async fn send(&mut self, workload: &Workload, key: Bytes) -> Result<(), String> {
        let status = |s: tonic::Status| format!("{:?}: {}", s.code(), s.message());
        match (self, workload) {
            (Driver::Wire(kv), Workload::Put { value }) => kv
                .put(PutRequest {
                    key,
                    value: value.clone(),
                    ..Default::default()
                })
                .await
                .map(drop)
                .map_err(status),
            (Driver::Wire(kv), Workload::Range { serializable }) => kv
                .range(RangeRequest {
                    key,
                    serializable: *serializable,
                    ..Default::default()
                })
                .await
                .map(drop)
                .map_err(status),
            (Driver::Oncekv(client), Workload::Put { value }) => client
                .put(key.to_vec(), value.to_vec())
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
            (Driver::Oncekv(client), Workload::Range { serializable }) => {
                let mut options = GetOptions::new();
                if *serializable {
                    options = options.with_serializable();
                }
                client
                    .range(key.to_vec(), options)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
        }
    }
}

/// Once a second: requests done so far, the rate over the last second, errors.
async fn report_progress(shared: Arc<Shared>, started: Instant) {
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_secs(1),
        Duration::from_secs(1),
    );
    let (mut last_done, mut last_at) = (0u64, started);
    loop {
        tick.tick().await;
        let now = Instant::now();
        let done = shared.done.load(Ordering::Relaxed);
        let errors = shared.errors.load(Ordering::Relaxed);
        let rate = (done - last_done) as f64 / now.duration_since(last_at).as_secs_f64();
        eprintln!(
            "bench: {:>6.1} s  {done:>9} done  {rate:>9.0}/s  {errors} errors",
            now.duration_since(started).as_secs_f64()
        );
        (last_done, last_at) = (done, now);
    }
}

/// The result of a run.
#[derive(Debug)]
struct Summary {
    op: &'static str,
    label: String,
    client: ClientKind,
    clients: usize,
    connections: usize,
    leader_only: bool,
    seconds: f64,
    ok: u64,
    errors: u64,
    first_error: Option<String>,
    rate: f64,
    /// avg, p50, p90, p99, max (milliseconds).
    latency_ms: [f64; 5],
    /// p99.9 (milliseconds): the tail `bench compare --scale` reports beside the worst.
    p999_ms: f64,
}

impl Summary {
    #[allow(clippy::too_many_arguments)]
    fn new(
        op: &'static str,
        label: String,
        common: &Common,
        connections: usize,
        elapsed: Duration,
        mut latencies: Vec<u64>,
        errors: u64,
        first_error: Option<String>,
    ) -> Summary {
        latencies.sort_unstable();
        let ok = latencies.len() as u64;
        let seconds = elapsed.as_secs_f64();
        let ms = |ns: u64| ns as f64 / 1e6;
        let pct = |p: f64| ms(percentile(&latencies, p));
        let avg = if latencies.is_empty() {
            0.0
        } else {
            latencies.iter().map(|&n| n as f64).sum::<f64>() / latencies.len() as f64 / 1e6
        };
        Summary {
            op,
            label,
            client: common.client,
            clients: common.clients,
            connections,
            leader_only: common.target.leader_only,
            seconds,
            ok,
            errors,
            first_error,
            rate: if seconds > 0.0 {
                ok as f64 / seconds
            } else {
                0.0
            },
            latency_ms: [
                avg,
                pct(0.50),
                pct(0.90),
                pct(0.99),
                latencies.last().map_or(0.0, |&n| ms(n)),
            ],
            p999_ms: pct(0.999),
        }
    }

    fn text(&self) -> String {
        let [avg, p50, p90, p99, max] = self.latency_ms;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} {}: {} clients, {} {}{}",
            self.op,
            self.label,
            self.clients,
            self.connections,
            self.client.connections(),
            if self.leader_only {
                ", leader only"
            } else {
                ", all endpoints"
            }
        );
        let _ = writeln!(
            out,
            "  requests: {} ok, {} failed in {:.2} s",
            self.ok, self.errors, self.seconds
        );
        let _ = writeln!(out, "  throughput: {:.0} {}s/s", self.rate, self.op);
        let _ = writeln!(
            out,
            "  latency ms: avg {avg:.2}  p50 {p50:.2}  p90 {p90:.2}  p99 {p99:.2}  max {max:.2}"
        );
        if let Some(e) = &self.first_error {
            let _ = writeln!(out, "  first error: {e}");
        }
        out
    }

    fn json(&self) -> String {
        let [avg, p50, p90, p99, max] = self.latency_ms;
        format!(
            concat!(
                "{{\"op\":\"{}\",\"label\":\"{}\",\"client\":\"{}\",\"clients\":{},",
                "\"connections\":{},",
                "\"leader_only\":{},\"ok\":{},\"errors\":{},\"seconds\":{:.3},\"rate\":{:.1},",
                "\"latency_ms\":{{\"avg\":{:.3},\"p50\":{:.3},\"p90\":{:.3},\"p99\":{:.3},",
                "\"max\":{:.3}}},\"first_error\":{}}}"
            ),
            self.op,
            json_escape(&self.label),
            self.client.name(),
            self.clients,
            self.connections,
            self.leader_only,
            self.ok,
            self.errors,
            self.seconds,
            self.rate,
            avg,
            p50,
            p90,
            p99,
            max,
            self.first_error
                .as_deref()
                .map_or_else(|| "null".to_string(), |e| format!("\"{}\"", json_escape(e)))
        )
    }
}

/// The value at rank `ceil(p * n)` of `sorted` (nearest rank; 0 when empty).
fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn json_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_json_strings() {
        assert_eq!(json_escape("a\"b\\c\nd\u{1}"), "a\\\"b\\\\c\\nd\\u0001");
    }

    #[test]
    fn endpoints_become_urls() {
        assert_eq!(url_of("127.0.0.1:2379"), "http://127.0.0.1:2379");
        assert_eq!(url_of("http://127.0.0.1:2379/"), "http://127.0.0.1:2379");
    }
}
