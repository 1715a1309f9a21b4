//! A Wing–Gong style linearizability checker (with the memoization of Lowe's WGL, as in
//! porcupine) for each shared key (`k…`, see [`crate::history`]) as a register with CAS.
//!
//! Each key is checked on its own (linearizability is compositional). An operation with
//! an unknown outcome may take effect at any time after its call, or never: it gets an
//! infinite return time and the search may leave it out. Serializable reads may be stale
//! by design and are not part of the history; failed reads tell nothing and are dropped.

use std::collections::{BTreeMap, HashSet};

use crate::history::{Call, Event, Outcome};

/// Give up (inconclusive, not a violation) after exploring this many states for a key.
const MAX_STATES: usize = 2_000_000;

type Value = Option<String>;

#[derive(Debug, Clone)]
enum Kind {
    Write(Value),
    /// Compare-and-swap; `outcome`: `Some(true|false)` when known.
    Cas {
        expect: Value,
        value: String,
        outcome: Option<bool>,
    },
    Read(Value),
}

#[derive(Debug, Clone)]
struct Op {
    start: u64,
    end: u64,
    known: bool,
    kind: Kind,
    what: String,
}

impl Op {
    /// The state after this op, or `None` if it cannot happen in `state`.
    fn step(&self, state: &Value) -> Option<Value> {
        match &self.kind {
            Kind::Write(v) => Some(v.clone()),
            Kind::Read(v) => (v == state).then(|| state.clone()),
            Kind::Cas {
                expect,
                value,
                outcome,
            } => {
                let holds = expect == state;
                match outcome {
                    Some(o) if *o != holds => None,
                    _ if holds => Some(Some(value.clone())),
                    _ => Some(state.clone()),
                }
            }
        }
    }
}

fn to_op(e: &Event) -> Option<Op> {
    let known = match &e.outcome {
        Outcome::Ok(_) => true,
        Outcome::Unknown => false,
        Outcome::Failed(_) => return None,
    };
    let kind = match (&e.call, &e.outcome) {
        (Call::Put { value }, _) => Kind::Write(Some(value.clone())),
        (Call::Delete, _) => Kind::Write(None),
        (Call::Cas { expect, value }, o) => Kind::Cas {
            expect: expect.clone(),
            value: value.clone(),
            outcome: match o {
                Outcome::Ok(Some(s)) => Some(s == "true"),
                _ => None,
            },
        },
        (
            Call::Get {
                serializable: false,
            },
            Outcome::Ok(v),
        ) => Kind::Read(v.clone()),
        _ => return None,
    };
    Some(Op {
        start: e.start,
        end: if known { e.end } else { u64::MAX },
        known,
        kind,
        what: format!(
            "c{} {:?} -> {:?} [{}..{}]",
            e.client, e.call, e.outcome, e.start, e.end
        ),
    })
}

/// Checks every shared key (`k…`) of `history`.
pub fn check_all(history: &[Event]) -> Vec<String> {
    judge_all(history).violations
}

/// What [`judge_all`] found: the violations (as [`check_all`] gives them), and the keys
/// whose search ran out of its budget (neither passed nor failed: a report must say so,
/// not count them as passed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Judged {
    pub violations: Vec<String>,
    pub inconclusive: Vec<String>,
}

/// [`check_all`], also naming the keys it could not decide.
pub fn judge_all(history: &[Event]) -> Judged {
    let mut by_key: BTreeMap<&str, Vec<Op>> = BTreeMap::new();
    for e in history.iter().filter(|e| e.key.starts_with('k')) {
        if let Some(op) = to_op(e) {
            by_key.entry(e.key.as_str()).or_default().push(op);
        }
    }
    let mut out = Judged::default();
    for (key, ops) in by_key {
        match check(&ops) {
            Verdict::Ok => {}
            Verdict::Inconclusive => out.inconclusive.push(key.to_string()),
            Verdict::Violation => {
                let mut msg = format!(
                    "linearizability: no valid order for the {} operations on {key}:",
                    ops.len()
                );
                for op in ops.iter().take(40) {
                    msg.push_str("\n      ");
                    msg.push_str(&op.what);
                }
                out.violations.push(msg);
            }
        }
    }
    out
}

