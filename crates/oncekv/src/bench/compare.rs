//! `oncekv bench compare`: etcd and oncekv side by side on this machine.
//!
//! Each round starts a 3-member etcd (three processes, fsync on, as etcd runs by default)
//! and then a 3-member `oncekv dev` (one process, fsync on), or the other way round on
//! even rounds, each from empty data directories, and runs every workload at every
//! client count against the one running. The load generator is this process and the
//! same code for both: `bench put` / `bench range` over the etcd wire protocol, so the
//! first two columns are what a program switching from etcd sees. Against oncekv the put
//! workload runs twice more through the oncekv client, with exactly-once sessions and
//! without, which is what the promise costs.
//!
//! On a small shared machine a figure moves by tens of percent from one minute to the
//! next (fsync latency above all), so only ratios within a round mean much: the table
//! gives them per round, next to the fsync probe taken at the start.
//!
//! Written to `--out`: `compare.md` (the tables), `compare.svg` (throughput and latency
//! against the number of clients) and `runs.csv` (every run).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use clap::{Args, ValueEnum};
use plotters::prelude::*;
use rand::Rng;
use tokio::process::{Child, Command};

use super::{ClientKind, Common, Summary, Target, Workload, WriteOut, find_leader};

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Numbers of concurrent clients to run every workload with, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    pub clients: Vec<usize>,
    /// Workloads, in the order they run against each cluster: put (random keys), range
    /// (linearizable gets of the same key space, after the puts filled it).
    #[arg(long, value_delimiter = ',', default_value = "put,range")]
    pub workloads: Vec<CompareWorkload>,
    /// How long each run lasts, in seconds.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// Rounds: each starts both clusters afresh, odd rounds etcd first.
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// Size of each put's value, in bytes.
    #[arg(long, default_value_t = 256)]
    pub value_size: usize,
    /// Number of distinct keys (8-byte decimal keys; at most 100,000,000).
    #[arg(long, default_value_t = 100_000)]
    pub key_space: u64,
    /// Skip the oncekv-client columns (exactly-once and untracked puts).
    #[arg(long)]
    pub no_oncekv_client: bool,
    /// Directory for compare.md, compare.svg and runs.csv (created if needed).
    #[arg(long, default_value = "bench-compare")]
    pub out: PathBuf,
    /// The etcd server binary (3.4 or later; Debian's etcd-server package has one).
    #[arg(long, default_value = "etcd")]
    pub etcd: PathBuf,
    /// The oncekv binary whose `dev` cluster is measured (default: this one).
    #[arg(long)]
    pub oncekv: Option<PathBuf>,
    /// An extra flag for `oncekv dev` (repeat for several), e.g.
    /// `--oncekv-arg=--leader-lease-reads`.
    #[arg(long = "oncekv-arg", allow_hyphen_values = true)]
    pub oncekv_args: Vec<String>,
    /// Keep the clusters' data directories and logs (their path is printed).
    #[arg(long)]
    pub keep: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, ValueEnum)]
pub enum CompareWorkload {
    Put,
    Range,
}

impl CompareWorkload {
    fn name(self) -> &'static str {
        match self {
            CompareWorkload::Put => "put",
            CompareWorkload::Range => "range",
        }
    }
}

/// A line of the chart: a server and the client that drove it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Series {
    Etcd,
    Oncekv,
    OncekvTracked,
    OncekvUntracked,
}

impl Series {
    const ALL: [Series; 4] = [
        Series::Etcd,
        Series::Oncekv,
        Series::OncekvTracked,
        Series::OncekvUntracked,
    ];

    fn name(self) -> &'static str {
        match self {
            Series::Etcd => "etcd",
            Series::Oncekv => "oncekv",
            Series::OncekvTracked => "oncekv, oncekv client exactly-once",
            Series::OncekvUntracked => "oncekv, oncekv client untracked",
        }
    }

    fn color(self) -> RGBColor {
        match self {
            Series::Etcd => RGBColor(0x44, 0x77, 0xaa),
            Series::Oncekv => RGBColor(0xcc, 0x33, 0x11),
            Series::OncekvTracked => RGBColor(0x22, 0x88, 0x33),
            Series::OncekvUntracked => RGBColor(0xaa, 0x77, 0x00),
        }
    }

    fn client(self) -> ClientKind {
        match self {
            Series::Etcd | Series::Oncekv => ClientKind::Wire,
            Series::OncekvTracked => ClientKind::Tracked,
            Series::OncekvUntracked => ClientKind::Untracked,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum System {
    Etcd,
    Oncekv,
}

/// One run's figures.
#[derive(Debug, Clone)]
struct Run {
    round: usize,
    series: Series,
    workload: CompareWorkload,
    clients: usize,
    errors: u64,
    /// One-minute load average when the run started.
    load: f64,
    figures: Figures,
}

/// Requests completed, seconds, server CPU and latency: of one run, or of a series over
/// all rounds (counts summed, percentiles the mean of the rounds').
#[derive(Debug, Clone, Copy, Default)]
struct Figures {
    ok: u64,
    seconds: f64,
    /// CPU seconds the servers used (all members).
    cpu: f64,
    /// CPU seconds the load generator (this process) used.
    client_cpu: f64,
    p50_ms: f64,
    p99_ms: f64,
}

impl Figures {
    /// Requests per second (0 for no time).
    fn rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.ok as f64 / self.seconds
        } else {
            0.0
        }
    }

    /// Server CPU per request, in microseconds.
    fn cpu_per_op_us(&self) -> f64 {
        per_op_us(self.cpu, self.ok)
    }

    /// The load generator's CPU per request, in microseconds.
    fn client_cpu_per_op_us(&self) -> f64 {
        per_op_us(self.client_cpu, self.ok)
    }

    /// The most requests per second this machine could complete with this load generator
    /// however little the server cost: every CPU spent on the load generator alone.
    fn ceiling(&self, cpus: usize) -> f64 {
        let us = self.client_cpu_per_op_us();
        if us > 0.0 {
            cpus as f64 * 1e6 / us
        } else {
            0.0
        }
    }
}

