//! HPACK (RFC 7541), as much as [`super::SchemeTolerant`] needs: a decoder for one
//! connection's client-to-server header blocks (static and dynamic tables, Huffman), and
//! an encoder that writes literals only, so the server's decoder table is never touched.
//!
//! Both are this file's own because no maintained crate does the job (checked November
//! 2026; times from a release build on the project's 2-core machine):
//!
//! - h2, whose decoder the server runs anyway, keeps its `hpack` module private, even
//!   with its `unstable` feature (0.4.20, `src/lib.rs`).
//! - loona-hpack 0.4.3 (last release 2024-11, from a repository that calls itself
//!   experimental; descended from the hpack crate) builds its Huffman tables, hash maps
//!   of 257 codes (24 µs), anew for every Huffman-coded string: it took 154 µs for
//!   etcdctl's request block (1.5 µs here), and 1.9 s for a 256 KiB block of one-byte
//!   Huffman literals (3.4 ms here, which stops at [`MAX_DECODED_BYTES`]). That time
//!   would be spent inside `poll_read`, on a runtime thread, and its per-field callback
//!   cannot stop a block midway, so [`MAX_DECODED_BYTES`] could bound memory but not
//!   time. Its `HuffmanDecoder` kept for a connection is still 6 to 40 times slower than
//!   the code here (a hash lookup per bit). It takes a table size update after a field,
//!   which RFC 7541 section 4.2 and h2 refuse, and does not say how many bytes the
//!   leading updates took, which the re-encoded block must carry. Its encoder adds every
//!   new literal to the table.
//! - httlib-hpack 0.1.3 and httlib-huffman 0.3.4 (last releases 2020-11): the decoder
//!   drains each field from the front of its input `Vec`, 508 ms for a 256 KiB block of
//!   one-byte indexed fields; the Huffman decoder accepts padding that is not a prefix of
//!   the end-of-string code (`[0x00]` decodes to `0`), an error by RFC 7541 section 5.2;
//!   and the decoder too takes a size update after a field. Its encoder can write what
//!   [`encode_block`] writes (the tests compare them), which is not worth a dependency
//!   on an unmaintained crate for thirty lines.
//!
//! The tests check this decoder against both crates, and pin their behaviour named here.

use std::collections::VecDeque;
use std::sync::OnceLock;

use super::{MAX_DECODED_BYTES, MAX_TABLE_SIZE};

/// Appends an HPACK integer (RFC 7541 section 5.1): `value` with a `prefix`-bit prefix,
/// the first byte's other bits set to `high`.
pub(super) fn put_integer(out: &mut Vec<u8>, high: u8, prefix: u8, value: usize) {
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
pub(super) fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    put_integer(out, 0x00, 7, s.len());
    out.extend_from_slice(s);
}

/// A header block holding `size_updates` and then every header as a literal without
/// indexing with a literal name (RFC 7541 section 6.2.2), which leaves the server's
/// dynamic table untouched.
pub(super) fn encode_block(size_updates: &[u8], headers: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
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

/// A decoded header field: name and value.
pub(super) type Field = (Vec<u8>, Vec<u8>);

/// An HPACK decoder (RFC 7541) for one connection's client-to-server header blocks.
pub(super) struct HpackDecoder {
    /// The dynamic table, newest entry first.
    table: VecDeque<Field>,
    /// The table's size by HPACK's measure (RFC 7541 section 4.1).
    size: usize,
    /// The size the client's last table size update allowed; 4096 to begin with, the
    /// HTTP/2 default of SETTINGS_HEADER_TABLE_SIZE.
    max_size: usize,
}

impl HpackDecoder {
    pub(super) fn new() -> Self {
        Self {
            table: VecDeque::new(),
            size: 0,
            max_size: 4096,
        }
    }

    /// Decodes a whole header block: how many bytes of table size updates it starts with,
    /// and its fields. `None` for anything malformed or over [`MAX_DECODED_BYTES`]; the
    /// table may then be left part-updated, and the caller stops decoding.
    pub(super) fn decode(&mut self, block: &[u8]) -> Option<(usize, Vec<Field>)> {
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
    pub(super) fn read_literal(&self, block: &[u8], pos: &mut usize, prefix: u8) -> Option<Field> {
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
    pub(super) fn entry(&self, index: usize) -> Option<(&[u8], &[u8])> {
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
    pub(super) fn insert(&mut self, field: Field) {
        let size = field.0.len() + field.1.len() + 32;
        self.evict(size);
        if size <= self.max_size {
            self.size += size;
            self.table.push_front(field);
        }
    }

    /// Evicts the oldest entries until `room` more bytes fit, or the table is empty.
    pub(super) fn evict(&mut self, room: usize) {
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
pub(super) fn read_integer(buf: &[u8], pos: &mut usize, prefix: u8) -> Option<usize> {
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
pub(super) fn read_string(buf: &[u8], pos: &mut usize) -> Option<Vec<u8>> {
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
pub(super) const STATIC_TABLE: [(&[u8], &[u8]); 61] = [
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
pub(super) const HUFFMAN_LENGTHS: [u8; 256] = [
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

pub(super) const HUFFMAN_MAX_LEN: usize = 30;

/// The canonical code laid out for decoding: the codes of length `n` are
/// `first[n]..first[n] + count[n]`, standing for `symbols[offset[n]..][..count[n]]`.
pub(super) struct HuffmanTable {
    first: [u32; HUFFMAN_MAX_LEN + 1],
    count: [u32; HUFFMAN_MAX_LEN + 1],
    offset: [usize; HUFFMAN_MAX_LEN + 1],
    symbols: [u8; 256],
}

pub(super) fn huffman_table() -> &'static HuffmanTable {
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
pub(super) fn huffman_decode(src: &[u8]) -> Option<Vec<u8>> {
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
