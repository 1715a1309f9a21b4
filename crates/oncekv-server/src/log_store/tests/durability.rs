//! When an append counts as durable: callbacks after fdatasync, group commit, the
//! committed id riding with appends, space reserved ahead, the leader's early
//! acknowledgement and its vote after a restart.

use super::*;

/// Appends `entry(1, index)` with a callback that reports (ok, fsyncs seen when fired).
fn append_reporting(store: &Store, index: u64, tx: mpsc::Sender<(bool, u64)>) -> TestResult {
    let shared = store.inner.shared.clone();
    store.append_with(
        [entry(1, index)],
        Box::new(move |res| {
            let _ = tx.send((res.is_ok(), shared.fsyncs.load(Ordering::SeqCst)));
        }),
    )?;
    Ok(())
}

fn gated(dir: &Path) -> (Arc<SyncGate>, LogStoreOptions, PathBuf) {
    let gate = Arc::new(SyncGate::default());
    let options = LogStoreOptions {
        sync_gate: Some(gate.clone()),
        ..LogStoreOptions::default()
    };
    (gate, options, dir.to_path_buf())
}

// openraft treats the callback as "durable": firing it before fdatasync returned would
// let a leader count an entry that a crash can still lose.
#[tokio::test]
async fn callback_fires_only_after_fdatasync_returned() -> TestResult {
    let dir = TempDir::new()?;
    let (gate, options, path) = gated(dir.path());
    let mut store = LogStore::open(&path, options).await?;
    gate.close();
    let before = store.fsync_count();
    let (tx, rx) = mpsc::channel();
    append_reporting(&store, 0, tx)?;
    gate.wait_arrivals(1); // written, fdatasync not yet called
    assert!(rx.try_recv().is_err(), "callback fired before fdatasync");
    assert_eq!(store.fsync_count(), before);
    // Already readable, as openraft requires when append returns.
    assert_eq!(all_entries(&mut store).await?, expected(1, 0..1));
    gate.open();
    let (ok, fsyncs_when_fired) = rx.recv_timeout(Duration::from_secs(10))?;
    assert!(ok);
    assert_eq!(
        fsyncs_when_fired,
        before + 1,
        "callback fired after exactly its fdatasync"
    );
    Ok(())
}

// Group commit: appends queued while an fdatasync is in flight share the next one, which
// is what makes throughput independent of the fsync latency.
#[tokio::test]
async fn appends_queued_during_an_fsync_share_the_next_one() -> TestResult {
    let dir = TempDir::new()?;
    let (gate, options, path) = gated(dir.path());
    let store = LogStore::<TestConfig>::open(&path, options).await?;
    gate.close();
    let before = store.fsync_count();
    let (tx, rx) = mpsc::channel();
    append_reporting(&store, 0, tx.clone())?;
    gate.wait_arrivals(1); // the first batch holds the writer
    for i in 1..100 {
        append_reporting(&store, i, tx.clone())?;
    }
    gate.open();
    for _ in 0..100 {
        let (ok, _) = rx.recv_timeout(Duration::from_secs(10))?;
        assert!(ok);
    }
    assert_eq!(store.fsync_count() - before, 2, "100 appends, 2 fdatasyncs");
    Ok(())
}

// One append call is one unit for the writer: it is never split over two fdatasyncs,
// which would double the latency of every large append.
#[tokio::test]
async fn one_append_of_many_entries_costs_one_fdatasync() -> TestResult {
    let dir = TempDir::new()?;
    let mut store = open(dir.path()).await?;
    for round in 0..20 {
        let before = store.fsync_count();
        store
            .blocking_append((round * 64..(round + 1) * 64).map(|i| entry(1, i)))
            .await?;
        assert_eq!(store.fsync_count() - before, 1, "round {round}");
    }
    Ok(())
}

