//! The hazard of leader-lease reads: a leader that stops running (a long GC pause, a
//! stopped VM, SIGSTOP) wakes up still believing it leads while another member has
//! been elected and has committed writes. Its lease must have run out by then: leases
//! are measured on the monotonic clock, which runs on while the process is stopped.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{free_port, start_founders_with};

/// The leader's member id as `endpoint` sees it, and that member's own id (0s when it
/// cannot say).
async fn status(endpoint: &str) -> (u64, u64) {
    let Ok(mut client) = etcd_client::Client::connect([endpoint], None).await else {
        return (0, 0);
    };
    match tokio::time::timeout(Duration::from_secs(2), client.status()).await {
        Ok(Ok(s)) => (s.leader(), s.header().map_or(0, |h| h.member_id())),
        _ => (0, 0),
    }
}

/// The index among `endpoints` of a member that reports itself leader, other than
/// `not` (waits up to 20 s).
async fn leader_among(endpoints: &[String], not: Option<usize>) -> usize {
    let start = Instant::now();
    loop {
        for (i, e) in endpoints.iter().enumerate() {
            if Some(i) == not {
                continue;
            }
            let (leader, me) = status(e).await;
            if leader != 0 && leader == me {
                return i;
            }
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no leader");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

async fn value(client: &mut etcd_client::Client) -> Result<String, etcd_client::Error> {
    let r = client.get("k", None).await?;
    Ok(r.kvs()
        .first()
        .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
        .unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_stopped_and_woken_serves_no_stale_read_under_its_lease() {
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let members = start_founders_with(
        dir.path(),
        &ports,
        3,
        &[
            "--leader-lease-reads",
            "--heartbeat-interval",
            "50",
            "--election-timeout",
            "500",
        ],
    );
    let endpoints: Vec<String> = ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{}", p.0))
        .collect();

    let old = leader_among(&endpoints, None).await;
    let mut on_old = etcd_client::Client::connect([endpoints[old].as_str()], None)
        .await
        .unwrap();
    on_old.put("k", "before", None).await.unwrap();
    // Reads on the leader: it holds a lease from here on.
    for _ in 0..20 {
        assert_eq!(value(&mut on_old).await.unwrap(), "before");
    }

    let pid = members.0[old].id();
    signal(pid, "-STOP");
    let new = leader_among(&endpoints, Some(old)).await;
    let mut on_new = etcd_client::Client::connect([endpoints[new].as_str()], None)
        .await
        .unwrap();
    on_new.put("k", "after", None).await.unwrap();

    // The read reaches the stopped leader's socket first; it wakes to that read and to
    // the new leader's messages, in whichever order.
    let read = tokio::spawn(async move {
        let first = tokio::time::timeout(Duration::from_secs(15), value(&mut on_old)).await;
        let second = tokio::time::timeout(Duration::from_secs(15), value(&mut on_old)).await;
        (first, second)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    signal(pid, "-CONT");
    let (first, second) = read.await.unwrap();
    for (n, r) in [first, second].into_iter().enumerate() {
        // An error (not leader, timed out) is allowed; the old value is not.
        if let Ok(Ok(v)) = r {
            assert_eq!(v, "after", "read {n} on the woken leader was stale");
        }
    }
    drop(members);
}
