//! What the log carries and what applying it answers.
//!
//! A log entry is a [`LogPayload`]: the leader's [`cluster_time`](LogPayload::cluster_time)
//! plus one or more [`Command`]s (the server batches client commands into one entry; every
//! command in it is applied in order and gets its own [`Response`]).
//!
//! The request/response shapes follow etcd's v3 API field for field, so the server's gRPC
//! layer is a thin translation.

use std::fmt;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// One raft log entry's application data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogPayload {
    /// Milliseconds of cluster time stamped by the leader when it proposed this entry.
    /// Applying takes `max(current, this)`, so cluster time never runs backwards.
    pub cluster_time: u64,
    /// Applied in order; one [`Response`] each.
    pub commands: Vec<Command>,
}

/// A state-changing command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Open a session. Its client id is the log index of the entry that carries it, so the
    /// proposer MUST put a `RegisterClient` first in its entry (a second one in the same
    /// entry is answered [`Response::Rejected`]). The leader draws `secret` at random.
    ///
    /// `nonce` makes registration idempotent: a client that lost the reply retries with
    /// the same nonce and, while the session lives, is answered that session's client id
    /// and secret (not this entry's `secret`; no second session is created, and the retry
    /// counts as the session's activity). The client MUST draw it at random from a
    /// cryptographic source, once per session it wants, and keep it as secret as the
    /// session's secret, which it obtains. 0 means none: every such registration opens a
    /// new session.
    RegisterClient { secret: Secret, nonce: u128 },
    /// Refresh a session's `last_active`.
    KeepAlive { client_id: u64, secret: Secret },
    /// End a session and drop its saved responses.
    CloseSession { client_id: u64, secret: Secret },
    /// Advance cluster time only (proposed by the leader when a lease or session is due).
    Tick,
    /// Change the replicated settings.
    Configure(Settings),
    /// An op numbered by a client session: applied at most once per `(client_id, seq)`.
    Tracked(Tracked),
    /// An op without a session (etcd behaviour: a retry may apply it twice).
    Untracked(Op),
    /// Raise or clear an alarm for a member (etcd's Alarm ACTIVATE / DEACTIVATE). While
    /// NOSPACE is raised anywhere, ops that add data are refused; while CORRUPT is, every
    /// op is. Answered [`Response::Done`].
    Alarm {
        activate: bool,
        member: u64,
        alarm: AlarmKind,
    },
    /// [`RegisterClient`](Command::RegisterClient) by an authenticated user, who owns the
    /// session: while auth is on, only `owner` may send requests under it (the server
    /// checks before it looks for a saved reply). A retry with the same nonce by another
    /// user is [`Response::Rejected`]. (A variant of its own, after the others, so that
    /// log entries written before it existed still decode.)
    RegisterOwned {
        secret: Secret,
        nonce: u128,
        owner: String,
    },
    /// A change to the auth store (etcd's Auth service), answered [`Response::Auth`].
    Auth(crate::auth::AuthCommand),
    /// A client's [`Tracked`](Command::Tracked) or [`Untracked`](Command::Untracked)
    /// write, permitted by the auth store at `auth_revision` (a server wraps every write
    /// it checked while auth was on). Applied only while auth is off or the store is still
    /// at that revision; otherwise answered [`OpError::AuthOldRevision`], as etcd checks a
    /// write's permission again at apply: a member may have permitted it on state older
    /// than a revoke the leader had applied. A tracked write's refusal is saved like any
    /// answer, so a retry of its seq gets it again.
    Authorized {
        auth_revision: u64,
        command: Box<Command>,
    },
}

impl Command {
    /// The tracked command this is, or carries.
    pub fn tracked(&self) -> Option<&Tracked> {
        match self {
            Command::Tracked(t) => Some(t),
            Command::Authorized { command, .. } => command.tracked(),
            _ => None,
        }
    }
}

/// etcd's alarm types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum AlarmKind {
    /// The space quota was exceeded: writes that add data are refused until disarmed.
    NoSpace,
    /// Members disagree on the state at one revision: everything is refused until
    /// disarmed.
    Corrupt,
}

