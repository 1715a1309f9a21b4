//! What lockers did under one lock, and what history holds for the lock's keys and the
//! key they write under it. [`crate::fencing`] compares the two.
//!
//! The conventions: the lock is [`LOCK`], its waiters' keys are `lock/<lease hex>` (as
//! etcd's `concurrency.Mutex` makes them), a holder's fencing token is its key's create
//! revision, and a holder writes [`FENCED`] with values [`fenced_value`] makes, which
//! carry the token.

use serde::{Deserialize, Serialize};

/// The lock's name; its waiters' keys are `lock/<lease hex>`.
pub const LOCK: &str = "lock";
/// The key holders write under the lock.
pub const FENCED: &str = "fenced";

/// What one guarded write did, as the locker saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WriteOutcome {
    /// Applied: the guard held.
    Written,
    /// Answered, guard false: the lock key was gone (the lock was lost).
    Refused,
    /// Not known.
    Unknown,
}

/// One acquisition and the writes made under it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acquisition {
    pub locker: usize,
    pub key: String,
    pub token: i64,
    /// `(value written, outcome)`, in order.
    pub writes: Vec<(String, WriteOutcome)>,
    /// The lease was found gone while the locker held the lock.
    #[serde(default)]
    pub lost: bool,
}

/// What every locker recorded.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub acquisitions: Vec<Acquisition>,
    /// Lock or unlock calls that failed (timeouts, the session lost mid-call).
    pub failures: Vec<String>,
}

/// One change to the lock's keys or to [`FENCED`], from history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    pub revision: i64,
    pub key: String,
    /// A put (`false`: a delete).
    pub put: bool,
    pub value: String,
    pub create_revision: i64,
}

/// The value of write `i` under `token` by `locker`: unique in the run.
pub fn fenced_value(token: i64, i: usize, locker: usize) -> String {
    format!("t{token}:{i}:l{locker}")
}

/// The token a [`FENCED`] value was written under.
pub fn token_of(value: &str) -> Option<i64> {
    value.strip_prefix('t')?.split(':').next()?.parse().ok()
}

/// A line of the CLI's `--locks` file: an acquisition, a failed lock or unlock call, or
/// a change from history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Line {
    Acquisition(Acquisition),
    Failure(String),
    Change(Change),
}

/// The lockers' record and history from `lines`, history in revision order (stable:
/// one revision's changes keep their order), as [`crate::fencing::check`] wants them.
pub fn split(lines: Vec<Line>) -> (Record, Vec<Change>) {
    let mut record = Record::default();
    let mut history = Vec::new();
    for line in lines {
        match line {
            Line::Acquisition(a) => record.acquisitions.push(a),
            Line::Failure(f) => record.failures.push(f),
            Line::Change(c) => history.push(c),
        }
    }
    history.sort_by_key(|c| c.revision);
    (record, history)
}
