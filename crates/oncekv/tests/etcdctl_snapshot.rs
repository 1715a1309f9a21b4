//! Backup and restore as an etcd operator does them: `etcdctl snapshot save` from a
//! running oncekv member, `oncekv snapshot status` (the same as etcdctl's), `oncekv
//! snapshot restore` into a new single-member cluster holding the same data; `etcdctl
//! endpoint hashkv --cluster` equal on every member. And migration both ways: an oncekv
//! copy restored by etcdctl into a real etcd 3.4, and that etcd's snapshot restored back
//! into oncekv.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, serve_member, start_founders};

fn etcdctl(endpoints: &str, args: &[&str]) -> std::process::Output {
    Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoints}"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn eventually(endpoints: &str, args: &[&str]) -> String {
    let start = Instant::now();
    loop {
        let out = etcdctl(endpoints, args);
        if out.status.success() {
            return String::from_utf8(out.stdout).unwrap();
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "etcdctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn oncekv(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_oncekv"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn snapshot_save_status_restore_and_hashkv() {
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let mut procs = start_founders(dir.path(), &ports, 3);
    let endpoint = |i: usize| format!("127.0.0.1:{}", ports[i].0);
    let all = (0..3).map(endpoint).collect::<Vec<_>>().join(",");
    eventually(&all, &["put", "k000", "v0"]);
    for i in 1..50 {
        eventually(&all, &["put", &format!("k{i:03}"), &format!("v{i}")]);
    }
    eventually(&all, &["put", "k007", "overwritten"]);

    // HashKV at one revision is the same on every member (once all have applied it, and
    // every member's client URL is published for --cluster to find).
    let start = Instant::now();
    loop {
        let out = ok(etcdctl(
            &all,
            &["endpoint", "hashkv", "--cluster", "-w", "json"],
        ));
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let hashes: Vec<u64> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["HashKV"]["hash"].as_u64().unwrap_or(0))
            .collect();
        if hashes.len() == 3 && hashes.iter().all(|h| *h == hashes[0] && *h != 0) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "hashes differ: {out}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // etcdctl snapshot save from one member; oncekv snapshot status reads it.
    let file = dir.path().join("backup.db");
    let out = ok(etcdctl(
        &endpoint(1),
        &["snapshot", "save", file.to_str().unwrap()],
    ));
    assert!(out.contains("Snapshot saved at"), "{out}");
    let status = oncekv(&["snapshot", "status", file.to_str().unwrap(), "-w", "json"]);
    let status = ok(status);
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(v["revision"], 52, "{status}");
    // etcdctl reads the copy (bbolt's integrity check included) and says the same.
    let theirs = ok(etcdctl(
        &endpoint(1),
        &["snapshot", "status", file.to_str().unwrap(), "-w", "json"],
    ));
    assert_eq!(theirs, status);

    // A damaged copy is refused, not restored.
    let mut damaged = std::fs::read(&file).unwrap();
    let mid = damaged.len() / 2;
    damaged[mid] ^= 0xff;
    let bad = dir.path().join("damaged.db");
    std::fs::write(&bad, damaged).unwrap();
    let out = oncekv(&["snapshot", "status", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("checksum mismatch"));

    // Restore into a new one-member cluster and serve it: the same data.
    let (client, peer) = (free_port(), free_port());
    let peer_url = format!("http://127.0.0.1:{peer}");
    let restored = dir.path().join("restored");
    let r1_cluster = format!("r1={peer_url}");
    let restore = || {
        oncekv(&[
            "snapshot",
            "restore",
            file.to_str().unwrap(),
            "--data-dir",
            restored.join("r1").to_str().unwrap(),
            "--name",
            "r1",
            "--initial-cluster",
            &r1_cluster,
            "--initial-advertise-peer-urls",
            &peer_url,
        ])
    };
    let out = ok(restore());
    assert!(out.contains("50 keys"), "{out}");
    assert!(out.contains("oncekv state, sessions included"), "{out}");
    // Restoring over existing data is refused.
    let again = restore();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists"));

    procs.0.push(serve_member(
        &restored,
        "r1",
        (client, peer),
        &format!("r1={peer_url}"),
        false,
        Stdio::null(),
    ));
    let new = format!("127.0.0.1:{client}");
    let copy = eventually(&new, &["get", "k", "--prefix", "-w", "json"]);
    let original = ok(etcdctl(&all, &["get", "k", "--prefix", "-w", "json"]));
    let kvs = |s: &str| {
        let v: serde_json::Value = serde_json::from_str(s).unwrap();
        v["kvs"].clone()
    };
    assert_eq!(kvs(&copy), kvs(&original));
    assert_eq!(kvs(&copy).as_array().unwrap().len(), 50);
    // The restored cluster takes writes, and its member list is the new one.
    ok(etcdctl(&new, &["put", "after", "restore"]));
    let members = ok(etcdctl(&new, &["member", "list"]));
    assert_eq!(members.lines().count(), 1, "{members}");
    assert!(members.contains("r1"), "{members}");
}

/// A real etcd 3.4 member on fresh ports serving the data directory `data`.
fn etcd_member(data: &std::path::Path, name: &str, (client, peer): (u16, u16)) -> common::Members {
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let child = Command::new("etcd")
        .args(["--name", name, "--data-dir"])
        .arg(data)
        .args(["--listen-client-urls", &client_url])
        .args(["--advertise-client-urls", &client_url])
        .args(["--listen-peer-urls", &peer_url])
        .args(["--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("{name}={peer_url}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("etcd is not installed: run .ci/install-deps");
    common::Members(vec![child])
}

fn kvs_json(endpoint: &str) -> serde_json::Value {
    let out = eventually(endpoint, &["get", "", "--prefix", "-w", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["kvs"].clone()
}

#[test]
fn a_copy_moves_to_etcd_and_back() {
    let dir = tempfile::tempdir().unwrap();
    let (_oncekv, (client, _)) = common::serve_single(dir.path(), &[]);
    let ep = format!("127.0.0.1:{client}");
    common::wait_serving(&ep);
    for (k, v) in [("a", "1"), ("b", "2"), ("a", "3"), ("c", "4")] {
        ok(etcdctl(&ep, &["put", k, v]));
    }
    ok(etcdctl(&ep, &["del", "b"]));
    let lease = ok(etcdctl(&ep, &["lease", "grant", "600"]));
    let lease = lease.split_whitespace().nth(1).unwrap().to_string();
    ok(etcdctl(&ep, &["put", "leased", "x", "--lease", &lease]));
    let rev_of_a3 = {
        let v: serde_json::Value =
            serde_json::from_str(&ok(etcdctl(&ep, &["get", "a", "-w", "json"]))).unwrap();
        v["kvs"][0]["mod_revision"].as_i64().unwrap()
    };
    ok(etcdctl(&ep, &["compact", &rev_of_a3.to_string()]));
    ok(etcdctl(&ep, &["put", "a", "5"]));
    let original = kvs_json(&ep);

    // oncekv -> etcd: etcdctl restores the copy, and etcd serves the same keys, with the
    // history since the compaction, and the lease.
    let copy = dir.path().join("copy.db");
    ok(etcdctl(&ep, &["snapshot", "save", copy.to_str().unwrap()]));
    let (eclient, epeer) = (free_port(), free_port());
    let etcd_dir = dir.path().join("etcd-data");
    let _ = etcdctl_restore(&copy, "e1", &etcd_dir, epeer);
    let etcd = etcd_member(&etcd_dir, "e1", (eclient, epeer));
    let eep = format!("127.0.0.1:{eclient}");
    assert_eq!(kvs_json(&eep), original);
    let old = ok(etcdctl(
        &eep,
        &["get", "a", "--rev", &rev_of_a3.to_string()],
    ));
    assert_eq!(old, "a\n3\n");
    let compacted = etcdctl(&eep, &["get", "a", "--rev", "2"]);
    assert!(String::from_utf8_lossy(&compacted.stderr).contains("compacted"));
    let leases = ok(etcdctl(&eep, &["lease", "list"]));
    assert!(leases.contains(&lease), "{leases}");

    // etcd -> oncekv: etcd writes, saves; oncekv restores what etcd now holds (the
    // sessions of the first copy are dropped: etcd has written since, and oncekv says so).
    ok(etcdctl(&eep, &["put", "from-etcd", "y"]));
    let at_etcd = kvs_json(&eep);
    let back = dir.path().join("back.db");
    ok(etcdctl(&eep, &["snapshot", "save", back.to_str().unwrap()]));
    drop(etcd);
    let (rclient, rpeer) = (free_port(), free_port());
    let cluster = format!("r1=http://127.0.0.1:{rpeer}");
    let restored = dir.path().join("restored");
    let out = ok(oncekv(&[
        "snapshot",
        "restore",
        back.to_str().unwrap(),
        "--data-dir",
        restored.join("r1").to_str().unwrap(),
        "--name",
        "r1",
        "--initial-cluster",
        &cluster,
    ]));
    assert!(out.contains("etcd data"), "{out}");
    assert!(out.contains("dropped"), "{out}");
    let _member = common::Members(vec![serve_member(
        &restored,
        "r1",
        (rclient, rpeer),
        &cluster,
        false,
        Stdio::null(),
    )]);
    let rep = format!("127.0.0.1:{rclient}");
    assert_eq!(kvs_json(&rep), at_etcd);
    let leases = ok(etcdctl(&rep, &["lease", "list"]));
    assert!(leases.contains(&lease), "{leases}");
    // The restored cluster takes writes after the imported revision.
    let put = ok(etcdctl(&rep, &["put", "after", "z", "-w", "json"]));
    let v: serde_json::Value = serde_json::from_str(&put).unwrap();
    let last = at_etcd
        .as_array()
        .unwrap()
        .iter()
        .map(|kv| kv["mod_revision"].as_i64().unwrap())
        .max()
        .unwrap();
    assert_eq!(v["header"]["revision"].as_i64().unwrap(), last + 1);
}

/// `etcdctl snapshot restore` of `copy` into `data_dir`, for the single member `name` of a
/// new cluster whose peer port is `peer`; the member id etcdctl gave it (hex).
fn etcdctl_restore(
    copy: &std::path::Path,
    name: &str,
    data_dir: &std::path::Path,
    peer: u16,
) -> String {
    let peer_url = format!("http://127.0.0.1:{peer}");
    let out = etcdctl(
        "127.0.0.1:1",
        &[
            "snapshot",
            "restore",
            copy.to_str().unwrap(),
            "--name",
            name,
            "--data-dir",
            data_dir.to_str().unwrap(),
            "--initial-cluster",
            &format!("{name}={peer_url}"),
            "--initial-advertise-peer-urls",
            &peer_url,
        ],
    );
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    ok(out);
    // etcdctl logs the member it adds: ..."added-peer-id":"347efd38acec9c95"...
    let (_, rest) = log
        .split_once("\"added-peer-id\":\"")
        .unwrap_or_else(|| panic!("no added-peer-id in {log}"));
    rest.split('"').next().unwrap().to_string()
}

/// Every file under `dir` with its contents.
fn files_under(dir: &std::path::Path) -> std::collections::BTreeMap<std::path::PathBuf, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
            } else {
                out.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

// The migration an etcd operator reaches for first (etcd's TestIssue6361): `etcdctl
// snapshot restore` writes etcd's data directory (member/snap/db, member/wal), and the
// member is started on it. oncekv imports the database once, leaves etcd's files as they
// were, and a write made after the import survives a restart (no second import).
#[test]
fn a_member_starts_on_a_data_dir_written_by_etcdctl_snapshot_restore() {
    let dir = tempfile::tempdir().unwrap();
    let (source, (client, _)) = common::serve_single(dir.path(), &[]);
    let ep = format!("127.0.0.1:{client}");
    common::wait_serving(&ep);
    for (k, v) in [("foo1", "val1"), ("foo2", "val2"), ("foo3", "val3")] {
        ok(etcdctl(&ep, &["put", k, v]));
    }
    let foos = |ep: &str| eventually(ep, &["get", "foo", "--prefix", "-w", "json"]);
    let kvs = |out: String| serde_json::from_str::<serde_json::Value>(&out).unwrap()["kvs"].clone();
    let original = kvs(foos(&ep));
    let copy = dir.path().join("copy.db");
    ok(etcdctl(&ep, &["snapshot", "save", copy.to_str().unwrap()]));
    drop(source);

    let (rclient, rpeer) = (free_port(), free_port());
    let cluster = format!("infra1=http://127.0.0.1:{rpeer}");
    let restored = dir.path().join("restored");
    let data_dir = restored.join("infra1");
    let etcd_id = etcdctl_restore(&copy, "infra1", &data_dir, rpeer);
    assert!(data_dir.join("member/snap/db").is_file());
    let etcd_files = files_under(&data_dir.join("member"));
    let start = || {
        let member = common::Members(vec![serve_member(
            &restored,
            "infra1",
            (rclient, rpeer),
            &cluster,
            false,
            Stdio::null(),
        )]);
        common::wait_serving(&format!("127.0.0.1:{rclient}"));
        member
    };
    let rep = format!("127.0.0.1:{rclient}");
    let member = start();
    assert_eq!(kvs(foos(&rep)), original);
    // The member keeps the id etcd gave it (etcd derives ids from the peer URLs and the
    // cluster token; so does oncekv for a new cluster).
    let listed = ok(etcdctl(&rep, &["member", "list"]));
    assert!(
        listed.starts_with(&format!("{etcd_id}, ")),
        "{listed} vs {etcd_id}"
    );
    ok(etcdctl(&rep, &["put", "after", "import"]));
    drop(member);
    assert_eq!(
        files_under(&data_dir.join("member")),
        etcd_files,
        "etcd's files changed"
    );
    let _member = start();
    assert_eq!(ok(etcdctl(&rep, &["get", "after"])), "after\nimport\n");
    assert_eq!(kvs(foos(&rep)), original);
}
