//! The run's trace: one line per fault, node start and client call, stamped with
//! simulated time. Its hash is what "bit for bit reproducible" is checked against.

use std::sync::{Arc, Mutex};

/// A shared, append-only trace.
#[derive(Debug, Clone, Default)]
pub struct Trace(Arc<Mutex<Vec<String>>>);

impl Trace {
    /// Appends `line`, prefixed with the simulated time if inside the simulation.
    pub fn line(&self, line: impl Into<String>) {
        let t = turmoil::sim_elapsed().map(|d| d.as_millis());
        let line = match t {
            Some(t) => format!("{t:>7} {}", line.into()),
            None => line.into(),
        };
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(line);
    }

    /// Appends `line` stamped with `ms` (for the driver, which runs outside any host).
    pub fn at(&self, ms: u128, line: impl std::fmt::Display) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(format!("{ms:>7} {line}"));
    }

    pub fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// FNV-1a over every line.
    pub fn hash(&self) -> u64 {
        let lines = self.0.lock().unwrap_or_else(|p| p.into_inner());
        lines
            .iter()
            .flat_map(|l| l.bytes().chain(std::iter::once(b'\n')))
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
            })
    }
}
