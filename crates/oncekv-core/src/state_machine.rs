//! The replicated state machine: `apply(index, entry) -> responses`, deterministic and
//! clock-free.
//!
//! Every replica that applies the same log gets the same state and the same responses.
//! Time comes only from the entries' `cluster_time`; sessions and leases expire while an
//! entry is applied, before its commands run.
//!
//! This module decides which commands run and keeps the state; what an op does to the
//! keys and leases is in its submodule `exec`.

mod exec;

use crate::command::AlarmKind;
use crate::command::{
    Command, KeyRange, LogPayload, Op, OpError, OpReply, OpResponse, RangeRequest, RangeResponse,
    Response, SessionError, Settings, Tracked,
};
use crate::history::{EventBatch, ReadLimit};
use crate::kv::KvStore;
use crate::lease::LeaseTable;
use crate::session::{RequestId, Secret, SessionTable, Verdict};
use exec::{Exec, Ready};

/// Counters for metrics and reports. Not part of the replicated state (not in snapshots).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Tracked ops executed (rule 7).
    pub executed: u64,
    /// Tracked ops answered from a saved response (rule 5).
    pub duplicates: u64,
    /// Tracked ops refused by rules 1, 2, 4 or 6, or for reusing a seq (rule 5).
    pub rejected: u64,
    /// `rejected` by [`SessionError::kind`], in [`SessionError::KINDS`] order.
    pub rejected_by_kind: [u64; SessionError::KINDS.len()],
    pub sessions_expired: u64,
    pub leases_expired: u64,
    /// Keys written by executed puts, in txns too (etcd's `etcd_mvcc_put_total`).
    pub puts: u64,
    /// Keys removed by executed deletes, in txns too (etcd's `etcd_mvcc_delete_total`).
    pub deleted_keys: u64,
}

impl Stats {
    /// Counts the keys an executed op wrote and removed (a saved reply sent again is not
    /// counted: nothing ran).
    fn count_writes(&mut self, reply: &OpReply) {
        fn walk(stats: &mut Stats, responses: &[crate::command::ResponseOp]) {
            use crate::command::ResponseOp;
            for r in responses {
                match r {
                    ResponseOp::Put(_) => stats.puts += 1,
                    ResponseOp::DeleteRange(d) => stats.deleted_keys += d.deleted.max(0) as u64,
                    ResponseOp::Txn(t) => walk(stats, &t.responses),
                    ResponseOp::Range(_) => {}
                }
            }
        }
        match &reply.result {
            Ok(OpResponse::Put(_) | OpResponse::Enqueue(_)) => self.puts += 1,
            Ok(OpResponse::DeleteRange(d)) => self.deleted_keys += d.deleted.max(0) as u64,
            Ok(OpResponse::Txn(t)) => walk(self, &t.responses),
            _ => {}
        }
    }
}

/// Something that expired while applying the entry at `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    Session { index: u64, client_id: u64 },
    Lease { index: u64, id: i64 },
}

/// KV store, leases, sessions and settings, at an applied index and cluster time.
#[derive(Debug, Clone, Default)]
pub struct StateMachine {
    pub(crate) kv: KvStore,
    pub(crate) leases: LeaseTable,
    pub(crate) sessions: SessionTable,
    pub(crate) settings: Settings,
    /// Raised alarms, by member (replicated: every replica refuses the same ops).
    pub(crate) alarms: std::collections::BTreeSet<(u64, AlarmKind)>,
    /// Users, roles and whether auth is on (etcd's auth store).
    pub(crate) auth: crate::auth::AuthStore,
    /// The user that registered each session opened with auth on (by client id); only
    /// live sessions are listed.
    pub(crate) owners: std::collections::BTreeMap<u64, String>,
    pub(crate) applied_index: u64,
    pub(crate) cluster_time: u64,
    pub(crate) stats: Stats,
    pub(crate) expiry_log: Option<Vec<Expired>>,
    #[cfg(feature = "sim")]
    pub(crate) probe: SimProbe,
}

