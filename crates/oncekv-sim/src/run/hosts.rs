//! The simulated hosts: their names, the program a node's host runs (a real oncekv node
//! on the simulated network, disk and clock), and the poison-tolerant lock the driver
//! shares with them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncekv_core::Settings;
use oncekv_server::request_path::NodeCore;
use oncekv_server::runtime::Clock;
use oncekv_server::transport::NodeTransport;
use oncekv_server::{Member, Node, NodeConfig};

use crate::disk::MemDisk;
use crate::duplicate::Duplicates;
use crate::net::{CLIENT_PORT, Net, PEER_PORT};
use crate::replicas::ReplicaObserver;
use crate::trace::Trace;

/// Cluster time starts here (a fixed epoch, so traces do not depend on the wall clock).
pub(super) const EPOCH_MS: i64 = 1_700_000_000_000;

/// Everything a node's host needs, cloned into its (re)start closure.
#[derive(Clone)]
pub(super) struct NodeCtx {
    pub(super) index: usize,
    pub(super) members: Vec<Member>,
    pub(super) disk: Arc<MemDisk>,
    pub(super) observer: Arc<ReplicaObserver>,
    pub(super) clock_offset: Arc<AtomicI64>,
    pub(super) cores: Arc<Mutex<Vec<Option<Arc<NodeCore>>>>>,
    pub(super) snapshot_count: u64,
    /// Leader-lease reads on every member (odd seeds): the linearizability checker then
    /// covers reads served under a lease, across crashes and partitions.
    pub(super) lease_reads: bool,
    /// [`Breaks::durability_gates`].
    pub(super) break_gates: bool,
    pub(super) settings: Settings,
    pub(super) trace: Trace,
    pub(super) net: Net,
    pub(super) duplicates: Arc<Duplicates>,
    /// Set while the node was wiped and added back: its next start joins the running
    /// cluster instead of founding one.
    pub(super) joining: Arc<std::sync::atomic::AtomicBool>,
    /// Turns true when the driver stops the node cleanly ([`Action::StopLeader`]).
    pub(super) stop: tokio::sync::watch::Receiver<bool>,
}

pub(super) fn node_name(i: usize) -> String {
    format!("n{i}")
}

pub(super) fn client_name(c: usize) -> String {
    format!("c{c}")
}

pub(super) fn locker_name(l: usize) -> String {
    format!("l{l}")
}

pub(super) async fn run_node(ctx: NodeCtx) -> turmoil::Result {
    let name = node_name(ctx.index);
    let ip = turmoil::lookup(name.as_str());
    let offset = ctx.clock_offset.clone();
    let clock = Clock::new(move || {
        let now = turmoil::sim_elapsed().map_or(0, |d| d.as_millis() as i64);
        (EPOCH_MS + now + offset.load(Ordering::Relaxed)).max(0) as u64
    });
    let mut config = NodeConfig::new(
        name.clone(),
        PathBuf::from(format!("/data/{name}")),
        SocketAddr::new(ip, CLIENT_PORT),
        SocketAddr::new(ip, PEER_PORT),
        ctx.members.clone(),
    );
    config.heartbeat_ms = 50;
    config.election_timeout_ms = 300;
    config.request_timeout = Duration::from_secs(2);
    config.snapshot_count = ctx.snapshot_count;
    config.leader_lease_reads = ctx.lease_reads;
    config.settings = ctx.settings;
    config.clock = clock;
    config.disk = ctx.disk.clone();
    config.observer = Some(ctx.observer.clone());
    config.break_durability_gates = ctx.break_gates;
    if ctx.joining.load(Ordering::Acquire) {
        config.initial_cluster_state = oncekv_server::config::ClusterState::Existing;
    }
    // A member joining a running cluster cannot start until the cluster lists it (the
    // admin's MemberAdd may not have committed yet): like a supervised process, it tries
    // again after a while. Any other start error is a failure of the run.
    let node = loop {
        let transport = NodeTransport {
            clients: ctx.net.listen(&name, CLIENT_PORT).await?,
            peers: ctx.net.listen(&name, PEER_PORT).await?,
            connector: ctx.net.connector(&name),
            duplicator: Some(ctx.duplicates.clone()),
        };
        match Node::start_with_transport(config.clone(), transport).await {
            Ok(node) => break node,
            Err(e @ oncekv_server::error::StartError::Join { .. }) => {
                ctx.trace.line(format!("{name} could not join yet: {e}"));
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(format!("{name} failed to start: {e}").into()),
        }
    };
    ctx.trace.line(format!("{name} started"));
    if let Some(slot) = lock(&ctx.cores).get_mut(ctx.index) {
        *slot = Some(node.core.clone());
    }
    // Runs until the driver asks for a clean stop, then stops as `oncekv dev` does on
    // SIGTERM (no hand-over) and ends the host's software; the repair starts it again.
    let mut stop = ctx.stop.clone();
    if stop.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
    node.halt().await;
    ctx.trace.line(format!("{name} stopped cleanly"));
    Ok(())
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
