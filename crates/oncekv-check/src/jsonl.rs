//! JSON Lines, the form a history is kept in between the run that records it and the
//! checkers: one JSON object a line (blank lines are skipped). The `oncekv-check` CLI
//! reads its three files with the `check_*` functions here; the format is in the crate's
//! README.

use std::fmt;
use std::io::{self, BufRead, Write};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::history::Event;
use crate::{fencing, lock, watch, watch_order};

/// Input that could not be read: the line (1-based) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for ReadError {}

/// Every line of `input` as a `T`.
pub fn read<T: DeserializeOwned>(input: impl BufRead) -> Result<Vec<T>, ReadError> {
    let mut out = Vec::new();
    for (i, line) in input.lines().enumerate() {
        let error = |message: String| ReadError {
            line: i + 1,
            message,
        };
        let line = line.map_err(|e| error(e.to_string()))?;
        if line.trim().is_empty() {
            continue;
        }
        out.push(serde_json::from_str(&line).map_err(|e| error(e.to_string()))?);
    }
    Ok(out)
}

/// `items` to `output`, one line each.
pub fn write<'a, T: Serialize + 'a>(
    mut output: impl Write,
    items: impl IntoIterator<Item = &'a T>,
) -> io::Result<()> {
    for item in items {
        serde_json::to_writer(&mut output, item)?;
        output.write_all(b"\n")?;
    }
    output.flush()
}

/// The violations in a history of calls ([`Event`] lines), for clients `0..clients`
/// (`None`: every client the history names, up to the highest index).
pub fn check_history(
    input: impl BufRead,
    clients: Option<usize>,
) -> Result<Vec<String>, ReadError> {
    Ok(judge_history(input, clients)?.violations)
}

/// [`check_history`], also naming the keys whose linearizability was left undecided.
pub fn judge_history(
    input: impl BufRead,
    clients: Option<usize>,
) -> Result<crate::linearizability::Judged, ReadError> {
    let history: Vec<Event> = read(input)?;
    let clients =
        clients.unwrap_or_else(|| history.iter().map(|e| e.client + 1).max().unwrap_or(0));
    Ok(crate::judge_calls(&history, clients))
}

/// The violations in watchers' records ([`watch::Watched`] lines, watcher `i` on line
/// `i`).
pub fn check_watches(input: impl BufRead) -> Result<Vec<String>, ReadError> {
    let (records, histories): (Vec<watch::Record>, Vec<Vec<watch::Seen>>) =
        read::<watch::Watched>(input)?
            .into_iter()
            .map(|w| (w.record, w.history))
            .unzip();
    Ok(watch_order::check(&records, &histories))
}

/// The violations in lockers' records ([`lock::Line`] lines).
pub fn check_locks(input: impl BufRead) -> Result<Vec<String>, ReadError> {
    let (record, history) = lock::split(read(input)?);
    Ok(fencing::check(&record, &history))
}
