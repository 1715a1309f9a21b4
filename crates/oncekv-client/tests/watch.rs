//! Watch and compaction through the client against a real three-member cluster: history
//! replay, the member serving a watch lost mid-stream (stopped, or gone silent), and a
//! watch that needs compacted history.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{LEADER_WAIT, Proxy, TestCluster};
use oncekv_client::{
    Client, ClientConfig, DeleteOptions, Error, EventType, GetOptions, WatchOptions, Watcher,
};
use tokio::task::JoinHandle;

/// How long a test waits for the events it expects.
const EVENTS_WAIT: Duration = Duration::from_secs(20);

/// One event as the tests compare them: revision, kind, key, value.
type Seen = (i64, EventType, String, String);

/// Reads `watcher` until it has delivered revision `last` (or fails the test).
async fn collect_until(watcher: &mut Watcher, seen: &mut Vec<Seen>, last: i64) {
    let deadline = tokio::time::Instant::now() + EVENTS_WAIT;
    while seen.last().is_none_or(|e| e.0 < last) {
        let next = tokio::time::timeout_at(deadline, watcher.next()).await;
        let response = match next {
            Ok(Some(Ok(r))) => r,
            other => panic!(
                "waiting for revision {last}, delivered up to {:?}: {other:?}",
                seen.last()
            ),
        };
        for e in response.events {
            seen.push((
                e.revision(),
                e.kind,
                String::from_utf8_lossy(&e.kv.key).into_owned(),
                String::from_utf8_lossy(&e.kv.value).into_owned(),
            ));
        }
    }
}

/// Puts `key{i % 5}` = `i` for i in 0..n through `client`, `pause` apart; returns the
/// revision of each put, in order (tracked puts: each applied once, so one revision each).
fn writer(client: Client, prefix: &str, n: usize, pause: Duration) -> JoinHandle<Vec<Seen>> {
    let prefix = prefix.to_string();
    tokio::spawn(async move {
        let mut done = Vec::with_capacity(n);
        for i in 0..n {
            let key = format!("{prefix}{}", i % 5);
            let r = client.put(key.clone(), i.to_string()).await.unwrap();
            done.push((r.header.revision, EventType::Put, key, i.to_string()));
            tokio::time::sleep(pause).await;
        }
        done
    })
}

// The client's promise for a watch: losing the member that serves it costs nothing, every
// revision still arrives exactly once, in order (here the served member is the leader, so
// the writer fails over at the same time).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watch_resumes_on_another_member_without_gap_or_repeat_when_its_member_stops() {
    let mut cluster = TestCluster::start(3, |_| {}).await;
    cluster.wait_leader(LEADER_WAIT).await;
    let client = Client::connect(cluster.endpoints(), ClientConfig::default()).unwrap();
    let start = client.put("other", "x").await.unwrap().header.revision + 1;
    let mut watcher = client
        .watch(
            "jobs/",
            WatchOptions::new().with_prefix().with_start_revision(start),
        )
        .await
        .unwrap();
    let served_by = watcher.endpoint().unwrap();
    let member = (0..3).find(|i| cluster.endpoint(*i) == served_by).unwrap();

    let writes = writer(
        Client::connect(cluster.endpoints(), ClientConfig::default()).unwrap(),
        "jobs/",
        300,
        Duration::from_millis(3),
    );
    let mut seen = Vec::new();
    collect_until(&mut watcher, &mut seen, start + 49).await;
    cluster.stop(member).await;
    let written = tokio::time::timeout(EVENTS_WAIT, writes)
        .await
        .unwrap()
        .unwrap();
    let last = written.last().unwrap().0;
    collect_until(&mut watcher, &mut seen, last).await;

    assert_eq!(seen, written, "every put once, in order, none other");
    let revisions: Vec<i64> = seen.iter().map(|e| e.0).collect();
    assert_eq!(revisions, (start..=last).collect::<Vec<_>>(), "no gap");
    assert!(watcher.resumes() >= 1, "the watch must have moved");
    let now = watcher.endpoint().unwrap();
    assert_ne!(now, served_by, "served by a live member now");
    assert_eq!(watcher.next_revision(), last + 1);
}

