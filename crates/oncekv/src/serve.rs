//! `oncekv serve`: one member of a cluster.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use oncekv_core::Settings;
use oncekv_server::config::ClusterState;
use oncekv_server::{Member, Node, NodeConfig, Stopped};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// This member's name; must appear in --initial-cluster.
    #[arg(long, default_value = "default")]
    pub name: String,
    /// Where the log and snapshots live.
    #[arg(long, default_value = "default.oncekv")]
    pub data_dir: PathBuf,
    /// URL to serve clients on (http://host:port, or https:// with --cert-file and
    /// --key-file or --auto-tls).
    #[arg(long, default_value = "http://127.0.0.1:2379")]
    pub listen_client_urls: String,
    /// URL to serve peers on (http://host:port, or https:// with --peer-cert-file and
    /// --peer-key-file or --peer-auto-tls).
    #[arg(long, default_value = "http://127.0.0.1:2380")]
    pub listen_peer_urls: String,
    /// URL clients should use to reach this member (default: the listen URL).
    #[arg(long)]
    pub advertise_client_urls: Option<String>,
    /// More URLs (http:// or https://host:port, comma separated) serving only the HTTP
    /// routes: /metrics, /health, /livez, /readyz, /version. The client URLs serve them
    /// too. https uses the client port's certificate, key and CA (and requires client
    /// certificates with --client-cert-auth), as etcd does.
    #[arg(long)]
    pub listen_metrics_urls: Option<String>,
    /// Every member as name=peer-url, comma separated (the same on every member)
    /// [default: this member alone, NAME=its advertised peer URL, as in etcd]
    #[arg(long)]
    pub initial_cluster: Option<String>,
    /// "new" to found the cluster with --initial-cluster (every founding member starts
    /// this way), "existing" to join a running cluster that added this member first
    /// (etcdctl member add). Read only at the first start.
    #[arg(long, default_value = "new", value_parser = ["new", "existing"])]
    pub initial_cluster_state: String,
    /// This member's peer URL as the other members reach it. oncekv serves one peer URL
    /// per member, and the others find it in --initial-cluster, so it must be this
    /// member's entry there (checked, as etcd does) [default: that entry]
    #[arg(long)]
    pub initial_advertise_peer_urls: Option<String>,
    /// Mixed into the id of a cluster founded with --initial-cluster-state new, so that
    /// two clusters whose members have the same names get different ids and refuse each
    /// other's peer traffic: give each cluster its own. Read only at the first start.
    #[arg(long, default_value = oncekv_server::membership::DEFAULT_CLUSTER_TOKEN)]
    pub initial_cluster_token: String,
    /// etcd's v2 API. oncekv serves the v3 API only, so `--enable-v2=false` (etcd 3.4's
    /// default) is accepted and `true` refused.
    #[arg(long, num_args = 0..=1, default_value_t = false, default_missing_value = "true",
          value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub enable_v2: bool,
    /// etcd's YAML configuration file: the flags' names as keys (`data-dir: /var/lib/etcd`),
    /// the TLS flags under `client-transport-security` and `peer-transport-security`. As in
    /// etcd, when a file is given every other flag and ETCD_* variable is ignored.
    #[arg(long)]
    pub config_file: Option<PathBuf>,
    /// Where this member's raft log lives, e.g. on a disk of its own [default:
    /// DATA_DIR/log]. Read at every start: a member must keep the --wal-dir it was
    /// created with (it refuses to start otherwise, rather than start without its log).
    #[arg(long)]
    pub wal_dir: Option<PathBuf>,
    #[command(flatten)]
    pub log: LogArgs,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub tuning: Tuning,
    #[command(flatten)]
    pub etcd: EtcdOnly,
}

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

