//! etcd's Election service (`v3electionpb.Election`): candidates queue under `name/` like
//! lock waiters (see [`super::queue`]); the leader is the candidate with the smallest create
//! revision, and its key's value is what it proclaims.
//!
//! Campaign is [`Op::Enqueue`] (tracked through an oncekv session: a retried campaign never
//! queues a second candidacy) and a wait for the turn. Proclaim and Resign are txns guarded
//! by the leader key's create revision, so a leader that lost its key (its lease ended) and
//! campaigned again cannot act with the old leadership. Leader reads the first candidate;
//! Observe follows the leadership through history, so no proclaimed value is skipped.

use std::sync::Arc;

use bytes::Bytes;
use oncekv_core::{
    Compare, CompareResult, CompareTarget, DeleteRangeRequest, EnqueueRequest, EventKind, KeyRange,
    KeyValue, Op, OpError, PutRequest, RangeRequest, ReadLimit, RequestOp, SortOrder, SortTarget,
    TxnRequest,
};
use oncekv_proto::SessionMeta;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use super::convert;
use super::lock::authorize_queue;
use super::queue;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::pb::v3electionpb as pb;
use crate::pb::v3electionpb::election_server::Election;
use crate::request_path::{Answered, NodeCore};

/// etcd's messages for the election calls (`concurrency.ErrElectionNotLeader`,
/// `ErrElectionNoLeader`, `v3election.ErrMissingLeaderKey`). etcd's server returns them as
/// plain errors, which gRPC sends with code Unknown; clients match on the message.
const NOT_LEADER: &str = "election: not leader";
const NO_LEADER: &str = "election: no leader";
const MISSING_LEADER_KEY: &str = "\"leader\" field must be provided";

/// Responses an Observe stream may have queued for a client that does not read.
const OBSERVE_BUFFER: usize = 16;
/// Events read from history at a time while following a leader.
const OBSERVE_READ: usize = 64;

#[derive(Debug, Clone)]
pub struct ElectionService {
    pub node: Arc<NodeCore>,
    /// The server's stop: an observer's stream ends there, so that an open `Observe`
    /// (`etcdctl elect -l`) does not hold the graceful shutdown until its grace runs out.
    pub stop: watch::Receiver<bool>,
}

/// A txn that runs `then` if `key` still has create revision `rev` (etcd's leadership
/// guard).
fn guarded(key: &Bytes, rev: i64, then: RequestOp) -> TxnRequest {
    TxnRequest {
        compare: vec![Compare {
            result: CompareResult::Equal,
            target: CompareTarget::CreateRevision(rev),
            range: KeyRange::single(key.clone()),
        }],
        success: vec![then],
        failure: vec![],
    }
}

fn resign_op(key: &Bytes, rev: i64) -> Op {
    Op::Txn(guarded(
        key,
        rev,
        RequestOp::DeleteRange(DeleteRangeRequest {
            range: KeyRange::single(key.clone()),
            prev_kv: false,
        }),
    ))
}

fn leader_key(leader: Option<pb::LeaderKey>) -> Result<pb::LeaderKey, Status> {
    leader.ok_or_else(|| Status::unknown(MISSING_LEADER_KEY))
}

/// The first candidate under `name/` at the state read: the leader.
fn first_candidate(req_name: &[u8]) -> RangeRequest {
    RangeRequest {
        range: queue::queue_range(req_name),
        limit: 1,
        sort_order: SortOrder::Ascend,
        sort_target: SortTarget::Create,
        ..RangeRequest::default()
    }
}

