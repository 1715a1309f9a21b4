//! The nemeses: which fault, on whom, when. A run alternates quiet and faulty periods
//! until its time is up; each fault is healed at the end of its period, and each period
//! recorded as a [`Window`] (what, when it began, when it was healed).

use std::time::Duration;

use rand::Rng;
use rand::seq::SliceRandom;
use serde::Serialize;

use crate::cluster::Cluster;
use crate::firewall::Firewall;
use crate::recorder::Recorder;
use crate::relay::{Delay, Relays};
use crate::rules::{self, Link};

/// Each nemesis, alone; [`Kind::Combined`] draws several per period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// The leader cut from every other member (its clients still reach it).
    PartitionLeader,
    /// A follower cut from every other member.
    IsolateFollower,
    /// Two sides that cannot talk, and one member that talks to both (5 members).
    Bridge,
    /// A new random minority cut off every 2 seconds.
    Flap,
    /// One link slow (100 ms +- 50 ms each way) and lossy (5 %).
    NetemOne,
    /// Every link slow (50 ms +- 25 ms each way) and lossy (3 %).
    NetemAll,
    /// The leader SIGSTOPped for the period (4 election timeouts by default), then
    /// SIGCONTed.
    PauseLeader,
    /// A member (the leader every other time) killed with -9, restarted at the heal.
    Kill,
    /// The leader's wall clock 8 s ahead, then (next period) 8 s behind, via libfaketime.
    ClockSkew,
    /// The leader's answers to its clients dropped: requests reach it and run, their
    /// replies are lost, and clients retry (a tracked retry must get the saved answer,
    /// never a second execution).
    LoseReplies,
    /// Two or three of the above at once.
    Combined,
}

/// Every nemesis, in the order the long form runs them.
pub const ALL: [Kind; 11] = [
    Kind::PartitionLeader,
    Kind::IsolateFollower,
    Kind::Bridge,
    Kind::Flap,
    Kind::NetemOne,
    Kind::NetemAll,
    Kind::PauseLeader,
    Kind::Kill,
    Kind::ClockSkew,
    Kind::LoseReplies,
    Kind::Combined,
];

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::PartitionLeader => "partition-leader",
            Kind::IsolateFollower => "isolate-follower",
            Kind::Bridge => "bridge",
            Kind::Flap => "flap",
            Kind::NetemOne => "netem-one",
            Kind::NetemAll => "netem-all",
            Kind::PauseLeader => "pause-leader",
            Kind::Kill => "kill",
            Kind::ClockSkew => "clock-skew",
            Kind::LoseReplies => "lose-replies",
            Kind::Combined => "combined",
        }
    }

    pub fn parse(name: &str) -> Option<Kind> {
        ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether member-to-member connections must pass through relays (for delays).
    pub fn needs_relays(self) -> bool {
        matches!(self, Kind::NetemOne | Kind::NetemAll | Kind::Combined)
    }

    /// Whether members must start under libfaketime.
    pub fn needs_faketime(self) -> bool {
        matches!(self, Kind::ClockSkew | Kind::Combined)
    }

    /// Why this nemesis cannot run on `members` members, if it cannot.
    pub fn unfit(self, members: usize) -> Option<String> {
        (self == Kind::Bridge && members < 5).then(|| {
            format!(
                "a bridge needs two sides of two and a member between: 5 members, not {members}"
            )
        })
    }
}

/// One faulty period.
#[derive(Debug, Clone, Serialize)]
pub struct Window {
    pub fault: String,
    /// Run-clock ms.
    pub start: u64,
    pub heal: u64,
}

/// What a nemesis acts on.
#[derive(Debug)]
pub struct Tools<'a> {
    pub cluster: &'a mut Cluster,
    pub firewall: &'a Firewall,
    pub relays: Option<&'a Relays>,
    pub recorder: &'a Recorder,
}

/// How the periods are timed.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub fault: Duration,
    pub quiet: Duration,
}

/// Members that died by themselves during the run (a finding), with their status.
pub type Crashes = Vec<String>;

