//! Property tests: random command streams from several clients (new requests, lost replies,
//! retries, network duplicates, forged secrets, reorderings inside the window, acks, ticks,
//! time stamps that run backwards, session and lease expiry, compactions) applied to two
//! replicas, one restored from its own snapshot now and then, whose images (history
//! included) must stay byte-identical; and a model of the session rules checking that no
//! tracked `(client, seq)` changes the state more than once.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use oncekv_core::{
    Command, CompareResult, CompareTarget, DeleteRangeRequest, EnqueueRequest, KeyRange,
    LogPayload, Op, OpResponse, PutRequest, RangeRequest, RequestOp, RequestTracker, Response,
    Secret, SessionError, Settings, StateMachine, Tracked, TxnRequest,
};
use proptest::prelude::*;

const CLIENTS: usize = 3;
const SESSION_TTL_MS: u64 = 8_000;
const LEASE_IDS: u8 = 3;
const ONCE_PREFIX: &str = "~once/";
const COUNTER: &str = "~count";

fn settings() -> Settings {
    Settings {
        session_ttl_ms: SESSION_TTL_MS,
        window: 4,
        min_lease_ttl_secs: 1,
    }
}

// --- what the generator draws -------------------------------------------------------------

/// An op on keys `k0`..`k7` and leases 1..=3 (0: none / pick one).
#[derive(Debug, Clone)]
enum OpSpec {
    Put {
        key: u8,
        value: u8,
        lease: u8,
        prev_kv: bool,
    },
    Delete {
        from: u8,
        len: u8,
        prev_kv: bool,
    },
    /// A txn: if `k{key}` has `version`, put `k{put}`, else delete `k{del}`.
    Cas {
        key: u8,
        version: i64,
        put: u8,
        del: u8,
    },
    Grant {
        id: u8,
        ttl: i64,
    },
    Revoke {
        id: u8,
    },
    KeepAlive {
        id: u8,
    },
    /// Compact history at this revision (refused when at or below the compacted one or in
    /// the future, which the runs reach too).
    Compact {
        revision: i64,
    },
    /// Lock (`proclaim` false) or Campaign on `k8` or `k9` with lease `lease` (0: a lease
    /// granted by the op itself), value `v{value}`.
    Enqueue {
        name: u8,
        lease: u8,
        value: u8,
        proclaim: bool,
    },
}

#[derive(Debug, Clone)]
enum Action {
    /// A client sends a new request (registering first if it has no session).
    Issue {
        client: usize,
        op: OpSpec,
    },
    /// Up to three in-flight requests (fresh or retried) reach the leader in one entry; their
    /// replies are lost or delivered.
    Deliver {
        picks: Vec<usize>,
        lose: bool,
    },
    /// The network delivers an exact copy of an old message (old first_incomplete too).
    Duplicate {
        pick: usize,
    },
    /// Someone who guessed a client id sends an in-flight request with a wrong secret.
    Forge {
        pick: usize,
    },
    KeepAlive {
        client: usize,
    },
    Close {
        client: usize,
    },
    /// A tick `ms` later.
    Tick {
        ms: u64,
    },
    /// The next entry, whatever it carries, is stamped `ms` earlier than the current cluster
    /// time (a new leader whose clock lags).
    Backwards {
        ms: u64,
    },
    Untracked {
        op: OpSpec,
    },
    /// Grow the window and change the session TTL through the log.
    Configure {
        grow: u64,
        ttl: u64,
    },
    /// Replica B is replaced by a restore of its own snapshot.
    Restore,
}

