//! gRPC's health service on the client port, as etcd serves it to Kubernetes' `grpc`
//! probes, `grpc_health_probe` and clients that watch a server's health: the server as a
//! whole ("") is SERVING, another name is unknown, and a stopping member tells its
//! watchers NOT_SERVING and lets them go instead of holding its shutdown open.

#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::time::Duration;

use common::TestCluster;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

fn asking(service: &str) -> HealthCheckRequest {
    HealthCheckRequest {
        service: service.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_is_serving_until_it_stops() {
    let mut c = TestCluster::start(1, |_| {}).await;
    c.wait_leader(Duration::from_secs(10)).await;
    let channel = tonic::transport::Channel::from_shared(c.endpoint(0))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);

    let status = health.check(asking("")).await.unwrap().into_inner().status;
    assert_eq!(status, ServingStatus::Serving as i32);
    let unknown = health.check(asking("etcdserverpb.KV")).await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);

    let mut watch = health.watch(asking("")).await.unwrap().into_inner();
    let first = watch.message().await.unwrap().expect("the current status");
    assert_eq!(first.status, ServingStatus::Serving as i32);

    // The member stops: the watcher hears NOT_SERVING, then the stream ends, and the stop
    // does not wait on the open watch.
    let stopping = tokio::spawn(async move {
        c.stop(0).await;
        c
    });
    let next = tokio::time::timeout(Duration::from_secs(10), watch.message())
        .await
        .expect("an answer before the member is gone");
    assert_eq!(
        next.unwrap().map(|r| r.status),
        Some(ServingStatus::NotServing as i32)
    );
    let end = tokio::time::timeout(Duration::from_secs(10), watch.message())
        .await
        .expect("the watch ends");
    assert!(!matches!(end, Ok(Some(_))), "{end:?}");
    tokio::time::timeout(Duration::from_secs(20), stopping)
        .await
        .expect("the member stops with a health watch open")
        .unwrap();
}
