//! Auto-compaction, as etcd 3.4's `--auto-compaction-mode` and
//! `--auto-compaction-retention` (off by default, as there).
//!
//! Every member samples its revision, but only the leader compacts, and its decision is an
//! `Op::Compact` through the log like a client's: every replica compacts at the same
//! index, whichever member decided. A new leader carries on from its own samples.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use oncekv_core::{Command, Op, OpError, Response};
use tokio::sync::watch;
use tokio::time::Instant;

pub use crate::config::{AutoCompaction, REVISION_MODE_INTERVAL};
use crate::request_path::NodeCore;

/// How often a periodic compactor samples the revision, as a fraction of its interval.
const SAMPLES_PER_INTERVAL: u32 = 10;

/// The longest time between two periodic compactions, however long the retention.
const MAX_PERIODIC_INTERVAL: Duration = Duration::from_secs(3600);

/// Runs the configured compactor until `stop` fires.
pub async fn run(core: Arc<NodeCore>, mut stop: watch::Receiver<bool>) {
    match core.config().auto_compaction {
        AutoCompaction::Off => {}
        AutoCompaction::Periodic { retention } => periodic(&core, retention, &mut stop).await,
        AutoCompaction::Revision { keep, every } => {
            by_revision(&core, keep, every, &mut stop).await
        }
    }
}

async fn periodic(core: &NodeCore, retention: Duration, stop: &mut watch::Receiver<bool>) {
    let interval = retention.min(MAX_PERIODIC_INTERVAL);
    let sample_every = (interval / SAMPLES_PER_INTERVAL).max(Duration::from_millis(1));
    // One sample per `sample_every` over the retention, so the oldest is `retention` old.
    let kept = (retention.as_nanos() / sample_every.as_nanos()) as usize + 1;
    let mut samples: VecDeque<i64> = VecDeque::with_capacity(kept + 1);
    let mut last_done = Instant::now();
    // The first compaction waits a whole retention; later ones an interval.
    let mut wait = retention;
    loop {
        samples.push_back(current_revision(core));
        if samples.len() > kept {
            samples.pop_front();
        }
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(sample_every) => {}
        }
        if !leads(core) || last_done.elapsed() < wait {
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
    core: &NodeCore,
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
        let revision = current_revision(core) - keep;
        if !leads(core) || revision <= 0 || revision == last {
            continue;
        }
        if compact(core, revision, &format!("keeping {keep} revisions")).await {
            last = revision;
        }
    }
}

fn current_revision(core: &NodeCore) -> i64 {
    core.applied().read().sm.revision()
}

fn leads(core: &NodeCore) -> bool {
    core.leader() == Some(core.id())
}

/// Proposes the compaction; true once history is compacted at or past `revision` (a
/// refusal as already compacted counts: a client or an earlier leader got there first).
/// Proposes nothing when this member has already applied such a compaction, so an idle
/// cluster writes no entry per interval.
async fn compact(core: &NodeCore, revision: i64, why: &str) -> bool {
    if revision <= core.applied().read().sm.compacted_revision() {
        return true;
    }
    tracing::info!(revision, "starting auto-compaction ({why})");
    match core
        .propose(Command::Untracked(Op::Compact { revision }))
        .await
    {
        Ok(Response::Op(Ok(reply))) => match reply.result {
            Ok(_) => {
                tracing::info!(revision, "finished auto-compaction");
                true
            }
            Err(OpError::Compacted) => true,
            Err(e) => {
                tracing::warn!(revision, "auto-compaction refused: {e}");
                false
            }
        },
        Ok(other) => {
            tracing::warn!(revision, "auto-compaction answered {other:?}");
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
}
