//! The rewrite: etcdctl's request, well-formed clients passed through, the dynamic table,
//! continuations, garbage, bad blocks, and the filter in front of a real h2 server.

use super::*;

/// Frames the filter lets through for `input`, fed in one piece, and its mode after.
fn through_filter(input: &[u8]) -> (Vec<u8>, Mode) {
    let mut f = Filter::new();
    let mut out = Vec::new();
    f.feed(input, &mut out);
    (out, f.mode)
}

#[test]
fn bad_blocks_in_rewrite_mode_pass_on_as_received() {
    let mut enc = Encoder::default();
    let mut first = start();
    let block = encode(&mut enc, &request("http://10.0.0.1:2379", "/x"), 0);
    first.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &block));
    let (rewritten, mode) = through_filter(&first);
    assert_eq!(mode, Mode::Rewrite);
    // Malformed (an index past the table, a string past the end), and a block that
    // decodes past MAX_DECODED_BYTES: 300 times 4035 bytes from 4.3 KB, where 200 times
    // is still decoded.
    let decoded = HpackDecoder::new().decode(&amplifying_block(200));
    assert_eq!(decoded.map(|(_, fields)| fields.len()), Some(201));
    for bad in [vec![0xbe], vec![0x00, 0x05, b'a'], amplifying_block(300)] {
        let mut tail = frame(TYPE_HEADERS, FLAG_END_HEADERS, 3, &bad);
        tail.extend(frame(0x0, FLAG_END_STREAM, 3, b"after"));
        let mut input = first.clone();
        input.extend_from_slice(&tail);
        let (out, mode) = through_filter(&input);
        assert_eq!(mode, Mode::Passthrough, "{:02x?}", &bad[..bad.len().min(8)]);
        let mut expected = rewritten.clone();
        expected.extend_from_slice(&tail);
        assert_eq!(out, expected);
    }
}

/// Serves HTTP/2 (tonic, no services) on one in-memory connection, through the filter if
/// `filtered`, and returns the client's end.
fn serve_one(filtered: bool) -> tokio::io::DuplexStream {
    let (client, server) = tokio::io::duplex(1 << 20);
    if filtered {
        serve(SchemeTolerant::new(server));
    } else {
        serve(server);
    }
    client
}

fn serve<S>(conn: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Connected + Unpin + Send + 'static,
{
    let incoming = futures::StreamExt::chain(
        futures::stream::iter([Ok::<_, io::Error>(conn)]),
        futures::stream::pending(),
    );
    let server = tonic::transport::Server::builder()
        .add_routes(tonic::service::Routes::default())
        .serve_with_incoming(incoming);
    tokio::spawn(server);
}

/// What the server sent, frame by frame (type, stream, payload), until it closed the
/// connection or `stop` said enough.
async fn server_frames(
    conn: &mut tokio::io::DuplexStream,
    stop: impl Fn(u8, u32) -> bool,
) -> Vec<(u8, u32, Vec<u8>)> {
    let mut got = Vec::new();
    let read = async {
        loop {
            let mut head = [0; FRAME_HEADER_LEN];
            if conn.read_exact(&mut head).await.is_err() {
                return;
            }
            let fh = FrameHeader::parse(&head).expect("nine bytes");
            let mut payload = vec![0; fh.len];
            if conn.read_exact(&mut payload).await.is_err() {
                return;
            }
            got.push((fh.kind, fh.stream_id, payload));
            if stop(fh.kind, fh.stream_id) {
                return;
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), read)
        .await
        .expect("the server answers within 10 s");
    got
}

const TYPE_RST_STREAM: u8 = 0x3;
const TYPE_GOAWAY: u8 = 0x7;
const PROTOCOL_ERROR: [u8; 4] = [0, 0, 0, 1];

#[tokio::test]
async fn h2_serves_the_rewritten_request_and_refuses_bad_blocks() {
    let answered = |kind: u8, sid: u32| sid == 1 && matches!(kind, TYPE_HEADERS | TYPE_RST_STREAM);
    let input = unhex(ETCDCTL_CLUSTER);
    // Unfiltered, h2 resets etcdctl's request for its authority.
    let mut conn = serve_one(false);
    conn.write_all(&input).await.expect("write");
    let got = server_frames(&mut conn, answered).await;
    assert!(
        got.contains(&(TYPE_RST_STREAM, 1, PROTOCOL_ERROR.to_vec())),
        "{got:?}"
    );
    // Filtered, it answers it (UNIMPLEMENTED, from a server without services).
    let mut conn = serve_one(true);
    conn.write_all(&input).await.expect("write");
    let got = server_frames(&mut conn, answered).await;
    assert!(matches!(got.last(), Some((TYPE_HEADERS, 1, _))), "{got:?}");
    // A malformed block after it (a string past its end): h2 fails the connection, with
    // the GOAWAY it sends a client that has nothing to rewrite.
    let malformed = frame(TYPE_HEADERS, FLAG_END_HEADERS, 3, &[0x00, 0x05, b'a']);
    conn.write_all(&malformed).await.expect("write");
    let goaway = |got: &[(u8, u32, Vec<u8>)]| {
        let frame = got.iter().find(|f| f.0 == TYPE_GOAWAY).expect("a GOAWAY");
        frame.2[4..8].to_vec()
    };
    let filtered = goaway(&server_frames(&mut conn, |kind, _| kind == TYPE_GOAWAY).await);
    let mut conn = serve_one(false);
    let mut plain = start();
    let mut enc = Encoder::default();
    let block = encode(&mut enc, &request("127.0.0.1:2379", "/a"), 0);
    plain.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &block));
    plain.extend(malformed);
    conn.write_all(&plain).await.expect("write");
    let direct = goaway(&server_frames(&mut conn, |kind, _| kind == TYPE_GOAWAY).await);
    assert_eq!(filtered, direct);
    assert_ne!(direct, [0; 4], "GOAWAY without an error");
    // A first block that decodes past MAX_DECODED_BYTES (and hyper's header list limit)
    // goes to h2 as received, which fails the connection as it does without the filter.
    let mut input = start();
    let block = amplifying_block(300);
    let (a, b) = block.split_at(block.len() / 2);
    input.extend(frame(TYPE_HEADERS, 0, 1, a));
    input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, b));
    let mut answers = Vec::new();
    for filtered in [true, false] {
        let mut conn = serve_one(filtered);
        conn.write_all(&input).await.expect("write");
        let got = server_frames(&mut conn, |kind, sid| {
            kind == TYPE_GOAWAY || answered(kind, sid)
        })
        .await;
        answers.push(got);
    }
    assert_eq!(answers[0], answers[1]);
    // ENHANCE_YOUR_CALM, "header_list_way_too_large" (h2 0.4.20).
    assert_eq!(goaway(&answers[0]), [0, 0, 0, 11], "{:?}", answers[0]);
}

