//! etcd's `serve` flags for what oncekv does not have or does one way only, and the
//! check that refuses a value asking for it.

use std::time::Duration;

use clap::Args;

/// etcd flags that configure what oncekv does not have (discovery, the v2 proxy, Go's
/// profiler) or does one way only. They are accepted so that an etcd member's command
/// line or configuration file starts oncekv unchanged; a value that would ask for
/// something oncekv does not do is refused with the reason, never silently ignored.
#[derive(Debug, Args, Clone, Default)]
pub struct EtcdOnly {
    /// Snapshot files kept (0: unlimited). oncekv keeps one snapshot, so any value holds.
    #[arg(long)]
    pub max_snapshots: Option<u64>,
    /// Log files kept (0: unlimited). oncekv deletes a log segment once a snapshot covers
    /// it, so it never keeps more than any value allows etcd.
    #[arg(long)]
    pub max_wals: Option<u64>,
    /// etcd refuses a membership change that would lose quorum among the members it hears
    /// from. oncekv does not check liveness before a change: only false is accepted.
    #[arg(long, num_args = 0..=1, default_missing_value = "true",
          value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub strict_reconfig_check: Option<bool>,
    /// Members never start an election that would disrupt a live leader: they refuse to
    /// vote while they hear from one (a leader lease), which is what etcd's pre-vote
    /// prevents. Either value is accepted; false cannot turn that off.
    #[arg(long, num_args = 0..=1, default_missing_value = "true",
          value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub pre_vote: Option<bool>,
    /// Start a one-member cluster from this member's data: not supported (only false is
    /// accepted); `oncekv snapshot restore` makes a new cluster from a snapshot instead.
    #[arg(long, num_args = 0..=1, default_missing_value = "true",
          value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub force_new_cluster: Option<bool>,
    /// Go's profiler at /debug/pprof: oncekv has none (profile it with perf); true is
    /// accepted with a warning.
    #[arg(long, num_args = 0..=1, default_missing_value = "true",
          value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub enable_pprof: Option<bool>,
    /// etcd's v2 proxy mode: only "off" is accepted.
    #[arg(long, value_parser = ["off", "on", "readonly"])]
    pub proxy: Option<String>,
    /// Proxy timeouts (milliseconds): used only by the proxy mode, which oncekv does not
    /// have, so they change nothing.
    #[arg(long, hide = true)]
    pub proxy_failure_wait: Option<u64>,
    #[arg(long, hide = true)]
    pub proxy_refresh_interval: Option<u64>,
    #[arg(long, hide = true)]
    pub proxy_dial_timeout: Option<u64>,
    #[arg(long, hide = true)]
    pub proxy_write_timeout: Option<u64>,
    #[arg(long, hide = true)]
    pub proxy_read_timeout: Option<u64>,
    /// Bootstrap through a discovery service: not supported (only empty is accepted);
    /// name the members with --initial-cluster.
    #[arg(long)]
    pub discovery: Option<String>,
    /// Bootstrap from DNS SRV records: not supported (only empty is accepted).
    #[arg(long)]
    pub discovery_srv: Option<String>,
    #[arg(long, hide = true)]
    pub discovery_srv_name: Option<String>,
    #[arg(long, hide = true)]
    pub discovery_proxy: Option<String>,
    /// What etcd does when discovery fails; oncekv has no discovery, so either value is
    /// accepted and changes nothing.
    #[arg(long, hide = true, value_parser = ["exit", "proxy"])]
    pub discovery_fallback: Option<String>,
    /// Origins allowed by CORS: oncekv sends no CORS headers, so only empty is accepted.
    #[arg(long)]
    pub cors: Option<String>,
    /// Hosts the HTTP API answers: oncekv answers every Host, so only "*" (etcd's
    /// default) or empty is accepted.
    #[arg(long)]
    pub host_whitelist: Option<String>,
    /// How often etcd commits its backend database. oncekv has no backend apart from its
    /// log, and an entry is on disk (fsynced) before it is acknowledged, so any value
    /// holds.
    #[arg(long, value_parser = crate::cli::parse_duration)]
    pub backend_batch_interval: Option<Duration>,
    /// How many operations etcd batches into one backend commit: as
    /// --backend-batch-interval, any value holds.
    #[arg(long)]
    pub backend_batch_limit: Option<u64>,
    /// etcd's bbolt freelist ("array" or "map"): oncekv has no bbolt database, so either
    /// holds.
    #[arg(long, value_parser = ["array", "map"])]
    pub experimental_backend_bbolt_freelist_type: Option<String>,
    /// How many revisions etcd deletes per compaction batch. oncekv drops compacted
    /// history in memory in one step, so any value holds.
    #[arg(long)]
    pub experimental_compaction_batch_limit: Option<u64>,
    /// etcd's lease checkpoints keep a lease's remaining TTL across a leader change.
    /// oncekv's lease deadlines are replicated in cluster time, so a new leader always
    /// keeps them: either value holds, as if true.
    #[arg(long, num_args = 0..=1, default_missing_value = "true",
          value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub experimental_enable_lease_checkpoint: Option<bool>,
    /// etcd's v2 API emulated on v3 under a prefix: oncekv has no v2 API (only empty is
    /// accepted).
    #[arg(long)]
    pub experimental_enable_v2v3: Option<String>,
    /// etcd checks a peer's client certificate SANs against the peer's address unless
    /// this is true. oncekv checks a peer's certificate chain against --peer-trusted-ca-file
    /// (and --peer-cert-allowed-cn / --peer-cert-allowed-hostname), not its address, so
    /// either value holds, as if true.
    #[arg(long, num_args = 0..=1, default_missing_value = "true",
          value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub experimental_peer_skip_client_san_verification: Option<bool>,
    /// The least time etcd lets a client wait between keepalive pings before it closes
    /// the connection. oncekv answers every ping and closes no connection for pinging
    /// often; a value is accepted with a warning.
    #[arg(long, value_parser = crate::cli::parse_duration)]
    pub grpc_keepalive_min_time: Option<Duration>,
    /// etcd lets a fresh member start its first election early. oncekv's first election
    /// comes after half to one election timeout either way; either value holds.
    #[arg(long, num_args = 0..=1, default_missing_value = "true",
          value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub initial_election_tick_advance: Option<bool>,
}

