//! On-disk layout of a log segment: the file header, the record frame, and the
//! payloads carried by non-entry records.
//!
//! A segment file is
//!
//! ```text
//! file header (32 bytes)
//!   0  8  magic  "OKVSEG01"
//!   8  8  segment id (u64 LE, equals the number in the file name)
//!  16  8  first batch: the group-commit batch number current when the file was created
//!  24  4  format version (u32 LE)
//!  28  4  crc32 of bytes 0..28
//! record*
//!   0  4  magic "OKVR"
//!   4  4  payload length (u32 LE)
//!   8  8  batch number (u64 LE): one per fdatasync, strictly increasing over the whole log
//!  16  1  kind (see [`Kind`])
//!  17  1  flags: bit 0 = last record of its batch
//!  18  4  crc32 of the payload
//!  22  4  crc32 of header bytes 0..22 (so the length is covered, and through the payload
//!         crc the whole record)
//!  26  …  payload (postcard)
//! ```
//!
//! The header has its own checksum so that a damaged payload still tells where the next
//! record starts and which batch it belonged to, and so that scanning for a valid record
//! after damage costs one small crc per candidate offset.

use openraft::{LogId, NodeId, Vote};
use serde::{Deserialize, Serialize};

/// Magic bytes at the start of every segment file.
pub(super) const FILE_MAGIC: &[u8; 8] = b"OKVSEG01";
/// Format version written into every segment header.
pub(super) const FORMAT_VERSION: u32 = 1;
/// Length of the segment file header.
pub(super) const FILE_HEADER_LEN: usize = 32;
/// Magic bytes at the start of every record.
pub(super) const RECORD_MAGIC: &[u8; 4] = b"OKVR";
/// Length of a record header; the payload follows it.
pub(super) const RECORD_HEADER_LEN: usize = 26;
/// Flag bit: this record is the last one of its group-commit batch.
pub(super) const FLAG_LAST_IN_BATCH: u8 = 1;

/// What a record's payload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// [`MetaRecord`]: vote, committed and purged ids; first record of every segment.
    Meta = 1,
    /// One postcard-encoded `C::Entry`.
    Entry = 2,
    /// A `Vote`.
    Vote = 3,
    /// An `Option<LogId>`: the committed log id.
    Committed = 4,
    /// A `LogId`: every entry up to and including its index is purged.
    Purge = 5,
    /// A `u64`: every entry with this index or above is removed (conflict truncation).
    Truncate = 6,
}

impl Kind {
    pub(super) fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Meta,
            2 => Kind::Entry,
            3 => Kind::Vote,
            4 => Kind::Committed,
            5 => Kind::Purge,
            6 => Kind::Truncate,
            _ => return None,
        })
    }
}

/// The durable small state, written as the first record of every segment so that deleting
/// older segments never loses the vote, the committed id or the purge point.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(bound = "")]
pub(super) struct MetaRecord<NID: NodeId> {
    pub(super) vote: Option<Vote<NID>>,
    pub(super) committed: Option<LogId<NID>>,
    pub(super) purged: Option<LogId<NID>>,
}

/// The segment file header, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileHeader {
    pub(super) segment: u64,
    pub(super) first_batch: u64,
}

impl FileHeader {
    pub(super) fn encode(&self) -> [u8; FILE_HEADER_LEN] {
        let mut b = [0u8; FILE_HEADER_LEN];
        b[0..8].copy_from_slice(FILE_MAGIC);
        b[8..16].copy_from_slice(&self.segment.to_le_bytes());
        b[16..24].copy_from_slice(&self.first_batch.to_le_bytes());
        b[24..28].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        let crc = crc32fast::hash(&b[0..28]);
        b[28..32].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes a file header; `Err` names what is wrong with it.
    pub(super) fn decode(buf: &[u8]) -> Result<FileHeader, &'static str> {
        if buf.len() < FILE_HEADER_LEN {
            return Err("file shorter than its header");
        }
        if &buf[0..8] != FILE_MAGIC {
            return Err("bad segment magic");
        }
        if crc32fast::hash(&buf[0..28]) != u32_at(buf, 28) {
            return Err("segment header checksum mismatch");
        }
        if u32_at(buf, 24) != FORMAT_VERSION {
            return Err("unsupported segment format version");
        }
        Ok(FileHeader {
            segment: u64_at(buf, 8),
            first_batch: u64_at(buf, 16),
        })
    }
}

/// A record header, decoded and checksum-verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RecordHeader {
    pub(super) len: u32,
    pub(super) batch: u64,
    pub(super) kind: u8,
    pub(super) flags: u8,
    pub(super) payload_crc: u32,
}

impl RecordHeader {
    /// Appends the header bytes to `out`.
    pub(super) fn encode_into(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(RECORD_MAGIC);
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.batch.to_le_bytes());
        out.push(self.kind);
        out.push(self.flags);
        out.extend_from_slice(&self.payload_crc.to_le_bytes());
        let crc = crc32fast::hash(&out[start..start + 22]);
        out.extend_from_slice(&crc.to_le_bytes());
    }

    pub(super) fn last_in_batch(&self) -> bool {
        self.flags & FLAG_LAST_IN_BATCH != 0
    }
}

