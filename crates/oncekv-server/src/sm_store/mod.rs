//! The core [`StateMachine`] behind openraft's `RaftStateMachine`, with snapshots kept on
//! disk.
//!
//! The state machine itself lives in memory; what makes it durable is the log plus the
//! latest snapshot file. On start, [`SmStore::open`] restores the snapshot (if any) and
//! openraft re-applies the log after it. A snapshot file is written to a temporary name,
//! fsynced, renamed over the old one and the directory fsynced, so a crash leaves either the
//! old or the new snapshot, never a torn one; a checksum catches anything else. The file's
//! bytes are `snapshot_file`'s.

mod snapshot_file;

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use oncekv_core::StateMachine;
use openraft::storage::{RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{AnyError, EntryPayload, RaftSnapshotBuilder, StorageIOError, StoredMembership};
use std::time::Instant;

use oncekv_core::waiting_list::{WaitError, WaitingList};

use crate::disk::{Disk, write_atomically_with};
use crate::error::ProposeError;

use crate::log_store::Durability;
use crate::types::{EntryResponses, LogId, Member, NodeId, StorageError, TypeConfig};

use snapshot_file::{Image, snapshot_file_head};
pub(crate) use snapshot_file::{
    SnapshotFile, decode_snapshot_file, encode_snapshot_file, load_snapshot_file,
};

/// The state machine snapshot, in the state directory.
pub const SNAPSHOT_FILE: &str = "snapshot.bin";

/// Watches a node's state machine (deterministic simulation and tests; `None` in
/// production). Called under the state machine's write lock: keep it quick, never block.
pub trait ApplyObserver: Send + Sync + std::fmt::Debug {
    /// A state machine was created: at open, and whenever a snapshot replaced it.
    fn prepare(&self, sm: &mut StateMachine);
    /// `sm` has just applied an entry, or installed a snapshot (its applied index says
    /// which).
    fn applied(&self, sm: &mut StateMachine);
}

/// Requests waiting for the applied index to reach a log index (linearizable reads).
pub type AppliedWaiters = WaitingList<u64, (), ProposeError>;

/// What is applied, shared between the raft state machine task and the request handlers.
#[derive(Debug)]
pub struct Applied {
    inner: RwLock<AppliedInner>,
    waiters: AppliedWaiters,
    /// The store revision of the applied state, published after every apply batch that
    /// changed it and after every snapshot install, always after the write lock is
    /// released: a receiver that wakes and reads the state sees at least that revision.
    /// Watch streams wait on it instead of polling.
    revision: tokio::sync::watch::Sender<i64>,
    /// Whether the applied auth store has auth on, kept after every apply and install:
    /// requests read it without the lock, and with auth off skip every auth check.
    auth_enabled: std::sync::atomic::AtomicBool,
    /// Held by a snapshot build from before it copies the state until its file is
    /// written; `true` once [`Applied::stop_snapshots`] ran, after which no build starts.
    snapshot_builds: Arc<tokio::sync::Mutex<bool>>,
}

#[derive(Debug)]
pub struct AppliedInner {
    pub sm: StateMachine,
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership<NodeId, Member>,
    /// Size of the last snapshot, reported as etcd's `dbSize`.
    pub snapshot_bytes: u64,
}

impl Applied {
    /// Read access for request handlers. Never held across an `.await`.
    pub fn read(&self) -> RwLockReadGuard<'_, AppliedInner> {
        self.inner
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, AppliedInner> {
        self.inner
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits until the applied index is at least `index`, or `deadline` passes
    /// ([`WaitError::Timeout`]), or the waiters are failed (e.g. leadership lost).
    pub async fn wait_applied(
        &self,
        index: u64,
        deadline: Instant,
    ) -> Result<(), WaitError<ProposeError>> {
        // Already applied (the usual case for a read): no waiter to register and remove.
        if self.read().sm.applied_index() >= index {
            return Ok(());
        }
        // Register before looking again, so an apply in between cannot be missed.
        let waiter = self.waiters.register(index, Some(deadline));
        if self.read().sm.applied_index() >= index {
            return Ok(());
        }
        waiter.await
    }

    /// Waits for a snapshot build in flight to finish writing its file and lets no other
    /// start. For a member that stops: openraft runs builds on a task of their own,
    /// which its shutdown does not wait for, and a snapshot file written after the stop
    /// returned would change a data directory its caller may already be reading.
    pub async fn stop_snapshots(&self) {
        *self.snapshot_builds.lock().await = true;
    }

    pub fn waiters(&self) -> &AppliedWaiters {
        &self.waiters
    }

    /// Wakes on every change of the applied store revision, and on every snapshot
    /// install (which may compact history without changing the revision). The value is
    /// the revision as published; the state may already be ahead of it.
    pub fn subscribe_revision(&self) -> tokio::sync::watch::Receiver<i64> {
        self.revision.subscribe()
    }

    /// Whether auth is on in the applied state.
    pub fn auth_enabled(&self) -> bool {
        self.auth_enabled.load(std::sync::atomic::Ordering::Acquire)
    }

    fn set_auth_enabled(&self, on: bool) {
        self.auth_enabled
            .store(on, std::sync::atomic::Ordering::Release);
    }

    /// Publishes `revision` if it differs from the last one: an apply batch that created
    /// no revision (session commands, ticks, duplicates) wakes no watcher.
    fn publish_revision(&self, revision: i64) {
        self.revision.send_if_modified(|r| {
            let changed = *r != revision;
            *r = revision;
            changed
        });
    }

    /// See [`NodeCore::corrupt_value_for_test`](crate::request_path::NodeCore::corrupt_value_for_test).
    pub(crate) fn corrupt_value_for_test(&self, key: &[u8], value: &[u8]) -> bool {
        self.write().sm.corrupt_value_for_test(key, value)
    }

    fn applied_up_to(&self, index: u64) {
        self.waiters.complete_up_to(&index, |_| ());
    }
}

/// openraft's state machine storage.
#[derive(Debug, Clone)]
pub struct SmStore {
    applied: Arc<Applied>,
    dir: PathBuf,
    disk: Arc<dyn Disk>,
    observer: Option<Arc<dyn ApplyObserver>>,
    /// The last log id of the snapshot file on disk; also serializes writers, so an older
    /// snapshot built concurrently never replaces a newer installed one.
    persisted: Arc<std::sync::Mutex<Option<LogId>>>,
    /// An entry whose apply takes longer is logged (etcd's
    /// `--experimental-warning-apply-duration`).
    warn_apply: std::time::Duration,
    /// Told how long each snapshot file took to write (etcd's
    /// `etcd_debugging_snap_save_total_duration_seconds`).
    on_save: Option<SaveObserver>,
    /// The member's log when it acknowledges its own appends before they are durable:
    /// an entry is applied only once it is durable there (see [`Durability`]).
    durability: Option<Durability<NodeId>>,
    /// The metadata of the snapshot loaded at open, until raft first asks for the
    /// current snapshot (see `get_current_snapshot`).
    opened_with: Arc<std::sync::Mutex<Option<SnapshotMeta<NodeId, Member>>>>,
}

/// Receives the time each snapshot file took to write and sync.
#[derive(Clone)]
pub struct SaveObserver(pub Arc<dyn Fn(std::time::Duration) + Send + Sync>);

impl std::fmt::Debug for SaveObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SaveObserver")
    }
}

