//! etcd's Watch service: one bidirectional stream per call, on which a client creates
//! and cancels watchers, asks for progress, and receives its watchers' events.
//!
//! Every member serves watches from its own applied state, followers included. One task
//! per stream ([`StreamTask`]) owns the stream's watchers; a watcher is a key range and
//! `next`, the first revision it has not been given. Whenever the applied revision
//! passes a watcher's `next` (the state machine publishes it, see
//! [`Applied::subscribe_revision`](crate::sm_store::Applied::subscribe_revision)), the
//! task reads the watcher's events from history in bounded batches and sends them.
//! Replaying an old `start_revision` and following live writes are the same loop, so a
//! watcher gets each revision exactly once, in order, without gaps, and a snapshot
//! install (which brings its history along) changes nothing for it. Responses go
//! through a bounded channel: a client that reads slowly makes the task wait while its
//! watchers fall behind in history, instead of the server buffering for it. A watcher
//! is cancelled only when history it still needs has been compacted.
//!
//! What a client sees follows etcd 3.4 (`etcdserver/api/v3rpc/watch.go`,
//! `mvcc/watchable_store.go`, `mvcc/watcher.go`, `mvcc/watcher_group.go`):
//! - create: `created`, the header at the current revision and the watcher's id (the
//!   client's own, or the smallest unused one from the stream's counter). An empty range
//!   or an id already in use on the stream: `watch_id` -1, `created` and `canceled`,
//!   with etcd's `cancel_reason`. An empty key means `"\0"`; `range_end` `"\0"` means
//!   every key from `key` on. `start_revision` 0 means the current revision + 1.
//! - events: one response per batch, header at the store revision when they were read
//!   (what etcd sends a watcher catching up). Filtered-out events are not sent; a batch
//!   left empty sends nothing.
//! - compacted: a watcher that needs revisions below the compacted revision gets
//!   `compact_revision` and `canceled` with a header at revision 0 (as etcd's does), no
//!   `cancel_reason`; its id stays taken until the client cancels it, as in etcd.
//! - cancel: `canceled` with the header at the current revision; an unknown id is
//!   ignored.
//! - progress request: `watch_id` -1 with the header at the revision current when it
//!   arrived. etcd 3.4.23 (the version checked) sends it at once, possibly ahead of
//!   events at or below that revision (etcd issue 15220; later releases, 3.4 included,
//!   wait until the stream's watchers are synced, PR 15237); here it is sent once every
//!   watcher of the stream has been given every event up to it, so the revision it
//!   reports is a promise. A watcher waiting for a future `start_revision` does not hold
//!   it back.
//! - `progress_notify`: every [`NodeConfig::watch_progress_notify_interval`] a watcher
//!   that is caught up and got no events since the last tick gets an empty response with
//!   its id and the current revision.
//! - `fragment`: a response larger than the server's request limit (plus gRPC's
//!   allowance) is split between events, `fragment` set on all parts but the last.
//!
//! [`NodeConfig::watch_progress_notify_interval`]: crate::config::NodeConfig::watch_progress_notify_interval

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use oncekv_core::{KeyRange, OpError, ReadLimit};
use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio::time::MissedTickBehavior;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::BoxStream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use super::convert;
use crate::auth::{Caller, Need};
use crate::error::{ApiError, ProposeError};
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::watch_create_request::FilterType;
use crate::pb::etcdserverpb::watch_server::Watch;
use crate::pb::mvccpb;
use crate::request_path::NodeCore;

/// etcd's `clientv3.AutoWatchID`: the client leaves the id to the server.
const AUTO_WATCH_ID: i64 = 0;
/// etcd's `clientv3.InvalidWatchID`: a refused create, or a response for the whole
/// stream (progress).
const INVALID_WATCH_ID: i64 = -1;
/// etcd's `mvcc.ErrEmptyWatcherRange`.
const EMPTY_RANGE: &str = "mvcc: watcher range is empty";
/// etcd's `mvcc.ErrWatcherDuplicateID`.
const DUPLICATE_ID: &str = "mvcc: duplicate watch ID provided on the WatchStream";