// The same without a test hook: appends issued back to back (as a pipelining caller
// would) end up in fewer fdatasyncs than appends.
#[tokio::test]
async fn back_to_back_appends_are_grouped() -> TestResult {
    let dir = TempDir::new()?;
    let store = open(dir.path()).await?;
    let before = store.fsync_count();
    let (tx, rx) = mpsc::channel();
    let n = 500;
    for i in 0..n {
        append_reporting(&store, i, tx.clone())?;
    }
    let mut last_seen = 0;
    for _ in 0..n {
        let (ok, fsyncs) = rx.recv_timeout(Duration::from_secs(30))?;
        assert!(ok);
        assert!(fsyncs > before, "a callback fired before any fdatasync");
        last_seen = last_seen.max(fsyncs);
    }
    let used = store.fsync_count() - before;
    println!("{n} queued appends used {used} fdatasyncs");
    assert!(used < n, "{n} appends used {used} fdatasyncs: no grouping");
    Ok(())
}

// openraft awaits save_committed inside its core loop on every commit: it must not wait
// for an fdatasync of its own. The committed id then rides in front of the next record.
#[tokio::test]
async fn save_committed_costs_no_fdatasync_and_rides_with_the_next_append() -> TestResult {
    let dir = TempDir::new()?;
    let (gate, options, path) = gated(dir.path());
    {
        let mut store = LogStore::<TestConfig>::open(&path, options).await?;
        append_one_by_one(&mut store, 1, 0..5).await?;
        gate.close();
        let before = store.fsync_count();
        // Would hang at the closed gate if it waited for durability.
        tokio::time::timeout(
            Duration::from_secs(10),
            store.save_committed(Some(log_id(1, 4))),
        )
        .await??;
        assert_eq!(store.fsync_count(), before, "save_committed wrote nothing");
        assert_eq!(store.read_committed().await?, Some(log_id(1, 4)));
        gate.open();
        let seg = segment_path(&path, 1);
        assert!(
            !records(&seg).iter().any(|r| r.1 == Kind::Committed as u8),
            "no committed record before the next write"
        );
        store.blocking_append([entry(1, 5)]).await?;
        assert_eq!(store.fsync_count(), before + 1, "one fdatasync for both");
        let kinds: Vec<u8> = records(&seg).iter().map(|r| r.1).collect();
        assert_eq!(
            kinds[kinds.len() - 2..],
            [Kind::Committed as u8, Kind::Entry as u8],
            "the committed id is written in front of the entry, in the same batch"
        );
    }
    let mut store = open(&path).await?;
    assert_eq!(store.read_committed().await?, Some(log_id(1, 4)));
    assert_eq!(all_entries(&mut store).await?, expected(1, 0..6));
    Ok(())
}

// With nothing else to write, flush() and a clean close still save the committed id.
#[tokio::test]
async fn flush_and_close_write_a_pending_committed_id() -> TestResult {
    let dir = TempDir::new()?;
    {
        let mut store = open(dir.path()).await?;
        append_one_by_one(&mut store, 1, 0..5).await?;
        store.save_committed(Some(log_id(1, 2))).await?;
        store.flush().await?;
    }
    {
        let mut store = open(dir.path()).await?;
        assert_eq!(store.read_committed().await?, Some(log_id(1, 2)));
        store.save_committed(Some(log_id(1, 3))).await?;
    }
    let mut store = open(dir.path()).await?;
    assert_eq!(store.read_committed().await?, Some(log_id(1, 3)));
    Ok(())
}

// A crash can cut any suffix of the last batch. Whatever it cuts, the recovered committed
// id must not point past the recovered log (openraft would try to apply entries that are
// gone). Cuts every byte position of a batch holding a committed id and entries.
#[tokio::test]
async fn recovered_committed_never_exceeds_the_recovered_log() -> TestResult {
    let template = TempDir::new()?;
    {
        let mut store = open(template.path()).await?;
        append_one_by_one(&mut store, 1, 0..4).await?;
        store.save_committed(Some(log_id(1, 3))).await?;
        // One batch: committed(3), entries 4..8; then committed(7) alone via flush.
        store.blocking_append((4..8).map(|i| entry(1, i))).await?;
        store.save_committed(Some(log_id(1, 7))).await?;
        store.flush().await?;
    }
    let seg = segment_path(template.path(), 1);
    let full = written_len(&seg) as usize;
    let recs = records(&seg);
    let first_committed = recs
        .iter()
        .find(|r| r.1 == Kind::Committed as u8)
        .map(|r| r.0)
        .ok_or("no committed record written")?;
    for cut in (first_committed..full).step_by(7) {
        let dir = TempDir::new()?;
        let path = dir.path().join("log");
        fs::create_dir_all(&path)?;
        for id in segment_ids(template.path()) {
            fs::copy(segment_path(template.path(), id), segment_path(&path, id))?;
        }
        OpenOptions::new()
            .write(true)
            .open(segment_path(&path, 1))?
            .set_len(cut as u64)?;
        let mut store = open(&path).await?;
        let last = store.get_log_state().await?.last_log_id.map(|l| l.index);
        let committed = store.read_committed().await?.map(|l| l.index);
        assert!(
            committed <= last,
            "cut at {cut}: committed {committed:?} beyond last entry {last:?}"
        );
    }
    Ok(())
}

