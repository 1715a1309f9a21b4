//! Request waiting list: park a request until the cluster says it is done.
//!
//! A [`WaitingList`] maps keys (a log index, a `(client_id, seq)` pair, a fan-out request
//! id) to [`Waiter`] futures. Whoever learns the outcome settles the key:
//!
//! * [`complete`](WaitingList::complete) wakes every waiter of one key with a value;
//! * [`complete_up_to`](WaitingList::complete_up_to) wakes every key `<=` an index
//!   ("applied index reached");
//! * [`fail`](WaitingList::fail) / [`fail_all`](WaitingList::fail_all) hand waiters an error
//!   (leadership lost: the server passes `NotLeader`);
//! * [`expire`](WaitingList::expire) times out waiters whose deadline has come;
//! * [`answer`](WaitingList::answer) feeds one voter's answer to quorum waiters
//!   ([`register_quorum`](WaitingList::register_quorum)): they complete once `k` of `n`
//!   answers agree and fail as soon as that can no longer happen.
//!
//! The list never reads a clock and spawns nothing: time comes in through `expire(now)`, and
//! [`next_deadline`](WaitingList::next_deadline) says when the caller should call it next.
//! Dropping a [`Waiter`] removes its entry at once, so an abandoned request leaves nothing
//! behind.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use futures::executor::block_on;
//! use oncekv_core::waiting_list::{WaitError, WaitingList};
//!
//! let list: WaitingList<u64, &'static str, String> = WaitingList::new();
//! let now = Instant::now();
//!
//! // A write proposed at log index 7, and a client retry that joins it.
//! let original = list.register(7, Some(now + Duration::from_secs(5)));
//! let retry = list.register(7, Some(now + Duration::from_secs(5)));
//! // A read waiting for index 9, which will never be applied in time.
//! let read = list.register(9, Some(now + Duration::from_secs(1)));
//! assert_eq!(list.len(), 3);
//!
//! // The state machine applied up to index 8.
//! assert_eq!(list.complete_up_to(&8, |_index| "applied"), 2);
//! assert_eq!(block_on(original), Ok("applied"));
//! assert_eq!(block_on(retry), Ok("applied"));
//!
//! // Time passes; the caller drives expiry.
//! assert_eq!(list.next_deadline(), Some(now + Duration::from_secs(1)));
//! assert_eq!(list.expire(now + Duration::from_secs(2)), 1);
//! assert_eq!(block_on(read), Err(WaitError::Timeout));
//! assert!(list.is_empty());
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::sync::oneshot;

/// Why a [`Waiter`] finished without a value.
///
/// `Timeout` and `Closed` say nothing about the request itself: a command whose waiter timed
/// out may still be applied later. Treat its outcome as *unknown*, never as failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WaitError<E> {
    /// The deadline passed before the key was settled. Outcome unknown; retryable.
    #[error("timed out waiting for the request to be settled")]
    Timeout,
    /// The key was failed with this error (for example `NotLeader` on leadership loss).
    #[error("{0}")]
    Failed(E),
    /// A quorum waiter can no longer collect `k` agreeing answers.
    #[error("a quorum of agreeing answers can no longer be reached")]
    QuorumUnreachable,
    /// Every handle of the waiting list was dropped before the key was settled.
    /// Outcome unknown.
    #[error("the waiting list was closed")]
    Closed,
}

type Outcome<V, E> = Result<V, WaitError<E>>;
type Tx<V, E> = oneshot::Sender<Outcome<V, E>>;

/// Lock without ever panicking: a poisoned lock only means another thread panicked while
/// holding it, and every mutation below leaves the indexes consistent or tolerates gaps.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Answers collected by one quorum waiter.
struct Tally<V> {
    n: usize,
    k: usize,
    voters: BTreeSet<u64>,
    /// Distinct answers and how many voters gave each. At most `n` groups.
    groups: Vec<(V, usize)>,
}

enum Verdict<V> {
    Pending,
    Reached(V),
    Unreachable,
}

impl<V: Clone + Eq> Tally<V> {
    fn new(n: usize, k: usize) -> Self {
        Self {
            n,
            k: k.max(1),
            voters: BTreeSet::new(),
            groups: Vec::new(),
        }
    }

    fn verdict(&self) -> Verdict<V> {
        let largest = self.groups.iter().max_by_key(|(_, count)| *count);
        match largest {
            Some((value, count)) if *count >= self.k => return Verdict::Reached(value.clone()),
            _ => {}
        }
        let remaining = self.n.saturating_sub(self.voters.len());
        if remaining + largest.map_or(0, |(_, count)| *count) < self.k {
            Verdict::Unreachable
        } else {
            Verdict::Pending
        }
    }

