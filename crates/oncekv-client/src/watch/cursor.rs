//! The resume point of a watch: which revision the caller has got to, and what each
//! response from the server means for it. Pure (no I/O), so the rules that make "no gap, no
//! repeat" hold are tested here directly.

use oncekv_proto::etcdserverpb as pb;
use oncekv_proto::mvccpb;

use crate::error::Error;
use crate::responses::{Event, WatchResponse};

/// Where delivery has got, and the rules for each response from the server. Pure: the
/// task feeds it responses and acts on the [`Step`] it returns.
#[derive(Debug)]
pub(super) struct Cursor {
    /// The first revision not yet delivered: a resumed watch starts here. 0 while unknown
    /// (a watch from now on, not created yet).
    next: i64,
    /// Whether `next` is certain: the caller's start revision, or past a delivered event
    /// or a progress notification. A `next` taken from a `created` response's header is
    /// the server's estimate of where the watch began; an event below it is passed on
    /// (the server's watcher started earlier) rather than treated as a repeat.
    certain: bool,
    /// Events of a fragmented response, until its last fragment.
    fragments: Vec<mvccpb::Event>,
}

/// What to do with one response from the server.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// Nothing for the caller (a `created` ack, a fragment of an unfinished response).
    Nothing,
    /// Deliver this response to the caller.
    Deliver(WatchResponse),
    /// The server ended the watch; tell the caller why.
    End(Error),
    /// The server confirmed the cancel the caller asked for.
    Cancelled,
}

impl Cursor {
    pub(super) fn new(start_revision: i64) -> Cursor {
        Cursor {
            next: start_revision.max(0),
            certain: start_revision > 0,
            fragments: Vec::new(),
        }
    }

    /// The start revision of a (re)created watch: where delivery has got (0: from now).
    pub(super) fn start(&self) -> i64 {
        self.next
    }

