//! `oncekv watch`, `oncekv compaction` and `oncekv get --rev` against a three-member
//! cluster on free loopback ports: what they print (etcdctl 3.4's output, compared with
//! etcdctl's own where it is installed), how they exit, and a watch on a follower seeing
//! writes made through the leader.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use oncekv_testkit::local_cluster::TempCluster;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(20);

/// A cluster whose members run on their own runtime while the test runs commands.
struct Cluster {
    cluster: TempCluster,
    leader: usize,
    /// Kept last: dropping it stops the members.
    _runtime: tokio::runtime::Runtime,
}

impl Cluster {
    fn start() -> Cluster {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let cluster = runtime.block_on(TempCluster::start(3, |_| {}));
        let leader = runtime.block_on(cluster.wait_leader(WAIT));
        Cluster {
            cluster,
            leader,
            _runtime: runtime,
        }
    }

    fn leader(&self) -> String {
        self.cluster.endpoint(self.leader)
    }

    fn follower(&self) -> String {
        self.cluster.endpoint((self.leader + 1) % 3)
    }
}

/// What a command printed and how it exited.
#[derive(Debug)]
struct Run {
    out: String,
    err: String,
    code: i32,
}

fn command(program: &str, endpoint: &str, args: &[&str]) -> Command {
    let mut cmd = if program == "etcdctl" {
        let mut cmd = Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3");
        cmd
    } else {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_oncekv"));
        cmd.env_remove("ONCEKV_ENDPOINTS").env_remove("ONCEKV_LOG");
        cmd
    };
    cmd.arg(format!("--endpoints={endpoint}")).args(args);
    cmd
}

