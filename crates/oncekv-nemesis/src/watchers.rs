//! Watchers: `etcd-client` watches of the shared keys' prefix (`k`) from revision 1,
//! with previous values, each starting on a member of its own. When a watch breaks (an
//! error, the stream ending, a cancel because its member lost the leader) the watcher
//! resumes on the next member from the last revision it saw + 1, as an etcd user must.
//! Every event is recorded as `oncekv-check`'s [`Seen`]; the checker compares them with
//! the cluster's history of the prefix, read after the run by [`crate::finale`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{ConnectOptions, EventType, WatchOptions};
use oncekv_check::watch::{Record, Seen};
use tokio::sync::watch;

use crate::etcd::text;
use crate::recorder::Recorder;

/// The prefix watched (the shared keys).
pub const PREFIX: &str = "k";
/// Resumes at most (every loop is bounded).
const MAX_RESUMES: u64 = 10_000;

/// What a watcher is told at the end: the last revision of the prefix in history, once
/// known (it stops when it has seen that far).
pub type Target = watch::Receiver<Option<i64>>;

/// One watcher's record, shared with the run.
pub type Shared = Arc<Mutex<Record>>;

/// An etcd event as the checker's vocabulary has it.
pub fn seen(e: &etcd_client::Event) -> Option<Seen> {
    let kv = e.kv()?;
    Some(Seen {
        revision: kv.mod_revision(),
        key: text(kv.key()),
        put: e.event_type() == EventType::Put,
        value: text(kv.value()),
        prev: e.prev_kv().map(|p| text(p.value())),
    })
}

fn lock(r: &Shared) -> std::sync::MutexGuard<'_, Record> {
    r.lock().unwrap_or_else(|p| p.into_inner())
}

/// Watches until it has seen the target revision, or until `hard_stop` (run-clock ms).
pub async fn run(
    endpoints: Vec<String>,
    first: usize,
    recorder: Arc<Recorder>,
    record: Shared,
    mut target: Target,
    hard_stop: u64,
) {
    lock(&record).start = 1;
    let mut next = 1i64;
    let mut member = first;
    let mut resumes = 0u64;
    let done = |next: i64, target: &Target| target.borrow().is_some_and(|t| next > t);
    'resume: while resumes < MAX_RESUMES {
        if done(next, &target) || recorder.now() >= hard_stop {
            break;
        }
        let endpoint = &endpoints[member % endpoints.len()];
        member += 1;
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_millis(500))
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
            .with_require_leader(true);
        let stream = async {
            let mut client = etcd_client::Client::connect([endpoint], Some(options)).await?;
            let opts = WatchOptions::new()
                .with_prefix()
                .with_prev_key()
                .with_start_revision(next);
            client.watch(PREFIX, Some(opts)).await
        };
        let Ok(Ok(mut stream)) = tokio::time::timeout(Duration::from_secs(2), stream).await else {
            resumes += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        loop {
            if done(next, &target) || recorder.now() >= hard_stop {
                break 'resume;
            }
            let message = tokio::select! {
                m = stream.message() => m,
                _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
                _ = target.changed() => continue,
            };
            match message {
                Ok(Some(resp)) => {
                    if resp.compact_revision() > 0 {
                        lock(&record).error = Some(format!(
                            "compacted at {} while resuming from {next}",
                            resp.compact_revision()
                        ));
                        break 'resume;
                    }
                    let events: Vec<Seen> = resp.events().iter().filter_map(seen).collect();
                    if let Some(last) = events.last() {
                        next = last.revision + 1;
                    }
                    lock(&record).seen.extend(events);
                    if resp.canceled() {
                        break;
                    }
                }
                Ok(None) | Err(_) => break,
            }
        }
        resumes += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut r = lock(&record);
    r.resumes = resumes;
    if !done(next, &target) && r.error.is_none() {
        r.error = Some(format!(
            "gave up at revision {next} (target {:?}) after {resumes} resumes",
            *target.borrow()
        ));
    }
}
