//! Elections: [`Client::election`] gives an [`Election`] to campaign in (etcd's Election
//! service), to read the leader of, and to observe.
//!
//! A campaign is a lock whose key carries a value: [`Election::campaign`] waits until the
//! candidacy leads and returns a [`Leadership`]; the leader changes its value with
//! [`Leadership::proclaim`] and steps down with [`Leadership::resign`]. Like a lock, a
//! candidacy runs on a lease of its own (see [`crate::lock`] for why), kept alive while the
//! `Leadership` lives; a retried Campaign (tracked) never queues a second candidacy.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use oncekv_core::KeyValue;
use oncekv_proto::v3electionpb::election_client::ElectionClient;
use oncekv_proto::v3electionpb::{
    CampaignRequest, LeaderKey, LeaderRequest, ProclaimRequest, ResignRequest,
};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;

use crate::client::{Client, Kind};
use crate::error::{Error, NO_LEADER};
use crate::lock::{LockOptions, Tenure};
use crate::responses::{Header, key_value};

/// The pause before an observer opens its stream again after it broke.
const REOBSERVE_PAUSE: Duration = Duration::from_millis(200);

/// An election, by name. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Election {
    client: Client,
    name: Bytes,
}

/// A campaign that won: the leader's key, and the lease it lives on.
#[derive(Debug)]
pub struct Leadership {
    leader: LeaderKey,
    header: Header,
    tenure: Tenure,
}

impl Client {
    /// The election `name`: its candidates' keys are `name/<lease in hex>`.
    pub fn election(&self, name: impl Into<Vec<u8>>) -> Election {
        Election {
            client: self.clone(),
            name: Bytes::from(name.into()),
        }
    }
}

impl Election {
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// Campaigns on a lease of its own ([`LockOptions::new`]) and waits until elected.
    pub async fn campaign(&self, value: impl Into<Vec<u8>>) -> Result<Leadership, Error> {
        self.campaign_with(value, LockOptions::new()).await
    }

    /// Campaigns with `value` and waits until elected. Dropping the future while it
    /// waits withdraws the candidacy.
    pub async fn campaign_with(
        &self,
        value: impl Into<Vec<u8>>,
        options: LockOptions,
    ) -> Result<Leadership, Error> {
        let tenure = Tenure::begin(&self.client, &self.name, options).await?;
        let req = CampaignRequest {
            name: self.name.clone(),
            lease: tenure.lease(),
            value: Bytes::from(value.into()),
        };
        let resp = self
            .client
            .call(Kind::Wait, "campaign", req, |ch, r| async move {
                Ok(ElectionClient::new(ch).campaign(r).await?.into_inner())
            })
            .await?;
        let leader = resp
            .leader
            .ok_or_else(|| Error::Internal("a campaign answer without a leader key".into()))?;
        Ok(Leadership {
            leader,
            header: resp.header.into(),
            tenure,
        })
    }

    /// The current leader's key and value; `None` if nobody leads.
    pub async fn leader(&self) -> Result<Option<KeyValue>, Error> {
        let req = LeaderRequest {
            name: self.name.clone(),
        };
        let resp = self
            .client
            .call(Kind::Read, "leader", req, |ch, r| async move {
                Ok(ElectionClient::new(ch).leader(r).await?.into_inner())
            })
            .await;
        match resp {
            Ok(r) => Ok(r.kv.map(key_value)),
            Err(Error::Rejected { message, .. }) if message == NO_LEADER => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The leader's key and value as they change: the current leader (once there is one),
    /// each value it proclaims, then each next leader's. If the member serving it fails,
    /// the observer carries on from another, skipping what it already delivered.
    pub fn observe(&self) -> Observer {
        let (tx, rx) = mpsc::channel(16);
        let task = tokio::spawn(observe(self.client.clone(), self.name.clone(), tx));
        Observer {
            rx: ReceiverStream::new(rx),
            task: task.abort_handle(),
        }
    }
}

impl Leadership {
    /// The leader key: leadership lasts while it exists.
    pub fn key(&self) -> &[u8] {
        &self.leader.key
    }

    /// The leader key's create revision (a fencing token, as a lock's).
    pub fn rev(&self) -> i64 {
        self.leader.rev
    }

    pub fn lease(&self) -> i64 {
        self.leader.lease
    }

    /// The store revision when elected.
    pub fn revision(&self) -> i64 {
        self.header.revision
    }

    /// Whether the candidacy's own lease was found gone: no longer the leader.
    pub fn is_lost(&self) -> bool {
        self.tenure.is_lost()
    }

    /// Completes when [`is_lost`](Self::is_lost) becomes true.
    pub async fn lost(&self) {
        self.tenure.lost().await;
    }

    /// Sets the leader's value, if this is still the leader ([`Error::NotLeader`] if not).
    pub async fn proclaim(&self, value: impl Into<Vec<u8>>) -> Result<(), Error> {
        let req = ProclaimRequest {
            leader: Some(self.leader.clone()),
            value: Bytes::from(value.into()),
        };
        self.tenure
            .client()
            .call(Kind::Write, "proclaim", req, |ch, r| async move {
                Ok(ElectionClient::new(ch).proclaim(r).await?.into_inner())
            })
            .await
            .map(|_| ())
    }

    /// Steps down (the next candidate leads), then ends the candidacy's own lease.
    pub async fn resign(self) -> Result<(), Error> {
        let req = ResignRequest {
            leader: Some(self.leader.clone()),
        };
        self.tenure
            .client()
            .call(Kind::Write, "resign", req, |ch, r| async move {
                Ok(ElectionClient::new(ch).resign(r).await?.into_inner())
            })
            .await?;
        self.tenure.end().await
    }
}

/// A stream of leaders (see [`Election::observe`]). Dropping it stops observing.
#[derive(Debug)]
pub struct Observer {
    rx: ReceiverStream<Result<KeyValue, Error>>,
    task: AbortHandle,
}

impl Stream for Observer {
    type Item = Result<KeyValue, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.rx).poll_next(cx)
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Feeds an [`Observer`]: opens the Observe stream (the client's retry loop picks a member
/// that answers), forwards what it sends, and opens it again when it breaks. A reopened
/// stream starts with the current leader; anything at or before what was delivered last
/// for the same key is skipped, so a value is never delivered twice.
async fn observe(client: Client, name: Bytes, tx: mpsc::Sender<Result<KeyValue, Error>>) {
    let mut last: Option<(Bytes, i64)> = None;
    loop {
        let req = LeaderRequest { name: name.clone() };
        let opened = client
            .call(Kind::Read, "observe", req, |ch, r| async move {
                Ok(ElectionClient::new(ch).observe(r).await?.into_inner())
            })
            .await;
        let mut stream = match opened {
            Ok(s) => s,
            Err(e) if e.is_retryable() => {
                tokio::time::sleep(REOBSERVE_PAUSE).await;
                continue;
            }
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        };
        // Until the server ends it (it is stopping) or the connection breaks: then again.
        while let Ok(Some(resp)) = stream.message().await {
            let Some(kv) = resp.kv.map(key_value) else {
                continue;
            };
            let seen = last
                .as_ref()
                .is_some_and(|(k, rev)| *k == kv.key && kv.mod_revision <= *rev);
            if seen {
                continue;
            }
            last = Some((kv.key.clone(), kv.mod_revision));
            if tx.send(Ok(kv)).await.is_err() {
                return;
            }
        }
        tokio::time::sleep(REOBSERVE_PAUSE).await;
    }
}
