//! The CI seed set: fixed seeds, with every fault, must pass every checker (the watchers'
//! and the lockers' included), and between them exercise every kind of fault, a watch
//! resuming on another member and lockers taking the lock (CI runs many more through the
//! binary: see the crate README). The seeds run through the binary in three processes at once, each seed after
//! the other in its process, so each takes exactly the path it takes alone (see
//! `oncekv_sim::run::align_task_ids`; threads of one process would perturb each other).

use std::collections::BTreeMap;
use std::process::{Command, Output};

/// 135 first failed liveness (a peer connection wedged for good); the others were picked
/// so that the set covers every fault kind, duplication and the commit trap. As
/// `(start, count)` runs of the binary.
const RUNS: &[(u64, u64)] = &[(0, 5), (5, 5), (135, 1)];

const FAULT_KINDS: &[&str] = &[
    "partition",
    "one-way",
    "isolate-leader",
    "hold",
    "loss",
    "black-hole",
    "duplicate",
    "isolate-at-commit",
    "crash",
    "slow-leader-disk",
    "crash-leader",
    "clock-jump",
    "pause-client",
    "replace-leader",
    "replace-member",
];

/// `name count, name count` after `prefix` on a summary line.
fn counts(stdout: &str, prefix: &str) -> BTreeMap<String, u64> {
    let Some(line) = stdout.lines().find_map(|l| l.strip_prefix(prefix)) else {
        return BTreeMap::new();
    };
    let list = line.split(';').next().unwrap_or_default();
    list.split(", ")
        .filter_map(|item| {
            let (name, n) = item.trim().rsplit_once(' ')?;
            Some((name.to_string(), n.parse().ok()?))
        })
        .collect()
}

#[test]
fn ci_seeds_pass_every_checker_and_cover_every_fault() {
    let children: Vec<_> = RUNS
        .iter()
        .map(|&(start, count)| {
            Command::new(env!("CARGO_BIN_EXE_oncekv-sim"))
                .args(["--seeds", &count.to_string(), "--start", &start.to_string()])
                .arg("--keep-going")
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start the simulator: {e}"))
        })
        .collect();
    let mut faults: BTreeMap<String, u64> = BTreeMap::new();
    let (mut duplicates, mut traps, mut resumes, mut locks) = (0, 0, 0, 0);
    for child in children {
        let Output { status, stdout, .. } = child
            .wait_with_output()
            .unwrap_or_else(|e| panic!("the simulator did not finish: {e}"));
        let stdout = String::from_utf8_lossy(&stdout);
        assert!(status.success(), "a seed failed:\n{stdout}");
        for (kind, n) in counts(&stdout, "  faults: ") {
            *faults.entry(kind).or_default() += n;
        }
        duplicates += counts(&stdout, "  duplicated messages: ")
            .values()
            .sum::<u64>();
        traps += stdout
            .split("commit traps fired: ")
            .nth(1)
            .and_then(|rest| rest.split(';').next())
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no commit trap count in:\n{stdout}"));
        resumes += stdout
            .split("watches resumed on another member: ")
            .nth(1)
            .and_then(|rest| rest.lines().next())
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no watch resume count in:\n{stdout}"));
        locks += stdout
            .split("locks taken: ")
            .nth(1)
            .and_then(|rest| rest.split(';').next())
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no lock count in:\n{stdout}"));
    }
    for kind in FAULT_KINDS {
        assert!(
            faults.contains_key(*kind),
            "no seed of the set applied {kind}: {faults:?}"
        );
    }
    assert!(duplicates > 0, "no message was duplicated");
    assert!(traps > 0, "the commit trap never fired");
    assert!(
        resumes > 0,
        "no watch resumed on another member: the watchers' checker saw no failover"
    );
    assert!(
        locks > 0,
        "no locker got the lock: the lockers' checker judged nothing"
    );
}
