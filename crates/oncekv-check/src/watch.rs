//! What a watcher saw, and what history holds for its range: one [`Seen`] an event.
//! [`crate::watch_order`] compares the two.

use serde::{Deserialize, Serialize};

/// One event as a watcher received it, or as history holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seen {
    pub revision: i64,
    pub key: String,
    /// A put (`false`: a delete).
    pub put: bool,
    pub value: String,
    /// The previous value (watches ask for it).
    pub prev: Option<String>,
}

/// What a watcher recorded.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The revision the watch started at (its first revision to report).
    pub start: i64,
    pub seen: Vec<Seen>,
    /// How often the watch resumed on another member (reported, not judged).
    #[serde(default)]
    pub resumes: u64,
    /// Why the watch ended early, if it did.
    #[serde(default)]
    pub error: Option<String>,
}

/// One watcher's record beside history for its range (from revision 1): a line of the
/// CLI's `--watches` file.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watched {
    pub record: Record,
    pub history: Vec<Seen>,
}
