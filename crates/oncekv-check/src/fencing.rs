//! The lockers' checker: their records against history (both in [`crate::lock`]).
//!
//! A partition or a paused client can let a holder's lease expire while it still believes
//! it holds the lock; the next waiter then gets the lock, and the old holder's guarded writes
//! must fail from then on. Nothing here trusts clocks: the checker reads history (the
//! replicas', or a cluster's as a watch from revision 1 reports it) of the lock's keys
//! and of [`FENCED`], and nothing else, and demands
//! - **ownership**: every write to [`FENCED`] was made at a revision where its writer's lock
//!   key was the live key under `lock/` with the lowest create revision, that is, the owner;
//! - **token order**: a holder's writes form one block, and the blocks come in increasing
//!   token order, so no two holders' critical sections overlap in token order;
//! - **the client's view**: a write a locker saw succeed is in history exactly once, one it
//!   saw refused (guard false) is not, one with an unknown outcome at most once; every token a
//!   locker was given is the create revision of its key, created in history at that revision.

use std::collections::BTreeMap;

use crate::lock::{Change, FENCED, Record, WriteOutcome, token_of};

/// The lockers' records against the history (see the module doc for what is demanded).
pub fn check(record: &Record, history: &[Change]) -> Vec<String> {
    let mut violations = Vec::new();
    // Live lock keys, by create revision, as history unfolds.
    let mut live: BTreeMap<String, i64> = BTreeMap::new();
    let mut created: BTreeMap<i64, String> = BTreeMap::new();
    let mut written: BTreeMap<String, usize> = BTreeMap::new();
    let mut last_token = 0;
    for c in history {
        if c.key != FENCED {
            if c.put {
                live.insert(c.key.clone(), c.create_revision);
                if c.create_revision == c.revision {
                    created.insert(c.revision, c.key.clone());
                }
            } else {
                live.remove(&c.key);
            }
            continue;
        }
        if !c.put {
            violations.push(format!("{FENCED} deleted at revision {}", c.revision));
            continue;
        }
        *written.entry(c.value.clone()).or_default() += 1;
        let Some(token) = token_of(&c.value) else {
            violations.push(format!("{FENCED} = {:?}: no token", c.value));
            continue;
        };
        let owner = live.values().min().copied();
        if owner != Some(token) {
            violations.push(format!(
                "mutual exclusion: {:?} written at revision {} under token {token}, but the \
                 owner then was {owner:?} (live lock keys {live:?})",
                c.value, c.revision
            ));
        }
        if token < last_token {
            violations.push(format!(
                "token order: {:?} at revision {} after writes under token {last_token}",
                c.value, c.revision
            ));
        }
        last_token = last_token.max(token);
    }
    for a in &record.acquisitions {
        if created.get(&a.token) != Some(&a.key) {
            violations.push(format!(
                "locker {} was given {} with token {}, but history created {:?} at that \
                 revision",
                a.locker,
                a.key,
                a.token,
                created.get(&a.token)
            ));
        }
        for (value, outcome) in &a.writes {
            let n = written.get(value).copied().unwrap_or(0);
            let ok = match outcome {
                WriteOutcome::Written => n == 1,
                WriteOutcome::Refused => n == 0,
                WriteOutcome::Unknown => n <= 1,
            };
            if !ok {
                violations.push(format!(
                    "locker {} saw {value} {outcome:?}, history has it {n} times",
                    a.locker
                ));
            }
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::Acquisition;

    fn change(revision: i64, key: &str, put: bool, value: &str, create: i64) -> Change {
        Change {
            revision,
            key: key.into(),
            put,
            value: value.into(),
            create_revision: create,
        }
    }

    fn acquisition(
        locker: usize,
        key: &str,
        token: i64,
        writes: &[(&str, WriteOutcome)],
    ) -> Acquisition {
        Acquisition {
            locker,
            key: key.into(),
            token,
            writes: writes.iter().map(|(v, o)| ((*v).to_string(), *o)).collect(),
            lost: false,
        }
    }

    /// Two holders one after the other, the second waiting behind the first.
    fn good_history() -> Vec<Change> {
        vec![
            change(2, "lock/a", true, "", 2),
            change(3, "lock/b", true, "", 3),
            change(4, FENCED, true, "t2:0:l0", 4),
            change(5, FENCED, true, "t2:1:l0", 4),
            change(6, "lock/a", false, "", 0),
            change(7, FENCED, true, "t3:0:l1", 4),
        ]
    }

    fn good_record() -> Record {
        Record {
            acquisitions: vec![
                acquisition(
                    0,
                    "lock/a",
                    2,
                    &[
                        ("t2:0:l0", WriteOutcome::Written),
                        ("t2:1:l0", WriteOutcome::Unknown),
                    ],
                ),
                acquisition(1, "lock/b", 3, &[("t3:0:l1", WriteOutcome::Written)]),
            ],
            failures: Vec::new(),
        }
    }

    #[test]
    fn a_clean_run_passes() {
        assert_eq!(check(&good_record(), &good_history()), Vec::<String>::new());
    }

    #[test]
    fn a_write_by_a_waiter_is_a_mutual_exclusion_violation() {
        let mut h = good_history();
        // lock/b writes while lock/a still lives.
        h.insert(2, change(4, FENCED, true, "t3:9:l1", 4));
        let v = check(&good_record(), &h);
        assert!(v.iter().any(|s| s.starts_with("mutual exclusion")), "{v:?}");
    }

    #[test]
    fn an_old_token_after_a_newer_one_is_a_token_order_violation() {
        let mut h = good_history();
        // The first holder's write lands after the second's, with lock/a recreated so
        // that ownership alone would not catch it.
        h.push(change(8, "lock/b", false, "", 0));
        h.push(change(9, "lock/a", true, "", 2));
        h.push(change(10, FENCED, true, "t2:2:l0", 4));
        let v = check(&good_record(), &h);
        assert!(v.iter().any(|s| s.starts_with("token order")), "{v:?}");
    }

    #[test]
    fn a_refused_write_in_history_or_a_written_one_missing_is_caught() {
        let mut r = good_record();
        r.acquisitions[1].writes[0].1 = WriteOutcome::Refused;
        assert_eq!(check(&r, &good_history()).len(), 1);
        let mut h = good_history();
        h.retain(|c| c.value != "t2:0:l0");
        assert_eq!(check(&good_record(), &h).len(), 1);
    }

    #[test]
    fn a_token_that_history_never_created_is_caught() {
        let mut r = good_record();
        r.acquisitions[1].token = 5;
        r.acquisitions[1].writes.clear();
        let v = check(&r, &good_history());
        assert!(v.iter().any(|s| s.contains("history created")), "{v:?}");
    }
}
