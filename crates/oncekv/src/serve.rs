//! `oncekv serve`: one member of a cluster. This module holds the top-level flags and the
//! startup (flags to a [`NodeConfig`], listeners, the member's lifetime); the flag groups
//! it flattens in, and the URL parsing, live in its submodules.

mod etcd_only;
mod log_flags;
mod tls_flags;
mod tuning;
mod urls;

use std::path::PathBuf;

use clap::Args;
use oncekv_server::config::ClusterState;
use oncekv_server::{Node, NodeConfig, Stopped};

pub use etcd_only::EtcdOnly;
pub use log_flags::{LogArgs, LogOutput};
pub use tls_flags::TlsArgs;
pub use tuning::Tuning;
pub use urls::{
    check_advertised_peer_url, parse_initial_cluster, parse_listen_urls, parse_peer_listen_urls,
    parse_url,
};

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
    let (peer_addrs, peer_unix_paths) = parse_peer_listen_urls(&args.listen_peer_urls)?;
    // Peers only on unix sockets: the member still needs a TCP peer listener, so it binds
    // an ephemeral loopback port that no URL names and nothing dials.
    let peer_addr = peer_addrs
        .first()
        .copied()
        .unwrap_or_else(|| std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
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
    config.more_peer_addrs = peer_addrs.get(1..).unwrap_or_default().to_vec();
    let unix_shown = peer_unix_paths
        .iter()
        .map(|p| format!("unix://{}", p.display()))
        .collect::<Vec<_>>()
        .join(", ");
    config.peer_unix_paths = peer_unix_paths;
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
    // The unix sockets, when peers listen only there: the loopback port is not for them.
    let peers_shown = match (unix_shown.is_empty(), peer_addrs.is_empty()) {
        (false, true) => unix_shown,
        (false, false) => format!("{}, {unix_shown}", node.peer_addr),
        (true, _) => node.peer_addr.to_string(),
    };
    eprintln!(
        "oncekv: member {} serving clients on {} and peers on {} (data in {})",
        args.name,
        std::iter::once(node.client_addr)
            .chain(client_addrs[1..].iter().copied())
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        peers_shown,
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
