//! When to hedge a write: after the recent p95 latency of writes.
//!
//! A hedge is the same tracked request (same client id and seq) sent to a second member
//! while the first has not answered. The cluster runs it at most once whichever copy
//! arrives first (the leader joins a copy to the in-flight original; a copy that arrives
//! later gets the saved reply), so hedging only trims the tail: the p95 delay keeps the
//! extra load to about one request in twenty.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// How many recent write latencies the p95 is taken over.
const WINDOW: usize = 256;
/// Below this many samples the p95 means little; the configured minimum is used instead.
const MIN_SAMPLES: usize = 20;

/// Recent write latencies, in microseconds (a ring).
#[derive(Debug, Default)]
pub(crate) struct Latencies {
    ring: Mutex<Ring>,
}

#[derive(Debug, Default)]
struct Ring {
    samples: Vec<u32>,
    next: usize,
}

impl Latencies {
    pub(crate) fn record(&self, latency: Duration) {
        let micros = u32::try_from(latency.as_micros()).unwrap_or(u32::MAX);
        let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        if ring.samples.len() < WINDOW {
            ring.samples.push(micros);
        } else {
            let next = ring.next;
            ring.samples[next] = micros;
        }
        ring.next = (ring.next + 1) % WINDOW;
    }

    /// How long a write waits before it is hedged: the recent p95, at least `min`.
    pub(crate) fn hedge_after(&self, min: Duration) -> Duration {
        let mut samples = {
            let ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
            if ring.samples.len() < MIN_SAMPLES {
                return min;
            }
            ring.samples.clone()
        };
        let rank = samples.len() * 95 / 100;
        let (_, p95, _) = samples.select_nth_unstable(rank);
        Duration::from_micros(u64::from(*p95)).max(min)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Too few samples say nothing about the tail: hedging must not fire on a guess.
    #[test]
    fn without_enough_samples_the_minimum_applies() {
        let l = Latencies::default();
        l.record(Duration::from_millis(500));
        assert_eq!(
            l.hedge_after(Duration::from_millis(20)),
            Duration::from_millis(20)
        );
    }

    // One slow write in twenty must not move the hedge point: that is the tail to cut.
    #[test]
    fn the_delay_is_the_p95_of_the_recent_window() {
        let l = Latencies::default();
        for i in 0..1000u64 {
            let ms = if i % 50 == 0 { 300 } else { 2 + i % 3 };
            l.record(Duration::from_millis(ms));
        }
        let d = l.hedge_after(Duration::from_micros(1));
        assert!(
            d >= Duration::from_millis(2) && d <= Duration::from_millis(4),
            "{d:?}"
        );
        assert_eq!(
            l.hedge_after(Duration::from_millis(20)),
            Duration::from_millis(20)
        );
    }
}
