//! The clusters `bench compare` measures, as child processes: a 3-member etcd or one
//! `oncekv dev`, started from empty data directories, waited on until they elect a
//! leader, and killed when done; or (`--scale`) stopped with SIGTERM and started again
//! on the same data and ports.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use super::machine::{process_cpu_seconds, process_rss_bytes};
use crate::bench::find_leader;

/// A running 3-member cluster; its processes are killed when it is dropped.
pub(super) struct Cluster {
    pub(super) name: &'static str,
    children: Vec<Child>,
    pub(super) endpoints: Vec<String>,
    /// How each process was started, to start it again on the same data and ports (a
    /// restart with other peer ports would not find the members the data names).
    recipes: Vec<Recipe>,
    /// Where the data and logs live, and the logs' pattern in it, for error messages.
    dir: PathBuf,
    logs: &'static str,
    /// The members' data directories (what `disk` measures).
    pub(super) data: Vec<PathBuf>,
    /// When the processes were last spawned.
    pub(super) spawned: Instant,
}

/// One process of a cluster: its command line and where its output goes.
struct Recipe {
    program: PathBuf,
    args: Vec<OsString>,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Recipe {
    /// Starts the process; `again`: a restart, whose log is appended to the first run's.
    fn spawn(&self, again: bool) -> Result<Child, String> {
        let stderr = if again {
            OpenOptions::new()
                .append(true)
                .create(true)
                .open(&self.stderr)
                .map_err(|e| format!("opening {}: {e}", self.stderr.display()))?
        } else {
            log_file(&self.stderr)?
        };
        Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log_file(&self.stdout)?)
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.program.display()))
    }
}

/// How a graceful stop went.
#[derive(Debug, Clone, Copy)]
pub(super) struct Stopped {
    pub(super) seconds: f64,
    /// Every process exited by itself within the limit (else it was killed).
    pub(super) clean: bool,
}

