//! etcd's own CLI, etcdctl 3.4, against `oncekv dev`: every command an etcd user reaches
//! for first must work unchanged.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Held by each test while its cluster runs: `oncekv dev` prefers etcd's fixed ports, so
/// two starting at once could both find a port free and one then fail to bind it.
static ONE_CLUSTER_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `oncekv dev` running as a child process; killed on drop.
struct DevCluster {
    child: Child,
    endpoints: Vec<String>,
    /// Kept open so the cluster's later output has somewhere to go.
    _stdout: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl DevCluster {
    fn start(data_dir: &std::path::Path) -> DevCluster {
        let mut child = Command::new(env!("CARGO_BIN_EXE_oncekv"))
            .args(["dev", "--data-dir"])
            .arg(data_dir)
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut endpoints = Vec::new();
        let mut ready = false;
        for line in stdout.by_ref() {
            let line = line.unwrap();
            if line.contains("cluster ready") {
                ready = true;
            }
            // "  n1: clients http://127.0.0.1:2379  peers http://127.0.0.1:2380"
            if let Some(rest) = line.trim().split_once("clients http://") {
                endpoints.push(rest.1.split_whitespace().next().unwrap().to_string());
            }
            if line.contains("ctrl-c stops") {
                break;
            }
        }
        assert!(
            ready && endpoints.len() == 3,
            "oncekv dev did not come up: {endpoints:?}"
        );
        DevCluster {
            child,
            endpoints,
            _stdout: stdout,
        }
    }

    fn etcdctl(&self, args: &[&str]) -> String {
        self.etcdctl_stdin(args, "")
    }

    fn etcdctl_stdin(&self, args: &[&str], stdin: &str) -> String {
        self.etcdctl_full(args, stdin).0
    }

    /// stdout and stderr of a successful etcdctl run.
    fn etcdctl_full(&self, args: &[&str], stdin: &str) -> (String, String) {
        let mut child = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoints.join(",")))
            .arg("--command-timeout=10s")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("etcdctl is not installed: run .ci/install-deps");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "etcdctl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    }

