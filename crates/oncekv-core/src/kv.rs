//! The key-value store with etcd's revision semantics and MVCC history.
//!
//! One store revision per mutating command (a txn's writes share one), per-key
//! `create_revision`, `mod_revision` and `version`. Writes go through a [`Write`] so that a
//! txn can make several changes at the revision it will commit. Every change is also
//! recorded in the [`History`], which serves reads at older revisions and watches, until
//! compacted.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::ops::Bound;

use bytes::Bytes;

pub use crate::command::in_range;
use crate::command::{
    DeleteRangeRequest, DeleteRangeResponse, KeyRange, OpError, RangeRequest, RangeResponse,
    SortOrder, SortTarget,
};
use crate::history::{Change, History};
pub use crate::value::Value;

/// The head's map: a B+ tree whose nodes are shared between copies, so that the copy a
/// snapshot takes under the lock apply waits for costs a pointer, not a walk of every
/// key (a quarter of a second at a million keys, every put waiting). A node shared with
/// a snapshot still being written is copied when a write first changes it.
type Map = imbl::OrdMap<MapKey, Value>;
type Entry<'a> = imbl::ordmap::Entry<'a, MapKey, Value, imbl::shared_ptr::DefaultSharedPtr>;
type OccupiedEntry<'a> =
    imbl::ordmap::OccupiedEntry<'a, MapKey, Value, imbl::shared_ptr::DefaultSharedPtr>;
type VacantEntry<'a> =
    imbl::ordmap::VacantEntry<'a, MapKey, Value, imbl::shared_ptr::DefaultSharedPtr>;

/// A key of the store's map: the key's bytes, with their first eight read as a big-endian
/// number (zero-padded).
///
/// A B-tree search compares the key sought with a dozen or more stored keys, and the bytes
/// of each live in an allocation of their own: comparing bytes first meant a cache miss
/// per comparison (a tenth of a put's server CPU at 100,000 keys). Comparing `head`s first
/// decides most comparisons from the node itself. The order is still the bytes' order: a
/// smaller `head` means smaller bytes (the first eight differ there; a shorter key's
/// padding is zero, no larger than any byte), and equal `head`s fall back to the bytes.
/// So the map can also be searched by `[u8]` through `Borrow`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapKey {
    head: u64,
    bytes: Bytes,
}

impl MapKey {
    fn new(bytes: Bytes) -> MapKey {
        let head = match bytes.first_chunk::<8>() {
            Some(first) => u64::from_be_bytes(*first),
            None => {
                let mut first = [0u8; 8];
                first[..bytes.len()].copy_from_slice(&bytes);
                u64::from_be_bytes(first)
            }
        };
        MapKey { head, bytes }
    }
}

impl Ord for MapKey {
    #[inline]
    fn cmp(&self, other: &MapKey) -> Ordering {
        self.head
            .cmp(&other.head)
            .then_with(|| self.bytes.cmp(&other.bytes))
    }
}

impl PartialOrd for MapKey {
    fn partial_cmp(&self, other: &MapKey) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Borrow<[u8]> for MapKey {
    fn borrow(&self) -> &[u8] {
        &self.bytes
    }
}

/// The key space (the head), its revision counter and its history. A fresh store is at
/// revision 1, as etcd is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvStore {
    map: Map,
    revision: i64,
    history: History,
}

impl Default for KvStore {
    fn default() -> Self {
        KvStore {
            map: Map::new(),
            revision: 1,
            history: History::default(),
        }
    }
}

/// A mutation in progress: every change made through it carries `revision`, and
/// [`KvStore::commit`] advances the store to it if anything changed.
#[derive(Debug, Clone, Copy)]
pub struct Write {
    pub revision: i64,
    pub changed: bool,
}

fn is_empty_range(range: &KeyRange) -> bool {
    !range.range_end.is_empty() && range.range_end.as_ref() != b"\0" && range.range_end <= range.key
}

/// The `(start, end)` bounds etcd's `key`/`range_end` pair selects, as keys of the map,
/// or bounds that select nothing for a range whose end is not after its start.
fn scan_bounds(range: &KeyRange) -> (Bound<MapKey>, Bound<MapKey>) {
    if is_empty_range(range) {
        return (Bound::Unbounded, Bound::Excluded(MapKey::new(Bytes::new())));
    }
    let start = Bound::Included(MapKey::new(range.key.clone()));
    match range.range_end.as_ref() {
        b"" => (start, Bound::Included(MapKey::new(range.key.clone()))),
        b"\0" => (start, Bound::Unbounded),
        _ => (start, Bound::Excluded(MapKey::new(range.range_end.clone()))),
    }
}

