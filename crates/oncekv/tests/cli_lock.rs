//! `oncekv lock` and `oncekv elect` against a three-member cluster on free loopback ports:
//! etcdctl's output and exit statuses, holders that never overlap, a lock given up on that
//! leaves no waiter, and leadership handed over on ctrl-c.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use oncekv_testkit::local_cluster::TempCluster;

const WAIT: Duration = Duration::from_secs(20);

struct Cluster {
    cluster: TempCluster,
    /// Kept last: dropping it stops the members.
    _runtime: tokio::runtime::Runtime,
}

impl Cluster {
    fn start() -> Cluster {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let cluster = runtime.block_on(TempCluster::start(3, |_| {}));
        runtime.block_on(cluster.wait_leader(WAIT));
        Cluster {
            cluster,
            _runtime: runtime,
        }
    }

    fn endpoint(&self, i: usize) -> String {
        self.cluster.endpoint(i)
    }

    fn oncekv(&self, i: usize, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_oncekv"));
        cmd.env_remove("ONCEKV_ENDPOINTS")
            .env_remove("ONCEKV_LOG")
            .arg(format!("--endpoints={}", self.endpoint(i)))
            .args(args);
        cmd
    }

    /// stdout of a command that must succeed.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.oncekv(0, args).stdin(Stdio::null()).output().unwrap();
        assert!(
            out.status.success(),
            "oncekv {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

/// A long-running command whose stdout lines arrive on a channel; killed on drop.
struct Long {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Long {
    fn spawn(mut cmd: Command) -> Long {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
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
        Long { child, lines }
    }

    fn lines(&self, n: usize) -> Vec<String> {
        (0..n)
            .map(|i| {
                self.lines
                    .recv_timeout(WAIT)
                    .unwrap_or_else(|e| panic!("printed {i} of {n} lines: {e}"))
            })
            .collect()
    }

    /// True if nothing is printed for `quiet` (can only pass wrongly, never fail wrongly).
    fn silent_for(&self, quiet: Duration) -> bool {
        self.lines.recv_timeout(quiet).is_err()
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.id().to_string();
        Command::new("kill").args([signal, &pid]).status().unwrap();
    }

    /// Waits for the exit; its code.
    fn wait(mut self) -> i32 {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(start.elapsed() < WAIT, "did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Long {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn lock_runs_commands_one_at_a_time_and_cleans_up() {
    let c = Cluster::start();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");

    // Three at once through three members: the critical sections never interleave, each
    // sees its key, etcd's revision and a fencing token larger than the one before.
    let section = format!(
        "echo \"begin $ETCD_LOCK_KEY $ONCEKV_FENCING_TOKEN $ETCD_LOCK_REV\" >> {0}; sleep 0.2; \
         echo \"end $ETCD_LOCK_KEY\" >> {0}",
        log.display()
    );
    let lockers: Vec<Child> = (0..3)
        .map(|i| {
            c.oncekv(i, &["lock", "jobs", "--", "sh", "-c", &section])
                .stdin(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for l in lockers {
        let out = l.wait_with_output().unwrap();
        assert!(out.status.success());
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 6, "{text}");
    let mut last_token = 0;
    for pair in lines.chunks(2) {
        let fields: Vec<&str> = pair[0].split(' ').collect();
        assert_eq!(fields.len(), 4, "{text}");
        assert_eq!(fields[0], "begin", "sections overlap: {text}");
        assert!(fields[1].starts_with("jobs/"), "{text}");
        assert_eq!(
            pair[1],
            format!("end {}", fields[1]),
            "sections overlap: {text}"
        );
        let token: i64 = fields[2].parse().unwrap();
        let rev: i64 = fields[3].parse().unwrap();
        assert!(token > last_token && rev >= token, "{text}");
        last_token = token;
    }
    assert_eq!(c.ok(&["get", "jobs/", "--prefix"]), "");

    // The command's failure is reported as etcdctl does, and the lock is released.
    let out = c
        .oncekv(0, &["lock", "jobs", "--", "sh", "-c", "exit 3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "Error: exit status 3\n"
    );
    assert_eq!(c.ok(&["get", "jobs/", "--prefix"]), "");

    // Without a command: prints the key (etcdctl's get output) and holds until ctrl-c; a
    // second locker waits, and when it is stopped while waiting it leaves no key behind.
    let holder = Long::spawn(c.oncekv(0, &["lock", "held"]));
    let printed = holder.lines(2);
    assert!(printed[0].starts_with("held/"), "{printed:?}");
    assert_eq!(printed[1], "");
    let waiter = Long::spawn(c.oncekv(1, &["lock", "held"]));
    assert!(
        waiter.silent_for(Duration::from_secs(1)),
        "a held lock was granted"
    );
    waiter.signal("-TERM");
    assert_eq!(waiter.wait(), 0);
    assert_eq!(
        c.ok(&["get", "held/", "--prefix", "--keys-only"]).trim(),
        printed[0],
        "the waiter left its key behind"
    );
    holder.signal("-INT");
    assert_eq!(holder.wait(), 0);
    assert_eq!(c.ok(&["get", "held/", "--prefix"]), "");
    assert_eq!(c.ok(&["lease", "list"]), "found 0 leases\n");
}

#[test]
fn elect_leads_until_ctrl_c_and_listeners_follow() {
    let c = Cluster::start();
    let out = c.oncekv(0, &["elect", "pick"]).output().unwrap();
    assert_eq!(out.status.code(), Some(128));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "Error: no proposal argument but -l not set\n"
    );

    let first = Long::spawn(c.oncekv(0, &["elect", "pick", "p1"]));
    let first_lines = first.lines(2);
    assert!(first_lines[0].starts_with("pick/"), "{first_lines:?}");
    assert_eq!(first_lines[1], "p1");
    let listener = Long::spawn(c.oncekv(2, &["elect", "-l", "pick"]));
    assert_eq!(listener.lines(2), first_lines);
    let second = Long::spawn(c.oncekv(1, &["elect", "pick", "p2"]));
    assert!(
        second.silent_for(Duration::from_secs(1)),
        "two leaders at once"
    );
    first.signal("-INT");
    assert_eq!(first.wait(), 0);
    let second_lines = second.lines(2);
    assert_eq!(second_lines[1], "p2");
    assert_ne!(second_lines[0], first_lines[0]);
    assert_eq!(listener.lines(2), second_lines);
    second.signal("-INT");
    assert_eq!(second.wait(), 0);
    assert_eq!(c.ok(&["get", "pick/", "--prefix"]), "");
}