impl Op {
    /// Roughly how many bytes the op carries (keys and values): what the space quota
    /// counts a write as adding before it is applied.
    pub fn approx_size(&self) -> usize {
        fn ops(list: &[RequestOp]) -> usize {
            list.iter()
                .map(|op| match op {
                    RequestOp::Put(p) => p.key.len() + p.value.len(),
                    RequestOp::Txn(t) => ops(&t.success) + ops(&t.failure),
                    RequestOp::Range(_) | RequestOp::DeleteRange(_) => 0,
                })
                .sum()
        }
        match self {
            Op::Put(p) => p.key.len() + p.value.len(),
            Op::Txn(t) => ops(&t.success) + ops(&t.failure),
            Op::Enqueue(e) => e.name.len() + e.value.len() + 17,
            _ => 0,
        }
    }

    /// Whether the op can add data (etcd's "capped" applier refuses these under NOSPACE):
    /// a put, a txn that may put, a lease grant, a lock or campaign.
    pub fn adds_data(&self) -> bool {
        fn puts(ops: &[RequestOp]) -> bool {
            ops.iter().any(|op| match op {
                RequestOp::Put(_) => true,
                RequestOp::Txn(t) => puts(&t.success) || puts(&t.failure),
                RequestOp::Range(_) | RequestOp::DeleteRange(_) => false,
            })
        }
        match self {
            Op::Put(_) | Op::LeaseGrant { .. } | Op::Enqueue(_) => true,
            Op::Txn(t) => puts(&t.success) || puts(&t.failure),
            Op::DeleteRange(_)
            | Op::LeaseRevoke { .. }
            | Op::LeaseKeepAlive { .. }
            | Op::Compact { .. } => false,
        }
    }
}

/// A session-numbered op: the seven exactly-once rules decide whether it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tracked {
    pub client_id: u64,
    pub secret: Secret,
    /// This request's number; a retry re-sends the same one.
    pub seq: u64,
    /// The smallest seq the client has no response for: everything below may be forgotten.
    pub first_incomplete: u64,
    /// `op.fingerprint()`, computed once by whoever builds the command (the server, as it
    /// receives the request) and carried in the log, so that applying it compares and
    /// saves one word instead of hashing the op's keys and values on the one thread that
    /// applies every entry. Use [`Tracked::new`], which computes it.
    pub fingerprint: u64,
    pub op: Op,
}

impl Tracked {
    /// A tracked op with its fingerprint.
    pub fn new(client_id: u64, secret: Secret, seq: u64, first_incomplete: u64, op: Op) -> Tracked {
        Tracked {
            client_id,
            secret,
            seq,
            first_incomplete,
            fingerprint: op.fingerprint(),
            op,
        }
    }
}

/// Replicated cluster settings (not per-node constants: every replica must expire the same
/// sessions at the same log index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    /// A session idle for longer than this (in cluster-time milliseconds) is removed.
    pub session_ttl_ms: u64,
    /// How many sequence numbers past `acked_below` a client may have outstanding.
    pub window: u64,
    /// Lease grants with a smaller TTL (seconds) are raised to it, as etcd does.
    pub min_lease_ttl_secs: i64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            session_ttl_ms: 60_000,
            window: 128,
            min_lease_ttl_secs: 2,
        }
    }
}

/// The largest lease TTL etcd accepts, in seconds.
pub const MAX_LEASE_TTL_SECS: i64 = 9_000_000_000;

/// A mutating operation (what etcd would put through raft).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    Put(PutRequest),
    DeleteRange(DeleteRangeRequest),
    Txn(TxnRequest),
    LeaseGrant {
        id: i64,
        ttl: i64,
    },
    LeaseRevoke {
        id: i64,
    },
    LeaseKeepAlive {
        id: i64,
    },
    /// etcd's Compact: drop history before `revision` (see `history.rs`).
    Compact {
        revision: i64,
    },
    /// The write half of etcd's Lock and Campaign (see [`EnqueueRequest`]).
    Enqueue(EnqueueRequest),
}

