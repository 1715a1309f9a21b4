//! What the log holds after a restart: torn tails are cut, corruption stops the open,
//! truncation and purge points survive, evicted entries read back from disk.

use super::*;

// An acknowledged write must survive a restart, with the vote and the log pointers:
// losing a vote lets a node vote twice in one term.
#[tokio::test]
async fn restart_recovers_entries_vote_committed_and_purge_point() -> TestResult {
    let dir = TempDir::new()?;
    {
        let mut store = open(dir.path()).await?;
        append_one_by_one(&mut store, 1, 0..10).await?;
        store.save_vote(&Vote::new(3, 2)).await?;
        store.save_committed(Some(log_id(1, 7))).await?;
        store.purge(log_id(1, 2)).await?;
        store.flush().await?;
    }
    let mut store = open(dir.path()).await?;
    assert_eq!(all_entries(&mut store).await?, expected(1, 3..10));
    assert_eq!(store.read_vote().await?, Some(Vote::new(3, 2)));
    assert_eq!(store.read_committed().await?, Some(log_id(1, 7)));
    let state = store.get_log_state().await?;
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 2)));
    assert_eq!(state.last_log_id, Some(log_id(1, 9)));
    Ok(())
}

// A crash mid-write leaves half a record; it was never acknowledged, so the node must
// start with the entries before it instead of refusing to start.
#[tokio::test]
async fn torn_tail_cut_mid_record_is_dropped_and_earlier_entries_survive() -> TestResult {
    let dir = TempDir::new()?;
    {
        let mut store = open(dir.path()).await?;
        append_one_by_one(&mut store, 1, 0..10).await?;
    }
    let seg = segment_path(dir.path(), 1);
    let last = entry_records(&seg)[9];
    let len = written_len(&seg);
    OpenOptions::new()
        .write(true)
        .open(&seg)?
        .set_len(len - 5)?;

    let mut store = open(dir.path()).await?;
    assert_eq!(all_entries(&mut store).await?, expected(1, 0..9));
    assert_eq!(
        fs::metadata(&seg)?.len(),
        last as u64,
        "the torn record is cut off the file"
    );
    // The log goes on from there, and the result survives another restart.
    store.blocking_append([entry(2, 9)]).await?;
    drop(store);
    let mut store = open(dir.path()).await?;
    let mut want = expected(1, 0..9);
    want.extend(expected(2, 9..10));
    assert_eq!(all_entries(&mut store).await?, want);
    Ok(())
}

// Garbage after the last record (a torn write of a batch that never completed, or a
// file extended with junk) is a torn tail too.
#[tokio::test]
async fn garbage_appended_after_last_record_is_cut() -> TestResult {
    let dir = TempDir::new()?;
    {
        let mut store = open(dir.path()).await?;
        append_one_by_one(&mut store, 1, 0..10).await?;
    }
    let seg = segment_path(dir.path(), 1);
    let mut f = OpenOptions::new().append(true).open(&seg)?;
    f.write_all(&[0u8; 700])?;
    f.write_all(&[0xab; 333])?;
    drop(f);

    let mut store = open(dir.path()).await?;
    assert_eq!(all_entries(&mut store).await?, expected(1, 0..10));
    Ok(())
}

// Damage inside the last batch is a torn write even when later records of that same
// batch survived (the disk may persist the pages of one write in any order).
#[tokio::test]
async fn damage_inside_the_unsynced_last_batch_is_a_torn_tail() -> TestResult {
    let dir = TempDir::new()?;
    {
        let mut store = open(dir.path()).await?;
        append_one_by_one(&mut store, 1, 0..3).await?;
        store.blocking_append((3..8).map(|i| entry(1, i))).await?;
    }
    let seg = segment_path(dir.path(), 1);
    let offsets = entry_records(&seg);
    flip_byte(&seg, offsets[4] + RECORD_HEADER_LEN + 3)?; // payload of entry 4

    let mut store = open(dir.path()).await?;
    assert_eq!(all_entries(&mut store).await?, expected(1, 0..4));
    Ok(())
}

// A flipped byte followed by later batches is not a crash artifact: acknowledged data
// changed on disk, and silently dropping it could lose committed writes.
#[tokio::test]
async fn flipped_byte_in_middle_record_fails_open_with_file_and_offset() -> TestResult {
    for (what, delta) in [("payload", RECORD_HEADER_LEN + 2), ("header", 5)] {
        let dir = TempDir::new()?;
        {
            let mut store = open(dir.path()).await?;
            append_one_by_one(&mut store, 1, 0..10).await?;
        }
        let seg = segment_path(dir.path(), 1);
        let at = entry_records(&seg)[4];
        flip_byte(&seg, at + delta)?;

        match open(dir.path()).await {
            Err(LogError::Corrupt {
                path,
                offset,
                reason,
            }) => {
                assert_eq!(path, seg, "{what}");
                assert_eq!(offset, at as u64, "{what}");
                assert!(reason.contains("not a torn write"), "{what}: {reason}");
            }
            other => panic!("{what}: expected a corruption error, got {other:?}"),
        }
        let msg = open(dir.path())
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            msg.contains(&format!("{} at offset {at}", seg.display())),
            "{msg}"
        );
    }
    Ok(())
}

// A segment older than the newest was sealed with fdatasync, so even damage at its very
// end is corruption.
#[tokio::test]
async fn damage_in_a_sealed_segment_fails_open() -> TestResult {
    let dir = TempDir::new()?;
    {
        let mut store = LogStore::open(dir.path(), tiny_segments()).await?;
        append_one_by_one(&mut store, 1, 0..10).await?;
    }
    let seg = segment_path(dir.path(), 1);
    let len = fs::metadata(&seg)?.len();
    OpenOptions::new()
        .write(true)
        .open(&seg)?
        .set_len(len - 1)?;
    match LogStore::<TestConfig>::open(dir.path(), tiny_segments()).await {
        Err(LogError::Corrupt { path, reason, .. }) => {
            assert_eq!(path, seg);
            assert!(reason.contains("newer segment"), "{reason}");
        }
        other => panic!("expected a corruption error, got {other:?}"),
    }
    Ok(())
}