/// Instrumentation for the deterministic simulation (`oncekv-sim`), compiled only with
/// the `sim` feature; all off by default and never turned on by the server. Not part of
/// the replicated state.
#[cfg(feature = "sim")]
#[derive(Debug, Clone, Default)]
pub struct SimProbe {
    /// Deliberately breaks rule 5 (a duplicate is executed again), to prove that the
    /// simulation's checkers catch a broken exactly-once mechanism.
    pub break_dedup: bool,
    /// When set, every tracked command that is executed (rule 7) is recorded in
    /// `executed` as `(index, client_id, seq)`. (A flag rather than an `Option`: the
    /// check sits on the tracked hot path, and a flag is one compare.)
    pub record_executed: bool,
    pub executed: Vec<(u64, u64, u64)>,
}

#[cfg(feature = "sim")]
impl SimProbe {
    #[inline]
    fn note_executed(&mut self, index: u64, t: &Tracked) {
        if self.record_executed {
            self.executed.push((index, t.client_id, t.seq));
        }
    }
}

impl StateMachine {
    pub fn new(settings: Settings) -> StateMachine {
        StateMachine {
            settings,
            ..StateMachine::default()
        }
    }

    /// Applies the entry at `index`. The caller MUST apply entries in log order, each index
    /// once, and MUST return `responses[i]` to whoever proposed `payload.commands[i]`.
    pub fn apply(&mut self, index: u64, payload: &LogPayload) -> Vec<Response> {
        self.begin_entry(index, payload.cluster_time);
        payload
            .commands
            .iter()
            .enumerate()
            .map(|(pos, c)| match c {
                // The hot path, straight to a function of its own: going through
                // `apply_command`'s jump table adds instructions to every tracked put
                // (count them with scripts/apply-instructions).
                Command::Tracked(t) => self.apply_tracked(index, t),
                _ => self.apply_command(index, pos, c),
            })
            .collect()
    }

    /// Records a raft entry that carries no commands (blank or membership): the applied
    /// index moves, cluster time does not.
    pub fn apply_empty(&mut self, index: u64) {
        debug_assert!(
            index > self.applied_index || (index == 0 && self.applied_index == 0),
            "entries applied out of order"
        );
        self.applied_index = index;
    }

    fn begin_entry(&mut self, index: u64, cluster_time: u64) {
        debug_assert!(
            index > self.applied_index || (index == 0 && self.applied_index == 0),
            "entries applied out of order"
        );
        self.applied_index = index;
        self.cluster_time = self.cluster_time.max(cluster_time);
        let now = self.cluster_time;
        for client_id in self.sessions.expire(now, self.settings.session_ttl_ms) {
            self.owners.remove(&client_id);
            self.stats.sessions_expired += 1;
            self.record(Expired::Session { index, client_id });
        }
        for (id, lease) in self.leases.expire(now) {
            self.stats.leases_expired += 1;
            self.exec().delete_keys(lease.keys);
            self.record(Expired::Lease { index, id });
        }
    }

    fn record(&mut self, e: Expired) {
        if let Some(log) = &mut self.expiry_log {
            log.push(e);
        }
    }

