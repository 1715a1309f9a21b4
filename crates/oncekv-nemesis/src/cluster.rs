//! The members as real child processes: `oncekv serve` or Debian's `etcd` 3.4, started
//! with etcd's flags, member `i` on 127.0.0.(i+1) (client port 2379, peer port 2380)
//! under uid [`rules::member_uid`]`(i)`, its data in a temporary directory and its output
//! in `logs/<name>.log` of the run's directory. The harness kills (-9) and restarts them,
//! pauses and resumes them (SIGSTOP/SIGCONT), skews their clocks (libfaketime, see
//! [`crate::clock`]) and finds the leader. Dropping the [`Cluster`] kills every member
//! and removes the data.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process};

use crate::clock;
use crate::etcd;
use crate::rules::{CLIENT_PORT, PEER_PORT, member_addr, member_uid};

/// The environment variable `scripts/nemesis` sets inside the namespace it made.
pub const NETNS_MARKER: &str = "ONCEKV_NEMESIS_NETNS";

/// What the members are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Oncekv,
    Etcd,
}

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Oncekv => "oncekv",
            Target::Etcd => "etcd",
        }
    }
}

/// How to start a cluster.
#[derive(Debug, Clone)]
pub struct Spec {
    pub target: Target,
    pub bin: PathBuf,
    pub members: usize,
    /// oncekv's `--leader-lease-reads` (etcd has no such flag).
    pub lease_reads: bool,
    /// `ONCEKV_BREAK` for every member (only a build with the `broken` feature reads it).
    pub breaks: Option<String>,
    /// Start members under libfaketime (this library), each with a clock file of its own.
    pub faketime: Option<PathBuf>,
}

/// Refuses to run outside a private network namespace: the harness binds fixed ports
/// on 127.0.0.x and rewrites the firewall, which must never happen on a shared host.
pub fn ensure_private_namespace() -> Result<(), String> {
    if std::env::var_os(NETNS_MARKER).is_none() {
        return Err(format!(
            "not in the namespace scripts/nemesis makes ({NETNS_MARKER} is unset): run \
             scripts/nemesis, which runs this inside `unshare --net`"
        ));
    }
    let dev = fs::read_to_string("/proc/net/dev").map_err(|e| format!("/proc/net/dev: {e}"))?;
    let interfaces: Vec<&str> = dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    if interfaces != ["lo"] {
        return Err(format!(
            "this network namespace has interfaces {interfaces:?}, not only lo: refusing to \
             touch its firewall"
        ));
    }
    Ok(())
}

/// One member's process and files.
#[derive(Debug)]
struct Member {
    name: String,
    data: PathBuf,
    log: PathBuf,
    clock: PathBuf,
    child: Option<Child>,
    paused: bool,
}

/// A running cluster. Dropping it kills every member.
#[derive(Debug)]
pub struct Cluster {
    spec: Spec,
    members: Vec<Member>,
    /// Holds the members' data; removed on drop.
    _tmp: tempfile::TempDir,
}

/// `name=http://addr:2380` for every member.
fn initial_cluster(n: usize) -> String {
    (0..n)
        .map(|i| format!("n{}=http://{}:{PEER_PORT}", i + 1, member_addr(i)))
        .collect::<Vec<_>>()
        .join(",")
}

/// The arguments member `i` of `spec` starts with (the same at every restart: a member
/// with data ignores the `--initial-*` flags, in etcd and in oncekv).
pub fn args(spec: &Spec, i: usize, data: &Path) -> Vec<String> {
    let addr = member_addr(i);
    let client = format!("http://{addr}:{CLIENT_PORT}");
    let peer = format!("http://{addr}:{PEER_PORT}");
    let mut a: Vec<String> = Vec::new();
    if spec.target == Target::Oncekv {
        a.push("serve".into());
    }
    let flags = [
        ("--name", format!("n{}", i + 1)),
        ("--data-dir", data.display().to_string()),
        ("--listen-client-urls", client.clone()),
        ("--advertise-client-urls", client),
        ("--listen-peer-urls", peer.clone()),
        ("--initial-advertise-peer-urls", peer),
        ("--initial-cluster", initial_cluster(spec.members)),
        ("--initial-cluster-token", "nemesis".into()),
        ("--initial-cluster-state", "new".into()),
        ("--heartbeat-interval", "100".into()),
        ("--election-timeout", "1000".into()),
    ];
    for (flag, value) in flags {
        a.push(format!("{flag}={value}"));
    }
    match spec.target {
        Target::Oncekv if spec.lease_reads => a.push("--leader-lease-reads=true".into()),
        Target::Oncekv => {}
        Target::Etcd => a.extend(["--logger=zap".into(), "--log-outputs=stderr".into()]),
    }
    a
}

