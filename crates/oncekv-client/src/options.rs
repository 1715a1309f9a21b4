//! Request options and transaction building blocks, translated to the etcd wire types.
//!
//! Keys and values are taken as anything that converts into `Vec<u8>` (`&str`, `String`,
//! `&[u8]`, `Vec<u8>`, `Bytes`).

use bytes::Bytes;
use oncekv_core::prefix_end;
use oncekv_proto::etcdserverpb as pb;

pub use oncekv_core::{SortOrder, SortTarget};

/// Which keys a range read or delete covers, besides the key itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
enum RangeEnd {
    /// Only the key.
    #[default]
    Single,
    /// Every key that starts with the key.
    Prefix,
    /// Every key `>=` the key.
    FromKey,
    /// `[key, end)`.
    End(Bytes),
}

impl RangeEnd {
    fn for_key(&self, key: &[u8]) -> Bytes {
        match self {
            RangeEnd::Single => Bytes::new(),
            RangeEnd::Prefix => prefix_end(key),
            RangeEnd::FromKey => Bytes::from_static(b"\0"),
            RangeEnd::End(end) => end.clone(),
        }
    }
}

/// Options of [`Client::put_with`](crate::Client::put_with).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PutOptions {
    lease: i64,
    prev_kv: bool,
    ignore_value: bool,
    ignore_lease: bool,
}

impl PutOptions {
    pub fn new() -> PutOptions {
        PutOptions::default()
    }

    /// Attach the key to lease `id`: the key is deleted when the lease ends.
    pub fn with_lease(mut self, id: i64) -> PutOptions {
        self.lease = id;
        self
    }

    /// Return the key's previous value in [`PutResponse::prev_kv`](crate::PutResponse).
    pub fn with_prev_kv(mut self) -> PutOptions {
        self.prev_kv = true;
        self
    }

    /// Keep the current value (the key must exist; the value given must be empty).
    pub fn with_ignore_value(mut self) -> PutOptions {
        self.ignore_value = true;
        self
    }

    /// Keep the current lease (no lease may be given).
    pub fn with_ignore_lease(mut self) -> PutOptions {
        self.ignore_lease = true;
        self
    }

    pub(crate) fn request(&self, key: Bytes, value: Bytes) -> pb::PutRequest {
        pb::PutRequest {
            key,
            value,
            lease: self.lease,
            prev_kv: self.prev_kv,
            ignore_value: self.ignore_value,
            ignore_lease: self.ignore_lease,
        }
    }
}

/// Options of [`Client::range`](crate::Client::range): which keys, how many, which fields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GetOptions {
    end: RangeEnd,
    limit: i64,
    revision: i64,
    keys_only: bool,
    count_only: bool,
    serializable: bool,
    sort: Option<(SortTarget, SortOrder)>,
}

impl GetOptions {
    pub fn new() -> GetOptions {
        GetOptions::default()
    }

    /// Every key that starts with the given key.
    pub fn with_prefix(mut self) -> GetOptions {
        self.end = RangeEnd::Prefix;
        self
    }

    /// Every key greater than or equal to the given key.
    pub fn with_from_key(mut self) -> GetOptions {
        self.end = RangeEnd::FromKey;
        self
    }

    /// Keys in `[key, end)`.
    pub fn with_range_end(mut self, end: impl Into<Vec<u8>>) -> GetOptions {
        self.end = RangeEnd::End(end.into().into());
        self
    }

    /// At most `limit` keys (0: all); [`RangeResponse::more`](crate::RangeResponse) tells
    /// whether some were left out.
    pub fn with_limit(mut self, limit: i64) -> GetOptions {
        self.limit = limit;
        self
    }

    /// Read the keyspace as it was at this store revision (0: the latest). A revision below
    /// the last compaction is refused with "required revision has been compacted", one
    /// above the current revision with "required revision is a future revision".
    pub fn with_revision(mut self, revision: i64) -> GetOptions {
        self.revision = revision;
        self
    }

    /// Keys without values.
    pub fn with_keys_only(mut self) -> GetOptions {
        self.keys_only = true;
        self
    }

    /// Only the count of matching keys.
    pub fn with_count_only(mut self) -> GetOptions {
        self.count_only = true;
        self
    }

    /// Answer from the contacted member's applied state without confirming leadership
    /// (faster, may be stale). Reads are linearizable by default.
    pub fn with_serializable(mut self) -> GetOptions {
        self.serializable = true;
        self
    }

