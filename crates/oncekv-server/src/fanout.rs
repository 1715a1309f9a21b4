//! Questions one member asks every member: the corruption check and cluster health.
//!
//! Both go through the request waiting list's quorum mode (`shared/DESIGN.md` section 3):
//! a waiter registered for `n` answers that completes when all `n` agree and fails as
//! soon as one disagrees. Each member's answer is fed in as it arrives; a member that
//! does not answer leaves the waiter to its deadline (a timeout, not a verdict).
//!
//! - **Corruption check** (etcd's, at start with `--initial-corrupt-check` and every
//!   `--corrupt-check-time`): every member's HashKV at this member's current revision. A
//!   member behind that revision waits until it has applied it. Disagreement raises the
//!   CORRUPT alarm, through the log, for each member outside the largest agreeing group
//!   (for this member when there is none), which stops reads and writes until disarmed.
//! - **Cluster health** (`/health?cluster`): every member's own health (a leader, no
//!   alarm, a linearizable read), as `etcdctl endpoint health --cluster` reports it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use oncekv_core::AlarmKind;
use oncekv_core::waiting_list::{WaitError, WaitingList};

use crate::request_path::NodeCore;
use crate::types::NodeId;

/// The quorum waiters a fan-out registers: one per question, keyed by a fresh number,
/// answered by each member's reply (as text).
pub(crate) type Fanouts = WaitingList<u64, String, String>;

/// What asking every member needs of this member: who it is, who the members are, and
/// where the answers are collected.
pub(crate) trait Fleet: Send + Sync + 'static {
    fn id(&self) -> NodeId;
    /// Every member of the configuration in effect, with its peer URL.
    fn member_urls(&self) -> Vec<(NodeId, String)>;
    /// A fresh key for one fan-out, and the list its waiter registers in.
    fn new_fanout(&self) -> (u64, &Fanouts);
}

/// What the corruption check needs besides: the revision to compare at, each member's
/// HashKV there, and the alarm. Nothing else of the node.
pub(crate) trait HashCheck: Fleet {
    /// This member's current revision, where the check compares.
    fn revision(&self) -> i64;
    /// This member's own HashKV at `revision`.
    fn own_hash(&self, revision: i64) -> Result<u32, String>;
    /// The member at peer `url`'s HashKV at `revision` (it waits until it has applied it).
    fn hash_of(
        &self,
        url: String,
        revision: i64,
    ) -> impl Future<Output = Result<u32, String>> + Send;
    /// How long the members get to answer.
    fn answer_timeout(&self) -> Duration;
    /// Raises CORRUPT for `member`, through the log.
    fn raise_corrupt(&self, member: NodeId) -> impl Future<Output = Result<(), String>> + Send;
    /// Resolves once this member has a leader and has caught up with it.
    fn caught_up(&self) -> impl Future<Output = ()> + Send;
}

impl Fleet for NodeCore {
    fn id(&self) -> NodeId {
        NodeCore::id(self)
    }

    fn member_urls(&self) -> Vec<(NodeId, String)> {
        self.membership()
            .into_iter()
            .map(|(id, m)| (id, m.peer_url))
            .collect()
    }

    fn new_fanout(&self) -> (u64, &Fanouts) {
        NodeCore::new_fanout(self)
    }
}

impl HashCheck for NodeCore {
    fn revision(&self) -> i64 {
        self.applied().read().sm.revision()
    }

    fn own_hash(&self, revision: i64) -> Result<u32, String> {
        hash_kv(self, revision)
            .map(|(hash, _, _)| hash)
            .map_err(|e| e.to_string())
    }

    async fn hash_of(&self, url: String, revision: i64) -> Result<u32, String> {
        self.forwarder().hash_kv_at(&url, revision).await
    }

    fn answer_timeout(&self) -> Duration {
        self.config().request_timeout
    }

    async fn raise_corrupt(&self, member: NodeId) -> Result<(), String> {
        self.set_alarm(true, member, AlarmKind::Corrupt)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn caught_up(&self) -> impl Future<Output = ()> + Send {
        NodeCore::caught_up(self)
    }
}

/// What a corruption check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckOutcome {
    /// Every member has this HashKV at the revision.
    Consistent { revision: i64, hash: u32 },
    /// Members disagree; these were alarmed.
    Corrupt {
        revision: i64,
        hashes: BTreeMap<NodeId, u32>,
        alarmed: Vec<NodeId>,
    },
    /// Not every member answered in time: nothing can be concluded.
    Incomplete {
        revision: i64,
        answered: usize,
        members: usize,
    },
}

