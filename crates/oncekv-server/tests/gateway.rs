//! etcd's JSON gateway with curl: put, range, txn, delete, lease grant, compaction, a
//! streaming watch, etcd's error form, an exactly-once write through the session
//! headers, etcd's documented auth flow, users and roles, the cluster and maintenance
//! routes, lease keep-alives and snapshots as streams (a keep-alive request held open
//! answered object by object), the `/v3beta` prefix, and etcd's lock and election
//! services.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_v3_api_over_http_json() {
    let cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let base = cluster.endpoint((leader + 1) % 3);
    let at = |path: &str| format!("{base}{path}");

    let (status, put) = post(
        &at("/v3/kv/put"),
        &json!({"key": b64("foo"), "value": b64("bar")}),
        &[],
    );
    assert_eq!(status, 200, "{put}");
    let revision = put["header"]["revision"].as_str().unwrap().to_string();
    assert!(
        put["header"]["cluster_id"].is_string(),
        "64-bit ints as strings: {put}"
    );

    let (status, got) = post(&at("/v3/kv/range"), &json!({"key": b64("foo")}), &[]);
    assert_eq!(status, 200);
    assert_eq!(got["count"], "1");
    assert_eq!(got["kvs"][0]["key"], b64("foo"));
    assert_eq!(got["kvs"][0]["value"], b64("bar"));
    assert_eq!(got["kvs"][0]["create_revision"], revision);
    assert_eq!(got["kvs"][0]["version"], "1");
    assert!(
        got["kvs"][0].get("lease").is_none(),
        "zero fields are left out"
    );

    let txn = json!({
        "compare": [{"target": "VALUE", "key": b64("foo"), "result": "EQUAL", "value": b64("bar")}],
        "success": [{"request_put": {"key": b64("foo"), "value": b64("baz")}}],
        "failure": [{"request_range": {"key": b64("foo")}}],
    });
    let (status, t) = post(&at("/v3/kv/txn"), &txn, &[]);
    assert_eq!(status, 200, "{t}");
    assert_eq!(t["succeeded"], true);
    assert!(t["responses"][0]["response_put"].is_object(), "{t}");
    let (_, t) = post(&at("/v3/kv/txn"), &txn, &[]);
    assert!(t.get("succeeded").is_none(), "failed compare: {t}");
    assert_eq!(
        t["responses"][0]["response_range"]["kvs"][0]["value"],
        b64("baz")
    );

    let (status, lease) = post(&at("/v3/lease/grant"), &json!({"TTL": 30}), &[]);
    assert_eq!(status, 200, "{lease}");
    assert_eq!(lease["TTL"], "30");
    let id = lease["ID"].as_str().unwrap().to_string();
    let (status, _) = post(
        &at("/v3/kv/put"),
        &json!({"key": b64("leased"), "value": b64("x"), "lease": id}),
        &[],
    );
    assert_eq!(status, 200);
    let (status, ttl) = post(
        &at("/v3/lease/timetolive"),
        &json!({"ID": id, "keys": true}),
        &[],
    );
    assert_eq!(status, 200, "{ttl}");
    assert_eq!(ttl["keys"][0], b64("leased"));

    // A streaming watch: created, then the events of a put made meanwhile.
    let mut watcher = Command::new("curl")
        .args([
            "-s",
            "-N",
            "--max-time",
            "20",
            "-X",
            "POST",
            &at("/v3/watch"),
        ])
        .args([
            "-d",
            &json!({"create_request": {"key": b64("w")}}).to_string(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watcher.stdout.take().unwrap()).lines();
    let created: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(created["result"]["created"], true, "{created}");
    post(
        &at("/v3/kv/put"),
        &json!({"key": b64("w"), "value": b64("1")}),
        &[],
    );
    let event: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(
        event["result"]["events"][0]["kv"]["value"],
        b64("1"),
        "{event}"
    );
    let _ = watcher.kill();
    let _ = watcher.wait();

    let (status, del) = post(&at("/v3/kv/deleterange"), &json!({"key": b64("foo")}), &[]);
    assert_eq!((status, del["deleted"].clone()), (200, json!("1")));
    let head = del["header"]["revision"].as_str().unwrap().to_string();
    let (status, c) = post(&at("/v3/kv/compaction"), &json!({"revision": head}), &[]);
    assert_eq!(status, 200, "{c}");

    // etcd's error form and status codes.
    let (status, e) = post(&at("/v3/kv/compaction"), &json!({"revision": "1"}), &[]);
    assert_eq!(status, 400, "{e}");
    assert_eq!(
        e["error"],
        "etcdserver: mvcc: required revision has been compacted"
    );
    assert_eq!(e["code"], 11);
    let (status, e) = post(&at("/v3/kv/put"), &json!({"key": "not base64!"}), &[]);
    assert_eq!(status, 400, "{e}");
    assert!(e["message"].as_str().unwrap().contains("not base64"));
    let (status, _) = post(&at("/v3/kv/put"), &json!("oops"), &[]);
    assert_eq!(status, 400);

    // Exactly once through the session headers: the retry gets the first revision.
    let session = register(&base).await;
    let headers = vec![
        format!("oncekv-client-id: {}", session.0),
        format!("oncekv-session-secret: {}", session.1),
        "oncekv-seq: 1".to_string(),
        "oncekv-first-incomplete: 1".to_string(),
    ];
    let body = json!({"key": b64("once"), "value": b64("1")});
    let (_, first) = post(&at("/v3/kv/put"), &body, &headers);
    let (_, retry) = post(&at("/v3/kv/put"), &body, &headers);
    assert_eq!(first["header"]["revision"], retry["header"]["revision"]);
    let (_, got) = post(&at("/v3/kv/range"), &json!({"key": b64("once")}), &[]);
    assert_eq!(got["kvs"][0]["version"], "1", "applied once: {got}");
    cluster.inner.shutdown().await;
}

// With auth on, a JSON client logs in at /v3/auth/authenticate and sends the token in
// `Authorization`, as with etcd's gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authenticate_over_http_json_gives_a_token_for_later_requests() {
    use oncekv_server::pb::etcdserverpb::AuthEnableRequest;
    use oncekv_server::pb::etcdserverpb::auth_client::AuthClient;

    let cluster = TestCluster::start(3, |c| c.bcrypt_cost = 4).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let base = cluster.endpoint(leader);
    let at = |path: &str| format!("{base}{path}");
    let (status, before) = post(&at("/v3/auth/status"), &json!({}), &[]);
    assert_eq!((status, before.get("enabled")), (200, None), "{before}");

    let mut auth = AuthClient::connect(base.clone()).await.unwrap();
    oncekv_testkit::auth::add_user_with_role(&mut auth, "root", "secret", "root")
        .await
        .unwrap();
    auth.auth_enable(AuthEnableRequest {}).await.unwrap();

    let (status, wrong) = post(
        &at("/v3/auth/authenticate"),
        &json!({"name": "root", "password": "nope"}),
        &[],
    );
    assert_eq!(status, 400, "{wrong}");
    assert!(
        wrong["message"]
            .as_str()
            .unwrap()
            .contains("authentication failed"),
        "{wrong}"
    );
    let (status, login) = post(
        &at("/v3/auth/authenticate"),
        &json!({"name": "root", "password": "secret"}),
        &[],
    );
    assert_eq!(status, 200, "{login}");
    let token = login["token"].as_str().unwrap().to_string();

    let put = json!({"key": b64("k"), "value": b64("v")});
    let (status, refused) = post(&at("/v3/kv/put"), &put, &[]);
    assert_ne!(status, 200, "a put without the token: {refused}");
    let (status, done) = post(
        &at("/v3/kv/put"),
        &put,
        &[format!("Authorization: {token}")],
    );
    assert_eq!(status, 200, "{done}");
    let (status, after) = post(
        &at("/v3/auth/status"),
        &json!({}),
        &[format!("Authorization: {token}")],
    );
    assert_eq!(
        (status, after["enabled"].as_bool()),
        (200, Some(true)),
        "{after}"
    );
}

