//! etcd's Watch service on the wire: the exact responses etcd 3.4 sends (created,
//! cancelled, compacted, progress, fragments), and the guarantees a watcher relies on
//! (every revision once, in order, no gap) when it reads slowly, when history is
//! compacted under it and when its member installs a snapshot.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{TestCluster, put};
use oncekv_server::pb::etcdserverpb::watch_client::WatchClient;
use oncekv_server::pb::etcdserverpb::watch_request::RequestUnion;
use oncekv_server::pb::etcdserverpb::{
    CompactionRequest, WatchCancelRequest, WatchCreateRequest, WatchProgressRequest, WatchRequest,
    WatchResponse,
};
use oncekv_server::pb::mvccpb::Event;
use oncekv_server::pb::mvccpb::event::EventType;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

const LEADER_WAIT: Duration = Duration::from_secs(10);
const RESPONSE_WAIT: Duration = Duration::from_secs(10);

/// One watch stream: requests in, responses out.
struct Stream {
    requests: mpsc::Sender<WatchRequest>,
    responses: Streaming<WatchResponse>,
}

impl Stream {
    async fn open(endpoint: String) -> Stream {
        let mut client = WatchClient::connect(endpoint).await.unwrap();
        let (requests, rx) = mpsc::channel(16);
        let responses = client
            .watch(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        Stream {
            requests,
            responses,
        }
    }

    async fn send(&self, r: RequestUnion) {
        self.requests
            .send(WatchRequest {
                request_union: Some(r),
            })
            .await
            .unwrap();
    }

    async fn create(&self, c: WatchCreateRequest) {
        self.send(RequestUnion::CreateRequest(c)).await;
    }

    async fn next(&mut self) -> WatchResponse {
        tokio::time::timeout(RESPONSE_WAIT, self.responses.message())
            .await
            .expect("a watch response in time")
            .unwrap()
            .expect("the stream is open")
    }

    /// Nothing arrives within `wait`.
    async fn quiet(&mut self, wait: Duration) {
        if let Ok(r) = tokio::time::timeout(wait, self.responses.message()).await {
            panic!("unexpected watch response: {r:?}");
        }
    }

    /// Responses of `watch_id` until `n` events have arrived; each must be an event
    /// response of that watcher.
    async fn events(&mut self, watch_id: i64, n: usize) -> Vec<Event> {
        let mut events = Vec::new();
        while events.len() < n {
            let r = self.next().await;
            assert_eq!(r.watch_id, watch_id, "{r:?}");
            assert!(!r.created && !r.canceled && !r.events.is_empty(), "{r:?}");
            events.extend(r.events);
        }
        assert_eq!(events.len(), n, "more events than expected: {events:?}");
        events
    }
}

fn create(key: &str) -> WatchCreateRequest {
    WatchCreateRequest {
        key: key.as_bytes().to_vec().into(),
        ..Default::default()
    }
}

fn prefix(p: &str) -> WatchCreateRequest {
    let mut end = p.as_bytes().to_vec();
    *end.last_mut().unwrap() += 1;
    WatchCreateRequest {
        range_end: end.into(),
        ..create(p)
    }
}

/// `(type, key, value, mod_revision)` of each event.
fn summary(events: &[Event]) -> Vec<(EventType, String, String, i64)> {
    events
        .iter()
        .map(|e| {
            let kv = e.kv.clone().unwrap();
            (
                EventType::try_from(e.r#type).unwrap(),
                String::from_utf8(kv.key.to_vec()).unwrap(),
                String::from_utf8(kv.value.to_vec()).unwrap(),
                kv.mod_revision,
            )
        })
        .collect()
}

// What etcd's clients rely on from the create response: `created`, the id (server-chosen
// from 0 up, or the client's own), and the current revision to resume from; and etcd's
// refusals for an id already in use and for an empty range.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_responses_carry_ids_revision_and_etcds_refusals() {
    let cluster = TestCluster::start(1, |_| {}).await;
    cluster.wait_leader(LEADER_WAIT).await;
    let mut kv = cluster.kv(0).await;
    let revision = put(&mut kv, "a", "1").await.unwrap();
    let mut s = Stream::open(cluster.endpoint(0)).await;

    s.create(create("a")).await;
    let r = s.next().await;
    assert!(r.created && !r.canceled, "{r:?}");
    assert_eq!(r.watch_id, 0);
    let header = r.header.unwrap();
    assert_eq!(header.revision, revision);
    assert_eq!(header.member_id, cluster.node(0).core.id());
    assert!(
        header.cluster_id != 0 && header.raft_term >= 1,
        "{header:?}"
    );

    s.create(WatchCreateRequest {
        watch_id: 7,
        ..create("b")
    })
    .await;
    assert_eq!((s.next().await.watch_id), 7);
    s.create(WatchCreateRequest {
        watch_id: 7,
        ..create("c")
    })
    .await;
    let r = s.next().await;
    assert!(r.created && r.canceled, "{r:?}");
    assert_eq!(r.watch_id, -1);
    assert_eq!(
        r.cancel_reason,
        "mvcc: duplicate watch ID provided on the WatchStream"
    );
    s.create(WatchCreateRequest {
        range_end: "a".into(),
        ..create("b")
    })
    .await;
    let r = s.next().await;
    assert!(r.created && r.canceled && r.watch_id == -1, "{r:?}");
    assert_eq!(r.cancel_reason, "mvcc: watcher range is empty");
    // The next server-chosen id is 1: 0 is in use.
    s.create(create("d")).await;
    assert_eq!(s.next().await.watch_id, 1);

    // Cancel: one response with `canceled`; an unknown id gets none.
    s.send(RequestUnion::CancelRequest(WatchCancelRequest {
        watch_id: 7,
    }))
    .await;
    let r = s.next().await;
    assert!(r.canceled && !r.created && r.watch_id == 7, "{r:?}");
    assert_eq!(r.header.unwrap().revision, revision);
    s.send(RequestUnion::CancelRequest(WatchCancelRequest {
        watch_id: 99,
    }))
    .await;
    s.quiet(Duration::from_millis(300)).await;
}

// The core guarantee: a watcher from an old revision gets history, then live writes,
// each revision once and in order; filters and prev_kv as etcd applies them; and the
// watchers of one stream do not see each other's events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_on_a_follower_replays_history_then_follows_writes_made_elsewhere() {
    let cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(LEADER_WAIT).await;
    let follower = (leader + 1) % 3;
    let mut kv = cluster.kv(leader).await;
    let first = put(&mut kv, "k/a", "1").await.unwrap();
    put(&mut kv, "k/a", "2").await.unwrap();
    put(&mut kv, "other", "x").await.unwrap();
    put(&mut kv, "k/b", "1").await.unwrap();
    let mut s = Stream::open(cluster.endpoint(follower)).await;
    s.create(WatchCreateRequest {
        start_revision: first,
        prev_kv: true,
        ..prefix("k/")
    })
    .await;
    assert!(s.next().await.created);
    let events = s.events(0, 3).await;
    assert_eq!(
        summary(&events),
        [
            (EventType::Put, "k/a".into(), "1".into(), first),
            (EventType::Put, "k/a".into(), "2".into(), first + 1),
            (EventType::Put, "k/b".into(), "1".into(), first + 3),
        ]
    );
    assert_eq!(events[0].prev_kv, None, "a create has no previous value");
    assert_eq!(events[1].prev_kv.as_ref().unwrap().value, "1");