/// Whether the file system under `dir` reserves blocks (tmpfs and ext4 do).
fn reserves_space(dir: &Path) -> bool {
    use crate::disk::AppendFile;
    let path = dir.join("probe");
    let reserved = fs::File::create(&path).is_ok_and(|mut f| f.preallocate(4096).is_ok());
    let _ = fs::remove_file(&path);
    reserved
}

// A segment is kept reserved ahead of its records (appends then grow no file);
// a sealed one is cut back to its records, and a restart cuts the newest one's zeros
// quietly: every entry back, no torn tail reported, and the next restart still clean.
#[tokio::test]
async fn segments_are_reserved_and_cut_back_to_their_records() -> TestResult {
    const SEGMENT: u64 = 4096;
    let dir = TempDir::new()?;
    let options = || {
        LogStoreOptions::default()
            .with_segment_bytes(SEGMENT)
            .with_cache_bytes(0)
    };
    let reserves = reserves_space(dir.path());
    {
        let mut store = LogStore::open(dir.path(), options()).await?;
        append_one_by_one(&mut store, 1, 0..60).await?;
        let ids = segment_ids(dir.path());
        assert!(
            ids.len() >= 2,
            "60 entries of ~100 bytes fill a 4 KiB segment"
        );
        for &id in &ids[..ids.len() - 1] {
            let seg = segment_path(dir.path(), id);
            assert_eq!(fs::metadata(&seg)?.len(), written_len(&seg), "sealed {id}");
        }
        let newest = segment_path(dir.path(), ids[ids.len() - 1]);
        if reserves {
            // Reserved ahead of the records, by at most two steps (a segment's size each).
            let (len, written) = (fs::metadata(&newest)?.len(), written_len(&newest));
            assert!(
                len > written && len <= written + 2 * SEGMENT,
                "{len} {written}"
            );
        }
    }
    for _ in 0..2 {
        let newest = segment_path(dir.path(), segment_ids(dir.path()).pop().unwrap_or(0));
        let mut store = LogStore::open(dir.path(), options()).await?;
        assert!(store.torn_tail().is_none(), "{:?}", store.torn_tail());
        assert_eq!(all_entries(&mut store).await?, expected(1, 0..60));
        assert_eq!(fs::metadata(&newest)?.len(), written_len(&newest));
    }
    Ok(())
}

// A batch torn inside the reserved space (some of it written, zeros after) is still a
// torn tail: cut at the damaged record and reported.
#[tokio::test]
async fn torn_write_inside_reserved_space_is_a_torn_tail() -> TestResult {
    let dir = TempDir::new()?;
    {
        let mut store = open(dir.path()).await?;
        append_one_by_one(&mut store, 1, 0..10).await?;
    }
    let seg = segment_path(dir.path(), 1);
    let last = entry_records(&seg)[9];
    let end = written_len(&seg);
    // Entry 9's record, its last 5 bytes lost, where zeros were.
    let mut buf = fs::read(&seg)?;
    buf.truncate(end as usize);
    for b in &mut buf[end as usize - 5..] {
        *b = 0;
    }
    if reserves_space(dir.path()) {
        buf.resize(64 << 20, 0);
    }
    fs::write(&seg, &buf)?;

    let mut store = open(dir.path()).await?;
    assert_eq!(all_entries(&mut store).await?, expected(1, 0..9));
    let torn = store
        .torn_tail()
        .ok_or("the torn record must be reported")?;
    assert_eq!(torn.offset, last as u64);
    assert_eq!(fs::metadata(&seg)?.len(), last as u64);
    Ok(())
}