/// How the path to the member serving a watch fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PathFault {
    /// Packets stop flowing, nothing is closed (a cut cable, a frozen host).
    Silence,
    /// Every connection is reset (a crashed process, a restarted proxy).
    Reset,
}

/// A watch served through a proxy to the leader, the path failing mid-stream while a
/// writer goes on directly: the watcher must deliver every put once, in order.
async fn watch_through_a_failing_path(fault: PathFault) {
    let cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(LEADER_WAIT).await;
    let proxy = Proxy::start(cluster.configs[leader].client_addr).await;
    let mut endpoints = vec![proxy.url()];
    endpoints.extend((0..3).filter(|i| *i != leader).map(|i| cluster.endpoint(i)));
    let config = ClientConfig {
        keep_alive_interval: Duration::from_millis(300),
        ..ClientConfig::default()
    };
    let client = Client::connect(endpoints, config).unwrap();
    let direct = Client::connect(cluster.endpoints(), ClientConfig::default()).unwrap();
    let start = direct.put("other", "x").await.unwrap().header.revision + 1;
    let mut watcher = client
        .watch(
            "cfg/",
            WatchOptions::new().with_prefix().with_start_revision(start),
        )
        .await
        .unwrap();
    assert_eq!(
        watcher.endpoint(),
        Some(proxy.url()),
        "served through the proxy"
    );

    let writes = writer(direct, "cfg/", 100, Duration::from_millis(5));
    let mut seen = Vec::new();
    collect_until(&mut watcher, &mut seen, start + 19).await;
    match fault {
        PathFault::Silence => proxy.0.set_blackhole(true),
        PathFault::Reset => proxy.0.reset_all(),
    }
    let written = writes.await.unwrap();
    collect_until(&mut watcher, &mut seen, written.last().unwrap().0).await;

    assert_eq!(seen, written, "every put once, in order");
    assert!(watcher.resumes() >= 1, "{fault:?}");
    if fault == PathFault::Silence {
        assert_ne!(
            watcher.endpoint(),
            Some(proxy.url()),
            "moved off the silent path"
        );
    }
}

// A member can vanish without closing anything: the watch must notice the silence (HTTP/2
// keep-alive) and resume elsewhere, here on a follower.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watch_resumes_when_its_connection_goes_silent() {
    watch_through_a_failing_path(PathFault::Silence).await;
}

// A reset connection (the member's process died, its host rebooted) must cost a resume,
// never an event.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watch_resumes_when_its_connection_is_reset() {
    watch_through_a_failing_path(PathFault::Reset).await;
}

// Replaying history is what lets a consumer start from a saved revision; each event must
// carry what etcd's does (kind, value, the previous value when asked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_replays_history_with_previous_values_then_follows_live_changes() {
    let cluster = TestCluster::start(3, |_| {}).await;
    cluster.wait_leader(LEADER_WAIT).await;
    let client = Client::connect(cluster.endpoints(), ClientConfig::default()).unwrap();
    let first = client.put("svc/a", "1").await.unwrap().header.revision;
    client.put("svc/a", "2").await.unwrap();
    client.put("other", "not watched").await.unwrap();
    client
        .delete_with("svc/", DeleteOptions::new().with_prefix())
        .await
        .unwrap();

    let mut watcher = client
        .watch(
            "svc/",
            WatchOptions::new()
                .with_prefix()
                .with_prev_kv()
                .with_start_revision(first),
        )
        .await
        .unwrap();
    let live = client.put("svc/b", "3").await.unwrap().header.revision;
    let mut events = Vec::new();
    while events
        .last()
        .is_none_or(|e: &oncekv_client::Event| e.revision() < live)
    {
        let r = tokio::time::timeout(EVENTS_WAIT, watcher.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        events.extend(r.events);
    }
    let got: Vec<_> = events
        .iter()
        .map(|e| {
            (
                e.revision() - first,
                e.kind,
                String::from_utf8_lossy(&e.kv.value).into_owned(),
                e.prev_kv
                    .as_ref()
                    .map(|kv| String::from_utf8_lossy(&kv.value).into_owned()),
            )
        })
        .collect();
    let s = |v: &str| v.to_string();
    assert_eq!(
        got,
        vec![
            (0, EventType::Put, s("1"), None),
            (1, EventType::Put, s("2"), Some(s("1"))),
            (3, EventType::Delete, s(""), Some(s("2"))),
            (live - first, EventType::Put, s("3"), None),
        ]
    );
    assert_eq!(events[2].kv.key, "svc/a");
    watcher.cancel().await;
}