fn per_op_us(cpu_seconds: f64, ok: u64) -> f64 {
    if ok == 0 {
        0.0
    } else {
        cpu_seconds / ok as f64 * 1e6
    }
}

pub async fn run(args: CompareArgs) -> Result<(), String> {
    validate(&args)?;
    tokio::select! {
        result = compare(&args) => result,
        _ = tokio::signal::ctrl_c() => Err("interrupted; the clusters were stopped".into()),
    }
}

fn validate(args: &CompareArgs) -> Result<(), String> {
    if args.clients.is_empty() || args.clients.contains(&0) {
        return Err("--clients: every count must be at least 1".into());
    }
    if args.workloads.is_empty() {
        return Err("--workloads: name at least one of put, range".into());
    }
    if args.rounds == 0 {
        return Err("--rounds must be at least 1".into());
    }
    if !(args.duration.is_finite() && args.duration > 0.0) {
        return Err(format!(
            "--duration {}: expected a positive number of seconds",
            args.duration
        ));
    }
    if args.key_space == 0 || args.key_space > 100_000_000 {
        return Err("--key-space must be between 1 and 100,000,000 (8-byte keys)".into());
    }
    Ok(())
}

async fn compare(args: &CompareArgs) -> Result<(), String> {
    let etcd_version = etcd_version(&args.etcd).await?;
    let oncekv = match &args.oncekv {
        Some(path) => path.clone(),
        None => std::env::current_exe().map_err(|e| format!("finding this binary: {e}"))?,
    };
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("creating {}: {e}", args.out.display()))?;
    let work = tempfile::Builder::new()
        .prefix("oncekv-compare.")
        .tempdir()
        .map_err(|e| format!("creating a temporary directory: {e}"))?;
    let fsync = fsync_probe(work.path())?;
    let rtt = round_trip_probe()?;
    eprintln!(
        "bench compare: etcd {etcd_version}, {} CPUs; fdatasync of a 256-byte append: p50 {:.0} µs, p99 {:.0} µs; loopback TCP round trip p50 {:.0} µs",
        cpus(),
        fsync.0,
        fsync.1,
        rtt
    );

    let mut value = vec![0u8; args.value_size];
    rand::thread_rng().fill(&mut value[..]);
    let value = Bytes::from(value);
    let mut runs = Vec::new();
    for round in 1..=args.rounds {
        let order = if round % 2 == 1 {
            [System::Etcd, System::Oncekv]
        } else {
            [System::Oncekv, System::Etcd]
        };
        for system in order {
            let dir = work.path().join(format!(
                "r{round}-{}",
                match system {
                    System::Etcd => "etcd",
                    System::Oncekv => "oncekv",
                }
            ));
            let cluster = match system {
                System::Etcd => Cluster::etcd(&args.etcd, &dir).await?,
                System::Oncekv => Cluster::oncekv(&oncekv, &args.oncekv_args, &dir).await?,
            };
            eprintln!(
                "bench compare: round {round}: {} ready at {}",
                cluster.name,
                cluster.endpoints.join(",")
            );
            let measured = measure_cluster(args, &cluster, system, round, &value).await;
            cluster.stop().await;
            runs.extend(measured?);
            if !args.keep {
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    }

    let report = Report {
        args,
        runs: &runs,
        etcd_version: &etcd_version,
        fsync,
        rtt,
        date: utc_now(),
    };
    let md = args.out.join("compare.md");
    let svg = args.out.join("compare.svg");
    let csv = args.out.join("runs.csv");
    std::fs::write(&md, report.markdown()).map_err(|e| format!("writing {}: {e}", md.display()))?;
    std::fs::write(&csv, report.csv()).map_err(|e| format!("writing {}: {e}", csv.display()))?;
    report.chart(&svg)?;
    print!("{}", report.summary());
    println!(
        "wrote {}, {} and {}",
        md.display(),
        svg.display(),
        csv.display()
    );
    if args.keep {
        eprintln!("bench compare: kept {}", work.keep().display());
    }
    let failed: u64 = runs.iter().map(|r| r.errors).sum();
    if failed > 0 {
        return Err(format!(
            "{failed} requests failed (see the errors column of {})",
            csv.display()
        ));
    }
    Ok(())
}

/// Every workload at every client count, with every client that applies, against one
/// running cluster.
async fn measure_cluster(
    args: &CompareArgs,
    cluster: &Cluster,
    system: System,
    round: usize,
    value: &Bytes,
) -> Result<Vec<Run>, String> {
    let series: &[Series] = match system {
        System::Etcd => &[Series::Etcd],
        System::Oncekv if args.no_oncekv_client => &[Series::Oncekv],
        // A cluster slows down as its history grows over the runs, so the two columns
        // compared with each other take turns going first.
        System::Oncekv if round % 2 == 1 => &[
            Series::Oncekv,
            Series::OncekvTracked,
            Series::OncekvUntracked,
        ],
        System::Oncekv => &[
            Series::Oncekv,
            Series::OncekvUntracked,
            Series::OncekvTracked,
        ],
    };
    // A second of puts first: leader elected, connections and caches warm.
    let warm_up = common(cluster, 16, 1.0, ClientKind::Wire, args.key_space);
    let _ = super::measure(
        &warm_up,
        Workload::Put {
            value: value.clone(),
        },
        false,
    )
    .await?;
    let mut runs = Vec::new();
    for &workload in &args.workloads {
        for &series in series {
            // The oncekv client's read path is the same as the wire's: only writes differ.
            if workload == CompareWorkload::Range && series.client() != ClientKind::Wire {
                continue;
            }
            for &clients in &args.clients {
                let c = common(
                    cluster,
                    clients,
                    args.duration,
                    series.client(),
                    args.key_space,
                );
                let load = load_average();
                let cpu_before = cluster.cpu_seconds();
                let client_cpu_before = process_cpu_seconds(std::process::id());
                let summary: Summary = super::measure(
                    &c,
                    match workload {
                        CompareWorkload::Put => Workload::Put {
                            value: value.clone(),
                        },
                        CompareWorkload::Range => Workload::Range {
                            serializable: false,
                        },
                    },
                    false,
                )
                .await?;
                let run = Run {
                    round,
                    series,
                    workload,
                    clients,
                    errors: summary.errors,
                    load,
                    figures: Figures {
                        ok: summary.ok,
                        seconds: summary.seconds,
                        cpu: cluster.cpu_seconds() - cpu_before,
                        client_cpu: process_cpu_seconds(std::process::id()) - client_cpu_before,
                        p50_ms: summary.latency_ms[1],
                        p99_ms: summary.latency_ms[3],
                    },
                };
                eprintln!(
                    "  round {round} {:<36} {:<5} {clients:>4} clients: {:>8.0}/s  p50 {:>6.2} ms  p99 {:>6.2} ms  server CPU {:>5.1} µs/op{}",
                    series.name(),
                    workload.name(),
                    run.figures.rate(),
                    run.figures.p50_ms,
                    run.figures.p99_ms,
                    run.figures.cpu_per_op_us(),
                    match &summary.first_error {
                        Some(e) => format!("  {} errors, the first: {e}", run.errors),
                        None => String::new(),
                    }
                );
                runs.push(run);
            }
        }
    }
    Ok(runs)
}

fn common(cluster: &Cluster, clients: usize, secs: f64, client: ClientKind, keys: u64) -> Common {
    Common {
        target: Target {
            endpoints: cluster.endpoints.clone(),
            connections: None,
            leader_only: false,
            timeout: 10.0,
            label: Some(cluster.name.to_string()),
            write_out: WriteOut::Simple,
        },
        clients,
        total: 0,
        duration: Some(secs),
        key_size: 8,
        key_space: keys,
        client,
    }
}

/// A running 3-member cluster; its processes are killed when it is dropped.
struct Cluster {
    name: &'static str,
    children: Vec<Child>,
    endpoints: Vec<String>,
}

impl Cluster {
    async fn etcd(etcd: &Path, dir: &Path) -> Result<Cluster, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let ports = free_ports(6)?;
        let peer = |i: usize| format!("http://127.0.0.1:{}", ports[2 * i + 1]);
        let client = |i: usize| format!("http://127.0.0.1:{}", ports[2 * i]);
        let initial: Vec<String> = (0..3).map(|i| format!("e{}={}", i + 1, peer(i))).collect();
        let mut children = Vec::new();
        for i in 0..3 {
            let log = log_file(&dir.join(format!("e{}.log", i + 1)))?;
            let child = Command::new(etcd)
                .arg("--name")
                .arg(format!("e{}", i + 1))
                .arg("--data-dir")
                .arg(dir.join(format!("e{}", i + 1)))
                .args(["--listen-client-urls", &client(i)])
                .args(["--advertise-client-urls", &client(i)])
                .args(["--listen-peer-urls", &peer(i)])
                .args(["--initial-advertise-peer-urls", &peer(i)])
                .args(["--initial-cluster", &initial.join(",")])
                .args(["--initial-cluster-token", "oncekv-bench-compare"])
                .args(["--initial-cluster-state", "new"])
                .args(["--logger", "zap", "--log-outputs", "stderr"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| format!("starting {}: {e}", etcd.display()))?;
            children.push(child);
        }
        let mut cluster = Cluster {
            name: "etcd",
            children,
            endpoints: (0..3).map(client).collect(),
        };
        cluster.wait_for_leader(dir, "e*.log").await?;
        Ok(cluster)
    }

    async fn oncekv(oncekv: &Path, extra: &[String], dir: &Path) -> Result<Cluster, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let out_path = dir.join("out");
        let child = Command::new(oncekv)
            .arg("dev")
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log_file(&out_path)?)
            .stderr(log_file(&dir.join("log"))?)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting {} dev: {e}", oncekv.display()))?;
        let mut cluster = Cluster {
            name: "oncekv",
            children: vec![child],
            endpoints: Vec::new(),
        };
        // `oncekv dev` prints "  n1: clients http://127.0.0.1:2379  peers ..." per member
        // (other ports when those are taken) before "ctrl-c stops the cluster".
        let started = Instant::now();
        loop {
            let out = std::fs::read_to_string(&out_path).unwrap_or_default();
            if out.contains("ctrl-c") {
                cluster.endpoints = out
                    .lines()
                    .filter_map(|l| l.split_once("clients ").map(|(_, rest)| rest))
                    .filter_map(|rest| rest.split_whitespace().next())
                    .map(str::to_string)
                    .collect();
                break;
            }
            cluster.check_running(dir, "log")?;
            if started.elapsed() > Duration::from_secs(60) {
                return Err(format!(
                    "oncekv dev did not start within 60 s; its output: {out}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if cluster.endpoints.is_empty() {
            return Err(format!(
                "no client endpoints in the output of oncekv dev ({})",
                out_path.display()
            ));
        }
        cluster.wait_for_leader(dir, "log").await?;
        Ok(cluster)
    }

    /// Until a member reports a leader (30 s at most).
    async fn wait_for_leader(&mut self, dir: &Path, logs: &str) -> Result<(), String> {
        let started = Instant::now();
        loop {
            if find_leader(&self.endpoints, Duration::from_secs(1))
                .await
                .is_ok()
            {
                return Ok(());
            }
            self.check_running(dir, logs)?;
            if started.elapsed() > Duration::from_secs(30) {
                return Err(format!(
                    "{} elected no leader within 30 s (logs: {}/{logs})",
                    self.name,
                    dir.display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn check_running(&mut self, dir: &Path, logs: &str) -> Result<(), String> {
        for child in &mut self.children {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "{} exited while starting ({status}); logs: {}/{logs}",
                    self.name,
                    dir.display()
                ));
            }
        }
        Ok(())
    }

    /// CPU seconds (user + system) the cluster's processes have used so far.
    fn cpu_seconds(&self) -> f64 {
        self.children
            .iter()
            .filter_map(Child::id)
            .map(process_cpu_seconds)
            .sum()
    }

    async fn stop(mut self) {
        for child in &mut self.children {
            let _ = child.kill().await;
        }
    }
}

fn log_file(path: &Path) -> Result<std::fs::File, String> {
    std::fs::File::create(path).map_err(|e| format!("creating {}: {e}", path.display()))
}

/// `n` TCP ports free on 127.0.0.1 right now (the listeners are closed again, so another
/// program could take one before the cluster binds it: the cluster then fails to start,
/// with its log named).
fn free_ports(n: usize) -> Result<Vec<u16>, String> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("finding free ports: {e}"))?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("finding free ports: {e}"))
}

/// Fields 14 and 15 of /proc/PID/stat (utime, stime), in seconds. The kernel reports
/// them in USER_HZ, which is 100 on every Linux architecture this runs on.
fn process_cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // The command name (field 2) is in parentheses and may hold spaces.
    let Some((_, rest)) = stat.rsplit_once(") ") else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // `rest` starts at field 3, so fields 14 and 15 are at 11 and 12.
    (ticks(11) + ticks(12)) as f64 / 100.0
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

async fn etcd_version(etcd: &Path) -> Result<String, String> {
    let out = Command::new(etcd)
        .arg("--version")
        .output()
        .await
        .map_err(|e| {
            format!(
                "running {} --version: {e} (install etcd 3.4 or later, e.g. Debian's etcd-server, or pass --etcd PATH)",
                etcd.display()
            )
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("etcd Version: "))
        .map(|v| v.trim().to_string())
        .ok_or_else(|| {
            format!(
                "{} --version printed no \"etcd Version:\" line: {text}",
                etcd.display()
            )
        })
}

/// fdatasync latency of 256-byte appends to a file in `dir` (what a log write costs):
/// (p50, p99) in microseconds over 500 appends.
fn fsync_probe(dir: &Path) -> Result<(f64, f64), String> {
    let path = dir.join("fsync-probe");
    let fail = |e: std::io::Error| format!("fsync probe in {}: {e}", dir.display());
    let mut file = std::fs::File::create(&path).map_err(fail)?;
    let block = [0x5au8; 256];
    let mut times = Vec::with_capacity(500);
    for _ in 0..500 {
        file.write_all(&block).map_err(fail)?;
        let start = Instant::now();
        file.sync_data().map_err(fail)?;
        times.push(start.elapsed().as_secs_f64() * 1e6);
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    times.sort_by(f64::total_cmp);
    Ok((times[times.len() / 2], times[times.len() * 99 / 100]))
}

/// The p50, in microseconds, of 2,000 round trips of a 64-byte message over a loopback
/// TCP connection (Nagle off) to a thread echoing it: the network's share of the floor
/// under one write's latency.
fn round_trip_probe() -> Result<f64, String> {
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    let fail = |e: std::io::Error| format!("round-trip probe: {e}");
    let listener = TcpListener::bind("127.0.0.1:0").map_err(fail)?;
    let addr = listener.local_addr().map_err(fail)?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut conn, _) = listener.accept()?;
        conn.set_nodelay(true)?;
        let mut buf = [0u8; 64];
        while conn.read_exact(&mut buf).is_ok() {
            conn.write_all(&buf)?;
        }
        Ok(())
    });
    let mut conn = TcpStream::connect(addr).map_err(fail)?;
    conn.set_nodelay(true).map_err(fail)?;
    let mut buf = [0x5au8; 64];
    let mut times = Vec::with_capacity(2_000);
    for _ in 0..2_000 {
        let start = Instant::now();
        conn.write_all(&buf).map_err(fail)?;
        conn.read_exact(&mut buf).map_err(fail)?;
        times.push(start.elapsed().as_secs_f64() * 1e6);
    }
    drop(conn);
    let _ = echo.join();
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// "YYYY-MM-DD HH:MM UTC" for now.
fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc_date(secs)
}