    fn record(&mut self, voter: u64, value: &V) -> Verdict<V> {
        if self.voters.len() >= self.n || !self.voters.insert(voter) {
            return Verdict::Pending; // a second answer from a voter, or more than n answers
        }
        match self.groups.iter_mut().find(|(v, _)| v == value) {
            Some(group) => group.1 += 1,
            None => self.groups.push((value.clone(), 1)),
        }
        self.verdict()
    }
}

struct Slot<K, V, E> {
    key: K,
    deadline: Option<Instant>,
    tx: Tx<V, E>,
    quorum: Option<Tally<V>>,
}

struct Inner<K, V, E> {
    next_id: u64,
    slots: HashMap<u64, Slot<K, V, E>>,
    by_key: BTreeMap<K, BTreeSet<u64>>,
    deadlines: BTreeSet<(Instant, u64)>,
}

impl<K: Ord, V, E> Inner<K, V, E> {
    /// Removes one waiter from every index.
    fn remove(&mut self, id: u64) -> Option<Slot<K, V, E>> {
        let slot = self.slots.remove(&id)?;
        if let Some(ids) = self.by_key.get_mut(&slot.key) {
            ids.remove(&id);
            if ids.is_empty() {
                self.by_key.remove(&slot.key);
            }
        }
        if let Some(at) = slot.deadline {
            self.deadlines.remove(&(at, id));
        }
        Some(slot)
    }

    /// Removes every waiter of `key`, returning their senders.
    fn take_key(&mut self, key: &K) -> Vec<Tx<V, E>> {
        let ids = self.by_key.remove(key).unwrap_or_default();
        self.take_ids(ids)
    }

    fn take_ids(&mut self, ids: BTreeSet<u64>) -> Vec<Tx<V, E>> {
        let mut senders = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(slot) = self.slots.remove(&id) {
                if let Some(at) = slot.deadline {
                    self.deadlines.remove(&(at, id));
                }
                senders.push(slot.tx);
            }
        }
        senders
    }
}

/// Sends `value` to every sender (clones for all but the last); returns how many received it.
fn deliver<V: Clone, E: Clone>(mut senders: Vec<Tx<V, E>>, value: Outcome<V, E>) -> usize {
    let Some(last) = senders.pop() else { return 0 };
    let woken: usize = senders
        .into_iter()
        .map(|tx| usize::from(tx.send(value.clone()).is_ok()))
        .sum();
    woken + usize::from(last.send(value).is_ok())
}

/// Sends each outcome to its waiter; returns how many were still there to receive it.
fn send_each<V, E>(settled: Vec<(Tx<V, E>, Outcome<V, E>)>) -> usize {
    settled
        .into_iter()
        .map(|(tx, outcome)| usize::from(tx.send(outcome).is_ok()))
        .sum()
}

/// Lets a [`Waiter`] remove itself without knowing the key type.
trait Detach: Send + Sync {
    fn detach(&self, id: u64);
}

impl<K: Ord + Send, V: Send, E: Send> Detach for Mutex<Inner<K, V, E>> {
    fn detach(&self, id: u64) {
        let removed = lock(self).remove(id);
        drop(removed); // outside the lock
    }
}

/// A registered request: resolves to the value its key was completed with, or a
/// [`WaitError`].
///
/// Dropping it before it resolves removes its entry (and deadline) from the list at once.
/// Polling it again after it returned `Ready` yields `Err(WaitError::Closed)`.
#[must_use = "a waiter removes itself from the list as soon as it is dropped"]
pub struct Waiter<V, E> {
    rx: oneshot::Receiver<Outcome<V, E>>,
    id: u64,
    /// `None` once resolved, or when there is nothing to remove.
    list: Option<Weak<dyn Detach>>,
}

impl<V, E> fmt::Debug for Waiter<V, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waiter")
            .field("id", &self.id)
            .field("settled", &self.list.is_none())
            .finish()
    }
}

impl<V, E> Future for Waiter<V, E> {
    type Output = Outcome<V, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.list.is_none() && self.rx.is_terminated() {
            return Poll::Ready(Err(WaitError::Closed));
        }
        let outcome = match Pin::new(&mut self.rx).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Ok(outcome)) => outcome,
            Poll::Ready(Err(_)) => Err(WaitError::Closed),
        };
        self.list = None;
        Poll::Ready(outcome)
    }
}

