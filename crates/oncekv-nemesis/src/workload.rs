//! The workload of a run, for a bounded time, every call recorded ([`Recorder`]):
//!
//! - **tracked writers** (oncekv only): the `oncekv-client` with `exactly_once: true`,
//!   every endpoint, following the leader and retrying with the same sequence number.
//!   Puts on their own key (`own/<c>`, counted by the exactly-once checker), puts of
//!   unique values and compare-and-swap txns on the shared keys, linearizable reads,
//!   lease grants with explicit ids and revokes. An error that is retryable or leaves the
//!   outcome unknown is *unknown*, never failed (as `oncekv-sim`'s workload reads them);
//! - **untracked writers**: the plain `etcd-client`, each on its own member, puts of
//!   unique values, compare-and-swap txns and deletes on the shared keys; a write that
//!   got no answer is unknown;
//! - **readers**: `etcd-client`, each on its own member, linearizable and serializable
//!   reads of the shared keys;
//! - **lease users**: `etcd-client`, grants with explicit ids, a keep-alive, revokes;
//! - **a prober**: a put and a linearizable read every 100 ms, on each member in turn,
//!   so that the return of service after a heal shows in the history
//!   ([`crate::finale::unavailability`]).
//!
//! The shared keys rotate every [`KEY_PERIOD_MS`] (`k<generation>.<i>`), so that no key
//! gathers more operations than the linearizability search can take in.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, LeaseGrantOptions, Txn, TxnOp};
use oncekv_check::{Call, Outcome, own_key};
use oncekv_client::{Client, ClientConfig, Error};
use rand::Rng;

use crate::etcd;
use crate::recorder::Recorder;

/// Shared keys at a time.
pub const SHARED_KEYS: usize = 4;
/// How long one generation of shared keys is used.
pub const KEY_PERIOD_MS: u64 = 5_000;
/// The key the prober writes and reads (not judged: it only shows availability).
pub const PROBE_KEY: &str = "probe";

/// The shared key `i` of the generation at `now_ms`.
pub fn shared_key(now_ms: u64, i: usize) -> String {
    format!("k{}.{i}", now_ms / KEY_PERIOD_MS)
}

/// What every worker needs.
#[derive(Debug, Clone)]
pub struct Env {
    pub recorder: Arc<Recorder>,
    pub endpoints: Vec<String>,
    /// Run-clock milliseconds after which no new call starts.
    pub until: u64,
}

impl Env {
    fn running(&self) -> bool {
        self.recorder.now() < self.until
    }

    /// The member client `c` talks to, when it talks to one.
    fn endpoint(&self, c: usize) -> &str {
        &self.endpoints[c % self.endpoints.len()]
    }
}

