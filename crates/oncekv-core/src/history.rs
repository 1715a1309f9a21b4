//! MVCC history: every change made to a key since the last compaction, so that a read at
//! an older revision and a watch from one can be answered.
//!
//! The current key space stays in [`KvStore`](crate::kv::KvStore)'s map (the head), which
//! every current read and every put uses. History is a second, append-only record of each
//! change in the order applied, each with the key's value before and after it:
//!
//! - a watch replays the record from a revision (changes are in revision order), each
//!   event's previous value at hand;
//! - a read at revision `r` is the head with the changes after `r` undone: a key changed
//!   since `r` had, at `r`, the value from before its first change after `r`.
//!
//! A write appends one record and builds no index: the record is what the apply path
//! pays for history, and a read at an older revision pays for the changes since then.
//!
//! # What compaction keeps
//!
//! `compact(c)` drops every change below `c`. What a read at `c` or later needs is the
//! head and the changes after `c`, each carrying the value it replaced; a watch from `c`
//! needs the changes from `c` on. Compacting at the current revision therefore leaves only
//! that revision's own changes, and frees the rest.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use serde::ser::SerializeSeq;
use serde::{Deserialize, Serialize, Serializer};

use crate::command::{KeyRange, KeyValue, OpError, in_range};
use crate::value::Value;

/// One change to one key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    pub revision: i64,
    pub key: Bytes,
    /// The key's value from this revision on; `None`: deleted at this revision.
    pub value: Option<Value>,
    /// The key's value before this change; `None`: it did not exist.
    pub prev: Option<Value>,
}

/// Whether a watch event is a put or a delete (etcd's `mvccpb.Event.EventType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

/// A change as a watcher sees it (etcd's `mvccpb.Event`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    /// Put: the key-value as written. Delete: the key, with `mod_revision` the delete's
    /// revision and every other field zero (as etcd sends it).
    pub kv: KeyValue,
    /// The key-value before the event, when asked for.
    pub prev_kv: Option<KeyValue>,
}

/// How much one [`History::events`] read may gather: it stops after the revision at
/// which either is reached (a revision is never split, so it may exceed both by that
/// revision's events).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadLimit {
    pub events: usize,
    /// Keys and values (previous values included), in bytes.
    pub bytes: usize,
}

impl ReadLimit {
    /// No limit.
    pub const ALL: ReadLimit = ReadLimit {
        events: usize::MAX,
        bytes: usize::MAX,
    };

    /// At most about `events` events, whatever their size.
    pub fn events(events: usize) -> ReadLimit {
        ReadLimit {
            events,
            bytes: usize::MAX,
        }
    }
}

/// What [`History::events`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventBatch {
    pub events: Vec<Event>,
    /// The first revision not yet scanned: the next call's `from`.
    pub next: i64,
    /// The store's revision when read.
    pub revision: i64,
}

/// Changes per chunk of the record. A chunk is about 170 KiB (a change is about 170
/// bytes), small enough that a nearly empty history costs little, large enough that
/// the chunk index stays short.
const CHUNK: usize = 1024;

/// The change record since the compacted revision.
///
/// The record is kept in chunks of at most [`CHUNK`] changes rather than one vector:
/// recording then never moves what is already recorded (a single vector doubling copies
/// the whole record, into fresh memory, each time it grows: a pause in apply as long as
/// the history is big, on every member at the same entry), and compaction frees whole
/// chunks instead of moving what it keeps. Chunks are shared between copies (a
/// snapshot copies the state under the lock apply waits for): a copy costs a pointer
/// per chunk, and only a shared chunk that changes afterwards (the last one, as it
/// fills; the first ones, at compaction) is copied then. Invariant: no chunk is empty.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// Every change at revision `>= compacted`, in the order applied, so in revision
    /// order (non-decreasing).
    chunks: VecDeque<Arc<Vec<Change>>>,
    /// How many changes the chunks hold.
    len: usize,
    /// Reads below this revision, and watches from below it, are refused (0: never
    /// compacted).
    compacted: i64,
}