#[test]
fn etcdctl_cluster_request_is_rewritten() {
    let input = unhex(ETCDCTL_CLUSTER);
    let before = frames(&input, MAX_OUT_FRAME);
    let Some(Seen::Headers(_, _, _, headers)) = before.get(2) else {
        panic!("no headers in {before:?}");
    };
    assert!(headers.contains(&h(":authority", "http://127.0.0.1:23790")));
    assert!(headers.contains(&h(":path", "/etcdserverpb.Maintenance/Status")));
    for step in [1, 2, 7, 64, input.len()] {
        let (out, mode) = run(&input, step);
        assert_eq!(mode, Mode::Rewrite);
        let after = frames(&out, MAX_OUT_FRAME);
        assert_eq!(
            after,
            with_authority(frames(&input, MAX_OUT_FRAME), "127.0.0.1:23790")
        );
    }
}

#[test]
fn well_formed_clients_pass_through_unchanged() {
    for flags in [
        0,
        Encoder::HUFFMAN_NAME | Encoder::HUFFMAN_VALUE,
        Encoder::WITH_INDEXING | Encoder::BEST_FORMAT,
        Encoder::HUFFMAN_VALUE | Encoder::WITH_INDEXING | Encoder::BEST_FORMAT,
        Encoder::NEVER_INDEXED,
    ] {
        let mut enc = Encoder::default();
        let mut input = start();
        for (i, sid) in [1u32, 3, 5].into_iter().enumerate() {
            let block = encode(&mut enc, &request("127.0.0.1:2379", "/a"), flags);
            // One padded with priority, one split over a CONTINUATION.
            match i {
                0 => input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, sid, &block)),
                1 => {
                    let mut p = vec![3, 0, 0, 0, 0, 16];
                    p.extend_from_slice(&block);
                    p.extend_from_slice(&[0, 0, 0]);
                    let fl = FLAG_END_HEADERS | FLAG_PADDED | FLAG_PRIORITY;
                    input.extend(frame(TYPE_HEADERS, fl, sid, &p));
                }
                _ => {
                    let (a, b) = block.split_at(block.len() / 2);
                    input.extend(frame(TYPE_HEADERS, 0, sid, a));
                    input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, sid, b));
                }
            }
            input.extend(frame(0x0, FLAG_END_STREAM, sid, b"\0\0\0\0\0"));
        }
        for step in [1, 3, 100, input.len()] {
            let (out, mode) = run(&input, step);
            assert_eq!(out, input, "flags {flags:#x} step {step}");
            assert_eq!(mode, Mode::Passthrough);
        }
    }
}

