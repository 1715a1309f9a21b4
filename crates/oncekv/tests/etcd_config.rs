//! `oncekv serve` configured the ways an etcd member is: ETCD_* environment variables, an
//! etcd YAML configuration file, and `--wal-dir`, each checked on a running member with
//! etcdctl.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Members, free_port, wait_serving};

/// Reads `child`'s stderr until it exits or `within` passes; the text and whether it exited.
fn stderr_of(mut child: std::process::Child, within: Duration) -> (String, Option<bool>) {
    let started = Instant::now();
    let exited = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status.success());
        }
        if started.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut text = String::new();
    if let Some(mut err) = child.stderr.take() {
        use std::io::Read;
        let _ = err.read_to_string(&mut text);
    }
    (text, exited)
}

/// Runs `command`, which must refuse to start: what it said.
fn refused(command: &mut Command) -> String {
    let child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (said, exited) = stderr_of(child, Duration::from_secs(20));
    assert_eq!(exited, Some(false), "{said}");
    said
}

fn files_in(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

// A member set up only through ETCD_* variables (etcd's names) serves, with its log in
// ETCD_WAL_DIR; restarted without its --wal-dir it refuses to start instead of starting
// with an empty log.
#[test]
fn a_member_configured_by_etcd_variables_serves_and_keeps_its_wal_dir() {
    let dir = tempfile::tempdir().unwrap();
    let (client, peer) = (free_port(), free_port());
    let (data, wal) = (dir.path().join("data"), dir.path().join("wal"));
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let member = Command::new(env!("CARGO_BIN_EXE_oncekv"))
        .arg("serve")
        .env("ETCD_NAME", "infra1")
        .env("ETCD_DATA_DIR", &data)
        .env("ETCD_WAL_DIR", &wal)
        .env("ETCD_LISTEN_CLIENT_URLS", &client_url)
        .env("ETCD_ADVERTISE_CLIENT_URLS", &client_url)
        .env("ETCD_LISTEN_PEER_URLS", &peer_url)
        .env("ETCD_INITIAL_ADVERTISE_PEER_URLS", &peer_url)
        .env("ETCD_INITIAL_CLUSTER", format!("infra1={peer_url}"))
        .env("ETCD_INITIAL_CLUSTER_STATE", "new")
        .env("ETCD_STRICT_RECONFIG_CHECK", "false")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let members = Members(vec![member]);
    wait_serving(&format!("127.0.0.1:{client}"));
    assert!(files_in(&wal) > 0, "no log in ETCD_WAL_DIR");
    assert_eq!(files_in(&data.join("log")), 0, "a log in DATA_DIR/log too");
    drop(members);

    // Without its --wal-dir the member would open an empty log beside its state.
    let said = refused(
        Command::new(env!("CARGO_BIN_EXE_oncekv"))
            .args(["serve", "--name", "infra1", "--data-dir"])
            .arg(&data)
            .args(["--listen-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("infra1={peer_url}")]),
    );
    assert!(said.contains("--wal-dir"), "{said}");

    // A flag given on the command line and in the environment is refused, as by etcd.
    let said = refused(
        Command::new(env!("CARGO_BIN_EXE_oncekv"))
            .args(["serve", "--name", "infra1"])
            .env("ETCD_NAME", "infra1"),
    );
    assert!(said.contains("\"ETCD_NAME\" is shadowed"), "{said}");
}

// A member started from an etcd YAML configuration file serves with the file's settings,
// and says that other flags are ignored; a file with a setting oncekv lacks is refused.
#[test]
fn a_member_started_from_an_etcd_configuration_file_serves() {
    let dir = tempfile::tempdir().unwrap();
    let (client, peer) = (free_port(), free_port());
    let data = dir.path().join("data");
    let file = dir.path().join("etcd.conf.yml");
    std::fs::write(
        &file,
        format!(
            "# as etcd's sample file writes it\n\
             name: 'infra1'\n\
             data-dir: {data}\n\
             wal-dir:\n\
             snapshot-count: 10000\n\
             heartbeat-interval: 100\n\
             election-timeout: 1000\n\
             listen-peer-urls: http://127.0.0.1:{peer}\n\
             listen-client-urls: http://127.0.0.1:{client}\n\
             max-snapshots: 5\n\
             max-wals: 5\n\
             cors:\n\
             initial-advertise-peer-urls: http://127.0.0.1:{peer}\n\
             advertise-client-urls: http://127.0.0.1:{client}\n\
             discovery:\n\
             discovery-fallback: 'proxy'\n\
             initial-cluster: infra1=http://127.0.0.1:{peer}\n\
             initial-cluster-token: 'etcd-cluster'\n\
             initial-cluster-state: 'new'\n\
             strict-reconfig-check: false\n\
             proxy: 'off'\n\
             proxy-dial-timeout: 1000\n\
             client-transport-security:\n  cert-file:\n  client-cert-auth: false\n  auto-tls: false\n\
             peer-transport-security:\n  client-cert-auth: false\n  auto-tls: false\n\
             log-level: info\n\
             logger: zap\n\
             log-outputs: [stderr]\n\
             force-new-cluster: false\n\
             auto-compaction-mode: periodic\n\
             auto-compaction-retention: \"1\"\n\
             grpc-keepalive-interval: 7200000000000\n\
             metrics: extensive\n",
            data = data.display()
        ),
    )
    .unwrap();
    let member = Command::new(env!("CARGO_BIN_EXE_oncekv"))
        .args(["serve", "--name", "ignored", "--config-file"])
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut members = Members(vec![member]);
    wait_serving(&format!("127.0.0.1:{client}"));
    assert!(
        files_in(&data.join("log")) > 0,
        "the file's data-dir is not used"
    );
    // metrics: extensive times the calls (etcdctl's put was one).
    let metrics = common::http_get(&format!("http://127.0.0.1:{client}/metrics"));
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("grpc_server_handling_seconds_count")
                && l.contains("grpc_method=\"Put\"")),
        "{metrics}"
    );
    let member = members.0.pop().unwrap();
    let (said, _) = stderr_of(member, Duration::ZERO);
    assert!(
        said.contains("Loading server configuration from") && said.contains("infra1"),
        "{said}"
    );

    std::fs::write(&file, "name: x\ndiscovery-srv-name: example\n").unwrap();
    let said = refused(
        Command::new(env!("CARGO_BIN_EXE_oncekv"))
            .args(["serve", "--config-file"])
            .arg(&file),
    );
    assert!(said.contains("discovery-srv-name"), "{said}");
}
