//! The etcd v3 gRPC API (KV, Watch, Lease, Cluster, Maintenance, and the concurrency
//! services Lock and Election) and oncekv's Session service.
//!
//! Handlers translate requests to core ops, propose or read through
//! [`NodeCore`](crate::request_path::NodeCore), and map
//! every refusal to the gRPC status etcd would send, with etcd's message (see
//! [`crate::error`]).

mod auth;
mod cluster;
pub mod convert;
mod election;
mod kv;
mod lease;
mod lock;
mod maintenance;
mod queue;
mod session;
mod watch;

pub use auth::AuthService;
pub use cluster::ClusterService;
pub use election::ElectionService;
pub use kv::KvService;
pub use lease::LeaseService;
pub use lock::LockService;
pub use maintenance::{ETCD_API_VERSION, MaintenanceService, alarm_name, hash_kv};
pub use oncekv_proto::SessionMeta;
pub use session::SessionService;
pub use watch::{WatchService, serve_stream as watch_stream};