impl Cluster {
    pub(super) async fn etcd(etcd: &Path, dir: &Path) -> Result<Cluster, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let ports = free_ports(6)?;
        let peer = |i: usize| format!("http://127.0.0.1:{}", ports[2 * i + 1]);
        let client = |i: usize| format!("http://127.0.0.1:{}", ports[2 * i]);
        let initial: Vec<String> = (0..3).map(|i| format!("e{}={}", i + 1, peer(i))).collect();
        let data: Vec<PathBuf> = (0..3).map(|i| dir.join(format!("e{}", i + 1))).collect();
        let recipes: Vec<Recipe> = (0..3)
            .map(|i| {
                let mut args: Vec<OsString> = vec!["--name".into(), format!("e{}", i + 1).into()];
                args.push("--data-dir".into());
                args.push(data[i].clone().into());
                // Given again on a restart, where etcd ignores the --initial-* flags and
                // reads the membership from its data.
                for (flag, value) in [
                    ("--listen-client-urls", client(i)),
                    ("--advertise-client-urls", client(i)),
                    ("--listen-peer-urls", peer(i)),
                    ("--initial-advertise-peer-urls", peer(i)),
                    ("--initial-cluster", initial.join(",")),
                    ("--initial-cluster-token", "oncekv-bench-compare".into()),
                    ("--initial-cluster-state", "new".into()),
                    ("--logger", "zap".into()),
                    ("--log-outputs", "stderr".into()),
                ] {
                    args.push(flag.into());
                    args.push(value.into());
                }
                Recipe {
                    program: etcd.to_path_buf(),
                    args,
                    stdout: dir.join(format!("e{}.out", i + 1)),
                    stderr: dir.join(format!("e{}.log", i + 1)),
                }
            })
            .collect();
        let children = recipes
            .iter()
            .map(|r| r.spawn(false))
            .collect::<Result<Vec<_>, _>>()?;
        let mut cluster = Cluster {
            name: "etcd",
            children,
            endpoints: (0..3).map(client).collect(),
            recipes,
            dir: dir.to_path_buf(),
            logs: "e*.log",
            data,
            spawned: Instant::now(),
        };
        cluster.wait_for_leader().await?;
        Ok(cluster)
    }

    pub(super) async fn oncekv(
        oncekv: &Path,
        extra: &[String],
        dir: &Path,
    ) -> Result<Cluster, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let out_path = dir.join("out");
        let mut args: Vec<OsString> = vec!["dev".into(), "--data-dir".into()];
        args.push(dir.join("data").into());
        args.extend(extra.iter().map(OsString::from));
        let recipe = Recipe {
            program: oncekv.to_path_buf(),
            args,
            stdout: out_path.clone(),
            stderr: dir.join("log"),
        };
        let child = recipe.spawn(false)?;
        let mut cluster = Cluster {
            name: "oncekv",
            children: vec![child],
            endpoints: Vec::new(),
            recipes: vec![recipe],
            dir: dir.to_path_buf(),
            logs: "log",
            data: vec![dir.join("data")],
            spawned: Instant::now(),
        };
        // `oncekv dev` prints "  n1: clients http://127.0.0.1:2379  peers ..." per member
        // (other ports when those are taken) before "ctrl-c stops the cluster".
        let started = Instant::now();
        loop {
            let out = std::fs::read_to_string(&out_path).unwrap_or_default();
            if out.contains("ctrl-c") {
                cluster.endpoints = out
                    .lines()
                    .filter_map(|l| l.split_once("clients ").map(|(_, rest)| rest))
                    .filter_map(|rest| rest.split_whitespace().next())
                    .map(str::to_string)
                    .collect();
                break;
            }
            cluster.check_running()?;
            if started.elapsed() > Duration::from_secs(60) {
                return Err(format!(
                    "oncekv dev did not start within 60 s; its output: {out}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if cluster.endpoints.is_empty() {
            return Err(format!(
                "no client endpoints in the output of oncekv dev ({})",
                out_path.display()
            ));
        }
        cluster.wait_for_leader().await?;
        Ok(cluster)
    }

    /// Sends every process SIGTERM (etcd and `oncekv dev` both stop cleanly on it) and
    /// waits for them to exit; one still running after `limit` is killed.
    pub(super) async fn stop_gracefully(&mut self, limit: Duration) -> Result<Stopped, String> {
        let started = Instant::now();
        for child in &self.children {
            let Some(pid) = child.id() else { continue };
            let status = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await
                .map_err(|e| format!("running kill -TERM {pid}: {e}"))?;
            if !status.success() {
                return Err(format!("kill -TERM {pid} failed ({status})"));
            }
        }
        let mut clean = true;
        for child in &mut self.children {
            let left = limit.saturating_sub(started.elapsed());
            if tokio::time::timeout(left, child.wait()).await.is_err() {
                clean = false;
                let _ = child.kill().await;
            }
        }
        Ok(Stopped {
            seconds: started.elapsed().as_secs_f64(),
            clean,
        })
    }

    /// Starts the stopped processes again on the same data directories and ports, and
    /// returns at once (`spawned` is then the moment they started).
    pub(super) fn respawn(&mut self) -> Result<(), String> {
        self.children = self
            .recipes
            .iter()
            .map(|r| r.spawn(true))
            .collect::<Result<Vec<_>, _>>()?;
        self.spawned = Instant::now();
        Ok(())
    }

    /// Resident memory of the cluster's processes together, in bytes.
    pub(super) fn rss_bytes(&self) -> u64 {
        self.children
            .iter()
            .filter_map(Child::id)
            .map(process_rss_bytes)
            .sum()
    }

    /// Until a member reports a leader (30 s at most).
    async fn wait_for_leader(&mut self) -> Result<(), String> {
        let started = Instant::now();
        loop {
            if find_leader(&self.endpoints, Duration::from_secs(1))
                .await
                .is_ok()
            {
                return Ok(());
            }
            self.check_running()?;
            if started.elapsed() > Duration::from_secs(30) {
                return Err(format!(
                    "{} elected no leader within 30 s (logs: {}/{})",
                    self.name,
                    self.dir.display(),
                    self.logs
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// An error naming the logs if a process has exited.
    pub(super) fn check_running(&mut self) -> Result<(), String> {
        for child in &mut self.children {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "{} exited while starting ({status}); logs: {}/{}",
                    self.name,
                    self.dir.display(),
                    self.logs
                ));
            }
        }
        Ok(())
    }

    /// CPU seconds (user + system) the cluster's processes have used so far.
    pub(super) fn cpu_seconds(&self) -> f64 {
        self.children
            .iter()
            .filter_map(Child::id)
            .map(process_cpu_seconds)
            .sum()
    }

    pub(super) async fn stop(mut self) {
        for child in &mut self.children {
            let _ = child.kill().await;
        }
    }
}

fn log_file(path: &Path) -> Result<std::fs::File, String> {
    std::fs::File::create(path).map_err(|e| format!("creating {}: {e}", path.display()))
}

/// `n` TCP ports free on 127.0.0.1 right now (the listeners are closed again, so another
/// program could take one before the cluster binds it: the cluster then fails to start,
/// with its log named).
fn free_ports(n: usize) -> Result<Vec<u16>, String> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("finding free ports: {e}"))?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("finding free ports: {e}"))
}

pub(super) async fn etcd_version(etcd: &Path) -> Result<String, String> {
    let out = Command::new(etcd)
        .arg("--version")
        .output()
        .await
        .map_err(|e| {
            format!(
                "running {} --version: {e} (install etcd 3.4 or later, e.g. Debian's etcd-server, or pass --etcd PATH)",
                etcd.display()
            )
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("etcd Version: "))
        .map(|v| v.trim().to_string())
        .ok_or_else(|| {
            format!(
                "{} --version printed no \"etcd Version:\" line: {text}",
                etcd.display()
            )
        })
}
