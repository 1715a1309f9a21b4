//! The member's background tasks, each started by [`Node`](super::Node) and stopped
//! with it: the ticker (waiters' deadlines, sessions' and leases' `Tick`, snapshots), the
//! publication of its client URL, the watch for a fatal stop or its removal, and the
//! leadership watch (what an election changes here). Each sees the node only through a
//! trait that names what it needs of it. (The corruption checks are `fanout`'s.)

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::Stopped;
use crate::error::ProposeError;
use crate::forwarder::Identified;
use crate::request_path::NodeCore;
use crate::types::{Member, NodeId};

/// Raft's view of leader, vote and membership, which changes on elections and membership
/// changes only.
type ServerMetrics = openraft::metrics::RaftServerMetrics<NodeId, Member>;

/// What the ticker needs of the node: its period, and the chores it does every period.
pub(super) trait Upkeep {
    /// The heartbeat.
    fn period(&self) -> Duration;
    /// Fails the waiters whose deadline is before `now`.
    fn expire_waiters(&self, now: std::time::Instant);
    /// Measures the store's size for `endpoint status` and the quota.
    fn measure_db_size(&self);
    async fn snapshot_if_due(&self);
    /// On the leader: proposes a `Tick` when a session or lease is due.
    async fn tick_if_due(&self);
    /// Leaves a joint membership whose second half is due.
    fn finish_joint_membership(&self);
}

// On the `Arc`: finishing a joint membership spawns a task that keeps the node.
impl Upkeep for Arc<NodeCore> {
    fn period(&self) -> Duration {
        Duration::from_millis(self.config().heartbeat_ms.max(10))
    }

    fn expire_waiters(&self, now: std::time::Instant) {
        NodeCore::expire_waiters(self, now)
    }

    fn measure_db_size(&self) {
        NodeCore::measure_db_size(self);
    }

    async fn snapshot_if_due(&self) {
        NodeCore::snapshot_if_due(self).await
    }

    async fn tick_if_due(&self) {
        NodeCore::tick_if_due(self).await
    }

    fn finish_joint_membership(&self) {
        NodeCore::finish_joint_membership(self)
    }
}

/// Every heartbeat: fails the waiters past their deadline (on every member), and on the
/// leader proposes a `Tick` when a session or lease is due and no traffic has moved
/// cluster time past it. An idle cluster with nothing due writes nothing.
pub(super) async fn ticker(core: Arc<NodeCore>, stop: watch::Receiver<bool>) {
    tick_until_stopped(&core, stop).await
}

async fn tick_until_stopped(core: &impl Upkeep, mut stop: watch::Receiver<bool>) {
    let period = core.period();
    // Before the first period too: `endpoint status` right after start reports the size.
    core.measure_db_size();
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(period) => {}
        }
        core.expire_waiters(tokio::time::Instant::now().into_std());
        core.measure_db_size();
        core.snapshot_if_due().await;
        core.tick_if_due().await;
        core.finish_joint_membership();
    }
}

/// What publishing this member's client URL needs of the node.
pub(super) trait Publisher {
    /// This member's client URL as the formation membership gives it.
    fn own_client_url(&self) -> Option<String>;
    /// The client URL the membership in effect here records for this member (`None`:
    /// this member is not in it).
    fn recorded_client_url(&self) -> Option<String>;
    /// Whether that membership is still the formation's, written by this member itself.
    fn membership_is_initial(&self) -> bool;
    /// Whether a leader is known, and whether it is this member.
    fn leadership(&self) -> (bool, bool);
    fn is_published(&self) -> bool;
    fn mark_published(&self);
    /// Records `client_url` in raft's membership; true if that took an entry.
    async fn publish(&self, client_url: String) -> Result<bool, ProposeError>;
}

impl Publisher for NodeCore {
    fn own_client_url(&self) -> Option<String> {
        self.members().get(&self.id()).map(|m| m.client_url.clone())
    }

