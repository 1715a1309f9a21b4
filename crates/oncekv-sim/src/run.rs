//! One simulation run: a seeded turmoil world with real oncekv nodes and clients, the
//! fault schedule applied between steps, and the checkers at the end.
//!
//! Here: the options, the report and the run itself. A node's host is in the submodule
//! `hosts`, the faults as the driver applies them in `world`.

mod hosts;
mod world;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use oncekv_core::Settings;
use oncekv_server::Member;
use oncekv_server::request_path::NodeCore;
use oncekv_server::runtime::seed_thread_rng;
use oncekv_server::transport::MessageKind;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::disk::MemDisk;
use crate::duplicate::Duplicates;
use crate::faults::{self, Action};
use crate::lockers::{self, LockerPlan};
use crate::membership;
use crate::net::{CLIENT_PORT, Net, PEER_PORT};
use crate::replicas::{ReplicaObserver, Replicas};
use crate::trace::Trace;
use crate::trap::CommitTrap;
use crate::watchers::{self, WatcherPlan};
use crate::workload::{self, ClientPlan, History};
use hosts::{EPOCH_MS, NodeCtx, client_name, lock, locker_name, node_name, run_node};
use world::World;

/// Mechanisms the simulated server can be told to lose (to prove the checkers catch it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Breaks {
    /// Rule 5 off: a duplicate is executed again.
    pub dedup: bool,
    /// `fdatasync` acknowledges without syncing.
    pub fsync: bool,
    /// The leader acknowledges its own appends before they are durable (as always) but
    /// applies and passes on commits without waiting for its copy.
    pub durability_gates: bool,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub nodes: usize,
    pub clients: usize,
    pub ops_per_client: usize,
    pub faults: bool,
    /// Faults happen in `[1 s, fault_secs)`; everything is healed after.
    pub fault_secs: u64,
    /// Give up (liveness violation) after this much simulated time.
    pub max_secs: u64,
    pub breaks: Breaks,
    /// Run these faults instead of the seed's schedule (targeted regression tests).
    pub schedule: Option<Vec<faults::Step>>,
    /// Run the watchers ([`watchers::specs`]) beside the workload.
    pub watchers: bool,
    /// Run the lockers ([`lockers`]) beside the workload.
    pub lockers: bool,
    /// Replace a member during the faults ([`membership`]).
    pub membership: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            nodes: 3,
            clients: 3,
            ops_per_client: 40,
            faults: true,
            fault_secs: 20,
            max_secs: 120,
            breaks: Breaks::default(),
            schedule: None,
            watchers: true,
            lockers: true,
            membership: true,
        }
    }
}

/// What a run found.
#[derive(Debug)]
pub struct Report {
    pub seed: u64,
    pub violations: Vec<String>,
    pub trace: Vec<String>,
    pub trace_hash: u64,
    pub sim_ms: u64,
    pub calls: usize,
    pub unknown: usize,
    pub entries_observed: u64,
    pub executions: u64,
    pub expiries: u64,
    /// Fault actions applied, by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// Messages delivered twice, by kind.
    pub duplicates: BTreeMap<MessageKind, u64>,
    /// Times the leader was isolated between applying a tracked write and replying.
    pub commit_traps: u64,
    /// Received chunks delayed as lost segments.
    pub losses: u64,
    /// Events the watchers received, and how often their watches resumed on another
    /// member.
    pub watch_events: usize,
    pub watch_resumes: u64,
    /// Times a locker got the lock, and its guarded writes refused because the lock had
    /// been lost meanwhile (fencing at work).
    pub lock_acquisitions: usize,
    pub fenced_refusals: usize,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

/// The message a panic carried, if it was a string.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s
    } else {
        "a panic without a message"
    }
}

