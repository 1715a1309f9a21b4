//! The snapshot file's format: magic, CRC-32 of the body, then postcard's encoding of
//! raft's metadata and the state machine image. Kept apart from the store so the format
//! can be read, and tested, without openraft's storage traits around it; backups read and
//! write the same files through it.

use std::io::Read;
use std::path::Path;

use oncekv_core::{SnapshotView, StateMachine};
use openraft::storage::SnapshotMeta;
use serde::{Deserialize, Serialize};

use crate::disk::{AppendFile, Disk, ReadFrom};
use crate::types::{Member, NodeId};

const SNAPSHOT_MAGIC: &[u8; 4] = b"OKVS";

/// The snapshot file's content: raft's metadata and the state machine image.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct SnapshotFile {
    pub(crate) meta: SnapshotMeta<NodeId, Member>,
    pub(crate) data: Vec<u8>,
}

impl SnapshotFile {
    /// [`decode_snapshot_file`] of `bytes`, reusing their buffer for the image.
    pub(crate) fn from_file_bytes(mut bytes: Vec<u8>) -> Result<SnapshotFile, String> {
        let (meta, image) = decode_snapshot_parts(&bytes)?;
        bytes.truncate(image.end);
        bytes.drain(..image.start);
        Ok(SnapshotFile { meta, data: bytes })
    }
}

/// The snapshot file's bytes: magic, CRC-32 of the body, the body (postcard of a
/// [`SnapshotFile`]).
pub(crate) fn encode_snapshot_file(
    meta: &SnapshotMeta<NodeId, Member>,
    data: &[u8],
) -> Result<Vec<u8>, String> {
    let head = snapshot_file_head(meta, &Image::Bytes(data))?;
    let mut bytes = Vec::with_capacity(head.len() + data.len());
    bytes.extend_from_slice(&head);
    bytes.extend_from_slice(data);
    Ok(bytes)
}

/// The state machine image a snapshot file holds: encoded already (one received from the
/// leader), or the state itself, encoded as it is written.
pub(super) enum Image<'a> {
    Bytes(&'a [u8]),
    View(&'a SnapshotView<'a>, usize),
}

impl Image<'_> {
    pub(super) fn len(&self) -> usize {
        match self {
            Image::Bytes(b) => b.len(),
            Image::View(_, len) => *len,
        }
    }

    fn checksum_into(&self, crc: &mut crc32fast::Hasher) -> Result<(), String> {
        match self {
            Image::Bytes(b) => crc.update(b),
            Image::View(view, _) => {
                postcard::serialize_with_flavor(*view, Checksum(crc)).map_err(|e| e.to_string())?
            }
        }
        Ok(())
    }

    pub(super) fn write_to(&self, file: &mut dyn AppendFile) -> std::io::Result<()> {
        let file = &mut Paced { file, unsynced: 0 };
        match self {
            Image::Bytes(b) => b.chunks(WRITE_BUFFER).try_for_each(|c| file.write_all(c)),
            Image::View(view, _) => {
                let mut failed = None;
                let out = ToFile {
                    file,
                    buf: Vec::with_capacity(WRITE_BUFFER),
                    failed: &mut failed,
                };
                match postcard::serialize_with_flavor(*view, out) {
                    Ok(()) => Ok(()),
                    Err(e) => Err(failed.unwrap_or_else(|| std::io::Error::other(e))),
                }
            }
        }
    }
}

/// How much of a snapshot is written before it is made durable, and the next written.
///
/// Written whole and synced once, a large image sat in the page cache (the kernel starts
/// writing back only at a tenth of memory) and its one `fdatasync` flushed hundreds of MB
/// at once: every log append's `fdatasync` behind it waited seconds, puts stalled and
/// peers' appends timed out. Synced every few MB, a log append waits at most for one
/// such flush (RocksDB's `bytes_per_sync` does the same for its files).
const SYNC_EVERY: usize = 8 << 20;

/// A file that is synced after every [`SYNC_EVERY`] bytes written to it.
struct Paced<'a> {
    file: &'a mut dyn AppendFile,
    unsynced: usize,
}

impl AppendFile for Paced<'_> {
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.file.write_all(buf)?;
        self.unsynced += buf.len();
        if self.unsynced >= SYNC_EVERY {
            self.sync_data()?;
        }
        Ok(())
    }

    fn sync_data(&mut self) -> std::io::Result<()> {
        self.unsynced = 0;
        self.file.sync_data()
    }
}

