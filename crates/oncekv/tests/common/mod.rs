//! What the tests that run `oncekv serve` processes share.
#![allow(dead_code, clippy::unwrap_used)]

use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// Member processes, killed on drop.
pub struct Members(pub Vec<Child>);

impl Drop for Members {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A loopback port free at the time of asking.
pub fn free_port() -> u16 {
    oncekv_testkit::free_port().unwrap()
}

/// `oncekv serve` for member `name` of a cluster on loopback, its data under `dir`.
/// `existing`: it joins a running cluster (`--initial-cluster-state existing`).
pub fn serve_member(
    dir: &std::path::Path,
    name: &str,
    ports: (u16, u16),
    initial_cluster: &str,
    existing: bool,
    stderr: std::process::Stdio,
) -> Child {
    serve_member_with(dir, name, ports, initial_cluster, existing, stderr, &[])
}

/// [`serve_member`] with more flags.
pub fn serve_member_with(
    dir: &std::path::Path,
    name: &str,
    (client, peer): (u16, u16),
    initial_cluster: &str,
    existing: bool,
    stderr: std::process::Stdio,
    extra: &[&str],
) -> Child {
    let client_url = format!("http://127.0.0.1:{client}");
    std::process::Command::new(env!("CARGO_BIN_EXE_oncekv"))
        .args(["serve", "--name", name, "--data-dir"])
        .arg(dir.join(name))
        .args(["--listen-client-urls", &client_url])
        .args(["--advertise-client-urls", &client_url])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args(["--initial-cluster", initial_cluster])
        .args([
            "--initial-cluster-state",
            if existing { "existing" } else { "new" },
        ])
        .args(extra)
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap()
}

/// Starts members `n1..=n{founders}` of a new cluster under `dir`, on the first
/// `founders` of `ports` (client, peer), their stderr discarded.
pub fn start_founders(dir: &std::path::Path, ports: &[(u16, u16)], founders: usize) -> Members {
    start_founders_with(dir, ports, founders, &[])
}

/// [`start_founders`] with more flags for every member.
pub fn start_founders_with(
    dir: &std::path::Path,
    ports: &[(u16, u16)],
    founders: usize,
    extra: &[&str],
) -> Members {
    let initial = (0..founders)
        .map(|i| format!("n{}=http://127.0.0.1:{}", i + 1, ports[i].1))
        .collect::<Vec<_>>()
        .join(",");
    Members(
        ports
            .iter()
            .take(founders)
            .enumerate()
            .map(|(i, p)| {
                serve_member_with(
                    dir,
                    &format!("n{}", i + 1),
                    *p,
                    &initial,
                    false,
                    std::process::Stdio::null(),
                    extra,
                )
            })
            .collect(),
    )
}

/// Whether `etcdctl put k v` against `endpoint` succeeds (short timeouts).
pub fn etcdctl_put(endpoint: &str) -> bool {
    std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args([
            &format!("--endpoints={endpoint}"),
            "--dial-timeout=1s",
            "--command-timeout=2s",
            "put",
            "k",
            "v",
        ])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The body `curl -s` gets from `url` (empty if nothing answers).
pub fn http_get(url: &str) -> String {
    let out = std::process::Command::new("curl")
        .args(["-s", url])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until the member at `endpoint` takes a write; panics after 20 s.
pub fn wait_serving(endpoint: &str) {
    let start = std::time::Instant::now();
    while !etcdctl_put(endpoint) {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "{endpoint} never served"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// A one-member cluster `n1` under `dir` on fresh ports, with `extra` flags: the process
/// and its (client, peer) ports.
pub fn serve_single(dir: &std::path::Path, extra: &[&str]) -> (Members, (u16, u16)) {
    let ports = (free_port(), free_port());
    let member = serve_member_with(
        dir,
        "n1",
        ports,
        &format!("n1=http://127.0.0.1:{}", ports.1),
        false,
        std::process::Stdio::null(),
        extra,
    );
    (Members(vec![member]), ports)
}

/// Resident memory of process `pid`, in bytes.
pub fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

/// Sends `signal` (`kill`'s spelling: "-TERM", "-INT") to `child` and waits for it to exit
/// (at most 10 s, then the test fails naming the signal).
pub fn signal_and_wait(child: &mut Child, signal: &str) -> ExitStatus {
    let pid = child.id().to_string();
    Command::new("kill").args([signal, &pid]).status().unwrap();
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{signal} ignored"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
