//! The write hot path: batching commands into log entries and stamping cluster time.
//!
//! Requests queue on a channel. A single task takes whatever has queued (up to a batch
//! limit) and proposes it as one log entry, so under load many client commands share one
//! entry, one append and one fsync (the log store's group commit shares fsyncs across
//! entries too). A bounded number of entries is in flight at once; while they are, new
//! requests accumulate into the next batch.
//!
//! Cluster time: the proposer stamps each entry with `max(previous stamp, wall clock,
//! applied cluster time)`, so it is monotonic on one leader and a new leader continues from
//! at least what it has applied (and apply takes the max with the log anyway).

use std::sync::Arc;
use std::time::Duration;

use oncekv_core::{Command, LogPayload, Response};
use openraft::error::{ClientWriteError, RaftError};
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::config::BatchLimits;
use crate::error::ProposeError;
use crate::runtime::Clock;
use crate::sm_store::Applied;
use crate::types::{NodeId, Raft};

struct Pending {
    command: Command,
    reply: oneshot::Sender<Result<Response, ProposeError>>,
}

/// Handle for submitting commands to the local raft node.
#[derive(Debug, Clone)]
pub struct Proposer {
    tx: mpsc::Sender<Pending>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("command", &self.command)
            .finish()
    }
}

impl Proposer {
    /// Starts the batching task for `raft`. An entry still unanswered after `timeout` is
    /// given up on (its callers get `Timeout`), so that a leader deposed with entries in
    /// flight cannot hold the in-flight slots forever.
    pub fn spawn(
        raft: Raft,
        applied: Arc<Applied>,
        limits: BatchLimits,
        clock: Clock,
        timeout: Duration,
    ) -> Proposer {
        let (tx, rx) = mpsc::channel(64 * 1024);
        tokio::spawn(run(raft, applied, rx, limits, clock, timeout));
        Proposer { tx }
    }

    /// Proposes `command` and waits for its response (or `timeout`).
    pub async fn propose(
        &self,
        command: Command,
        timeout: Duration,
    ) -> Result<Response, ProposeError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Pending { command, reply })
            .await
            .map_err(|_| ProposeError::Stopped)?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(ProposeError::Stopped),
            Err(_) => Err(ProposeError::Timeout),
        }
    }

    /// Proposes every command (queued back to back, so they tend to share an entry) and
    /// waits for all of their responses; one result per command, in order. `timeout`
    /// bounds the whole wait.
    pub async fn propose_many(
        &self,
        commands: Vec<Command>,
        timeout: Duration,
    ) -> Vec<Result<Response, ProposeError>> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut waiting = Vec::with_capacity(commands.len());
        for command in commands {
            let (reply, rx) = oneshot::channel();
            let sent = self.tx.send(Pending { command, reply }).await;
            waiting.push(sent.ok().map(|()| rx));
        }
        let mut out = Vec::with_capacity(waiting.len());
        for rx in waiting {
            out.push(match rx {
                None => Err(ProposeError::Stopped),
                Some(rx) => match tokio::time::timeout_at(deadline, rx).await {
                    Ok(Ok(result)) => result,
                    Ok(Err(_)) => Err(ProposeError::Stopped),
                    Err(_) => Err(ProposeError::Timeout),
                },
            });
        }
        out
    }
}

/// The next batch from `rx`: the item carried over from the last batch (or, if none, the
/// next one to arrive), then whatever is already queued, until `limits` are reached. An
/// item that `starts_new(first, item)` says may not join the batch is carried into the
/// next one. `None` once the channel is closed and empty.
pub(crate) async fn next_batch<T>(
    rx: &mut mpsc::Receiver<T>,
    carry: &mut Option<T>,
    limits: &BatchLimits,
    command: impl Fn(&T) -> &Command,
    starts_new: impl Fn(&T, &T) -> bool,
) -> Option<Vec<T>> {
    let first = match carry.take() {
        Some(p) => p,
        None => rx.recv().await?,
    };
    let mut bytes = approx_size(command(&first));
    let mut batch = vec![first];
    while batch.len() < limits.max_commands && bytes < limits.max_bytes {
        match rx.try_recv() {
            Ok(p) if starts_new(&batch[0], &p) => {
                *carry = Some(p);
                break;
            }
            Ok(p) => {
                bytes += approx_size(command(&p));
                batch.push(p);
            }
            Err(_) => break,
        }
    }
    Some(batch)
}

