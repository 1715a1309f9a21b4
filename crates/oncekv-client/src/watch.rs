//! Watch: the changes to a key range, as a stream that outlives the member serving it.
//!
//! Each [`Watcher`] has its own gRPC `Watch` stream to one member, run by a background
//! task. The task remembers how far delivery has got (the [`Cursor`]): the first revision
//! not yet delivered. When the stream fails (the member stopped, the connection was reset
//! or went silent), the task opens a stream to another member and creates the watch again
//! from exactly that revision. Every member serves watches from its own applied history,
//! so the resumed watch replays what the caller has not seen and goes on live: each
//! revision is delivered once, in order, with no gap.
//!
//! That rests on three promises of the server (etcd makes the same ones):
//! - a watch created from revision `r` reports every matching event from `r` on, in
//!   revision order, and never splits one revision's events between responses (fragments
//!   aside, which the task joins);
//! - the `created` response of a watch with no start revision carries the revision the
//!   watch starts after (used only if the stream fails before any event arrives);
//! - a progress notification at revision `r` comes after every event up to `r`.
//!
//! An event below a revision already delivered would break the promise to the caller, so
//! the task ends the watch with [`Error::Internal`] instead of passing it on.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use oncekv_proto::etcdserverpb::watch_client::WatchClient;
use oncekv_proto::etcdserverpb::{self as pb, watch_request::RequestUnion};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use crate::client::Client;
use crate::error::{Error, Failure, classify, timed_out};
use crate::options::WatchOptions;
use crate::responses::WatchResponse;
use crate::retry::Budget;

mod cursor;

use cursor::{Cursor, Step};

/// Responses delivered but not yet taken by the caller. A caller that falls behind stops
/// the task reading its stream, so the server (not this client) holds the backlog, and
/// serves it from history.
const DELIVERY_QUEUE: usize = 16;
/// How long a cancel waits for the server to confirm before the stream is just dropped
/// (which ends the watch on the server as well).
const CANCEL_WAIT: Duration = Duration::from_secs(1);

impl Client {
    /// Watches `key` (or the range `options` select): a [`Watcher`] yielding the matching
    /// events, in revision order, from `options`' start revision (default: changes made
    /// after the watch is created) until it is cancelled or dropped.
    ///
    /// Returns once a member has answered the create request. If the member serving the
    /// watch fails later, the watcher resumes on another member from the revision after
    /// the last one it delivered (see [`Watcher`]).
    ///
    /// Fails if no member answers within the retry budget, or if the server refuses the
    /// stream (etcd servers before v3, or a member without Watch: `Unimplemented`).
    pub async fn watch(
        &self,
        key: impl Into<Vec<u8>>,
        options: WatchOptions,
    ) -> Result<Watcher, Error> {
        let start_revision = options.start_revision();
        let shared = Arc::new(Shared {
            resumes: AtomicU64::new(0),
            endpoint: Mutex::new(None),
        });
        let (responses_tx, responses) = mpsc::channel(DELIVERY_QUEUE);
        let (control_tx, control) = mpsc::unbounded_channel();
        let (created_tx, created) = oneshot::channel();
        let task = WatchTask {
            client: self.clone(),
            key: Bytes::from(key.into()),
            options,
            cursor: Cursor::new(start_revision),
            shared: shared.clone(),
            responses: responses_tx,
            control,
            created: Some(created_tx),
        };
        let task = tokio::spawn(task.run());
        let mut watcher = Watcher {
            responses,
            control: control_tx,
            shared,
            task: Some(task),
            start_revision: start_revision.max(0),
            next_revision: start_revision.max(0),
        };
        match created.await {
            Ok(Ok(start)) => {
                watcher.start_revision = start;
                watcher.next_revision = start;
                Ok(watcher)
            }
            Ok(Err(e)) => Err(e),
            // The task ended without a word: it can only have panicked.
            Err(_) => Err(Error::Internal("the watch task ended unexpectedly".into())),
        }
    }
}

