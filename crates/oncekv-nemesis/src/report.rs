//! The result as a Markdown table: a row per nemesis and target (etcd's row under
//! oncekv's when both ran), with the calls, each checker's verdict and the longest
//! unavailability after a heal.

use std::fmt::Write;

use crate::judge::{Counts, Verdicts};

/// One nemesis against one target, over all its runs.
#[derive(Debug, Clone, Default)]
pub struct Row {
    /// The nemesis, with "(lease reads)" when members ran with `--leader-lease-reads`.
    pub nemesis: String,
    pub target: String,
    pub runs: usize,
    pub counts: Counts,
    pub exactly_once: usize,
    pub linearizability: usize,
    /// Shared keys the linearizability search could not decide (its budget ran out).
    pub inconclusive: usize,
    pub watches: usize,
    pub fencing: usize,
    pub liveness: usize,
    /// The longest time from a heal to a successful write and linearizable read (ms).
    pub unavailability: Option<u64>,
    /// Heals after which service did not return before the next fault or the end.
    pub not_back: usize,
    pub heals: usize,
    /// Why the row has no figures, or what to know reading them.
    pub note: Option<String>,
    /// Output directories of runs with violations.
    pub kept: Vec<String>,
}

impl Row {
    /// Adds one run's figures.
    pub fn add(&mut self, counts: Counts, v: &Verdicts, recovery: &[Option<u64>]) {
        self.runs += 1;
        self.counts.add(counts);
        self.exactly_once += v.exactly_once.len();
        self.linearizability += v.linearizability.len();
        self.inconclusive += v.inconclusive.len();
        self.watches += v.watches.len();
        self.fencing += v.fencing.len();
        self.liveness += v.liveness.len();
        self.heals += recovery.len();
        self.not_back += recovery.iter().filter(|r| r.is_none()).count();
        if let Some(max) = recovery.iter().flatten().max() {
            self.unavailability = Some(self.unavailability.map_or(*max, |u| u.max(*max)));
        }
    }

    pub fn violations(&self) -> usize {
        self.exactly_once + self.linearizability + self.watches + self.fencing + self.liveness
    }
}

fn verdict(n: usize, runs: usize) -> String {
    match (runs, n) {
        (0, _) => "–".into(),
        (_, 0) => "ok".into(),
        (_, n) => format!("**{n} violation{}**", if n == 1 { "" } else { "s" }),
    }
}

fn seconds(ms: u64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

fn unavailability(r: &Row) -> String {
    if r.runs == 0 || r.heals == 0 {
        return "–".into();
    }
    let max = r.unavailability.map_or("–".into(), seconds);
    if r.not_back == 0 {
        max
    } else {
        format!(
            "{max}; {} of {} heals: not back in time",
            r.not_back, r.heals
        )
    }
}

/// The table, with a line of notes under it.
pub fn table(rows: &[Row]) -> String {
    let mut s = String::new();
    s.push_str("| nemesis | target | runs | ops | ok | fail | unknown | exactly-once | linearizable | watch | fencing | liveness | longest unavailability after a heal | note |\n");
    s.push_str("|---|---|--:|--:|--:|--:|--:|---|---|---|---|---|---|---|\n");
    for r in rows {
        let exactly_once = if r.target == "etcd" && r.runs > 0 {
            format!("{}¹", verdict(r.exactly_once, r.runs))
        } else {
            verdict(r.exactly_once, r.runs)
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.nemesis,
            r.target,
            r.runs,
            r.counts.ops,
            r.counts.ok,
            r.counts.failed,
            r.counts.unknown,
            exactly_once,
            match (verdict(r.linearizability, r.runs), r.inconclusive) {
                (v, 0) => v,
                (v, n) => format!("{v} ({n} key{} undecided)", if n == 1 { "" } else { "s" }),
            },
            verdict(r.watches, r.runs),
            verdict(r.fencing, r.runs),
            verdict(r.liveness, r.runs),
            unavailability(r),
            r.note.as_deref().unwrap_or("")
        );
    }
    if rows.iter().any(|r| r.target == "etcd") {
        s.push_str("\n¹ etcd has no sessions: its runs have no tracked writers, so only the lease rules (a fresh explicit id never \"already exists\", a long-lived lease is never \"not found\" at its revoke) are judged.\n");
    }
    let kept: Vec<&String> = rows.iter().flat_map(|r| &r.kept).collect();
    if !kept.is_empty() {
        s.push_str("\nRuns with violations (history, verdicts and member logs kept):\n");
        for k in kept {
            let _ = writeln!(s, "- `{k}`");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(target: &str) -> Row {
        Row {
            nemesis: "kill".into(),
            target: target.into(),
            ..Row::default()
        }
    }

    // A violation must stand out in the table and a clean run must say ok: the table is
    // what a reader acts on.
    #[test]
    fn a_violation_is_counted_in_its_checkers_column() {
        let mut r = row("oncekv");
        let v = Verdicts {
            linearizability: vec!["stale read".into()],
            ..Verdicts::default()
        };
        let counts = Counts {
            ops: 10,
            ok: 7,
            failed: 1,
            unknown: 2,
        };
        r.add(counts, &v, &[Some(1_200), Some(3_400)]);
        r.add(counts, &Verdicts::default(), &[Some(800), None]);
        let t = table(&[r.clone()]);
        let line = t.lines().nth(2).unwrap_or_default();
        assert_eq!(
            line,
            "| kill | oncekv | 2 | 20 | 14 | 2 | 4 | ok | **1 violation** | ok | ok | ok | 3.4 s; 1 of 4 heals: not back in time |  |"
        );
        assert_eq!(r.violations(), 1);
        assert!(!t.contains('¹'));
    }

    // A key the search could not decide is not a pass: the column says how many.
    #[test]
    fn undecided_keys_show_beside_the_linearizability_verdict() {
        let mut r = row("oncekv");
        let v = Verdicts {
            inconclusive: vec!["k1@3".into(), "k2@3".into()],
            ..Verdicts::default()
        };
        r.add(Counts::default(), &v, &[]);
        let t = table(&[r]);
        assert!(t.contains("| ok (2 keys undecided) |"), "{t}");
    }

    #[test]
    fn etcds_exactly_once_column_says_what_it_judged() {
        let mut r = row("etcd");
        r.add(Counts::default(), &Verdicts::default(), &[]);
        let t = table(&[r]);
        assert!(t.contains("| ok¹ |"), "{t}");
        assert!(t.contains("only the lease rules"));
    }

    #[test]
    fn a_skipped_nemesis_shows_dashes_and_its_reason() {
        let r = Row {
            note: Some("skipped: 5 members needed".into()),
            ..row("oncekv")
        };
        let t = table(&[r]);
        assert!(
            t.contains("| – | – | – | – | – | – | skipped: 5 members needed |"),
            "{t}"
        );
    }
}
