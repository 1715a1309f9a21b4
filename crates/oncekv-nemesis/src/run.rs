//! One run: a fresh cluster behind a fresh firewall table, the workload for `--time`
//! seconds while the nemesis strikes, everything healed, service's return measured, the
//! final reads and the history from revision 1 taken, then judged and written.
//!
//! Teardown is by ownership: the cluster, the relays and the firewall table are locals
//! dropped in reverse order (members killed first, the table last) however the run
//! ends, an error or ctrl-c (which drops this future) included.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncekv_check::watch::Watched;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::cluster::{self, Cluster, Target};
use crate::finale;
use crate::firewall::Firewall;
use crate::judge::{self, Counts, Recorded, Verdicts};
use crate::lockers;
use crate::nemesis::{self, Kind, Timing, Tools};
use crate::recorder::Recorder;
use crate::relay::Relays;
use crate::watchers;
use crate::workload::{self, Env};

/// Workers of each kind.
const TRACKED: usize = 3;
const UNTRACKED: usize = 3;
const READERS: usize = 2;
const LEASE_USERS: usize = 1;
const WATCHERS: usize = 2;
const LOCKERS: usize = 2;

/// What to run.
#[derive(Debug, Clone)]
pub struct Spec {
    pub cluster: cluster::Spec,
    pub nemesis: Kind,
    pub time: Duration,
    pub timing: Timing,
    /// This run's output directory (created here).
    pub dir: PathBuf,
}

/// What a run found.
#[derive(Debug)]
pub struct Outcome {
    pub counts: Counts,
    pub verdicts: Verdicts,
    /// For each heal (the last is the final one), how long until service returned.
    pub recovery: Vec<Option<u64>>,
}

