//! A damaged raft log on restart: a torn last record is found and cut (the member then
//! catches up from its peers); damage before the tail stops the member with a clear error.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{TestCluster, get, put};
use oncekv_server::Node;

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut segs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segs.sort();
    segs
}

/// Where a segment's records end: past its last non-zero byte (a segment's space is
/// reserved up front, so the file is longer than what was written; every record
/// starts with a non-zero magic, so the last one ends at or after that byte).
fn written_len(path: &Path) -> u64 {
    let bytes = std::fs::read(path).unwrap();
    bytes
        .iter()
        .rposition(|&b| b != 0)
        .map_or(0, |i| i as u64 + 1)
}

/// Offset of the last record's header in a segment (every record starts with `OKVR`). The
/// last non-zero byte is not always in the last record: a record may end with zeros.
fn last_record(path: &Path) -> u64 {
    let bytes = std::fs::read(path).unwrap();
    bytes.windows(4).rposition(|w| w == b"OKVR").unwrap() as u64
}

/// A record header's length: its last byte is the end of the header's own checksum.
const RECORD_HEADER_LEN: u64 = 26;

fn flip_byte(path: &Path, offset: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[offset as usize] ^= 0x5a;
    std::fs::write(path, bytes).unwrap();
}

/// A 3-member cluster with 100 acknowledged writes and one follower stopped; returns the
/// cluster, the leader and the stopped follower.
async fn cluster_with_a_stopped_follower() -> (TestCluster, usize, usize) {
    let mut cluster = TestCluster::start(3, |_| {}).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let mut kv = cluster.kv(leader).await;
    for i in 0..100 {
        put(&mut kv, &format!("k{i:03}"), "v").await.unwrap();
    }
    cluster
        .wait_caught_up(leader, Duration::from_secs(10))
        .await;
    let follower = (leader + 1) % 3;
    cluster.stop(follower).await;
    // Its log is final once `halt` returns: the tests below read and damage the files,
    // and a record written after that (the committed id, written when the last handle
    // of the log went) once landed where a test had just measured the end.
    let log_dir = cluster.configs[follower].data_dir.join("log");
    let contents = |dir: &Path| -> Vec<Vec<u8>> {
        segments(dir)
            .iter()
            .map(|p| std::fs::read(p).unwrap())
            .collect()
    };
    let at_stop = contents(&log_dir);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        contents(&log_dir) == at_stop,
        "the stopped member's log changed after halt returned"
    );
    (cluster, leader, follower)
}

// A crash can tear the last write; restart must notice (checksum), cut it, and let raft
// bring the member back, never serve the damaged record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_last_record_is_detected_and_cut_on_restart() {
    let (mut cluster, leader, follower) = cluster_with_a_stopped_follower().await;
    let log_dir = cluster.configs[follower].data_dir.join("log");
    let newest = segments(&log_dir).pop().unwrap();
    let len = written_len(&newest);
    flip_byte(&newest, last_record(&newest) + RECORD_HEADER_LEN - 1);

    cluster.restart(follower).await;
    let cut = cluster
        .node(follower)
        .core
        .torn_tail()
        .cloned()
        .expect("the damaged tail went unnoticed");
    assert_eq!(cut.path, newest);
    assert!(cut.offset < len && cut.dropped_bytes > 0, "{cut:?}");

    // The member catches up and agrees with the leader.
    cluster
        .wait_caught_up(leader, Duration::from_secs(10))
        .await;
    let lh = cluster.node(leader).core.applied().read().sm.state_hash();
    let fh = cluster.node(follower).core.applied().read().sm.state_hash();
    assert_eq!(lh, fh);
    let mut kv = cluster.kv(follower).await;
    for i in 0..100 {
        assert!(get(&mut kv, &format!("k{i:03}")).await.unwrap().is_some());
    }
}

// Damage that a crash cannot explain (a record followed by later, intact ones) must stop
// the member instead of silently dropping acknowledged entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corruption_before_the_tail_stops_the_member_with_a_clear_error() {
    let (cluster, _leader, follower) = cluster_with_a_stopped_follower().await;
    let log_dir = cluster.configs[follower].data_dir.join("log");
    let oldest = segments(&log_dir).remove(0);
    let len = written_len(&oldest);
    flip_byte(&oldest, len / 2);

    let err = Node::start(cluster.configs[follower].clone())
        .await
        .unwrap_err()
        .to_string();
    let name = oldest.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        err.contains(&name) && err.contains("offset"),
        "unclear error: {err}"
    );
}

// The log is purged up to the last snapshot; with the snapshot file gone, the member must
// not start and must say which file is missing and how to recover, rather than raft's
// "Failed to get log entries".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_snapshot_is_named_with_the_recovery() {
    let mut cluster = TestCluster::start(1, |c| c.snapshot_count = 20).await;
    cluster.wait_leader(Duration::from_secs(10)).await;
    let mut kv = cluster.kv(0).await;
    for i in 0..100 {
        put(&mut kv, &format!("k{i:03}"), "v").await.unwrap();
    }
    let snapshot = cluster.data_dir(0).join("state").join("snapshot.bin");
    // Also wait until no snapshot is due: a build still running when the member stops
    // would write the file again after it is removed below.
    cluster
        .wait_for(
            "a snapshot, a purged log and no snapshot due",
            Duration::from_secs(10),
            |c| {
                let m = c.node(0).core.metrics();
                let index = |l: Option<openraft::LogId<u64>>| l.map_or(0, |l| l.index);
                snapshot.exists()
                    && index(m.purged) > 20
                    && index(m.last_applied) < index(m.snapshot) + 20
            },
        )
        .await;
    cluster.stop(0).await;
    std::fs::remove_file(&snapshot).unwrap();
    let err = cluster.inner.restart(0).await.unwrap_err().to_string();
    assert!(
        err.contains(&snapshot.display().to_string())
            && err.contains("is missing")
            && err.contains("--initial-cluster-state existing"),
        "{err}"
    );
}