/// A live watch: call [`next`](Watcher::next) (or use it as a [`Stream`](tokio_stream::Stream)) for its
/// responses.
///
/// Each response holds the events of one or more whole revisions, in revision order;
/// together they hold every matching event from the start revision on, each once. A
/// response without events is a progress notification (asked for with
/// [`WatchOptions::with_progress_notify`] or [`request_progress`](Watcher::request_progress)).
///
/// **Resume.** When the stream to the serving member fails (the member stopped or
/// crashed, the connection was reset, or went silent and HTTP/2 keep-alive gave up on it),
/// the watcher moves to another member and creates the watch again from
/// [`next_revision`](Watcher::next_revision), retrying with backoff within the client's
/// retry budget ([`ClientConfig`](crate::ClientConfig)), which starts afresh after each
/// successful resume. Nothing is missed and nothing repeated. If the budget runs out,
/// `next` returns the last transport error and the watch ends; `next_revision` then says
/// where to watch again from.
///
/// **Leader.** Unless [`WatchOptions::with_leaderless_member_allowed`] says otherwise, only
/// a member with a leader serves the watch: one cut off from the cluster ends the stream
/// (after a few election timeouts), which counts as a failure to resume from.
///
/// **End.** The watch ends (`next` returns `None` after the final item) when it is
/// cancelled, or with an error when the server cancels it: [`Error::Compacted`] if it
/// needs revisions compaction removed (its start, or where it would resume after an
/// outage), [`Error::WatchCanceled`] for any other reason. Dropping the watcher ends the
/// watch on the server too.
#[derive(Debug)]
pub struct Watcher {
    responses: mpsc::Receiver<Delivery>,
    control: mpsc::UnboundedSender<Control>,
    shared: Arc<Shared>,
    task: Option<JoinHandle<()>>,
    /// See [`start_revision`](Watcher::start_revision).
    start_revision: i64,
    /// See [`next_revision`](Watcher::next_revision): moves as the caller takes responses,
    /// not as the task queues them (the task may be far ahead, catching up on history).
    next_revision: i64,
}

/// One item for the caller, with where delivery stands once the caller has it.
#[derive(Debug)]
struct Delivery {
    item: Result<WatchResponse, Error>,
    next_revision: i64,
}

/// What the caller's [`Watcher`] and its task share.
#[derive(Debug)]
struct Shared {
    /// Times the watch was created again on a member after its stream failed.
    resumes: AtomicU64,
    /// The endpoint serving the watch now (`None` while between members).
    endpoint: Mutex<Option<String>>,
}

/// Requests from the [`Watcher`] to its task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Control {
    Progress,
    Cancel,
}

impl Watcher {
    /// The next response, `Some(Err(_))` once if the watch ended with an error, or `None`
    /// when it has ended. Cancel-safe (may be used in `select!`).
    pub async fn next(&mut self) -> Option<Result<WatchResponse, Error>> {
        let delivery = self.responses.recv().await?;
        Some(self.take(delivery))
    }

    fn take(&mut self, delivery: Delivery) -> Result<WatchResponse, Error> {
        self.next_revision = delivery.next_revision;
        delivery.item
    }

    /// Asks the serving member for a progress notification (a response without events
    /// carrying the revision every event up to which has been delivered). Best effort: a
    /// request made while the watch is between members is dropped.
    pub fn request_progress(&self) {
        let _ = self.control.send(Control::Progress);
    }

    /// Ends the watch: tells the serving member to cancel it and waits (about a second at
    /// most) for the task to finish. Responses already delivered are dropped with the
    /// watcher.
    pub async fn cancel(mut self) {
        let _ = self.control.send(Control::Cancel);
        if let Some(task) = self.task.take() {
            let wait = CANCEL_WAIT + Duration::from_millis(500);
            let _ = tokio::time::timeout(wait, task).await;
        }
    }

    /// The first revision this watch reports: its start revision, or, for a watch from now
    /// on, the one after the revision the member created it at. (Unlike
    /// [`next_revision`](Self::next_revision), it does not move as events are delivered.)
    pub fn start_revision(&self) -> i64 {
        self.start_revision
    }

    /// The first revision of which the caller has not been handed the events (by
    /// [`next`](Self::next) or the stream): where to watch again from after the watch
    /// ended. Responses the watcher has received but the caller has not taken yet do not
    /// count, so once every revision up to `r` has been taken this is above `r`.
    pub fn next_revision(&self) -> i64 {
        self.next_revision
    }

    /// How often the watch was resumed on a member after its stream failed.
    pub fn resumes(&self) -> u64 {
        self.shared.resumes.load(Ordering::Relaxed)
    }

