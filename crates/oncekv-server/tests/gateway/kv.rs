//! The KV, lease, watch and session routes over HTTP/JSON, with etcd's error form.

use super::*;

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
