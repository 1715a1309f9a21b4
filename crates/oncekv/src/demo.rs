//! `oncekv demo`: exactly-once under lost replies and leader kills, shown and checked.
//!
//! A local 3-member cluster with a fault proxy in front of every member. Concurrent
//! clients put to their own keys and grant leases with explicit ids, through the proxies,
//! while the proxies drop a share of the replies and the leader is killed and restarted
//! several times. Afterwards every key's version must equal the number of puts its client
//! made, and every lease grant must have succeeded exactly once. The same workload then
//! runs with an etcd-style untracked client, whose retries show up as extra versions.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use oncekv_client::{Client, ClientConfig, Error};
use oncekv_testkit::fault_proxy::FaultProxy;
use oncekv_testkit::local_cluster::LocalCluster;
use tokio::sync::{Mutex, watch};

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Concurrent clients.
    #[arg(long, default_value_t = 8)]
    pub clients: u64,
    /// Puts each client makes (to its own key).
    #[arg(long, default_value_t = 150)]
    pub puts: u64,
    /// Lease grants with explicit ids each client makes.
    #[arg(long, default_value_t = 10)]
    pub leases: u64,
    /// Share of replies the proxies drop (after the server ran the request).
    #[arg(long, default_value_t = 0.2)]
    pub drop_replies: f64,
    /// How many times the leader is killed and restarted during the run.
    #[arg(long, default_value_t = 3)]
    pub leader_kills: u64,
    /// Seed for the proxies' fault choices (random if not given).
    #[arg(long)]
    pub seed: Option<u64>,
}

/// What one client saw.
#[derive(Debug, Default, Clone)]
struct Outcome {
    puts_acked: u64,
    puts_unknown: u64,
    leases_granted: u64,
    leases_refused_as_existing: u64,
    leases_unknown: u64,
    errors: Vec<String>,
}

/// Totals of one workload run.
#[derive(Debug, Default)]
struct Report {
    requests: u64,
    retries: u64,
    outcome_unknown: u64,
    duplicates_absorbed: u64,
    leader_changes: u64,
    replies_dropped: u64,
    keys_checked: u64,
    applied_twice: u64,
    lost: u64,
    leases_ok: u64,
    leases_duplicated: u64,
    errors: Vec<String>,
}

struct Progress {
    puts: AtomicU64,
    leases: AtomicU64,
}

pub async fn run(args: DemoArgs) -> Result<(), String> {
    if !(0.0..1.0).contains(&args.drop_replies) {
        return Err("--drop-replies must be in [0, 1)".into());
    }
    let seed = args.seed.unwrap_or_else(rand_seed);
    println!(
        "oncekv demo: 3 members, {} clients x ({} puts + {} lease grants), {:.0}% of replies \
         dropped, {} leader kills, seed {seed}",
        args.clients,
        args.puts,
        args.leases,
        args.drop_replies * 100.0,
        args.leader_kills
    );
    let dir = tempfile::Builder::new()
        .prefix("oncekv-demo-")
        .tempdir()
        .map_err(|e| format!("creating a temporary directory: {e}"))?;

    println!("\n== exactly-once client (oncekv sessions)");
    let tracked = workload(&args, seed, dir.path(), "once", ClientConfig::default()).await?;
    print_report(&tracked, true);

    println!("\n== etcd-style client (same retries, no session)");
    let untracked = workload(&args, seed, dir.path(), "etcd", ClientConfig::untracked()).await?;
    print_report(&untracked, false);

    let held = tracked.applied_twice == 0
        && tracked.lost == 0
        && tracked.leases_duplicated == 0
        && tracked.errors.is_empty()
        && tracked.leases_ok == args.clients * args.leases;
    println!();
    if held {
        println!(
            "exactly-once held: {} keys and {} leases checked, 0 commands applied twice \
             (the etcd-style client applied {} twice)",
            tracked.keys_checked,
            tracked.leases_ok,
            untracked.applied_twice + untracked.leases_duplicated
        );
        Ok(())
    } else {
        Err("exactly-once did NOT hold in the run above".into())
    }
}

fn rand_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

