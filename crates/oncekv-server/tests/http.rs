//! The HTTP routes beside gRPC on the client port, asked with curl as an operator would:
//! `/metrics` (Prometheus text, etcd's names), `/health`, `/livez`, `/readyz`, `/version`.

#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::process::Command;
use std::time::Duration;

use common::{TestCluster, put, register, tracked};
use oncekv_server::pb::etcdserverpb::{DeleteRangeRequest, PutRequest};

/// `curl -s -w '\n%{http_code}' URL` → (status, body).
fn curl(url: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "10", "-w", "\n%{http_code}", url])
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').expect("a status line");
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// The value of the sample `name` (with its labels exactly as written), if present.
fn sample(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        let (n, v) = l.rsplit_once(' ')?;
        (n == name).then(|| v.parse().ok())?
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_health_and_version_answer_curl() {
    // Snapshots every 10 entries, so the snapshot metric has something to count.
    let mut c = TestCluster::start(3, |cfg| cfg.snapshot_count = 10).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let follower = (leader + 1) % 3;
    let mut kv = c.kv(follower).await;
    for i in 0..20 {
        put(&mut kv, &format!("k{i}"), "v").await.unwrap();
    }
    // One key deleted, and a delete that finds nothing (etcd counts deleted keys).
    for key in ["k5", "absent"] {
        kv.delete_range(DeleteRangeRequest {
            key: key.as_bytes().to_vec().into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    // One tracked put, sent twice: the second is a duplicate every member absorbs.
    let session = register(&c.endpoint(leader)).await;
    let req = || PutRequest {
        key: b"once".to_vec().into(),
        value: b"1".to_vec().into(),
        ..Default::default()
    };
    let mut lkv = c.kv(leader).await;
    lkv.put(tracked(&session, 1, req())).await.unwrap();
    lkv.put(tracked(&session, 1, req())).await.unwrap();
    // A tracked request for a session that does not exist.
    let bogus = (session.0 ^ 1, session.1.clone());
    assert!(lkv.put(tracked(&bogus, 1, req())).await.is_err());

    // The follower's counters move as it applies: let it catch up first.
    c.wait_caught_up(leader, Duration::from_secs(10)).await;
    let started = std::time::Instant::now();
    while c.node(follower).core.metrics().snapshot.is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the follower took no snapshot"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let base = c.endpoint(follower);
    let (status, text) = curl(&format!("{base}/metrics"));
    assert_eq!(status, 200, "{text}");
    assert_eq!(sample(&text, "etcd_server_has_leader"), Some(1.0), "{text}");
    assert_eq!(sample(&text, "etcd_server_is_leader"), Some(0.0));
    assert!(sample(&text, "etcd_server_leader_changes_seen_total") >= Some(1.0));
    assert!(sample(&text, "etcd_server_proposals_committed_total") >= Some(20.0));
    assert!(sample(&text, "etcd_disk_wal_fsync_duration_seconds_count") >= Some(1.0));
    assert!(
        sample(
            &text,
            "etcd_debugging_snap_save_total_duration_seconds_count"
        ) >= Some(1.0),
        "{text}"
    );
    assert!(sample(&text, "etcd_mvcc_db_total_size_in_bytes").is_some());
    assert_eq!(sample(&text, "etcd_debugging_mvcc_keys_total"), Some(20.0));
    // 20 puts and the tracked one once: its duplicate ran nothing.
    assert_eq!(sample(&text, "etcd_mvcc_put_total"), Some(21.0), "{text}");
    assert_eq!(sample(&text, "etcd_mvcc_delete_total"), Some(1.0), "{text}");
    assert_eq!(
        sample(&text, "etcd_server_version{server_version=\"3.4.23\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "etcd_cluster_version{cluster_version=\"3.4\"}"),
        Some(1.0)
    );
    assert_eq!(sample(&text, "oncekv_sessions"), Some(1.0));
    assert_eq!(
        sample(&text, "oncekv_duplicates_absorbed_total"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "oncekv_session_errors_total{kind=\"session_expired\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            "grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Put\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"}"
        ),
        Some(20.0),
        "{text}"
    );
    assert!(text.contains("process_resident_memory_bytes"));

    let (status, body) = curl(&format!("{base}/health"));
    assert_eq!((status, body.as_str()), (200, r#"{"health":"true"}"#));
    let (status, body) = curl(&format!("{base}/livez"));
    assert_eq!((status, body.as_str()), (200, "ok"));
    let (status, body) = curl(&format!("{base}/readyz?verbose"));
    assert_eq!(status, 200);
    assert!(body.contains("[+]linearizable_read ok"), "{body}");
    assert!(body.ends_with("readyz check passed\n"), "{body}");
    let (status, body) = curl(&format!("{base}/version"));
    assert_eq!(status, 200);
    assert!(body.contains(r#""etcdserver":"3.4.23""#), "{body}");
    assert!(body.contains(r#""etcdcluster":"3.4.0""#), "{body}");
    let (status, _) = curl(&format!("{base}/no-such-page"));
    assert_eq!(status, 404);

    // Without a quorum, the last member is alive but not healthy or ready.
    c.stop(leader).await;
    c.stop((follower + 1) % 3).await;
    let (status, body) = curl(&format!("{base}/health"));
    assert_eq!((status, body.as_str()), (503, r#"{"health":"false"}"#));
    // etcd 3.4's body has no reason; oncekv gives it in a header.
    let headers = Command::new("curl")
        .args(["-s", "--max-time", "10", "-D", "-", "-o", "/dev/null"])
        .arg(format!("{base}/health"))
        .output()
        .expect("curl runs");
    let headers = String::from_utf8_lossy(&headers.stdout).to_ascii_lowercase();
    assert!(headers.contains("x-oncekv-health-reason: "), "{headers}");
    let (status, body) = curl(&format!("{base}/readyz"));
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("[-]linearizable_read failed"), "{body}");
    let (status, body) = curl(&format!("{base}/livez"));
    assert_eq!((status, body.as_str()), (200, "ok"));
    c.inner.shutdown().await;
}