fn op_spec() -> impl Strategy<Value = OpSpec> {
    let key = 0u8..8;
    prop_oneof![
        4 => (key.clone(), any::<u8>(), 0..=LEASE_IDS, any::<bool>()).prop_map(
            |(key, value, lease, prev_kv)| OpSpec::Put { key, value, lease, prev_kv }
        ),
        2 => (key.clone(), 0u8..3, any::<bool>())
            .prop_map(|(from, len, prev_kv)| OpSpec::Delete { from, len, prev_kv }),
        2 => (key.clone(), 0i64..3, key.clone(), key)
            .prop_map(|(key, version, put, del)| OpSpec::Cas { key, version, put, del }),
        2 => (0..=LEASE_IDS, 1i64..=4).prop_map(|(id, ttl)| OpSpec::Grant { id, ttl }),
        1 => (1..=LEASE_IDS).prop_map(|id| OpSpec::Revoke { id }),
        1 => (1..=LEASE_IDS).prop_map(|id| OpSpec::KeepAlive { id }),
        2 => (1i64..60).prop_map(|revision| OpSpec::Compact { revision }),
        1 => (8u8..=9, 0..=LEASE_IDS, 0u8..2, any::<bool>())
            .prop_map(|(name, lease, value, proclaim)| OpSpec::Enqueue { name, lease, value, proclaim }),
    ]
}

/// `restore_weight` (at least 1) tunes how often replica B is rebuilt from its snapshot.
fn action(restore_weight: u32) -> impl Strategy<Value = Action> {
    let client = 0..CLIENTS;
    let pick = any::<usize>();
    prop_oneof![
        10 => (client.clone(), op_spec()).prop_map(|(client, op)| Action::Issue { client, op }),
        8 => (prop::collection::vec(pick, 1..=3), prop::bool::weighted(0.3))
            .prop_map(|(picks, lose)| Action::Deliver { picks, lose }),
        2 => pick.prop_map(|pick| Action::Duplicate { pick }),
        1 => pick.prop_map(|pick| Action::Forge { pick }),
        1 => client.clone().prop_map(|client| Action::KeepAlive { client }),
        1 => client.prop_map(|client| Action::Close { client }),
        4 => prop_oneof![19 => 0u64..2_000, 1 => 8_000u64..20_000]
            .prop_map(|ms| Action::Tick { ms }),
        1 => (1u64..5_000).prop_map(|ms| Action::Backwards { ms }),
        2 => op_spec().prop_map(|op| Action::Untracked { op }),
        1 => (prop::bool::weighted(0.2), 4_000u64..12_000)
            .prop_map(|(grow, ttl)| Action::Configure { grow: u64::from(grow), ttl }),
        restore_weight => Just(Action::Restore),
    ]
}

fn key(n: u8) -> Bytes {
    Bytes::from(format!("k{n}"))
}

fn put(key: Bytes, value: impl Into<Bytes>) -> PutRequest {
    PutRequest {
        key,
        value: value.into(),
        ..PutRequest::default()
    }
}

/// The op as a list of txn ops (for KV ops) or a lease op.
fn build(spec: &OpSpec) -> Result<RequestOp, Op> {
    Ok(match *spec {
        OpSpec::Put {
            key: k,
            value,
            lease,
            prev_kv,
        } => RequestOp::Put(PutRequest {
            lease: i64::from(lease),
            prev_kv,
            ..put(key(k), vec![value])
        }),
        OpSpec::Delete { from, len, prev_kv } => RequestOp::DeleteRange(DeleteRangeRequest {
            range: if len == 0 {
                KeyRange::prefix("k")
            } else {
                KeyRange {
                    key: key(from),
                    range_end: key(from + len),
                }
            },
            prev_kv,
        }),
        OpSpec::Cas {
            key: k,
            version,
            put: p,
            del,
        } => RequestOp::Txn(TxnRequest {
            compare: vec![oncekv_core::Compare {
                result: CompareResult::Equal,
                target: CompareTarget::Version(version),
                range: KeyRange::single(key(k)),
            }],
            success: vec![
                RequestOp::Put(put(key(p), "cas")),
                RequestOp::Range(RangeRequest {
                    range: KeyRange::prefix("k"),
                    ..RangeRequest::default()
                }),
            ],
            failure: vec![RequestOp::DeleteRange(DeleteRangeRequest {
                range: KeyRange::single(key(del)),
                prev_kv: true,
            })],
        }),
        OpSpec::Grant { id, ttl } => {
            return Err(Op::LeaseGrant {
                id: i64::from(id),
                ttl,
            });
        }
        OpSpec::Revoke { id } => return Err(Op::LeaseRevoke { id: i64::from(id) }),
        OpSpec::KeepAlive { id } => return Err(Op::LeaseKeepAlive { id: i64::from(id) }),
        OpSpec::Compact { revision } => return Err(Op::Compact { revision }),
        OpSpec::Enqueue {
            name,
            lease,
            value,
            proclaim,
        } => {
            return Err(Op::Enqueue(EnqueueRequest {
                name: key(name),
                lease: i64::from(lease),
                value: Bytes::from(format!("v{value}")),
                proclaim,
            }));
        }
    })
}