/// Puts tokio's task numbering at the same place, modulo 4, before every seed.
///
/// tokio numbers tasks from one counter for the whole process, and a current-thread
/// runtime keeps its tasks in four lists chosen by that number (`id % 4`). When a crashed
/// host's runtime is dropped, its tasks are dropped list by list, so the order in which its
/// connections close and its work stops depends on the numbers its tasks got, i.e. on how
/// many tasks the process made before. Measured on seeds 150-189: shifting the counter by
/// 1, 2 or 3 before the run changed 4, 2 and 3 of the 40 traces, by 4 none, and 8 of them
/// took another path alone than after their predecessors. Spending numbers on a throwaway
/// runtime until the next one is a multiple of 4 makes a seed replay the same alone, after
/// other seeds, and in the tests. (Seeds on several threads at once still take numbers
/// from each other; `oncekv-sim --jobs` therefore runs each seed in its own process.)
pub fn align_task_ids() {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().build() else {
        return;
    };
    rt.block_on(async {
        for _ in 0..8 {
            let Ok(id) = tokio::spawn(async { tokio::task::id() }).await else {
                return;
            };
            if id.to_string().parse::<u64>().is_ok_and(|n| n % 4 == 3) {
                return;
            }
        }
    });
}

/// The replicas' history per watcher, and of the lock (see `run`).
type Watched = Result<Vec<Vec<watchers::Seen>>, String>;
type Locked = Result<Vec<lockers::Change>, String>;

