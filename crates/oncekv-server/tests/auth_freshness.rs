//! A request's permissions are checked on state at least as new as the request, as etcd
//! checks them: right after `auth disable` returned, a linearizable range or a put sent
//! without a token to a member that has not applied the change yet is served, not
//! refused with "user name is empty" from that member's older state.
//!
//! The other way round, a write *permitted* on a member's older state after the leader
//! applied a revoke is refused when it is applied, as etcd checks a write at apply.
//!
//! The member is made to lag by stopping it while the leader applies the change, and the
//! request is sent the moment it is back, before the leader has caught it up.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use oncekv_proto::etcdserverpb::auth_client::AuthClient;
use oncekv_proto::etcdserverpb::kv_client::KvClient;
use oncekv_proto::etcdserverpb::{
    AuthDisableRequest, AuthEnableRequest, AuthRoleRevokePermissionRequest, PutRequest,
    RangeRequest,
};
use oncekv_testkit::auth::{add_readwrite_role, add_user_with_role, as_user};
use oncekv_testkit::local_cluster::TempCluster;
use tonic::transport::{Channel, Endpoint};

const WAIT: Duration = Duration::from_secs(10);

/// A channel to member `i` that connects on first use, so that nothing is spent on
/// connecting between the member's start and the request.
fn lazy(cluster: &TempCluster, i: usize) -> Channel {
    Endpoint::from_shared(cluster.endpoint(i))
        .unwrap()
        .connect_lazy()
}

/// Enables auth through member `leader` (root must exist), then disables it
/// while member `lagging` is stopped, and starts that member again.
async fn disable_auth_behind(cluster: &mut TempCluster, leader: usize, lagging: usize) {
    let mut auth = AuthClient::new(lazy(cluster, leader));
    auth.auth_enable(AuthEnableRequest {}).await.unwrap();
    let disable = as_user(&mut auth, "root", "rootpw", AuthDisableRequest {})
        .await
        .unwrap();
    cluster.wait_caught_up(leader, WAIT).await;
    cluster.stop(lagging).await;
    auth.auth_disable(disable).await.unwrap();
    cluster.restart(lagging).await;
}

/// A 3-member cluster with user root (auth still off): the cluster, its leader, the
/// member that will lag, and an auth client to the leader.
async fn cluster_with_root() -> (TempCluster, usize, usize, AuthClient<Channel>) {
    let cluster = TempCluster::start(3, |c| c.bcrypt_cost = 4).await;
    let leader = cluster.wait_leader(WAIT).await;
    let mut auth = AuthClient::new(lazy(&cluster, leader));
    add_user_with_role(&mut auth, "root", "rootpw", "root")
        .await
        .unwrap();
    (cluster, leader, (leader + 1) % 3, auth)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_right_after_auth_disable_are_checked_on_state_as_new_as_they_are() {
    let (mut cluster, leader, lagging, _) = cluster_with_root().await;

    disable_auth_behind(&mut cluster, leader, lagging).await;
    let range = KvClient::new(lazy(&cluster, lagging))
        .range(RangeRequest {
            key: "k".into(),
            ..RangeRequest::default()
        })
        .await;
    assert!(
        range.is_ok(),
        "a linearizable range after auth disable: {range:?}"
    );

    // The same for a write: the leader may have moved on meanwhile, so ask again.
    let leader = cluster.wait_leader(WAIT).await;
    let lagging = (leader + 1) % 3;
    disable_auth_behind(&mut cluster, leader, lagging).await;
    let put = KvClient::new(lazy(&cluster, lagging))
        .put(PutRequest {
            key: "k".into(),
            value: "v".into(),
            ..PutRequest::default()
        })
        .await;
    assert!(put.is_ok(), "a put after auth disable: {put:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_permitted_on_a_lagging_member_after_a_revoke_is_refused_at_apply() {
    let (mut cluster, leader, lagging, mut auth) = cluster_with_root().await;
    add_readwrite_role(&mut auth, "app", "k", "").await.unwrap();
    add_user_with_role(&mut auth, "app", "apppw", "app")
        .await
        .unwrap();
    auth.auth_enable(AuthEnableRequest {}).await.unwrap();
    // app's token, minted at the auth revision the lagging member will still hold.
    let put = as_user(
        &mut auth,
        "app",
        "apppw",
        PutRequest {
            key: "k".into(),
            value: "after the revoke".into(),
            ..PutRequest::default()
        },
    )
    .await
    .unwrap();
    let revoke = as_user(
        &mut auth,
        "root",
        "rootpw",
        AuthRoleRevokePermissionRequest {
            role: "app".into(),
            key: "k".into(),
            range_end: Default::default(),
        },
    )
    .await
    .unwrap();
    cluster.wait_caught_up(leader, WAIT).await;
    cluster.stop(lagging).await;
    auth.role_revoke_permission(revoke).await.unwrap();
    cluster.restart(lagging).await;

    let put = KvClient::new(lazy(&cluster, lagging)).put(put).await;
    let refused = put.expect_err("a put permitted on state older than the revoke was applied");
    assert!(
        refused.message().contains("revision of auth store is old"),
        "refused for the stale permit, as etcd: {refused:?}"
    );
    let read = as_user(
        &mut auth,
        "root",
        "rootpw",
        RangeRequest {
            key: "k".into(),
            ..RangeRequest::default()
        },
    )
    .await
    .unwrap();
    let kvs = KvClient::new(lazy(&cluster, leader))
        .range(read)
        .await
        .unwrap()
        .into_inner()
        .kvs;
    assert!(kvs.is_empty(), "the refused put left nothing: {kvs:?}");
}