    // A second watcher on the stream: deletes only.
    s.create(WatchCreateRequest {
        filters: vec![0], // NOPUT
        watch_id: 5,
        ..prefix("k/")
    })
    .await;
    assert_eq!(s.next().await.watch_id, 5);

    // Live writes through another member.
    let mut other = cluster.kv((leader + 2) % 3).await;
    put(&mut other, "k/c", "1").await.unwrap();
    let mut del = cluster.kv(leader).await;
    let deleted = del
        .delete_range(oncekv_server::pb::etcdserverpb::DeleteRangeRequest {
            key: "k/a".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .header
        .unwrap()
        .revision;
    let mut by_watcher: std::collections::BTreeMap<i64, Vec<Event>> = Default::default();
    while by_watcher.get(&0).map_or(0, Vec::len) < 2 || !by_watcher.contains_key(&5) {
        let r = s.next().await;
        by_watcher.entry(r.watch_id).or_default().extend(r.events);
    }
    let w0 = &by_watcher[&0];
    assert_eq!(
        summary(w0),
        [
            (EventType::Put, "k/c".into(), "1".into(), deleted - 1),
            (EventType::Delete, "k/a".into(), "".into(), deleted),
        ]
    );
    assert_eq!(w0[1].prev_kv.as_ref().unwrap().value, "2");
    let kv = w0[1].kv.as_ref().unwrap();
    assert_eq!(
        (kv.create_revision, kv.version),
        (0, 0),
        "etcd's delete event"
    );
    assert_eq!(
        summary(&by_watcher[&5]),
        [(EventType::Delete, "k/a".into(), "".into(), deleted)]
    );
    s.quiet(Duration::from_millis(300)).await;
}

// A client that stops reading must not make the server buffer its events: the stream
// waits, and when the client reads again every revision arrives once, in order. Only
// compaction of what it still needs cancels a watcher, with `compact_revision` (and, as
// etcd, a created response before it for a watch created from a compacted revision).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_watcher_catches_up_from_history_and_compaction_cancels_it() {
    let cluster = TestCluster::start(1, |_| {}).await;
    cluster.wait_leader(LEADER_WAIT).await;
    let mut kv = cluster.kv(0).await;
    let mut s = Stream::open(cluster.endpoint(0)).await;
    s.create(prefix("n/")).await;
    let created = s.next().await;
    let start = created.header.unwrap().revision + 1;
    // More responses than the stream buffers, written while nobody reads.
    let mut last = 0;
    for i in 0..600 {
        last = put(&mut kv, &format!("n/{}", i % 7), &i.to_string())
            .await
            .unwrap();
    }
    let events = s.events(0, 600).await;
    let revisions: Vec<i64> = events
        .iter()
        .map(|e| e.kv.as_ref().unwrap().mod_revision)
        .collect();
    assert_eq!(revisions, (start..=last).collect::<Vec<_>>());

    // A second stream falls behind: its client reads nothing while large values are
    // written, so the stream's buffer fills and its task waits with the watcher behind.
    // Then history the watcher still needs is compacted.
    let mut slow = Stream::open(cluster.endpoint(0)).await;
    slow.create(prefix("big/")).await;
    let from = slow.next().await.header.unwrap().revision + 1;
    let value = "v".repeat(64 * 1024);
    for i in 0..200 {
        last = put(&mut kv, &format!("big/{}", i % 3), &value)
            .await
            .unwrap();
    }
    kv.compact(CompactionRequest {
        revision: last - 10,
        physical: true,
    })
    .await
    .unwrap();
    // What it got before is gap-free from `from`; then it is cancelled at the
    // compacted revision.
    let mut next = from;
    let cancel = loop {
        let r = slow.next().await;
        if r.canceled {
            break r;
        }
        for e in &r.events {
            assert_eq!(e.kv.as_ref().unwrap().mod_revision, next);
            next += 1;
        }
    };
    assert_eq!(cancel.compact_revision, last - 10, "{cancel:?}");
    assert_eq!(cancel.watch_id, 0);
    assert!(cancel.cancel_reason.is_empty(), "{cancel:?}");
    assert!(next < last - 10, "it needed compacted revisions");

    // From a compacted revision: created, then cancelled with the compacted revision.
    slow.create(WatchCreateRequest {
        start_revision: start,
        ..create("n/1")
    })
    .await;
    let r = slow.next().await;
    assert!(r.created && !r.canceled && r.watch_id == 1, "{r:?}");
    let r = slow.next().await;
    assert!(r.canceled && r.watch_id == 1, "{r:?}");
    assert_eq!(r.compact_revision, last - 10);
    assert_eq!(r.header.unwrap().revision, 0, "etcd sends no revision here");
    // From exactly the compacted revision: still served.
    slow.create(WatchCreateRequest {
        start_revision: last - 10,
        ..prefix("big/")
    })
    .await;
    assert!(slow.next().await.created);
    let events = slow.events(2, 11).await;
    assert_eq!(events[0].kv.as_ref().unwrap().mod_revision, last - 10);
}

// A progress response promises that every event up to its revision was sent: it must
// come after a catching-up watcher's events, never before (etcd 3.4 could send it early).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_request_answers_after_the_events_it_covers() {
    let cluster = TestCluster::start(1, |_| {}).await;
    cluster.wait_leader(LEADER_WAIT).await;
    let mut kv = cluster.kv(0).await;
    let mut last = 0;
    for i in 0..300 {
        last = put(&mut kv, "p", &i.to_string()).await.unwrap();
    }
    let mut s = Stream::open(cluster.endpoint(0)).await;
    s.create(WatchCreateRequest {
        start_revision: 1,
        ..create("p")
    })
    .await;
    s.send(RequestUnion::ProgressRequest(WatchProgressRequest {}))
        .await;
    assert!(s.next().await.created);
    let mut seen = 0;
    let progress = loop {
        let r = s.next().await;
        if r.watch_id == -1 {
            break r;
        }
        seen = r.events.last().unwrap().kv.as_ref().unwrap().mod_revision;
    };
    assert_eq!(
        seen, last,
        "every event up to the progress revision came first"
    );
    assert_eq!(progress.header.unwrap().revision, last);
    assert!(progress.events.is_empty() && !progress.created && !progress.canceled);
}

