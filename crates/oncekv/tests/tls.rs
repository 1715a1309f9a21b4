//! TLS on both ports with real `oncekv serve` processes, etcdctl and the Rust client:
//! a 3-member cluster whose members reach each other only with certificates from their
//! CA, etcdctl with `--cacert` working unchanged, plaintext and unverified clients
//! refused, `--client-cert-auth` requiring a client certificate, and certificates
//! re-read when their files change.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Members, free_port};
use oncekv_client::{Client, ClientConfig, ClientTlsOptions};
use oncekv_server::tls::DevPki;

/// `oncekv serve` for member `name` with https URLs and `tls` flags.
fn serve_tls(
    dir: &Path,
    name: &str,
    (client, peer): (u16, u16),
    initial_cluster: &str,
    tls: &[String],
) -> Child {
    let client_url = format!("https://127.0.0.1:{client}");
    Command::new(env!("CARGO_BIN_EXE_oncekv"))
        .args(["serve", "--name", name, "--data-dir"])
        .arg(dir.join(name))
        .args(["--listen-client-urls", &client_url])
        .args(["--advertise-client-urls", &client_url])
        .args(["--listen-peer-urls", &format!("https://127.0.0.1:{peer}")])
        .args(["--initial-cluster", initial_cluster])
        .args(tls)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// etcdctl with `args`; its output when it succeeds.
fn etcdctl(args: &[String]) -> Result<String, String> {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--dial-timeout=2s", "--command-timeout=4s"])
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    if out.status.success() {
        Ok(text)
    } else {
        Err(String::from_utf8_lossy(&out.stderr).to_string())
    }
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// Retries `put` through etcdctl until it works (the cluster electing); panics after 30 s.
fn wait_put(flags: &[String], endpoint: &str) {
    let start = Instant::now();
    loop {
        let mut args = flags.to_vec();
        args.extend(strings(&[
            &format!("--endpoints={endpoint}"),
            "put",
            "k",
            "v",
        ]));
        match etcdctl(&args) {
            Ok(_) => return,
            Err(e) => assert!(
                start.elapsed() < Duration::from_secs(30),
                "{endpoint} never served over TLS: {e}"
            ),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_speak_tls_on_both_ports() {
    let dir = tempfile::tempdir().unwrap();
    // "intruder": a certificate from the cluster's own CA, but not a member's common name.
    let pki = DevPki::create(&dir.path().join("pki"), &["intruder"]).unwrap();
    // Someone else's authority: its certificates are no good here.
    let stranger = DevPki::create(&dir.path().join("stranger"), &["mallory"]).unwrap();
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let initial = ports
        .iter()
        .enumerate()
        .map(|(i, (_, p))| format!("n{}=https://127.0.0.1:{p}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let tls: Vec<String> = [
        ("--cert-file", &pki.server_cert),
        ("--key-file", &pki.server_key),
        ("--peer-cert-file", &pki.server_cert),
        ("--peer-key-file", &pki.server_key),
        ("--peer-trusted-ca-file", &pki.ca_file),
    ]
    .iter()
    .flat_map(|(flag, file)| [flag.to_string(), path(file)])
    .chain(
        [
            "--peer-client-cert-auth",
            "--peer-cert-allowed-cn",
            "oncekv member",
        ]
        .map(String::from),
    )
    .collect();
    let _members = Members(
        ports
            .iter()
            .enumerate()
            .map(|(i, p)| serve_tls(dir.path(), &format!("n{}", i + 1), *p, &initial, &tls))
            .collect(),
    );
    let https = |i: usize| format!("https://127.0.0.1:{}", ports[i].0);
    let cacert = vec![format!("--cacert={}", path(&pki.ca_file))];

    // etcdctl with --cacert, unchanged: a write on one member, read on another (the
    // members replicated it over TLS).
    wait_put(&cacert, &https(0));
    let mut get = cacert.clone();
    get.extend([
        format!("--endpoints={}", https(2)),
        "get".into(),
        "k".into(),
    ]);
    assert_eq!(etcdctl(&get).unwrap(), "k\nv\n");
    let mut list = cacert.clone();
    list.extend([
        format!("--endpoints={}", https(1)),
        "member".into(),
        "list".into(),
    ]);
    let members = etcdctl(&list).unwrap();
    for (_, peer) in &ports {
        assert!(
            members.contains(&format!("https://127.0.0.1:{peer}")),
            "{members}"
        );
    }

    // Plaintext on the TLS port, and TLS without trusting the CA, are refused.
    let plain = etcdctl(&strings(&[
        &format!("--endpoints=http://127.0.0.1:{}", ports[0].0),
        "get",
        "k",
    ]));
    assert!(plain.is_err(), "plaintext client served: {plain:?}");
    let unverified = etcdctl(&strings(&[
        &format!("--endpoints={}", https(0)),
        "get",
        "k",
    ]));
    assert!(
        unverified.is_err(),
        "unverified client served: {unverified:?}"
    );
    let wrong_ca = etcdctl(&strings(&[
        &format!("--cacert={}", path(&stranger.ca_file)),
        &format!("--endpoints={}", https(0)),
        "get",
        "k",
    ]));
    assert!(
        wrong_ca.is_err(),
        "client trusting another CA served: {wrong_ca:?}"
    );

    // The Rust client takes the same options.
    let config = ClientConfig {
        tls: Some(ClientTlsOptions {
            ca_file: Some(pki.ca_file.clone()),
            ..ClientTlsOptions::default()
        }),
        ..ClientConfig::default()
    };
    let client = Client::connect(&[https(1), https(2)], config).unwrap();
    client.put("rust", "tls").await.unwrap();
    let got = client.get("k").await.unwrap();
    assert_eq!(got.expect("k was written").value.as_ref(), b"v");
    let no_ca = ClientConfig {
        max_retry_time: Duration::from_secs(2),
        ..ClientConfig::default()
    };
    let refused = Client::connect(&[https(1)], no_ca).unwrap().get("k").await;
    assert!(
        refused.is_err(),
        "client without the CA served: {refused:?}"
    );

    // The peer port takes no one without a certificate from the peer CA with the allowed
    // common name: a stranger with its own CA's certificate, a holder of the right CA's
    // certificate for another name, or plaintext, cannot even finish connecting.
    for options in [
        Some(ClientTlsOptions {
            cert_file: Some(pki.clients[0].1.clone()),
            key_file: Some(pki.clients[0].2.clone()),
            ca_file: Some(pki.ca_file.clone()),
            ..ClientTlsOptions::default()
        }),
        Some(ClientTlsOptions {
            cert_file: Some(stranger.clients[0].1.clone()),
            key_file: Some(stranger.clients[0].2.clone()),
            insecure_skip_verify: true,
            ..ClientTlsOptions::default()
        }),
        Some(ClientTlsOptions {
            insecure_skip_verify: true,
            ..ClientTlsOptions::default()
        }),
        None,
    ] {
        let connector = options.map(|o| oncekv_proto::net::Connector::tls(o.build().unwrap()));
        let endpoint =
            tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", ports[0].1))
                .unwrap();
        let channel = match connector {
            Some(c) => c.channel(&endpoint),
            None => endpoint.connect_lazy(),
        };
        let mut raft = oncekv_proto::oncekv::raft_client::RaftClient::new(channel);
        let reply = raft
            .vote(oncekv_proto::oncekv::RaftRequest {
                payload: bytes::Bytes::from_static(b"garbage"),
            })
            .await;
        // Refused by the transport (a failed handshake), not by the service: the peer
        // gate would have answered PermissionDenied, the raft service InvalidArgument.
        let status = reply.expect_err("a stranger's vote is refused");
        // (Plaintext may read the server's TLS alert as a broken HTTP/2 frame: Internal.)
        assert!(
            !matches!(
                status.code(),
                tonic::Code::PermissionDenied | tonic::Code::InvalidArgument
            ),
            "{status:?}"
        );
    }

    // The cluster still works after all that.
    let mut put = cacert.clone();
    put.extend([
        format!("--endpoints={}", https(2)),
        "put".into(),
        "after".into(),
        "1".into(),
    ]);
    assert_eq!(etcdctl(&put).unwrap(), "OK\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_required_and_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let first = DevPki::create(&dir.path().join("first"), &["root", "alice"]).unwrap();
    let second = DevPki::create(&dir.path().join("second"), &["root"]).unwrap();
    // The member reads its files here; the test swaps their contents under it.
    let live = dir.path().join("live");
    std::fs::create_dir_all(&live).unwrap();
    let install = |pki: &DevPki| {
        std::fs::copy(&pki.server_cert, live.join("server.pem")).unwrap();
        std::fs::copy(&pki.server_key, live.join("server-key.pem")).unwrap();
        std::fs::copy(&pki.ca_file, live.join("ca.pem")).unwrap();
    };
    install(&first);
    let ports = (free_port(), free_port());
    let tls = vec![
        format!("--cert-file={}", path(&live.join("server.pem"))),
        format!("--key-file={}", path(&live.join("server-key.pem"))),
        format!("--trusted-ca-file={}", path(&live.join("ca.pem"))),
        "--client-cert-auth".to_string(),
    ];
    let initial = format!("n1=http://127.0.0.1:{}", ports.1);
    let client_url = format!("https://127.0.0.1:{}", ports.0);
    let member = Command::new(env!("CARGO_BIN_EXE_oncekv"))
        .args(["serve", "--name", "n1", "--data-dir"])
        .arg(dir.path().join("n1"))
        .args(["--listen-client-urls", &client_url])
        .args([
            "--listen-peer-urls",
            &format!("http://127.0.0.1:{}", ports.1),
        ])
        .args(["--initial-cluster", &initial])
        .args(&tls)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _members = Members(vec![member]);
    let flags = |pki: &DevPki| {
        vec![
            format!("--cacert={}", path(&pki.ca_file)),
            format!("--cert={}", path(&pki.clients[0].1)),
            format!("--key={}", path(&pki.clients[0].2)),
        ]
    };
    wait_put(&flags(&first), &client_url);

    // With auth on, a certificate's common name is the user: "root" may do anything,
    // "alice" (no such user) nothing, and no password is asked of either.
    let run = |pki_flags: Vec<String>, args: &[&str]| {
        let mut all = pki_flags;
        all.push(format!("--endpoints={client_url}"));
        all.extend(strings(args));
        etcdctl(&all)
    };
    for args in [
        &["user", "add", "root", "--no-password"][..],
        &["user", "grant-role", "root", "root"],
        &["auth", "enable"],
    ] {
        run(flags(&first), args).unwrap();
    }
    assert_eq!(run(flags(&first), &["put", "cn", "root"]).unwrap(), "OK\n");
    let alice = vec![
        format!("--cacert={}", path(&first.ca_file)),
        format!("--cert={}", path(&first.clients[1].1)),
        format!("--key={}", path(&first.clients[1].2)),
    ];
    let denied = run(alice, &["get", "cn"]).unwrap_err();
    assert!(denied.contains("etcdserver: permission denied"), "{denied}");
    run(flags(&first), &["auth", "disable"]).unwrap();

    // Without a client certificate: refused.
    let bare = etcdctl(&strings(&[
        &format!("--cacert={}", path(&first.ca_file)),
        &format!("--endpoints={client_url}"),
        "get",
        "k",
    ]));
    assert!(
        bare.is_err(),
        "client without a certificate served: {bare:?}"
    );

    // New certificates from another CA: new connections get them, without a restart.
    install(&second);
    let mut get = flags(&second);
    get.extend([
        format!("--endpoints={client_url}"),
        "get".into(),
        "k".into(),
    ]);
    assert_eq!(etcdctl(&get).unwrap(), "k\nv\n");
    let mut old = flags(&first);
    old.extend([
        format!("--endpoints={client_url}"),
        "get".into(),
        "k".into(),
    ]);
    assert!(etcdctl(&old).is_err(), "the replaced CA still works");
}

/// Whether a TLS 1.2 handshake offering only `suite` completes with the server at `port`.
fn tls12_handshake(port: u16, suite: rustls::CipherSuite, ca: &Path) -> bool {
    let base = rustls::crypto::ring::default_provider();
    let provider = rustls::crypto::CryptoProvider {
        cipher_suites: base
            .cipher_suites
            .iter()
            .filter(|s| s.suite() == suite)
            .copied()
            .collect(),
        ..base
    };
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .with_root_certificates(oncekv_proto::tls::load_roots(ca).unwrap())
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
    let mut tcp = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    while conn.is_handshaking() {
        if conn.complete_io(&mut tcp).is_err() {
            return false;
        }
    }
    true
}

// etcd's --client-crl-file refuses a revoked client certificate (and only it), and
// --cipher-suites limits the TLS 1.2 suites offered, by Go's names.
#[test]
fn revoked_certificates_and_unlisted_cipher_suites_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pki = DevPki::create_revoking(&dir.path().join("pki"), &["alice", "mallory"], &["mallory"])
        .unwrap();
    let ports = (free_port(), free_port());
    let _member = single_tls_member(
        dir.path(),
        &pki,
        ports,
        &[
            format!("--client-crl-file={}", path(&pki.crl_file)),
            "--cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256".to_string(),
        ],
    );
    let client_url = format!("https://127.0.0.1:{}", ports.0);
    let identity = |user: usize| {
        vec![
            format!("--cacert={}", path(&pki.ca_file)),
            format!("--cert={}", path(&pki.clients[user].1)),
            format!("--key={}", path(&pki.clients[user].2)),
        ]
    };
    wait_put(&identity(0), &client_url);
    let mut revoked = identity(1);
    revoked.extend(strings(&[&format!("--endpoints={client_url}"), "get", "k"]));
    assert!(
        etcdctl(&revoked).is_err(),
        "a revoked certificate was served"
    );

    assert!(tls12_handshake(
        ports.0,
        rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        &pki.ca_file
    ));
    assert!(!tls12_handshake(
        ports.0,
        rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        &pki.ca_file
    ));
}

// etcd's --client-cert-allowed-hostname: only client certificates valid for that host
// name are served (the member certificate names localhost; alice's names no host).
#[test]
fn only_certificates_for_the_allowed_host_name_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let pki = DevPki::create(&dir.path().join("pki"), &["alice"]).unwrap();
    let ports = (free_port(), free_port());
    let _member = single_tls_member(
        dir.path(),
        &pki,
        ports,
        &strings(&[
            "--client-cert-auth=true",
            "--client-cert-allowed-hostname=localhost",
        ]),
    );
    let client_url = format!("https://127.0.0.1:{}", ports.0);
    let named = vec![
        format!("--cacert={}", path(&pki.ca_file)),
        format!("--cert={}", path(&pki.server_cert)),
        format!("--key={}", path(&pki.server_key)),
    ];
    wait_put(&named, &client_url);
    let mut alice = vec![
        format!("--cacert={}", path(&pki.ca_file)),
        format!("--cert={}", path(&pki.clients[0].1)),
        format!("--key={}", path(&pki.clients[0].2)),
    ];
    alice.extend(strings(&[&format!("--endpoints={client_url}"), "get", "k"]));
    assert!(
        etcdctl(&alice).is_err(),
        "a certificate for no host was served"
    );
}

/// A one-member cluster `n1` with TLS on both ports from `pki` (the member certificate
/// serves both, the CA trusted on both), plus `extra` flags.
fn single_tls_member(dir: &Path, pki: &DevPki, ports: (u16, u16), extra: &[String]) -> Members {
    let mut tls = vec![
        format!("--cert-file={}", path(&pki.server_cert)),
        format!("--key-file={}", path(&pki.server_key)),
        format!("--trusted-ca-file={}", path(&pki.ca_file)),
        format!("--peer-cert-file={}", path(&pki.server_cert)),
        format!("--peer-key-file={}", path(&pki.server_key)),
        format!("--peer-trusted-ca-file={}", path(&pki.ca_file)),
    ];
    tls.extend_from_slice(extra);
    let initial = format!("n1=https://127.0.0.1:{}", ports.1);
    Members(vec![serve_tls(dir, "n1", ports, &initial, &tls)])
}

// etcd's https --listen-metrics-urls: the metrics port speaks TLS with the client port's
// certificate (an http one beside it stays plaintext), and asking for https without client
// TLS stops the start.
#[test]
fn https_metrics_urls_serve_with_the_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = DevPki::create(&dir.path().join("pki"), &["alice"]).unwrap();
    let ports = (free_port(), free_port());
    let (secure, plain) = (free_port(), free_port());
    let _member = single_tls_member(
        dir.path(),
        &pki,
        ports,
        &[format!(
            "--listen-metrics-urls=https://127.0.0.1:{secure},http://127.0.0.1:{plain}"
        )],
    );
    let curl = |args: &[&str]| {
        let out = Command::new("curl")
            .args(["-s", "--max-time", "3"])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let ca = path(&pki.ca_file);
    let metrics = format!("https://localhost:{secure}/metrics");
    let start = Instant::now();
    loop {
        let (ok, body) = curl(&["--cacert", &ca, &metrics]);
        if ok && body.contains("etcd_server_has_leader") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{metrics}: {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Not plaintext, and not without trusting the CA.
    let (ok, _) = curl(&[&format!("http://127.0.0.1:{secure}/metrics")]);
    assert!(!ok, "plaintext was served on the https metrics URL");
    let (ok, _) = curl(&[&metrics]);
    assert!(!ok, "served to a client that does not trust the CA");
    let (ok, body) = curl(&[&format!("http://127.0.0.1:{plain}/health")]);
    assert!(ok && body.contains("true"), "{body}");

    let out = Command::new(env!("CARGO_BIN_EXE_oncekv"))
        .args(["serve", "--data-dir"])
        .arg(dir.path().join("plain"))
        .args([
            "--listen-metrics-urls",
            &format!("https://127.0.0.1:{}", free_port()),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("needs the client port's TLS"), "{stderr}");
}