#[test]
fn rewrite_mode_follows_the_dynamic_table() {
    // Huffman and indexing: the second and third requests refer to the first's
    // entries, `:authority` included.
    let flags = Encoder::HUFFMAN_NAME
        | Encoder::HUFFMAN_VALUE
        | Encoder::WITH_INDEXING
        | Encoder::BEST_FORMAT;
    let mut enc = Encoder::default();
    let mut input = start();
    let first = encode(&mut enc, &request("http://10.0.0.1:2379", "/x"), flags);
    input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &first));
    input.extend(frame(0x0, FLAG_END_STREAM, 1, b"\0\0\0\0\0"));
    let second = encode(&mut enc, &request("http://10.0.0.1:2379", "/y"), flags);
    assert!(second.len() < first.len() / 2, "second block not indexed");
    let mut p = vec![2, 0, 0, 0, 1, 200];
    p.extend_from_slice(&second);
    p.extend_from_slice(&[0, 0]);
    let fl = FLAG_END_HEADERS | FLAG_PADDED | FLAG_PRIORITY | FLAG_END_STREAM;
    input.extend(frame(TYPE_HEADERS, fl, 3, &p));
    // A table size update (to 256 and back to 4096), then the same request split.
    let mut third = Vec::new();
    enc.update_max_dynamic_size(256, &mut third)
        .expect("size update");
    enc.update_max_dynamic_size(4096, &mut third)
        .expect("size update");
    assert_eq!(third, [0x3f, 0xe1, 0x01, 0x3f, 0xe1, 0x1f]);
    third.extend(encode(
        &mut enc,
        &request("http://10.0.0.1:2379", "/z"),
        flags,
    ));
    let (a, rest) = third.split_at(4);
    let (b, c) = rest.split_at(rest.len() / 2);
    input.extend(frame(TYPE_HEADERS, FLAG_END_STREAM, 5, a));
    input.extend(frame(TYPE_CONTINUATION, 0, 5, b));
    input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 5, c));
    input.extend(frame(0x6, 0, 0, &[1; 8])); // PING

    let expected = with_authority(frames(&input, MAX_OUT_FRAME), "10.0.0.1:2379");
    assert_eq!(
        expected
            .iter()
            .filter(|s| matches!(s, Seen::Headers(..)))
            .count(),
        3
    );
    for step in [1, 5, 33, input.len()] {
        let (out, mode) = run(&input, step);
        assert_eq!(mode, Mode::Rewrite);
        assert_eq!(frames(&out, MAX_OUT_FRAME), expected, "step {step}");
        // The size updates reach the server, at the start of the third block.
        let third_at = out
            .windows(6)
            .position(|w| w == [0x3f, 0xe1, 0x01, 0x3f, 0xe1, 0x1f]);
        assert!(third_at.is_some());
    }
}

#[test]
fn schemes_and_paths_are_stripped() {
    assert_eq!(strip_scheme(b"http://a:1"), Some(b"a:1".to_vec()));
    assert_eq!(
        strip_scheme(b"HTTPS://[::1]:2379/"),
        Some(b"[::1]:2379".to_vec())
    );
    assert_eq!(strip_scheme(b"http://a:1?x#y"), Some(b"a:1".to_vec()));
    assert_eq!(strip_scheme(b"a:1"), None);
    assert_eq!(
        strip_scheme(b"/run/oncekv.sock"),
        Some(b"localhost".to_vec())
    );
    assert_eq!(strip_scheme(b"http:/"), None);
    assert_eq!(strip_scheme(b"unix://x"), None);
    assert_eq!(strip_scheme(b""), None);
}

#[test]
fn large_blocks_are_split_into_continuations() {
    let mut enc = Encoder::default();
    let mut headers = request("https://example.com:443", "/big");
    headers.push(h("x-big", &"v".repeat(40_000)));
    let block = encode(&mut enc, &headers, 0);
    let mut input = start();
    // The client's own frames may be larger than 16 KiB if the server allowed it.
    input.extend(frame(
        TYPE_HEADERS,
        FLAG_END_HEADERS | FLAG_END_STREAM,
        1,
        &block,
    ));
    let (out, mode) = run(&input, 4096);
    assert_eq!(mode, Mode::Rewrite);
    let after = frames(&out, MAX_OUT_FRAME);
    let expected = with_authority(frames(&input, 1 << 20), "example.com:443");
    assert_eq!(after, expected);
    let continuations = out
        .windows(4)
        .filter(|w| w[0] == TYPE_CONTINUATION && w[2..] == [0, 0])
        .count();
    assert!(continuations >= 2);
}