// progress_notify: an idle, caught-up watcher periodically learns the revision, so a
// client can tell a quiet range from a stalled stream; a busy one is not disturbed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_notify_tells_an_idle_watcher_the_revision() {
    let cluster = TestCluster::start(1, |c| {
        c.watch_progress_notify_interval = Duration::from_millis(200)
    })
    .await;
    cluster.wait_leader(LEADER_WAIT).await;
    let mut kv = cluster.kv(0).await;
    let mut s = Stream::open(cluster.endpoint(0)).await;
    s.create(WatchCreateRequest {
        progress_notify: true,
        ..create("quiet")
    })
    .await;
    s.create(create("unnotified")).await;
    assert!(s.next().await.created);
    assert!(s.next().await.created);
    let revision = put(&mut kv, "elsewhere", "x").await.unwrap();
    // A tick may come before the write is applied; one after it reports the write's
    // revision. Every one is for the watcher that asked, and carries no events.
    loop {
        let r = s.next().await;
        assert_eq!(r.watch_id, 0, "only the watcher that asked: {r:?}");
        assert!(r.events.is_empty() && !r.canceled && !r.created, "{r:?}");
        if r.header.unwrap().revision >= revision {
            break;
        }
    }
}

// A watcher that asks for fragments gets a response above the server's limit in parts
// under it, `fragment` on all but the last; together they hold every event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_responses_are_fragmented_for_a_watcher_that_asks() {
    const MAX: usize = 200 * 1024;
    let cluster = TestCluster::start(1, |c| c.max_request_bytes = MAX).await;
    cluster.wait_leader(LEADER_WAIT).await;
    let mut kv = cluster.kv(0).await;
    let value = "v".repeat(150 * 1024);
    let mut first = 0;
    // 8 x 150 KiB: above the limit plus gRPC's 512 KiB allowance, in one catch-up read.
    for i in 0..8 {
        let r = put(&mut kv, &format!("f/{i}"), &value).await.unwrap();
        if i == 0 {
            first = r;
        }
    }
    let mut s = Stream::open(cluster.endpoint(0)).await;
    s.create(WatchCreateRequest {
        start_revision: first,
        fragment: true,
        ..prefix("f/")
    })
    .await;
    assert!(s.next().await.created);
    let mut parts = Vec::new();
    loop {
        let r = s.next().await;
        let more = r.fragment;
        parts.push(r);
        if !more {
            break;
        }
    }
    assert!(parts.len() > 1, "not fragmented");
    for p in &parts {
        assert!(
            prost::Message::encoded_len(p) < MAX + 512 * 1024,
            "a part over the limit"
        );
    }
    let events: Vec<Event> = parts.into_iter().flat_map(|p| p.events).collect();
    let revisions: Vec<i64> = events
        .iter()
        .map(|e| e.kv.as_ref().unwrap().mod_revision)
        .collect();
    assert_eq!(revisions, (first..first + 8).collect::<Vec<_>>());
}

