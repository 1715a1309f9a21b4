//! The durable Raft log: segment files with checksummed records, group commit, and an
//! in-memory index, implementing openraft's [`RaftLogStorage`] and [`RaftLogReader`] for
//! any [`RaftTypeConfig`] whose entries serialize with serde (encoded with postcard).
//!
//! ```ignore
//! let log = LogStore::<TypeConfig>::open(data_dir.join("log"), LogStoreOptions::default()).await?;
//! let raft = openraft::Raft::new(id, config, network, log, state_machine).await?;
//! ```
//!
//! # Guarantees (what openraft relies on)
//!
//! * [`RaftLogStorage::append`] returns as soon as the entries are queued and readable;
//!   the [`LogFlushed`] callback fires **only after `fdatasync` returned** for a write that
//!   contains them (or with an error, after which the log refuses all writes). The one
//!   exception is opt-in: after [`LogStore::ack_own_appends_early`], a leader's appends of
//!   its own entries are acknowledged when queued, and whoever would act on them waits on
//!   [`Durability`] instead (see there for why that is safe).
//! * Group commit: one writer thread drains everything queued, writes it, calls
//!   `fdatasync` once, and only then fires every callback of that batch.
//! * `save_vote` returns only once its record is durable. `save_committed` returns at
//!   once: the committed id rides in front of the next record written (or the next
//!   [`LogStore::flush`]), so a restart may recover an older committed id, never one
//!   beyond the recovered log (persisting it is optional in Raft). Vote,
//!   committed id and purge point are records in the same log rather than a side file: the
//!   writes are then serialized with the entries by construction (openraft requires vote
//!   and log I/O in order), they ride the same group-commit fdatasync instead of paying a
//!   temp-file + fsync + rename + directory-fsync each, and every segment starts with a copy
//!   of them so that deleting old segments never loses them.
//! * `truncate` and `purge` take effect in memory at once and reach disk in order with
//!   everything else; a purged segment file is deleted only after the purge record is
//!   durable.
//! * Every record is checksummed (a crc32 over its header, which holds the payload's
//!   crc32). On open, damage is a **torn tail** (cut off with a `tracing::warn!`; the node
//!   starts with what precedes it) only if it lies in the newest segment and no valid
//!   record of a *later* group-commit batch follows it. Anything else, a damaged record
//!   followed by a newer batch or damage in an older, sealed segment, is **corruption**:
//!   `open` fails with [`LogError::Corrupt`] naming the file and offset. This holds
//!   because the writer never writes batch `b + 1` before the fdatasync of batch `b`
//!   returned (details in `recovery.rs`). Limit: damage confined to the final batch
//!   cannot be told from a torn write and is cut like one.
//!
//! # Layout
//!
//! `DIR/00000000000000000001.seg`, `…2.seg`, …, each a 32-byte header (magic, segment
//! id, first batch number, version, crc) followed by records: a 26-byte header (magic,
//! payload length, batch number, kind, flags, payload crc32, header crc32) and a postcard
//! payload: an entry, a vote, a committed id, a purge point, a truncation index, or the
//! meta record (vote, committed, purged) that opens every segment (`format.rs` has the
//! byte table). A new segment starts when the active one reaches
//! [`LogStoreOptions::segment_bytes`], and at every open, so a segment is written by one
//! process lifetime only. `purge` deletes whole segments that hold only purged entries.
//! A segment's blocks are kept reserved (zeros) a few MiB ahead of its records, so
//! appends do not grow the file; a sealed segment is cut back to what was written, and
//! recovery cuts the zeros off the newest one.
//!
//! `DIR/clean-stop` (empty) exists only between a [`LogStore::close_cleanly`], which
//! writes it after the fdatasync of everything queued, and the next open (which removes
//! it durably before it touches anything else) or the next write (which removes it
//! first). Found at open with a log that reads back whole, it tells that nothing queued
//! was lost; see `read_vote` for what that allows.
//!
//! Reads use an in-memory index (log index → segment, offset, length, crc) and keep the
//! payloads of the newest entries in memory (up to [`LogStoreOptions::cache_bytes`]), so
//! replication of recent entries does no I/O and older ones cost one `pread` per run.

mod error;
mod format;
mod reader;
mod recovery;
mod state;
mod writer;

