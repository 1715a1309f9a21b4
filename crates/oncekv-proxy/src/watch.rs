//! etcd's Watch service on the proxy. Each downstream stream gets a task that creates
//! and cancels its watchers; each watcher is a task that takes responses from its
//! source, filters them for itself and sends them down the stream.
//!
//! A watcher's source is its range's coalesced group ([`hub`]) whenever the group can
//! serve it: a watch from now on, or from a revision the group has not passed yet. A
//! watch that needs older history gets a watch of its own on the cluster, from its start
//! revision; so does a watcher that falls more than the group's buffer behind (it goes on
//! from the first revision it has not sent, so it still gets each revision once, in
//! order). Either way the per-stream queue toward the client is bounded: a client that
//! does not read stalls only its own watchers.

mod hub;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use bytes::Bytes;
use oncekv_client::{Client, Error, Watcher};
use oncekv_proto::etcdserverpb::watch_create_request::FilterType;
use oncekv_proto::etcdserverpb::watch_request::RequestUnion;
use oncekv_proto::etcdserverpb::watch_server::Watch;
use oncekv_proto::etcdserverpb::{ResponseHeader, WatchCreateRequest, WatchRequest, WatchResponse};
use oncekv_proto::mvccpb;
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::namespace::Namespace;
use crate::upstream::{Upstream, token_of};
pub(crate) use hub::Hub;
use hub::{Msg, range_options, to_msg};

/// Responses queued toward one downstream stream.
const STREAM_QUEUE: usize = 128;

#[derive(Debug)]
pub(crate) struct WatchProxy {
    pub(crate) up: Arc<Upstream>,
    pub(crate) ns: Namespace,
    pub(crate) hub: Arc<Hub>,
}

/// What every watcher of one downstream stream shares.
#[derive(Debug, Clone)]
struct StreamCtx {
    up: Arc<Upstream>,
    hub: Arc<Hub>,
    ns: Namespace,
    client: Client,
    token: Option<String>,
    out: mpsc::Sender<Result<WatchResponse, Status>>,
}

#[tonic::async_trait]
impl Watch for WatchProxy {
    async fn watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<tonic::codegen::BoxStream<WatchResponse>>, Status> {
        let token = token_of(&request)?;
        let client = self.up.client_for(&request)?;
        let requests = request.into_inner();
        let (out, responses) = mpsc::channel(STREAM_QUEUE);
        let ctx = StreamCtx {
            up: self.up.clone(),
            hub: self.hub.clone(),
            ns: self.ns.clone(),
            client,
            token,
            out,
        };
        tokio::spawn(serve_stream(ctx, requests));
        Ok(Response::new(Box::pin(ReceiverStream::new(responses))))
    }
}

/// One live downstream watcher: its task, and the last revision it has sent.
struct Running {
    task: JoinHandle<()>,
    sent: Arc<AtomicI64>,
}

