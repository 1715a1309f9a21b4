//! The driver's side of the simulated world between steps: which hosts are up, and the
//! faults of the schedule applied to the network, the disks, the clocks and the members.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use oncekv_server::request_path::NodeCore;
use rand::rngs::StdRng;

use super::hosts::{client_name, lock, locker_name, node_name};
use crate::disk::MemDisk;
use crate::duplicate::Duplicates;
use crate::faults::Action;
use crate::membership;
use crate::net::Net;
use crate::trace::Trace;
use crate::trap::CommitTrap;

/// The driver's handle on the simulated world between steps.
pub(super) struct World {
    pub(super) nodes: usize,
    pub(super) clients: usize,
    pub(super) lockers: usize,
    pub(super) crashed: Vec<bool>,
    /// Nodes removed and not yet started again to join: a heal leaves them down.
    pub(super) replacing: Vec<bool>,
    /// Whether the admin host exists (the schedule replaces a member).
    pub(super) admin: bool,
    pub(super) joining: Vec<Arc<std::sync::atomic::AtomicBool>>,
    /// Per node: set to ask it for a clean stop; cleared before it starts again.
    pub(super) stops: Vec<tokio::sync::watch::Sender<bool>>,
    /// Nodes stopped cleanly and not started again.
    pub(super) stopped: Vec<bool>,
    /// Replacements for the admin host to carry out.
    pub(super) jobs: Arc<Mutex<Vec<membership::Replacement>>>,
    pub(super) requests: membership::Requests,
    pub(super) disks: Vec<Arc<MemDisk>>,
    pub(super) offsets: Vec<Arc<AtomicI64>>,
    pub(super) cores: Arc<Mutex<Vec<Option<Arc<NodeCore>>>>>,
    pub(super) trace: Trace,
    pub(super) net: Net,
    pub(super) duplicates: Arc<Duplicates>,
    pub(super) trap: Arc<CommitTrap>,
    /// Actions applied, by kind.
    pub(super) applied: BTreeMap<&'static str, u64>,
}

