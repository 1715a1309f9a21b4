//! What the node's background tasks drive: snapshots when due, the db size the quota
//! limits, alarms, expiring or failing waiters, and the `Tick` that expires sessions
//! and leases.

use crate::error::ProposeError;
use crate::types::{Member, NodeId};
use oncekv_core::{AlarmKind, Command};
use openraft::RaftMetrics;
use std::time::{Duration, Instant};

use super::NodeCore;

/// A snapshot at least this large is written again only once the log since it is a
/// quarter of its size (see [`snapshot_due`]).
pub const LARGE_SNAPSHOT_BYTES: u64 = 64 << 20;

/// A large snapshot waits for a log of `1 / SNAPSHOT_LOG_FRACTION` of its size.
const SNAPSHOT_LOG_FRACTION: u64 = 4;

/// How long after asking for a snapshot that has not come the ticker asks again.
const SNAPSHOT_ASK_AGAIN: Duration = Duration::from_secs(30);

/// Whether a member should snapshot now: `entries` applied since its last snapshot have
/// reached `snapshot_count` (etcd's rule), and, once the last snapshot was large, the
/// log written since (`log_bytes`) is at least a quarter of that snapshot's size
/// (`snapshot_bytes`).
///
/// A snapshot here is the whole state (etcd's state is its database file, already on
/// disk), so counting entries alone would write a large state again for every few MB of
/// log: a 1 GB state under light traffic, one put per entry, would be rewritten on every
/// member for each 10,000 puts. With the size rule a snapshot writes at most four times
/// the log written since the last one (LogCabin snapshots by log size the same way).
/// Why a quarter and not more: the log since the snapshot counts in the member's size on
/// disk, which the space quota limits, so it stays within a quarter of the state.
pub fn snapshot_due(
    entries: u64,
    snapshot_count: u64,
    log_bytes: u64,
    snapshot_bytes: u64,
) -> bool {
    entries >= snapshot_count
        && (snapshot_bytes < LARGE_SNAPSHOT_BYTES
            || log_bytes.saturating_mul(SNAPSHOT_LOG_FRACTION) >= snapshot_bytes)
}

impl NodeCore {
    /// Measures this member's data on disk again (the snapshot file plus the log entries
    /// not yet purged) and returns it.
    pub fn measure_db_size(&self) -> u64 {
        let size = self.applied.read().snapshot_bytes + self.log.live_bytes();
        self.db_size
            .store(size, std::sync::atomic::Ordering::Relaxed);
        size
    }

    /// Asks raft for a snapshot when one is due by `snapshot_due`; the ticker calls it
    /// on every member (raft's own policy is off: it counts entries only).
    pub async fn snapshot_if_due(&self) {
        let metrics = self.metrics();
        let applied = metrics.last_applied.map_or(0, |l| l.index);
        let snapshot = metrics.snapshot.map_or(0, |l| l.index);
        let snapshot_bytes = self.applied.read().snapshot_bytes;
        if !snapshot_due(
            applied.saturating_sub(snapshot),
            self.config.snapshot_count,
            self.log.live_bytes(),
            snapshot_bytes,
        ) {
            return;
        }
        {
            let mut asked = self
                .snapshot_asked
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let now = tokio::time::Instant::now();
            // Raft ignores a request while it builds; ask again only if the snapshot
            // asked for has not come in a long while (a failed build).
            if let Some((at_index, when)) = *asked
                && at_index == snapshot
                && now.duration_since(when) < SNAPSHOT_ASK_AGAIN
            {
                return;
            }
            *asked = Some((snapshot, now));
        }
        if let Err(e) = self.raft.trigger().snapshot().await {
            tracing::warn!("could not ask raft for a snapshot: {e}");
        }
    }