// A watch that needs history compaction removed must say so, with the revision history now
// starts at, and end: silently starting later would hide lost events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_a_compacted_revision_ends_with_the_compact_revision() {
    let cluster = TestCluster::start(3, |_| {}).await;
    cluster.wait_leader(LEADER_WAIT).await;
    let client = Client::connect(cluster.endpoints(), ClientConfig::default()).unwrap();
    let old = client.put("k", "1").await.unwrap().header.revision;
    let compact_at = client.put("k", "2").await.unwrap().header.revision;
    client.put("k", "3").await.unwrap();
    client.compact(compact_at, true).await.unwrap();

    let mut watcher = client
        .watch("k", WatchOptions::new().with_start_revision(old))
        .await
        .unwrap();
    let end = tokio::time::timeout(EVENTS_WAIT, watcher.next())
        .await
        .unwrap();
    assert_eq!(
        end,
        Some(Err(Error::Compacted {
            compact_revision: compact_at
        }))
    );
    assert!(watcher.next().await.is_none(), "the watch has ended");
    assert!(end.unwrap().unwrap_err().is_answer());

    // From the compact revision on, history is whole.
    let mut watcher = client
        .watch("k", WatchOptions::new().with_start_revision(compact_at))
        .await
        .unwrap();
    let r = tokio::time::timeout(EVENTS_WAIT, watcher.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(r.events[0].revision(), compact_at);
}

// etcd's two refusals, word for word (scripts and etcd clients match on them), and reads
// at a revision on either side of the compaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compact_refuses_compacted_and_future_revisions_and_reads_follow_it() {
    let cluster = TestCluster::start(3, |_| {}).await;
    cluster.wait_leader(LEADER_WAIT).await;
    let client = Client::connect(cluster.endpoints(), ClientConfig::default()).unwrap();
    let one = client.put("k", "1").await.unwrap().header.revision;
    let two = client.put("k", "2").await.unwrap().header.revision;
    let now = client.put("k", "3").await.unwrap().header.revision;

    let at = |rev| GetOptions::new().with_revision(rev);
    let read = client.range("k", at(one)).await.unwrap();
    assert_eq!(read.kvs[0].value, "1", "a read at an old revision sees it");
    assert_eq!(read.header.revision, now);

    let refused = |e: Error, words: &str| match e {
        Error::Rejected { code, message } => {
            assert_eq!(code, tonic::Code::OutOfRange);
            assert_eq!(
                message,
                format!("etcdserver: mvcc: required revision {words}")
            );
        }
        other => panic!("{other:?}"),
    };
    refused(
        client.compact(now + 1, false).await.unwrap_err(),
        "is a future revision",
    );
    client.compact(two, false).await.unwrap();
    refused(
        client.compact(two, false).await.unwrap_err(),
        "has been compacted",
    );
    refused(
        client.compact(one, false).await.unwrap_err(),
        "has been compacted",
    );
    refused(
        client.range("k", at(one)).await.unwrap_err(),
        "has been compacted",
    );
    refused(
        client.range("k", at(now + 10)).await.unwrap_err(),
        "is a future revision",
    );
    assert_eq!(client.range("k", at(two)).await.unwrap().kvs[0].value, "2");
    client.compact(now, true).await.unwrap();
    assert_eq!(client.get("k").await.unwrap().unwrap().value, "3");
}