/// Runs `seed` once.
pub fn run(seed: u64, opts: &Options) -> Report {
    align_task_ids();
    seed_thread_rng(seed);
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_f0ce_u64);
    let trace = Trace::default();
    let replicas = Replicas::shared();
    let history: History = Arc::default();
    let settings = Settings {
        session_ttl_ms: 6_000,
        ..Settings::default()
    };
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .epoch(UNIX_EPOCH + Duration::from_millis(EPOCH_MS as u64))
        .simulation_duration(Duration::from_secs(opts.max_secs))
        .tick_duration(Duration::from_millis(1))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(rng.gen_range(2..=25)))
        .build();

    let members: Vec<Member> = (0..opts.nodes)
        .map(|i| Member {
            name: node_name(i),
            peer_url: format!("http://{}:{PEER_PORT}", node_name(i)),
            client_url: format!("http://{}:{CLIENT_PORT}", node_name(i)),
        })
        .collect();
    let cores: Arc<Mutex<Vec<Option<Arc<NodeCore>>>>> =
        Arc::new(Mutex::new(vec![None; opts.nodes]));
    let net = Net::new(rng.r#gen());
    let duplicates = Arc::new(Duplicates::new(rng.r#gen()));
    let trap = Arc::new(CommitTrap::new(
        net.clone(),
        (0..opts.nodes).map(node_name).collect(),
        (0..opts.clients).map(client_name).collect(),
        cores.clone(),
    ));
    let snapshot_count = rng.gen_range(30..=300);
    let mut disks = Vec::new();
    let mut offsets = Vec::new();
    let mut joining = Vec::new();
    let mut stops = Vec::new();
    for i in 0..opts.nodes {
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        stops.push(stop);
        let ctx = NodeCtx {
            index: i,
            members: members.clone(),
            disk: Arc::new(MemDisk::new(opts.breaks.fsync)),
            observer: Arc::new(ReplicaObserver {
                node: i,
                replicas: replicas.clone(),
                break_dedup: opts.breaks.dedup,
                trap: Some(trap.clone()),
            }),
            clock_offset: Arc::default(),
            cores: cores.clone(),
            snapshot_count,
            lease_reads: seed % 2 == 1,
            break_gates: opts.breaks.durability_gates,
            settings,
            trace: trace.clone(),
            net: net.clone(),
            duplicates: duplicates.clone(),
            joining: Arc::default(),
            stop: stop_rx,
        };
        joining.push(ctx.joining.clone());
        disks.push(ctx.disk.clone());
        offsets.push(ctx.clock_offset.clone());
        sim.host(node_name(i), move || run_node(ctx.clone()));
    }
    let faults_end = Duration::from_secs(if opts.faults { opts.fault_secs } else { 0 });
    let endpoints: Vec<String> = (0..opts.nodes)
        .map(|i| format!("http://{}:{CLIENT_PORT}", node_name(i)))
        .collect();
    let clients_running = Arc::new(AtomicUsize::new(opts.clients));
    let specs = if opts.watchers {
        watchers::specs()
    } else {
        Vec::new()
    };
    let records: watchers::Records = Arc::new(Mutex::new(
        specs.iter().map(|_| watchers::Record::default()).collect(),
    ));
    for (index, spec) in specs.iter().enumerate() {
        let plan = WatcherPlan {
            index,
            spec: spec.clone(),
            endpoints: endpoints.clone(),
            clients_running: clients_running.clone(),
            records: records.clone(),
            trace: trace.clone(),
            net: net.clone(),
        };
        sim.client(format!("w{index}"), watchers::run(plan));
    }
    let lock_records: lockers::Records = Arc::default();
    for index in 0..if opts.lockers { lockers::LOCKERS } else { 0 } {
        let plan = LockerPlan {
            index,
            // From the seed without drawing from `rng`: the fault plan stays as it was.
            seed: seed ^ (0x10c4_e250_u64 + index as u64),
            endpoints: endpoints.clone(),
            clients_running: clients_running.clone(),
            records: lock_records.clone(),
            trace: trace.clone(),
            net: net.clone(),
        };
        sim.client(locker_name(index), lockers::run(plan));
    }
    for c in 0..opts.clients {
        let plan = ClientPlan {
            index: c,
            seed: rng.r#gen(),
            ops: opts.ops_per_client,
            endpoints: endpoints.clone(),
            faults_end,
            history: history.clone(),
            trace: trace.clone(),
            net: net.clone(),
        };
        let running = clients_running.clone();
        sim.client(client_name(c), async move {
            let result = workload::run(plan).await;
            running.fetch_sub(1, Ordering::AcqRel);
            result
        });
    }

    let mut schedule = if let Some(s) = &opts.schedule {
        s.clone()
    } else if opts.faults {
        faults::plan(
            &mut rng,
            opts.nodes,
            opts.clients,
            settings.session_ttl_ms,
            faults_end.as_millis() as u64,
        )
    } else {
        Vec::new()
    };
    if opts.faults && opts.schedule.is_none() && opts.membership {
        schedule.extend(membership::plan(seed, faults_end.as_millis() as u64));
        schedule.sort_by_key(|s| s.at_ms);
    }
    let jobs: Arc<Mutex<Vec<membership::Replacement>>> = Arc::default();
    let requests: membership::Requests = Arc::default();
    let admin = schedule
        .iter()
        .any(|s| matches!(s.action, Action::ReplaceMember { .. }));
    if admin {
        let plan = membership::AdminPlan {
            endpoints: endpoints.clone(),
            jobs: jobs.clone(),
            requests: requests.clone(),
            clients_running: clients_running.clone(),
            trace: trace.clone(),
            net: net.clone(),
        };
        sim.client(membership::ADMIN, membership::run(plan));
    }
    let mut world = World {
        nodes: opts.nodes,
        clients: opts.clients,
        lockers: if opts.lockers { lockers::LOCKERS } else { 0 },
        crashed: vec![false; opts.nodes],
        replacing: vec![false; opts.nodes],
        admin,
        joining,
        stops,
        stopped: vec![false; opts.nodes],
        jobs,
        requests,
        disks,
        offsets,
        cores,
        trace: trace.clone(),
        net: net.clone(),
        duplicates: duplicates.clone(),
        trap: trap.clone(),
        applied: BTreeMap::new(),
    };
    let mut violations = Vec::new();
    let mut next = 0;
    let mut last_leader = None;
    loop {
        let now = sim.elapsed().as_millis() as u64;
        while next < schedule.len() && schedule[next].at_ms <= now {
            world.apply(&mut sim, &schedule[next].action, &mut rng);
            next += 1;
        }
        world.serve_admin(&mut sim, &mut rng);
        // A panic in a host's task shuts its runtime down (`tokio_unstable` builds), and
        // turmoil's step then panics: a failure of the seed, reported with its trace
        // like any other rather than unwinding through the caller. Not when a destructor
        // panics again while this unwinds (tokio's scheduler, h2's poisoned streams):
        // that aborts the process, which only a seed run in a child (`--jobs`) survives.
        let stepped = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sim.step())) {
            Ok(stepped) => stepped,
            Err(panic) => {
                let at = sim.elapsed().as_millis();
                violations.push(format!(
                    "a simulated host panicked at {at} ms: {} (its own message is on stderr)",
                    panic_message(&*panic)
                ));
                trace.at(
                    at,
                    "a simulated host panicked; the run stops here".to_string(),
                );
                break;
            }
        };
        for sprung in trap.take_sprung() {
            trace.at(
                sim.elapsed().as_millis(),
                format!(
                    "trap: n{} isolated right after executing (client {}, seq {}) at index {}",
                    sprung.node, sprung.client_id, sprung.seq, sprung.index
                ),
            );
        }
        // Each new leader (or term) in the trace: how long elections take is then part of
        // what a schedule can check.
        let leader = world.leader().map(|l| (l, world.term_of(l)));
        if let Some((l, term)) = leader
            && leader != last_leader
        {
            trace.at(
                sim.elapsed().as_millis(),
                format!("leader n{l}, term {term}"),
            );
            last_leader = leader;
        }
        match stepped {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => {
                violations.push(format!(
                    "liveness or host failure at {} ms: {e}",
                    sim.elapsed().as_millis()
                ));
                break;
            }
        }
    }
    let sim_ms = sim.elapsed().as_millis() as u64;
    // The history each watcher must have seen, and the lock's, from the member that
    // applied the most.
    let (histories, lock_history): (Watched, Locked) = {
        let cores = lock(&world.cores);
        let most = cores
            .iter()
            .flatten()
            .max_by_key(|c| c.applied().read().sm.applied_index());
        match most {
            Some(core) => {
                let applied = core.applied();
                let inner = applied.read();
                (
                    specs
                        .iter()
                        .map(|s| watchers::history_of(&inner.sm, s))
                        .collect(),
                    lockers::history_of(&inner.sm),
                )
            }
            None => {
                let e = "no member is running at the end".to_string();
                (Err(e.clone()), Err(e))
            }
        }
    };
    drop(sim);
    let faults = std::mem::take(&mut world.applied);
    drop(world);

    let history = lock(&history).clone();
    let replicas = lock(&replicas);
    violations.extend(replicas.violations.iter().cloned());
    violations.extend(oncekv_check::check_calls(&history, opts.clients));
    let records = std::mem::take(&mut *lock(&records));
    if opts.watchers {
        match &histories {
            Ok(h) => violations.extend(oncekv_check::watch_order::check(&records, h)),
            Err(e) => violations.push(format!("watchers: {e}")),
        }
    }
    let lock_record = std::mem::take(&mut *lock(&lock_records));
    if opts.lockers {
        match &lock_history {
            Ok(h) => violations.extend(oncekv_check::fencing::check(&lock_record, h)),
            Err(e) => violations.push(format!("lockers: {e}")),
        }
    }
    trace.at(
        u128::from(sim_ms),
        format!(
            "end: applied {:?}, {} entries observed, {} indexes hashed",
            replicas.applied,
            replicas.observed,
            replicas.hashed_indexes()
        ),
    );
    Report {
        seed,
        violations,
        trace_hash: trace.hash(),
        trace: trace.lines(),
        sim_ms,
        calls: history.len(),
        unknown: history
            .iter()
            .filter(|e| e.outcome == workload::Outcome::Unknown)
            .count(),
        entries_observed: replicas.observed,
        executions: replicas.executions,
        expiries: replicas.expiries,
        faults,
        duplicates: duplicates.counts(),
        commit_traps: trap.fired(),
        losses: net.losses(),
        watch_events: records.iter().map(|r| r.seen.len()).sum(),
        watch_resumes: records.iter().map(|r| r.resumes).sum(),
        lock_acquisitions: lock_record.acquisitions.len(),
        fenced_refusals: lock_record
            .acquisitions
            .iter()
            .flat_map(|a| &a.writes)
            .filter(|(_, o)| *o == lockers::WriteOutcome::Refused)
            .count(),
    }
}
