//! With auth on, the proxy lends no rights: each caller's own token decides what it may
//! do, and its tracked writes run under a session of its own user.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use etcd_client::{ConnectOptions, Permission};
use oncekv_proxy::{Proxy, ProxyConfig};
use oncekv_testkit::local_cluster::TempCluster;
use tokio::net::TcpListener;

async fn connect(url: &str, user: Option<(&str, &str)>) -> etcd_client::Client {
    let mut options = ConnectOptions::new().with_timeout(Duration::from_secs(10));
    if let Some((name, password)) = user {
        options = options.with_user(name, password);
    }
    etcd_client::Client::connect([url], Some(options))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_caller_has_its_own_rights_through_the_proxy() {
    let cluster = TempCluster::start(3, |_| {}).await;
    cluster.wait_leader(Duration::from_secs(10)).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let proxy = Proxy::new(ProxyConfig::new(cluster.endpoints())).unwrap();
    tokio::spawn(proxy.serve(listener, std::future::pending()));

    // Set up through the proxy too: auth calls pass through under the caller's token.
    let mut admin = connect(&url, None).await;
    admin.user_add("root", "rootpw", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.role_add("app").await.unwrap();
    admin
        .role_grant_permission("app", Permission::read_write("app/").with_prefix())
        .await
        .unwrap();
    admin.user_add("alice", "alicepw", None).await.unwrap();
    admin.user_grant_role("alice", "app").await.unwrap();
    admin.user_add("bob", "bobpw", None).await.unwrap();
    admin.auth_enable().await.unwrap();

    let mut alice = connect(&url, Some(("alice", "alicepw"))).await;
    alice.put("app/x", "1", None).await.unwrap();
    let denied = alice.put("other/x", "1", None).await.unwrap_err();
    assert!(
        denied.to_string().contains("permission denied"),
        "alice wrote outside her role: {denied}"
    );
    // Bob has no role: the proxy's own standing (it has none) must not stand in for his.
    let mut bob = connect(&url, Some(("bob", "bobpw"))).await;
    let denied = bob.put("app/x", "2", None).await.unwrap_err();
    assert!(
        denied.to_string().contains("permission denied"),
        "bob wrote through the proxy: {denied}"
    );
    let mut anonymous = connect(&url, None).await;
    assert!(anonymous.put("app/x", "3", None).await.is_err());

    let mut root = connect(&url, Some(("root", "rootpw"))).await;
    let kv = root.get("app/x", None).await.unwrap().kvs()[0].clone();
    assert_eq!((kv.value_str().unwrap(), kv.version()), ("1", 1));
}

// A put through the proxy runs, its reply is lost, and an auth change then makes the
// caller's token stale, so the proxy's retry is refused before the cluster looks at the
// seq. Passed on as is ("revision of auth store is old"), that refusal would make an etcd
// client renew its token and send the put again as a new write. The proxy answers "request
// timed out" instead, as etcd does when it cannot tell, and the put stays applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_token_after_a_lost_reply_is_an_unknown_outcome() {
    use oncekv_testkit::fault_proxy::FaultProxy;

    let cluster = TempCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let direct = cluster.endpoint(leader);
    let mut admin = connect(&direct, None).await;
    admin.user_add("root", "rootpw", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.user_add("alice", "alicepw", None).await.unwrap();
    admin.user_grant_role("alice", "root").await.unwrap();
    admin.auth_enable().await.unwrap();
    let mut root = connect(&direct, Some(("root", "rootpw"))).await;

    let fault = FaultProxy::in_front_of(&direct).await.unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let mut config = ProxyConfig::new(vec![format!("http://{}", fault.addr())]);
    config.client.attempt_timeout = Duration::from_millis(300);
    config.client.backoff_cap = Duration::from_millis(50);
    config.client.max_attempts = 1000;
    let proxy = Proxy::new(config).unwrap();
    tokio::spawn(proxy.serve(listener, std::future::pending()));
    let mut alice = connect(&url, Some(("alice", "alicepw"))).await;
    alice.put("warm-up", "1", None).await.unwrap();

    fault.set_drop_replies(1.0);
    let put = tokio::spawn(async move { alice.put("k", "v", None).await });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while root.get("k", None).await.unwrap().kvs().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the put never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    root.role_add("other").await.unwrap();
    // Every attempt sent before the auth change has had its reply dropped by now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    fault.set_drop_replies(0.0);

    let outcome = tokio::time::timeout(Duration::from_secs(30), put)
        .await
        .unwrap()
        .unwrap();
    let err = outcome.expect_err("the retry was refused: the put cannot be acknowledged");
    assert!(
        err.to_string().contains("request timed out"),
        "the caller was told {err}, not that the outcome is unknown"
    );
    // The auth change made root's token stale too: a fresh one reads.
    let mut root = connect(&direct, Some(("root", "rootpw"))).await;
    let kv = root.get("k", None).await.unwrap().kvs()[0].clone();
    assert_eq!(kv.version(), 1, "the put ran once");
}
