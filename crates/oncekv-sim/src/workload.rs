//! The workload: clients built on the real `oncekv-client` (sessions, retries, leader
//! discovery), each doing a seeded mix of puts with unique values, compare-and-swap txns,
//! deletes, lease grants with explicit ids and revokes, and linearizable and serializable
//! reads. Every call is recorded with its simulated call and return times; a write whose
//! outcome the client could not learn is *unknown*, never failed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncekv_client::{
    Client, ClientConfig, Compare, CompareOp, Error, GetOptions, PutOptions, TxnOp,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::net;
use crate::trace::Trace;
// The recorded history's vocabulary belongs to the checkers that read it.
pub use oncekv_check::{Call, Event, Outcome};
use oncekv_check::{final_key, final_value, own_key};

/// Shared keys every client reads and writes (the linearizability checker's subject).
pub const SHARED_KEYS: usize = 4;

/// Every client's calls, in completion order.
pub type History = Arc<Mutex<Vec<Event>>>;

/// What one workload client needs.
#[derive(Debug, Clone)]
pub struct ClientPlan {
    pub index: usize,
    pub seed: u64,
    pub ops: usize,
    pub endpoints: Vec<String>,
    /// Simulated time at which faults stop; the final read waits for it.
    pub faults_end: Duration,
    pub history: History,
    pub trace: Trace,
    pub net: net::Net,
}

pub fn now_ms() -> u64 {
    turmoil::sim_elapsed().map_or(0, |d| d.as_millis() as u64)
}

fn config() -> ClientConfig {
    ClientConfig {
        attempt_timeout: Duration::from_millis(500),
        request_timeout: Duration::from_millis(1_500),
        connect_timeout: Duration::from_millis(300),
        max_attempts: 60,
        max_retry_time: Duration::from_secs(12),
        backoff_base: Duration::from_millis(20),
        backoff_cap: Duration::from_millis(400),
        keep_alive: true,
        exactly_once: true,
        ..ClientConfig::default()
    }
}

fn classify_write<T>(r: &Result<T, Error>) -> Option<Outcome> {
    match r {
        Ok(_) => None,
        Err(e) if e.is_outcome_unknown() || e.is_retryable() => Some(Outcome::Unknown),
        Err(e) => Some(Outcome::Failed(e.to_string())),
    }
}

