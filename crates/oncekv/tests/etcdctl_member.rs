//! etcdctl's member commands against `oncekv serve` processes, as an operator grows and
//! shrinks a cluster: `member add` prints the settings the new member starts with, the
//! new member joins with them, `member remove` of the leader makes that member exit and
//! the others carry on; the oncekv CLI's learner add and promote answer as etcdctl's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, serve_member, start_founders};

fn run(cmd: &str, endpoints: &str, args: &[&str]) -> Output {
    let mut c = Command::new(cmd);
    if cmd == "etcdctl" {
        c.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoints}"));
    } else {
        c.args(["--endpoints", endpoints]);
    }
    c.args(args).output().unwrap()
}

fn ok(cmd: &str, endpoints: &str, args: &[&str]) -> String {
    let out = run(cmd, endpoints, args);
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Retries `args` until it succeeds (a cluster electing a leader), for up to `limit`.
fn eventually(cmd: &str, endpoints: &str, args: &[&str], limit: Duration) -> String {
    let start = Instant::now();
    loop {
        let out = run(cmd, endpoints, args);
        if out.status.success() {
            return String::from_utf8(out.stdout).unwrap();
        }
        assert!(
            start.elapsed() < limit,
            "{cmd} {args:?} kept failing: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `NAME="value"` lines of `member add`'s output.
/// Waits until every member at `endpoints` names the same leader twice, half a second
/// apart: a membership change sent during an election fails (as etcd's does, with its
/// outcome unknown), and a fresh cluster on a loaded machine may still hold one.
fn stable_leader(endpoints: &str) {
    let leaders = || {
        let out = run("etcdctl", endpoints, &["endpoint", "status", "-w", "json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let all: Vec<u64> = v
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|e| e["Status"]["leader"].as_u64().unwrap_or(0))
                    .collect()
            })
            .unwrap_or_default();
        let n = endpoints.split(',').count();
        (all.len() == n && all.iter().all(|l| *l != 0 && *l == all[0])).then(|| all[0])
    };
    let start = Instant::now();
    loop {
        if let Some(first) = leaders() {
            std::thread::sleep(Duration::from_millis(500));
            if leaders() == Some(first) {
                return;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no stable leader at {endpoints}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn env_value(out: &str, name: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_else(|| panic!("no {name} in {out}"))
}

/// `member list -w json` → (hex id, name, is learner), from `endpoints`.
fn members(endpoints: &str) -> Vec<(String, String, bool)> {
    let out = ok("etcdctl", endpoints, &["member", "list", "-w", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mut list: Vec<(String, String, bool)> = v["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                format!("{:x}", m["ID"].as_u64().unwrap()),
                m["name"].as_str().unwrap_or_default().to_string(),
                m["isLearner"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    list.sort_by(|a, b| a.1.cmp(&b.1));
    list
}

#[test]
fn etcdctl_grows_the_cluster_and_removes_the_leader() {
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<(u16, u16)> = (0..4).map(|_| (free_port(), free_port())).collect();
    let mut procs = start_founders(dir.path(), &ports, 3);
    let all = |which: &[usize]| {
        which
            .iter()
            .map(|&i| format!("127.0.0.1:{}", ports[i].0))
            .collect::<Vec<_>>()
            .join(",")
    };
    let founders = all(&[0, 1, 2]);
    eventually(
        "etcdctl",
        &founders,
        &["put", "a", "1"],
        Duration::from_secs(20),
    );

    let n4_peer = format!("http://127.0.0.1:{}", ports[3].1);
    stable_leader(&founders);
    let out = ok(
        "etcdctl",
        &founders,
        &["member", "add", "n4", &format!("--peer-urls={n4_peer}")],
    );
    assert!(
        out.starts_with("Member ") && out.contains(" added to cluster "),
        "{out}"
    );
    assert_eq!(env_value(&out, "ETCD_NAME"), "n4");
    assert_eq!(env_value(&out, "ETCD_INITIAL_CLUSTER_STATE"), "existing");
    assert_eq!(env_value(&out, "ETCD_INITIAL_ADVERTISE_PEER_URLS"), n4_peer);
    let n4_cluster = env_value(&out, "ETCD_INITIAL_CLUSTER");
    assert!(
        n4_cluster.contains(&format!("n4={n4_peer}")),
        "{n4_cluster}"
    );
    procs.0.push(serve_member(
        dir.path(),
        "n4",
        ports[3],
        &n4_cluster,
        true,
        Stdio::null(),
    ));
    let n4 = all(&[3]);
    // The new member has the data, and every member lists four started members.
    let got = eventually(
        "etcdctl",
        &n4,
        &["get", "a", "--print-value-only"],
        Duration::from_secs(20),
    );
    assert_eq!(got.trim(), "1");
    let start = Instant::now();
    while members(&founders)
        .iter()
        .any(|(_, name, _)| name.is_empty())
    {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "n4 never listed as started"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let list = members(&founders);
    assert_eq!(
        list.iter().map(|(_, n, _)| n.as_str()).collect::<Vec<_>>(),
        ["n1", "n2", "n3", "n4"]
    );

    // Remove the leader: its process exits, the other three elect a leader and serve.
    stable_leader(&all(&[0, 1, 2, 3]));
    let status = ok("etcdctl", &founders, &["endpoint", "status", "-w", "json"]);
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    let leader = format!("{:x}", v[0]["Status"]["leader"].as_u64().unwrap());
    let leader_index = list.iter().position(|(id, _, _)| *id == leader).unwrap();
    let out = ok("etcdctl", &n4, &["member", "remove", &leader]);
    assert!(out.contains("removed from cluster"), "{out}");
    let start = Instant::now();
    let exit = loop {
        if let Some(status) = procs.0[leader_index].try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the removed leader did not exit"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        exit.success(),
        "a removed member exits 0, as etcd's: {exit}"
    );
    let rest: Vec<usize> = (0..4).filter(|&i| i != leader_index).collect();
    let remaining = all(&rest);
    eventually(
        "etcdctl",
        &remaining,
        &["put", "b", "2"],
        Duration::from_secs(20),
    );
    let list = members(&remaining);
    assert_eq!(list.len(), 3, "{list:?}");
    assert!(list.iter().all(|(id, _, _)| *id != leader));

    // The oncekv CLI: a learner that has not started cannot be promoted; removing it works.
    let oncekv = env!("CARGO_BIN_EXE_oncekv");
    let out = ok(
        oncekv,
        &remaining,
        &[
            "member",
            "add",
            "n5",
            "--peer-urls=http://127.0.0.1:9",
            "--learner",
        ],
    );
    assert!(out.contains("ETCD_NAME=\"n5\""), "{out}");
    let learner = members(&remaining)
        .into_iter()
        .find(|(_, _, learner)| *learner)
        .expect("a learner listed");
    let promote = run(oncekv, &remaining, &["member", "promote", &learner.0]);
    assert!(!promote.status.success());
    assert!(
        String::from_utf8_lossy(&promote.stderr)
            .contains("can only promote a learner member which is in sync with leader"),
        "{}",
        String::from_utf8_lossy(&promote.stderr)
    );
    let out = ok(oncekv, &remaining, &["member", "remove", &learner.0]);
    assert!(out.contains("removed from cluster"), "{out}");
    assert_eq!(members(&remaining).len(), 3);
}

/// etcd's way to grow a one-member cluster: `member add` answers at once (the new member
/// has not started), writes then wait for the new member, and once it joins both serve.
/// The leader is killed between the add and the join, so the change it began is left
/// in its joint configuration, which the restarted leader finishes itself.
#[test]
fn a_one_member_cluster_grows_even_when_its_leader_restarts_mid_change() {
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<(u16, u16)> = (0..2).map(|_| (free_port(), free_port())).collect();
    let mut procs = start_founders(dir.path(), &ports, 1);
    let n1 = format!("127.0.0.1:{}", ports[0].0);
    eventually("etcdctl", &n1, &["put", "a", "1"], Duration::from_secs(20));

    let n2_peer = format!("http://127.0.0.1:{}", ports[1].1);
    let out = ok(
        "etcdctl",
        &n1,
        &["member", "add", "n2", &format!("--peer-urls={n2_peer}")],
    );
    assert!(out.contains(" added to cluster "), "{out}");
    let n2_cluster = env_value(&out, "ETCD_INITIAL_CLUSTER");
    // Two voters, one started: nothing commits, as in etcd.
    let refused = run("etcdctl", &n1, &["--command-timeout=1s", "put", "b", "2"]);
    assert!(!refused.status.success(), "a write committed without n2");

    procs.0[0].kill().unwrap();
    procs.0[0].wait().unwrap();
    let log = dir.path().join("n1.log");
    procs.0[0] = serve_member(
        dir.path(),
        "n1",
        ports[0],
        &format!("n1=http://127.0.0.1:{}", ports[0].1),
        false,
        std::fs::File::create(&log).unwrap().into(),
    );
    procs.0.push(serve_member(
        dir.path(),
        "n2",
        ports[1],
        &n2_cluster,
        true,
        Stdio::null(),
    ));
    let both = format!("{n1},127.0.0.1:{}", ports[1].0);
    eventually(
        "etcdctl",
        &both,
        &["put", "c", "3"],
        Duration::from_secs(30),
    );
    let n2 = format!("127.0.0.1:{}", ports[1].0);
    let got = eventually(
        "etcdctl",
        &n2,
        &["get", "a", "--print-value-only"],
        Duration::from_secs(20),
    );
    assert_eq!(got.trim(), "1");
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(&log).unwrap();
        if text.contains("finishing a joint membership change left behind") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the restarted leader never finished the change:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Listed by name once n2 has published its own.
    let start = Instant::now();
    loop {
        let names: Vec<String> = members(&both).into_iter().map(|(_, n, _)| n).collect();
        if names == ["n1", "n2"] {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{names:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}