    pub fn with_sort(mut self, target: SortTarget, order: SortOrder) -> GetOptions {
        self.sort = Some((target, order));
        self
    }

    pub(crate) fn request(&self, key: Bytes) -> pb::RangeRequest {
        let (target, order) = self.sort.unwrap_or_default();
        pb::RangeRequest {
            range_end: self.end.for_key(&key),
            key,
            limit: self.limit,
            revision: self.revision,
            sort_order: sort_order(order) as i32,
            sort_target: sort_target(target) as i32,
            serializable: self.serializable,
            keys_only: self.keys_only,
            count_only: self.count_only,
            ..pb::RangeRequest::default()
        }
    }
}

fn sort_order(o: SortOrder) -> pb::range_request::SortOrder {
    use pb::range_request::SortOrder as P;
    match o {
        SortOrder::None => P::None,
        SortOrder::Ascend => P::Ascend,
        SortOrder::Descend => P::Descend,
    }
}

fn sort_target(t: SortTarget) -> pb::range_request::SortTarget {
    use pb::range_request::SortTarget as P;
    match t {
        SortTarget::Key => P::Key,
        SortTarget::Version => P::Version,
        SortTarget::Create => P::Create,
        SortTarget::Mod => P::Mod,
        SortTarget::Value => P::Value,
    }
}

/// Options of [`Client::delete_with`](crate::Client::delete_with).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteOptions {
    end: RangeEnd,
    prev_kv: bool,
}

impl DeleteOptions {
    pub fn new() -> DeleteOptions {
        DeleteOptions::default()
    }

    /// Every key that starts with the given key.
    pub fn with_prefix(mut self) -> DeleteOptions {
        self.end = RangeEnd::Prefix;
        self
    }

    /// Every key greater than or equal to the given key.
    pub fn with_from_key(mut self) -> DeleteOptions {
        self.end = RangeEnd::FromKey;
        self
    }

    /// Keys in `[key, end)`.
    pub fn with_range_end(mut self, end: impl Into<Vec<u8>>) -> DeleteOptions {
        self.end = RangeEnd::End(end.into().into());
        self
    }

    /// Return the deleted key-values in [`DeleteResponse::prev_kvs`](crate::DeleteResponse).
    pub fn with_prev_kv(mut self) -> DeleteOptions {
        self.prev_kv = true;
        self
    }

    pub(crate) fn request(&self, key: Bytes) -> pb::DeleteRangeRequest {
        pb::DeleteRangeRequest {
            range_end: self.end.for_key(&key),
            key,
            prev_kv: self.prev_kv,
        }
    }
}

/// Options of [`Client::watch`](crate::Client::watch): which keys, from which revision,
/// and what each event carries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchOptions {
    end: RangeEnd,
    start_revision: i64,
    allow_leaderless: bool,
    prev_kv: bool,
    no_put: bool,
    no_delete: bool,
    progress_notify: bool,
    fragment: bool,
}

impl WatchOptions {
    pub fn new() -> WatchOptions {
        WatchOptions::default()
    }

    /// Every key that starts with the given key.
    pub fn with_prefix(mut self) -> WatchOptions {
        self.end = RangeEnd::Prefix;
        self
    }

    /// Every key greater than or equal to the given key.
    pub fn with_from_key(mut self) -> WatchOptions {
        self.end = RangeEnd::FromKey;
        self
    }

    /// Keys in `[key, end)`.
    pub fn with_range_end(mut self, end: impl Into<Vec<u8>>) -> WatchOptions {
        self.end = RangeEnd::End(end.into().into());
        self
    }

    /// Replay history from this revision (inclusive) before live events; 0 (the default):
    /// only changes made after the watch is created. A revision below the last compaction
    /// ends the watch with [`Error::Compacted`](crate::Error::Compacted).
    pub fn with_start_revision(mut self, revision: i64) -> WatchOptions {
        self.start_revision = revision;
        self
    }

    /// Each event carries the key's previous key-value (if history still holds it).
    pub fn with_prev_kv(mut self) -> WatchOptions {
        self.prev_kv = true;
        self
    }

    /// Leave out put events (the server filters them).
    pub fn with_no_put(mut self) -> WatchOptions {
        self.no_put = true;
        self
    }

