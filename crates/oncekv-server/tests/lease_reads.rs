//! `--leader-lease-reads`: the leader answers linearizable reads under its lease, without
//! a round of heartbeats per read, and still every read sees every write acknowledged
//! before it (on the leader, and on a follower that asks the leader for its index).

#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::process::Command;
use std::time::Duration;

use common::{TestCluster, get, put};

/// The value of the counter `name` on the member at `endpoint`.
fn counter(endpoint: &str, name: &str) -> f64 {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "10", &format!("{endpoint}/metrics")])
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| {
            let (n, v) = l.rsplit_once(' ')?;
            (n == name).then(|| v.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_reads_skip_rounds_and_see_every_acknowledged_write() {
    // A longer election timeout than the tests' usual 500 ms: a lease of 1.2 s, renewed
    // every 0.6 s, so even a slow machine takes many reads per renewal.
    let c = TestCluster::start(3, |config| {
        config.leader_lease_reads = true;
        config.election_timeout_ms = 1500;
    })
    .await;
    let leader = c.wait_leader(Duration::from_secs(20)).await;
    let (writer, reader) = ((leader + 1) % 3, (leader + 2) % 3);
    let mut on_writer = c.kv(writer).await;
    let mut on_leader = c.kv(leader).await;
    let mut on_reader = c.kv(reader).await;
    let at = c.endpoint(leader);
    let (rounds, leased) = (
        counter(&at, "oncekv_read_index_rounds_total"),
        counter(&at, "oncekv_lease_reads_total"),
    );

    // Each put is acknowledged (through a follower) before the reads start, so both
    // reads must see it.
    for i in 0..100 {
        let value = i.to_string();
        put(&mut on_writer, "k", &value).await.unwrap();
        let read = get(&mut on_leader, "k").await.unwrap().map(|(v, _)| v);
        assert_eq!(read.as_deref(), Some(value.as_str()), "leader read {i}");
        let read = get(&mut on_reader, "k").await.unwrap().map(|(v, _)| v);
        assert_eq!(read.as_deref(), Some(value.as_str()), "follower read {i}");
    }

    let rounds = counter(&at, "oncekv_read_index_rounds_total") - rounds;
    let leased = counter(&at, "oncekv_lease_reads_total") - leased;
    // 200 reads, all through the leader: nearly all under the lease (the first may need
    // a round to take one); rounds only renew it, about one per 0.6 s.
    assert!(leased >= 150.0, "{leased} reads under the lease");
    assert!(
        rounds * 4.0 < leased,
        "{rounds} rounds for {leased} leased reads"
    );
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_flag_every_read_waits_for_a_round() {
    let c = TestCluster::start(3, |_| {}).await;
    let leader = c.wait_leader(Duration::from_secs(20)).await;
    let mut on_leader = c.kv(leader).await;
    put(&mut on_leader, "k", "v").await.unwrap();
    let at = c.endpoint(leader);
    let rounds = counter(&at, "oncekv_read_index_rounds_total");
    for _ in 0..20 {
        get(&mut on_leader, "k").await.unwrap();
    }
    // One read at a time: each its own round.
    let rounds = counter(&at, "oncekv_read_index_rounds_total") - rounds;
    assert!(rounds >= 20.0, "{rounds} rounds for 20 reads");
    assert_eq!(counter(&at, "oncekv_lease_reads_total"), 0.0);
    drop(c);
}
