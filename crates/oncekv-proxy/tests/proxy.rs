//! The grpc-proxy end to end: an unchanged etcd client (the `etcd-client` crate) talks to
//! the proxy, the proxy talks to a real 3-member cluster through fault proxies that lose
//! replies, and the leader dies midway.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use etcd_client::{ConnectOptions, GetOptions, LeaseGrantOptions, PutOptions, WatchOptions};
use oncekv_proxy::{Proxy, ProxyConfig};
use oncekv_testkit::fault_proxy::FaultProxy;
use oncekv_testkit::local_cluster::TempCluster;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

const LEADER_WAIT: Duration = Duration::from_secs(10);

/// A proxy for `endpoints` on a free port: its address and what stops it.
async fn start_proxy(
    endpoints: Vec<String>,
    tweak: impl Fn(&mut ProxyConfig),
) -> (SocketAddr, oneshot::Sender<()>) {
    let mut config = ProxyConfig::new(endpoints);
    config.client.backoff_base = Duration::from_millis(5);
    config.client.backoff_cap = Duration::from_millis(100);
    config.client.attempt_timeout = Duration::from_millis(300);
    config.client.max_attempts = 1000;
    tweak(&mut config);
    let proxy = Proxy::new(config).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(proxy.serve(listener, async {
        let _ = stopped.await;
    }));
    (addr, stop)
}

async fn etcd(addr: SocketAddr) -> etcd_client::Client {
    let options = ConnectOptions::new().with_timeout(Duration::from_secs(20));
    etcd_client::Client::connect([format!("http://{addr}")], Some(options))
        .await
        .unwrap()
}

/// The proxy's `/metrics` value of `name` (a plain HTTP/1.1 GET on its gRPC port).
async fn metric(addr: SocketAddr, name: &str) -> i64 {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: proxy\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).await.unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in:\n{body}"))
}

// The promise for an unchanged client: 30 % of the cluster's replies to the proxy are
// lost and the leader is killed halfway, yet N puts leave version N.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_through_the_proxy_apply_once_through_lost_replies_and_a_leader_kill() {
    let mut cluster = TempCluster::start(3, |_| {}).await;
    cluster.wait_leader(LEADER_WAIT).await;
    let mut faults = Vec::new();
    for i in 0..3 {
        let f = FaultProxy::in_front_of(&cluster.endpoint(i)).await.unwrap();
        f.set_drop_replies(0.3);
        faults.push(f);
    }
    let urls = faults
        .iter()
        .map(|f| format!("http://{}", f.addr()))
        .collect();
    let (addr, _stop) = start_proxy(urls, |_| {}).await;
    let mut client = etcd(addr).await;
    const N: i64 = 120;
    for i in 0..N {
        if i == N / 2 {
            let leader = cluster.wait_leader(LEADER_WAIT).await;
            cluster.stop(leader).await;
        }
        client.put("k", i.to_string(), None).await.unwrap();
    }
    let dropped: u64 = faults.iter().map(|f| f.stats().replies_dropped).sum();
    assert!(
        dropped > 10,
        "the fault proxies dropped only {dropped} replies"
    );
    let resp = client.get("k", None).await.unwrap();
    let kv = &resp.kvs()[0];
    assert_eq!(
        kv.version(),
        N,
        "a put through the proxy was applied twice (or lost)"
    );
    assert_eq!(kv.value_str().unwrap(), (N - 1).to_string());
    // A lease with an explicit ID: its grant, retried after lost replies, succeeds once.
    let lease = client
        .lease_grant(30, Some(LeaseGrantOptions::new().with_id(4242)))
        .await
        .unwrap();
    assert_eq!(lease.id(), 4242);
    let txn = etcd_client::Txn::new()
        .when([etcd_client::Compare::version(
            "k",
            etcd_client::CompareOp::Equal,
            N,
        )])
        .and_then([etcd_client::TxnOp::put(
            "k",
            "txn",
            Some(PutOptions::new().with_lease(4242)),
        )]);
    assert!(client.txn(txn).await.unwrap().succeeded());
    let kv = client.get("k", None).await.unwrap().kvs()[0].clone();
    assert_eq!((kv.version(), kv.lease()), (N + 1, 4242));
}

