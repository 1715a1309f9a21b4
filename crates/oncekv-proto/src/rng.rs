//! The random number generator client and server draw from: the thread's seeded one in a
//! deterministic simulation, the OS-seeded `rand::thread_rng()` otherwise.
//!
//! openraft draws election timeouts, the server session secrets and the client its
//! backoff jitter and registration nonces. A turmoil simulation runs every host on one
//! thread; [`seed_thread_rng`] makes all of that a pure function of the seed.

use std::cell::RefCell;

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

thread_local! {
    static SEEDED: RefCell<Option<StdRng>> = const { RefCell::new(None) };
}

/// Makes this thread's randomness a pure function of `seed` (simulation only).
pub fn seed_thread_rng(seed: u64) {
    SEEDED.with(|r| *r.borrow_mut() = Some(StdRng::seed_from_u64(seed)));
}

/// Returns this thread to OS-seeded randomness.
pub fn unseed_thread_rng() {
    SEEDED.with(|r| *r.borrow_mut() = None);
}

/// The thread's seeded generator if there is one, else `rand::thread_rng()`.
#[derive(Debug, Default, Clone, Copy)]
pub struct SeededRng;

impl SeededRng {
    fn with<T>(f: impl FnOnce(&mut dyn RngCore) -> T) -> T {
        SEEDED.with(|r| match r.borrow_mut().as_mut() {
            Some(rng) => f(rng),
            None => f(&mut rand::thread_rng()),
        })
    }
}

impl RngCore for SeededRng {
    fn next_u32(&mut self) -> u32 {
        Self::with(|r| r.next_u32())
    }

    fn next_u64(&mut self) -> u64 {
        Self::with(|r| r.next_u64())
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        Self::with(|r| r.fill_bytes(dest))
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        Self::with(|r| r.try_fill_bytes(dest))
    }
}
