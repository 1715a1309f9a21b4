//! Lockers: hosts of their own that take one lock, [`LOCK`], with the real `oncekv-client`
//! (a lease of their own per acquisition, kept alive, revoked on unlock) while the workload
//! writes and the faults strike. A holder writes the key [`FENCED`] a few times, each write
//! a txn guarded by its lock key still existing with the create revision it was granted
//! with: the fencing token, as etcd's `Mutex.IsOwner` compare does. Then it unlocks.
//!
//! A partition or a paused client can let a holder's lease expire while it still believes
//! it holds the lock; the next waiter then gets the lock, and the old holder's guarded writes
//! must fail from then on. Nothing here trusts clocks: the checker reads the replicas'
//! history of the lock's keys and of [`FENCED`] and demands
//! - **ownership**: every write to [`FENCED`] was made at a revision where its writer's lock
//!   key was the live key under `lock/` with the lowest create revision, that is, the owner;
//! - **token order**: a holder's writes form one block, and the blocks come in increasing
//!   token order, so no two holders' critical sections overlap in token order;
//! - **the client's view**: a write a locker saw succeed is in history exactly once, one it
//!   saw refused (guard false) is not, one with an unknown outcome at most once; every token a
//!   locker was given is the create revision of its key, created in history at that revision.

use std::collections::BTreeMap;
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

/// The lock's name; its waiters' keys are `lock/<lease hex>`.
pub const LOCK: &str = "lock";
/// The key holders write under the lock.
pub const FENCED: &str = "fenced";
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

/// What one guarded write did, as the locker saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Applied: the guard held.
    Written,
    /// Answered, guard false: the lock key was gone (the lock was lost).
    Refused,
    /// Not known.
    Unknown,
}

/// One acquisition and the writes made under it.
#[derive(Debug, Clone)]
pub struct Acquisition {
    pub locker: usize,
    pub key: String,
    pub token: i64,
    /// `(value written, outcome)`, in order.
    pub writes: Vec<(String, WriteOutcome)>,
    /// The lease was found gone while the locker held the lock.
    pub lost: bool,
}

/// What every locker recorded.
#[derive(Debug, Default)]
pub struct Record {
    pub acquisitions: Vec<Acquisition>,
    /// Lock or unlock calls that failed (timeouts, the session lost mid-call).
    pub failures: Vec<String>,
}

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

/// The value of write `i` under `token` by `locker`: unique in the run.
fn fenced_value(token: i64, i: usize, locker: usize) -> String {
    format!("t{token}:{i}:l{locker}")
}