impl<V, E> Drop for Waiter<V, E> {
    fn drop(&mut self) {
        if let Some(list) = self.list.take().and_then(|weak| weak.upgrade()) {
            list.detach(self.id);
        }
    }
}

/// The request waiting list. Cloning it gives another handle to the same list; waiters see
/// [`WaitError::Closed`] once every handle is dropped.
///
/// All operations take one short lock and are O(log n) per waiter touched. Waiters are
/// woken after the lock is released; only quorum tallies compare and clone answers under it.
/// The `Clone`/`Eq` impls of `V` and `E` MUST NOT call back into the list.
pub struct WaitingList<K, V, E> {
    inner: Arc<Mutex<Inner<K, V, E>>>,
}

impl<K, V, E> Clone for WaitingList<K, V, E> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K, V, E> fmt::Debug for WaitingList<K, V, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = lock(&self.inner);
        f.debug_struct("WaitingList")
            .field("waiters", &inner.slots.len())
            .field("keys", &inner.by_key.len())
            .finish()
    }
}

impl<K, V, E> Default for WaitingList<K, V, E>
where
    K: Ord + Clone + Send + 'static,
    V: Clone + Send + 'static,
    E: Clone + Send + 'static,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<K, V, E> WaitingList<K, V, E>
where
    K: Ord + Clone + Send + 'static,
    V: Clone + Send + 'static,
    E: Clone + Send + 'static,
{
    /// An empty list.
    pub fn new() -> Self {
        let inner = Inner {
            next_id: 0,
            slots: HashMap::new(),
            by_key: BTreeMap::new(),
            deadlines: BTreeSet::new(),
        };
        Self {
            inner: Arc::new(Mutex::new(inner)),
        }
    }

    fn add(&self, key: K, deadline: Option<Instant>, quorum: Option<Tally<V>>) -> Waiter<V, E> {
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut inner = lock(&self.inner);
            let id = inner.next_id;
            inner.next_id += 1;
            inner.by_key.entry(key.clone()).or_default().insert(id);
            if let Some(at) = deadline {
                inner.deadlines.insert((at, id));
            }
            let slot = Slot {
                key,
                deadline,
                tx,
                quorum,
            };
            inner.slots.insert(id, slot);
            id
        };
        let weak: Weak<dyn Detach> = Arc::downgrade(&self.inner) as Weak<Mutex<Inner<K, V, E>>>;
        Waiter {
            rx,
            id,
            list: Some(weak),
        }
    }

    /// Registers a waiter on `key`. Several waiters may share a key; each gets a clone of
    /// the value.
    ///
    /// With `deadline: None` the waiter waits until settled or dropped. A deadline is only
    /// enforced when the caller calls [`expire`](Self::expire): the caller MUST drive expiry
    /// (see [`next_deadline`](Self::next_deadline)) or deadlines mean nothing.
    pub fn register(&self, key: K, deadline: Option<Instant>) -> Waiter<V, E> {
        self.add(key, deadline, None)
    }

    /// Whether anyone waits on `key`. A hint only: the answer may change as soon as the
    /// lock is released, so nothing correct may depend on it.
    pub fn contains_key(&self, key: &K) -> bool {
        lock(&self.inner).by_key.contains_key(key)
    }

    /// Wakes every waiter of `key` (quorum waiters too) with `value`; returns how many were
    /// woken. Completing a key nobody waits on does nothing and returns 0.
    pub fn complete(&self, key: &K, value: V) -> usize {
        let senders = lock(&self.inner).take_key(key);
        deliver(senders, Ok(value))
    }

    /// Wakes every waiter whose key is `<= key`, with the value `f` computes for that key
    /// (`f` is called once per key that has waiters, in key order, outside the lock).
    /// Returns how many waiters were woken.
    pub fn complete_up_to(&self, key: &K, mut f: impl FnMut(&K) -> V) -> usize {
        let mut due = Vec::new();
        {
            let mut inner = lock(&self.inner);
            while let Some(entry) = inner.by_key.first_entry() {
                if entry.key() > key {
                    break;
                }
                let (k, ids) = entry.remove_entry();
                due.push((k, inner.take_ids(ids)));
            }
        }
        due.into_iter()
            .map(|(k, senders)| deliver(senders, Ok(f(&k))))
            .sum()
    }

    /// Fails every waiter of `key` with `WaitError::Failed(err)`; returns how many.
    pub fn fail(&self, key: &K, err: E) -> usize {
        let senders = lock(&self.inner).take_key(key);
        deliver(senders, Err(WaitError::Failed(err)))
    }

    /// Fails every waiter with `WaitError::Failed(err)` and returns how many. The caller MUST
    /// call this when it stops being able to settle keys (leadership lost), or waiters hang
    /// until their deadlines. The list stays usable afterwards.
    pub fn fail_all(&self, err: E) -> usize {
        let senders: Vec<_> = {
            let mut inner = lock(&self.inner);
            inner.by_key.clear();
            inner.deadlines.clear();
            // In registration order, so that who wakes first never depends on hashing.
            let mut slots: Vec<_> = inner.slots.drain().collect();
            slots.sort_unstable_by_key(|(id, _)| *id);
            slots.into_iter().map(|(_, slot)| slot.tx).collect()
        };
        deliver(senders, Err(WaitError::Failed(err)))
    }

    /// Fails every waiter whose deadline is `<= now` with [`WaitError::Timeout`]; returns
    /// how many. The boundary is inclusive so that a caller that sleeps until
    /// [`next_deadline`](Self::next_deadline) and then calls `expire` always makes progress.
    /// Costs O(log n) per expired waiter; unexpired waiters are not visited.
    pub fn expire(&self, now: Instant) -> usize {
        let mut settled = Vec::new();
        {
            let mut inner = lock(&self.inner);
            while let Some(&(at, id)) = inner.deadlines.first() {
                if at > now {
                    break;
                }
                if let Some(slot) = inner.remove(id) {
                    settled.push((slot.tx, Err(WaitError::Timeout)));
                }
            }
        }
        send_each(settled)
    }

    /// The earliest deadline of any live waiter: the caller should call
    /// [`expire`](Self::expire) at (or after) that instant.
    pub fn next_deadline(&self) -> Option<Instant> {
        lock(&self.inner).deadlines.first().map(|&(at, _)| at)
    }

    /// Number of live waiters (registered, not yet settled, not dropped).
    pub fn len(&self) -> usize {
        lock(&self.inner).slots.len()
    }

    /// Whether no waiter is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<K, V, E> WaitingList<K, V, E>
