//! The I/O-free heart of oncekv: every client command takes effect exactly once.
//!
//! This crate reads no clock, opens no socket or file and spawns no task. The server feeds
//! it committed log entries; it answers with responses. That is all exactly-once needs:
//!
//! - [`StateMachine`] applies [`LogPayload`]s (etcd's KV and lease semantics) and runs the
//!   seven exactly-once rules of `shared/DESIGN.md` section 2 through its [`SessionTable`].
//! - [`RequestTracker`] numbers a client's requests (the client half of the protocol).
//! - [`waiting_list::WaitingList`] parks requests until their entry is applied.
//!
//! # Layers
//!
//! A module imports only modules named before it here: `auth`, `lease`, `encoding`,
//! `tracker` and `waiting_list` import none; then `command` (the log's and the API's
//! types); `fingerprint`, `session` and `value` (what the store keeps for a key); `history`
//! (older revisions); `kv` (the current keys); `txn`; `state_machine` (with `exec`, what an
//! op does to the keys and leases); and `snapshot` on top. `scripts/check-import-circles`
//! fails on a circle.
//!
//! # A duplicate is absorbed
//!
//! A client registers, puts once, loses the reply and retries with the same seq: the
//! replica answers the saved response and the key's version stays 1.
//!
//! ```
//! use oncekv_core::{Command, LogPayload, Op, Response, RequestTracker, Secret, StateMachine, Tracked};
//!
//! let mut sm = StateMachine::default();
//! let secret = Secret::from_u128(0x5eed);
//! // The leader stamps every entry with cluster time (ms); the log index names the client.
//! // The client's random nonce lets a retried registration get this same session back.
//! let nonce = 0x6e6f_6e63_65u128;
//! let registered = sm.apply(1, &LogPayload {
//!     cluster_time: 1_000,
//!     commands: vec![Command::RegisterClient { secret, nonce }],
//! });
//! let Response::Registered { client_id, .. } = registered[0] else { unreachable!() };
//!
//! let mut tracker = RequestTracker::new();
//! let put = Command::Tracked(Tracked::new(
//!     client_id,
//!     secret,
//!     tracker.next_seq(),
//!     tracker.first_incomplete(),
//!     Op::put("k", "v"),
//! ));
//! let first = sm.apply(2, &LogPayload { cluster_time: 1_001, commands: vec![put.clone()] });
//! // The reply was lost; the client retries the same (client_id, seq).
//! let retry = sm.apply(3, &LogPayload { cluster_time: 1_002, commands: vec![put] });
//!
//! assert_eq!(first, retry);
//! assert_eq!(sm.kv().get(b"k").map(|v| v.version), Some(1));
//! assert_eq!(sm.stats().duplicates, 1);
//! ```

pub mod auth;
pub mod broken;
pub mod command;
pub mod encoding;
pub mod fingerprint;
pub mod history;
pub mod kv;
pub mod lease;
pub mod session;
pub mod snapshot;
pub mod state_machine;
pub mod tracker;
pub mod txn;
mod value;
pub mod waiting_list;

pub use auth::{Access, AuthCommand, AuthError, AuthStore, PermKind, Permission};
pub use command::{
    AlarmKind, CONCURRENCY_TTL_SECS, Command, Compare, CompareResult, CompareTarget,
    DeleteRangeRequest, DeleteRangeResponse, EnqueueRequest, Enqueued, KeyRange, KeyValue,
    LogPayload, Op, OpError, OpReply, OpResponse, PutRequest, PutResponse, RangeRequest,
    RangeResponse, RequestOp, Response, ResponseOp, Settings, SortOrder, SortTarget, Tracked,
    TxnRequest, TxnResponse, prefix_end, queue_key,
};
pub use history::{Event, EventBatch, EventKind, ReadLimit};
pub use session::{SavedReply, Secret, SessionError, SessionTable};
pub use snapshot::{ImportedState, SnapshotError, SnapshotView};
#[cfg(feature = "sim")]
pub use state_machine::SimProbe;
pub use state_machine::{Expired, StateMachine, Stats};
pub use tracker::RequestTracker;
pub use txn::validate_txn;