    /// The endpoint serving the watch, if it is being served right now.
    pub fn endpoint(&self) -> Option<String> {
        self.shared
            .endpoint
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl tokio_stream::Stream for Watcher {
    type Item = Result<WatchResponse, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.responses
            .poll_recv(cx)
            .map(|delivery| delivery.map(|d| self.take(d)))
    }
}

/// The Watch stub without tonic's 4 MiB default limit on a received message: a response
/// holds whole revisions (a member sends up to 4 MiB of keys and values per response,
/// and one revision may hold more), and with `prev_kv` each event carries two values.
/// etcd's Go client sets no limit either (`MaxCallRecvMsgSize` defaults to `MaxInt32`);
/// the member bounds what it sends.
fn watch_client(channel: crate::transport::Channel) -> WatchClient<crate::transport::Channel> {
    WatchClient::new(channel).max_decoding_message_size(usize::MAX)
}

/// How one stream to one member ended.
#[derive(Debug)]
enum Ended {
    /// The watch is over (cancelled, dropped, or ended with an error already delivered).
    Done,
    /// The stream failed retryably; resume elsewhere. `served`: the watch had been
    /// created on it (so a new outage begins, with a fresh retry budget).
    Failed { error: Error, served: bool },
}

/// The background half of a [`Watcher`]: owns the stream, resumes it.
struct WatchTask {
    client: Client,
    key: Bytes,
    options: WatchOptions,
    cursor: Cursor,
    shared: Arc<Shared>,
    responses: mpsc::Sender<Delivery>,
    control: mpsc::UnboundedReceiver<Control>,
    /// Answers [`Client::watch`]: `Ok` once a member answered the create request (or the
    /// error if none did). `None` once sent.
    /// Told the first revision the watch reports, once a member has created it.
    created: Option<oneshot::Sender<Result<i64, Error>>>,
}

impl WatchTask {
    async fn run(mut self) {
        let transport = self.client.transport().clone();
        transport.discover_once().await;
        // The budget of the current outage (or of the first creation); `None` while the
        // watch is served.
        let mut budget: Option<Budget> = None;
        loop {
            let attempt_timeout = budget
                .get_or_insert_with(|| Budget::new(self.client.config()))
                .start_attempt();
            let i = transport.current();
            let (error, served) = match self.serve(i, attempt_timeout).await {
                Ended::Done => return,
                Ended::Failed { error, served } => (error, served),
            };
            self.set_endpoint(None);
            if served {
                budget = None;
            }
            transport.failed(i);
            let delay = budget
                .get_or_insert_with(|| Budget::new(self.client.config()))
                .next_delay();
            let Some(delay) = delay else {
                self.finish(error).await;
                return;
            };
            tracing::debug!(
                endpoint = transport.url(i),
                next_revision = self.cursor.start(),
                ?delay,
                "oncekv client: watch stream failed, resuming on another member: {error}"
            );
            let pause = tokio::time::sleep(delay);
            tokio::pin!(pause);
            loop {
                tokio::select! {
                    () = &mut pause => break,
                    control = self.control.recv() => match control {
                        None | Some(Control::Cancel) => return,
                        // No stream to ask; the caller learns progress from what follows.
                        Some(Control::Progress) => {}
                    },
                }
            }
            transport.find_leader().await;
        }
    }

