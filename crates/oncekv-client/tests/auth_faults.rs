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

const PUTS: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracked_writes_with_credentials_apply_once_through_lost_replies() {
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
