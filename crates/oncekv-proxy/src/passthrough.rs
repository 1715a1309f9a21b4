//! etcd's Cluster, Maintenance and Auth services, passed through under the caller's own
//! token. Reads and idempotent calls (member list, status, hashes, alarm list,
//! authenticate, auth and user/role reads, defragment) are retried on another member;
//! changes the cluster does not track (membership, alarms, auth settings, users and
//! roles, move-leader) get one attempt, as a direct call would, so a lost reply is never
//! turned into a second change by the proxy.
//!
//! With `--advertise-client-url`, MemberList names the proxy as every member's client
//! URL: a client that syncs its endpoints from the member list (clientv3's
//! `AutoSyncInterval`, `etcdctl --cluster`) then stays on the proxy instead of going
//! around it to the members.

use std::sync::Arc;

use oncekv_client::CallKind;
use oncekv_proto::etcdserverpb::auth_client::AuthClient;
use oncekv_proto::etcdserverpb::auth_server::Auth;
use oncekv_proto::etcdserverpb::cluster_client::ClusterClient;
use oncekv_proto::etcdserverpb::cluster_server::Cluster;
use oncekv_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use oncekv_proto::etcdserverpb::maintenance_server::Maintenance;
use oncekv_proto::etcdserverpb::*;
use tonic::{Request, Response, Status};

use crate::relay::{once, relay};
use crate::upstream::Upstream;

#[derive(Debug)]
pub(crate) struct ClusterProxy {
    pub(crate) up: Arc<Upstream>,
    /// `--advertise-client-url`, if given.
    pub(crate) advertise: Option<String>,
}

#[tonic::async_trait]
impl Cluster for ClusterProxy {
    async fn member_add(
        &self,
        request: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        once!(self, request, ClusterClient::member_add)
    }

    async fn member_remove(
        &self,
        request: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        once!(self, request, ClusterClient::member_remove)
    }

    async fn member_update(
        &self,
        request: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        once!(self, request, ClusterClient::member_update)
    }

    async fn member_list(
        &self,
        request: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        let relayed: Result<Response<MemberListResponse>, Status> = relay!(
            self,
            request,
            CallKind::Read,
            "member list",
            ClusterClient::member_list
        );
        let mut resp = relayed?;
        if let Some(url) = &self.advertise {
            for m in &mut resp.get_mut().members {
                m.client_ur_ls = vec![url.clone()];
            }
        }
        Ok(resp)
    }

    async fn member_promote(
        &self,
        request: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        once!(self, request, ClusterClient::member_promote)
    }
}

#[derive(Debug)]
pub(crate) struct MaintenanceProxy {
    pub(crate) up: Arc<Upstream>,
}

#[tonic::async_trait]
impl Maintenance for MaintenanceProxy {
    async fn alarm(
        &self,
        request: Request<AlarmRequest>,
    ) -> Result<Response<AlarmResponse>, Status> {
        let get = request.get_ref().action == alarm_request::AlarmAction::Get as i32;
        if get {
            relay!(
                self,
                request,
                CallKind::Read,
                "alarm list",
                MaintenanceClient::alarm
            )
        } else {
            once!(self, request, MaintenanceClient::alarm)
        }
    }

    async fn status(
        &self,
        request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        relay!(
            self,
            request,
            CallKind::Read,
            "status",
            MaintenanceClient::status
        )
    }

    async fn defragment(
        &self,
        request: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        relay!(
            self,
            request,
            CallKind::Read,
            "defragment",
            MaintenanceClient::defragment
        )
    }

    async fn hash(&self, request: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        relay!(
            self,
            request,
            CallKind::Read,
            "hash",
            MaintenanceClient::hash
        )
    }

    async fn hash_kv(
        &self,
        request: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        relay!(
            self,
            request,
            CallKind::Read,
            "hash kv",
            MaintenanceClient::hash_kv
        )
    }

    async fn snapshot(
        &self,
        request: Request<SnapshotRequest>,
    ) -> Result<Response<tonic::codegen::BoxStream<SnapshotResponse>>, Status> {
        let client = self.up.client_for(&request)?;
        let stream = MaintenanceClient::new(client.current_channel())
            .snapshot(request.into_inner())
            .await?
            .into_inner();
        Ok(Response::new(Box::pin(stream)))
    }

    async fn move_leader(
        &self,
        request: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        once!(self, request, MaintenanceClient::move_leader)
    }
}

#[derive(Debug)]
pub(crate) struct AuthProxy {
    pub(crate) up: Arc<Upstream>,
}

/// Auth methods: `read` ones are retried, `change` ones get one attempt.
macro_rules! auth_methods {
    (read { $($rm:ident($rq:ident) -> $rs:ident;)* } change { $($cm:ident($cq:ident) -> $cs:ident;)* }) => {
        #[tonic::async_trait]
        impl Auth for AuthProxy {
            $(
                async fn $rm(&self, request: Request<$rq>) -> Result<Response<$rs>, Status> {
                    relay!(self, request, CallKind::Read, "auth", AuthClient::$rm)
                }
            )*
            $(
                async fn $cm(&self, request: Request<$cq>) -> Result<Response<$cs>, Status> {
                    once!(self, request, AuthClient::$cm)
                }
            )*
        }
    };
}

auth_methods! {
    read {
        authenticate(AuthenticateRequest) -> AuthenticateResponse;
        auth_status(AuthStatusRequest) -> AuthStatusResponse;
        user_get(AuthUserGetRequest) -> AuthUserGetResponse;
        user_list(AuthUserListRequest) -> AuthUserListResponse;
        role_get(AuthRoleGetRequest) -> AuthRoleGetResponse;
        role_list(AuthRoleListRequest) -> AuthRoleListResponse;
    }
    change {
        auth_enable(AuthEnableRequest) -> AuthEnableResponse;
        auth_disable(AuthDisableRequest) -> AuthDisableResponse;
        user_add(AuthUserAddRequest) -> AuthUserAddResponse;
        user_delete(AuthUserDeleteRequest) -> AuthUserDeleteResponse;
        user_change_password(AuthUserChangePasswordRequest) -> AuthUserChangePasswordResponse;
        user_grant_role(AuthUserGrantRoleRequest) -> AuthUserGrantRoleResponse;
        user_revoke_role(AuthUserRevokeRoleRequest) -> AuthUserRevokeRoleResponse;
        role_add(AuthRoleAddRequest) -> AuthRoleAddResponse;
        role_delete(AuthRoleDeleteRequest) -> AuthRoleDeleteResponse;
        role_grant_permission(AuthRoleGrantPermissionRequest) -> AuthRoleGrantPermissionResponse;
        role_revoke_permission(AuthRoleRevokePermissionRequest) -> AuthRoleRevokePermissionResponse;
    }
}