/// Runs the workload on a fresh cluster under `root/name`.
async fn workload(
    args: &DemoArgs,
    seed: u64,
    root: &std::path::Path,
    name: &str,
    config: ClientConfig,
) -> Result<Report, String> {
    let cluster = LocalCluster::start(3, &root.join(name), LocalCluster::fast_timings)
        .await
        .map_err(|e| format!("starting the cluster: {e}"))?;
    let cluster = Arc::new(Mutex::new(cluster));
    let (proxies, endpoints) = {
        let c = cluster.lock().await;
        c.wait_leader(Duration::from_secs(10))
            .await
            .ok_or("no leader elected")?;
        let mut proxies = Vec::new();
        for (i, cfg) in c.configs.iter().enumerate() {
            let listen = SocketAddr::from(([127, 0, 0, 1], 0));
            let p =
                FaultProxy::start_with_seed(listen, cfg.client_addr, seed.wrapping_add(i as u64))
                    .await
                    .map_err(|e| format!("starting a proxy: {e}"))?;
            p.set_drop_replies(args.drop_replies);
            proxies.push(p);
        }
        let endpoints: Vec<String> = proxies
            .iter()
            .map(|p| format!("http://{}", p.addr()))
            .collect();
        (proxies, endpoints)
    };

    let progress = Arc::new(Progress {
        puts: AtomicU64::new(0),
        leases: AtomicU64::new(0),
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let total_ops = args.clients * (args.puts + args.leases);
    let killer = tokio::spawn(kill_leaders(
        cluster.clone(),
        args.leader_kills,
        progress.clone(),
        total_ops,
        stop_rx.clone(),
    ));
    let reporter = tokio::spawn(report_progress(
        progress.clone(),
        args.clients * args.puts,
        args.clients * args.leases,
        stop_rx,
    ));

    let mut clients = Vec::new();
    let mut tasks = Vec::new();
    for id in 0..args.clients {
        let client = Client::connect(&endpoints, config.clone()).map_err(|e| e.to_string())?;
        clients.push(client.clone());
        let (puts, leases, progress) = (args.puts, args.leases, progress.clone());
        let key = format!("demo/{name}/client-{id}");
        let lease_base = 1_000_000 * (id as i64 + 1);
        tasks.push(tokio::spawn(async move {
            client_workload(client, key, puts, lease_base, leases, progress).await
        }));
    }
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.map_err(|e| format!("client task failed: {e}"))?);
    }
    let _ = stop_tx.send(true);
    let leader_changes = killer.await.unwrap_or(0);
    let _ = reporter.await;

    // Check against the cluster directly (no proxy, no faults).
    for p in &proxies {
        p.heal();
    }
    let mut c = cluster.lock().await;
    for i in 0..c.len() {
        c.restart(i)
            .await
            .map_err(|e| format!("restarting member {i}: {e}"))?;
    }
    c.wait_leader(Duration::from_secs(10))
        .await
        .ok_or("no leader after the run")?;
    let checker =
        Client::connect(c.endpoints(), ClientConfig::default()).map_err(|e| e.to_string())?;
    let mut report = Report {
        leader_changes,
        ..Report::default()
    };
    for (id, o) in outcomes.iter().enumerate() {
        let key = format!("demo/{name}/client-{id}");
        let version = checker
            .get(key.as_str())
            .await
            .map_err(|e| e.to_string())?
            .map_or(0, |kv| kv.version) as u64;
        report.keys_checked += 1;
        report.applied_twice += version.saturating_sub(o.puts_acked + o.puts_unknown);
        report.lost += o.puts_acked.saturating_sub(version);
        report.leases_ok += o.leases_granted;
        report.leases_duplicated += o.leases_refused_as_existing;
        report.outcome_unknown += o.puts_unknown + o.leases_unknown;
        report.errors.extend(o.errors.iter().cloned());
    }
    let live = checker.lease_leases().await.map_err(|e| e.to_string())?;
    let expected = args.clients * args.leases;
    if (live.len() as u64) < report.leases_ok
        || report.leases_ok + report.leases_duplicated > expected
    {
        report.errors.push(format!(
            "{} leases exist, {} grants succeeded",
            live.len(),
            report.leases_ok
        ));
    }
    for client in &clients {
        let s = client.stats();
        report.requests += s.requests;
        report.retries += s.retries;
    }
    report.replies_dropped = proxies.iter().map(|p| p.stats().replies_dropped).sum();
    // Every replica counts the same duplicates; members restarted during the run lost
    // their in-memory counters, so the largest count is a lower bound.
    report.duplicates_absorbed = c
        .running()
        .map(|(_, n)| n.core.applied().read().sm.stats().duplicates)
        .max()
        .unwrap_or(0);
    drop(c);
    if let Ok(c) = Arc::try_unwrap(cluster) {
        c.into_inner().shutdown().await;
    }
    Ok(report)
}