#[cfg(test)]
mod test_suite;
#[cfg(test)]
mod tests;

use std::fmt;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::thread::{self, JoinHandle};

use bytes::Bytes;
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    ErrorSubject, ErrorVerb, LogId, LogState, NodeId, OptionalSend, RaftLogId, RaftLogReader,
    RaftTypeConfig, StorageError, Vote,
};
use tokio::sync::oneshot;

use crate::disk::Disk;

pub use error::LogError;
use format::Kind;
use reader::ReadHandles;
use recovery::Recovered;
pub use recovery::TornTail;
use state::{Sink, Slot, State};
use writer::{Done, Op, Writer, WriterShared};

/// Tuning of a [`LogStore`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LogStoreOptions {
    /// Start a new segment file once the active one holds this many bytes.
    pub segment_bytes: u64,
    /// Keep the encoded payloads of the newest entries in memory up to this many bytes.
    pub cache_bytes: usize,
    /// The file system (the real one unless a simulation passes its own).
    pub disk: Arc<dyn Disk>,
    /// Told the duration of every fdatasync of the log.
    pub on_fsync: Option<FsyncObserver>,
    /// Test hook: hold the writer before each fdatasync.
    #[cfg(test)]
    pub(crate) sync_gate: Option<Arc<writer::SyncGate>>,
}

impl LogStoreOptions {
    /// Sets [`LogStoreOptions::segment_bytes`].
    pub fn with_segment_bytes(mut self, bytes: u64) -> Self {
        self.segment_bytes = bytes;
        self
    }

    /// Sets [`LogStoreOptions::disk`].
    pub fn with_disk(mut self, disk: Arc<dyn Disk>) -> Self {
        self.disk = disk;
        self
    }

    /// Sets [`LogStoreOptions::cache_bytes`].
    pub fn with_cache_bytes(mut self, bytes: usize) -> Self {
        self.cache_bytes = bytes;
        self
    }

    /// Sets [`LogStoreOptions::on_fsync`].
    pub fn with_fsync_observer(mut self, observer: FsyncObserver) -> Self {
        self.on_fsync = Some(observer);
        self
    }
}

/// Told how long each fdatasync of a segment took (the WAL fsync metric).
#[derive(Clone)]
pub struct FsyncObserver(pub Arc<dyn Fn(std::time::Duration) + Send + Sync>);

impl std::fmt::Debug for FsyncObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FsyncObserver")
    }
}

impl Default for LogStoreOptions {
    fn default() -> Self {
        LogStoreOptions {
            segment_bytes: 64 << 20,
            cache_bytes: 64 << 20,
            disk: crate::disk::os_disk(),
            on_fsync: None,
            #[cfg(test)]
            sync_gate: None,
        }
    }
}

/// The durable Raft log of one node, stored in one directory.
///
/// Cloning is cheap and shares the log (the clone is also the [`RaftLogStorage::LogReader`]).
/// One directory MUST be opened by at most one `LogStore` at a time. Dropping the last
/// clone waits for the writer thread to finish what was queued.
pub struct LogStore<C: RaftTypeConfig> {
    inner: Arc<Inner<C::NodeId>>,
    _types: PhantomData<fn() -> C>,
}

struct Inner<NID: NodeId> {
    dir: PathBuf,
    disk: Arc<dyn Disk>,
    /// What [`LogStore::open`] cut off, if anything.
    torn_tail: Option<TornTail>,
    /// [`LogStore::open`] found the log closed by [`LogStore::close_cleanly`] and whole.
    clean_stop: bool,
    state: Mutex<State<NID>>,
    shared: Arc<WriterShared>,
    readers: ReadHandles,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl<C: RaftTypeConfig> Clone for LogStore<C> {
    fn clone(&self) -> Self {
        LogStore {
            inner: self.inner.clone(),
            _types: PhantomData,
        }
    }
}

impl<C: RaftTypeConfig> fmt::Debug for LogStore<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogStore")
            .field("dir", &self.inner.dir)
            .finish_non_exhaustive()
    }
}

impl<NID: NodeId> Inner<NID> {
    /// The log's in-memory state, locked (shared by the store and its `Durability`
    /// handles).
    fn lock_state(&self) -> Result<MutexGuard<'_, State<NID>>, LogError> {
        self.state
            .lock()
            .map_err(|_| LogError::Inconsistent("log state lock poisoned by a panic".to_string()))
    }
}