// A watch from now on sees the next change; cancel must end it promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_now_sees_the_next_change_and_cancel_ends_it() {
    let cluster = TestCluster::start(3, |_| {}).await;
    cluster.wait_leader(LEADER_WAIT).await;
    let client = Client::connect(cluster.endpoints(), ClientConfig::default()).unwrap();
    let mut watcher = client.watch("k", WatchOptions::new()).await.unwrap();
    let created_after = watcher.start_revision();
    assert!(created_after > 0, "created at a known revision");
    assert_eq!(
        watcher.next_revision(),
        created_after,
        "nothing delivered yet"
    );
    let rev = client.put("k", "1").await.unwrap().header.revision;
    let r = tokio::time::timeout(EVENTS_WAIT, watcher.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(r.events[0].revision(), rev);
    assert!(rev >= created_after);
    tokio::time::timeout(Duration::from_secs(3), watcher.cancel())
        .await
        .unwrap();
}

// A member that has lost its leader may be cut off from the cluster: it would keep the
// stream open and deliver nothing. By default (as etcdctl asks) such a member ends the
// watch, so the client moves on; a watch that allows it stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_without_a_leader_ends_the_watch_unless_allowed() {
    let mut cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(LEADER_WAIT).await;
    let follower = (leader + 1) % 3;
    let config = ClientConfig {
        max_retry_time: Duration::from_secs(2),
        ..ClientConfig::default()
    };
    let client = Client::connect([cluster.endpoint(follower)], config).unwrap();
    let mut strict = client.watch("k", WatchOptions::new()).await.unwrap();
    let mut lenient = client
        .watch("k", WatchOptions::new().with_leaderless_member_allowed())
        .await
        .unwrap();
    for i in 0..3 {
        if i != follower {
            cluster.stop(i).await;
        }
    }
    let ended = tokio::time::timeout(EVENTS_WAIT, strict.next())
        .await
        .unwrap();
    match ended {
        Some(Err(e)) => assert!(e.is_retryable(), "{e:?}"),
        other => panic!("the leaderless member kept the watch: {other:?}"),
    }
    assert!(
        tokio::time::timeout(Duration::from_secs(1), lenient.next())
            .await
            .is_err(),
        "the lenient watch is still open"
    );
    assert_eq!(lenient.endpoint(), Some(cluster.endpoint(follower)));
}

// `next_revision` counts what the caller took, not what the watcher has queued: a watch
// replaying history has every old event queued at once, and a loop `while
// next_revision() <= target { next() }` must still read them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_revision_moves_as_the_caller_takes_responses() {
    let cluster = TestCluster::start(3, |_| {}).await;
    cluster.wait_leader(LEADER_WAIT).await;
    let client = Client::connect(cluster.endpoints(), ClientConfig::default()).unwrap();
    let first = client.put("h/0", "v").await.unwrap().header.revision;
    let mut last = first;
    for i in 1..30 {
        last = client
            .put(format!("h/{i}"), "v")
            .await
            .unwrap()
            .header
            .revision;
    }
    let options = WatchOptions::new().with_prefix().with_start_revision(first);
    let mut watcher = client.watch("h/", options).await.unwrap();
    // Time for the watcher to receive the whole history.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(watcher.next_revision(), first, "nothing taken yet");
    let mut taken = Vec::new();
    while watcher.next_revision() <= last {
        let r = tokio::time::timeout(EVENTS_WAIT, watcher.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let top = r.events.last().map_or(0, |e| e.kv.mod_revision);
        taken.extend(r.events.iter().map(|e| e.kv.mod_revision));
        assert_eq!(watcher.next_revision(), top + 1, "past what was taken");
    }
    assert_eq!(taken, (first..=last).collect::<Vec<_>>());
    watcher.cancel().await;
}