impl KvStore {
    pub fn revision(&self) -> i64 {
        self.revision
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn get(&self, key: &[u8]) -> Option<&Value> {
        self.map.get(key)
    }

    /// See `StateMachine::corrupt_value_for_test`.
    pub(crate) fn corrupt_value_for_test(&mut self, key: &[u8], value: &[u8]) -> bool {
        match self.map.get_mut(key) {
            Some(v) => {
                v.value = Bytes::copy_from_slice(value);
                true
            }
            None => false,
        }
    }

    /// Every key in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&Bytes, &Value)> {
        self.map.iter().map(|(k, v)| (&k.bytes, v))
    }

    /// Rebuilds a store (restore from a snapshot).
    pub fn from_parts(
        revision: i64,
        entries: impl IntoIterator<Item = (Bytes, Value)>,
        compacted: i64,
        changes: Vec<Change>,
    ) -> Self {
        Self::from_head_and_history(revision, entries, History::from_parts(compacted, changes))
    }

    /// [`from_parts`](Self::from_parts) with the history already built.
    pub(crate) fn from_head_and_history(
        revision: i64,
        entries: impl IntoIterator<Item = (Bytes, Value)>,
        history: History,
    ) -> Self {
        KvStore {
            map: entries
                .into_iter()
                .map(|(k, v)| (MapKey::new(k), v))
                .collect(),
            revision,
            history,
        }
    }

    /// The history of changes since the last compaction.
    pub fn history(&self) -> &History {
        &self.history
    }

    /// The compacted revision (0: never compacted).
    pub fn compacted_revision(&self) -> i64 {
        self.history.compacted()
    }