fn run(program: &str, endpoint: &str, args: &[&str]) -> Run {
    let out = command(program, endpoint, args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    Run {
        out: String::from_utf8(out.stdout).unwrap(),
        err: String::from_utf8(out.stderr).unwrap(),
        code: out.status.code().unwrap_or(-1),
    }
}

/// A successful oncekv run's stdout.
fn oncekv(endpoint: &str, args: &[&str]) -> String {
    let r = run("oncekv", endpoint, args);
    assert_eq!(r.code, 0, "oncekv {args:?}: {r:?}");
    r.out
}

/// The revision a `put` made.
fn put(endpoint: &str, key: &str, value: &str) -> i64 {
    let out = oncekv(endpoint, &["put", key, value, "-w", "json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    v["header"]["revision"].as_i64().unwrap()
}

fn etcdctl_installed() -> bool {
    let installed = Command::new("etcdctl")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        eprintln!("etcdctl is not installed (.ci/install-deps): checking oncekv's output alone");
    }
    installed
}

/// A running `watch` command whose stdout lines arrive on a channel.
struct Watch {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Watch {
    fn start(program: &str, endpoint: &str, args: &[&str]) -> Watch {
        let mut args = args.to_vec();
        args.insert(0, "watch");
        let mut child = command(program, endpoint, &args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Watch { child, lines }
    }

    /// The next `n` lines of output.
    fn lines(&self, n: usize) -> Vec<String> {
        let deadline = Instant::now() + WAIT;
        (0..n)
            .map(|i| {
                let left = deadline.saturating_duration_since(Instant::now());
                self.lines
                    .recv_timeout(left)
                    .unwrap_or_else(|e| panic!("line {i} of {n}: {e}"))
            })
            .collect()
    }

    /// Sends ctrl-c (SIGINT) and waits for the exit; returns the status and stderr.
    fn interrupt(mut self) -> (ExitStatus, String) {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-INT", &pid]).status().unwrap();
        let status = self.wait();
        let mut err = String::new();
        if let Some(mut stderr) = self.child.stderr.take() {
            std::io::Read::read_to_string(&mut stderr, &mut err).unwrap();
        }
        (status, err)
    }

    fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "the watch did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn lines(text: &[&str]) -> Vec<String> {
    text.iter().map(|s| s.to_string()).collect()
}

// etcd users script against etcdctl's watch output; a watch on a follower must see writes
// made through the leader (members serve watches from their own applied state).
#[test]
fn watch_on_a_follower_prints_puts_and_deletes_as_etcdctl_does() {
    let c = Cluster::start();
    let (leader, follower) = (c.leader(), c.follower());
    let etcdctl = etcdctl_installed();
    let start = put(&leader, "other", "x") + 1;
    let rev = format!("--rev={start}");

    // Live: started before the writes (from a known revision, so it cannot miss them).
    let live = Watch::start("oncekv", &follower, &["app/", "--prefix", &rev]);
    put(&leader, "app/a", "1");
    put(&leader, "app/a", "2");
    put(&leader, "app/b", "x y");
    put(&leader, "not/app", "unwatched");
    oncekv(&leader, &["del", "app/a"]);
    let want = lines(&[
        "PUT", "app/a", "1", "PUT", "app/a", "2", "PUT", "app/b", "x y", "DELETE", "app/a", "",
    ]);
    assert_eq!(live.lines(12), want);
    let (status, err) = live.interrupt();
    assert!(
        status.success(),
        "ctrl-c ends a watch cleanly: {status:?} {err}"
    );
    assert_eq!(err, "");

    // Replayed from history, with the previous key-values before the new ones.
    let prev = Watch::start(
        "oncekv",
        &follower,
        &["app/", "--prefix", &rev, "--prev-kv"],
    );
    let want_prev = lines(&[
        "PUT", "app/a", "1", //
        "PUT", "app/a", "1", "app/a", "2", //
        "PUT", "app/b", "x y", //
        "DELETE", "app/a", "2", "app/a", "",
    ]);
    assert_eq!(prev.lines(want_prev.len()), want_prev);
    drop(prev);

    // A range [key, end) and a single key.
    let ranged = Watch::start("oncekv", &follower, &["app/a", "app/b", &rev]);
    assert_eq!(ranged.lines(3), lines(&["PUT", "app/a", "1"]));
    drop(ranged);

    // JSON: clientv3's WatchResponse, one document per response.
    let json = Watch::start(
        "oncekv",
        &follower,
        &["app/", "--prefix", &rev, "-w", "json"],
    );
    let mut events = Vec::new();
    while events.len() < 4 {
        let line = json.lines(1).remove(0);
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            (&v["Canceled"], &v["Created"], &v["CompactRevision"]),
            (&Value::Bool(false), &Value::Bool(false), &Value::from(0)),
            "{line}"
        );
        events.extend(v["Events"].as_array().unwrap().clone());
    }
    assert_eq!(events[0]["kv"]["key"], "YXBwL2E=", "base64 keys");
    assert_eq!(events[0]["type"], Value::Null, "PUT (0) is left out");
    assert_eq!(events[3]["type"], 1, "DELETE");
    assert_eq!(events[3]["kv"]["mod_revision"], start + 4);
    drop(json);

    if etcdctl {
        for (args, want) in [
            (vec!["app/", "--prefix", &rev], &want),
            (vec!["app/", "--prefix", &rev, "--prev-kv"], &want_prev),
        ] {
            let theirs = Watch::start("etcdctl", &follower, &args);
            assert_eq!(&theirs.lines(want.len()), want, "etcdctl watch {args:?}");
        }
    }

    // From now on (no --rev): the first change after the watch exists is printed.
    let now = Watch::start("oncekv", &follower, &["tick"]);
    let mut i = 0;
    let first = loop {
        put(&leader, "tick", &i.to_string());
        if let Ok(line) = now.lines.recv_timeout(Duration::from_millis(200)) {
            break line;
        }
        i += 1;
        assert!(i < 100, "the watch never saw a put");
    };
    assert_eq!(first, "PUT");
    let rest = now.lines(2);
    assert_eq!(rest[0], "tick");
    let seen: usize = rest[1].parse().unwrap();
    // Every put after the first one seen follows, in order.
    put(&leader, "tick", "last");
    let mut expected = Vec::new();
    for j in seen + 1..=i {
        expected.extend(lines(&["PUT", "tick", &j.to_string()]));
    }
    expected.extend(lines(&["PUT", "tick", "last"]));
    assert_eq!(now.lines(expected.len()), expected);
    let (status, _) = now.interrupt();
    assert!(status.success());
}

// Compaction's two refusals are etcd's words (scripts match on them); reads and watches
// below the compaction say "compacted" as etcdctl does, a watch with exit status 5.
#[test]
fn compaction_refusals_get_rev_and_a_compacted_watch_print_what_etcdctl_prints() {
    let c = Cluster::start();
    let e = c.leader();
    let etcdctl = etcdctl_installed();
    let one = put(&e, "k", "v1");
    let two = put(&e, "k", "v2");
    let three = put(&e, "k", "v3");

    assert_eq!(
        oncekv(&e, &["get", "k", "--rev", &one.to_string()]),
        "k\nv1\n"
    );
    assert_eq!(
        oncekv(
            &e,
            &["get", "k", "--rev", &two.to_string(), "--print-value-only"]
        ),
        "v2\n"
    );
    if etcdctl {
        let args = ["get", "k", "--rev", &one.to_string()];
        assert_eq!(run("etcdctl", &e, &args).out, "k\nv1\n");
    }

    let compacted = "etcdserver: mvcc: required revision has been compacted";
    let future = "etcdserver: mvcc: required revision is a future revision";
    let refused = |args: &[&str], message: &str| {
        let r = run("oncekv", &e, args);
        assert_eq!(
            (r.code, r.err.as_str(), r.out.as_str()),
            (1, format!("Error: {message}\n").as_str(), ""),
            "{args:?}"
        );
        if etcdctl {
            let theirs = run("etcdctl", &e, args);
            assert_eq!(theirs.code, 1, "etcdctl {args:?}: {theirs:?}");
            assert!(
                theirs.err.ends_with(&format!("Error: {message}\n")),
                "{theirs:?}"
            );
        }
    };
    refused(&["compaction", &(three + 100).to_string()], future);
    assert_eq!(
        oncekv(&e, &["compaction", &two.to_string()]),
        format!("compacted revision {two}\n")
    );
    refused(&["compaction", &two.to_string()], compacted);
    refused(&["compaction", &one.to_string()], compacted);
    refused(&["get", "k", "--rev", &one.to_string()], compacted);
    assert_eq!(
        oncekv(&e, &["compaction", &three.to_string(), "--physical"]),
        format!("compacted revision {three}\n")
    );
    if etcdctl {
        let four = put(&e, "k", "v4");
        let theirs = run("etcdctl", &e, &["compaction", &four.to_string()]);
        assert_eq!(theirs.out, format!("compacted revision {four}\n"));
    }

    // A watch from a compacted revision: cancelled by the server, reported as etcdctl does.
    let ours = run("oncekv", &e, &["watch", "k", "--rev", &one.to_string()]);
    let want_err =
        format!("watch was canceled ({compacted})\nError: watch is canceled by the server\n");
    assert_eq!(
        (ours.code, ours.out.as_str(), ours.err.as_str()),
        (5, "", want_err.as_str())
    );
    let json = run("oncekv", &e, &["watch", "k", "--rev", "1", "-w", "json"]);
    assert_eq!(json.code, 5);
    let v: Value = serde_json::from_str(&json.out).unwrap();
    assert_eq!(
        (&v["Canceled"], &v["Events"]),
        (&Value::Bool(true), &Value::Array(vec![]))
    );
    assert!(v["CompactRevision"].as_i64().unwrap() >= three, "{v}");
    if etcdctl {
        let theirs = run("etcdctl", &e, &["watch", "k", "--rev", &one.to_string()]);
        assert_eq!((theirs.code, theirs.out.as_str()), (5, ""));
        assert_eq!(theirs.err, want_err);
    }

    // Usage errors and help.
    let r = run("oncekv", &e, &["watch", "k", "z", "--prefix"]);
    assert!(r.code != 0 && r.err.contains("--prefix"), "{r:?}");
    let r = run("oncekv", &e, &["compaction", "abc"]);
    assert!(r.code != 0 && r.err.contains("<REVISION>"), "{r:?}");
    for path in [&["watch"][..], &["compaction"]] {
        let mut args = path.to_vec();
        args.push("--help");
        let help = oncekv(&e, &args);
        assert!(help.contains("Usage: oncekv"), "{path:?}: {help}");
    }
}
