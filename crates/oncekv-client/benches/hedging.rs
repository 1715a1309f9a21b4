//! Hedged writes against a member that stalls now and then: tail latency with hedging
//! off and on, in one run, and proof that hedging applies nothing twice.
//!
//! A 3-member cluster in this process, each member behind a fault proxy; the leader's
//! proxy holds one reply chunk in `STALL_ONE_IN` for `STALL` (a member with disk hiccups).
//! Clients talk to the leader first (as the client does after leader discovery); a
//! hedge goes to a follower, which forwards it to the leader, where it is absorbed by the
//! original. Rounds alternate off / on so both see the same machine.
//!
//! ```sh
//! cargo bench -p oncekv-client --bench hedging
//! ```
//!
//! It prints p50 / p99 / max per mode and their ratio, and checks for every round that
//! the revision grew by exactly the number of puts (each applied once) and that every
//! key's version is the number of puts made to it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use oncekv_client::{Client, ClientConfig};
use oncekv_testkit::fault_proxy::{Delay, FaultProxy};
use oncekv_testkit::local_cluster::TempCluster;

const CLIENTS: usize = 4;
const PUTS_PER_CLIENT: usize = 250;
const ROUNDS: usize = 3;
const STALL_ONE_IN: u32 = 100;
const STALL: Duration = Duration::from_millis(150);

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// One round of puts; returns every put's latency. Panics if a put fails or the cluster
/// applied other than one revision per put.
async fn round(endpoints: &[String], hedge: bool, round: usize, direct: &str) -> Vec<Duration> {
    let config = ClientConfig {
        hedge_writes: hedge,
        ..ClientConfig::default()
    };
    let client = Client::connect(endpoints, config).unwrap();
    // Register the session outside the measurement.
    client
        .put(format!("warm/{round}/{hedge}"), "x")
        .await
        .unwrap();
    let checker = Client::connect([direct], ClientConfig::default()).unwrap();
    let before = checker.get_header_revision().await;
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let key = format!("hedge/{round}/{hedge}/{c}");
            let mut latencies = Vec::with_capacity(PUTS_PER_CLIENT);
            for i in 0..PUTS_PER_CLIENT {
                let started = Instant::now();
                client.put(key.clone(), i.to_string()).await.unwrap();
                latencies.push(started.elapsed());
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let after = checker.get_header_revision().await;
    assert_eq!(
        after - before,
        (CLIENTS * PUTS_PER_CLIENT) as i64,
        "hedge={hedge}: the revision must grow by one per put"
    );
    for c in 0..CLIENTS {
        let kv = checker
            .get(format!("hedge/{round}/{hedge}/{c}"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(kv.version, PUTS_PER_CLIENT as i64, "hedge={hedge}");
    }
    if hedge {
        eprintln!("  round {round}: {} hedges", client.stats().hedges);
    }
    all
}

trait Revision {
    async fn get_header_revision(&self) -> i64;
}

impl Revision for Client {
    async fn get_header_revision(&self) -> i64 {
        self.range("rev", oncekv_client::GetOptions::new())
            .await
            .unwrap()
            .header
            .revision
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let cluster = TempCluster::start(3, |_| {}).await;
        let leader = cluster.wait_leader(Duration::from_secs(10)).await;
        let mut proxies = Vec::new();
        let mut order: Vec<usize> = (0..3).collect();
        order.sort_by_key(|&i| i != leader);
        for &i in &order {
            let proxy = FaultProxy::in_front_of(&cluster.endpoint(i)).await.unwrap();
            if i == leader {
                proxy.set_delay(Delay::stalls(STALL_ONE_IN, STALL));
            }
            proxies.push(proxy);
        }
        let endpoints: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
        let direct = cluster.endpoint(leader);
        let (mut off, mut on) = (Vec::new(), Vec::new());
        for r in 0..ROUNDS {
            off.extend(round(&endpoints, false, r, &direct).await);
            on.extend(round(&endpoints, true, r, &direct).await);
        }
        off.sort();
        on.sort();
        println!(
            "hedged writes, {CLIENTS} clients x {PUTS_PER_CLIENT} puts x {ROUNDS} rounds per mode; \
             the leader stalls one reply chunk in {STALL_ONE_IN} for {STALL:?}"
        );
        println!("{:<10} {:>10} {:>10} {:>10}", "mode", "p50", "p99", "max");
        for (name, l) in [("off", &off), ("on", &on)] {
            println!(
                "{name:<10} {:>10.2?} {:>10.2?} {:>10.2?}",
                percentile(l, 0.50),
                percentile(l, 0.99),
                l[l.len() - 1]
            );
        }
        let ratio = percentile(&on, 0.99).as_secs_f64() / percentile(&off, 0.99).as_secs_f64();
        println!("p99 on/off: {ratio:.2}");
        println!("every put applied once in both modes (revision and versions checked)");
    });
}
