//! The space quota as an etcd operator meets it: past `--quota-backend-bytes` the NOSPACE
//! alarm is raised and writes get etcd's "database space exceeded" while reads and
//! deletes go on; after deleting, compacting and defragmenting, `alarm disarm` resumes
//! writes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{free_port, serve_single};

fn etcdctl(endpoint: &str, args: &[&str]) -> Output {
    Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn nospace_refuses_writes_until_space_is_freed_and_the_alarm_disarmed() {
    let dir = tempfile::tempdir().unwrap();
    let metrics_port = free_port();
    let metrics_url = format!("http://127.0.0.1:{metrics_port}");
    let (_member, ports) = serve_single(
        dir.path(),
        &[
            "--quota-backend-bytes",
            "300000",
            "--listen-metrics-urls",
            &metrics_url,
        ],
    );
    let e = format!("127.0.0.1:{}", ports.0);
    let start = Instant::now();
    while !etcdctl(&e, &["put", "probe", "1"]).status.success() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the member never served"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let value = "v".repeat(20_000);
    let mut refused = None;
    for i in 0..100 {
        let out = etcdctl(&e, &["put", &format!("k{i:03}"), &value]);
        if !out.status.success() {
            refused = Some(String::from_utf8_lossy(&out.stderr).into_owned());
            break;
        }
    }
    let refused = refused.expect("the quota was never reached");
    assert!(
        refused.contains("etcdserver: mvcc: database space exceeded"),
        "{refused}"
    );
    let alarms = ok(etcdctl(&e, &["alarm", "list"]));
    assert!(alarms.contains("alarm:NOSPACE"), "{alarms}");
    // Still refused while the alarm is up, small or not; reads and deletes go on.
    assert!(!etcdctl(&e, &["put", "small", "x"]).status.success());
    assert_eq!(
        ok(etcdctl(&e, &["get", "k000", "--print-value-only"])).trim(),
        value
    );
    let deleted = ok(etcdctl(&e, &["del", "k", "--prefix"]));
    assert!(deleted.trim().parse::<u32>().unwrap() > 5, "{deleted}");
    // etcd 3.4's body; the alarm named in oncekv's header.
    let health = std::process::Command::new("curl")
        .args(["-s", "-i", &format!("http://{e}/health")])
        .output()
        .unwrap();
    let health = String::from_utf8_lossy(&health.stdout).to_ascii_lowercase();
    assert!(
        health.contains("x-oncekv-health-reason: alarm nospace")
            && health.ends_with(r#"{"health":"false"}"#),
        "{health}"
    );
    // The metrics port serves the same routes (and nothing of the gRPC API).
    let metrics = common::http_get(&format!("http://127.0.0.1:{metrics_port}/metrics"));
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("etcd_mvcc_db_total_size_in_bytes ")),
        "{metrics}"
    );

    // Give the space back: compact at the deletion, defragment (a snapshot).
    let v: serde_json::Value =
        serde_json::from_str(&ok(etcdctl(&e, &["get", "probe", "-w", "json"]))).unwrap();
    let revision = v["header"]["revision"].as_i64().unwrap().to_string();
    ok(etcdctl(&e, &["compact", &revision]));
    ok(etcdctl(&e, &["defrag"]));
    let status: serde_json::Value =
        serde_json::from_str(&ok(etcdctl(&e, &["endpoint", "status", "-w", "json"]))).unwrap();
    let db_size = status[0]["Status"]["dbSize"].as_i64().unwrap();
    assert!(
        db_size < 100_000,
        "defragmenting gave nothing back: {db_size}"
    );

    let disarmed = ok(etcdctl(&e, &["alarm", "disarm"]));
    assert!(disarmed.contains("alarm:NOSPACE"), "{disarmed}");
    assert_eq!(ok(etcdctl(&e, &["alarm", "list"])).trim(), "");
    ok(etcdctl(&e, &["put", "after", "disarm"]));
}
