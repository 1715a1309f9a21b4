//! The timing, size, session and auth settings `serve` and `dev` share, checked as etcd
//! checks them and written into a member's [`NodeConfig`].

use std::time::Duration;

use clap::Args;
use oncekv_core::Settings;
use oncekv_server::NodeConfig;

/// The longest `--election-timeout` accepted, as in etcd.
const MAX_ELECTION_MS: u64 = 50_000;

/// Settings shared by `serve` and `dev`.
#[derive(Debug, Args, Clone)]
pub struct Tuning {
    /// Snapshot (and compact the log) every this many applied entries. A snapshot is the
    /// whole state, so once the last one was 64 MiB or more, the next also waits until the
    /// log written since is a quarter of its size.
    #[arg(long, default_value_t = 10_000)]
    pub snapshot_count: u64,
    /// Raft heartbeat interval, in milliseconds.
    #[arg(long, default_value_t = 100)]
    pub heartbeat_interval: u64,
    /// Raft election timeout, in milliseconds: at least 5 heartbeat intervals, at most
    /// 50000. A follower that stops hearing from its leader stands for election after 1.5
    /// to 2 of these (etcd: 1 to 2); a member that knows no leader, after 0.5 to 1.
    #[arg(long, default_value_t = 1000)]
    pub election_timeout: u64,
    /// "basic" or "extensive": extensive adds grpc_server_handling_seconds, a histogram of
    /// every gRPC call's duration by method, to /metrics (as etcd's does).
    #[arg(long, default_value = "basic", value_parser = ["basic", "extensive"])]
    pub metrics: String,
    /// Concurrent requests (HTTP/2 streams) one client connection may have open; more
    /// wait for one to finish (etcd's default: no limit).
    #[arg(long, default_value_t = u32::MAX)]
    pub max_concurrent_streams: u32,
    /// Largest client request accepted, in bytes (etcd's default: 1.5 MiB).
    #[arg(long, default_value_t = 1536 * 1024)]
    pub max_request_bytes: usize,
    /// The space quota on a member's data (snapshot and log) in bytes: past it, writes that
    /// add data raise the NOSPACE alarm and are refused ("etcdserver: mvcc: database space
    /// exceeded") until `alarm disarm`; reads, deletes and compaction go on. 0 means the
    /// default (etcd's: 2 GiB).
    #[arg(long, default_value_t = 0)]
    pub quota_backend_bytes: u64,
    /// Once started, compare every member's HashKV at one revision; a mismatch raises the
    /// CORRUPT alarm, which stops reads and writes until `alarm disarm`.
    #[arg(long, alias = "experimental-initial-corrupt-check", num_args = 0..=1,
          default_value_t = false, default_missing_value = "true",
          value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub initial_corrupt_check: bool,
    /// Compare every member's HashKV this often (e.g. 1h, 30m; 0 = never, the default).
    #[arg(long, alias = "experimental-corrupt-check-time", default_value = "0", value_parser = crate::cli::parse_duration)]
    pub corrupt_check_time: Duration,
    /// Connections open at once on each port; past it new ones are closed at once. A new
    /// connection that sends nothing for 10 s is closed too.
    #[arg(long, default_value_t = 10_000)]
    pub max_connections: usize,
    /// Ping a connection idle this long to check its peer is still there (etcd's flag).
    #[arg(long, default_value = "2h", value_parser = crate::cli::parse_duration)]
    pub grpc_keepalive_interval: Duration,
    /// Close a connection whose ping is not answered within this (etcd's flag).
    #[arg(long, default_value = "20s", value_parser = crate::cli::parse_duration)]
    pub grpc_keepalive_timeout: Duration,
    /// Log a warning ("apply request took too long") for every log entry whose apply
    /// takes longer than this (etcd's flag; oncekv times a whole entry, the batch of
    /// requests it carries).
    #[arg(long, default_value = "100ms", value_parser = crate::cli::parse_duration)]
    pub experimental_warning_apply_duration: Duration,
    /// Most operations in one txn branch (etcd's default: 128).
    #[arg(long, default_value_t = 128)]
    pub max_txn_ops: usize,
    /// Idle time after which an exactly-once client session expires, in seconds. Only
    /// applied when the cluster first forms (it is a replicated setting).
    #[arg(long, default_value_t = 60)]
    pub session_ttl: u64,
    /// How many requests an exactly-once session may have outstanding.
    #[arg(long, default_value_t = 128)]
    pub session_window: u64,
    /// Log entries the leader proposes before the earlier ones are answered. Requests
    /// that arrive meanwhile are batched into the next entry, so fewer entries in flight
    /// means bigger batches and fewer fsyncs.
    #[arg(long, default_value_t = oncekv_server::config::BatchLimits::default().max_in_flight)]
    pub max_inflight_entries: usize,
    /// On a follower: batches of client writes forwarded to the leader (one peer RPC
    /// each) before the earlier ones are answered. Writes that arrive meanwhile join the
    /// next batch.
    #[arg(long, default_value_t = oncekv_server::config::BatchLimits::default().max_forwards_in_flight)]
    pub max_inflight_forwards: usize,
    /// Serve linearizable reads on the leader without a round of heartbeats while a
    /// quorum confirmed its leadership within the last 0.8 election timeouts (a lease).
    /// Faster reads, at a price: it assumes no member's clock runs 20 % faster or slower
    /// than another's, and a member with it refuses to vote during its first election
    /// timeout (a restarted member forgets which leader it heard from). Give it to every
    /// member or none.
    #[arg(long, num_args = 0..=1, default_value_t = false, default_missing_value = "true",
              value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub leader_lease_reads: bool,
    /// bcrypt cost of the password hashes this member computes (4 to 31; each step
    /// doubles the work of every Authenticate and user add).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(4..=31))]
    pub bcrypt_cost: u32,
    /// Token kind. "simple": oncekv's tokens (signed, so any member checks any member's).
    /// "jwt,sign-method=RS256,priv-key=FILE,pub-key=FILE,ttl=5m" as etcd's: JSON Web
    /// Tokens signed with the key (RS*, PS*, ES256, ES384, HS*, EdDSA; for HS* priv-key is
    /// the secret). With only pub-key the member checks tokens and issues none.
    #[arg(long, default_value = "simple")]
    pub auth_token: String,
    /// Seconds an Authenticate token stays valid (any auth change ends all tokens sooner).
    #[arg(long, default_value_t = 300)]
    pub auth_token_ttl: u64,
    /// How the leader compacts history by itself: "periodic" (keep a span of time) or
    /// "revision" (keep a number of revisions). See --auto-compaction-retention.
    #[arg(long, default_value = "periodic", value_parser = ["periodic", "revision"])]
    pub auto_compaction_mode: String,
    /// What auto-compaction keeps; 0 turns it off (the default). Periodic mode: a span of
    /// time (`30m`, `1h30m`; a bare number is hours): once it has passed, history older
    /// than it is compacted every span (at least hourly). Revision mode: how many
    /// revisions to keep, checked every 5 minutes.
    #[arg(long, default_value = "0")]
    pub auto_compaction_retention: String,
    /// How often a watcher that asked for progress notifications (and got no events
    /// meanwhile) is told the current revision, e.g. 10m, 30s (etcd's flag and default).
    #[arg(long, default_value = "10m", value_parser = crate::cli::parse_duration)]
    pub experimental_watch_progress_notify_interval: Duration,
}

