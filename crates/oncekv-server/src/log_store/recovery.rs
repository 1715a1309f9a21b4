//! Opening a log directory: replay every segment, cut a torn tail, refuse real damage.
//!
//! # Torn tail or corruption?
//!
//! The writer never starts writing batch `b + 1` before the `fdatasync` of batch `b`
//! returned, and it seals (fdatasyncs) a segment before creating the next one. So after a
//! crash only the last batch of the newest segment can be partly on disk; everything
//! older was durable and must read back intact. Every record carries its batch number, and
//! the last record of each batch is flagged. When a record fails its checks:
//!
//! * in a segment that is not the newest → **corruption** (`Err` from open);
//! * otherwise the damaged record belongs to batch `B` (read from its header when the
//!   header's own checksum holds, else the batch of the previous record, plus one if that
//!   record closed its batch, else the segment's first batch). If any valid record of a
//!   batch later than `B` follows anywhere in the file → **corruption**: batch `B` had
//!   been fdatasync'd, so this is not a torn write. If none follows → **torn tail**: the
//!   file is cut at the damaged record (`tracing::warn!`) and the node opens with what
//!   precedes it. Those records were never acknowledged.
//!
//! The one case this cannot catch is damage confined to the very last batch after it was
//! acknowledged: that is indistinguishable from a torn write, and is treated as one.
//! Raft tolerates it only because the entries are also on a majority of peers.
//!
//! Every open then starts a fresh segment, so a segment is only ever written by one
//! process lifetime and the rule above never sees a cut tail followed by newer batches.
//!
//! Zeros from a record boundary to the end of the newest segment are the space the writer
//! reserved and had not reached: they are cut off quietly, not reported as a torn tail.
//! An older segment never has them (the writer cuts a segment to its written length
//! before it starts the next), so there they are damage like any other.

use std::path::{Path, PathBuf};

use openraft::{LogId, RaftLogId, RaftTypeConfig, Vote};
use serde::de::DeserializeOwned;

use super::LogError;
use super::format::{
    CLEAN_STOP_FILE, FILE_HEADER_LEN, FileHeader, Found, Kind, MetaRecord, RECORD_HEADER_LEN,
    find_later_batch, parse_record, parse_segment_file_name, segment_file_name,
};
use super::state::{Slot, State};
use crate::disk::Disk;

/// What recovery hands to the store.
#[derive(Debug)]
pub(super) struct Recovered<C: RaftTypeConfig> {
    pub(super) state: State<C::NodeId>,
    /// Number for the next group-commit batch: above every batch found on disk.
    pub(super) next_batch: u64,
    /// The torn tail cut off the newest segment, if there was one.
    pub(super) torn_tail: Option<TornTail>,
    /// The clean-stop marker was there and the log read back whole (nothing cut but the
    /// reserved zeros): every record the last process wrote is here.
    pub(super) clean_stop: bool,
}

/// A torn tail that recovery cut off (unacknowledged writes of a crash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    pub path: std::path::PathBuf,
    /// Where the segment now ends.
    pub offset: u64,
    pub dropped_bytes: u64,
    pub reason: String,
}

