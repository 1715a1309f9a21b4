//! etcd's Auth service: enable/disable, Authenticate, users and roles.
//!
//! Changes go through the log as [`AuthCommand`]s, so every member holds the same store;
//! passwords are hashed here, on the member that takes the request, and only hashes are
//! logged. With auth on, every change and every listing needs the root role; a user may
//! read its own roles and change its own password.

use std::sync::Arc;

use oncekv_core::{AuthCommand, AuthError, PermKind, Permission};
use rand::RngCore;
use tonic::{Request, Response, Status};

use crate::auth::{Caller, Need};
use crate::error::ApiError;
use crate::pb::authpb;
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::auth_server::Auth;
use crate::request_path::NodeCore;

#[derive(Debug, Clone)]
pub struct AuthService {
    pub node: Arc<NodeCore>,
}

impl AuthService {
    fn header(&self) -> Option<pb::ResponseHeader> {
        let revision = self.node.applied().read().sm.revision();
        self.node.header(revision)
    }

    /// Proposes `command` once the caller is allowed to (the root role with auth on, or
    /// `allowed_self` naming the caller).
    async fn change<T>(
        &self,
        request: &Request<T>,
        command: AuthCommand,
        allowed_self: Option<&str>,
    ) -> Result<Option<pb::ResponseHeader>, Status> {
        self.admin_or_self(request, allowed_self).await?;
        self.commit(command).await
    }

    /// Proposes `command` (the caller already checked).
    async fn commit(&self, command: AuthCommand) -> Result<Option<pb::ResponseHeader>, Status> {
        self.node.propose_auth(command).await?;
        Ok(self.header())
    }

    async fn admin_or_self<T>(
        &self,
        request: &Request<T>,
        allowed_self: Option<&str>,
    ) -> Result<(), Status> {
        let caller = Caller::of(request);
        let Some(user) = self.node.caller_user(&caller).await? else {
            return Ok(());
        };
        if allowed_self == Some(user.as_str()) {
            return Ok(());
        }
        self.node.authorize(&caller, &[Need::Admin]).await?;
        Ok(())
    }

    /// The password as the store keeps it: a given bcrypt hash, a hash of the given
    /// password, or none (`no_password`).
    async fn password(
        &self,
        password: &str,
        hashed: &str,
        no_password: bool,
    ) -> Result<Option<String>, Status> {
        if no_password {
            return Ok(None);
        }
        if !hashed.is_empty() {
            return Ok(Some(hashed.to_string()));
        }
        Ok(Some(self.node.hash_password(password).await?))
    }
}

fn perm_kind(t: i32) -> Result<PermKind, Status> {
    match authpb::permission::Type::try_from(t) {
        Ok(authpb::permission::Type::Read) => Ok(PermKind::Read),
        Ok(authpb::permission::Type::Write) => Ok(PermKind::Write),
        Ok(authpb::permission::Type::Readwrite) => Ok(PermKind::ReadWrite),
        Err(_) => Err(Status::invalid_argument(format!(
            "etcdserver: invalid permission type {t}"
        ))),
    }
}

fn perm_type(kind: PermKind) -> i32 {
    match kind {
        PermKind::Read => authpb::permission::Type::Read as i32,
        PermKind::Write => authpb::permission::Type::Write as i32,
        PermKind::ReadWrite => authpb::permission::Type::Readwrite as i32,
    }
}

#[tonic::async_trait]
impl Auth for AuthService {
    async fn auth_enable(
        &self,
        request: Request<pb::AuthEnableRequest>,
    ) -> Result<Response<pb::AuthEnableResponse>, Status> {
        let mut token_key = [0u8; 32];
        crate::runtime::RaftRng.fill_bytes(&mut token_key);
        let header = self
            .change(&request, AuthCommand::Enable { token_key }, None)
            .await?;
        Ok(Response::new(pb::AuthEnableResponse { header }))
    }

    async fn auth_disable(
        &self,
        request: Request<pb::AuthDisableRequest>,
    ) -> Result<Response<pb::AuthDisableResponse>, Status> {
        let header = self.change(&request, AuthCommand::Disable, None).await?;
        Ok(Response::new(pb::AuthDisableResponse { header }))
    }