fn sm_err(e: impl std::fmt::Display) -> StorageError {
    StorageIOError::write_state_machine(AnyError::error(e)).into()
}

fn snap_err(
    meta: Option<&SnapshotMeta<NodeId, Member>>,
    e: impl std::fmt::Display,
) -> StorageError {
    StorageIOError::write_snapshot(meta.map(|m| m.signature()), AnyError::error(e)).into()
}

/// etcd's default for `--experimental-warning-apply-duration`.
pub const DEFAULT_WARN_APPLY: std::time::Duration = std::time::Duration::from_millis(100);

impl SmStore {
    /// Logs a warning for every entry whose apply takes longer than `limit`.
    pub fn with_apply_warning(mut self, limit: std::time::Duration) -> SmStore {
        self.warn_apply = limit;
        self
    }

    /// Applies an entry only once `durability` says it is durable in the member's log.
    pub fn with_durability(mut self, durability: Durability<NodeId>) -> SmStore {
        self.durability = Some(durability);
        self
    }

    /// Sets who is told how long each snapshot file took to write.
    pub fn with_save_observer(mut self, observer: SaveObserver) -> SmStore {
        self.on_save = Some(observer);
        self
    }

    /// Opens the state machine under `dir`, restoring the snapshot file if there is one.
    /// A snapshot that fails its checksum or does not decode is an error, not an empty
    /// state: starting empty would silently lose data.
    pub fn open(dir: &Path, settings: oncekv_core::Settings) -> Result<SmStore, String> {
        SmStore::open_with(dir, settings, crate::disk::os_disk(), None)
    }

