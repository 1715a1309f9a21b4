//! The clusters `bench compare` measures, as child processes: a 3-member etcd or one
//! `oncekv dev`, started from empty data directories, waited on until they elect a
//! leader, and killed when done.

use std::net::TcpListener;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use super::machine::process_cpu_seconds;
use crate::bench::find_leader;

/// A running 3-member cluster; its processes are killed when it is dropped.
pub(super) struct Cluster {
    pub(super) name: &'static str,
    children: Vec<Child>,
    pub(super) endpoints: Vec<String>,
}

impl Cluster {
    pub(super) async fn etcd(etcd: &Path, dir: &Path) -> Result<Cluster, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let ports = free_ports(6)?;
        let peer = |i: usize| format!("http://127.0.0.1:{}", ports[2 * i + 1]);
        let client = |i: usize| format!("http://127.0.0.1:{}", ports[2 * i]);
        let initial: Vec<String> = (0..3).map(|i| format!("e{}={}", i + 1, peer(i))).collect();
        let mut children = Vec::new();
        for i in 0..3 {
            let log = log_file(&dir.join(format!("e{}.log", i + 1)))?;
            let child = Command::new(etcd)
                .arg("--name")
                .arg(format!("e{}", i + 1))
                .arg("--data-dir")
                .arg(dir.join(format!("e{}", i + 1)))
                .args(["--listen-client-urls", &client(i)])
                .args(["--advertise-client-urls", &client(i)])
                .args(["--listen-peer-urls", &peer(i)])
                .args(["--initial-advertise-peer-urls", &peer(i)])
                .args(["--initial-cluster", &initial.join(",")])
                .args(["--initial-cluster-token", "oncekv-bench-compare"])
                .args(["--initial-cluster-state", "new"])
                .args(["--logger", "zap", "--log-outputs", "stderr"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| format!("starting {}: {e}", etcd.display()))?;
            children.push(child);
        }
        let mut cluster = Cluster {
            name: "etcd",
            children,
            endpoints: (0..3).map(client).collect(),
        };
        cluster.wait_for_leader(dir, "e*.log").await?;
        Ok(cluster)
    }

    pub(super) async fn oncekv(
        oncekv: &Path,
        extra: &[String],
        dir: &Path,
    ) -> Result<Cluster, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let out_path = dir.join("out");
        let child = Command::new(oncekv)
            .arg("dev")
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log_file(&out_path)?)
            .stderr(log_file(&dir.join("log"))?)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting {} dev: {e}", oncekv.display()))?;
        let mut cluster = Cluster {
            name: "oncekv",
            children: vec![child],
            endpoints: Vec::new(),
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
            cluster.check_running(dir, "log")?;
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
        cluster.wait_for_leader(dir, "log").await?;
        Ok(cluster)
    }

    /// Until a member reports a leader (30 s at most).
    async fn wait_for_leader(&mut self, dir: &Path, logs: &str) -> Result<(), String> {
        let started = Instant::now();
        loop {
            if find_leader(&self.endpoints, Duration::from_secs(1))
                .await
                .is_ok()
            {
                return Ok(());
            }
            self.check_running(dir, logs)?;
            if started.elapsed() > Duration::from_secs(30) {
                return Err(format!(
                    "{} elected no leader within 30 s (logs: {}/{logs})",
                    self.name,
                    dir.display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn check_running(&mut self, dir: &Path, logs: &str) -> Result<(), String> {
        for child in &mut self.children {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "{} exited while starting ({status}); logs: {}/{logs}",
                    self.name,
                    dir.display()
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
