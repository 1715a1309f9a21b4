//! What Lock and Campaign share: waiting for a turn in the queue under a name, and
//! leaving the queue when an etcd client gives up.
//!
//! The queue under `name` is the keys under `name/`, owned in create-revision order
//! ([`Op::Enqueue`] puts the caller's key in it). A waiter whose key has create revision
//! `mine` owns the name once no key under `name/` has a smaller create revision. This
//! member's applied state decides, followers included: every deletion it sees is
//! committed, so a turn it grants is one the leader would grant too.

use std::sync::Arc;

use bytes::Bytes;
use oncekv_core::{EnqueueRequest, Enqueued, KeyRange, Op, RangeRequest, SortOrder, SortTarget};
use oncekv_proto::SessionMeta;
use tonic::Status;

use crate::request_path::{Answered, NodeCore, Permit};

/// etcd's `concurrency.ErrSessionExpired`: the waiter's key went (its lease expired or was
/// revoked, or someone deleted it) before its turn came.
pub const SESSION_EXPIRED: &str = "mutex: session is expired";

/// The queue of `name`: every key under `name/`.
pub fn queue_range(name: &[u8]) -> KeyRange {
    let mut prefix = name.to_vec();
    prefix.push(b'/');
    KeyRange::prefix(prefix)
}

/// The key that must go before `mine` can own the queue: the last one created before it.
/// Waiting for that one alone (not all of them) is etcd's `waitDeletes`; when it goes, the
/// next one before `mine` (if any) is looked up.
fn blocker(node: &NodeCore, name: &[u8], mine: i64) -> Result<Option<(Bytes, i64)>, Status> {
    let req = RangeRequest {
        range: queue_range(name),
        limit: 1,
        sort_order: SortOrder::Descend,
        sort_target: SortTarget::Create,
        max_create_revision: mine - 1,
        ..RangeRequest::default()
    };
    let applied = node.applied();
    let (_, resp) = applied
        .read()
        .sm
        .range(&req)
        .map_err(|e| Status::internal(e.to_string()))?;
    Ok(resp
        .kvs
        .into_iter()
        .next()
        .map(|kv| (kv.key, kv.create_revision)))
}

/// Whether `key` exists with create revision `create`.
fn exists(node: &NodeCore, key: &[u8], create: i64) -> bool {
    node.applied()
        .read()
        .sm
        .kv()
        .get(key)
        .is_some_and(|v| v.create_revision == create)
}

/// Waits until `key` (created at `mine`) owns the queue of `name`, on this member's
/// applied state, from the revision `written` on (the enqueue may have been applied on the
/// leader first). Answers the revision at which it owns it. Fails with
/// [`SESSION_EXPIRED`] if `key` goes first: a turn is granted only to a key that still
/// exists, checked after the wait as etcd 3.5's `Mutex.Lock` does.
pub async fn wait_for_turn(
    node: &NodeCore,
    name: &[u8],
    key: &[u8],
    mine: i64,
    written: i64,
) -> Result<i64, Status> {
    let mut revisions = node.applied().subscribe_revision();
    let mut waiting_for: Option<(Bytes, i64)> = None;
    loop {
        // Mark the current revision seen before reading, so a change in between wakes
        // the wait below.
        revisions.borrow_and_update();
        let revision = node.applied().read().sm.revision();
        if revision >= written {
            if !exists(node, key, mine) {
                return Err(Status::unknown(SESSION_EXPIRED));
            }
            let still_there = waiting_for
                .as_ref()
                .is_some_and(|(k, create)| exists(node, k, *create));
            if !still_there {
                waiting_for = blocker(node, name, mine)?;
                if waiting_for.is_none() {
                    return Ok(revision);
                }
            }
        }
        if revisions.changed().await.is_err() {
            return Err(Status::unavailable("etcdserver: server stopped"));
        }
    }
}

/// Lock's and Campaign's common path: enqueue (tracked under `meta` if there is one), wait
/// for the turn, and answer the key with the revision at which it owns the queue. An
/// untracked call abandoned while it waits runs `leave(key)` (see [`LeaveOnDrop`]).
pub async fn enqueue_and_wait(
    node: &Arc<NodeCore>,
    req: EnqueueRequest,
    (meta, permit): (Option<SessionMeta>, Permit),
    leave: impl FnOnce(&Enqueued) -> Op,
) -> Result<(Enqueued, i64), Status> {
    let tracked = meta.is_some();
    let name = req.name.clone();
    let enqueued: Answered<Enqueued> = node.execute_as(Op::Enqueue(req), meta, permit).await?;
    let queued = enqueued.answer;
    let guard = LeaveOnDrop::new(node.clone(), (!tracked).then(|| leave(&queued)));
    let owned_at = wait_for_turn(
        node,
        &name,
        &queued.key,
        queued.create_revision,
        enqueued.revision,
    )
    .await;
    // Answered, or the key is gone anyway: nothing to leave. Other failures (the server
    // stopping) still try to leave, as etcd does after a failed wait.
    if owned_at.is_ok()
        || owned_at
            .as_ref()
            .is_err_and(|s| s.message() == SESSION_EXPIRED)
    {
        guard.disarm();
    }
    Ok((queued, owned_at?))
}

/// Runs `op` untracked when dropped armed: how a Lock or Campaign leaves the queue when
/// its caller goes away while waiting, as etcd's server does for its clients.
///
/// Only untracked calls get one. A tracked call (through an oncekv session) must keep its
/// key: its client retries the same seq on another connection, gets the saved enqueue and
/// waits again for the same key; deleting the key here could race that retry and leave the
/// retry believing it owns a key that is gone. The oncekv client cleans up itself, by
/// revoking the lease it locked with.
struct LeaveOnDrop {
    node: Arc<NodeCore>,
    op: Option<Op>,
}

impl LeaveOnDrop {
    fn new(node: Arc<NodeCore>, op: Option<Op>) -> LeaveOnDrop {
        LeaveOnDrop { node, op }
    }

    /// The call ended with an answer: nothing to undo.
    fn disarm(mut self) {
        self.op = None;
    }
}

impl Drop for LeaveOnDrop {
    fn drop(&mut self) {
        let Some(op) = self.op.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let node = self.node.clone();
        runtime.spawn(async move {
            // The member's own clean-up of a call it answered: nothing to check again.
            if let Err(e) = node.execute(op, None, Permit::UNCHECKED).await {
                tracing::debug!("leaving the queue of an abandoned call failed: {e}");
            }
        });
    }
}
