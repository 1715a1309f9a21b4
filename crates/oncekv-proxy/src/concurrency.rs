//! etcd's Lock and Election services, relayed. Lock and Campaign are tracked writes
//! whose answer may wait for the caller's turn (no attempt deadline); Unlock, Proclaim
//! and Resign are tracked writes; Leader is a read; Observe is a stream passed through.

use std::sync::Arc;

use oncekv_client::CallKind;
use oncekv_proto::v3electionpb::election_client::ElectionClient;
use oncekv_proto::v3electionpb::election_server::Election;
use oncekv_proto::v3electionpb::*;
use oncekv_proto::v3lockpb::lock_client::LockClient;
use oncekv_proto::v3lockpb::lock_server::Lock;
use oncekv_proto::v3lockpb::*;
use tonic::{Request, Response, Status};

use crate::relay::relay;
use crate::upstream::Upstream;

#[derive(Debug)]
pub(crate) struct LockProxy {
    pub(crate) up: Arc<Upstream>,
}

#[tonic::async_trait]
impl Lock for LockProxy {
    async fn lock(&self, request: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        relay!(self, request, CallKind::Wait, "lock", LockClient::lock)
    }

    async fn unlock(
        &self,
        request: Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        relay!(self, request, CallKind::Write, "unlock", LockClient::unlock)
    }
}

#[derive(Debug)]
pub(crate) struct ElectionProxy {
    pub(crate) up: Arc<Upstream>,
}

#[tonic::async_trait]
impl Election for ElectionProxy {
    async fn campaign(
        &self,
        request: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        relay!(
            self,
            request,
            CallKind::Wait,
            "campaign",
            ElectionClient::campaign
        )
    }

    async fn proclaim(
        &self,
        request: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        relay!(
            self,
            request,
            CallKind::Write,
            "proclaim",
            ElectionClient::proclaim
        )
    }

    async fn leader(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<LeaderResponse>, Status> {
        relay!(
            self,
            request,
            CallKind::Read,
            "leader",
            ElectionClient::leader
        )
    }

    async fn observe(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<tonic::codegen::BoxStream<LeaderResponse>>, Status> {
        let client = self.up.client_for(&request)?;
        let stream = ElectionClient::new(client.current_channel())
            .observe(request.into_inner())
            .await?
            .into_inner();
        Ok(Response::new(Box::pin(stream)))
    }

    async fn resign(
        &self,
        request: Request<ResignRequest>,
    ) -> Result<Response<ResignResponse>, Status> {
        relay!(
            self,
            request,
            CallKind::Write,
            "resign",
            ElectionClient::resign
        )
    }
}