/// The checker's answer for one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    Violation,
    Inconclusive,
}

struct Search<'a> {
    ops: &'a [Op],
    seen: HashSet<(Vec<u64>, Value)>,
}

fn check(ops: &[Op]) -> Verdict {
    let mut s = Search {
        ops,
        seen: HashSet::new(),
    };
    let done = vec![0u64; ops.len().div_ceil(64)];
    match s.dfs(&done, &None) {
        Some(true) => Verdict::Ok,
        Some(false) => Verdict::Violation,
        None => Verdict::Inconclusive,
    }
}

fn is_set(bits: &[u64], i: usize) -> bool {
    bits[i / 64] & (1 << (i % 64)) != 0
}

impl Search<'_> {
    /// `Some(true)`: the remaining ops linearize from `state`; `None`: budget spent.
    fn dfs(&mut self, done: &[u64], state: &Value) -> Option<bool> {
        let pending: Vec<usize> = (0..self.ops.len()).filter(|&i| !is_set(done, i)).collect();
        if pending.iter().all(|&i| !self.ops[i].known) {
            return Some(true);
        }
        // An op may go next only if no pending op returned before it was called.
        let min_end = pending
            .iter()
            .map(|&i| self.ops[i].end)
            .min()
            .unwrap_or(u64::MAX);
        for &i in &pending {
            let op = &self.ops[i];
            if op.start > min_end {
                continue;
            }
            let Some(next) = op.step(state) else { continue };
            let mut bits = done.to_vec();
            bits[i / 64] |= 1 << (i % 64);
            if !self.seen.insert((bits.clone(), next.clone())) {
                continue;
            }
            if self.seen.len() > MAX_STATES {
                return None;
            }
            if self.dfs(&bits, &next)? {
                return Some(true);
            }
        }
        Some(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(start: u64, end: u64, kind: Kind) -> Op {
        Op {
            start,
            end,
            known: end != u64::MAX,
            kind,
            what: String::new(),
        }
    }

    fn w(v: &str) -> Kind {
        Kind::Write(Some(v.to_string()))
    }

    fn r(v: Option<&str>) -> Kind {
        Kind::Read(v.map(str::to_string))
    }

    // Overlapping ops may take effect in either order.
    #[test]
    fn concurrent_write_and_read_linearize() {
        let ops = [
            op(0, 10, w("a")),
            op(5, 15, r(Some("a"))),
            op(5, 15, r(None)),
        ];
        assert_eq!(check(&ops), Verdict::Ok);
    }

    // A read after a completed write must see it (or something later): the stale read
    // is what a lost acknowledged write looks like.
    #[test]
    fn stale_read_after_completed_write_is_a_violation() {
        let ops = [
            op(0, 10, w("a")),
            op(20, 30, w("b")),
            op(40, 50, r(Some("a"))),
        ];
        assert_eq!(check(&ops), Verdict::Violation);
    }

    // A write applied twice (a duplicate executed late) resurrects an overwritten value.
    #[test]
    fn resurrected_value_is_a_violation() {
        let ops = [
            op(0, 10, w("a")),
            op(20, 30, w("b")),
            op(40, 50, r(Some("b"))),
            op(60, 70, r(Some("a"))),
        ];
        assert_eq!(check(&ops), Verdict::Violation);
    }

    // An unknown write may have happened at any time after its call, or never.
    #[test]
    fn unknown_write_may_apply_late_or_never() {
        let late = [
            op(0, u64::MAX, w("a")),
            op(50, 60, r(None)),
            op(70, 80, r(Some("a"))),
        ];
        assert_eq!(check(&late), Verdict::Ok);
        let never = [op(0, u64::MAX, w("a")), op(50, 60, r(None))];
        assert_eq!(check(&never), Verdict::Ok);
    }

    #[test]
    fn failed_cas_needs_a_different_value() {
        let cas = |outcome| Kind::Cas {
            expect: None,
            value: "x".into(),
            outcome: Some(outcome),
        };
        assert_eq!(check(&[op(0, 10, cas(false))]), Verdict::Violation);
        assert_eq!(
            check(&[op(0, 10, cas(true)), op(20, 30, r(Some("x")))]),
            Verdict::Ok
        );
    }
}
