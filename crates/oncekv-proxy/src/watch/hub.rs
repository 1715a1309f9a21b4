//! Coalesced watches: one watch on the cluster per (user, key range), its responses
//! broadcast to every downstream watcher of that range.
//!
//! A [`Group`] owns one upstream [`Watcher`] (which itself resumes on another member
//! when its member fails, from the first revision it has not delivered, so the group's
//! stream has each revision once, in order). The group watches from "now", asks for
//! every event's previous key-value and for progress notifications, so it serves any
//! downstream watcher of the range whatever its filters; each downstream watcher filters
//! for itself.
//!
//! **The joining rule.** The group task records the first revision it has not broadcast
//! (`next`) *before* it broadcasts a response. A watcher subscribes first and reads `next`
//! after: every response at or above what it read is then in its receiver, and anything
//! below is dropped by its own filter. So a watcher that joins at `next = n` is told it
//! was created at revision `n - 1` and gets every event from `n` on, exactly once.
//!
//! **Lifetime.** Joining happens under the hub's lock, and a group with no receivers is
//! removed under the same lock, so no watcher ever joins a group that is going away. A
//! group whose upstream watch ends (compacted, or the cluster unreachable past the
//! client's retry budget) is removed before it broadcasts the end.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use bytes::Bytes;
use oncekv_client::{Client, Error, EventType, WatchOptions};
use oncekv_proto::etcdserverpb::ResponseHeader;
use oncekv_proto::mvccpb;
use tokio::sync::{broadcast, watch};

use crate::metrics::Metrics;

/// Responses a group keeps for its slowest watcher. A watcher further behind leaves the
/// group and catches up on a watch of its own (see `watch.rs`), so a slow reader costs
/// the cluster one watch, never the proxy unbounded memory. The ring holds its last this
/// many responses whether or not anyone still needs them, so it is what a busy group
/// costs in memory: small, since falling behind it is cheap.
const GROUP_BUFFER: usize = 128;
/// How often a group with no watchers left checks whether it may end.
const IDLE_CHECK: Duration = Duration::from_millis(500);

/// What a group (or a private watch) hands its watchers.
#[derive(Debug)]
pub(crate) enum Msg {
    /// Events of whole revisions, in order, each with its previous key-value when
    /// history had it.
    Events {
        header: ResponseHeader,
        events: Vec<mvccpb::Event>,
    },
    /// Every event up to `header.revision` has been sent.
    Progress { header: ResponseHeader },
    /// History below this revision is compacted away: the watch cannot go on.
    Compacted(i64),
    /// The watch ended for another reason.
    Failed(String),
}

/// Who may share a group: the same token (so the same rights) and the same range.
type GroupKey = (Option<String>, Bytes, Bytes);

#[derive(Debug)]
struct Group {
    tx: broadcast::Sender<Arc<Msg>>,
    /// `None` until the upstream watch is created; then its outcome.
    started: watch::Receiver<Option<Result<(), String>>>,
    /// The first revision not yet broadcast, and the newest header seen.
    state: Mutex<(i64, ResponseHeader)>,
}

/// A downstream watcher's place in a group.
#[derive(Debug)]
pub(crate) struct Joined {
    pub(crate) rx: broadcast::Receiver<Arc<Msg>>,
    /// The first revision the watcher reports (`next` when it joined, or its own later
    /// start revision).
    pub(crate) from: i64,
    /// The header for its `created` response (at revision `from - 1` for a watch from
    /// now on).
    pub(crate) header: ResponseHeader,
}

/// Every live group.
#[derive(Debug)]
pub(crate) struct Hub {
    groups: Mutex<HashMap<GroupKey, Arc<Group>>>,
    metrics: Arc<Metrics>,
    /// The newest header any upstream watch has seen (for responses that have none of
    /// their own, such as a progress reply).
    last_header: Mutex<ResponseHeader>,
}

impl Hub {
    pub(crate) fn new(metrics: Arc<Metrics>) -> Arc<Hub> {
        Arc::new(Hub {
            groups: Mutex::new(HashMap::new()),
            metrics,
            last_header: Mutex::new(ResponseHeader::default()),
        })
    }

