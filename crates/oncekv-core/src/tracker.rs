//! The client side of exactly-once: numbering requests.

use std::collections::BTreeSet;

/// Hands out sequence numbers and tracks which have responses. Independent of transport.
///
/// The client MUST send a retry with the seq it was first given (never a new one), and MUST
/// call [`complete`](Self::complete) only once it holds the response: `first_incomplete`
/// tells the servers they may forget every response below it.
#[derive(Debug, Clone)]
pub struct RequestTracker {
    next_seq: u64,
    incomplete: BTreeSet<u64>,
}

impl Default for RequestTracker {
    fn default() -> Self {
        RequestTracker {
            next_seq: 1,
            incomplete: BTreeSet::new(),
        }
    }
}

impl RequestTracker {
    pub fn new() -> RequestTracker {
        RequestTracker::default()
    }

    /// The next sequence number (from 1, never reused), now outstanding.
    pub fn next_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.incomplete.insert(seq);
        seq
    }

    /// Marks `seq` as answered (or abandoned). Unknown or repeated seqs are ignored.
    pub fn complete(&mut self, seq: u64) {
        self.incomplete.remove(&seq);
    }

    /// The smallest seq without a response (`next_seq` if none is outstanding).
    pub fn first_incomplete(&self) -> u64 {
        self.incomplete.first().copied().unwrap_or(self.next_seq)
    }

    /// How many requests are outstanding.
    pub fn in_flight(&self) -> usize {
        self.incomplete.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Sequence numbers must never repeat, or a new request would get an old response.
    #[test]
    fn seqs_start_at_one_and_are_never_reused() {
        let mut t = RequestTracker::new();
        let a = t.next_seq();
        t.complete(a);
        let b = t.next_seq();
        assert_eq!((a, b), (1, 2));
    }

    // first_incomplete is what lets servers drop saved responses; it must not pass a seq
    // still waiting for its response.
    #[test]
    fn first_incomplete_is_the_oldest_unanswered_seq() {
        let mut t = RequestTracker::new();
        assert_eq!(t.first_incomplete(), 1);
        let (a, b, c) = (t.next_seq(), t.next_seq(), t.next_seq());
        t.complete(b);
        assert_eq!(t.first_incomplete(), a);
        t.complete(a);
        assert_eq!(t.first_incomplete(), c);
        t.complete(c);
        assert_eq!(t.first_incomplete(), 4);
        assert_eq!(t.in_flight(), 0);
    }
}