/// Responses a stream may have queued for its client; beyond that, the stream's task
/// waits for the client to read. Bounds a stream's memory to this many responses.
const STREAM_BUFFER: usize = 64;
/// What is read from history for one watcher at a time: up to 256 events or 4 MiB of keys
/// and values, whichever comes first (a batch never splits a revision, so it may hold
/// more when one revision changed more keys). With [`STREAM_BUFFER`] this bounds what a
/// stream holds for a client that does not read.
const PER_READ: ReadLimit = ReadLimit {
    events: 256,
    bytes: 4 << 20,
};
/// A require-leader stream ends after this many election timeouts without a leader,
/// as etcd's does (`v3rpc/interceptor.go`, `maxNoLeaderCnt`).
const NO_LEADER_ELECTION_TIMEOUTS: u32 = 3;

#[derive(Debug, Clone)]
pub struct WatchService {
    pub node: Arc<NodeCore>,
    /// The node stopping: every stream ends, so that shutdown does not wait on clients.
    pub stop: watch::Receiver<bool>,
}

/// Resolves once the node is stopping (or gone). The channel's guard is dropped inside,
/// so a task awaiting this stays `Send`.
async fn stopping(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

fn requires_leader(metadata: &MetadataMap) -> bool {
    metadata
        .get(oncekv_proto::metadata::REQUIRE_LEADER_KEY)
        .is_some_and(|v| v.as_bytes() == oncekv_proto::metadata::REQUIRE_LEADER_VALUE.as_bytes())
}

#[tonic::async_trait]
impl Watch for WatchService {
    async fn watch(
        &self,
        request: Request<Streaming<pb::WatchRequest>>,
    ) -> Result<Response<BoxStream<pb::WatchResponse>>, Status> {
        let require_leader = requires_leader(request.metadata());
        if require_leader && self.node.leader().is_none() {
            return Err(ApiError::from(ProposeError::NoLeader).into());
        }
        let caller = Caller::of(&request);
        Ok(Response::new(Box::pin(serve_stream(
            self.node.clone(),
            self.stop.clone(),
            request.into_inner(),
            require_leader,
            caller,
        ))))
    }
}

/// Serves one watch stream whose requests come from `requests` (a gRPC stream, or the
/// JSON gateway's single create request): the responses, until the receiver is dropped.
/// Every watcher `caller` creates needs read permission on its range (with auth on).
pub fn serve_stream<S>(
    node: Arc<NodeCore>,
    stop: watch::Receiver<bool>,
    requests: S,
    require_leader: bool,
    caller: Caller,
) -> ReceiverStream<Result<pb::WatchResponse, Status>>
where
    S: futures::Stream<Item = Result<pb::WatchRequest, Status>> + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    let mut task = StreamTask::new(node, tx, stop);
    task.caller = caller;
    tokio::spawn(task.run(requests, require_leader));
    ReceiverStream::new(rx)
}

/// One watcher of a stream.
#[derive(Debug)]
struct Watcher {
    range: KeyRange,
    /// The first revision this watcher has not been given: every event below it was
    /// sent (or filtered out), none at or above it.
    next: i64,
    prev_kv: bool,
    no_put: bool,
    no_delete: bool,
    fragment: bool,
    progress_notify: bool,
    /// Events were sent since the last progress tick, which makes that tick's progress
    /// response redundant (etcd elides it too).
    sent_since_tick: bool,
    /// Cancelled because history it needed was compacted. Kept so that its id stays
    /// taken until the client cancels it, as etcd keeps it.
    compacted: bool,
}

impl Watcher {
    /// Whether history holds revisions this watcher has not been given.
    fn behind(&self, revision: i64) -> bool {
        !self.compacted && self.next <= revision
    }

    fn wants(&self, e: &mvccpb::Event) -> bool {
        let put = e.r#type == mvccpb::event::EventType::Put as i32;
        !(put && self.no_put || !put && self.no_delete)
    }
}

/// A stream's watchers by id, and the ids it gives out.
#[derive(Debug, Default)]
struct Watchers {
    by_id: BTreeMap<i64, Watcher>,
    /// Where the search for a server-chosen id starts. Only grows, as etcd's does, so a
    /// cancelled watcher's id is not handed out again by the server.
    next_auto: i64,
}

impl Watchers {
    /// The id for a new watcher: `requested` if the client chose one and it is free,
    /// otherwise the first free id from the counter. `None`: the chosen id is taken.
    fn assign_id(&mut self, requested: i64) -> Option<i64> {
        if requested != AUTO_WATCH_ID {
            return (!self.by_id.contains_key(&requested)).then_some(requested);
        }
        while self.by_id.contains_key(&self.next_auto) {
            self.next_auto += 1;
        }
        let id = self.next_auto;
        self.next_auto += 1;
        Some(id)
    }

