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
//!
//! `--scale` runs another experiment, the cost as data grows (puts with every revision
//! kept, a restart, reads after it): [`scale`].
//!
//! Here: the flags, the rounds and the runs against each cluster. Starting and stopping
//! the clusters is in [`cluster`], reading the machine in [`machine`], and what is
//! written from the runs in [`report`].

mod cluster;
mod machine;
mod report;
mod scale;

use std::path::PathBuf;

use bytes::Bytes;
use clap::{Args, ValueEnum};
use plotters::style::RGBColor;
use rand::Rng;

use super::{ClientKind, Common, Summary, Target, Workload, WriteOut};
use cluster::{Cluster, etcd_version};
use machine::{cpus, fsync_probe, load_average, process_cpu_seconds, round_trip_probe};
use report::{Report, utc_now};

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Instead of the throughput table, the cost as data grows: per system, --duration
    /// of puts with every revision kept, then a graceful stop, a restart on the same data
    /// and --read-duration of linearizable gets; writes scale.md and scale.csv (put
    /// count, put latency tail, resident memory before and after the restart, disk,
    /// restart time, reads after it, and oncekv's figures per put against etcd's). Takes
    /// minutes and, at the defaults, several GiB of memory and disk (under TMPDIR).
    #[arg(long)]
    pub scale: bool,
    /// The systems to run, in this order.
    #[arg(long, value_delimiter = ',', default_value = "etcd,oncekv")]
    pub systems: Vec<System>,
    /// Numbers of concurrent clients to run every workload with, comma separated
    /// [default: 1,16,64; with --scale one count, 64].
    #[arg(long, value_delimiter = ',')]
    pub clients: Vec<usize>,
    /// Workloads, in the order they run against each cluster: put (random keys), range
    /// (linearizable gets of the same key space, after the puts filled it).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "put,range",
        conflicts_with = "scale"
    )]
    pub workloads: Vec<CompareWorkload>,
    /// How long each run lasts (with --scale: the put phase), in seconds [default: 5;
    /// with --scale 60].
    #[arg(long)]
    pub duration: Option<f64>,
    /// With --scale: how long the linearizable gets after the restart last, in seconds
    /// [default: 10].
    #[arg(long, requires = "scale")]
    pub read_duration: Option<f64>,
    /// Rounds: each starts both clusters afresh, odd rounds etcd first.
    #[arg(long, default_value_t = 2, conflicts_with = "scale")]
    pub rounds: usize,
    /// Size of each put's value, in bytes [default: 256; with --scale 1024].
    #[arg(long)]
    pub value_size: Option<usize>,
    /// Number of distinct keys (8-byte decimal keys; at most 100,000,000) [default:
    /// 100,000; with --scale 1,000,000].
    #[arg(long)]
    pub key_space: Option<u64>,
    /// Skip the oncekv-client columns (exactly-once and untracked puts).
    #[arg(long, conflicts_with = "scale")]
    pub no_oncekv_client: bool,
    /// Directory for compare.md, compare.svg and runs.csv, or with --scale scale.md and
    /// scale.csv (created if needed).
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

impl CompareArgs {
    /// The client counts: as given, else this mode's default.
    fn clients(&self) -> &[usize] {
        match (self.clients.is_empty(), self.scale) {
            (false, _) => &self.clients,
            (true, false) => &[1, 16, 64],
            (true, true) => &[64],
        }
    }

    fn duration(&self) -> f64 {
        self.duration.unwrap_or(if self.scale { 60.0 } else { 5.0 })
    }

    fn read_duration(&self) -> f64 {
        self.read_duration.unwrap_or(10.0)
    }

    fn value_size(&self) -> usize {
        self.value_size
            .unwrap_or(if self.scale { 1024 } else { 256 })
    }

    fn key_space(&self) -> u64 {
        self.key_space
            .unwrap_or(if self.scale { 1_000_000 } else { 100_000 })
    }
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

/// A system measured: a 3-member etcd (three processes) or `oncekv dev` (three members
/// in one process).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum System {
    Etcd,
    Oncekv,
}

impl System {
    fn name(self) -> &'static str {
        match self {
            System::Etcd => "etcd",
            System::Oncekv => "oncekv",
        }
    }
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
    if args.clients().contains(&0) {
        return Err("--clients: every count must be at least 1".into());
    }
    if args.scale && args.clients().len() != 1 {
        return Err("--scale runs one client count: give --clients one number".into());
    }
    if args.systems.is_empty() {
        return Err("--systems: name at least one of etcd, oncekv".into());
    }
    if args.workloads.is_empty() {
        return Err("--workloads: name at least one of put, range".into());
    }
    if args.rounds == 0 {
        return Err("--rounds must be at least 1".into());
    }
    for (flag, secs) in [
        ("--duration", args.duration()),
        ("--read-duration", args.read_duration()),
    ] {
        if !(secs.is_finite() && secs > 0.0) {
            return Err(format!(
                "{flag} {secs}: expected a positive number of seconds"
            ));
        }
    }
    if args.key_space() == 0 || args.key_space() > 100_000_000 {
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

    let mut value = vec![0u8; args.value_size()];
    rand::thread_rng().fill(&mut value[..]);
    let value = Bytes::from(value);
    if args.scale {
        let machine = scale::Machine {
            etcd_version: &etcd_version,
            oncekv: &oncekv,
            work: work.path(),
            fsync,
            rtt,
        };
        let result = scale::run(args, &machine, &value).await;
        if args.keep {
            eprintln!("bench compare: kept {}", work.keep().display());
        }
        return result;
    }
    let mut runs = Vec::new();
    for round in 1..=args.rounds {
        let order = if round % 2 == 1 {
            [System::Etcd, System::Oncekv]
        } else {
            [System::Oncekv, System::Etcd]
        };
        for system in order.into_iter().filter(|s| args.systems.contains(s)) {
            let dir = work.path().join(format!("r{round}-{}", system.name()));
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
    let warm_up = common(cluster, 16, 1.0, ClientKind::Wire, args.key_space());
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
            for &clients in args.clients() {
                let c = common(
                    cluster,
                    clients,
                    args.duration(),
                    series.client(),
                    args.key_space(),
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