    /// ctrl-C, as a user would stop it; returns whether it exited successfully.
    fn interrupt(mut self) -> bool {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-INT", &pid]).status().unwrap();
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.success();
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "oncekv dev ignored ctrl-c"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

#[test]
fn etcdctl_works_against_oncekv_dev_and_data_survives_a_restart() {
    let _one = ONE_CLUSTER_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let c = DevCluster::start(dir.path());

    // put / get / prefix / from-key / json
    assert_eq!(c.etcdctl(&["put", "greeting", "hello"]).trim(), "OK");
    assert_eq!(c.etcdctl(&["put", "group/a", "1"]).trim(), "OK");
    assert_eq!(c.etcdctl(&["put", "group/b", "2"]).trim(), "OK");
    assert_eq!(c.etcdctl(&["get", "greeting"]), "greeting\nhello\n");
    assert_eq!(
        c.etcdctl(&["get", "group/", "--prefix"]),
        "group/a\n1\ngroup/b\n2\n"
    );
    assert_eq!(
        c.etcdctl(&["get", "group/b", "--from-key", "--keys-only"])
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["group/b"]
    );
    let got = json(&c.etcdctl(&["get", "greeting", "-w", "json"]));
    assert_eq!(got["count"], 1);
    assert_eq!(got["kvs"][0]["version"], 1);
    assert_eq!(got["kvs"][0]["value"], "aGVsbG8="); // base64("hello")
    let revision = got["header"]["revision"].as_i64().unwrap();
    assert!(
        revision >= 4,
        "three puts on a fresh store reach revision 4, got {revision}"
    );

    // del
    assert_eq!(c.etcdctl(&["del", "group/", "--prefix"]).trim(), "2");
    assert_eq!(c.etcdctl(&["get", "group/", "--prefix"]), "");

    // txn from stdin: compare, success and failure branches
    let out = c.etcdctl_stdin(
        &["txn"],
        "value(\"greeting\") = \"hello\"\n\nput outcome yes\n\nput outcome no\n\n",
    );
    assert!(out.starts_with("SUCCESS"), "{out}");
    assert_eq!(
        c.etcdctl(&["get", "outcome", "--print-value-only"]).trim(),
        "yes"
    );
    let out = c.etcdctl_stdin(
        &["txn"],
        "value(\"greeting\") = \"bye\"\n\nput outcome yes\n\nput outcome no\n\n",
    );
    assert!(out.starts_with("FAILURE"), "{out}");
    assert_eq!(
        c.etcdctl(&["get", "outcome", "--print-value-only"]).trim(),
        "no"
    );

    // leases
    let out = c.etcdctl(&["lease", "grant", "60"]);
    let id = out.split_whitespace().nth(1).unwrap().to_string(); // "lease <id> granted with TTL(60s)"
    assert!(out.contains("granted with TTL(60s)"), "{out}");
    assert_eq!(
        c.etcdctl(&["put", "leased", "v", "--lease", &id]).trim(),
        "OK"
    );
    let out = c.etcdctl(&["lease", "timetolive", &id, "--keys"]);
    assert!(
        out.contains("granted with TTL(60s)") && out.contains("attached keys([leased])"),
        "{out}"
    );
    let out = c.etcdctl(&["lease", "list"]);
    assert!(out.contains("found 1 leases") && out.contains(&id), "{out}");
    let out = c.etcdctl(&["lease", "keep-alive", "--once", &id]);
    assert!(out.contains("keepalived with TTL(60)"), "{out}");
    let out = c.etcdctl(&["lease", "revoke", &id]);
    assert!(out.contains("revoked"), "{out}");
    assert_eq!(
        c.etcdctl(&["get", "leased"]),
        "",
        "revoking a lease deletes its keys"
    );
    let out = c.etcdctl(&["lease", "timetolive", &id]);
    assert!(out.contains("already expired"), "{out}");

    // cluster views
    let out = c.etcdctl(&["member", "list"]);
    assert_eq!(out.lines().count(), 3, "{out}");
    for e in &c.endpoints {
        assert!(out.contains(e), "member list lacks {e}: {out}");
    }
    let status = json(&c.etcdctl(&["endpoint", "status", "-w", "json"]));
    let statuses = status.as_array().unwrap();
    assert_eq!(statuses.len(), 3);
    let leaders: Vec<_> = statuses
        .iter()
        .map(|s| s["Status"]["leader"].clone())
        .collect();
    assert!(
        leaders
            .iter()
            .all(|l| l == &leaders[0] && l.as_u64().unwrap_or(0) != 0),
        "{leaders:?}"
    );
    // etcdctl 3.4 prints health results on stderr.
    let (_, out) = c.etcdctl_full(&["endpoint", "health"], "");
    assert_eq!(out.matches("is healthy").count(), 3, "{out}");
    // --cluster dials every member's client URL from the member list, sending the URL
    // (scheme included) as the HTTP/2 authority.
    let status = json(&c.etcdctl(&["endpoint", "status", "--cluster", "-w", "json"]));
    let mut dialed: Vec<String> = status
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["Endpoint"].as_str().unwrap().to_string())
        .collect();
    dialed.sort();
    let mut want: Vec<String> = c.endpoints.iter().map(|e| format!("http://{e}")).collect();
    want.sort();
    assert_eq!(dialed, want, "{status}");
    let (_, out) = c.etcdctl_full(&["endpoint", "health", "--cluster"], "");
    assert_eq!(out.matches("is healthy").count(), 3, "{out}");

    // ctrl-C stops cleanly; the same --data-dir reopens the same data.
    let before = json(&c.etcdctl(&["get", "greeting", "-w", "json"]))["header"]["revision"]
        .as_i64()
        .unwrap();
    assert!(c.interrupt(), "oncekv dev did not exit cleanly on ctrl-c");
    let c = DevCluster::start(dir.path());
    assert_eq!(
        c.etcdctl(&["get", "greeting", "--print-value-only"]).trim(),
        "hello"
    );
    let after = json(&c.etcdctl(&["put", "again", "x", "-w", "json"]))["header"]["revision"]
        .as_i64()
        .unwrap();
    assert_eq!(after, before + 1, "revisions continue after a restart");
}

/// etcdctl against one endpoint; returns (success, stdout, stderr) without judging.
fn etcdctl_at(endpoint: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .arg("--command-timeout=10s")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("etcdctl is not installed: run .ci/install-deps");
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// A long-running etcdctl (`watch`, `lock`, `elect`), whose stdout lines arrive on a
/// channel; killed on drop.
struct LongEtcdctl {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl LongEtcdctl {
    fn spawn(endpoint: &str, args: &[&str]) -> LongEtcdctl {
        let mut child = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoint}"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcdctl is not installed: run .ci/install-deps");
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        LongEtcdctl { child, lines }
    }

    /// The next `n` lines it prints.
    fn lines(&self, n: usize) -> Vec<String> {
        (0..n)
            .map(|i| {
                self.lines
                    .recv_timeout(Duration::from_secs(10))
                    .unwrap_or_else(|e| panic!("etcdctl printed {i} of {n} lines: {e}"))
            })
            .collect()
    }

    /// True if it prints nothing for `quiet` (a negative that can only pass wrongly, never
    /// fail wrongly, on a slow machine).
    fn silent_for(&self, quiet: Duration) -> bool {
        self.lines.recv_timeout(quiet).is_err()
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.id().to_string();
        Command::new("kill").args([signal, &pid]).status().unwrap();
    }

    /// Waits for it to exit; its success.
    fn wait(mut self) -> bool {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.success();
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "etcdctl did not exit"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for LongEtcdctl {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// etcd's data model through etcd's own CLI: reads at past revisions, a watch on a
// follower seeing writes made through the other members, a replay of history with
// previous values, compaction with etcd's two refusals, and a watch from a compacted
// revision cancelled with etcd's message. Outputs are compared with etcd 3.4's.
#[test]
fn etcdctl_watch_get_rev_and_compaction_behave_as_with_etcd() {
    let _one = ONE_CLUSTER_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let c = DevCluster::start(dir.path());
    let status = json(&c.etcdctl(&["endpoint", "status", "-w", "json"]));
    let statuses = status.as_array().unwrap();
    let is_leader =
        |s: &serde_json::Value| s["Status"]["leader"] == s["Status"]["header"]["member_id"];
    let endpoint = |s: &serde_json::Value| s["Endpoint"].as_str().unwrap().to_string();
    let follower = endpoint(statuses.iter().find(|s| !is_leader(s)).unwrap());
    let others: Vec<String> = statuses
        .iter()
        .map(endpoint)
        .filter(|e| *e != follower)
        .collect();
    let put_at = |e: &str, k: &str, v: &str| {
        let (ok, out, err) = etcdctl_at(e, &["put", k, v, "-w", "json"]);
        assert!(ok, "{out}{err}");
        json(&out)["header"]["revision"].as_i64().unwrap()
    };

    let r1 = put_at(&others[0], "w/a", "1");
    let r2 = put_at(&others[1], "w/a", "2");
    put_at(&others[0], "w/b", "1");
    assert_eq!(c.etcdctl(&["del", "w/a"]).trim(), "1");

    // get --rev: the keyspace as it was.
    assert_eq!(
        c.etcdctl(&["get", "w/a", &format!("--rev={r1}")]),
        "w/a\n1\n"
    );
    assert_eq!(
        c.etcdctl(&["get", "w/", "--prefix", &format!("--rev={r2}")]),
        "w/a\n2\n"
    );
    assert_eq!(c.etcdctl(&["get", "w/a"]), "");

    // A live watch on a follower (from the next revision, so no write can slip in
    // before it is set up), written to through the two other members.
    let now = json(&c.etcdctl(&["get", "w/", "-w", "json"]))["header"]["revision"]
        .as_i64()
        .unwrap();
    let live = LongEtcdctl::spawn(
        &follower,
        &["watch", "w/", "--prefix", &format!("--rev={}", now + 1)],
    );
    put_at(&others[0], "w/live", "x");
    put_at(&others[1], "w/live", "y");
    assert_eq!(live.lines(6), ["PUT", "w/live", "x", "PUT", "w/live", "y"]);
    let (ok, _, err) = etcdctl_at(&others[1], &["del", "w/live"]);
    assert!(ok, "{err}");
    assert_eq!(live.lines(2), ["DELETE", "w/live"]);
    assert_eq!(live.lines(1), [""], "a delete prints an empty value");
    drop(live);

    // Replay from an old revision with previous values, in etcdctl's format: the event
    // type, the previous key-value if any, then the key-value.
    let replay = LongEtcdctl::spawn(
        &follower,
        &[
            "watch",
            "w/",
            "--prefix",
            "--prev-kv",
            &format!("--rev={r1}"),
        ],
    );
    let want = [
        "PUT", "w/a", "1", //
        "PUT", "w/a", "1", "w/a", "2", //
        "PUT", "w/b", "1", //
        "DELETE", "w/a", "2", "w/a", "", //
        "PUT", "w/live", "x", //
        "PUT", "w/live", "x", "w/live", "y", //
        "DELETE", "w/live", "y", "w/live", "",
    ];
    assert_eq!(replay.lines(want.len()), want);
    drop(replay);

    // Compaction, and etcd's two refusals (messages as etcd 3.4 prints them).
    let (ok, out, err) = etcdctl_at(&follower, &["compaction", &r2.to_string()]);
    assert!(ok, "{err}");
    assert_eq!(out, format!("compacted revision {r2}\n"));
    let (ok, _, err) = etcdctl_at(&follower, &["compaction", &r2.to_string()]);
    assert!(!ok);
    assert!(
        err.ends_with("Error: etcdserver: mvcc: required revision has been compacted\n"),
        "{err}"
    );
    let (ok, _, err) = etcdctl_at(&follower, &["compaction", "1000000"]);
    assert!(!ok);
    assert!(
        err.ends_with("Error: etcdserver: mvcc: required revision is a future revision\n"),
        "{err}"
    );
    let (ok, _, err) = etcdctl_at(&follower, &["get", "w/a", &format!("--rev={r1}")]);
    assert!(!ok);
    assert!(
        err.ends_with("Error: etcdserver: mvcc: required revision has been compacted\n"),
        "{err}"
    );
    assert_eq!(
        c.etcdctl(&["get", "w/a", &format!("--rev={r2}")]),
        "w/a\n2\n"
    );

    // A watch from a compacted revision is cancelled by the server; etcdctl says why and
    // exits.
    let (ok, out, err) = etcdctl_at(&follower, &["watch", "w/a", &format!("--rev={r1}")]);
    assert!(!ok);
    assert_eq!(out, "");
    assert_eq!(
        err,
        "watch was canceled (etcdserver: mvcc: required revision has been compacted)\n\
         Error: watch is canceled by the server\n"
    );
}

// etcd's concurrency recipes through etcd's own CLI (clientv3/concurrency over KV, Lease and
// Watch): `etcdctl lock` holders never overlap, a waiter gets the lock when the holder's
// lease expires, and `etcdctl elect` hands leadership over only when the leader resigns or
// loses its lease.
#[test]
fn etcdctl_lock_and_elect_exclude_and_hand_over() {
    let _one = ONE_CLUSTER_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let c = DevCluster::start(dir.path());
    let log = dir.path().join("critical.log");

    // Three lockers at once, each through another member, each logging its critical
    // section: the log must read begin/end pairs of one key at a time.
    let section = format!(
        "echo \"begin $ETCD_LOCK_KEY\" >> {0}; sleep 0.3; echo \"end $ETCD_LOCK_KEY\" >> {0}",
        log.display()
    );
    let lockers: Vec<Child> = c
        .endpoints
        .iter()
        .map(|e| {
            Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .arg(format!("--endpoints={e}"))
                .args(["lock", "--ttl=5", "jobs", "--", "sh", "-c", &section])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("etcdctl is not installed: run .ci/install-deps")
        })
        .collect();
    for l in lockers {
        let out = l.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "etcdctl lock failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let lines: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(lines.len(), 6, "{lines:?}");
    let mut keys = std::collections::BTreeSet::new();
    for pair in lines.chunks(2) {
        let key = pair[0]
            .strip_prefix("begin ")
            .unwrap_or_else(|| panic!("{lines:?}"));
        assert!(key.starts_with("jobs/"), "{lines:?}");
        assert_eq!(pair[1], format!("end {key}"), "sections overlap: {lines:?}");
        keys.insert(key.to_string());
    }
    assert_eq!(keys.len(), 3, "each locker its own key: {lines:?}");

    // A holder killed without unlocking: the waiter gets the lock once the holder's
    // 3-second lease expires, not before.
    let holder = LongEtcdctl::spawn(&c.endpoints[0], &["lock", "--ttl=3", "held"]);
    let held_key = holder.lines(1).remove(0);
    assert!(held_key.starts_with("held/"), "{held_key}");
    let waiter = LongEtcdctl::spawn(&c.endpoints[1], &["lock", "--ttl=3", "held"]);
    assert!(
        waiter.silent_for(Duration::from_secs(1)),
        "the waiter got a held lock"
    );
    holder.signal("-KILL");
    let waiter_key = waiter.lines(1).remove(0);
    assert!(
        waiter_key.starts_with("held/") && waiter_key != held_key,
        "{waiter_key}"
    );
    waiter.signal("-INT");
    assert!(waiter.wait(), "etcdctl lock exits 0 after ctrl-c");
    assert_eq!(
        c.etcdctl(&["get", "held/", "--prefix", "--keys-only"])
            .trim(),
        ""
    );

    // Elections: the second campaigner waits while the first leads; an observer sees the
    // leader's proposal; ctrl-c makes the first resign and the second lead.
    let first = LongEtcdctl::spawn(&c.endpoints[0], &["elect", "pick", "p1"]);
    let first_lines = first.lines(2);
    assert!(first_lines[0].starts_with("pick/"), "{first_lines:?}");
    assert_eq!(first_lines[1], "p1");
    let second = LongEtcdctl::spawn(&c.endpoints[1], &["elect", "pick", "p2"]);
    let observer = LongEtcdctl::spawn(&c.endpoints[2], &["elect", "-l", "pick"]);
    assert_eq!(observer.lines(2), first_lines);
    assert!(
        second.silent_for(Duration::from_secs(1)),
        "two leaders at once"
    );
    first.signal("-INT");
    assert!(
        first.wait(),
        "etcdctl elect exits 0 after ctrl-c (resigned)"
    );
    let second_lines = second.lines(2);
    assert!(second_lines[0].starts_with("pick/"), "{second_lines:?}");
    assert_eq!(second_lines[1], "p2");
    assert_eq!(observer.lines(2), second_lines);

    // The leader loses its lease (revoked, as when it expires): a third campaigner leads.
    let third = LongEtcdctl::spawn(&c.endpoints[2], &["elect", "pick", "p3"]);
    assert!(
        third.silent_for(Duration::from_secs(1)),
        "two leaders at once"
    );
    let lease = second_lines[0].trim_start_matches("pick/").to_string();
    let id = i64::from_str_radix(&lease, 16).unwrap();
    assert_eq!(
        c.etcdctl(&["lease", "revoke", &lease]).trim(),
        format!("lease {id:016x} revoked")
    );
    assert_eq!(third.lines(2)[1], "p3");
    assert!(
        !second.wait(),
        "a leader whose lease is gone exits with an error"
    );
}