    /// The keys (with values) in `range`, in key order.
    pub fn scan<'a>(&'a self, range: &'a KeyRange) -> impl Iterator<Item = (&'a Bytes, &'a Value)> {
        // One key (the commonest read): one descent of the tree, where a range descends
        // once for each of its ends.
        let (one, many) = if range.range_end.is_empty() {
            (self.map.get_key_value(range.key.as_ref()), None)
        } else {
            (None, Some(self.map.range(scan_bounds(range))))
        };
        one.into_iter()
            .chain(many.into_iter().flatten())
            .map(|(k, v)| (&k.bytes, v))
    }

    /// The keys in `range` with the values they had at `revision`, in key order: the
    /// head's, with the changes made after `revision` undone.
    fn scan_at<'a>(&'a self, range: &'a KeyRange, revision: i64) -> Vec<(&'a Bytes, &'a Value)> {
        let undone = self.history.undo_after(range, revision);
        let mut head = self.scan(range).peekable();
        let mut undone = undone.into_iter().peekable();
        let mut out = Vec::new();
        loop {
            // Both in key order; a key changed since `revision` takes its undone value.
            let take_head = match (head.peek(), undone.peek()) {
                (None, None) => break,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some((a, _)), Some((b, _))) => a < b,
            };
            if take_head {
                out.extend(head.next());
            } else if let Some((key, value)) = undone.next() {
                head.next_if(|(k, _)| *k == key);
                if let Some(v) = value {
                    out.push((key, v));
                }
            }
        }
        out
    }

    /// Starts a mutation at the next revision.
    pub fn begin(&self) -> Write {
        Write {
            revision: self.revision + 1,
            changed: false,
        }
    }

    /// Ends a mutation: the store revision advances only if something changed.
    pub fn commit(&mut self, write: Write) {
        if write.changed {
            self.revision = write.revision;
        }
    }

    /// Whether a read at `revision` (0: current) can be served: not past the store's
    /// revision (`FutureRevision`), not below the compacted one (`Compacted`).
    pub fn check_revision(&self, revision: i64) -> Result<(), OpError> {
        if revision > self.revision {
            return Err(OpError::FutureRevision);
        }
        if revision > 0 && revision < self.history.compacted() {
            return Err(OpError::Compacted);
        }
        Ok(())
    }

    /// etcd's Range, at `req.revision` (0: current). A current read sees writes already
    /// made in the current txn; a read at a revision sees that revision only.
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, OpError> {
        self.check_revision(req.revision)?;
        // The head answers when nothing was written after the revision asked for.
        if req.revision == 0 || req.revision >= self.history.last_revision() {
            Ok(self.select(req, self.scan(&req.range)))
        } else {
            Ok(self.select(req, self.scan_at(&req.range, req.revision).into_iter()))
        }
    }

    /// etcd's Compact: history before `revision` is dropped (see [`History::compact`]).
    /// Refused at or below the compacted revision, and past the current one, as etcd does.
    pub fn compact(&mut self, revision: i64) -> Result<(), OpError> {
        if revision <= self.history.compacted() {
            return Err(OpError::Compacted);
        }
        if revision > self.revision {
            return Err(OpError::FutureRevision);
        }
        self.history.compact(revision);
        Ok(())
    }

    /// The filters, sort and limit of a range request, over the keys it selected.
    fn select<'a>(
        &self,
        req: &RangeRequest,
        selected: impl Iterator<Item = (&'a Bytes, &'a Value)>,
    ) -> RangeResponse {
        let in_bounds = |v: &Value| {
            (req.min_mod_revision == 0 || v.mod_revision >= req.min_mod_revision)
                && (req.max_mod_revision == 0 || v.mod_revision <= req.max_mod_revision)
                && (req.min_create_revision == 0 || v.create_revision >= req.min_create_revision)
                && (req.max_create_revision == 0 || v.create_revision <= req.max_create_revision)
        };
        let mut count = 0i64;
        let mut matched: Vec<(&Bytes, &Value)> = Vec::new();
        for (k, v) in selected {
            count += 1;
            if !req.count_only && in_bounds(v) {
                matched.push((k, v));
            }
        }
        let order = match (req.sort_order, req.sort_target) {
            (SortOrder::None, SortTarget::Key) => SortOrder::None,
            (SortOrder::None, _) => SortOrder::Ascend,
            (order, _) => order,
        };
        if order != SortOrder::None {
            // Stable: ties stay in key order.
            matched.sort_by(|(ka, a), (kb, b)| match req.sort_target {
                SortTarget::Key => ka.cmp(kb),
                SortTarget::Version => a.version.cmp(&b.version),
                SortTarget::Create => a.create_revision.cmp(&b.create_revision),
                SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
                SortTarget::Value => a.value.cmp(&b.value),
            });
            if order == SortOrder::Descend {
                matched.reverse();
            }
        }
        let mut more = false;
        if req.limit > 0 && matched.len() as i64 > req.limit {
            matched.truncate(req.limit as usize);
            more = true;
        }
        let kvs = matched
            .into_iter()
            .map(|(k, v)| {
                let mut kv = v.to_key_value(k);
                if req.keys_only {
                    kv.value = Bytes::new();
                }
                kv
            })
            .collect();
        RangeResponse { kvs, more, count }
    }

    /// Sets `key`, in one search of the map, as part of `w`. `value` / `lease` of `None`
    /// keep the key's current one (etcd's `ignore_value` / `ignore_lease`; the caller has
    /// checked that the key exists). Returns the previous value and the lease the key now
    /// has; the caller has checked the request (non-empty key, lease exists) and keeps the
    /// lease table in step.
    pub fn put(
        &mut self,
        w: &mut Write,
        key: &Bytes,
        value: Option<&Bytes>,
        lease: Option<i64>,
    ) -> (Option<Value>, i64) {
        w.changed = true;
        match self.map.entry(MapKey::new(key.clone())) {
            Entry::Occupied(entry) => entry.set(w.revision, value, lease, &mut self.history),
            Entry::Vacant(entry) => entry.set(w.revision, value, lease, &mut self.history),
        }
    }

    /// Finds where `key` is or would go, for a put of that one key decided later: the
    /// search is done, nothing has changed, and dropping the slot changes nothing.
    #[inline]
    pub fn slot(&mut self, key: &Bytes) -> Slot<'_> {
        Slot {
            entry: self.map.entry(MapKey::new(key.clone())),
            revision: &mut self.revision,
            history: &mut self.history,
        }
    }

    /// Deletes every key in the range; returns the deleted keys with their values (the
    /// caller detaches them from leases).
    pub fn delete_range(&mut self, w: &mut Write, range: &KeyRange) -> Vec<(Bytes, Value)> {
        let keys: Vec<Bytes> = self.scan(range).map(|(k, _)| k.clone()).collect();
        let mut deleted = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some(v) = self.map.remove(&MapKey::new(key.clone())) {
                self.history.record(w.revision, &key, None, Some(v.clone()));
                deleted.push((key, v));
            }
        }
        if !deleted.is_empty() {
            w.changed = true;
        }
        deleted
    }

    /// Builds etcd's DeleteRange response from what [`delete_range`](Self::delete_range)
    /// removed.
    pub fn delete_response(
        req: &DeleteRangeRequest,
        deleted: &[(Bytes, Value)],
    ) -> DeleteRangeResponse {
        DeleteRangeResponse {
            deleted: deleted.len() as i64,
            prev_kvs: if req.prev_kv {
                deleted.iter().map(|(k, v)| v.to_key_value(k)).collect()
            } else {
                Vec::new()
            },
        }
    }

    /// Checks the invariants; `Err` names the first one broken.
    pub fn validate(&self) -> Result<(), String> {
        for (k, v) in self.iter() {
            if k.is_empty() {
                return Err("empty key in the store".into());
            }
            if v.version < 1 || v.create_revision > v.mod_revision || v.mod_revision > self.revision
            {
                return Err(format!(
                    "key {k:?}: bad revisions {v:?} at store revision {}",
                    self.revision
                ));
            }
        }
        self.history
            .validate(|key| self.get(key), self.iter(), self.revision)
    }
}

