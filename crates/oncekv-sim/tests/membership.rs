//! Membership changes under the workload: the leader (then a follower) is removed, its
//! disk wiped, and it is added back as a new member that catches up. Every checker must
//! pass, and the replaced member must really have left and rejoined.

use oncekv_sim::faults::{Action, Step};
use oncekv_sim::run::{Options, run};

fn replaced(leader: bool, crash_during: bool) -> Options {
    let mut schedule = vec![Step {
        at_ms: 3_000,
        action: Action::ReplaceMember { leader },
    }];
    if crash_during {
        // Another member crashes while the replacement is under way.
        schedule.push(Step {
            at_ms: 3_500,
            action: Action::Crash { node: 0 },
        });
    }
    schedule.push(Step {
        at_ms: 15_000,
        action: Action::Heal,
    });
    Options {
        ops_per_client: 30,
        fault_secs: 15,
        schedule: Some(schedule),
        ..Options::default()
    }
}

#[test]
fn replacing_the_leader_or_a_follower_keeps_every_promise() {
    for (leader, crash) in [(true, false), (false, true)] {
        for seed in [1, 2] {
            let report = run(seed, &replaced(leader, crash));
            let trace = report.trace.join("\n");
            assert!(
                report.ok(),
                "leader {leader}, seed {seed}: {:#?}\n{trace}",
                report.violations
            );
            for step in [
                "admin: removing",
                "taken down and wiped",
                "admin: adding",
                "started to join",
                "is a member again",
            ] {
                assert!(
                    trace.contains(step),
                    "leader {leader}, seed {seed}: no {step:?} in\n{trace}"
                );
            }
        }
    }
}