/// Two histories are equal when they hold the same changes, however they are chunked.
impl PartialEq for History {
    fn eq(&self, other: &History) -> bool {
        self.compacted == other.compacted && self.changes() == other.changes()
    }
}

impl Eq for History {}

/// The record of a [`History`], in the order applied: iterated, compared, or encoded as a
/// sequence (as a `Vec<Change>` encodes, which is what a snapshot holds).
#[derive(Clone, Copy)]
pub struct Changes<'a> {
    chunks: &'a VecDeque<Arc<Vec<Change>>>,
    len: usize,
}

/// One chunk's changes (a function, so that the iterator's type can be named).
fn chunk_iter(chunk: &Arc<Vec<Change>>) -> std::slice::Iter<'_, Change> {
    chunk.iter()
}

/// The record of an empty history.
static NO_CHUNKS: VecDeque<Arc<Vec<Change>>> = VecDeque::new();

impl<'a> Changes<'a> {
    /// No changes.
    pub fn none() -> Changes<'static> {
        Changes {
            chunks: &NO_CHUNKS,
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn first(&self) -> Option<&'a Change> {
        self.chunks.front().and_then(|c| c.first())
    }

    pub fn last(&self) -> Option<&'a Change> {
        self.chunks.back().and_then(|c| c.last())
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &'a Change> + Clone + 'a {
        self.into_iter()
    }

    /// The changes from the first for which `before` is false on (`before` must hold for
    /// a prefix of the record and for nothing after it, as with `slice::partition_point`).
    fn after(&self, before: impl Fn(&Change) -> bool) -> impl Iterator<Item = &'a Change> + 'a {
        let chunk = self
            .chunks
            .partition_point(|c| c.last().is_some_and(&before));
        let first = self.chunks.get(chunk).map_or(&[][..], |c| {
            let at = c.partition_point(&before);
            &c[at..]
        });
        let rest = self.chunks.range((chunk + 1).min(self.chunks.len())..);
        first.iter().chain(rest.flat_map(chunk_iter))
    }
}

impl<'a> IntoIterator for Changes<'a> {
    type Item = &'a Change;
    type IntoIter = std::iter::FlatMap<
        std::collections::vec_deque::Iter<'a, Arc<Vec<Change>>>,
        std::slice::Iter<'a, Change>,
        fn(&'a Arc<Vec<Change>>) -> std::slice::Iter<'a, Change>,
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.chunks.iter().flat_map(chunk_iter)
    }
}

impl PartialEq for Changes<'_> {
    fn eq(&self, other: &Changes<'_>) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

impl std::fmt::Debug for Changes<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Serialize for Changes<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.len))?;
        for change in self.iter() {
            seq.serialize_element(change)?;
        }
        seq.end()
    }
}

impl History {
    /// Rebuilds a history from its record (restore from a snapshot).
    pub fn from_parts(compacted: i64, changes: Vec<Change>) -> History {
        let mut history = History {
            compacted,
            ..History::default()
        };
        for change in changes {
            history.push(change);
        }
        history
    }

    /// The compacted revision (0: never compacted).
    pub fn compacted(&self) -> i64 {
        self.compacted
    }

