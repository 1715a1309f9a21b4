//! Leader-lease reads (`--leader-lease-reads`, off by default).
//!
//! A linearizable read normally waits for a round of heartbeats that a quorum answers
//! (see [`crate::read_batch`]). With a lease, a leader that had such a round answered
//! recently serves reads at once, at its last log index, without another round.
//!
//! Why that is safe, and what it assumes:
//! - A round that started at `t0` and was answered by a quorum means each member of that
//!   quorum heard from this leader after `t0`. openraft makes a voter that heard from its
//!   leader refuse every vote for `election_timeout_max` afterwards, which is
//!   `--election-timeout` (see `NodeConfig::vote_lease`). A new leader needs a vote from
//!   one member of that quorum, so none can exist before `t0 + --election-timeout`; the
//!   lease ends earlier, at `t0 + LEASE_FRACTION x --election-timeout`.
//! - A voter forgets when it last heard from the leader if it restarts. So with lease
//!   reads on, a member refuses to vote for anyone during its first `--election-timeout`:
//!   it heard that leader before it stopped, so it owes it less than that from its start
//!   (see [`ReadLease::voting_allowed`]). Every member must run with
//!   the flag: the guard is on the voters, the lease on the leader.
//! - Clocks: each member measures these spans on its own monotonic clock. The lease is
//!   right while no clock runs more than 20 % faster or slower than another over an
//!   election timeout (the fraction's margin). NTP steps do not matter (monotonic
//!   clocks); a VM whose clock stalls while others run can break it, as any lease.
//! - A leader serving under its lease needs a read index that covers every write
//!   acknowledged before the read came (a write is acknowledged once committed):
//!   - with nothing in flight (its published metrics show every entry of its log
//!     applied), its last log index, at once;
//!   - with writes in flight, its committed index, asked of raft's core after the read
//!     came (not of the metrics, which trail it; a follower applies an entry only after
//!     the leader's core counted it committed), and at least the read index of the round
//!     that granted the lease (`floor`), which is at least the first entry of this
//!     leader's term, so everything an earlier leader acknowledged is in. The read then
//!     does not wait for the writes in flight, only for the committed ones to apply.
//!
//!   A read never uses a lease of an earlier term.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// The lease runs for this fraction of the election timeout after a confirmed round
/// started: the rest is the margin for clocks that run at different rates.
const LEASE_FRACTION: f64 = 0.8;

#[derive(Debug)]
pub(crate) struct ReadLease {
    duration: Duration,
    /// No votes before this (the member's start plus `election_timeout_max`).
    votes_from: Instant,
    held: Mutex<Option<Held>>,
    renewing: AtomicBool,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    term: u64,
    until: Instant,
    /// The largest read index a round of `term` confirmed.
    floor: u64,
}

impl ReadLease {
    /// A lease for a member that started now, given how long a voter refuses votes after
    /// hearing its leader (`NodeConfig::vote_lease`, openraft's `election_timeout_max`).
    pub(crate) fn new(vote_lease: Duration) -> ReadLease {
        ReadLease {
            duration: vote_lease.mul_f64(LEASE_FRACTION),
            votes_from: Instant::now() + vote_lease,
            held: Mutex::new(None),
            renewing: AtomicBool::new(false),
        }
    }

    /// A quorum confirmed this member as leader of `term`, at read index `index`, in a
    /// round that started at `round_started`.
    pub(crate) fn confirmed(&self, term: u64, round_started: Instant, index: u64) {
        let until = round_started + self.duration;
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        *held = Some(match *held {
            Some(h) if h.term == term => Held {
                term,
                until: h.until.max(until),
                floor: h.floor.max(index),
            },
            _ => Held {
                term,
                until,
                floor: index,
            },
        });
    }

    /// The lease of `term` at `now`, if one runs: how long it still runs, and the read
    /// index its rounds confirmed (the floor of a read under it).
    pub(crate) fn current(&self, term: u64, now: Instant) -> Option<(Duration, u64)> {
        let held = (*self.held.lock().unwrap_or_else(PoisonError::into_inner))?;
        // A broken build (`lease-clock`) forgets the clock bound: once held, held.
        let clock_ignored = oncekv_core::broken::is(oncekv_core::broken::Break::LeaseClock);
        (held.term == term && (now < held.until || clock_ignored))
            .then(|| (held.until.saturating_duration_since(now), held.floor))
    }

    /// Whether a lease with `remaining` left should be renewed now (half of it is gone),
    /// and no renewal is under way: the caller then runs one round and calls
    /// [`renewed`](ReadLease::renewed).
    pub(crate) fn start_renewal(&self, remaining: Duration) -> bool {
        remaining < self.duration / 2 && !self.renewing.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn renewed(&self) {
        self.renewing.store(false, Ordering::Release);
    }

    /// Whether this member may grant votes at `now` (see the module comment).
    pub(crate) fn voting_allowed(&self, now: Instant) -> bool {
        now >= self.votes_from
    }

    /// When this member starts voting.
    #[cfg(test)]
    fn votes_from(&self) -> Instant {
        self.votes_from
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_runs_from_the_round_start_for_its_term_only() {
        let lease = ReadLease::new(Duration::from_millis(1000));
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(lease.current(3, t0), None, "no round yet");
        lease.confirmed(3, t0, 10);
        assert_eq!(lease.current(3, t0 + ms(300)), Some((ms(500), 10)));
        assert_eq!(lease.current(4, t0), None, "another term");
        assert_eq!(lease.current(3, t0 + ms(800)), None);
        // An older round answered late does not shorten it, nor lower its floor.
        lease.confirmed(3, t0 - ms(500), 7);
        assert_eq!(lease.current(3, t0 + ms(700)), Some((ms(100), 10)));
        // A later round of the term lengthens it and raises the floor.
        lease.confirmed(3, t0 + ms(100), 12);
        assert_eq!(lease.current(3, t0 + ms(700)), Some((ms(200), 12)));
        // A round of a new term replaces it, floor and all.
        lease.confirmed(5, t0 + ms(100), 11);
        assert_eq!(lease.current(3, t0 + ms(200)), None);
        assert_eq!(lease.current(5, t0 + ms(200)), Some((ms(700), 11)));
    }

    #[test]
    fn one_renewal_at_a_time_once_half_the_lease_is_gone() {
        let lease = ReadLease::new(Duration::from_millis(1000));
        assert!(!lease.start_renewal(Duration::from_millis(500)));
        assert!(lease.start_renewal(Duration::from_millis(399)));
        assert!(
            !lease.start_renewal(Duration::from_millis(100)),
            "one is out"
        );
        lease.renewed();
        assert!(lease.start_renewal(Duration::from_millis(100)));
    }

    #[test]
    fn a_started_member_does_not_vote_for_one_vote_lease() {
        let started = Instant::now();
        let lease = ReadLease::new(Duration::from_millis(1000));
        assert!(!lease.voting_allowed(started + Duration::from_millis(999)));
        assert!(lease.voting_allowed(lease.votes_from()));
        assert!(lease.votes_from() >= started + Duration::from_millis(1000));
    }
}
