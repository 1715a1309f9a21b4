//! The generated protobuf and gRPC code, from [`oncekv_proto`] (kept under this name so
//! the server's modules read `crate::pb::etcdserverpb`).

pub use oncekv_proto::{authpb, etcdserverpb, mvccpb, oncekv, v3electionpb, v3lockpb};
