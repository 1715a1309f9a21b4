//! The replica-side checkers, fed by every node's state machine as it applies entries
//! (through the server's [`ApplyObserver`] seam):
//!
//! - **exactly-once**: a tracked `(client, seq)` is executed at one log index only, on
//!   every replica (a replica re-applying the same index after a restart is the same
//!   execution; a second index is a second execution);
//! - **replica agreement**: equal state hashes at equal applied index, across replicas and
//!   across restarts of one replica;
//! - **expiry agreement**: a session or lease expires at the same log index everywhere;
//! - the state machine's own invariants (`validate`), every few entries.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use oncekv_core::{Expired, StateMachine};
use oncekv_server::sm_store::ApplyObserver;

use crate::trap::CommitTrap;

/// Validate the state machine's invariants every this many applied entries.
const VALIDATE_EVERY: u64 = 32;

/// What the replicas did, as far as the checkers care.
#[derive(Debug, Default)]
pub struct Replicas {
    /// Log index → (state hash after it, node that first reported it).
    hash_at: BTreeMap<u64, (u64, usize)>,
    /// `(client_id, seq)` → (index it was executed at, node that first reported it).
    executed_at: BTreeMap<(u64, u64), (u64, usize)>,
    /// `("session" | "lease", id)` → (index it expired at, node that first reported it).
    expired_at: BTreeMap<(&'static str, i64), (u64, usize)>,
    /// Highest applied index per node.
    pub applied: BTreeMap<usize, u64>,
    /// Entries observed (all replicas, re-applications included).
    pub observed: u64,
    pub executions: u64,
    pub expiries: u64,
    pub violations: Vec<String>,
    /// Subjects already reported, so one broken command or index is reported once.
    reported: std::collections::BTreeSet<String>,
}

impl Replicas {
    pub fn shared() -> Arc<Mutex<Replicas>> {
        Arc::default()
    }

    /// Distinct log indexes whose state hash was compared.
    pub fn hashed_indexes(&self) -> usize {
        self.hash_at.len()
    }

    fn violation(&mut self, subject: String, msg: String) {
        if self.reported.insert(subject) && self.violations.len() < 50 {
            self.violations.push(msg);
        }
    }

    /// Checks what `node` just applied; returns the tracked commands it executed
    /// (`(index, client_id, seq)`).
    fn record(&mut self, node: usize, sm: &mut StateMachine) -> Vec<(u64, u64, u64)> {
        let index = sm.applied_index();
        self.observed += 1;
        let applied = self.applied.entry(node).or_default();
        *applied = (*applied).max(index);

        let hash = sm.state_hash();
        match self.hash_at.get(&index) {
            Some(&(h, first)) if h != hash => self.violation(
                format!("hash {index}"),
                format!(
                    "replica agreement: n{node} has state hash {hash:016x} at index {index}, \
                 n{first} had {h:016x}"
                ),
            ),
            Some(_) => {}
            None => {
                self.hash_at.insert(index, (hash, node));
            }
        }

        let executed = std::mem::take(&mut sm.sim_probe().executed);
        for &(at, client, seq) in &executed {
            self.executions += 1;
            match self.executed_at.get(&(client, seq)) {
                Some(&(first_at, first)) if first_at != at => self.violation(
                    format!("exec {client} {seq}"),
                    format!(
                        "exactly-once: (client {client}, seq {seq}) executed at index {at} on \
                     n{node}, and at index {first_at} on n{first}"
                    ),
                ),
                Some(_) => {}
                None => {
                    self.executed_at.insert((client, seq), (at, node));
                }
            }
        }

        for e in sm.take_expired() {
            self.expiries += 1;
            let (key, at) = match e {
                Expired::Session { index, client_id } => (("session", client_id as i64), index),
                Expired::Lease { index, id } => (("lease", id), index),
            };
            match self.expired_at.get(&key) {
                Some(&(first_at, first)) if first_at != at => self.violation(
                    format!("expiry {} {}", key.0, key.1),
                    format!(
                        "expiry agreement: {} {} expired at index {at} on n{node}, at index \
                     {first_at} on n{first}",
                        key.0, key.1
                    ),
                ),
                Some(_) => {}
                None => {
                    self.expired_at.insert(key, (at, node));
                }
            }
        }

        if index.is_multiple_of(VALIDATE_EVERY)
            && let Err(e) = sm.validate()
        {
            self.violation(
                format!("invariant n{node}"),
                format!("invariant broken on n{node} at index {index}: {e}"),
            );
        }
        executed
    }
}

/// One node's observer: instruments its state machine and reports to [`Replicas`].
#[derive(Debug)]
pub struct ReplicaObserver {
    pub node: usize,
    pub replicas: Arc<Mutex<Replicas>>,
    pub break_dedup: bool,
    /// Springs on the leader's executions, if the run has one.
    pub trap: Option<Arc<CommitTrap>>,
}

impl ReplicaObserver {
    fn lock(&self) -> MutexGuard<'_, Replicas> {
        self.replicas.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl ApplyObserver for ReplicaObserver {
    fn prepare(&self, sm: &mut StateMachine) {
        sm.record_expiries(true);
        let probe = sm.sim_probe();
        probe.record_executed = true;
        probe.break_dedup = self.break_dedup;
    }

    fn applied(&self, sm: &mut StateMachine) {
        let executed = self.lock().record(self.node, sm);
        if let Some(trap) = &self.trap {
            trap.executed(self.node, &executed);
        }
    }
}
