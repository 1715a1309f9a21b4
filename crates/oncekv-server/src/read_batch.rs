//! One leadership confirmation shared by every linearizable read waiting at that moment.
//!
//! A read index is only good for reads that arrived before the leader started confirming
//! its leadership (the confirmation proves no other leader had committed anything by
//! then). So reads queue; while a confirmation is out, new arrivals wait for the next
//! one, which starts as soon as the current one ends and serves all of them. Under load
//! that is one round of heartbeats per batch of reads instead of one per read; alone, a
//! read costs what it did.

use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;
use tokio::sync::oneshot;

use crate::error::ProposeError;

type Waiter = oneshot::Sender<Result<u64, ProposeError>>;

/// Confirms leadership once and answers the read index (a leader's own, or one asked of
/// the leader).
pub(crate) type Round =
    Arc<dyn Fn() -> BoxFuture<'static, Result<u64, ProposeError>> + Send + Sync>;

pub(crate) struct ReadBatcher {
    round: Round,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// A round is out (its task answers `waiting` next, or stops when it is empty).
    running: bool,
    /// Reads that arrived after the running round started.
    waiting: Vec<Waiter>,
}

impl std::fmt::Debug for ReadBatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadBatcher").finish_non_exhaustive()
    }
}

impl ReadBatcher {
    pub(crate) fn new(round: Round) -> Arc<ReadBatcher> {
        Arc::new(ReadBatcher {
            round,
            state: Mutex::default(),
        })
    }

    /// A read index from a round that started after this call.
    pub(crate) async fn read_index(self: &Arc<Self>) -> Result<u64, ProposeError> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.waiting.push(tx);
            !std::mem::replace(&mut state.running, true)
        };
        if start {
            // Its own task: a reader that gives up must not strand the others.
            tokio::spawn(self.clone().drive());
        }
        rx.await.unwrap_or(Err(ProposeError::Stopped))
    }

    async fn drive(self: Arc<Self>) {
        // Should this task end abnormally (a panic, the runtime shutting down), the next
        // read must start a round of its own rather than wait for this one forever.
        let mut reset = Reset {
            batcher: &self,
            armed: true,
        };
        loop {
            let batch = {
                let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                if state.waiting.is_empty() {
                    state.running = false;
                    // A read arriving from now on starts the next driver: this one's
                    // reset must not touch it.
                    reset.armed = false;
                    return;
                }
                std::mem::take(&mut state.waiting)
            };
            let result = (self.round)().await;
            for waiter in batch {
                let _ = waiter.send(result.clone());
            }
        }
    }
}

/// Marks the batcher idle and fails the reads still waiting, if the driver ends without
/// having done so itself.
struct Reset<'a> {
    batcher: &'a ReadBatcher,
    armed: bool,
}

impl Drop for Reset<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut state = self
            .batcher
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        state.running = false;
        for waiter in state.waiting.drain(..) {
            let _ = waiter.send(Err(ProposeError::Stopped));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use super::*;

    /// A round that takes 20 ms and answers how many rounds have started.
    fn counting() -> (Arc<ReadBatcher>, Arc<AtomicU64>) {
        let rounds = Arc::new(AtomicU64::new(0));
        let counter = rounds.clone();
        let batcher = ReadBatcher::new(Arc::new(move || {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(n)
            })
        }));
        (batcher, rounds)
    }

    #[tokio::test]
    async fn concurrent_reads_share_rounds_that_start_after_them() {
        let (batcher, rounds) = counting();
        let first = batcher.read_index().await.unwrap();
        assert_eq!(first, 1);
        // 100 reads at once: the first starts a round, the rest wait for one more.
        let reads: Vec<_> = (0..100)
            .map(|_| {
                let b = batcher.clone();
                tokio::spawn(async move { b.read_index().await.unwrap() })
            })
            .collect();
        let mut answers = Vec::new();
        for r in reads {
            answers.push(r.await.unwrap());
        }
        let total = rounds.load(Ordering::SeqCst);
        assert!(total <= 3, "{total} rounds for 101 reads");
        assert!(
            answers.iter().all(|&a| a >= 2),
            "a read got an earlier round"
        );
    }

    #[tokio::test]
    async fn a_read_arriving_during_a_round_waits_for_the_next() {
        let (batcher, _) = counting();
        let early = {
            let b = batcher.clone();
            tokio::spawn(async move { b.read_index().await.unwrap() })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let late = batcher.read_index().await.unwrap();
        assert_eq!(early.await.unwrap(), 1);
        assert_eq!(late, 2, "the round out when it arrived started before it");
    }

    #[tokio::test]
    async fn a_round_that_dies_leaves_the_batcher_usable() {
        let calls = Arc::new(AtomicU64::new(0));
        let counter = calls.clone();
        let batcher = ReadBatcher::new(Arc::new(move || {
            let n = counter.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                assert!(n > 0, "the first round dies");
                Ok(n)
            })
        }));
        assert_eq!(batcher.read_index().await, Err(ProposeError::Stopped));
        let next = tokio::time::timeout(Duration::from_secs(5), batcher.read_index()).await;
        assert_eq!(next, Ok(Ok(1)), "a later read starts a round of its own");
    }
}
