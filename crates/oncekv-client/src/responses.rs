//! What calls return: plain Rust structs, translated from the etcd wire types.
//!
//! Key-values are [`oncekv_core::KeyValue`] (etcd's `mvccpb.KeyValue`: key, value,
//! create/mod revision, version, lease) with `Bytes` keys and values.

use bytes::Bytes;
use oncekv_core::KeyValue;
use oncekv_proto::{etcdserverpb as pb, mvccpb};

/// Which member answered, and the store revision and raft term at the time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Header {
    pub cluster_id: u64,
    pub member_id: u64,
    /// The store revision after the call (for writes: including this write).
    pub revision: i64,
    pub raft_term: u64,
}

impl From<Option<pb::ResponseHeader>> for Header {
    fn from(h: Option<pb::ResponseHeader>) -> Header {
        h.map_or_else(Header::default, |h| Header {
            cluster_id: h.cluster_id,
            member_id: h.member_id,
            revision: h.revision,
            raft_term: h.raft_term,
        })
    }
}

pub(crate) fn key_value(kv: mvccpb::KeyValue) -> KeyValue {
    kv.into()
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PutResponse {
    pub header: Header,
    /// The key's previous state, if asked for and the key existed.
    pub prev_kv: Option<KeyValue>,
}

impl From<pb::PutResponse> for PutResponse {
    fn from(r: pb::PutResponse) -> PutResponse {
        PutResponse {
            header: r.header.into(),
            prev_kv: r.prev_kv.map(key_value),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeResponse {
    pub header: Header,
    pub kvs: Vec<KeyValue>,
    /// Some matching keys were left out by the limit.
    pub more: bool,
    /// How many keys matched (regardless of the limit).
    pub count: i64,
}

impl From<pb::RangeResponse> for RangeResponse {
    fn from(r: pb::RangeResponse) -> RangeResponse {
        RangeResponse {
            header: r.header.into(),
            kvs: r.kvs.into_iter().map(key_value).collect(),
            more: r.more,
            count: r.count,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteResponse {
    pub header: Header,
    pub deleted: i64,
    /// The deleted key-values, if asked for.
    pub prev_kvs: Vec<KeyValue>,
}

impl From<pb::DeleteRangeResponse> for DeleteResponse {
    fn from(r: pb::DeleteRangeResponse) -> DeleteResponse {
        DeleteResponse {
            header: r.header.into(),
            deleted: r.deleted,
            prev_kvs: r.prev_kvs.into_iter().map(key_value).collect(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TxnResponse {
    pub header: Header,
    /// Whether every compare held (the success branch ran).
    pub succeeded: bool,
    /// One response per op of the branch that ran, in order.
    pub responses: Vec<TxnOpResponse>,
}

/// The result of one [`TxnOp`](crate::TxnOp).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOpResponse {
    Get(RangeResponse),
    Put(PutResponse),
    Delete(DeleteResponse),
    Txn(TxnResponse),
}

impl From<pb::TxnResponse> for TxnResponse {
    fn from(r: pb::TxnResponse) -> TxnResponse {
        use pb::response_op::Response as R;
        TxnResponse {
            header: r.header.into(),
            succeeded: r.succeeded,
            responses: r
                .responses
                .into_iter()
                .filter_map(|op| op.response)
                .map(|op| match op {
                    R::ResponseRange(r) => TxnOpResponse::Get(r.into()),
                    R::ResponsePut(r) => TxnOpResponse::Put(r.into()),
                    R::ResponseDeleteRange(r) => TxnOpResponse::Delete(r.into()),
                    R::ResponseTxn(r) => TxnOpResponse::Txn(r.into()),
                })
                .collect(),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompactResponse {
    /// `revision` is the store revision when the compaction was applied.
    pub header: Header,
}

impl From<pb::CompactionResponse> for CompactResponse {
    fn from(r: pb::CompactionResponse) -> CompactResponse {
        CompactResponse {
            header: r.header.into(),
        }
    }
}

/// What an [`Event`] did to its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Put,
    Delete,
}

/// One change of one key (etcd's `mvccpb.Event`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: EventType,
    /// For a put, the key-value it wrote; for a delete, the key with `mod_revision` set
    /// to the revision of the delete (and no value).
    pub kv: KeyValue,
    /// The key-value before this event, when the watch asked for it and history still
    /// held it.
    pub prev_kv: Option<KeyValue>,
}

impl Event {
    /// The revision this event happened at. Several events share one revision when one
    /// transaction (or one range delete) made them.
    pub fn revision(&self) -> i64 {
        self.kv.mod_revision
    }
}

impl TryFrom<mvccpb::Event> for Event {
    /// What was wrong with the event (a server that breaks the wire format).
    type Error = String;

    fn try_from(e: mvccpb::Event) -> Result<Event, String> {
        use mvccpb::event::EventType as T;
        let kind = match T::try_from(e.r#type) {
            Ok(T::Put) => EventType::Put,
            Ok(T::Delete) => EventType::Delete,
            Err(_) => return Err(format!("unknown event type {}", e.r#type)),
        };
        let kv = e.kv.ok_or("an event without a key-value")?;
        Ok(Event {
            kind,
            kv: key_value(kv),
            prev_kv: e.prev_kv.map(key_value),
        })
    }
}

/// What a watch delivers: the events of one or more revisions, in revision order, or (with
/// no events) a progress notification.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchResponse {
    /// The member that sent it. With events, `revision` is the store revision when they
    /// were sent (it may be past the last event); without, every event up to `revision`
    /// has been delivered.
    pub header: Header,
    /// Every event of each revision it covers (a revision's events are never split
    /// between responses).
    pub events: Vec<Event>,
}

impl WatchResponse {
    /// A progress notification: no events, only how far the watch has got.
    pub fn is_progress_notify(&self) -> bool {
        self.events.is_empty()
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseGrantResponse {
    pub header: Header,
    pub id: i64,
    /// The granted TTL in seconds (raised to the cluster's minimum if smaller).
    pub ttl: i64,
}

impl From<pb::LeaseGrantResponse> for LeaseGrantResponse {
    fn from(r: pb::LeaseGrantResponse) -> LeaseGrantResponse {
        LeaseGrantResponse {
            header: r.header.into(),
            id: r.id,
            ttl: r.ttl,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseRevokeResponse {
    pub header: Header,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseKeepAliveResponse {
    pub header: Header,
    pub id: i64,
    /// The lease's renewed TTL in seconds.
    pub ttl: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseTimeToLiveResponse {
    pub header: Header,
    pub id: i64,
    /// Seconds left; -1 if the lease does not exist.
    pub ttl: i64,
    /// The TTL the lease was granted with.
    pub granted_ttl: i64,
    /// The keys attached to the lease, if asked for.
    pub keys: Vec<Bytes>,
}

impl From<pb::LeaseTimeToLiveResponse> for LeaseTimeToLiveResponse {
    fn from(r: pb::LeaseTimeToLiveResponse) -> LeaseTimeToLiveResponse {
        LeaseTimeToLiveResponse {
            header: r.header.into(),
            id: r.id,
            ttl: r.ttl,
            granted_ttl: r.granted_ttl,
            keys: r.keys,
        }
    }
}

/// A cluster member (etcd's `Member`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub is_learner: bool,
}

/// Every member, and which member answered (etcd's `MemberListResponse`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemberListResponse {
    pub header: Header,
    pub members: Vec<Member>,
}

impl From<pb::MemberListResponse> for MemberListResponse {
    fn from(r: pb::MemberListResponse) -> MemberListResponse {
        MemberListResponse {
            header: r.header.into(),
            members: r.members.into_iter().map(Member::from).collect(),
        }
    }
}

impl From<pb::Member> for Member {
    fn from(m: pb::Member) -> Member {
        Member {
            id: m.id,
            name: m.name,
            peer_urls: m.peer_ur_ls,
            client_urls: m.client_ur_ls,
            is_learner: m.is_learner,
        }
    }
}

/// One member's view of itself and the cluster (etcd's `Maintenance.Status`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    /// `header.member_id` is the answering member.
    pub header: Header,
    /// The etcd API version the server is compatible with.
    pub version: String,
    /// The member id of the leader this member knows of (0: none).
    pub leader: u64,
    pub raft_index: u64,
    pub raft_term: u64,
    pub raft_applied_index: u64,
    pub db_size: i64,
    /// The part of `db_size` in use (etcd reports it beside `db_size`).
    pub db_size_in_use: i64,
    pub is_learner: bool,
    pub errors: Vec<String>,
}

impl Status {
    /// Whether the answering member is the leader.
    pub fn is_leader(&self) -> bool {
        self.leader != 0 && self.leader == self.header.member_id
    }
}

impl From<pb::StatusResponse> for Status {
    fn from(s: pb::StatusResponse) -> Status {
        Status {
            header: s.header.into(),
            version: s.version,
            leader: s.leader,
            raft_index: s.raft_index,
            raft_term: s.raft_term,
            raft_applied_index: s.raft_applied_index,
            db_size: s.db_size,
            db_size_in_use: s.db_size_in_use,
            is_learner: s.is_learner,
            errors: s.errors,
        }
    }
}