/// A member's own health, as `/health` decides it: `Ok` or the reason.
pub async fn own_health(core: &NodeCore) -> Result<(), String> {
    if let Some((_, alarm)) = core.alarms().first() {
        return Err(format!("ALARM {}", crate::compat::alarm_name(*alarm)));
    }
    linearizable_read(core).await
}

/// How long a health check waits for a linearizable read, as etcd's.
const HEALTH_READ_TIMEOUT: Duration = Duration::from_secs(1);

/// What keeps this member from serving a linearizable read now, if anything (`/readyz`'s
/// check, and part of [`own_health`]).
pub async fn linearizable_read(core: &NodeCore) -> Result<(), String> {
    if core.leader().is_none() {
        return Err("RAFT NO LEADER".to_string());
    }
    match tokio::time::timeout(HEALTH_READ_TIMEOUT, core.read_index()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("QGET ERROR: {e}")),
        Err(_) => Err("QGET ERROR: timed out".to_string()),
    }
}

/// HashKV's digest of the keys as of `revision` (0: the newest), with the compacted
/// revision: a CRC-32 over every key's name, value, revisions, version and lease, in key
/// order. Members that applied the same history give the same hash at the same revision,
/// whatever else (sessions, timing) differs.
pub fn hash_kv(node: &NodeCore, revision: i64) -> Result<(u32, i64, i64), crate::error::ApiError> {
    let req = oncekv_core::RangeRequest {
        range: oncekv_core::KeyRange {
            key: vec![0].into(),
            range_end: vec![0].into(),
        },
        revision,
        ..Default::default()
    };
    let inner = node.applied().read();
    let (current, resp) = inner.sm.range(&req)?;
    let compacted = inner.sm.compacted_revision();
    drop(inner);
    let mut h = crc32fast::Hasher::new();
    for kv in &resp.kvs {
        h.update(&(kv.key.len() as u64).to_le_bytes());
        h.update(&kv.key);
        h.update(&(kv.value.len() as u64).to_le_bytes());
        h.update(&kv.value);
        for n in [kv.create_revision, kv.mod_revision, kv.version, kv.lease] {
            h.update(&n.to_le_bytes());
        }
    }
    let at = if revision > 0 { revision } else { current };
    Ok((h.finalize(), compacted, at))
}

/// HashKV at `revision`, once this member has applied it (within the request
/// timeout).
pub(crate) async fn hash_kv_when_applied(core: &NodeCore, revision: i64) -> Result<u32, String> {
    let mut applied = core.applied().subscribe_revision();
    let reached = applied.wait_for(|r| *r >= revision);
    match tokio::time::timeout(core.config().request_timeout, reached).await {
        Ok(Ok(_)) => {}
        _ => return Err(format!("revision {revision} not applied in time")),
    }
    hash_kv(core, revision)
        .map(|(hash, _, _)| hash)
        .map_err(|e| e.to_string())
}

/// Asks every member `ask` (this member answers itself with `own`), feeding each answer
/// into one quorum waiter that needs all of them to agree. Returns the waiter's verdict
/// and every answer received, by member.
async fn ask_all<C, F, Fut>(
    core: &Arc<C>,
    own: String,
    ask: F,
    timeout: Duration,
) -> (Result<String, WaitError<String>>, BTreeMap<NodeId, String>)
where
    C: Fleet,
    F: Fn(Arc<C>, String) -> Fut,
    Fut: Future<Output = Result<String, String>> + Send + 'static,
{
    let (key, fanouts) = core.new_fanout();
    let members = core.member_urls();
    let deadline = tokio::time::Instant::now().into_std() + timeout;
    // Registered before anyone is asked: an answer fed earlier would not count.
    let waiter = fanouts.register_quorum(key, members.len(), members.len(), Some(deadline));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for (id, url) in &members {
        if *id == core.id() {
            let _ = tx.send((*id, own.clone()));
            fanouts.answer(&key, *id, own.clone());
            continue;
        }
        let (fut, tx, id) = (ask(core.clone(), url.clone()), tx.clone(), *id);
        let fanouts = fanouts.clone();
        tokio::spawn(async move {
            match fut.await {
                Ok(answer) => {
                    // Recorded for the caller before the waiter may settle on it, so the
                    // answer that decides the verdict is among those the caller reads.
                    let _ = tx.send((id, answer.clone()));
                    fanouts.answer(&key, id, answer);
                }
                Err(e) => tracing::debug!(member = format!("{id:x}"), "fan-out: {e}"),
            }
        });
    }
    drop(tx);
    let verdict = tokio::select! {
        v = waiter => v,
        // The ticker expires the waiter at its deadline; this is the backstop if no
        // ticker runs (a node being shut down).
        _ = tokio::time::sleep(timeout + Duration::from_secs(1)) => Err(WaitError::Timeout),
    };
    let mut answers = BTreeMap::new();
    while let Ok((id, a)) = rx.try_recv() {
        answers.insert(id, a);
    }
    // The waiter fails at the first disagreement; to say who disagrees, the caller needs
    // the other answers too: wait for them (until the deadline) before reporting.
    if matches!(verdict, Err(WaitError::QuorumUnreachable)) {
        let rest = async {
            while answers.len() < members.len() {
                match rx.recv().await {
                    Some((id, a)) => {
                        answers.insert(id, a);
                    }
                    None => break,
                }
            }
        };
        let _ = tokio::time::timeout(timeout, rest).await;
    }
    (verdict, answers)
}

