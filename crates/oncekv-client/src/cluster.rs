//! Cluster membership and per-member status.

use crate::transport::Channel;
use oncekv_proto::etcdserverpb::cluster_client::ClusterClient;
use oncekv_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use oncekv_proto::etcdserverpb::{
    MemberAddRequest, MemberListRequest, MemberPromoteRequest, MemberRemoveRequest,
    MemberUpdateRequest, SnapshotRequest, StatusRequest,
};
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

    /// Adds a member that will serve peers at `peer_urls` (one URL), as a voter or a
    /// learner: returns it (without a name until it starts) and every member. Start the
    /// new member with `--initial-cluster-state existing` next.
    pub async fn member_add(
        &self,
        peer_urls: Vec<String>,
        is_learner: bool,
    ) -> Result<(Member, MemberListResponse), Error> {
        let r = self
            .member_call(
                MemberAddRequest {
                    peer_ur_ls: peer_urls,
                    is_learner,
                },
                |mut c, r| async move { c.member_add(r).await },
            )
            .await?;
        let member = r.member.map(Member::from).unwrap_or_default();
        Ok((member, listed(r.header, r.members)))
    }

    /// Removes member `id` (the leader too: it steps down and stops).
    pub async fn member_remove(&self, id: u64) -> Result<MemberListResponse, Error> {
        let r = self
            .member_call(MemberRemoveRequest { id }, |mut c, r| async move {
                c.member_remove(r).await
            })
            .await?;
        Ok(listed(r.header, r.members))
    }

    /// Changes member `id`'s peer URL.
    pub async fn member_update(
        &self,
        id: u64,
        peer_urls: Vec<String>,
    ) -> Result<MemberListResponse, Error> {
        let req = MemberUpdateRequest {
            id,
            peer_ur_ls: peer_urls,
        };
        let r = self
            .member_call(req, |mut c, r| async move { c.member_update(r).await })
            .await?;
        Ok(listed(r.header, r.members))
    }

    /// Makes learner `id` a voter (refused until it has caught up with the leader).
    pub async fn member_promote(&self, id: u64) -> Result<MemberListResponse, Error> {
        let r = self
            .member_call(MemberPromoteRequest { id }, |mut c, r| async move {
                c.member_promote(r).await
            })
            .await?;
        Ok(listed(r.header, r.members))
    }

    /// A membership change: not a tracked command (membership lives in raft's
    /// configuration, not the state machine). Each endpoint is tried in turn until one
    /// answers; one that cannot be reached or does not answer in time passes it on. A
    /// change that took effect before its reply was lost is then refused harmlessly by
    /// the next member (the peer URL exists, the member is gone), never made twice.
    async fn member_call<Req, Resp, F, Fut>(&self, req: Req, call: F) -> Result<Resp, Error>
    where
        Req: Clone,
        F: Fn(ClusterClient<Channel>, Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        self.first_answer(|channel, timeout| {
            let mut request = Request::new(req.clone());
            request.set_timeout(timeout);
            call(ClusterClient::new(channel), request)
        })
        .await
    }

    /// `call` on each endpoint in turn until one answers (an answer may be a refusal);
    /// an endpoint that cannot be reached or does not answer in time passes it on. For
    /// calls that a second member refuses harmlessly if the first had taken them.
    pub(crate) async fn first_answer<Resp, F, Fut>(&self, call: F) -> Result<Resp, Error>
    where
        F: Fn(Channel, std::time::Duration) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        let mut last = None;
        for endpoint in self.endpoint_urls() {
            match self.answer_of(&endpoint, &call).await {
                Ok(resp) => return Ok(resp),
                Err((error, true)) => last = Some(error),
                Err((error, false)) => return Err(error),
            }
        }
        Err(last.unwrap_or_else(|| Error::InvalidArgument("no endpoints".to_string())))
    }

    /// One attempt of `call` at `endpoint`: the answer, or the error and whether another
    /// member might answer instead (unreachable, no answer in time, no leader).
    pub(crate) async fn answer_of<Resp, F, Fut>(
        &self,
        endpoint: &str,
        call: &F,
    ) -> Result<Resp, (Error, bool)>
    where
        F: Fn(Channel, std::time::Duration) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        let timeout = self.config().request_timeout;
        let channel = self.channel_to(endpoint).map_err(|e| (e, false))?;
        match tokio::time::timeout(timeout, call(channel, timeout)).await {
            Ok(Ok(resp)) => Ok(resp.into_inner()),
            Ok(Err(status)) => Err(match classify(&status, endpoint) {
                Failure::Retry { error, .. } => (error, true),
                Failure::Answer(error) => (error, false),
                Failure::SessionExpired(message) => (Error::SessionExpired(message), false),
            }),
            Err(_) => Err((
                Error::Timeout {
                    endpoint: endpoint.to_string(),
                    after: timeout,
                },
                true,
            )),
        }
    }

    /// Streams a consistent point-in-time copy of the state of the member at the first
    /// endpoint (etcd's Maintenance.Snapshot) to `sink`, chunk by chunk; returns the size.
    /// One attempt: a copy cut short is an error, never a short file.
    pub async fn snapshot(
        &self,
        mut sink: impl FnMut(&[u8]) -> std::io::Result<()>,
    ) -> Result<u64, Error> {
        let endpoint = self
            .endpoint_urls()
            .into_iter()
            .next()
            .ok_or_else(|| Error::InvalidArgument("no endpoints".to_string()))?;
        let answer = |status: tonic::Status| match classify(&status, &endpoint) {
            Failure::Retry { error, .. } | Failure::Answer(error) => error,
            Failure::SessionExpired(message) => Error::SessionExpired(message),
        };
        let mut client = MaintenanceClient::new(self.channel_to(&endpoint)?);
        let mut stream = client
            .snapshot(SnapshotRequest {})
            .await
            .map_err(answer)?
            .into_inner();
        let mut total = 0u64;
        let mut remaining = None;
        while let Some(chunk) = stream.message().await.map_err(answer)? {
            sink(&chunk.blob)
                .map_err(|e| Error::InvalidArgument(format!("writing the snapshot: {e}")))?;
            total += chunk.blob.len() as u64;
            remaining = Some(chunk.remaining_bytes);
        }
        if remaining != Some(0) {
            return Err(Error::Unavailable {
                endpoint,
                message: "the snapshot stream ended early".to_string(),
            });
        }
        Ok(total)
    }

    /// The status of the member at `endpoint` (one of the client's endpoints or any
    /// other). One attempt, no failover: it is about that member.
    pub async fn status(&self, endpoint: &str) -> Result<Status, Error> {
        self.answer_of(endpoint, &|channel, timeout| async move {
            let mut request = Request::new(StatusRequest {});
            request.set_timeout(timeout);
            MaintenanceClient::new(channel).status(request).await
        })
        .await
        .map(Status::from)
        .map_err(|(e, _)| e)
    }
}

/// The members a membership change answers with.
fn listed(
    header: Option<oncekv_proto::etcdserverpb::ResponseHeader>,
    members: Vec<oncekv_proto::etcdserverpb::Member>,
) -> MemberListResponse {
    MemberListResponse {
        header: header.into(),
        members: members.into_iter().map(Member::from).collect(),
    }
}