impl<NID: NodeId> Drop for Inner<NID> {
    fn drop(&mut self) {
        // A clean close also writes the committed id still held in memory (best effort:
        // losing it only makes the next start re-apply a little less). Closing the queue
        // stops the writer once it has written what was queued.
        let st = match self.state.get_mut() {
            Ok(st) => st,
            Err(poisoned) => poisoned.into_inner(),
        };
        if self.shared.failure().is_none() && st.queue_committed().is_ok() {
            let _ = st.dispatch();
        }
        st.tx = None;
        let handle = match self.thread.get_mut() {
            Ok(h) => h.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(h) = handle
            && h.thread().id() != thread::current().id()
            && h.join().is_err()
        {
            tracing::error!(dir = %self.dir.display(), "raft log writer thread panicked");
        }
    }
}

impl<C: RaftTypeConfig> LogStore<C> {
    /// Opens (or creates) the log in `dir`: replays every segment, cuts a torn tail with a
    /// warning, and fails with [`LogError::Corrupt`] (naming file and offset) on damage
    /// that a crash cannot explain. Needs a tokio runtime (replay runs on a blocking
    /// thread). Returns once the fresh segment for this process is durable.
    pub async fn open(dir: impl AsRef<Path>, options: LogStoreOptions) -> Result<Self, LogError> {
        let dir = dir.as_ref().to_path_buf();
        let replay_dir = dir.clone();
        let (segment_bytes, cache_bytes) = (options.segment_bytes, options.cache_bytes);
        let disk = options.disk.clone();
        let on_runtime = disk.runs_on_runtime();
        let replay_disk = disk.clone();
        let replay =
            move || recovery::recover::<C>(&*replay_disk, &replay_dir, segment_bytes, cache_bytes);
        let Recovered {
            mut state,
            next_batch,
            torn_tail,
            clean_stop,
        } = if on_runtime {
            replay()?
        } else {
            tokio::task::spawn_blocking(replay)
                .await
                .map_err(|e| LogError::Inconsistent(format!("log recovery task failed: {e}")))??
        };

        let shared = Arc::new(WriterShared {
            on_fsync: options.on_fsync.clone(),
            ..WriterShared::default()
        });
        #[allow(unused_mut)]
        let mut writer = Writer::new(
            dir.clone(),
            disk.clone(),
            shared.clone(),
            next_batch,
            options.segment_bytes,
        );
        #[cfg(test)]
        {
            writer.gate = options.sync_gate.clone();
        }
        let handle = if on_runtime {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            tokio::spawn(writer.run_on_runtime(rx));
            state.tx = Some(Sink::Task(tx));
            None
        } else {
            let (tx, rx) = mpsc::channel();
            let handle = thread::Builder::new()
                .name("oncekv-log-writer".to_string())
                .spawn(move || writer.run(rx))
                .map_err(|e| LogError::io("spawn the writer thread for", &dir, e))?;
            state.tx = Some(Sink::Thread(tx));
            Some(handle)
        };
        let started = state.start_segment().and_then(|()| state.dispatch());
        let store = LogStore {
            inner: Arc::new(Inner {
                dir,
                disk,
                state: Mutex::new(state),
                shared,
                readers: ReadHandles::default(),
                thread: Mutex::new(handle),
                torn_tail,
                clean_stop,
            }),
            _types: PhantomData,
        };
        started?;
        store.flush().await?;
        Ok(store)
    }

    /// The torn tail [`open`](Self::open) found and cut off, if any.
    pub fn torn_tail(&self) -> Option<&TornTail> {
        self.inner.torn_tail.as_ref()
    }

    /// Whether the last process closed this log with [`close_cleanly`](Self::close_cleanly)
    /// and it read back whole at [`open`](Self::open).
    pub fn stopped_cleanly(&self) -> bool {
        self.inner.clean_stop
    }

    /// Makes everything queued so far durable, then marks the log as stopped cleanly, so
    /// that the next [`open`](Self::open) knows nothing queued was lost (see
    /// [`RaftLogStorage::read_vote`] here for what that allows). Call it once raft is
    /// stopped. Should anything be written afterwards, the writer first removes the mark,
    /// so the mark never covers less than the whole log.
    pub async fn close_cleanly(&self) -> Result<(), LogError> {
        let rx = self.with_state(|st| {
            st.queue_committed()?;
            st.send(Op::MarkClean);
            Ok(notify(st))
        })?;
        wait_durable(rx).await
    }