/// Feeds an encoding to a CRC-32 instead of keeping it.
struct Checksum<'a>(&'a mut crc32fast::Hasher);

impl postcard::ser_flavors::Flavor for Checksum<'_> {
    type Output = ();

    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.0.update(&[byte]);
        Ok(())
    }

    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        self.0.update(bytes);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// How much of an image is gathered before it is written to the file.
const WRITE_BUFFER: usize = 1 << 20;

/// Writes an encoding to a file through a buffer of [`WRITE_BUFFER`] bytes; a failed
/// write stops the encoding and is kept in `failed`.
struct ToFile<'a> {
    file: &'a mut dyn AppendFile,
    buf: Vec<u8>,
    failed: &'a mut Option<std::io::Error>,
}

impl ToFile<'_> {
    fn flush(&mut self) -> postcard::Result<()> {
        if let Err(e) = self.file.write_all(&self.buf) {
            *self.failed = Some(e);
            return Err(postcard::Error::SerializeBufferFull);
        }
        self.buf.clear();
        Ok(())
    }
}

impl postcard::ser_flavors::Flavor for ToFile<'_> {
    type Output = ();

    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        if self.buf.len() == WRITE_BUFFER {
            self.flush()?;
        }
        self.buf.push(byte);
        Ok(())
    }

    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        if self.buf.len() + bytes.len() > WRITE_BUFFER {
            self.flush()?;
        }
        if bytes.len() >= WRITE_BUFFER {
            if let Err(e) = self.file.write_all(bytes) {
                *self.failed = Some(e);
                return Err(postcard::Error::SerializeBufferFull);
            }
        } else {
            self.buf.extend_from_slice(bytes);
        }
        Ok(())
    }

    fn finalize(mut self) -> postcard::Result<()> {
        self.flush()
    }
}

/// The snapshot file up to the image, which follows it: the image is never copied into
/// a file buffer of its own (hundreds of MB with a long history). postcard encodes a byte
/// vector as its length and then its bytes, so the metadata and the image's length, then
/// the image, are exactly the [`SnapshotFile`] they decode to.
pub(super) fn snapshot_file_head(
    meta: &SnapshotMeta<NodeId, Member>,
    image: &Image,
) -> Result<Vec<u8>, String> {
    let fields = oncekv_core::encoding::encode(&(meta, image.len())).map_err(|e| e.to_string())?;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&fields);
    image.checksum_into(&mut crc)?;
    let mut head = Vec::with_capacity(SNAPSHOT_MAGIC.len() + 4 + fields.len());
    head.extend_from_slice(SNAPSHOT_MAGIC);
    head.extend_from_slice(&crc.finalize().to_le_bytes());
    head.extend_from_slice(&fields);
    Ok(head)
}

pub(crate) fn decode_snapshot_file(bytes: &[u8]) -> Result<SnapshotFile, String> {
    let (meta, image) = decode_snapshot_parts(bytes)?;
    Ok(SnapshotFile {
        meta,
        data: bytes[image].to_vec(),
    })
}

/// The metadata of the snapshot file `bytes`, and where in them its image is.
fn decode_snapshot_parts(
    bytes: &[u8],
) -> Result<(SnapshotMeta<NodeId, Member>, std::ops::Range<usize>), String> {
    let rest = bytes
        .strip_prefix(SNAPSHOT_MAGIC)
        .ok_or("not an oncekv snapshot file")?;
    if rest.len() < 4 {
        return Err("truncated snapshot file".into());
    }
    let (crc, body) = rest.split_at(4);
    let want = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    if crc32fast::hash(body) != want {
        return Err("checksum mismatch (corrupt snapshot file)".into());
    }
    // The image is taken whole from what follows its length (decoding it as a sequence
    // of bytes would go a byte at a time).
    let ((meta, len), image): ((SnapshotMeta<NodeId, Member>, usize), _) =
        postcard::take_from_bytes(body).map_err(|e| format!("undecodable snapshot file: {e}"))?;
    if image.len() < len {
        return Err("truncated snapshot file (the image is cut short)".into());
    }
    let start = bytes.len() - image.len();
    Ok((meta, start..start + len))
}

/// A snapshot file read back: its metadata, the state, and the file's size.
pub(crate) struct Loaded {
    pub(crate) meta: SnapshotMeta<NodeId, Member>,
    pub(crate) sm: StateMachine,
    pub(crate) bytes: u64,
}

