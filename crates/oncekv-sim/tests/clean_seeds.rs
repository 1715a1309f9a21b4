//! The CI seed set: fixed seeds, with every fault, must pass every checker, and between
//! them exercise every kind of fault (CI runs many more through the binary: see the crate
//! README). Two threads, each running its share of the seeds one after the other.

use std::collections::BTreeMap;

use oncekv_sim::run::{Options, Report, run};

/// 135 first failed liveness (a peer connection wedged for good); the others were picked
/// so that the set covers every fault kind, duplication and the commit trap.
const SEEDS: &[u64] = &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 135];

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
    "clock-jump",
    "pause-client",
];

fn run_share(share: usize, of: usize) -> Vec<Report> {
    SEEDS
        .iter()
        .skip(share)
        .step_by(of)
        .map(|&seed| run(seed, &Options::default()))
        .collect()
}

#[test]
fn ci_seeds_pass_every_checker_and_cover_every_fault() {
    let reports: Vec<Report> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|share| {
                std::thread::Builder::new()
                    .stack_size(64 << 20)
                    .spawn_scoped(s, move || run_share(share, 2))
                    .unwrap_or_else(|e| panic!("worker thread: {e}"))
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_else(|_| panic!("a seed panicked")))
            .collect()
    });
    let mut faults: BTreeMap<&str, u64> = BTreeMap::new();
    let (mut duplicates, mut traps) = (0, 0);
    for report in &reports {
        assert!(
            report.ok(),
            "seed {}: {:#?}\n{}",
            report.seed,
            report.violations,
            report.trace.join("\n")
        );
        for (kind, n) in &report.faults {
            *faults.entry(kind).or_default() += n;
        }
        duplicates += report.duplicates.values().sum::<u64>();
        traps += report.commit_traps;
    }
    for kind in FAULT_KINDS {
        assert!(
            faults.contains_key(kind),
            "no seed of the set applied {kind}: {faults:?}"
        );
    }
    assert!(duplicates > 0, "no message was duplicated");
    assert!(traps > 0, "the commit trap never fired");
}
