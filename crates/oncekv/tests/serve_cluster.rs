//! Three `oncekv serve` processes, as an operator runs them: every member's member list
//! names every member's client URLs (etcd clients discover endpoints from it, and
//! `etcdctl --cluster` dials them).
#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Members, free_port, serve_member};

use serde_json::Value;

/// The tests here run one at a time: each picks free ports and releases them before its
/// members bind them, so two running at once can be handed the same port (CI saw a member
/// of one test never serve).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `oncekv member list -w json` against `endpoint`, if it answers.
fn member_list(endpoint: &str) -> Option<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_oncekv"))
        .args(["--endpoints", endpoint, "member", "list", "-w", "json"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// Every member's client URLs in `list`, by name.
fn client_urls(list: &Value) -> Vec<(String, Vec<String>)> {
    let mut urls: Vec<(String, Vec<String>)> = list["members"]
        .as_array()
        .map(|members| {
            members
                .iter()
                .map(|m| {
                    let name = m["name"].as_str().unwrap_or_default().to_string();
                    let urls = m["clientURLs"]
                        .as_array()
                        .map(|u| {
                            u.iter()
                                .filter_map(|x| x.as_str().map(str::to_string))
                                .collect()
                        })
                        .unwrap_or_default();
                    (name, urls)
                })
                .collect()
        })
        .unwrap_or_default();
    urls.sort();
    urls
}

/// Three `oncekv serve` members `n1..n3` of a new cluster under `dir` on free ports
/// (client, peer), each with its stderr made by `stderr`.
fn start_three(dir: &std::path::Path, stderr: impl Fn() -> Stdio) -> (Members, Vec<(u16, u16)>) {
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let initial_cluster = ports
        .iter()
        .enumerate()
        .map(|(i, (_, peer))| format!("n{}=http://127.0.0.1:{peer}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let members = ports
        .iter()
        .enumerate()
        .map(|(i, ports)| {
            let name = format!("n{}", i + 1);
            serve_member(dir, &name, *ports, &initial_cluster, false, stderr())
        })
        .collect();
    (Members(members), ports)
}

#[test]
fn every_member_lists_every_members_client_urls() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (_members, ports) = start_three(dir.path(), Stdio::null);
    let want: Vec<(String, Vec<String>)> = ports
        .iter()
        .enumerate()
        .map(|(i, (client, _))| {
            (
                format!("n{}", i + 1),
                vec![format!("http://127.0.0.1:{client}")],
            )
        })
        .collect();
    for (client, _) in &ports {
        let endpoint = format!("127.0.0.1:{client}");
        let started = Instant::now();
        let mut last = None;
        loop {
            if let Some(list) = member_list(&endpoint) {
                let got = client_urls(&list);
                if got == want {
                    break;
                }
                last = Some(got);
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{endpoint}'s member list never showed every client URL: {last:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// An etcd member's usual command line: several client URLs (one by `localhost`), each
/// advertised, the peer URL advertised too. Every listener serves, and the member list
/// names every advertised client URL.
#[test]
fn a_member_serves_every_listen_client_url_and_lists_every_advertised_one() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (a, b, peer) = (free_port(), free_port(), free_port());
    let urls = format!("http://127.0.0.1:{a},http://localhost:{b}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let _member = Members(vec![
        Command::new(env!("CARGO_BIN_EXE_oncekv"))
            .args(["serve", "--name", "n1", "--data-dir"])
            .arg(dir.path().join("n1"))
            .args(["--listen-client-urls", &urls])
            .args(["--advertise-client-urls", &urls])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("n1={peer_url}")])
            .args(["--initial-cluster-token", "serve-cluster-test"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    ]);
    common::wait_serving(&format!("127.0.0.1:{a}"));
    common::wait_serving(&format!("127.0.0.1:{b}"));
    let want = vec![(
        "n1".to_string(),
        vec![
            format!("http://127.0.0.1:{a}"),
            format!("http://localhost:{b}"),
        ],
    )];
    let started = Instant::now();
    loop {
        let got = member_list(&format!("127.0.0.1:{b}")).map(|l| client_urls(&l));
        if got.as_ref() == Some(&want) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "member list: {got:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// systemd, Kubernetes and `kill` stop a service with SIGTERM: the member stops as it does
/// on ctrl-c (its servers end their streams, raft shuts down) and exits 0, as etcd does,
/// rather than dying of the signal.
#[test]
fn sigterm_stops_a_member_gracefully() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (client, peer) = (free_port(), free_port());
    let mut member = serve_member(
        dir.path(),
        "n1",
        (client, peer),
        &format!("n1=http://127.0.0.1:{peer}"),
        false,
        Stdio::piped(),
    );
    common::wait_serving(&format!("127.0.0.1:{client}"));
    let status = common::signal_and_wait(&mut member, "-TERM");
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut member.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{status:?}: {stderr}");
    assert!(stderr.contains("oncekv: stopping"), "{stderr}");
}

/// The members of `endpoints` that answer `oncekv endpoint status` naming themselves as
/// the leader.
fn leading(endpoints: &[String]) -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_oncekv"))
        .args(["endpoint", "status", "-w", "json", "--endpoints"])
        .arg(endpoints.join(","))
        .output()
        .unwrap();
    let statuses: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    statuses
        .as_array()
        .map(|all| {
            all.iter()
                .filter(|s| {
                    let st = &s["Status"];
                    st["leader"].as_u64().is_some() && st["leader"] == st["header"]["member_id"]
                })
                .filter_map(|s| s["Endpoint"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// SIGTERM to the leader of three `oncekv serve` members (a rolling restart's step): it
/// hands leadership to another member before it exits, as etcd does, so that the others
/// lead at once; without the hand-over they would wait at least an election timeout
/// (1 s here) before even starting an election.
#[test]
fn sigterm_to_the_leader_hands_leadership_over_first() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (mut members, ports) = start_three(dir.path(), Stdio::piped);
    let endpoints: Vec<String> = ports
        .iter()
        .map(|(client, _)| format!("127.0.0.1:{client}"))
        .collect();
    let started = Instant::now();
    let leader = loop {
        if let [one] = leading(&endpoints).as_slice() {
            break endpoints.iter().position(|e| e == one).unwrap();
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no leader");
        std::thread::sleep(Duration::from_millis(100));
    };

    let status = common::signal_and_wait(&mut members.0[leader], "-TERM");
    let others: Vec<String> = (0..3)
        .filter(|i| *i != leader)
        .map(|i| endpoints[i].clone())
        .collect();
    let now_leading = leading(&others);
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut members.0[leader].stderr.take().unwrap(), &mut stderr)
        .unwrap();
    assert!(status.success(), "{status:?}: {stderr}");
    assert!(
        stderr.contains("leadership transferred to"),
        "the leader logged no hand-over: {stderr}"
    );
    assert_eq!(
        now_leading.len(),
        1,
        "right after the old leader exited, one of the others leads"
    );
}