    fn behind(&self, revision: i64) -> impl Iterator<Item = i64> + '_ {
        self.by_id
            .iter()
            .filter(move |(_, w)| w.behind(revision))
            .map(|(id, _)| *id)
    }
}

/// The stream is over: the client went away or the node is stopping.
#[derive(Debug)]
struct Ended;

/// What a stream's task owns. It alone reads the client's requests and writes the
/// responses, so a watcher's created response always precedes its events, and its
/// events go out in the order they were read.
#[derive(Debug)]
struct StreamTask {
    node: Arc<NodeCore>,
    /// Who opened the stream (checked at every create, with auth on).
    caller: Caller,
    tx: mpsc::Sender<Result<pb::WatchResponse, Status>>,
    stop: watch::Receiver<bool>,
    watchers: Watchers,
    /// The highest applied revision this task has seen. The applied state may be ahead;
    /// it is never behind.
    revision: i64,
    /// Unanswered progress requests: the revision to report and how many asked. Later
    /// requests raise the revision, which is still a true answer for the earlier ones,
    /// so a client sending many costs no memory.
    progress_wanted: Option<(i64, usize)>,
    /// A response above this is split when its watcher asked for fragments.
    max_response_bytes: usize,
}

impl StreamTask {
    fn new(
        node: Arc<NodeCore>,
        tx: mpsc::Sender<Result<pb::WatchResponse, Status>>,
        stop: watch::Receiver<bool>,
    ) -> StreamTask {
        let max_response_bytes =
            node.config().max_request_bytes + crate::config::GRPC_OVERHEAD_BYTES;
        StreamTask {
            node,
            caller: Caller::default(),
            tx,
            stop,
            watchers: Watchers::default(),
            revision: 0,
            progress_wanted: None,
            max_response_bytes,
        }
    }

    async fn run<S>(mut self, mut inbound: S, require_leader: bool)
    where
        S: futures::Stream<Item = Result<pb::WatchRequest, Status>> + Unpin,
    {
        use futures::StreamExt;
        let mut revisions = self.node.applied().subscribe_revision();
        let period = self.node.config().watch_progress_notify_interval;
        let mut progress_ticks =
            tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        progress_ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let election_timeout = Duration::from_millis(self.node.config().election_timeout_ms);
        let mut leader_checks = tokio::time::interval(election_timeout);
        leader_checks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut leaderless_checks = 0;
        let (closed, mut stop) = (self.tx.clone(), self.stop.clone());
        // The client may close its half of the stream and keep reading: as with etcd,
        // its watchers are served until it cancels the call.
        let mut reading = true;
        let ended = loop {
            self.revision = self.revision.max(*revisions.borrow_and_update());
            if self.answer_progress().await.is_err() {
                break None;
            }
            let behind = self.watchers.behind(self.revision).next().is_some();
            let step = tokio::select! {
                // Requests first: a cancel should not wait for a long catch-up.
                biased;
                () = stopping(&mut stop) => break Some(ProposeError::Stopped),
                () = closed.closed() => break None,
                msg = inbound.next(), if reading => match msg {
                    Some(Ok(req)) => self.handle(req).await,
                    None => {
                        reading = false;
                        Ok(())
                    }
                    Some(Err(status)) => {
                        tracing::debug!("watch stream: {status}");
                        break None;
                    }
                },
                changed = revisions.changed() => changed.map_err(|_| Ended),
                _ = progress_ticks.tick() => self.progress_tick().await,
                _ = leader_checks.tick(), if require_leader => {
                    if self.node.leader().is_some() {
                        leaderless_checks = 0;
                    } else {
                        leaderless_checks += 1;
                        if leaderless_checks >= NO_LEADER_ELECTION_TIMEOUTS {
                            break Some(ProposeError::NoLeader);
                        }
                    }
                    Ok(())
                }
                () = std::future::ready(()), if behind => self.catch_up().await,
            };
            if step.is_err() {
                break None;
            }
        };
        if let Some(reason) = ended {
            // Best effort: a client that reads learns why, and goes to another member.
            let _ = self.tx.try_send(Err(ApiError::from(reason).into()));
        }
    }

    /// The applied state's current revision, which also moves `self.revision` up.
    fn current_revision(&mut self) -> i64 {
        let revision = self.node.applied().read().sm.revision();
        self.revision = self.revision.max(revision);
        revision
    }