// Past the first reservation, the writer reserves the next step before it writes there:
// 5 MiB of entries leave the segment reserved beyond them, by at most one step.
#[tokio::test]
async fn the_reservation_moves_ahead_of_the_records() -> TestResult {
    const STEP: u64 = 4 << 20;
    let dir = TempDir::new()?;
    if !reserves_space(dir.path()) {
        eprintln!("skipped: this file system reserves no blocks");
        return Ok(());
    }
    let big = |i: u64| Entry::<TestConfig> {
        log_id: log_id(1, i),
        payload: EntryPayload::Normal(format!("{i:0>65000}")),
    };
    {
        let mut store = open(dir.path()).await?;
        for first in (0..80).step_by(8) {
            store.blocking_append((first..first + 8).map(big)).await?;
        }
        let seg = segment_path(dir.path(), 1);
        let (len, written) = (fs::metadata(&seg)?.len(), written_len(&seg));
        assert!(written > STEP, "{written}");
        assert!(len > written && len <= written + STEP, "{len} {written}");
    }
    let mut store = open(dir.path()).await?;
    assert!(store.torn_tail().is_none());
    let got = store.try_get_log_entries(..).await?;
    assert_eq!(
        summary(&got),
        summary(&(0..80).map(big).collect::<Vec<_>>())
    );
    Ok(())
}

/// What `live_bytes` keeps as a running sum, counted afresh from the slots.
fn recount_live_bytes(store: &Store) -> u64 {
    let state = store.inner.state.lock().unwrap_or_else(|p| p.into_inner());
    state
        .slots
        .iter()
        .map(|s| u64::from(s.len) + RECORD_HEADER_LEN as u64)
        .sum::<u64>()
        + state.segments.len() as u64 * FILE_HEADER_LEN as u64
}

// The ticker reads `live_bytes` every heartbeat (db size, the snapshot rule), so it is a
// running sum; it must agree with a recount through appends, a truncation, a purge and a
// reopen (recovery rebuilds the slots).
#[tokio::test]
async fn live_bytes_keeps_count_through_truncation_purge_and_reopen() -> TestResult {
    let dir = TempDir::new()?;
    let mut store = LogStore::<TestConfig>::open(dir.path(), tiny_segments()).await?;
    assert_eq!(store.live_bytes(), recount_live_bytes(&store));
    append_one_by_one(&mut store, 1, 1..31).await?;
    let full = store.live_bytes();
    assert!(full > 30 * RECORD_HEADER_LEN as u64, "{full}");
    assert_eq!(full, recount_live_bytes(&store));
    store.truncate(log_id(1, 21)).await?;
    assert!(store.live_bytes() < full);
    assert_eq!(store.live_bytes(), recount_live_bytes(&store));
    store.purge(log_id(1, 8)).await?;
    assert_eq!(store.live_bytes(), recount_live_bytes(&store));
    drop(store);
    let store = LogStore::<TestConfig>::open(dir.path(), tiny_segments()).await?;
    assert_eq!(store.live_bytes(), recount_live_bytes(&store));
    Ok(())
}

/// Opens the gate when dropped, so that a failing test does not leave the writer held
/// (dropping the store joins the writer).
struct Reopen(Arc<SyncGate>);

impl Drop for Reopen {
    fn drop(&mut self) {
        self.0.open();
    }
}

// A leader's own appends are acknowledged when queued (raft replicates them while they are
// written); a follower's only once durable, since its acknowledgement tells the leader so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leaders_own_appends_are_acknowledged_before_fdatasync() -> TestResult {
    let dir = TempDir::new()?;
    let (gate, options, path) = gated(dir.path());
    let mut store = LogStore::<TestConfig>::open(&path, options).await?;
    let _reopen = Reopen(gate.clone());
    store.ack_own_appends_early(1);

    // Leading (a committed vote naming this node): acknowledged with the fdatasync held.
    store.save_vote(&Vote::new_committed(2, 1)).await?;
    gate.close();
    tokio::time::timeout(
        Duration::from_secs(10),
        store.blocking_append([entry(2, 0)]),
    )
    .await
    .map_err(|_| "the leader's append was not acknowledged before its fdatasync")??;
    gate.wait_arrivals(1);
    assert_eq!(store.durability().durable_prefix(log_id(2, 0))?, None);
    gate.open();
    store.durability().wait(0).await?;

    // Following node 2: not acknowledged until the fdatasync returned.
    store.save_vote(&Vote::new_committed(3, 2)).await?;
    gate.close();
    let mut follower = store.clone();
    let append = tokio::spawn(async move { follower.blocking_append([entry(3, 1)]).await });
    gate.wait_arrivals(2);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !append.is_finished(),
        "a follower's append acknowledged before its fdatasync"
    );
    gate.open();
    tokio::time::timeout(Duration::from_secs(10), append).await???;
    Ok(())
}