// etcd's documented curl flow for auth (etcd.io, "gRPC gateway", authentication), word
// for word: add root, give it the root role, enable auth, log in, put with the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_documented_auth_flow_over_http_json() {
    let cluster = TestCluster::start(3, |c| c.bcrypt_cost = 4).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let base = cluster.endpoint((leader + 1) % 3);
    let at = |path: &str| format!("{base}{path}");
    let ok = |path: &str, body: Value, headers: &[String]| {
        let (status, v) = post(&at(path), &body, headers);
        assert_eq!(status, 200, "{path}: {v}");
        v
    };

    let added = ok(
        "/v3/auth/user/add",
        json!({"name": "root", "password": "pass"}),
        &[],
    );
    assert!(added["header"]["revision"].is_string(), "{added}");
    ok("/v3/auth/role/add", json!({"name": "root"}), &[]);
    ok(
        "/v3/auth/user/grant",
        json!({"user": "root", "role": "root"}),
        &[],
    );
    ok("/v3/auth/enable", json!({}), &[]);
    let login = ok(
        "/v3/auth/authenticate",
        json!({"name": "root", "password": "pass"}),
        &[],
    );
    let token = vec![format!(
        "Authorization: {}",
        login["token"].as_str().unwrap()
    )];

    let put = json!({"key": "Zm9v", "value": "YmFy"});
    let done = ok("/v3/kv/put", put.clone(), &token);
    assert!(done["header"]["revision"].is_string(), "{done}");
    // As etcd: no token is an anonymous request, refused for want of a user name.
    let (status, refused) = post(&at("/v3/kv/put"), &put, &[]);
    assert_eq!(
        (status, &refused["code"], &refused["error"]),
        (400, &json!(3), &json!("etcdserver: user name is empty")),
        "{refused}"
    );
    let (status, refused) = post(&at("/v3/auth/disable"), &json!({}), &[]);
    assert_ne!(status, 200, "disabling takes root: {refused}");

    ok("/v3/auth/disable", json!({}), &token);
    let after = ok("/v3/auth/status", json!({}), &[]);
    assert!(after.get("enabled").is_none(), "{after}");
    ok("/v3/kv/put", put, &[]);
    cluster.inner.shutdown().await;
}

