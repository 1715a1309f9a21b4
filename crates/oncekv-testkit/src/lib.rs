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

/// A loopback port free when asked: for processes that must be told their port on the
/// command line. Tests that can bind port 0 themselves should.
///
/// The port is drawn below the kernel's ephemeral range, which is where both `bind(0)`
/// and every outgoing connection take their ports: a port from that range, found free,
/// can be taken by some client's connection before the member told to listen on it
/// starts (a member then fails to start, and its test with it). Below the range only an
/// explicit bind takes a port. No port is handed out twice by one process.
pub fn free_port() -> std::io::Result<u16> {
    use rand::Rng;
    use std::sync::Mutex;
    static GIVEN: Mutex<std::collections::BTreeSet<u16>> =
        Mutex::new(std::collections::BTreeSet::new());
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u16, ephemeral_low.max(10_001));
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = rand::thread_rng();
    for _ in 0..2_000 {
        let port = rng.gen_range(low..high);
        if given.contains(&port) {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.insert(port);
            return Ok(port);
        }
    }
    // Everything below the range is taken: fall back on the kernel's choice.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    given.insert(port);
    Ok(port)
}
