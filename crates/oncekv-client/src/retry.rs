//! The retry budget of one call: attempts, total time, and capped exponential backoff with
//! jitter.

use std::time::Duration;

use rand::Rng;
// tokio's clock: std's in production, simulated time in a deterministic simulation.
use tokio::time::Instant;

use crate::config::ClientConfig;

/// Counts the attempts of one call against the configured budget.
#[derive(Debug)]
pub(crate) struct Budget {
    started: Instant,
    attempts: u32,
    max_attempts: u32,
    max_time: Duration,
    attempt_timeout: Duration,
    request_timeout: Duration,
    base: Duration,
    cap: Duration,
}

impl Budget {
    pub(crate) fn new(config: &ClientConfig) -> Budget {
        Budget {
            started: Instant::now(),
            attempts: 0,
            max_attempts: config.max_attempts.max(1),
            max_time: config.max_retry_time,
            attempt_timeout: config.attempt_timeout.min(config.request_timeout),
            request_timeout: config.request_timeout,
            base: config.backoff_base,
            cap: config.backoff_cap.max(config.backoff_base),
        }
    }

    /// Starts an attempt; returns how long it may take: the attempt timeout, doubled for
    /// each attempt before it, capped by the request timeout and cut short by the
    /// budget's deadline.
    pub(crate) fn start_attempt(&mut self) -> Duration {
        self.attempts += 1;
        let left = self.max_time.saturating_sub(self.started.elapsed());
        let grown = backoff(self.attempt_timeout, self.request_timeout, self.attempts);
        grown.min(left).max(Duration::from_millis(1))
    }

    /// Attempts started so far.
    pub(crate) fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The pause before the next attempt, or `None` when the budget is spent (no attempts
    /// left, or the pause would end past the deadline).
    pub(crate) fn next_delay(&self) -> Option<Duration> {
        if self.attempts >= self.max_attempts {
            return None;
        }
        let delay = jittered(backoff(self.base, self.cap, self.attempts));
        if self.started.elapsed() + delay >= self.max_time {
            return None;
        }
        Some(delay)
    }
}

/// `base * 2^(retry - 1)`, capped (retry counts from 1).
fn backoff(base: Duration, cap: Duration, retry: u32) -> Duration {
    let factor = 1u32 << retry.saturating_sub(1).min(20);
    base.saturating_mul(factor).min(cap)
}

/// Somewhere in `[d/2, d]`: spreads out clients that failed together without ever
/// retrying at once.
fn jittered(d: Duration) -> Duration {
    let half = d / 2;
    let nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
    // The thread's RNG, or the simulation's seeded one (see `oncekv_proto::rng`).
    half + Duration::from_nanos(oncekv_proto::rng::SeededRng.gen_range(0..=nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    // The cap keeps a long outage from pushing retries minutes apart.
    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let (base, cap) = (Duration::from_millis(10), Duration::from_millis(100));
        let got: Vec<u128> = (1..=6).map(|r| backoff(base, cap, r).as_millis()).collect();
        assert_eq!(got, vec![10, 20, 40, 80, 100, 100]);
        assert_eq!(backoff(base, cap, u32::MAX), cap);
    }

    // Jitter must never turn a backoff into an immediate retry storm.
    #[test]
    fn jitter_stays_between_half_and_all() {
        for _ in 0..1000 {
            let d = jittered(Duration::from_millis(100));
            assert!(
                d >= Duration::from_millis(50) && d <= Duration::from_millis(100),
                "{d:?}"
            );
        }
    }

    // The budget is what turns "keep retrying" into an OutcomeUnknown the caller can act on.
    #[test]
    fn budget_ends_after_max_attempts() {
        let config = ClientConfig {
            max_attempts: 3,
            backoff_base: Duration::from_millis(1),
            ..ClientConfig::default()
        };
        let mut budget = Budget::new(&config);
        budget.start_attempt();
        assert!(budget.next_delay().is_some());
        budget.start_attempt();
        assert!(budget.next_delay().is_some());
        budget.start_attempt();
        assert_eq!(budget.next_delay(), None);
        assert_eq!(budget.attempts(), 3);
    }

    // A hung reply must cost one short attempt, while a slow server still gets, attempt by
    // attempt, up to the whole request timeout.
    #[test]
    fn attempts_start_short_and_double_up_to_the_request_timeout() {
        let config = ClientConfig {
            attempt_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(5),
            max_retry_time: Duration::from_secs(60),
            ..ClientConfig::default()
        };
        let mut budget = Budget::new(&config);
        let got: Vec<u64> = (0..5).map(|_| budget.start_attempt().as_secs()).collect();
        assert_eq!(got, vec![1, 2, 4, 5, 5]);
    }

    #[test]
    fn budget_ends_at_the_deadline_and_cuts_attempts_short() {
        let config = ClientConfig {
            max_retry_time: Duration::from_millis(50),
            request_timeout: Duration::from_secs(5),
            backoff_base: Duration::from_millis(100),
            ..ClientConfig::default()
        };
        let mut budget = Budget::new(&config);
        assert!(budget.start_attempt() <= Duration::from_millis(50));
        assert_eq!(
            budget.next_delay(),
            None,
            "a 50-100 ms pause would pass the deadline"
        );
    }
}
