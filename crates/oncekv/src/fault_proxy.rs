//! `oncekv fault-proxy`: the test kit's fault-injecting TCP proxy as a command, so that
//! scripts can put lost replies between any client (etcdctl, Go, Python) and a member.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use oncekv_testkit::fault_proxy::FaultProxy;

/// Relay `--listen` to `--upstream`, dropping a share of the replies.
#[derive(Debug, Args)]
pub struct FaultProxyArgs {
    /// Address to accept clients on (port 0: any free port, printed at start)
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The member (or any gRPC server) to relay to, HOST:PORT
    #[arg(long)]
    upstream: SocketAddr,
    /// Probability (0 to 1) that a reply is dropped: the request reaches the server, the
    /// answer never reaches the client, and the connection is then cut
    #[arg(long, default_value_t = 0.0)]
    drop_replies: f64,
    /// Seed of the random choices (default: random, printed), to replay a run
    #[arg(long)]
    seed: Option<u64>,
}

pub async fn run(args: FaultProxyArgs) -> Result<(), String> {
    if !(0.0..=1.0).contains(&args.drop_replies) {
        return Err(format!(
            "--drop-replies {} is not between 0 and 1",
            args.drop_replies
        ));
    }
    let seed = args.seed.unwrap_or_else(rand::random);
    let proxy = FaultProxy::start_with_seed(args.listen, args.upstream, seed)
        .await
        .map_err(|e| format!("fault-proxy: listening on {}: {e}", args.listen))?;
    proxy.set_drop_replies(args.drop_replies);
    println!(
        "oncekv fault-proxy: {} -> {} dropping {:.0} % of replies (seed {seed})",
        proxy.addr(),
        args.upstream,
        args.drop_replies * 100.0
    );
    let _ = crate::stop_requested().await;
    let stats = proxy.stats();
    println!(
        "oncekv fault-proxy: {} connections, {} replies dropped",
        stats.connections, stats.replies_dropped
    );
    tokio::time::timeout(Duration::from_secs(2), proxy.shutdown())
        .await
        .map_err(|_| "fault-proxy: shutdown timed out".to_string())
}
