#![allow(clippy::unwrap_used)]

use super::*;
use futures::FutureExt;
use futures::executor::block_on;
use proptest::prelude::*;
use std::time::Duration;

type List = WaitingList<u64, String, &'static str>;

fn at(base: Instant, secs: u64) -> Option<Instant> {
    Some(base + Duration::from_secs(secs))
}

/// Polls once without blocking: `None` while the waiter is still pending.
fn peek<V, E>(w: &mut Waiter<V, E>) -> Option<Outcome<V, E>> {
    w.now_or_never()
}

#[test]
fn complete_wakes_every_waiter_on_the_key() {
    // A client retry joins the original's waiter; both must get the one response.
    let list = List::new();
    let a = list.register(5, None);
    let b = list.register(5, None);
    let mut other = list.register(6, None);
    assert_eq!(list.complete(&5, "ok".into()), 2);
    assert_eq!(block_on(a), Ok("ok".to_string()));
    assert_eq!(block_on(b), Ok("ok".to_string()));
    assert_eq!(peek(&mut other), None);
    assert_eq!(list.len(), 1);
}

#[test]
fn complete_up_to_wakes_keys_at_or_below_the_index_only() {
    // Reads wait for "applied index >= i"; later indexes must keep waiting.
    let list = List::new();
    let w3 = list.register(3, None);
    let w5a = list.register(5, None);
    let w5b = list.register(5, None);
    let mut w6 = list.register(6, None);
    let mut calls = Vec::new();
    let woken = list.complete_up_to(&5, |k| {
        calls.push(*k);
        format!("applied {k}")
    });
    assert_eq!(woken, 3);
    assert_eq!(calls, vec![3, 5], "f runs once per key, in order");
    assert_eq!(block_on(w3), Ok("applied 3".to_string()));
    assert_eq!(block_on(w5a), Ok("applied 5".to_string()));
    assert_eq!(block_on(w5b), Ok("applied 5".to_string()));
    assert_eq!(peek(&mut w6), None);
    assert!(list.contains_key(&6) && !list.contains_key(&5));
}

#[test]
fn fail_all_fails_every_waiter_with_the_error() {
    // On leadership loss no waiter may hang: all get NotLeader, quorum ones too.
    let list = List::new();
    let base = Instant::now();
    let a = list.register(1, at(base, 10));
    let b = list.register(2, None);
    let q = list.register_quorum(3, 3, 2, None);
    assert_eq!(list.fail_all("not leader"), 3);
    for w in [a, b, q] {
        assert_eq!(block_on(w), Err(WaitError::Failed("not leader")));
    }
    assert!(list.is_empty());
    assert_eq!(list.next_deadline(), None);
    let again = list.register(1, None);
    assert_eq!(list.complete(&1, "x".into()), 1, "list stays usable");
    assert_eq!(block_on(again), Ok("x".to_string()));
}

#[test]
fn fail_by_key_leaves_other_keys_waiting() {
    // A proposal rejected for one request must not fail unrelated requests.
    let list = List::new();
    let a = list.register(1, None);
    let mut b = list.register(2, None);
    assert_eq!(list.fail(&1, "rejected"), 1);
    assert_eq!(block_on(a), Err(WaitError::Failed("rejected")));
    assert_eq!(peek(&mut b), None);
}

#[test]
fn expire_times_out_due_waiters_at_the_boundary_and_keeps_later_ones() {
    // Deadline == now expires, so sleeping until next_deadline() always makes progress.
    let list = List::new();
    let base = Instant::now();
    let early = list.register(1, at(base, 1));
    let boundary = list.register(2, at(base, 2));
    let mut later = list.register(3, at(base, 3));
    let mut never = list.register(4, None);
    assert_eq!(list.next_deadline(), at(base, 1));
    assert_eq!(list.expire(base), 0);
    assert_eq!(list.expire(base + Duration::from_secs(2)), 2);
    assert_eq!(block_on(early), Err(WaitError::Timeout));
    assert_eq!(block_on(boundary), Err(WaitError::Timeout));
    assert_eq!(peek(&mut later), None);
    assert_eq!(list.next_deadline(), at(base, 3));
    assert_eq!(list.expire(base + Duration::from_secs(100)), 1);
    assert_eq!(peek(&mut later), Some(Err(WaitError::Timeout)));
    assert_eq!(peek(&mut never), None, "no deadline, no expiry");
    assert_eq!(list.next_deadline(), None);
}

#[test]
fn quorum_completes_when_k_answers_agree() {
    // Health fan-out: 2 of 3 nodes agreeing is an answer; the third may never reply.
    let list = List::new();
    let mut q = list.register_quorum(9, 3, 2, None);
    assert_eq!(list.answer(&9, 1, "a".into()), 0);
    assert_eq!(list.answer(&9, 2, "b".into()), 0);
    assert_eq!(peek(&mut q), None);
    assert_eq!(list.answer(&9, 3, "a".into()), 1);
    assert_eq!(peek(&mut q), Some(Ok("a".to_string())));
    assert!(list.is_empty());
}

