//! A seed's path must not depend on what ran before it in the same process. tokio numbers
//! tasks from one process-wide counter and a crashed host's tasks are dropped in an order
//! that depends on those numbers (`oncekv_sim::run::align_task_ids`). Kept alone in its
//! own test binary: tests running at the same time in one process would take numbers from
//! each other.

use oncekv_sim::run::{Options, run};

/// Makes `n` tokio tasks, moving the process-wide task counter on by `n`.
fn spend_task_ids(n: usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a throwaway runtime");
    rt.block_on(async {
        for _ in 0..n {
            tokio::spawn(async {}).await.expect("an empty task");
        }
    });
}

#[test]
fn a_seed_takes_the_same_path_whatever_tasks_the_process_made_before() {
    let opts = Options::default();
    // Seed 154 took another path after 1, 2 or 3 extra tasks before the alignment.
    let first = run(154, &opts);
    assert!(first.ok(), "{:#?}", first.violations);
    for n in [1, 2] {
        spend_task_ids(n);
        let again = run(154, &opts);
        assert_eq!(
            first.trace_hash, again.trace_hash,
            "seed 154 took another path after {n} extra tokio tasks"
        );
    }
}