/// Replays the log in `dir` (creating `dir` if missing). Blocking.
pub(super) fn recover<C: RaftTypeConfig>(
    disk: &dyn Disk,
    dir: &Path,
    segment_limit: u64,
    cache_limit: usize,
) -> Result<Recovered<C>, LogError> {
    disk.create_dir_all(dir)
        .map_err(|e| LogError::io("create directory", dir, e))?;
    let names = disk
        .list_dir(dir)
        .map_err(|e| LogError::io("list", dir, e))?;
    let marked = names.iter().any(|n| n == CLEAN_STOP_FILE);
    if marked {
        // Consumed before anything here changes the log: were this open to cut a damaged
        // tail and the process to die before it writes, the next open must not find the
        // mark beside a log that lost records.
        let path = dir.join(CLEAN_STOP_FILE);
        disk.remove_file(&path)
            .map_err(|e| LogError::io("remove", &path, e))?;
        disk.sync_dir(dir)
            .map_err(|e| LogError::io("fsync directory", dir, e))?;
    }
    let ids = segment_ids(&names);
    let mut dropped_segment = false;
    let mut state = State::new(segment_limit, cache_limit);
    let mut max_batch = 0;
    let mut torn_tail = None;
    for (i, &id) in ids.iter().enumerate() {
        let newest = i + 1 == ids.len();
        let path = dir.join(segment_file_name(id));
        let buf = match disk.read(&path) {
            Ok(buf) => buf,
            // Listed, then gone: only a purge deletes segments (off the writer's thread,
            // so one may still be finishing), and a purged segment holds nothing needed.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(LogError::io("read", &path, e)),
        };
        let header = match FileHeader::decode(&buf) {
            Ok(h) if h.segment == id => h,
            Ok(h) => {
                let reason = format!(
                    "header names segment {} but the file name says {id}",
                    h.segment
                );
                return Err(corrupt(&path, 0, reason));
            }
            Err(reason) => {
                drop_torn_segment(disk, dir, &path, &buf, newest, reason)?;
                dropped_segment = true;
                continue;
            }
        };
        max_batch = max_batch.max(header.first_batch);
        state.segments.insert(id);
        let mut pos = FILE_HEADER_LEN;
        let mut prev = None;
        loop {
            match parse_record(&buf, pos) {
                Ok(None) => break,
                Ok(Some(found)) => {
                    apply::<C>(&mut state, id, &found)
                        .map_err(|reason| corrupt(&path, found.offset as u64, reason))?;
                    max_batch = max_batch.max(found.header.batch);
                    prev = Some(found.header);
                    pos = found.end();
                }
                Err(damage) => {
                    if newest && buf[pos..].iter().all(|&b| b == 0) {
                        // The space reserved past the last record (see the writer),
                        // or a batch of which nothing reached the disk: either
                        // way nothing was acknowledged there. Cut, so that this segment
                        // reads as sealed once the next open starts a newer one.
                        disk.truncate(&path, pos as u64)
                            .map_err(|e| LogError::io("truncate", &path, e))?;
                        break;
                    }
                    if !newest {
                        let reason = format!(
                            "{}; a newer segment exists, so this one was sealed with fdatasync",
                            damage.reason
                        );
                        return Err(corrupt(&path, pos as u64, reason));
                    }
                    let batch = match (damage.header, prev) {
                        (Some(h), _) => h.batch,
                        (None, Some(p)) if p.last_in_batch() => p.batch + 1,
                        (None, Some(p)) => p.batch,
                        (None, None) => header.first_batch,
                    };
                    if let Some(later) = find_later_batch(&buf, pos + 1, batch) {
                        let reason = format!(
                            "{} in batch {batch}, yet a valid record of later batch {} follows at \
                             offset {}, so the damaged batch had been fdatasync'd: not a torn write",
                            damage.reason, later.header.batch, later.offset
                        );
                        return Err(corrupt(&path, pos as u64, reason));
                    }
                    cut_torn_tail(disk, &path, pos as u64, buf.len(), damage.reason)?;
                    torn_tail = Some(TornTail {
                        path: path.clone(),
                        offset: pos as u64,
                        dropped_bytes: (buf.len() - pos) as u64,
                        reason: damage.reason.to_string(),
                    });
                    break;
                }
            }
        }
    }
    check_start(&state, dir)?;
    let clean_stop = marked && torn_tail.is_none() && !dropped_segment;
    if marked && !clean_stop {
        tracing::warn!(dir = %dir.display(), "the log was marked as stopped cleanly, yet its tail was damaged; treating the stop as a crash");
    }
    Ok(Recovered {
        state,
        next_batch: max_batch + 1,
        torn_tail,
        clean_stop,
    })
}

/// Segment ids among the file names of a log directory, ascending. Other files are
/// ignored.
fn segment_ids(names: &[String]) -> Vec<u64> {
    let mut ids: Vec<u64> = names
        .iter()
        .filter_map(|n| parse_segment_file_name(n))
        .collect();
    ids.sort_unstable();
    ids
}

