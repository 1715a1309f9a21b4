//! A new user's first screen: a clean start of a 3-member cluster logs no WARN or ERROR
//! line, and says who was elected, at INFO, as etcd does.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn a_clean_start_logs_no_warning_and_names_the_leader() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_oncekv"))
        .args(["dev", "--data-dir"])
        .arg(dir.path())
        .env_remove("ONCEKV_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let stdout = BufReader::new(child.stdout.take().unwrap());
    for line in stdout.lines() {
        if line.unwrap().contains("ctrl-c stops") {
            break;
        }
    }
    // Followers learn of the leader a heartbeat or so later; let them.
    std::thread::sleep(Duration::from_secs(2));
    child.kill().unwrap();
    let _ = child.wait();
    let log = log.join().unwrap();
    let noisy: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    assert!(
        noisy.is_empty(),
        "a clean start logged:\n{}",
        noisy.join("\n")
    );
    let elected = log.lines().filter(|l| l.contains("elected leader")).count();
    // At least once per member (a split vote would make a second election).
    assert!(elected >= 3, "each member should log the election:\n{log}");
}