/// etcd's logging flags. `ONCEKV_LOG` (a tracing filter such as
/// `info,openraft=debug`), when set, overrides `--log-level`.
#[derive(Debug, Args, Clone)]
pub struct LogArgs {
    /// Least severe messages logged: debug, info, warn, error (etcd's panic and fatal
    /// log as error).
    #[arg(long, default_value = "info",
          value_parser = ["debug", "info", "warn", "error", "panic", "fatal"])]
    pub log_level: String,
    /// etcd's choice of logging library; oncekv has one, so either value logs the same.
    #[arg(long, default_value = "zap", value_parser = ["zap", "capnslog"])]
    pub logger: String,
    /// Where logs go: "default" or "stderr", "stdout", or a file path (appended to).
    #[arg(long, default_value = "default")]
    pub log_outputs: String,
    /// etcd 3.4's older switch for debug-level logging: the same as --log-level=debug.
    #[arg(long, num_args = 0..=1, default_value_t = false, default_missing_value = "true",
          value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub debug: bool,
    /// capnslog's per-package levels: accepted only empty (use --log-level).
    #[arg(long, hide = true)]
    pub log_package_levels: Option<String>,
}

/// Where a member's log lines go.
#[derive(Debug, PartialEq, Eq)]
pub enum LogOutput {
    Stderr,
    Stdout,
    File(PathBuf),
}

impl LogArgs {
    /// The tracing filter for `--log-level`: oncekv's own messages at that level,
    /// libraries' (openraft, hyper) only from warn up unless debug is asked for.
    pub fn filter(&self) -> String {
        let level = if self.debug {
            "debug"
        } else {
            self.log_level.as_str()
        };
        match level {
            "debug" => "info,oncekv=debug,oncekv_server=debug,openraft=debug".into(),
            "info" => "warn,oncekv=info,oncekv_server=info".into(),
            "warn" => "warn".into(),
            _ => "error".into(),
        }
    }

    pub fn output(&self) -> Result<LogOutput, String> {
        let outputs: Vec<&str> = self
            .log_outputs
            .split(',')
            .map(str::trim)
            .filter(|o| !o.is_empty())
            .collect();
        match outputs.as_slice() {
            [] | ["default"] | ["stderr"] => Ok(LogOutput::Stderr),
            ["stdout"] => Ok(LogOutput::Stdout),
            ["systemd/journal"] => Err(
                "--log-outputs systemd/journal: not supported; use stderr (journald collects a \
                 unit's stderr)"
                    .into(),
            ),
            [path] => Ok(LogOutput::File(PathBuf::from(path))),
            _ => Err(format!(
                "--log-outputs {}: oncekv logs to one output",
                self.log_outputs
            )),
        }
    }
}

/// etcd's TLS flags, for the client port and (`--peer-`) the peer port.
#[derive(Debug, Args, Clone, Default)]
pub struct TlsArgs {
    /// The client port's certificate (PEM); re-read when the file changes.
    #[arg(long)]
    pub cert_file: Option<PathBuf>,
    /// The client port's private key (PEM).
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// The CA that signs client certificates (with --client-cert-auth, required of every
    /// client; a certificate's common name authenticates it as that user).
    #[arg(long)]
    pub trusted_ca_file: Option<PathBuf>,
    /// Refuse clients without a certificate signed by --trusted-ca-file.
    #[arg(long, num_args = 0..=1, default_value_t = false, default_missing_value = "true",
              value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub client_cert_auth: bool,
    /// Serve clients with a self-signed certificate made in DATA_DIR/fixtures/client
    /// (clients must then skip verification: etcdctl --insecure-skip-tls-verify).
    #[arg(long, num_args = 0..=1, default_value_t = false, default_missing_value = "true",
              value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub auto_tls: bool,
    /// The peer port's certificate (PEM), also presented when dialing peers.
    #[arg(long)]
    pub peer_cert_file: Option<PathBuf>,
    /// The peer port's private key (PEM).
    #[arg(long)]
    pub peer_key_file: Option<PathBuf>,
    /// The CA that signs every member's peer certificate: peers are checked against it
    /// both ways.
    #[arg(long)]
    pub peer_trusted_ca_file: Option<PathBuf>,
    /// Refuse peer connections without a certificate signed by --peer-trusted-ca-file.
    #[arg(long, num_args = 0..=1, default_value_t = false, default_missing_value = "true",
              value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub peer_client_cert_auth: bool,
    /// Serve and dial peers with a self-signed certificate made in DATA_DIR/fixtures/peer
    /// (encrypts peer traffic but authenticates no one: peers skip verification).
    #[arg(long, num_args = 0..=1, default_value_t = false, default_missing_value = "true",
              value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub peer_auto_tls: bool,
    /// Serve only peers whose certificate's common name is this (with
    /// --peer-client-cert-auth: the certificate must also be signed by
    /// --peer-trusted-ca-file). Refused connections are logged.
    #[arg(long)]
    pub peer_cert_allowed_cn: Option<String>,
    /// Serve only peers whose certificate (signed by --peer-trusted-ca-file) is valid for
    /// this host name or IP address (its subject alternative names; needs
    /// --peer-client-cert-auth; not with --peer-cert-allowed-cn).
    #[arg(long)]
    pub peer_cert_allowed_hostname: Option<String>,
    /// Serve only clients whose certificate is valid for this host name or IP address
    /// (needs --client-cert-auth).
    #[arg(long)]
    pub client_cert_allowed_hostname: Option<String>,
    /// Certificate revocation list (PEM or DER): clients presenting a certificate it
    /// lists are refused. Re-read when the file changes.
    #[arg(long)]
    pub client_crl_file: Option<PathBuf>,
    /// Certificate revocation list for peers' certificates.
    #[arg(long)]
    pub peer_crl_file: Option<PathBuf>,
    /// TLS 1.2 cipher suites both ports offer, comma separated, by Go's names (etcd's
    /// list, e.g. TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256): ECDHE with AES-GCM or
    /// ChaCha20-Poly1305. As in etcd, TLS 1.3 stays on with its own suites. [default: all]
    #[arg(long)]
    pub cipher_suites: Option<String>,
}