    async fn send(&mut self, resp: pb::WatchResponse) -> Result<(), Ended> {
        tokio::select! {
            sent = self.tx.send(Ok(resp)) => sent.map_err(|_| Ended),
            () = stopping(&mut self.stop) => Err(Ended),
        }
    }

    async fn handle(&mut self, req: pb::WatchRequest) -> Result<(), Ended> {
        use pb::watch_request::RequestUnion;
        match req.request_union {
            Some(RequestUnion::CreateRequest(c)) => self.create(c).await,
            Some(RequestUnion::CancelRequest(c)) => self.cancel(c.watch_id).await,
            Some(RequestUnion::ProgressRequest(_)) => {
                let revision = self.current_revision();
                let wanted = self.progress_wanted.get_or_insert((revision, 0));
                *wanted = (wanted.0.max(revision), wanted.1 + 1);
                Ok(())
            }
            // etcd ignores a request it does not know rather than ending the stream.
            None => Ok(()),
        }
    }

    async fn create(&mut self, c: pb::WatchCreateRequest) -> Result<(), Ended> {
        let current = self.current_revision();
        let key = if c.key.is_empty() {
            // etcd: "\0" is the smallest key.
            Bytes::from_static(b"\0")
        } else {
            c.key
        };
        let empty = !c.range_end.is_empty() && c.range_end[..] != [0] && key >= c.range_end;
        let denied = match self
            .node
            .authorize(&self.caller, &[Need::Read(&key, &c.range_end)])
            .await
        {
            Ok(_) => None,
            Err(e) => Some(e.to_string()),
        };
        let id = if let Some(reason) = &denied {
            Err(reason.as_str())
        } else if empty {
            Err(EMPTY_RANGE)
        } else {
            self.watchers.assign_id(c.watch_id).ok_or(DUPLICATE_ID)
        };
        let id = match id {
            Ok(id) => id,
            Err(reason) => {
                return self
                    .send(pb::WatchResponse {
                        header: self.node.header(current),
                        watch_id: INVALID_WATCH_ID,
                        created: true,
                        canceled: true,
                        cancel_reason: reason.into(),
                        ..Default::default()
                    })
                    .await;
            }
        };
        let filters = |f: FilterType| c.filters.contains(&(f as i32));
        let watcher = Watcher {
            range: KeyRange {
                key,
                range_end: c.range_end,
            },
            // A negative start is treated as the oldest revision (etcd answers it as
            // compacted only by an accident of its initial compacted revision, -1).
            next: match c.start_revision {
                0 => current + 1,
                start => start.max(1),
            },
            prev_kv: c.prev_kv,
            no_put: filters(FilterType::Noput),
            no_delete: filters(FilterType::Nodelete),
            fragment: c.fragment,
            progress_notify: c.progress_notify,
            sent_since_tick: false,
            compacted: false,
        };
        self.watchers.by_id.insert(id, watcher);
        self.send(pb::WatchResponse {
            header: self.node.header(current),
            watch_id: id,
            created: true,
            ..Default::default()
        })
        .await
    }

    async fn cancel(&mut self, id: i64) -> Result<(), Ended> {
        if self.watchers.by_id.remove(&id).is_none() {
            return Ok(());
        }
        let current = self.current_revision();
        self.send(pb::WatchResponse {
            header: self.node.header(current),
            watch_id: id,
            canceled: true,
            ..Default::default()
        })
        .await
    }

    /// One batch for every watcher that is behind, round-robin, so that one watcher
    /// replaying a long history does not starve the others on the stream.
    async fn catch_up(&mut self) -> Result<(), Ended> {
        let behind: Vec<i64> = self.watchers.behind(self.revision).collect();
        for id in behind {
            self.catch_up_one(id).await?;
        }
        Ok(())
    }