    fn recorded_client_url(&self) -> Option<String> {
        self.membership()
            .get(&self.id())
            .map(|m| m.client_url.clone())
    }

    fn membership_is_initial(&self) -> bool {
        NodeCore::membership_is_initial(self)
    }

    fn leadership(&self) -> (bool, bool) {
        let leader = self.leader();
        (leader.is_some(), leader == Some(self.id()))
    }

    fn is_published(&self) -> bool {
        NodeCore::is_published(self)
    }

    fn mark_published(&self) {
        NodeCore::mark_published(self)
    }

    async fn publish(&self, client_url: String) -> Result<bool, ProposeError> {
        NodeCore::publish(self, client_url).await
    }
}

/// Keeps this member's client URL in raft's replicated membership equal to its
/// configured one (the membership written at formation knows only each member's own), so
/// every member's MemberList names every member's client URLs. Checks every 100 ms until
/// the URL is published (see [`NodeCore::published`]), then once a second; a publish is
/// one membership entry, proposed only when the URL differs.
pub(super) async fn publish_client_url(core: Arc<NodeCore>, stop: watch::Receiver<bool>) {
    publish_until_stopped(&*core, stop).await
}

async fn publish_until_stopped(core: &impl Publisher, mut stop: watch::Receiver<bool>) {
    let Some(client_url) = core.own_client_url().filter(|u| !u.is_empty()) else {
        core.mark_published();
        return;
    };
    // The leader answered that its membership has this URL: with the formation
    // membership still in effect, no entry will come to make this member's view agree,
    // and none is needed (every member was formed knowing it).
    let mut confirmed = false;
    let mut wait = Duration::ZERO;
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = match core.is_published() {
            true => Duration::from_secs(1),
            false => Duration::from_millis(100),
        };
        let recorded = core.recorded_client_url();
        // Every member writes the formation membership itself, with only its own client
        // URL, as log entry 0, which is never replicated: until a membership entry has
        // been committed after it, this member's view says nothing about the others'.
        let initial = core.membership_is_initial();
        let settled = !initial && recorded == Some(client_url.clone());
        // The leader's own view is the one its membership entries carry.
        let (has_leader, leading) = core.leadership();
        // Nothing to propose: the membership the leader has already names this URL.
        let published = settled || (initial && (leading || confirmed));
        if has_leader && published {
            core.mark_published();
        }
        if !has_leader || recorded.is_none() || published {
            continue;
        }
        match core.publish(client_url.clone()).await {
            Ok(true) => tracing::info!(%client_url, "published this member's client URL"),
            Ok(false) => confirmed = true,
            Err(e) => tracing::debug!(%client_url, "publishing the client URL failed: {e}"),
        }
    }
}

/// Watches raft for a fatal stop (its core task ended with an error) or this member's
/// removal, and reports it.
///
/// A removal is final once a configuration without this member is committed. The
/// leader stops replicating to a removed member once that configuration is appended, so
/// the member may never learn of it itself: it only stops hearing from a leader. So when
/// the configuration in effect here leaves this member out but is not applied, or when
/// this member knows no leader, it asks the other members of that configuration, whose
/// applied state says whether a removal is committed (as etcd's peers tell a removed
/// member that contacts them).
pub(super) async fn fatal_watch(
    core: Arc<NodeCore>,
    fatal: watch::Sender<Option<Stopped>>,
    stop: watch::Receiver<bool>,
) {
    watch_for_the_end(&*core, fatal, stop).await
}

/// What watching for a fatal stop or a removal needs of the node.
pub(super) trait Liveness {
    fn id(&self) -> NodeId;
    /// The member's name, for the log.
    fn name(&self) -> String;
    fn own_peer_url(&self) -> String;
    fn server_metrics(&self) -> watch::Receiver<ServerMetrics>;
    fn metrics(&self) -> watch::Receiver<openraft::RaftMetrics<NodeId, Member>>;
    /// Asks the member at peer `url` whether `own_peer_url` is still a member.
    async fn identify(&self, url: &str, own_peer_url: &str) -> Result<Identified, String>;
}