impl Cluster {
    /// Starts every member (they find each other; [`Cluster::wait_ready`] waits for a
    /// leader). Output goes to `logs/` under `run_dir`.
    pub fn start(spec: Spec, run_dir: &Path) -> Result<Cluster, String> {
        let tmp = tempfile::Builder::new()
            .prefix("oncekv-nemesis-")
            .tempdir()
            .map_err(|e| format!("temporary directory: {e}"))?;
        // Members run as other users: they must reach their directories.
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("chmod {}: {e}", tmp.path().display()))?;
        let logs = run_dir.join("logs");
        fs::create_dir_all(&logs).map_err(|e| format!("{}: {e}", logs.display()))?;
        let mut members = Vec::new();
        for i in 0..spec.members {
            let name = format!("n{}", i + 1);
            let home = tmp.path().join(&name);
            fs::create_dir_all(&home).map_err(|e| format!("{}: {e}", home.display()))?;
            let clock = home.join("faketime");
            clock::write_offset(&clock, 0)?;
            std::os::unix::fs::chown(&home, Some(member_uid(i)), Some(member_uid(i)))
                .map_err(|e| format!("chown {}: {e}", home.display()))?;
            members.push(Member {
                data: home.join("data"),
                log: logs.join(format!("{name}.log")),
                name,
                clock,
                child: None,
                paused: false,
            });
        }
        let mut cluster = Cluster {
            spec,
            members,
            _tmp: tmp,
        };
        for i in 0..cluster.members.len() {
            cluster.spawn(i)?;
        }
        Ok(cluster)
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    pub fn target(&self) -> Target {
        self.spec.target
    }

