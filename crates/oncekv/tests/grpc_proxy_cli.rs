//! `oncekv grpc-proxy start` as a user runs it: the binary in front of `oncekv dev`,
//! etcdctl 3.4 through it, on a unix socket and on TCP.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// A child process killed on drop, and the lines it printed up to `until`.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(args: &[&str], until: &str) -> (Running, Vec<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_oncekv"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        let done = line.contains(until);
        lines.push(line);
        if done {
            break;
        }
    }
    assert!(
        lines.last().is_some_and(|l| l.contains(until)),
        "{args:?} never printed {until:?}: {lines:?}"
    );
    (Running(child), lines)
}

fn etcdctl(endpoint: &str, args: &[&str]) -> String {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg("--endpoints")
        .arg(endpoint)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "etcdctl {args:?} via {endpoint}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn etcdctl_works_through_the_proxy_on_a_unix_socket_and_on_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (_dev, lines) = start(
        &["dev", "--nodes", "1", "--data-dir", data.to_str().unwrap()],
        "ctrl-c stops",
    );
    let member = lines
        .iter()
        .find_map(|l| {
            l.trim()
                .split_once("clients ")
                .map(|(_, r)| r.split_whitespace().next().unwrap().to_string())
        })
        .unwrap();
    let sock = format!("unix://{}", dir.path().join("proxy.sock").display());
    let (_unix_proxy, _) = start(
        &[
            "grpc-proxy",
            "start",
            "--endpoints",
            &member,
            "--listen-addr",
            &sock,
        ],
        "serving etcd's API",
    );
    assert_eq!(etcdctl(&sock, &["put", "k", "v1"]), "OK\n");
    assert_eq!(etcdctl(&sock, &["get", "k", "--print-value-only"]), "v1\n");

    let (_tcp_proxy, lines) = start(
        &[
            "grpc-proxy",
            "start",
            "--endpoints",
            &member,
            "--listen-addr",
            "127.0.0.1:0",
            "--namespace",
            "app/",
        ],
        "serving etcd's API",
    );
    let tcp = lines
        .last()
        .and_then(|l| l.split_whitespace().find(|w| w.starts_with("http://")))
        .unwrap()
        .to_string();
    assert_eq!(etcdctl(&tcp, &["put", "k", "v2"]), "OK\n");
    // The namespace is the proxy's: the member holds the key under it.
    assert_eq!(
        etcdctl(&member, &["get", "app/k", "--print-value-only"]),
        "v2\n"
    );
    assert_eq!(etcdctl(&tcp, &["get", "k", "--print-value-only"]), "v2\n");
    // etcdctl 3.4 sends the endpoint's URL as the :authority of endpoint status.
    let status = etcdctl(&tcp, &["endpoint", "status"]);
    assert!(status.contains(&tcp), "{status}");
}