impl Tuning {
    pub fn apply(&self, config: &mut NodeConfig) -> Result<(), String> {
        // etcd's checks, in its words: raft needs heartbeats well inside an election
        // timeout (openraft's shortest timeout is half of it, see
        // `NodeConfig::raft_election_timeouts`).
        let (heartbeat, election) = (self.heartbeat_interval, self.election_timeout);
        if heartbeat == 0 {
            return Err("--heartbeat-interval must be >0 (set to 0ms)".into());
        }
        if election < heartbeat.saturating_mul(5) {
            return Err(format!(
                "--election-timeout[{election}ms] should be at least as 5 times as --heartbeat-interval[{heartbeat}ms]"
            ));
        }
        if election > MAX_ELECTION_MS {
            return Err(format!(
                "--election-timeout[{election}ms] is too long, and should be set less than {MAX_ELECTION_MS}ms"
            ));
        }
        if self.experimental_watch_progress_notify_interval.is_zero() {
            return Err("--experimental-watch-progress-notify-interval must be above 0".into());
        }
        config.watch_progress_notify_interval = self.experimental_watch_progress_notify_interval;
        config.auto_compaction = oncekv_server::compactor::AutoCompaction::from_flags(
            &self.auto_compaction_mode,
            &self.auto_compaction_retention,
            crate::cli::parse_duration,
        )?;
        config.snapshot_count = self.snapshot_count;
        config.heartbeat_ms = self.heartbeat_interval;
        config.election_timeout_ms = self.election_timeout;
        config.max_request_bytes = self.max_request_bytes;
        if self.max_concurrent_streams == 0 {
            return Err("--max-concurrent-streams must be above 0".into());
        }
        config.max_concurrent_streams = self.max_concurrent_streams;
        config.metrics_extensive = self.metrics == "extensive";
        config.max_txn_ops = self.max_txn_ops;
        config.initial_corrupt_check = self.initial_corrupt_check;
        config.max_connections = self.max_connections.max(1);
        if self.grpc_keepalive_interval.is_zero() || self.grpc_keepalive_timeout.is_zero() {
            return Err(
                "--grpc-keepalive-interval and --grpc-keepalive-timeout must be above 0".into(),
            );
        }
        config.grpc_keepalive_interval = self.grpc_keepalive_interval;
        config.grpc_keepalive_timeout = self.grpc_keepalive_timeout;
        if self.experimental_warning_apply_duration.is_zero() {
            return Err("--experimental-warning-apply-duration must be above 0".into());
        }
        config.warning_apply_duration = self.experimental_warning_apply_duration;
        config.corrupt_check_time =
            (!self.corrupt_check_time.is_zero()).then_some(self.corrupt_check_time);
        if self.quota_backend_bytes > 0 {
            config.quota_backend_bytes = self.quota_backend_bytes;
        }
        config.settings = Settings {
            session_ttl_ms: self.session_ttl.saturating_mul(1000),
            window: self.session_window,
            ..Settings::default()
        };
        config.batch.max_in_flight = self.max_inflight_entries.max(1);
        config.batch.max_forwards_in_flight = self.max_inflight_forwards.max(1);
        config.bcrypt_cost = self.bcrypt_cost;
        config.leader_lease_reads = self.leader_lease_reads;
        config.auth_token_ttl = Duration::from_secs(self.auth_token_ttl.max(1));
        config.auth_jwt = auth_token(&self.auth_token)?;
        config.request_timeout =
            Duration::from_millis(self.election_timeout.saturating_mul(7).max(5_000));
        Ok(())
    }
}

