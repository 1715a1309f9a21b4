//! MVCC history against a naive model that keeps a full copy of the key space at every
//! revision: a read at every retained revision, and the watch events from every retained
//! revision, must equal what the copies say, through puts, deletes, txns, lease revokes and
//! expiries, compactions and restores from a snapshot. Plus the cases the issue names:
//! a duplicate creates no revision and no event, lease expiry creates delete events, and
//! compaction frees what it drops.

mod common;

use std::collections::BTreeMap;

use bytes::Bytes;
use common::{Replica, get_req, tracked};
use oncekv_core::{
    DeleteRangeRequest, Event, EventKind, KeyRange, KeyValue, Op, OpError, PutRequest,
    RangeRequest, ReadLimit, RequestOp, Response, Secret, Settings, SortOrder, SortTarget,
    StateMachine, TxnRequest,
};
use proptest::prelude::*;

fn settings() -> Settings {
    Settings {
        min_lease_ttl_secs: 1,
        ..Settings::default()
    }
}

fn key(n: u8) -> Bytes {
    Bytes::from(format!("k{n}"))
}

fn put(n: u8, value: u8, lease: i64) -> PutRequest {
    PutRequest {
        key: key(n),
        value: Bytes::from(vec![value]),
        lease,
        ..PutRequest::default()
    }
}

#[derive(Debug, Clone)]
enum Step {
    Put {
        key: u8,
        value: u8,
        lease: u8,
    },
    Delete {
        from: u8,
        len: u8,
    },
    /// A txn writing two keys and deleting a third range at one revision.
    Txn {
        a: u8,
        b: u8,
        del: u8,
    },
    Grant {
        id: u8,
        ttl: i64,
    },
    Revoke {
        id: u8,
    },
    /// Cluster time moves on (leases may expire).
    Tick {
        ms: u64,
    },
    /// Compact `back` revisions behind the current one (refused when that is not above the
    /// compacted revision).
    Compact {
        back: i64,
    },
    /// The replica is replaced by a restore of its own snapshot.
    Restore,
}

fn step() -> impl Strategy<Value = Step> {
    let k = 0u8..8;
    prop_oneof![
        6 => (k.clone(), any::<u8>(), 0u8..3).prop_map(|(key, value, lease)| Step::Put { key, value, lease }),
        2 => (k.clone(), 0u8..4).prop_map(|(from, len)| Step::Delete { from, len }),
        2 => (k.clone(), k.clone(), k).prop_map(|(a, b, del)| Step::Txn { a, b, del }),
        2 => (1u8..3, 1i64..4).prop_map(|(id, ttl)| Step::Grant { id, ttl }),
        1 => (1u8..3).prop_map(|id| Step::Revoke { id }),
        2 => (0u64..2_500).prop_map(|ms| Step::Tick { ms }),
        1 => (0i64..6).prop_map(|back| Step::Compact { back }),
        1 => Just(Step::Restore),
    ]
}

/// The naive model: the whole key space after every revision the test saw.
#[derive(Debug, Default)]
struct Copies(BTreeMap<i64, BTreeMap<Bytes, KeyValue>>);

impl Copies {
    fn record(&mut self, sm: &StateMachine) {
        let state = sm
            .kv()
            .iter()
            .map(|(k, v)| (k.clone(), v.to_key_value(k)))
            .collect();
        self.0.insert(sm.revision(), state);
    }

    /// The model's events at `revision`: puts written at it, keys gone since the revision
    /// before, in key order. `None` if either copy is missing (several revisions in one
    /// entry, e.g. two leases expiring at once).
    fn events_at(&self, revision: i64) -> Option<Vec<Event>> {
        let before = self.0.get(&(revision - 1))?;
        let after = self.0.get(&revision)?;
        let mut events = Vec::new();
        for (k, kv) in after {
            if kv.mod_revision == revision {
                events.push(Event {
                    kind: EventKind::Put,
                    kv: kv.clone(),
                    prev_kv: before.get(k).cloned(),
                });
            }
        }
        for (k, kv) in before {
            if !after.contains_key(k) {
                events.push(Event {
                    kind: EventKind::Delete,
                    kv: KeyValue {
                        key: k.clone(),
                        mod_revision: revision,
                        ..KeyValue::default()
                    },
                    prev_kv: Some(kv.clone()),
                });
            }
        }
        events.sort_by(|a, b| a.kv.key.cmp(&b.kv.key));
        Some(events)
    }
}

