//! The writer thread: the only code that writes to segment files.
//!
//! It receives [`Op`]s in the exact order the store produced them, drains everything that
//! is queued, writes it with one `write` per segment, calls `fdatasync` once, and only then
//! fires the completion callbacks of that batch (group commit). A batch is never started
//! before the previous batch's `fdatasync` returned, which is what lets recovery tell a
//! torn tail from older damage (see `recovery`).
//!
//! After any I/O error the writer is failed for good: later operations complete with an
//! error and nothing more is written (after a failed fsync the page cache state is
//! unknown, so retrying could report data durable that is not).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::disk::{AppendFile, Disk};

use super::format::{
    CLEAN_STOP_FILE, FILE_HEADER_LEN, FLAG_LAST_IN_BATCH, FileHeader, Kind, RECORD_HEADER_LEN,
    RecordHeader, segment_file_name,
};

/// Completion callback: receives the outcome of the fdatasync covering the operation.
pub(super) type Done = Box<dyn FnOnce(io::Result<()>) + Send>;

/// One instruction for the writer thread.
pub(super) enum Op {
    /// Seal the current segment (fdatasync), then create segment `id`, write its header,
    /// fdatasync it and fsync the directory.
    Rotate { id: u64 },
    /// Append one record to the current segment.
    Record(Staged),
    /// Delete these segment files once everything before this op is durable.
    Delete { ids: Vec<u64> },
    /// Call back once everything before this op is durable.
    Notify(Done),
    /// Once everything before this op is durable, leave the clean-stop marker (see
    /// [`CLEAN_STOP_FILE`]); the next write of any kind removes it first.
    MarkClean,
}

impl std::fmt::Debug for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::Rotate { id } => write!(f, "Rotate({id})"),
            Op::Record(r) => write!(
                f,
                "Record({:?} @{}, {} bytes)",
                r.kind,
                r.offset,
                r.payload.len()
            ),
            Op::Delete { ids } => write!(f, "Delete({ids:?})"),
            Op::Notify(_) => write!(f, "Notify"),
            Op::MarkClean => write!(f, "MarkClean"),
        }
    }
}

/// A record whose header the writer completes (batch number and flags are only known
/// when the batch is cut).
pub(super) struct Staged {
    pub(super) kind: Kind,
    pub(super) payload: Bytes,
    pub(super) payload_crc: u32,
    /// Where the store expects the record to start; checked against the file length.
    pub(super) offset: u64,
    /// The store's sequence number of this record, published once written.
    pub(super) seq: u64,
}

/// What the writer has made durable: the highest record `seq` covered by a completed
/// fdatasync, and whether the writer failed (nothing more becomes durable then).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Synced {
    pub(super) seq: u64,
    pub(super) failed: bool,
}

/// Counters shared between the writer and the store.
#[derive(Debug)]
pub(super) struct WriterShared {
    /// fdatasync/fsync calls made, for tests and metrics.
    pub(super) fsyncs: AtomicU64,
    /// Highest record `seq` whose bytes are in the file (readable with `pread`).
    pub(super) written_seq: AtomicU64,
    /// Published after every fdatasync (and on failure), for those waiting on an entry's
    /// durability rather than on a callback of their own (see `Durability`).
    pub(super) synced: tokio::sync::watch::Sender<Synced>,
    /// Set once the writer failed; the message of the first error.
    pub(super) failed: Mutex<Option<String>>,
    pub(super) on_fsync: Option<super::FsyncObserver>,
}

impl Default for WriterShared {
    fn default() -> Self {
        WriterShared {
            fsyncs: AtomicU64::new(0),
            written_seq: AtomicU64::new(0),
            synced: tokio::sync::watch::Sender::new(Synced::default()),
            failed: Mutex::new(None),
            on_fsync: None,
        }
    }
}

impl WriterShared {
    pub(super) fn failure(&self) -> Option<String> {
        match self.failed.lock() {
            Ok(g) => g.clone(),
            Err(_) => Some("log writer state poisoned".to_string()),
        }
    }
}

/// A test hook that holds the writer just before each fdatasync until released.
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct SyncGate {
    state: Mutex<(bool, u64)>, // (closed, number of times the writer waited at the gate)
    cv: std::sync::Condvar,
}

