//! The calls of a run as its clients saw them: what each asked, what it was answered,
//! and when. One [`Event`] a call; a history is the events in the order the calls
//! completed (each client's calls in the order it made them).
//!
//! The conventions the checkers rely on, whoever records the history:
//! - **shared keys** start with `k` (`k0`, `k1`, ...): every client reads and writes
//!   them; [`crate::linearizability`] checks each as a register;
//! - **own keys**, [`own_key`]`(c)`: only client `c` puts them, with values unique in
//!   the run, so their version counts the puts applied ([`crate::exactly_once`]);
//! - **the final read**: after the faults, client `c` reads its own key linearizably
//!   and records it under the key [`final_key`]`(c)`, the value as [`final_value`].

use serde::{Deserialize, Serialize};

/// What a call did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Answered; for reads the value seen, for CAS whether it succeeded.
    Ok(Option<String>),
    /// Refused with an answer (nothing applied).
    Failed(String),
    /// May or may not have been applied.
    Unknown,
}

/// The kind of a call, with its arguments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Call {
    Put {
        value: String,
    },
    Delete,
    /// Compare the value with `expect` (`None`: the key is absent), then put `value`.
    Cas {
        expect: Option<String>,
        value: String,
    },
    Get {
        serializable: bool,
    },
    LeaseGrant {
        id: i64,
        ttl: i64,
    },
    LeaseRevoke {
        id: i64,
        long_lived: bool,
    },
}

/// One recorded call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub client: usize,
    pub key: String,
    pub call: Call,
    pub outcome: Outcome,
    /// Milliseconds at invocation and at the answer, on one monotonic clock shared by
    /// every client of the history (any origin).
    pub start: u64,
    pub end: u64,
}

/// The key only client `client` writes: its final version must count its puts exactly.
pub fn own_key(client: usize) -> String {
    format!("own/{client}")
}

/// The key client `client`'s final read of its own key is recorded under.
pub fn final_key(client: usize) -> String {
    format!("final/{client}")
}

/// How the final read's answer is recorded: the value and the key's version.
pub fn final_value(value: &str, version: i64) -> String {
    format!("{value}@v{version}")
}