fn utc_date(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let (hour, minute) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    // Civil date from days since 1970-01-01 (proleptic Gregorian calendar, in 400-year
    // eras of 146,097 days that start on March 1st).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02} UTC")
}

struct Report<'a> {
    args: &'a CompareArgs,
    runs: &'a [Run],
    etcd_version: &'a str,
    fsync: (f64, f64),
    /// Loopback TCP round trip p50, µs.
    rtt: f64,
    date: String,
}

type Key = (CompareWorkload, Series, usize);

impl Report<'_> {
    /// Each series' figures over all rounds.
    fn aggregates(&self) -> BTreeMap<Key, Figures> {
        let mut sums: BTreeMap<Key, (Figures, usize)> = BTreeMap::new();
        for r in self.runs {
            let (a, rounds) = sums.entry((r.workload, r.series, r.clients)).or_default();
            a.ok += r.figures.ok;
            a.seconds += r.figures.seconds;
            a.cpu += r.figures.cpu;
            a.client_cpu += r.figures.client_cpu;
            a.p50_ms += r.figures.p50_ms;
            a.p99_ms += r.figures.p99_ms;
            *rounds += 1;
        }
        sums.into_iter()
            .map(|(key, (mut a, rounds))| {
                a.p50_ms /= rounds as f64;
                a.p99_ms /= rounds as f64;
                (key, a)
            })
            .collect()
    }

    /// Rate of `a` over rate of `b` in each round both ran.
    fn per_round_ratios(
        &self,
        w: CompareWorkload,
        clients: usize,
        a: Series,
        b: Series,
    ) -> Vec<f64> {
        let rate = |s: Series, round: usize| {
            self.runs
                .iter()
                .find(|r| {
                    r.workload == w && r.series == s && r.clients == clients && r.round == round
                })
                .map(|r| r.figures.rate())
        };
        (1..=self.args.rounds)
            .filter_map(|round| match (rate(a, round), rate(b, round)) {
                (Some(x), Some(y)) if y > 0.0 => Some(x / y),
                _ => None,
            })
            .collect()
    }

    fn markdown(&self) -> String {
        let agg = self.aggregates();
        let mut md = String::new();
        let _ = writeln!(md, "# oncekv and etcd on one machine, {}\n", self.date);
        let _ = writeln!(
            md,
            "{} CPUs; fdatasync of a 256-byte append p50 {:.0} µs, p99 {:.0} µs; loopback TCP \
             round trip p50 {:.0} µs. etcd {} \
             (3 processes) and oncekv {} (`oncekv dev`: 3 members in one process), fsync on, \
             on 127.0.0.1; {} round(s) of {} s runs, each round from empty data \
             directories, odd rounds etcd first. Load generator: `oncekv bench` in the same \
             process for both (etcd v3 wire protocol, one gRPC connection per member, \
             requests spread over all members; followers forward to the leader).\n",
            cpus(),
            self.fsync.0,
            self.fsync.1,
            self.rtt,
            self.etcd_version,
            env!("CARGO_PKG_VERSION"),
            self.args.rounds,
            self.args.duration,
        );
        let _ = writeln!(
            md,
            "Command: `oncekv bench compare --clients {} --workloads {} --duration {} --rounds {} --value-size {} --key-space {}{}`\n",
            self.args
                .clients
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(","),
            self.args
                .workloads
                .iter()
                .map(|w| w.name())
                .collect::<Vec<_>>()
                .join(","),
            self.args.duration,
            self.args.rounds,
            self.args.value_size,
            self.args.key_space,
            self.args
                .oncekv_args
                .iter()
                .map(|a| format!(" --oncekv-arg={a}"))
                .collect::<String>(),
        );
        for &w in &self.args.workloads {
            let _ = match w {
                CompareWorkload::Put => writeln!(
                    md,
                    "## put ({}-byte values, 8-byte keys over {} keys)\n",
                    self.args.value_size, self.args.key_space
                ),
                CompareWorkload::Range => writeln!(
                    md,
                    "## range (linearizable gets of one key, over {} keys)\n",
                    self.args.key_space
                ),
            };
            let _ = writeln!(
                md,
                "| clients | etcd req/s | oncekv req/s | oncekv/etcd | per round | etcd p50 / p99 ms | oncekv p50 / p99 ms | server CPU µs/req etcd / oncekv | load generator CPU µs/req etcd / oncekv |"
            );
            let _ = writeln!(
                md,
                "| ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"
            );
            for &c in &self.args.clients {
                let e = agg.get(&(w, Series::Etcd, c)).copied().unwrap_or_default();
                let o = agg
                    .get(&(w, Series::Oncekv, c))
                    .copied()
                    .unwrap_or_default();
                let _ = writeln!(
                    md,
                    "| {c} | {:.0} | {:.0} | **{}** | {} | {:.2} / {:.2} | {:.2} / {:.2} | {:.0} / {:.0} | {:.0} / {:.0} |",
                    e.rate(),
                    o.rate(),
                    ratio(o.rate(), e.rate()),
                    ratios(&self.per_round_ratios(w, c, Series::Oncekv, Series::Etcd)),
                    e.p50_ms,
                    e.p99_ms,
                    o.p50_ms,
                    o.p99_ms,
                    e.cpu_per_op_us(),
                    o.cpu_per_op_us(),
                    e.client_cpu_per_op_us(),
                    o.client_cpu_per_op_us(),
                );
            }
            // One write's floor: it is durable on a quorum once the leader's and a
            // follower's fsync are done, and it crosses the network at least twice (client
            // to leader and back, leader to follower and back).
            if w == CompareWorkload::Put && self.args.clients.contains(&1) {
                let e = agg.get(&(w, Series::Etcd, 1)).copied().unwrap_or_default();
                let o = agg
                    .get(&(w, Series::Oncekv, 1))
                    .copied()
                    .unwrap_or_default();
                let floor_ms = (self.fsync.0 + 2.0 * self.rtt) / 1000.0;
                if o.p50_ms > 0.0 && e.p50_ms > 0.0 {
                    let _ = writeln!(
                        md,
                        "\nOne client's put against the floor of one fdatasync plus two loopback \
                         round trips ({floor_ms:.2} ms): oncekv's p50 is {} times it, etcd's {}.",
                        ratio(o.p50_ms, floor_ms),
                        ratio(e.p50_ms, floor_ms),
                    );
                }
            }
            // What the machine allows at the most clients: a ratio to etcd cannot exceed
            // this, however cheap oncekv's side, since the load runs on the same CPUs.
            if let Some(&c) = self.args.clients.iter().max() {
                let e = agg.get(&(w, Series::Etcd, c)).copied().unwrap_or_default();
                let o = agg
                    .get(&(w, Series::Oncekv, c))
                    .copied()
                    .unwrap_or_default();
                let ceiling = o.ceiling(cpus());
                if ceiling > 0.0 && e.rate() > 0.0 {
                    let _ = writeln!(
                        md,
                        "\nThe load generator shares the machine: at {c} clients it spent {:.0} µs \
                         of CPU per request against oncekv, so {} CPUs complete at most {:.0} \
                         requests/s even with a server that cost nothing, {} times etcd's rate.",
                        o.client_cpu_per_op_us(),
                        cpus(),
                        ceiling,
                        ratio(ceiling, e.rate()),
                    );
                }
            }
            let tracked = self
                .args
                .clients
                .iter()
                .any(|&c| agg.contains_key(&(w, Series::OncekvTracked, c)));
            if tracked {
                let _ = writeln!(
                    md,
                    "\nThe oncekv client against oncekv (it sends to the leader; one client, one session, per member endpoint, shared by the request loops):\n"
                );
                let _ = writeln!(
                    md,
                    "| clients | exactly-once req/s | untracked req/s | exactly-once/untracked | per round | exactly-once p50 / p99 ms | untracked p50 / p99 ms |"
                );
                let _ = writeln!(md, "| ---: | ---: | ---: | ---: | --- | ---: | ---: |");
                for &c in &self.args.clients {
                    let t = agg
                        .get(&(w, Series::OncekvTracked, c))
                        .copied()
                        .unwrap_or_default();
                    let u = agg
                        .get(&(w, Series::OncekvUntracked, c))
                        .copied()
                        .unwrap_or_default();
                    let _ = writeln!(
                        md,
                        "| {c} | {:.0} | {:.0} | **{}** | {} | {:.2} / {:.2} | {:.2} / {:.2} |",
                        t.rate(),
                        u.rate(),
                        ratio(t.rate(), u.rate()),
                        ratios(&self.per_round_ratios(
                            w,
                            c,
                            Series::OncekvTracked,
                            Series::OncekvUntracked
                        )),
                        t.p50_ms,
                        t.p99_ms,
                        u.p50_ms,
                        u.p99_ms,
                    );
                }
            }
            let _ = writeln!(md);
        }
        let _ = writeln!(
            md,
            "Rates are requests over seconds summed across rounds; latencies are the mean of the rounds' percentiles. Every run is in runs.csv; the chart is compare.svg."
        );
        md
    }

    /// The ratio lines printed at the end of the run.
    fn summary(&self) -> String {
        let agg = self.aggregates();
        let mut out = String::new();
        for &w in &self.args.workloads {
            for &c in &self.args.clients {
                let e = agg.get(&(w, Series::Etcd, c)).copied().unwrap_or_default();
                let o = agg
                    .get(&(w, Series::Oncekv, c))
                    .copied()
                    .unwrap_or_default();
                let _ = writeln!(
                    out,
                    "{:<5} {c:>4} clients: etcd {:>8.0}/s  oncekv {:>8.0}/s  oncekv/etcd {} (per round {})",
                    w.name(),
                    e.rate(),
                    o.rate(),
                    ratio(o.rate(), e.rate()),
                    ratios(&self.per_round_ratios(w, c, Series::Oncekv, Series::Etcd)),
                );
            }
        }
        out
    }

    fn csv(&self) -> String {
        let mut out = String::from(
            "round,server,client,workload,clients,ok,errors,seconds,rate,p50_ms,p99_ms,server_cpu_s,client_cpu_s,load\n",
        );
        for r in self.runs {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{:.3},{:.1},{:.3},{:.3},{:.2},{:.2},{:.2}",
                r.round,
                if r.series == Series::Etcd {
                    "etcd"
                } else {
                    "oncekv"
                },
                r.series.client().name(),
                r.workload.name(),
                r.clients,
                r.figures.ok,
                r.errors,
                r.figures.seconds,
                r.figures.rate(),
                r.figures.p50_ms,
                r.figures.p99_ms,
                r.figures.cpu,
                r.figures.client_cpu,
                r.load
            );
        }
        out
    }

    /// Per workload, a column of two panels: requests/s, then p50 (thick) and p99 (thin)
    /// latency, against the number of clients.
    fn chart(&self, path: &Path) -> Result<(), String> {
        let fail = |e: &dyn std::fmt::Display| format!("drawing {}: {e}", path.display());
        let agg = self.aggregates();
        let columns = self.args.workloads.len();
        let root = SVGBackend::new(path, (560 * columns as u32, 760)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| fail(&e))?;
        let root = root
            .titled(
                &format!(
                    "oncekv vs etcd {}, 3 members each, {} CPUs, fdatasync p50 {:.0} µs ({})",
                    self.etcd_version,
                    cpus(),
                    self.fsync.0,
                    self.date
                ),
                ("sans-serif", 18),
            )
            .map_err(|e| fail(&e))?;
        let panels = root.split_evenly((2, columns));
        // The client counts sit at evenly spaced positions (1, 16, 64 would crowd a
        // linear axis and get unlabelled ticks on a log one), each labelled with its count.
        let counts = &self.args.clients;
        let x_range = -0.3..(counts.len().max(1) - 1) as f64 + 0.3;
        let x_label = |x: &f64| {
            let i = x.round();
            match counts.get(i as usize) {
                Some(c) if (x - i).abs() < 1e-6 && i >= 0.0 => c.to_string(),
                _ => String::new(),
            }
        };
        for (col, &w) in self.args.workloads.iter().enumerate() {
            let lines: Vec<(Series, Vec<(f64, Figures)>)> = Series::ALL
                .iter()
                .map(|&s| {
                    let points = self
                        .args
                        .clients
                        .iter()
                        .enumerate()
                        .filter_map(|(i, &c)| agg.get(&(w, s, c)).map(|a| (i as f64, *a)))
                        .collect();
                    (s, points)
                })
                .filter(|(_, p): &(Series, Vec<_>)| !p.is_empty())
                .collect();
            let top = lines
                .iter()
                .flat_map(|(_, p)| p.iter().map(|(_, a)| a.rate()))
                .fold(1.0, f64::max);
            let mut chart = ChartBuilder::on(&panels[col])
                .caption(format!("{}: throughput", w.name()), ("sans-serif", 16))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(70)
                .build_cartesian_2d(x_range.clone(), 0.0..top * 1.15)
                .map_err(|e| fail(&e))?;
            chart
                .configure_mesh()
                .x_desc("clients")
                .y_desc("requests/s")
                .light_line_style(TRANSPARENT)
                .disable_x_mesh()
                .x_labels(counts.len() * 10 + 1)
                .x_label_formatter(&x_label)
                .y_label_formatter(&|y| format!("{y:.0}"))
                .draw()
                .map_err(|e| fail(&e))?;
            for (s, points) in &lines {
                let color = s.color();
                let xy: Vec<(f64, f64)> = points.iter().map(|(c, a)| (*c, a.rate())).collect();
                chart
                    .draw_series(LineSeries::new(xy.clone(), color.stroke_width(2)))
                    .map_err(|e| fail(&e))?
                    .label(s.name())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                    });
                chart
                    .draw_series(xy.iter().map(|&p| Circle::new(p, 3, color.filled())))
                    .map_err(|e| fail(&e))?;
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(|e| fail(&e))?;

            let top = lines
                .iter()
                .flat_map(|(_, p)| p.iter().map(|(_, a)| a.p99_ms))
                .fold(0.1, f64::max);
            let mut chart = ChartBuilder::on(&panels[columns + col])
                .caption(
                    format!("{}: latency, p50 (thick) and p99 (thin)", w.name()),
                    ("sans-serif", 16),
                )
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(70)
                .build_cartesian_2d(x_range.clone(), 0.0..top * 1.15)
                .map_err(|e| fail(&e))?;
            chart
                .configure_mesh()
                .x_desc("clients")
                .y_desc("ms")
                .light_line_style(TRANSPARENT)
                .disable_x_mesh()
                .x_labels(counts.len() * 10 + 1)
                .x_label_formatter(&x_label)
                .draw()
                .map_err(|e| fail(&e))?;
            for (s, points) in &lines {
                let color = s.color();
                let p50: Vec<(f64, f64)> = points.iter().map(|(c, a)| (*c, a.p50_ms)).collect();
                let p99: Vec<(f64, f64)> = points.iter().map(|(c, a)| (*c, a.p99_ms)).collect();
                chart
                    .draw_series(LineSeries::new(p50.clone(), color.stroke_width(3)))
                    .map_err(|e| fail(&e))?;
                chart
                    .draw_series(p50.iter().map(|&p| Circle::new(p, 3, color.filled())))
                    .map_err(|e| fail(&e))?;
                chart
                    .draw_series(LineSeries::new(p99, color.stroke_width(1)))
                    .map_err(|e| fail(&e))?;
            }
        }
        root.present().map_err(|e| fail(&e))?;
        Ok(())
    }
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}", a / b)
    } else {
        "-".into()
    }
}

