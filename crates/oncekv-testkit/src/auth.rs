//! Setting up etcd auth for a test: users with a role, as `etcdctl user add` and
//! `user grant-role` would.

use oncekv_proto::etcdserverpb::auth_client::AuthClient;
use oncekv_proto::etcdserverpb::{AuthUserAddRequest, AuthUserGrantRoleRequest};
use tonic::transport::Channel;

/// Adds user `name` with `password` and grants it `role` (which must exist, unless it is
/// `root`).
pub async fn add_user_with_role(
    auth: &mut AuthClient<Channel>,
    name: &str,
    password: &str,
    role: &str,
) -> Result<(), tonic::Status> {
    auth.user_add(AuthUserAddRequest {
        name: name.into(),
        password: password.into(),
        ..AuthUserAddRequest::default()
    })
    .await?;
    auth.user_grant_role(AuthUserGrantRoleRequest {
        user: name.into(),
        role: role.into(),
    })
    .await?;
    Ok(())
}