    /// Member `i`'s client URL.
    pub fn endpoint(i: usize) -> String {
        format!("http://{}:{CLIENT_PORT}", member_addr(i))
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.len()).map(Cluster::endpoint).collect()
    }

    /// The member's name (`n1`...).
    pub fn name(&self, i: usize) -> &str {
        self.members.get(i).map_or("?", |m| m.name.as_str())
    }

    fn spawn(&mut self, i: usize) -> Result<(), String> {
        let args = args(&self.spec, i, &self.members[i].data);
        let m = &mut self.members[i];
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.log)
            .map_err(|e| format!("{}: {e}", m.log.display()))?;
        let err = log
            .try_clone()
            .map_err(|e| format!("{}: {e}", m.log.display()))?;
        let mut cmd = Command::new(&self.spec.bin);
        cmd.args(&args)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", m.data.parent().unwrap_or(&m.data))
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .uid(member_uid(i))
            .gid(member_uid(i))
            // A group of its own: ctrl-c at the terminal reaches the harness, which stops
            // the members itself, not the members half-way through a teardown.
            .process_group(0);
        if let Some(b) = &self.spec.breaks {
            cmd.env("ONCEKV_BREAK", b);
        }
        if let Some(lib) = &self.spec.faketime {
            // The wall clock only: a real machine's wall clock steps (NTP, an operator),
            // its monotonic clock never goes back, and under the library it would jump
            // with every change of offset (see `clock`).
            cmd.env("LD_PRELOAD", lib)
                .env("FAKETIME_TIMESTAMP_FILE", &m.clock)
                .env("FAKETIME_NO_CACHE", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting {} {}: {e}", self.spec.bin.display(), m.name))?;
        m.child = Some(child);
        m.paused = false;
        Ok(())
    }

    /// Kills member `i` with SIGKILL and waits for it (a no-op if it is down).
    pub fn kill(&mut self, i: usize) {
        if let Some(m) = self.members.get_mut(i)
            && let Some(mut child) = m.child.take()
        {
            let _ = child.kill();
            let _ = child.wait();
            m.paused = false;
        }
    }

    /// Starts member `i` again on its data if it is down.
    pub fn restart(&mut self, i: usize) -> Result<(), String> {
        if self.members.get(i).is_some_and(|m| m.child.is_none()) {
            self.spawn(i)?;
        }
        Ok(())
    }

    fn signal(&self, i: usize, signal: Signal) -> Result<(), String> {
        let m = self.members.get(i).ok_or("no such member")?;
        let Some(child) = &m.child else {
            return Ok(());
        };
        let pid = Pid::from_raw(child.id() as i32).ok_or("a member without a pid")?;
        kill_process(pid, signal).map_err(|e| format!("signal to {}: {e}", m.name))
    }

    /// SIGSTOP: the member stops where it is, its sockets open (a long GC pause).
    pub fn pause(&mut self, i: usize) -> Result<(), String> {
        self.signal(i, Signal::STOP)?;
        if let Some(m) = self.members.get_mut(i) {
            m.paused = true;
        }
        Ok(())
    }

    /// SIGCONT.
    pub fn resume(&mut self, i: usize) -> Result<(), String> {
        self.signal(i, Signal::CONT)?;
        if let Some(m) = self.members.get_mut(i) {
            m.paused = false;
        }
        Ok(())
    }

    /// Sets member `i`'s clock `secs` seconds off real time (libfaketime re-reads the file
    /// on every clock call: the member's clocks jump at once).
    pub fn set_clock(&self, i: usize, secs: i64) -> Result<(), String> {
        let m = self.members.get(i).ok_or("no such member")?;
        clock::write_offset(&m.clock, secs)
    }

    /// Undoes every process fault: resumes paused members, restarts killed ones, puts
    /// every clock right.
    pub fn heal(&mut self) -> Result<(), String> {
        for i in 0..self.len() {
            if self.members[i].paused {
                self.resume(i)?;
            }
            self.restart(i)?;
            self.set_clock(i, 0)?;
        }
        Ok(())
    }

    /// Members that exited without being killed by the harness: `(name, status)`. A
    /// member that dies by itself is a finding.
    pub fn exited(&mut self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for m in &mut self.members {
            if let Some(child) = &mut m.child
                && let Ok(Some(status)) = child.try_wait()
            {
                out.push((m.name.clone(), status.to_string()));
                m.child = None;
            }
        }
        out
    }

    /// The member that leads, by its own status and the others' agreement: the one whose
    /// status names itself as leader with the highest term. `None` if no member answers
    /// as leader within a second.
    pub async fn leader(&self) -> Option<usize> {
        let mut best: Option<(u64, usize)> = None;
        for i in 0..self.len() {
            if self.members[i].child.is_none() || self.members[i].paused {
                continue;
            }
            let Ok(mut c) = etcd::connect(&Cluster::endpoint(i), Duration::from_secs(1)).await
            else {
                continue;
            };
            let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(1), c.status()).await else {
                continue;
            };
            let me = s.header().map_or(0, |h| h.member_id());
            if me != 0 && s.leader() == me && best.is_none_or(|(t, _)| s.raft_term() > t) {
                best = Some((s.raft_term(), i));
            }
        }
        best.map(|(_, i)| i)
    }

    /// Waits (at most `limit`) until a leader is elected and answers a linearizable read.
    pub async fn wait_ready(&mut self, limit: Duration) -> Result<usize, String> {
        let deadline = tokio::time::Instant::now() + limit;
        while tokio::time::Instant::now() < deadline {
            if let Some((name, status)) = self.exited().into_iter().next() {
                return Err(format!("member {name} exited while starting: {status}"));
            }
            if let Some(l) = self.leader().await
                && let Ok(mut c) =
                    etcd::connect(&Cluster::endpoint(l), Duration::from_secs(1)).await
                && c.get("ready", None).await.is_ok()
            {
                return Ok(l);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(format!("no leader within {limit:?}"))
    }

    /// Every member's log, for a report.
    pub fn logs(&self) -> Vec<PathBuf> {
        self.members.iter().map(|m| m.log.clone()).collect()
    }

    /// Stops every member now (resumed first, so that none stays stopped).
    pub fn stop(&mut self) {
        for i in 0..self.len() {
            let _ = self.signal(i, Signal::CONT);
            self.kill(i);
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Both targets get the same cluster flags: etcd's command line is the contract.
    #[test]
    fn a_member_starts_with_etcds_flags_and_its_own_address() {
        let spec = Spec {
            target: Target::Etcd,
            bin: "etcd".into(),
            members: 3,
            lease_reads: true,
            breaks: None,
            faketime: None,
        };
        let a = args(&spec, 1, Path::new("/d"));
        assert_eq!(a[0], "--name=n2");
        assert!(a.contains(&"--listen-peer-urls=http://127.0.0.2:2380".to_string()));
        assert!(a.contains(
            &"--initial-cluster=n1=http://127.0.0.1:2380,n2=http://127.0.0.2:2380,n3=http://127.0.0.3:2380"
                .to_string()
        ));
        // etcd has no lease reads: the flag would stop it from starting.
        assert!(!a.iter().any(|f| f.contains("lease-reads")));
        let oncekv = Spec {
            target: Target::Oncekv,
            ..spec
        };
        let a = args(&oncekv, 0, Path::new("/d"));
        assert_eq!(a[0], "serve");
        assert!(a.contains(&"--leader-lease-reads=true".to_string()));
    }
}