fn ratios(r: &[f64]) -> String {
    if r.is_empty() {
        return "-".into();
    }
    r.iter()
        .map(|x| format!("{x:.2}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_utc_calendar_dates() {
        assert_eq!(utc_date(0), "1970-01-01 00:00 UTC");
        // 2000-02-29 (a leap day of a century year) 12:34.
        assert_eq!(utc_date(951_827_640), "2000-02-29 12:34 UTC");
        assert_eq!(utc_date(1_795_564_800), "2026-11-25 00:00 UTC");
    }

    fn run(round: usize, series: Series, clients: usize, ok: u64, seconds: f64) -> Run {
        Run {
            round,
            series,
            workload: CompareWorkload::Put,
            clients,
            errors: 0,
            load: 0.0,
            figures: Figures {
                ok,
                seconds,
                cpu: ok as f64 * 1e-4,
                client_cpu: ok as f64 * 5e-5,
                p50_ms: round as f64,
                p99_ms: 10.0 * round as f64,
            },
        }
    }

    fn args() -> CompareArgs {
        CompareArgs {
            clients: vec![1, 64],
            workloads: vec![CompareWorkload::Put],
            duration: 1.0,
            rounds: 2,
            value_size: 256,
            key_space: 1000,
            no_oncekv_client: false,
            out: PathBuf::from("unused"),
            etcd: PathBuf::from("etcd"),
            oncekv: None,
            oncekv_args: Vec::new(),
            keep: false,
        }
    }

    #[test]
    fn ratios_are_taken_within_rounds_and_over_summed_rates() {
        let runs = vec![
            run(1, Series::Etcd, 64, 1000, 1.0),
            run(1, Series::Oncekv, 64, 3000, 1.0),
            run(2, Series::Oncekv, 64, 1000, 1.0),
            run(2, Series::Etcd, 64, 1000, 2.0),
        ];
        let args = args();
        let report = Report {
            args: &args,
            runs: &runs,
            etcd_version: "3.4.23",
            fsync: (150.0, 300.0),
            rtt: 25.0,
            date: utc_date(0),
        };
        // Round 1: 3000/1000; round 2: 1000/500.
        let per_round =
            report.per_round_ratios(CompareWorkload::Put, 64, Series::Oncekv, Series::Etcd);
        assert_eq!(per_round, vec![3.0, 2.0]);
        let agg = report.aggregates();
        let e = agg[&(CompareWorkload::Put, Series::Etcd, 64)];
        let o = agg[&(CompareWorkload::Put, Series::Oncekv, 64)];
        // Summed: 2000 puts in 3 s against 4000 in 2 s.
        assert!((o.rate() / e.rate() - 3.0).abs() < 1e-9);
        assert!((o.p50_ms - 1.5).abs() < 1e-9, "mean of the rounds' p50");
        let md = report.markdown();
        assert!(
            md.contains("| 64 | 667 | 2000 | **3.00** | 3.00 2.00 |"),
            "{md}"
        );
        // No run at 1 client: the row says so instead of dividing by zero.
        assert!(md.contains("| 1 | 0 | 0 | **-** | - |"), "{md}");
        // The load generator's 50 µs per request: 2 CPUs complete at most 40,000/s.
        assert!((o.client_cpu_per_op_us() - 50.0).abs() < 1e-9);
        assert!((o.ceiling(2) - 40_000.0).abs() < 1e-6);
        assert!(
            md.contains("at 64 clients it spent 50 µs of CPU per request against oncekv"),
            "{md}"
        );
        let csv = report.csv();
        assert_eq!(csv.lines().count(), 5);
        assert!(
            csv.contains("\n2,etcd,wire,put,64,1000,0,2.000,500.0,"),
            "{csv}"
        );
    }

    #[test]
    fn the_chart_is_an_svg_with_every_series() {
        let runs = vec![
            run(1, Series::Etcd, 1, 900, 1.0),
            run(1, Series::Etcd, 64, 6000, 1.0),
            run(1, Series::Oncekv, 1, 800, 1.0),
            run(1, Series::Oncekv, 64, 15000, 1.0),
            run(1, Series::OncekvTracked, 64, 14000, 1.0),
        ];
        let mut args = args();
        args.rounds = 1;
        let report = Report {
            args: &args,
            runs: &runs,
            etcd_version: "3.4.23",
            fsync: (150.0, 300.0),
            rtt: 25.0,
            date: utc_date(0),
        };
        // The floor: 150 µs fdatasync + 2 x 25 µs round trips; both p50s are 1 ms.
        let md = report.markdown();
        assert!(
            md.contains("(0.20 ms): oncekv's p50 is 5.00 times it, etcd's 5.00."),
            "{md}"
        );
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("c.svg");
        report.chart(&path).unwrap_or_else(|e| panic!("{e}"));
        let svg = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
        for label in [
            "etcd",
            "oncekv, oncekv client exactly-once",
            "put: throughput",
        ] {
            assert!(svg.contains(label), "no {label:?} in the chart");
        }
        assert!(
            !svg.contains("untracked"),
            "a series with no runs is not drawn"
        );
    }
}
