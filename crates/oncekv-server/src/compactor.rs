//! Auto-compaction, as etcd 3.4's `--auto-compaction-mode` and
//! `--auto-compaction-retention` (off by default, as there).
//!
//! Every member samples its revision, but only the leader compacts, and its decision is an
//! `Op::Compact` through the log like a client's: every replica compacts at the same
//! index, whichever member decided. A new leader carries on from its own samples.
//!
//! The compactor sees its member only through [`Compactable`]: the revisions, whether it
//! leads, and proposing a compaction. Nothing else of the node is in reach.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use oncekv_core::{Command, Op, OpError, Response};
use tokio::sync::watch;
use tokio::time::Instant;

pub use crate::config::{AutoCompaction, REVISION_MODE_INTERVAL};
use crate::error::ApiError;
use crate::request_path::{Compacted, NodeCore, answer};

/// How often a periodic compactor samples the revision, as a fraction of its interval.
const SAMPLES_PER_INTERVAL: u32 = 10;

/// The longest time between two periodic compactions, however long the retention.
const MAX_PERIODIC_INTERVAL: Duration = Duration::from_secs(3600);

/// What the compactor needs of its member.
pub(crate) trait Compactable {
    /// The store's current revision, and the revision its history is compacted at.
    fn revisions(&self) -> (i64, i64);
    /// Whether this member leads: only the leader decides to compact.
    fn leads(&self) -> bool;
    /// Proposes `Op::Compact { revision }` through the log: the store's answer, or why
    /// the proposal got none.
    async fn propose_compaction(&self, revision: i64) -> Result<Result<(), OpError>, String>;
}

impl Compactable for NodeCore {
    fn revisions(&self) -> (i64, i64) {
        let inner = self.applied().read();
        (inner.sm.revision(), inner.sm.compacted_revision())
    }

    fn leads(&self) -> bool {
        self.leader() == Some(self.id())
    }