impl Liveness for NodeCore {
    fn id(&self) -> NodeId {
        NodeCore::id(self)
    }

    fn name(&self) -> String {
        self.config().name.clone()
    }

    fn own_peer_url(&self) -> String {
        self.members()
            .get(&self.id())
            .map(|m| m.peer_url.clone())
            .unwrap_or_default()
    }

    fn server_metrics(&self) -> watch::Receiver<ServerMetrics> {
        self.raft().server_metrics()
    }

    fn metrics(&self) -> watch::Receiver<openraft::RaftMetrics<NodeId, Member>> {
        self.raft().metrics()
    }

    async fn identify(&self, url: &str, own_peer_url: &str) -> Result<Identified, String> {
        self.forwarder().identify(url, own_peer_url).await
    }
}

async fn watch_for_the_end(
    core: &impl Liveness,
    fatal: watch::Sender<Option<Stopped>>,
    mut stop: watch::Receiver<bool>,
) {
    // Woken by the server metrics (leader, vote, membership), which change on elections
    // and membership changes only; the full metrics change at every append and apply,
    // which under load woke this task (and `leadership_watch`) for nothing. The full
    // metrics are read, never waited on: raft records a fatal error there before its core
    // ends, and the end closes the server metrics channel.
    let mut server = core.server_metrics();
    let metrics = core.metrics();
    let own_peer_url = core.own_peer_url();
    let name = core.name();
    loop {
        let (verdict, ask) = {
            let s = server.borrow_and_update();
            let m = metrics.borrow();
            match &m.running_state {
                Err(e) => (Some(Stopped::Fatal(e.to_string())), Vec::new()),
                Ok(()) => {
                    let config = &s.membership_config;
                    // Possibly older than `s`: only a configuration that leaves this
                    // member out waits for it, and that case asks again every second.
                    let applied = m.last_applied.map_or(0, |l| l.index);
                    let left_out = config.log_id().is_some_and(|l| l.index > 0)
                        && config.membership().get_node(&core.id()).is_none();
                    let committed = config.log_id().is_some_and(|l| l.index <= applied);
                    let leaderless =
                        s.current_leader.is_none() && config.log_id().is_some_and(|l| l.index > 0);
                    if left_out && committed {
                        (Some(Stopped::Removed), Vec::new())
                    } else if left_out || leaderless {
                        let urls = config
                            .membership()
                            .nodes()
                            .map(|(_, n)| n.peer_url.clone())
                            .filter(|u| *u != own_peer_url)
                            .collect();
                        (None, urls)
                    } else {
                        (None, Vec::new())
                    }
                }
            }
        };
        let mut verdict = verdict;
        for url in &ask {
            let answer = core.identify(url, &own_peer_url).await;
            if answer == Ok(Identified::NotAMember) {
                verdict = Some(Stopped::Removed);
                break;
            }
        }
        if let Some(verdict) = verdict {
            match &verdict {
                Stopped::Fatal(e) => {
                    tracing::error!(%name, "raft stopped: {e}")
                }
                Stopped::Removed => tracing::warn!(
                    %name,
                    "this member has been permanently removed from the cluster"
                ),
            }
            let _ = fatal.send(Some(verdict));
            return;
        }
        // Asking again in a while if nothing changes meanwhile.
        let recheck = async {
            if ask.is_empty() {
                std::future::pending::<()>().await
            } else {
                tokio::time::sleep(Duration::from_secs(1)).await
            }
        };
        tokio::select! {
            _ = stop.changed() => return,
            _ = recheck => {}
            changed = server.changed() => if changed.is_err() {
                if !*stop.borrow() {
                    let reason = match &metrics.borrow().running_state {
                        Err(e) => e.to_string(),
                        Ok(()) => "raft stopped unexpectedly".to_string(),
                    };
                    let _ = fatal.send(Some(Stopped::Fatal(reason)));
                }
                return;
            },
        }
    }
}

