//! etcd's JSON gateway with curl: put, range, txn, delete, lease grant, compaction, a
//! streaming watch, etcd's error form, an exactly-once write through the session
//! headers, etcd's documented auth flow, users and roles, the cluster and maintenance
//! routes, lease keep-alives and snapshots as streams (a keep-alive request held open
//! answered object by object), the `/v3beta` prefix, and etcd's lock and election
//! services.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;

mod auth;
mod kv;
mod services;
mod streams;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use common::{TestCluster, register};
use serde_json::{Value, json};

fn b64(s: &str) -> String {
    B64.encode(s)
}

/// `curl -s -X POST URL -d BODY [-H h]...` → (status, JSON body).
fn post(url: &str, body: &Value, headers: &[String]) -> (u16, Value) {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-s",
        "--max-time",
        "10",
        "-w",
        "\n%{http_code}",
        "-X",
        "POST",
        url,
    ])
    .args(["-d", &body.to_string()]);
    for h in headers {
        cmd.args(["-H", h]);
    }
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (
        code.trim().parse().unwrap(),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

/// `curl -s -X POST URL -d BODY` for a streaming answer → (status, one JSON value a line).
fn post_lines(url: &str, body: &str) -> (u16, Vec<Value>) {
    post_lines_for(url, body, 20)
}

/// As [`post_lines`], for a stream that stays open: what came within `secs` seconds.
fn post_lines_for(url: &str, body: &str, secs: u32) -> (u16, Vec<Value>) {
    let out = Command::new("curl")
        .args([
            "-s",
            "--max-time",
            &secs.to_string(),
            "-w",
            "\n%{http_code}",
            "-X",
            "POST",
            url,
        ])
        .args(["-d", body])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap();
    let lines = body
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (code.trim().parse().unwrap(), lines)
}

/// A `post` left running (a request that waits, such as a lock), for [`finish`].
fn spawn_post(url: &str, body: &Value) -> Child {
    Command::new("curl")
        .args([
            "-s",
            "--max-time",
            "20",
            "-w",
            "\n%{http_code}",
            "-X",
            "POST",
        ])
        .args([url, "-d", &body.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The answer of a spawned post, waited for without blocking the runtime.
async fn finish(mut child: Child) -> (u16, Value) {
    for _ in 0..300 {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (
        code.trim().parse().unwrap(),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}