    fn apply_command(&mut self, index: u64, pos: usize, command: &Command) -> Response {
        let now = self.cluster_time;
        match command {
            Command::RegisterClient { secret, nonce } => {
                self.register(index, pos, *secret, *nonce, None)
            }
            Command::KeepAlive { client_id, secret } => {
                Response::Session(self.sessions.keep_alive(*client_id, *secret, now))
            }
            Command::CloseSession { client_id, secret } => {
                let closed = self.sessions.close(*client_id, *secret);
                if closed.is_ok() {
                    self.owners.remove(client_id);
                }
                Response::Session(closed)
            }
            Command::RegisterOwned {
                secret,
                nonce,
                owner,
            } => self.register(index, pos, *secret, *nonce, Some(owner)),
            Command::Auth(command) => Response::Auth(self.auth.apply(command)),
            Command::Tick => Response::Done,
            Command::Configure(s) => {
                // Shrinking the window could strand saved responses a client still needs.
                if s.window < self.settings.window
                    || s.session_ttl_ms == 0
                    || s.min_lease_ttl_secs < 1
                {
                    Response::Rejected
                } else {
                    self.settings = *s;
                    Response::Done
                }
            }
            // `apply` sends tracked commands to `apply_tracked` itself; this arm keeps the
            // match whole.
            Command::Tracked(t) => self.apply_tracked(index, t),
            Command::Untracked(op) => Response::Op(Ok(match self.alarm_refusal(op) {
                Some(e) => self.refused(e),
                None => {
                    let reply = self.exec().execute(index, op);
                    self.stats.count_writes(&reply);
                    reply
                }
            })),
            Command::Authorized {
                auth_revision,
                command,
            } => {
                let stale = self.auth.enabled() && self.auth.revision() != *auth_revision;
                match (&**command, stale) {
                    (Command::Tracked(t), true) => {
                        self.apply_tracked_or_refuse(index, t, Some(OpError::AuthOldRevision))
                    }
                    (Command::Untracked(_), true) => {
                        Response::Op(Ok(self.refused(OpError::AuthOldRevision)))
                    }
                    (inner, _) => self.apply_command(index, pos, inner),
                }
            }
            Command::Alarm {
                activate,
                member,
                alarm,
            } => {
                if *activate {
                    self.alarms.insert((*member, *alarm));
                } else {
                    self.alarms.remove(&(*member, *alarm));
                }
                Response::Done
            }
        }
    }

    /// `RegisterClient` (`owner` `None`) and `RegisterOwned`: a retried nonce gets its
    /// session back (only from its owner, when registering with one); otherwise a new
    /// session named by this entry's index, if the registration is first in its entry.
    fn register(
        &mut self,
        index: u64,
        pos: usize,
        secret: Secret,
        nonce: u128,
        owner: Option<&String>,
    ) -> Response {
        let now = self.cluster_time;
        // A retry creates nothing, so it may sit anywhere in its entry.
        if let Some((client_id, secret)) = self.sessions.retried_registration(nonce, now) {
            if owner.is_some() && self.owners.get(&client_id) != owner {
                return Response::Rejected;
            }
            Response::Registered {
                client_id,
                secret,
                settings: self.settings,
            }
        } else if pos == 0 && self.sessions.register(index, secret, nonce, now) {
            if let Some(owner) = owner {
                self.owners.insert(index, owner.clone());
            }
            Response::Registered {
                client_id: index,
                secret,
                settings: self.settings,
            }
        } else {
            Response::Rejected
        }
    }

    /// The error a raised alarm answers `op` with, if any.
    #[inline]
    fn alarm_refusal(&self, op: &Op) -> Option<OpError> {
        if self.alarms.is_empty() {
            return None;
        }
        if self.alarms.iter().any(|(_, a)| *a == AlarmKind::Corrupt) {
            Some(OpError::Corrupt)
        } else if op.adds_data() {
            Some(OpError::NoSpace)
        } else {
            None
        }
    }

    fn refused(&self, e: OpError) -> OpReply {
        OpReply {
            revision: self.kv.revision(),
            result: Err(e),
        }
    }

    /// Overwrites `key`'s stored value in place (same revisions), outside any command:
    /// breaks replica agreement on purpose, for the server's corruption-detection tests.
    /// `false` if the key does not exist. Nothing in the product calls it.
    #[doc(hidden)]
    pub fn corrupt_value_for_test(&mut self, key: &[u8], value: &[u8]) -> bool {
        self.kv.corrupt_value_for_test(key, value)
    }

