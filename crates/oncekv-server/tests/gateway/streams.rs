//! Requests held open: lease keep-alives and watches answered object by object, and
//! calls waiting for a stream slot.

use super::*;

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