impl Op {
    /// A put with no options.
    pub fn put(key: impl Into<Bytes>, value: impl Into<Bytes>) -> Op {
        Op::Put(PutRequest {
            key: key.into(),
            value: value.into(),
            ..PutRequest::default()
        })
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutRequest {
    pub key: Bytes,
    pub value: Bytes,
    /// Attach the key to this lease (0: none).
    pub lease: i64,
    pub prev_kv: bool,
    /// Keep the current value; the key must exist.
    pub ignore_value: bool,
    /// Keep the current lease; `lease` must then be 0.
    pub ignore_lease: bool,
}

/// The write half of etcd's Lock and Campaign: join the waiters under `name` with the key
/// [`queue_key`]`(name, lease)`, attached to `lease`. The waiters own `name` in
/// create-revision order; the server's half waits until no key under `name/` was created
/// before this one. A key of this lease already there is reused (it keeps its create revision,
/// so re-locking with the same lease is not a new place in the queue), as etcd's
/// `concurrency.Mutex` and `Election` do.
///
/// Lease 0 grants a lease of [`CONCURRENCY_TTL_SECS`] in the same command: etcd's server
/// opens a session of its own for such a call, which is two writes; here it is one, so a
/// retry through an oncekv session cannot leave a second lease and a second waiter behind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnqueueRequest {
    pub name: Bytes,
    pub lease: i64,
    /// The key's value when it is created (Lock: empty; Campaign: the proposal).
    pub value: Bytes,
    /// Campaign: an existing key with another value gets `value` (etcd's Campaign proclaims
    /// it). Lock: an existing key is left as it is.
    pub proclaim: bool,
}

/// The TTL of a lease granted for a Lock or Campaign that named none: etcd's default
/// session TTL.
pub const CONCURRENCY_TTL_SECS: i64 = 60;

/// The queue key of `lease` under `name`: `name/<lease in lower-case hex>`, the format
/// etcd's `concurrency` package uses (Go's `%x`, so a negative id keeps its sign).
pub fn queue_key(name: &[u8], lease: i64) -> Bytes {
    let hex = if lease < 0 {
        format!("-{:x}", lease.unsigned_abs())
    } else {
        format!("{lease:x}")
    };
    let mut key = Vec::with_capacity(name.len() + 1 + hex.len());
    key.extend_from_slice(name);
    key.push(b'/');
    key.extend_from_slice(hex.as_bytes());
    Bytes::from(key)
}

/// What [`Op::Enqueue`] did: the caller's key, its lease (granted here if the request named
/// none) and its create revision, which orders the waiters and is the holder's fencing token.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enqueued {
    pub key: Bytes,
    pub lease: i64,
    pub create_revision: i64,
}

/// etcd's key range: `range_end` empty means the single `key`; `"\0"` means every key
/// `>= key`; otherwise `[key, range_end)`. A prefix is `[p, prefix_end(p))`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRange {
    pub key: Bytes,
    pub range_end: Bytes,
}

impl KeyRange {
    pub fn single(key: impl Into<Bytes>) -> KeyRange {
        KeyRange {
            key: key.into(),
            range_end: Bytes::new(),
        }
    }

    pub fn prefix(prefix: impl Into<Bytes>) -> KeyRange {
        let key: Bytes = prefix.into();
        let range_end = prefix_end(&key);
        KeyRange { key, range_end }
    }
}

/// Whether `key` lies in `range`.
pub fn in_range(range: &KeyRange, key: &[u8]) -> bool {
    let after_start = key >= &range.key[..];
    let before_end = match range.range_end.as_ref() {
        b"" => key == &range.key[..],
        b"\0" => true,
        end => key < end,
    };
    after_start && before_end
}