    /// The raised alarms, by member.
    pub fn alarms(&self) -> impl Iterator<Item = (u64, AlarmKind)> + '_ {
        self.alarms.iter().copied()
    }

    /// The exactly-once rules (`shared/DESIGN.md` section 2): 1–6 in the session table,
    /// 7 here. The admitted session stays borrowed while the op runs, so its reply is saved
    /// without looking the session up again.
    #[inline(always)]
    fn apply_tracked(&mut self, index: u64, t: &Tracked) -> Response {
        self.apply_tracked_or_refuse(index, t, None)
    }

    /// [`apply_tracked`](Self::apply_tracked), answering `refusal` (if any) instead of
    /// running the op, should the session admit it: a refusal is an answer, saved for
    /// the seq like any other.
    #[inline(never)]
    fn apply_tracked_or_refuse(
        &mut self,
        index: u64,
        t: &Tracked,
        refusal: Option<OpError>,
    ) -> Response {
        // What a raised alarm answers instead of running the op (nearly always `None`),
        // decided before the store is borrowed for the op.
        let refused = refusal
            .or_else(|| self.alarm_refusal(&t.op))
            .map(|e| self.refused(e));
        let dedup_broken = self.dedup_broken();
        // A put's search of the store comes before the session check (see `Ready`), so the
        // session's cache miss and the store's overlap instead of adding up (the figures
        // are in benches/README.md). The prefetch's bucket index is kept for the check
        // (`check_from`), which then does not hash the id again.
        let (hint, ready) = match &t.op {
            Op::Put(p) => (
                self.sessions.prefetch(t.client_id),
                Ready::Put(self.kv.slot(&p.key), p),
            ),
            op => (
                self.sessions.hint(t.client_id),
                Ready::Other(&mut self.kv, op),
            ),
        };
        // Computed on every tracked command (a save needs it as much as a duplicate
        // does), while the session's cache line is still on its way.
        let id = RequestId {
            client_id: t.client_id,
            secret: t.secret,
            seq: t.seq,
            first_incomplete: t.first_incomplete,
            fingerprint: t.fingerprint,
        };
        match self.sessions.check_from(hint, id, self.settings.window) {
            Verdict::Execute(pending) => {
                self.stats.executed += 1;
                #[cfg(feature = "sim")]
                self.probe.note_executed(index, t);
                // An alarm's refusal is saved like any answer: a retry gets it again.
                let reply = match refused {
                    Some(reply) => reply,
                    None => {
                        let reply = ready.execute(
                            &mut self.leases,
                            &self.settings,
                            self.cluster_time,
                            index,
                        );
                        self.stats.count_writes(&reply);
                        reply
                    }
                };
                pending.save(&reply, self.cluster_time);
                Response::Op(Ok(reply))
            }
            // The simulation's and the nemesis's `--break dedup` execute the duplicate
            // again; the first reply stays saved.
            Verdict::Duplicate(_) if dedup_broken => {
                self.stats.executed += 1;
                #[cfg(feature = "sim")]
                self.probe.note_executed(index, t);
                Response::Op(Ok(ready.execute(
                    &mut self.leases,
                    &self.settings,
                    self.cluster_time,
                    index,
                )))
            }
            Verdict::Duplicate(saved) => {
                self.stats.duplicates += 1;
                Response::Op(Ok(saved.to_reply()))
            }
            Verdict::Reject(e) => {
                self.stats.rejected += 1;
                self.stats.rejected_by_kind[e.kind_index()] += 1;
                Response::Op(Err(e))
            }
        }
    }

    /// The keys and leases, for running an op.
    fn exec(&mut self) -> Exec<'_> {
        Exec {
            kv: &mut self.kv,
            leases: &mut self.leases,
            settings: &self.settings,
            now: self.cluster_time,
        }
    }

    /// etcd's Range against the applied state, with the store's revision (etcd's header
    /// revision, also for a read at an older revision).
    pub fn range(&self, req: &RangeRequest) -> Result<(i64, RangeResponse), OpError> {
        if req.range.key.is_empty() {
            return Err(OpError::EmptyKey);
        }
        Ok((self.kv.revision(), self.kv.range(req)?))
    }

    /// Changes at revisions `>= from` to keys in `range`, as watch events, in revision
    /// order, stopping after the revision at which `limit` is reached (never inside a
    /// revision). `Compacted` if `from` is below the compacted revision.
    pub fn events(
        &self,
        range: &KeyRange,
        from: i64,
        prev_kv: bool,
        limit: ReadLimit,
    ) -> Result<EventBatch, OpError> {
        self.kv
            .history()
            .events(range, from, prev_kv, limit, self.kv.revision())
    }

    /// The compacted revision (0: never compacted).
    pub fn compacted_revision(&self) -> i64 {
        self.kv.compacted_revision()
    }

    /// The earliest cluster time at which a session or lease may expire: when no traffic
    /// moves time past it, the leader proposes a [`Command::Tick`].
    pub fn next_deadline(&self) -> Option<u64> {
        let s = self.sessions.next_deadline(self.settings.session_ttl_ms);
        let l = self.leases.next_deadline();
        match (s, l) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Starts (or stops) recording what expires, for tests and the simulation.
    pub fn record_expiries(&mut self, on: bool) {
        self.expiry_log = on.then(Vec::new);
    }

    /// Takes what expired since the last call (needs [`record_expiries`](Self::record_expiries)).
    pub fn take_expired(&mut self) -> Vec<Expired> {
        self.expiry_log
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Whether duplicates are executed again: only in a deliberately broken build (the
    /// simulation's probe, or [`crate::broken`]).
    #[inline]
    fn dedup_broken(&self) -> bool {
        #[cfg(feature = "sim")]
        if self.probe.break_dedup {
            return true;
        }
        crate::broken::is(crate::broken::Break::Dedup)
    }

    /// The simulation's instrumentation (see [`SimProbe`]).
    #[cfg(feature = "sim")]
    pub fn sim_probe(&mut self) -> &mut SimProbe {
        &mut self.probe
    }

    pub fn kv(&self) -> &KvStore {
        &self.kv
    }

    /// The key space with its history, the rest of the state dropped (see
    /// [`restore_without_keys`](Self::restore_without_keys)).
    pub fn into_kv(self) -> KvStore {
        self.kv
    }

    pub fn leases(&self) -> &LeaseTable {
        &self.leases
    }

    pub fn auth(&self) -> &crate::auth::AuthStore {
        &self.auth
    }

    /// The user that owns session `client_id`, if it was registered with auth on.
    pub fn session_owner(&self, client_id: u64) -> Option<&str> {
        self.owners.get(&client_id).map(String::as_str)
    }

    pub fn sessions(&self) -> &SessionTable {
        &self.sessions
    }

    pub fn settings(&self) -> Settings {
        self.settings
    }

    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }

    pub fn cluster_time(&self) -> u64 {
        self.cluster_time
    }

    pub fn revision(&self) -> i64 {
        self.kv.revision()
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Checks every invariant (STYLE.md): saved seqs inside each session's window, deadline
    /// indexes covering every session and lease, lease key sets matching the keys' leases,
    /// sane revisions. `Err` names the first one broken.
    pub fn validate(&self) -> Result<(), String> {
        self.kv.validate()?;
        self.leases.validate()?;
        self.sessions
            .validate(self.settings.window, self.cluster_time)?;
        for (key, v) in self.kv.iter() {
            if v.lease != 0
                && !self
                    .leases
                    .get(v.lease)
                    .is_some_and(|l| l.keys.contains(key))
            {
                return Err(format!(
                    "key {key:?} names lease {} which does not list it",
                    v.lease
                ));
            }
        }
        for (id, lease) in self.leases.iter() {
            for key in &lease.keys {
                if self.kv.get(key).is_none_or(|v| v.lease != *id) {
                    return Err(format!(
                        "lease {id} lists key {key:?} which is not attached"
                    ));
                }
            }
        }
        Ok(())
    }
}
