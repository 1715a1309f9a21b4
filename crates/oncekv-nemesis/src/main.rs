//! `oncekv-nemesis`: the command line over the library's layers (see its crate doc):
//! reads the options, refuses to run outside the private namespace `scripts/nemesis`
//! makes, runs the planned runs one after another against each target, prints and writes
//! the report, and tears everything down on ctrl-c or SIGTERM.
//!
//! Exit status: 0 when every checker passed, 1 on any violation, 2 when a run could not
//! be made (the harness or a member failed to start) and none found a violation, 130 on
//! an interrupt.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use oncekv_nemesis::cluster::{self, Target};
use oncekv_nemesis::nemesis::Timing;
use oncekv_nemesis::plan::{self, Variant};
use oncekv_nemesis::report::{self, Row};
use oncekv_nemesis::{clock, run};

/// Real faults (partitions, slow and lossy links, SIGSTOP, kill -9, skewed clocks) against
/// real `oncekv serve` members, or Debian's etcd 3.4, with a recorded workload judged by
/// oncekv-check. Run it through scripts/nemesis, which makes the private network
/// namespace it needs.
#[derive(Debug, Parser)]
#[command(name = "oncekv-nemesis")]
struct Args {
    /// oncekv, etcd (the control; no tracked writers) or both.
    #[arg(long, env = "TARGET", default_value = "oncekv")]
    target: String,
    /// The oncekv binary (`oncekv serve` runs each member).
    #[arg(long, env = "ONCEKV_BIN", default_value = "target/release/oncekv")]
    oncekv_bin: PathBuf,
    /// The etcd binary (Debian's etcd-server package).
    #[arg(long, env = "ETCD_BIN", default_value = "/usr/bin/etcd")]
    etcd_bin: PathBuf,
    /// Members per cluster (a bridge needs 5).
    #[arg(long, default_value_t = 3)]
    members: usize,
    /// Nemeses, comma separated, each optionally `+lease-reads` (e.g.
    /// `kill,clock-skew+lease-reads`); default: all of them (the quick set with --quick).
    /// Known: partition-leader, isolate-follower, bridge, flap, netem-one, netem-all,
    /// pause-leader, kill, clock-skew, combined.
    #[arg(long, value_delimiter = ',')]
    nemesis: Vec<String>,
    /// Runs in all, round-robin across the nemeses (default: one each).
    #[arg(long)]
    runs: Option<usize>,
    /// Seconds of workload (and faults) per run.
    #[arg(long, default_value_t = 30)]
    time: u64,
    /// Seconds each fault lasts before it is healed.
    #[arg(long, default_value_t = 5)]
    fault_secs: u64,
    /// Seconds of quiet before each fault.
    #[arg(long, default_value_t = 4)]
    quiet_secs: u64,
    /// The short form (under 5 minutes for one target): 8 nemeses, 15 s each.
    #[arg(long)]
    quick: bool,
    /// Run every oncekv member with --leader-lease-reads.
    #[arg(long)]
    leader_lease_reads: bool,
    /// A deliberately broken oncekv (built with `--features broken`): ONCEKV_BREAK=MODE
    /// in every member's environment (dedup, stale-read or lease-clock). The checkers
    /// must then report violations.
    #[arg(long = "break", value_name = "MODE")]
    breaks: Option<String>,
    /// Where each run's history, verdicts and (on a violation) member logs go, and the
    /// report (default: target/nemesis/<unix time>).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = cluster::ensure_private_namespace() {
        eprintln!("oncekv-nemesis: {e}");
        return ExitCode::from(2);
    }
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        eprintln!("oncekv-nemesis: cannot handle SIGTERM");
        return ExitCode::from(2);
    };
    // Dropping `run_all` (on a signal) drops the run in progress: its members are
    // killed, its nft table deleted, its temporary directory removed.
    tokio::select! {
        code = run_all(args) => code,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("oncekv-nemesis: interrupted; everything torn down");
            ExitCode::from(130)
        }
        _ = term.recv() => {
            eprintln!("oncekv-nemesis: terminated; everything torn down");
            ExitCode::from(143)
        }
    }
}

/// The targets, the nemeses (each once, for the report's rows) and the runs in order.
type Planned = (Vec<Target>, Vec<Variant>, Vec<Variant>);

fn plan_runs(args: &Args) -> Result<Planned, String> {
    let targets = plan::targets(&args.target)?;
    let mut variants: Vec<Variant> = if args.nemesis.is_empty() {
        if args.quick {
            plan::quick()
        } else {
            plan::every()
        }
    } else {
        args.nemesis
            .iter()
            .map(|s| Variant::parse(s.trim()))
            .collect::<Result<_, _>>()?
    };
    if args.leader_lease_reads {
        let mut unique: Vec<Variant> = Vec::new();
        for v in variants {
            let v = Variant {
                lease_reads: true,
                ..v
            };
            if !unique.contains(&v) {
                unique.push(v);
            }
        }
        variants = unique;
    }
    let runs = plan::spread(&variants, args.runs.unwrap_or(variants.len()));
    Ok((targets, variants, runs))
}