// 200 downstream watchers on 4 keys cost the cluster 4 watches; each watcher still gets
// exactly the events of its own key, and a watcher that asks for history gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_on_the_same_key_share_one_upstream_watch() {
    let cluster = TempCluster::start(3, |_| {}).await;
    cluster.wait_leader(LEADER_WAIT).await;
    let (addr, _stop) = start_proxy(cluster.endpoints(), |_| {}).await;
    let mut client = etcd(addr).await;
    client.put("w0", "old", None).await.unwrap();
    let mut streams = Vec::new();
    for i in 0..200 {
        let key = format!("w{}", i % 4);
        let s = client.watch(key.clone(), None).await.unwrap();
        streams.push((key, s));
    }
    assert_eq!(metric(addr, "oncekv_proxy_upstream_watches").await, 4);
    assert_eq!(metric(addr, "oncekv_proxy_downstream_watchers").await, 200);
    let mut history = client
        .watch("w0", Some(WatchOptions::new().with_start_revision(1)))
        .await
        .unwrap();
    for k in 0..4 {
        client.put(format!("w{k}"), "new", None).await.unwrap();
    }
    for (key, s) in &mut streams {
        let keys = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                // The first response is the watch's `created` one, without events.
                let resp = s.message().await.unwrap().unwrap();
                if !resp.events().is_empty() {
                    let keys: Vec<String> = resp
                        .events()
                        .iter()
                        .map(|e| e.kv().unwrap().key_str().unwrap().to_string())
                        .collect();
                    return keys;
                }
            }
        })
        .await
        .expect("a watcher got no event");
        assert_eq!(keys, vec![key.clone()]);
    }
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let resp = history.message().await.unwrap().unwrap();
        seen.extend(
            resp.events()
                .iter()
                .map(|e| e.kv().unwrap().value_str().unwrap().to_string()),
        );
    }
    assert_eq!(
        seen,
        ["old", "new"],
        "the history watch missed or repeated revisions"
    );
    drop(streams);
}

// A watcher that reads nothing while 600 puts go by falls out of its group's buffer and
// goes on with a watch of its own from the first revision it had not been sent: when it
// reads at last it gets every put once, in order, while its group-mate read live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_falls_behind_its_group_still_gets_every_revision_once() {
    let cluster = TempCluster::start(1, |_| {}).await;
    cluster.wait_leader(LEADER_WAIT).await;
    let (addr, _stop) = start_proxy(cluster.endpoints(), |_| {}).await;
    let mut slow_client = etcd(addr).await;
    let mut slow = slow_client
        .watch("lag/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    let mut live_client = etcd(addr).await;
    let mut live = live_client
        .watch("lag/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    // Both created (the first response of each).
    assert!(slow.message().await.unwrap().unwrap().created());
    assert!(live.message().await.unwrap().unwrap().created());
    assert_eq!(metric(addr, "oncekv_proxy_upstream_watches").await, 1);
    let mut writer = etcd(addr).await;
    const PUTS: usize = 600;
    // 9.6 MB in all: more than the HTTP/2 window, the stream queue and the group's
    // ring hold between them.
    let value = vec![b'v'; 16 * 1024];
    let reader = tokio::spawn(async move {
        let mut n = 0;
        while n < PUTS {
            n += live.message().await.unwrap().unwrap().events().len();
        }
        n
    });
    for i in 0..PUTS {
        writer
            .put(format!("lag/{i:04}"), value.clone(), None)
            .await
            .unwrap();
    }
    assert_eq!(reader.await.unwrap(), PUTS);
    let mut keys = Vec::new();
    while keys.len() < PUTS {
        let resp = tokio::time::timeout(Duration::from_secs(20), slow.message())
            .await
            .expect("the slow watcher never caught up")
            .unwrap()
            .unwrap();
        keys.extend(
            resp.events()
                .iter()
                .map(|e| e.kv().unwrap().key_str().unwrap().to_string()),
        );
    }
    let want: Vec<String> = (0..PUTS).map(|i| format!("lag/{i:04}")).collect();
    assert_eq!(
        keys, want,
        "the slow watcher missed, repeated or reordered a put"
    );
    // It left the group for a watch of its own.
    assert_eq!(metric(addr, "oncekv_proxy_upstream_watches").await, 2);
}

// --namespace: keys live under the prefix on the cluster and come back without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_puts_keys_under_its_prefix_and_hides_it() {
    let cluster = TempCluster::start(1, |_| {}).await;
    cluster.wait_leader(LEADER_WAIT).await;
    let (addr, _stop) = start_proxy(cluster.endpoints(), |c| c.namespace = "tenant/".into()).await;
    let mut through = etcd(addr).await;
    through.put("a", "1", None).await.unwrap();
    through.put("b", "2", None).await.unwrap();
    let direct = etcd_client::Client::connect([cluster.endpoint(0)], None)
        .await
        .unwrap();
    let mut direct = direct;
    let raw = direct.get("tenant/a", None).await.unwrap();
    assert_eq!(raw.kvs()[0].value_str().unwrap(), "1");
    let all = through
        .get("", Some(GetOptions::new().with_from_key()))
        .await
        .unwrap();
    let keys: Vec<_> = all.kvs().iter().map(|kv| kv.key_str().unwrap()).collect();
    assert_eq!(keys, ["a", "b"]);
}