#[cfg(test)]
impl SyncGate {
    pub(crate) fn close(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.0 = true;
        }
    }

    pub(crate) fn open(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.0 = false;
        }
        self.cv.notify_all();
    }

    /// Blocks until the writer has arrived at the closed gate `n` times in total.
    pub(crate) fn wait_arrivals(&self, n: u64) {
        let Ok(mut s) = self.state.lock() else { return };
        while s.1 < n {
            s = match self.cv.wait(s) {
                Ok(s) => s,
                Err(_) => return,
            };
        }
    }

    fn pass(&self) {
        let Ok(mut s) = self.state.lock() else { return };
        if s.0 {
            s.1 += 1;
            self.cv.notify_all();
            while s.0 {
                s = match self.cv.wait(s) {
                    Ok(s) => s,
                    Err(_) => return,
                };
            }
        }
    }
}

/// How far ahead of its records a segment is kept reserved: one `fallocate` and zero fill
/// per this many bytes appended (the zeros ride on the next batch's fdatasync, so a step
/// is small enough for that one sync to stay around a millisecond), and what an idle
/// member holds.
const RESERVE_AHEAD: u64 = 1 << 20;

/// The writer's private state.
pub(super) struct Writer {
    dir: PathBuf,
    disk: Arc<dyn Disk>,
    shared: Arc<WriterShared>,
    /// The segment being appended to, its id and its length in bytes.
    current: Option<(u64, Box<dyn AppendFile>, u64)>,
    /// How far ahead of the records to keep the current segment reserved (see
    /// [`AppendFile::preallocate`]).
    reserve_step: u64,
    /// Where the current segment's reservation ends; `None` once the file system refused
    /// one (the segment then grows as it is written).
    reserved_to: Option<u64>,
    /// The current segment may be longer than what was written (zeros reserved past it):
    /// it is cut to its written length when sealed, so that only the newest segment ever
    /// has such a tail (which recovery cuts off).
    reserved_tail: bool,
    /// Records of the open batch, not yet written, and their encoded size.
    staged: Vec<Staged>,
    staged_bytes: u64,
    /// Number of the next batch to write.
    batch: u64,
    /// This writer left the clean-stop marker: it must go (durably) before any other
    /// byte of the log is written. (A marker found at open is removed by recovery.)
    clean_marked: bool,
    /// `Some` once an I/O error happened.
    failed: Option<String>,
    /// Where purged segments go to be deleted off this thread (`None`: deleted here, as
    /// on the simulation's runtime).
    deleter: Option<std::sync::mpsc::Sender<PathBuf>>,
    #[cfg(test)]
    pub(super) gate: Option<Arc<SyncGate>>,
}

impl Writer {
    pub(super) fn new(
        dir: PathBuf,
        disk: Arc<dyn Disk>,
        shared: Arc<WriterShared>,
        next_batch: u64,
        segment_bytes: u64,
    ) -> Writer {
        Writer {
            dir,
            disk,
            shared,
            current: None,
            reserve_step: segment_bytes.clamp(1, RESERVE_AHEAD),
            reserved_to: None,
            reserved_tail: false,
            staged: Vec::new(),
            staged_bytes: 0,
            batch: next_batch,
            clean_marked: false,
            failed: None,
            deleter: None,
            #[cfg(test)]
            gate: None,
        }
    }

    /// Runs until every sender is gone, then returns (files are closed on drop).
    /// Each message is the operations of one store call, never split across batches.
    pub(super) fn run(mut self, rx: Receiver<Vec<Op>>) {
        let (deleter, paths) = std::sync::mpsc::channel::<PathBuf>();
        let disk = self.disk.clone();
        let spawned = std::thread::Builder::new()
            .name("oncekv-log-delete".into())
            .spawn(move || {
                for path in paths {
                    delete_segment(&*disk, &path);
                }
            });
        match spawned {
            Ok(_) => self.deleter = Some(deleter),
            Err(e) => {
                tracing::warn!(error = %e, "no thread for deleting purged log segments; the writer deletes them")
            }
        }
        while let Ok(mut ops) = rx.recv() {
            for more in rx.try_iter() {
                ops.extend(more);
            }
            self.process(ops);
        }
    }

    /// As [`run`](Self::run), as a task on the async runtime (deterministic simulation:
    /// see [`Disk::runs_on_runtime`]).
    pub(super) async fn run_on_runtime(
        mut self,
        mut rx: tokio::sync::mpsc::UnboundedReceiver<Vec<Op>>,
    ) {
        while let Some(mut ops) = rx.recv().await {
            // A slow disk: the batch waits as it would for the device, and what is queued
            // meanwhile joins it. A crash during the wait loses all of it.
            let delay = self.disk.sync_delay();
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            while let Ok(more) = rx.try_recv() {
                ops.extend(more);
            }
            self.process(ops);
        }
    }

