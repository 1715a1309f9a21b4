//! The sessions by client id: an open-addressing table whose buckets are the session
//! records themselves, one 64-byte cache line each.
//!
//! A general-purpose hash map reaches a record through its control bytes first and then
//! the bucket (two cache misses when the table is far larger than the cache). Here the
//! client id sits in the record, so looking up a session whose home bucket is free of
//! collisions reads exactly one cache line, and the rules of `check` are decided there
//! too (see [`Saved`](super::saved::Saved)).
//!
//! Client ids are log indices (`shared/DESIGN.md` section 2): increasing, with gaps. The
//! home bucket is Fibonacci hashing (multiply by 2^64/φ, keep the top bits), which spreads
//! arithmetic progressions of ids evenly. Collisions are resolved by linear probing; a
//! removal shifts the following entries back instead of leaving tombstones, so a lookup
//! always ends at the first empty bucket. The table doubles when more than 4/5 full.

use std::fmt;

use super::Session;

/// One bucket: an empty slot or a session, aligned to a cache line.
#[derive(Clone)]
#[repr(align(64))]
struct Bucket(Option<Session>);

// A bucket is exactly one cache line: the session record must not grow past it.
const _: () = assert!(std::mem::size_of::<Bucket>() == 64);

/// Grow when `len > capacity * MAX_LOAD_NUM / MAX_LOAD_DEN`.
const MAX_LOAD_NUM: usize = 4;
const MAX_LOAD_DEN: usize = 5;
const MIN_CAPACITY: usize = 16;

#[derive(Clone, Default)]
pub(super) struct Slots {
    /// A power of two long (or empty), never full.
    buckets: Vec<Bucket>,
    len: usize,
    /// `64 - log2(buckets.len())`: the hash's top bits index the table.
    shift: u32,
}

impl Slots {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn home(&self, client_id: u64) -> usize {
        // Fibonacci hashing; `shift` < 64 whenever the table is not empty.
        (client_id.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    fn mask(&self) -> usize {
        self.buckets.len().wrapping_sub(1)
    }

    /// The bucket holding `client_id`'s session.
    #[inline]
    fn find(&self, client_id: u64) -> Option<usize> {
        if self.buckets.is_empty() {
            return None;
        }
        let mask = self.mask();
        let mut i = self.home(client_id);
        // Ends: the table always has an empty bucket.
        loop {
            match &self.buckets.get(i)?.0 {
                None => return None,
                Some(s) if s.client_id == client_id => return Some(i),
                Some(_) => i = (i + 1) & mask,
            }
        }
    }

    pub(super) fn get(&self, client_id: u64) -> Option<&Session> {
        let i = self.find(client_id)?;
        self.buckets.get(i)?.0.as_ref()
    }

    #[inline]
    pub(super) fn get_mut(&mut self, client_id: u64) -> Option<&mut Session> {
        let i = self.find(client_id)?;
        self.buckets.get_mut(i)?.0.as_mut()
    }

    /// Reads the client id in `client_id`'s home bucket (0 if empty or out of range).
    /// Nothing depends on the value: the point is the load, which brings the bucket into
    /// cache. Several of these in a row are independent loads the CPU overlaps, where the
    /// lookups during apply, separated by a whole command's work, would wait for one miss
    /// after another.
    pub(super) fn touch(&self, client_id: u64) -> u64 {
        if self.buckets.is_empty() {
            return 0;
        }
        self.buckets
            .get(self.home(client_id))
            .and_then(|b| b.0.as_ref())
            .map_or(0, |s| s.client_id)
    }

    pub(super) fn contains(&self, client_id: u64) -> bool {
        self.find(client_id).is_some()
    }

    /// Inserts `session` under its client id; `false` (and nothing changes) if taken.
    pub(super) fn insert(&mut self, session: Session) -> bool {
        if self.contains(session.client_id) {
            return false;
        }
        if (self.len + 1) * MAX_LOAD_DEN > self.buckets.len() * MAX_LOAD_NUM {
            self.grow();
        }
        self.place(session);
        self.len += 1;
        true
    }

    /// Puts a session whose id is not in the table into the first free bucket of its probe
    /// sequence.
    fn place(&mut self, session: Session) {
        let mask = self.mask();
        let mut i = self.home(session.client_id);
        while self.buckets.get(i).is_some_and(|b| b.0.is_some()) {
            i = (i + 1) & mask;
        }
        if let Some(bucket) = self.buckets.get_mut(i) {
            bucket.0 = Some(session);
        }
    }

    fn grow(&mut self) {
        let capacity = (self.buckets.len() * 2).max(MIN_CAPACITY);
        let old = std::mem::replace(
            &mut self.buckets,
            std::iter::repeat_with(|| Bucket(None))
                .take(capacity)
                .collect(),
        );
        self.shift = 64 - capacity.trailing_zeros();
        for session in old.into_iter().filter_map(|b| b.0) {
            self.place(session);
        }
    }

    /// Removes and returns `client_id`'s session, shifting later entries of its probe run
    /// back so that no lookup meets a hole before its entry.
    pub(super) fn remove(&mut self, client_id: u64) -> Option<Session> {
        let mut hole = self.find(client_id)?;
        let removed = self.buckets.get_mut(hole)?.0.take();
        self.len -= 1;
        let mask = self.mask();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let Some(home) = self
                .buckets
                .get(j)
                .and_then(|b| b.0.as_ref())
                .map(|s| self.home(s.client_id))
            else {
                break;
            };
            // The entry at `j` may move to `hole` unless its home lies cyclically in
            // `(hole, j]` (it would then sit before its home).
            let home_after_hole = (j.wrapping_sub(home) & mask) < (j.wrapping_sub(hole) & mask);
            if !home_after_hole {
                self.buckets.swap(hole, j);
                hole = j;
            }
        }
        removed
    }

