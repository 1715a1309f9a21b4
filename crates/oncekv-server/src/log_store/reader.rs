//! Reading entries back for replication: from the in-memory cache when the payload is
//! recent, else with one `pread` per run of entries stored next to each other.

use std::collections::HashMap;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use openraft::RaftTypeConfig;

use super::format::{payload_crc, segment_file_name};
use super::{LogError, LogStore};
use crate::disk::ReadAt;

/// Largest single `pread` when reading a run of entries.
const MAX_READ_SPAN: u64 = 4 << 20;

/// Read-only handles of segment files, opened on first use. An open handle keeps a
/// deleted segment readable, which makes a read racing with a purge safe.
#[derive(Debug, Default)]
pub(super) struct ReadHandles {
    files: Mutex<HashMap<u64, Arc<dyn ReadAt>>>,
}

impl ReadHandles {
    /// The handle of segment `id`. Callers MUST hold the state lock while the segment
    /// is still listed, so it cannot be deleted before it is opened.
    fn get(
        &self,
        disk: &dyn crate::disk::Disk,
        dir: &Path,
        id: u64,
    ) -> Result<Arc<dyn ReadAt>, LogError> {
        let mut files = self.files.lock().map_err(|_| poisoned())?;
        if let Some(f) = files.get(&id) {
            return Ok(f.clone());
        }
        let path = dir.join(segment_file_name(id));
        let file = disk
            .open_read(&path)
            .map_err(|e| LogError::io("open", path, e))?;
        files.insert(id, file.clone());
        Ok(file)
    }

    /// Closes the handles of deleted segments (readers holding one keep it).
    pub(super) fn forget(&self, ids: &[u64]) {
        if let Ok(mut files) = self.files.lock() {
            for id in ids {
                files.remove(id);
            }
        }
    }
}

fn poisoned() -> LogError {
    LogError::Inconsistent("log reader lock poisoned by a panic".to_string())
}

/// One entry to return: its payload, or where to read it.
enum Piece {
    Cached(Bytes),
    OnDisk(DiskLoc),
}

struct DiskLoc {
    file: Arc<dyn ReadAt>,
    segment: u64,
    offset: u64,
    len: u32,
    crc: u32,
}

impl<C: RaftTypeConfig> LogStore<C> {
    /// The present entries within `range`, in order.
    pub(super) fn read_range<RB: RangeBounds<u64>>(
        &self,
        range: RB,
    ) -> Result<Vec<C::Entry>, LogError> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.saturating_add(1),
            Bound::Excluded(&e) => e,
            Bound::Unbounded => u64::MAX,
        };
        let pieces = self.plan(start, end)?;
        let mut out = Vec::with_capacity(pieces.len());
        let mut run: Vec<DiskLoc> = Vec::new();
        for piece in pieces {
            match piece {
                Piece::Cached(bytes) => {
                    self.read_run(&mut run, &mut out)?;
                    out.push(self.decode(&bytes, None)?);
                }
                Piece::OnDisk(loc) => {
                    let joins = run.first().zip(run.last()).is_some_and(|(first, last)| {
                        last.segment == loc.segment
                            && loc.offset >= last.offset + u64::from(last.len)
                            && loc.offset + u64::from(loc.len) - first.offset <= MAX_READ_SPAN
                    });
                    if !joins {
                        self.read_run(&mut run, &mut out)?;
                    }
                    run.push(loc);
                }
            }
        }
        self.read_run(&mut run, &mut out)?;
        Ok(out)
    }

    /// Under the state lock: what to return for `[start, end)`.
    fn plan(&self, start: u64, end: u64) -> Result<Vec<Piece>, LogError> {
        let st = self.lock()?;
        let (Some(first), Some(last)) = (st.slots.front(), st.slots.back()) else {
            return Ok(Vec::new());
        };
        let (first, last) = (first.log_id.index, last.log_id.index);
        let (start, end) = (start.max(first), end.min(last.saturating_add(1)));
        let mut pieces = Vec::new();
        for index in start..end {
            let Some(slot) = st.position(index).map(|p| &st.slots[p]) else {
                break;
            };
            pieces.push(match &slot.cached {
                Some(bytes) => Piece::Cached(bytes.clone()),
                None => Piece::OnDisk(DiskLoc {
                    file: self.inner.readers.get(
                        &*self.inner.disk,
                        &self.inner.dir,
                        slot.segment,
                    )?,
                    segment: slot.segment,
                    offset: slot.offset,
                    len: slot.len,
                    crc: slot.crc,
                }),
            });
        }
        Ok(pieces)
    }

    /// Reads a run of neighbouring on-disk payloads with one `pread`, then empties `run`.
    fn read_run(&self, run: &mut Vec<DiskLoc>, out: &mut Vec<C::Entry>) -> Result<(), LogError> {
        let (Some(first), Some(last)) = (run.first(), run.last()) else {
            return Ok(());
        };
        let base = first.offset;
        let span = (last.offset + u64::from(last.len) - base) as usize;
        let mut buf = vec![0u8; span];
        let path = self.inner.dir.join(segment_file_name(first.segment));
        first
            .file
            .read_exact_at(&mut buf, base)
            .map_err(|e| LogError::io("read", path, e))?;
        for loc in run.drain(..) {
            let at = (loc.offset - base) as usize;
            let payload = &buf[at..at + loc.len as usize];
            if payload_crc(payload) != loc.crc {
                return Err(self.bad_read(&loc, "payload checksum mismatch".to_string()));
            }
            out.push(self.decode(payload, Some(&loc))?);
        }
        Ok(())
    }

    fn decode(&self, payload: &[u8], loc: Option<&DiskLoc>) -> Result<C::Entry, LogError> {
        postcard::from_bytes(payload).map_err(|e| match loc {
            Some(loc) => self.bad_read(loc, format!("cannot decode entry: {e}")),
            None => LogError::Inconsistent(format!("cannot decode a cached entry: {e}")),
        })
    }

    fn bad_read(&self, loc: &DiskLoc, reason: String) -> LogError {
        LogError::BadRead {
            path: self.inner.dir.join(segment_file_name(loc.segment)),
            offset: loc.offset,
            reason,
        }
    }
}