impl World {
    pub(super) fn leader(&self) -> Option<usize> {
        let cores = lock(&self.cores);
        cores
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.as_ref().map(|c| (i, c)))
            .filter(|(i, c)| !self.crashed[*i] && c.leader() == Some(c.id()))
            .max_by_key(|(_, c)| c.term())
            .map(|(i, _)| i)
    }

    pub(super) fn term_of(&self, n: usize) -> u64 {
        lock(&self.cores)
            .get(n)
            .and_then(|c| c.as_ref().map(|c| c.term()))
            .unwrap_or(0)
    }

    fn all_hosts(&self) -> Vec<String> {
        (0..self.nodes)
            .map(node_name)
            .chain((0..self.clients).map(client_name))
            .chain((0..self.lockers).map(locker_name))
            .chain(self.admin.then(|| membership::ADMIN.to_string()))
            .collect()
    }

    /// Does what the admin host asked of the driver: take a removed node down and wipe
    /// its disk, or start it again to join.
    pub(super) fn serve_admin(&mut self, sim: &mut turmoil::Sim<'_>, rng: &mut StdRng) {
        use membership::Phase;
        let mut requests = lock(&self.requests);
        for (node, phase) in requests.iter_mut() {
            let n = *node;
            let now = sim.elapsed().as_millis();
            match phase {
                Phase::WipeRequested => {
                    if !self.crashed[n] {
                        sim.crash(node_name(n));
                        self.disks[n].crash(rng);
                        self.crashed[n] = true;
                    }
                    self.disks[n].wipe();
                    self.replacing[n] = true;
                    self.joining[n].store(true, Ordering::Release);
                    if let Some(slot) = lock(&self.cores).get_mut(n) {
                        *slot = None;
                    }
                    self.trace.at(now, format!("n{n} taken down and wiped"));
                    *phase = Phase::Wiped;
                }
                Phase::StartRequested => {
                    self.stops[n].send_replace(false);
                    sim.bounce(node_name(n));
                    self.crashed[n] = false;
                    self.replacing[n] = false;
                    self.trace.at(now, format!("n{n} starting to join"));
                    *phase = Phase::Started;
                }
                Phase::Wiped | Phase::Started => {}
            }
        }
    }

    /// Crashes node `n` (its unsynced writes are lost); `None` if it is down already.
    /// Returns the bytes lost.
    fn crash(&mut self, sim: &mut turmoil::Sim<'_>, n: usize, rng: &mut StdRng) -> Option<u64> {
        if self.crashed[n] {
            return None;
        }
        sim.crash(node_name(n));
        let lost = self.disks[n].crash(rng);
        self.crashed[n] = true;
        if let Some(slot) = lock(&self.cores).get_mut(n) {
            *slot = None;
        }
        Some(lost)
    }

    pub(super) fn apply(&mut self, sim: &mut turmoil::Sim<'_>, action: &Action, rng: &mut StdRng) {
        let now = sim.elapsed().as_millis();
        let mut note = format!("fault {action:?}");
        *self.applied.entry(action.kind()).or_default() += 1;
        match action {
            Action::Partition { side, drop } => {
                for &a in side {
                    for b in (0..self.nodes).filter(|b| !side.contains(b)) {
                        if *drop {
                            self.net.cut_both(&node_name(a), &node_name(b));
                        } else {
                            sim.hold(node_name(a), node_name(b));
                        }
                    }
                }
            }
            Action::OneWay { from, to } => self.net.cut(&node_name(*from), &node_name(*to)),
            Action::IsolateLeader => match self.leader() {
                Some(l) => {
                    note = format!("fault IsolateLeader n{l}");
                    // Cut between nodes; held towards clients, whose replies arrive late.
                    for n in (0..self.nodes).filter(|n| *n != l) {
                        self.net.cut_both(&node_name(l), &node_name(n));
                    }
                    for c in 0..self.clients {
                        sim.hold(node_name(l), client_name(c));
                    }
                }
                None => note = "fault IsolateLeader (no leader)".to_string(),
            },
            Action::Hold { a, b } => sim.hold(node_name(*a), node_name(*b)),
            Action::Lossy { rate_per_mille } => self.net.set_loss(*rate_per_mille),
            Action::BlackHole {
                node,
                other,
                client,
            } => {
                let other = if *client {
                    client_name(*other)
                } else {
                    node_name(*other)
                };
                self.net.black_hole(&node_name(*node), &other);
            }
            Action::Duplicate { rate_per_mille } => self.duplicates.set_rate(*rate_per_mille),
            Action::IsolateLeaderAtCommit { hold_ms } => self.trap.arm(*hold_ms),
            Action::Crash { node } => {
                if let Some(lost) = self.crash(sim, *node, rng) {
                    note = format!("fault Crash n{node}, lost {lost} unsynced bytes");
                }
            }
            Action::SlowLeaderDisk { sync_ms } => match self.leader() {
                Some(l) => {
                    self.disks[l].set_sync_delay(*sync_ms);
                    note = format!("fault SlowLeaderDisk n{l}, {sync_ms} ms per log write");
                }
                None => note = "fault SlowLeaderDisk (no leader)".to_string(),
            },
            Action::CrashLeader => match self.leader() {
                Some(l) => {
                    if let Some(lost) = self.crash(sim, l, rng) {
                        note = format!("fault CrashLeader n{l}, lost {lost} unsynced bytes");
                    }
                }
                None => note = "fault CrashLeader (no leader)".to_string(),
            },
            Action::StopLeader => match self.leader() {
                Some(l) => {
                    // Down from now on for the driver (a crash meanwhile is a no-op); the
                    // node itself halts over the next steps and ends.
                    self.stops[l].send_replace(true);
                    self.stopped[l] = true;
                    self.crashed[l] = true;
                    if let Some(slot) = lock(&self.cores).get_mut(l) {
                        *slot = None;
                    }
                    note = format!("fault StopLeader n{l}");
                }
                None => note = "fault StopLeader (no leader)".to_string(),
            },
            Action::ClockJump { node, by_ms } => {
                self.offsets[*node].fetch_add(*by_ms, Ordering::Relaxed);
            }
            Action::PauseClient { client } => {
                // Locker i shares a host with client i: a pause stops both, so a holder's
                // keep-alives stop too and its lock can be lost while it still believes
                // it holds it (what fencing tokens are for).
                let locker = (*client < self.lockers).then(|| locker_name(*client));
                for n in 0..self.nodes {
                    sim.hold(client_name(*client), node_name(n));
                    if let Some(l) = &locker {
                        sim.hold(l.as_str(), node_name(n));
                    }
                }
            }
            Action::ReplaceMember { leader } => {
                let target = if *leader {
                    self.leader()
                } else {
                    let leader = self.leader();
                    (0..self.nodes)
                        .find(|n| Some(*n) != leader && !self.crashed[*n] && !self.replacing[*n])
                };
                let id = target.and_then(|n| {
                    lock(&self.cores)
                        .get(n)
                        .and_then(|c| c.as_ref().map(|c| c.id()))
                });
                match (target, id) {
                    (Some(node), Some(id)) if !self.replacing.iter().any(|r| *r) => {
                        lock(&self.jobs).push(membership::Replacement { node, id });
                        note = format!("fault ReplaceMember n{node} ({id:x})");
                    }
                    _ => note = "fault ReplaceMember (no member to replace now)".to_string(),
                }
            }
            Action::Heal => {
                self.net.heal();
                for disk in &self.disks {
                    disk.set_sync_delay(0);
                }
                self.duplicates.set_rate(0);
                self.trap.disarm();
                let hosts = self.all_hosts();
                for (i, a) in hosts.iter().enumerate() {
                    for b in &hosts[i + 1..] {
                        sim.release(a.as_str(), b.as_str());
                    }
                }
                for n in 0..self.nodes {
                    if self.stopped[n] {
                        // Stopped cleanly, then the machine loses power: whatever the
                        // stop left unsynced goes (nothing, if it closed the log as it
                        // should; then the log's clean-stop mark is there too).
                        self.stopped[n] = false;
                        if !self.crashed[n] || self.replacing[n] {
                            continue;
                        }
                        let lost = self.disks[n].crash(rng);
                        note.push_str(&format!("; n{n}'s disk lost {lost} unsynced bytes"));
                    }
                    if self.crashed[n] && !self.replacing[n] {
                        self.stops[n].send_replace(false);
                        sim.bounce(node_name(n));
                        self.crashed[n] = false;
                    }
                }
            }
        }
        self.trace.at(now, note);
    }
}