// A member whose own appends are acknowledged early must not resume leading its term
// after a restart (a crash may have taken entries its followers hold): the vote it led
// under comes back as not granted, and the member campaigns for a new term. Another
// member's granted vote comes back as not granted too (at startup a member has no leader
// lease to keep; see `read_vote`); a store that was not told whose it is returns the vote
// as saved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_leader_gets_its_vote_back_as_not_granted() -> TestResult {
    let dir = TempDir::new()?;
    {
        let mut store = open(dir.path()).await?;
        store.save_vote(&Vote::new_committed(4, 1)).await?;
    }
    let mut plain = open(dir.path()).await?;
    assert_eq!(plain.read_vote().await?, Some(Vote::new_committed(4, 1)));
    drop(plain);
    let mut other = open(dir.path()).await?;
    other.ack_own_appends_early(2);
    assert_eq!(other.read_vote().await?, Some(Vote::new(4, 1)));
    drop(other);

    let (gate, options, path) = gated(dir.path());
    let mut store = LogStore::<TestConfig>::open(&path, options).await?;
    let _reopen = Reopen(gate.clone());
    store.ack_own_appends_early(1);
    assert_eq!(store.read_vote().await?, Some(Vote::new(4, 1)));
    // In memory as well: until a new vote is saved, an append is not the leader's own and
    // waits for its fdatasync.
    gate.close();
    let mut appender = store.clone();
    let append = tokio::spawn(async move { appender.blocking_append([entry(4, 0)]).await });
    gate.wait_arrivals(1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !append.is_finished(),
        "an append under the restored vote was acknowledged before its fdatasync"
    );
    gate.open();
    tokio::time::timeout(Duration::from_secs(10), append).await???;
    Ok(())
}

/// Opens the log as a member that acknowledges its own appends early (node 1).
async fn open_as_leader(dir: &Path) -> Result<Store, LogError> {
    let store = open(dir).await?;
    store.ack_own_appends_early(1);
    Ok(store)
}

/// Leaves in `dir` the log of node 1 that led term 4, appended entries 0..3 and closed
/// the log cleanly.
async fn leader_log_closed_cleanly(dir: &Path) -> TestResult {
    let mut store = open_as_leader(dir).await?;
    store.save_vote(&Vote::new_committed(4, 1)).await?;
    store.blocking_append((0..3).map(|i| entry(4, i))).await?;
    assert!(!store.stopped_cleanly());
    store.close_cleanly().await?;
    Ok(())
}

// A leader whose log was closed cleanly gets its vote back as it was, and resumes its
// term; the mark is gone as soon as the log is opened, so a crash after that is a crash
// again, and a write after the mark takes the mark away.
#[tokio::test]
async fn a_leader_stopped_cleanly_resumes_its_term_and_only_then() -> TestResult {
    let dir = TempDir::new()?;
    let marker = dir.path().join(crate::log_store::format::CLEAN_STOP_FILE);
    leader_log_closed_cleanly(dir.path()).await?;
    assert!(marker.exists(), "close_cleanly left no mark");
    let mut store = open_as_leader(dir.path()).await?;
    assert!(store.stopped_cleanly());
    assert!(!marker.exists(), "the mark outlived the open");
    assert_eq!(store.read_vote().await?, Some(Vote::new_committed(4, 1)));
    assert_eq!(
        summary(&store.try_get_log_entries(0..3).await?),
        expected(4, 0..3)
    );
    drop(store);

    // Dropped without close_cleanly: to the next open this is a crash.
    let mut store = open_as_leader(dir.path()).await?;
    assert!(!store.stopped_cleanly());
    assert_eq!(store.read_vote().await?, Some(Vote::new(4, 1)));
    store.save_vote(&Vote::new_committed(5, 1)).await?;

    // Marked, then written to: the write removes the mark before it lands.
    store.close_cleanly().await?;
    assert!(marker.exists());
    // (Acknowledged early, as the leader's own: flush to see it on disk.)
    store.blocking_append([entry(5, 3)]).await?;
    store.flush().await?;
    assert!(
        !marker.exists(),
        "an append after the mark left the mark in place"
    );
    drop(store);
    let mut store = open_as_leader(dir.path()).await?;
    assert!(!store.stopped_cleanly());
    assert_eq!(store.read_vote().await?, Some(Vote::new(5, 1)));
    Ok(())
}

