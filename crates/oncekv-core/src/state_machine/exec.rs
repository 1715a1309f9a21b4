//! What one op does to the keys and leases: etcd's put, delete, txn and lease semantics
//! and the queue of `Op::Enqueue`. The state machine decides whether an op runs (sessions,
//! alarms); this module runs it against the store, borrowed apart from the sessions.

use bytes::Bytes;

use crate::command::{
    CONCURRENCY_TTL_SECS, DeleteRangeRequest, DeleteRangeResponse, EnqueueRequest, Enqueued,
    MAX_LEASE_TTL_SECS, Op, OpError, OpReply, OpResponse, PutRequest, PutResponse, RequestOp,
    ResponseOp, Settings, TxnRequest, TxnResponse, queue_key,
};
use crate::kv::{KeySlot, KnownSlot, KvStore, PutEntry, Slot, Value, Write};
use crate::lease::LeaseTable;
use crate::txn::{compares_hold, validate_txn};

/// A tracked op made ready to run before its session is checked. For a put that means
/// finding its key in the store, after asking for the session's cache line
/// (`SessionTable::prefetch`): with a session table far larger than the CPU's caches, the
/// session and the B-tree search then wait for memory together, where checking first
/// would wait for the session and only then start the search. Dropping it (a duplicate, a
/// refusal) changes nothing.
pub(super) enum Ready<'a> {
    Put(Slot<'a>, &'a PutRequest),
    Other(&'a mut KvStore, &'a Op),
}

impl Ready<'_> {
    pub(super) fn execute(
        self,
        leases: &mut LeaseTable,
        settings: &Settings,
        now: u64,
        index: u64,
    ) -> OpReply {
        match self {
            Ready::Put(slot, p) => put_in(slot, leases, p),
            Ready::Other(kv, op) => Exec {
                kv,
                leases,
                settings,
                now,
            }
            .execute(index, op),
        }
    }
}

/// etcd's refusals of a put, in etcd's order; `exists` says whether the key is stored.
fn check_put(
    p: &PutRequest,
    exists: impl FnOnce() -> bool,
    leases: &LeaseTable,
) -> Result<(), OpError> {
    if p.key.is_empty() {
        return Err(OpError::EmptyKey);
    }
    if p.ignore_lease && p.lease != 0 {
        return Err(OpError::LeaseProvided);
    }
    if p.ignore_value && !p.value.is_empty() {
        return Err(OpError::ValueProvided);
    }
    if (p.ignore_value || p.ignore_lease) && !exists() {
        return Err(OpError::KeyNotFound);
    }
    if p.lease != 0 && !leases.contains(p.lease) {
        return Err(OpError::LeaseNotFound);
    }
    Ok(())
}

/// The value a put writes (`None`: keep the key's, etcd's `ignore_value`).
fn put_value(p: &PutRequest) -> Option<&Bytes> {
    (!p.ignore_value).then_some(&p.value)
}

/// The lease a put gives the key (`None`: keep the key's, etcd's `ignore_lease`).
fn put_lease(p: &PutRequest) -> Option<i64> {
    (!p.ignore_lease).then_some(p.lease)
}

/// [`put_at`] for the kind of slot `slot` is (inlined, so that its caller branches on the
/// kind and calls the function for that kind).
#[inline(always)]
fn put_in(slot: Slot<'_>, leases: &mut LeaseTable, p: &PutRequest) -> OpReply {
    match slot.known() {
        KnownSlot::Stored(slot) => put_at(slot, leases, p),
        KnownSlot::Free(slot) => put_at(slot, leases, p),
    }
}

/// A put of its own (not in a txn) at the key's slot: checked, written at the next
/// revision, the key moved between leases. One function per kind of slot (stored key or
/// not): a caller then passes only what that kind holds, where a `Slot` made the tracked
/// put copy the whole B-tree entry, either variant, into the call (ten stores; counts in
/// benches/README.md).
#[inline(never)]
fn put_at<E: PutEntry>(slot: KeySlot<'_, E>, leases: &mut LeaseTable, p: &PutRequest) -> OpReply {
    if let Err(e) = check_put(p, || slot.exists(), leases) {
        return OpReply {
            revision: slot.revision(),
            result: Err(e),
        };
    }
    let (revision, prev, lease) = slot.put(put_value(p), put_lease(p));
    OpReply {
        revision,
        result: Ok(OpResponse::Put(finish_put(leases, p, prev, lease))),
    }
}

