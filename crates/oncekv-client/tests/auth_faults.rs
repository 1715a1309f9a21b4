//! Exactly-once with auth on, through a fault proxy that drops half the replies (the
//! request ran; the client retries): a client with credentials puts one key 100 times and
//! its version ends at exactly 100, every put applied once, across an auth change midway
//! that makes the client's token stale (it authenticates again and resends under the
//! same sequence numbers, in the session it owns).
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{LEADER_WAIT, Proxy, TestCluster};
use oncekv_client::{Client, ClientConfig, Credentials};
use oncekv_proto::etcdserverpb::auth_client::AuthClient;
use oncekv_proto::etcdserverpb::{AuthEnableRequest, AuthRoleAddRequest};
use oncekv_testkit::auth::{add_readwrite_role, add_user_with_role, as_user};
use tonic::transport::Channel;

const PUTS: usize = 100;

/// A 3-member cluster with auth on: `root` (password `rootpw`), and `app` (`apppw`) with
/// read-write rights on `app/`. Returns the cluster, its leader and an auth client to it.
async fn cluster_with_app_user() -> (TestCluster, usize, AuthClient<Channel>) {
    let cluster = TestCluster::start(3, |c| c.bcrypt_cost = 4).await;
    let leader = cluster.wait_leader(LEADER_WAIT).await;
    let mut auth = AuthClient::connect(cluster.endpoint(leader)).await.unwrap();
    add_user_with_role(&mut auth, "root", "rootpw", "root")
        .await
        .unwrap();
    add_readwrite_role(&mut auth, "app", "app/", "app0")
        .await
        .unwrap();
    add_user_with_role(&mut auth, "app", "apppw", "app")
        .await
        .unwrap();
    auth.auth_enable(AuthEnableRequest {}).await.unwrap();
    (cluster, leader, auth)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracked_writes_with_credentials_apply_once_through_lost_replies() {
    let (cluster, leader, mut auth) = cluster_with_app_user().await;

    let proxy = Proxy::start(cluster.configs[leader].client_addr).await;
    let config = ClientConfig {
        attempt_timeout: Duration::from_millis(500),
        credentials: Some(Credentials {
            user: "app".into(),
            password: "apppw".into(),
        }),
        ..ClientConfig::default()
    };
    let client = Client::connect([proxy.url()], config).unwrap();
    client.put("app/warm-up", "1").await.unwrap();

    proxy.0.set_drop_replies(0.5);
    for i in 0..PUTS {
        client.put("app/counter", i.to_string()).await.unwrap();
        if i == PUTS / 2 {
            // Any auth change makes the client's token stale; it authenticates again.
            let other = AuthRoleAddRequest {
                name: "other".into(),
            };
            let request = as_user(&mut auth, "root", "rootpw", other).await.unwrap();
            auth.role_add(request).await.unwrap();
        }
    }
    proxy.0.set_drop_replies(0.0);
    let kv = client.get("app/counter").await.unwrap().unwrap();
    assert_eq!(kv.version, PUTS as i64, "every put applied exactly once");
    assert_eq!(kv.value.as_ref(), (PUTS - 1).to_string().as_bytes());
}

// A put runs, its reply is lost, and before the client's retry gets through the user
// loses the right to write. The retry is refused at the door ("permission denied")
// without the cluster looking at the seq, so the refusal says nothing about the first
// attempt: the client must report the outcome as unknown, not as a refusal (which would
// tell the caller the put did not happen).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_after_a_lost_reply_leaves_the_outcome_unknown() {
    use oncekv_proto::etcdserverpb::AuthUserRevokeRoleRequest;

    let (cluster, leader, mut auth) = cluster_with_app_user().await;
    let root = Client::connect(
        [cluster.endpoint(leader)],
        ClientConfig {
            credentials: Some(Credentials {
                user: "root".into(),
                password: "rootpw".into(),
            }),
            ..ClientConfig::default()
        },
    )
    .unwrap();

    let proxy = Proxy::start(cluster.configs[leader].client_addr).await;
    let client = Client::connect(
        [proxy.url()],
        ClientConfig {
            attempt_timeout: Duration::from_millis(500),
            max_attempts: 1000,
            max_retry_time: Duration::from_secs(30),
            backoff_cap: Duration::from_millis(50),
            credentials: Some(Credentials {
                user: "app".into(),
                password: "apppw".into(),
            }),
            ..ClientConfig::default()
        },
    )
    .unwrap();
    client.put("app/warm-up", "1").await.unwrap();

    proxy.swallow_replies(true);
    let put = tokio::spawn({
        let client = client.clone();
        async move { client.put("app/k", "v").await }
    });
    // The put has run on the cluster (its replies are being lost).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while root.get("app/k").await.unwrap().is_none() {
        assert!(tokio::time::Instant::now() < deadline, "the put never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let revoke = AuthUserRevokeRoleRequest {
        name: "app".into(),
        role: "app".into(),
    };
    let request = as_user(&mut auth, "root", "rootpw", revoke).await.unwrap();
    auth.user_revoke_role(request).await.unwrap();
    // Every attempt sent before the revoke has had its reply dropped by now, so the
    // attempts that get through are all refused.
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.swallow_replies(false);

    let outcome = tokio::time::timeout(Duration::from_secs(30), put)
        .await
        .unwrap()
        .unwrap();
    match outcome {
        Err(e) => assert!(e.is_outcome_unknown(), "reported as {e:?}"),
        Ok(r) => panic!("the put cannot succeed once the user lost the right: {r:?}"),
    }
    let kv = root.get("app/k").await.unwrap().unwrap();
    assert_eq!(kv.version, 1, "the put ran once");
}
