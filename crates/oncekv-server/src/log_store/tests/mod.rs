//! Behaviour tests of the durable log, with the helpers they share: what survives a
//! restart ([`recovery`]: torn tails, corruption, truncation, purge) and when an append
//! counts as durable ([`durability`]: group commit, callback ordering, reservations).

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, RaftLogReader, Vote};
use tempfile::TempDir;

use super::format::{FILE_HEADER_LEN, Kind, RECORD_HEADER_LEN, parse_record, segment_file_name};
use super::test_suite::TestConfig;
use super::writer::SyncGate;
use super::{LogError, LogStore, LogStoreOptions};

type Store = LogStore<TestConfig>;
type TestResult = Result<(), Box<dyn std::error::Error>>;

fn log_id(term: u64, index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn entry(term: u64, index: u64) -> Entry<TestConfig> {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(format!("put key-{index} value-{term}-{index:0>60}")),
    }
}

/// (term, index, command) of each entry, for comparisons.
fn summary(entries: &[Entry<TestConfig>]) -> Vec<(u64, u64, String)> {
    entries
        .iter()
        .map(|e| {
            let cmd = match &e.payload {
                EntryPayload::Normal(c) => c.clone(),
                other => format!("{other:?}"),
            };
            (e.log_id.leader_id.term, e.log_id.index, cmd)
        })
        .collect()
}

fn expected(term: u64, indexes: std::ops::Range<u64>) -> Vec<(u64, u64, String)> {
    summary(&indexes.map(|i| entry(term, i)).collect::<Vec<_>>())
}

async fn open(dir: &Path) -> Result<Store, LogError> {
    LogStore::open(dir, LogStoreOptions::default()).await
}

fn tiny_segments() -> LogStoreOptions {
    LogStoreOptions::default()
        .with_segment_bytes(256)
        .with_cache_bytes(0)
}

/// Appends each index as its own durable append (so each is its own batch).
async fn append_one_by_one(
    store: &mut Store,
    term: u64,
    indexes: std::ops::Range<u64>,
) -> TestResult {
    for i in indexes {
        store.blocking_append([entry(term, i)]).await?;
    }
    Ok(())
}

fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(segment_file_name(id))
}

fn segment_ids(dir: &Path) -> Vec<u64> {
    let mut ids: Vec<u64> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(super::format::parse_segment_file_name)
        })
        .collect();
    ids.sort_unstable();
    ids
}

/// (offset, kind, batch) of every valid record of a segment file.
fn records(path: &Path) -> Vec<(usize, u8, u64)> {
    let buf = fs::read(path).unwrap_or_default();
    let mut pos = FILE_HEADER_LEN;
    let mut out = Vec::new();
    while let Ok(Some(found)) = parse_record(&buf, pos) {
        out.push((found.offset, found.header.kind, found.header.batch));
        pos = found.end();
    }
    out
}

/// Where a segment's records end: its length, less the zeros reserved past them.
fn written_len(path: &Path) -> u64 {
    let buf = fs::read(path).unwrap_or_default();
    let mut pos = FILE_HEADER_LEN;
    while let Ok(Some(found)) = parse_record(&buf, pos) {
        pos = found.end();
    }
    pos as u64
}

fn entry_records(path: &Path) -> Vec<usize> {
    records(path)
        .into_iter()
        .filter(|r| r.1 == Kind::Entry as u8)
        .map(|r| r.0)
        .collect()
}

fn flip_byte(path: &Path, at: usize) -> TestResult {
    let mut buf = fs::read(path)?;
    buf[at] ^= 0x5a;
    fs::write(path, buf)?;
    Ok(())
}

async fn all_entries(
    store: &mut Store,
) -> Result<Vec<(u64, u64, String)>, Box<dyn std::error::Error>> {
    Ok(summary(&store.try_get_log_entries(..).await?))
}

mod durability;
mod recovery;
