//! Watchers: hosts of their own running the real `oncekv-client` watch (which resumes on
//! another member when its member fails) while the workload writes and the faults strike.
//! Each records every event it is handed; at the end, [`oncekv_check::watch_order`]
//! compares the sequence with the replicas' history for the watcher's range
//! ([`history_of`]): equal, revision for revision, from the watch's start to the last
//! revision written, without a gap, a repeat or a reordering.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncekv_client::{Client, ClientConfig, EventType, WatchOptions};
use oncekv_core::{EventKind, KeyRange, ReadLimit, StateMachine, prefix_end};

use crate::net;
use crate::trace::Trace;
use crate::workload::now_ms;
// What a watcher records, and the checker that judges it (`oncekv_check::watch_order`).
pub use oncekv_check::watch::{Record, Seen};

/// How long watchers keep watching after the last workload client has finished, for the
/// last events to reach them (faults are over by then).
const SETTLE: Duration = Duration::from_secs(3);

/// What one watcher watches.
#[derive(Debug, Clone)]
pub struct Spec {
    pub prefix: &'static str,
    /// 0: from when the watch is created.
    pub start_revision: i64,
}

/// The watchers of a run: one from the first revision over the shared keys, one from
/// "now" over every client's own key.
pub fn specs() -> Vec<Spec> {
    vec![
        Spec {
            prefix: "k",
            start_revision: 1,
        },
        Spec {
            prefix: "own/",
            start_revision: 0,
        },
    ]
}

pub type Records = Arc<Mutex<Vec<Record>>>;

/// What a watcher host needs.
#[derive(Debug, Clone)]
pub struct WatcherPlan {
    pub index: usize,
    pub spec: Spec,
    pub endpoints: Vec<String>,
    /// Workload clients still running; the watcher stops [`SETTLE`] after it reaches 0.
    pub clients_running: Arc<AtomicUsize>,
    pub records: Records,
    pub trace: Trace,
    pub net: net::Net,
}

fn config() -> ClientConfig {
    ClientConfig {
        attempt_timeout: Duration::from_millis(500),
        request_timeout: Duration::from_millis(1_500),
        connect_timeout: Duration::from_millis(300),
        max_attempts: 1_000,
        max_retry_time: Duration::from_secs(60),
        backoff_base: Duration::from_millis(20),
        backoff_cap: Duration::from_millis(400),
        keep_alive: true,
        ..ClientConfig::default()
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn lock(records: &Records) -> std::sync::MutexGuard<'_, Vec<Record>> {
    records.lock().unwrap_or_else(|p| p.into_inner())
}

/// Watches until the workload is over and settled, recording into `records[index]`.
pub async fn run(plan: WatcherPlan) -> turmoil::Result {
    let name = format!("w{}", plan.index);
    let client = Client::connect_with(&plan.endpoints, config(), Some(plan.net.connector(&name)))?;
    let mut options = WatchOptions::new().with_prefix().with_prev_kv();
    if plan.spec.start_revision > 0 {
        options = options.with_start_revision(plan.spec.start_revision);
    }
    let set = |f: &dyn Fn(&mut Record)| {
        if let Some(r) = lock(&plan.records).get_mut(plan.index) {
            f(r);
        }
    };
    let mut watcher = match client.watch(plan.spec.prefix, options).await {
        Ok(w) => w,
        Err(e) => {
            set(&|r| r.error = Some(format!("create: {e}")));
            return Ok(());
        }
    };
    let start = watcher.start_revision();
    set(&|r| r.start = start);
    plan.trace.line(format!(
        "{name} watching {:?} from revision {start}",
        plan.spec.prefix
    ));
    let mut done_at: Option<u64> = None;
    loop {
        if done_at.is_none() && plan.clients_running.load(Ordering::Acquire) == 0 {
            done_at = Some(now_ms() + SETTLE.as_millis() as u64);
        }
        if done_at.is_some_and(|t| now_ms() >= t) {
            break;
        }
        let next = tokio::time::timeout(Duration::from_millis(200), watcher.next()).await;
        let resp = match next {
            Err(_) => continue,
            Ok(None) => {
                set(&|r| r.error = Some("the watch ended".into()));
                break;
            }
            Ok(Some(Err(e))) => {
                let e = e.to_string();
                set(&|r| r.error = Some(e.clone()));
                break;
            }
            Ok(Some(Ok(resp))) => resp,
        };
        let seen: Vec<Seen> = resp
            .events
            .iter()
            .map(|e| Seen {
                revision: e.revision(),
                key: text(&e.kv.key),
                put: e.kind == EventType::Put,
                value: text(&e.kv.value),
                prev: e.prev_kv.as_ref().map(|p| text(&p.value)),
            })
            .collect();
        set(&|r| r.seen.extend(seen.iter().cloned()));
    }
    let resumes = watcher.resumes();
    set(&|r| r.resumes = resumes);
    plan.trace
        .line(format!("{name} stopped after {resumes} resumes"));
    watcher.cancel().await;
    Ok(())
}

/// The replicas' history of `spec`'s range, from revision 1.
pub fn history_of(sm: &StateMachine, spec: &Spec) -> Result<Vec<Seen>, String> {
    let range = KeyRange {
        key: spec.prefix.into(),
        range_end: prefix_end(spec.prefix.as_bytes()),
    };
    let batch = sm
        .events(&range, 1, true, ReadLimit::ALL)
        .map_err(|e| format!("history from revision 1: {e}"))?;
    Ok(batch
        .events
        .iter()
        .map(|e| Seen {
            revision: e.kv.mod_revision,
            key: text(&e.kv.key),
            put: e.kind == EventKind::Put,
            value: text(&e.kv.value),
            prev: e.prev_kv.as_ref().map(|p| text(&p.value)),
        })
        .collect())
}
