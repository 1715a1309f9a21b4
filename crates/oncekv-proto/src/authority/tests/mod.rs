//! The authority rewrite against captured etcdctl bytes, hand-built HPACK blocks of every
//! shape, garbage, and two HPACK crates as references: the shared helpers here, the
//! HPACK decoder in [`decoder`], the rewrite and the filtered connection in [`rewrite`].

use super::hpack::put_integer;
use super::*;

use httlib_hpack::Encoder;
use loona_hpack::Decoder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::server::Connected;

type Headers = Vec<(Vec<u8>, Vec<u8>)>;
/// A header block being read back: stream, END_STREAM, priority fields, fragments.
type OpenBlock = (u32, bool, Option<[u8; 5]>, Vec<u8>);

/// etcdctl 3.4.23's first bytes on a connection opened by `endpoint status --cluster`
/// (captured from a real run against etcd): preface, SETTINGS, SETTINGS ack, HEADERS
/// with `:authority: http://127.0.0.1:23790` (Huffman-coded, with indexing), DATA,
/// PING.
const ETCDCTL_CLUSTER: &str = "505249202a20485454502f322e300d0a0d0a534d0d0a0d0a00000004000000\
    00000000000401000000000000770104000000018386459760a924882d9dcb6571afa066a925a87510ac6e\
    48d36a3f41909d29aee30c044eae05c0b86e09975f075f8b1d75d0620d263d4c4d65647a8b9acac8b4c76\
    02bb2caecff40027465864d833505b11f40899acac8b24d494f6a7f8669f7de08056f408d25062d49587599\
    6ee5b1063d5f03332e34000005000100000001000000000000000806010000000002041010090e0707";

fn unhex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|p| {
            u8::from_str_radix(std::str::from_utf8(p).expect("ascii"), 16).expect("hex digits")
        })
        .collect()
}

fn h(name: &str, value: &str) -> (Vec<u8>, Vec<u8>) {
    (name.as_bytes().to_vec(), value.as_bytes().to_vec())
}

fn request(authority: &str, path: &str) -> Headers {
    vec![
        h(":method", "POST"),
        h(":scheme", "http"),
        h(":path", path),
        h(":authority", authority),
        h("content-type", "application/grpc"),
        h("user-agent", "grpc-go/1.26.0"),
        h("te", "trailers"),
    ]
}

/// An HPACK block for `headers`, each with `flags` (httlib's Huffman and indexing
/// flags), from the connection's encoder.
fn encode(enc: &mut Encoder<'_>, headers: &Headers, flags: u8) -> Vec<u8> {
    let mut dst = Vec::new();
    for (n, v) in headers {
        enc.encode((n.clone(), v.clone(), flags), &mut dst)
            .expect("encodes");
    }
    dst
}

fn frame(kind: u8, flags: u8, stream_id: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let len = payload.len();
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend_from_slice(&stream_id.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn start() -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    out.extend(frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100])); // SETTINGS
    out.extend(frame(0x8, 0, 0, &[0, 0, 0x10, 0])); // WINDOW_UPDATE
    out
}

/// Runs `input` through a fresh filter in pieces of `step` bytes.
fn run(input: &[u8], step: usize) -> (Vec<u8>, Mode) {
    let mut f = Filter::new();
    let mut out = Vec::new();
    for piece in input.chunks(step.max(1)) {
        f.feed(piece, &mut out);
        assert!(
            f.input.len() <= MAX_BLOCK_BYTES + READ_CHUNK,
            "held too much"
        );
    }
    let mode = f.mode;
    f.finish(&mut out);
    (out, mode)
}

#[derive(Debug, PartialEq)]
enum Seen {
    /// A header block: stream, END_STREAM, priority fields, decoded headers.
    Headers(u32, bool, Option<[u8; 5]>, Headers),
    /// Any other frame, as received.
    Other(Vec<u8>),
}

/// Splits client bytes after the preface into frames, decoding header blocks with one
/// decoder for the connection, and checking every frame's size.
fn frames(bytes: &[u8], max_frame: usize) -> Vec<Seen> {
    assert_eq!(&bytes[..24], PREFACE);
    let mut dec = Decoder::new();
    let mut pos = 24;
    let mut seen = Vec::new();
    let mut pending: Option<OpenBlock> = None;
    while pos < bytes.len() {
        let fh = FrameHeader::parse(&bytes[pos..]).expect("a whole frame header");
        assert!(fh.len <= max_frame, "frame of {} bytes", fh.len);
        let payload = &bytes[pos + 9..pos + 9 + fh.len];
        let whole = &bytes[pos..pos + 9 + fh.len];
        pos += 9 + fh.len;
        match fh.kind {
            TYPE_HEADERS => {
                assert!(pending.is_none());
                let (prio, frag) =
                    headers_fragment(fh.flags, payload).expect("a well-formed HEADERS frame");
                pending = Some((
                    fh.stream_id,
                    fh.flags & FLAG_END_STREAM != 0,
                    prio,
                    frag.to_vec(),
                ));
            }
            TYPE_CONTINUATION => pending
                .as_mut()
                .expect("CONTINUATION follows HEADERS")
                .3
                .extend_from_slice(payload),
            _ => {
                assert!(pending.is_none());
                seen.push(Seen::Other(whole.to_vec()));
                continue;
            }
        }
        if fh.flags & FLAG_END_HEADERS != 0 {
            let (sid, end, prio, frag) = pending.take().expect("a block is open");
            let headers = dec.decode(&frag).expect("the block decodes");
            seen.push(Seen::Headers(sid, end, prio, headers));
        }
    }
    assert!(pending.is_none());
    seen
}

/// `seen` with every `:authority` set to `authority`.
fn with_authority(seen: Vec<Seen>, authority: &str) -> Vec<Seen> {
    seen.into_iter()
        .map(|s| match s {
            Seen::Headers(sid, end, prio, headers) => {
                let headers = headers
                    .into_iter()
                    .map(|(n, v)| {
                        if n == b":authority" {
                            (n, authority.as_bytes().to_vec())
                        } else {
                            (n, v)
                        }
                    })
                    .collect();
                Seen::Headers(sid, end, prio, headers)
            }
            other => other,
        })
        .collect()
}

/// A small deterministic generator for the randomized tests.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> usize {
        (self.next() % n) as usize
    }

    fn bytes(&mut self, len: usize, alphabet: &[u8]) -> Vec<u8> {
        (0..len)
            .map(|_| alphabet[self.below(alphabet.len() as u64)])
            .collect()
    }
}

/// A block that puts a 4000-byte field in the table and refers to it `refs` times.
fn amplifying_block(refs: usize) -> Vec<u8> {
    let mut block = vec![0x40, 0x03];
    block.extend_from_slice(b"x-a");
    put_integer(&mut block, 0x00, 7, 4000);
    block.extend(std::iter::repeat_n(b'v', 4000));
    block.extend(std::iter::repeat_n(0x80 | 62, refs));
    block
}

mod decoder;
mod rewrite;
