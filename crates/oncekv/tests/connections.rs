//! Connections are bounded: past `--max-connections` a new connection is closed at once,
//! and a connection that sends nothing is closed after 10 s, freeing its slot.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{etcdctl_put, serve_single, wait_serving};

/// Whether the server closed `conn` (EOF or reset) within `within`.
fn closed_within(conn: &mut TcpStream, within: Duration) -> bool {
    conn.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 64];
    match conn.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

#[test]
fn connections_past_the_limit_and_silent_ones_are_closed() {
    let dir = tempfile::tempdir().unwrap();
    let (_member, ports) = serve_single(dir.path(), &["--max-connections", "20"]);
    let endpoint = format!("127.0.0.1:{}", ports.0);
    wait_serving(&endpoint);
    // Let etcdctl's connection go.
    std::thread::sleep(Duration::from_millis(300));

    let opened = Instant::now();
    let mut silent: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect(&endpoint).unwrap())
        .collect();
    let mut extra = TcpStream::connect(&endpoint).unwrap();
    assert!(
        closed_within(&mut extra, Duration::from_secs(3)),
        "a connection past the limit stayed open"
    );
    assert!(!etcdctl_put(&endpoint), "a request got through a full port");

    // The silent ones are closed about 10 s after they were opened.
    for conn in &mut silent {
        let left = Duration::from_secs(15).saturating_sub(opened.elapsed());
        assert!(closed_within(conn, left), "a silent connection was kept");
    }
    assert!(
        opened.elapsed() >= Duration::from_secs(9),
        "closed too early"
    );
    let start = Instant::now();
    while !etcdctl_put(&endpoint) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "slots were not freed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