#[tonic::async_trait]
impl Election for ElectionService {
    async fn campaign(
        &self,
        request: Request<pb::CampaignRequest>,
    ) -> Result<Response<pb::CampaignResponse>, Status> {
        let meta = SessionMeta::from_metadata(request.metadata()).map_err(ApiError::from)?;
        let caller = Caller::of(&request);
        let r = request.into_inner();
        self.node.check_size(&r)?;
        let permit = authorize_queue(&self.node, &caller, &r.name, meta.as_ref(), true).await?;
        let req = EnqueueRequest {
            name: r.name.clone(),
            lease: r.lease,
            value: r.value,
            proclaim: true,
        };
        let (queued, revision) = queue::enqueue_and_wait(&self.node, req, (meta, permit), |q| {
            resign_op(&q.key, q.create_revision)
        })
        .await?;
        Ok(Response::new(pb::CampaignResponse {
            header: self.node.header(revision),
            leader: Some(pb::LeaderKey {
                name: r.name,
                key: queued.key,
                rev: queued.create_revision,
                lease: queued.lease,
            }),
        }))
    }

    async fn proclaim(
        &self,
        request: Request<pb::ProclaimRequest>,
    ) -> Result<Response<pb::ProclaimResponse>, Status> {
        let meta = SessionMeta::from_metadata(request.metadata()).map_err(ApiError::from)?;
        let caller = Caller::of(&request);
        let r = request.into_inner();
        self.node.check_size(&r)?;
        let leader = leader_key(r.leader)?;
        let put = RequestOp::Put(PutRequest {
            key: leader.key.clone(),
            value: r.value,
            lease: leader.lease,
            ..PutRequest::default()
        });
        let op = Op::Txn(guarded(&leader.key, leader.rev, put));
        let permit = self.node.authorize_op(&caller, &op, meta.as_ref()).await?;
        let done: Answered<oncekv_core::TxnResponse> =
            self.node.execute_as(op, meta, permit).await?;
        if !done.answer.succeeded {
            return Err(Status::unknown(NOT_LEADER));
        }
        Ok(Response::new(pb::ProclaimResponse {
            header: self.node.header(done.revision),
        }))
    }

    async fn leader(
        &self,
        request: Request<pb::LeaderRequest>,
    ) -> Result<Response<pb::LeaderResponse>, Status> {
        let caller = Caller::of(&request);
        let r = request.into_inner();
        self.node.check_size(&r)?;
        let _read_only = authorize_queue(&self.node, &caller, &r.name, None, false).await?;
        let (revision, resp) = self.node.range(&first_candidate(&r.name), false).await?;
        match resp.kvs.into_iter().next() {
            Some(kv) => Ok(Response::new(pb::LeaderResponse {
                header: self.node.header(revision),
                kv: Some(convert::key_value(kv)),
            })),
            None => Err(Status::unknown(NO_LEADER)),
        }
    }

