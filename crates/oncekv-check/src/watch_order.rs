//! The watchers' checker: each watcher's events against history for its range
//! ([`crate::watch`]): equal, revision for revision, from the watch's start to the last
//! revision written, without a gap, a repeat or a reordering.

use crate::watch::{Record, Seen};

/// Each watcher's events against the history (`history[i]` for watcher `i`): from its
/// start revision on, the same events in the same order, through the last one written.
pub fn check(records: &[Record], history: &[Vec<Seen>]) -> Vec<String> {
    let mut violations = Vec::new();
    for (i, (record, history)) in records.iter().zip(history).enumerate() {
        if let Some(e) = &record.error {
            violations.push(format!("watcher w{i} ended early: {e}"));
            continue;
        }
        let want: Vec<&Seen> = history
            .iter()
            .filter(|s| s.revision >= record.start)
            .collect();
        let first_difference = record
            .seen
            .iter()
            .zip(&want)
            .position(|(got, want)| got != *want);
        if let Some(at) = first_difference {
            violations.push(format!(
                "watcher w{i} (from revision {}): event {at} is {:?}, history has {:?}",
                record.start, record.seen[at], want[at]
            ));
        } else if record.seen.len() > want.len() {
            violations.push(format!(
                "watcher w{i}: {} events past the end of history, first {:?}",
                record.seen.len() - want.len(),
                record.seen[want.len()]
            ));
        } else if record.seen.len() < want.len() {
            violations.push(format!(
                "watcher w{i}: stopped after {} of {} events (next {:?})",
                record.seen.len(),
                want.len(),
                want[record.seen.len()]
            ));
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(revision: i64) -> Seen {
        Seen {
            revision,
            key: "k0".into(),
            put: true,
            value: format!("v{revision}"),
            prev: None,
        }
    }

    fn record(start: i64, revisions: &[i64]) -> Record {
        Record {
            start,
            seen: revisions.iter().map(|r| seen(*r)).collect(),
            ..Record::default()
        }
    }

    // The checker must catch each way a watch can break its promise, or the simulation's
    // clean watch runs prove nothing.
    #[test]
    fn a_gap_a_repeat_a_reordering_or_a_short_tail_is_a_violation() {
        let history = vec![(2..=6).map(seen).collect::<Vec<_>>()];
        assert!(check(&[record(1, &[2, 3, 4, 5, 6])], &history).is_empty());
        assert!(check(&[record(4, &[4, 5, 6])], &history).is_empty());
        for bad in [
            record(1, &[2, 3, 5, 6]),
            record(1, &[2, 3, 3, 4, 5, 6]),
            record(1, &[2, 4, 3, 5, 6]),
            record(1, &[2, 3, 4]),
            record(4, &[3, 4, 5, 6]),
        ] {
            assert_eq!(check(&[bad], &history).len(), 1);
        }
        let ended = Record {
            error: Some("compacted".into()),
            ..record(1, &[2, 3, 4, 5, 6])
        };
        assert_eq!(check(&[ended], &history).len(), 1);
    }
}