/// When this node stops leading, everything waiting on it fails with `NotLeader` so that
/// clients go to the new leader at once instead of waiting for a timeout.
pub(super) async fn leadership_watch(core: Arc<NodeCore>, stop: watch::Receiver<bool>) {
    follow_leadership(&*core, stop).await
}

/// What following elections needs of the node.
pub(super) trait Seat {
    fn id(&self) -> NodeId;
    fn server_metrics(&self) -> watch::Receiver<ServerMetrics>;
    /// Counts a change of leader (etcd's `leader_changes_seen_total`).
    fn leader_changed(&self);
    /// Whether this member leads, and since which term.
    fn set_leading(&self, term: Option<u64>);
    /// Fails every request waiting on this member's leadership; how many there were.
    fn fail_waiters(&self, leader: Option<NodeId>) -> usize;
}

impl Seat for NodeCore {
    fn id(&self) -> NodeId {
        NodeCore::id(self)
    }

    fn server_metrics(&self) -> watch::Receiver<ServerMetrics> {
        self.raft().server_metrics()
    }

    fn leader_changed(&self) {
        self.node_metrics().leader_changed();
    }

    fn set_leading(&self, term: Option<u64>) {
        NodeCore::set_leading(self, term)
    }

    fn fail_waiters(&self, leader: Option<NodeId>) -> usize {
        NodeCore::fail_waiters(self, ProposeError::NotLeader { leader })
    }
}

