//! The async runtime openraft runs on: tokio, with a random number generator that a
//! deterministic simulation can seed.
//!
//! openraft draws election timeouts from `AsyncRuntime::thread_rng()`. With tokio's own
//! runtime that is the OS-seeded `rand::thread_rng()`, so the same simulation seed gave
//! different elections on every run. [`seed_thread_rng`] installs a seeded generator for
//! the calling thread (a turmoil simulation runs every host on one thread); without it,
//! the generator is `rand::thread_rng()`, exactly as with openraft's `TokioRuntime`.

use std::future::Future;
use std::time::Duration;

pub use oncekv_proto::rng::{SeededRng as RaftRng, seed_thread_rng, unseed_thread_rng};
use openraft::{AsyncRuntime, OptionalSend, TokioInstant, TokioRuntime};

/// tokio, as openraft's `TokioRuntime`, but with [`RaftRng`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct OncekvRuntime;

impl AsyncRuntime for OncekvRuntime {
    type JoinError = <TokioRuntime as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <TokioRuntime as AsyncRuntime>::Sleep;
    type Instant = TokioInstant;
    type TimeoutError = <TokioRuntime as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> =
        <TokioRuntime as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = RaftRng;
    type OneshotSender<T: OptionalSend> = <TokioRuntime as AsyncRuntime>::OneshotSender<T>;
    type OneshotReceiverError = <TokioRuntime as AsyncRuntime>::OneshotReceiverError;
    type OneshotReceiver<T: OptionalSend> = <TokioRuntime as AsyncRuntime>::OneshotReceiver<T>;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        TokioRuntime::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        TokioRuntime::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        TokioRuntime::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        TokioRuntime::is_panic(join_error)
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        RaftRng
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        TokioRuntime::oneshot()
    }
}

/// Resolves once the node is stopping (or gone): what ends a server, and every stream a
/// client could otherwise hold open through the graceful shutdown. The channel's guard is
/// dropped inside, so a task awaiting this stays `Send`.
pub(crate) async fn stopped(mut stop: tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

#[cfg(test)]
mod tests {
    use rand::Rng;

    use super::*;

    // The whole point: the same seed must give the same election timeouts.
    #[test]
    fn the_system_clock_reads_wall_time_and_only_moves_forward() {
        let clock = Clock::system();
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let a = clock.now_ms();
        assert!(a.abs_diff(wall) < 60_000, "{a} vs wall {wall}");
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = clock.now_ms();
        assert!(b >= a + 15, "{a} then {b}");
    }

    #[test]
    fn seeded_thread_draws_the_same_sequence_every_time() {
        let draw = || {
            (0..8)
                .map(|_| OncekvRuntime::thread_rng().gen_range(150..300u64))
                .collect::<Vec<_>>()
        };
        seed_thread_rng(42);
        let a = draw();
        seed_thread_rng(42);
        let b = draw();
        seed_thread_rng(43);
        let c = draw();
        unseed_thread_rng();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}

/// Where a leader reads the time it stamps on entries, in milliseconds. Only a leader's
/// clock is ever read (followers take cluster time from the log). The system clock in
/// production; a simulation passes simulated time, and may make it jump.
#[derive(Clone)]
pub struct Clock(std::sync::Arc<dyn Fn() -> u64 + Send + Sync>);

impl Clock {
    /// Milliseconds since the Unix epoch: the system's wall clock as this process first
    /// read it, advanced by the monotonic clock since. A step of the wall clock while the
    /// member runs (an NTP correction, an operator's `date -s`) then moves no lease's or
    /// session's deadline, as etcd's leases (Go's monotonic time) are not moved either;
    /// only a restart reads the wall clock again.
    pub fn system() -> Clock {
        use std::sync::OnceLock;
        use std::time::{Instant, SystemTime, UNIX_EPOCH};
        static ANCHOR: OnceLock<(u64, Instant)> = OnceLock::new();
        Clock::new(|| {
            let (wall_ms, at) = *ANCHOR.get_or_init(|| {
                let wall = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64);
                (wall, Instant::now())
            });
            wall_ms + at.elapsed().as_millis() as u64
        })
    }

    pub fn new(f: impl Fn() -> u64 + Send + Sync + 'static) -> Clock {
        Clock(std::sync::Arc::new(f))
    }

    pub fn now_ms(&self) -> u64 {
        (self.0)()
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::system()
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Clock({} ms)", self.now_ms())
    }
}
