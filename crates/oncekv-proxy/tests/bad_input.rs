//! Bad input at the proxy gets a clear error and costs other clients nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use etcd_client::ConnectOptions;
use oncekv_proxy::{Proxy, ProxyConfig};
use oncekv_testkit::local_cluster::TempCluster;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn proxy_for(cluster: &TempCluster) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let proxy = Proxy::new(ProxyConfig::new(cluster.endpoints())).unwrap();
    tokio::spawn(proxy.serve(listener, std::future::pending()));
    addr
}

async fn etcd(addr: SocketAddr) -> etcd_client::Client {
    let options = ConnectOptions::new().with_timeout(Duration::from_secs(10));
    etcd_client::Client::connect([format!("http://{addr}")], Some(options))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_oversized_requests_are_refused_and_the_proxy_serves_on() {
    let cluster = TempCluster::start(1, |_| {}).await;
    cluster.wait_leader(Duration::from_secs(10)).await;
    let addr = proxy_for(&cluster).await;

    // Bytes that are neither HTTP/2 nor HTTP/1: the connection is closed, nothing hangs.
    let mut garbage = TcpStream::connect(addr).await.unwrap();
    garbage
        .write_all(&[0xde, 0xad, 0xbe, 0xef].repeat(4096))
        .await
        .unwrap();
    let mut sink = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), garbage.read_to_end(&mut sink)).await;
    assert!(closed.is_ok(), "the proxy kept a garbage connection open");

    let mut client = etcd(addr).await;
    // Over the cluster's 1.5 MiB limit but within what the proxy buffers: the cluster's
    // own refusal, etcd's words, comes back.
    let big = vec![b'x'; 1_800_000];
    let refused = client.put("big", big, None).await.unwrap_err();
    assert!(
        refused.to_string().contains("request is too large"),
        "unexpected refusal: {refused}"
    );
    // Past what the proxy buffers: refused at the proxy, before it is read whole.
    let huge = vec![b'x'; 8 * 1024 * 1024];
    let refused = client.put("huge", huge, None).await.unwrap_err();
    assert!(!refused.to_string().is_empty());
    // Nothing was written, and the proxy still serves.
    client.put("after", "ok", None).await.unwrap();
    let got = client.get("big", None).await.unwrap();
    assert!(got.kvs().is_empty());
    let got = client.get("after", None).await.unwrap();
    assert_eq!(got.kvs()[0].value_str().unwrap(), "ok");
}

// A client that opens a watch and never reads holds a bounded backlog: the writers and
// other watchers go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_never_reads_holds_nobody_up() {
    let cluster = TempCluster::start(1, |_| {}).await;
    cluster.wait_leader(Duration::from_secs(10)).await;
    let addr = proxy_for(&cluster).await;
    let mut stalled = etcd(addr).await;
    let _never_read = stalled.watch("hot", None).await.unwrap();
    let mut reader = etcd(addr).await;
    let mut live = reader.watch("hot", None).await.unwrap();
    let mut writer = etcd(addr).await;
    let value = vec![b'v'; 64 * 1024];
    for _ in 0..300 {
        writer.put("hot", value.clone(), None).await.unwrap();
    }
    // The reading watcher got all 300 puts although the other one read none (19 MiB of
    // events it has not taken).
    let mut seen = 0;
    while seen < 300 {
        let resp = tokio::time::timeout(Duration::from_secs(20), live.message())
            .await
            .expect("the live watcher stalled behind the one that never reads")
            .unwrap()
            .unwrap();
        seen += resp.events().len();
    }
    assert_eq!(seen, 300);
}