/// Alternates quiet and faulty periods of `kind` until `until` (run-clock ms). Returns
/// the periods, and the members that exited by themselves (restarted at the next heal).
pub async fn run(
    kind: Kind,
    tools: &mut Tools<'_>,
    timing: Timing,
    until: u64,
) -> Result<(Vec<Window>, Crashes), String> {
    let mut windows = Vec::new();
    let mut crashes = Vec::new();
    let period = (timing.fault + timing.quiet).as_millis().max(1) as u64;
    let max_periods = until / period + 1;
    for round in 0..max_periods {
        tokio::time::sleep(timing.quiet).await;
        let start = tools.recorder.now();
        if start + timing.fault.as_millis() as u64 > until {
            break;
        }
        let fault = apply(kind, tools, round, timing.fault).await?;
        crashes.extend(heal(tools)?);
        windows.push(Window {
            fault,
            start,
            heal: tools.recorder.now(),
        });
    }
    Ok((windows, crashes))
}

/// Removes every fault: rules, delays, paused and killed members, clocks. Returns the
/// members that had died by themselves.
pub fn heal(tools: &mut Tools<'_>) -> Result<Crashes, String> {
    tools.firewall.heal()?;
    if let Some(r) = tools.relays {
        r.clear();
    }
    let crashes = tools
        .cluster
        .exited()
        .into_iter()
        .map(|(name, status)| format!("member {name} exited by itself ({status})"))
        .collect();
    tools.cluster.heal()?;
    Ok(crashes)
}

async fn leader_or_any(cluster: &Cluster) -> usize {
    match cluster.leader().await {
        Some(l) => l,
        None => rand::thread_rng().gen_range(0..cluster.len()),
    }
}

fn follower_of(cluster: &Cluster, leader: usize) -> usize {
    let others: Vec<usize> = (0..cluster.len()).filter(|&i| i != leader).collect();
    others.choose(&mut rand::thread_rng()).copied().unwrap_or(0)
}

/// Applies one period of `kind`, holds it for `hold`, and says what it was (the heal
/// is the caller's).
async fn apply(
    kind: Kind,
    tools: &mut Tools<'_>,
    round: u64,
    hold: Duration,
) -> Result<String, String> {
    let what = match kind {
        Kind::Flap => return flap(tools, hold).await,
        Kind::Combined => {
            let mut kinds = [
                Kind::PartitionLeader,
                Kind::IsolateFollower,
                Kind::NetemAll,
                Kind::PauseLeader,
                Kind::Kill,
                Kind::ClockSkew,
                Kind::LoseReplies,
            ];
            kinds.shuffle(&mut rand::thread_rng());
            let count = rand::thread_rng().gen_range(2..=3);
            let mut parts = Vec::new();
            for k in kinds.iter().take(count) {
                parts.push(start(*k, tools, round).await?);
            }
            parts.join(" + ")
        }
        _ => start(kind, tools, round).await?,
    };
    tokio::time::sleep(hold).await;
    Ok(what)
}

