//! Lockers: hosts of their own that take one lock, [`LOCK`], with the real `oncekv-client`
//! (a lease of their own per acquisition, kept alive, revoked on unlock) while the workload
//! writes and the faults strike. A holder writes the key [`FENCED`] a few times, each write
//! a txn guarded by its lock key still existing with the create revision it was granted
//! with: the fencing token, as etcd's `Mutex.IsOwner` compare does. Then it unlocks.
//!
//! A partition or a paused client can let a holder's lease expire while it still believes
//! it holds the lock; the next waiter then gets the lock, and the old holder's guarded writes
//! must fail from then on. [`oncekv_check::fencing`] judges what the lockers recorded
//! against the replicas' history of the lock's keys and of [`FENCED`] ([`history_of`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncekv_client::{Client, ClientConfig, Compare, CompareOp, LockOptions, PutOptions, TxnOp};
use oncekv_core::{EventKind, KeyRange, ReadLimit, StateMachine, prefix_end};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::net;
use crate::trace::Trace;
use crate::workload::now_ms;
// What a locker records, the lock's conventions, and the history the checker
// (`oncekv_check::fencing`) reads.
pub use oncekv_check::lock::{
    Acquisition, Change, FENCED, LOCK, Record, WriteOutcome, fenced_value,
};

/// How many lockers a run has.
pub const LOCKERS: usize = 2;
/// Acquisitions per locker at most.
const ROUNDS: usize = 6;
/// Guarded writes per acquisition.
const WRITES: usize = 3;
/// The TTL of a locker's lease: short, so that faults make holders lose the lock.
const LEASE_TTL_SECS: i64 = 3;
/// How long a locker waits for the lock before giving up on that round.
const LOCK_TIMEOUT: Duration = Duration::from_secs(15);

pub type Records = Arc<Mutex<Record>>;

/// What a locker host needs.
#[derive(Debug, Clone)]
pub struct LockerPlan {
    pub index: usize,
    /// Chooses the pauses between rounds and between writes.
    pub seed: u64,
    pub endpoints: Vec<String>,
    /// Workload clients still running; a locker starts no new round once it reaches 0.
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

fn lock_records(records: &Records) -> std::sync::MutexGuard<'_, Record> {
    records.lock().unwrap_or_else(|p| p.into_inner())
}

/// Takes the lock up to [`ROUNDS`] times while the workload runs.
pub async fn run(plan: LockerPlan) -> turmoil::Result {
    let name = format!("l{}", plan.index);
    let client = Client::connect_with(&plan.endpoints, config(), Some(plan.net.connector(&name)))?;
    let mut rng = StdRng::seed_from_u64(plan.seed);
    for round in 0..ROUNDS {
        // Rounds spread over the fault window, so that faults meet holders.
        tokio::time::sleep(Duration::from_millis(rng.gen_range(200..3_000))).await;
        if plan.clients_running.load(Ordering::Acquire) == 0 {
            break;
        }
        let options = LockOptions::new().with_ttl(LEASE_TTL_SECS);
        let guard = match tokio::time::timeout(LOCK_TIMEOUT, client.lock_with(LOCK, options)).await
        {
            Ok(Ok(guard)) => guard,
            Ok(Err(e)) => {
                plan.trace
                    .line(format!("{name} round {round}: lock failed: {e}"));
                lock_records(&plan.records)
                    .failures
                    .push(format!("{name} lock: {e}"));
                continue;
            }
            Err(_) => {
                plan.trace
                    .line(format!("{name} round {round}: lock timed out"));
                lock_records(&plan.records)
                    .failures
                    .push(format!("{name} lock: timed out"));
                continue;
            }
        };
        let token = guard.fencing_token();
        let key = String::from_utf8_lossy(guard.key()).into_owned();
        plan.trace.line(format!(
            "{name} round {round}: holds {key} with token {token} [{}]",
            now_ms()
        ));
        let mut writes = Vec::with_capacity(WRITES);
        for i in 0..WRITES {
            let value = fenced_value(token, i, plan.index);
            let guarded = Compare::create_revision(guard.key().to_vec(), CompareOp::Equal, token);
            let put = TxnOp::put(FENCED, value.clone(), PutOptions::new());
            let outcome = match client.txn(vec![guarded], vec![put], vec![]).await {
                Ok(t) if t.succeeded => WriteOutcome::Written,
                Ok(_) => WriteOutcome::Refused,
                Err(_) => WriteOutcome::Unknown,
            };
            plan.trace.line(format!(
                "{name} write {value} -> {outcome:?} [{}]",
                now_ms()
            ));
            writes.push((value, outcome));
            tokio::time::sleep(Duration::from_millis(rng.gen_range(20..400))).await;
        }
        let lost = guard.is_lost();
        lock_records(&plan.records).acquisitions.push(Acquisition {
            locker: plan.index,
            key: key.clone(),
            token,
            writes,
            lost,
        });
        if let Err(e) = guard.unlock().await {
            plan.trace.line(format!("{name} unlock {key}: {e}"));
            lock_records(&plan.records)
                .failures
                .push(format!("{name} unlock: {e}"));
        }
    }
    plan.trace.line(format!("{name} done"));
    let _ = client.close().await;
    Ok(())
}

/// The replicas' history of the lock's keys and of [`FENCED`], in revision order.
pub fn history_of(sm: &StateMachine) -> Result<Vec<Change>, String> {
    let lock_prefix = format!("{LOCK}/");
    let ranges = [
        KeyRange {
            key: lock_prefix.clone().into(),
            range_end: prefix_end(lock_prefix.as_bytes()),
        },
        KeyRange::single(FENCED),
    ];
    let mut changes = Vec::new();
    for range in &ranges {
        let batch = sm
            .events(range, 1, false, ReadLimit::ALL)
            .map_err(|e| format!("history from revision 1: {e}"))?;
        changes.extend(batch.events.iter().map(|e| Change {
            revision: e.kv.mod_revision,
            key: String::from_utf8_lossy(&e.kv.key).into_owned(),
            put: e.kind == EventKind::Put,
            value: String::from_utf8_lossy(&e.kv.value).into_owned(),
            create_revision: e.kv.create_revision,
        }));
    }
    // Stable: a revision's own changes keep their order.
    changes.sort_by_key(|c| c.revision);
    Ok(changes)
}
