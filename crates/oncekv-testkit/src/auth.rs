//! Setting up etcd auth for a test: users with a role, as `etcdctl user add` and
//! `user grant-role` would.

use oncekv_proto::authpb::{Permission, permission};
use oncekv_proto::etcdserverpb::auth_client::AuthClient;
use oncekv_proto::etcdserverpb::{
    AuthRoleAddRequest, AuthRoleGrantPermissionRequest, AuthUserAddRequest,
    AuthUserGrantRoleRequest, AuthenticateRequest,
};
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

/// Adds role `name` with read-write permission on `[key, range_end)` (`range_end` empty:
/// the key alone), as `etcdctl role add` and `role grant-permission` would.
pub async fn add_readwrite_role(
    auth: &mut AuthClient<Channel>,
    name: &str,
    key: &str,
    range_end: &str,
) -> Result<(), tonic::Status> {
    auth.role_add(AuthRoleAddRequest { name: name.into() })
        .await?;
    auth.role_grant_permission(AuthRoleGrantPermissionRequest {
        name: name.into(),
        perm: Some(Permission {
            perm_type: permission::Type::Readwrite as i32,
            key: key.as_bytes().to_vec().into(),
            range_end: range_end.as_bytes().to_vec().into(),
        }),
    })
    .await?;
    Ok(())
}

/// `message` with the token `name` gets by authenticating with `password` in its
/// metadata, as etcdctl sends an authenticated request.
pub async fn as_user<T>(
    auth: &mut AuthClient<Channel>,
    name: &str,
    password: &str,
    message: T,
) -> Result<tonic::Request<T>, tonic::Status> {
    let token = auth
        .authenticate(AuthenticateRequest {
            name: name.into(),
            password: password.into(),
        })
        .await?
        .into_inner()
        .token;
    let mut request = tonic::Request::new(message);
    let value = token
        .parse()
        .map_err(|_| tonic::Status::internal("the token is not a valid metadata value"))?;
    request.metadata_mut().insert("token", value);
    Ok(request)
}
