//! Lock holders: `etcd-client`'s `lock()` on the lock [`LOCK`] with a lease of their own
//! (short TTL, kept alive while held), each on its own member. The fencing token of an
//! acquisition is the create revision of the lock key it was given (what etcd's
//! `concurrency.Mutex` compares); each holder then writes [`FENCED`] a few times, each
//! write a txn guarded by its key still having that create revision, unlocks, and
//! revokes the lease. `oncekv-check`'s fencing checker compares what the holders were
//! answered with the history of the lock's keys and of [`FENCED`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, LockOptions, Txn, TxnOp};
use oncekv_check::lock::{Acquisition, FENCED, LOCK, Record, WriteOutcome, fenced_value};
use rand::Rng;

use crate::etcd;
use crate::recorder::Recorder;

/// The lease of a holder: short, so that faults make holders lose the lock.
const LEASE_TTL_SECS: i64 = 3;
/// Guarded writes per acquisition.
const WRITES: usize = 3;
/// Acquisitions per locker at most (every loop is bounded).
const ROUNDS: usize = 200;

/// The lockers' record, shared with the run.
pub type Shared = Arc<Mutex<Record>>;

fn lock(r: &Shared) -> std::sync::MutexGuard<'_, Record> {
    r.lock().unwrap_or_else(|p| p.into_inner())
}

/// Locker `locker`, on member `endpoint`, taking the lock until `until` (run-clock ms).
pub async fn run(
    endpoint: String,
    locker: usize,
    recorder: Arc<Recorder>,
    record: Shared,
    until: u64,
) {
    let fail = |what: String| lock(&record).failures.push(format!("l{locker} {what}"));
    // Lock waits may be long; every other call is short.
    let (Ok(mut client), Ok(mut waiter)) = (
        etcd::connect(&endpoint, Duration::from_secs(2)).await,
        etcd::connect(&endpoint, Duration::from_secs(10)).await,
    ) else {
        return;
    };
    for _ in 0..ROUNDS {
        let pause = rand::thread_rng().gen_range(100..1_000);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        if recorder.now() >= until {
            break;
        }
        let lease = match client.lease_grant(LEASE_TTL_SECS, None).await {
            Ok(l) => l.id(),
            Err(e) => {
                fail(format!("lease grant: {e}"));
                continue;
            }
        };
        let lost = Arc::new(AtomicBool::new(false));
        let keeper = tokio::spawn(keep_alive(client.clone(), lease, lost.clone()));
        let key = match waiter
            .lock(LOCK, Some(LockOptions::new().with_lease(lease)))
            .await
        {
            Ok(r) => r.key().to_vec(),
            Err(e) => {
                fail(format!("lock: {e}"));
                keeper.abort();
                let _ = client.lease_revoke(lease).await;
                continue;
            }
        };
        let token = match client.get(key.clone(), None).await {
            Ok(r) => r.kvs().first().map(|kv| kv.create_revision()),
            Err(e) => {
                fail(format!("reading the token: {e}"));
                None
            }
        };
        if let Some(token) = token {
            let mut writes = Vec::with_capacity(WRITES);
            for i in 0..WRITES {
                let value = fenced_value(token, i, locker);
                let txn = Txn::new()
                    .when([Compare::create_revision(
                        key.clone(),
                        CompareOp::Equal,
                        token,
                    )])
                    .and_then([TxnOp::put(FENCED, value.clone(), None)]);
                let outcome = match client.txn(txn).await {
                    Ok(t) if t.succeeded() => WriteOutcome::Written,
                    Ok(_) => WriteOutcome::Refused,
                    Err(_) => WriteOutcome::Unknown,
                };
                writes.push((value, outcome));
                let pause = rand::thread_rng().gen_range(20..300);
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
            lock(&record).acquisitions.push(Acquisition {
                locker,
                key: etcd::text(&key),
                token,
                writes,
                lost: lost.load(Ordering::Acquire),
            });
        } else {
            fail(format!(
                "{}: gone before its token was read",
                etcd::text(&key)
            ));
        }
        if let Err(e) = client.unlock(key).await {
            fail(format!("unlock: {e}"));
        }
        keeper.abort();
        let _ = client.lease_revoke(lease).await;
    }
}

/// Keeps `lease` alive every second; sets `lost` when the cluster says it is gone.
async fn keep_alive(mut client: etcd_client::Client, lease: i64, lost: Arc<AtomicBool>) {
    for _ in 0..10_000 {
        if let Ok((mut keeper, mut stream)) = client.lease_keep_alive(lease).await {
            for _ in 0..10_000 {
                if keeper.keep_alive().await.is_err() {
                    break;
                }
                match tokio::time::timeout(Duration::from_secs(1), stream.message()).await {
                    Ok(Ok(Some(r))) if r.ttl() <= 0 => {
                        lost.store(true, Ordering::Release);
                        return;
                    }
                    Ok(Ok(Some(_))) | Err(_) => {}
                    Ok(Ok(None)) | Ok(Err(_)) => break,
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