    /// As [`open`](Self::open), on `disk`, with an optional observer.
    pub fn open_with(
        dir: &Path,
        settings: oncekv_core::Settings,
        disk: Arc<dyn Disk>,
        observer: Option<Arc<dyn ApplyObserver>>,
    ) -> Result<SmStore, String> {
        disk.create_dir_all(dir)
            .map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let path = dir.join(SNAPSHOT_FILE);
        let mut inner = AppliedInner {
            sm: StateMachine::new(settings),
            last_applied: None,
            membership: StoredMembership::default(),
            snapshot_bytes: 0,
        };
        let mut opened_with = None;
        if let Some(loaded) = load_snapshot_file(&*disk, &path)
            .map_err(|e| format!("snapshot {}: {e}", path.display()))?
        {
            opened_with = Some(loaded.meta.clone());
            inner.sm = loaded.sm;
            inner.last_applied = loaded.meta.last_log_id;
            inner.membership = loaded.meta.last_membership;
            inner.snapshot_bytes = loaded.bytes;
        }
        if let Some(o) = &observer {
            o.prepare(&mut inner.sm);
        }
        let persisted = Arc::new(std::sync::Mutex::new(inner.last_applied));
        let (revision, _) = tokio::sync::watch::channel(inner.sm.revision());
        let auth_enabled = std::sync::atomic::AtomicBool::new(inner.sm.auth().enabled());
        Ok(SmStore {
            disk,
            observer,
            applied: Arc::new(Applied {
                inner: RwLock::new(inner),
                waiters: WaitingList::new(),
                revision,
                auth_enabled,
                snapshot_builds: Arc::default(),
            }),
            dir: dir.to_path_buf(),
            persisted,
            warn_apply: DEFAULT_WARN_APPLY,
            on_save: None,
            durability: None,
            opened_with: Arc::new(std::sync::Mutex::new(opened_with)),
        })
    }

    pub fn applied(&self) -> Arc<Applied> {
        self.applied.clone()
    }

    fn current_snapshot_file(&self) -> Option<SnapshotFile> {
        let bytes = self.disk.read(&self.dir.join(SNAPSHOT_FILE)).ok()?;
        // The image is cut out of the file's buffer in place: a copy would hold the
        // whole state's encoding twice.
        SnapshotFile::from_file_bytes(bytes).ok()
    }

    /// Writes the snapshot file durably (temp file, fsync, rename, fsync dir), unless a
    /// newer one is already there. Returns the file size.
    fn persist(&self, meta: &SnapshotMeta<NodeId, Member>, image: &Image) -> Result<u64, String> {
        let mut persisted = self.persisted.lock().unwrap_or_else(|p| p.into_inner());
        if *persisted > meta.last_log_id {
            return Ok(0);
        }
        let head = snapshot_file_head(meta, image)?;
        let path = self.dir.join(SNAPSHOT_FILE);
        let started = std::time::Instant::now();
        write_atomically_with(&*self.disk, &path, |file| {
            file.write_all(&head)?;
            image.write_to(file)
        })
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
        if let Some(observe) = &self.on_save {
            (observe.0)(started.elapsed());
        }
        *persisted = meta.last_log_id;
        Ok((head.len() + image.len()) as u64)
    }
}

