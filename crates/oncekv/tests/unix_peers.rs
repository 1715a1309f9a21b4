//! etcd's `unix://` peer URLs (its TestEtcdUnixPeers): members that reach each other
//! only over unix sockets form a cluster, forward writes and agree.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};

use common::{Members, free_port, wait_serving};

#[test]
fn three_members_over_unix_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let names = ["a", "b", "c"];
    // etcd's form, relative to the members' working directory: host and port are the path.
    let socket = |n: &str| format!("unix://{n}.sock:1");
    let cluster = names
        .iter()
        .map(|n| format!("{n}={}", socket(n)))
        .collect::<Vec<_>>()
        .join(",");
    let ports: Vec<u16> = names.iter().map(|_| free_port()).collect();
    let members = Members(
        names
            .iter()
            .zip(&ports)
            .map(|(n, port)| {
                let client = format!("http://127.0.0.1:{port}");
                Command::new(env!("CARGO_BIN_EXE_oncekv"))
                    .current_dir(dir.path())
                    .args(["serve", "--name", n, "--data-dir"])
                    .arg(dir.path().join(n))
                    .args(["--listen-client-urls", &client])
                    .args(["--advertise-client-urls", &client])
                    .args(["--listen-peer-urls", &socket(n)])
                    .args(["--initial-advertise-peer-urls", &socket(n)])
                    .args(["--initial-cluster", &cluster])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect(),
    );
    let endpoint = |i: usize| format!("127.0.0.1:{}", ports[i]);
    for i in 0..3 {
        wait_serving(&endpoint(i));
    }
    let etcdctl = |i: usize, args: &[&str]| {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", endpoint(i)))
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    etcdctl(1, &["put", "over", "unix"]);
    assert_eq!(etcdctl(2, &["get", "over"]), "over\nunix\n");
    let listed = etcdctl(0, &["member", "list"]);
    for n in names {
        assert!(listed.contains(&socket(n)), "{listed}");
    }
    drop(members);
}
