//! Leases, expiring purely by cluster time.
//!
//! Like sessions, leases use a lazy deadline index: a keep-alive only moves the lease's
//! `deadline`; the index entry `(indexed_deadline, id)` (always `<=` the real deadline) is
//! fixed up when it comes due. A lease expires when `cluster_time >= deadline`, i.e. when its
//! remaining TTL reaches zero, as in etcd.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// A granted lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The TTL granted, in seconds.
    pub ttl: i64,
    /// Cluster time (ms) at which it expires unless kept alive.
    pub deadline: u64,
    /// Keys attached to it, deleted when it is revoked or expires.
    pub keys: BTreeSet<Bytes>,
}

/// What etcd's LeaseTimeToLive answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseStatus {
    pub id: i64,
    pub granted_ttl: i64,
    /// Whole seconds left.
    pub ttl: i64,
    pub keys: Vec<Bytes>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseTable {
    leases: BTreeMap<i64, Lease>,
    /// Lazy: `(d, id)` with `d <= leases[id].deadline`; entries of revoked leases are dropped
    /// when they come due.
    by_deadline: BTreeSet<(u64, i64)>,
}

impl LeaseTable {
    pub fn len(&self) -> usize {
        self.leases.len()
    }

    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    pub fn get(&self, id: i64) -> Option<&Lease> {
        self.leases.get(&id)
    }

    pub fn contains(&self, id: i64) -> bool {
        self.leases.contains_key(&id)
    }

    /// Leases in id order.
    pub fn iter(&self) -> impl Iterator<Item = (&i64, &Lease)> {
        self.leases.iter()
    }

    /// The first id `>= from` (wrapping past `i64::MAX` to 1) that is free. Deterministic,
    /// so every replica picks the same id for a grant with ID 0.
    pub fn free_id(&self, from: i64) -> i64 {
        let mut id = from.max(1);
        while self.leases.contains_key(&id) {
            id = if id == i64::MAX { 1 } else { id + 1 };
        }
        id
    }

    /// Creates a lease; the caller checked that `id` is free.
    pub fn grant(&mut self, id: i64, ttl: i64, now: u64) {
        let deadline = deadline(now, ttl);
        self.leases.insert(
            id,
            Lease {
                ttl,
                deadline,
                keys: BTreeSet::new(),
            },
        );
        self.by_deadline.insert((deadline, id));
    }

    /// Removes a lease, returning it (its keys are the caller's to delete).
    pub fn revoke(&mut self, id: i64) -> Option<Lease> {
        self.leases.remove(&id)
    }

    /// Restarts the lease's TTL from `now`; returns the TTL, or `None` if there is no lease.
    pub fn keep_alive(&mut self, id: i64, now: u64) -> Option<i64> {
        let lease = self.leases.get_mut(&id)?;
        lease.deadline = lease.deadline.max(deadline(now, lease.ttl));
        Some(lease.ttl)
    }

    pub fn attach(&mut self, id: i64, key: &Bytes) {
        if let Some(lease) = self.leases.get_mut(&id) {
            lease.keys.insert(key.clone());
        }
    }

    pub fn detach(&mut self, id: i64, key: &[u8]) {
        if let Some(lease) = self.leases.get_mut(&id) {
            lease.keys.remove(key);
        }
    }

    /// Removes every lease whose deadline is `<= now`, in `(deadline, id)` order. The order
    /// is part of the replicated state (each expiry's deletes get their own revision in
    /// history), so it depends only on the leases, never on the lazy index: a replica
    /// restored from a snapshot, whose index holds the exact deadlines, expires them in
    /// the same order as one whose index lags behind keep-alives.
    pub fn expire(&mut self, now: u64) -> Vec<(i64, Lease)> {
        let mut expired = Vec::new();
        while let Some(&(d, id)) = self.by_deadline.first() {
            if d > now {
                break;
            }
            self.by_deadline.pop_first();
            let Some(lease) = self.leases.get(&id) else {
                continue;
            };
            if lease.deadline <= now {
                if let Some(lease) = self.leases.remove(&id) {
                    expired.push((id, lease));
                }
            } else {
                self.by_deadline.insert((lease.deadline, id));
            }
        }
        expired.sort_by_key(|(id, lease)| (lease.deadline, *id));
        expired
    }

    /// The earliest cluster time at which [`expire`](Self::expire) may remove something.
    pub fn next_deadline(&self) -> Option<u64> {
        self.by_deadline.first().map(|(d, _)| *d)
    }

    /// etcd's LeaseTimeToLive at cluster time `now`.
    pub fn status(&self, id: i64, with_keys: bool, now: u64) -> Option<LeaseStatus> {
        let lease = self.leases.get(&id)?;
        Some(LeaseStatus {
            id,
            granted_ttl: lease.ttl,
            ttl: (lease.deadline.saturating_sub(now) / 1000) as i64,
            keys: if with_keys {
                lease.keys.iter().cloned().collect()
            } else {
                Vec::new()
            },
        })
    }

    /// Rebuilds a table (restore from a snapshot).
    pub fn from_leases(leases: impl IntoIterator<Item = (i64, Lease)>) -> LeaseTable {
        let leases: BTreeMap<i64, Lease> = leases.into_iter().collect();
        let by_deadline = leases.iter().map(|(id, l)| (l.deadline, *id)).collect();
        LeaseTable {
            leases,
            by_deadline,
        }
    }

    /// Checks the index invariant; `Err` names the first lease that breaks it.
    pub fn validate(&self) -> Result<(), String> {
        // A lease revoked and granted again under the same id may leave a stale, earlier
        // entry behind; it is harmless (dropped or re-indexed when due), so keep the first.
        let mut indexed = BTreeMap::new();
        for &(d, id) in &self.by_deadline {
            indexed.entry(id).or_insert(d);
        }
        for (id, lease) in &self.leases {
            match indexed.get(id) {
                Some(d) if *d <= lease.deadline => {}
                _ => {
                    return Err(format!(
                        "lease {id} is not indexed at or before its deadline"
                    ));
                }
            }
        }
        Ok(())
    }
}

fn deadline(now: u64, ttl_secs: i64) -> u64 {
    now.saturating_add((ttl_secs.max(0) as u64).saturating_mul(1000))
}
