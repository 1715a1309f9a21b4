//! The put workload shared by the session bench and `examples/apply_cost.rs`.

use oncekv_core::{Command, Op, Secret, Tracked};

/// Each client's secret, cheap to recompute in a measured loop.
pub fn secret_of(client_id: u64) -> Secret {
    Secret::from_u128(u128::from(client_id).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835))
}

/// xorshift64*: a few ns per draw, the same sequence in every variant.
pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// `op` untracked, or tracked for `client_id` at `seq` acknowledging everything before it
/// (first_incomplete = seq), so a session never holds more than one saved response.
pub fn command(tracked: bool, client_id: u64, seq: u64, op: Op) -> Command {
    if tracked {
        Command::Tracked(Tracked::new(client_id, secret_of(client_id), seq, seq, op))
    } else {
        Command::Untracked(op)
    }
}