impl EtcdOnly {
    /// Refuses a value that asks for what oncekv does not do; warnings for values it
    /// accepts but cannot honour exactly.
    pub fn check(&self) -> Result<Vec<String>, String> {
        let given = |v: &Option<String>| v.as_deref().is_some_and(|s| !s.trim().is_empty());
        if self.strict_reconfig_check == Some(true) {
            return Err(
                "--strict-reconfig-check: oncekv does not check the members' liveness \
                        before a membership change; pass --strict-reconfig-check=false"
                    .into(),
            );
        }
        if self.force_new_cluster == Some(true) {
            return Err(
                "--force-new-cluster: not supported; to start a new cluster from a \
                        member's data, save a snapshot (etcdctl snapshot save) and restore it \
                        (oncekv snapshot restore)"
                    .into(),
            );
        }
        if self.proxy.as_deref().is_some_and(|p| p != "off") {
            return Err("--proxy: oncekv has no proxy mode (only --proxy=off)".into());
        }
        for (flag, value) in [
            ("discovery", &self.discovery),
            ("discovery-srv", &self.discovery_srv),
            ("discovery-srv-name", &self.discovery_srv_name),
            ("discovery-proxy", &self.discovery_proxy),
        ] {
            if given(value) {
                return Err(format!(
                    "--{flag}: discovery is not supported; name every member with \
                     --initial-cluster"
                ));
            }
        }
        if given(&self.experimental_enable_v2v3) {
            return Err("--experimental-enable-v2v3: oncekv has no v2 API (only empty)".into());
        }
        if given(&self.cors) {
            return Err(
                "--cors: oncekv's HTTP API sends no CORS headers (only an empty --cors)".into(),
            );
        }
        if self
            .host_whitelist
            .as_deref()
            .is_some_and(|h| !h.trim().is_empty() && h.trim() != "*")
        {
            return Err("--host-whitelist: oncekv answers every Host (only \"*\")".into());
        }
        let mut warnings = Vec::new();
        if let Some(t) = self.grpc_keepalive_min_time {
            warnings.push(format!(
                "--grpc-keepalive-min-time {t:?}: not enforced; oncekv answers every client \
                 ping and closes no connection for pinging often"
            ));
        }
        if self.enable_pprof == Some(true) {
            warnings.push(
                "--enable-pprof: oncekv has no Go profiler; /debug/pprof is not served".into(),
            );
        }
        if self.pre_vote == Some(false) {
            warnings.push(
                "--pre-vote=false: oncekv's members always refuse to vote while they hear from \
                 a leader, as with --pre-vote=true"
                    .into(),
            );
        }
        Ok(warnings)
    }
}