    /// Leave out delete events (the server filters them).
    pub fn with_no_delete(mut self) -> WatchOptions {
        self.no_delete = true;
        self
    }

    /// Ask the server for periodic empty responses carrying the current revision while
    /// nothing matches: they tell how far the watch has got, and let a resumed watch
    /// start past revisions that had nothing for it.
    pub fn with_progress_notify(mut self) -> WatchOptions {
        self.progress_notify = true;
        self
    }

    /// Let the server split responses too large for one message; the client joins the
    /// fragments, so each [`WatchResponse`](crate::WatchResponse) is still whole.
    pub fn with_fragment(mut self) -> WatchOptions {
        self.fragment = true;
        self
    }

    /// Let a member that has lost touch with the leader go on serving the watch (etcd
    /// clients' default). Without this, the watch asks to be served only by a member that
    /// has a leader, as etcdctl does: a member cut off from the cluster (which would keep
    /// the stream open but see no new revisions) ends it after a few election timeouts,
    /// and the watch resumes on a member that has one.
    pub fn with_leaderless_member_allowed(mut self) -> WatchOptions {
        self.allow_leaderless = true;
        self
    }

    /// The revision the watch starts from (0: from now on).
    pub fn start_revision(&self) -> i64 {
        self.start_revision
    }

    /// Whether the serving member must have a leader.
    pub(crate) fn requires_leader(&self) -> bool {
        !self.allow_leaderless
    }

    /// The create request for `key` starting at `start_revision` (the watch's own on
    /// first creation, later the revision to resume from).
    pub(crate) fn request(&self, key: Bytes, start_revision: i64) -> pb::WatchCreateRequest {
        use pb::watch_create_request::FilterType;
        let mut filters = Vec::new();
        if self.no_put {
            filters.push(FilterType::Noput as i32);
        }
        if self.no_delete {
            filters.push(FilterType::Nodelete as i32);
        }
        pb::WatchCreateRequest {
            range_end: self.end.for_key(&key),
            key,
            start_revision,
            progress_notify: self.progress_notify,
            filters,
            prev_kv: self.prev_kv,
            watch_id: 0,
            fragment: self.fragment,
        }
    }
}

/// How a [`Compare`] relates the key's field to the operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOp {
    Equal,
    NotEqual,
    Greater,
    Less,
}

/// A transaction guard: a field of a key (or of every key in a range) against an operand.
/// A missing key has version, revisions and lease 0 and fails every value comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compare {
    key: Bytes,
    end: RangeEnd,
    op: CompareOp,
    target: pb::compare::TargetUnion,
}

impl Compare {
    fn new(key: impl Into<Vec<u8>>, op: CompareOp, target: pb::compare::TargetUnion) -> Compare {
        Compare {
            key: key.into().into(),
            end: RangeEnd::Single,
            op,
            target,
        }
    }

    /// The key's version (number of puts since creation; 0: absent).
    pub fn version(key: impl Into<Vec<u8>>, op: CompareOp, version: i64) -> Compare {
        Compare::new(key, op, pb::compare::TargetUnion::Version(version))
    }

    /// The revision at which the key was created.
    pub fn create_revision(key: impl Into<Vec<u8>>, op: CompareOp, revision: i64) -> Compare {
        Compare::new(key, op, pb::compare::TargetUnion::CreateRevision(revision))
    }

    /// The revision of the key's last modification.
    pub fn mod_revision(key: impl Into<Vec<u8>>, op: CompareOp, revision: i64) -> Compare {
        Compare::new(key, op, pb::compare::TargetUnion::ModRevision(revision))
    }

    /// The key's value.
    pub fn value(key: impl Into<Vec<u8>>, op: CompareOp, value: impl Into<Vec<u8>>) -> Compare {
        Compare::new(
            key,
            op,
            pb::compare::TargetUnion::Value(value.into().into()),
        )
    }

    /// The lease the key is attached to (0: none).
    pub fn lease(key: impl Into<Vec<u8>>, op: CompareOp, lease: i64) -> Compare {
        Compare::new(key, op, pb::compare::TargetUnion::Lease(lease))
    }

    /// Compare every key starting with the key (all must hold).
    pub fn with_prefix(mut self) -> Compare {
        self.end = RangeEnd::Prefix;
        self
    }

    /// Compare every key in `[key, end)` (all must hold).
    pub fn with_range_end(mut self, end: impl Into<Vec<u8>>) -> Compare {
        self.end = RangeEnd::End(end.into().into());
        self
    }