    pub(crate) fn last_header(&self) -> ResponseHeader {
        *self
            .last_header
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn note_header(&self, h: &ResponseHeader) {
        let mut last = self
            .last_header
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if h.revision >= last.revision {
            *last = *h;
        }
    }

    /// Joins (or starts) the group of `(token, key, end)` for a watcher reporting from
    /// `start` (0: from now on). `None` when the group is already past `start`: the
    /// watcher needs history the group has not kept, and must watch on its own.
    pub(crate) async fn join(
        self: &Arc<Self>,
        client: &Client,
        token: Option<String>,
        key: Bytes,
        end: Bytes,
        start: i64,
    ) -> Result<Option<Joined>, Error> {
        let group_key = (token, key, end);
        let (group, rx) = {
            let mut groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
            let group = match groups.get(&group_key) {
                Some(g) => g.clone(),
                None => {
                    let g = self.start_group(client.clone(), group_key.clone());
                    groups.insert(group_key.clone(), g.clone());
                    g
                }
            };
            let rx = group.tx.subscribe();
            (group, rx)
        };
        let mut started = group.started.clone();
        let outcome = started
            .wait_for(Option::is_some)
            .await
            .map(|s| s.clone().unwrap_or(Ok(())));
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(reason)) => return Err(Error::WatchCanceled { reason }),
            Err(_) => {
                return Err(Error::WatchCanceled {
                    reason: "oncekv-proxy: the upstream watch ended".into(),
                });
            }
        }
        let (next, mut header) = *group.state.lock().unwrap_or_else(PoisonError::into_inner);
        if start > 0 && start < next {
            return Ok(None);
        }
        let from = if start > 0 { start } else { next };
        header.revision = header.revision.max(next - 1);
        Ok(Some(Joined { rx, from, header }))
    }

    fn start_group(self: &Arc<Self>, client: Client, key: GroupKey) -> Arc<Group> {
        let (tx, _) = broadcast::channel(GROUP_BUFFER);
        let (started_tx, started) = watch::channel(None);
        let group = Arc::new(Group {
            tx,
            started,
            state: Mutex::new((0, ResponseHeader::default())),
        });
        let hub = Arc::downgrade(self);
        tokio::spawn(run_group(hub, group.clone(), client, key, started_tx));
        group
    }

    /// Removes `group` if it is still `key`'s and (unless `force`) nobody listens.
    fn remove(&self, key: &GroupKey, group: &Arc<Group>, force: bool) -> bool {
        let mut groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        let ours = groups.get(key).is_some_and(|g| Arc::ptr_eq(g, group));
        if ours && (force || group.tx.receiver_count() == 0) {
            groups.remove(key);
            return true;
        }
        !ours
    }
}

/// Why a watch ended, as etcd's `cancel_reason` (the member's own words for a refusal).
pub(crate) fn reason(e: Error) -> String {
    match e {
        Error::WatchCanceled { reason } => reason,
        e => e.to_string(),
    }
}

/// The options every watch the proxy opens upstream uses for `end`.
pub(crate) fn range_options(end: &Bytes) -> WatchOptions {
    if end.is_empty() {
        WatchOptions::new()
    } else {
        WatchOptions::new().with_range_end(end.to_vec())
    }
}

async fn run_group(
    hub: Weak<Hub>,
    group: Arc<Group>,
    client: Client,
    key: GroupKey,
    started: watch::Sender<Option<Result<(), String>>>,
) {
    let options = range_options(&key.2).with_prev_kv().with_progress_notify();
    let mut watcher = match client.watch(key.1.clone(), options).await {
        Ok(w) => w,
        Err(e) => {
            if let Some(hub) = hub.upgrade() {
                hub.remove(&key, &group, true);
            }
            let _ = started.send(Some(Err(reason(e))));
            return;
        }
    };
    let Some(metrics) = hub.upgrade().map(|h| h.metrics.clone()) else {
        return;
    };
    metrics.upstream_watches.inc();
    {
        let mut state = group.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.0 = watcher.start_revision();
        if let Some(h) = hub.upgrade() {
            state.1 = h.last_header();
        }
        state.1.revision = watcher.start_revision() - 1;
    }
    let _ = started.send(Some(Ok(())));
    let mut idle = tokio::time::interval(IDLE_CHECK);
    loop {
        let item = tokio::select! {
            item = watcher.next() => item,
            _ = idle.tick() => {
                let gone = hub.upgrade().is_none_or(|h| h.remove(&key, &group, false));
                if gone {
                    break;
                }
                continue;
            }
        };
        let msg = match item {
            Some(Ok(resp)) => {
                let msg = to_msg(resp);
                let (next, header) = match &msg {
                    Msg::Events { header, events } => (
                        events
                            .last()
                            .and_then(|e| e.kv.as_ref())
                            .map_or(0, |kv| kv.mod_revision)
                            + 1,
                        *header,
                    ),
                    Msg::Progress { header } => (header.revision + 1, *header),
                    _ => (0, ResponseHeader::default()),
                };
                if let Some(h) = hub.upgrade() {
                    h.note_header(&header);
                }
                // Before the broadcast: see the joining rule in the module doc.
                let mut state = group.state.lock().unwrap_or_else(PoisonError::into_inner);
                state.0 = state.0.max(next);
                state.1 = header;
                msg
            }
            Some(Err(Error::Compacted { compact_revision })) => Msg::Compacted(compact_revision),
            Some(Err(e)) => Msg::Failed(reason(e)),
            None => Msg::Failed("oncekv-proxy: the upstream watch ended".into()),
        };
        let end = matches!(msg, Msg::Compacted(_) | Msg::Failed(_));
        if end && let Some(h) = hub.upgrade() {
            h.remove(&key, &group, true);
        }
        let _ = group.tx.send(Arc::new(msg));
        if end {
            break;
        }
    }
    metrics.upstream_watches.dec();
    watcher.cancel().await;
}

/// A client watch response as etcd's wire types.
pub(crate) fn to_msg(resp: oncekv_client::WatchResponse) -> Msg {
    let h = resp.header;
    let header = ResponseHeader {
        cluster_id: h.cluster_id,
        member_id: h.member_id,
        revision: h.revision,
        raft_term: h.raft_term,
    };
    if resp.events.is_empty() {
        return Msg::Progress { header };
    }
    let events = resp
        .events
        .into_iter()
        .map(|e| mvccpb::Event {
            r#type: match e.kind {
                EventType::Put => mvccpb::event::EventType::Put as i32,
                EventType::Delete => mvccpb::event::EventType::Delete as i32,
            },
            kv: Some(e.kv.into()),
            prev_kv: e.prev_kv.map(Into::into),
        })
        .collect();
    Msg::Events { header, events }
}
