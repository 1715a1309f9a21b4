//! Keeps openraft's routine election chatter off a healthy member's log.
//!
//! When a candidate wins, the vote replies still on their way arrive after its vote has
//! become a leader's, and openraft drops each with a WARN ("A message will be ignored
//! because vote changed ..."). Every clean start and every election prints a few, so a
//! new user's first screen reads as trouble when nothing is wrong. etcd logs an election
//! at INFO; oncekv's own INFO line for it comes from the server ("elected leader ... at
//! term ..."). This layer vetoes just that message; every other openraft warning passes.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// The start of the message vetoed.
const STALE_VOTE_REPLY: &str = "A message will be ignored because vote changed";

/// A layer whose only effect is to veto openraft's stale-vote warning for every layer.
#[derive(Debug, Clone, Copy, Default)]
pub struct QuietElections;

impl<S: Subscriber> Layer<S> for QuietElections {
    fn event_enabled(&self, event: &Event<'_>, _ctx: Context<'_, S>) -> bool {
        let meta = event.metadata();
        if *meta.level() != Level::WARN || !meta.target().starts_with("openraft") {
            return true;
        }
        let mut message = StartsWith {
            prefix: STALE_VOTE_REPLY,
            found: false,
        };
        event.record(&mut message);
        !message.found
    }
}

/// Whether an event's `message` field starts with `prefix`.
struct StartsWith {
    prefix: &'static str,
    found: bool,
}

impl Visit for StartsWith {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.found = format!("{value:?}").starts_with(self.prefix);
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.found = value.starts_with(self.prefix);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt;

    /// Collects the messages that reach it.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<String>>>);

    impl<S: Subscriber> Layer<S> for Seen {
        fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
            let mut m = Message(String::new());
            event.record(&mut m);
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(m.0);
        }
    }

    struct Message(String);

    impl Visit for Message {
        fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
            if field.name() == "message" {
                self.0 = format!("{value:?}");
            }
        }
    }

    #[test]
    fn only_the_stale_vote_warning_is_vetoed() {
        let seen = Seen::default();
        let subscriber = tracing_subscriber::registry()
            .with(QuietElections)
            .with(seen.clone());
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(target: "openraft::core::raft_core", "A message will be ignored because vote changed: msg sent by vote: T1");
            tracing::warn!(target: "openraft::core::raft_core", "leader has removed target: 3");
            tracing::info!(target: "openraft::core::raft_core", "A message will be ignored because vote changed (info)");
            tracing::warn!(target: "oncekv", "A message will be ignored because vote changed (ours)");
        });
        let seen = seen
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert!(seen.iter().all(|m| !m.contains("T1")), "{seen:?}");
    }
}
