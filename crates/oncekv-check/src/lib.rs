//! oncekv's history checkers: given what a run's clients did and saw, and what the
//! cluster's history holds, every way the run broke a promise.
//!
//! The promises: a write through a session applies exactly once ([`exactly_once`]),
//! reads and writes of a key are linearizable ([`linearizability`]), a watch reports
//! every revision of its range once and in order ([`watch_order`]), and a lock holder's
//! fenced writes land only while it owns the lock ([`fencing`]). The checkers know
//! nothing of how the history was made: the deterministic simulation (`oncekv-sim`),
//! the nemesis runner against real processes (`oncekv-nemesis`) and a run against etcd
//! itself are judged by the same code. Times are milliseconds on one monotonic clock;
//! an outcome the client could not learn is *unknown*, never failed.
//!
//! # Layers
//!
//! Dependencies run downward only:
//! 1. **Files** ([`jsonl`]): histories as JSON Lines, read with the line of any error;
//!    what the `oncekv-check` binary runs.
//! 2. **Checkers** ([`exactly_once`], [`linearizability`], [`watch_order`], [`fencing`];
//!    [`check_calls`] runs the first two): pure functions from a history to the list of
//!    violations, each a sentence a person can act on.
//! 3. **Vocabulary** ([`history`]: calls and their outcomes; [`watch`]: what a watcher
//!    saw; [`lock`]: what a locker did and the lock's history): plain data, serde-ready,
//!    and the naming conventions (own keys, final reads, fenced values) the checkers
//!    rely on.
//!
//! ```
//! use oncekv_check::{Call, Event, Outcome};
//!
//! let put = |value: &str, start, end| Event {
//!     client: 0,
//!     key: "k0".into(),
//!     call: Call::Put { value: value.into() },
//!     outcome: Outcome::Ok(None),
//!     start,
//!     end,
//! };
//! let read = Event {
//!     client: 1,
//!     key: "k0".into(),
//!     call: Call::Get { serializable: false },
//!     outcome: Outcome::Ok(Some("a".into())),
//!     start: 40,
//!     end: 50,
//! };
//! // "b" was acknowledged before the read began: reading "a" is stale.
//! let history = [put("a", 0, 10), put("b", 20, 30), read];
//! assert_eq!(oncekv_check::linearizability::check_all(&history).len(), 1);
//! ```

pub mod exactly_once;
pub mod fencing;
pub mod history;
pub mod jsonl;
pub mod linearizability;
pub mod lock;
pub mod watch;
pub mod watch_order;

pub use history::{Call, Event, Outcome, final_key, final_value, own_key};

/// Every violation in a history of calls: [`exactly_once::check`] for clients
/// `0..clients`, then [`linearizability::check_all`].
pub fn check_calls(history: &[Event], clients: usize) -> Vec<String> {
    judge_calls(history, clients).violations
}

/// [`check_calls`], also naming the shared keys whose linearizability search ran out of
/// its budget (neither passed nor failed).
pub fn judge_calls(history: &[Event], clients: usize) -> linearizability::Judged {
    let mut judged = linearizability::judge_all(history);
    let mut violations = exactly_once::check(history, clients);
    violations.append(&mut judged.violations);
    judged.violations = violations;
    judged
}