    async fn observe(
        &self,
        request: Request<pb::LeaderRequest>,
    ) -> Result<Response<BoxStream<pb::LeaderResponse>>, Status> {
        let caller = Caller::of(&request);
        let r = request.into_inner();
        self.node.check_size(&r)?;
        let _read_only = authorize_queue(&self.node, &caller, &r.name, None, false).await?;
        // Linearizable start, as etcd's first Get; the following is from history.
        let (revision, resp) = self.node.range(&first_candidate(&r.name), false).await?;
        let (tx, rx) = mpsc::channel(OBSERVE_BUFFER);
        let node = self.node.clone();
        let first = resp.kvs.into_iter().next();
        let stop = self.stop.clone();
        tokio::spawn(async move {
            // At the stop, dropping `tx` ends the client's stream.
            let end = tokio::select! {
                end = observe(&node, &r.name, first, revision, &tx) => end,
                () = crate::runtime::stopped(stop) => Ok(()),
            };
            if let Err(status) = end {
                let _ = tx.send(Err(status)).await;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn resign(
        &self,
        request: Request<pb::ResignRequest>,
    ) -> Result<Response<pb::ResignResponse>, Status> {
        let meta = SessionMeta::from_metadata(request.metadata()).map_err(ApiError::from)?;
        let caller = Caller::of(&request);
        let r = request.into_inner();
        self.node.check_size(&r)?;
        let leader = leader_key(r.leader)?;
        let op = resign_op(&leader.key, leader.rev);
        let permit = self.node.authorize_op(&caller, &op, meta.as_ref()).await?;
        // Not leading (any more) is no error: etcd answers the header either way.
        let done: Answered<oncekv_core::TxnResponse> =
            self.node.execute_as(op, meta, permit).await?;
        Ok(Response::new(pb::ResignResponse {
            header: self.node.header(done.revision),
        }))
    }
}

type Sender = mpsc::Sender<Result<pb::LeaderResponse, Status>>;

/// Why following history stopped.
enum Stop {
    /// The client went away (or the server is stopping): end quietly.
    Gone,
    /// Tell the client.
    Failed(Status),
}

impl From<OpError> for Stop {
    fn from(e: OpError) -> Stop {
        Stop::Failed(ApiError::from(e).into())
    }
}

/// Streams the leadership of `name` from `revision` on: the leader (`first`, or the first
/// candidate to appear), each value it proclaims, and when its key goes, the next leader,
/// until the client goes away. Each step reads history from the revision after the last
/// one handled, so a value proclaimed and replaced between two wake-ups is still sent.
async fn observe(
    node: &NodeCore,
    name: &[u8],
    first: Option<KeyValue>,
    revision: i64,
    tx: &Sender,
) -> Result<(), Status> {
    let mut leader = first;
    let mut from = revision + 1;
    loop {
        let kv = match leader.take() {
            Some(kv) => kv,
            None => match next_event(node, tx, &queue::queue_range(name), &mut from, true).await {
                Ok((kv, _)) => kv,
                Err(Stop::Gone) => return Ok(()),
                Err(Stop::Failed(s)) => return Err(s),
            },
        };
        let key = kv.key.clone();
        if send(node, tx, kv).await.is_err() {
            return Ok(());
        }
        // Follow the leader's key until it is deleted.
        loop {
            match next_event(node, tx, &KeyRange::single(key.clone()), &mut from, false).await {
                Ok((kv, EventKind::Put)) => {
                    if send(node, tx, kv).await.is_err() {
                        return Ok(());
                    }
                }
                Ok((_, EventKind::Delete)) => break,
                Err(Stop::Gone) => return Ok(()),
                Err(Stop::Failed(s)) => return Err(s),
            }
        }
        // The next leader is whoever is first now (the state at the deletion's revision
        // or later: candidates that came and went meanwhile never led).
        let (revision, resp) = {
            let applied = node.applied();
            let inner = applied.read();
            let resp = inner
                .sm
                .range(&first_candidate(name))
                .map_err(|e| Status::from(ApiError::from(e)))?;
            (inner.sm.revision(), resp.1)
        };
        from = from.max(revision + 1);
        leader = resp.kvs.into_iter().next();
    }
}

async fn send(node: &NodeCore, tx: &Sender, kv: KeyValue) -> Result<(), ()> {
    let header = node.header(kv.mod_revision);
    tx.send(Ok(pb::LeaderResponse {
        header,
        kv: Some(convert::key_value(kv)),
    }))
    .await
    .map_err(|_| ())
}

/// The next event in `range` at revision `>= from` (only puts if `puts_only`), waiting
/// for new revisions as needed; moves `from` past it.
async fn next_event(
    node: &NodeCore,
    tx: &Sender,
    range: &KeyRange,
    from: &mut i64,
    puts_only: bool,
) -> Result<(KeyValue, EventKind), Stop> {
    let mut revisions = node.applied().subscribe_revision();
    loop {
        revisions.borrow_and_update();
        let batch = node.applied().read().sm.events(
            range,
            *from,
            false,
            ReadLimit::events(OBSERVE_READ),
        )?;
        for e in batch.events {
            let revision = e.kv.mod_revision;
            *from = revision + 1;
            if puts_only && e.kind != EventKind::Put {
                continue;
            }
            return Ok((e.kv, e.kind));
        }
        *from = (*from).max(batch.next);
        if batch.next <= batch.revision {
            // More history to read before waiting.
            continue;
        }
        tokio::select! {
            changed = revisions.changed() => {
                if changed.is_err() {
                    return Err(Stop::Gone);
                }
            }
            // A client that left an idle election should not keep this task.
            () = tx.closed() => return Err(Stop::Gone),
        }
    }
}