/// How much of a snapshot file is read at a time when it is checked.
const READ_CHUNK: usize = 8 << 20;

/// The snapshot file at `path` decoded, `None` if there is none: checked whole (magic,
/// CRC-32) in a first pass, then decoded as it is read in a second, so that the file
/// is never in memory whole next to the state decoded from it (a restarted member held
/// both, twice its settled memory; see `StateMachine::restore_from`). The second pass
/// reads from the page cache the first one filled.
pub(crate) fn load_snapshot_file(disk: &dyn Disk, path: &Path) -> Result<Option<Loaded>, String> {
    let file = match disk.open_read(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("reading it: {e}")),
    };
    let read_err = |e: std::io::Error| format!("reading it: {e}");
    let len = file.size().map_err(read_err)?;
    let body = (SNAPSHOT_MAGIC.len() + 4) as u64;
    if len < body {
        return Err("truncated snapshot file".into());
    }
    let mut head = [0u8; 8];
    file.read_exact_at(&mut head, 0).map_err(read_err)?;
    if head[..4] != SNAPSHOT_MAGIC[..] {
        return Err("not an oncekv snapshot file".into());
    }
    let want = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    let mut crc = crc32fast::Hasher::new();
    let mut chunk = vec![0u8; READ_CHUNK];
    let mut body_reader = ReadFrom {
        file: &*file,
        pos: body,
        end: len,
    };
    loop {
        let n = body_reader.read(&mut chunk).map_err(read_err)?;
        if n == 0 {
            break;
        }
        crc.update(&chunk[..n]);
    }
    drop(chunk);
    if crc.finalize() != want {
        return Err("checksum mismatch (corrupt snapshot file)".into());
    }
    // The metadata is small (membership, log ids): a first piece of the body holds it.
    let mut first = vec![0u8; (len - body).min(1 << 20) as usize];
    file.read_exact_at(&mut first, body).map_err(read_err)?;
    let ((meta, image_len), rest): ((SnapshotMeta<NodeId, Member>, usize), _) =
        postcard::take_from_bytes(&first).map_err(|e| format!("undecodable snapshot file: {e}"))?;
    let start = body + (first.len() - rest.len()) as u64;
    let end = start + image_len as u64;
    if end > len {
        return Err("truncated snapshot file (the image is cut short)".into());
    }
    drop(first);
    let sm = StateMachine::restore_from(ReadFrom {
        file: &*file,
        pos: start,
        end,
    })
    .map_err(|e| e.to_string())?;
    Ok(Some(Loaded {
        meta,
        sm,
        bytes: len,
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::types::LogId;
    use oncekv_core::StateMachine;
    use openraft::StoredMembership;

    /// The file is written in two parts (the head, then the image as it is); its bytes are
    /// still postcard's encoding of the whole [`SnapshotFile`], so files written before
    /// and after read alike.
    #[test]
    fn the_snapshot_file_is_the_encoding_of_the_whole_record() {
        let meta = SnapshotMeta {
            last_log_id: Some(LogId::new(openraft::CommittedLeaderId::new(3, 1), 42)),
            last_membership: StoredMembership::default(),
            snapshot_id: "3-1-42".into(),
        };
        for len in [0usize, 1, 127, 128, 300_000] {
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let file = encode_snapshot_file(&meta, &data).unwrap();
            let whole = postcard::to_allocvec(&SnapshotFile {
                meta: meta.clone(),
                data: data.clone(),
            })
            .unwrap();
            assert_eq!(file[..4], SNAPSHOT_MAGIC[..]);
            assert_eq!(file[4..8], crc32fast::hash(&whole).to_le_bytes());
            assert_eq!(file[8..], whole[..], "len {len}");
            let back = decode_snapshot_file(&file).unwrap();
            assert_eq!((back.meta, back.data), (meta.clone(), data.clone()));
            let in_place = SnapshotFile::from_file_bytes(file).unwrap();
            assert_eq!((in_place.meta, in_place.data), (meta.clone(), data));
        }
        // An image cut short is refused, not read as a shorter one.
        let mut file = encode_snapshot_file(&meta, &[9u8; 1000]).unwrap();
        file.truncate(file.len() - 10);
        let body = file[8..].to_vec();
        file[4..8].copy_from_slice(&crc32fast::hash(&body).to_le_bytes());
        assert!(
            decode_snapshot_file(&file)
                .unwrap_err()
                .contains("truncated")
        );
    }

    /// A file read back in two passes gives the state written, and a damaged, cut or
    /// missing file is told apart.
    #[test]
    fn a_snapshot_file_is_loaded_as_it_is_read_and_damage_is_refused() {
        use oncekv_core::{Command, LogPayload, Op, Settings};
        let mut sm = StateMachine::new(Settings::default());
        for i in 0..200u64 {
            let op = Op::put(format!("k{}", i % 30), vec![i as u8; 100 + i as usize]);
            let entry = LogPayload {
                cluster_time: 1_000,
                commands: vec![Command::Untracked(op)],
            };
            sm.apply(i + 1, &entry);
        }
        let image = sm.snapshot().unwrap();
        let meta = SnapshotMeta {
            last_log_id: Some(LogId::new(openraft::CommittedLeaderId::new(2, 1), 200)),
            last_membership: StoredMembership::default(),
            snapshot_id: "2-1-200".into(),
        };
        let file = encode_snapshot_file(&meta, &image).unwrap();
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("snapshot.bin");
        let disk = crate::disk::OsDisk;
        assert!(load_snapshot_file(&disk, &path).unwrap().is_none());

        std::fs::write(&path, &file).unwrap();
        let loaded = load_snapshot_file(&disk, &path).unwrap().unwrap();
        assert_eq!(loaded.meta, meta);
        assert_eq!(loaded.bytes, file.len() as u64);
        assert_eq!(loaded.sm.snapshot().unwrap(), image);

        let mut damaged = file.clone();
        let at = damaged.len() / 2;
        damaged[at] ^= 0x40;
        std::fs::write(&path, &damaged).unwrap();
        let refused = load_snapshot_file(&disk, &path).err().unwrap();
        assert!(refused.contains("checksum mismatch"), "{refused}");

        std::fs::write(&path, &file[..file.len() - 3]).unwrap();
        assert!(load_snapshot_file(&disk, &path).is_err());
        std::fs::write(&path, &file[..5]).unwrap();
        let refused = load_snapshot_file(&disk, &path).err().unwrap();
        assert!(refused.contains("truncated"), "{refused}");
    }

    /// A file that keeps what is written, or fails once it would hold over `limit` bytes.
    struct MemFile {
        bytes: Vec<u8>,
        limit: usize,
    }

    impl AppendFile for MemFile {
        fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
            if self.bytes.len() + buf.len() > self.limit {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::StorageFull,
                    "no space left on device",
                ));
            }
            self.bytes.extend_from_slice(buf);
            Ok(())
        }

        fn sync_data(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The state written as it is encoded gives the same file as its encoded image, and a
    /// failed write is reported as the disk's error.
    #[test]
    fn a_state_written_as_it_is_encoded_is_the_file_of_its_image() {
        use oncekv_core::{Command, LogPayload, Op, PutRequest, Settings};
        let mut sm = StateMachine::new(Settings::default());
        // Values over the write buffer's size too, which go around it.
        for (i, len) in [10usize, 3 << 20, 1000, WRITE_BUFFER, 5]
            .into_iter()
            .enumerate()
        {
            let put = PutRequest {
                key: format!("k{i}").into_bytes().into(),
                value: vec![i as u8; len].into(),
                ..PutRequest::default()
            };
            let entry = LogPayload {
                cluster_time: 1_000 + i as u64,
                commands: vec![Command::Untracked(Op::Put(put))],
            };
            sm.apply(i as u64 + 1, &entry);
        }
        let meta = SnapshotMeta::default();
        let whole = encode_snapshot_file(&meta, &sm.snapshot().unwrap()).unwrap();
        let view = sm.snapshot_view();
        let len = postcard::experimental::serialized_size(&view).unwrap();
        let image = Image::View(&view, len);
        let mut file = MemFile {
            bytes: snapshot_file_head(&meta, &image).unwrap(),
            limit: usize::MAX,
        };
        image.write_to(&mut file).unwrap();
        assert_eq!(file.bytes.len(), whole.len());
        assert!(file.bytes == whole, "the same bytes");
        let mut full = MemFile {
            bytes: Vec::new(),
            limit: 2 << 20,
        };
        let err = image.write_to(&mut full).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::StorageFull);
    }
}
