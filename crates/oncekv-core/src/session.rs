//! The session table: oncekv's idempotent receiver (RIFL's result tracker).
//!
//! Each registered client has a [`Session`]: its secret, the sequence numbers it has
//! acknowledged (`acked_below`), when it was last active, and the saved response of every
//! seq it may still ask about. [`SessionTable::check`] implements rules 1–6 of
//! `shared/DESIGN.md` section 2; the caller applies the op and hands the response to
//! [`Pending::save`] (rule 7).
//!
//! The table is laid out for 1 M sessions and more, far beyond the CPU caches: each
//! session is one 64-byte record that is also its hash-table bucket (`session/slots.rs`),
//! and it keeps its saved response inline, with the fingerprint of the request that
//! produced it, when it is the only one and packs into 8 bytes (`session/saved.rs`).
//! Checking a request then usually reads one cache line, and saving the reply of a client
//! that waits for each answer allocates nothing.
//!
//! Expiry uses a *lazy* deadline index: each session has one `(indexed_time, client_id)`
//! entry with `indexed_time <= last_active`. Refreshing a session only writes its
//! `last_active` (nothing on the hot path touches the index); when an index entry comes due
//! the session is either removed (it really is idle) or re-indexed at its true
//! `last_active`. Expiry therefore costs O(log n) per due entry and never scans the table.

use std::collections::BTreeSet;
use std::fmt;
use std::num::NonZeroU64;

use rustc_hash::FxHashMap;
use serde::ser::SerializeStruct;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::command::OpReply;
pub use crate::command::{Secret, SessionError};

mod saved;
mod slots;

use saved::Saved;
pub use saved::SavedReply;
use slots::Slots;

/// One client's session: a single 64-byte record (`session/slots.rs`, `session/saved.rs`).
#[derive(Debug, Clone)]
pub struct Session {
    client_id: u64,
    secret: Secret,
    /// Every seq below this has been acknowledged by the client (its `first_incomplete`).
    acked_below: NonZeroU64,
    /// Cluster time of the last executed command or keep-alive.
    last_active: u64,
    /// Saved responses, every seq in `[acked_below, acked_below + window)`.
    saved: Saved,
}

impl Session {
    fn new(client_id: u64, secret: Secret, now: u64) -> Session {
        Session {
            client_id,
            secret,
            acked_below: NonZeroU64::MIN,
            last_active: now,
            saved: Saved::default(),
        }
    }

    pub fn client_id(&self) -> u64 {
        self.client_id
    }

    pub fn acked_below(&self) -> u64 {
        self.acked_below.get()
    }

    pub fn last_active(&self) -> u64 {
        self.last_active
    }

    /// The saved responses, by seq.
    pub fn saved(&self) -> Vec<(u64, OpReply)> {
        self.saved
            .iter()
            .map(|(seq, _, reply)| (seq, reply.into_owned()))
            .collect()
    }

    /// The saved response of `seq`, if any.
    pub fn saved_reply(&self, seq: u64) -> Option<SavedReply<'_>> {
        self.saved.get(seq)
    }
}

/// Sessions compare by content (the saved responses' placement is not content).
impl PartialEq for Session {
    fn eq(&self, other: &Session) -> bool {
        self.client_id == other.client_id
            && self.secret == other.secret
            && self.acked_below == other.acked_below
            && self.last_active == other.last_active
            && self.saved == other.saved
    }
}

impl Eq for Session {}

/// The snapshot form: `secret`, `acked_below`, `last_active`, then the saved `(seq,
/// fingerprint, reply)` triples by seq. The client id is not part of it (the image pairs
/// it with the session).
impl Serialize for Session {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        struct SavedImage<'a>(&'a Saved);
        impl Serialize for SavedImage<'_> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_seq(self.0.iter())
            }
        }
        let mut image = serializer.serialize_struct("Session", 4)?;
        image.serialize_field("secret", &self.secret)?;
        image.serialize_field("acked_below", &self.acked_below.get())?;
        image.serialize_field("last_active", &self.last_active)?;
        image.serialize_field("saved", &SavedImage(&self.saved))?;
        image.end()
    }
}

/// Owned twin of [`Session`]'s snapshot form, for decoding.
#[derive(Deserialize)]
#[serde(rename = "Session")]
struct SessionImage {
    secret: Secret,
    acked_below: u64,
    last_active: u64,
    saved: Vec<(u64, u64, OpReply)>,
}

