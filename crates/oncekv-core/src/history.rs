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

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::command::{KeyRange, KeyValue, OpError};
use crate::kv::{Value, in_range};

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

/// The change record since the compacted revision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    /// Every change at revision `>= compacted`, in the order applied, so in revision
    /// order (non-decreasing).
    changes: Vec<Change>,
    /// Reads below this revision, and watches from below it, are refused (0: never
    /// compacted).
    compacted: i64,
}

impl History {
    /// Rebuilds a history from its record (restore from a snapshot).
    pub fn from_parts(compacted: i64, changes: Vec<Change>) -> History {
        History { changes, compacted }
    }

    /// The compacted revision (0: never compacted).
    pub fn compacted(&self) -> i64 {
        self.compacted
    }

    /// The record, in the order applied.
    pub fn changes(&self) -> &[Change] {
        &self.changes
    }

    /// How many changes are recorded.
    pub fn len(&self) -> usize {
        self.changes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// The revision of the last recorded change (0: none).
    pub fn last_revision(&self) -> i64 {
        self.changes.last().map_or(0, |c| c.revision)
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
        self.changes.push(Change {
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
        let start = self.changes.partition_point(|c| c.revision <= revision);
        let mut undone = BTreeMap::new();
        for change in &self.changes[start..] {
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
        let start = self.changes.partition_point(|c| c.revision < from);
        let mut events: Vec<Event> = Vec::new();
        let mut bytes = 0usize;
        let mut next = from.max(revision + 1);
        for change in &self.changes[start..] {
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
        let start = self.changes.partition_point(|c| c.revision < revision);
        // Into a vector of its own size: what was dropped is freed, not kept as capacity.
        self.changes = self.changes[start..].to_vec();
        for change in self
            .changes
            .iter_mut()
            .take_while(|c| c.revision == revision)
        {
            change.prev = None;
        }
        self.compacted = revision;
    }

    /// Checks the record against the head (the current key space, at store revision
    /// `store_revision`). `Err` names the first broken invariant.
    pub fn validate(
        &self,
        head: &BTreeMap<Bytes, Value>,
        store_revision: i64,
    ) -> Result<(), String> {
        if self.compacted > store_revision {
            return Err(format!(
                "compacted revision {} is past the store's {store_revision}",
                self.compacted
            ));
        }
        if self
            .changes
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
        for change in &self.changes {
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
            if change.value.as_ref() != head.get(*key) {
                return Err(format!("key {key:?}: head and history disagree"));
            }
        }
        // Every value written since the compaction is recorded.
        for (key, value) in head {
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
