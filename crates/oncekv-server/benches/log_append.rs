//! What does one durable append cost? The segment log (`oncekv_server::log_store`)
//! against redb with one write transaction (fsync on commit) per batch, for a batch of 1
//! entry and a batch of 64 entries of about 100 bytes each.
//!
//! Run: `cargo bench -p oncekv-server --bench log_append`. The stores live in a temporary
//! directory under `$ONCEKV_BENCH_DIR` (default: the system temp dir); pointing it at a
//! tmpfs such as `/dev/shm`, where fdatasync is free, shows the CPU cost of each format
//! apart from the device's flush latency.
//!
//! Both stores are purged in the untimed setup every few thousand entries, so each runs
//! in the steady state of a Raft log that is compacted after snapshots.
//!
//! A virtual disk's flush latency drifts by orders of magnitude over minutes, which makes
//! criterion's one-after-the-other runs hard to compare. `ONCEKV_BENCH_AB=ROUNDS` adds an
//! interleaved A/B run (ROUNDS rounds of 50 appends to each store, alternating) that
//! prints the median, mean and p90 per batch for both, measured under the same conditions.

use std::cell::Cell;
use std::error::Error;
use std::io::Cursor; // named by declare_raft_types! (default snapshot type)
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput};
use oncekv_server::log_store::{LogStore, LogStoreOptions};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
use redb::{Database, ReadableDatabase, TableDefinition};
use tempfile::TempDir;
use tokio::runtime::Runtime;

openraft::declare_raft_types!(
    /// Bench type config: string commands.
    BenchConfig: D = String, R = String,
);

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
/// Purge (both stores) whenever this many entries were added since the last purge.
const PURGE_EVERY: u64 = 16 * 1024;

fn entry(index: u64) -> Entry<BenchConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        // ~100 bytes encoded, like a small etcd put.
        payload: EntryPayload::Normal(format!(
            "put /registry/pods/default/{index:020} {:>56}",
            "v"
        )),
    }
}

fn batch(start: u64, n: u64) -> Vec<Entry<BenchConfig>> {
    (start..start + n).map(entry).collect()
}

fn temp_dir() -> std::io::Result<TempDir> {
    match std::env::var_os("ONCEKV_BENCH_DIR") {
        Some(base) => TempDir::new_in(base),
        None => TempDir::new(),
    }
}

fn bench_segment_log(c: &mut Criterion, rt: &Runtime, n: u64) -> Result<(), Box<dyn Error>> {
    let dir = temp_dir()?;
    let mut log = rt.block_on(LogStore::<BenchConfig>::open(
        dir.path(),
        LogStoreOptions::default().with_segment_bytes(8 << 20),
    ))?;
    let mut group = c.benchmark_group(format!("append_fsync_{n}_entries"));
    group.throughput(Throughput::Elements(n));
    let mut purger = log.clone();
    // Setup builds many inputs ahead of the timed appends: purge only what is appended.
    let appended = Cell::new(0u64);
    let (mut next, mut purged) = (0u64, 0u64);
    group.bench_function("segment_log", |b| {
        b.iter_batched(
            || {
                if appended.get() - purged >= PURGE_EVERY {
                    purged = appended.get() - PURGE_EVERY / 2;
                    let upto = LogId::new(CommittedLeaderId::new(1, 1), purged);
                    if let Err(e) = rt.block_on(purger.purge(upto)) {
                        panic!("purge failed: {e}");
                    }
                }
                next += n;
                batch(next - n, n)
            },
            |entries| {
                let end = entries.last().map_or(0, |e| e.log_id.index + 1);
                if let Err(e) = rt.block_on(log.blocking_append(entries)) {
                    panic!("append failed: {e}");
                }
                appended.set(end);
            },
            BatchSize::SmallInput,
        );
    });
    group.finish();
    println!(
        "segment_log, {n}-entry batches: {} fdatasyncs for {} appended entries",
        log.fsync_count(),
        appended.get()
    );
    Ok(())
}

