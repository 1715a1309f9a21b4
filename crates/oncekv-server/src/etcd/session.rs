//! oncekv's Session service: register, keep alive and close a client session.

use std::sync::Arc;

use oncekv_core::{Command, Secret};
use rand::RngCore;
use tonic::{Request, Response, Status};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::pb::oncekv as pb;
use crate::pb::oncekv::session_server::Session;
use crate::request_path::NodeCore;

/// Empty: no nonce (0); otherwise exactly 16 bytes, not all zero.
fn nonce_from_bytes(bytes: &[u8]) -> Result<u128, ApiError> {
    if bytes.is_empty() {
        return Ok(0);
    }
    let arr: [u8; 16] = bytes.try_into().map_err(|_| {
        ApiError::InvalidArgument("oncekv: a registration nonce is 16 bytes".into())
    })?;
    Ok(u128::from_be_bytes(arr))
}

fn secret_from_bytes(bytes: &[u8]) -> Result<Secret, ApiError> {
    let arr: [u8; 16] = bytes
        .try_into()
        .map_err(|_| ApiError::InvalidArgument("oncekv: a session secret is 16 bytes".into()))?;
    Ok(Secret(arr))
}

#[derive(Debug, Clone)]
pub struct SessionService {
    pub node: Arc<NodeCore>,
}

impl SessionService {
    async fn session_command(&self, command: Command) -> Result<i64, Status> {
        self.node.propose_session(command).await?;
        Ok(self.node.applied().read().sm.revision())
    }
}

#[tonic::async_trait]
impl Session for SessionService {
    async fn register(
        &self,
        request: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterResponse>, Status> {
        let nonce = nonce_from_bytes(&request.get_ref().nonce)?;
        let mut secret = [0u8; 16];
        // The OS-seeded thread RNG, or the simulation's seeded one (deterministic runs).
        crate::runtime::RaftRng.fill_bytes(&mut secret);
        // With a nonce a live session already has, the state machine answers with that
        // session (this secret is then unused): a retried registration opens nothing new.
        // With auth on, the session belongs to the registering user: no one else may send
        // requests under it (see `NodeCore::check_session_owner`).
        let command = match self.node.caller_user(&Caller::of(&request)).await? {
            Some(owner) => Command::RegisterOwned {
                secret: Secret(secret),
                nonce,
                owner,
            },
            None => Command::RegisterClient {
                secret: Secret(secret),
                nonce,
            },
        };
        let registered = self.node.propose_registration(command).await?;
        let revision = self.node.applied().read().sm.revision();
        Ok(Response::new(pb::RegisterResponse {
            header: self.node.header(revision),
            client_id: registered.client_id,
            secret: registered.secret.0.to_vec().into(),
            ttl_ms: registered.settings.session_ttl_ms,
            window: registered.settings.window,
        }))
    }

    async fn keep_alive(
        &self,
        request: Request<pb::SessionKeepAliveRequest>,
    ) -> Result<Response<pb::SessionKeepAliveResponse>, Status> {
        let caller = Caller::of(&request);
        let r = request.into_inner();
        if let Some(user) = self.node.caller_user(&caller).await? {
            self.node.check_session_owner(&user, r.client_id)?;
        }
        let secret = secret_from_bytes(&r.secret)?;
        let revision = self
            .session_command(Command::KeepAlive {
                client_id: r.client_id,
                secret,
            })
            .await?;
        Ok(Response::new(pb::SessionKeepAliveResponse {
            header: self.node.header(revision),
        }))
    }

    async fn close(
        &self,
        request: Request<pb::SessionCloseRequest>,
    ) -> Result<Response<pb::SessionCloseResponse>, Status> {
        let caller = Caller::of(&request);
        let r = request.into_inner();
        if let Some(user) = self.node.caller_user(&caller).await? {
            self.node.check_session_owner(&user, r.client_id)?;
        }
        let secret = secret_from_bytes(&r.secret)?;
        let revision = self
            .session_command(Command::CloseSession {
                client_id: r.client_id,
                secret,
            })
            .await?;
        Ok(Response::new(pb::SessionCloseResponse {
            header: self.node.header(revision),
        }))
    }
}
