//! The leader writes its own log while the followers write theirs, yet nothing commits
//! before the leader's copy is durable: with the leader's fdatasync held, a put reaches
//! both followers and is not answered; released, it is. With one voter, a put is not
//! answered before the only copy is durable.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use common::{TestCluster, put};
use oncekv_server::disk::{AppendFile, Disk, ReadAt, os_disk};

/// Holds every `sync_data` of the files it created while closed.
#[derive(Debug, Default)]
struct Hold {
    state: Mutex<(bool, u64)>, // (closed, syncs that waited)
    cv: Condvar,
}

impl Hold {
    fn close(&self) {
        self.state.lock().unwrap().0 = true;
    }

    fn open(&self) {
        self.state.lock().unwrap().0 = false;
        self.cv.notify_all();
    }

    fn waiting(&self) -> u64 {
        self.state.lock().unwrap().1
    }

    fn pass(&self) {
        let mut s = self.state.lock().unwrap();
        if s.0 {
            s.1 += 1;
            while s.0 {
                s = self.cv.wait(s).unwrap();
            }
        }
    }
}

/// Opens the hold when dropped: a failing test must not leave a log writer waiting in
/// it, or the cluster's drop (which joins the writer) would never return.
struct OpenOnDrop(Arc<Hold>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

/// The real disk, with fdatasync held at will.
#[derive(Debug)]
struct HeldDisk {
    real: Arc<dyn Disk>,
    hold: Arc<Hold>,
}

struct HeldFile {
    real: Box<dyn AppendFile>,
    hold: Arc<Hold>,
}

impl AppendFile for HeldFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.real.write_all(buf)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.hold.pass();
        self.real.sync_data()
    }

    fn preallocate(&mut self, len: u64) -> io::Result<()> {
        self.real.preallocate(len)
    }
}

impl Disk for HeldDisk {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.real.create_dir_all(dir)
    }
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.real.list_dir(dir)
    }
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.real.read(path)
    }
    fn open_read(&self, path: &Path) -> io::Result<Arc<dyn ReadAt>> {
        self.real.open_read(path)
    }
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn AppendFile>> {
        Ok(Box::new(HeldFile {
            real: self.real.create_new(path)?,
            hold: self.hold.clone(),
        }))
    }
    fn create(&self, path: &Path) -> io::Result<Box<dyn AppendFile>> {
        Ok(Box::new(HeldFile {
            real: self.real.create(path)?,
            hold: self.hold.clone(),
        }))
    }
    fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        self.real.truncate(path, len)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.real.remove_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.real.rename(from, to)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.real.sync_dir(dir)
    }
}

/// Starts `n` members on held disks; returns the holds by member name.
async fn start_held(n: usize) -> (TestCluster, Arc<Mutex<HashMap<String, Arc<Hold>>>>) {
    let holds: Arc<Mutex<HashMap<String, Arc<Hold>>>> = Arc::default();
    let for_tweak = holds.clone();
    let cluster = TestCluster::start(n, move |config| {
        let hold = Arc::new(Hold::default());
        for_tweak
            .lock()
            .unwrap()
            .insert(config.name.clone(), hold.clone());
        config.disk = Arc::new(HeldDisk {
            real: os_disk(),
            hold,
        });
    })
    .await;
    (cluster, holds)
}

fn last_log_index(cluster: &TestCluster, i: usize) -> u64 {
    cluster.node(i).core.metrics().last_log_index.unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_write_while_the_leader_does_and_the_commit_waits_for_the_leader() {
    let (cluster, holds) = start_held(3).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let mut kv = cluster.kv(leader).await;
    put(&mut kv, "warm", "1").await.unwrap();
    cluster
        .wait_caught_up(leader, Duration::from_secs(10))
        .await;
    let name = format!("n{}", leader + 1);
    let hold = holds.lock().unwrap()[&name].clone();

    hold.close();
    let _open = OpenOnDrop(hold.clone());
    let before = last_log_index(&cluster, leader);
    let term = cluster.node(leader).core.metrics().current_term;
    let answered = tokio::spawn(async move { put(&mut kv, "k", "v").await });
    // The leader's write of the put's entry is held in its fdatasync; both followers
    // still receive it (raft replicated it while the leader was writing).
    cluster
        .wait_for(
            "the leader's fdatasync held",
            Duration::from_secs(10),
            |_| hold.waiting() > 0,
        )
        .await;
    // The put's entry (no other writes are under way), sent by this leader: the term
    // must not move (a leader stuck in its own write would soon be replaced, and the new
    // leader's first entry would take this index).
    let entry = before + 1;
    cluster
        .wait_for(
            "both followers hold the entry",
            Duration::from_secs(10),
            move |c| {
                (0..3).filter(|&i| i != leader).all(|i| {
                    let m = c.node(i).core.metrics();
                    assert_eq!(m.current_term, term, "an election replaced the leader");
                    m.last_log_index.unwrap_or(0) >= entry
                })
            },
        )
        .await;
    // The leader and one follower make a quorum in raft's eyes, but the leader's copy is
    // not durable yet: a crash could lose it, so no member applies it, and the client
    // has no answer.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !answered.is_finished(),
        "answered before the leader's copy was durable"
    );
    for i in 0..3 {
        let applied = cluster.node(i).core.applied().read().sm.applied_index();
        assert!(
            applied < entry,
            "member {i} applied {applied} of {entry} before the leader's copy was durable"
        );
    }

    hold.open();
    let revision = tokio::time::timeout(Duration::from_secs(10), answered)
        .await
        .expect("answered once the leader's copy is durable")
        .unwrap()
        .unwrap();
    assert!(revision > 0);
    cluster.inner.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_voter_answers_only_what_is_durable() {
    let (cluster, holds) = start_held(1).await;
    cluster.wait_leader(Duration::from_secs(10)).await;
    let mut kv = cluster.kv(0).await;
    put(&mut kv, "warm", "1").await.unwrap();
    let hold = holds.lock().unwrap().values().next().unwrap().clone();

    hold.close();
    let _open = OpenOnDrop(hold.clone());
    let answered = tokio::spawn(async move { put(&mut kv, "k", "v").await });
    cluster
        .wait_for("the fdatasync held", Duration::from_secs(10), |_| {
            hold.waiting() > 0
        })
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!answered.is_finished(), "answered before it was durable");

    hold.open();
    tokio::time::timeout(Duration::from_secs(10), answered)
        .await
        .expect("answered once durable")
        .unwrap()
        .unwrap();
    cluster.inner.shutdown().await;
}