    async fn catch_up_one(&mut self, id: i64) -> Result<(), Ended> {
        let Some(w) = self.watchers.by_id.get_mut(&id) else {
            return Ok(());
        };
        // The lock is held for the read only, never across an await.
        let read = {
            let applied = self.node.applied().read();
            applied
                .sm
                .events(&w.range, w.next, w.prev_kv, PER_READ)
                .map_err(|e| (e, applied.sm.compacted_revision()))
        };
        let batch = match read {
            Ok(batch) => batch,
            Err((OpError::Compacted, compact_revision)) => {
                w.compacted = true;
                return self
                    .send(pb::WatchResponse {
                        // etcd's compaction notice carries no revision in its header.
                        header: self.node.header(0),
                        watch_id: id,
                        canceled: true,
                        compact_revision,
                        ..Default::default()
                    })
                    .await;
            }
            Err((e, _)) => {
                // The core answers a history read with events or Compacted only.
                tracing::error!(watch_id = id, "reading watch history: {e}");
                w.compacted = true;
                return self
                    .send(pb::WatchResponse {
                        header: self.node.header(0),
                        watch_id: id,
                        canceled: true,
                        cancel_reason: e.to_string(),
                        ..Default::default()
                    })
                    .await;
            }
        };
        self.revision = self.revision.max(batch.revision);
        if batch.next <= w.next {
            // A read from a revision history holds must move past it; otherwise this
            // watcher would be read again and again. A core bug: stop the watcher
            // rather than spin.
            tracing::error!(
                watch_id = id,
                next = w.next,
                ?batch,
                "watch history read made no progress"
            );
            w.compacted = true;
            return Ok(());
        }
        w.next = batch.next;
        let events: Vec<_> = batch
            .events
            .into_iter()
            .map(convert::event)
            .filter(|e| w.wants(e))
            .collect();
        if events.is_empty() {
            return Ok(());
        }
        w.sent_since_tick = true;
        let fragment = w.fragment;
        let resp = pb::WatchResponse {
            header: self.node.header(batch.revision),
            watch_id: id,
            events,
            ..Default::default()
        };
        if !fragment {
            return self.send(resp).await;
        }
        for part in fragments(resp, self.max_response_bytes) {
            self.send(part).await?;
        }
        Ok(())
    }

    /// Answers the progress requests once no watcher is behind the revision they report.
    async fn answer_progress(&mut self) -> Result<(), Ended> {
        let Some((revision, count)) = self.progress_wanted else {
            return Ok(());
        };
        if self.watchers.behind(revision).next().is_some() {
            return Ok(());
        }
        self.progress_wanted = None;
        for _ in 0..count {
            self.send(self.progress(INVALID_WATCH_ID, revision)).await?;
        }
        Ok(())
    }

    /// A response without events telling `watch_id` (or, with -1, the stream) that every
    /// event up to `revision` has been sent.
    fn progress(&self, watch_id: i64, revision: i64) -> pb::WatchResponse {
        pb::WatchResponse {
            header: self.node.header(revision),
            watch_id,
            ..Default::default()
        }
    }

    /// The periodic progress of `progress_notify` watchers: only a watcher that is
    /// caught up (so the revision is a promise) and got no events since the last tick.
    async fn progress_tick(&mut self) -> Result<(), Ended> {
        let revision = self.revision;
        let mut due = Vec::new();
        for (id, w) in &mut self.watchers.by_id {
            if w.progress_notify && !w.compacted && !w.sent_since_tick && !w.behind(revision) {
                due.push(*id);
            }
            w.sent_since_tick = false;
        }
        for id in due {
            self.send(self.progress(id, revision)).await?;
        }
        Ok(())
    }
}

