//! The oncekv CLI's operator commands against `oncekv serve` processes: endpoint health
//! and hashkv across the cluster, defrag, alarm list and disarm, move-leader, all with
//! etcdctl's output.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{free_port, start_founders};

fn oncekv(endpoints: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_oncekv"))
        .args(["--endpoints", endpoints])
        .args(args)
        .output()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Retries until `args` succeeds and `accept` takes its output.
fn eventually(endpoints: &str, args: &[&str], accept: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    loop {
        let out = oncekv(endpoints, args);
        let text = stdout(&out);
        if out.status.success() && accept(&text) {
            return text;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "oncekv {args:?}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn health_hashkv_defrag_alarms_and_move_leader() {
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let _members = start_founders(dir.path(), &ports, 3);
    let all = ports
        .iter()
        .map(|(c, _)| format!("127.0.0.1:{c}"))
        .collect::<Vec<_>>()
        .join(",");
    eventually(&all, &["put", "k", "v"], |_| true);

    // Every member, once every member has published its client URL.
    let health = eventually(&all, &["endpoint", "health", "--cluster"], |t| {
        t.lines().count() == 3
    });
    assert!(
        health
            .lines()
            .all(|l| l.contains(" is healthy: successfully committed proposal: took = ")),
        "{health}"
    );
    let hashes = eventually(&all, &["endpoint", "hashkv", "--cluster"], |t| {
        let h: Vec<&str> = t.lines().filter_map(|l| l.rsplit(", ").next()).collect();
        h.len() == 3 && h.iter().all(|x| *x == h[0])
    });
    assert_eq!(hashes.lines().count(), 3, "{hashes}");

    let defrag = eventually(&all, &["defrag", "--cluster"], |_| true);
    assert_eq!(
        defrag
            .lines()
            .filter(|l| l.starts_with("Finished defragmenting etcd member["))
            .count(),
        3,
        "{defrag}"
    );

    let out = oncekv(&all, &["alarm", "list"]);
    assert!(out.status.success());
    assert_eq!(stdout(&out), "");
    let out = oncekv(&all, &["alarm", "disarm"]);
    assert!(out.status.success());

    // Move leadership to a member that does not lead.
    let status: serde_json::Value = serde_json::from_str(&eventually(
        &all,
        &["endpoint", "status", "-w", "json"],
        |_| true,
    ))
    .unwrap();
    let leader = status[0]["Status"]["leader"].as_u64().unwrap();
    let target = status
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["Status"]["header"]["member_id"].as_u64().unwrap())
        .find(|id| *id != leader)
        .unwrap();
    let moved = oncekv(&all, &["move-leader", &format!("{target:x}")]);
    assert!(
        moved.status.success(),
        "{}",
        String::from_utf8_lossy(&moved.stderr)
    );
    assert_eq!(
        stdout(&moved),
        format!("Leadership transferred from {leader:x} to {target:x}\n")
    );
    let status: serde_json::Value = serde_json::from_str(&eventually(
        &all,
        &["endpoint", "status", "-w", "json"],
        |_| true,
    ))
    .unwrap();
    assert_eq!(status[0]["Status"]["leader"].as_u64(), Some(target));
    let bad = oncekv(&all, &["move-leader", "nothex"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("expecting ID in Hex"));
}
