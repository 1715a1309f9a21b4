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
