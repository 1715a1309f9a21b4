//! Serves HTTP/2 requests whose `:authority` carries a URL scheme.
//!
//! etcdctl 3.4's `endpoint status --cluster` reads the member list, then asks each member
//! for its status through a connection to that member's client URL, and sends the URL,
//! scheme included, as the `:authority` pseudo-header: `http://127.0.0.1:2379`. grpc-go
//! (etcd) serves it; the `h2` crate under tonic/hyper does not. Its server parses the value
//! with `http::uri::Authority`, which stops at the first `/` and so rejects the whole
//! value, and resets the stream with PROTOCOL_ERROR before hyper or tonic see the request
//! (h2 0.4.20, `src/server.rs`, `Peer::convert_poll_message`; hyperium/h2 issue 525). No
//! h2, hyper or tonic setting skips that check.
//!
//! [`SchemeTolerant`] sits between the accepted connection and the HTTP/2 server and
//! rewrites such an authority in the client-to-server bytes before h2 reads them:
//! `http://host:port` and `https://host:port` (any case, and anything after a `/`, `?` or
//! `#` that follows) become `host:port`, and a unix socket's path (what clients dialing
//! `unix:///PATH` send) becomes `localhost`.
//!
//! Cost for a well-formed client: the bytes up to the end of the first HEADERS block are
//! parsed, that one block is HPACK-decoded (a few microseconds), and from then on the
//! connection is a plain pass-through (a client does not change the form of its authority
//! midway). Only a connection whose first request carried a scheme stays in rewrite mode,
//! where every header block is decoded (with the connection's dynamic table) and
//! re-encoded as literals without indexing, so that the server's decoder table stays empty
//! and needs no tracking; the never-indexed mark of a field is not kept, which matters
//! only to intermediaries. The server-to-client direction is never touched.
//!
//! The HPACK decoder and encoder are this module's own (RFC 7541, with the Huffman code
//! from its lengths): h2 does not export its own, and the HPACK crates either decode
//! Huffman strings a hundred times slower, time a client could make the server spend on
//! a runtime thread, or accept malformed blocks; `hpack.rs` has the measurements. The
//! tests check the decoder against two of those crates.
//!
//! Anything unexpected (not the HTTP/2 preface, a malformed frame, an HPACK error, a header
//! block over [`MAX_BLOCK_BYTES`]) switches the connection to pass-through with the bytes
//! as received, and h2 gives the answer it would have given without this wrapper. In
//! rewrite mode that can leave h2 with an HPACK table that no longer matches the client's;
//! h2 then fails the connection with COMPRESSION_ERROR, which is where such a connection
//! was headed anyway.
//!
//! Plaintext HTTP/2 only (prior knowledge, as gRPC uses): under TLS, wrap the decrypted
//! stream instead, since ciphertext never matches the preface and just passes through.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

mod hpack;

use hpack::{HpackDecoder, encode_block};

/// The client connection preface (RFC 9113 section 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER_LEN: usize = 9;

const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;

const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;

/// The most bytes of one header block (its HEADERS and CONTINUATION frames as received)
/// held back while it is collected. Frames of other types stream through and are never
/// held whole. hyper's server allows 16 KiB of header list and frames of 16 KiB by
/// default, so a real request's block is far below this.
pub const MAX_BLOCK_BYTES: usize = 256 * 1024;

/// The largest HPACK dynamic table the client may ask for. h2 itself allows what its
/// SETTINGS_HEADER_TABLE_SIZE says (4096 unless configured), and is shown the client's
/// size updates, so this only bounds this wrapper's memory.
const MAX_TABLE_SIZE: usize = 64 * 1024;

/// The most a decoded header list may come to, by HPACK's measure (name, value and 32 per
/// field). A block that references the dynamic table can decode to far more than its own
/// size; past this it is passed on as received. hyper's server accepts 16 KiB.
const MAX_DECODED_BYTES: usize = 1 << 20;

/// Frames this wrapper writes stay within the smallest SETTINGS_MAX_FRAME_SIZE a server
/// may announce (RFC 9113 section 4.2), whatever the server's setting is.
const MAX_OUT_FRAME: usize = 16_384;

/// Bytes read from the connection at a time while it is still being parsed.
const READ_CHUNK: usize = 16 * 1024;

/// An accepted connection whose client-to-server HTTP/2 bytes have a scheme-prefixed
/// `:authority` rewritten to a plain `host:port` (see the module docs).
pub struct SchemeTolerant<S> {
    inner: S,
    /// `None` once the connection is a plain pass-through with nothing held back.
    filter: Option<Box<Filter>>,
    /// Bytes already processed and waiting for the reader, from `ready_pos` on.
    ready: Vec<u8>,
    ready_pos: usize,
}