// Users and roles as etcd's gateway writes them (field names, enum names, zero values
// left out), and its error codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_and_roles_over_http_json() {
    let cluster = TestCluster::start(3, |c| c.bcrypt_cost = 4).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let base = cluster.endpoint(leader);
    let at = |path: &str| format!("{base}{path}");
    let ok = |path: &str, body: Value, headers: &[String]| {
        let (status, v) = post(&at(path), &body, headers);
        assert_eq!(status, 200, "{path}: {v}");
        v
    };
    let refused = |path: &str, body: Value, headers: &[String]| {
        let (status, v) = post(&at(path), &body, headers);
        (status, v["code"].clone(), v["error"].clone())
    };

    for name in ["root", "bob"] {
        ok(
            "/v3/auth/user/add",
            json!({"name": name, "password": "pass"}),
            &[],
        );
    }
    assert_eq!(
        refused(
            "/v3/auth/user/add",
            json!({"name": "bob", "password": "pass"}),
            &[]
        ),
        (412, json!(9), json!("etcdserver: user name already exists"))
    );
    let (status, e) = post(
        &at("/v3/auth/user/add"),
        &json!({"name": "x", "password": 5}),
        &[],
    );
    assert_eq!((status, &e["code"]), (400, &json!(3)), "{e}");
    ok("/v3/auth/role/add", json!({"name": "root"}), &[]);
    ok("/v3/auth/role/add", json!({"name": "reader"}), &[]);
    for perm in [
        json!({"permType": "READ", "key": b64("a"), "range_end": b64("b")}),
        json!({"permType": "WRITE", "key": b64("c")}),
        json!({"permType": 2, "key": b64("d")}),
    ] {
        ok(
            "/v3/auth/role/grant",
            json!({"name": "reader", "perm": perm}),
            &[],
        );
    }
    let role = ok("/v3/auth/role/get", json!({"role": "reader"}), &[]);
    assert_eq!(
        role["perm"],
        json!([
            {"key": b64("a"), "range_end": b64("b")},
            {"permType": "WRITE", "key": b64("c")},
            {"permType": "READWRITE", "key": b64("d")},
        ]),
        "READ is the zero value, left out: {role}"
    );
    assert!(role["header"]["cluster_id"].is_string(), "{role}");
    assert_eq!(
        refused("/v3/auth/role/get", json!({"role": "nope"}), &[]),
        (412, json!(9), json!("etcdserver: role name not found"))
    );

    ok(
        "/v3/auth/user/grant",
        json!({"user": "bob", "role": "reader"}),
        &[],
    );
    let bob = ok("/v3/auth/user/get", json!({"name": "bob"}), &[]);
    assert_eq!(bob["roles"], json!(["reader"]), "{bob}");
    assert_eq!(
        refused("/v3/auth/user/get", json!({"name": "nobody"}), &[]),
        (412, json!(9), json!("etcdserver: user name not found"))
    );
    let users = ok("/v3/auth/user/list", json!({}), &[]);
    assert_eq!(users["users"], json!(["bob", "root"]), "{users}");
    let roles = ok("/v3/auth/role/list", json!({}), &[]);
    assert_eq!(roles["roles"], json!(["reader", "root"]), "{roles}");

    // A changed password, tried with auth on.
    ok(
        "/v3/auth/user/changepw",
        json!({"name": "bob", "password": "new"}),
        &[],
    );
    ok(
        "/v3/auth/user/grant",
        json!({"user": "root", "role": "root"}),
        &[],
    );
    ok("/v3/auth/enable", json!({}), &[]);
    let (status, _) = post(
        &at("/v3/auth/authenticate"),
        &json!({"name": "bob", "password": "pass"}),
        &[],
    );
    assert_eq!(status, 400, "the old password");
    let login = ok(
        "/v3/auth/authenticate",
        json!({"name": "bob", "password": "new"}),
        &[],
    );
    let bob_token = vec![format!(
        "Authorization: {}",
        login["token"].as_str().unwrap()
    )];
    let bob = ok("/v3/auth/user/get", json!({"name": "bob"}), &bob_token);
    assert_eq!(
        bob["roles"],
        json!(["reader"]),
        "a user reads its own roles"
    );
    let (status, _, _) = refused("/v3/auth/user/list", json!({}), &bob_token);
    assert_ne!(status, 200, "listing users takes root");
    let login = ok(
        "/v3/auth/authenticate",
        json!({"name": "root", "password": "pass"}),
        &[],
    );
    let root = vec![format!(
        "Authorization: {}",
        login["token"].as_str().unwrap()
    )];
    ok("/v3/auth/disable", json!({}), &root);

    ok(
        "/v3/auth/user/revoke",
        json!({"name": "bob", "role": "reader"}),
        &[],
    );
    let bob = ok("/v3/auth/user/get", json!({"name": "bob"}), &[]);
    assert!(bob.get("roles").is_none(), "{bob}");
    ok(
        "/v3/auth/role/revoke",
        json!({"role": "reader", "key": b64("a"), "range_end": b64("b")}),
        &[],
    );
    let role = ok("/v3/auth/role/get", json!({"role": "reader"}), &[]);
    assert_eq!(role["perm"].as_array().unwrap().len(), 2, "{role}");
    ok("/v3/auth/role/delete", json!({"role": "reader"}), &[]);
    let roles = ok("/v3/auth/role/list", json!({}), &[]);
    assert_eq!(roles["roles"], json!(["root"]), "{roles}");
    ok("/v3/auth/user/delete", json!({"name": "bob"}), &[]);
    let users = ok("/v3/auth/user/list", json!({}), &[]);
    assert_eq!(users["users"], json!(["root"]), "{users}");
    cluster.inner.shutdown().await;
}