/// A tracked op: KV ops are wrapped in a txn that also puts this request's own marker key and
/// the shared counter, so every execution leaves a trace the model can count.
fn tracked_op(spec: &OpSpec, client_id: u64, seq: u64) -> Op {
    match build(spec) {
        Ok(inner) => Op::Txn(TxnRequest {
            compare: vec![],
            success: vec![
                inner,
                RequestOp::Put(put(marker(client_id, seq), "1")),
                RequestOp::Put(put(Bytes::from_static(COUNTER.as_bytes()), "1")),
            ],
            failure: vec![],
        }),
        Err(lease_op) => lease_op,
    }
}

fn untracked_op(spec: &OpSpec) -> Op {
    match build(spec) {
        Ok(RequestOp::Put(p)) => Op::Put(p),
        Ok(RequestOp::DeleteRange(d)) => Op::DeleteRange(d),
        Ok(RequestOp::Txn(t)) => Op::Txn(t),
        Ok(RequestOp::Range(_)) => unreachable!("build() makes no bare ranges"),
        Err(lease_op) => lease_op,
    }
}

fn marker(client_id: u64, seq: u64) -> Bytes {
    Bytes::from(format!("{ONCE_PREFIX}{client_id:08}/{seq:08}"))
}

mod harness;
mod model;

use harness::Harness;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 128,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    // Dedup must survive compaction, restart and failover: a replica rebuilt from a snapshot
    // midway must answer every later command exactly as one that never was, byte for byte,
    // or a retry after failover could run twice or get a different answer.
    #[test]
    fn replica_restored_from_a_snapshot_midway_stays_byte_identical(
        actions in prop::collection::vec(action(3), 1..150)
    ) {
        let mut h = Harness::new();
        for a in actions {
            h.run(a);
        }
        let final_a = h.a.snapshot().ok();
        prop_assert!(final_a.is_some());
        prop_assert_eq!(final_a, h.b.snapshot().ok());
    }

    // The promise itself: whatever the retries, duplicates, reorderings, acks and expiries,
    // each tracked (client, seq) changes the state at most once, and every answer is what the
    // seven rules say.
    #[test]
    fn no_tracked_command_changes_state_more_than_once(
        actions in prop::collection::vec(action(1), 1..200)
    ) {
        let mut h = Harness::new();
        for a in actions {
            h.run(a);
        }
        h.model.check_state(&h.a);
        let executed = h.model.executed.len() as u64;
        prop_assert_eq!(h.a.stats().executed, executed);
    }
}

// The generator must reach every rule, or the properties above are vacuous: each outcome of
// the session rules, session and lease expiry, and restores all occur in a typical run.
#[test]
fn random_streams_reach_every_rule() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut outcomes: BTreeMap<&str, u64> = BTreeMap::new();
    let (mut sessions_expired, mut leases_expired, mut restores) = (0, 0, 0);
    for _ in 0..64 {
        let actions = prop::collection::vec(action(3), 100..150)
            .new_tree(&mut runner)
            .expect("strategy")
            .current();
        let mut h = Harness::new();
        for a in actions {
            h.run(a);
        }
        for (k, n) in &h.model.outcomes {
            *outcomes.entry(k).or_default() += n;
        }
        sessions_expired += h.a.stats().sessions_expired;
        leases_expired += h.a.stats().leases_expired;
        restores += h.restores;
    }
    for rule in [
        "expired",
        "denied",
        "stale",
        "duplicate",
        "window",
        "executed",
        "kv applied",
        "lease grant ok",
        "lease already exists",
        "compacted",
        "compaction refused",
        "enqueued",
    ] {
        assert!(
            outcomes.get(rule).is_some_and(|n| *n >= 10),
            "{rule}: {outcomes:?}"
        );
    }
    assert!(sessions_expired >= 10 && leases_expired >= 10 && restores >= 10);
}