    async fn propose_compaction(&self, revision: i64) -> Result<Result<(), OpError>, String> {
        match self
            .propose(Command::Untracked(Op::Compact { revision }))
            .await
        {
            Ok(Response::Op(Ok(reply))) => match answer::<Compacted>(reply.result) {
                Ok(Compacted) => Ok(Ok(())),
                Err(ApiError::Op(refused)) => Ok(Err(refused)),
                Err(other) => Err(other.to_string()),
            },
            Ok(other) => Err(format!("answered {other:?}")),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Runs the configured compactor until `stop` fires.
pub async fn run(core: Arc<NodeCore>, mut stop: watch::Receiver<bool>) {
    match core.config().auto_compaction {
        AutoCompaction::Off => {}
        AutoCompaction::Periodic { retention } => periodic(&*core, retention, &mut stop).await,
        AutoCompaction::Revision { keep, every } => {
            by_revision(&*core, keep, every, &mut stop).await
        }
    }
}

async fn periodic(core: &impl Compactable, retention: Duration, stop: &mut watch::Receiver<bool>) {
    let interval = retention.min(MAX_PERIODIC_INTERVAL);
    let sample_every = (interval / SAMPLES_PER_INTERVAL).max(Duration::from_millis(1));
    // One sample per `sample_every` over the retention, so the oldest is `retention` old.
    let kept = (retention.as_nanos() / sample_every.as_nanos()) as usize + 1;
    let mut samples: VecDeque<i64> = VecDeque::with_capacity(kept + 1);
    let mut last_done = Instant::now();
    // The first compaction waits a whole retention; later ones an interval.
    let mut wait = retention;
    loop {
        samples.push_back(core.revisions().0);
        if samples.len() > kept {
            samples.pop_front();
        }
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(sample_every) => {}
        }
        if !core.leads() || last_done.elapsed() < wait {
            continue;
        }
        let Some(&revision) = samples.front() else {
            continue;
        };
        if compact(core, revision, &format!("retention {retention:?}")).await {
            last_done = Instant::now();
            wait = interval;
        }
    }
}

async fn by_revision(
    core: &impl Compactable,
    keep: i64,
    every: Duration,
    stop: &mut watch::Receiver<bool>,
) {
    let mut last = 0;
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let revision = core.revisions().0 - keep;
        if !core.leads() || revision <= 0 || revision == last {
            continue;
        }
        if compact(core, revision, &format!("keeping {keep} revisions")).await {
            last = revision;
        }
    }
}

/// Proposes the compaction; true once history is compacted at or past `revision` (a
/// refusal as already compacted counts: a client or an earlier leader got there first).
/// Proposes nothing when this member has already applied such a compaction, so an idle
/// cluster writes no entry per interval.
async fn compact(core: &impl Compactable, revision: i64, why: &str) -> bool {
    if revision <= core.revisions().1 {
        return true;
    }
    tracing::info!(revision, "starting auto-compaction ({why})");
    match core.propose_compaction(revision).await {
        Ok(Ok(())) => {
            tracing::info!(revision, "finished auto-compaction");
            true
        }
        Ok(Err(OpError::Compacted)) => true,
        Ok(Err(e)) => {
            tracing::warn!(revision, "auto-compaction refused: {e}");
            false
        }
        Err(e) => {
            tracing::warn!(revision, "auto-compaction failed, will retry: {e}");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seconds(s: &str) -> Result<Duration, String> {
        s.strip_suffix('s')
            .and_then(|n| n.parse().ok())
            .map(Duration::from_secs)
            .ok_or_else(|| format!("bad duration {s:?}"))
    }

    // etcd reads a bare number in periodic mode as hours, and "0" as off in both modes; a
    // misread retention would compact history a user meant to keep.
    #[test]
    fn flags_read_as_etcd_reads_them() {
        let read = |mode, retention| AutoCompaction::from_flags(mode, retention, seconds);
        assert_eq!(read("periodic", "0"), Ok(AutoCompaction::Off));
        assert_eq!(read("revision", "0"), Ok(AutoCompaction::Off));
        assert_eq!(
            read("periodic", "2"),
            Ok(AutoCompaction::Periodic {
                retention: Duration::from_secs(7200)
            })
        );
        assert_eq!(
            read("periodic", "30s"),
            Ok(AutoCompaction::Periodic {
                retention: Duration::from_secs(30)
            })
        );
        assert_eq!(
            read("revision", "1000"),
            Ok(AutoCompaction::Revision {
                keep: 1000,
                every: REVISION_MODE_INTERVAL
            })
        );
        assert!(read("revision", "1h").is_err());
        assert!(read("revision", "-5").is_err());
        assert!(read("periodic", "soon").is_err());
        assert!(read("hourly", "1").is_err());
    }

    /// A member whose revisions and leadership the test sets, recording what it is asked
    /// to compact.
    #[derive(Default)]
    struct Member {
        state: std::sync::Mutex<(i64, i64, bool)>,
        proposed: std::sync::Mutex<Vec<i64>>,
    }

    impl Member {
        fn set(&self, revision: i64, leads: bool) {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            (state.0, state.2) = (revision, leads);
        }

        fn proposed(&self) -> Vec<i64> {
            self.proposed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
        }
    }

    impl Compactable for Member {
        fn revisions(&self) -> (i64, i64) {
            let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            (state.0, state.1)
        }

        fn leads(&self) -> bool {
            self.state.lock().unwrap_or_else(|p| p.into_inner()).2
        }

        async fn propose_compaction(&self, revision: i64) -> Result<Result<(), OpError>, String> {
            self.proposed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(revision);
            self.state.lock().unwrap_or_else(|p| p.into_inner()).1 = revision;
            Ok(Ok(()))
        }
    }

    /// Waits (up to 2 s) until `member` has been asked to compact `want`.
    async fn asked(member: &Member, want: &[i64]) -> Vec<i64> {
        for _ in 0..200 {
            if member.proposed() == want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        member.proposed()
    }

    // Revision mode: only the leader compacts, at its revision minus `keep`, once per
    // revision reached, and nothing before `keep` revisions exist.
    #[tokio::test]
    async fn revision_mode_compacts_on_the_leader_keeping_the_last_revisions() {
        let member = std::sync::Arc::new(Member::default());
        let (stop_tx, mut stop) = watch::channel(false);
        member.set(5, true);
        let running = {
            let member = member.clone();
            tokio::spawn(async move {
                by_revision(&*member, 10, Duration::from_millis(5), &mut stop).await
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(member.proposed().is_empty(), "fewer revisions than kept");
        member.set(100, false);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(member.proposed().is_empty(), "a follower compacted");
        member.set(100, true);
        assert_eq!(asked(&member, &[90]).await, [90]);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(member.proposed(), [90], "the same revision compacted twice");
        member.set(250, true);
        assert_eq!(asked(&member, &[90, 240]).await, [90, 240]);
        stop_tx.send_replace(true);
        running.await.expect("the compactor stops");
    }
}