async fn serve_stream(ctx: StreamCtx, mut requests: Streaming<WatchRequest>) {
    let mut watchers: HashMap<i64, Running> = HashMap::new();
    let mut next_id = 0i64;
    loop {
        let req = match requests.message().await {
            Ok(Some(req)) => req,
            // The client closed its side: etcd serves the stream's watchers on until the
            // client goes away, so one that sends its creates and half-closes (grpcurl, a
            // finite request iterator) still gets their responses.
            Ok(None) => {
                ctx.out.closed().await;
                break;
            }
            Err(_) => break,
        };
        watchers.retain(|_, w| !w.task.is_finished());
        match req.request_union {
            Some(RequestUnion::CreateRequest(create)) => {
                let id = if create.watch_id != 0 {
                    create.watch_id
                } else {
                    while watchers.contains_key(&next_id) {
                        next_id += 1;
                    }
                    next_id
                };
                if watchers.contains_key(&id) {
                    let refused = WatchResponse {
                        header: Some(ctx.hub.last_header()),
                        watch_id: -1,
                        created: true,
                        canceled: true,
                        cancel_reason: "etcdserver: duplicate watch ID".into(),
                        ..Default::default()
                    };
                    if ctx.out.send(Ok(refused)).await.is_err() {
                        break;
                    }
                    continue;
                }
                let sent = Arc::new(AtomicI64::new(0));
                let task = tokio::spawn(serve_watcher(ctx.clone(), id, create, sent.clone()));
                watchers.insert(id, Running { task, sent });
            }
            Some(RequestUnion::CancelRequest(cancel)) => {
                if let Some(w) = watchers.remove(&cancel.watch_id) {
                    w.task.abort();
                    let canceled = WatchResponse {
                        header: Some(ctx.hub.last_header()),
                        watch_id: cancel.watch_id,
                        canceled: true,
                        ..Default::default()
                    };
                    if ctx.out.send(Ok(canceled)).await.is_err() {
                        break;
                    }
                }
            }
            Some(RequestUnion::ProgressRequest(_)) => {
                // Every watcher of the stream has been sent everything up to the oldest
                // of their positions: that is the revision the reply may promise.
                let mut header = ctx.hub.last_header();
                if let Some(min) = watchers
                    .values()
                    .map(|w| w.sent.load(Ordering::Relaxed))
                    .min()
                {
                    header.revision = header.revision.min(min);
                }
                let progress = WatchResponse {
                    header: Some(header),
                    watch_id: -1,
                    ..Default::default()
                };
                if ctx.out.send(Ok(progress)).await.is_err() {
                    break;
                }
            }
            None => {}
        }
    }
    for w in watchers.into_values() {
        w.task.abort();
    }
}

/// Where a watcher's responses come from.
enum Source {
    Group(broadcast::Receiver<Arc<Msg>>),
    Own(Watcher),
}

/// One downstream watcher's filters.
#[derive(Debug, Clone, Copy)]
struct Filter {
    /// Events below this revision were sent before the watcher existed.
    from: i64,
    no_put: bool,
    no_delete: bool,
    prev_kv: bool,
    progress_notify: bool,
}

async fn serve_watcher(ctx: StreamCtx, id: i64, create: WatchCreateRequest, sent: Arc<AtomicI64>) {
    let _watcher = Counted::new(&ctx.up.metrics.downstream_watchers);
    let (mut key, mut end) = (create.key.clone(), create.range_end.clone());
    if key.is_empty() {
        // etcd reads an empty key as "\0".
        key = Bytes::from_static(&[0]);
    }
    ctx.ns.range(&mut key, &mut end);
    let mut filter = Filter {
        from: create.start_revision,
        no_put: create.filters.contains(&(FilterType::Noput as i32)),
        no_delete: create.filters.contains(&(FilterType::Nodelete as i32)),
        prev_kv: create.prev_kv,
        progress_notify: create.progress_notify,
    };
    let joined = ctx
        .hub
        .join(
            &ctx.client,
            ctx.token.clone(),
            key.clone(),
            end.clone(),
            create.start_revision,
        )
        .await;
    let (mut source, header) = match joined {
        Ok(Some(j)) => {
            filter.from = j.from;
            (Source::Group(j.rx), j.header)
        }
        Ok(None) => match own_watch(&ctx, &key, &end, filter.from).await {
            Ok((w, header)) => (Source::Own(w), header),
            Err(e) => return refuse(&ctx, id, e).await,
        },
        Err(e) => return refuse(&ctx, id, e).await,
    };
    sent.store(filter.from - 1, Ordering::Relaxed);
    let created = WatchResponse {
        header: Some(header),
        watch_id: id,
        created: true,
        ..Default::default()
    };
    if ctx.out.send(Ok(created)).await.is_err() {
        return;
    }
    // A watch of its own counts as an upstream watch for as long as the watcher has it.
    let mut own =
        matches!(source, Source::Own(_)).then(|| Counted::new(&ctx.up.metrics.upstream_watches));
    loop {
        let msg = match &mut source {
            Source::Group(rx) => match rx.recv().await {
                Ok(msg) => msg,
                Err(
                    broadcast::error::RecvError::Lagged(_) | broadcast::error::RecvError::Closed,
                ) => {
                    // Fell behind the group (or it went away): go on alone from the first
                    // revision not yet sent.
                    let from = sent.load(Ordering::Relaxed) + 1;
                    match own_watch(&ctx, &key, &end, from).await {
                        Ok((w, _)) => {
                            source = Source::Own(w);
                            own.get_or_insert_with(|| {
                                Counted::new(&ctx.up.metrics.upstream_watches)
                            });
                            continue;
                        }
                        Err(e) => Arc::new(end_msg(e)),
                    }
                }
            },
            Source::Own(w) => Arc::new(match w.next().await {
                Some(Ok(resp)) => to_msg(resp),
                Some(Err(e)) => end_msg(e),
                None => return,
            }),
        };
        let (responses, done) = respond(&ctx.ns, id, &filter, &msg, &sent);
        for resp in responses {
            if ctx.out.send(Ok(resp)).await.is_err() {
                return;
            }
        }
        if done {
            break;
        }
    }
    drop(own);
}

