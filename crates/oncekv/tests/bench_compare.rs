//! `oncekv bench compare` end to end: it starts a real 3-member etcd and a 3-member
//! `oncekv dev`, measures both, and writes the table, the chart and every run.
#![allow(clippy::unwrap_used)]

use std::process::Command;

#[test]
fn compare_runs_both_clusters_and_writes_table_chart_and_runs() {
    let out = tempfile::tempdir().unwrap();
    let result = Command::new(env!("CARGO_BIN_EXE_oncekv"))
        .args([
            "bench",
            "compare",
            "--clients",
            "1,4",
            "--workloads",
            "put,range",
        ])
        .args(["--duration", "0.5", "--rounds", "1", "--key-space", "1000"])
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("etcd is not installed: run .ci/install-deps");
    let stdout = String::from_utf8_lossy(&result.stdout);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(result.status.success(), "{stdout}\n{stderr}");

    // Every run completed requests without errors: 2 client counts of put and range
    // against etcd, and against oncekv the same plus the oncekv client's two put columns.
    let csv = std::fs::read_to_string(out.path().join("runs.csv")).unwrap();
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    assert_eq!(rows.len(), 4 + 8, "{csv}");
    for row in &rows {
        let (ok, errors): (u64, u64) = (row[5].parse().unwrap(), row[6].parse().unwrap());
        assert!(ok > 0 && errors == 0, "{row:?}");
    }
    let count = |server: &str, client: &str| {
        rows.iter()
            .filter(|r| r[1] == server && r[2] == client)
            .count()
    };
    assert_eq!(count("etcd", "wire"), 4);
    assert_eq!(count("oncekv", "wire"), 4);
    assert_eq!(count("oncekv", "tracked"), 2);
    assert_eq!(count("oncekv", "untracked"), 2);
    // The etcd servers were separate processes whose CPU was counted.
    assert!(
        rows.iter()
            .filter(|r| r[1] == "etcd")
            .all(|r| r[11].parse::<f64>().unwrap() > 0.0),
        "{csv}"
    );

    let md = std::fs::read_to_string(out.path().join("compare.md")).unwrap();
    assert!(md.contains("etcd 3."), "{md}");
    assert!(md.contains("## put") && md.contains("## range"), "{md}");
    assert!(md.contains("| 4 |"), "{md}");
    let svg = std::fs::read_to_string(out.path().join("compare.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("range: throughput"));
    assert!(stdout.contains("oncekv/etcd"), "{stdout}");
}

#[test]
fn compare_names_a_missing_etcd() {
    let out = tempfile::tempdir().unwrap();
    let result = Command::new(env!("CARGO_BIN_EXE_oncekv"))
        .args(["bench", "compare", "--etcd", "/nonexistent/etcd", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    assert!(!result.status.success());
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(
        stderr.contains("/nonexistent/etcd") && stderr.contains("--etcd PATH"),
        "{stderr}"
    );
}