#[test]
fn quorum_fails_as_soon_as_agreement_is_impossible() {
    // Waiting for the last reply would only add latency once the outcome is certain.
    let list = List::new();
    let mut q = list.register_quorum(9, 5, 3, None);
    for (voter, v) in [(1, "a"), (2, "b"), (3, "c")] {
        assert_eq!(list.answer(&9, voter, v.into()), 0);
    }
    assert_eq!(peek(&mut q), None, "2 unanswered + 1 could still make 3");
    assert_eq!(list.answer(&9, 4, "d".into()), 1);
    assert_eq!(peek(&mut q), Some(Err(WaitError::QuorumUnreachable)));
    assert!(list.is_empty(), "voter 5 never answered and need not");
}

#[test]
fn quorum_larger_than_voters_fails_immediately() {
    // k > n can never be met; the caller must learn that without waiting.
    let list = List::new();
    let q = list.register_quorum(1, 2, 3, None);
    assert!(list.is_empty());
    assert_eq!(block_on(q), Err(WaitError::QuorumUnreachable));
}

#[test]
fn duplicate_voter_answer_is_ignored() {
    // A re-sent reply must count once, whether it repeats or contradicts the first.
    let list = List::new();
    let mut q = list.register_quorum(1, 2, 2, None);
    assert_eq!(list.answer(&1, 7, "x".into()), 0);
    assert_eq!(list.answer(&1, 7, "x".into()), 0);
    assert_eq!(list.answer(&1, 7, "y".into()), 0);
    assert_eq!(peek(&mut q), None);
    assert_eq!(list.answer(&1, 8, "x".into()), 1);
    assert_eq!(peek(&mut q), Some(Ok("x".to_string())));
}

#[test]
fn answer_leaves_plain_waiters_alone() {
    // Only quorum waiters tally answers; a plain waiter waits for complete().
    let list = List::new();
    let mut plain = list.register(1, None);
    assert_eq!(list.answer(&1, 1, "x".into()), 0);
    assert_eq!(peek(&mut plain), None);
}

#[test]
fn dropped_waiter_leaves_nothing_behind() {
    // Abandoned requests (client gone) must not leak entries or deadlines.
    let list = List::new();
    let base = Instant::now();
    let plain = list.register(1, None);
    let shared = list.register(1, None);
    let timed = list.register(2, at(base, 5));
    let quorum = list.register_quorum(3, 3, 2, at(base, 7));
    assert_eq!(list.len(), 4);
    drop(plain);
    assert_eq!(list.len(), 3);
    assert!(list.contains_key(&1), "the other waiter on key 1 stays");
    drop((shared, timed));
    assert_eq!(list.next_deadline(), at(base, 7));
    drop(quorum);
    assert_eq!(list.len(), 0);
    assert_eq!(list.next_deadline(), None);
    assert!(!list.contains_key(&1) && !list.contains_key(&2) && !list.contains_key(&3));
    assert_eq!(list.complete_up_to(&u64::MAX, |_| String::new()), 0);
}

#[test]
fn completing_a_key_nobody_waits_on_is_harmless() {
    // Late or duplicate notifications (a retry already answered) are routine.
    let list = List::new();
    let mut w = list.register(2, None);
    assert_eq!(list.complete(&1, "x".into()), 0);
    assert_eq!(list.fail(&1, "e"), 0);
    assert_eq!(list.answer(&1, 1, "x".into()), 0);
    assert_eq!(list.complete_up_to(&1, |_| "x".into()), 0);
    assert_eq!(peek(&mut w), None);
    assert_eq!(list.len(), 1);
}

#[test]
fn dropping_the_list_closes_waiters() {
    // A server shutting down must not leave callers hanging forever.
    let list = List::new();
    let w = list.register(1, None);
    let handle = list.clone();
    drop(list);
    let mut w = w;
    assert_eq!(peek(&mut w), None, "a handle remains");
    drop(handle);
    assert_eq!(block_on(&mut w), Err(WaitError::Closed));
    assert_eq!(
        block_on(w),
        Err(WaitError::Closed),
        "polling again does not panic"
    );
}

#[test]
fn waiter_resolves_on_another_thread() {
    // The server completes from the apply task while callers await elsewhere.
    fn assert_send<T: Send + Sync>(_: &T) {}
    let list = List::new();
    let w = list.register(1, None);
    assert_send(&w);
    assert_send(&list);
    let remote = list.clone();
    let t = std::thread::spawn(move || remote.complete(&1, "done".into()));
    assert_eq!(block_on(w), Ok("done".to_string()));
    assert_eq!(t.join().unwrap(), 1);
}

