//! oncekv server: openraft consensus over a durable log, the core state machine, and
//! etcd-compatible gRPC services.
//!
//! # Layers
//!
//! Modules depend only on modules of their own layer or of the layers below it
//! (`scripts/check-import-circles` fails CI on any import circle). From the bottom:
//!
//! 1. **Foundations**, knowing nothing of raft or requests: [`types`] (ids, members,
//!    openraft's type configuration), [`runtime`], [`disk`], [`tls`], [`jwt`],
//!    `conn_guard`, [`pb`], `compat` (etcd's names for versions and alarms) and
//!    `metrics` (the Prometheus registry, filled from what the node hands it).
//! 2. **Storage and configuration**: [`log_store`] (the durable raft log), [`error`] (how
//!    a request fails), [`sm_store`] (the state machine and its snapshot file),
//!    [`config`] (what a member starts with, and the size limits derived from it),
//!    `identity` (who a member is), `member_change` (the vocabulary of membership
//!    changes), [`backup`] (point-in-time copies, etcd's database file).
//! 3. **Between members**: [`transport`], [`peer_wire`] (framed raft and forward calls,
//!    sending side) and [`network`] (openraft's network over them).
//! 4. **The node**: `proposer` (the write hot path: commands batched into entries),
//!    `forwarder` (a follower's requests to the leader, in batches) and
//!    [`request_path::NodeCore`], which owns what a request goes through (execute,
//!    propose, read index). On top of `NodeCore`, each its own owner: `auth`,
//!    [`membership`], [`fanout`] (questions asked of every member: corruption check,
//!    cluster health) and [`compactor`].
//! 5. **Surfaces**: [`etcd`] (the etcd v3 services and oncekv's Session service),
//!    `gateway` (etcd's JSON gateway), `http` (`/metrics`, `/health`),
//!    `peer_gate` and `peer_listener` (the receiving side of the peer port), and
//!    [`services`], which builds the gRPC servers; `node` starts a member with all of
//!    it ([`Node::start`]).
//!
//! # A put, from the wire down
//!
//! `etcd::kv` receives `Put`, checks the caller's rights (`auth`) and hands the command
//! to `NodeCore::execute`. A tracked command (one with session metadata) that is already
//! in flight here joins it; otherwise, on the leader, the `proposer` batches it with
//! others into one raft entry, and on a follower the `forwarder` sends it to the
//! leader in a batch over [`peer_wire`]. openraft appends the entry to [`log_store`],
//! replicates it through [`network`], and once committed applies it in [`sm_store`],
//! where the core state machine answers a duplicate with its saved reply instead of
//! running it twice. The reply travels back to the waiting handler.
//!
//! # A linearizable read
//!
//! `etcd::kv` receives `Range`, checks the caller's rights on this member's state
//! (`auth`) and asks `NodeCore::range`, which first waits for a read index: the leader
//! confirms its leadership with a round of heartbeats (shared by the reads that arrive
//! meanwhile, or skipped under `--leader-lease-reads`), a follower asks the leader for
//! it through the `forwarder`. Once this member has applied up to that index, the
//! range is read from its own state machine.

mod auth;
pub mod backup;
pub mod compactor;
mod compat;
pub mod config;
mod conn_guard;
pub mod disk;
pub mod error;
pub mod etcd;
pub mod fanout;
mod forwarder;
mod gateway;
mod http;
mod identity;
pub mod jwt;
pub mod log_store;
mod member_change;
pub mod membership;
mod metrics;
pub mod network;
mod node;
pub mod pb;
mod peer_gate;
mod peer_listener;
pub mod peer_wire;
mod proposer;
mod read_batch;
mod read_lease;
pub mod request_path;
pub mod runtime;
pub mod services;
pub mod sm_store;
pub mod tls;
pub mod transport;
pub mod types;

pub use config::NodeConfig;
pub use node::{Node, Stopped};
pub use types::Member;
