//! oncekv server: openraft consensus over a durable log, the core state machine, and
//! etcd-compatible gRPC services.
//!
//! - [`node`]: starting a member ([`node::Node::start`]), its background tasks, shutdown;
//!   [`config`]: what it starts with.
//! - [`request_path`]: what a request goes through (execute, propose, forward, read
//!   index), owned by [`request_path::NodeCore`], which every handler shares;
//!   [`error`]: how a request fails, and the gRPC status each failure becomes.
//! - [`proposer`]: the write hot path (batching commands into entries, cluster time);
//!   [`forwarder`]: a follower's writes travel to the leader in batches.
//! - [`log_store`] and [`sm_store`]: the durable raft log and the state machine with its
//!   snapshot file; [`backup`]: point-in-time copies and restoring a new cluster from one.
//! - [`network`] and [`services`]: raft between peers, and the gRPC servers;
//!   [`peer_gate`]: who may talk to the peer port, decided before a body is read;
//!   [`http`]: `/metrics`, `/health` and the other HTTP routes beside gRPC on the client
//!   port, with [`metrics`], the member's Prometheus registry; [`gateway`]: etcd's JSON
//!   gateway on the same port.
//! - [`membership`]: adding, removing and promoting members; a member's identity.
//! - [`fanout`]: questions asked of every member through the waiting list's quorum mode
//!   (the corruption check, cluster health).
//! - [`compactor`]: etcd's auto-compaction, decided by the leader through the log.
//! - [`etcd`]: the etcd v3 API and oncekv's Session service.
//! - `oncekv_proto::authority`: serves clients (etcdctl 3.4's `--cluster`) that put a URL scheme in
//!   HTTP/2's `:authority`, which h2 refuses.

pub mod auth;
pub mod backup;
pub mod compactor;
pub mod config;
pub mod conn_guard;
pub mod disk;
pub mod error;
pub mod etcd;
pub mod fanout;
pub mod forwarder;
pub mod gateway;
pub mod http;
pub mod jwt;
pub mod log_store;
pub mod membership;
pub mod metrics;
pub mod network;
pub mod node;
pub mod pb;
pub mod peer_gate;
mod peer_listener;
pub mod peer_wire;
pub mod proposer;
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