fn ranges() -> Vec<KeyRange> {
    vec![
        KeyRange {
            key: Bytes::from_static(b"k"),
            range_end: Bytes::from_static(b"\0"),
        },
        KeyRange::prefix("k"),
        KeyRange::single(key(3)),
        KeyRange {
            key: key(2),
            range_end: key(6),
        },
    ]
}

/// Every retained revision reads as the model's copy; older ones are refused as compacted,
/// newer ones as future.
fn check_reads(sm: &StateMachine, copies: &Copies) {
    let compacted = sm.compacted_revision();
    let current = sm.revision();
    for (&revision, copy) in copies.0.range(1..=current) {
        for range in ranges() {
            let req = RangeRequest {
                revision,
                ..get_req(range.clone())
            };
            let got = sm.range(&req);
            if revision < compacted {
                assert_eq!(got, Err(OpError::Compacted), "read at {revision}");
                continue;
            }
            let want: Vec<KeyValue> = copy
                .iter()
                .filter(|(k, _)| oncekv_core::kv::in_range(&range, k))
                .map(|(_, kv)| kv.clone())
                .collect();
            let (header, resp) = got.unwrap_or_else(|e| panic!("read at {revision}: {e}"));
            assert_eq!(header, current);
            assert_eq!(resp.count, want.len() as i64, "count at {revision}");
            assert_eq!(resp.kvs, want, "{range:?} at {revision}");
            // The filters, sort and limit apply to the older revision's keys too.
            let newest_two = sm
                .range(&RangeRequest {
                    sort_order: SortOrder::Descend,
                    sort_target: SortTarget::Mod,
                    limit: 2,
                    ..req.clone()
                })
                .map(|(_, r)| r.kvs.iter().map(|kv| kv.mod_revision).collect::<Vec<_>>());
            let mut mods: Vec<i64> = want.iter().map(|kv| kv.mod_revision).collect();
            mods.sort_unstable_by(|a, b| b.cmp(a));
            mods.truncate(2);
            assert_eq!(newest_two, Ok(mods), "sorted by mod at {revision}");
        }
    }
    assert_eq!(
        sm.range(&RangeRequest {
            revision: current + 1,
            ..get_req(KeyRange::single(key(0)))
        }),
        Err(OpError::FutureRevision)
    );
}

/// Events from every retained revision equal the model's, revision by revision, with
/// `prev_kv` wherever the revision before is retained; read in small batches, they are
/// the same events and no revision is split between batches.
fn check_events(sm: &StateMachine, copies: &Copies) {
    let compacted = sm.compacted_revision();
    let current = sm.revision();
    let all = &ranges()[0];
    if compacted > 1 {
        assert_eq!(
            sm.events(all, compacted - 1, false, ReadLimit::ALL),
            Err(OpError::Compacted)
        );
    }
    for from in compacted.max(1)..=current + 1 {
        let batch = sm
            .events(all, from, true, ReadLimit::ALL)
            .expect("retained");
        assert_eq!(batch.next, current + 1);
        assert_eq!(batch.revision, current);
        let mut by_revision: BTreeMap<i64, Vec<Event>> = BTreeMap::new();
        for e in batch.events.clone() {
            by_revision.entry(e.kv.mod_revision).or_default().push(e);
        }
        let revisions: Vec<i64> = batch.events.iter().map(|e| e.kv.mod_revision).collect();
        assert!(
            revisions.windows(2).all(|w| w[0] <= w[1]),
            "in revision order"
        );
        for revision in from..=current {
            let Some(want) = copies.events_at(revision) else {
                continue;
            };
            let mut got = by_revision.remove(&revision).unwrap_or_default();
            got.sort_by(|a, b| a.kv.key.cmp(&b.kv.key));
            if revision == compacted {
                // The revision before a compaction point may be gone: prev_kv is then
                // absent, never wrong.
                for (g, w) in got.iter_mut().zip(&want) {
                    if g.prev_kv.is_none() {
                        g.prev_kv = w.prev_kv.clone();
                    }
                }
            }
            assert_eq!(got, want, "events at {revision} (from {from})");
        }
        // In batches of at most about 2 events.
        let mut batched = Vec::new();
        let mut next = from;
        while next <= current {
            let b = sm
                .events(all, next, true, ReadLimit::events(2))
                .expect("retained");
            assert!(b.next > next, "a batch makes progress");
            if let Some(last) = b.events.last() {
                assert!(b.next > last.kv.mod_revision);
                assert!(b.events.iter().all(|e| e.kv.mod_revision < b.next));
            }
            batched.extend(b.events);
            next = b.next;
        }
        assert_eq!(batched, batch.events, "batched from {from}");
    }
}

