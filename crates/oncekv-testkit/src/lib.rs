//! Test tooling beside the product: what oncekv's integration tests, the client's tests
//! and `oncekv demo` use to put faults between clients and a real cluster.
//!
//! - [`fault_proxy`]: a TCP proxy that loses replies, swallows them, delays, resets and
//!   blackholes connections on command.
//! - [`local_cluster`]: a whole cluster of real members on loopback sockets in one
//!   process, stoppable and restartable from its data directories.

pub mod fault_proxy;
pub mod local_cluster;
