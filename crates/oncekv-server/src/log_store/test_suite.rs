//! openraft's storage conformance suite on [`LogStore`], with a minimal in-memory state
//! machine (the real one lives elsewhere; the suite needs some state machine).

// openraft's trait signatures and its suite dictate `StorageError` as the error type.
#![allow(clippy::result_large_err)]

use std::io::Cursor;
use std::sync::{Arc, Mutex};

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{
    AnyError, EntryPayload, LogId, RaftSnapshotBuilder, SnapshotMeta, StorageError, StorageIOError,
    StoredMembership,
};
use serde::{Deserialize, Serialize};
use tempfile::TempDir;

use super::{LogStore, LogStoreOptions};

openraft::declare_raft_types!(
    /// Type config of the storage tests: string commands, string responses.
    pub(crate) TestConfig:
        D = String,
        R = String,
);

/// What the test state machine remembers, which is also its snapshot content.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Applied {
    last_applied: Option<LogId<u64>>,
    membership: StoredMembership<u64, openraft::BasicNode>,
    commands: Vec<String>,
}

type StoredSnapshot = (SnapshotMeta<u64, openraft::BasicNode>, Vec<u8>);

/// An in-memory state machine: applies by remembering, snapshots with postcard.
#[derive(Debug, Clone, Default)]
pub(crate) struct MemStateMachine {
    applied: Arc<Mutex<Applied>>,
    snapshot: Arc<Mutex<Option<StoredSnapshot>>>,
}

fn sm_err(e: impl ToString) -> StorageError<u64> {
    StorageIOError::write_state_machine(AnyError::error(e)).into()
}

impl MemStateMachine {
    fn applied(&self) -> Result<std::sync::MutexGuard<'_, Applied>, StorageError<u64>> {
        self.applied.lock().map_err(sm_err)
    }
}

impl RaftSnapshotBuilder<TestConfig> for MemStateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TestConfig>, StorageError<u64>> {
        let applied = self.applied()?.clone();
        let data = postcard::to_stdvec(&applied).map_err(sm_err)?;
        let meta = SnapshotMeta {
            last_log_id: applied.last_applied,
            last_membership: applied.membership.clone(),
            snapshot_id: format!("snap-{:?}", applied.last_applied.map(|l| l.index)),
        };
        *self.snapshot.lock().map_err(sm_err)? = Some((meta.clone(), data.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TestConfig> for MemStateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<
        (
            Option<LogId<u64>>,
            StoredMembership<u64, openraft::BasicNode>,
        ),
        StorageError<u64>,
    > {
        let a = self.applied()?;
        Ok((a.last_applied, a.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<String>, StorageError<u64>>
    where
        I: IntoIterator<Item = openraft::Entry<TestConfig>> + Send,
    {
        let mut a = self.applied()?;
        let mut out = Vec::new();
        for e in entries {
            a.last_applied = Some(e.log_id);
            match e.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(cmd) => a.commands.push(cmd),
                EntryPayload::Membership(m) => {
                    a.membership = StoredMembership::new(Some(e.log_id), m)
                }
            }
            out.push(String::new());
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<u64>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, openraft::BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<u64>> {
        let data = snapshot.into_inner();
        let applied: Applied = postcard::from_bytes(&data).map_err(sm_err)?;
        *self.applied()? = applied;
        *self.snapshot.lock().map_err(sm_err)? = Some((meta.clone(), data));
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TestConfig>>, StorageError<u64>> {
        let snap = self.snapshot.lock().map_err(sm_err)?.clone();
        Ok(snap.map(|(meta, data)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}

/// Builds a fresh log in a temporary directory (removed when the guard drops).
struct Builder {
    options: LogStoreOptions,
}

impl StoreBuilder<TestConfig, LogStore<TestConfig>, MemStateMachine, TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(TempDir, LogStore<TestConfig>, MemStateMachine), StorageError<u64>> {
        let dir = TempDir::new().map_err(sm_err)?;
        let log = LogStore::open(dir.path(), self.options.clone()).await?;
        Ok((dir, log, MemStateMachine::default()))
    }
}

// The storage contract openraft relies on (log state, purge, truncate, vote, reads).
#[test]
fn log_store_passes_openraft_storage_suite() -> Result<(), StorageError<u64>> {
    Suite::test_all(Builder {
        options: LogStoreOptions::default(),
    })
}

// The same contract with tiny segments and no cache: every read goes to disk and purges
// delete whole segment files, so those paths are covered too.
#[test]
fn log_store_passes_openraft_storage_suite_with_tiny_segments_and_no_cache()
-> Result<(), StorageError<u64>> {
    let options = LogStoreOptions::default()
        .with_segment_bytes(128)
        .with_cache_bytes(0);
    Suite::test_all(Builder { options })
}
