//! The same seed must replay bit for bit: that is what makes a failing seed debuggable.

use oncekv_sim::run::{Options, run};

#[test]
fn same_seed_same_trace_hash() {
    let opts = Options {
        ops_per_client: 15,
        fault_secs: 8,
        ..Options::default()
    };
    let a = run(7, &opts);
    let b = run(7, &opts);
    assert!(a.ok(), "{:#?}", a.violations);
    assert_eq!(a.trace, b.trace, "same seed, different traces");
    assert_eq!(a.trace_hash, b.trace_hash);
    let c = run(8, &opts);
    assert_ne!(a.trace_hash, c.trace_hash, "different seeds, same trace");
}