/// A watch of this watcher's own on the cluster, from `from`, with the header for its
/// `created` response.
async fn own_watch(
    ctx: &StreamCtx,
    key: &Bytes,
    end: &Bytes,
    from: i64,
) -> Result<(Watcher, ResponseHeader), Error> {
    let mut options = range_options(end).with_prev_kv().with_progress_notify();
    if from > 0 {
        options = options.with_start_revision(from);
    }
    let w = ctx.client.watch(key.clone(), options).await?;
    let mut header = ctx.hub.last_header();
    header.revision = header.revision.max(w.start_revision() - 1);
    Ok((w, header))
}

fn end_msg(e: Error) -> Msg {
    match e {
        Error::Compacted { compact_revision } => Msg::Compacted(compact_revision),
        Error::WatchCanceled { reason } => Msg::Failed(reason),
        e => Msg::Failed(e.to_string()),
    }
}

/// A create the proxy could not serve: created and canceled at once, with the reason
/// (etcd's shape for a refused watch).
async fn refuse(ctx: &StreamCtx, id: i64, e: Error) {
    let mut resp = WatchResponse {
        header: Some(ctx.hub.last_header()),
        watch_id: id,
        created: true,
        canceled: true,
        ..Default::default()
    };
    match end_msg(e) {
        Msg::Compacted(rev) => {
            resp.compact_revision = rev;
            resp.header = Some(ResponseHeader::default());
        }
        Msg::Failed(reason) => resp.cancel_reason = reason,
        _ => {}
    }
    let _ = ctx.out.send(Ok(resp)).await;
}

