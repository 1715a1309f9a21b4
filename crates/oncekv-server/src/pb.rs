//! Generated protobuf and gRPC code (prost messages, tonic clients and servers).
//!
//! - [`etcdserverpb`] and [`mvccpb`]: the etcd v3 API subset oncekv serves (KV, Lease,
//!   Cluster, Maintenance), wire-compatible with etcd v3.4.
//! - [`oncekv`]: oncekv's own `Session` service (exactly-once client sessions) and the
//!   `Raft` peer service (opaque postcard-encoded openraft payloads).
//!
//! All `bytes` fields are [`bytes::Bytes`]. Service traits have default methods that
//! answer `Unimplemented`, so a server overrides only what it serves; streaming methods
//! return `BoxStream<T>`.
//!
//! etcd's field names are kept, so prost's snake-casing gives names such as `ttl`, `id`,
//! `granted_ttl`, `peer_ur_ls`, `client_ur_ls`, `db_size`, `member_id`.

/// etcd v3 key-value types (`mvccpb` package).
#[allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}

/// etcd v3 gRPC services and messages (`etcdserverpb` package).
#[allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}

/// oncekv's own gRPC services: client sessions and raft peer traffic.
#[allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
pub mod oncekv {
    tonic::include_proto!("oncekv");
}