    /// Serves the watch over one stream to endpoint `i` until the stream fails or the
    /// watch ends. `attempt_timeout` bounds opening the stream and getting the server's
    /// first answer.
    async fn serve(&mut self, i: usize, attempt_timeout: Duration) -> Ended {
        let transport = self.client.transport().clone();
        let url = transport.url(i).to_string();
        let (generation, channel) = transport.channel_with_generation(i);
        // Room for the create request and a few cancel/progress requests; more progress
        // requests than fit are dropped (they are best effort).
        let (requests, outbound) = mpsc::channel(8);
        let create = self.options.request(self.key.clone(), self.cursor.start());
        let _ = requests.try_send(pb::WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(create)),
        });
        let deadline = Instant::now() + attempt_timeout;
        let mut request = tonic::Request::new(ReceiverStream::new(outbound));
        if self.options.requires_leader() {
            request.metadata_mut().insert(
                oncekv_proto::metadata::REQUIRE_LEADER_KEY,
                tonic::metadata::MetadataValue::from_static(
                    oncekv_proto::metadata::REQUIRE_LEADER_VALUE,
                ),
            );
        }
        let opened = tokio::time::timeout_at(deadline, watch_client(channel).watch(request)).await;
        let timeout = || Error::Timeout {
            endpoint: url.clone(),
            after: attempt_timeout,
        };
        let mut stream: Streaming<pb::WatchResponse> = match opened {
            Ok(Ok(response)) => response.into_inner(),
            Ok(Err(status)) => return self.failed(&status, &url, false).await,
            Err(_) => {
                // The connection may be hung: the next attempt to this member dials anew.
                transport.reconnect(i, generation);
                return Ended::Failed {
                    error: timeout(),
                    served: false,
                };
            }
        };
        let mut answered = false;
        let mut watch_id = None;
        let mut cancelling: Option<Instant> = None;
        loop {
            // Until the server answers the create request, the attempt's deadline holds;
            // a cancel waits a little for the server's confirmation; otherwise no limit
            // (HTTP/2 keep-alive notices a silent connection).
            let wait_until = match cancelling {
                Some(at) => Some(at),
                None if !answered => Some(deadline),
                None => None,
            };
            let message = tokio::select! {
                m = stream.message() => m,
                () = sleep_until(wait_until) => {
                    if cancelling.is_some() {
                        return Ended::Done;
                    }
                    transport.reconnect(i, generation);
                    return Ended::Failed { error: timeout(), served: false };
                }
                control = self.control.recv() => {
                    match control {
                        None => return Ended::Done,
                        Some(Control::Cancel) => {
                            let Some(id) = watch_id else { return Ended::Done };
                            let cancel = RequestUnion::CancelRequest(pb::WatchCancelRequest {
                                watch_id: id,
                            });
                            let sent = requests.try_send(pb::WatchRequest {
                                request_union: Some(cancel),
                            });
                            if sent.is_err() {
                                return Ended::Done;
                            }
                            cancelling = Some(Instant::now() + CANCEL_WAIT);
                        }
                        Some(Control::Progress) => {
                            let progress =
                                RequestUnion::ProgressRequest(pb::WatchProgressRequest {});
                            let _ = requests.try_send(pb::WatchRequest {
                                request_union: Some(progress),
                            });
                        }
                    }
                    continue;
                }
            };
            let response = match message {
                Ok(Some(response)) => response,
                Ok(None) => {
                    // The member closed the stream without cancelling the watch (it is
                    // shutting down): carry on elsewhere.
                    if cancelling.is_some() {
                        return Ended::Done;
                    }
                    return Ended::Failed {
                        error: Error::Unavailable {
                            endpoint: url,
                            message: "the member ended the watch stream".into(),
                        },
                        served: answered,
                    };
                }
                Err(status) => {
                    if cancelling.is_some() {
                        return Ended::Done;
                    }
                    if timed_out(&status) {
                        transport.reconnect(i, generation);
                    }
                    return self.failed(&status, &url, answered).await;
                }
            };
            // The cursor first, so that a caller woken by the creation below already sees
            // the revision the watch was created at.
            let first = !answered;
            if first {
                answered = true;
                watch_id = Some(response.watch_id);
            }
            let step = match self.cursor.on_response(response, cancelling.is_some()) {
                // Refused at creation (etcd's created-and-canceled, e.g. a user who may
                // not read the range): `Client::watch` fails with the refusal rather than
                // return a watcher whose first item is its end.
                Step::End(e) if first && self.created.is_some() => {
                    if let Some(created) = self.created.take() {
                        let _ = created.send(Err(e));
                    }
                    return Ended::Done;
                }
                step => step,
            };
            if first {
                self.set_endpoint(Some(url.clone()));
                match self.created.take() {
                    Some(created) => {
                        let _ = created.send(Ok(self.cursor.start()));
                    }
                    None => {
                        self.shared.resumes.fetch_add(1, Ordering::Relaxed);
                    }
                }
                tracing::debug!(
                    endpoint = %url,
                    start_revision = self.cursor.start(),
                    "oncekv client: watch created"
                );
            }
            match step {
                Step::Nothing => {}
                Step::Deliver(r) if cancelling.is_none() => {
                    if !self.deliver(Ok(r)).await {
                        return Ended::Done;
                    }
                }
                Step::Deliver(_) => {}
                Step::Cancelled => return Ended::Done,
                Step::End(e) => {
                    self.finish(e).await;
                    return Ended::Done;
                }
            }
        }
    }

    /// A stream to `url` failed with `status`: resume elsewhere if that is worth trying,
    /// else end the watch with the error.
    async fn failed(&mut self, status: &tonic::Status, url: &str, served: bool) -> Ended {
        match classify(status, url) {
            Failure::Retry { error, .. } => Ended::Failed { error, served },
            Failure::Answer(error) => {
                self.finish(error).await;
                Ended::Done
            }
            Failure::SessionExpired(message) => {
                self.finish(Error::SessionExpired(message)).await;
                Ended::Done
            }
        }
    }

    /// Hands `item` to the caller, waiting while the caller's queue is full. `false` if
    /// the caller is gone or cancelled meanwhile.
    async fn deliver(&mut self, item: Result<WatchResponse, Error>) -> bool {
        loop {
            tokio::select! {
                permit = self.responses.reserve() => {
                    return match permit {
                        Ok(permit) => {
                            permit.send(Delivery {
                                item,
                                next_revision: self.cursor.start(),
                            });
                            true
                        }
                        Err(_) => false,
                    };
                }
                control = self.control.recv() => match control {
                    None | Some(Control::Cancel) => return false,
                    // The caller is behind on what was already sent; progress is moot.
                    Some(Control::Progress) => {}
                },
            }
        }
    }

    /// Ends the watch with `error`: [`Client::watch`] returns it if no member ever
    /// answered, else the caller's next `next()` does.
    async fn finish(&mut self, error: Error) {
        self.set_endpoint(None);
        match self.created.take() {
            Some(created) => {
                let _ = created.send(Err(error));
            }
            None => {
                self.deliver(Err(error)).await;
            }
        }
    }

    fn set_endpoint(&self, endpoint: Option<String>) {
        *self
            .shared
            .endpoint
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = endpoint;
    }
}

/// Sleeps until `at`, or forever when there is no deadline.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