    pub(crate) fn to_pb(&self) -> pb::Compare {
        use pb::compare::{CompareResult as R, CompareTarget as T, TargetUnion as U};
        let result = match self.op {
            CompareOp::Equal => R::Equal,
            CompareOp::NotEqual => R::NotEqual,
            CompareOp::Greater => R::Greater,
            CompareOp::Less => R::Less,
        };
        let target = match self.target {
            U::Version(_) => T::Version,
            U::CreateRevision(_) => T::Create,
            U::ModRevision(_) => T::Mod,
            U::Value(_) => T::Value,
            U::Lease(_) => T::Lease,
        };
        pb::Compare {
            result: result as i32,
            target: target as i32,
            range_end: self.end.for_key(&self.key),
            key: self.key.clone(),
            target_union: Some(self.target.clone()),
        }
    }
}

/// One operation of a transaction branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOp {
    Get {
        key: Bytes,
        options: GetOptions,
    },
    Put {
        key: Bytes,
        value: Bytes,
        options: PutOptions,
    },
    Delete {
        key: Bytes,
        options: DeleteOptions,
    },
    Txn {
        compares: Vec<Compare>,
        success: Vec<TxnOp>,
        failure: Vec<TxnOp>,
    },
}

impl TxnOp {
    pub fn get(key: impl Into<Vec<u8>>, options: GetOptions) -> TxnOp {
        TxnOp::Get {
            key: key.into().into(),
            options,
        }
    }

    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, options: PutOptions) -> TxnOp {
        TxnOp::Put {
            key: key.into().into(),
            value: value.into().into(),
            options,
        }
    }

    pub fn delete(key: impl Into<Vec<u8>>, options: DeleteOptions) -> TxnOp {
        TxnOp::Delete {
            key: key.into().into(),
            options,
        }
    }

    /// A nested transaction (its ops may not touch keys its parent also writes).
    pub fn txn(compares: Vec<Compare>, success: Vec<TxnOp>, failure: Vec<TxnOp>) -> TxnOp {
        TxnOp::Txn {
            compares,
            success,
            failure,
        }
    }

    pub(crate) fn to_pb(&self) -> pb::RequestOp {
        use pb::request_op::Request as R;
        let request = match self {
            TxnOp::Get { key, options } => R::RequestRange(options.request(key.clone())),
            TxnOp::Put {
                key,
                value,
                options,
            } => R::RequestPut(options.request(key.clone(), value.clone())),
            TxnOp::Delete { key, options } => R::RequestDeleteRange(options.request(key.clone())),
            TxnOp::Txn {
                compares,
                success,
                failure,
            } => R::RequestTxn(txn_request(compares, success, failure)),
        };
        pb::RequestOp {
            request: Some(request),
        }
    }
}

pub(crate) fn txn_request(
    compares: &[Compare],
    success: &[TxnOp],
    failure: &[TxnOp],
) -> pb::TxnRequest {
    pb::TxnRequest {
        compare: compares.iter().map(Compare::to_pb).collect(),
        success: success.iter().map(TxnOp::to_pb).collect(),
        failure: failure.iter().map(TxnOp::to_pb).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // etcd's range encoding is easy to get subtly wrong; these are its three shapes.
    #[test]
    fn range_options_encode_etcds_range_end() {
        assert_eq!(
            GetOptions::new().request("a".into()).range_end,
            Bytes::new()
        );
        assert_eq!(
            GetOptions::new()
                .with_prefix()
                .request("ab".into())
                .range_end,
            Bytes::from("ac")
        );
        assert_eq!(
            GetOptions::new()
                .with_from_key()
                .request("a".into())
                .range_end,
            Bytes::from("\0")
        );
        assert_eq!(
            DeleteOptions::new()
                .with_range_end("z")
                .request("a".into())
                .range_end,
            Bytes::from("z")
        );
    }

    #[test]
    fn compares_carry_target_and_operand() {
        let c = Compare::value("k", CompareOp::NotEqual, "v").to_pb();
        assert_eq!(c.target, pb::compare::CompareTarget::Value as i32);
        assert_eq!(c.result, pb::compare::CompareResult::NotEqual as i32);
        assert_eq!(
            c.target_union,
            Some(pb::compare::TargetUnion::Value("v".into()))
        );
    }
}
