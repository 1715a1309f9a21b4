//! The oncekv client: etcd's KV and lease API, where every write takes effect exactly once.
//!
//! ```no_run
//! use oncekv_client::{Client, ClientConfig, Compare, CompareOp, GetOptions, PutOptions, TxnOp};
//!
//! # async fn demo() -> Result<(), oncekv_client::Error> {
//! let client = Client::connect(["127.0.0.1:2379", "127.0.0.1:22379"], ClientConfig::default())?;
//!
//! // However often this put is retried (lost replies, leader crash), it applies once.
//! client.put("greeting", "hello").await?;
//! if let Some(kv) = client.get("greeting").await? {
//!     assert_eq!((&kv.value[..], kv.version), (&b"hello"[..], 1));
//! }
//!
//! // A lease with a key on it, and a guarded update.
//! let lease = client.lease_grant(10, 0).await?;
//! client.put_with("session/worker-1", "up", PutOptions::new().with_lease(lease.id)).await?;
//! let txn = client
//!     .txn(
//!         vec![Compare::value("greeting", CompareOp::Equal, "hello")],
//!         vec![TxnOp::put("greeting", "hi", PutOptions::new())],
//!         vec![],
//!     )
//!     .await?;
//! assert!(txn.succeeded);
//! let sessions = client.range("session/", GetOptions::new().with_prefix()).await?;
//! println!("{} live workers", sessions.count);
//! # Ok(())
//! # }
//! ```
//!
//! # How a call runs
//!
//! - **Endpoints and the leader.** [`Client::connect`] takes a list of endpoints
//!   (`http://host:port` or `host:port`) and connects to nothing yet; channels open on first
//!   use. Before its first call the client asks every member for its status and talks to
//!   the leader. On a retryable failure (unavailable, connection lost, not leader / no
//!   leader, timeout, cancelled) it moves to the next endpoint, backs off (capped
//!   exponential, jittered), looks for the leader again and retries, until the retry
//!   budget of [`ClientConfig`] (attempts and total time) is spent.
//! - **Attempts are short.** The first attempt of a call waits
//!   [`ClientConfig::attempt_timeout`] (1 s), each further one twice as long as the one
//!   before, up to [`ClientConfig::request_timeout`]. An attempt that gets no answer in
//!   time leaves its connection behind (it may be hung: open, but silent) and the retry
//!   goes out on a fresh one; HTTP/2 keep-alive pings declare a silent connection dead
//!   within about two [`ClientConfig::keep_alive_interval`]s. So a lost reply costs one
//!   short attempt, never the whole budget.
//! - **Hedged writes** ([`ClientConfig::hedge_writes`], off by default): a tracked write
//!   that has not answered after the recent p95 write latency is sent, with the same seq,
//!   to a second member as well; the first answer wins. The cluster applies it once.
//! - **Sessions.** The first write registers a session (`Session.Register`: a client id, a
//!   128-bit secret, a TTL and a window). Every attempt of one registration carries the
//!   same random nonce, so a retry after a lost reply gets the same session back. A background task refreshes it every third of
//!   the TTL and stops when the last clone of the client is dropped.
//! - **Exactly once.** Every write (put, delete, txn, lease grant, revoke and keep-alive)
//!   takes the next sequence number from the session's [`oncekv_core::RequestTracker`]
//!   and sends it with the client id, secret and the oldest unanswered sequence number as
//!   request metadata. A retry re-sends the *same* sequence number, so the cluster runs the
//!   write at most once and answers every retry with the saved result: N puts leave the
//!   key at `version == N` whatever fails in between.
//! - **Expired sessions.** If the session expired before the write could have reached any
//!   server, the client registers a new session and sends the write under it. If the write
//!   had been sent before, the call fails with [`Error::OutcomeUnknown`]: it may or may
//!   not have been applied. Either way the next call uses a fresh session.
//! - **Refusals at the door.** An auth refusal (a stale token the client cannot renew,
//!   a permission the user lost) or a full window is given before the cluster looks at
//!   the seq. After an attempt that may have run, such a refusal also ends the call in
//!   [`Error::OutcomeUnknown`], never in the refusal itself.
//! - **Reads** (get, range, lease time-to-live and leases, member list) are retried the
//!   same way without a session; they are linearizable unless asked to be serializable.
//! - **Watches** ([`Client::watch`]) run on a stream of their own to one member (any
//!   member: each serves watches from its applied history). The client remembers the first
//!   revision it has not delivered; if the stream fails (the member stops, the connection
//!   resets or goes silent), it creates the watch again on another member from exactly
//!   that revision, so every revision arrives once, in order. A watch that needs history
//!   compaction removed ends with [`Error::Compacted`]. [`Client::compact`] is a tracked
//!   write like the others.
//!
//! [`ClientConfig::untracked`] makes an etcd-style client with the same API and retries but
//! no session: a retried write may then apply twice (for comparison only).
//!
//! # Errors
//!
//! [`Error`] keeps four kinds apart: retryable transport trouble (what remained when the
//! budget ran out), the cluster's answers (lease not found, invalid argument, stale, a seq
//! reused for a different request, ...), server bugs ([`Error::Internal`], never retried),
//! and [`Error::OutcomeUnknown`]. The server tags each of its errors with a detail from
//! [`oncekv_proto::ErrorDetail`] whose class decides which kind it is.
//!
//! # Types
//!
//! Calls return the plain structs of [`responses`]; key-values are
//! [`oncekv_core::KeyValue`] with [`bytes::Bytes`] keys and values. Keys and values are
//! passed as anything that converts into `Vec<u8>` (`&str`, `String`, `&[u8]`, `Bytes`).

mod client;
mod cluster;
mod config;
pub mod election;
mod error;
mod hedge;
mod kv;
mod lease;
pub mod lock;
mod maintenance;
pub mod options;
mod relay;
pub mod responses;
mod retry;
mod session;
mod transport;
mod watch;

pub use client::{Client, ClientStats};
pub use config::{ClientConfig, Credentials};
pub use election::{Election, Leadership, Observer};
pub use error::Error;
pub use lock::{LockGuard, LockOptions};
pub use maintenance::{Alarm, HashKv};
pub use oncekv_core::KeyValue;
pub use oncekv_proto::tls::ClientTlsOptions;
pub use options::{
    Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, SortOrder, SortTarget, TxnOp,
    WatchOptions,
};
pub use relay::{CallKind, RelayError};
pub use responses::{
    CompactResponse, DeleteResponse, Event, EventType, Header, LeaseGrantResponse,
    LeaseKeepAliveResponse, LeaseRevokeResponse, LeaseTimeToLiveResponse, Member,
    MemberListResponse, PutResponse, RangeResponse, Status, TxnOpResponse, TxnResponse,
    WatchResponse,
};
pub use transport::Channel;
pub use watch::Watcher;
