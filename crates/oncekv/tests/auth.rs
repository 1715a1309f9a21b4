//! etcd's auth on a 3-member cluster of real `oncekv serve` processes: the walk-through
//! with etcdctl (root, enable, a role limited to a prefix, users inside and outside it, a
//! wrong password), a token gone stale after a password change, the Rust client
//! re-authenticating by itself, and a session that one user registered refused to
//! another without revealing its saved reply.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, start_founders_with, wait_serving};
use oncekv_client::{Client, ClientConfig, Credentials};
use oncekv_proto::SessionMeta;
use oncekv_proto::etcdserverpb::auth_client::AuthClient;
use oncekv_proto::etcdserverpb::kv_client::KvClient;
use oncekv_proto::etcdserverpb::{AuthenticateRequest, PutRequest, RangeRequest};
use oncekv_proto::oncekv::RegisterRequest;
use oncekv_proto::oncekv::session_client::SessionClient;
use tonic::transport::Channel;

/// etcdctl against `endpoints` with `args`: stdout on success, stderr on failure.
fn etcdctl(endpoints: &str, args: &[&str]) -> Result<String, String> {
    etcdctl_with_input(endpoints, args, None)
}

fn etcdctl_with_input(
    endpoints: &str,
    args: &[&str],
    input: Option<&str>,
) -> Result<String, String> {
    let mut child = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoints}"))
        .args(["--dial-timeout=2s", "--command-timeout=5s"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(input) = input {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).to_string())
    }
}

fn ok(endpoints: &str, args: &[&str]) -> String {
    etcdctl(endpoints, args).unwrap_or_else(|e| panic!("etcdctl {args:?}: {e}"))
}

fn refused(endpoints: &str, args: &[&str], message: &str) {
    match etcdctl(endpoints, args) {
        Ok(out) => panic!("etcdctl {args:?} was served: {out}"),
        Err(e) => assert!(e.contains(message), "etcdctl {args:?}: {e}"),
    }
}

fn with_token<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("token", token.parse().unwrap());
    request
}

