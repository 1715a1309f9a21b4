//! `oncekv dev`: a local cluster in one process, the embedded default.

use std::io::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use oncekv_server::{Member, Node, NodeConfig, Stopped};

use crate::serve::Tuning;

#[derive(Debug, Args)]
pub struct DevArgs {
    /// Number of members: 1, 3 or 5.
    #[arg(long, default_value_t = 3, value_parser = parse_nodes)]
    pub nodes: usize,
    /// Keep data here (reopened on the next start with the same ports). Default: a
    /// temporary directory removed on exit.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Serve TLS on every port with a throw-away CA made in DATA_DIR/tls (peers must
    /// present its certificates; so may clients), and print the etcdctl flags to use it.
    #[arg(long)]
    pub tls: bool,
    #[command(flatten)]
    pub tuning: Tuning,
}

fn parse_nodes(s: &str) -> Result<usize, String> {
    match s {
        "1" => Ok(1),
        "3" => Ok(3),
        "5" => Ok(5),
        _ => Err("a dev cluster has 1, 3 or 5 members".into()),
    }
}

/// etcd's local-cluster convention: member i serves clients on i2379 and peers on i2380.
const CLIENT_PORTS: [u16; 5] = [2379, 22379, 32379, 42379, 52379];
const LAYOUT_FILE: &str = "oncekv-dev-cluster.txt";

fn free_or_any(port: u16) -> Result<u16, String> {
    if TcpListener::bind(("127.0.0.1", port)).is_ok() {
        return Ok(port);
    }
    let l = TcpListener::bind(("127.0.0.1", 0)).map_err(|e| format!("finding a free port: {e}"))?;
    l.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

/// The members and their ports: read back from a reused data dir (raft remembers peer
/// addresses, so they must not change), or chosen fresh and recorded.
fn layout(dir: &Path, nodes: usize) -> Result<Vec<(String, u16, u16)>, String> {
    let file = dir.join(LAYOUT_FILE);
    if let Ok(text) = std::fs::read_to_string(&file) {
        let parsed: Result<Vec<_>, String> = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                match f.as_slice() {
                    [name, c, p] => Ok((
                        name.to_string(),
                        c.parse()
                            .map_err(|_| format!("{}: bad port {c}", file.display()))?,
                        p.parse()
                            .map_err(|_| format!("{}: bad port {p}", file.display()))?,
                    )),
                    _ => Err(format!("{}: malformed line {l:?}", file.display())),
                }
            })
            .collect();
        let parsed = parsed?;
        if parsed.len() != nodes {
            return Err(format!(
                "{} holds a {}-member cluster; start it with --nodes {}",
                dir.display(),
                parsed.len(),
                parsed.len()
            ));
        }
        return Ok(parsed);
    }
    let mut out = Vec::new();
    for (i, base) in CLIENT_PORTS.iter().take(nodes).enumerate() {
        let client = free_or_any(*base)?;
        let peer = free_or_any(base + 1)?;
        if client == peer {
            return Err("could not find distinct free ports".into());
        }
        out.push((format!("n{}", i + 1), client, peer));
    }
    let text: String = out
        .iter()
        .map(|(n, c, p)| format!("{n} {c} {p}\n"))
        .collect();
    std::fs::write(&file, text).map_err(|e| format!("writing {}: {e}", file.display()))?;
    Ok(out)
}