#[test]
fn list_survives_a_panic_while_locked() {
    // A poisoned lock must not turn one panic into a dead server.
    #[derive(Clone, Debug)]
    struct Touchy(bool);
    impl PartialEq for Touchy {
        fn eq(&self, other: &Self) -> bool {
            assert!(!(self.0 || other.0), "boom");
            true
        }
    }
    impl Eq for Touchy {}
    let list: WaitingList<u64, Touchy, ()> = WaitingList::new();
    let mut q = list.register_quorum(1, 3, 2, None);
    list.answer(&1, 1, Touchy(false));
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        list.answer(&1, 2, Touchy(true));
    }));
    assert!(panicked.is_err());
    assert_eq!(list.len(), 1);
    assert_eq!(list.complete(&1, Touchy(false)), 1);
    assert!(matches!(peek(&mut q), Some(Ok(Touchy(false)))));
}

#[derive(Debug, Clone)]
enum Op {
    Register { key: u64, deadline: Option<u64> },
    Complete { key: u64 },
    CompleteUpTo { key: u64 },
    Drop { pick: usize },
    Expire { now: u64 },
    FailAll,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..6u64, proptest::option::of(0..10u64))
            .prop_map(|(key, deadline)| Op::Register { key, deadline }),
        1 => (0..6u64).prop_map(|key| Op::Complete { key }),
        1 => (0..6u64).prop_map(|key| Op::CompleteUpTo { key }),
        2 => any::<usize>().prop_map(|pick| Op::Drop { pick }),
        1 => (0..12u64).prop_map(|now| Op::Expire { now }),
        1 => Just(Op::FailAll),
    ]
}

type Live = (u64, Option<u64>, Waiter<String, &'static str>);
type Settled = (Waiter<String, &'static str>, Outcome<String, &'static str>);

/// Moves the model's waiters matching `pred` out of `live`, paired with their expected outcome.
fn settle(
    live: &mut Vec<Live>,
    pred: impl Fn(u64, Option<u64>) -> bool,
    outcome: impl Fn(u64) -> Outcome<String, &'static str>,
) -> Vec<Settled> {
    let (hit, keep): (Vec<Live>, Vec<Live>) = std::mem::take(live)
        .into_iter()
        .partition(|(k, d, _)| pred(*k, *d));
    *live = keep;
    hit.into_iter().map(|(k, _, w)| (w, outcome(k))).collect()
}

proptest! {
    // Model check: every op settles exactly the waiters a plain Vec model predicts,
    // len() and next_deadline() agree with the model, and drops leave nothing behind.
    #[test]
    fn random_operations_match_a_simple_model(ops in proptest::collection::vec(op(), 1..60)) {
        let list = List::new();
        let base = Instant::now();
        let value = |k: u64| format!("v{k}");
        let mut live: Vec<Live> = Vec::new();
        for op in ops {
            let (count, settled) = match op {
                Op::Register { key, deadline } => {
                    let w = list.register(key, deadline.and_then(|d| at(base, d)));
                    live.push((key, deadline, w));
                    (0, Vec::new())
                }
                Op::Complete { key } => (
                    list.complete(&key, value(key)),
                    settle(&mut live, |k, _| k == key, |k| Ok(value(k))),
                ),
                Op::CompleteUpTo { key } => (
                    list.complete_up_to(&key, |k| value(*k)),
                    settle(&mut live, |k, _| k <= key, |k| Ok(value(k))),
                ),
                Op::Drop { pick } => {
                    if !live.is_empty() {
                        drop(live.remove(pick % live.len()));
                    }
                    (0, Vec::new())
                }
                Op::Expire { now } => (
                    list.expire(base + Duration::from_secs(now)),
                    settle(&mut live, |_, d| d.is_some_and(|d| d <= now), |_| Err(WaitError::Timeout)),
                ),
                Op::FailAll => (
                    list.fail_all("nl"),
                    settle(&mut live, |_, _| true, |_| Err(WaitError::Failed("nl"))),
                ),
            };
            prop_assert_eq!(count, settled.len());
            for (mut w, expected) in settled {
                prop_assert_eq!(peek(&mut w), Some(expected));
            }
            for (_, _, w) in &mut live {
                prop_assert_eq!(peek(w), None);
            }
            prop_assert_eq!(list.len(), live.len());
            let model_deadline = live.iter().filter_map(|(_, d, _)| *d).min();
            prop_assert_eq!(list.next_deadline(), model_deadline.and_then(|d| at(base, d)));
        }
        drop(live);
        prop_assert!(list.is_empty());
    }
}
