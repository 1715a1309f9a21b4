//! Cluster membership and per-member status.

use oncekv_proto::etcdserverpb::cluster_client::ClusterClient;
use oncekv_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use oncekv_proto::etcdserverpb::{MemberListRequest, StatusRequest};
use tonic::Request;

use crate::client::{Client, Kind};
use crate::error::{Error, Failure, classify};
use crate::responses::{Member, MemberListResponse, Status};

impl Client {
    /// Every member of the cluster.
    pub async fn member_list(&self) -> Result<Vec<Member>, Error> {
        Ok(self.member_list_response().await?.members)
    }

    /// Every member of the cluster, with the header of the member that answered.
    pub async fn member_list_response(&self) -> Result<MemberListResponse, Error> {
        self.call(
            Kind::Read,
            "member list",
            MemberListRequest {},
            |ch, r| async move { Ok(ClusterClient::new(ch).member_list(r).await?.into_inner()) },
        )
        .await
        .map(MemberListResponse::from)
    }

    /// The status of the member at `endpoint` (one of the client's endpoints or any
    /// other). One attempt, no failover: it is about that member.
    pub async fn status(&self, endpoint: &str) -> Result<Status, Error> {
        let channel = self.channel_to(endpoint)?;
        let timeout = self.config().request_timeout;
        let mut request = Request::new(StatusRequest {});
        request.set_timeout(timeout);
        let mut client = MaintenanceClient::new(channel);
        let call = client.status(request);
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(resp)) => Ok(resp.into_inner().into()),
            Ok(Err(status)) => Err(match classify(&status, endpoint) {
                Failure::Retry { error, .. } | Failure::Answer(error) => error,
                Failure::SessionExpired(message) => Error::SessionExpired(message),
            }),
            Err(_) => Err(Error::Timeout {
                endpoint: endpoint.to_string(),
                after: timeout,
            }),
        }
    }
}
