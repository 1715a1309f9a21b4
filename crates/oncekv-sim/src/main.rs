//! `oncekv-sim --seeds N [--start S] [--break dedup|fsync]`: runs many seeds, prints
//! progress and a summary, and exits non-zero (printing the seed and a short trace) on
//! any violation.

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
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
    if !oncekv_sim::TOKIO_SEEDED {
        eprintln!(
            "warning: built without RUSTFLAGS=\"--cfg tokio_unstable\"; tokio's own RNG is not \
             seeded and a seed may not replay exactly"
        );
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
    let (mut sim_ms, mut calls, mut unknown) = (0, 0, 0);
    for seed in args.start..args.start + args.seeds {
        let t = Instant::now();
        let report = run(seed, &opts);
        sim_ms += report.sim_ms;
        calls += report.calls;
        unknown += report.unknown;
        println!(
            "seed {seed}: {} in {:.1}s wall, {:.1}s simulated, {} calls ({} unknown), {} entries applied, {} executions, {} expiries, trace {:016x}",
            if report.ok() { "ok" } else { "VIOLATION" },
            t.elapsed().as_secs_f64(),
            report.sim_ms as f64 / 1000.0,
            report.calls,
            report.unknown,
            report.entries_observed,
            report.executions,
            report.expiries,
            report.trace_hash,
        );
        if !report.ok() {
            print_failure(&report, args.full_trace);
            failed.push(seed);
            if !args.keep_going {
                break;
            }
        }
    }
    println!(
        "summary: {} seeds from {} in {:.1}s wall, {:.0}s simulated, {calls} calls ({unknown} unknown); {} failed {:?}",
        args.seeds,
        args.start,
        started.elapsed().as_secs_f64(),
        sim_ms as f64 / 1000.0,
        failed.len(),
        failed,
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
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