    pub(super) fn on_response(&mut self, r: pb::WatchResponse, cancelling: bool) -> Step {
        let header_revision = r.header.as_ref().map_or(0, |h| h.revision);
        if r.canceled {
            self.fragments.clear();
            return if r.compact_revision > 0 {
                Step::End(Error::Compacted {
                    compact_revision: r.compact_revision,
                })
            } else if cancelling {
                Step::Cancelled
            } else {
                let reason = if r.cancel_reason.is_empty() {
                    "no reason given".to_string()
                } else {
                    r.cancel_reason
                };
                Step::End(Error::WatchCanceled { reason })
            };
        }
        if r.created {
            // A watch from now on starts after the revision current at its creation.
            if self.next == 0 && header_revision > 0 {
                self.next = header_revision + 1;
            }
            if r.events.is_empty() {
                return Step::Nothing;
            }
        }
        if r.fragment {
            self.fragments.extend(r.events);
            return Step::Nothing;
        }
        let mut raw = std::mem::take(&mut self.fragments);
        raw.extend(r.events);
        let header = r.header.into();
        if raw.is_empty() {
            // Progress: every event up to the header's revision has been sent.
            if header_revision >= self.next {
                self.next = header_revision + 1;
                self.certain = true;
            }
            return Step::Deliver(WatchResponse {
                header,
                events: Vec::new(),
            });
        }
        let mut events = Vec::with_capacity(raw.len());
        let mut last = if self.certain { self.next - 1 } else { 0 };
        for e in raw {
            let event = match Event::try_from(e) {
                Ok(event) => event,
                Err(what) => return Step::End(Error::Internal(format!("watch: {what}"))),
            };
            let revision = event.revision();
            if revision <= 0 || revision < last {
                return Step::End(Error::Internal(format!(
                    "watch: the server sent an event of revision {revision} after revision \
                     {last} (events must come once each, in revision order)"
                )));
            }
            if revision == last && self.certain && revision < self.next {
                return Step::End(Error::Internal(format!(
                    "watch: the server sent revision {revision} again (it was delivered)"
                )));
            }
            last = revision;
            events.push(event);
        }
        self.next = last + 1;
        self.certain = true;
        Step::Deliver(WatchResponse { header, events })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::responses::EventType;
    use bytes::Bytes;

    fn header(revision: i64) -> Option<pb::ResponseHeader> {
        Some(pb::ResponseHeader {
            revision,
            ..pb::ResponseHeader::default()
        })
    }

    fn put(key: &str, revision: i64) -> mvccpb::Event {
        mvccpb::Event {
            r#type: mvccpb::event::EventType::Put as i32,
            kv: Some(mvccpb::KeyValue {
                key: Bytes::from(key.to_string()),
                mod_revision: revision,
                create_revision: revision,
                version: 1,
                value: Bytes::from_static(b"v"),
                lease: 0,
            }),
            prev_kv: None,
        }
    }

    fn created(revision: i64) -> pb::WatchResponse {
        pb::WatchResponse {
            header: header(revision),
            created: true,
            ..pb::WatchResponse::default()
        }
    }

    fn events(header_revision: i64, revisions: &[i64]) -> pb::WatchResponse {
        pb::WatchResponse {
            header: header(header_revision),
            events: revisions.iter().map(|r| put("k", *r)).collect(),
            ..pb::WatchResponse::default()
        }
    }

    fn delivered(step: Step) -> Vec<i64> {
        match step {
            Step::Deliver(r) => r.events.iter().map(Event::revision).collect(),
            other => panic!("expected a delivery, got {other:?}"),
        }
    }

    // Where a resumed watch starts is the whole of "no gap, no repeat": the revision after
    // the last one delivered, or the caller's start if nothing was delivered yet.
    #[test]
    fn the_resume_point_follows_what_was_delivered() {
        let mut c = Cursor::new(5);
        assert_eq!(c.start(), 5, "nothing delivered: the caller's start");
        assert_eq!(c.on_response(created(9), false), Step::Nothing);
        assert_eq!(c.start(), 5, "created does not move an explicit start");
        assert_eq!(
            delivered(c.on_response(events(9, &[5, 5, 7]), false)),
            [5, 5, 7]
        );
        assert_eq!(c.start(), 8);
        // A progress notification at 12: nothing matched in 8..=12.
        let progress = c.on_response(events(12, &[]), false);
        assert!(matches!(progress, Step::Deliver(ref r) if r.is_progress_notify()));
        assert_eq!(c.start(), 13);
        // A progress notification behind the cursor changes nothing.
        c.on_response(events(10, &[]), false);
        assert_eq!(c.start(), 13);
    }

    // A watch from now on that fails before its first event must resume after the
    // revision it was created at, not "from now" again (which would skip what happened
    // during the outage).
    #[test]
    fn a_watch_from_now_resumes_after_its_creation_revision() {
        let mut c = Cursor::new(0);
        assert_eq!(c.start(), 0);
        c.on_response(created(41), false);
        assert_eq!(c.start(), 42);
        // The server's watcher may have begun a little before the revision its created
        // answer reports: such an event is delivered, not refused.
        assert_eq!(delivered(c.on_response(events(42, &[41]), false)), [41]);
        assert_eq!(c.start(), 42);
    }

    // A repeated or reordered revision would break the promise to the caller; ending the
    // watch loudly (a server bug) beats passing it on.
    #[test]
    fn repeats_and_reordering_end_the_watch_as_a_server_bug() {
        let cases: [(&[i64], &[i64]); 4] = [
            (&[3], &[3]),
            (&[3], &[2]),
            (&[], &[4, 3]),
            (&[3, 4], &[4, 5]),
        ];
        for (first, second) in cases {
            let mut c = Cursor::new(1);
            if !first.is_empty() {
                delivered(c.on_response(events(9, first), false));
            }
            let step = c.on_response(events(9, second), false);
            assert!(
                matches!(step, Step::End(Error::Internal(_))),
                "{first:?} then {second:?}: {step:?}"
            );
        }
    }

    // Fragments are parts of one response: delivering them one by one would let a resume
    // land inside a revision.
    #[test]
    fn fragments_are_joined_into_one_response() {
        let mut c = Cursor::new(1);
        let mut part = events(9, &[4, 4]);
        part.fragment = true;
        assert_eq!(c.on_response(part, false), Step::Nothing);
        assert_eq!(c.start(), 1);
        assert_eq!(delivered(c.on_response(events(9, &[4]), false)), [4, 4, 4]);
        assert_eq!(c.start(), 5);
    }

    // The caller must be able to tell "history is gone" (and from where it is kept) from
    // any other cancel, and from the cancel it asked for.
    #[test]
    fn cancels_say_why() {
        let cancel = |compact_revision, reason: &str| pb::WatchResponse {
            canceled: true,
            compact_revision,
            cancel_reason: reason.to_string(),
            ..pb::WatchResponse::default()
        };
        let mut c = Cursor::new(2);
        assert_eq!(
            c.on_response(cancel(7, ""), false),
            Step::End(Error::Compacted {
                compact_revision: 7
            })
        );
        assert_eq!(
            c.on_response(cancel(0, "permission denied"), false),
            Step::End(Error::WatchCanceled {
                reason: "permission denied".into()
            })
        );
        assert_eq!(c.on_response(cancel(0, ""), true), Step::Cancelled);
        // Compaction wins even while cancelling: the caller should know history is gone.
        assert!(matches!(
            c.on_response(cancel(7, ""), true),
            Step::End(Error::Compacted { .. })
        ));
    }

    #[test]
    fn events_keep_their_kind_and_previous_value() {
        let mut c = Cursor::new(1);
        let mut delete = put("k", 3);
        delete.r#type = mvccpb::event::EventType::Delete as i32;
        delete.prev_kv = put("k", 2).kv;
        let step = c.on_response(
            pb::WatchResponse {
                header: header(3),
                events: vec![put("k", 2), delete],
                ..pb::WatchResponse::default()
            },
            false,
        );
        let Step::Deliver(r) = step else {
            panic!("{step:?}")
        };
        assert_eq!(r.events[0].kind, EventType::Put);
        assert_eq!(r.events[1].kind, EventType::Delete);
        assert_eq!(
            r.events[1].prev_kv.as_ref().map(|kv| kv.mod_revision),
            Some(2)
        );
        let mut broken = put("k", 4);
        broken.r#type = 7;
        let step = c.on_response(events(4, &[]), false);
        assert!(matches!(step, Step::Deliver(_)));
        let step = c.on_response(
            pb::WatchResponse {
                events: vec![broken],
                ..pb::WatchResponse::default()
            },
            false,
        );
        assert!(matches!(step, Step::End(Error::Internal(_))), "{step:?}");
    }
}