impl RaftStateMachine<TypeConfig> for SmStore {
    type SnapshotBuilder = SmStore;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembership<NodeId, Member>), StorageError> {
        let inner = self.applied.read();
        Ok((inner.last_applied, inner.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<EntryResponses>, StorageError>
    where
        I: IntoIterator<Item = openraft::Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<openraft::Entry<TypeConfig>> = entries.into_iter().collect();
        if let (Some(durability), Some(last)) = (&self.durability, entries.last()) {
            // On a leader that acknowledges its own appends early, raft's commit may run
            // ahead of this member's fdatasync: nothing is applied (and so answered, read
            // or put in a snapshot) before it is durable here.
            durability.wait(last.log_id.index).await.map_err(sm_err)?;
        }
        let mut out = Vec::new();
        let (last, revision) = {
            let mut inner = self.applied.write();
            for entry in entries {
                let index = entry.log_id.index;
                inner.last_applied = Some(entry.log_id);
                let started = std::time::Instant::now();
                let responses = match entry.payload {
                    EntryPayload::Blank => {
                        inner.sm.apply_empty(index);
                        Vec::new()
                    }
                    EntryPayload::Normal(payload) => inner.sm.apply(index, &payload),
                    EntryPayload::Membership(m) => {
                        inner.membership = StoredMembership::new(Some(entry.log_id), m);
                        inner.sm.apply_empty(index);
                        Vec::new()
                    }
                };
                let took = started.elapsed();
                if took > self.warn_apply {
                    // etcd's words, so that log searches for slow applies find both.
                    tracing::warn!(
                        index,
                        commands = responses.len(),
                        took = ?took,
                        expected_duration = ?self.warn_apply,
                        "apply request took too long"
                    );
                }
                out.push(EntryResponses(responses));
                if let Some(o) = &self.observer {
                    o.applied(&mut inner.sm);
                }
            }
            self.applied.set_auth_enabled(inner.sm.auth().enabled());
            (
                inner.last_applied.map_or(0, |l| l.index),
                inner.sm.revision(),
            )
        };
        self.applied.publish_revision(revision);
        self.applied.applied_up_to(last);
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, Member>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let mut sm = StateMachine::restore(&data).map_err(|e| snap_err(Some(meta), e))?;
        if let Some(o) = &self.observer {
            o.prepare(&mut sm);
        }
        let size = self
            .persist(meta, &Image::Bytes(&data))
            .map_err(|e| snap_err(Some(meta), e))?;
        let (index, revision) = {
            let mut inner = self.applied.write();
            inner.sm = sm;
            inner.last_applied = meta.last_log_id;
            inner.membership = meta.last_membership.clone();
            inner.snapshot_bytes = size;
            if let Some(o) = &self.observer {
                o.applied(&mut inner.sm);
            }
            self.applied.set_auth_enabled(inner.sm.auth().enabled());
            (meta.last_log_id.map_or(0, |l| l.index), inner.sm.revision())
        };
        // Always wake: the installed state may have compacted history that a watcher
        // still needs even when its revision equals the old one.
        self.applied.revision.send_replace(revision);
        self.applied.applied_up_to(index);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        // Raft's first ask, as it starts (openraft 0.9's `get_initial_state`), reads only
        // the metadata: answered from what open loaded, without reading the file (GBs
        // for a large state, held beside the state just loaded from it). Every later
        // ask is to send the snapshot to a member, and gets the file.
        let opened = self
            .opened_with
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(meta) = opened {
            return Ok(Some(Snapshot {
                meta,
                snapshot: Box::new(Cursor::new(Vec::new())),
            }));
        }
        Ok(self.current_snapshot_file().map(|f| Snapshot {
            meta: f.meta,
            snapshot: Box::new(Cursor::new(f.data)),
        }))
    }
}

impl SmStore {
    /// Copies the state, encodes the copy and writes the snapshot file. Blocking: seconds
    /// for a large history.
    // openraft's StorageError is large; it is what the trait returns.
    #[allow(clippy::result_large_err)]
    fn build_snapshot_blocking(&self) -> Result<Snapshot<TypeConfig>, StorageError> {
        // Copy under the lock, encode after it: apply waits for this lock. The key
        // space's map and its history share their nodes and chunks with the copy, so
        // what is copied here is the small tables (sessions, leases, auth).
        let started = std::time::Instant::now();
        let (sm, last, membership) = {
            let inner = self.applied.read();
            (
                inner.sm.clone(),
                inner.last_applied,
                inner.membership.clone(),
            )
        };
        // Encoded as it is written (after a pass that measures it and one that checksums
        // it, since both go in front), never held whole in memory: with a long history
        // the image is hundreds of MB, and every member builds one at the same entry.
        let copied = started.elapsed();
        let view = sm.snapshot_view();
        let len = postcard::experimental::serialized_size(&view).map_err(sm_err)?;
        let meta = SnapshotMeta {
            last_log_id: last,
            last_membership: membership,
            snapshot_id: match last {
                Some(l) => format!("{}-{}-{}", l.leader_id, l.index, len),
                None => format!("empty-{len}"),
            },
        };
        let size = self
            .persist(&meta, &Image::View(&view, len))
            .map_err(|e| snap_err(Some(&meta), e))?;
        drop(view);
        drop(sm);
        self.applied.write().snapshot_bytes = size;
        // etcd logs its snapshots at info too; the copy is the part apply waits for.
        tracing::info!(
            index = last.map_or(0, |l| l.index),
            bytes = size,
            copy_ms = copied.as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            "saved snapshot"
        );
        // openraft 0.9 keeps only the metadata of a snapshot it had built; a follower that
        // needs it gets it from the file (`get_current_snapshot`).
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(Vec::new())),
        })
    }
}