/// A segment whose file header is bad: fine (and removed) only if it is the newest and
/// holds no valid record, i.e. the crash hit while it was being created.
fn drop_torn_segment(
    disk: &dyn Disk,
    dir: &Path,
    path: &Path,
    buf: &[u8],
    newest: bool,
    reason: &str,
) -> Result<(), LogError> {
    if !newest {
        let reason = format!("{reason}; a newer segment exists, so this one was sealed");
        return Err(corrupt(path, 0, reason));
    }
    if let Some(found) = find_later_batch(buf, 0, 0) {
        let reason = format!(
            "{reason}, yet a valid record follows at offset {}",
            found.offset
        );
        return Err(corrupt(path, 0, reason));
    }
    tracing::warn!(
        path = %path.display(),
        reason,
        "removing a log segment whose creation was interrupted by a crash"
    );
    disk.remove_file(path)
        .map_err(|e| LogError::io("remove", path, e))?;
    disk.sync_dir(dir)
        .map_err(|e| LogError::io("fsync directory", dir, e))
}

/// Cuts the newest segment at `at` and makes the cut durable.
fn cut_torn_tail(
    disk: &dyn Disk,
    path: &Path,
    at: u64,
    len: usize,
    reason: &str,
) -> Result<(), LogError> {
    tracing::warn!(
        path = %path.display(),
        offset = at,
        dropped_bytes = len as u64 - at,
        reason,
        "cutting a torn tail off the raft log (unacknowledged writes of a crash)"
    );
    disk.truncate(path, at)
        .map_err(|e| LogError::io("truncate", path, e))
}

/// Replays one valid record into `state`.
fn apply<C: RaftTypeConfig>(
    state: &mut State<C::NodeId>,
    segment: u64,
    found: &Found<'_>,
) -> Result<(), String> {
    let kind = Kind::from_u8(found.header.kind).ok_or_else(|| {
        format!(
            "unknown record kind {} (written by a newer version?)",
            found.header.kind
        )
    })?;
    match kind {
        Kind::Meta => {
            let meta: MetaRecord<C::NodeId> = decode(found.payload, "meta")?;
            state.vote = meta.vote;
            state.committed = meta.committed;
            if let Some(p) = meta.purged {
                state.purge_upto(p);
            }
        }
        Kind::Entry => {
            let entry: C::Entry = decode(found.payload, "entry")?;
            let log_id = entry.get_log_id().clone();
            state.check_append([log_id.index], false)?;
            state.insert_slot(Slot {
                log_id,
                segment,
                offset: (found.offset + RECORD_HEADER_LEN) as u64,
                len: found.header.len,
                crc: found.header.payload_crc,
                seq: 0,
                cached: None,
            });
        }
        Kind::Vote => state.vote = Some(decode::<Vote<C::NodeId>>(found.payload, "vote")?),
        Kind::Committed => state.committed = decode(found.payload, "committed")?,
        Kind::Purge => {
            state.purge_upto(decode::<LogId<C::NodeId>>(found.payload, "purge")?);
        }
        Kind::Truncate => state.truncate_from(decode(found.payload, "truncate")?),
    }
    Ok(())
}

/// After replay, the first present entry must directly follow the purge point.
fn check_start<NID: openraft::NodeId>(state: &State<NID>, dir: &Path) -> Result<(), LogError> {
    if let (Some(p), Some(first)) = (&state.purged, state.slots.front())
        && first.log_id.index != p.index + 1
    {
        return Err(LogError::Inconsistent(format!(
            "log in {} is purged up to {} but its first entry is {}: entries are missing",
            dir.display(),
            p.index,
            first.log_id.index
        )));
    }
    Ok(())
}

fn decode<T: DeserializeOwned>(payload: &[u8], what: &str) -> Result<T, String> {
    postcard::from_bytes(payload).map_err(|e| {
        format!(
            "{what} record has a valid checksum but cannot be decoded ({e}): format mismatch or bug"
        )
    })
}

fn corrupt(path: &Path, offset: u64, reason: impl Into<String>) -> LogError {
    LogError::Corrupt {
        path: PathBuf::from(path),
        offset,
        reason: reason.into(),
    }
}