/// Starts one fault of `kind` (not flap or combined) and says what it did.
async fn start(kind: Kind, tools: &mut Tools<'_>, round: u64) -> Result<String, String> {
    let n = tools.cluster.len();
    let name = |t: &Tools<'_>, i: usize| t.cluster.name(i).to_string();
    Ok(match kind {
        Kind::PartitionLeader => {
            let l = leader_or_any(tools.cluster).await;
            cut(tools, &rules::links_across(n, &[l]))?;
            format!("partition leader {}", name(tools, l))
        }
        Kind::IsolateFollower => {
            let l = leader_or_any(tools.cluster).await;
            let f = follower_of(tools.cluster, l);
            cut(tools, &rules::links_across(n, &[f]))?;
            format!("isolate follower {}", name(tools, f))
        }
        Kind::Bridge => {
            let mut order: Vec<usize> = (0..n).collect();
            order.shuffle(&mut rand::thread_rng());
            let (a, rest) = order.split_at(2);
            let (bridge, b) = rest.split_at(1);
            let links: Vec<Link> = rules::links_across(n, a)
                .into_iter()
                .filter(|(x, y)| b.contains(x) || b.contains(y))
                .collect();
            cut(tools, &links)?;
            format!(
                "bridge {} between {:?} and {:?}",
                name(tools, bridge[0]),
                a.iter().map(|&i| name(tools, i)).collect::<Vec<_>>(),
                b.iter().map(|&i| name(tools, i)).collect::<Vec<_>>()
            )
        }
        Kind::NetemOne | Kind::NetemAll => {
            let (links, delay, loss) = if kind == Kind::NetemOne {
                let all = rules::all_links(n);
                let link = *all.choose(&mut rand::thread_rng()).ok_or("no links")?;
                (vec![link], (100, 50), 5)
            } else {
                (rules::all_links(n), (50, 25), 3)
            };
            if let Some(r) = tools.relays {
                r.set(
                    &links,
                    Delay {
                        base: Duration::from_millis(delay.0),
                        jitter: Duration::from_millis(delay.1),
                    },
                );
            }
            if let Some(rule) = rules::loss(&links, loss) {
                tools.firewall.add(&rule)?;
            }
            format!(
                "delay {}+-{} ms, loss {loss} % on {}",
                delay.0,
                delay.1,
                if links.len() == 1 {
                    format!("{}-{}", name(tools, links[0].0), name(tools, links[0].1))
                } else {
                    "every link".into()
                }
            )
        }
        Kind::PauseLeader => {
            let l = leader_or_any(tools.cluster).await;
            tools.cluster.pause(l)?;
            format!("SIGSTOP leader {}", name(tools, l))
        }
        Kind::Kill => {
            let victim = if round.is_multiple_of(2) {
                leader_or_any(tools.cluster).await
            } else {
                rand::thread_rng().gen_range(0..n)
            };
            tools.cluster.kill(victim);
            format!("kill -9 {}", name(tools, victim))
        }
        Kind::ClockSkew => {
            let l = leader_or_any(tools.cluster).await;
            let secs = if round.is_multiple_of(2) { 8 } else { -8 };
            tools.cluster.set_clock(l, secs)?;
            format!("clock of leader {} {secs:+} s", name(tools, l))
        }
        Kind::LoseReplies => {
            let l = leader_or_any(tools.cluster).await;
            tools.firewall.add(&rules::lose_replies(l))?;
            format!(
                "replies of leader {} to its clients dropped",
                name(tools, l)
            )
        }
        Kind::Flap | Kind::Combined => {
            return Err(format!("{} is not a single fault", kind.name()));
        }
    })
}

fn cut(tools: &Tools<'_>, links: &[Link]) -> Result<(), String> {
    match rules::cut(links) {
        Some(rule) => tools.firewall.add(&rule),
        None => Ok(()),
    }
}

/// A new random minority cut off every 2 s for `hold`.
async fn flap(tools: &mut Tools<'_>, hold: Duration) -> Result<String, String> {
    let n = tools.cluster.len();
    let flips = (hold.as_millis() / 2_000).max(1) as usize;
    let mut sides = Vec::new();
    for _ in 0..flips {
        tools.firewall.heal()?;
        let mut order: Vec<usize> = (0..n).collect();
        order.shuffle(&mut rand::thread_rng());
        let side: Vec<usize> = order.into_iter().take((n - 1) / 2).collect();
        cut(tools, &rules::links_across(n, &side))?;
        sides.push(
            side.iter()
                .map(|&i| tools.cluster.name(i).to_string())
                .collect::<Vec<_>>()
                .join(","),
        );
        tokio::time::sleep(hold / flips as u32).await;
    }
    Ok(format!("flapping: cut off {} in turn", sides.join(" / ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_nemesis_is_found_by_its_name() {
        for k in ALL {
            assert_eq!(Kind::parse(k.name()), Some(k));
        }
        assert_eq!(Kind::parse("partition"), None);
    }

    // With 3 members there is no bridge: two sides of two need 5 (say so, don't fake it).
    #[test]
    fn a_bridge_needs_five_members() {
        assert!(Kind::Bridge.unfit(3).is_some());
        assert!(Kind::Bridge.unfit(5).is_none());
        assert!(Kind::Kill.unfit(3).is_none());
    }
}