async fn run_all(args: Args) -> ExitCode {
    let (targets, variants, runs) = match plan_runs(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("oncekv-nemesis: {e}");
            return ExitCode::from(2);
        }
    };
    let (time, timing) = if args.quick {
        (plan::QUICK_TIME, plan::QUICK_TIMING)
    } else {
        (
            Duration::from_secs(args.time),
            Timing {
                fault: Duration::from_secs(args.fault_secs),
                quiet: Duration::from_secs(args.quiet_secs),
            },
        )
    };
    let out = args.out.clone().unwrap_or_else(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        PathBuf::from(format!("target/nemesis/{now}"))
    });
    if let Err(e) = std::fs::create_dir_all(&out) {
        eprintln!("oncekv-nemesis: {}: {e}", out.display());
        return ExitCode::from(2);
    }
    let faketime = clock::library();
    if args.breaks.is_some() {
        eprintln!(
            "oncekv-nemesis: ONCEKV_BREAK={} in every member: a build with the broken \
             feature must be reported with violations",
            args.breaks.as_deref().unwrap_or_default()
        );
    }
    let started = Instant::now();
    let mut rows: Vec<Row> = Vec::new();
    let mut errors = 0;
    for v in &variants {
        for &t in &targets {
            rows.push(Row {
                nemesis: v.label(),
                target: t.name().into(),
                note: v.unfit(t, args.members).or_else(|| v.caveat(t)),
                ..Row::default()
            });
        }
    }
    let total = runs.len() * targets.len();
    let mut done = 0;
    for (i, v) in runs.iter().enumerate() {
        for &target in &targets {
            done += 1;
            let row_index = rows
                .iter()
                .position(|r| r.nemesis == v.label() && r.target == target.name());
            let Some(row_index) = row_index else { continue };
            if v.unfit(target, args.members).is_some() {
                continue;
            }
            if v.kind.needs_faketime() && faketime.is_none() {
                rows[row_index].note =
                    Some(format!("skipped: {} is not installed", clock::LIBFAKETIME));
                continue;
            }
            let dir = out.join(format!(
                "{}-{}{}-{i}",
                target.name(),
                v.kind.name(),
                if v.lease_reads { "-lease-reads" } else { "" }
            ));
            let spec = run::Spec {
                cluster: cluster::Spec {
                    target,
                    bin: match target {
                        Target::Oncekv => args.oncekv_bin.clone(),
                        Target::Etcd => args.etcd_bin.clone(),
                    },
                    members: args.members,
                    lease_reads: v.lease_reads,
                    breaks: args.breaks.clone().filter(|_| target == Target::Oncekv),
                    faketime: faketime.clone().filter(|_| v.kind.needs_faketime()),
                },
                nemesis: v.kind,
                time,
                timing,
                dir: dir.clone(),
            };
            let t0 = Instant::now();
            eprintln!("[{done}/{total}] {} {} ...", target.name(), v.label());
            match run::run(spec).await {
                Ok(o) => {
                    let row = &mut rows[row_index];
                    row.add(o.counts, &o.verdicts, &o.recovery);
                    let n = o.verdicts.violations();
                    eprintln!(
                        "[{done}/{total}] {} {}: {} ops, {} violations, {:.0} s ({})",
                        target.name(),
                        v.label(),
                        o.counts.ops,
                        n,
                        t0.elapsed().as_secs_f64(),
                        dir.display()
                    );
                    for line in o.verdicts.lines().iter().take(12) {
                        eprintln!("    {line}");
                    }
                    if n > 0 {
                        row.kept.push(dir.display().to_string());
                    }
                }
                Err(e) => {
                    errors += 1;
                    eprintln!(
                        "[{done}/{total}] {} {}: run failed: {e}",
                        target.name(),
                        v.label()
                    );
                    rows[row_index].note = Some(format!("run failed: {}", first_line(&e)));
                }
            }
        }
    }
    let mut text = format!(
        "{}\n\n{} runs of {} s (faults of {} s after {} s of quiet, {} members) in {:.0} s; output in `{}`.\n",
        report::table(&rows),
        total,
        time.as_secs(),
        timing.fault.as_secs(),
        timing.quiet.as_secs(),
        args.members,
        started.elapsed().as_secs_f64(),
        out.display()
    );
    if let Some(b) = &args.breaks {
        text.push_str(&format!(
            "\nMembers ran with ONCEKV_BREAK={b}: a build with the `broken` feature must show violations above.\n"
        ));
    }
    println!("{text}");
    if let Err(e) = std::fs::write(out.join("report.md"), &text) {
        eprintln!("oncekv-nemesis: report.md: {e}");
    }
    let violations: usize = rows.iter().map(Row::violations).sum();
    if violations > 0 {
        ExitCode::from(1)
    } else if errors > 0 {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}
