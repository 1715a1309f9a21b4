//! Faults chosen by the seed: a schedule of actions at simulated times, every fault
//! paired with its repair, all repaired by the end of the fault window.

use rand::Rng;
use rand::seq::SliceRandom;

/// One thing the driver does to the simulated world.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Cut every link between the two sides (both directions), at the connections
    /// (`drop`: [`crate::net::Net::cut`], connects wait) or in turmoil (held messages,
    /// connects held too). Either way TCP delivers what was sent once the repair comes.
    Partition { side: Vec<usize>, drop: bool },
    /// Cut bytes from `from` to `to` only.
    OneWay { from: usize, to: usize },
    /// Isolate whichever node leads when the action runs.
    IsolateLeader,
    /// Hold (delay) every message between two nodes until the repair.
    Hold { a: usize, b: usize },
    /// Segment loss at this rate per received chunk: each lost one arrives after a
    /// retransmission timeout.
    Lossy { rate_per_mille: u32 },
    /// Silence the connections open between node `node` and host `other` (a node, or a
    /// client when `client`) for good; new connections work.
    BlackHole {
        node: usize,
        other: usize,
        client: bool,
    },
    /// Deliver this many messages in a thousand twice (peer RPCs, forwards, client
    /// writes), the copy up to 2 s late.
    Duplicate { rate_per_mille: u32 },
    /// Isolate the leader right after it applies the next tracked write, before the reply
    /// leaves, for `hold_ms` ([`crate::trap`]). Disarmed by the repair if it has not
    /// fired.
    IsolateLeaderAtCommit { hold_ms: u64 },
    /// Crash a node (losing unsynced writes); it restarts at the repair.
    Crash { node: usize },
    /// Make whichever node leads write its log this slowly (each batch takes `sync_ms`),
    /// until the repair: its followers' copies become durable before its own.
    SlowLeaderDisk { sync_ms: u64 },
    /// Crash whichever node leads; it restarts at the repair. Scheduled inside a
    /// [`Action::SlowLeaderDisk`] window, it lands while the leader's latest entries are
    /// acknowledged by followers and not yet durable on the leader itself.
    CrashLeader,
    /// Stop whichever node leads cleanly, as an operator would (`Node::halt`: raft stops,
    /// the log is flushed and marked as closed cleanly); it starts again at the repair and
    /// may resume its term. Only in hand-made schedules (the seeded plans do not draw it,
    /// so that every seed keeps the plan it had).
    StopLeader,
    /// Move a node's clock by this many milliseconds (it leads with it).
    ClockJump { node: usize, by_ms: i64 },
    /// Hold a client's messages to and from every node (sometimes for longer than the
    /// session TTL): a paused client.
    PauseClient { client: usize },
    /// Remove a member (the leader when `leader`, else a follower), wipe its disk and add
    /// it back as a new member ([`crate::membership`]). Not undone by a heal.
    ReplaceMember { leader: bool },
    /// Undo everything above (heal links, restart crashed nodes, release held messages).
    Heal,
}

impl Action {
    /// The action's name, for counting.
    pub fn kind(&self) -> &'static str {
        match self {
            Action::Partition { .. } => "partition",
            Action::OneWay { .. } => "one-way",
            Action::IsolateLeader => "isolate-leader",
            Action::Hold { .. } => "hold",
            Action::Lossy { .. } => "loss",
            Action::BlackHole { .. } => "black-hole",
            Action::Duplicate { .. } => "duplicate",
            Action::IsolateLeaderAtCommit { .. } => "isolate-at-commit",
            Action::Crash { .. } => "crash",
            Action::SlowLeaderDisk { .. } => "slow-leader-disk",
            Action::CrashLeader => "crash-leader",
            Action::StopLeader => "stop-leader",
            Action::ClockJump { .. } => "clock-jump",
            Action::PauseClient { .. } => "pause-client",
            Action::ReplaceMember { leader: true } => "replace-leader",
            Action::ReplaceMember { leader: false } => "replace-member",
            Action::Heal => "heal",
        }
    }
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
            0..=11 => {
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
            12..=18 => {
                let from = rng.gen_range(0..nodes);
                let to = (from + rng.gen_range(1..nodes)) % nodes;
                Action::OneWay { from, to }
            }
            19..=30 => Action::IsolateLeader,
            31..=36 => {
                let a = rng.gen_range(0..nodes);
                let b = (a + rng.gen_range(1..nodes)) % nodes;
                Action::Hold { a, b }
            }
            37..=42 => Action::Lossy {
                rate_per_mille: rng.gen_range(5..=100),
            },
            43..=48 => {
                let node = rng.gen_range(0..nodes);
                if rng.gen_bool(0.3) {
                    Action::BlackHole {
                        node,
                        other: rng.gen_range(0..clients),
                        client: true,
                    }
                } else {
                    Action::BlackHole {
                        node,
                        other: (node + rng.gen_range(1..nodes)) % nodes,
                        client: false,
                    }
                }
            }
            49..=55 => Action::Duplicate {
                rate_per_mille: rng.gen_range(50..=300),
            },
            56..=62 => Action::IsolateLeaderAtCommit {
                hold_ms: rng.gen_range(1_000..=3_000),
            },
            63..=74 => Action::Crash {
                node: rng.gen_range(0..nodes),
            },
            75..=80 => Action::SlowLeaderDisk {
                sync_ms: rng.gen_range(5..=60),
            },
            81..=89 => Action::ClockJump {
                node: rng.gen_range(0..nodes),
                by_ms: rng.gen_range(-20_000..=20_000),
            },
            _ => Action::PauseClient {
                client: rng.gen_range(0..clients),
            },
        };
        let long = matches!(action, Action::PauseClient { .. }) && rng.gen_bool(0.5);
        let lasts = match action {
            _ if long => session_ttl_ms + rng.gen_range(500..3_000),
            // Armed for a while, then isolated for at least `hold_ms` once sprung.
            Action::IsolateLeaderAtCommit { hold_ms } => rng.gen_range(500..3_000) + hold_ms,
            _ => rng.gen_range(100..3_000),
        };
        let instant = matches!(action, Action::ClockJump { .. } | Action::BlackHole { .. });
        let slow_leader = matches!(action, Action::SlowLeaderDisk { .. });
        steps.push(Step { at_ms: t, action });
        if slow_leader {
            // The leader is mid-write for most of the window: crash it inside.
            steps.push(Step {
                at_ms: t + rng.gen_range(20..lasts.max(21)),
                action: Action::CrashLeader,
            });
        }
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