where
    K: Ord + Clone + Send + 'static,
    V: Clone + Eq + Send + 'static,
    E: Clone + Send + 'static,
{
    /// Registers a quorum waiter on `key` expecting `n` answers (see [`answer`](Self::answer)).
    /// It completes with the value as soon as `k` answers are equal, and fails with
    /// [`WaitError::QuorumUnreachable`] as soon as the unanswered voters plus the largest
    /// agreeing group are fewer than `k` — at once if `k > n`. `k == 0` is treated as 1.
    ///
    /// Answers given before this call are not seen: the caller MUST register before sending
    /// the requests whose answers it will feed in.
    pub fn register_quorum(
        &self,
        key: K,
        n: usize,
        k: usize,
        deadline: Option<Instant>,
    ) -> Waiter<V, E> {
        let tally = Tally::new(n, k);
        if let Verdict::Unreachable = tally.verdict() {
            let (tx, rx) = oneshot::channel();
            let _ = tx.send(Err(WaitError::QuorumUnreachable));
            return Waiter {
                rx,
                id: 0,
                list: None,
            };
        }
        self.add(key, deadline, Some(tally))
    }

    /// Records `voter`'s answer on every quorum waiter of `key`; plain waiters are left
    /// alone. A voter's second answer, and answers beyond the first `n`, are ignored.
    /// Returns how many waiters this answer settled (completed or failed).
    pub fn answer(&self, key: &K, voter: u64, value: V) -> usize {
        let mut settled = Vec::new();
        {
            let mut guard = lock(&self.inner);
            let inner = &mut *guard;
            let Some(ids) = inner.by_key.get(key) else {
                return 0;
            };
            let mut verdicts = Vec::new();
            for id in ids {
                if let Some(tally) = inner.slots.get_mut(id).and_then(|s| s.quorum.as_mut()) {
                    match tally.record(voter, &value) {
                        Verdict::Pending => {}
                        Verdict::Reached(v) => verdicts.push((*id, Ok(v))),
                        Verdict::Unreachable => {
                            verdicts.push((*id, Err(WaitError::QuorumUnreachable)))
                        }
                    }
                }
            }
            for (id, outcome) in verdicts {
                if let Some(slot) = inner.remove(id) {
                    settled.push((slot.tx, outcome));
                }
            }
        }
        send_each(settled)
    }
}

#[cfg(test)]
mod tests;