impl TryFrom<SessionImage> for Session {
    type Error = String;

    fn try_from(image: SessionImage) -> Result<Session, String> {
        Ok(Session {
            // Set by `SessionTable::from_sessions` from the image's pairing.
            client_id: 0,
            secret: image.secret,
            acked_below: NonZeroU64::new(image.acked_below).ok_or("acked_below is 0")?,
            last_active: image.last_active,
            saved: Saved::from_sorted(image.saved)?,
        })
    }
}

impl<'de> Deserialize<'de> for Session {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Session, D::Error> {
        let image = SessionImage::deserialize(deserializer)?;
        Session::try_from(image).map_err(serde::de::Error::custom)
    }
}

/// Where a session's bucket is, from [`SessionTable::prefetch`].
#[derive(Debug, Clone, Copy)]
pub struct BucketHint(usize);

/// The parts of a tracked command the session rules look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestId {
    pub client_id: u64,
    pub secret: Secret,
    pub seq: u64,
    pub first_incomplete: u64,
    /// The request's [`Op::fingerprint`](crate::command::Op::fingerprint): a saved
    /// response is returned only to the request that produced it.
    pub fingerprint: u64,
}

/// What [`SessionTable::check`] decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict<'a> {
    /// Rule 7: apply the op, then hand its reply to [`Pending::save`].
    Execute(Pending<'a>),
    /// Rule 5: a duplicate; answer this saved reply unchanged and apply nothing.
    Duplicate(SavedReply<'a>),
    /// Rules 1, 2, 4, 6, and rule 5 for a seq whose saved reply belongs to another
    /// request ([`SessionError::SeqReused`]): not applied.
    Reject(SessionError),
}

/// A request [`SessionTable::check`] admitted for execution (rule 7). It holds the
/// request's session until [`save`](Self::save) stores the op's reply there, so nothing
/// else can happen to the session in between and the session is not looked up twice.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "the reply must be saved (rule 7), or a retry would execute the request again"]
pub struct Pending<'a> {
    session: &'a mut Session,
    seq: NonZeroU64,
    fingerprint: u64,
}

impl Pending<'_> {
    /// Rule 7's tail: saves `reply` for the admitted seq and marks the session active at
    /// `now`, the cluster time, which never goes back (so it is not before the session's
    /// last activity; [`SessionTable::validate`] checks that). Copies `reply` only if it
    /// does not fit in the session record.
    #[inline]
    pub fn save(self, reply: &OpReply, now: u64) {
        let session = self.session;
        debug_assert!(now >= session.last_active, "cluster time went back");
        session.last_active = now;
        session.saved.insert(self.seq, reply, self.fingerprint);
    }
}

/// The registration nonces of the live sessions whose registration carried one, both
/// ways: by nonce to recognise a retried registration, by client id to forget the nonce
/// with its session. Kept apart from the session records, which have no room for 16 more
/// bytes and which sessions without a nonce should not pay for.
///
/// A nonce obtains its session's secret (a retried registration is answered with it), so
/// it is as secret as the secret: `Debug` prints none.
#[derive(Clone, Default)]
struct Nonces {
    by_nonce: FxHashMap<u128, u64>,
    by_client: FxHashMap<u64, u128>,
}

impl Nonces {
    fn client_of(&self, nonce: u128) -> Option<u64> {
        self.by_nonce.get(&nonce).copied()
    }

    /// Remembers `nonce` (not 0, not in use) for `client_id` (which has none).
    fn insert(&mut self, nonce: u128, client_id: u64) {
        self.by_nonce.insert(nonce, client_id);
        self.by_client.insert(client_id, nonce);
    }

    /// Forgets `client_id`'s nonce, if it has one.
    fn forget(&mut self, client_id: u64) {
        if let Some(nonce) = self.by_client.remove(&client_id) {
            self.by_nonce.remove(&nonce);
        }
    }
}

impl fmt::Debug for Nonces {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nonces")
            .field("len", &self.by_nonce.len())
            .finish_non_exhaustive()
    }
}

/// All sessions, with their deadline index and registration nonces.
#[derive(Debug, Clone, Default)]
pub struct SessionTable {
    sessions: Slots,
    /// Lazy: `(t, id)` with `t <= sessions[id].last_active`; stale entries of closed
    /// sessions are dropped when they come due.
    by_activity: BTreeSet<(u64, u64)>,
    /// Exactly the live sessions registered with a nonce.
    nonces: Nonces,
}