/// The response `msg` makes for this watcher (`None`: nothing for it), and whether the
/// watch ends with it.
fn respond(
    ns: &Namespace,
    id: i64,
    f: &Filter,
    msg: &Msg,
    sent: &AtomicI64,
) -> (Vec<WatchResponse>, bool) {
    match msg {
        Msg::Events { header, events } => {
            let put = mvccpb::event::EventType::Put as i32;
            let mut last = None;
            let events: Vec<mvccpb::Event> = events
                .iter()
                .filter(|e| e.kv.as_ref().is_some_and(|kv| kv.mod_revision >= f.from))
                .inspect(|e| last = e.kv.as_ref().map(|kv| kv.mod_revision))
                .filter(|e| !(f.no_put && e.r#type == put || f.no_delete && e.r#type != put))
                .map(|e| {
                    let mut e = e.clone();
                    if !f.prev_kv {
                        e.prev_kv = None;
                    }
                    ns.strip_event(&mut e);
                    e
                })
                .collect();
            if let Some(rev) = last {
                sent.fetch_max(rev, Ordering::Relaxed);
            }
            let responses = split_by_revision(events)
                .into_iter()
                .map(|events| WatchResponse {
                    header: Some(*header),
                    watch_id: id,
                    events,
                    ..Default::default()
                })
                .collect();
            (responses, false)
        }
        Msg::Progress { header } => {
            if header.revision >= f.from - 1 {
                sent.fetch_max(header.revision, Ordering::Relaxed);
            }
            let resp = f.progress_notify.then(|| WatchResponse {
                header: Some(*header),
                watch_id: id,
                ..Default::default()
            });
            (resp.into_iter().collect(), false)
        }
        Msg::Compacted(rev) => (
            vec![WatchResponse {
                header: Some(ResponseHeader::default()),
                watch_id: id,
                canceled: true,
                compact_revision: *rev,
                ..Default::default()
            }],
            true,
        ),
        Msg::Failed(reason) => (
            vec![WatchResponse {
                header: None,
                watch_id: id,
                canceled: true,
                cancel_reason: reason.clone(),
                ..Default::default()
            }],
            true,
        ),
    }
}

/// What one response to a downstream watcher carries at most, in keys and values,
/// before the next revision starts a new response. A member's catch-up batch can hold
/// 4 MiB of values and their previous values besides; clients cap what they receive (4
/// MiB by default in tonic-based ones), so the proxy hands a batch on in pieces, each
/// of whole revisions (a revision larger than this goes whole, as a member sends it).
const RESPONSE_BYTES: usize = 1 << 20;

/// `events` (in revision order) as the events of successive responses: whole
/// revisions each, cut once one holds [`RESPONSE_BYTES`]. Empty in, nothing out.
fn split_by_revision(events: Vec<mvccpb::Event>) -> Vec<Vec<mvccpb::Event>> {
    let size = |e: &mvccpb::Event| {
        let kv = |kv: &Option<mvccpb::KeyValue>| {
            kv.as_ref().map_or(0, |kv| kv.key.len() + kv.value.len())
        };
        kv(&e.kv) + kv(&e.prev_kv)
    };
    let revision = |e: &mvccpb::Event| e.kv.as_ref().map_or(0, |kv| kv.mod_revision);
    let mut out: Vec<Vec<mvccpb::Event>> = Vec::new();
    let mut bytes = 0;
    for e in events {
        let same_revision = out
            .last()
            .and_then(|chunk| chunk.last())
            .is_some_and(|last| revision(last) == revision(&e));
        if out.is_empty() || (bytes >= RESPONSE_BYTES && !same_revision) {
            out.push(Vec::new());
            bytes = 0;
        }
        bytes += size(&e);
        if let Some(chunk) = out.last_mut() {
            chunk.push(e);
        }
    }
    out
}

/// One unit of a gauge, held while something lives: counted up when made, down when
/// dropped (an aborted task included).
struct Counted(prometheus::IntGauge);

impl Counted {
    fn new(gauge: &prometheus::IntGauge) -> Counted {
        gauge.inc();
        Counted(gauge.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(revision: i64, value_len: usize) -> mvccpb::Event {
        mvccpb::Event {
            kv: Some(mvccpb::KeyValue {
                key: Bytes::from_static(b"k"),
                mod_revision: revision,
                value: Bytes::from(vec![b'v'; value_len]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_large_batch_is_split_between_revisions_only() {
        assert!(split_by_revision(Vec::new()).is_empty());
        let half = RESPONSE_BYTES / 2;
        // Revision 2 has two events; the cut may not fall between them.
        let events = vec![
            put(1, half),
            put(2, half),
            put(2, half),
            put(3, 10),
            put(4, 10),
        ];
        let chunks = split_by_revision(events);
        let revisions: Vec<Vec<i64>> = chunks
            .iter()
            .map(|c| {
                c.iter()
                    .map(|e| e.kv.as_ref().map_or(0, |kv| kv.mod_revision))
                    .collect()
            })
            .collect();
        assert_eq!(revisions, vec![vec![1, 2, 2], vec![3, 4]]);
    }
}
