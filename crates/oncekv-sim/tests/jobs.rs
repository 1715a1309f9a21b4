//! `--jobs 2` runs each seed in a child process and must print what `--jobs 1` prints:
//! the same seeds, the same trace hashes, the same totals.

use std::process::Command;

/// The per-seed lines (without the wall time) and the totals of a run of the binary.
fn run_sim(jobs: &str) -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_oncekv-sim"))
        .args([
            "--seeds",
            "3",
            "--start",
            "154",
            "--ops",
            "15",
            "--fault-secs",
            "8",
        ])
        .args(["--jobs", jobs])
        .output()
        .expect("the simulator runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            if line.starts_with("summary:") {
                // Up to the wall time (and the job count after it).
                line.split_once(" in ").map(|(head, _)| head.to_string())
            } else if let Some((seed, rest)) = line.split_once(" in ") {
                // Drop "<t>s wall, " from seed lines.
                let rest = rest.split_once("wall, ").map_or(rest, |(_, r)| r);
                Some(format!("{seed} {rest}"))
            } else {
                Some(line.to_string())
            }
        })
        .collect()
}

#[test]
fn seeds_in_child_processes_print_what_one_job_prints() {
    if !oncekv_sim::TOKIO_SEEDED {
        panic!(
            "built without --cfg tokio_unstable (.cargo/config.toml sets it; a RUSTFLAGS \
             variable replaces it): tokio's select! order is then random per process"
        );
    }
    let one = run_sim("1");
    let two = run_sim("2");
    assert_eq!(
        one.iter().filter(|l| l.starts_with("seed ")).count(),
        3,
        "{one:#?}"
    );
    assert!(one.iter().any(|l| l.starts_with("  faults: ")), "{one:#?}");
    assert_eq!(one, two);
}