// A member that falls behind by more than the leader's log and installs a snapshot
// brings history with it: a watcher on that member continues with every revision once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_on_a_member_that_installs_a_snapshot_misses_nothing() {
    let mut cluster = TestCluster::start(3, |c| c.snapshot_count = 50).await;
    let leader = cluster.wait_leader(LEADER_WAIT).await;
    let follower = (leader + 1) % 3;
    let mut kv = cluster.kv(leader).await;
    let before = put(&mut kv, "s/0", "x").await.unwrap();
    cluster.wait_caught_up(leader, LEADER_WAIT).await;
    cluster.stop(follower).await;
    let mut last = before;
    for i in 1..300 {
        last = put(&mut kv, &format!("s/{}", i % 5), "y").await.unwrap();
    }
    // The leader purges once no replication uses the entries: for the stopped follower,
    // at its next retry (openraft backs off 500 ms after an unreachable peer), which a
    // fast loop of puts can finish before.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let metrics = cluster.node(leader).core.metrics();
        if metrics.purged.is_some_and(|p| p.index > 0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the leader must have purged its log: {metrics:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.restart(follower).await;
    // From the revision the follower had: whether the snapshot arrives before or after
    // this watch is created, it must see every later revision exactly once.
    let mut s = Stream::open(cluster.endpoint(follower)).await;
    s.create(WatchCreateRequest {
        start_revision: before + 1,
        ..prefix("s/")
    })
    .await;
    let created = s.next().await;
    assert!(created.created);
    // Which case this run exercised: below `last`, the watch was created before the
    // snapshot arrived and followed the install.
    eprintln!(
        "watch created at revision {} of {last}",
        created.header.unwrap().revision
    );
    let events = s.events(0, (last - before) as usize).await;
    let revisions: Vec<i64> = events
        .iter()
        .map(|e| e.kv.as_ref().unwrap().mod_revision)
        .collect();
    assert_eq!(revisions, (before + 1..=last).collect::<Vec<_>>());
    assert!(
        cluster.node(follower).core.metrics().snapshot.is_some(),
        "the follower caught up by snapshot"
    );
}

// A stopping member ends its watch streams (with Unavailable, so clients go elsewhere)
// instead of holding its shutdown until they close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_a_member_ends_its_watch_streams_promptly() {
    let mut cluster = TestCluster::start(1, |_| {}).await;
    cluster.wait_leader(LEADER_WAIT).await;
    let mut s = Stream::open(cluster.endpoint(0)).await;
    s.create(create("x")).await;
    assert!(s.next().await.created);
    let started = std::time::Instant::now();
    cluster.stop(0).await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "shutdown waited {:?} for the watch stream",
        started.elapsed()
    );
    let end = tokio::time::timeout(RESPONSE_WAIT, s.responses.message())
        .await
        .unwrap();
    match end {
        Err(status) => assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}"),
        Ok(None) => {}
        Ok(Some(r)) => panic!("unexpected response {r:?}"),
    }
}