impl TlsArgs {
    /// The TLS settings for both ports; `client_https` / `peer_https`: whether the listen
    /// URL asks for TLS.
    pub fn apply(
        &self,
        config: &mut NodeConfig,
        client_https: bool,
        peer_https: bool,
    ) -> Result<(), String> {
        let hosts = |addr: SocketAddr| {
            vec![
                addr.ip().to_string(),
                "127.0.0.1".to_string(),
                "localhost".to_string(),
            ]
        };
        config.client_tls = port_tls(
            "client",
            client_https,
            (&self.cert_file, &self.key_file),
            &self.trusted_ca_file,
            self.client_cert_auth,
            self.auto_tls.then(|| {
                (
                    config.data_dir.join("fixtures/client"),
                    hosts(config.client_addr),
                )
            }),
        )?;
        config.peer_tls = port_tls(
            "peer",
            peer_https,
            (&self.peer_cert_file, &self.peer_key_file),
            &self.peer_trusted_ca_file,
            self.peer_client_cert_auth,
            self.peer_auto_tls.then(|| {
                (
                    config.data_dir.join("fixtures/peer"),
                    hosts(config.peer_addr),
                )
            }),
        )?;
        let suites: Vec<String> = self
            .cipher_suites
            .iter()
            .flat_map(|s| s.split(','))
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        if !suites.is_empty() {
            // Checked now, so that a misspelt name stops the start with its flag.
            oncekv_proto::tls::provider_for_suites(&suites).map_err(|e| e.to_string())?;
            if config.client_tls.is_none() && config.peer_tls.is_none() {
                return Err("--cipher-suites: neither port serves TLS".into());
            }
        }
        for (port, crl, host, files) in [
            (
                "client",
                &self.client_crl_file,
                &self.client_cert_allowed_hostname,
                config.client_tls.as_mut(),
            ),
            (
                "peer",
                &self.peer_crl_file,
                &self.peer_cert_allowed_hostname,
                config.peer_tls.as_mut(),
            ),
        ] {
            let prefix = if port == "peer" { "peer-" } else { "" };
            let Some(files) = files else {
                if crl.is_some() {
                    return Err(format!("--{port}-crl-file: the {port} port serves no TLS"));
                }
                if host.is_some() {
                    return Err(format!(
                        "--{port}-cert-allowed-hostname: the {port} port serves no TLS"
                    ));
                }
                continue;
            };
            files.cipher_suites = suites.clone();
            files.crl_file = crl.clone();
            if crl.is_some() && files.trusted_ca_file.is_none() {
                return Err(format!(
                    "--{port}-crl-file needs --{prefix}trusted-ca-file: without it no \
                     {port} presents a certificate to check"
                ));
            }
            if host.is_some() && !files.client_cert_auth {
                return Err(format!(
                    "--{port}-cert-allowed-hostname needs --{prefix}client-cert-auth (and \
                     --{prefix}trusted-ca-file): without them no {port} presents a \
                     certificate to check"
                ));
            }
            files.allowed_hostname = host.clone();
        }
        if self.peer_cert_allowed_cn.is_some() && self.peer_cert_allowed_hostname.is_some() {
            return Err(
                "--peer-cert-allowed-cn and --peer-cert-allowed-hostname are mutually exclusive"
                    .into(),
            );
        }
        if let Some(cn) = &self.peer_cert_allowed_cn {
            match config.peer_tls.as_mut() {
                Some(files) if files.client_cert_auth => files.allowed_cn = Some(cn.clone()),
                _ => {
                    return Err("--peer-cert-allowed-cn needs --peer-client-cert-auth (and \
                                --peer-trusted-ca-file): without them peers present no \
                                certificate to check"
                        .into());
                }
            }
        }
        Ok(())
    }
}