fn bench_redb(c: &mut Criterion, n: u64) -> Result<(), Box<dyn Error>> {
    let dir = temp_dir()?;
    let db = Database::create(dir.path().join("log.redb"))?;
    let mut group = c.benchmark_group(format!("append_fsync_{n}_entries"));
    group.throughput(Throughput::Elements(n));
    let appended = Cell::new(0u64);
    let (mut next, mut purged) = (0u64, 0u64);
    group.bench_function("redb", |b| {
        b.iter_batched(
            || {
                if appended.get() - purged >= PURGE_EVERY {
                    purged = appended.get() - PURGE_EVERY / 2;
                    if let Err(e) = redb_purge(&db, purged) {
                        panic!("redb purge failed: {e}");
                    }
                }
                next += n;
                encode(next - n, n)
            },
            |encoded| {
                if let Err(e) = redb_append(&db, &encoded) {
                    panic!("redb append failed: {e}");
                }
                appended.set(encoded.last().map_or(0, |(i, _)| i + 1));
            },
            BatchSize::SmallInput,
        );
    });
    group.finish();
    check_redb(&db, appended.get())?;
    Ok(())
}

/// Entries encoded as the segment log encodes them (postcard), so both store the same bytes.
fn encode(start: u64, n: u64) -> Vec<(u64, Vec<u8>)> {
    batch(start, n)
        .into_iter()
        .map(|e| (e.log_id.index, postcard::to_stdvec(&e).unwrap_or_default()))
        .collect()
}

/// One write transaction per batch; redb's default durability fsyncs on commit.
fn redb_append(db: &Database, entries: &[(u64, Vec<u8>)]) -> Result<(), Box<dyn Error>> {
    let txn = db.begin_write()?;
    {
        let mut table = txn.open_table(LOG)?;
        for (index, bytes) in entries {
            table.insert(index, bytes.as_slice())?;
        }
    }
    txn.commit()?;
    Ok(())
}

fn redb_purge(db: &Database, upto: u64) -> Result<(), Box<dyn Error>> {
    let txn = db.begin_write()?;
    {
        let mut table = txn.open_table(LOG)?;
        table.retain_in(..=upto, |_, _| false)?;
    }
    txn.commit()?;
    Ok(())
}

/// The last entry made it, so redb was not benchmarked doing nothing.
fn check_redb(db: &Database, next: u64) -> Result<(), Box<dyn Error>> {
    if next == 0 {
        return Ok(()); // filtered out: nothing was appended
    }
    let txn = db.begin_read()?;
    let table = txn.open_table(LOG)?;
    if table.get(next - 1)?.is_none() {
        return Err(format!("redb lost entry {}", next - 1).into());
    }
    Ok(())
}

/// Alternates blocks of appends between the two stores and prints latency statistics.
fn interleaved(rt: &Runtime, n: u64, rounds: usize) -> Result<(), Box<dyn Error>> {
    const PER_ROUND: usize = 50;
    let dir = temp_dir()?;
    let mut log = rt.block_on(LogStore::<BenchConfig>::open(
        dir.path().join("segment_log"),
        LogStoreOptions::default(),
    ))?;
    let db = Database::create(dir.path().join("log.redb"))?;
    let (mut seg, mut rdb) = (Vec::new(), Vec::new());
    let (mut next_seg, mut next_rdb) = (0, 0);
    for _ in 0..rounds {
        for _ in 0..PER_ROUND {
            let entries = batch(next_seg, n);
            next_seg += n;
            let t = Instant::now();
            rt.block_on(log.blocking_append(entries))?;
            seg.push(t.elapsed());
        }
        for _ in 0..PER_ROUND {
            let encoded = encode(next_rdb, n);
            next_rdb += n;
            let t = Instant::now();
            redb_append(&db, &encoded)?;
            rdb.push(t.elapsed());
        }
    }
    check_redb(&db, next_rdb)?;
    for (name, times) in [("segment_log", &mut seg), ("redb", &mut rdb)] {
        times.sort_unstable();
        let mean = times.iter().sum::<Duration>() / times.len().max(1) as u32;
        let pct = |p: usize| times[(times.len() * p / 100).min(times.len() - 1)];
        println!(
            "A/B {n:>2}-entry batches  {name:<11}  median {:>8.1} µs  mean {:>8.1} µs  p90 {:>8.1} µs  \
             {:>9.0} entries/s",
            pct(50).as_secs_f64() * 1e6,
            mean.as_secs_f64() * 1e6,
            pct(90).as_secs_f64() * 1e6,
            n as f64 / mean.as_secs_f64(),
        );
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let rt = Runtime::new()?;
    let mut c = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .configure_from_args();
    for n in [1, 64] {
        bench_segment_log(&mut c, &rt, n)?;
        bench_redb(&mut c, n)?;
    }
    c.final_summary();
    if let Some(rounds) = std::env::var("ONCEKV_BENCH_AB")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        for n in [1, 64] {
            interleaved(&rt, n, rounds)?;
        }
    }
    Ok(())
}
