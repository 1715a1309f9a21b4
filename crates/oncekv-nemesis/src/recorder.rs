//! The run's clock and its record of calls. Times are milliseconds since the run began
//! on the harness's own monotonic clock (`std::time::Instant`; the harness never runs
//! under libfaketime, only members do), as `oncekv-check` wants them.

use std::sync::Mutex;
use std::time::Instant;

use oncekv_check::{Call, Event, Outcome};

/// Shared by every worker of a run.
#[derive(Debug)]
pub struct Recorder {
    origin: Instant,
    calls: Mutex<Vec<Event>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder {
            origin: Instant::now(),
            calls: Mutex::new(Vec::new()),
        }
    }

    /// Milliseconds since the run began.
    pub fn now(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    /// Records a call made at `start` that completed now.
    pub fn record(&self, client: usize, key: String, call: Call, outcome: Outcome, start: u64) {
        let end = self.now();
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Event {
                client,
                key,
                call,
                outcome,
                start,
                end,
            });
    }

    /// Every call so far, in the order they completed.
    pub fn calls(&self) -> Vec<Event> {
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone();
        calls.sort_by_key(|e| e.end);
        calls
    }
}