async fn think(lo: u64, hi: u64) {
    let ms = rand::thread_rng().gen_range(lo..hi);
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// A pause after a call that did not succeed, so that a partitioned client does not pile
/// up unknown writes faster than the checker can order them.
async fn after(ok: bool) {
    if !ok {
        think(200, 600).await;
    }
}

fn tracked_config() -> ClientConfig {
    ClientConfig {
        attempt_timeout: Duration::from_millis(500),
        request_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_millis(300),
        max_attempts: 30,
        max_retry_time: Duration::from_secs(6),
        backoff_base: Duration::from_millis(20),
        backoff_cap: Duration::from_millis(400),
        keep_alive: true,
        exactly_once: true,
        ..ClientConfig::default()
    }
}

fn classify<T>(r: &Result<T, Error>) -> Outcome {
    match r {
        Ok(_) => Outcome::Ok(None),
        Err(e) if e.is_outcome_unknown() || e.is_retryable() => Outcome::Unknown,
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

/// Tracked writer `c` (its own key is `own/<c>`).
pub async fn tracked_writer(env: Env, c: usize) {
    let client = match Client::connect(&env.endpoints, tracked_config()) {
        Ok(client) => client,
        Err(e) => {
            eprintln!("nemesis: tracked writer c{c}: {e}");
            return;
        }
    };
    let mut last_seen: HashMap<String, Option<String>> = HashMap::new();
    let mut leases: Vec<(i64, bool)> = Vec::new();
    let mut n: i64 = 0;
    while env.running() && n < 1_000_000 {
        n += 1;
        let start = env.recorder.now();
        let i = rand::thread_rng().gen_range(0..SHARED_KEYS);
        let key = shared_key(start, i);
        let value = format!("c{c}-{n}");
        let roll = rand::thread_rng().gen_range(0..100);
        let (key, call, outcome) = match roll {
            0..=39 => {
                let key = own_key(c);
                let o = classify(&client.put(key.clone(), value.clone()).await);
                (key, Call::Put { value }, o)
            }
            40..=54 => {
                let o = classify(&client.put(key.clone(), value.clone()).await);
                (key, Call::Put { value }, o)
            }
            55..=69 => {
                let expect = last_seen.get(&key).cloned().flatten();
                let compare = match &expect {
                    Some(v) => oncekv_client::Compare::value(
                        key.clone(),
                        oncekv_client::CompareOp::Equal,
                        v.clone(),
                    ),
                    None => oncekv_client::Compare::version(
                        key.clone(),
                        oncekv_client::CompareOp::Equal,
                        0,
                    ),
                };
                let put = oncekv_client::TxnOp::put(
                    key.clone(),
                    value.clone(),
                    oncekv_client::PutOptions::new(),
                );
                let r = client.txn(vec![compare], vec![put], vec![]).await;
                let o = match &r {
                    Ok(t) => Outcome::Ok(Some(t.succeeded.to_string())),
                    Err(_) => classify(&r),
                };
                (key, Call::Cas { expect, value }, o)
            }
            70..=84 => {
                let o = match client.range(key.clone(), Default::default()).await {
                    Ok(resp) => {
                        let v = resp.kvs.first().map(|kv| etcd::text(&kv.value));
                        last_seen.insert(key.clone(), v.clone());
                        Outcome::Ok(v)
                    }
                    Err(e) => Outcome::Failed(e.to_string()),
                };
                (
                    key,
                    Call::Get {
                        serializable: false,
                    },
                    o,
                )
            }
            85..=93 => {
                let id = ((c as i64 + 1) << 24) | n;
                let long_lived = rand::thread_rng().gen_bool(0.5);
                let ttl = if long_lived { 3_600 } else { 5 };
                let r = client.lease_grant(ttl, id).await;
                if r.is_ok() {
                    leases.push((id, long_lived));
                }
                (
                    format!("lease/{id}"),
                    Call::LeaseGrant { id, ttl },
                    classify(&r),
                )
            }
            _ => match leases.pop() {
                Some((id, long_lived)) => {
                    let o = classify(&client.lease_revoke(id).await);
                    (
                        format!("lease/{id}"),
                        Call::LeaseRevoke { id, long_lived },
                        o,
                    )
                }
                None => continue,
            },
        };
        let ok = matches!(outcome, Outcome::Ok(_));
        env.recorder.record(c, key, call, outcome, start);
        after(ok).await;
        think(10, 80).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(3), client.close()).await;
}

/// Untracked writer `c`, on its own member.
pub async fn untracked_writer(env: Env, c: usize) {
    let Ok(mut client) = etcd::connect(env.endpoint(c), Duration::from_secs(2)).await else {
        return;
    };
    let mut last_seen: HashMap<String, Option<String>> = HashMap::new();
    let mut n: u64 = 0;
    while env.running() && n < 1_000_000 {
        n += 1;
        let start = env.recorder.now();
        let key = shared_key(start, rand::thread_rng().gen_range(0..SHARED_KEYS));
        let value = format!("u{c}-{n}");
        let roll = rand::thread_rng().gen_range(0..100);
        let (call, outcome) = match roll {
            0..=44 => {
                let o = match client.put(key.clone(), value.clone(), None).await {
                    Ok(_) => Outcome::Ok(None),
                    Err(e) => etcd::write_failure(&e),
                };
                (Call::Put { value }, o)
            }
            45..=74 => {
                let expect = last_seen.get(&key).cloned().flatten();
                let compare = match &expect {
                    Some(v) => Compare::value(key.clone(), CompareOp::Equal, v.clone()),
                    None => Compare::version(key.clone(), CompareOp::Equal, 0),
                };
                let txn = Txn::new().when([compare]).and_then([TxnOp::put(
                    key.clone(),
                    value.clone(),
                    None,
                )]);
                let o = match client.txn(txn).await {
                    Ok(t) => Outcome::Ok(Some(t.succeeded().to_string())),
                    Err(e) => etcd::write_failure(&e),
                };
                (Call::Cas { expect, value }, o)
            }
            75..=79 => {
                let o = match client.delete(key.clone(), None).await {
                    Ok(_) => Outcome::Ok(None),
                    Err(e) => etcd::write_failure(&e),
                };
                (Call::Delete, o)
            }
            _ => {
                let o = match client.get(key.clone(), None).await {
                    Ok(resp) => {
                        let v = resp.kvs().first().map(|kv| etcd::text(kv.value()));
                        last_seen.insert(key.clone(), v.clone());
                        Outcome::Ok(v)
                    }
                    Err(e) => Outcome::Failed(e.to_string()),
                };
                (
                    Call::Get {
                        serializable: false,
                    },
                    o,
                )
            }
        };
        let ok = matches!(outcome, Outcome::Ok(_));
        env.recorder.record(c, key, call, outcome, start);
        after(ok).await;
        think(10, 80).await;
    }
}

/// Reader `c`, on its own member: linearizable reads, and a third serializable.
pub async fn reader(env: Env, c: usize) {
    let Ok(mut client) = etcd::connect(env.endpoint(c), Duration::from_secs(2)).await else {
        return;
    };
    let mut n: u64 = 0;
    while env.running() && n < 1_000_000 {
        n += 1;
        let start = env.recorder.now();
        let key = shared_key(start, rand::thread_rng().gen_range(0..SHARED_KEYS));
        let serializable = rand::thread_rng().gen_range(0..3) == 0;
        let options = serializable.then(|| GetOptions::new().with_serializable());
        let outcome = match client.get(key.clone(), options).await {
            Ok(resp) => Outcome::Ok(resp.kvs().first().map(|kv| etcd::text(kv.value()))),
            Err(e) => Outcome::Failed(e.to_string()),
        };
        let ok = matches!(outcome, Outcome::Ok(_));
        env.recorder
            .record(c, key, Call::Get { serializable }, outcome, start);
        after(ok).await;
        think(10, 80).await;
    }
}

/// Lease user `c`, on its own member: grants with explicit ids (a quarter long-lived),
/// a keep-alive of each, revokes.
pub async fn lease_user(env: Env, c: usize) {
    let Ok(mut client) = etcd::connect(env.endpoint(c), Duration::from_secs(2)).await else {
        return;
    };
    let mut granted: Vec<(i64, bool)> = Vec::new();
    let mut n: i64 = 0;
    while env.running() && n < 100_000 {
        n += 1;
        let start = env.recorder.now();
        let revoke =
            granted.len() >= 3 || (!granted.is_empty() && rand::thread_rng().gen_bool(0.4));
        if revoke {
            let (id, long_lived) = granted.remove(0);
            let outcome = match client.lease_revoke(id).await {
                Ok(_) => Outcome::Ok(None),
                Err(e) => etcd::write_failure(&e),
            };
            env.recorder.record(
                c,
                format!("lease/{id}"),
                Call::LeaseRevoke { id, long_lived },
                outcome,
                start,
            );
        } else {
            let id = ((c as i64 + 1) << 24) | n;
            let long_lived = rand::thread_rng().gen_bool(0.25);
            let ttl = if long_lived { 3_600 } else { 10 };
            let options = LeaseGrantOptions::new().with_id(id);
            let outcome = match client.lease_grant(ttl, Some(options)).await {
                Ok(_) => {
                    granted.push((id, long_lived));
                    Outcome::Ok(None)
                }
                Err(e) => etcd::write_failure(&e),
            };
            let ok = matches!(outcome, Outcome::Ok(_));
            env.recorder.record(
                c,
                format!("lease/{id}"),
                Call::LeaseGrant { id, ttl },
                outcome,
                start,
            );
            after(ok).await;
            if ok
                && let Ok((mut keeper, mut stream)) = client.lease_keep_alive(id).await
                && keeper.keep_alive().await.is_ok()
            {
                let _ = tokio::time::timeout(Duration::from_secs(1), stream.message()).await;
            }
        }
        think(100, 400).await;
    }
}

/// The prober (client `c`): a put and a linearizable read every 100 ms, each member in
/// turn, until `env.until`.
pub async fn prober(env: Env, c: usize) {
    let mut clients = Vec::new();
    for e in &env.endpoints {
        if let Ok(client) = etcd::connect(e, Duration::from_secs(1)).await {
            clients.push(client);
        }
    }
    let mut n: u64 = 0;
    while env.running() && n < 10_000_000 && !clients.is_empty() {
        let count = clients.len();
        let client = &mut clients[n as usize % count];
        n += 1;
        let start = env.recorder.now();
        let value = format!("p{n}");
        let outcome = match client.put(PROBE_KEY, value.clone(), None).await {
            Ok(_) => Outcome::Ok(None),
            Err(e) => etcd::write_failure(&e),
        };
        env.recorder
            .record(c, PROBE_KEY.into(), Call::Put { value }, outcome, start);
        let start = env.recorder.now();
        let outcome = match client.get(PROBE_KEY, None).await {
            Ok(resp) => Outcome::Ok(resp.kvs().first().map(|kv| etcd::text(kv.value()))),
            Err(e) => Outcome::Failed(e.to_string()),
        };
        env.recorder.record(
            c,
            PROBE_KEY.into(),
            Call::Get {
                serializable: false,
            },
            outcome,
            start,
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Keys must start with `k` (the linearizability checker's subject) and change with
    // the generation, so that no key's history outgrows the search.
    #[test]
    fn shared_keys_rotate_by_generation() {
        assert_eq!(shared_key(0, 2), "k0.2");
        assert_eq!(shared_key(KEY_PERIOD_MS - 1, 2), "k0.2");
        assert_eq!(shared_key(KEY_PERIOD_MS, 2), "k1.2");
    }
}