/// One port's TLS files from its flags; errors name the flag to fix.
fn port_tls(
    port: &str,
    https: bool,
    (cert, key): (&Option<PathBuf>, &Option<PathBuf>),
    trusted_ca: &Option<PathBuf>,
    client_cert_auth: bool,
    auto: Option<(PathBuf, Vec<String>)>,
) -> Result<Option<oncekv_server::tls::TlsFiles>, String> {
    let prefix = if port == "peer" { "peer-" } else { "" };
    let files = match (cert, key, auto) {
        (Some(cert), Some(key), _) => Some(oncekv_server::tls::TlsFiles {
            cert_file: cert.clone(),
            key_file: key.clone(),
            trusted_ca_file: trusted_ca.clone(),
            client_cert_auth,
            ..Default::default()
        }),
        (Some(_), None, _) | (None, Some(_), _) => {
            return Err(format!(
                "--{prefix}cert-file and --{prefix}key-file go together"
            ));
        }
        (None, None, Some((dir, hosts))) => {
            let mut files = oncekv_server::tls::self_signed(&dir, &hosts)
                .map_err(|e| format!("--{prefix}auto-tls in {}: {e}", dir.display()))?;
            files.trusted_ca_file = trusted_ca.clone();
            files.client_cert_auth = client_cert_auth;
            Some(files)
        }
        (None, None, None) => None,
    };
    match (&files, https) {
        (Some(_), false) => Err(format!(
            "TLS is configured for the {port} port but --listen-{port}-urls is http://; use https://"
        )),
        (None, true) => Err(format!(
            "--listen-{port}-urls is https:// but no certificate is given: set \
             --{prefix}cert-file and --{prefix}key-file, or --{prefix}auto-tls"
        )),
        _ => {
            if client_cert_auth && trusted_ca.is_none() {
                return Err(format!(
                    "--{prefix}client-cert-auth needs --{prefix}trusted-ca-file"
                ));
            }
            Ok(files)
        }
    }
}

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

/// `http://127.0.0.1:2379` (or `https://`) → its socket address. `localhost` is
/// 127.0.0.1 (etcd's default URLs use it); other host names are not resolved, as etcd
/// refuses domain names for binding.
pub fn parse_url(url: &str) -> Result<SocketAddr, String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("{url:?}: only http:// and https:// URLs are supported"))?;
    let host_port = rest.trim_end_matches('/');
    let host_port = match host_port.strip_prefix("localhost:") {
        Some(port) => format!("127.0.0.1:{port}"),
        None => host_port.to_string(),
    };
    host_port
        .parse()
        .map_err(|_| format!("{url:?}: expected http://IP:PORT (host names are not resolved)"))
}

