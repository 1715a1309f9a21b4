//! Test tooling beside the product: what oncekv's integration tests, the client's tests
//! and `oncekv demo` use to put faults between clients and a real cluster.
//!
//! - [`fault_proxy`]: a TCP proxy that loses replies, swallows them, delays, resets and
//!   blackholes connections on command.
//! - [`local_cluster`]: a whole cluster of real members on loopback sockets in one
//!   process, stoppable and restartable from its data directories.
//! - [`auth`]: users and roles for tests that turn etcd auth on.

pub mod auth;
pub mod fault_proxy;
pub mod local_cluster;

/// A loopback port free when asked (bound to port 0 and released): for processes that
/// must be told their port on the command line. Another process can take it before it is
/// used; tests that can bind port 0 themselves should.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