/// A key's place in the store, found by [`KvStore::slot`] before a put of it is decided.
pub struct Slot<'a> {
    entry: Entry<'a>,
    revision: &'a mut i64,
    history: &'a mut History,
}

impl<'a> Slot<'a> {
    /// Says whether the key is stored, as the type of slot (a put of each kind is a
    /// function of its own: only what that kind holds is passed on).
    #[inline]
    pub fn known(self) -> KnownSlot<'a> {
        let Slot {
            entry,
            revision,
            history,
        } = self;
        match entry {
            Entry::Occupied(entry) => KnownSlot::Stored(KeySlot {
                entry,
                revision,
                history,
            }),
            Entry::Vacant(entry) => KnownSlot::Free(KeySlot {
                entry,
                revision,
                history,
            }),
        }
    }
}

/// A [`Slot`] whose key is known to be stored, or known not to be.
#[derive(Debug)]
pub enum KnownSlot<'a> {
    Stored(KeySlot<'a, OccupiedEntry<'a>>),
    Free(KeySlot<'a, VacantEntry<'a>>),
}

/// A key's place in the store for a put of that one key: `E` is the B-tree entry of a
/// stored key or of a key that is not (see [`KnownSlot`]).
pub struct KeySlot<'a, E> {
    entry: E,
    revision: &'a mut i64,
    history: &'a mut History,
}

// The map's entries do not print themselves; the revision says where the store is.
impl std::fmt::Debug for Slot<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("revision", &self.revision)
            .finish_non_exhaustive()
    }
}

impl<E: PutEntry> std::fmt::Debug for KeySlot<'_, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeySlot")
            .field("stored", &E::STORED)
            .field("revision", &self.revision)
            .finish_non_exhaustive()
    }
}

impl<E: PutEntry> KeySlot<'_, E> {
    /// Whether the key is in the store.
    pub fn exists(&self) -> bool {
        E::STORED
    }

    /// The store's revision.
    pub fn revision(&self) -> i64 {
        *self.revision
    }

    /// [`KvStore::put`] as a write of its own: at the store's next revision, which it
    /// becomes. Returns that revision, the previous value and the key's lease.
    #[inline]
    pub fn put(self, value: Option<&Bytes>, lease: Option<i64>) -> (i64, Option<Value>, i64) {
        *self.revision += 1;
        let rev = *self.revision;
        let (prev, lease) = self.entry.set(rev, value, lease, self.history);
        (rev, prev, lease)
    }
}

/// A B-tree entry a put can write: a stored key's or a free one's.
pub trait PutEntry {
    /// Whether the entry's key is in the store.
    const STORED: bool;

    /// A put at this entry, at revision `rev` (see [`KvStore::put`]), recorded in
    /// `history`.
    fn set(
        self,
        rev: i64,
        value: Option<&Bytes>,
        lease: Option<i64>,
        history: &mut History,
    ) -> (Option<Value>, i64);
}

impl PutEntry for OccupiedEntry<'_> {
    const STORED: bool = true;

    /// Returns the key's previous value and its lease now.
    #[inline]
    fn set(
        mut self,
        rev: i64,
        value: Option<&Bytes>,
        lease: Option<i64>,
        history: &mut History,
    ) -> (Option<Value>, i64) {
        let v = self.get_mut();
        // The old value moves into `prev` rather than being copied.
        let prev_value = match value {
            Some(value) => std::mem::replace(&mut v.value, value.clone()),
            None => v.value.clone(),
        };
        let prev = Value {
            create_revision: v.create_revision,
            mod_revision: v.mod_revision,
            version: v.version,
            value: prev_value,
            lease: v.lease,
        };
        v.mod_revision = rev;
        v.version += 1;
        v.lease = lease.unwrap_or(v.lease);
        let lease = v.lease;
        let now = v.clone();
        history.record(rev, &self.key().bytes, Some(now), Some(prev.clone()));
        (Some(prev), lease)
    }
}