    /// The record, in the order applied.
    pub fn changes(&self) -> Changes<'_> {
        Changes {
            chunks: &self.chunks,
            len: self.len,
        }
    }

    /// How many changes are recorded.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The revision of the last recorded change (0: none).
    pub fn last_revision(&self) -> i64 {
        self.changes().last().map_or(0, |c| c.revision)
    }

    /// Appends `change`, which must not be older than the last one.
    pub(crate) fn push(&mut self, change: Change) {
        match self.chunks.back_mut() {
            Some(chunk) if chunk.len() < CHUNK => Arc::make_mut(chunk).push(change),
            // The first chunk grows as a vector does (a small history stays small); the
            // ones after it are allocated whole.
            None => self.chunks.push_back(Arc::new(vec![change])),
            Some(_) => {
                let mut chunk = Vec::with_capacity(CHUNK);
                chunk.push(change);
                self.chunks.push_back(Arc::new(chunk));
            }
        }
        self.len += 1;
    }

    /// Records a change of `key` from `prev` to `value`. Changes MUST be recorded in
    /// revision order.
    #[inline]
    pub fn record(
        &mut self,
        revision: i64,
        key: &Bytes,
        value: Option<Value>,
        prev: Option<Value>,
    ) {
        debug_assert!(
            revision >= self.last_revision(),
            "history recorded out of order"
        );
        self.push(Change {
            revision,
            key: key.clone(),
            value,
            prev,
        });
    }

    /// What undoing the changes after `revision` does to the keys in `range`: each key
    /// changed since then, with the value it had at `revision` (`None`: it did not exist).
    /// Every other key in `range` had at `revision` the value the head holds now.
    pub fn undo_after<'a>(
        &'a self,
        range: &KeyRange,
        revision: i64,
    ) -> BTreeMap<&'a Bytes, Option<&'a Value>> {
        let mut undone = BTreeMap::new();
        for change in self.changes().after(|c| c.revision <= revision) {
            if in_range(range, &change.key) {
                // The first change after `revision` replaced the value it had then.
                undone.entry(&change.key).or_insert(change.prev.as_ref());
            }
        }
        undone
    }

    /// Changes at revisions `>= from` to keys in `range`, as watch events, in revision
    /// order (within a revision, in the order they were made). Stops after the revision at
    /// which `limit` is reached, never inside one, so a watcher resuming from `next` sees
    /// every revision exactly once. `revision` is the store's.
    pub fn events(
        &self,
        range: &KeyRange,
        from: i64,
        prev_kv: bool,
        limit: ReadLimit,
        revision: i64,
    ) -> Result<EventBatch, OpError> {
        if from < self.compacted {
            return Err(OpError::Compacted);
        }
        let mut events: Vec<Event> = Vec::new();
        let mut bytes = 0usize;
        let mut next = from.max(revision + 1);
        for change in self.changes().after(|c| c.revision < from) {
            if (events.len() >= limit.events.max(1) || bytes >= limit.bytes)
                && events
                    .last()
                    .is_some_and(|e| e.kv.mod_revision != change.revision)
            {
                next = change.revision;
                break;
            }
            if !in_range(range, &change.key) {
                continue;
            }
            let (kind, kv) = match &change.value {
                Some(v) => (EventKind::Put, v.to_key_value(&change.key)),
                None => (
                    EventKind::Delete,
                    KeyValue {
                        key: change.key.clone(),
                        mod_revision: change.revision,
                        ..KeyValue::default()
                    },
                ),
            };
            let prev_kv = if prev_kv {
                change.prev.as_ref().map(|v| v.to_key_value(&change.key))
            } else {
                None
            };
            bytes += kv.key.len() + kv.value.len() + prev_kv.as_ref().map_or(0, |p| p.value.len());
            events.push(Event { kind, kv, prev_kv });
        }
        Ok(EventBatch {
            events,
            next,
            revision,
        })
    }

    /// Drops every change below `revision` (see the module doc); the caller has checked
    /// that `revision` is above the compacted one and at most the store's.
    ///
    /// The changes at `revision` itself lose their previous values: those are values from
    /// before `revision`, compacted like the rest, and no read needs them (a read at
    /// `revision` or later never undoes a change at `revision`). A watch event at
    /// `revision` then comes without `prev_kv`, as etcd's does once the revision before it
    /// is compacted. This is what lets deleting keys, then compacting at the deletion's
    /// revision, give their space back.
    pub fn compact(&mut self, revision: i64) {
        let below = |c: &Change| c.revision < revision;
        // Whole chunks below `revision` are freed; of the chunk it falls in, what is below
        // it is dropped (a move of at most one chunk).
        while self
            .chunks
            .front()
            .is_some_and(|c| c.last().is_some_and(below))
        {
            if let Some(chunk) = self.chunks.pop_front() {
                self.len -= chunk.len();
            }
        }
        if let Some(chunk) = self.chunks.front_mut() {
            let cut = chunk.partition_point(below);
            if cut > 0 {
                Arc::make_mut(chunk).drain(..cut);
                self.len -= cut;
            }
        }
        for chunk in self.chunks.iter_mut() {
            if chunk.first().is_none_or(|c| c.revision != revision) {
                break;
            }
            let chunk = Arc::make_mut(chunk);
            for change in chunk.iter_mut().take_while(|c| c.revision == revision) {
                change.prev = None;
            }
            if chunk.last().is_some_and(|c| c.revision != revision) {
                break;
            }
        }
        self.compacted = revision;
    }

    /// Checks the record against the head (the current key space, at store revision
    /// `store_revision`), given as a lookup (`get`) and every key with its value (`all`).
    /// `Err` names the first broken invariant.
    pub fn validate<'a>(
        &self,
        get: impl Fn(&[u8]) -> Option<&'a Value>,
        all: impl Iterator<Item = (&'a Bytes, &'a Value)>,
        store_revision: i64,
    ) -> Result<(), String> {
        if self.compacted > store_revision {
            return Err(format!(
                "compacted revision {} is past the store's {store_revision}",
                self.compacted
            ));
        }
        if self.chunks.iter().any(|c| c.is_empty()) {
            return Err("history holds an empty chunk".into());
        }
        if self.chunks.iter().map(|c| c.len()).sum::<usize>() != self.len {
            return Err("history's length is not its chunks'".into());
        }
        if self
            .changes()
            .first()
            .is_some_and(|c| c.revision < self.compacted)
        {
            return Err("history holds a change below the compacted revision".into());
        }
        if self.last_revision() > store_revision {
            return Err(format!(
                "history holds revision {} past the store's {store_revision}",
                self.last_revision()
            ));
        }
        // Each change follows the key's previous one; the last is the head's value.
        let mut last: BTreeMap<&Bytes, &Change> = BTreeMap::new();
        for change in self.changes() {
            if let Some(before) = last.insert(&change.key, change) {
                if before.revision > change.revision {
                    return Err(format!(
                        "history out of order: revision {} before {}",
                        before.revision, change.revision
                    ));
                }
                if before.value != change.prev {
                    return Err(format!(
                        "key {:?}: the change at {} does not follow the one at {}",
                        change.key, change.revision, before.revision
                    ));
                }
            }
        }
        for (key, change) in &last {
            if change.value.as_ref() != get(key) {
                return Err(format!("key {key:?}: head and history disagree"));
            }
        }
        // Every value written since the compaction is recorded.
        for (key, value) in all {
            if value.mod_revision >= self.compacted && !last.contains_key(key) {
                return Err(format!(
                    "key {key:?}: written at {} and not in history",
                    value.mod_revision
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn value(revision: i64, n: u64) -> Value {
        Value {
            create_revision: 1,
            mod_revision: revision,
            version: 1,
            value: Bytes::from(n.to_string()),
            lease: 0,
        }
    }

    /// A history of a few keys over more than two chunks (several changes at some
    /// revisions), with the same changes as a plain vector beside it.
    fn recorded() -> (History, Vec<Change>) {
        let mut history = History::default();
        let mut plain: Vec<Change> = Vec::new();
        let mut last: BTreeMap<Bytes, Value> = BTreeMap::new();
        let mut revision = 1;
        for n in 0..(2 * CHUNK as u64 + 37) {
            // Two changes at every third revision.
            if n % 3 != 1 {
                revision += 1;
            }
            let key = Bytes::from(format!("k{}", n % 7));
            let prev = last.get(&key).cloned();
            let now = (n % 11 != 0).then(|| value(revision, n));
            match &now {
                Some(v) => last.insert(key.clone(), v.clone()),
                None => last.remove(&key),
            };
            history.record(revision, &key, now.clone(), prev.clone());
            plain.push(Change {
                revision,
                key,
                value: now,
                prev,
            });
        }
        (history, plain)
    }

    fn all() -> KeyRange {
        KeyRange {
            key: Bytes::from_static(b"k"),
            range_end: Bytes::from_static(b"l"),
        }
    }

    #[test]
    fn a_chunked_record_reads_as_one_vector_would() {
        let (history, plain) = recorded();
        assert!(history.chunks.len() >= 3, "the record spans chunks");
        assert_eq!(history.len(), plain.len());
        assert!(history.changes().iter().eq(plain.iter()));
        assert_eq!(history.last_revision(), plain.last().unwrap().revision);
        // Encoded as the vector is: snapshots written before and after read the same.
        assert_eq!(
            postcard::to_stdvec(&history.changes()).unwrap(),
            postcard::to_stdvec(&plain).unwrap()
        );
        let last = history.last_revision();
        for from in [
            1,
            2,
            300,
            CHUNK as i64 / 2,
            CHUNK as i64 - 1,
            last - 1,
            last,
        ] {
            let start = plain.partition_point(|c| c.revision < from);
            let read = history
                .events(&all(), from, true, ReadLimit::ALL, last)
                .unwrap();
            assert_eq!(read.events.len(), plain.len() - start, "from {from}");
            assert_eq!(read.events[0].kv.mod_revision, plain[start].revision);
            let undone = history.undo_after(&all(), from);
            let mut expected: BTreeMap<&Bytes, Option<&Value>> = BTreeMap::new();
            for c in plain.iter().filter(|c| c.revision > from) {
                expected.entry(&c.key).or_insert(c.prev.as_ref());
            }
            assert_eq!(undone, expected, "undo after {from}");
        }
    }

    #[test]
    fn a_copy_shares_its_chunks_and_neither_side_sees_the_others_changes() {
        let (mut history, plain) = recorded();
        let copy = history.clone();
        assert!(
            history
                .chunks
                .iter()
                .zip(&copy.chunks)
                .all(|(a, b)| Arc::ptr_eq(a, b)),
            "a copy of pointers, not of changes"
        );
        let next = history.last_revision() + 1;
        history.record(next, &Bytes::from_static(b"k1"), Some(value(next, 1)), None);
        history.compact(CHUNK as i64 / 2);
        assert!(
            copy.changes().iter().eq(plain.iter()),
            "the copy is as it was"
        );
        assert_eq!(copy.compacted(), 0);
        assert_eq!(history.last_revision(), next);
        assert!(history.changes().first().unwrap().revision >= CHUNK as i64 / 2);
        // Full chunks the change did not touch are still shared.
        assert!(
            history
                .chunks
                .iter()
                .any(|a| copy.chunks.iter().any(|b| Arc::ptr_eq(a, b)))
        );
    }

    #[test]
    fn compaction_frees_whole_chunks_and_keeps_the_rest_in_order() {
        for at in [2, CHUNK as i64 / 3, CHUNK as i64 / 3 + 1, CHUNK as i64 + 5] {
            let (mut history, plain) = recorded();
            let chunks = history.chunks.len();
            history.compact(at);
            let mut kept: Vec<Change> = plain.into_iter().filter(|c| c.revision >= at).collect();
            for c in kept.iter_mut().take_while(|c| c.revision == at) {
                c.prev = None;
            }
            assert!(
                history.changes().iter().eq(kept.iter()),
                "compacted at {at}"
            );
            assert_eq!(history.len(), kept.len());
            assert!(history.chunks.iter().all(|c| !c.is_empty()));
            if at > CHUNK as i64 {
                assert!(history.chunks.len() < chunks, "a whole chunk was freed");
            }
            // Chunked differently (rebuilt from the plain record), equal all the same.
            assert_eq!(history, History::from_parts(at, kept.clone()));
            // And recording goes on after it.
            let next = history.last_revision() + 1;
            history.record(next, &Bytes::from_static(b"k0"), Some(value(next, 0)), None);
            assert_eq!(history.len(), kept.len() + 1);
        }
    }
}