async fn token(channel: &Channel, name: &str, password: &str) -> Result<String, tonic::Status> {
    AuthClient::new(channel.clone())
        .authenticate(AuthenticateRequest {
            name: name.into(),
            password: password.into(),
        })
        .await
        .map(|r| r.into_inner().token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_walk_through() {
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let _members = start_founders_with(dir.path(), &ports, 3, &["--bcrypt-cost", "4"]);
    let endpoints = ports
        .iter()
        .map(|(c, _)| format!("127.0.0.1:{c}"))
        .collect::<Vec<_>>()
        .join(",");
    let e = endpoints.as_str();
    wait_serving(&format!("127.0.0.1:{}", ports[0].0));

    // Root, a role limited to app/, alice and bob inside it, carol outside; then enable.
    for args in [
        &["user", "add", "root:rootpw"][..],
        &["user", "grant-role", "root", "root"],
        &["role", "add", "app"],
        &[
            "role",
            "grant-permission",
            "app",
            "readwrite",
            "app/",
            "--prefix=true",
        ],
        &["user", "add", "alice:alicepw"],
        &["user", "grant-role", "alice", "app"],
        &["user", "add", "bob:bobpw"],
        &["user", "grant-role", "bob", "app"],
        &["user", "add", "carol:carolpw"],
        &["auth", "enable"],
    ] {
        ok(e, args);
    }

    refused(e, &["put", "x", "1"], "etcdserver: user name is empty");
    assert_eq!(
        ok(e, &["--user", "alice:alicepw", "put", "app/a", "1"]),
        "OK\n"
    );
    assert_eq!(
        ok(e, &["--user", "alice:alicepw", "get", "app/a"]),
        "app/a\n1\n"
    );
    refused(
        e,
        &["--user", "alice:alicepw", "put", "other", "1"],
        "etcdserver: permission denied",
    );
    refused(
        e,
        &["--user", "alice:alicepw", "get", "", "--prefix"],
        "etcdserver: permission denied",
    );
    refused(
        e,
        &["--user", "carol:carolpw", "get", "app/a"],
        "etcdserver: permission denied",
    );
    refused(
        e,
        &["--user", "alice:wrong", "get", "app/a"],
        "etcdserver: authentication failed, invalid user ID or password",
    );
    refused(
        e,
        &["--user", "alice:alicepw", "user", "list"],
        "etcdserver: permission denied",
    );
    // Revoking a lease deletes its keys: it needs write permission on each of them.
    let lease_id = |out: String| out.split_whitespace().nth(1).unwrap().to_string();
    let outside = lease_id(ok(e, &["--user", "root:rootpw", "lease", "grant", "60"]));
    ok(
        e,
        &[
            "--user",
            "root:rootpw",
            "put",
            "other/x",
            "1",
            "--lease",
            &outside,
        ],
    );
    refused(
        e,
        &["--user", "alice:alicepw", "lease", "revoke", &outside],
        "etcdserver: permission denied",
    );
    let inside = lease_id(ok(e, &["--user", "alice:alicepw", "lease", "grant", "60"]));
    ok(
        e,
        &[
            "--user",
            "alice:alicepw",
            "put",
            "app/leased",
            "1",
            "--lease",
            &inside,
        ],
    );
    ok(e, &["--user", "alice:alicepw", "lease", "revoke", &inside]);
    assert_eq!(ok(e, &["--user", "alice:alicepw", "get", "app/leased"]), "");
    let users = ok(e, &["--user", "root:rootpw", "user", "list"]);
    assert_eq!(users, "alice\nbob\ncarol\nroot\n");

    // A token is bound to the auth revision: after alice's password changes (on another
    // member), her old token is stale there and everywhere, and her old password fails.
    let channel = Channel::from_shared(format!("http://127.0.0.1:{}", ports[1].0))
        .unwrap()
        .connect_lazy();
    let alice = token(&channel, "alice", "alicepw").await.unwrap();
    let mut kv = KvClient::new(channel.clone());
    let read = |key: &str| RangeRequest {
        key: key.as_bytes().to_vec().into(),
        ..RangeRequest::default()
    };
    kv.range(with_token(read("app/a"), &alice)).await.unwrap();
    etcdctl_with_input(
        &format!("127.0.0.1:{}", ports[2].0),
        &[
            "--user",
            "root:rootpw",
            "user",
            "passwd",
            "alice",
            "--interactive=false",
        ],
        Some("alicepw2\n"),
    )
    .unwrap();
    let start = Instant::now();
    let stale = loop {
        match kv.range(with_token(read("app/a"), &alice)).await {
            Err(status) => break status,
            Ok(_) => {
                // The change may still be on its way to this member.
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "old token still works"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert_eq!(stale.message(), "etcdserver: revision of auth store is old");
    let old = token(&channel, "alice", "alicepw").await.unwrap_err();
    assert_eq!(
        old.message(),
        "etcdserver: authentication failed, invalid user ID or password"
    );
    let forged = format!("{alice}x");
    let bad = kv
        .range(with_token(read("app/a"), &forged))
        .await
        .unwrap_err();
    assert_eq!(bad.message(), "etcdserver: invalid auth token");

    // The Rust client: credentials, exactly-once writes, and a fresh token by itself
    // when an auth change makes its token stale.
    let config = ClientConfig {
        credentials: Some(Credentials {
            user: "alice".into(),
            password: "alicepw2".into(),
        }),
        ..ClientConfig::default()
    };
    let client = Client::connect(endpoints.split(','), config).unwrap();
    client.put("app/rust", "1").await.unwrap();
    ok(e, &["--user", "root:rootpw", "role", "add", "unrelated"]);
    client.put("app/rust", "2").await.unwrap();
    let denied = client.put("other", "1").await.unwrap_err();
    assert!(
        matches!(&denied, oncekv_client::Error::PermissionDenied(m) if m == "etcdserver: permission denied"),
        "{denied:?}"
    );

    // Sessions belong to their user. Alice registers one and writes under it; bob, who
    // may write the same keys, cannot use her session, not even to read back the saved
    // reply of her request; alice's retry gets it.
    let alice = token(&channel, "alice", "alicepw2").await.unwrap();
    let bob = token(&channel, "bob", "bobpw").await.unwrap();
    let registered = SessionClient::new(channel.clone())
        .register(with_token(RegisterRequest::default(), &alice))
        .await
        .unwrap()
        .into_inner();
    let meta = SessionMeta {
        client_id: registered.client_id,
        secret: oncekv_core::Secret(registered.secret.as_ref().try_into().unwrap()),
        seq: 1,
        first_incomplete: 1,
    };
    let put = |who: &str| {
        let mut request = with_token(
            PutRequest {
                key: "app/session".as_bytes().to_vec().into(),
                value: "alice".as_bytes().to_vec().into(),
                ..PutRequest::default()
            },
            who,
        );
        meta.attach(request.metadata_mut());
        request
    };
    let first = kv.put(put(&alice)).await.unwrap().into_inner();
    let stolen = kv.put(put(&bob)).await.unwrap_err();
    assert_eq!(stolen.code(), tonic::Code::PermissionDenied);
    assert_eq!(stolen.message(), "etcdserver: permission denied");
    let retry = kv.put(put(&alice)).await.unwrap().into_inner();
    assert_eq!(
        first.header.unwrap().revision,
        retry.header.unwrap().revision,
        "alice's retry is answered from the saved reply"
    );
    // Registering again with the same nonce as another user is refused too.
    let nonce = vec![7u8; 16];
    SessionClient::new(channel.clone())
        .register(with_token(
            RegisterRequest {
                nonce: nonce.clone().into(),
            },
            &alice,
        ))
        .await
        .unwrap();
    let again = SessionClient::new(channel.clone())
        .register(with_token(
            RegisterRequest {
                nonce: nonce.into(),
            },
            &bob,
        ))
        .await
        .unwrap_err();
    assert_eq!(again.code(), tonic::Code::PermissionDenied);

    // Disabling auth opens the cluster again.
    ok(e, &["--user", "root:rootpw", "auth", "disable"]);
    assert_eq!(ok(e, &["put", "x", "1"]), "OK\n");
}
