//! The commit trap: isolate the leader at the exact moment it has applied a tracked
//! write, before its reply can reach the client. The client must then retry against a new
//! leader and get the response saved in the session table, not a second execution.
//!
//! The fault schedule arms the trap; the leader's [`crate::replicas::ReplicaObserver`]
//! springs it from inside the apply (the reply is built only after the apply returns), by
//! cutting every link of the leader in [`Net`]; the driver heals it after a while.

use std::sync::{Arc, Mutex, MutexGuard};

use oncekv_server::request_path::NodeCore;

use crate::net::Net;

/// Where the trap fired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sprung {
    pub node: usize,
    pub client_id: u64,
    pub seq: u64,
    pub index: u64,
    /// How long the leader stays cut off (milliseconds).
    pub hold_ms: u64,
}

#[derive(Debug, Default)]
struct State {
    /// Armed with how long the isolation will last.
    armed: Option<u64>,
    /// Sprung, not yet picked up by the driver.
    sprung: Vec<Sprung>,
    fired: u64,
}

/// One run's trap, shared by every node's observer and the driver.
#[derive(Debug)]
pub struct CommitTrap {
    state: Mutex<State>,
    net: Net,
    nodes: Vec<String>,
    clients: Vec<String>,
    cores: Arc<Mutex<Vec<Option<Arc<NodeCore>>>>>,
}

impl CommitTrap {
    pub fn new(
        net: Net,
        nodes: Vec<String>,
        clients: Vec<String>,
        cores: Arc<Mutex<Vec<Option<Arc<NodeCore>>>>>,
    ) -> CommitTrap {
        CommitTrap {
            state: Mutex::default(),
            net,
            nodes,
            clients,
            cores,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next tracked write the leader applies isolates it for `hold_ms`.
    pub fn arm(&self, hold_ms: u64) {
        self.lock().armed = Some(hold_ms);
    }

    pub fn disarm(&self) {
        self.lock().armed = None;
    }

    /// Times the trap fired.
    pub fn fired(&self) -> u64 {
        self.lock().fired
    }

    /// What fired since the last call (for the driver to trace and heal).
    pub fn take_sprung(&self) -> Vec<Sprung> {
        std::mem::take(&mut self.lock().sprung)
    }

    fn leads(&self, node: usize) -> bool {
        let cores = self.cores.lock().unwrap_or_else(|p| p.into_inner());
        cores
            .get(node)
            .and_then(|c| c.as_ref())
            .is_some_and(|c| c.leader() == Some(c.id()))
    }

    /// Called by `node`'s observer with the tracked commands it just executed
    /// (`(index, client_id, seq)`): fires if armed and `node` leads.
    pub fn executed(&self, node: usize, executed: &[(u64, u64, u64)]) {
        let Some(&(index, client_id, seq)) = executed.last() else {
            return;
        };
        if self.lock().armed.is_none() || !self.leads(node) {
            return;
        }
        let mut s = self.lock();
        let Some(hold_ms) = s.armed.take() else {
            return;
        };
        let leader = &self.nodes[node];
        for other in self.nodes.iter().chain(&self.clients) {
            if other != leader {
                self.net.cut_both(leader, other);
            }
        }
        s.fired += 1;
        s.sprung.push(Sprung {
            node,
            client_id,
            seq,
            index,
            hold_ms,
        });
    }
}