    async fn auth_status(
        &self,
        _request: Request<pb::AuthStatusRequest>,
    ) -> Result<Response<pb::AuthStatusResponse>, Status> {
        self.node.read_index().await.map_err(ApiError::from)?;
        let (enabled, auth_revision) = {
            let inner = self.node.applied().read();
            (inner.sm.auth().enabled(), inner.sm.auth().revision())
        };
        Ok(Response::new(pb::AuthStatusResponse {
            header: self.header(),
            enabled,
            auth_revision,
        }))
    }

    async fn authenticate(
        &self,
        request: Request<pb::AuthenticateRequest>,
    ) -> Result<Response<pb::AuthenticateResponse>, Status> {
        let r = request.into_inner();
        if r.name.is_empty() {
            return Err(ApiError::from(AuthError::UserEmpty).into());
        }
        let token = self.node.authenticate(&r.name, &r.password).await?;
        Ok(Response::new(pb::AuthenticateResponse {
            header: self.header(),
            token,
        }))
    }

    async fn user_add(
        &self,
        request: Request<pb::AuthUserAddRequest>,
    ) -> Result<Response<pb::AuthUserAddResponse>, Status> {
        let r = request.get_ref();
        let no_password = r.options.as_ref().is_some_and(|o| o.no_password);
        if r.name.is_empty() {
            return Err(ApiError::from(AuthError::UserEmpty).into());
        }
        // Checked before the (deliberately slow) hash is computed.
        self.admin_or_self(&request, None).await?;
        let password = self
            .password(&r.password, &r.hashed_password, no_password)
            .await?;
        let command = AuthCommand::UserAdd {
            name: r.name.clone(),
            password,
        };
        let header = self.commit(command).await?;
        Ok(Response::new(pb::AuthUserAddResponse { header }))
    }

    async fn user_get(
        &self,
        request: Request<pb::AuthUserGetRequest>,
    ) -> Result<Response<pb::AuthUserGetResponse>, Status> {
        let name = request.get_ref().name.clone();
        self.admin_or_self(&request, Some(&name)).await?;
        self.node.read_index().await.map_err(ApiError::from)?;
        let roles = {
            let inner = self.node.applied().read();
            let user = inner
                .sm
                .auth()
                .user(&name)
                .ok_or(ApiError::from(AuthError::UserNotFound))?;
            user.roles.iter().cloned().collect()
        };
        Ok(Response::new(pb::AuthUserGetResponse {
            header: self.header(),
            roles,
        }))
    }

    async fn user_list(
        &self,
        request: Request<pb::AuthUserListRequest>,
    ) -> Result<Response<pb::AuthUserListResponse>, Status> {
        self.admin_or_self(&request, None).await?;
        self.node.read_index().await.map_err(ApiError::from)?;
        let users = self
            .node
            .applied()
            .read()
            .sm
            .auth()
            .users()
            .map(str::to_string)
            .collect();
        Ok(Response::new(pb::AuthUserListResponse {
            header: self.header(),
            users,
        }))
    }

    async fn user_delete(
        &self,
        request: Request<pb::AuthUserDeleteRequest>,
    ) -> Result<Response<pb::AuthUserDeleteResponse>, Status> {
        let name = request.get_ref().name.clone();
        let header = self
            .change(&request, AuthCommand::UserDelete { name }, None)
            .await?;
        Ok(Response::new(pb::AuthUserDeleteResponse { header }))
    }

    async fn user_change_password(
        &self,
        request: Request<pb::AuthUserChangePasswordRequest>,
    ) -> Result<Response<pb::AuthUserChangePasswordResponse>, Status> {
        let r = request.get_ref();
        let name = r.name.clone();
        self.admin_or_self(&request, Some(&name)).await?;
        let password = self
            .password(&r.password, &r.hashed_password, false)
            .await?;
        let command = AuthCommand::UserChangePassword { name, password };
        let header = self.commit(command).await?;
        Ok(Response::new(pb::AuthUserChangePasswordResponse { header }))
    }

    async fn user_grant_role(
        &self,
        request: Request<pb::AuthUserGrantRoleRequest>,
    ) -> Result<Response<pb::AuthUserGrantRoleResponse>, Status> {
        let r = request.get_ref();
        let command = AuthCommand::UserGrantRole {
            user: r.user.clone(),
            role: r.role.clone(),
        };
        let header = self.change(&request, command, None).await?;
        Ok(Response::new(pb::AuthUserGrantRoleResponse { header }))
    }