/// One record found in a segment buffer.
#[derive(Debug, Clone, Copy)]
pub(super) struct Found<'a> {
    pub(super) offset: usize,
    pub(super) header: RecordHeader,
    pub(super) payload: &'a [u8],
}

impl Found<'_> {
    /// Offset just past this record.
    pub(super) fn end(&self) -> usize {
        self.offset + RECORD_HEADER_LEN + self.payload.len()
    }
}

/// Why the record at some offset is not valid.
#[derive(Debug, Clone, Copy)]
pub(super) struct Damage {
    pub(super) reason: &'static str,
    /// The header, when the header itself checked out (then only the payload is bad).
    pub(super) header: Option<RecordHeader>,
}

/// Parses the record at `pos`. `Ok(None)` means `pos` is exactly the end of `buf`.
pub(super) fn parse_record(buf: &[u8], pos: usize) -> Result<Option<Found<'_>>, Damage> {
    let rest = buf.len().saturating_sub(pos);
    if rest == 0 {
        return Ok(None);
    }
    let damage = |reason, header| Damage { reason, header };
    if rest < RECORD_HEADER_LEN {
        return Err(damage("record header cut short by end of file", None));
    }
    let h = &buf[pos..pos + RECORD_HEADER_LEN];
    if &h[0..4] != RECORD_MAGIC {
        return Err(damage("bad record magic", None));
    }
    if crc32fast::hash(&h[0..22]) != u32_at(h, 22) {
        return Err(damage("record header checksum mismatch", None));
    }
    let header = RecordHeader {
        len: u32_at(h, 4),
        batch: u64_at(h, 8),
        kind: h[16],
        flags: h[17],
        payload_crc: u32_at(h, 18),
    };
    let start = pos + RECORD_HEADER_LEN;
    let end = start + header.len as usize;
    if end > buf.len() {
        return Err(damage(
            "record payload cut short by end of file",
            Some(header),
        ));
    }
    let payload = &buf[start..end];
    if crc32fast::hash(payload) != header.payload_crc {
        return Err(damage("record payload checksum mismatch", Some(header)));
    }
    Ok(Some(Found {
        offset: pos,
        header,
        payload,
    }))
}

/// Finds the first valid record starting after `from` whose batch is greater than
/// `batch`, skipping over damaged bytes. Used only on the error path: a hit proves that
/// the damage at `from` was already covered by an fdatasync (see `recovery`).
pub(super) fn find_later_batch(buf: &[u8], from: usize, batch: u64) -> Option<Found<'_>> {
    let mut pos = from;
    while pos < buf.len() {
        let candidate = buf[pos..]
            .windows(RECORD_MAGIC.len())
            .position(|w| w == RECORD_MAGIC)?;
        let at = pos + candidate;
        match parse_record(buf, at) {
            Ok(Some(found)) if found.header.batch > batch => return Some(found),
            Ok(Some(found)) => pos = found.end(),
            Ok(None) | Err(_) => pos = at + 1,
        }
    }
    None
}

/// crc32 of a payload, as stored in its record header.
pub(super) fn payload_crc(payload: &[u8]) -> u32 {
    crc32fast::hash(payload)
}

fn u32_at(buf: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&buf[at..at + 4]);
    u32::from_le_bytes(b)
}

fn u64_at(buf: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(b)
}

/// Present in the log directory only while the log is closed cleanly: written by the
/// writer after the fdatasync of everything queued before a clean close, and removed
/// (with a directory fsync) before anything else is written to the log. So when it is
/// found at open, every record the last process queued is on disk.
pub(super) const CLEAN_STOP_FILE: &str = "clean-stop";

/// File name of segment `id`: zero-padded so that names sort like ids.
pub(super) fn segment_file_name(id: u64) -> String {
    format!("{id:020}.seg")
}

/// Parses a segment file name back into its id.
pub(super) fn parse_segment_file_name(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(".seg")?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    // A record survives encode → parse, and any single flipped bit is detected.
    #[test]
    fn record_round_trips_and_detects_every_flipped_bit() {
        let payload = b"hello raft".to_vec();
        let header = RecordHeader {
            len: payload.len() as u32,
            batch: 7,
            kind: Kind::Entry as u8,
            flags: FLAG_LAST_IN_BATCH,
            payload_crc: payload_crc(&payload),
        };
        let mut buf = Vec::new();
        header.encode_into(&mut buf);
        buf.extend_from_slice(&payload);
        let found = parse_record(&buf, 0)
            .ok()
            .flatten()
            .map(|f| (f.header, f.payload.to_vec()));
        assert_eq!(found, Some((header, payload)));
        for bit in 0..buf.len() * 8 {
            let mut bad = buf.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(
                parse_record(&bad, 0).is_err(),
                "flip of bit {bit} went unnoticed"
            );
        }
    }

    // Segment names sort like their ids, which recovery relies on.
    #[test]
    fn segment_names_round_trip() {
        assert_eq!(parse_segment_file_name(&segment_file_name(42)), Some(42));
        assert_eq!(parse_segment_file_name("42.seg"), None);
        assert_eq!(parse_segment_file_name("00000000000000000042.tmp"), None);
    }
}
