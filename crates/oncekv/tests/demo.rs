//! `oncekv demo` end to end: it must report exactly-once held (exit 0) while the
//! etcd-style contrast run shows duplicates.
#![allow(clippy::unwrap_used)]

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn demo_holds_exactly_once_and_shows_the_untracked_duplicates() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_oncekv"))
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
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout_pipe = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        stdout_pipe.read_to_string(&mut out).unwrap();
        out
    });
    // A hang must fail this test with the demo's output, not stall the whole suite.
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > Duration::from_secs(180) {
            child.kill().unwrap();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = reader.join().unwrap();
    let status = status.unwrap_or_else(|| panic!("demo still running after 180 s:\n{stdout}"));
    assert!(status.success(), "demo failed:\n{stdout}");
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