impl RaftSnapshotBuilder<TypeConfig> for SmStore {
    #[allow(clippy::result_large_err)]
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        // On a thread of its own: run on the async runtime, encoding a history of
        // hundreds of MB held a worker for seconds, and with every member snapshotting
        // at the same index (as they do) no heartbeat went out meanwhile and the cluster
        // changed leader. A simulation keeps it on the runtime, in seed order.
        let gate = self.applied.snapshot_builds.clone().lock_owned().await;
        if *gate {
            return Err(sm_err("the member is stopping: no snapshot is built"));
        }
        if self.disk.runs_on_runtime() {
            return self.build_snapshot_blocking();
        }
        let store = self.clone();
        tokio::task::spawn_blocking(move || {
            let built = store.build_snapshot_blocking();
            drop(gate);
            built
        })
        .await
        .map_err(|e| sm_err(format!("the snapshot task failed: {e}")))?
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    // A stop waits for the snapshot build in flight to write its file, and no build
    // starts after it: the data directory is final once a member's stop returns.
    // The state lock is held across awaits on purpose: it keeps the build in flight.
    #[allow(clippy::await_holding_lock)]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stop_waits_for_the_snapshot_build_in_flight_and_refuses_new_ones() {
        use oncekv_core::{Command, LogPayload, Op, PutRequest, Settings};
        let dir = tempfile::TempDir::new().unwrap();
        let store = SmStore::open(dir.path(), Settings::default()).unwrap();
        let applied = store.applied();
        {
            let mut inner = applied.write();
            let put = PutRequest {
                key: b"k".to_vec().into(),
                value: b"v".to_vec().into(),
                ..PutRequest::default()
            };
            let entry = LogPayload {
                cluster_time: 1_000,
                commands: vec![Command::Untracked(Op::Put(put))],
            };
            inner.sm.apply(1, &entry);
        }
        let path = dir.path().join(SNAPSHOT_FILE);

        // The build is held where it copies the state, with the gate taken.
        let state = applied.write();
        let mut builder = store.clone();
        let build = tokio::spawn(async move { builder.build_snapshot().await.is_ok() });
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while applied.snapshot_builds.try_lock().is_ok() {
            assert!(Instant::now() < deadline, "the build never took the gate");
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        let stop = tokio::spawn({
            let applied = applied.clone();
            async move { applied.stop_snapshots().await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(!stop.is_finished(), "the stop did not wait for the build");
        drop(state);
        stop.await.unwrap();
        let written =
            std::fs::read(&path).expect("the build's file is there once the stop returns");
        assert!(build.await.unwrap(), "the build in flight failed");

        let mut late = store.clone();
        assert!(
            late.build_snapshot().await.is_err(),
            "a build started after the stop"
        );
        assert_eq!(
            std::fs::read(&path).unwrap(),
            written,
            "the file changed after the stop"
        );
    }

    // Reopened on a snapshot, the store answers raft's first ask (at its start, for the
    // metadata) without the image, and every later ask (to send it) with the file.
    #[tokio::test]
    async fn the_first_ask_after_open_is_answered_without_reading_the_image() {
        use oncekv_core::{Command, LogPayload, Op, Settings};
        let dir = tempfile::TempDir::new().unwrap();
        {
            let mut store = SmStore::open(dir.path(), Settings::default()).unwrap();
            {
                let mut inner = store.applied.write();
                let entry = LogPayload {
                    cluster_time: 1_000,
                    commands: vec![Command::Untracked(Op::put("k", "v"))],
                };
                inner.sm.apply(1, &entry);
                inner.last_applied = Some(LogId::new(openraft::CommittedLeaderId::new(1, 1), 1));
            }
            store.build_snapshot().await.unwrap();
        }
        let mut store = SmStore::open(dir.path(), Settings::default()).unwrap();
        let first = store.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(first.meta.last_log_id.map(|l| l.index), Some(1));
        assert!(first.snapshot.get_ref().is_empty());
        let second = store.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(second.meta, first.meta);
        let restored = StateMachine::restore(second.snapshot.get_ref()).unwrap();
        assert_eq!(
            restored.kv().get(b"k").map(|v| v.value.clone()),
            Some("v".into())
        );
    }
}