/// What follows a put in the store: the key leaves its previous lease and joins its new
/// one; the reply carries the previous value if the request asked for it.
#[inline]
fn finish_put(
    leases: &mut LeaseTable,
    p: &PutRequest,
    prev: Option<Value>,
    lease: i64,
) -> PutResponse {
    if let Some(prev) = &prev
        && prev.lease != lease
        && prev.lease != 0
    {
        leases.detach(prev.lease, &p.key);
    }
    if lease != 0 {
        leases.attach(lease, &p.key);
    }
    PutResponse {
        prev_kv: prev
            .filter(|_| p.prev_kv)
            .map(|v| Box::new(v.to_key_value(&p.key))),
    }
}

/// What an op runs against: the keys and leases, borrowed apart from the sessions so that a
/// tracked op runs while its session stays borrowed (see `apply_tracked`), with the settings
/// and the cluster time of the entry.
pub(super) struct Exec<'a> {
    pub(super) kv: &'a mut KvStore,
    pub(super) leases: &'a mut LeaseTable,
    pub(super) settings: &'a Settings,
    pub(super) now: u64,
}

impl Exec<'_> {
    /// Runs an op against the store. Refusals (`Err` in the reply) change nothing.
    pub(super) fn execute(&mut self, index: u64, op: &Op) -> OpReply {
        let result = match op {
            Op::Put(p) => return put_in(self.kv.slot(&p.key), self.leases, p),
            Op::DeleteRange(d) => self.check_delete(d).map(|()| {
                let mut w = self.kv.begin();
                let resp = self.delete(&mut w, d);
                self.kv.commit(w);
                OpResponse::DeleteRange(resp)
            }),
            Op::Txn(t) => self.txn(t).map(OpResponse::Txn),
            Op::LeaseGrant { id, ttl } => self.lease_grant(index, *id, *ttl),
            Op::LeaseRevoke { id } => match self.leases.revoke(*id) {
                Some(lease) => {
                    self.delete_keys(lease.keys);
                    Ok(OpResponse::LeaseRevoke)
                }
                None => Err(OpError::LeaseNotFound),
            },
            Op::LeaseKeepAlive { id } => match self.leases.keep_alive(*id, self.now) {
                Some(ttl) => Ok(OpResponse::LeaseKeepAlive { id: *id, ttl }),
                None => Err(OpError::LeaseNotFound),
            },
            Op::Compact { revision } => self.kv.compact(*revision).map(|()| OpResponse::Compact),
            Op::Enqueue(e) => self.enqueue(index, e).map(OpResponse::Enqueue),
        };
        OpReply {
            revision: self.kv.revision(),
            result,
        }
    }

    fn check_put(&self, p: &PutRequest) -> Result<(), OpError> {
        check_put(p, || self.kv.get(&p.key).is_some(), self.leases)
    }

    fn check_delete(&self, d: &DeleteRangeRequest) -> Result<(), OpError> {
        if d.range.key.is_empty() {
            return Err(OpError::EmptyKey);
        }
        Ok(())
    }

    /// A put in a txn that [`check_put`](Self::check_put) accepted.
    fn put(&mut self, w: &mut Write, p: &PutRequest) -> PutResponse {
        let (prev, lease) = self.kv.put(w, &p.key, put_value(p), put_lease(p));
        finish_put(self.leases, p, prev, lease)
    }

    fn delete(&mut self, w: &mut Write, d: &DeleteRangeRequest) -> DeleteRangeResponse {
        let deleted = self.kv.delete_range(w, &d.range);
        for (key, v) in &deleted {
            if v.lease != 0 {
                self.leases.detach(v.lease, key);
            }
        }
        KvStore::delete_response(d, &deleted)
    }

    /// Deletes a revoked or expired lease's keys at one new revision.
    pub(super) fn delete_keys(&mut self, keys: impl IntoIterator<Item = Bytes>) {
        let mut w = self.kv.begin();
        for key in keys {
            self.kv
                .delete_range(&mut w, &crate::command::KeyRange::single(key));
        }
        self.kv.commit(w);
    }

    fn txn(&mut self, t: &TxnRequest) -> Result<TxnResponse, OpError> {
        // The op-count limit is the server's flag; here only the shape matters.
        validate_txn(t, usize::MAX)?;
        let mut path = Vec::new();
        self.check_txn(t, &mut path)?;
        let mut w = self.kv.begin();
        let resp = self.run_txn(&mut w, t, &mut path.into_iter());
        self.kv.commit(w);
        Ok(resp)
    }

    /// Decides every branch, nested txns included, against the state before the txn (etcd's
    /// `compareToPath`), appending the decisions to `path` in the order
    /// [`run_txn`](Self::run_txn) meets them, and checks the ops on that path before
    /// anything changes, as etcd does: a txn is refused whole or applied whole.
    fn check_txn(&self, t: &TxnRequest, path: &mut Vec<bool>) -> Result<(), OpError> {
        let succeeded = compares_hold(self.kv, t);
        path.push(succeeded);
        let branch = if succeeded { &t.success } else { &t.failure };
        for op in branch {
            match op {
                RequestOp::Range(r) => self.kv.check_revision(r.revision)?,
                RequestOp::Put(p) => self.check_put(p)?,
                RequestOp::DeleteRange(d) => self.check_delete(d)?,
                RequestOp::Txn(inner) => self.check_txn(inner, path)?,
            }
        }
        Ok(())
    }

    /// Runs the branches [`check_txn`](Self::check_txn) decided (`path`).
    fn run_txn(
        &mut self,
        w: &mut Write,
        t: &TxnRequest,
        path: &mut impl Iterator<Item = bool>,
    ) -> TxnResponse {
        let succeeded = path.next().unwrap_or(false);
        let branch = if succeeded { &t.success } else { &t.failure };
        let mut responses = Vec::with_capacity(branch.len());
        for op in branch {
            responses.push(match op {
                RequestOp::Range(r) => ResponseOp::Range(self.kv.range(r).unwrap_or_default()),
                // Checked up front; still valid, since validate_txn forbids a put of a key
                // that the same path writes or deletes elsewhere.
                RequestOp::Put(p) => ResponseOp::Put(match self.check_put(p) {
                    Ok(()) => self.put(w, p),
                    Err(_) => PutResponse::default(),
                }),
                RequestOp::DeleteRange(d) => ResponseOp::DeleteRange(self.delete(w, d)),
                RequestOp::Txn(inner) => ResponseOp::Txn(self.run_txn(w, inner, path)),
            });
        }
        TxnResponse {
            succeeded,
            responses,
        }
    }

    /// [`Op::Enqueue`]: refused whole (nothing granted, nothing written) or applied whole.
    fn enqueue(&mut self, index: u64, e: &EnqueueRequest) -> Result<Enqueued, OpError> {
        let lease = if e.lease == 0 {
            match self.lease_grant(index, 0, CONCURRENCY_TTL_SECS)? {
                OpResponse::LeaseGrant { id, .. } => id,
                _ => return Err(OpError::LeaseNotFound),
            }
        } else if self.leases.contains(e.lease) {
            e.lease
        } else {
            return Err(OpError::LeaseNotFound);
        };
        let key = queue_key(&e.name, lease);
        let existing = self
            .kv
            .get(&key)
            .map(|v| (v.create_revision, v.value == e.value));
        let write = match existing {
            None => true,
            Some((_, same_value)) => e.proclaim && !same_value,
        };
        if write {
            let put = PutRequest {
                key: key.clone(),
                value: e.value.clone(),
                lease,
                ..PutRequest::default()
            };
            let mut w = self.kv.begin();
            self.put(&mut w, &put);
            self.kv.commit(w);
        }
        let create_revision = match existing {
            Some((rev, _)) => rev,
            None => self.kv.revision(),
        };
        Ok(Enqueued {
            key,
            lease,
            create_revision,
        })
    }

    fn lease_grant(&mut self, index: u64, id: i64, ttl: i64) -> Result<OpResponse, OpError> {
        if ttl > MAX_LEASE_TTL_SECS {
            return Err(OpError::LeaseTtlTooLarge);
        }
        let ttl = ttl.max(self.settings.min_lease_ttl_secs);
        let id = if id == 0 {
            self.leases
                .free_id(i64::try_from(index).unwrap_or(i64::MAX))
        } else if self.leases.contains(id) {
            return Err(OpError::LeaseAlreadyExists);
        } else {
            id
        };
        self.leases.grant(id, ttl, self.now);
        Ok(OpResponse::LeaseGrant { id, ttl })
    }
}
