//! `oncekv-check`: judges a recorded history (JSON Lines, see the crate README) and
//! prints every violation, and every key whose linearizability search ran out of its
//! budget (undecided: not a violation, and not a pass either). Exit status: 0 no
//! violation, 1 some, 2 input that cannot be read.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use oncekv_check::jsonl::{self, ReadError};

#[derive(Debug, Parser)]
#[command(
    name = "oncekv-check",
    about = "Judges a recorded history (JSON Lines): exactly-once, linearizability, watch order, lock fencing"
)]
struct Args {
    /// The calls, one JSON object a line.
    #[arg(long, value_name = "FILE.jsonl")]
    history: PathBuf,
    /// Watchers' records, each beside history for its range, one watcher a line.
    #[arg(long, value_name = "FILE.jsonl")]
    watches: Option<PathBuf>,
    /// Lockers' acquisitions and the lock's history, one a line.
    #[arg(long, value_name = "FILE.jsonl")]
    locks: Option<PathBuf>,
    /// Clients 0..N did the own-key workload (and a final read); default: every client
    /// the history names. 0 skips the exactly-once count.
    #[arg(long, value_name = "N")]
    clients: Option<usize>,
}

/// What `check` finds in `path`, or why it could not be read.
fn judge<T>(
    path: &Path,
    check: impl FnOnce(BufReader<File>) -> Result<T, ReadError>,
) -> Result<T, String> {
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    check(BufReader::new(file)).map_err(|e| format!("{}: {e}", path.display()))
}

/// The violations, and the keys left undecided.
fn run(args: &Args) -> Result<(Vec<String>, Vec<String>), String> {
    let judged = judge(&args.history, |r| jsonl::judge_history(r, args.clients))?;
    let mut violations = judged.violations;
    if let Some(path) = &args.watches {
        violations.extend(judge(path, jsonl::check_watches)?);
    }
    if let Some(path) = &args.locks {
        violations.extend(judge(path, jsonl::check_locks)?);
    }
    Ok((violations, judged.inconclusive))
}

fn main() -> ExitCode {
    let args = Args::parse();
    let (violations, undecided) = match run(&args) {
        Err(e) => {
            eprintln!("oncekv-check: cannot read {e}");
            return ExitCode::from(2);
        }
        Ok(found) => found,
    };
    for key in &undecided {
        println!("undecided: linearizability of {key} (the search ran out of its budget)");
    }
    if !undecided.is_empty() {
        let n = undecided.len();
        println!("{n} key{} undecided", if n == 1 { "" } else { "s" });
    }
    match violations {
        violations if violations.is_empty() => {
            println!("no violations");
            ExitCode::SUCCESS
        }
        violations => {
            for v in &violations {
                println!("violation: {v}");
            }
            let n = violations.len();
            println!("{n} violation{}", if n == 1 { "" } else { "s" });
            ExitCode::from(1)
        }
    }
}