    /// Executes one drained group of operations: one fdatasync (plus one per rotation),
    /// then deletions, then callbacks.
    fn process(&mut self, ops: Vec<Op>) {
        let mut done = Vec::new();
        let mut delete = Vec::new();
        let mut result = match &self.failed {
            Some(msg) => Err(msg.clone()),
            None => Ok(()),
        };
        for op in ops {
            match op {
                Op::Notify(d) => done.push(d),
                Op::Delete { ids } => delete.extend(ids),
                Op::Record(r) if result.is_ok() => result = self.stage(r),
                Op::Rotate { id } if result.is_ok() => result = self.rotate(id),
                Op::MarkClean if result.is_ok() => {
                    result = self.write_and_sync().and_then(|()| self.mark_clean());
                }
                Op::Record(_) | Op::Rotate { .. } | Op::MarkClean => {}
            }
        }
        if result.is_ok() {
            result = self.write_and_sync();
        }
        match result {
            Ok(()) => {
                for d in done {
                    d(Ok(()));
                }
                // After the callbacks, and off this thread when it can be: unlinking a
                // purged 64 MB segment takes tens of ms (hundreds for the several a
                // snapshot frees at once), and appends waiting on the next fdatasync
                // would wait for it. A segment left behind by a crash before its delete
                // is harmless: recovery skips what was purged, and the next purge deletes
                // it.
                for id in delete {
                    let path = self.dir.join(segment_file_name(id));
                    match &self.deleter {
                        Some(deleter) => {
                            if let Err(back) = deleter.send(path) {
                                delete_segment(&*self.disk, &back.0);
                            }
                        }
                        None => delete_segment(&*self.disk, &path),
                    }
                }
            }
            Err(msg) => {
                self.fail(&msg);
                for d in done {
                    d(Err(io::Error::other(msg.clone())));
                }
            }
        }
    }

    fn fail(&mut self, msg: &str) {
        if self.failed.is_none() {
            tracing::error!(
                error = msg,
                "raft log writer failed; the log accepts no more writes"
            );
            self.failed = Some(msg.to_string());
            if let Ok(mut f) = self.shared.failed.lock() {
                f.get_or_insert_with(|| msg.to_string());
            }
            self.shared.synced.send_modify(|s| s.failed = true);
        }
    }

    fn stage(&mut self, r: Staged) -> Result<(), String> {
        let Some((id, _, len)) = &self.current else {
            return Err("internal: record staged with no open segment".to_string());
        };
        let expected = *len + self.staged_bytes;
        if r.offset != expected {
            return Err(format!(
                "internal: record for segment {id} expected at offset {} but the file ends at {expected}",
                r.offset
            ));
        }
        self.staged_bytes += (RECORD_HEADER_LEN + r.payload.len()) as u64;
        self.staged.push(r);
        Ok(())
    }

