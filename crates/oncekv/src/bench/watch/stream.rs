//! The watchers' side of `bench watch`: one Watch stream creates its share of the
//! watchers, then checks every event against the writer's sequence (gaps, duplicates,
//! order) and times its delivery.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use oncekv_proto::etcdserverpb::watch_client::WatchClient;
use oncekv_proto::etcdserverpb::watch_request::RequestUnion;
use oncekv_proto::etcdserverpb::{WatchCreateRequest, WatchRequest, WatchResponse};
use oncekv_proto::mvccpb::event::EventType;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::Channel;

use super::{nanos, read_stamp};

/// One Watch stream with its share of the watchers.
#[derive(Debug)]
pub(super) struct WatchStream {
    pub(super) index: usize,
    pub(super) watchers: usize,
    pub(super) key: Bytes,
    pub(super) prefix: bool,
    pub(super) clock: Instant,
    /// Events received by every stream together.
    pub(super) delivered: Arc<AtomicU64>,
}

/// Where one watcher is in the writer's sequence.
#[derive(Debug, Default, Clone, Copy)]
struct WatcherState {
    /// The sequence number expected next.
    next_seq: u64,
    last_revision: i64,
}

/// What the streams saw (one stream's, or all of them merged).
#[derive(Debug, Default)]
pub(super) struct StreamResult {
    /// Each watcher's position at the end.
    pub(super) positions: Vec<u64>,
    pub(super) events: u64,
    /// Delivery latencies (ns), one per event.
    pub(super) latencies: Vec<u64>,
    pub(super) gaps: u64,
    pub(super) duplicates: u64,
    /// When the last event arrived, since the clock's start.
    pub(super) last_event: Duration,
    pub(super) problems: u64,
    pub(super) first_problem: Option<String>,
}

impl StreamResult {
    pub(super) fn problem(&mut self, message: String) {
        self.problems += 1;
        self.first_problem.get_or_insert(message);
    }

    pub(super) fn merge(&mut self, mut other: StreamResult) {
        self.positions.append(&mut other.positions);
        self.events += other.events;
        self.latencies.append(&mut other.latencies);
        self.gaps += other.gaps;
        self.duplicates += other.duplicates;
        self.last_event = self.last_event.max(other.last_event);
        self.problems += other.problems;
        if let Some(p) = other.first_problem {
            self.first_problem.get_or_insert(p);
        }
    }
}

impl WatchStream {
    /// Creates the watchers, says so on `ready`, then checks and times every event until
    /// `stop` says the run is over.
    pub(super) async fn run(
        self,
        channel: Channel,
        ready: mpsc::Sender<Result<(), String>>,
        mut stop: watch::Receiver<bool>,
    ) -> StreamResult {
        let mut result = StreamResult::default();
        // The request side stays open for the whole run: etcd ends a Watch call whose
        // client has closed its side.
        let (requests, request_stream) = mpsc::channel(self.watchers);
        let range_end = if self.prefix {
            oncekv_core::prefix_end(&self.key)
        } else {
            Bytes::new()
        };
        for _ in 0..self.watchers {
            let create = WatchRequest {
                request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                    key: self.key.clone(),
                    range_end: range_end.clone(),
                    ..Default::default()
                })),
            };
            // Cannot fail: the channel has room for every create and its receiver is
            // alive until the call below takes it.
            let _ = requests.try_send(create);
        }
        let mut responses = match WatchClient::new(channel)
            .watch(ReceiverStream::new(request_stream))
            .await
        {
            Ok(r) => r.into_inner(),
            Err(status) => {
                let _ = ready
                    .send(Err(format!(
                        "stream {}: Watch: {:?}: {}",
                        self.index,
                        status.code(),
                        status.message()
                    )))
                    .await;
                return result;
            }
        };
        let mut watchers: HashMap<i64, WatcherState> = HashMap::with_capacity(self.watchers);
        while watchers.len() < self.watchers {
            match self.next(&mut responses, &mut stop).await {
                Some(Ok(r)) if r.created && !r.canceled => {
                    if watchers
                        .insert(r.watch_id, WatcherState::default())
                        .is_some()
                    {
                        let _ = ready
                            .send(Err(format!(
                                "stream {}: watch id {} created twice",
                                self.index, r.watch_id
                            )))
                            .await;
                        return result;
                    }
                }
                Some(Ok(r)) => {
                    let _ = ready
                        .send(Err(format!(
                            "stream {}: unexpected response while creating watchers: {}",
                            self.index,
                            describe(&r)
                        )))
                        .await;
                    return result;
                }
                Some(Err(e)) => {
                    let _ = ready.send(Err(e)).await;
                    return result;
                }
                None => return result,
            }
        }
        let _ = ready.send(Ok(())).await;

        loop {
            let response = match self.next(&mut responses, &mut stop).await {
                Some(Ok(r)) => r,
                Some(Err(e)) => {
                    result.problem(e);
                    break;
                }
                None => break,
            };
            let arrived = self.clock.elapsed();
            let Some(watcher) = watchers.get_mut(&response.watch_id) else {
                result.problem(format!(
                    "stream {}: a response for unknown watch id {}",
                    self.index, response.watch_id
                ));
                continue;
            };
            if response.canceled {
                result.problem(format!(
                    "stream {}: watcher {} cancelled: {}",
                    self.index,
                    response.watch_id,
                    describe(&response)
                ));
                continue;
            }
            for event in &response.events {
                let kv = event.kv.as_ref();
                let stamp = kv.and_then(|kv| read_stamp(&kv.value));
                let (Some(kv), Some((seq, sent)), true) =
                    (kv, stamp, event.r#type == EventType::Put as i32)
                else {
                    result.problem(format!(
                        "stream {}: watcher {}: an event that is not one of the writer's puts",
                        self.index, response.watch_id
                    ));
                    continue;
                };
                result.events += 1;
                result.latencies.push(nanos(arrived).saturating_sub(sent));
                if seq < watcher.next_seq || kv.mod_revision <= watcher.last_revision {
                    result.duplicates += 1;
                    continue;
                }
                result.gaps += seq - watcher.next_seq;
                watcher.next_seq = seq + 1;
                watcher.last_revision = kv.mod_revision;
            }
            if !response.events.is_empty() {
                result.last_event = arrived;
                self.delivered
                    .fetch_add(response.events.len() as u64, Ordering::Relaxed);
            }
        }
        result.positions = watchers.values().map(|w| w.next_seq).collect();
        drop(requests);
        result
    }

    /// The next response, `None` once `stop` is set, an error if the stream ends first.
    async fn next(
        &self,
        responses: &mut Streaming<WatchResponse>,
        stop: &mut watch::Receiver<bool>,
    ) -> Option<Result<WatchResponse, String>> {
        if *stop.borrow() {
            return None;
        }
        tokio::select! {
            message = responses.message() => Some(match message {
                Ok(Some(r)) => Ok(r),
                Ok(None) => Err(format!("stream {}: the server ended the stream", self.index)),
                Err(status) => Err(format!(
                    "stream {}: {:?}: {}",
                    self.index,
                    status.code(),
                    status.message()
                )),
            }),
            _ = stop.changed() => None,
        }
    }
}

/// A response's flags, for an error message.
fn describe(r: &WatchResponse) -> String {
    format!(
        "watch_id {} created {} canceled {} compact_revision {} cancel_reason {:?} events {}",
        r.watch_id,
        r.created,
        r.canceled,
        r.compact_revision,
        r.cancel_reason,
        r.events.len()
    )
}
