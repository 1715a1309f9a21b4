//! The model of the session rules: DESIGN.md section 2 written as plainly as possible,
//! independent of the crate, checking every response the replicas give.

use super::*;

#[derive(Debug, Clone)]
struct ModelSession {
    secret: Secret,
    acked_below: u64,
    last_active: u64,
    saved: BTreeMap<u64, Response>,
}

/// DESIGN.md section 2 written as plainly as possible, independent of the crate.
#[derive(Debug, Clone)]
pub(super) struct Model {
    now: u64,
    settings: Settings,
    sessions: BTreeMap<u64, ModelSession>,
    /// Every tracked `(client, seq)` the rules let run.
    pub(super) executed: BTreeSet<(u64, u64)>,
    /// How many of those were KV ops that succeeded (each put its marker and the counter).
    kv_applied: i64,
    /// How often each rule decided (to check the generator reaches them all).
    pub(super) outcomes: BTreeMap<&'static str, u64>,
}

impl Model {
    pub(super) fn new() -> Model {
        Model {
            now: 0,
            settings: settings(),
            sessions: BTreeMap::new(),
            executed: BTreeSet::new(),
            kv_applied: 0,
            outcomes: BTreeMap::new(),
        }
    }

    pub(super) fn begin(&mut self, time: u64) {
        self.now = self.now.max(time);
        let (now, ttl) = (self.now, self.settings.session_ttl_ms);
        self.sessions.retain(|_, s| s.last_active + ttl >= now);
    }

    fn authenticate(
        &mut self,
        client_id: u64,
        secret: Secret,
    ) -> Result<&mut ModelSession, SessionError> {
        match self.sessions.get_mut(&client_id) {
            None => Err(SessionError::SessionExpired { client_id }),
            Some(s) if s.secret != secret => Err(SessionError::PermissionDenied { client_id }),
            Some(s) => Ok(s),
        }
    }

    /// Checks `got` against the rules and records what the command did.
    pub(super) fn check(&mut self, index: u64, pos: usize, command: &Command, got: &Response) {
        let now = self.now;
        match command {
            Command::RegisterClient { secret, .. } => {
                assert_eq!(pos, 0, "the harness registers alone");
                let want = Response::Registered {
                    client_id: index,
                    secret: *secret,
                    settings: self.settings,
                };
                assert_eq!(got, &want);
                let session = ModelSession {
                    secret: *secret,
                    acked_below: 1,
                    last_active: now,
                    saved: BTreeMap::new(),
                };
                self.sessions.insert(index, session);
            }
            Command::KeepAlive { client_id, secret } => {
                let want = self
                    .authenticate(*client_id, *secret)
                    .map(|s| s.last_active = now);
                assert_eq!(got, &Response::Session(want));
            }
            Command::CloseSession { client_id, secret } => {
                let want = self.authenticate(*client_id, *secret).map(|_| ());
                if want.is_ok() {
                    self.sessions.remove(client_id);
                }
                assert_eq!(got, &Response::Session(want));
            }
            Command::Tick => assert_eq!(got, &Response::Done),
            Command::Configure(s) => {
                let ok = s.window >= self.settings.window
                    && s.session_ttl_ms > 0
                    && s.min_lease_ttl_secs >= 1;
                if ok {
                    self.settings = *s;
                }
                assert_eq!(
                    got,
                    if ok {
                        &Response::Done
                    } else {
                        &Response::Rejected
                    }
                );
            }
            Command::Untracked(_) => assert!(matches!(got, Response::Op(Ok(_))), "{got:?}"),
            Command::Tracked(t) => self.check_tracked(t, got),
            // The workload raises no alarms.
            Command::Alarm { .. } => assert_eq!(got, &Response::Done),
            // Nor does it use auth.
            Command::RegisterOwned { .. } | Command::Auth(_) | Command::Authorized { .. } => {
                panic!("the workload does not use auth: {command:?}")
            }
        }
    }

