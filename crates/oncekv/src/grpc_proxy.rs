//! `oncekv grpc-proxy start`: etcd's gRPC proxy command, with every write relayed to the
//! cluster exactly once (the proxy itself is the `oncekv-proxy` crate).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use oncekv_client::{ClientConfig, ClientTlsOptions};
use oncekv_proxy::{Listener, Proxy, ProxyConfig, ServerTls};
use tokio::net::TcpListener;

/// `oncekv grpc-proxy <command>`.
#[derive(Debug, Args)]
pub struct GrpcProxyArgs {
    #[command(subcommand)]
    command: ProxyCommand,
}

#[derive(Debug, Subcommand)]
enum ProxyCommand {
    /// Serve etcd's v3 API to unchanged etcd clients, relaying every write to the
    /// cluster through an oncekv session so that it applies exactly once.
    ///
    /// The leg from the proxy to the cluster is exactly-once: lost replies, leader
    /// changes and a member's death are retried under the write's own sequence number.
    /// The leg from the application to the proxy is a plain etcd call: run the proxy
    /// beside the application (on loopback), where that leg does not lose replies.
    Start(StartArgs),
}

/// Flags named as `etcd grpc-proxy start`'s where they mean the same.
#[derive(Debug, Args)]
pub struct StartArgs {
    /// The cluster's client URLs, comma separated
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:2379")]
    endpoints: Vec<String>,
    /// Address to serve clients on: HOST:PORT (port 0: any free port, printed at start),
    /// or unix:///PATH for a unix socket (clients dial unix:///PATH; etcdctl takes it as
    /// an endpoint)
    #[arg(long, default_value = "127.0.0.1:23790")]
    listen_addr: String,
    /// This proxy's client URL, which MemberList then reports as every member's (so
    /// clients that sync their endpoints from the member list stay on the proxy)
    #[arg(long, value_name = "URL")]
    advertise_client_url: Option<String>,
    /// A prefix every key lives under on the cluster (KV and Watch), removed in replies
    #[arg(long, default_value = "")]
    namespace: String,
    /// Also serve /metrics and /health on this address (http://HOST:PORT)
    #[arg(long, value_name = "URL")]
    metrics_addr: Option<String>,
    /// Toward the cluster: verify its certificates with this CA bundle
    #[arg(long, value_name = "FILE")]
    cacert: Option<PathBuf>,
    /// Toward the cluster: identify with this certificate (with --key)
    #[arg(long, value_name = "FILE")]
    cert: Option<PathBuf>,
    /// Toward the cluster: the private key of --cert
    #[arg(long, value_name = "FILE")]
    key: Option<PathBuf>,
    /// Toward the cluster: accept any server certificate
    #[arg(long)]
    insecure_skip_tls_verify: bool,
    /// Toward clients: serve TLS with this certificate (with --key-file)
    #[arg(long, value_name = "FILE")]
    cert_file: Option<PathBuf>,
    /// Toward clients: the private key of --cert-file
    #[arg(long, value_name = "FILE")]
    key_file: Option<PathBuf>,
    /// Toward clients: require client certificates signed by this CA
    #[arg(long, value_name = "FILE")]
    trusted_ca_file: Option<PathBuf>,
    /// How long the proxy keeps retrying one write (under its sequence number) before it
    /// answers "request timed out" (outcome unknown), e.g. 30s
    #[arg(long, default_value = "30s", value_parser = crate::cli::parse_duration)]
    retry_time: Duration,
    /// Requests relayed to the cluster at once; more wait for a slot
    #[arg(long, default_value_t = 10_000)]
    max_in_flight: usize,
    /// Threads that relay requests. One thread answers a lone client fastest (no hand-off
    /// between threads) and relays some 20,000 puts a second (README, "The grpc-proxy's
    /// cost"); give more to a proxy that many busy clients share
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    worker_threads: u16,
    /// Accepted for etcd's command lines (log detail is set with ONCEKV_LOG)
    #[arg(long)]
    debug: bool,
}

impl GrpcProxyArgs {
    /// The runtime's worker threads (`--worker-threads`).
    pub fn worker_threads(&self) -> usize {
        let ProxyCommand::Start(start) = &self.command;
        usize::from(start.worker_threads)
    }
}

pub async fn run(args: GrpcProxyArgs) -> Result<(), String> {
    let ProxyCommand::Start(args) = args.command;
    let mut config = ProxyConfig::new(args.endpoints.clone());
    config.client = ClientConfig {
        max_retry_time: args.retry_time,
        max_attempts: u32::MAX,
        ..ClientConfig::default()
    };
    let upstream_tls = ClientTlsOptions {
        ca_file: args.cacert,
        cert_file: args.cert,
        key_file: args.key,
        insecure_skip_verify: args.insecure_skip_tls_verify,
    };
    if upstream_tls != ClientTlsOptions::default() {
        config.client.tls = Some(upstream_tls);
    }
    config.namespace = args.namespace;
    config.advertise_client_url = args.advertise_client_url;
    config.max_in_flight = args.max_in_flight;
    config.tls = match (args.cert_file, args.key_file) {
        (Some(cert_file), Some(key_file)) => Some(ServerTls {
            cert_file,
            key_file,
            trusted_ca_file: args.trusted_ca_file,
        }),
        (None, None) if args.trusted_ca_file.is_none() => None,
        _ => {
            return Err(
                "--cert-file and --key-file go together (and --trusted-ca-file needs them)".into(),
            );
        }
    };
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let proxy = Proxy::new(config).map_err(|e| e.to_string())?;
    let (listener, local): (Listener, String) = match args
        .listen_addr
        .strip_prefix("unix://")
        .or_else(|| args.listen_addr.strip_prefix("unix:"))
    {
        Some(path) => {
            // A socket file left by an earlier run that was killed would refuse the
            // bind; a live proxy on it still answers, so only a dead file is removed.
            if std::os::unix::net::UnixStream::connect(path).is_err() {
                let _ = std::fs::remove_file(path);
            }
            let l = tokio::net::UnixListener::bind(path)
                .map_err(|e| format!("grpc-proxy: listening on unix socket {path}: {e}"))?;
            (l.into(), format!("unix://{path}"))
        }
        None => {
            let addr: SocketAddr = args.listen_addr.parse().map_err(|e| {
                format!(
                    "--listen-addr {}: {e} (give HOST:PORT or unix:///PATH)",
                    args.listen_addr
                )
            })?;
            let l = TcpListener::bind(addr)
                .await
                .map_err(|e| format!("grpc-proxy: listening on {addr}: {e}"))?;
            let local = l.local_addr().map_err(|e| format!("grpc-proxy: {e}"))?;
            (l.into(), format!("{scheme}://{local}"))
        }
    };
    if let Some(url) = &args.metrics_addr {
        let addr = url
            .trim_start_matches("http://")
            .parse::<SocketAddr>()
            .map_err(|e| format!("--metrics-addr {url}: {e} (give http://HOST:PORT)"))?;
        let metrics = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("grpc-proxy: --metrics-addr {addr}: {e}"))?;
        proxy.spawn_http(metrics);
    }
    println!(
        "oncekv grpc-proxy: serving etcd's API on {local} for the cluster at {}",
        args.endpoints.join(",")
    );
    tracing::info!("listening for grpc-proxy client requests on {local}");
    proxy
        .serve(listener, async {
            let _ = crate::stop_requested().await;
        })
        .await
        .map_err(|e| e.to_string())
}