    async fn user_revoke_role(
        &self,
        request: Request<pb::AuthUserRevokeRoleRequest>,
    ) -> Result<Response<pb::AuthUserRevokeRoleResponse>, Status> {
        let r = request.get_ref();
        let command = AuthCommand::UserRevokeRole {
            user: r.name.clone(),
            role: r.role.clone(),
        };
        let header = self.change(&request, command, None).await?;
        Ok(Response::new(pb::AuthUserRevokeRoleResponse { header }))
    }

    async fn role_add(
        &self,
        request: Request<pb::AuthRoleAddRequest>,
    ) -> Result<Response<pb::AuthRoleAddResponse>, Status> {
        let name = request.get_ref().name.clone();
        let header = self
            .change(&request, AuthCommand::RoleAdd { name }, None)
            .await?;
        Ok(Response::new(pb::AuthRoleAddResponse { header }))
    }

    async fn role_get(
        &self,
        request: Request<pb::AuthRoleGetRequest>,
    ) -> Result<Response<pb::AuthRoleGetResponse>, Status> {
        let role = request.get_ref().role.clone();
        // A user may read the roles it holds.
        let caller = Caller::of(&request);
        if let Some(user) = self.node.caller_user(&caller).await? {
            let holds = {
                let inner = self.node.applied().read();
                inner
                    .sm
                    .auth()
                    .user(&user)
                    .is_some_and(|u| u.roles.contains(&role))
            };
            if !holds {
                self.node.authorize(&caller, &[Need::Admin]).await?;
            }
        }
        self.node.read_index().await.map_err(ApiError::from)?;
        let perm = {
            let inner = self.node.applied().read();
            inner
                .sm
                .auth()
                .role(&role)
                .ok_or(ApiError::from(AuthError::RoleNotFound))?
                .iter()
                .map(|p| authpb::Permission {
                    perm_type: perm_type(p.kind),
                    key: p.key.clone(),
                    range_end: p.range_end.clone(),
                })
                .collect()
        };
        Ok(Response::new(pb::AuthRoleGetResponse {
            header: self.header(),
            perm,
        }))
    }

    async fn role_list(
        &self,
        request: Request<pb::AuthRoleListRequest>,
    ) -> Result<Response<pb::AuthRoleListResponse>, Status> {
        self.admin_or_self(&request, None).await?;
        self.node.read_index().await.map_err(ApiError::from)?;
        let roles = self
            .node
            .applied()
            .read()
            .sm
            .auth()
            .roles()
            .map(str::to_string)
            .collect();
        Ok(Response::new(pb::AuthRoleListResponse {
            header: self.header(),
            roles,
        }))
    }

    async fn role_delete(
        &self,
        request: Request<pb::AuthRoleDeleteRequest>,
    ) -> Result<Response<pb::AuthRoleDeleteResponse>, Status> {
        let name = request.get_ref().role.clone();
        let header = self
            .change(&request, AuthCommand::RoleDelete { name }, None)
            .await?;
        Ok(Response::new(pb::AuthRoleDeleteResponse { header }))
    }

    async fn role_grant_permission(
        &self,
        request: Request<pb::AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<pb::AuthRoleGrantPermissionResponse>, Status> {
        let r = request.get_ref();
        let perm = r
            .perm
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("etcdserver: permission not given"))?;
        let command = AuthCommand::RoleGrantPermission {
            role: r.name.clone(),
            permission: Permission {
                kind: perm_kind(perm.perm_type)?,
                key: perm.key.clone(),
                range_end: perm.range_end.clone(),
            },
        };
        let header = self.change(&request, command, None).await?;
        Ok(Response::new(pb::AuthRoleGrantPermissionResponse {
            header,
        }))
    }

    async fn role_revoke_permission(
        &self,
        request: Request<pb::AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<pb::AuthRoleRevokePermissionResponse>, Status> {
        let r = request.get_ref();
        let command = AuthCommand::RoleRevokePermission {
            role: r.role.clone(),
            key: r.key.clone(),
            range_end: r.range_end.clone(),
        };
        let header = self.change(&request, command, None).await?;
        Ok(Response::new(pb::AuthRoleRevokePermissionResponse {
            header,
        }))
    }
}