// A mark beside a log whose tail is damaged does not count: the damage says records were
// lost, whatever the mark says.
#[tokio::test]
async fn a_clean_mark_over_a_torn_tail_counts_as_a_crash() -> TestResult {
    let dir = TempDir::new()?;
    leader_log_closed_cleanly(dir.path()).await?;
    let newest = *segment_ids(dir.path()).last().ok_or("no segment")?;
    let path = segment_path(dir.path(), newest);
    let end = written_len(&path);
    let mut bytes = fs::read(&path)?;
    let last = usize::try_from(end)? - 1;
    bytes[last] ^= 0xff;
    fs::write(&path, &bytes)?;

    // Recovery alone (what an open does before its first write) cuts the tail and
    // consumes the mark: a process that dies right after it must not find the mark
    // beside the shortened log at the next open.
    let disk = crate::disk::os_disk();
    let cut = crate::log_store::recovery::recover::<TestConfig>(&*disk, dir.path(), 64 << 20, 0)?;
    assert!(cut.torn_tail.is_some(), "the damaged record was not cut");
    assert!(!cut.clean_stop);
    assert!(
        !dir.path()
            .join(crate::log_store::format::CLEAN_STOP_FILE)
            .exists(),
        "the mark outlived the recovery that cut the log"
    );

    let mut store = open_as_leader(dir.path()).await?;
    assert!(store.torn_tail().is_none(), "cut twice");
    assert!(!store.stopped_cleanly());
    assert_eq!(store.read_vote().await?, Some(Vote::new(4, 1)));
    Ok(())
}

// `Durability` answers from the records' fdatasync, and a truncation takes away what it
// removed: an entry at a truncated index is durable only once its replacement is.
#[tokio::test]
async fn durability_follows_fdatasync_and_truncation() -> TestResult {
    let dir = TempDir::new()?;
    let (gate, options, path) = gated(dir.path());
    let mut store = LogStore::<TestConfig>::open(&path, options).await?;
    let _reopen = Reopen(gate.clone());
    store.blocking_append((0..3).map(|i| entry(1, i))).await?;
    let durability = store.durability();
    assert_eq!(durability.durable_prefix(log_id(1, 2))?, Some(log_id(1, 2)));

    gate.close();
    store.append_with((3..6).map(|i| entry(1, i)), Box::new(|_| {}))?;
    gate.wait_arrivals(1);
    // Written, not yet synced: the durable prefix ends before them.
    assert_eq!(durability.durable_prefix(log_id(1, 5))?, Some(log_id(1, 2)));
    assert_eq!(durability.durable_prefix(log_id(1, 9))?, Some(log_id(1, 2)));
    let waiting = tokio::spawn({
        let d = durability.clone();
        async move { d.wait(4).await }
    });
    // Entries 4 and 5 go; 4 comes back from another term while the first write is held.
    store.truncate(log_id(1, 4)).await?;
    store.append_with([entry(2, 4)], Box::new(|_| {}))?;
    assert_eq!(durability.durable_prefix(log_id(2, 4))?, Some(log_id(1, 2)));
    assert!(matches!(
        durability.wait(5).await,
        Err(LogError::Inconsistent(_))
    ));

    gate.open();
    tokio::time::timeout(Duration::from_secs(10), waiting).await???;
    tokio::time::timeout(Duration::from_secs(10), durability.wait(4)).await??;
    assert_eq!(durability.durable_prefix(log_id(2, 4))?, Some(log_id(2, 4)));
    Ok(())
}