    fn check_tracked(&mut self, t: &Tracked, got: &Response) {
        let outcome = self.check_rules(t, got);
        *self.outcomes.entry(outcome).or_default() += 1;
        if let Response::Op(Ok(reply)) = got {
            let tag = match reply.result {
                Ok(OpResponse::LeaseGrant { .. }) => "lease grant ok",
                Err(oncekv_core::OpError::LeaseAlreadyExists) => "lease already exists",
                Ok(OpResponse::Compact) => "compacted",
                Ok(OpResponse::Enqueue(_)) => "enqueued",
                Err(oncekv_core::OpError::Compacted | oncekv_core::OpError::FutureRevision) => {
                    "compaction refused"
                }
                _ => return,
            };
            *self.outcomes.entry(tag).or_default() += 1;
        }
    }

    /// The rules in order; names the one that decided.
    fn check_rules(&mut self, t: &Tracked, got: &Response) -> &'static str {
        let (now, window) = (self.now, self.settings.window);
        let session = match self.authenticate(t.client_id, t.secret) {
            Ok(s) => s,
            Err(e) => {
                assert_eq!(got, &Response::Op(Err(e.clone())));
                return match e {
                    SessionError::SessionExpired { .. } => "expired",
                    _ => "denied",
                };
            }
        };
        if t.first_incomplete > session.acked_below {
            session.acked_below = t.first_incomplete;
            session.saved = session.saved.split_off(&t.first_incomplete);
        }
        let acked_below = session.acked_below;
        if t.seq < acked_below {
            let stale = SessionError::Stale {
                seq: t.seq,
                acked_below,
            };
            assert_eq!(got, &Response::Op(Err(stale)));
            return "stale";
        }
        if let Some(saved) = session.saved.get(&t.seq) {
            assert_eq!(got, saved, "a duplicate must get the saved response");
            return "duplicate";
        }
        if t.seq >= acked_below + window {
            let exceeded = SessionError::WindowExceeded {
                seq: t.seq,
                limit: acked_below + window - 1,
            };
            assert_eq!(got, &Response::Op(Err(exceeded)));
            return "window";
        }
        let Response::Op(Ok(reply)) = got else {
            panic!("seq {} should have run: {got:?}", t.seq);
        };
        session.saved.insert(t.seq, got.clone());
        session.last_active = now;
        assert!(
            self.executed.insert((t.client_id, t.seq)),
            "({}, {}) ran twice",
            t.client_id,
            t.seq
        );
        if matches!(t.op, Op::Txn(_)) && reply.result.is_ok() {
            self.kv_applied += 1;
            *self.outcomes.entry("kv applied").or_default() += 1;
        }
        "executed"
    }

    /// The state machine's sessions and the KV traces agree with the model.
    pub(super) fn check_state(&self, sm: &StateMachine) {
        let ids: Vec<u64> = sm.sessions().sorted().iter().map(|(id, _)| *id).collect();
        assert_eq!(
            ids,
            self.sessions.keys().copied().collect::<Vec<_>>(),
            "live sessions"
        );
        for (id, m) in &self.sessions {
            let s = sm.sessions().get(*id).expect("listed above");
            assert_eq!(s.acked_below(), m.acked_below, "session {id}");
            assert_eq!(s.last_active(), m.last_active, "session {id}");
            let saved: Vec<u64> = s.saved().iter().map(|(seq, _)| *seq).collect();
            assert_eq!(
                saved,
                m.saved.keys().copied().collect::<Vec<_>>(),
                "session {id}"
            );
        }
        let markers: Vec<i64> = sm
            .kv()
            .scan(&KeyRange::prefix(ONCE_PREFIX))
            .map(|(_, v)| v.version)
            .collect();
        assert!(
            markers.iter().all(|v| *v == 1),
            "a tracked op ran twice: {markers:?}"
        );
        assert_eq!(markers.len() as i64, self.kv_applied, "marker keys");
        let counter = sm.kv().get(COUNTER.as_bytes()).map_or(0, |v| v.version);
        assert_eq!(counter, self.kv_applied, "counter version");
    }
}
