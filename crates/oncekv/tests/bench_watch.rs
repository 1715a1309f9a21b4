//! `oncekv bench watch` against `oncekv dev`: the fan-out tool itself must hold up, since
//! its exactly-once check is what a benchmark run's figures are trusted on.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

/// A child process killed when dropped, so a failing test leaves no cluster behind.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// A small run (20 watchers on 3 streams over the 3 members, 50 puts) reports every event
// delivered exactly once, in order, and the summary's counts add up.
#[test]
fn bench_watch_delivers_every_put_to_every_watcher_once() {
    let data = tempfile::tempdir().unwrap();
    let mut dev = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_oncekv"))
            .args(["dev", "--data-dir"])
            .arg(data.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // `oncekv dev` prints "  n1: clients http://127.0.0.1:2379  peers ..." per member
    // (on other ports when those are taken), then "ctrl-c stops the cluster".
    let mut endpoints = Vec::new();
    let mut lines = BufReader::new(dev.0.stdout.take().unwrap()).lines();
    for line in lines.by_ref().map_while(Result::ok) {
        if let Some((_, url)) = line.split_once("clients http://") {
            endpoints.push(url.split_whitespace().next().unwrap().to_string());
        }
        if line.contains("ctrl-c") {
            break;
        }
    }

    let out = Command::new(env!("CARGO_BIN_EXE_oncekv"))
        .args(["bench", "watch", "--endpoints", &endpoints.join(",")])
        .args([
            "--watchers",
            "20",
            "--streams",
            "3",
            "--total",
            "50",
            "-w",
            "json",
        ])
        .output()
        .unwrap();
    drop(dev);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench watch failed: {stderr}");
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["puts"], 50, "{summary}");
    assert_eq!(summary["events"], 50 * 20, "{summary}");
    for bad in ["gaps", "duplicates", "missing", "problems"] {
        assert_eq!(summary[bad], 0, "{bad}: {summary}");
    }
    assert!(
        summary["latency_ms"]["p99"].as_f64().unwrap() > 0.0,
        "{summary}"
    );
}
