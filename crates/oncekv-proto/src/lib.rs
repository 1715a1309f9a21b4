//! oncekv's wire, shared by client and server so that neither depends on the other.
//!
//! - [`etcdserverpb`] and [`mvccpb`]: the etcd v3 API oncekv serves, wire-compatible with
//!   etcd v3.4, with etcd's concurrency services [`v3lockpb`] and [`v3electionpb`]; [`oncekv`]: oncekv's own `Session` service and the `Raft` peer service.
//!   Client stubs always; server stubs with the `server` feature. All `bytes` fields are
//!   [`bytes::Bytes`]. Server traits have default methods that answer `Unimplemented`,
//!   so a server overrides only what it serves.
//! - [`codec`]: prost's codec, with undecodable requests answered InvalidArgument.
//! - [`metadata`]: the four request metadata keys that make a write exactly-once.
//! - [`detail`]: the machine-readable error details and the class of each (retry, answer,
//!   bug).
//! - [`net`] and [`rng`]: the connection seam and the random number generator, which a
//!   deterministic simulation replaces for client and server alike.
//!
//! etcd's field names are kept, so prost's snake-casing gives names such as `ttl`, `id`,
//! `granted_ttl`, `peer_ur_ls`, `client_ur_ls`, `db_size`, `member_id`.

pub mod authority;
pub mod codec;
pub mod detail;
pub mod metadata;
pub mod net;
pub mod rng;
pub mod tls;

pub use detail::{ERROR_DETAIL_KEY, ErrorClass, ErrorDetail};
pub use metadata::SessionMeta;

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

/// A key-value from the wire as the core keeps it (the same six fields).
impl From<mvccpb::KeyValue> for oncekv_core::KeyValue {
    fn from(kv: mvccpb::KeyValue) -> oncekv_core::KeyValue {
        oncekv_core::KeyValue {
            key: kv.key,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
            value: kv.value,
            lease: kv.lease,
        }
    }
}

/// A key-value as the core keeps it, on the wire (the same six fields).
impl From<oncekv_core::KeyValue> for mvccpb::KeyValue {
    fn from(kv: oncekv_core::KeyValue) -> mvccpb::KeyValue {
        mvccpb::KeyValue {
            key: kv.key,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
            value: kv.value,
            lease: kv.lease,
        }
    }
}

/// etcd v3 auth types (`authpb` package).
#[allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
pub mod authpb {
    tonic::include_proto!("authpb");
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

/// etcd's Lock service (`v3lockpb` package).
#[allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
pub mod v3lockpb {
    tonic::include_proto!("v3lockpb");
}

/// etcd's Election service (`v3electionpb` package).
#[allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
pub mod v3electionpb {
    tonic::include_proto!("v3electionpb");
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