/// Runs `spec` once.
pub async fn run(spec: Spec) -> Result<Outcome, String> {
    std::fs::create_dir_all(&spec.dir).map_err(|e| format!("{}: {e}", spec.dir.display()))?;
    let n = spec.cluster.members;
    let firewall = Firewall::create(n, spec.nemesis.needs_relays())?;
    let relays = if spec.nemesis.needs_relays() {
        Some(Relays::start(n).await?)
    } else {
        None
    };
    let mut cluster = Cluster::start(spec.cluster.clone(), &spec.dir)?;
    cluster.wait_ready(Duration::from_secs(30)).await?;

    let recorder = Arc::new(Recorder::new());
    let until = spec.time.as_millis() as u64;
    let env = Env {
        recorder: recorder.clone(),
        endpoints: cluster.endpoints(),
        until,
    };
    let tracked = if cluster.target() == Target::Oncekv {
        TRACKED
    } else {
        0
    };
    // Client indices: tracked writers first (the exactly-once checker counts 0..tracked).
    let mut next = tracked;
    let mut take = |k: usize| {
        let first = next;
        next += k;
        first..next
    };
    let untracked = take(UNTRACKED);
    let readers = take(READERS);
    let lease_users = take(LEASE_USERS);
    let prober = take(1).start;
    let final_reader = take(1).start;

    let mut work = JoinSet::new();
    for c in 0..tracked {
        work.spawn(workload::tracked_writer(env.clone(), c));
    }
    for c in untracked {
        work.spawn(workload::untracked_writer(env.clone(), c));
    }
    for c in readers {
        work.spawn(workload::reader(env.clone(), c));
    }
    for c in lease_users {
        work.spawn(workload::lease_user(env.clone(), c));
    }
    let lock_record = lockers::Shared::default();
    for l in 0..LOCKERS {
        let endpoint = Cluster::endpoint((l + 1) % n);
        work.spawn(lockers::run(
            endpoint,
            l,
            recorder.clone(),
            lock_record.clone(),
            until,
        ));
    }
    let probe = tokio::spawn(workload::prober(
        Env {
            until: until + 60_000,
            ..env.clone()
        },
        prober,
    ));
    let (target_tx, target_rx) = watch::channel(None);
    let mut watch_tasks = JoinSet::new();
    let watch_records: Vec<watchers::Shared> = (0..WATCHERS)
        .map(|_| Arc::new(Mutex::new(Default::default())))
        .collect();
    for (w, record) in watch_records.iter().enumerate() {
        watch_tasks.spawn(watchers::run(
            cluster.endpoints(),
            w,
            recorder.clone(),
            record.clone(),
            target_rx.clone(),
            until + 120_000,
        ));
    }

    let mut tools = Tools {
        cluster: &mut cluster,
        firewall: &firewall,
        relays: relays.as_ref(),
        recorder: &recorder,
    };
    let (mut windows, mut crashes) =
        nemesis::run(spec.nemesis, &mut tools, spec.timing, until).await?;
    let left = until.saturating_sub(recorder.now());
    tokio::time::sleep(Duration::from_millis(left)).await;
    // The final heal (every period healed itself; this also restarts any member that
    // died by itself since).
    crashes.extend(nemesis::heal(&mut tools)?);
    let final_heal = recorder.now();
    windows.push(nemesis::Window {
        fault: "final heal".into(),
        start: final_heal,
        heal: final_heal,
    });
    let workers_done = tokio::time::timeout(Duration::from_secs(40), async {
        while work.join_next().await.is_some() {}
    })
    .await;
    if workers_done.is_err() {
        work.abort_all();
        crashes.push("workers still running 40 s after the end: aborted".into());
    }

    // Service's return after the final heal, then the final reads.
    for _ in 0..300 {
        if finale::unavailability(&recorder.calls(), final_heal, u64::MAX).is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    probe.abort();
    let endpoints = cluster.endpoints();
    finale::final_reads(&recorder, &endpoints, final_reader, tracked).await;
    let leader = cluster.leader().await.unwrap_or(0);
    let history = finale::history(&Cluster::endpoint(leader)).await;
    let last_watched = history.as_ref().ok().map(|h| {
        finale::watched(h, watchers::PREFIX)
            .last()
            .map_or(0, |s| s.revision)
    });
    // Without a history there is nothing to compare with: the watchers stop at once.
    let _ = target_tx.send(Some(last_watched.unwrap_or(0)));
    let watched = tokio::time::timeout(Duration::from_secs(60), async {
        while watch_tasks.join_next().await.is_some() {}
    })
    .await;
    if watched.is_err() {
        watch_tasks.abort_all();
    }
    crashes.extend(
        cluster
            .exited()
            .into_iter()
            .map(|(name, status)| format!("member {name} exited by itself ({status})")),
    );
    drop(cluster);
    drop(relays);
    drop(firewall);

    let calls = recorder.calls();
    let recovery = recovery(&calls, &windows);
    let watches = watch_records
        .iter()
        .map(|r| Watched {
            record: r.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            history: history
                .as_ref()
                .map(|h| finale::watched(h, watchers::PREFIX))
                .unwrap_or_default(),
        })
        .collect();
    let recorded = Recorded {
        tracked,
        watches,
        locks: lock_record
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone(),
        lock_history: history.map(|h| finale::lock_changes(&h)),
        windows,
        calls,
    };
    let verdicts = judge::judge(&recorded, &crashes);
    judge::write(&spec.dir, &recorded, &verdicts)?;
    if verdicts.violations() == 0 {
        // Nothing to look into: keep the history, not the members' logs.
        let _ = std::fs::remove_dir_all(spec.dir.join("logs"));
    }
    Ok(Outcome {
        counts: Counts::of(&recorded.calls),
        verdicts,
        recovery,
    })
}

/// For each heal, how long until service returned, bounded by the next fault.
fn recovery(calls: &[oncekv_check::Event], windows: &[nemesis::Window]) -> Vec<Option<u64>> {
    windows
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let until = windows.get(i + 1).map_or(u64::MAX, |next| next.start);
            finale::unavailability(calls, w.heal, until)
        })
        .collect()
}