/// `resp` as etcd sends it to a watcher that asked for fragments: whole if it is under
/// `max_bytes` encoded or has fewer than two events; otherwise split between events into
/// parts each under `max_bytes` (a part of one event may exceed it), `fragment` set on
/// every part but the last.
fn fragments(resp: pb::WatchResponse, max_bytes: usize) -> Vec<pb::WatchResponse> {
    if resp.events.len() < 2 || resp.encoded_len() < max_bytes {
        return vec![resp];
    }
    let mut template = resp;
    let events = std::mem::take(&mut template.events);
    template.fragment = true;
    let base = template.encoded_len();
    let part = |events: Vec<mvccpb::Event>| pb::WatchResponse {
        events,
        ..template.clone()
    };
    let mut parts = Vec::new();
    let (mut current, mut size) = (Vec::new(), base);
    for e in events {
        // The event's field in the response: tag 11, length, message.
        let len = prost::encoding::message::encoded_len(11, &e);
        if !current.is_empty() && size + len >= max_bytes {
            parts.push(part(std::mem::take(&mut current)));
            size = base;
        }
        size += len;
        current.push(e);
    }
    let mut last = part(current);
    last.fragment = false;
    parts.push(last);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, value_len: usize, revision: i64) -> mvccpb::Event {
        mvccpb::Event {
            r#type: mvccpb::event::EventType::Put as i32,
            kv: Some(mvccpb::KeyValue {
                key: Bytes::copy_from_slice(key.as_bytes()),
                create_revision: revision,
                mod_revision: revision,
                version: 1,
                value: Bytes::from(vec![b'x'; value_len]),
                lease: 0,
            }),
            prev_kv: None,
        }
    }

    fn response(events: Vec<mvccpb::Event>) -> pb::WatchResponse {
        pb::WatchResponse {
            header: Some(pb::ResponseHeader {
                cluster_id: 1,
                member_id: 2,
                revision: 99,
                raft_term: 3,
            }),
            watch_id: 7,
            events,
            ..Default::default()
        }
    }

    // A client reassembles fragments by concatenating events until `fragment` is false:
    // every event must arrive once, in order, and every part must fit the limit.
    #[test]
    fn large_response_is_split_into_fragments_under_the_limit() {
        let events: Vec<_> = (1..=10).map(|i| put(&format!("k{i}"), 300, i)).collect();
        let whole = response(events.clone());
        let max = 1000;
        assert!(whole.encoded_len() >= max);
        let parts = fragments(whole, max);
        assert!(parts.len() > 1, "{} parts", parts.len());
        for (i, p) in parts.iter().enumerate() {
            assert_eq!(p.fragment, i + 1 < parts.len(), "part {i}");
            assert!(p.encoded_len() < max, "part {i}: {} bytes", p.encoded_len());
            assert!(!p.events.is_empty());
            assert_eq!((p.watch_id, p.header), (7, whole_header()));
        }
        let rejoined: Vec<_> = parts.into_iter().flat_map(|p| p.events).collect();
        assert_eq!(rejoined, events);
    }

    fn whole_header() -> Option<pb::ResponseHeader> {
        response(Vec::new()).header
    }

    // etcd never splits a response that fits, nor a single event however large: the
    // client must get it whole.
    #[test]
    fn small_response_or_single_event_is_sent_whole() {
        let small = response(vec![put("a", 10, 1), put("b", 10, 2)]);
        assert_eq!(fragments(small.clone(), 10_000), vec![small]);
        let big = response(vec![put("a", 5000, 1)]);
        assert_eq!(fragments(big.clone(), 1000), vec![big]);
        // Events each larger than the limit go one per part.
        let parts = fragments(response(vec![put("a", 2000, 1), put("b", 2000, 2)]), 1000);
        assert_eq!(parts.len(), 2);
        assert!(parts[0].fragment && !parts[1].fragment);
    }

    // etcd's ids: the server hands out the smallest unused id from a counter that only
    // grows; a client-chosen id must be free on the stream.
    #[test]
    fn watch_ids_skip_taken_ids_and_refuse_duplicates() {
        let mut ws = Watchers::default();
        let watcher = || Watcher {
            range: KeyRange::default(),
            next: 1,
            prev_kv: false,
            no_put: false,
            no_delete: false,
            fragment: false,
            progress_notify: false,
            sent_since_tick: false,
            compacted: false,
        };
        assert_eq!(ws.assign_id(1), Some(1));
        ws.by_id.insert(1, watcher());
        assert_eq!(ws.assign_id(1), None, "a taken id is refused");
        assert_eq!(ws.assign_id(AUTO_WATCH_ID), Some(0));
        ws.by_id.insert(0, watcher());
        assert_eq!(ws.assign_id(AUTO_WATCH_ID), Some(2), "skips the client's 1");
        ws.by_id.insert(2, watcher());
        ws.by_id.remove(&0);
        assert_eq!(
            ws.assign_id(AUTO_WATCH_ID),
            Some(3),
            "a cancelled id is not handed out again"
        );
        assert_eq!(ws.assign_id(0), Some(4));
        assert_eq!(
            ws.assign_id(0),
            Some(5),
            "auto ids are distinct even before use"
        );
    }

    #[test]
    fn filters_drop_the_named_event_types() {
        let mut w = Watcher {
            range: KeyRange::default(),
            next: 1,
            prev_kv: false,
            no_put: true,
            no_delete: false,
            fragment: false,
            progress_notify: false,
            sent_since_tick: false,
            compacted: false,
        };
        let mut delete = put("a", 0, 2);
        delete.r#type = mvccpb::event::EventType::Delete as i32;
        assert!(!w.wants(&put("a", 1, 1)));
        assert!(w.wants(&delete));
        (w.no_put, w.no_delete) = (false, true);
        assert!(w.wants(&put("a", 1, 1)));
        assert!(!w.wants(&delete));
    }
}