/// The token a [`FENCED`] value was written under.
fn token_of(value: &str) -> Option<i64> {
    value.strip_prefix('t')?.split(':').next()?.parse().ok()
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

/// One change to the lock's keys or to [`FENCED`], from history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub revision: i64,
    pub key: String,
    pub put: bool,
    pub value: String,
    pub create_revision: i64,
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

/// The lockers' records against the history (see the module doc for what is demanded).
pub fn check(record: &Record, history: &[Change]) -> Vec<String> {
    let mut violations = Vec::new();
    // Live lock keys, by create revision, as history unfolds.
    let mut live: BTreeMap<String, i64> = BTreeMap::new();
    let mut created: BTreeMap<i64, String> = BTreeMap::new();
    let mut written: BTreeMap<String, usize> = BTreeMap::new();
    let mut last_token = 0;
    for c in history {
        if c.key != FENCED {
            if c.put {
                live.insert(c.key.clone(), c.create_revision);
                if c.create_revision == c.revision {
                    created.insert(c.revision, c.key.clone());
                }
            } else {
                live.remove(&c.key);
            }
            continue;
        }
        if !c.put {
            violations.push(format!("{FENCED} deleted at revision {}", c.revision));
            continue;
        }
        *written.entry(c.value.clone()).or_default() += 1;
        let Some(token) = token_of(&c.value) else {
            violations.push(format!("{FENCED} = {:?}: no token", c.value));
            continue;
        };
        let owner = live.values().min().copied();
        if owner != Some(token) {
            violations.push(format!(
                "mutual exclusion: {:?} written at revision {} under token {token}, but the \
                 owner then was {owner:?} (live lock keys {live:?})",
                c.value, c.revision
            ));
        }
        if token < last_token {
            violations.push(format!(
                "token order: {:?} at revision {} after writes under token {last_token}",
                c.value, c.revision
            ));
        }
        last_token = last_token.max(token);
    }
    for a in &record.acquisitions {
        if created.get(&a.token) != Some(&a.key) {
            violations.push(format!(
                "locker {} was given {} with token {}, but history created {:?} at that \
                 revision",
                a.locker,
                a.key,
                a.token,
                created.get(&a.token)
            ));
        }
        for (value, outcome) in &a.writes {
            let n = written.get(value).copied().unwrap_or(0);
            let ok = match outcome {
                WriteOutcome::Written => n == 1,
                WriteOutcome::Refused => n == 0,
                WriteOutcome::Unknown => n <= 1,
            };
            if !ok {
                violations.push(format!(
                    "locker {} saw {value} {outcome:?}, history has it {n} times",
                    a.locker
                ));
            }
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(revision: i64, key: &str, put: bool, value: &str, create: i64) -> Change {
        Change {
            revision,
            key: key.into(),
            put,
            value: value.into(),
            create_revision: create,
        }
    }

    fn acquisition(
        locker: usize,
        key: &str,
        token: i64,
        writes: &[(&str, WriteOutcome)],
    ) -> Acquisition {
        Acquisition {
            locker,
            key: key.into(),
            token,
            writes: writes.iter().map(|(v, o)| ((*v).to_string(), *o)).collect(),
            lost: false,
        }
    }

    /// Two holders one after the other, the second waiting behind the first.
    fn good_history() -> Vec<Change> {
        vec![
            change(2, "lock/a", true, "", 2),
            change(3, "lock/b", true, "", 3),
            change(4, FENCED, true, "t2:0:l0", 4),
            change(5, FENCED, true, "t2:1:l0", 4),
            change(6, "lock/a", false, "", 0),
            change(7, FENCED, true, "t3:0:l1", 4),
        ]
    }

    fn good_record() -> Record {
        Record {
            acquisitions: vec![
                acquisition(
                    0,
                    "lock/a",
                    2,
                    &[
                        ("t2:0:l0", WriteOutcome::Written),
                        ("t2:1:l0", WriteOutcome::Unknown),
                    ],
                ),
                acquisition(1, "lock/b", 3, &[("t3:0:l1", WriteOutcome::Written)]),
            ],
            failures: Vec::new(),
        }
    }

    #[test]
    fn a_clean_run_passes() {
        assert_eq!(check(&good_record(), &good_history()), Vec::<String>::new());
    }

    #[test]
    fn a_write_by_a_waiter_is_a_mutual_exclusion_violation() {
        let mut h = good_history();
        // lock/b writes while lock/a still lives.
        h.insert(2, change(4, FENCED, true, "t3:9:l1", 4));
        let v = check(&good_record(), &h);
        assert!(v.iter().any(|s| s.starts_with("mutual exclusion")), "{v:?}");
    }

    #[test]
    fn an_old_token_after_a_newer_one_is_a_token_order_violation() {
        let mut h = good_history();
        // The first holder's write lands after the second's, with lock/a recreated so
        // that ownership alone would not catch it.
        h.push(change(8, "lock/b", false, "", 0));
        h.push(change(9, "lock/a", true, "", 2));
        h.push(change(10, FENCED, true, "t2:2:l0", 4));
        let v = check(&good_record(), &h);
        assert!(v.iter().any(|s| s.starts_with("token order")), "{v:?}");
    }

    #[test]
    fn a_refused_write_in_history_or_a_written_one_missing_is_caught() {
        let mut r = good_record();
        r.acquisitions[1].writes[0].1 = WriteOutcome::Refused;
        assert_eq!(check(&r, &good_history()).len(), 1);
        let mut h = good_history();
        h.retain(|c| c.value != "t2:0:l0");
        assert_eq!(check(&good_record(), &h).len(), 1);
    }

    #[test]
    fn a_token_that_history_never_created_is_caught() {
        let mut r = good_record();
        r.acquisitions[1].token = 5;
        r.acquisitions[1].writes.clear();
        let v = check(&r, &good_history());
        assert!(v.iter().any(|s| s.contains("history created")), "{v:?}");
    }
}