/// Roughly how many bytes `c` adds to an entry (for batch limits).
pub(crate) fn approx_size(c: &Command) -> usize {
    match c {
        Command::Tracked(t) => op_size(&t.op) + 48,
        Command::Untracked(op) => op_size(op),
        Command::Authorized { command, .. } => approx_size(command) + 8,
        _ => 32,
    }
}

fn op_size(op: &oncekv_core::Op) -> usize {
    match op {
        oncekv_core::Op::Put(p) => p.key.len() + p.value.len() + 16,
        _ => 64,
    }
}

async fn run(
    raft: Raft,
    applied: Arc<Applied>,
    mut rx: mpsc::Receiver<Pending>,
    limits: BatchLimits,
    clock: Clock,
    timeout: Duration,
) {
    let in_flight = Arc::new(Semaphore::new(limits.max_in_flight));
    let mut last_stamp = 0u64;
    let mut carry: Option<Pending> = None;
    let mut last_entry = 0usize;
    loop {
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        if last_entry >= BatchLimits::LOADED_ENTRY {
            gather(limits.gather_yields).await;
        }
        // A RegisterClient must come first in its entry (its client id is the entry's
        // index), so a second one waits for the next entry.
        let Some(batch) = next_batch(
            &mut rx,
            &mut carry,
            &limits,
            |p| &p.command,
            |_, p| matches!(p.command, Command::RegisterClient { .. }),
        )
        .await
        else {
            return;
        };
        last_entry = batch.len();
        let applied_time = applied.read().sm.cluster_time();
        last_stamp = last_stamp.max(clock.now_ms()).max(applied_time);
        let (commands, replies): (Vec<_>, Vec<_>) =
            batch.into_iter().map(|p| (p.command, p.reply)).unzip();
        let payload = LogPayload {
            cluster_time: last_stamp,
            commands,
        };
        let raft = raft.clone();
        tokio::spawn(async move {
            let result = tokio::time::timeout(timeout, raft.client_write(payload)).await;
            drop(permit);
            let result = match result {
                Ok(r) => r.map_err(propose_error),
                Err(_) => Err(ProposeError::Timeout),
            };
            match result {
                Ok(resp) => {
                    let mut responses = resp.data.0.into_iter();
                    for reply in replies {
                        let r = responses.next().ok_or_else(|| {
                            ProposeError::Internal(
                                "state machine returned too few responses".into(),
                            )
                        });
                        let _ = reply.send(r);
                    }
                }
                Err(err) => {
                    for reply in replies {
                        let _ = reply.send(Err(err.clone()));
                    }
                }
            }
        });
    }
}

/// Lets the tasks that are ready run before the next batch is cut: with one entry in
/// flight at a time, the requests whose handlers are about to queue them would otherwise
/// wait a whole commit for the entry after. Each yield returns once the worker has run its
/// other ready tasks (and, when it has none, polled the sockets), so an idle runtime
/// costs the batch microseconds, not a timer tick.
async fn gather(yields: usize) {
    for _ in 0..yields {
        tokio::task::yield_now().await;
    }
}

fn propose_error(
    e: RaftError<NodeId, ClientWriteError<NodeId, crate::types::Member>>,
) -> ProposeError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => ProposeError::NotLeader {
            leader: f.leader_id,
        },
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            ProposeError::Internal(e.to_string())
        }
        RaftError::Fatal(_) => ProposeError::Stopped,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Request handlers that are ready (each still a few polls from queueing its command,
    /// as a gRPC handler decoding a request is) get their commands into the batch when the
    /// proposer gathers first, and not when it cuts at once.
    #[tokio::test(flavor = "current_thread")]
    async fn gathering_lets_ready_handlers_join_the_batch() {
        // Gathering first: the handlers spawned for the case of none never run.
        for (yields, expected) in [(BatchLimits::default().gather_yields, 20), (0, 0)] {
            let (tx, mut rx) = mpsc::channel(64);
            for i in 0..20 {
                let tx = tx.clone();
                tokio::spawn(async move {
                    tokio::task::yield_now().await;
                    tokio::task::yield_now().await;
                    tx.send(i).await.unwrap();
                });
            }
            gather(yields).await;
            let mut queued = 0;
            while rx.try_recv().is_ok() {
                queued += 1;
            }
            assert_eq!(queued, expected, "after {yields} yields");
        }
    }
}
