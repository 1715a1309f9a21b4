//! oncekv server: openraft consensus over a durable log, the core state machine, and
//! etcd-compatible gRPC services.

pub mod log_store;
pub mod pb;