/// etcd's `--listen-client-urls`: one or more URLs, comma separated, all `http://` or all
/// `https://` (a port's TLS settings apply to every listener).
pub fn parse_listen_urls(flag: &str, urls: &str) -> Result<Vec<SocketAddr>, String> {
    let urls: Vec<&str> = urls
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect();
    let https = urls.iter().filter(|u| u.starts_with("https://")).count();
    if https != 0 && https != urls.len() {
        return Err(format!(
            "--{flag} mixes http:// and https:// URLs; oncekv serves one scheme per port"
        ));
    }
    if urls.is_empty() {
        return Err(format!("--{flag} is empty"));
    }
    urls.into_iter().map(parse_url).collect()
}

/// `n1=http://a:2380,n2=http://b:2380` → members (client URLs unknown).
pub fn parse_initial_cluster(s: &str) -> Result<Vec<Member>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|part| {
            let (name, url) = part
                .split_once('=')
                .ok_or_else(|| format!("--initial-cluster entry {part:?} is not name=url"))?;
            parse_url(url)?;
            Ok(Member {
                name: name.trim().to_string(),
                peer_url: url.trim().to_string(),
                client_url: String::new(),
            })
        })
        .collect()
}

/// etcd's check of `--initial-advertise-peer-urls` against `name`'s entry in
/// `--initial-cluster`: the entry is how the other members reach this one, so the two
/// must agree (oncekv: exactly one URL).
pub fn check_advertised_peer_url(name: &str, members: &[Member], urls: &str) -> Result<(), String> {
    let urls: Vec<&str> = urls
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect();
    let listed = members
        .iter()
        .find(|m| m.name == name)
        .map(|m| m.peer_url.trim_end_matches('/'))
        .ok_or_else(|| {
            format!("couldn't find local name {name:?} in the initial cluster configuration")
        })?;
    match urls.as_slice() {
        [url] if url.trim_end_matches('/') == listed => Ok(()),
        [] => Err("--initial-advertise-peer-urls is empty".into()),
        [_] => Err(format!(
            "--initial-cluster has {name}={listed} but missing from --initial-advertise-peer-urls={}",
            urls.join(",")
        )),
        _ => Err(format!(
            "--initial-advertise-peer-urls={}: oncekv serves one peer URL per member",
            urls.join(",")
        )),
    }
}