    /// The directory holding the segments.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Bytes the entries not yet purged take in the segment files (records with their
    /// headers): with the snapshot file, what this member's data takes on disk.
    pub fn live_bytes(&self) -> u64 {
        let state = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
        state.slot_bytes + state.segments.len() as u64 * format::FILE_HEADER_LEN as u64
    }

    /// Acknowledges appends made under this node's own leadership (`id` is this node) as
    /// soon as they are queued instead of after their fdatasync, so that raft replicates
    /// them while this node writes them (openraft 0.9 runs nothing else until an append
    /// is acknowledged). Appends made as a follower are still acknowledged after their
    /// fdatasync: a follower's acknowledgement tells the leader the entry is durable.
    ///
    /// Only sound together with the two uses of [`Durability`] that `Node` sets up: an
    /// entry is applied only once it is durable here, and an append tells followers the
    /// commit index only as far as this log is durable.
    pub fn ack_own_appends_early(&self, id: C::NodeId) {
        if let Ok(mut st) = self.lock() {
            st.acks_early_for = Some(id);
        }
    }

    /// A handle that tells when entries of this log are durable.
    pub fn durability(&self) -> Durability<C::NodeId> {
        Durability {
            inner: self.inner.clone(),
        }
    }

    /// Number of fdatasync/fsync calls made on segment files since open (metrics, tests).
    pub fn fsync_count(&self) -> u64 {
        self.inner.shared.fsyncs.load(Ordering::Relaxed)
    }

    /// Waits until everything queued so far (appends, truncations, purges, and the latest
    /// committed id) is durable.
    pub async fn flush(&self) -> Result<(), LogError> {
        let rx = self.with_state(|st| {
            st.queue_committed()?;
            Ok(notify(st))
        })?;
        wait_durable(rx).await
    }

    /// Runs `f` under the state lock, then hands everything `f` queued to the writer as
    /// one message (still under the lock, so file order is state order). Fails without
    /// running `f` if the writer has failed.
    fn with_state<R>(
        &self,
        f: impl FnOnce(&mut State<C::NodeId>) -> Result<R, LogError>,
    ) -> Result<R, LogError> {
        let mut st = self.lock()?;
        self.ensure_writable()?;
        let result = f(&mut st);
        // Dispatch even after an error: whatever `f` queued is already reflected in the state.
        let sent = st.dispatch();
        let value = result?;
        sent?;
        Ok(value)
    }

    fn lock(&self) -> Result<MutexGuard<'_, State<C::NodeId>>, LogError> {
        self.inner.lock_state()
    }

    fn ensure_writable(&self) -> Result<(), LogError> {
        match self.inner.shared.failure() {
            Some(msg) => Err(LogError::WriterFailed(msg)),
            None => Ok(()),
        }
    }

    /// Queues `entries` and arranges for `done` to run after they are durable. The entries
    /// are readable when this returns. `done` MUST NOT block: it runs on the writer thread.
    fn append_with<I>(&self, entries: I, done: Done) -> Result<(), LogError>
    where
        I: IntoIterator<Item = C::Entry>,
    {
        let mut encoded = Vec::new();
        for entry in entries {
            let payload = Bytes::from(oncekv_core::encoding::encode(&entry)?);
            encoded.push((entry.get_log_id().clone(), payload));
        }
        if let Some((id, p)) = encoded
            .iter()
            .find(|(_, p)| u32::try_from(p.len()).is_err())
        {
            return Err(LogError::Inconsistent(format!(
                "entry {} encodes to {} bytes, over the 4 GiB record limit",
                id.index,
                p.len()
            )));
        }
        self.with_state(|st| {
            // Entries at or below the purge point are already covered by a snapshot (they are
            // committed, so any copy is identical): skip them rather than reopen a purged range.
            if let Some(floor) = st.purged.as_ref().map(|p| p.index) {
                encoded.retain(|(id, _)| id.index > floor);
            }
            st.check_append(encoded.iter().map(|(id, _)| id.index), true)
                .map_err(LogError::Inconsistent)?;
            for (log_id, payload) in encoded {
                let len = payload.len() as u32;
                let (segment, offset, crc, seq) = st.write_record(Kind::Entry, payload.clone())?;
                st.insert_slot(Slot {
                    log_id,
                    segment,
                    offset,
                    len,
                    crc,
                    seq,
                    cached: Some(payload),
                });
            }
            st.send(Op::Notify(done));
            st.evict(self.inner.shared.written_seq.load(Ordering::Acquire));
            Ok(())
        })
    }