// A crash while a new segment file was being created leaves an empty or headless file;
// it holds nothing acknowledged and must not stop the node.
#[tokio::test]
async fn interrupted_segment_creation_is_removed() -> TestResult {
    let dir = TempDir::new()?;
    {
        let mut store = open(dir.path()).await?;
        append_one_by_one(&mut store, 1, 0..5).await?;
    }
    // The open that went on to create the next segment had cut this one's reserved tail
    // first (recovery does, before the writer starts a segment).
    let seg = segment_path(dir.path(), 1);
    OpenOptions::new()
        .write(true)
        .open(&seg)?
        .set_len(written_len(&seg))?;
    let stray = segment_path(dir.path(), 7);
    fs::write(&stray, b"OKVSEG")?;
    let mut store = open(dir.path()).await?;
    assert!(!stray.exists());
    assert_eq!(all_entries(&mut store).await?, expected(1, 0..5));
    Ok(())
}

// Conflict resolution: a follower drops entries from another term and takes the
// leader's, and must not resurrect the dropped ones after a restart.
#[tokio::test]
async fn truncate_then_append_replaces_entries_and_survives_restart() -> TestResult {
    let dir = TempDir::new()?;
    let mut want = expected(1, 0..5);
    want.extend(expected(2, 5..8));
    {
        let mut store = open(dir.path()).await?;
        append_one_by_one(&mut store, 1, 0..10).await?;
        store.truncate(log_id(1, 5)).await?;
        assert_eq!(store.get_log_state().await?.last_log_id, Some(log_id(1, 4)));
        store.blocking_append((5..8).map(|i| entry(2, i))).await?;
        assert_eq!(all_entries(&mut store).await?, want);
    }
    let mut store = open(dir.path()).await?;
    assert_eq!(all_entries(&mut store).await?, want);
    assert_eq!(store.get_log_state().await?.last_log_id, Some(log_id(2, 7)));
    Ok(())
}

// After a snapshot the log is purged; the purge point must survive a restart (else the
// node believes entries exist that are gone) and disk space must be reclaimed.
#[tokio::test]
async fn purge_then_restart_keeps_purge_point_and_deletes_old_segments() -> TestResult {
    let dir = TempDir::new()?;
    {
        let mut store = LogStore::open(dir.path(), tiny_segments()).await?;
        append_one_by_one(&mut store, 1, 0..20).await?;
        let before = segment_ids(dir.path()).len();
        store.purge(log_id(1, 10)).await?;
        store.flush().await?;
        // Segments are deleted off the writer's thread, after the purge is durable.
        let mut after = segment_ids(dir.path()).len();
        for _ in 0..100 {
            if after < before {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            after = segment_ids(dir.path()).len();
        }
        assert!(
            after < before,
            "purge deleted no segment within 2 s: {before} → {after}"
        );
    }
    let mut store = LogStore::<TestConfig>::open(dir.path(), tiny_segments()).await?;
    assert_eq!(all_entries(&mut store).await?, expected(1, 11..20));
    let state = store.get_log_state().await?;
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 10)));

    // Purging past the last entry (snapshot installed from the leader) also persists.
    store.purge(log_id(3, 40)).await?;
    drop(store);
    let mut store = LogStore::<TestConfig>::open(dir.path(), tiny_segments()).await?;
    let state = store.get_log_state().await?;
    assert_eq!(state.last_purged_log_id, Some(log_id(3, 40)));
    assert_eq!(state.last_log_id, Some(log_id(3, 40)));
    store.blocking_append([entry(3, 41)]).await?;
    assert_eq!(all_entries(&mut store).await?, expected(3, 41..42));
    Ok(())
}

// A hole in the log would make Raft's log matching unsound; refuse it.
#[tokio::test]
async fn append_leaving_a_hole_is_rejected() -> TestResult {
    let dir = TempDir::new()?;
    let mut store = open(dir.path()).await?;
    store.blocking_append([entry(1, 0), entry(1, 1)]).await?;
    assert!(store.blocking_append([entry(1, 5)]).await.is_err());
    assert_eq!(all_entries(&mut store).await?, expected(1, 0..2));
    Ok(())
}

// Replication reads old entries from disk once they left the cache; they must come back
// byte-exact, before and after a restart.
#[tokio::test]
async fn evicted_entries_are_read_back_from_disk() -> TestResult {
    let dir = TempDir::new()?;
    let options = LogStoreOptions::default().with_cache_bytes(0);
    {
        let mut store = LogStore::open(dir.path(), options.clone()).await?;
        store.blocking_append((0..50).map(|i| entry(1, i))).await?;
        store.blocking_append([entry(1, 50)]).await?;
        assert!(store.inner.state.lock().map(|s| s.cache_from).unwrap_or(0) > 0);
        assert_eq!(all_entries(&mut store).await?, expected(1, 0..51));
        assert_eq!(
            summary(&store.try_get_log_entries(10..13).await?),
            expected(1, 10..13)
        );
    }
    let mut store = LogStore::<TestConfig>::open(dir.path(), options).await?;
    assert_eq!(
        summary(&store.try_get_log_entries(7..=9).await?),
        expected(1, 7..10)
    );
    assert_eq!(all_entries(&mut store).await?, expected(1, 0..51));
    Ok(())
}
