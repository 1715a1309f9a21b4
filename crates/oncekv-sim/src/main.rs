//! `oncekv-sim --seeds N [--start S] [--break dedup|fsync]`: runs many seeds, prints
//! progress and a summary, and exits non-zero (printing the seed and a short trace) on
//! any violation.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use clap::Parser;
use oncekv_server::transport::MessageKind;
use oncekv_sim::run::{Breaks, Options, Report, run};

#[derive(Debug, Parser)]
#[command(
    about = "oncekv deterministic simulation: seeded faults, exactly-once and linearizability checks"
)]
struct Args {
    /// How many seeds to run.
    #[arg(long, default_value_t = 20)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    start: u64,
    /// Switch a mechanism off inside the simulated server, to see the checkers catch it.
    #[arg(long = "break", value_parser = ["dedup", "fsync"])]
    breaks: Vec<String>,
    /// Operations per client.
    #[arg(long, default_value_t = 40)]
    ops: usize,
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    #[arg(long, default_value_t = 3)]
    clients: usize,
    /// Seconds of simulated time with faults.
    #[arg(long, default_value_t = 20)]
    fault_secs: u64,
    /// Run without faults.
    #[arg(long)]
    no_faults: bool,
    /// Keep going after a failing seed.
    #[arg(long)]
    keep_going: bool,
    /// Print the whole trace of failing seeds (not just its tail).
    #[arg(long)]
    full_trace: bool,
    /// Seeds run at once, each on its own thread (output stays in seed order).
    #[arg(long, default_value_t = 1)]
    jobs: usize,
}

/// Log lines stamped with simulated milliseconds.
struct SimTime;

impl tracing_subscriber::fmt::time::FormatTime for SimTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        match turmoil::sim_elapsed() {
            Some(t) => write!(w, "{:>7}", t.as_millis()),
            None => write!(w, "{:>7}", "-"),
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    // `RUST_LOG=openraft=debug,oncekv_server=debug` prints the servers' logs in simulated
    // time (for one seed: the log of many is rarely what you want).
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_timer(SimTime)
            .with_ansi(false)
            .with_writer(std::io::stderr)
            .init();
    }
    let opts = Options {
        nodes: args.nodes,
        clients: args.clients,
        ops_per_client: args.ops,
        faults: !args.no_faults,
        fault_secs: args.fault_secs,
        breaks: Breaks {
            dedup: args.breaks.iter().any(|b| b == "dedup"),
            fsync: args.breaks.iter().any(|b| b == "fsync"),
        },
        ..Options::default()
    };
    let started = Instant::now();
    let mut failed: Vec<u64> = Vec::new();
    let mut total = Totals::default();
    run_seeds(&args, &opts, |seed, report, wall| {
        total.add(&report);
        println!(
            "seed {seed}: {} in {wall:.1}s wall, {:.1}s simulated, {} calls ({} unknown), {} entries applied, {} executions, {} expiries, {} duplicates, {} commit traps, trace {:016x}",
            if report.ok() { "ok" } else { "VIOLATION" },
            report.sim_ms as f64 / 1000.0,
            report.calls,
            report.unknown,
            report.entries_observed,
            report.executions,
            report.expiries,
            report.duplicates.values().sum::<u64>(),
            report.commit_traps,
            report.trace_hash,
        );
        if !report.ok() {
            print_failure(&report, args.full_trace);
            failed.push(seed);
        }
    });
    let wall = started.elapsed().as_secs_f64();
    let ran = total.seeds.max(1) as f64;
    println!(
        "summary: {} seeds from {} ({} clean) in {wall:.1}s wall ({:.2}s per seed, {} jobs), {:.0}s simulated, {} calls ({} unknown); {} failed {:?}",
        total.seeds,
        args.start,
        total.seeds - failed.len() as u64,
        wall / ran,
        args.jobs,
        total.sim_ms as f64 / 1000.0,
        total.calls,
        total.unknown,
        failed.len(),
        failed,
    );
    println!(
        "  faults: {}",
        total
            .faults
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "  duplicated messages: {}; commit traps fired: {}; segments lost (delivered late): {}",
        total
            .duplicates
            .iter()
            .map(|(k, n)| format!("{k:?} {n}"))
            .collect::<Vec<_>>()
            .join(", "),
        total.commit_traps,
        total.losses,
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Sums over the seeds run.
#[derive(Default)]
struct Totals {
    seeds: u64,
    sim_ms: u64,
    calls: usize,
    unknown: usize,
    faults: BTreeMap<&'static str, u64>,
    duplicates: BTreeMap<MessageKind, u64>,
    commit_traps: u64,
    losses: u64,
}

impl Totals {
    fn add(&mut self, r: &Report) {
        self.seeds += 1;
        self.sim_ms += r.sim_ms;
        self.calls += r.calls;
        self.unknown += r.unknown;
        for (k, n) in &r.faults {
            *self.faults.entry(k).or_default() += n;
        }
        for (k, n) in &r.duplicates {
            *self.duplicates.entry(*k).or_default() += n;
        }
        self.commit_traps += r.commit_traps;
        self.losses += r.losses;
    }
}

/// Runs the seeds on `args.jobs` threads (each seed alone on one thread, so it replays
/// exactly as with one job) and hands each report to `done` in seed order, with its wall
/// seconds. Without `--keep-going`, stops after the first failing seed.
fn run_seeds(args: &Args, opts: &Options, mut done: impl FnMut(u64, Report, f64)) {
    let end = args.start + args.seeds;
    let next = AtomicU64::new(args.start);
    let stop = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel::<(u64, Report, f64)>();
    std::thread::scope(|scope| {
        for _ in 0..args.jobs.max(1) {
            let tx = tx.clone();
            let (next, stop) = (&next, &stop);
            std::thread::Builder::new()
                // Deep futures (openraft, tonic) in a debug build want more than 2 MiB.
                .stack_size(64 << 20)
                .spawn_scoped(scope, move || {
                    while !stop.load(Ordering::Relaxed) {
                        let seed = next.fetch_add(1, Ordering::Relaxed);
                        if seed >= end {
                            return;
                        }
                        let t = Instant::now();
                        let report = run(seed, opts);
                        if tx.send((seed, report, t.elapsed().as_secs_f64())).is_err() {
                            return;
                        }
                    }
                })
                .unwrap_or_else(|e| panic!("cannot start a worker thread: {e}"));
        }
        drop(tx);
        let mut pending: BTreeMap<u64, (Report, f64)> = BTreeMap::new();
        let mut expect = args.start;
        for (seed, report, wall) in rx {
            pending.insert(seed, (report, wall));
            while let Some((report, wall)) = pending.remove(&expect) {
                let ok = report.ok();
                done(expect, report, wall);
                expect += 1;
                if !ok && !args.keep_going {
                    // Seeds after it that are still running finish unreported.
                    stop.store(true, Ordering::Relaxed);
                    return;
                }
            }
        }
    });
}

fn print_failure(report: &Report, full: bool) {
    println!("--- seed {} violated:", report.seed);
    for v in &report.violations {
        println!("  * {v}");
    }
    let skip = if full {
        0
    } else {
        report.trace.len().saturating_sub(40)
    };
    println!("--- trace (last {} lines):", report.trace.len() - skip);
    for line in &report.trace[skip..] {
        println!("  {line}");
    }
    println!(
        "--- replay: cargo run --release -p oncekv-sim -- --seeds 1 --start {}",
        report.seed
    );
}
