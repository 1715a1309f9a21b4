//! Message duplication: the simulated network delivers some messages twice, the second
//! copy late, through the server's [`Duplicator`] seam (a byte stream cannot duplicate,
//! so the copies are made where messages exist: peer RPCs as they are sent, client writes
//! as they are received). Seeded, switched on and off by the fault schedule, counted.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use oncekv_server::transport::{Duplicator, MessageKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One run's duplicating network.
#[derive(Debug)]
pub struct Duplicates(Mutex<State>);

#[derive(Debug)]
struct State {
    per_mille: u32,
    rng: StdRng,
    counts: BTreeMap<MessageKind, u64>,
}

impl Duplicates {
    pub fn new(seed: u64) -> Duplicates {
        Duplicates(Mutex::new(State {
            per_mille: 0,
            rng: StdRng::seed_from_u64(seed),
            counts: BTreeMap::new(),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// From now on, this many messages in a thousand arrive twice (0: none).
    pub fn set_rate(&self, per_mille: u32) {
        self.lock().per_mille = per_mille;
    }

    /// Copies delivered so far, by kind.
    pub fn counts(&self) -> BTreeMap<MessageKind, u64> {
        self.lock().counts.clone()
    }
}

impl Duplicator for Duplicates {
    fn duplicate(&self, kind: MessageKind) -> Option<Duration> {
        let mut s = self.lock();
        let rate = f64::from(s.per_mille) / 1000.0;
        if s.per_mille == 0 || !s.rng.gen_bool(rate) {
            return None;
        }
        *s.counts.entry(kind).or_default() += 1;
        // From "right behind the original" (it may still be in flight) to well after its
        // answer (the original's response is saved, or the client has moved on).
        Some(Duration::from_millis(s.rng.gen_range(1..=2_000)))
    }
}