async fn client_workload(
    client: Client,
    key: String,
    puts: u64,
    lease_base: i64,
    leases: u64,
    progress: Arc<Progress>,
) -> Outcome {
    let mut o = Outcome::default();
    for n in 0..puts {
        match client.put(key.as_str(), n.to_string()).await {
            Ok(_) => o.puts_acked += 1,
            Err(e) if e.is_outcome_unknown() => o.puts_unknown += 1,
            Err(e) => o.errors.push(format!("put {key}: {e}")),
        }
        progress.puts.fetch_add(1, Ordering::Relaxed);
    }
    for j in 0..leases {
        let id = lease_base + j as i64;
        match client.lease_grant(600, id).await {
            Ok(r) if r.id == id => o.leases_granted += 1,
            Ok(r) => o.errors.push(format!("lease {id} granted as {}", r.id)),
            // A retry of a grant that had already run: etcd's non-idempotent answer.
            Err(Error::LeaseAlreadyExists) => o.leases_refused_as_existing += 1,
            Err(e) if e.is_outcome_unknown() => o.leases_unknown += 1,
            Err(e) => o.errors.push(format!("lease grant {id}: {e}")),
        }
        progress.leases.fetch_add(1, Ordering::Relaxed);
    }
    o
}

/// Kills the leader `kills` times, evenly spread over the workload's progress (so the
/// kills land mid-run however fast the machine is); each stays down until the others have
/// elected a new leader, then restarts. Returns how many times the leader changed.
async fn kill_leaders(
    cluster: Arc<Mutex<LocalCluster>>,
    kills: u64,
    progress: Arc<Progress>,
    total_ops: u64,
    mut stop: watch::Receiver<bool>,
) -> u64 {
    let mut changes = 0;
    for k in 0..kills {
        let due = total_ops * (k + 1) / (kills + 1);
        while progress.puts.load(Ordering::Relaxed) + progress.leases.load(Ordering::Relaxed) < due
        {
            tokio::select! {
                _ = stop.changed() => return changes,
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
        }
        let mut c = cluster.lock().await;
        let Some(old) = c.leader() else { continue };
        c.stop(old).await;
        let new = c.wait_leader(Duration::from_secs(10)).await;
        if let Err(e) = c.restart(old).await {
            println!("  restarting member n{} failed: {e}", old + 1);
        }
        match new {
            Some(new) => {
                changes += 1;
                println!(
                    "  killed leader n{}; n{} took over; n{} restarted",
                    old + 1,
                    new + 1,
                    old + 1
                );
            }
            None => println!("  killed leader n{}; no new leader within 10 s", old + 1),
        }
    }
    changes
}

async fn report_progress(
    progress: Arc<Progress>,
    puts: u64,
    leases: u64,
    mut stop: watch::Receiver<bool>,
) {
    let start = Instant::now();
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        println!(
            "  [{:>4.1}s] puts {}/{puts}, lease grants {}/{leases}",
            start.elapsed().as_secs_f64(),
            progress.puts.load(Ordering::Relaxed),
            progress.leases.load(Ordering::Relaxed),
        );
    }
}

fn print_report(r: &Report, tracked: bool) {
    println!("  requests:                      {}", r.requests);
    println!("  retries:                       {}", r.retries);
    println!("  replies dropped by the proxies: {}", r.replies_dropped);
    println!("  leader changes:                {}", r.leader_changes);
    if tracked {
        println!(
            "  duplicates absorbed (servers): {} (at least)",
            r.duplicates_absorbed
        );
        println!("  outcome unknown:               {}", r.outcome_unknown);
    }
    println!("  keys checked:                  {}", r.keys_checked);
    println!(
        "  commands applied twice:        {}",
        r.applied_twice + r.leases_duplicated
    );
    println!("    puts applied twice:          {}", r.applied_twice);
    println!(
        "    lease grants run twice:      {} (answered \"lease already exists\")",
        r.leases_duplicated
    );
    println!("  acknowledged puts lost:        {}", r.lost);
    for e in r.errors.iter().take(5) {
        println!("  error: {e}");
    }
}