pub async fn run(args: ServeArgs) -> Result<(), String> {
    if args.enable_v2 {
        return Err("--enable-v2: oncekv serves etcd's v3 API only (etcd 3.4's default is --enable-v2=false)".into());
    }
    for warning in args.etcd.check()? {
        tracing::warn!("{warning}");
    }
    if args
        .log
        .log_package_levels
        .as_deref()
        .is_some_and(|l| !l.trim().is_empty())
    {
        return Err(
            "--log-package-levels: capnslog's per-package levels are not supported; \
                    use --log-level"
                .into(),
        );
    }
    let client_addrs = parse_listen_urls("listen-client-urls", &args.listen_client_urls)?;
    let client_addr = client_addrs[0];
    let peer_addrs = parse_listen_urls("listen-peer-urls", &args.listen_peer_urls)?;
    let peer_addr = peer_addrs[0];
    // Without --initial-cluster a member founds a cluster of itself (etcd's default).
    let initial_cluster = args.initial_cluster.clone().unwrap_or_else(|| {
        // The first listening URL when none is advertised (etcd advertises them all; a
        // member here has one peer URL).
        let first_listening = args.listen_peer_urls.split(',').next().unwrap_or_default();
        let peer_url = args
            .initial_advertise_peer_urls
            .as_deref()
            .unwrap_or(first_listening.trim());
        format!("{}={peer_url}", args.name)
    });
    let mut members = parse_initial_cluster(&initial_cluster)?;
    if let Some(urls) = &args.initial_advertise_peer_urls {
        check_advertised_peer_url(&args.name, &members, urls)?;
    }
    let advertise = args
        .advertise_client_urls
        .clone()
        .unwrap_or_else(|| args.listen_client_urls.clone());
    for m in &mut members {
        if m.name == args.name {
            m.client_url = advertise.clone();
        }
    }
    let mut config = NodeConfig::new(&args.name, &args.data_dir, client_addr, peer_addr, members);
    config.more_client_addrs = client_addrs[1..].to_vec();
    config.more_peer_addrs = peer_addrs[1..].to_vec();
    // Recorded absolute: the same relative --wal-dir from another working directory is
    // another directory, and must not pass for the one the member was created with.
    config.wal_dir = args
        .wal_dir
        .as_deref()
        .map(std::path::absolute)
        .transpose()
        .map_err(|e| format!("--wal-dir: {e}"))?;
    args.tuning.apply(&mut config)?;
    args.tls.apply(
        &mut config,
        args.listen_client_urls.starts_with("https://"),
        args.listen_peer_urls.starts_with("https://"),
    )?;
    if args.initial_cluster_state == "existing" {
        config.initial_cluster_state = ClusterState::Existing;
    }
    config.initial_cluster_token = args.initial_cluster_token.clone();
    let mut metrics_listeners = Vec::new();
    for url in args
        .listen_metrics_urls
        .iter()
        .flat_map(|u| u.split(','))
        .filter(|u| !u.trim().is_empty())
    {
        let url = url.trim();
        let addr = parse_url(url)?;
        let tls = url.starts_with("https://");
        if tls && config.client_tls.is_none() {
            return Err(format!(
                "--listen-metrics-urls {url}: an https URL needs the client port's TLS \
                 (--cert-file and --key-file, or --auto-tls)"
            ));
        }
        let listener = oncekv_server::services::bind(addr)
            .await
            .map_err(|e| format!("listening on {addr} (--listen-metrics-urls): {e}"))?;
        metrics_listeners.push((listener, tls));
    }
    let mut node = Node::start(config).await.map_err(|e| e.to_string())?;
    for (listener, tls) in metrics_listeners {
        node.serve_http(listener, tls)?;
    }
    eprintln!(
        "oncekv: member {} serving clients on {} and peers on {} (data in {})",
        args.name,
        std::iter::once(node.client_addr)
            .chain(client_addrs[1..].iter().copied())
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        node.peer_addr,
        args.data_dir.display()
    );
    let scheme = if args.listen_client_urls.starts_with("https://") {
        "https"
    } else {
        "http"
    };
    eprintln!(
        "oncekv: metrics at {scheme}://{}/metrics, health at {scheme}://{}/health",
        node.client_addr, node.client_addr
    );
    let ready = tokio::spawn(announce_ready(
        node.core.clone(),
        args.name.clone(),
        advertise.clone(),
    ));
    let outcome = serve_until_stopped(node, &args.name).await;
    ready.abort();
    outcome
}

/// Prints etcd's own words for a member that is ready, once it has a leader, has caught
/// up with it and has published its client URL: scripts and test harnesses written for etcd wait for these lines
/// ("ready to serve client requests" above all) on its output.
async fn announce_ready(
    core: std::sync::Arc<oncekv_server::request_path::NodeCore>,
    name: String,
    client_urls: String,
) {
    core.caught_up().await;
    core.published().await;
    let version = oncekv_server::etcd::ETCD_API_VERSION;
    let minor = version.rsplit_once('.').map_or(version, |(minor, _)| minor);
    eprintln!("oncekv: enabled capabilities for version {minor}");
    eprintln!(
        "oncekv: published {{Name:{name} ClientURLs:[{}]}} to cluster {:x}",
        client_urls.replace(',', " "),
        core.cluster_id()
    );
    eprintln!("oncekv: ready to serve client requests");
}

/// Serves until a signal asks to stop (then stops gracefully) or the member cannot go on.
async fn serve_until_stopped(node: Node, name: &str) -> Result<(), String> {
    tokio::select! {
        signal = crate::stop_requested() => signal?,
        stopped = node.failed() => {
            // Removed, or failed on its storage: nothing to hand over.
            node.halt().await;
            return match stopped {
                Stopped::Removed => {
                    eprintln!(
                        "oncekv: member {name} has been permanently removed from the cluster; exiting"
                    );
                    Ok(())
                }
                Stopped::Fatal(error) => Err(format!(
                    "member {name} stopped on a storage error and exits (restart it once the \
                     cause is fixed; what it acknowledged is durable): {error}"
                )),
            };
        }
    }
    eprintln!("oncekv: stopping");
    node.shutdown().await;
    Ok(())
}