    /// Queues one small record after applying `update` to the state; returns a receiver
    /// that resolves once it is durable.
    fn write_small(
        &self,
        kind: Kind,
        payload: Vec<u8>,
        update: impl FnOnce(&mut State<C::NodeId>),
    ) -> Result<oneshot::Receiver<std::io::Result<()>>, LogError> {
        self.with_state(|st| {
            update(st);
            st.write_record(kind, Bytes::from(payload))?;
            Ok(notify(st))
        })
    }
}

/// Tells when entries of a [`LogStore`] are durable: for those who act on an entry that
/// [`LogStore::ack_own_appends_early`] acknowledged before its fdatasync.
///
/// Why acknowledging early is sound: openraft 0.9 uses a leader's acknowledgement of its
/// own append only to count the leader in the commit quorum, so raft's commit index may
/// now pass entries that are durable on fewer members than a quorum (one follower and not
/// yet the leader). Such a commit lives in the leader's memory only, and nothing acts on
/// it: the leader applies (answers, serves reads from, snapshots) an entry only once its
/// own copy is durable, and tells followers a commit index only as far as its log is
/// durable ([`Durability::durable_prefix`]). By then the entry is durable on the leader
/// and on the follower(s) whose acknowledgements made the quorum, which is what a commit
/// promises. If the leader crashes first, its in-memory commit is lost with it, before
/// anyone saw it; the entry survives or not as any uncommitted entry does.
pub struct Durability<NID: NodeId> {
    inner: Arc<Inner<NID>>,
}

impl<NID: NodeId> Clone for Durability<NID> {
    fn clone(&self) -> Self {
        Durability {
            inner: self.inner.clone(),
        }
    }
}

impl<NID: NodeId> fmt::Debug for Durability<NID> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Durability")
            .field("dir", &self.inner.dir)
            .finish_non_exhaustive()
    }
}

impl<NID: NodeId> Durability<NID> {
    /// `upto` if it and every entry before it are durable, else the last entry before it
    /// that is (`None` if none is present and durable and nothing is purged).
    pub fn durable_prefix(&self, upto: LogId<NID>) -> Result<Option<LogId<NID>>, LogError> {
        let st = self.state()?;
        if st.purged.as_ref().is_some_and(|p| upto.index <= p.index) {
            return Ok(Some(upto));
        }
        let synced = self.inner.shared.synced.borrow().seq;
        let end = match st.position(upto.index) {
            Some(pos) => pos + 1,
            None if st.slots.back().is_some_and(|s| s.log_id.index < upto.index) => st.slots.len(),
            None => 0,
        };
        // Record numbers grow with the index (see `needed_seq`): the durable entries are
        // a prefix of the present ones.
        let durable = st.slots.partition_point(|s| s.seq <= synced).min(end);
        Ok(match durable.checked_sub(1) {
            Some(pos) if st.slots[pos].log_id.index == upto.index => Some(upto),
            Some(pos) => Some(st.slots[pos].log_id.clone()),
            None => st.purged.clone(),
        })
    }

    /// Waits until entry `index` and every entry before it are durable. Fails if the entry
    /// is not in the log (truncated away) or the writer failed.
    pub async fn wait(&self, index: u64) -> Result<(), LogError> {
        let mut synced = self.inner.shared.synced.subscribe();
        loop {
            // Looked up again after every fdatasync: a truncation may have replaced the
            // entry with one written later.
            let Some(seq) = self.needed_seq(index)? else {
                return Ok(());
            };
            let now = *synced.borrow_and_update();
            if now.seq >= seq {
                return Ok(());
            }
            if now.failed {
                return Err(LogError::WriterFailed(
                    self.inner
                        .shared
                        .failure()
                        .unwrap_or_else(|| "log writer failed".to_string()),
                ));
            }
            synced.changed().await.map_err(|_| LogError::WriterGone)?;
        }
    }

