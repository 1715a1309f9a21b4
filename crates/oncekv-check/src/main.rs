//! `oncekv-check`: judges a recorded history (JSON Lines, see the crate README) and
//! prints every violation. Exit status: 0 none, 1 some, 2 input that cannot be read.

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

/// The violations `check` finds in `path`, or why it could not be read.
fn judge(
    path: &Path,
    check: impl FnOnce(BufReader<File>) -> Result<Vec<String>, ReadError>,
) -> Result<Vec<String>, String> {
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    check(BufReader::new(file)).map_err(|e| format!("{}: {e}", path.display()))
}

fn run(args: &Args) -> Result<Vec<String>, String> {
    let mut violations = judge(&args.history, |r| jsonl::check_history(r, args.clients))?;
    if let Some(path) = &args.watches {
        violations.extend(judge(path, jsonl::check_watches)?);
    }
    if let Some(path) = &args.locks {
        violations.extend(judge(path, jsonl::check_locks)?);
    }
    Ok(violations)
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Err(e) => {
            eprintln!("oncekv-check: cannot read {e}");
            ExitCode::from(2)
        }
        Ok(violations) if violations.is_empty() => {
            println!("no violations");
            ExitCode::SUCCESS
        }
        Ok(violations) => {
            for v in &violations {
                println!("violation: {v}");
            }
            let n = violations.len();
            println!("{n} violation{}", if n == 1 { "" } else { "s" });
            ExitCode::from(1)
        }
    }
}