    /// Every session, in bucket order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Session> {
        self.buckets.iter().filter_map(|b| b.0.as_ref())
    }

    /// Checks the table's own invariants: the length, the load bound, and that every
    /// session is reachable from its home bucket without crossing an empty one.
    pub(super) fn validate(&self) -> Result<(), String> {
        let n = self.buckets.len();
        if n != 0 && (!n.is_power_of_two() || self.shift != 64 - n.trailing_zeros()) {
            return Err(format!(
                "session table of {n} buckets, shift {}",
                self.shift
            ));
        }
        if self.iter().count() != self.len {
            return Err("session table length out of date".into());
        }
        if self.len * MAX_LOAD_DEN > n * MAX_LOAD_NUM {
            return Err(format!("session table over-full: {} of {n}", self.len));
        }
        for (i, bucket) in self.buckets.iter().enumerate() {
            if let Some(s) = &bucket.0
                && self.find(s.client_id) != Some(i)
            {
                return Err(format!(
                    "session {} is unreachable from its home bucket",
                    s.client_id
                ));
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Slots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slots")
            .field("len", &self.len)
            .field("buckets", &self.buckets.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::Secret;

    fn session(client_id: u64) -> Session {
        Session::new(client_id, Secret::from_u128(u128::from(client_id)), 0)
    }

    /// Inserts, lookups and removals agree with a reference map through growth and
    /// backward shifts, including ids that collide on purpose.
    #[test]
    fn agrees_with_a_map_through_growth_and_removals() {
        let mut slots = Slots::default();
        let mut model = std::collections::BTreeSet::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for step in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Few distinct ids, some multiples of large powers of two (same home bits).
            let id = match x % 3 {
                0 => x % 3_000,
                1 => (x % 64) << 40,
                _ => x % 50,
            };
            if step % 3 == 2 {
                assert_eq!(slots.remove(id).is_some(), model.remove(&id), "remove {id}");
            } else {
                assert_eq!(slots.insert(session(id)), model.insert(id), "insert {id}");
            }
            assert_eq!(slots.len(), model.len());
            if step % 997 == 0 {
                slots.validate().expect("valid");
            }
        }
        slots.validate().expect("valid");
        for id in 0..3_000 {
            assert_eq!(slots.contains(id), model.contains(&id));
        }
        let mut ids: Vec<u64> = slots.iter().map(|s| s.client_id).collect();
        ids.sort_unstable();
        assert_eq!(ids, model.into_iter().collect::<Vec<_>>());
    }
}