// etcdctl and clientv3 mark watch streams "require leader": a member cut off from the
// cluster must end such a stream (etcd's "no leader", Unavailable) so the client moves
// to a member that still sees writes, instead of watching a frozen view forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_leader_stream_ends_when_its_member_loses_the_leader() {
    let mut cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(LEADER_WAIT).await;
    let survivor = (leader + 1) % 3;
    let mut client = WatchClient::connect(cluster.endpoint(survivor))
        .await
        .unwrap();
    let (requests, rx) = mpsc::channel(4);
    let mut call = tonic::Request::new(ReceiverStream::new(rx));
    call.metadata_mut()
        .insert("hasleader", "true".parse().unwrap());
    let mut responses = client.watch(call).await.unwrap().into_inner();
    requests
        .send(WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(create("x"))),
        })
        .await
        .unwrap();
    let created = responses.message().await.unwrap().unwrap();
    assert!(created.created);
    for i in 0..3 {
        if i != survivor {
            cluster.stop(i).await;
        }
    }
    let end = tokio::time::timeout(Duration::from_secs(20), responses.message())
        .await
        .expect("the stream ends once no leader is seen");
    let status = end.expect_err("ends with an error");
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert_eq!(status.message(), "etcdserver: no leader");
    // And a new require-leader stream is refused outright.
    let mut call = tonic::Request::new(tokio_stream::iter(Vec::<WatchRequest>::new()));
    call.metadata_mut()
        .insert("hasleader", "true".parse().unwrap());
    let refused = client
        .watch(call)
        .await
        .expect_err("refused without a leader");
    assert_eq!(refused.code(), tonic::Code::Unavailable);
}

