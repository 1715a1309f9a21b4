//! Judging a run with `oncekv-check`'s checkers (this crate writes none of its own), and
//! keeping its history as the JSON Lines files `oncekv-check` re-judges:
//!
//! ```sh
//! oncekv-check --history calls.jsonl --watches watches.jsonl --locks locks.jsonl --clients N
//! ```

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use oncekv_check::lock::{self, Change, Line};
use oncekv_check::watch::{self, Watched};
use oncekv_check::{Event, Outcome, exactly_once, fencing, jsonl, linearizability, watch_order};
use serde::Serialize;

use crate::nemesis::Window;
use crate::workload::PROBE_KEY;

/// Each checker's violations (empty: it passed).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Verdicts {
    /// Own keys' versions against the tracked puts, lease answers, final reads.
    pub exactly_once: Vec<String>,
    /// Every shared key as a register, final reads included (so an acknowledged write
    /// lost after the heal is a violation here).
    pub linearizability: Vec<String>,
    /// Shared keys whose linearizability search ran out of its budget: not checked.
    pub inconclusive: Vec<String>,
    pub watches: Vec<String>,
    pub fencing: Vec<String>,
    /// Members that exited by themselves, and the cluster failing the harness after the
    /// heal (no history from revision 1).
    pub liveness: Vec<String>,
}

impl Verdicts {
    pub fn violations(&self) -> usize {
        self.exactly_once.len()
            + self.linearizability.len()
            + self.watches.len()
            + self.fencing.len()
            + self.liveness.len()
    }

    /// Every violation, each on a line with its checker's name.
    pub fn lines(&self) -> Vec<String> {
        let groups = [
            ("exactly-once", &self.exactly_once),
            ("linearizability", &self.linearizability),
            ("watch", &self.watches),
            ("fencing", &self.fencing),
            ("liveness", &self.liveness),
        ];
        groups
            .iter()
            .flat_map(|(name, v)| v.iter().map(move |s| format!("[{name}] {s}")))
            .collect()
    }
}

/// What the run recorded, ready to judge and to write.
#[derive(Debug)]
pub struct Recorded {
    pub calls: Vec<Event>,
    /// Tracked clients, `0..tracked`.
    pub tracked: usize,
    /// Each watcher's record beside history for its range.
    pub watches: Vec<Watched>,
    pub locks: lock::Record,
    /// History of the lock's keys and the fenced key; `Err`: none could be read.
    pub lock_history: Result<Vec<Change>, String>,
    pub windows: Vec<Window>,
}

/// Runs every checker on `r`; `crashes` go in as liveness violations.
pub fn judge(r: &Recorded, crashes: &[String]) -> Verdicts {
    let mut liveness: Vec<String> = crashes.to_vec();
    let fencing = match &r.lock_history {
        Ok(history) => fencing::check(&r.locks, history),
        Err(e) => {
            liveness.push(format!("no history of the lock after the heal: {e}"));
            Vec::new()
        }
    };
    let (records, histories): (Vec<watch::Record>, Vec<Vec<watch::Seen>>) = r
        .watches
        .iter()
        .map(|w| (w.record.clone(), w.history.clone()))
        .unzip();
    let watches = if r.lock_history.is_ok() {
        watch_order::check(&records, &histories)
    } else {
        Vec::new()
    };
    let judged = linearizability::judge_all(&r.calls);
    Verdicts {
        exactly_once: exactly_once::check(&r.calls, r.tracked),
        linearizability: judged.violations,
        inconclusive: judged.inconclusive,
        watches,
        fencing,
        liveness,
    }
}

/// Calls counted for the report: the workload's (the prober's only show availability).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub ops: usize,
    pub ok: usize,
    pub failed: usize,
    pub unknown: usize,
}

impl Counts {
    pub fn of(calls: &[Event]) -> Counts {
        let mut c = Counts::default();
        for e in calls.iter().filter(|e| e.key != PROBE_KEY) {
            c.ops += 1;
            match e.outcome {
                Outcome::Ok(_) => c.ok += 1,
                Outcome::Failed(_) => c.failed += 1,
                Outcome::Unknown => c.unknown += 1,
            }
        }
        c
    }

    pub fn add(&mut self, o: Counts) {
        self.ops += o.ops;
        self.ok += o.ok;
        self.failed += o.failed;
        self.unknown += o.unknown;
    }
}

fn create(dir: &Path, name: &str) -> Result<BufWriter<File>, String> {
    let path = dir.join(name);
    File::create(&path)
        .map(BufWriter::new)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Writes `calls.jsonl`, `watches.jsonl`, `locks.jsonl` (`oncekv-check`'s three files),
/// `faults.jsonl` (the periods) and `verdicts.json` into `dir`.
pub fn write(dir: &Path, r: &Recorded, verdicts: &Verdicts) -> Result<(), String> {
    let io = |e: std::io::Error| format!("{}: {e}", dir.display());
    jsonl::write(create(dir, "calls.jsonl")?, &r.calls).map_err(io)?;
    jsonl::write(create(dir, "watches.jsonl")?, &r.watches).map_err(io)?;
    let mut lines: Vec<Line> = Vec::new();
    lines.extend(r.locks.acquisitions.iter().cloned().map(Line::Acquisition));
    lines.extend(r.locks.failures.iter().cloned().map(Line::Failure));
    if let Ok(h) = &r.lock_history {
        lines.extend(h.iter().cloned().map(Line::Change));
    }
    jsonl::write(create(dir, "locks.jsonl")?, &lines).map_err(io)?;
    jsonl::write(create(dir, "faults.jsonl")?, &r.windows).map_err(io)?;
    serde_json::to_writer_pretty(create(dir, "verdicts.json")?, verdicts)
        .map_err(|e| format!("verdicts.json: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncekv_check::Call;

    fn event(key: &str, outcome: Outcome) -> Event {
        Event {
            client: 0,
            key: key.into(),
            call: Call::Put { value: "v".into() },
            outcome,
            start: 0,
            end: 1,
        }
    }

    #[test]
    fn counts_leave_the_prober_out() {
        let calls = [
            event("k0.0", Outcome::Ok(None)),
            event("k0.0", Outcome::Unknown),
            event("own/0", Outcome::Failed("no".into())),
            event(PROBE_KEY, Outcome::Unknown),
        ];
        assert_eq!(
            Counts::of(&calls),
            Counts {
                ops: 3,
                ok: 1,
                failed: 1,
                unknown: 1
            }
        );
    }

    // The files must be what `oncekv-check` reads back, or a run cannot be re-judged.
    #[test]
    fn written_files_read_back_with_the_same_verdicts() -> Result<(), String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let stale = Event {
            client: 1,
            key: "k0.0".into(),
            call: Call::Get {
                serializable: false,
            },
            outcome: Outcome::Ok(None),
            start: 5,
            end: 6,
        };
        let r = Recorded {
            calls: vec![event("k0.0", Outcome::Ok(None)), stale],
            tracked: 0,
            watches: Vec::new(),
            locks: Default::default(),
            lock_history: Ok(Vec::new()),
            windows: Vec::new(),
        };
        let v = judge(&r, &[]);
        assert_eq!(v.linearizability.len(), 1, "{v:?}");
        write(dir.path(), &r, &v)?;
        let file = File::open(dir.path().join("calls.jsonl")).map_err(|e| e.to_string())?;
        let again = jsonl::check_history(std::io::BufReader::new(file), Some(0))
            .map_err(|e| e.to_string())?;
        assert_eq!(again, v.linearizability);
        Ok(())
    }
}