    /// Writes the staged records as one batch and fdatasyncs the segment. The records are
    /// durable exactly when this returns `Ok`.
    fn write_and_sync(&mut self) -> Result<(), String> {
        if self.staged.is_empty() {
            return Ok(());
        }
        self.unmark()?;
        let Some((id, file, len)) = &mut self.current else {
            return Err("internal: batch with no open segment".to_string());
        };
        let path = self.dir.join(segment_file_name(*id));
        let mut buf = Vec::with_capacity(self.staged_bytes as usize);
        let last = self.staged.len() - 1;
        let mut max_seq = 0;
        for (i, s) in self.staged.iter().enumerate() {
            let header = RecordHeader {
                len: s.payload.len() as u32,
                batch: self.batch,
                kind: s.kind as u8,
                flags: if i == last { FLAG_LAST_IN_BATCH } else { 0 },
                payload_crc: s.payload_crc,
            };
            header.encode_into(&mut buf);
            buf.extend_from_slice(&s.payload);
            max_seq = max_seq.max(s.seq);
        }
        // Appends that stay inside reserved blocks leave the file's size and block map as
        // they were, so each batch's fdatasync writes the data and little else (etcd
        // preallocates its WAL segments for the same reason). The reservation moves ahead
        // of the records a step at a time, so an idle member holds one step, not a
        // segment. Best effort: the log works the same without it.
        let end = *len + buf.len() as u64;
        if let Some(reserved) = self.reserved_to
            && end > reserved
        {
            let target = end + self.reserve_step;
            self.reserved_to = match file.preallocate(target) {
                Ok(()) => {
                    self.reserved_tail = true;
                    Some(target)
                }
                Err(e) if e.kind() == io::ErrorKind::Unsupported => None,
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "could not reserve space for a log segment; appending without");
                    // A failed fallocate (a nearly full disk) may have reserved part of
                    // the range: records fill it, and sealing cuts what they leave.
                    self.reserved_tail = true;
                    None
                }
            };
        }
        file.write_all(&buf)
            .map_err(|e| io_msg("write to", &path, &e))?;
        *len = end;
        self.shared
            .written_seq
            .fetch_max(max_seq, Ordering::Release);
        self.staged.clear();
        self.staged_bytes = 0;

        #[cfg(test)]
        if let Some(gate) = &self.gate {
            gate.pass();
        }
        let started = std::time::Instant::now();
        file.sync_data()
            .map_err(|e| io_msg("fdatasync", &path, &e))?;
        if let Some(observe) = &self.shared.on_fsync {
            (observe.0)(started.elapsed());
        }
        self.shared.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.batch += 1;
        // Before any callback of the batch runs: whoever learns of the flush from a
        // callback finds the entries durable here too.
        self.shared.synced.send_if_modified(|s| {
            let newer = max_seq > s.seq;
            s.seq = s.seq.max(max_seq);
            newer
        });
        Ok(())
    }

    /// Seals the current segment and starts segment `id`.
    fn rotate(&mut self, id: u64) -> Result<(), String> {
        self.write_and_sync()?;
        self.unmark()?;
        if let Some((old, _, len)) = &self.current
            && self.reserved_tail
        {
            // Before the next segment exists: recovery reads zeros past the last record as
            // the end of the log only in the newest segment.
            let path = self.dir.join(segment_file_name(*old));
            self.disk
                .truncate(&path, *len)
                .map_err(|e| io_msg("cut the reserved tail of", &path, &e))?;
            self.shared.fsyncs.fetch_add(1, Ordering::Relaxed);
        }
        let path = self.dir.join(segment_file_name(id));
        let mut file = self
            .disk
            .create_new(&path)
            .map_err(|e| io_msg("create", &path, &e))?;
        let header = FileHeader {
            segment: id,
            first_batch: self.batch,
        };
        file.write_all(&header.encode())
            .map_err(|e| io_msg("write header of", &path, &e))?;
        // The first batch reserves the segment's first step (see `write_and_sync`).
        self.reserved_to = Some(FILE_HEADER_LEN as u64);
        self.reserved_tail = false;
        file.sync_data()
            .map_err(|e| io_msg("fdatasync", &path, &e))?;
        self.shared.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.sync_dir()?;
        self.current = Some((id, file, FILE_HEADER_LEN as u64));
        Ok(())
    }

    fn sync_dir(&self) -> Result<(), String> {
        self.disk
            .sync_dir(&self.dir)
            .map_err(|e| io_msg("fsync directory", &self.dir, &e))?;
        self.shared.fsyncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Leaves the clean-stop marker. Called only once everything staged before it is
    /// durable; the file is empty, its presence is the message.
    fn mark_clean(&mut self) -> Result<(), String> {
        let path = self.dir.join(CLEAN_STOP_FILE);
        let mut file = self
            .disk
            .create(&path)
            .map_err(|e| io_msg("create", &path, &e))?;
        file.sync_data()
            .map_err(|e| io_msg("fdatasync", &path, &e))?;
        self.shared.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.sync_dir()?;
        self.clean_marked = true;
        Ok(())
    }

    /// Removes the clean-stop marker, durably, if it may be there. Before any write: a
    /// marker left beside a record it does not cover would let a crash that lost that
    /// record pass for a clean stop.
    fn unmark(&mut self) -> Result<(), String> {
        if !self.clean_marked {
            return Ok(());
        }
        let path = self.dir.join(CLEAN_STOP_FILE);
        match self.disk.remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_msg("remove", &path, &e)),
        }
        self.sync_dir()?;
        self.clean_marked = false;
        Ok(())
    }
}

fn io_msg(what: &str, path: &Path, e: &io::Error) -> String {
    format!("cannot {what} {}: {e}", path.display())
}

/// Deletes a purged segment's file; a failure is logged and otherwise harmless (see
/// [`Writer::process`]).
fn delete_segment(disk: &dyn Disk, path: &Path) {
    if let Err(e) = disk.remove_file(path) {
        tracing::warn!(path = %path.display(), error = %e, "could not delete purged log segment");
    }
}