// Refusals reach an etcd client in etcd's shape. A write under a token the cluster does
// not know fails with etcd's "invalid auth token" (the proxy's session registration is
// what the cluster refuses; "request timed out" would make clients retry the same token
// instead of authenticating again). A watch the user may not read is refused in its
// `created` response, as etcd refuses it, not created and then canceled. And a client
// that half-closes its watch stream after its create still gets the watch served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_reach_the_client_in_etcds_shape() {
    use oncekv_proto::etcdserverpb::auth_client::AuthClient;
    use oncekv_proto::etcdserverpb::kv_client::KvClient;
    use oncekv_proto::etcdserverpb::watch_client::WatchClient;
    use oncekv_proto::etcdserverpb::watch_request::RequestUnion;
    use oncekv_proto::etcdserverpb::{
        AuthenticateRequest, PutRequest, WatchCreateRequest, WatchRequest,
    };

    let cluster = TempCluster::start(1, |_| {}).await;
    cluster.wait_leader(LEADER_WAIT).await;
    let (addr, _stop) = start_proxy(cluster.endpoints(), |_| {}).await;
    let mut admin = etcd(addr).await;
    admin.user_add("root", "rootpw", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.user_add("alice", "alicepw", None).await.unwrap();
    admin.auth_enable().await.unwrap();

    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    fn with_token<T>(mut r: tonic::Request<T>, token: &str) -> tonic::Request<T> {
        r.metadata_mut().insert("token", token.parse().unwrap());
        r
    }
    let put = PutRequest {
        key: "k".into(),
        value: "v".into(),
        ..Default::default()
    };
    let refused = KvClient::new(channel.clone())
        .put(with_token(tonic::Request::new(put.clone()), "lol"))
        .await
        .unwrap_err();
    assert_eq!(
        (refused.code(), refused.message()),
        (
            tonic::Code::Unauthenticated,
            "etcdserver: invalid auth token"
        )
    );

    let token = |name: &str, password: &str| {
        let mut auth = AuthClient::new(channel.clone());
        let request = AuthenticateRequest {
            name: name.into(),
            password: password.into(),
        };
        async move { auth.authenticate(request).await.unwrap().into_inner().token }
    };
    let create = |key: &'static str| WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: key.into(),
            ..Default::default()
        })),
    };
    // A watch of "k" on a stream that half-closes after its create: the stream, and its
    // first response.
    let watch_k = |token: String| {
        let channel = channel.clone();
        async move {
            let request = with_token(tonic::Request::new(tokio_stream::once(create("k"))), &token);
            let mut stream = WatchClient::new(channel)
                .watch(request)
                .await
                .unwrap()
                .into_inner();
            let first = stream
                .message()
                .await
                .unwrap()
                .expect("no created response");
            (stream, first)
        }
    };
    // Alice has no role: her watch is refused on creation, with etcd's reason.
    let alice = token("alice", "alicepw").await;
    let (_, first) = watch_k(alice).await;
    assert!(first.created && first.canceled, "{first:?}");
    assert_eq!(first.cancel_reason, "etcdserver: permission denied");

    // Root's watch on a stream closed after the create is served on.
    let root = token("root", "rootpw").await;
    let (mut stream, first) = watch_k(root.clone()).await;
    assert!(first.created && !first.canceled, "{first:?}");
    KvClient::new(channel.clone())
        .put(with_token(tonic::Request::new(put), &root))
        .await
        .unwrap();
    let event = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("no event on a half-closed watch stream")
        .unwrap()
        .expect("the watch stream ended");
    assert_eq!(event.events.len(), 1);
}