// Many watchers per stream and many streams per connection, created while writes go on:
// each watcher, on its own, gets every revision of its range once and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_watchers_on_many_streams_each_get_every_revision_once() {
    const STREAMS: usize = 8;
    const WATCHERS: i64 = 25;
    const WRITES: i64 = 60;
    let cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(LEADER_WAIT).await;
    let follower = (leader + 1) % 3;
    let mut kv = cluster.kv(leader).await;
    let from = put(&mut kv, "m/start", "0").await.unwrap() + 1;
    let writer = tokio::spawn(async move {
        let mut last = 0;
        for i in 0..WRITES {
            last = put(&mut kv, &format!("m/{}", i % 4), &i.to_string())
                .await
                .unwrap();
        }
        last
    });
    // One connection, several streams on it.
    let channel = tonic::transport::Endpoint::from_shared(cluster.endpoint(follower))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut streams = Vec::new();
    for _ in 0..STREAMS {
        let (requests, rx) = mpsc::channel(WATCHERS as usize);
        let responses = WatchClient::new(channel.clone())
            .watch(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let s = Stream {
            requests,
            responses,
        };
        for _ in 0..WATCHERS {
            s.create(WatchCreateRequest {
                start_revision: from,
                ..prefix("m/")
            })
            .await;
        }
        streams.push(s);
    }
    let last = writer.await.unwrap();
    assert_eq!(last, from + WRITES - 1);
    for mut s in streams {
        let mut next = vec![from; WATCHERS as usize];
        let mut created = 0;
        while created < WATCHERS || next.iter().any(|n| *n <= last) {
            let r = s.next().await;
            if r.created {
                created += 1;
                continue;
            }
            let n = &mut next[usize::try_from(r.watch_id).unwrap()];
            for e in &r.events {
                assert_eq!(
                    e.kv.as_ref().unwrap().mod_revision,
                    *n,
                    "watcher {}",
                    r.watch_id
                );
                *n += 1;
            }
        }
        assert!(next.iter().all(|n| *n == last + 1));
    }
}
