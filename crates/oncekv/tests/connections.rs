//! Connections are bounded: past `--max-connections` a new connection is closed at once,
//! a connection that sends nothing is closed after 10 s, freeing its slot, and 10,000
//! idle HTTP/2 connections cost the member a bounded amount of memory each while it goes
//! on serving.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{etcdctl_put, rss, serve_single, wait_serving};

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

/// What an idle gRPC client's connection carries: the HTTP/2 preface and an empty
/// SETTINGS frame, then nothing (grpc-go connects at dial time and waits for a call).
const HTTP2_HELLO: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

#[test]
fn ten_thousand_idle_connections_cost_little_each() {
    const CONNECTIONS: usize = 10_000;
    // Each idle connection holds h2's buffers (16 KiB to write, 8 KiB to read) and its
    // state; the authority filter frees its read buffer while a connection waits.
    const MAX_BYTES_EACH: u64 = 40 << 10;
    let dir = tempfile::tempdir().unwrap();
    // Room for etcdctl beside them (the default limit is 10,000).
    let (member, ports) = serve_single(dir.path(), &["--max-connections", "10100"]);
    let endpoint = format!("127.0.0.1:{}", ports.0);
    wait_serving(&endpoint);
    std::thread::sleep(Duration::from_millis(300));
    let pid = member.0[0].id();
    let before = rss(pid);
    let mut idle = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        let mut conn = TcpStream::connect(&endpoint).unwrap();
        conn.write_all(HTTP2_HELLO).unwrap();
        idle.push(conn);
    }
    // The server answers each with its own SETTINGS: once the last has, all are set up.
    let mut buf = [0u8; 9];
    idle.last_mut().unwrap().read_exact(&mut buf).unwrap();
    assert_eq!(buf[3], 0x4, "the server's first frame is SETTINGS");
    std::thread::sleep(Duration::from_secs(2));
    let each = rss(pid).saturating_sub(before) / CONNECTIONS as u64;
    assert!(
        each < MAX_BYTES_EACH,
        "{each} bytes per idle connection (limit {MAX_BYTES_EACH})"
    );
    // Past the first-bytes deadline, they are still open (they spoke), and the member
    // serves as before.
    std::thread::sleep(Duration::from_secs(9));
    assert!(!closed_within(&mut idle[0], Duration::from_millis(100)));
    assert!(etcdctl_put(&endpoint));
    eprintln!("{each} bytes per idle HTTP/2 connection");
}