/// Compares every member's HashKV at this member's current revision; raises CORRUPT for
/// the members that disagree.
pub async fn corruption_check(core: &Arc<NodeCore>) -> CheckOutcome {
    check_hashes(core).await
}

/// [`corruption_check`] for any member that can answer [`HashCheck`]'s questions.
async fn check_hashes<C: HashCheck>(core: &Arc<C>) -> CheckOutcome {
    let revision = core.revision();
    let own = match core.own_hash(revision) {
        Ok(hash) => hash,
        Err(e) => {
            tracing::warn!("corruption check: own HashKV at {revision}: {e}");
            return CheckOutcome::Incomplete {
                revision,
                answered: 0,
                members: core.member_urls().len(),
            };
        }
    };
    let (verdict, answers) =
        ask_all(
            core,
            own.to_string(),
            move |core: Arc<C>, url| async move {
                core.hash_of(url, revision).await.map(|h| h.to_string())
            },
            core.answer_timeout(),
        )
        .await;
    let hashes: BTreeMap<NodeId, u32> = answers
        .iter()
        .filter_map(|(id, h)| Some((*id, h.parse().ok()?)))
        .collect();
    match verdict {
        Ok(_) => CheckOutcome::Consistent {
            revision,
            hash: own,
        },
        Err(WaitError::QuorumUnreachable) => {
            let alarmed = outliers(&hashes, core.id());
            tracing::error!(
                revision,
                ?hashes,
                "corruption check: members disagree on HashKV; raising CORRUPT"
            );
            for id in &alarmed {
                if let Err(e) = core.raise_corrupt(*id).await {
                    tracing::error!("raising CORRUPT for {id:x}: {e}");
                }
            }
            CheckOutcome::Corrupt {
                revision,
                hashes,
                alarmed,
            }
        }
        Err(_) => CheckOutcome::Incomplete {
            revision,
            answered: hashes.len(),
            members: core.member_urls().len(),
        },
    }
}

/// The members outside the largest group of equal hashes; `me` when no group is larger
/// than every other (nothing says who is right).
fn outliers(hashes: &BTreeMap<NodeId, u32>, me: NodeId) -> Vec<NodeId> {
    let mut counts: BTreeMap<u32, usize> = BTreeMap::new();
    for h in hashes.values() {
        *counts.entry(*h).or_default() += 1;
    }
    let mut sizes: Vec<(usize, u32)> = counts.iter().map(|(h, n)| (*n, *h)).collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    match sizes.as_slice() {
        [(first, majority), rest @ ..] if rest.first().is_none_or(|(n, _)| n < first) => hashes
            .iter()
            .filter(|(_, h)| *h != majority)
            .map(|(id, _)| *id)
            .collect(),
        _ => vec![me],
    }
}

/// Every member's health, for `/health?cluster`: `Ok` when every member answered healthy,
/// otherwise the members and their reasons (or no answer).
pub async fn cluster_health(core: &Arc<NodeCore>) -> Result<(), BTreeMap<NodeId, String>> {
    let own = match own_health(core).await {
        Ok(()) => "ok".to_string(),
        Err(reason) => reason,
    };
    let (verdict, answers) = ask_all(
        core,
        own,
        |core: Arc<NodeCore>, url| async move { core.forwarder().health_of(&url).await },
        Duration::from_secs(3),
    )
    .await;
    match verdict {
        Ok(answer) if answer == "ok" => Ok(()),
        _ => {
            let mut report: BTreeMap<NodeId, String> = core
                .member_urls()
                .into_iter()
                .map(|(id, _)| (id, "no answer".to_string()))
                .collect();
            report.extend(answers);
            Err(report)
        }
    }
}

