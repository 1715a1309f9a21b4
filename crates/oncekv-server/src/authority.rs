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
//! `#` that follows) become `host:port`.
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
//! The HPACK decoder is this file's own (RFC 7541, with the Huffman code from its lengths);
//! the tests check it against two HPACK crates.
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

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

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
            let mut chunk = ReadBuf::new(&mut filter.chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut chunk) {
                Poll::Pending => return Poll::Pending,
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

impl<S: AsyncWrite + Unpin> AsyncWrite for SchemeTolerant<S> {
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

impl<S: Connected> Connected for SchemeTolerant<S> {
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
    /// Where reads from the connection land.
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
            chunk: vec![0; READ_CHUNK],
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
/// without anything from a following `/`, `?` or `#` on; `None` for any other value.
fn strip_scheme(value: &[u8]) -> Option<Vec<u8>> {
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

/// Appends an HPACK integer (RFC 7541 section 5.1): `value` with a `prefix`-bit prefix,
/// the first byte's other bits set to `high`.
fn put_integer(out: &mut Vec<u8>, high: u8, prefix: u8, value: usize) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(high | value as u8);
        return;
    }
    out.push(high | max as u8);
    let mut rest = value - max;
    while rest >= 0x80 {
        out.push(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// Appends an HPACK string literal without Huffman coding (RFC 7541 section 5.2).
fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    put_integer(out, 0x00, 7, s.len());
    out.extend_from_slice(s);
}

/// A header block holding `size_updates` and then every header as a literal without
/// indexing with a literal name (RFC 7541 section 6.2.2), which leaves the server's
/// dynamic table untouched.
fn encode_block(size_updates: &[u8], headers: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let body: usize = headers.iter().map(|(n, v)| n.len() + v.len() + 11).sum();
    let mut out = Vec::with_capacity(size_updates.len() + body);
    out.extend_from_slice(size_updates);
    for (name, value) in headers {
        out.push(0x00);
        put_string(&mut out, name);
        put_string(&mut out, value);
    }
    out
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

/// A decoded header field: name and value.
type Field = (Vec<u8>, Vec<u8>);

/// An HPACK decoder (RFC 7541) for one connection's client-to-server header blocks.
struct HpackDecoder {
    /// The dynamic table, newest entry first.
    table: VecDeque<Field>,
    /// The table's size by HPACK's measure (RFC 7541 section 4.1).
    size: usize,
    /// The size the client's last table size update allowed; 4096 to begin with, the
    /// HTTP/2 default of SETTINGS_HEADER_TABLE_SIZE.
    max_size: usize,
}

impl HpackDecoder {
    fn new() -> Self {
        Self {
            table: VecDeque::new(),
            size: 0,
            max_size: 4096,
        }
    }

    /// Decodes a whole header block: how many bytes of table size updates it starts with,
    /// and its fields. `None` for anything malformed or over [`MAX_DECODED_BYTES`]; the
    /// table may then be left part-updated, and the caller stops decoding.
    fn decode(&mut self, block: &[u8]) -> Option<(usize, Vec<Field>)> {
        let mut pos = 0;
        let mut fields = Vec::new();
        let mut list_size = 0usize;
        let mut size_updates = 0;
        while let Some(&first) = block.get(pos) {
            let field = if first & 0x80 != 0 {
                // Indexed field (section 6.1).
                let index = read_integer(block, &mut pos, 7)?;
                let (name, value) = self.entry(index)?;
                (name.to_vec(), value.to_vec())
            } else if first & 0x40 != 0 {
                // Literal with incremental indexing (section 6.2.1).
                let field = self.read_literal(block, &mut pos, 6)?;
                self.insert(field.clone());
                field
            } else if first & 0x20 != 0 {
                // Table size update (section 6.3): only before the first field, as h2
                // also requires.
                if !fields.is_empty() {
                    return None;
                }
                let size = read_integer(block, &mut pos, 5)?;
                if size > MAX_TABLE_SIZE {
                    return None;
                }
                self.max_size = size;
                self.evict(0);
                size_updates = pos;
                continue;
            } else {
                // Literal without indexing or never indexed (sections 6.2.2, 6.2.3).
                self.read_literal(block, &mut pos, 4)?
            };
            list_size = list_size.checked_add(field.0.len() + field.1.len() + 32)?;
            if list_size > MAX_DECODED_BYTES {
                return None;
            }
            fields.push(field);
        }
        Some((size_updates, fields))
    }

    /// A literal field whose name index has a `prefix`-bit prefix.
    fn read_literal(&self, block: &[u8], pos: &mut usize, prefix: u8) -> Option<Field> {
        let index = read_integer(block, pos, prefix)?;
        let name = if index == 0 {
            read_string(block, pos)?
        } else {
            self.entry(index)?.0.to_vec()
        };
        let value = read_string(block, pos)?;
        Some((name, value))
    }

    /// The field at a 1-based index into the static table followed by the dynamic one
    /// (section 2.3.3).
    fn entry(&self, index: usize) -> Option<(&[u8], &[u8])> {
        let index = index.checked_sub(1)?;
        match STATIC_TABLE.get(index) {
            Some(&(name, value)) => Some((name, value)),
            None => {
                let (name, value) = self.table.get(index - STATIC_TABLE.len())?;
                Some((name, value))
            }
        }
    }

    /// Adds a field to the dynamic table, evicting the oldest entries to make room
    /// (section 4.4); a field larger than the whole table empties it.
    fn insert(&mut self, field: Field) {
        let size = field.0.len() + field.1.len() + 32;
        self.evict(size);
        if size <= self.max_size {
            self.size += size;
            self.table.push_front(field);
        }
    }

    /// Evicts the oldest entries until `room` more bytes fit, or the table is empty.
    fn evict(&mut self, room: usize) {
        while self.size + room > self.max_size {
            let Some((name, value)) = self.table.pop_back() else {
                self.size = 0;
                return;
            };
            self.size -= name.len() + value.len() + 32;
        }
    }
}

/// Reads an HPACK integer with a `prefix`-bit prefix (RFC 7541 section 5.1) at `*pos`.
/// At most four continuation bytes are accepted, which keeps the value below 2^29.
fn read_integer(buf: &[u8], pos: &mut usize, prefix: u8) -> Option<usize> {
    let mask = (1usize << prefix) - 1;
    let first = usize::from(*buf.get(*pos)?) & mask;
    *pos += 1;
    if first < mask {
        return Some(first);
    }
    let mut value = mask;
    for shift in [0, 7, 14, 21] {
        let byte = *buf.get(*pos)?;
        *pos += 1;
        value += usize::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// Reads an HPACK string literal (RFC 7541 section 5.2) at `*pos`, Huffman-decoding it if
/// its H bit is set.
fn read_string(buf: &[u8], pos: &mut usize) -> Option<Vec<u8>> {
    let huffman = *buf.get(*pos)? & 0x80 != 0;
    let len = read_integer(buf, pos, 7)?;
    let end = pos.checked_add(len)?;
    let bytes = buf.get(*pos..end)?;
    *pos = end;
    if huffman {
        huffman_decode(bytes)
    } else {
        Some(bytes.to_vec())
    }
}

/// The static table (RFC 7541 Appendix A).
const STATIC_TABLE: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// The length in bits of each byte's code in HPACK's Huffman code (RFC 7541 Appendix B).
/// The code is canonical (codes ascend with length, then with the byte), so the lengths
/// define it; the end-of-string symbol takes the next code, thirty 1 bits.
const HUFFMAN_LENGTHS: [u8; 256] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, // 0..
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28, // 16..
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, // 32..
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, // 48..
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, // 64..
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, // 80..
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5, // 96..
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, // 112..
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23, // 128..
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, // 144..
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, // 160..
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23, // 176..
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, // 192..
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, // 208..
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23, // 224..
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, // 240..
];

const HUFFMAN_MAX_LEN: usize = 30;

/// The canonical code laid out for decoding: the codes of length `n` are
/// `first[n]..first[n] + count[n]`, standing for `symbols[offset[n]..][..count[n]]`.
struct HuffmanTable {
    first: [u32; HUFFMAN_MAX_LEN + 1],
    count: [u32; HUFFMAN_MAX_LEN + 1],
    offset: [usize; HUFFMAN_MAX_LEN + 1],
    symbols: [u8; 256],
}

fn huffman_table() -> &'static HuffmanTable {
    static TABLE: OnceLock<HuffmanTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = HuffmanTable {
            first: [0; HUFFMAN_MAX_LEN + 1],
            count: [0; HUFFMAN_MAX_LEN + 1],
            offset: [0; HUFFMAN_MAX_LEN + 1],
            symbols: [0; 256],
        };
        for &len in &HUFFMAN_LENGTHS {
            t.count[usize::from(len)] += 1;
        }
        let (mut code, mut at) = (0u32, 0usize);
        for len in 1..=HUFFMAN_MAX_LEN {
            t.first[len] = code;
            t.offset[len] = at;
            at += t.count[len] as usize;
            code = (code + t.count[len]) << 1;
        }
        let mut next = t.offset;
        for (symbol, &len) in (0..=255u8).zip(HUFFMAN_LENGTHS.iter()) {
            let len = usize::from(len);
            t.symbols[next[len]] = symbol;
            next[len] += 1;
        }
        t
    })
}

/// Decodes a Huffman-coded string (RFC 7541 section 5.2): `None` if it holds the
/// end-of-string symbol or a code that does not exist, or if its padding is longer than
/// 7 bits or not all 1 bits.
fn huffman_decode(src: &[u8]) -> Option<Vec<u8>> {
    let t = huffman_table();
    let mut out = Vec::with_capacity(src.len() * 8 / 5);
    let (mut code, mut len) = (0u32, 0usize);
    for &byte in src {
        for shift in (0..8).rev() {
            code = code << 1 | u32::from(byte >> shift & 1);
            len += 1;
            let index = code.wrapping_sub(t.first[len]);
            if code >= t.first[len] && index < t.count[len] {
                out.push(t.symbols[t.offset[len] + index as usize]);
                (code, len) = (0, 0);
            } else if len == HUFFMAN_MAX_LEN {
                return None;
            }
        }
    }
    (len <= 7 && code == (1 << len) - 1).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    use httlib_hpack::Encoder;
    use loona_hpack::Decoder;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

    #[test]
    fn static_table_matches_loona() {
        let mut dec = Decoder::new();
        for (i, &(name, value)) in STATIC_TABLE.iter().enumerate() {
            let got = dec.decode(&[0x80 | (i as u8 + 1)]).expect("static index");
            assert_eq!(
                got,
                vec![(name.to_vec(), value.to_vec())],
                "index {}",
                i + 1
            );
        }
    }

    #[test]
    fn huffman_matches_other_implementations() {
        let all: Vec<u8> = (0..=255).collect();
        // Every byte alone (so every code and its padding), and all of them in a row.
        for s in all
            .iter()
            .map(|&b| vec![b])
            .chain([all.clone(), Vec::new()])
        {
            let mut enc = Vec::new();
            httlib_huffman::encode(&s, &mut enc).expect("httlib encodes");
            assert_eq!(huffman_decode(&enc), Some(s.clone()));
            let loona = loona_hpack::huffman::HuffmanDecoder::new().decode(&enc);
            assert_eq!(loona.ok(), Some(s));
        }
        // Random strings, and random bytes taken as a code: both decoders agree on what
        // is valid and on what it says.
        let mut rng = XorShift(7);
        let mut loona = loona_hpack::huffman::HuffmanDecoder::new();
        let mut valid = 0;
        for round in 0..3000 {
            let len = rng.below(40);
            let s = rng.bytes(len, &all);
            if round % 2 == 0 {
                let mut enc = Vec::new();
                httlib_huffman::encode(&s, &mut enc).expect("httlib encodes");
                assert_eq!(huffman_decode(&enc), Some(s));
            } else {
                let ours = huffman_decode(&s);
                valid += usize::from(ours.is_some());
                assert_eq!(ours, loona.decode(&s).ok(), "input {s:02x?}");
            }
        }
        assert!(valid > 10, "random codes too rarely valid: {valid}");
    }

    #[test]
    fn hpack_decoder_matches_loona() {
        let mut rng = XorShift(11);
        let names: [&[u8]; 6] = [
            b":authority",
            b":path",
            b"content-type",
            b"x-a",
            b"x-b",
            b"te",
        ];
        let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789-_./:ABC\x00\xff";
        for _ in 0..40 {
            let mut enc = Encoder::default();
            let mut ours = HpackDecoder::new();
            let mut theirs = Decoder::new();
            for _ in 0..8 {
                let mut block = Vec::new();
                if rng.below(4) == 0 {
                    let size = [0u32, 64, 256, 4096][rng.below(4)];
                    enc.update_max_dynamic_size(size, &mut block)
                        .expect("size update");
                }
                let mut fields = Vec::new();
                for _ in 0..rng.below(12) {
                    let name = names[rng.below(names.len() as u64)].to_vec();
                    let cap = if rng.below(10) == 0 { 300 } else { 12 };
                    let len = rng.below(cap);
                    let value = rng.bytes(len, alphabet);
                    let flags = [0, 0x1, 0x2, 0x3, 0x4, 0x6, 0x7, 0x8, 0x14, 0x17][rng.below(10)];
                    enc.encode((name.clone(), value.clone(), flags), &mut block)
                        .expect("encodes");
                    fields.push((name, value));
                }
                if block.is_empty() {
                    continue;
                }
                let (_, got) = ours.decode(&block).expect("our decoder");
                assert_eq!(got, fields);
                // loona refuses a block of size updates alone, after applying them.
                match theirs.decode(&block) {
                    Ok(theirs) => assert_eq!(theirs, fields),
                    Err(e) => assert!(fields.is_empty(), "loona: {e:?}"),
                }
            }
        }
        // Random bytes: never a panic, and where both accept, the same fields.
        let mut agreed = 0;
        for _ in 0..5000 {
            let len = rng.below(24);
            let block = rng.bytes(len, &(0..=255).collect::<Vec<u8>>());
            let ours = HpackDecoder::new().decode(&block);
            if let (Some((_, a)), Ok(b)) = (&ours, Decoder::new().decode(&block)) {
                assert_eq!(a, &b);
                agreed += 1;
            }
        }
        assert!(agreed > 50, "only {agreed} random blocks valid");
    }

    #[test]
    fn hpack_decoder_limits() {
        // A field indexed into the table, then referenced 5000 times: 20 MB decoded from
        // 5 KB, refused past MAX_DECODED_BYTES.
        let mut block = vec![0x40, 0x03];
        block.extend_from_slice(b"x-a");
        put_integer(&mut block, 0x00, 7, 4000);
        block.extend(std::iter::repeat_n(b'v', 4000));
        block.extend(std::iter::repeat_n(0x80 | 62, 5000));
        assert_eq!(HpackDecoder::new().decode(&block), None);
        // A table size update above MAX_TABLE_SIZE, one after a field, an index past the
        // table, an integer too long, a string past the end.
        let mut big = Vec::new();
        put_integer(&mut big, 0x20, 5, MAX_TABLE_SIZE + 1);
        for bad in [
            &big[..],
            &[0x82, 0x20],
            &[0xbe],
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
            &[0x00, 0x05, b'a'],
        ] {
            assert_eq!(HpackDecoder::new().decode(bad), None, "{bad:02x?}");
        }
        // Size updates at the start are counted, and shrink the table.
        let mut dec = HpackDecoder::new();
        let (n, fields) = dec
            .decode(&[0x40, 1, b'a', 1, b'b', 0xbe])
            .expect("indexed");
        assert_eq!((n, fields.len()), (0, 2));
        assert_eq!(
            dec.decode(&[0x20, 0x3f, 0x01, 0x82]),
            Some((3, vec![h(":method", "GET")]))
        );
        assert_eq!(dec.decode(&[0xbe]), None, "the update emptied the table");
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
}
