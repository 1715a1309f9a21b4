//! The `oncekv` client commands against `oncekv dev`, over real sockets: every command
//! prints what etcdctl 3.4 prints for the same request against the same cluster, and every
//! write goes through a session that the command closes before it exits.
//!
//! One test function on one cluster, run serially: `oncekv dev` prefers fixed ports.
//! Where etcdctl is installed (CI installs it), outputs are compared with its own; both
//! talk to the leader's endpoint only, so the member ids in response headers agree.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// `oncekv dev` running as a child process; killed on drop.
struct DevCluster {
    child: Child,
    endpoints: Vec<String>,
    _stdout: std::io::Lines<BufReader<ChildStdout>>,
}

impl DevCluster {
    fn start(data_dir: &std::path::Path) -> DevCluster {
        let mut child = Command::new(env!("CARGO_BIN_EXE_oncekv"))
            .args(["dev", "--data-dir"])
            .arg(data_dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut endpoints = Vec::new();
        for line in stdout.by_ref() {
            let line = line.unwrap();
            // "  n1: clients http://127.0.0.1:2379  peers http://127.0.0.1:2380"
            if let Some((_, rest)) = line.trim().split_once("clients http://") {
                endpoints.push(rest.split_whitespace().next().unwrap().to_string());
            }
            if line.contains("ctrl-c stops") {
                break;
            }
        }
        assert_eq!(endpoints.len(), 3, "oncekv dev did not come up");
        DevCluster {
            child,
            endpoints,
            _stdout: stdout,
        }
    }
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a command printed and how it exited.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Run {
    out: String,
    err: String,
    code: i32,
}

fn run(mut cmd: Command, stdin: &str) -> Run {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    Run {
        out: String::from_utf8(out.stdout).unwrap(),
        err: String::from_utf8(out.stderr).unwrap(),
        code: out.status.code().unwrap_or(-1),
    }
}

fn json(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

/// The JSON with every number zeroed: the same fields and strings, whatever the revisions.
fn shape(v: &Value) -> Value {
    match v {
        Value::Number(_) => Value::from(0),
        Value::Array(a) => Value::Array(a.iter().map(shape).collect()),
        Value::Object(o) => Value::Object(o.iter().map(|(k, v)| (k.clone(), shape(v))).collect()),
        other => other.clone(),
    }
}

/// Every run of digits replaced by `#`.
fn mask_numbers(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_digit() {
            if !out.ends_with('#') {
                out.push('#');
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The oncekv CLI and etcdctl, both pointed at one endpoint of the cluster.
struct Clis {
    endpoint: String,
    etcdctl: bool,
}

impl Clis {
    fn oncekv_cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_oncekv"));
        cmd.arg(format!("--endpoints={}", self.endpoint))
            .args(args)
            .env_remove("ONCEKV_ENDPOINTS")
            .env_remove("ONCEKV_LOG");
        cmd
    }

    fn oncekv_in(&self, args: &[&str], stdin: &str) -> Run {
        run(self.oncekv_cmd(args), stdin)
    }

    /// A successful oncekv run's stdout.
    fn oncekv(&self, args: &[&str]) -> String {
        let r = self.oncekv_in(args, "");
        assert_eq!(r.code, 0, "oncekv {args:?} failed: {r:?}");
        r.out
    }

    fn etcdctl_in(&self, args: &[&str], stdin: &str) -> Run {
        let mut cmd = Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint))
            .arg("--command-timeout=10s")
            .args(args);
        run(cmd, stdin)
    }

    /// Runs both; their stdout and exit status (0 or not) must agree. Returns oncekv's run.
    fn same_in(&self, args: &[&str], stdin: &str) -> Run {
        let ours = self.oncekv_in(args, stdin);
        if self.etcdctl {
            let theirs = self.etcdctl_in(args, stdin);
            assert_eq!(
                ours.out, theirs.out,
                "stdout of {args:?} differs from etcdctl's"
            );
            assert_eq!(
                ours.code == 0,
                theirs.code == 0,
                "{args:?}: oncekv {ours:?}, etcdctl {theirs:?}"
            );
        }
        ours
    }

    fn same(&self, args: &[&str]) -> String {
        let r = self.same_in(args, "");
        assert_eq!(r.code, 0, "oncekv {args:?} failed: {r:?}");
        r.out
    }

    /// For writes: runs oncekv, then etcdctl with the same input (so each sees the other's
    /// effects); `normalize` must make their outputs equal.
    fn alike_in(&self, args: &[&str], stdin: &str, normalize: fn(&str) -> String) -> String {
        let ours = self.oncekv_in(args, stdin);
        assert_eq!(ours.code, 0, "oncekv {args:?} failed: {ours:?}");
        if self.etcdctl {
            let theirs = self.etcdctl_in(args, stdin);
            assert_eq!(theirs.code, 0, "etcdctl {args:?} failed: {theirs:?}");
            assert_eq!(
                normalize(&ours.out),
                normalize(&theirs.out),
                "{args:?}: oncekv printed {:?}, etcdctl {:?}",
                ours.out,
                theirs.out
            );
        }
        ours.out
    }

    fn leader_raft_index(&self) -> u64 {
        let s = json(&self.oncekv(&["endpoint", "status", "-w", "json"]));
        s[0]["Status"]["raftIndex"].as_u64().unwrap()
    }

    /// The leader's raft index once nothing is being written (a fresh cluster may still
    /// be settling).
    fn quiet_raft_index(&self) -> u64 {
        let mut last = self.leader_raft_index();
        loop {
            std::thread::sleep(Duration::from_millis(300));
            let now = self.leader_raft_index();
            if now == last {
                return now;
            }
            last = now;
        }
    }
}

fn json_shape(s: &str) -> String {
    shape(&json(s)).to_string()
}

fn same_text(s: &str) -> String {
    s.to_string()
}

/// The endpoint of the member that leads (it answers with itself as the leader).
fn leader_endpoint(endpoints: &[String]) -> String {
    let start = Instant::now();
    loop {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_oncekv"));
        cmd.args(["endpoint", "status", "-w", "json", "--endpoints"])
            .arg(endpoints.join(","));
        let r = run(cmd, "");
        if r.code == 0 {
            let statuses = json(&r.out);
            for s in statuses.as_array().unwrap() {
                let st = &s["Status"];
                if st["leader"].as_u64().is_some() && st["leader"] == st["header"]["member_id"] {
                    return s["Endpoint"].as_str().unwrap().to_string();
                }
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no leader: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn lease_id(grant_output: &str) -> String {
    // "lease 0000000000000002 granted with TTL(60s)"
    let id = grant_output.split_whitespace().nth(1).unwrap().to_string();
    assert_eq!(id.len(), 16, "{grant_output}");
    id
}

#[test]
fn client_commands_print_what_etcdctl_prints_and_write_through_closed_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(dir.path());
    let etcdctl = Command::new("etcdctl")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !etcdctl {
        eprintln!("etcdctl is not installed (.ci/install-deps): checking oncekv's output alone");
    }
    let c = Clis {
        endpoint: leader_endpoint(&cluster.endpoints),
        etcdctl,
    };

    // Writes through sessions: each one-shot put registers a session, puts, and closes it —
    // three log entries, so nothing is left to linger until the session TTL — and N puts
    // leave version == N.
    let before = c.quiet_raft_index();
    for i in 1..=3 {
        assert_eq!(c.oncekv(&["put", "counter", &i.to_string()]), "OK\n");
    }
    assert_eq!(
        c.leader_raft_index() - before,
        9,
        "each put: register, put, close"
    );
    let got = json(&c.oncekv(&["get", "counter", "-w", "json"]));
    assert_eq!(got["kvs"][0]["version"], 3, "{got}");
    let before = c.leader_raft_index();
    c.oncekv(&["get", "counter"]);
    assert_eq!(c.leader_raft_index(), before, "a read registers no session");

    // put: OK, prev kv lines, stdin values, JSON.
    assert_eq!(
        c.alike_in(&["put", "greeting", "hello"], "", same_text),
        "OK\n"
    );
    assert_eq!(
        c.alike_in(&["put", "greeting", "hello", "--prev-kv"], "", same_text),
        "OK\ngreeting\nhello\n"
    );
    c.alike_in(&["put", "greeting", "hello", "-w", "json"], "", json_shape);
    let out = c.alike_in(
        &["put", "greeting", "hello", "--prev-kv", "-w", "json"],
        "",
        json_shape,
    );
    assert_eq!(json(&out)["prev_kv"]["value"], "aGVsbG8=", "{out}");
    c.alike_in(&["put", "from-stdin"], "line one\nline two\n", same_text);
    assert_eq!(
        c.same(&["get", "from-stdin", "--print-value-only"]),
        "line one\nline two\n\n",
        "the value is stdin byte for byte"
    );
    c.alike_in(&["put", "greeting", "--ignore-value"], "", same_text);
    for (k, v) in [("group/a", "1"), ("group/b", "2"), ("group/c", "3")] {
        c.alike_in(&["put", k, v], "", same_text);
    }

    // get: every selection and format, identical to etcdctl's.
    assert_eq!(c.same(&["get", "greeting"]), "greeting\nhello\n");
    assert_eq!(
        c.same(&["get", "group/", "--prefix"]),
        "group/a\n1\ngroup/b\n2\ngroup/c\n3\n"
    );
    for args in [
        &["get", "group/a", "group/c"][..],
        &["get", "group/b", "--from-key", "--keys-only"],
        &["get", "group/", "--prefix", "--print-value-only"],
        &["get", "group/", "--prefix", "--limit", "2", "-w", "json"],
        &[
            "get",
            "group/",
            "--prefix",
            "--sort-by=VALUE",
            "--order=DESCEND",
        ],
        &["get", "group/", "--prefix", "--order=descend", "-w", "json"],
        &["get", "group/", "--prefix", "--consistency=s"],
        &["get", "", "--prefix", "--keys-only"],
        &["get", "greeting", "-w", "json"],
        &["get", "greeting", "--hex"],
        &["get", "missing"],
        &["get", "missing", "-w", "json"],
    ] {
        c.same(args);
    }
    let got = json(&c.same(&["get", "greeting", "-w", "json"]));
    assert_eq!(got["kvs"][0]["key"], "Z3JlZXRpbmc=", "{got}");
    assert_eq!(
        c.oncekv(&["get", "group/", "--prefix", "--count-only"]),
        "3\n"
    );

    // del: the count, then the deleted pairs.
    let recreate = |c: &Clis| {
        for (k, v) in [("group/a", "1"), ("group/b", "2")] {
            c.oncekv(&["put", k, v]);
        }
    };
    assert_eq!(c.same(&["del", "missing"]), "0\n");
    c.oncekv(&["del", "group/c"]);
    recreate(&c);
    let ours = c.oncekv(&["del", "group/", "--prefix", "--prev-kv"]);
    assert_eq!(ours, "2\ngroup/a\n1\ngroup/b\n2\n");
    if c.etcdctl {
        recreate(&c);
        let theirs = c.etcdctl_in(&["del", "group/", "--prefix", "--prev-kv"], "");
        assert_eq!(ours, theirs.out);
    }
    recreate(&c);
    let ours = c.oncekv(&["del", "group/a", "group/z", "-w", "json"]);
    if c.etcdctl {
        recreate(&c);
        let theirs = c.etcdctl_in(&["del", "group/a", "group/z", "-w", "json"], "");
        assert_eq!(json_shape(&ours), json_shape(&theirs.out));
    }

    // txn: etcdctl's stdin format; SUCCESS/FAILURE and each op's output.
    let txn = "value(\"greeting\") = \"hello\"\nversion(\"counter\") > \"0\"\n\n\
               put outcome yes\nget greeting\ndel nothing\n\nput outcome no\n\n";
    let out = c.alike_in(&["txn"], txn, same_text);
    assert_eq!(out, "SUCCESS\n\nOK\n\ngreeting\nhello\n\n0\n");
    let txn = "value(\"greeting\") = \"bye\"\n\nput outcome yes\n\nput outcome no\nget outcome\n\n";
    let out = c.alike_in(&["txn"], txn, same_text);
    assert_eq!(out, "FAILURE\n\nOK\n\noutcome\nno\n");
    c.alike_in(&["txn", "-w", "json"], txn, json_shape);
    c.alike_in(&["txn", "-i"], txn, same_text);
    let bad = c.oncekv_in(&["txn"], "valu(\"k\") = \"v\"\n\n\n\n");
    assert_eq!(bad.code, 1);
    assert!(
        bad.err.starts_with("Error: malformed comparison"),
        "{bad:?}"
    );

    // leases: hex IDs everywhere.
    let mask_id = |s: &str| -> String {
        s.split_whitespace()
            .enumerate()
            .map(|(i, w)| if i == 1 { "ID" } else { w })
            .collect::<Vec<_>>()
            .join(" ")
    };
    let out = c.oncekv(&["lease", "grant", "60"]);
    let id = lease_id(&out);
    assert_eq!(out, format!("lease {id} granted with TTL(60s)\n"));
    if c.etcdctl {
        let theirs = c.etcdctl_in(&["lease", "grant", "60"], "");
        assert_eq!(mask_id(&out), mask_id(&theirs.out));
    }
    c.alike_in(&["lease", "grant", "60", "-w", "json"], "", json_shape);
    c.oncekv(&["put", "leased/1", "a", "--lease", &id]);
    c.oncekv(&["put", "leased/2", "b", "--lease", &id]);
    let ttl = c.alike_in(&["lease", "timetolive", &id, "--keys"], "", mask_numbers);
    assert!(
        ttl.starts_with(&format!("lease {id} granted with TTL(60s), remaining("))
            && ttl.ends_with("s), attached keys([leased/1 leased/2])\n"),
        "{ttl}"
    );
    c.alike_in(&["lease", "timetolive", &id], "", mask_numbers);
    c.alike_in(
        &["lease", "timetolive", &id, "--keys", "-w", "json"],
        "",
        json_shape,
    );
    assert_eq!(
        c.same(&["lease", "keep-alive", "--once", &id]),
        format!("lease {id} keepalived with TTL(60)\n")
    );
    c.alike_in(
        &["lease", "keep-alive", "--once", &id, "-w", "json"],
        "",
        json_shape,
    );
    assert_eq!(
        c.oncekv(&["lease", "revoke", &id]),
        format!("lease {id} revoked\n")
    );
    assert_eq!(
        c.same(&["get", "leased/", "--prefix"]),
        "",
        "revoke deletes keys"
    );
    assert_eq!(
        c.same(&["lease", "timetolive", &id]),
        format!("lease {id} already expired\n")
    );
    c.same(&["lease", "timetolive", &id, "-w", "json"]);
    let ours = c.same_in(&["lease", "revoke", &id], "");
    assert_eq!(
        (ours.code, ours.err.as_str()),
        (
            1,
            "Error: failed to revoke lease (etcdserver: requested lease not found)\n"
        )
    );
    let ours = c.same_in(&["lease", "keep-alive", "--once", &id], "");
    assert_eq!(ours.err, "Error: etcdserver: requested lease not found\n");
    let revoke_json = |c: &Clis, etcdctl: bool| {
        let id = lease_id(&c.oncekv(&["lease", "grant", "60"]));
        let args = ["lease", "revoke", id.as_str(), "-w", "json"];
        if etcdctl {
            c.etcdctl_in(&args, "").out
        } else {
            c.oncekv(&args)
        }
    };
    let ours = revoke_json(&c, false);
    if c.etcdctl {
        assert_eq!(json_shape(&ours), json_shape(&revoke_json(&c, true)));
    }

    // lease keep-alive without --once: renews until ctrl-c, then exits cleanly.
    let id = lease_id(&c.oncekv(&["lease", "grant", "3"]));
    let mut keeper = c
        .oncekv_cmd(&["lease", "keep-alive", &id])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(keeper.stdout.take().unwrap()).lines();
    for _ in 0..2 {
        let line = lines.next().unwrap().unwrap();
        assert_eq!(line, format!("lease {id} keepalived with TTL(3)"));
    }
    let status = common::signal_and_wait(&mut keeper, "-INT");
    assert!(status.success(), "{status:?}");
    // ... and stops by itself when the lease is revoked.
    let mut keeper = c
        .oncekv_cmd(&["lease", "keep-alive", &id])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = keeper.stdout.take().unwrap();
    let mut first = [0u8; 8];
    stdout.read_exact(&mut first).unwrap();
    c.oncekv(&["lease", "revoke", &id]);
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    assert!(keeper.wait().unwrap().success());
    assert!(
        rest.ends_with(&format!("lease {id} expired or revoked.\n")),
        "{rest}"
    );

    // member list and endpoint status.
    let members = c.same(&["member", "list"]);
    assert_eq!(members.lines().count(), 3, "{members}");
    for e in &cluster.endpoints {
        assert!(members.contains(e), "member list lacks {e}: {members}");
    }
    c.same(&["member", "list", "-w", "json"]);
    c.same(&["member", "list", "-w", "table"]);
    c.alike_in(&["endpoint", "status"], "", mask_numbers);
    c.alike_in(&["endpoint", "status", "-w", "table"], "", mask_numbers);
    c.alike_in(&["endpoint", "status", "-w", "json"], "", json_shape);
    let all = c.oncekv(&[
        "endpoint",
        "status",
        "--endpoints",
        &cluster.endpoints.join(","),
    ]);
    assert_eq!(all.lines().count(), 3, "{all}");
    assert_eq!(
        all.matches(", true, false, ").count(),
        1,
        "one leader: {all}"
    );

    // Errors: `Error: <message>` on stderr, a non-zero exit.
    let r = c.same_in(&["get", "greeting", "--rev", "1000000"], "");
    assert_eq!(r.code, 1);
    assert!(r.err.starts_with("Error: etcdserver: mvcc:"), "{r:?}");
    let r = c.oncekv_in(&["get", "greeting", "-w", "table"], "");
    assert_eq!(
        (r.code, r.err.as_str()),
        (1, "Error: table not supported as output format\n")
    );
    let r = c.oncekv_in(&["put", "k", "v", "--lease", "zz"], "");
    assert!(
        r.code != 0 && r.err.contains("bad lease ID \"zz\""),
        "{r:?}"
    );
    let r = c.oncekv_in(&["lease", "grant"], "");
    assert!(r.code != 0 && r.err.contains("<TTL>"), "{r:?}");
    let mut unreachable = Command::new(env!("CARGO_BIN_EXE_oncekv"));
    unreachable.args([
        "get",
        "k",
        "--endpoints=127.0.0.1:1",
        "--command-timeout=1s",
    ]);
    let r = run(unreachable, "");
    assert!(r.code == 1 && r.err.starts_with("Error: "), "{r:?}");

    // The endpoints can come from the environment, and options after the command win.
    let mut from_env = Command::new(env!("CARGO_BIN_EXE_oncekv"));
    from_env
        .args(["get", "greeting", "--print-value-only"])
        .env("ONCEKV_ENDPOINTS", &c.endpoint);
    assert_eq!(run(from_env, "").out, "hello\n");
    let out = c.oncekv(&["get", "greeting", "--endpoints", &c.endpoint, "-w", "json"]);
    assert!(out.starts_with('{'), "{out}");

    // --help on every command.
    for path in [
        &["put"][..],
        &["get"],
        &["del"],
        &["txn"],
        &["lease"],
        &["lease", "grant"],
        &["lease", "revoke"],
        &["lease", "keep-alive"],
        &["lease", "timetolive"],
        &["member", "list"],
        &["endpoint", "status"],
    ] {
        let mut args = path.to_vec();
        args.push("--help");
        let help = c.oncekv(&args);
        assert!(help.contains("Usage: oncekv"), "{path:?}: {help}");
    }
}
