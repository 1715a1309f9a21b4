//! The checkers must have teeth: with a mechanism switched off inside the simulated
//! server, some seed among the first 200 must fail. A harness that passes a broken server
//! proves nothing about a working one.
//!
//! The seeds run through the binary with `--jobs 2`, each in a child process. A broken
//! server can trip one of openraft's debug assertions, and unwinding that panic can panic
//! again in a destructor (tokio's scheduler, h2's streams), which aborts the process: in
//! a child that is one failed seed, in this test's own process it would be the end of it.

use std::process::Command;

/// What a run with `--break <what>` found: the first failing seed and everything the
/// binary printed, or `None` if all 200 seeds passed.
fn first_failing_seed(what: &str) -> Option<(u64, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_oncekv-sim"))
        .args([
            "--seeds", "200", "--start", "0", "--jobs", "2", "--break", what,
        ])
        .output()
        .expect("the simulator runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("summary:"))
        .unwrap_or_else(|| panic!("no summary line; the run printed:\n{stdout}"));
    // "...; 1 failed [68]": without --keep-going the run stops at its first failure.
    let failed = summary
        .rsplit_once('[')
        .and_then(|(_, list)| list.strip_suffix(']'))
        .unwrap_or_else(|| panic!("no list of failed seeds in {summary:?}"));
    let first = failed.split(',').next().map(str::trim).unwrap_or("");
    if first.is_empty() {
        assert!(out.status.success(), "no seed failed, yet: {}", out.status);
        return None;
    }
    assert!(!out.status.success(), "seed {first} failed, yet exit 0");
    let seed = first
        .parse()
        .unwrap_or_else(|e| panic!("failed seed {first:?}: {e}"));
    Some((seed, stdout))
}

#[test]
fn broken_dedup_is_caught_within_200_seeds() {
    let (seed, printed) =
        first_failing_seed("dedup").expect("no seed caught a server that executes duplicates");
    let violated = format!("--- seed {seed} violated:");
    let (_, violations) = printed
        .split_once(&violated)
        .unwrap_or_else(|| panic!("seed {seed} failed without a checker's verdict:\n{printed}"));
    assert!(
        violations
            .lines()
            .take_while(|l| !l.starts_with("--- trace"))
            .any(|l| l.contains("exactly-once")),
        "seed {seed} failed, but not on exactly-once:\n{printed}"
    );
}

#[test]
fn broken_fsync_is_caught_within_200_seeds() {
    assert!(
        first_failing_seed("fsync").is_some(),
        "no seed caught a server whose fsync acknowledges without syncing"
    );
}

// The leader's own appends are acknowledged before they are durable; what keeps that
// safe is that nothing is applied or passed on as committed before the leader's copy is
// durable. Without those gates a slow leader disk and a crash inside it (the
// `SlowLeaderDisk` fault) lose applied entries. Under debug assertions the broken server
// may instead trip openraft's own check (a committed entry that differs) and panic; the
// seed then fails with that panic, in the checker's report or, if unwinding aborted the
// child, in the harness's account of the dead child.
#[test]
fn broken_durability_gates_are_caught_within_200_seeds() {
    let (seed, printed) = first_failing_seed("durability-gates")
        .expect("no seed caught a leader that applies entries before its own copy is durable");
    assert!(
        printed.contains(&format!("--- seed {seed} violated:")) || printed.contains("panicked at"),
        "seed {seed} failed without a checker's verdict or a panic:\n{printed}"
    );
}