impl PutEntry for VacantEntry<'_> {
    const STORED: bool = false;

    /// Returns no previous value and the key's lease.
    #[inline]
    fn set(
        self,
        rev: i64,
        value: Option<&Bytes>,
        lease: Option<i64>,
        history: &mut History,
    ) -> (Option<Value>, i64) {
        let lease = lease.unwrap_or(0);
        let v = Value {
            create_revision: rev,
            mod_revision: rev,
            version: 1,
            value: value.cloned().unwrap_or_default(),
            lease,
        };
        history.record(rev, &self.key().bytes, Some(v.clone()), None);
        self.insert(v);
        (None, lease)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Keys where the first eight bytes decide, where they tie (zero bytes against the
    /// padding of a shorter key), and longer than eight.
    fn tricky_keys() -> Vec<Bytes> {
        let mut keys: Vec<&[u8]> = vec![
            b"",
            b"\0",
            b"\0\0",
            b"a",
            b"a\0",
            b"a\x01",
            b"ab",
            b"abcdefg",
            b"abcdefg\0",
            b"abcdefgh",
            b"abcdefgh\0",
            b"abcdefgh\x01",
            b"abcdefgi",
            b"abcdefgha",
            b"a\0\0\0\0\0\0\0",
            b"a\0\0\0\0\0\0\0\0",
            b"\xff",
            b"\xff\xff\xff\xff\xff\xff\xff",
            b"\xff\xff\xff\xff\xff\xff\xff\xff",
            b"\xff\xff\xff\xff\xff\xff\xff\xff\xff",
            b"00000042",
            b"000000420",
            b"0000004",
            b"zz",
        ];
        keys.sort();
        keys.into_iter().map(Bytes::from_static).collect()
    }

    #[test]
    fn map_keys_order_as_their_bytes_do() {
        let keys = tricky_keys();
        for a in &keys {
            for b in &keys {
                let (ka, kb) = (MapKey::new(a.clone()), MapKey::new(b.clone()));
                assert_eq!(ka.cmp(&kb), a.cmp(b), "{a:?} against {b:?}");
                assert_eq!(ka == kb, a == b, "{a:?} against {b:?}");
            }
        }
    }

    #[test]
    fn scans_and_gets_find_what_a_map_of_bytes_would() {
        let mut store = KvStore::default();
        let mut plain: std::collections::BTreeMap<Bytes, Bytes> = Default::default();
        // The tricky keys, and decimal keys of several lengths (a pseudo-random walk).
        let mut keys: Vec<Bytes> = tricky_keys()
            .into_iter()
            .filter(|k| !k.is_empty())
            .collect();
        let mut x: u64 = 7;
        for _ in 0..500 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            keys.push(Bytes::from(format!("{}", x >> (40 + x % 20))));
        }
        for (i, key) in keys.iter().enumerate() {
            let value = Bytes::from(format!("v{i}"));
            let mut w = store.begin();
            store.put(&mut w, key, Some(&value), None);
            store.commit(w);
            plain.insert(key.clone(), value);
        }
        let listed: Vec<&Bytes> = store.iter().map(|(k, _)| k).collect();
        assert_eq!(listed, plain.keys().collect::<Vec<_>>());
        let mut ends: Vec<Bytes> = keys.iter().take(60).cloned().collect();
        ends.extend([
            Bytes::new(),
            Bytes::from_static(b"\0"),
            Bytes::from_static(b"5"),
        ]);
        for start in keys.iter().take(60) {
            assert_eq!(
                store.get(start).map(|v| &v.value),
                plain.get(start),
                "get {start:?}"
            );
            for end in &ends {
                let range = KeyRange {
                    key: start.clone(),
                    range_end: end.clone(),
                };
                let scanned: Vec<&Bytes> = store.scan(&range).map(|(k, _)| k).collect();
                let expected: Vec<&Bytes> = plain.keys().filter(|k| in_range(&range, k)).collect();
                assert_eq!(scanned, expected, "range {start:?}..{end:?}");
            }
        }
        store.validate().unwrap();
    }
}
