//! `oncekv-sim --seeds N [--start S] [--break dedup|fsync]`: runs many seeds, prints
//! progress and a summary, and exits non-zero (printing the seed and a short trace) on
//! any violation.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
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
    #[arg(long = "break", value_parser = ["dedup", "fsync", "durability-gates"])]
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
    /// Seeds run at once (output stays in seed order). With more than one, each seed runs
    /// in a process of its own, so that it takes exactly the path it takes alone.
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// Internal: instead of the summary, print one machine-readable `#report` line (how a
    /// `--jobs` child process hands its seed's figures to its parent).
    #[arg(long, hide = true)]
    report_line: bool,
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
            durability_gates: args.breaks.iter().any(|b| b == "durability-gates"),
        },
        ..Options::default()
    };
    let started = Instant::now();
    let mut failed: Vec<u64> = Vec::new();
    let mut total = Totals::default();
    run_seeds(&args, &opts, |seed, outcome| {
        total.merge(&outcome.totals);
        print!("{}", outcome.text);
        if !outcome.ok {
            failed.push(seed);
        }
    });
    if args.report_line {
        println!("{REPORT_PREFIX}{}", total.to_line());
        return if failed.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
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
    let list = |m: &BTreeMap<String, u64>| {
        m.iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!("  faults: {}", list(&total.faults));
    println!(
        "  duplicated messages: {}; commit traps fired: {}; segments lost (delivered late): {}",
        list(&total.duplicates),
        total.commit_traps,
        total.losses,
    );
    println!(
        "  watch events checked: {}; watches resumed on another member: {}",
        total.watch_events, total.watch_resumes,
    );
    println!(
        "  locks taken: {}; guarded writes refused after a lock was lost: {}",
        total.lock_acquisitions, total.fenced_refusals,
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
    calls: u64,
    unknown: u64,
    faults: BTreeMap<String, u64>,
    duplicates: BTreeMap<String, u64>,
    commit_traps: u64,
    losses: u64,
    watch_events: u64,
    watch_resumes: u64,
    lock_acquisitions: u64,
    fenced_refusals: u64,
}

/// Starts the line a `--report-line` child prints its figures on.
const REPORT_PREFIX: &str = "#report ";

impl Totals {
    fn of(r: &Report) -> Totals {
        Totals {
            seeds: 1,
            sim_ms: r.sim_ms,
            calls: r.calls as u64,
            unknown: r.unknown as u64,
            faults: r.faults.iter().map(|(k, n)| (k.to_string(), *n)).collect(),
            duplicates: r
                .duplicates
                .iter()
                .map(|(k, n)| (format!("{k:?}"), *n))
                .collect(),
            commit_traps: r.commit_traps,
            losses: r.losses,
            watch_events: r.watch_events as u64,
            watch_resumes: r.watch_resumes,
            lock_acquisitions: r.lock_acquisitions as u64,
            fenced_refusals: r.fenced_refusals as u64,
        }
    }

    fn merge(&mut self, t: &Totals) {
        self.seeds += t.seeds;
        self.sim_ms += t.sim_ms;
        self.calls += t.calls;
        self.unknown += t.unknown;
        for (k, n) in &t.faults {
            *self.faults.entry(k.clone()).or_default() += n;
        }
        for (k, n) in &t.duplicates {
            *self.duplicates.entry(k.clone()).or_default() += n;
        }
        self.commit_traps += t.commit_traps;
        self.losses += t.losses;
        self.watch_events += t.watch_events;
        self.watch_resumes += t.watch_resumes;
        self.lock_acquisitions += t.lock_acquisitions;
        self.fenced_refusals += t.fenced_refusals;
    }

    /// `key=value` fields separated by spaces; the maps as `name:count,...`.
    fn to_line(&self) -> String {
        let map = |m: &BTreeMap<String, u64>| {
            m.iter()
                .map(|(k, n)| format!("{k}:{n}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        format!(
            "seeds={} sim_ms={} calls={} unknown={} commit_traps={} losses={} watch_events={} watch_resumes={} lock_acquisitions={} fenced_refusals={} faults={} duplicates={}",
            self.seeds,
            self.sim_ms,
            self.calls,
            self.unknown,
            self.commit_traps,
            self.losses,
            self.watch_events,
            self.watch_resumes,
            self.lock_acquisitions,
            self.fenced_refusals,
            map(&self.faults),
            map(&self.duplicates),
        )
    }

    /// Reads [`to_line`](Self::to_line); `None` if anything in it is off.
    fn parse_line(line: &str) -> Option<Totals> {
        let mut t = Totals::default();
        for field in line.split_whitespace() {
            let (key, value) = field.split_once('=')?;
            let map = |value: &str| -> Option<BTreeMap<String, u64>> {
                value
                    .split(',')
                    .filter(|p| !p.is_empty())
                    .map(|p| {
                        let (k, n) = p.split_once(':')?;
                        Some((k.to_string(), n.parse().ok()?))
                    })
                    .collect()
            };
            match key {
                "seeds" => t.seeds = value.parse().ok()?,
                "sim_ms" => t.sim_ms = value.parse().ok()?,
                "calls" => t.calls = value.parse().ok()?,
                "unknown" => t.unknown = value.parse().ok()?,
                "commit_traps" => t.commit_traps = value.parse().ok()?,
                "losses" => t.losses = value.parse().ok()?,
                "watch_events" => t.watch_events = value.parse().ok()?,
                "watch_resumes" => t.watch_resumes = value.parse().ok()?,
                "lock_acquisitions" => t.lock_acquisitions = value.parse().ok()?,
                "fenced_refusals" => t.fenced_refusals = value.parse().ok()?,
                "faults" => t.faults = map(value)?,
                "duplicates" => t.duplicates = map(value)?,
                _ => return None,
            }
        }
        Some(t)
    }
}

/// One seed's result: whether it was clean, what to print for it, its figures.
struct Outcome {
    ok: bool,
    text: String,
    totals: Totals,
}

/// The seed's line, and for a violation the violation, the trace and how to replay it.
fn outcome_of(report: &Report, wall: f64, args: &Args) -> Outcome {
    let seed = report.seed;
    let mut text = format!(
        "seed {seed}: {} in {wall:.1}s wall, {:.1}s simulated, {} calls ({} unknown), {} entries applied, {} executions, {} expiries, {} duplicates, {} commit traps, {} watch events ({} resumes), {} locks ({} fenced refusals), trace {:016x}\n",
        if report.ok() { "ok" } else { "VIOLATION" },
        report.sim_ms as f64 / 1000.0,
        report.calls,
        report.unknown,
        report.entries_observed,
        report.executions,
        report.expiries,
        report.duplicates.values().sum::<u64>(),
        report.commit_traps,
        report.watch_events,
        report.watch_resumes,
        report.lock_acquisitions,
        report.fenced_refusals,
        report.trace_hash,
    );
    if !report.ok() {
        text.push_str(&failure_text(
            report,
            args.full_trace,
            &replay_command(args, report.seed),
        ));
    }
    Outcome {
        ok: report.ok(),
        text,
        totals: Totals::of(report),
    }
}

/// Runs one seed in a child process (this binary with `--seeds 1 --report-line`), for
/// `--jobs`: a fresh process gives the seed the tokio task numbering it gets alone.
fn run_in_child(args: &Args, seed: u64) -> Outcome {
    // `why` is one line; `detail` (what the child printed) follows it, indented.
    let failed = |why: String, detail: String| Outcome {
        ok: false,
        text: format!("seed {seed}: VIOLATION (of the harness: {why})\n{detail}"),
        totals: Totals {
            seeds: 1,
            ..Totals::default()
        },
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            return failed(
                format!("cannot find this binary to run a seed: {e}"),
                String::new(),
            );
        }
    };
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["--report-line"]).args(seed_args(args, seed));
    if args.full_trace {
        cmd.arg("--full-trace");
    }
    // The child's stderr is captured rather than inherited so that, when the child dies
    // without its report (a panic that aborts while unwinding), the panic's own message
    // goes into the seed's failure text instead of somewhere among other seeds' logs.
    let output = match cmd.output() {
        Ok(output) => output,
        Err(e) => {
            return failed(format!("cannot start a child process: {e}"), String::new());
        }
    };
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprint!("{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut text = String::new();
    let mut totals = None;
    for line in stdout.lines() {
        match line.strip_prefix(REPORT_PREFIX) {
            Some(report) => totals = Totals::parse_line(report),
            None => {
                text.push_str(line);
                text.push('\n');
            }
        }
    }
    match totals {
        Some(totals) if totals.seeds == 1 => Outcome {
            ok: output.status.success(),
            text,
            totals,
        },
        _ => failed(
            format!(
                "the child process ended ({}) without its report",
                output.status
            ),
            format!("{text}{}", panics_in(&stderr)),
        ),
    }
}

/// The panics a child wrote to stderr (each header with the message line after it), or
/// its last lines if it wrote none: what a reader of a dead child's failure needs first.
fn panics_in(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().collect();
    let mut out = String::new();
    let mut found = 0;
    for (i, line) in lines.iter().enumerate() {
        if line.contains("panicked at") && found < 8 {
            found += 1;
            out.push_str(&format!("  stderr: {line}\n"));
            if let Some(next) = lines.get(i + 1) {
                out.push_str(&format!("  stderr: {next}\n"));
            }
        }
    }
    if found == 0 {
        for line in &lines[lines.len().saturating_sub(10)..] {
            out.push_str(&format!("  stderr: {line}\n"));
        }
    }
    out
}

/// Runs the seeds, with `--jobs` above 1 each in a child process, `args.jobs` at a time,
/// and hands each outcome to `done` in seed order. Without `--keep-going`, stops after the
/// first failing seed.
fn run_seeds(args: &Args, opts: &Options, mut done: impl FnMut(u64, Outcome)) {
    let end = args.start + args.seeds;
    let next = AtomicU64::new(args.start);
    let stop = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel::<(u64, Outcome)>();
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
                        let outcome = if args.jobs > 1 {
                            run_in_child(args, seed)
                        } else {
                            let t = Instant::now();
                            let report = run(seed, opts);
                            outcome_of(&report, t.elapsed().as_secs_f64(), args)
                        };
                        if tx.send((seed, outcome)).is_err() {
                            return;
                        }
                    }
                })
                .unwrap_or_else(|e| panic!("cannot start a worker thread: {e}"));
        }
        drop(tx);
        let mut pending: BTreeMap<u64, Outcome> = BTreeMap::new();
        let mut expect = args.start;
        for (seed, outcome) in rx {
            pending.insert(seed, outcome);
            while let Some(outcome) = pending.remove(&expect) {
                let ok = outcome.ok;
                done(expect, outcome);
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

/// The options that run `seed` alone as this run runs it (for a child process under
/// `--jobs`, and for the replay line of a failure).
fn seed_args(args: &Args, seed: u64) -> Vec<String> {
    let mut out: Vec<String> = [
        ("--seeds", 1),
        ("--start", seed),
        ("--ops", args.ops as u64),
        ("--nodes", args.nodes as u64),
        ("--clients", args.clients as u64),
        ("--fault-secs", args.fault_secs),
    ]
    .into_iter()
    .flat_map(|(flag, value)| [flag.to_string(), value.to_string()])
    .collect();
    for b in &args.breaks {
        out.extend(["--break".to_string(), b.clone()]);
    }
    if args.no_faults {
        out.push("--no-faults".to_string());
    }
    out
}

/// The command that runs `seed` alone as this run did.
fn replay_command(args: &Args, seed: u64) -> String {
    format!(
        "cargo run --release -p oncekv-sim -- {}",
        seed_args(args, seed).join(" ")
    )
}

fn failure_text(report: &Report, full: bool, replay: &str) -> String {
    let mut text = format!("--- seed {} violated:\n", report.seed);
    for v in &report.violations {
        text.push_str(&format!("  * {v}\n"));
    }
    let skip = if full {
        0
    } else {
        report.trace.len().saturating_sub(40)
    };
    text.push_str(&format!(
        "--- trace (last {} lines):\n",
        report.trace.len() - skip
    ));
    for line in &report.trace[skip..] {
        text.push_str(&format!("  {line}\n"));
    }
    text.push_str(&format!("--- replay: {replay}\n"));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_childs_panics_are_picked_out_of_its_stderr() {
        let stderr = "log line\nthread 'main' panicked at src/a.rs:23:5:\nassertion failed: x\n\
                      more log\nthread 'main' panicked at src/b.rs:1:1:\nRefCell already borrowed\n\
                      fatal runtime error: aborting\n";
        let picked = panics_in(stderr);
        assert!(picked.contains("src/a.rs:23:5"), "{picked}");
        assert!(picked.contains("assertion failed: x"), "{picked}");
        assert!(picked.contains("RefCell already borrowed"), "{picked}");
        assert!(!picked.contains("log line"), "{picked}");
        let quiet = panics_in("one\ntwo\n");
        assert!(quiet.contains("stderr: two"), "{quiet}");
    }

    #[test]
    fn a_report_line_reads_back_as_written() {
        let mut t = Totals {
            seeds: 1,
            sim_ms: 29_200,
            calls: 119,
            unknown: 2,
            commit_traps: 1,
            losses: 3,
            ..Totals::default()
        };
        t.faults.insert("crash".into(), 4);
        t.faults.insert("isolate-at-commit".into(), 1);
        t.duplicates.insert("AppendEntries".into(), 7);
        let back = Totals::parse_line(&t.to_line()).expect("parses");
        assert_eq!(back.to_line(), t.to_line());
        assert_eq!(back.faults.get("isolate-at-commit"), Some(&1));
        assert!(Totals::parse_line("seeds=1 bogus=2").is_none());
        assert!(Totals::parse_line("faults=crash").is_none());
    }
}