    fn state(&self) -> Result<MutexGuard<'_, State<NID>>, LogError> {
        self.inner.lock_state()
    }

    /// The record sequence number whose fdatasync makes entry `index` durable, `None` if
    /// it is already (purged, or found on disk at open). Within the present log, record
    /// numbers grow with the index (a truncation removes a tail, later appends get higher
    /// numbers), so the entry's own record being synced covers every entry before it.
    fn needed_seq(&self, index: u64) -> Result<Option<u64>, LogError> {
        let st = self.state()?;
        if st.purged.as_ref().is_some_and(|p| index <= p.index) {
            return Ok(None);
        }
        match st.position(index) {
            Some(pos) => Ok(Some(st.slots[pos].seq).filter(|&seq| seq > 0)),
            None => Err(LogError::Inconsistent(format!(
                "entry {index} is not in the log"
            ))),
        }
    }
}

/// Queues a durability notification.
fn notify<NID: NodeId>(st: &mut State<NID>) -> oneshot::Receiver<std::io::Result<()>> {
    let (tx, rx) = oneshot::channel();
    st.send(Op::Notify(Box::new(move |res| {
        // The waiter may have gone away; durability does not depend on it.
        let _ = tx.send(res);
    })));
    rx
}

async fn wait_durable(rx: oneshot::Receiver<std::io::Result<()>>) -> Result<(), LogError> {
    match rx.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(LogError::WriterFailed(e.to_string())),
        Err(_) => Err(LogError::WriterGone),
    }
}

impl<C: RaftTypeConfig> RaftLogReader<C> for LogStore<C> {
    async fn try_get_log_entries<RB>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, StorageError<C::NodeId>>
    where
        RB: std::ops::RangeBounds<u64> + Clone + fmt::Debug + OptionalSend,
    {
        self.read_range(range)
            .map_err(|e| e.into_storage(ErrorSubject::Logs, ErrorVerb::Read))
    }
}

impl<C: RaftTypeConfig> RaftLogStorage<C> for LogStore<C> {
    type LogReader = LogStore<C>;

