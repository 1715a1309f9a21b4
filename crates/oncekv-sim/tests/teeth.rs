//! The checkers must have teeth: with a mechanism switched off inside the simulated
//! server, some seed among the first 200 must fail. A harness that passes a broken server
//! proves nothing about a working one.

use oncekv_sim::run::{Breaks, Options, run};

fn first_failing_seed(breaks: Breaks) -> Option<(u64, Vec<String>)> {
    let opts = Options {
        breaks,
        ..Options::default()
    };
    (0..200).find_map(|seed| {
        let report = run(seed, &opts);
        (!report.ok()).then_some((seed, report.violations))
    })
}

#[test]
fn broken_dedup_is_caught_within_200_seeds() {
    let found = first_failing_seed(Breaks {
        dedup: true,
        ..Breaks::default()
    });
    let (seed, violations) = found.expect("no seed caught a server that executes duplicates");
    assert!(
        violations.iter().any(|v| v.contains("exactly-once")),
        "seed {seed} failed, but not on exactly-once: {violations:#?}"
    );
}

#[test]
fn broken_fsync_is_caught_within_200_seeds() {
    let found = first_failing_seed(Breaks {
        fsync: true,
        ..Breaks::default()
    });
    assert!(
        found.is_some(),
        "no seed caught a server whose fsync acknowledges without syncing"
    );
}

// The leader's own appends are acknowledged before they are durable; what keeps that
// safe is that nothing is applied or passed on as committed before the leader's copy is
// durable. Without those gates a slow leader disk and a crash inside it (the
// `SlowLeaderDisk` fault) lose applied entries. Under debug assertions the broken server
// may trip openraft's own check (a committed entry that differs) and panic, which the run
// reports as a violation of the seed.
#[test]
fn broken_durability_gates_are_caught_within_200_seeds() {
    let opts = Options {
        breaks: Breaks {
            durability_gates: true,
            ..Breaks::default()
        },
        ..Options::default()
    };
    let caught = (0..200).find(|&seed| !run(seed, &opts).ok());
    assert!(
        caught.is_some(),
        "no seed caught a leader that applies entries before its own copy is durable"
    );
}