#[test]
fn garbage_passes_through() {
    let http1 = b"GET / HTTP/1.1\r\nHost: http://x\r\n\r\n".to_vec();
    let mut bad_hpack = start();
    bad_hpack.extend(frame(
        TYPE_HEADERS,
        FLAG_END_HEADERS,
        1,
        &[0xff, 0xff, 0xff],
    ));
    bad_hpack.extend(frame(0x0, 0, 1, b"after"));
    let mut bad_padding = start();
    bad_padding.extend(frame(
        TYPE_HEADERS,
        FLAG_PADDED | FLAG_END_HEADERS,
        1,
        &[9, 1],
    ));
    let mut interrupted = start();
    interrupted.extend(frame(TYPE_HEADERS, 0, 1, &[0x82]));
    interrupted.extend(frame(0x6, 0, 0, &[0; 8]));
    let mut stray_continuation = start();
    stray_continuation.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, &[0x82]));
    let truncated = start()[..40].to_vec();
    for input in [
        http1,
        bad_hpack,
        bad_padding,
        interrupted,
        stray_continuation,
        truncated,
        PREFACE[..10].to_vec(),
        Vec::new(),
    ] {
        for step in [1, 4, input.len()] {
            assert_eq!(run(&input, step).0, input);
        }
    }
}

#[test]
fn random_input_never_panics_and_keeps_unrewritten_bytes() {
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut next = move || rng.next();
    for round in 0..2000 {
        let mut input = if round % 2 == 0 { start() } else { Vec::new() };
        let len = (next() % 300) as usize;
        for _ in 0..len {
            // Small frame lengths and types 0..10 now and then, to reach the parser.
            let b = next() as u8;
            input.push(if round % 3 == 0 { b % 10 } else { b });
        }
        let step = 1 + (next() % 50) as usize;
        let (out, mode) = run(&input, step);
        if mode != Mode::Rewrite {
            assert_eq!(out, input);
        }
    }
}

#[test]
fn oversized_block_is_passed_on_unbuffered() {
    let mut input = start();
    let len = (1usize << 24) - 1;
    input.extend_from_slice(&[0xff, 0xff, 0xff, TYPE_HEADERS, FLAG_END_HEADERS, 0, 0, 0, 1]);
    let mut f = Filter::new();
    let mut out = Vec::new();
    f.feed(&input, &mut out);
    assert_eq!(f.mode, Mode::Passthrough);
    assert_eq!(out, input);
    let junk = vec![0xa5; 2 << 20];
    f.feed(&junk, &mut out);
    assert!(f.input.is_empty());
    assert_eq!(out.len(), input.len() + junk.len());
    assert!(len > MAX_BLOCK_BYTES);
}

#[tokio::test]
async fn async_read_rewrites_and_forwards_writes() {
    let input = unhex(ETCDCTL_CLUSTER);
    let (mut client, server) = tokio::io::duplex(64);
    let mut wrapped = SchemeTolerant::new(server);
    let writer = tokio::spawn(async move {
        for piece in input.chunks(13) {
            client.write_all(piece).await.expect("write");
        }
        client.shutdown().await.expect("shutdown");
        let mut back = Vec::new();
        client.read_to_end(&mut back).await.expect("read");
        back
    });
    let mut out = Vec::new();
    wrapped.read_to_end(&mut out).await.expect("read");
    assert!(wrapped.is_rewriting() || wrapped.filter.is_none());
    wrapped.write_all(b"reply").await.expect("write");
    wrapped.shutdown().await.expect("shutdown");
    assert_eq!(writer.await.expect("writer task"), b"reply");
    let expected = with_authority(
        frames(&unhex(ETCDCTL_CLUSTER), MAX_OUT_FRAME),
        "127.0.0.1:23790",
    );
    assert_eq!(frames(&out, MAX_OUT_FRAME), expected);
    // Forwarded from the wrapped stream (the unit type for a duplex pipe).
    wrapped.connect_info();
}

#[tokio::test]
async fn async_read_of_a_good_client_becomes_direct() {
    let mut enc = Encoder::default();
    let mut input = start();
    let block = encode(&mut enc, &request("127.0.0.1:2379", "/a"), 0);
    input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &block));
    let (mut client, server) = tokio::io::duplex(1 << 16);
    let mut wrapped = SchemeTolerant::new(server);
    client.write_all(&input).await.expect("write");
    let mut out = vec![0; input.len()];
    wrapped.read_exact(&mut out).await.expect("read");
    assert_eq!(out, input);
    client.write_all(b"more").await.expect("write");
    let mut more = [0; 4];
    wrapped.read_exact(&mut more).await.expect("read");
    assert_eq!(&more, b"more");
    assert!(wrapped.filter.is_none(), "still filtering: {wrapped:?}");
}