    /// This member's data on disk, as last measured (etcd's db size).
    pub fn db_size(&self) -> u64 {
        self.db_size.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The raised alarms, by member.
    pub fn alarms(&self) -> Vec<(NodeId, AlarmKind)> {
        self.applied.read().sm.alarms().collect()
    }

    /// Raises or clears `alarm` for `member` through the log; returns once applied here.
    pub async fn set_alarm(
        &self,
        activate: bool,
        member: NodeId,
        alarm: AlarmKind,
    ) -> Result<(), ProposeError> {
        let command = Command::Alarm {
            activate,
            member,
            alarm,
        };
        self.propose(command).await.map(|_| ())
    }

    /// Takes a snapshot of the applied state now (compacting the log before it) and
    /// waits until one covers at least `index`.
    pub async fn snapshot_now(&self, index: u64) -> Result<(), String> {
        let covered =
            |m: &RaftMetrics<NodeId, Member>| m.snapshot.is_some_and(|s| s.index >= index);
        if covered(&self.metrics()) {
            return Ok(());
        }
        self.raft
            .trigger()
            .snapshot()
            .await
            .map_err(|e| e.to_string())?;
        let mut metrics = self.raft.metrics();
        // Covered, and the log before it purged: then the space is given back.
        let wait = metrics
            .wait_for(|m| covered(m) && m.purged.map(|p| p.index) >= m.snapshot.map(|s| s.index));
        let result = match tokio::time::timeout(self.config.request_timeout, wait).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err("raft stopped".to_string()),
            Err(_) => Err("the snapshot did not complete in time".to_string()),
        };
        self.measure_db_size();
        result
    }

    /// Fails with `Timeout` every waiter whose deadline is past `now`: retries joined to
    /// an in-flight original, and reads waiting for the applied index.
    pub(crate) fn expire_waiters(&self, now: Instant) {
        self.in_flight.expire(now);
        self.fanouts.expire(now);
        self.applied.waiters().expire(now);
    }

    /// Fails everything waiting on this node with `err` (leadership lost: the clients go
    /// to the new leader at once instead of waiting for a timeout). Returns how many.
    pub(crate) fn fail_waiters(&self, err: ProposeError) -> usize {
        self.in_flight.fail_all(err.clone()) + self.applied.waiters().fail_all(err)
    }

    /// On the leader, proposes a `Tick` when a session or lease is due by this member's
    /// clock (traffic would have moved cluster time past it otherwise).
    pub(crate) async fn tick_if_due(&self) {
        if self.leader() != Some(self.id) {
            return;
        }
        let due = self
            .applied
            .read()
            .sm
            .next_deadline()
            .is_some_and(|d| d <= self.config.clock.now_ms());
        if due && let Err(e) = self.propose_local(Command::Tick).await {
            tracing::debug!("tick: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{LARGE_SNAPSHOT_BYTES, snapshot_due};

    #[test]
    fn small_states_snapshot_by_entries_large_ones_also_by_log_size() {
        const MB: u64 = 1 << 20;
        // etcd's rule while the last snapshot is small: entries alone.
        assert!(!snapshot_due(9_999, 10_000, 0, MB));
        assert!(snapshot_due(10_000, 10_000, 0, MB));
        assert!(snapshot_due(10_000, 10_000, 0, 0));
        // A 1 GiB snapshot waits for 256 MiB of log, however many entries.
        let big = 1024 * MB;
        assert!(!snapshot_due(10_000, 10_000, 3 * MB, big));
        assert!(!snapshot_due(5_000_000, 10_000, 256 * MB - 1, big));
        assert!(snapshot_due(5_000_000, 10_000, 256 * MB, big));
        // ... and still needs the entries.
        assert!(!snapshot_due(9_999, 10_000, 2 * big, big));
        // The line between the two rules.
        assert!(snapshot_due(10_000, 10_000, 0, LARGE_SNAPSHOT_BYTES - 1));
        assert!(!snapshot_due(10_000, 10_000, 0, LARGE_SNAPSHOT_BYTES));
    }
}