// The `/v3beta` prefix, the cluster and maintenance routes, and the streaming lease
// keep-alive and snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_maintenance_keepalive_and_v3beta_over_http_json() {
    let cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let base = cluster.endpoint(leader);
    let at = |path: &str| format!("{base}{path}");
    let ok = |path: &str, body: Value| {
        let (status, v) = post(&at(path), &body, &[]);
        assert_eq!(status, 200, "{path}: {v}");
        v
    };

    ok(
        "/v3beta/kv/put",
        json!({"key": b64("beta"), "value": b64("1")}),
    );
    let got = ok("/v3beta/kv/range", json!({"key": b64("beta")}));
    assert_eq!(got["kvs"][0]["value"], b64("1"), "{got}");
    let (status, _) = post(&at("/v3alpha/kv/range"), &json!({"key": b64("beta")}), &[]);
    assert_eq!(status, 404, "etcd 3.4 has no /v3alpha");

    let alarms = ok("/v3/maintenance/alarm", json!({"action": "GET"}));
    assert!(alarms.get("alarms").is_none(), "{alarms}");
    let hash = ok("/v3/maintenance/hash", json!({}));
    assert!(
        hash["hash"].as_u64().unwrap() > 0,
        "a uint32 is a number: {hash}"
    );
    let hash_kv = ok("/v3/maintenance/hashkv", json!({}));
    assert!(hash_kv["hash"].as_u64().unwrap() > 0, "{hash_kv}");
    assert_eq!(hash_kv["header"]["revision"], got["header"]["revision"]);
    let defragmented = ok("/v3/maintenance/defragment", json!({}));
    assert_eq!(defragmented, json!({}), "no header, as etcd");
    let (status, e) = post(&at("/v3/maintenance/alarm"), &json!({"action": "NAP"}), &[]);
    assert_eq!(status, 400, "{e}");

    let added = ok(
        "/v3/cluster/member/add",
        json!({"peerURLs": ["http://127.0.0.1:9"], "isLearner": true}),
    );
    let learner = &added["member"];
    assert_eq!(
        learner["peerURLs"],
        json!(["http://127.0.0.1:9"]),
        "{added}"
    );
    assert_eq!(learner["isLearner"], true, "{added}");
    let id = learner["ID"].as_str().unwrap().to_string();
    assert_eq!(added["members"].as_array().unwrap().len(), 4, "{added}");
    let ids = |v: &Value| -> Vec<String> {
        v["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["ID"].as_str().unwrap().to_string())
            .collect()
    };
    let listed = ok("/v3/cluster/member/list", json!({}));
    assert!(ids(&listed).contains(&id), "{listed}");
    let removed = ok("/v3/cluster/member/remove", json!({"ID": id}));
    assert!(!ids(&removed).contains(&id), "{removed}");
    let listed = ok("/v3/cluster/member/list", json!({}));
    assert_eq!(ids(&listed).len(), 3, "{listed}");

    // Keep-alives: one line per request object in the body.
    let lease = ok("/v3/lease/grant", json!({"TTL": 30}));
    let lease_id = lease["ID"].as_str().unwrap().to_string();
    let (status, lines) = post_lines(
        &at("/v3/lease/keepalive"),
        &format!(r#"{{"ID": "{lease_id}"}} {{"ID": {lease_id}}}"#),
    );
    assert_eq!((status, lines.len()), (200, 2), "{lines:?}");
    for line in &lines {
        assert_eq!(line["result"]["ID"], lease_id, "{line}");
        assert_eq!(line["result"]["TTL"], "30", "{line}");
    }
    let (_, gone) = post_lines(&at("/v3beta/lease/keepalive"), r#"{"ID": "12345"}"#);
    assert!(gone[0]["result"].get("TTL").is_none(), "{gone:?}");
    let (status, bad) = post_lines(&at("/v3/lease/keepalive"), r#"{"ID": "x"}"#);
    assert_eq!((status, &bad[0]["code"]), (400, &json!(3)), "{bad:?}");
    // Nothing to keep alive: an empty answer (the server once panicked here).
    let (status, none) = post_lines(&at("/v3/lease/keepalive"), "");
    assert_eq!((status, none.len()), (200, 0), "{none:?}");
    // A bad object after a good one: its answer, then one error line that ends it.
    let (status, cut) = post_lines(
        &at("/v3/lease/keepalive"),
        &format!(r#"{{"ID": "{lease_id}"}} garbage {{"ID": "{lease_id}"}}"#),
    );
    assert_eq!((status, cut.len()), (200, 2), "{cut:?}");
    assert_eq!(cut[0]["result"]["ID"], lease_id, "{cut:?}");
    assert_eq!(cut[1]["error"]["grpc_code"], 3, "{cut:?}");
    // An object far longer than a keep-alive needs is refused, not buffered on.
    let padded = format!(r#"{{"ID": "{lease_id}", "pad": "{}"}}"#, "x".repeat(5000));
    let (status, long) = post_lines(&at("/v3/lease/keepalive"), &padded);
    assert_eq!((status, &long[0]["code"]), (400, &json!(3)), "{long:?}");

    // A snapshot: chunks that add up, the last with no bytes remaining.
    let (status, chunks) = post_lines(&at("/v3/maintenance/snapshot"), "{}");
    assert_eq!(status, 200);
    let blobs: Vec<Vec<u8>> = chunks
        .iter()
        .map(|c| B64.decode(c["result"]["blob"].as_str().unwrap()).unwrap())
        .collect();
    let total: usize = blobs.iter().map(Vec::len).sum();
    let first: u64 = chunks[0]["result"]
        .get("remaining_bytes")
        .map_or(0, |r| r.as_str().unwrap().parse().unwrap());
    assert_eq!(
        first as usize,
        total - blobs[0].len(),
        "{}",
        chunks[0]["result"]["header"]
    );
    assert!(
        chunks.last().unwrap()["result"]
            .get("remaining_bytes")
            .is_none()
    );

    // Leadership handed to another member.
    let status = ok("/v3/maintenance/status", json!({}));
    let other = listed["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["ID"].as_str().unwrap().to_string())
        .find(|m| *m != status["leader"])
        .unwrap();
    let moved = ok(
        "/v3/maintenance/transfer-leadership",
        json!({"targetID": other}),
    );
    assert_eq!(moved, json!({}), "{moved}");
    cluster.inner.shutdown().await;
}

// etcd's v3lock and v3election services (`/v3/lock/...`, `/v3/election/...`), with the
// field names a real etcd 3.4 answers, through a follower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_election_over_http_json() {
    let cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let base = cluster.endpoint((leader + 1) % 3);
    let at = |path: &str| format!("{base}{path}");
    let ok = |path: &str, body: Value| {
        let (status, v) = post(&at(path), &body, &[]);
        assert_eq!(status, 200, "{path}: {v}");
        v
    };
    let lease = || {
        let granted = ok("/v3/lease/grant", json!({"TTL": 60}));
        granted["ID"].as_str().unwrap().to_string()
    };
    let (first_lease, second_lease) = (lease(), lease());
    let hex = |id: &str| format!("{:x}", id.parse::<i64>().unwrap());

    // A lock is `name/<lease in hex>`; a second waits until the first is unlocked.
    let first = ok(
        "/v3/lock/lock",
        json!({"name": b64("mylock"), "lease": first_lease}),
    );
    assert_eq!(first["key"], b64(&format!("mylock/{}", hex(&first_lease))));
    assert!(first["header"]["revision"].is_string(), "{first}");
    let mut waiting = spawn_post(
        &at("/v3/lock/lock"),
        &json!({"name": b64("mylock"), "lease": second_lease}),
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(
        waiting.try_wait().unwrap().is_none(),
        "the second lock waits"
    );
    let unlocked = ok("/v3/lock/unlock", json!({"key": first["key"]}));
    assert!(unlocked["header"].is_object(), "{unlocked}");
    let (status, second) = finish(waiting).await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(
        second["key"],
        b64(&format!("mylock/{}", hex(&second_lease)))
    );
    ok("/v3/lock/unlock", json!({"key": second["key"]}));

    // Campaign, leader, proclaim, observe, resign.
    let campaign = ok(
        "/v3/election/campaign",
        json!({"name": b64("ele"), "lease": first_lease, "value": b64("v1")}),
    );
    let me = campaign["leader"].clone();
    assert_eq!(me["name"], b64("ele"), "{campaign}");
    assert_eq!(me["key"], b64(&format!("ele/{}", hex(&first_lease))));
    assert_eq!(me["lease"], first_lease.as_str(), "{campaign}");
    assert!(me["rev"].is_string(), "{campaign}");
    let led = ok("/v3/election/leader", json!({"name": b64("ele")}));
    assert_eq!(led["kv"]["key"], me["key"], "{led}");
    assert_eq!(led["kv"]["value"], b64("v1"), "{led}");
    assert_eq!(led["kv"]["create_revision"], me["rev"], "{led}");
    assert_eq!(led["kv"]["lease"], first_lease.as_str(), "{led}");
    assert!(led["header"]["revision"].is_string(), "{led}");

    let proclaimed = ok(
        "/v3/election/proclaim",
        json!({"leader": me, "value": b64("v2")}),
    );
    assert!(proclaimed["header"].is_object(), "{proclaimed}");
    let led = ok("/v3/election/leader", json!({"name": b64("ele")}));
    assert_eq!(
        (&led["kv"]["value"], &led["kv"]["version"]),
        (&json!(b64("v2")), &json!("2")),
        "{led}"
    );
    let (status, observed) = post_lines_for(
        &at("/v3/election/observe"),
        &json!({"name": b64("ele")}).to_string(),
        2,
    );
    assert_eq!(status, 200);
    let current = &observed[0]["result"];
    assert_eq!(current["kv"]["key"], me["key"], "{observed:?}");
    assert_eq!(current["kv"]["value"], b64("v2"), "{observed:?}");
    assert!(current["header"]["revision"].is_string(), "{observed:?}");

    let (status, bad) = post(
        &at("/v3/election/proclaim"),
        &json!({"leader": "me", "value": b64("x")}),
        &[],
    );
    assert_eq!((status, &bad["code"]), (400, &json!(3)), "{bad}");
    let resigned = ok("/v3/election/resign", json!({"leader": me}));
    assert!(resigned["header"].is_object(), "{resigned}");
    // etcd's errors for these are plain ones: gRPC Unknown, HTTP 500.
    let (status, none) = post(
        &at("/v3/election/leader"),
        &json!({"name": b64("ele")}),
        &[],
    );
    assert_eq!(
        (status, &none["code"], &none["error"]),
        (500, &json!(2), &json!("election: no leader")),
        "{none}"
    );
    let (status, stale) = post(
        &at("/v3/election/proclaim"),
        &json!({"leader": me, "value": b64("v3")}),
        &[],
    );
    assert_eq!(
        (status, &stale["error"]),
        (500, &json!("election: not leader")),
        "{stale}"
    );

    let beta = ok(
        "/v3beta/lock/lock",
        json!({"name": b64("beta"), "lease": second_lease}),
    );
    assert_eq!(beta["key"], b64(&format!("beta/{}", hex(&second_lease))));
    ok("/v3beta/lock/unlock", json!({"key": beta["key"]}));
    cluster.inner.shutdown().await;
}

/// A POST with a chunked body held open, spoken as raw HTTP/1.1 so that nothing between
/// the test and the server (curl reads a piped body in whole buffers) holds a chunk back.
struct HeldOpen {
    conn: tokio::net::TcpStream,
    /// Everything the server has answered so far, headers included.
    answered: String,
}

impl HeldOpen {
    async fn post(base: &str, path: &str) -> HeldOpen {
        use tokio::io::AsyncWriteExt;
        let addr = base.trim_start_matches("http://").to_string();
        let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
        conn.write_all(
            format!(
                "POST {path} HTTP/1.1\r\nHost: {addr}\r\n\
                 Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        HeldOpen {
            conn,
            answered: String::new(),
        }
    }

    /// Sends one chunk of the body ("" ends the body).
    async fn send(&mut self, text: &str) {
        use tokio::io::AsyncWriteExt;
        let chunk = format!("{:x}\r\n{text}\r\n", text.len());
        self.conn.write_all(chunk.as_bytes()).await.unwrap();
    }

    /// Reads until `pattern` occurs `count` times in the answer, with the body still open.
    async fn read_until(&mut self, pattern: &str, count: usize) {
        use tokio::io::AsyncReadExt;
        let read = tokio::time::timeout(Duration::from_secs(10), async {
            let mut buf = [0u8; 4096];
            while self.answered.matches(pattern).count() < count {
                let n = self.conn.read(&mut buf).await.unwrap();
                if n == 0 {
                    return false;
                }
                self.answered.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
            true
        })
        .await;
        assert!(
            read == Ok(true),
            "{pattern:?} not seen {count} times while the request was open: {:?}",
            self.answered
        );
    }
}

// One keep-alive request held open: each object is answered as soon as it comes, before
// the next is written, as etcd's gateway answers a client that keeps its lease alive over
// one request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_request_held_open_is_answered_object_by_object() {
    let cluster = TestCluster::start(1, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let base = cluster.endpoint(leader);
    let (status, lease) = post(&format!("{base}/v3/lease/grant"), &json!({"TTL": 30}), &[]);
    assert_eq!(status, 200, "{lease}");
    let id = lease["ID"].as_str().unwrap().to_string();

    let mut held = HeldOpen::post(&base, "/v3/lease/keepalive").await;
    for round in 1..=2 {
        held.send(&format!("{{\"ID\": \"{id}\"}}\n")).await;
        held.read_until("\"TTL\"", round).await;
    }
    let answered = &held.answered;
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
    assert_eq!(
        answered.matches(&format!("\"ID\":\"{id}\"")).count(),
        2,
        "{answered}"
    );
    held.send("").await;
}

// One watch request held open, as etcd's gateway serves it: a watch is created, sees a
// put, a second is created and the first canceled with later objects of the same body,
// and a malformed object ends the stream with an error line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_request_held_open_takes_creates_and_cancels_as_they_come() {
    let cluster = TestCluster::start(1, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let base = cluster.endpoint(leader);
    let put = |key: &str| {
        let url = format!("{base}/v3/kv/put");
        let body = json!({"key": b64(key), "value": b64("v")});
        async move {
            let (status, out) = tokio::task::spawn_blocking(move || post(&url, &body, &[]))
                .await
                .unwrap();
            assert_eq!(status, 200, "{out}");
        }
    };

    let mut held = HeldOpen::post(&base, "/v3/watch").await;
    let create = |key: &str, id: u32| {
        format!(
            r#"{{"create_request": {{"key": "{}", "watch_id": {id}}}}}"#,
            b64(key)
        )
    };
    held.send(&create("first", 5)).await;
    held.read_until("\"created\":true", 1).await;
    put("first").await;
    held.read_until(&format!("\"key\":\"{}\"", b64("first")), 1)
        .await;

    held.send(&create("second", 6)).await;
    held.read_until("\"created\":true", 2).await;
    held.send(r#"{"cancel_request": {"watch_id": "5"}}"#).await;
    held.read_until("\"canceled\":true", 1).await;
    put("second").await;
    held.read_until(&format!("\"key\":\"{}\"", b64("second")), 1)
        .await;

    held.send(r#"{"delete_request": {}}"#).await;
    held.read_until("\"error\"", 1).await;
    let answered = &held.answered;
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
    assert!(answered.contains("cancel_request"), "{answered}");
    // The canceled watch saw none of the later put: "first" appears once as a key.
    assert_eq!(answered.matches(&b64("first")).count(), 1, "{answered}");
    cluster.inner.shutdown().await;
}

// etcd's --max-concurrent-streams as its gateway shows it (TestV3Curl_MaxStreams_*): with
// every slot held by an open watch, a range waits; once a watch ends, it goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_calls_wait_for_a_stream_slot() {
    let cluster = TestCluster::start(1, |c| c.max_concurrent_streams = 2).await;
    cluster.wait_leader(Duration::from_secs(10)).await;
    let base = cluster.endpoint(0);
    let at = |path: &str| format!("{base}{path}");
    let watch = json!({"create_request": {"key": b64("foo")}});
    let mut watchers: Vec<Child> = (0..2)
        .map(|_| spawn_post(&at("/v3/watch"), &watch))
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let range = json!({"key": b64("foo")});
    let waited = tokio::task::spawn_blocking({
        let url = at("/v3/kv/range");
        let range = range.clone();
        move || {
            Command::new("curl")
                .args(["-s", "--max-time", "2", "-X", "POST", &url, "-d"])
                .arg(range.to_string())
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    // curl's exit status 28: the operation timed out.
    assert_eq!(waited.status.code(), Some(28), "{waited:?}");
    let mut ended = watchers.pop().unwrap();
    ended.kill().unwrap();
    ended.wait().unwrap();
    let url = at("/v3/kv/range");
    let (status, answer) = tokio::task::spawn_blocking(move || post(&url, &range, &[]))
        .await
        .unwrap();
    assert_eq!(status, 200, "{answer}");
    assert!(answer["header"]["revision"].is_string(), "{answer}");
    for mut w in watchers {
        let _ = w.kill();
        let _ = w.wait();
    }
}
