//! `--auth-token jwt,...` side by side with a real etcd 3.4 given the same key: etcdctl
//! works the same against both, the tokens have etcd's header and claims, and each server
//! takes the other's tokens (same key, same auth revision). A member with only the public
//! key checks tokens and issues none; a key that is missing stops the start.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::{Members, free_port, serve_single, wait_serving};
use oncekv_proto::etcdserverpb::auth_client::AuthClient;
use oncekv_proto::etcdserverpb::kv_client::KvClient;
use oncekv_proto::etcdserverpb::{AuthenticateRequest, RangeRequest};

fn keys() -> String {
    format!(
        "{}/../oncekv-server/testdata/jwt",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn auth_token_flag() -> String {
    let k = keys();
    format!("jwt,pub-key={k}/rsa.pub.pem,priv-key={k}/rsa.pem,sign-method=RS256,ttl=10m")
}

fn etcdctl(endpoint: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .args(["--dial-timeout=2s", "--command-timeout=5s"])
        .args(args)
        .output()
        .unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn ok(endpoint: &str, args: &[&str]) -> String {
    etcdctl(endpoint, args).unwrap_or_else(|e| panic!("etcdctl {args:?} at {endpoint}: {e}"))
}

fn etcd_jwt(dir: &std::path::Path) -> (Members, String) {
    let (client, peer) = (free_port(), free_port());
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let child = Command::new("etcd")
        .args(["--name", "e1", "--data-dir"])
        .arg(dir.join("e1"))
        .args(["--listen-client-urls", &client_url])
        .args(["--advertise-client-urls", &client_url])
        .args(["--listen-peer-urls", &peer_url])
        .args(["--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("e1={peer_url}")])
        .args(["--auth-token", &auth_token_flag()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("etcd is not installed: run .ci/install-deps");
    let endpoint = format!("127.0.0.1:{client}");
    let start = Instant::now();
    while etcdctl(&endpoint, &["endpoint", "health"]).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "etcd never served"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (Members(vec![child]), endpoint)
}

/// Root with the root role, then auth on: the same steps on either server.
fn enable_auth(endpoint: &str) {
    ok(endpoint, &["user", "add", "root:pw"]);
    ok(endpoint, &["user", "grant-role", "root", "root"]);
    ok(endpoint, &["auth", "enable"]);
}

async fn token(endpoint: &str) -> String {
    let mut auth = AuthClient::connect(format!("http://{endpoint}"))
        .await
        .unwrap();
    auth.authenticate(AuthenticateRequest {
        name: "root".into(),
        password: "pw".into(),
    })
    .await
    .unwrap()
    .into_inner()
    .token
}

fn part(token: &str, i: usize) -> serde_json::Value {
    let b64 = token.split('.').nth(i).unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(b64).unwrap()).unwrap()
}

async fn get_with(endpoint: &str, token: &str) -> Result<(), tonic::Status> {
    let mut kv = KvClient::connect(format!("http://{endpoint}"))
        .await
        .unwrap();
    let mut request = tonic::Request::new(RangeRequest {
        key: "k".into(),
        ..Default::default()
    });
    request
        .metadata_mut()
        .insert("token", token.parse().unwrap());
    kv.range(request).await.map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_tokens_are_etcds() {
    let dir = tempfile::tempdir().unwrap();
    let (_etcd, etcd) = etcd_jwt(dir.path());
    let flag = format!("--auth-token={}", auth_token_flag());
    let (_oncekv, (client, _)) = serve_single(dir.path(), &[&flag]);
    let oncekv = format!("127.0.0.1:{client}");
    wait_serving(&oncekv);

    for endpoint in [&etcd, &oncekv] {
        enable_auth(endpoint);
        ok(endpoint, &["--user", "root:pw", "put", "k", "v"]);
        let out = ok(endpoint, &["--user", "root:pw", "get", "k"]);
        assert_eq!(out, "k\nv\n", "{endpoint}");
        let refused = etcdctl(endpoint, &["get", "k"]).unwrap_err();
        assert!(
            refused.contains("user name is empty"),
            "{endpoint}: {refused}"
        );
        let refused = etcdctl(endpoint, &["--user", "root:wrong", "get", "k"]).unwrap_err();
        assert!(
            refused.contains("authentication failed"),
            "{endpoint}: {refused}"
        );
    }

    let (theirs, ours) = (token(&etcd).await, token(&oncekv).await);
    assert_eq!(part(&ours, 0)["alg"], "RS256");
    assert_eq!(part(&theirs, 0)["alg"], "RS256");
    let (tc, oc) = (part(&theirs, 1), part(&ours, 1));
    let names = |v: &serde_json::Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(names(&oc), names(&tc));
    assert_eq!(oc["username"], "root");
    // The same auth steps leave both stores at the same auth revision...
    assert_eq!(oc["revision"], tc["revision"]);
    // ...so each server takes the other's token, and neither takes a damaged one.
    get_with(&oncekv, &theirs).await.unwrap();
    get_with(&etcd, &ours).await.unwrap();
    let damaged = format!("{}x", &ours[..ours.len() - 1]);
    let refused = get_with(&oncekv, &damaged).await.unwrap_err();
    assert!(
        refused.message().contains("invalid auth token"),
        "{refused:?}"
    );
}

#[test]
fn a_public_key_alone_issues_no_tokens_and_a_missing_key_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let k = keys();
    let flag = format!("--auth-token=jwt,pub-key={k}/rsa.pub.pem,sign-method=RS256");
    let (_oncekv, (client, _)) = serve_single(dir.path(), &[&flag]);
    let endpoint = format!("127.0.0.1:{client}");
    wait_serving(&endpoint);
    enable_auth(&endpoint);
    let refused = etcdctl(&endpoint, &["--user", "root:pw", "get", "k"]).unwrap_err();
    assert!(refused.contains("verify-only"), "{refused}");

    let out = Command::new(env!("CARGO_BIN_EXE_oncekv"))
        .args(["serve", "--data-dir"])
        .arg(dir.path().join("nokey"))
        .args(["--auth-token", "jwt,sign-method=RS256,ttl=5m"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("missing key data"), "{stderr}");
}