/// etcd's `--auth-token`: `simple` (None) or `jwt,` then `key=value` options, whose key
/// files are read here. An unknown option is warned about and ignored, as etcd does.
pub fn auth_token(value: &str) -> Result<Option<std::sync::Arc<oncekv_server::jwt::Jwt>>, String> {
    let mut parts = value.split(',');
    let kind = parts.next().unwrap_or_default();
    let invalid = || format!("--auth-token {value:?}: auth: invalid auth options");
    match kind {
        "simple" => return Ok(None),
        "jwt" => {}
        _ => return Err(invalid()),
    }
    let mut options = std::collections::BTreeMap::new();
    for part in parts {
        let (k, v) = part.split_once('=').ok_or_else(invalid)?;
        if options.insert(k.to_string(), v.to_string()).is_some() {
            return Err(invalid());
        }
    }
    let read = |key: &str| -> Result<Option<Vec<u8>>, String> {
        match options.get(key).filter(|f| !f.is_empty()) {
            Some(file) => std::fs::read(file)
                .map(Some)
                .map_err(|e| format!("--auth-token: {key} {file:?}: {e}")),
            None => Ok(None),
        }
    };
    let ttl = match options.get("ttl").filter(|t| !t.is_empty()) {
        Some(t) => crate::cli::parse_duration(t).map_err(|e| format!("--auth-token ttl: {e}"))?,
        None => Duration::from_secs(300),
    };
    for key in options.keys() {
        if !["sign-method", "pub-key", "priv-key", "ttl"].contains(&key.as_str()) {
            tracing::warn!(option = %key, "unknown JWT option in --auth-token, ignored");
        }
    }
    let opts = oncekv_server::jwt::JwtOptions {
        sign_method: options.get("sign-method").cloned().unwrap_or_default(),
        public_key: read("pub-key")?,
        private_key: read("priv-key")?,
        ttl,
    };
    oncekv_server::jwt::Jwt::new(&opts)
        .map(|j| Some(std::sync::Arc::new(j)))
        .map_err(|e| format!("--auth-token: {e}"))
}
