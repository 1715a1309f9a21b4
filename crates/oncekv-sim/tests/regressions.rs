//! Targeted schedules for failures the simulation found, so each stays fixed whatever
//! the seeded schedules turn into.

use oncekv_sim::faults::{Action, Step};
use oncekv_sim::run::{Options, Report, run};

/// Runs `seed` under `opts`; fails with its violations and trace unless it was clean.
fn run_clean(seed: u64, opts: &Options) -> Report {
    let report = run(seed, opts);
    assert!(
        report.ok(),
        "seed {seed}: {:#?}\n{}",
        report.violations,
        report.trace.join("\n")
    );
    report
}

fn black_hole(at_ms: u64, node: usize, other: usize) -> Step {
    Step {
        at_ms,
        action: Action::BlackHole {
            node,
            other,
            client: false,
        },
    }
}

// Seed 135 (before the network model changed): a follower stayed at applied index 106
// for good after the partitions healed. Its peer connections could no longer write (turmoil
// had dropped segments), so hyper opened no stream on them, considered them idle and,
// with `keep_alive_while_idle(false)`, never pinged them: they were never declared dead
// or replaced. Here every peer connection goes silent at once, mid-workload, and later the
// leader is cut off so the followers need their own connections; the cluster must notice
// by itself (HTTP/2 keep-alive), reconnect and finish. Caveat: this schedule passes with
// the old setting too (its streams are still open when the keep-alive timer fires); the
// exact wedge was shown on seed 135 of the old harness, failing before the fix and
// passing after it.
#[test]
fn silent_peer_connections_are_replaced() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .try_init();
    }
    let opts = Options {
        ops_per_client: 20,
        fault_secs: 20,
        schedule: Some(vec![
            black_hole(2_000, 0, 1),
            black_hole(2_000, 0, 2),
            black_hole(2_000, 1, 2),
            // The leader's own connections are busy and get replaced anyway; the
            // followers' connections to each other carry only votes, sit idle, and are
            // what the followers need once the leader is cut off.
            Step {
                at_ms: 14_000,
                action: Action::IsolateLeader,
            },
            Step {
                at_ms: 20_000,
                action: Action::Heal,
            },
        ]),
        ..Options::default()
    };
    for seed in [135, 1] {
        run_clean(seed, &opts);
    }
}

/// Seed 11's window: the leader's disk turns slow (26 ms per log write) at 1.8 s, `then`
/// hits the leader 156 ms later, and the repair comes `heal_after_ms` after that.
fn slow_leader_then(then: Action, heal_after_ms: u64) -> Options {
    Options {
        ops_per_client: 20,
        fault_secs: 6,
        schedule: Some(vec![
            Step {
                at_ms: 1_800,
                action: Action::SlowLeaderDisk { sync_ms: 26 },
            },
            Step {
                at_ms: 1_956,
                action: then,
            },
            Step {
                at_ms: 1_956 + heal_after_ms,
                action: Action::Heal,
            },
        ]),
        ..Options::default()
    }
}

// Seed 11, once the leader's disk could be slow: the leader acknowledges its own appends
// before they are durable, so its followers held entries of its term that a crash then
// took from its own log. openraft 0.9 restarts a member that led as the leader of the
// same term, and the restarted leader wrote new entries under the ids of the lost ones;
// the followers took them for the entries they had, and the replicas' states parted
// ("replica agreement" at index 9). A member now starts as a follower.
#[test]
fn a_leader_that_lost_its_unsynced_tail_does_not_resume_its_term() {
    let opts = slow_leader_then(Action::CrashLeader, 314);
    for seed in [11, 2, 5] {
        let report = run_clean(seed, &opts);
        assert!(
            report
                .trace
                .iter()
                .any(|l| l.contains("fault CrashLeader n")),
            "seed {seed}: no leader was crashed, the schedule tests nothing:\n{}",
            report.trace.join("\n")
        );
    }
}

// The other side of the rule above: a leader stopped cleanly (its log flushed and marked
// as closed whole) may resume its term at once when it starts again. Here it is stopped
// while its disk is slow, so entries its followers hold are still being written on it
// when the stop comes: the stop must wait for them before it marks the log. The restart
// comes before or after the followers' election, so the old leader either resumes its
// term or meets a newer one; both must keep every checker clean.
#[test]
fn a_leader_stopped_cleanly_mid_write_resumes_without_parting_the_replicas() {
    for (seed, restart_after_ms) in [(2, 150), (3, 150), (5, 900), (7, 900)] {
        let opts = slow_leader_then(Action::StopLeader, restart_after_ms);
        let report = run_clean(seed, &opts);
        let trace = report.trace.join("\n");
        assert!(
            trace.contains("ms per log write") && trace.contains("stopped cleanly"),
            "seed {seed}: no leader with a slow disk stopped cleanly, the schedule tests nothing:\n{trace}"
        );
        // The power loss at the repair finds nothing unsynced, so what the restarted
        // member reads is what it had acknowledged.
        assert!(
            trace.contains("disk lost 0 unsynced bytes"),
            "seed {seed}: a clean stop left writes unsynced:\n{trace}"
        );
    }
}

// Every member crashes at once and starts again (kill -9 of a whole cluster): a leader
// must be elected at the first round open to it, within 650 ms of the start: one maximum
// election timeout (300 ms here), or, in the seeds with lease reads, where members vote
// only after one, two. Members used to come back holding their granted votes, and openraft
// refuses every vote for an election timeout after it last saw a granted vote (counted
// from the start), so the first candidate was refused by all and the cluster waited for a
// second round (3-4 s with `oncekv dev`'s timeouts).
#[test]
fn a_cluster_that_crashed_whole_elects_at_the_first_round() {
    const RESTART_MS: u64 = 2_100;
    let crash = |node| Step {
        at_ms: 2_000,
        action: Action::Crash { node },
    };
    let opts = Options {
        ops_per_client: 20,
        fault_secs: 6,
        schedule: Some(vec![
            crash(0),
            crash(1),
            crash(2),
            Step {
                at_ms: RESTART_MS,
                action: Action::Heal,
            },
        ]),
        ..Options::default()
    };
    for seed in [1, 2, 3, 4] {
        let report = run_clean(seed, &opts);
        let elected = report.trace.iter().find_map(|l| {
            let (at, rest) = l.trim_start().split_once(' ')?;
            let at: u64 = at.parse().ok()?;
            (at > RESTART_MS && rest.starts_with("leader n")).then_some(at)
        });
        let trace = report.trace.join("\n");
        let Some(elected) = elected else {
            panic!("seed {seed}: no leader after the restart:\n{trace}");
        };
        assert!(
            elected - RESTART_MS <= 650,
            "seed {seed}: a leader only {} ms after the restart:\n{trace}",
            elected - RESTART_MS
        );
    }
}
