//! Faults chosen by the seed: a schedule of actions at simulated times, every fault
//! paired with its repair, all repaired by the end of the fault window.

use rand::Rng;
use rand::seq::SliceRandom;

/// One thing the driver does to the simulated world.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Cut every link between the two sides (both directions): messages are dropped
    /// (`drop`), or held until the repair (what TCP's retransmission makes of a partition).
    Partition { side: Vec<usize>, drop: bool },
    /// Drop messages from `from` to `to` only.
    OneWay { from: usize, to: usize },
    /// Isolate whichever node leads when the action runs.
    IsolateLeader,
    /// Hold (delay) every message between two nodes until the repair.
    Hold { a: usize, b: usize },
    /// Random link failures (message loss) at this rate per message.
    Lossy { rate_per_mille: u32 },
    /// Crash a node (losing unsynced writes); it restarts at the repair.
    Crash { node: usize },
    /// Move a node's clock by this many milliseconds (it leads with it).
    ClockJump { node: usize, by_ms: i64 },
    /// Hold a client's messages to and from every node (sometimes for longer than the
    /// session TTL): a paused client.
    PauseClient { client: usize },
    /// Undo everything above (heal links, restart crashed nodes, release held messages).
    Heal,
}

/// An action at a simulated time (milliseconds).
#[derive(Debug, Clone)]
pub struct Step {
    pub at_ms: u64,
    pub action: Action,
}

/// A seeded schedule over `[1 s, end_ms)`: faults one after another, each followed by a
/// heal, and a final heal at `end_ms`.
pub fn plan(
    rng: &mut impl Rng,
    nodes: usize,
    clients: usize,
    session_ttl_ms: u64,
    end_ms: u64,
) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut t = 1_000 + rng.gen_range(0..1_000);
    while t < end_ms {
        let action = match rng.gen_range(0..100) {
            0..=14 => {
                let mut all: Vec<usize> = (0..nodes).collect();
                all.shuffle(rng);
                // One node, a minority, or a majority on the listed side.
                let n = rng.gen_range(1..nodes);
                all.truncate(n);
                all.sort_unstable();
                Action::Partition {
                    side: all,
                    drop: rng.gen_bool(0.5),
                }
            }
            15..=22 => {
                let from = rng.gen_range(0..nodes);
                let to = (from + rng.gen_range(1..nodes)) % nodes;
                Action::OneWay { from, to }
            }
            23..=37 => Action::IsolateLeader,
            38..=44 => {
                let a = rng.gen_range(0..nodes);
                let b = (a + rng.gen_range(1..nodes)) % nodes;
                Action::Hold { a, b }
            }
            45..=51 => Action::Lossy {
                rate_per_mille: rng.gen_range(1..=20),
            },
            52..=74 => Action::Crash {
                node: rng.gen_range(0..nodes),
            },
            75..=84 => Action::ClockJump {
                node: rng.gen_range(0..nodes),
                by_ms: rng.gen_range(-20_000..=20_000),
            },
            _ => Action::PauseClient {
                client: rng.gen_range(0..clients),
            },
        };
        let long = matches!(action, Action::PauseClient { .. }) && rng.gen_bool(0.5);
        let lasts = if long {
            session_ttl_ms + rng.gen_range(500..3_000)
        } else {
            rng.gen_range(100..3_000)
        };
        let instant = matches!(action, Action::ClockJump { .. });
        steps.push(Step { at_ms: t, action });
        if !instant {
            // Sometimes a second fault overlaps the first (e.g. crash during partition).
            if rng.gen_bool(0.3) {
                let node = rng.gen_range(0..nodes);
                steps.push(Step {
                    at_ms: t + rng.gen_range(0..lasts.max(1)),
                    action: Action::Crash { node },
                });
            }
            steps.push(Step {
                at_ms: t + lasts,
                action: Action::Heal,
            });
        }
        t += lasts + rng.gen_range(200..2_000);
    }
    steps.push(Step {
        at_ms: end_ms,
        action: Action::Heal,
    });
    steps.sort_by_key(|s| s.at_ms);
    steps
}