async fn follow_leadership(core: &impl Seat, mut stop: watch::Receiver<bool>) {
    // The server metrics change with the leader and the vote only (see `fatal_watch`).
    let mut server = core.server_metrics();
    let mut was_leader = false;
    // etcd counts every change of the leader this member sees, the first one included.
    let mut last_seen = None;
    loop {
        // A leader's term: its vote was stored (as a candidate's) before it was elected.
        let (leader, term) = {
            let s = server.borrow_and_update();
            (s.current_leader, s.vote.leader_id().get_term())
        };
        if leader != last_seen {
            core.leader_changed();
            // etcd's words for the same moments (raft.node at INFO).
            match (last_seen, leader) {
                (_, Some(l)) => {
                    tracing::info!(
                        "raft.node: {:x} elected leader {l:x} at term {term}",
                        core.id()
                    )
                }
                (Some(old), None) => {
                    tracing::info!(
                        "raft.node: {:x} lost leader {old:x} at term {term}",
                        core.id()
                    )
                }
                (None, None) => {}
            }
            last_seen = leader;
        }
        let is_leader = leader == Some(core.id());
        if is_leader != was_leader {
            core.set_leading(is_leader.then_some(term));
        }
        if was_leader && !is_leader {
            let n = core.fail_waiters(leader);
            tracing::info!(
                failed = n,
                ?leader,
                "lost leadership; failed waiting requests"
            );
        }
        was_leader = is_leader;
        tokio::select! {
            _ = stop.changed() => return,
            changed = server.changed() => if changed.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A member whose membership view and leadership the test sets. Publishing records the
    /// URL, as the leader's membership entry would once applied here.
    #[derive(Default)]
    struct Member {
        view: Mutex<(Option<String>, bool, bool)>,
        published: std::sync::atomic::AtomicBool,
        proposals: std::sync::atomic::AtomicUsize,
    }

    impl Member {
        fn view(&self) -> std::sync::MutexGuard<'_, (Option<String>, bool, bool)> {
            self.view.lock().unwrap_or_else(|p| p.into_inner())
        }
    }

    impl Publisher for Member {
        fn own_client_url(&self) -> Option<String> {
            Some("http://127.0.0.1:2379".into())
        }

        fn recorded_client_url(&self) -> Option<String> {
            self.view().0.clone()
        }

        fn membership_is_initial(&self) -> bool {
            false
        }

        fn leadership(&self) -> (bool, bool) {
            let view = self.view();
            (view.1, view.2)
        }

        fn is_published(&self) -> bool {
            self.published.load(std::sync::atomic::Ordering::SeqCst)
        }

        fn mark_published(&self) {
            self.published
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }

        async fn publish(&self, client_url: String) -> Result<bool, ProposeError> {
            self.proposals
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.view().0 = Some(client_url);
            Ok(true)
        }
    }

    // Without a leader nothing is proposed; once one is known, the URL is proposed once
    // and the member counts as published when its membership names it.
    #[tokio::test]
    async fn a_member_publishes_its_client_url_once_a_leader_is_known() {
        let member = Arc::new(Member::default());
        member.view().0 = Some(String::new());
        let (stop_tx, stop) = watch::channel(false);
        let running = {
            let member = member.clone();
            tokio::spawn(async move { publish_until_stopped(&*member, stop).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            member.proposals.load(std::sync::atomic::Ordering::SeqCst),
            0
        );
        assert!(!member.is_published(), "published without a leader");
        member.view().1 = true;
        for _ in 0..50 {
            if member.is_published() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(member.is_published(), "never published");
        assert_eq!(
            member.proposals.load(std::sync::atomic::Ordering::SeqCst),
            1
        );
        assert_eq!(
            member.recorded_client_url().as_deref(),
            Some("http://127.0.0.1:2379")
        );
        stop_tx.send_replace(true);
        running.await.expect("the task stops");
    }

    /// A member that records what the leadership watch tells it.
    struct Follower {
        metrics: watch::Receiver<ServerMetrics>,
        leading: Mutex<Vec<Option<u64>>>,
        changes: std::sync::atomic::AtomicUsize,
        failed: Mutex<Vec<Option<NodeId>>>,
    }

    impl Seat for Follower {
        fn id(&self) -> NodeId {
            1
        }

        fn server_metrics(&self) -> watch::Receiver<ServerMetrics> {
            self.metrics.clone()
        }

        fn leader_changed(&self) {
            self.changes
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }

        fn set_leading(&self, term: Option<u64>) {
            self.leading
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(term);
        }

        fn fail_waiters(&self, leader: Option<NodeId>) -> usize {
            self.failed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(leader);
            3
        }
    }

    fn led_by(leader: Option<NodeId>, term: u64) -> ServerMetrics {
        ServerMetrics {
            id: 1,
            vote: openraft::Vote::new_committed(term, leader.unwrap_or(2)),
            state: openraft::ServerState::Follower,
            current_leader: leader,
            membership_config: Arc::default(),
        }
    }

    // Winning an election marks this member leading since its term; losing it fails the
    // waiting requests once, naming the new leader, and every change of leader is counted.
    #[tokio::test]
    async fn losing_the_leadership_fails_the_waiting_requests_once() {
        let (metrics_tx, metrics) = watch::channel(led_by(None, 1));
        let member = Arc::new(Follower {
            metrics,
            leading: Mutex::default(),
            changes: Default::default(),
            failed: Mutex::default(),
        });
        let (stop_tx, stop) = watch::channel(false);
        let running = {
            let member = member.clone();
            tokio::spawn(async move { follow_leadership(&*member, stop).await })
        };
        let settle = || tokio::time::sleep(Duration::from_millis(50));
        settle().await;
        metrics_tx.send_replace(led_by(Some(1), 2));
        settle().await;
        metrics_tx.send_replace(led_by(Some(3), 3));
        settle().await;
        metrics_tx.send_replace(led_by(Some(3), 3));
        settle().await;
        stop_tx.send_replace(true);
        running.await.expect("the task stops");
        let leading = member
            .leading
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        assert_eq!(leading, vec![Some(2), None]);
        let failed = member
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        assert_eq!(failed, vec![Some(3)]);
        assert_eq!(member.changes.load(std::sync::atomic::Ordering::SeqCst), 2);
    }
}
