//! A few seeds with every fault must pass every checker (CI runs many more through the
//! binary: see the crate README).

use oncekv_sim::run::{Options, run};

#[test]
fn first_seeds_pass_every_checker() {
    for seed in 0..3 {
        let report = run(seed, &Options::default());
        assert!(
            report.ok(),
            "seed {seed}: {:#?}\n{}",
            report.violations,
            report.trace.join("\n")
        );
    }
}