impl<S> SchemeTolerant<S> {
    /// Wraps a freshly accepted connection, before any byte has been read from it.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            filter: Some(Box::new(Filter::new())),
            ready: Vec::new(),
            ready_pos: 0,
        }
    }

    /// The wrapped connection.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped connection. Reading from it directly skips bytes held back here.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Whether the connection is in rewrite mode, for tests and logging.
    pub fn is_rewriting(&self) -> bool {
        self.filter
            .as_ref()
            .is_some_and(|f| matches!(f.mode, Mode::Rewrite))
    }
}

impl<S> fmt::Debug for SchemeTolerant<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match &self.filter {
            None => "passthrough",
            Some(filter) => match filter.mode {
                Mode::Undecided => "undecided",
                Mode::Rewrite => "rewrite",
                Mode::Passthrough => "passthrough (draining)",
            },
        };
        f.debug_struct("SchemeTolerant")
            .field("mode", &mode)
            .finish_non_exhaustive()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for SchemeTolerant<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.ready_pos < this.ready.len() {
                let n = buf.remaining().min(this.ready.len() - this.ready_pos);
                buf.put_slice(&this.ready[this.ready_pos..this.ready_pos + n]);
                this.ready_pos += n;
                if this.ready_pos == this.ready.len() {
                    this.ready.clear();
                    this.ready_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let Some(filter) = this.filter.as_mut() else {
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            };
            if filter.is_drained() {
                // Decided pass-through and nothing held back: from here on every read
                // goes straight to the connection.
                this.filter = None;
                this.ready = Vec::new();
                continue;
            }
            if filter.chunk.is_empty() {
                filter.chunk = vec![0; READ_CHUNK];
            }
            let mut chunk = ReadBuf::new(&mut filter.chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut chunk) {
                Poll::Pending => {
                    // Nothing to read: a connection idle here (one that opened without a
                    // request yet) holds no read buffer; the next read makes one.
                    filter.chunk = Vec::new();
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {}
            }
            let n = chunk.filled().len();
            if n == 0 {
                // End of stream: whatever is held back goes out as received, and h2
                // sees the truncation.
                filter.finish(&mut this.ready);
                this.filter = None;
                if this.ready.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            filter.feed_chunk(n, &mut this.ready);
            // Loop: either bytes are ready now or more input is needed; an `Ok` with
            // nothing put in `buf` would read as end of stream.
        }
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for SchemeTolerant<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected
    for SchemeTolerant<S>
{
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// No HEADERS block seen yet.
    Undecided,
    /// The first request carried a scheme: every header block is re-encoded.
    Rewrite,
    /// Bytes go out as received.
    Passthrough,
}

/// A header block being collected: a HEADERS frame and its CONTINUATION frames.
struct Block {
    /// The frames as received, sent on unchanged if the block is not rewritten.
    raw: Vec<u8>,
    /// The header block fragments, padding and priority removed.
    fragment: Vec<u8>,
    stream_id: u32,
    end_stream: bool,
    /// The HEADERS frame's priority fields (RFC 9113 section 6.2), kept as they were.
    priority: Option<[u8; 5]>,
}

/// The client-to-server byte stream parser; all of it is synchronous so that tests can
/// drive it directly.
struct Filter {
    mode: Mode,
    /// How many bytes of the preface have been seen (24 once it is complete).
    preface_seen: usize,
    /// Payload bytes of the current frame that stream through without being looked at.
    raw_left: usize,
    /// Bytes received and not yet processed.
    input: Vec<u8>,
    block: Option<Block>,
    decoder: HpackDecoder,
    /// Where reads from the connection land (empty while the connection waits).
    chunk: Vec<u8>,
}

impl Filter {
    fn new() -> Self {
        Self {
            mode: Mode::Undecided,
            preface_seen: 0,
            raw_left: 0,
            input: Vec::new(),
            block: None,
            decoder: HpackDecoder::new(),
            chunk: Vec::new(),
        }
    }

    /// Pass-through decided and nothing held back.
    fn is_drained(&self) -> bool {
        self.mode == Mode::Passthrough && self.input.is_empty() && self.block.is_none()
    }

    /// Processes the first `n` bytes of `chunk`, just read from the connection.
    fn feed_chunk(&mut self, n: usize, out: &mut Vec<u8>) {
        let n = n.min(self.chunk.len());
        self.input.extend_from_slice(&self.chunk[..n]);
        self.process(out);
    }

    /// Processes `data`, received from the client, appending to `out` what the server may
    /// read now.
    #[cfg(test)]
    fn feed(&mut self, data: &[u8], out: &mut Vec<u8>) {
        self.input.extend_from_slice(data);
        self.process(out);
    }

    /// End of stream: everything held back goes out as received.
    fn finish(&mut self, out: &mut Vec<u8>) {
        if let Some(block) = self.block.take() {
            out.extend_from_slice(&block.raw);
        }
        out.append(&mut self.input);
        self.mode = Mode::Passthrough;
    }

    /// Gives up on parsing: the block being collected and all later bytes go out as
    /// received.
    fn give_up(&mut self, out: &mut Vec<u8>) {
        if let Some(block) = self.block.take() {
            out.extend_from_slice(&block.raw);
        }
        self.mode = Mode::Passthrough;
    }

    fn process(&mut self, out: &mut Vec<u8>) {
        // `pos` walks `input`; the consumed prefix is dropped once at the end.
        let mut pos = 0;
        loop {
            let avail = &self.input[pos..];
            if self.mode == Mode::Passthrough {
                out.extend_from_slice(avail);
                pos = self.input.len();
                break;
            }
            if self.preface_seen < PREFACE.len() {
                let want = &PREFACE[self.preface_seen..];
                let n = want.len().min(avail.len());
                if avail[..n] != want[..n] {
                    // Not HTTP/2 with prior knowledge: leave it all to the server.
                    self.give_up(out);
                    continue;
                }
                out.extend_from_slice(&avail[..n]);
                pos += n;
                self.preface_seen += n;
                if self.preface_seen < PREFACE.len() {
                    break;
                }
                continue;
            }
            if self.raw_left > 0 {
                let n = self.raw_left.min(avail.len());
                out.extend_from_slice(&avail[..n]);
                pos += n;
                self.raw_left -= n;
                if self.raw_left > 0 {
                    break;
                }
                continue;
            }
            let Some(header) = FrameHeader::parse(avail) else {
                break;
            };
            let is_block_frame = match &self.block {
                None => header.kind == TYPE_HEADERS,
                Some(block) => {
                    header.kind == TYPE_CONTINUATION && header.stream_id == block.stream_id
                }
            };
            if !is_block_frame {
                if self.block.is_some() {
                    // A header block interrupted by another frame is a connection
                    // error (RFC 9113 section 6.10); h2 reports it.
                    self.give_up(out);
                    continue;
                }
                // Any other frame streams through without being held.
                out.extend_from_slice(&avail[..FRAME_HEADER_LEN]);
                pos += FRAME_HEADER_LEN;
                self.raw_left = header.len;
                continue;
            }
            let frame_len = FRAME_HEADER_LEN + header.len;
            let held = self.block.as_ref().map_or(0, |b| b.raw.len());
            if held + frame_len > MAX_BLOCK_BYTES {
                self.give_up(out);
                continue;
            }
            if avail.len() < frame_len {
                break;
            }
            let frame = &avail[..frame_len];
            let payload = &frame[FRAME_HEADER_LEN..];
            pos += frame_len;
            match self.block.as_mut() {
                None => {
                    let Some((priority, fragment)) = headers_fragment(header.flags, payload) else {
                        out.extend_from_slice(frame);
                        self.mode = Mode::Passthrough;
                        continue;
                    };
                    if header.stream_id == 0 {
                        out.extend_from_slice(frame);
                        self.mode = Mode::Passthrough;
                        continue;
                    }
                    self.block = Some(Block {
                        raw: frame.to_vec(),
                        fragment: fragment.to_vec(),
                        stream_id: header.stream_id,
                        end_stream: header.flags & FLAG_END_STREAM != 0,
                        priority,
                    });
                }
                Some(block) => {
                    block.raw.extend_from_slice(frame);
                    block.fragment.extend_from_slice(payload);
                }
            }
            if header.flags & FLAG_END_HEADERS != 0 {
                self.complete_block(out);
            }
        }
        self.input.drain(..pos);
    }

    /// A whole header block has arrived: decide, rewrite or pass it on.
    fn complete_block(&mut self, out: &mut Vec<u8>) {
        let Some(block) = self.block.take() else {
            return;
        };
        let Some((size_updates, mut headers)) = self.decoder.decode(&block.fragment) else {
            // h2 will find the same fault (or a list over its limit); in rewrite mode the
            // tables now disagree too, which h2 reports as a compression error.
            out.extend_from_slice(&block.raw);
            self.mode = Mode::Passthrough;
            return;
        };
        let mut changed = false;
        for (name, value) in headers.iter_mut() {
            if name.as_slice() == b":authority"
                && let Some(stripped) = strip_scheme(value)
            {
                *value = stripped;
                changed = true;
            }
        }
        match self.mode {
            Mode::Undecided if !changed => {
                // A well-formed client: nothing on this connection needs looking at.
                out.extend_from_slice(&block.raw);
                self.mode = Mode::Passthrough;
            }
            Mode::Undecided | Mode::Rewrite => {
                self.mode = Mode::Rewrite;
                let encoded = encode_block(&block.fragment[..size_updates], &headers);
                write_block_frames(out, &block, &encoded);
            }
            Mode::Passthrough => out.extend_from_slice(&block.raw),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct FrameHeader {
    len: usize,
    kind: u8,
    flags: u8,
    stream_id: u32,
}

impl FrameHeader {
    /// The frame header at the start of `buf`, if all 9 bytes are there.
    fn parse(buf: &[u8]) -> Option<Self> {
        let h: &[u8; FRAME_HEADER_LEN] = buf.get(..FRAME_HEADER_LEN)?.try_into().ok()?;
        Some(Self {
            len: usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]),
            kind: h[3],
            flags: h[4],
            // The top bit is reserved (RFC 9113 section 4.1).
            stream_id: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
        })
    }
}

/// A HEADERS payload's priority fields and header block fragment, or `None` if the
/// padding or priority fields do not fit in it.
fn headers_fragment(flags: u8, payload: &[u8]) -> Option<(Option<[u8; 5]>, &[u8])> {
    let mut rest = payload;
    let mut pad = 0;
    if flags & FLAG_PADDED != 0 {
        let (&n, tail) = rest.split_first()?;
        pad = usize::from(n);
        rest = tail;
    }
    let mut priority = None;
    if flags & FLAG_PRIORITY != 0 {
        let fields: [u8; 5] = rest.get(..5)?.try_into().ok()?;
        priority = Some(fields);
        rest = &rest[5..];
    }
    let end = rest.len().checked_sub(pad)?;
    Some((priority, &rest[..end]))
}

/// `host:port` for an authority that starts with `http://` or `https://` (any case),
/// without anything from a following `/`, `?` or `#` on; `localhost` for a unix socket's
/// path (grpc-go clients dialing `unix:///run/x.sock` send the path as the authority);
/// `None` for any other value.
fn strip_scheme(value: &[u8]) -> Option<Vec<u8>> {
    if value.first() == Some(&b'/') {
        return Some(b"localhost".to_vec());
    }
    let rest = [&b"http://"[..], &b"https://"[..]]
        .iter()
        .find_map(|scheme| {
            let head = value.get(..scheme.len())?;
            head.eq_ignore_ascii_case(scheme)
                .then(|| &value[scheme.len()..])
        })?;
    let end = rest
        .iter()
        .position(|&c| matches!(c, b'/' | b'?' | b'#'))
        .unwrap_or(rest.len());
    Some(rest[..end].to_vec())
}

fn put_frame_header(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream_id: u32) {
    // `len` never exceeds MAX_OUT_FRAME, so three bytes hold it.
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend_from_slice(&(stream_id & 0x7fff_ffff).to_be_bytes());
}

/// Appends `encoded` as a HEADERS frame for `block`'s stream followed by as many
/// CONTINUATION frames as keep each frame within [`MAX_OUT_FRAME`]. END_STREAM and the
/// priority fields are kept; padding is dropped.
fn write_block_frames(out: &mut Vec<u8>, block: &Block, encoded: &[u8]) {
    let prio_len = if block.priority.is_some() { 5 } else { 0 };
    let first_len = encoded.len().min(MAX_OUT_FRAME - prio_len);
    let (first, mut rest) = encoded.split_at(first_len);
    let mut flags = 0;
    if block.end_stream {
        flags |= FLAG_END_STREAM;
    }
    if block.priority.is_some() {
        flags |= FLAG_PRIORITY;
    }
    if rest.is_empty() {
        flags |= FLAG_END_HEADERS;
    }
    put_frame_header(
        out,
        prio_len + first.len(),
        TYPE_HEADERS,
        flags,
        block.stream_id,
    );
    if let Some(priority) = block.priority {
        out.extend_from_slice(&priority);
    }
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let (part, tail) = rest.split_at(rest.len().min(MAX_OUT_FRAME));
        let flags = if tail.is_empty() { FLAG_END_HEADERS } else { 0 };
        put_frame_header(out, part.len(), TYPE_CONTINUATION, flags, block.stream_id);
        out.extend_from_slice(part);
        rest = tail;
    }
}

#[cfg(test)]
mod tests;
