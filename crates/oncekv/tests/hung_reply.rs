//! A reply that never comes must cost one short attempt, not the whole command: the CLI
//! against a proxy that lets the leader run every request but swallows every other reply
//! and leaves that connection open and silent (the case a plain timeout-and-give-up
//! client turns into "outcome unknown").
#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use oncekv_proto::etcdserverpb::RangeRequest;
use oncekv_testkit::fault_proxy::FaultProxy;
use oncekv_testkit::local_cluster::TempCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_puts_through_swallowed_replies_all_succeed_quickly_and_apply_once() {
    let cluster = TempCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let proxy = FaultProxy::in_front_of(&cluster.endpoint(leader))
        .await
        .unwrap();
    proxy.set_swallow_every(2);
    let endpoint = proxy.addr().to_string();

    let mut slowest = Duration::ZERO;
    for i in 0..20 {
        let endpoint = endpoint.clone();
        let started = Instant::now();
        let out = tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_oncekv"))
                .args(["--endpoints", &endpoint, "--command-timeout", "5s"])
                .args(["put", "hung", &format!("v{i}")])
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        let took = started.elapsed();
        slowest = slowest.max(took);
        assert!(
            out.status.success(),
            "put {i} failed after {took:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK");
        assert!(
            took < Duration::from_millis(2500),
            "put {i} took {took:?}: a hung reply must cost one short attempt"
        );
    }
    assert!(
        proxy.stats().replies_swallowed >= 20,
        "the proxy swallowed only {} replies",
        proxy.stats().replies_swallowed
    );

    let mut kv = cluster.kv(leader).await;
    let got = kv
        .range(RangeRequest {
            key: "hung".into(),
            ..RangeRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.kvs.len(), 1);
    assert_eq!(
        got.kvs[0].version, 20,
        "every put applied exactly once (slowest took {slowest:?})"
    );
    assert_eq!(&got.kvs[0].value[..], b"v19");
}