struct Run {
    replica: Replica,
    copies: Copies,
    restores: usize,
    compactions: usize,
}

impl Run {
    fn new() -> Run {
        let replica = Replica::new(settings());
        let mut copies = Copies::default();
        copies.record(&replica.sm);
        Run {
            replica,
            copies,
            restores: 0,
            compactions: 0,
        }
    }

    fn untracked(&mut self, op: Op) {
        self.replica.untracked(op);
    }

    fn step(&mut self, step: Step) {
        let r = &mut self.replica;
        match step {
            Step::Put { key, value, lease } => {
                self.untracked(Op::Put(put(key, value, i64::from(lease))));
            }
            Step::Delete { from, len } => self.untracked(Op::DeleteRange(DeleteRangeRequest {
                range: KeyRange {
                    key: key(from),
                    range_end: if len == 0 {
                        Bytes::new()
                    } else {
                        key(from + len)
                    },
                },
                prev_kv: false,
            })),
            Step::Txn { a, b, del } => self.untracked(Op::Txn(TxnRequest {
                compare: vec![],
                success: vec![
                    RequestOp::Put(put(a, 1, 0)),
                    RequestOp::Put(put(b, 2, 0)),
                    RequestOp::DeleteRange(DeleteRangeRequest {
                        range: KeyRange::single(key(del)),
                        prev_kv: false,
                    }),
                ],
                failure: vec![],
            })),
            Step::Grant { id, ttl } => self.untracked(Op::LeaseGrant {
                id: i64::from(id),
                ttl,
            }),
            Step::Revoke { id } => self.untracked(Op::LeaseRevoke { id: i64::from(id) }),
            Step::Tick { ms } => {
                let time = r.time + ms;
                r.tick_at(time);
            }
            Step::Compact { back } => {
                let revision = r.sm.revision() - back;
                let reply = r.untracked(Op::Compact { revision });
                if reply.result.is_ok() {
                    self.compactions += 1;
                }
            }
            Step::Restore => {
                let image = r.snapshot();
                r.sm = StateMachine::restore(&image).expect("own snapshot restores");
                self.restores += 1;
            }
        }
        self.copies.record(&self.replica.sm);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn reads_and_events_at_every_retained_revision_match_full_copies(
        steps in prop::collection::vec(step(), 1..60)
    ) {
        let mut run = Run::new();
        for s in steps {
            run.step(s);
            check_reads(&run.replica.sm, &run.copies);
        }
        check_events(&run.replica.sm, &run.copies);
    }
}

// The generator must reach compactions, restores and lease expiries, or the property
// above checks less than it claims.
#[test]
fn random_runs_compact_restore_and_expire() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let (mut compactions, mut restores, mut expired) = (0, 0, 0);
    for _ in 0..32 {
        let steps = prop::collection::vec(step(), 40..60)
            .new_tree(&mut runner)
            .expect("strategy")
            .current();
        let mut run = Run::new();
        for s in steps {
            run.step(s);
        }
        compactions += run.compactions;
        restores += run.restores;
        expired += run.replica.sm.stats().leases_expired;
    }
    assert!(
        compactions >= 10 && restores >= 10 && expired >= 10,
        "{compactions} compactions, {restores} restores, {expired} expiries"
    );
}

// A tracked command's duplicate changes nothing: no revision, no event.
#[test]
fn a_duplicate_creates_no_revision_and_no_event() {
    let mut r = Replica::new(settings());
    let secret = Secret::from_u128(7);
    let id = r.register(secret);
    let cmd = tracked(id, secret, 1, 1, Op::put("k", "v"));
    r.one(cmd.clone());
    let (revision, recorded) = (r.sm.revision(), r.sm.kv().history().len());
    let again = r.one(cmd);
    assert!(matches!(again, Response::Op(Ok(_))));
    assert_eq!(r.sm.stats().duplicates, 1);
    assert_eq!(r.sm.revision(), revision);
    assert_eq!(r.sm.kv().history().len(), recorded);
    let events =
        r.sm.events(&KeyRange::single("k"), 1, false, ReadLimit::ALL)
            .expect("retained");
    assert_eq!(events.events.len(), 1);
}