    async fn get_log_state(&mut self) -> Result<LogState<C>, StorageError<C::NodeId>> {
        let st = self
            .lock()
            .map_err(|e| e.into_storage(ErrorSubject::Logs, ErrorVerb::Read))?;
        Ok(LogState {
            last_purged_log_id: st.purged.clone(),
            last_log_id: st.last_log_id(),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    /// Returns only once the vote is durable.
    async fn save_vote(&mut self, vote: &Vote<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        let err = |e: LogError| e.into_storage(ErrorSubject::Vote, ErrorVerb::Write);
        let payload = postcard::to_stdvec(vote).map_err(|e| err(e.into()))?;
        let rx = self
            .write_small(Kind::Vote, payload, |st| st.vote = Some(vote.clone()))
            .map_err(err)?;
        wait_durable(rx).await.map_err(err)
    }

    /// openraft reads the vote once, at startup. Once the store knows which member it
    /// belongs to ([`ack_own_appends_early`](Self::ack_own_appends_early)), a granted vote
    /// comes back as not granted (in memory only; the record stays), with one exception
    /// below. Raft's safety does not rest on the flag (a member still never votes twice
    /// in a term); two things do:
    ///
    /// * **This member's own vote: safety.** openraft 0.9 would resume leading in the same
    ///   term at once. With early acknowledgements a crash can lose entries of that term
    ///   which followers already hold, and the resumed leader would write different
    ///   entries under the same log ids (same term, same indexes), which the followers
    ///   take for the ones they have, so the replicas' logs would differ where raft
    ///   assumes they agree. As a follower, it leads again only in a new term, and every
    ///   new entry gets a new id. The exception: a log that
    ///   [`close_cleanly`](Self::close_cleanly) marked and that read back whole holds
    ///   every entry this member appended in its term, so it resumes leading at once (a
    ///   cluster stopped cleanly comes back without an election).
    /// * **Another member's vote: liveness.** openraft refuses to vote, for an election
    ///   timeout after a granted vote was last seen, so as not to depose a live leader;
    ///   at startup it counts from the start. When a whole cluster restarts after a crash
    ///   every member then refuses the first candidate, and a leader is elected only at
    ///   the second round (3-4 s with the default timeouts). A member that just started
    ///   has heard from no leader, so it has no lease to protect. (Leader-lease reads do
    ///   not rely on this: with them on, a member refuses all votes for a while after it
    ///   starts, see `read_lease`.)
    async fn read_vote(&mut self) -> Result<Option<Vote<C::NodeId>>, StorageError<C::NodeId>> {
        let clean_stop = self.inner.clean_stop;
        let mut st = self
            .lock()
            .map_err(|e| e.into_storage(ErrorSubject::Vote, ErrorVerb::Read))?;
        let Some(me) = st.acks_early_for.clone() else {
            return Ok(st.vote.clone());
        };
        if let Some(vote) = &st.vote
            && vote.is_committed()
            && let Some(holder) = vote.leader_id().voted_for()
            && !(clean_stop && holder == me)
        {
            st.vote = Some(Vote::new(vote.leader_id().term, holder));
        }
        Ok(st.vote.clone())
    }

    /// Returns at once: the committed id is kept in memory and written in front of the next
    /// record (see `State::set_committed` for why that is safe), so openraft, which awaits
    /// this inside its core loop on every commit, never waits for an fdatasync here.
    async fn save_committed(
        &mut self,
        committed: Option<LogId<C::NodeId>>,
    ) -> Result<(), StorageError<C::NodeId>> {
        self.with_state(|st| {
            st.set_committed(committed);
            Ok(())
        })
        .map_err(|e| e.into_storage(ErrorSubject::Store, ErrorVerb::Write))
    }

    async fn read_committed(
        &mut self,
    ) -> Result<Option<LogId<C::NodeId>>, StorageError<C::NodeId>> {
        let st = self
            .lock()
            .map_err(|e| e.into_storage(ErrorSubject::Store, ErrorVerb::Read))?;
        Ok(st.committed.clone())
    }

    /// Returns once the entries are queued and readable; `callback` fires only after the
    /// fdatasync covering them returned, or at once for a leader's own entries once
    /// [`LogStore::ack_own_appends_early`] was called.
    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<C>,
    ) -> Result<(), StorageError<C::NodeId>>
    where
        I: IntoIterator<Item = C::Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let err = |e: LogError| e.into_storage(ErrorSubject::Logs, ErrorVerb::Write);
        // openraft saves a vote before the appends made under it, and awaits both, so the
        // vote read here is the one this append is made under.
        let as_leader = self.lock().map_err(err)?.appends_as_leader();
        if as_leader {
            // A write error fails the writer: the next call reports it, and `Durability`
            // never reports these entries durable, so they are neither applied nor told to
            // followers as committed.
            self.append_with(entries, Box::new(|_| {})).map_err(err)?;
            callback.log_io_completed(Ok(()));
            Ok(())
        } else {
            self.append_with(entries, Box::new(move |res| callback.log_io_completed(res)))
                .map_err(err)
        }
    }

    /// Removes entries with index `>= log_id.index` at once (in memory); the truncation
    /// record reaches disk before any later write.
    async fn truncate(&mut self, log_id: LogId<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        let err = |e: LogError| e.into_storage(ErrorSubject::Logs, ErrorVerb::Delete);
        let payload = postcard::to_stdvec(&log_id.index).map_err(|e| err(e.into()))?;
        self.with_state(|st| {
            st.truncate_from(log_id.index);
            st.write_record(Kind::Truncate, Bytes::from(payload))?;
            Ok(())
        })
        .map_err(err)
    }

    /// Removes entries up to and including `log_id.index` and records the purge point;
    /// segment files holding only purged entries are deleted once that record is durable.
    async fn purge(&mut self, log_id: LogId<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        let err = |e: LogError| e.into_storage(ErrorSubject::Logs, ErrorVerb::Delete);
        let payload = postcard::to_stdvec(&log_id).map_err(|e| err(e.into()))?;
        self.with_state(|st| {
            if !st.purge_upto(log_id) {
                return Ok(());
            }
            st.write_record(Kind::Purge, Bytes::from(payload))?;
            let ids = st.deletable_segments();
            if !ids.is_empty() {
                for id in &ids {
                    st.segments.remove(id);
                }
                self.inner.readers.forget(&ids);
                st.send(Op::Delete { ids });
            }
            Ok(())
        })
        .map_err(err)
    }
}
