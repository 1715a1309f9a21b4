//! Which runs a command line asks for: the nemeses (each alone or with
//! `--leader-lease-reads`), how many runs across them, for how long, on which targets.

use std::time::Duration;

use crate::cluster::Target;
use crate::nemesis::{ALL, Kind, Timing};

/// One nemesis as a run runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Variant {
    pub kind: Kind,
    /// Members run with oncekv's `--leader-lease-reads`.
    pub lease_reads: bool,
}

impl Variant {
    /// `name` or `name+lease-reads`.
    pub fn parse(s: &str) -> Result<Variant, String> {
        let (name, lease_reads) = match s.strip_suffix("+lease-reads") {
            Some(name) => (name, true),
            None => (s, false),
        };
        let kind = Kind::parse(name).ok_or_else(|| {
            format!(
                "unknown nemesis {s:?}; known: {} (each may end in +lease-reads)",
                ALL.map(Kind::name).join(", ")
            )
        })?;
        Ok(Variant { kind, lease_reads })
    }

    pub fn label(&self) -> String {
        if self.lease_reads {
            format!("{} (lease reads)", self.kind.name())
        } else {
            self.kind.name().to_string()
        }
    }

    /// Why this variant does not run against `target` with `members`, if it does not.
    pub fn unfit(&self, target: Target, members: usize) -> Option<String> {
        if self.lease_reads && target == Target::Etcd {
            return Some("skipped: etcd has no --leader-lease-reads".into());
        }
        self.kind
            .unfit(members)
            .map(|why| format!("skipped: {why}"))
    }
}

impl Variant {
    /// What a reader of `target`'s figures must know, if anything.
    pub fn caveat(&self, target: Target) -> Option<String> {
        (target == Target::Etcd && self.kind.needs_faketime()).then(|| {
            "libfaketime does not reach etcd's clocks (Go reads them through the vDSO, not \
             libc): no clock was skewed"
                .to_string()
        })
    }
}

fn variant(kind: Kind, lease_reads: bool) -> Variant {
    Variant { kind, lease_reads }
}

/// The short form's nemeses: the leader cut off (with and without lease reads), paused,
/// killed; every link slow and lossy; the leader's clock skewed (with and without); the
/// leader's replies lost.
pub fn quick() -> Vec<Variant> {
    vec![
        variant(Kind::PartitionLeader, false),
        variant(Kind::PartitionLeader, true),
        variant(Kind::PauseLeader, false),
        variant(Kind::Kill, false),
        variant(Kind::NetemAll, false),
        variant(Kind::ClockSkew, false),
        variant(Kind::ClockSkew, true),
        variant(Kind::LoseReplies, false),
    ]
}

/// The long form's: every nemesis, and the leader cut off and its clock skewed with
/// lease reads.
pub fn every() -> Vec<Variant> {
    let mut v: Vec<Variant> = ALL.iter().map(|&k| variant(k, false)).collect();
    v.push(variant(Kind::PartitionLeader, true));
    v.push(variant(Kind::ClockSkew, true));
    v.push(variant(Kind::Combined, true));
    v
}

/// `runs` runs spread round-robin across `variants` (each at least once when `runs`
/// allows): the run list, in order.
pub fn spread(variants: &[Variant], runs: usize) -> Vec<Variant> {
    if variants.is_empty() {
        return Vec::new();
    }
    (0..runs).map(|i| variants[i % variants.len()]).collect()
}

/// The targets `--target` names.
pub fn targets(s: &str) -> Result<Vec<Target>, String> {
    match s {
        "oncekv" => Ok(vec![Target::Oncekv]),
        "etcd" => Ok(vec![Target::Etcd]),
        "both" => Ok(vec![Target::Oncekv, Target::Etcd]),
        other => Err(format!("--target {other:?}: oncekv, etcd or both")),
    }
}

/// The quick form's timing and length: two faults of 4 s in 15 s.
pub const QUICK_TIME: Duration = Duration::from_secs(15);
pub const QUICK_TIMING: Timing = Timing {
    fault: Duration::from_secs(4),
    quiet: Duration::from_secs(3),
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nemesis_name_may_ask_for_lease_reads() -> Result<(), String> {
        assert_eq!(
            Variant::parse("clock-skew+lease-reads")?,
            variant(Kind::ClockSkew, true)
        );
        assert_eq!(Variant::parse("kill")?, variant(Kind::Kill, false));
        assert!(Variant::parse("kill+fast").is_err());
        Ok(())
    }

    // `--runs 100` across 13 variants: every variant runs, none more than once over its
    // share.
    #[test]
    fn runs_are_spread_across_the_nemeses() {
        let v = every();
        let runs = spread(&v, 100);
        assert_eq!(runs.len(), 100);
        for x in &v {
            let n = runs.iter().filter(|r| *r == x).count();
            assert!((7..=8).contains(&n), "{x:?}: {n}");
        }
        assert_eq!(spread(&v, 2), v[..2].to_vec());
    }

    #[test]
    fn etcd_skips_lease_reads_and_three_members_skip_the_bridge() {
        assert!(variant(Kind::Kill, true).unfit(Target::Etcd, 3).is_some());
        assert!(variant(Kind::Kill, true).unfit(Target::Oncekv, 3).is_none());
        assert!(
            variant(Kind::Bridge, false)
                .unfit(Target::Oncekv, 3)
                .is_some()
        );
    }
}
