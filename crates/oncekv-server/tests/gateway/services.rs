//! The cluster and maintenance routes, `/v3beta`, and the lock and election services.

use super::*;

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