// Revoke and expiry delete the lease's keys with delete events, one revision per lease.
#[test]
fn lease_revoke_and_expiry_create_delete_events() {
    let mut r = Replica::new(settings());
    r.ok(Op::LeaseGrant { id: 1, ttl: 1 });
    r.ok(Op::LeaseGrant { id: 2, ttl: 60 });
    r.ok(Op::Put(put(1, 1, 1)));
    r.ok(Op::Put(put(2, 2, 1)));
    r.ok(Op::Put(put(3, 3, 2)));
    let from = r.sm.revision() + 1;
    r.ok(Op::LeaseRevoke { id: 2 });
    let time = r.time + 1_000;
    r.tick_at(time);
    let batch =
        r.sm.events(&KeyRange::prefix("k"), from, true, ReadLimit::ALL)
            .expect("retained");
    let got: Vec<(EventKind, Bytes, i64, Option<Bytes>)> = batch
        .events
        .iter()
        .map(|e| {
            (
                e.kind,
                e.kv.key.clone(),
                e.kv.mod_revision,
                e.prev_kv.as_ref().map(|p| p.value.clone()),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (
                EventKind::Delete,
                key(3),
                from,
                Some(Bytes::from_static(&[3]))
            ),
            (
                EventKind::Delete,
                key(1),
                from + 1,
                Some(Bytes::from_static(&[1]))
            ),
            (
                EventKind::Delete,
                key(2),
                from + 1,
                Some(Bytes::from_static(&[2]))
            ),
        ]
    );
}

// Compaction drops what no read at or after it needs: at the current revision, everything
// but that revision's own changes (which a watch from it replays).
#[test]
fn compaction_frees_history() {
    let mut r = Replica::new(settings());
    for i in 0..100u8 {
        r.ok(Op::Put(put(i % 10, i, 0)));
    }
    assert_eq!(r.sm.kv().history().len(), 100);
    let current = r.sm.revision();
    // Halfway: the 51 changes from the compaction point on.
    r.ok(Op::Compact {
        revision: current - 50,
    });
    assert_eq!(r.sm.kv().history().len(), 51);
    r.ok(Op::Compact { revision: current });
    assert_eq!(r.sm.kv().history().len(), 1);
    assert_eq!(r.sm.compacted_revision(), current);
    assert_eq!(
        r.untracked(Op::Compact { revision: current }).result,
        Err(OpError::Compacted)
    );
    assert_eq!(
        r.untracked(Op::Compact {
            revision: current + 1
        })
        .result,
        Err(OpError::FutureRevision)
    );
    // A key the head alone held at the compaction reads at the compacted revision as it
    // was, after it is written again.
    r.ok(Op::Put(put(0, 200, 0)));
    let at = |sm: &StateMachine, revision| {
        sm.range(&RangeRequest {
            revision,
            ..get_req(KeyRange::single(key(0)))
        })
        .map(|(_, resp)| resp.kvs[0].value.clone())
    };
    assert_eq!(at(&r.sm, current), Ok(Bytes::from_static(&[90])));
    assert_eq!(at(&r.sm, current + 1), Ok(Bytes::from_static(&[200])));
}

// A read stops after the revision at which its byte budget is spent, so a watcher behind
// on large values is served in bounded pieces.
#[test]
fn an_event_read_stops_at_its_byte_budget() {
    let mut r = Replica::new(settings());
    for n in 0..4u8 {
        r.ok(Op::Put(PutRequest {
            value: Bytes::from(vec![n; 1000]),
            ..put(n, 0, 0)
        }));
    }
    let limit = ReadLimit {
        events: 100,
        bytes: 1500,
    };
    let first =
        r.sm.events(&KeyRange::prefix("k"), 1, false, limit)
            .expect("retained");
    assert_eq!(first.events.len(), 2);
    assert_eq!(first.next, 4);
    let rest =
        r.sm.events(&KeyRange::prefix("k"), first.next, false, limit)
            .expect("retained");
    assert_eq!(rest.events.len(), 2);
    assert_eq!(rest.next, r.sm.revision() + 1);
}