impl SessionTable {
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.len() == 0
    }

    pub fn get(&self, client_id: u64) -> Option<&Session> {
        self.sessions.get(client_id)
    }

    /// Asks for `client_id`'s session to be brought into cache, and goes on without
    /// waiting: a [`check_from`](Self::check_from) that follows other work finds it there,
    /// without hashing the id again. (See `StateMachine::apply_tracked`.) Changes nothing.
    #[inline]
    pub fn prefetch(&self, client_id: u64) -> BucketHint {
        BucketHint(self.sessions.prefetch(client_id))
    }

    /// How many responses are saved across all sessions, and their encoded size (what
    /// they take in a snapshot): for metrics. Walks every session.
    pub fn saved_summary(&self) -> (u64, u64) {
        let mut count = 0u64;
        let mut bytes = 0u64;
        for s in self.sessions.iter() {
            for (_, _, reply) in s.saved.iter() {
                count += 1;
                bytes +=
                    postcard::experimental::serialized_size(reply.as_ref()).map_or(0, |n| n as u64);
            }
        }
        (count, bytes)
    }

    /// Sessions in client-id order (for snapshots and comparisons).
    pub fn sorted(&self) -> Vec<(u64, &Session)> {
        let mut all: Vec<_> = self.sessions.iter().map(|s| (s.client_id, s)).collect();
        all.sort_unstable_by_key(|(id, _)| *id);
        all
    }

    /// Creates a session. A non-zero `nonce` (the client's random registration nonce) is
    /// remembered for the session's life, for
    /// [`retried_registration`](Self::retried_registration). `false` (and nothing changes)
    /// if `client_id` is taken or `nonce` is a live session's.
    pub fn register(&mut self, client_id: u64, secret: Secret, nonce: u128, now: u64) -> bool {
        if nonce != 0 && self.nonces.client_of(nonce).is_some() {
            return false;
        }
        if !self.sessions.insert(Session::new(client_id, secret, now)) {
            return false;
        }
        self.by_activity.insert((now, client_id));
        if nonce != 0 {
            self.nonces.insert(nonce, client_id);
        }
        true
    }

    /// If `nonce` is not 0 and a live session was registered with it, the client is
    /// retrying that registration (its reply was lost): marks the session active at `now`
    /// and returns its client id and secret, for the same answer as the first time.
    /// `None` otherwise (nothing changes).
    pub fn retried_registration(&mut self, nonce: u128, now: u64) -> Option<(u64, Secret)> {
        if nonce == 0 {
            return None;
        }
        let client_id = self.nonces.client_of(nonce)?;
        let session = self.sessions.get_mut(client_id)?;
        session.last_active = session.last_active.max(now);
        Some((client_id, session.secret))
    }

    /// The registration nonces of live sessions, `(client_id, nonce)` in client-id order
    /// (for snapshots).
    pub(crate) fn sorted_nonces(&self) -> Vec<(u64, u128)> {
        let mut all: Vec<_> = self
            .nonces
            .by_client
            .iter()
            .map(|(id, nonce)| (*id, *nonce))
            .collect();
        all.sort_unstable();
        all
    }

    /// Refreshes `last_active` after checking the secret.
    pub fn keep_alive(
        &mut self,
        client_id: u64,
        secret: Secret,
        now: u64,
    ) -> Result<(), SessionError> {
        let hint = self.hint(client_id);
        let session = Self::authenticate(&mut self.sessions, hint, client_id, secret)?;
        session.last_active = session.last_active.max(now);
        Ok(())
    }

    /// Removes the session and its saved responses after checking the secret.
    pub fn close(&mut self, client_id: u64, secret: Secret) -> Result<(), SessionError> {
        let hint = self.hint(client_id);
        Self::authenticate(&mut self.sessions, hint, client_id, secret)?;
        self.sessions.remove(client_id);
        self.nonces.forget(client_id);
        Ok(())
    }

    /// Rule 1, then rule 2 (which reveals nothing about the session). `hint` is where
    /// the session is looked for first.
    #[inline]
    fn authenticate(
        sessions: &mut Slots,
        hint: BucketHint,
        client_id: u64,
        secret: Secret,
    ) -> Result<&mut Session, SessionError> {
        let session = sessions
            .get_mut_from(hint.0, client_id)
            .ok_or(SessionError::SessionExpired { client_id })?;
        if session.secret != secret {
            return Err(SessionError::PermissionDenied { client_id });
        }
        Ok(session)
    }

    /// Rules 1–6 for a tracked command, in order. On [`Verdict::Execute`] the caller MUST
    /// apply the op and then [`save`](Pending::save) its reply.
    ///
    /// Reads one cache line (the session record) unless the client id collides in the
    /// table, or the seq is a duplicate whose reply did not fit inline, or the client has
    /// several saved responses and this request acknowledges some or is below the newest.
    #[inline]
    pub fn check(&mut self, req: RequestId, window: u64) -> Verdict<'_> {
        self.check_from(self.hint(req.client_id), req, window)
    }

    /// Where `client_id`'s session should be, for [`check_from`](Self::check_from), without
    /// a [`prefetch`](Self::prefetch).
    #[inline]
    pub fn hint(&self, client_id: u64) -> BucketHint {
        BucketHint(self.sessions.home(client_id))
    }

    /// [`check`](Self::check) where a [`prefetch`](Self::prefetch) of the client's session
    /// gave `hint`. A hint from another client or from before the table changed costs a
    /// lookup, never a wrong verdict.
    #[inline]
    pub fn check_from(&mut self, hint: BucketHint, req: RequestId, window: u64) -> Verdict<'_> {
        let session = match Self::authenticate(&mut self.sessions, hint, req.client_id, req.secret)
        {
            Ok(session) => session,
            Err(e) => return Verdict::Reject(e),
        };
        // Rule 3: the client no longer needs responses below `first_incomplete`.
        // (Compared first: above `acked_below` it cannot be 0, and the compiler sees that.)
        if req.first_incomplete > session.acked_below.get()
            && let Some(first_incomplete) = NonZeroU64::new(req.first_incomplete)
        {
            session.acked_below = first_incomplete;
            session.saved.drop_below(first_incomplete.get());
        }
        let acked_below = session.acked_below.get();
        // Rule 4.
        if req.seq < acked_below {
            return Verdict::Reject(SessionError::Stale {
                seq: req.seq,
                acked_below,
            });
        }
        // Rule 5, for the request that produced the saved reply only: a different request
        // under the same seq is refused, not given another request's outcome. (The reply is
        // looked up through a shared borrow once it is known to be there: returning a
        // borrow on one path while another keeps the session mutably borrowed is beyond
        // today's borrow checker.)
        if session.saved.contains(req.seq) {
            let session: &Session = session;
            return match session.saved.get(req.seq) {
                Some(saved) if saved.fingerprint() == req.fingerprint => Verdict::Duplicate(saved),
                Some(_) => Verdict::Reject(SessionError::SeqReused { seq: req.seq }),
                // Unreachable (it was there just above); a refusal is the one answer that
                // can never execute a request twice.
                None => Verdict::Reject(SessionError::Stale {
                    seq: req.seq,
                    acked_below,
                }),
            };
        }
        // Rule 6: bounded memory without ever dropping a response the client may need.
        // (`req.seq >= acked_below` here, so the difference cannot wrap.)
        if req.seq - acked_below >= window {
            return Verdict::Reject(SessionError::WindowExceeded {
                seq: req.seq,
                limit: acked_below.saturating_add(window) - 1,
            });
        }
        // Not 0: it is at least `acked_below` (rule 4).
        let Some(seq) = NonZeroU64::new(req.seq) else {
            return Verdict::Reject(SessionError::Stale {
                seq: req.seq,
                acked_below,
            });
        };
        Verdict::Execute(Pending {
            session,
            seq,
            fingerprint: req.fingerprint,
        })
    }

    /// Removes every session with `last_active + ttl < now`, returning their ids in the
    /// order removed. O(log n) per index entry that comes due.
    pub fn expire(&mut self, now: u64, ttl: u64) -> Vec<u64> {
        let mut expired = Vec::new();
        while let Some(&(t, id)) = self.by_activity.first() {
            if t.saturating_add(ttl) >= now {
                break;
            }
            self.by_activity.pop_first();
            let Some(session) = self.sessions.get(id) else {
                continue; // closed earlier; its index entry was left behind
            };
            if session.last_active.saturating_add(ttl) < now {
                self.sessions.remove(id);
                self.nonces.forget(id);
                expired.push(id);
            } else {
                self.by_activity.insert((session.last_active, id));
            }
        }
        expired
    }

    /// The earliest cluster time at which [`expire`](Self::expire) may remove something.
    pub fn next_deadline(&self, ttl: u64) -> Option<u64> {
        self.by_activity
            .first()
            .map(|(t, _)| t.saturating_add(ttl).saturating_add(1))
    }

    /// Rebuilds a table from sessions and the `(client_id, nonce)` pairs of those
    /// registered with a nonce (restore from a snapshot); each session takes the client id
    /// it is paired with. `Err` if an id appears twice, or a nonce is 0, used twice, or
    /// names no session.
    pub fn from_sessions(
        sessions: impl IntoIterator<Item = (u64, Session)>,
        nonces: impl IntoIterator<Item = (u64, u128)>,
    ) -> Result<SessionTable, String> {
        let mut table = SessionTable::default();
        for (id, mut session) in sessions {
            session.client_id = id;
            let last_active = session.last_active;
            if !table.sessions.insert(session) {
                return Err(format!("session {id} appears twice"));
            }
            table.by_activity.insert((last_active, id));
        }
        for (id, nonce) in nonces {
            if nonce == 0 || !table.sessions.contains(id) {
                return Err(format!(
                    "registration nonce for session {id}, which has none"
                ));
            }
            if table.nonces.client_of(nonce).is_some() || table.nonces.by_client.contains_key(&id) {
                return Err(format!("registration nonce of session {id} not unique"));
            }
            table.nonces.insert(nonce, id);
        }
        Ok(table)
    }

    /// Checks the invariants, among them that no session was active after `now` (the
    /// cluster time, which never goes back); `Err` names the first one broken.
    pub fn validate(&self, window: u64, now: u64) -> Result<(), String> {
        self.sessions.validate()?;
        let nonces = &self.nonces;
        if nonces.by_nonce.len() != nonces.by_client.len() {
            return Err("registration nonces out of step with their sessions".into());
        }
        for (nonce, id) in &nonces.by_nonce {
            if *nonce == 0 || nonces.by_client.get(id) != Some(nonce) {
                return Err(format!("session {id}'s registration nonce is inconsistent"));
            }
            if !self.sessions.contains(*id) {
                return Err(format!(
                    "registration nonce kept for session {id}, which is gone"
                ));
            }
        }
        let mut indexed: FxHashMap<u64, u64> = FxHashMap::default();
        for &(t, id) in &self.by_activity {
            if self.sessions.contains(id) && indexed.insert(id, t).is_some() {
                return Err(format!("session {id} has two deadline-index entries"));
            }
        }
        for s in self.sessions.iter() {
            let id = s.client_id;
            if s.last_active > now {
                return Err(format!(
                    "session {id} active at {} after the cluster time {now}",
                    s.last_active
                ));
            }
            match indexed.get(&id) {
                None => return Err(format!("session {id} is missing from the deadline index")),
                Some(t) if *t > s.last_active => {
                    return Err(format!("session {id} indexed after its last activity"));
                }
                Some(_) => {}
            }
            s.saved
                .validate(s.acked_below.get(), window)
                .map_err(|e| format!("session {id}: {e}"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `check_from` with a hint that points elsewhere (another client's bucket, an empty
    /// one, past the table) gives exactly the verdict of `check`, and changes the table the
    /// same way.
    #[test]
    fn a_wrong_hint_changes_no_verdict() {
        let secret = |id: u64| Secret::from_u128(u128::from(id) * 7);
        let reply = OpReply {
            revision: 5,
            result: Err(crate::command::OpError::KeyNotFound),
        };
        let mut table = SessionTable::default();
        for id in 1..=40 {
            assert!(table.register(id, secret(id), 0, 0));
        }
        let mut plain = table.clone();
        let requests = [
            (3, secret(3), 1, 1),
            (3, secret(3), 1, 1),     // a duplicate
            (3, secret(4), 2, 1),     // a wrong secret
            (99, secret(99), 1, 1),   // no such session
            (17, secret(17), 200, 1), // past the window
            (17, secret(17), 2, 2),
        ];
        for (n, (client_id, secret, seq, first_incomplete)) in requests.into_iter().enumerate() {
            let req = RequestId {
                client_id,
                secret,
                seq,
                first_incomplete,
                fingerprint: 7,
            };
            let hints = [
                table.hint(client_id % 40 + 1),
                BucketHint(0),
                BucketHint(usize::MAX),
            ];
            let hint = hints[n % hints.len()];
            let expected = match plain.check(req, 8) {
                Verdict::Execute(pending) => {
                    pending.save(&reply, 1);
                    "execute".to_string()
                }
                other => format!("{other:?}"),
            };
            let got = match table.check_from(hint, req, 8) {
                Verdict::Execute(pending) => {
                    pending.save(&reply, 1);
                    "execute".to_string()
                }
                other => format!("{other:?}"),
            };
            assert_eq!(got, expected, "request {n}");
        }
        assert_eq!(table.sorted(), plain.sorted());
        table.validate(8, 1).expect("valid");
    }

    /// Rule 6 is exact at the top of the seq range: the window `[acked_below, acked_below +
    /// window)` neither wraps nor saturates, and `validate` agrees with `check`.
    #[test]
    fn window_is_exact_at_the_top_of_the_seq_range() {
        let secret = Secret::from_u128(9);
        let request = |seq| RequestId {
            client_id: 1,
            secret,
            seq,
            first_incomplete: 1,
            fingerprint: 7,
        };
        let mut table = SessionTable::default();
        assert!(table.register(1, secret, 0, 0));
        // acked_below 1 + window (2^64 - 2) = 2^64 - 1: u64::MAX is one past the window.
        match table.check(request(u64::MAX), u64::MAX - 1) {
            Verdict::Reject(e) => assert_eq!(
                e,
                SessionError::WindowExceeded {
                    seq: u64::MAX,
                    limit: u64::MAX - 1,
                }
            ),
            other => panic!("expected a refusal, got {other:?}"),
        }
        // One more and it is inside (saturating arithmetic refused it).
        let reply = OpReply {
            revision: 1,
            result: Err(crate::command::OpError::KeyNotFound),
        };
        match table.check(request(u64::MAX), u64::MAX) {
            Verdict::Execute(pending) => pending.save(&reply, 1),
            other => panic!("expected execution, got {other:?}"),
        }
        table.validate(u64::MAX, 1).expect("valid");
        assert!(table.validate(u64::MAX - 1, 1).is_err());
        // The session was active at 1: a table said to be at time 0 is inconsistent.
        assert!(table.validate(u64::MAX, 0).is_err());
    }

    /// A nonce must not outlive its session (a retried registration would then name a
    /// dead session), and a snapshot must not bring in such a nonce: `validate` and
    /// `from_sessions` catch both.
    #[test]
    fn validate_catches_a_dangling_nonce() {
        let secret = Secret::from_u128(3);
        let mut table = SessionTable::default();
        assert!(table.register(1, secret, 0xfeed, 0));
        assert!(table.register(2, secret, 0, 0));
        table.validate(8, 0).expect("valid");
        // A removal that skipped the nonce (what `close` and `expire` must not do).
        table.sessions.remove(1);
        let err = table.validate(8, 0).expect_err("dangling nonce");
        assert!(err.contains("session 1"), "{err}");

        let session = |id| (id, Session::new(id, secret, 0));
        assert!(SessionTable::from_sessions([session(2)], [(1, 0xfeed)]).is_err());
        assert!(SessionTable::from_sessions([session(2)], [(2, 0)]).is_err());
        let twice = SessionTable::from_sessions([session(1), session(2)], [(1, 5), (2, 5)]);
        assert!(twice.is_err());
        let table = SessionTable::from_sessions([session(1), session(2)], [(2, 5)]);
        table.expect("consistent").validate(8, 0).expect("valid");
    }

    /// A live session's nonce cannot be given to a second session: registering with it
    /// is refused, and the table is unchanged.
    #[test]
    fn a_live_nonce_is_not_registered_twice() {
        let secret = Secret::from_u128(3);
        let mut table = SessionTable::default();
        assert!(table.register(1, secret, 9, 0));
        assert!(!table.register(2, secret, 9, 0));
        assert_eq!(table.len(), 1);
        assert_eq!(table.retried_registration(9, 1), Some((1, secret)));
        assert_eq!(table.retried_registration(0, 1), None);
        table.validate(8, 1).expect("valid");
    }
}