/// The `range_end` that selects every key starting with `prefix` (etcd's `GetPrefixRangeEnd`):
/// the prefix with its last non-0xff byte incremented, or `"\0"` (to the end) if none.
pub fn prefix_end(prefix: &[u8]) -> Bytes {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end.into();
        }
    }
    Bytes::from_static(b"\0")
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SortOrder {
    #[default]
    None,
    Ascend,
    Descend,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SortTarget {
    #[default]
    Key,
    Version,
    Create,
    Mod,
    Value,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeRequest {
    pub range: KeyRange,
    /// At most this many kvs (0: no limit); `more` tells if some were left out.
    pub limit: i64,
    /// Read at this revision (0: current). Revisions below the compacted one answer
    /// `Compacted`; newer than the store's, `FutureRevision`.
    pub revision: i64,
    pub sort_order: SortOrder,
    pub sort_target: SortTarget,
    pub keys_only: bool,
    pub count_only: bool,
    pub min_mod_revision: i64,
    pub max_mod_revision: i64,
    pub min_create_revision: i64,
    pub max_create_revision: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteRangeRequest {
    pub range: KeyRange,
    pub prev_kv: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnRequest {
    pub compare: Vec<Compare>,
    pub success: Vec<RequestOp>,
    pub failure: Vec<RequestOp>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RequestOp {
    Range(RangeRequest),
    Put(PutRequest),
    DeleteRange(DeleteRangeRequest),
    Txn(TxnRequest),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareResult {
    Equal,
    Greater,
    Less,
    NotEqual,
}

/// What a compare looks at, with the operand (etcd's `target_union`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareTarget {
    Version(i64),
    CreateRevision(i64),
    ModRevision(i64),
    Value(Bytes),
    Lease(i64),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compare {
    pub result: CompareResult,
    pub target: CompareTarget,
    pub range: KeyRange,
}

/// etcd's `mvccpb.KeyValue`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyValue {
    pub key: Bytes,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    pub value: Bytes,
    pub lease: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeResponse {
    pub kvs: Vec<KeyValue>,
    pub more: bool,
    pub count: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutResponse {
    /// Boxed: most puts do not ask for it, and every reply moves through the apply path
    /// and the saved-response table, which is cheaper when `OpResponse` is small. (Encoded
    /// exactly as an unboxed `Option<KeyValue>`.)
    pub prev_kv: Option<Box<KeyValue>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteRangeResponse {
    pub deleted: i64,
    pub prev_kvs: Vec<KeyValue>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnResponse {
    pub succeeded: bool,
    pub responses: Vec<ResponseOp>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResponseOp {
    Range(RangeResponse),
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
}

/// The successful result of an [`Op`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpResponse {
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
    LeaseGrant { id: i64, ttl: i64 },
    LeaseRevoke,
    LeaseKeepAlive { id: i64, ttl: i64 },
    Compact,
    Enqueue(Enqueued),
}

/// An op that was applied (or refused by the store's rules), with the store revision right
/// after it. This is what a session saves: a retried failing op fails the same way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpReply {
    pub revision: i64,
    pub result: Result<OpResponse, OpError>,
}

/// etcd's answers for a request the store refuses. Messages match etcd's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum OpError {
    #[error("etcdserver: requested lease not found")]
    LeaseNotFound,
    #[error("etcdserver: lease already exists")]
    LeaseAlreadyExists,
    #[error("etcdserver: too large lease TTL")]
    LeaseTtlTooLarge,
    #[error("etcdserver: key not found")]
    KeyNotFound,
    #[error("etcdserver: lease is provided")]
    LeaseProvided,
    #[error("etcdserver: value is provided")]
    ValueProvided,
    #[error("etcdserver: mvcc: required revision has been compacted")]
    Compacted,
    #[error("etcdserver: mvcc: required revision is a future revision")]
    FutureRevision,
    #[error("etcdserver: duplicate key given in txn request")]
    DuplicateKey,
    #[error("etcdserver: too many operations in txn request")]
    TooManyOps,
    #[error("etcdserver: key is not provided")]
    EmptyKey,
    #[error("etcdserver: mvcc: database space exceeded")]
    NoSpace,
    #[error("etcdserver: corrupt cluster")]
    Corrupt,
    /// The auth store changed between a write's permission check and its apply
    /// ([`Command::Authorized`]); etcd's clients take a new token and send it again.
    #[error("etcdserver: revision of auth store is old")]
    AuthOldRevision,
}

impl OpError {
    /// Every error, in declaration order (`ALL[e as usize] == e`): a saved response packs
    /// an error into a byte and reads it back from here (`session/saved.rs`).
    pub const ALL: [OpError; 14] = [
        OpError::LeaseNotFound,
        OpError::LeaseAlreadyExists,
        OpError::LeaseTtlTooLarge,
        OpError::KeyNotFound,
        OpError::LeaseProvided,
        OpError::ValueProvided,
        OpError::Compacted,
        OpError::FutureRevision,
        OpError::DuplicateKey,
        OpError::TooManyOps,
        OpError::EmptyKey,
        OpError::NoSpace,
        OpError::Corrupt,
        OpError::AuthOldRevision,
    ];
}

/// The answer to one [`Command`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// `RegisterClient` opened this session.
    Registered {
        client_id: u64,
        secret: Secret,
        settings: Settings,
    },
    /// `KeepAlive` / `CloseSession`.
    Session(Result<(), SessionError>),
    /// `Tick` / `Configure`, or a non-application entry.
    Done,
    /// A tracked or untracked op. `Err` only from the session rules (the op did not run,
    /// or its saved response was lost to expiry/acks).
    Op(Result<OpReply, SessionError>),
    /// A malformed command (e.g. two registrations in one entry); nothing changed.
    Rejected,
    /// [`Command::Auth`].
    Auth(Result<(), crate::auth::AuthError>),
}

/// A session's 128-bit secret. Drawn at random by the leader and stored in the log, so every
/// replica holds the same one. `Debug` does not print it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Secret(pub [u8; 16]);

impl Secret {
    pub fn from_u128(v: u128) -> Secret {
        Secret(v.to_be_bytes())
    }

    /// Lower-case hex, as carried in the `oncekv-session-secret` request metadata.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses 32 hex digits; `None` for anything else.
    pub fn from_hex(s: &str) -> Option<Secret> {
        if s.len() != 32 || !s.is_ascii() {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Secret(out))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Why a session command was not executed. These are *answers*, not transport failures: a
/// client must not blindly retry them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum SessionError {
    #[error(
        "oncekv: session {client_id} expired or never existed; the request's outcome is unknown if it was sent before"
    )]
    SessionExpired { client_id: u64 },
    #[error("oncekv: wrong secret for session {client_id}")]
    PermissionDenied { client_id: u64 },
    #[error("oncekv: seq {seq} is stale: the client acknowledged everything below {acked_below}")]
    Stale { seq: u64, acked_below: u64 },
    #[error(
        "oncekv: seq {seq} is past the window: at most seq {limit} is accepted until earlier responses are acknowledged"
    )]
    WindowExceeded { seq: u64, limit: u64 },
    /// A response is saved for `seq`, but for another request (its fingerprint differs):
    /// a client bug. Answering the saved response would pass one request's outcome off as
    /// another's, so the request is refused and nothing runs.
    #[error("oncekv: seq {seq} was already used for a different request")]
    SeqReused { seq: u64 },
}

impl SessionError {
    /// Every [`kind`](Self::kind), in the order of `Stats::rejected_by_kind`.
    pub const KINDS: [&'static str; 5] = [
        "session_expired",
        "permission_denied",
        "stale",
        "window_exceeded",
        "seq_reused",
    ];

    /// A short name for metrics labels: one of [`KINDS`](Self::KINDS).
    pub fn kind(&self) -> &'static str {
        Self::KINDS[self.kind_index()]
    }

    pub(crate) fn kind_index(&self) -> usize {
        match self {
            SessionError::SessionExpired { .. } => 0,
            SessionError::PermissionDenied { .. } => 1,
            SessionError::Stale { .. } => 2,
            SessionError::WindowExceeded { .. } => 3,
            SessionError::SeqReused { .. } => 4,
        }
    }
}