/// The corruption check once this member has a leader and has caught up with it, as
/// etcd's initial check runs before it serves.
pub(crate) async fn initial_check<C: HashCheck>(
    core: Arc<C>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    tokio::select! {
        _ = stop.changed() => return,
        () = core.caught_up() => {}
    }
    let outcome = check_hashes(&core).await;
    tracing::info!(?outcome, "initial corruption check");
}

/// Runs the corruption check every `period` until `stop`.
pub(crate) async fn periodic_check<C: HashCheck>(
    core: Arc<C>,
    period: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(period) => {}
        }
        let outcome = check_hashes(&core).await;
        tracing::debug!(?outcome, "periodic corruption check");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Three members whose hashes the test sets; `None`: the member never answers.
    struct Members {
        hashes: BTreeMap<NodeId, Option<u32>>,
        fanouts: Fanouts,
        alarmed: Mutex<Vec<NodeId>>,
    }

    impl Members {
        fn new(hashes: [(NodeId, Option<u32>); 3]) -> Arc<Members> {
            Arc::new(Members {
                hashes: hashes.into(),
                fanouts: Fanouts::default(),
                alarmed: Mutex::default(),
            })
        }
    }

    impl Fleet for Members {
        fn id(&self) -> NodeId {
            1
        }

        fn member_urls(&self) -> Vec<(NodeId, String)> {
            self.hashes.keys().map(|id| (*id, id.to_string())).collect()
        }

        fn new_fanout(&self) -> (u64, &Fanouts) {
            (7, &self.fanouts)
        }
    }

    impl HashCheck for Members {
        fn revision(&self) -> i64 {
            42
        }

        fn own_hash(&self, _: i64) -> Result<u32, String> {
            self.hashes[&1].ok_or_else(|| "no hash".to_string())
        }

        fn hash_of(&self, url: String, _: i64) -> impl Future<Output = Result<u32, String>> + Send {
            let answer = url.parse().ok().and_then(|id: NodeId| self.hashes[&id]);
            async move {
                match answer {
                    Some(hash) => Ok(hash),
                    None => std::future::pending().await,
                }
            }
        }

        fn answer_timeout(&self) -> Duration {
            Duration::from_millis(200)
        }

        fn raise_corrupt(&self, member: NodeId) -> impl Future<Output = Result<(), String>> + Send {
            self.alarmed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(member);
            async { Ok(()) }
        }

        async fn caught_up(&self) {}
    }

    #[tokio::test]
    async fn the_check_alarms_the_member_that_disagrees_and_concludes_nothing_without_an_answer() {
        let agreed = Members::new([(1, Some(7)), (2, Some(7)), (3, Some(7))]);
        assert_eq!(
            check_hashes(&agreed).await,
            CheckOutcome::Consistent {
                revision: 42,
                hash: 7
            }
        );
        let corrupt = Members::new([(1, Some(7)), (2, Some(7)), (3, Some(9))]);
        match check_hashes(&corrupt).await {
            CheckOutcome::Corrupt {
                alarmed, hashes, ..
            } => {
                assert_eq!(alarmed, vec![3]);
                assert_eq!(hashes.len(), 3, "every answer is reported: {hashes:?}");
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        assert_eq!(
            *corrupt.alarmed.lock().unwrap_or_else(|p| p.into_inner()),
            vec![3]
        );
        let silent = Members::new([(1, Some(7)), (2, Some(7)), (3, None)]);
        assert!(matches!(
            check_hashes(&silent).await,
            CheckOutcome::Incomplete {
                answered: 2,
                members: 3,
                ..
            }
        ));
        assert!(
            silent
                .alarmed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty()
        );
    }

    #[test]
    fn the_minority_is_alarmed_and_a_tie_alarms_the_checker() {
        let three = BTreeMap::from([(1, 7), (2, 7), (3, 9)]);
        assert_eq!(outliers(&three, 1), vec![3]);
        let tie = BTreeMap::from([(1, 7), (2, 9)]);
        assert_eq!(outliers(&tie, 1), vec![1]);
        let agreed = BTreeMap::from([(1, 7), (2, 7)]);
        assert!(outliers(&agreed, 1).is_empty());
    }
}