/// Runs one client's workload to the end (errors are recorded, never returned).
pub async fn run(plan: ClientPlan) -> turmoil::Result {
    let name = format!("c{}", plan.index);
    let client = Client::connect_with(&plan.endpoints, config(), Some(plan.net.connector(&name)))?;
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let c = plan.index;
    let mut leases: Vec<(i64, bool)> = Vec::new();
    let mut last_seen: Vec<Option<String>> = vec![None; SHARED_KEYS];
    for n in 1..=plan.ops {
        let roll = rng.gen_range(0..100);
        let k = rng.gen_range(0..SHARED_KEYS);
        let key = format!("k{k}");
        let value = format!("c{c}-{n}");
        let start = now_ms();
        let (key, call, outcome) = match roll {
            0..=24 => {
                let key = own_key(c);
                let r = client.put(key.clone(), value.clone()).await;
                let o = classify_write(&r).unwrap_or(Outcome::Ok(None));
                (key, Call::Put { value }, o)
            }
            25..=39 => {
                let r = client.put(key.clone(), value.clone()).await;
                let o = classify_write(&r).unwrap_or(Outcome::Ok(None));
                (key, Call::Put { value }, o)
            }
            40..=46 => {
                let r = client.delete(key.clone()).await;
                let o = classify_write(&r).unwrap_or(Outcome::Ok(None));
                (key, Call::Delete, o)
            }
            47..=59 => {
                let expect = last_seen[k].clone();
                let compare = match &expect {
                    Some(v) => Compare::value(key.clone(), CompareOp::Equal, v.clone()),
                    None => Compare::version(key.clone(), CompareOp::Equal, 0),
                };
                let put = TxnOp::put(key.clone(), value.clone(), PutOptions::new());
                let r = client.txn(vec![compare], vec![put], vec![]).await;
                let o = match (&r, classify_write(&r)) {
                    (Ok(t), _) => Outcome::Ok(Some(t.succeeded.to_string())),
                    (Err(_), Some(o)) => o,
                    (Err(_), None) => Outcome::Unknown,
                };
                (key, Call::Cas { expect, value }, o)
            }
            60..=79 => {
                let serializable = roll >= 72;
                let options = if serializable {
                    GetOptions::new().with_serializable()
                } else {
                    GetOptions::new()
                };
                let r = client.range(key.clone(), options).await;
                let o = match r {
                    Ok(resp) => {
                        let v = resp
                            .kvs
                            .first()
                            .map(|kv| String::from_utf8_lossy(&kv.value).into_owned());
                        last_seen[k] = v.clone();
                        Outcome::Ok(v)
                    }
                    Err(e) => Outcome::Failed(e.to_string()),
                };
                (key, Call::Get { serializable }, o)
            }
            80..=91 => {
                let id = ((c as i64 + 1) << 24) | n as i64;
                let long_lived = rng.gen_bool(0.5);
                let ttl = if long_lived {
                    3_600
                } else {
                    rng.gen_range(2..=6)
                };
                let r = client.lease_grant(ttl, id).await;
                if r.is_ok() {
                    leases.push((id, long_lived));
                }
                let o = classify_write(&r).unwrap_or(Outcome::Ok(None));
                (format!("lease/{id}"), Call::LeaseGrant { id, ttl }, o)
            }
            _ => match leases.pop() {
                Some((id, long_lived)) => {
                    let r = client.lease_revoke(id).await;
                    let o = classify_write(&r).unwrap_or(Outcome::Ok(None));
                    (
                        format!("lease/{id}"),
                        Call::LeaseRevoke { id, long_lived },
                        o,
                    )
                }
                None => continue,
            },
        };
        let end = now_ms();
        plan.trace.line(format!(
            "c{c} {key} {call:?} -> {outcome:?} [{start}..{end}]"
        ));
        record(&plan.history, c, key, call, outcome, start, end);
        // Spread the calls over the fault window (and a little past it).
        let spread = plan.faults_end.as_millis() as u64 * 2 / plan.ops.max(1) as u64;
        let think = rng.gen_range(0..spread.max(40));
        tokio::time::sleep(Duration::from_millis(think)).await;
    }

    // Once the faults are over, read the own key linearizably (liveness and the
    // exactly-once count both depend on this read succeeding).
    let wait = plan
        .faults_end
        .saturating_sub(Duration::from_millis(now_ms()));
    tokio::time::sleep(wait).await;
    let key = own_key(c);
    let start = now_ms();
    let outcome = match client.range(key.clone(), GetOptions::new()).await {
        Ok(resp) => Outcome::Ok(
            resp.kvs
                .first()
                .map(|kv| final_value(&String::from_utf8_lossy(&kv.value), kv.version)),
        ),
        Err(e) => Outcome::Failed(format!("final read: {e}")),
    };
    let end = now_ms();
    plan.trace
        .line(format!("c{c} final {key} -> {outcome:?} [{start}..{end}]"));
    record(
        &plan.history,
        c,
        final_key(c),
        Call::Get {
            serializable: false,
        },
        outcome,
        start,
        end,
    );
    let _ = client.close().await;
    Ok(())
}

fn record(
    history: &History,
    client: usize,
    key: String,
    call: Call,
    outcome: Outcome,
    start: u64,
    end: u64,
) {
    let mut h = history.lock().unwrap_or_else(|p| p.into_inner());
    h.push(Event {
        client,
        key,
        call,
        outcome,
        start,
        end,
    });
}
