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
    pub(super) fn home(&self, client_id: u64) -> usize {
        // Fibonacci hashing; `shift` is 0 for an empty table and below 64 always.
        (client_id.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    fn mask(&self) -> usize {
        self.buckets.len().wrapping_sub(1)
    }

    /// The bucket holding `client_id`'s session. (An empty table has `shift` 0: every
    /// home index is out of range and the lookup ends at once.)
    #[inline]
    fn find(&self, client_id: u64) -> Option<usize> {
        let home = self.home(client_id);
        match &self.buckets.get(home)?.0 {
            None => None,
            Some(s) if s.client_id == client_id => Some(home),
            Some(_) => self.find_past_home(client_id, home),
        }
    }

    /// [`find`](Self::find) for a session that is not in its home bucket (a collision).
    #[inline(never)]
    fn find_past_home(&self, client_id: u64, home: usize) -> Option<usize> {
        let mask = self.mask();
        let mut i = home;
        // Ends: the table always has an empty bucket.
        loop {
            i = (i + 1) & mask;
            match &self.buckets.get(i)?.0 {
                None => return None,
                Some(s) if s.client_id == client_id => return Some(i),
                Some(_) => {}
            }
        }
    }

    pub(super) fn get(&self, client_id: u64) -> Option<&Session> {
        let i = self.find(client_id)?;
        self.buckets.get(i)?.0.as_ref()
    }

    #[inline]
    pub(super) fn get_mut(&mut self, client_id: u64) -> Option<&mut Session> {
        let home = self.home(client_id);
        let at_home = match &self.buckets.get(home)?.0 {
            None => return None,
            Some(s) => s.client_id == client_id,
        };
        // The usual case in straight-line code, so that the compiler sees the second access
        // to the same bucket and checks its bounds and tag once.
        if at_home {
            return self.buckets.get_mut(home)?.0.as_mut();
        }
        let i = self.find_past_home(client_id, home)?;
        self.buckets.get_mut(i)?.0.as_mut()
    }

    /// Starts loading `client_id`'s home bucket into cache without waiting for it (a
    /// prefetch instruction: unlike a load, nothing waits for it to arrive), and returns
    /// the bucket's index for [`get_mut_from`](Self::get_mut_from).
    #[inline]
    pub(super) fn prefetch(&self, client_id: u64) -> usize {
        let home = self.home(client_id);
        if let Some(b) = self.buckets.get(home) {
            mem_prefetch::prefetch_read_data::<_, 3>(b);
        }
        home
    }

    /// [`get_mut`](Self::get_mut) given a guess of the bucket (what
    /// [`prefetch`](Self::prefetch) returned): the guess is taken only if that bucket holds
    /// `client_id`'s session, so a wrong or stale one costs a lookup, never a wrong answer.
    #[inline]
    pub(super) fn get_mut_from(&mut self, guess: usize, client_id: u64) -> Option<&mut Session> {
        let at_guess = self
            .buckets
            .get(guess)
            .and_then(|b| b.0.as_ref())
            .is_some_and(|s| s.client_id == client_id);
        if at_guess {
            return self.buckets.get_mut(guess)?.0.as_mut();
        }
        self.get_mut(client_id)
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

    /// An empty table (no buckets yet) answers every lookup with nothing, without a
    /// special case: its `shift` of 0 puts every home index out of range.
    #[test]
    fn empty_table_finds_nothing() {
        let mut slots = Slots::default();
        for id in [0, 1, 7, u64::MAX] {
            assert!(slots.get_mut(id).is_none());
            assert!(slots.get(id).is_none());
            slots.prefetch(id);
            assert!(slots.remove(id).is_none());
        }
        assert!(slots.insert(session(3)));
        assert!(slots.get_mut(3).is_some());
        assert!(slots.remove(3).is_some());
        assert!(slots.get_mut(3).is_none());
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
        for id in (0..3_000).chain((0..64).map(|i| i << 40)) {
            assert_eq!(slots.contains(id), model.contains(&id));
            let found = slots.get_mut(id).map(|s| s.client_id);
            assert_eq!(found, model.contains(&id).then_some(id), "get_mut {id}");
        }
        let mut ids: Vec<u64> = slots.iter().map(|s| s.client_id).collect();
        ids.sort_unstable();
        assert_eq!(ids, model.into_iter().collect::<Vec<_>>());
    }
}