pub async fn run(args: DevArgs) -> Result<(), String> {
    let (dir, _temp) = match &args.data_dir {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(|e| format!("creating {}: {e}", d.display()))?;
            (d.clone(), None)
        }
        None => {
            let t = tempfile::Builder::new()
                .prefix("oncekv-dev-")
                .tempdir()
                .map_err(|e| format!("creating a temporary directory: {e}"))?;
            (t.path().to_path_buf(), Some(t))
        }
    };
    let layout = layout(&dir, args.nodes)?;
    let scheme = if args.tls { "https" } else { "http" };
    // Made again at every start: the certificates are throw-away, and a member's peers
    // check them against whichever CA this start made.
    let pki = if args.tls {
        let tls_dir = dir.join("tls");
        Some(
            oncekv_server::tls::DevPki::create(&tls_dir, &["root"])
                .map_err(|e| format!("making certificates in {}: {e}", tls_dir.display()))?,
        )
    } else {
        None
    };
    let members: Vec<Member> = layout
        .iter()
        .map(|(name, c, p)| Member {
            name: name.clone(),
            peer_url: format!("{scheme}://127.0.0.1:{p}"),
            client_url: format!("{scheme}://127.0.0.1:{c}"),
        })
        .collect();
    let mut nodes = Vec::new();
    // Bind every port before any member starts, so no member's first vote requests meet a
    // peer that is not listening yet.
    let mut listeners = Vec::new();
    for (name, c, p) in &layout {
        let bind = |port: u16| async move {
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            oncekv_server::services::bind(addr)
                .await
                .map_err(|e| format!("member {name}: listening on {addr}: {e}"))
        };
        listeners.push((bind(*c).await?, bind(*p).await?));
    }
    let mut starts = Vec::new();
    for ((name, c, p), (client, peer)) in layout.iter().zip(listeners) {
        let mut config = NodeConfig::new(
            name,
            dir.join(name),
            SocketAddr::from(([127, 0, 0, 1], *c)),
            SocketAddr::from(([127, 0, 0, 1], *p)),
            members.clone(),
        );
        args.tuning.apply(&mut config)?;
        if let Some(pki) = &pki {
            let (client_tls, peer_tls) = pki.member_tls(false);
            config.client_tls = Some(client_tls);
            config.peer_tls = Some(peer_tls);
        }
        starts.push(async move {
            Node::start_with_listeners(config, client, peer)
                .await
                .map_err(|e| format!("member {name}: {e}"))
        });
    }
    // Together: a member reopened on a large state loads it for seconds (off the
    // runtime), and one at a time the first would be left calling peers that are not up.
    for started in futures::future::join_all(starts).await {
        nodes.push(started?);
    }
    let started = Instant::now();
    while nodes.iter().all(|n| n.core.leader().is_none()) {
        if started.elapsed() > Duration::from_secs(30) {
            return Err("no leader elected within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let endpoints: Vec<String> = layout
        .iter()
        .map(|(_, c, _)| format!("127.0.0.1:{c}"))
        .collect();
    println!("oncekv dev: {}-member cluster ready", nodes.len());
    println!(
        "  data: {}{}",
        dir.display(),
        if args.data_dir.is_none() {
            " (temporary, removed on exit)"
        } else {
            ""
        }
    );
    for (name, c, p) in &layout {
        println!("  {name}: clients {scheme}://127.0.0.1:{c}  peers {scheme}://127.0.0.1:{p}");
    }
    let tls_flags = match &pki {
        Some(pki) => {
            let mut flags = format!(" --cacert={}", pki.ca_file.display());
            if let Some((_, cert, key)) = pki.clients.first() {
                flags += &format!(" --cert={} --key={}", cert.display(), key.display());
            }
            flags
        }
        None => String::new(),
    };
    if let Some((_, c, _)) = layout.first() {
        let curl = match &pki {
            Some(pki) => format!("curl --cacert {} ", pki.ca_file.display()),
            None => String::new(),
        };
        println!(
            "  metrics: {curl}{scheme}://127.0.0.1:{c}/metrics  health: {scheme}://127.0.0.1:{c}/health (every member serves both)"
        );
    }
    let endpoints: Vec<String> = match &pki {
        Some(_) => endpoints.iter().map(|e| format!("https://{e}")).collect(),
        None => endpoints,
    };
    println!("try:");
    println!(
        "  etcdctl{tls_flags} --endpoints={} put greeting hello",
        endpoints.join(",")
    );
    println!(
        "  etcdctl{tls_flags} --endpoints={} get greeting",
        endpoints.join(",")
    );
    println!("ctrl-c stops the cluster");
    let mut running: Vec<(String, Node)> = layout
        .iter()
        .map(|(name, _, _)| name.clone())
        .zip(nodes)
        .collect();
    while !running.is_empty() {
        let failed = futures::future::select_all(running.iter().map(|(_, n)| Box::pin(n.failed())));
        let (stopped, i) = tokio::select! {
            signal = crate::stop_requested() => {
                signal?;
                break;
            }
            (stopped, i, _) = failed => (stopped, i),
        };
        let (name, node) = running.remove(i);
        node.halt().await;
        match stopped {
            Stopped::Removed => {
                println!("oncekv dev: member {name} was removed from the cluster and stopped");
            }
            Stopped::Fatal(error) => {
                return Err(format!("member {name} stopped on a storage error: {error}"));
            }
        }
    }
    let mut nodes: Vec<Node> = running.into_iter().map(|(_, n)| n).collect();
    // stdout may be closed by now (a pipe whose reader left); stopping must not fail.
    let _ = writeln!(std::io::stdout(), "oncekv dev: stopping");
    // Every member stops: no hand-overs between them. The leader stops last, so that no
    // follower outlives it long enough to start an election: then all of them keep the
    // leader's term, and at the next start the leader resumes it without an election
    // (its log is marked as closed cleanly).
    nodes.sort_by_key(|n| n.core.leader() == Some(n.core.id()));
    for node in nodes {
        node.halt().await;
    }
    Ok(())
}
