//! `oncekv demo` end to end: it must report exactly-once held (exit 0) while the
//! etcd-style contrast run shows duplicates.
#![allow(clippy::unwrap_used)]

use std::process::Command;

#[test]
fn demo_holds_exactly_once_and_shows_the_untracked_duplicates() {
    let out = Command::new(env!("CARGO_BIN_EXE_oncekv"))
        .args([
            "demo",
            "--clients",
            "3",
            "--puts",
            "40",
            "--leases",
            "4",
            "--leader-kills",
            "1",
        ])
        .args(["--drop-replies", "0.3", "--seed", "5"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (tracked, untracked) = stdout.split_once("== etcd-style client").unwrap();
    let applied_twice = |section: &str| -> u64 {
        let line = section
            .lines()
            .find(|l| l.trim_start().starts_with("commands applied twice:"))
            .unwrap();
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(applied_twice(tracked), 0, "{stdout}");
    assert!(
        applied_twice(untracked) > 0,
        "the contrast run showed no duplicates:\n{stdout}"
    );
    assert!(
        tracked.contains("leader changes:                1"),
        "{stdout}"
    );
    assert!(stdout.contains("exactly-once held"), "{stdout}");
}
