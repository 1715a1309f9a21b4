//! Membership changes in the fault schedule: a member (a follower, or whoever leads at
//! the time) is removed from the cluster with MemberRemove, its disk is wiped, and it is
//! added back as a new member (MemberAdd, then a start with `--initial-cluster-state
//! existing`), catching up from the leader's snapshot or log, while the workload runs on.
//! That is a remove, an add and, for the leader, a leader replacement, under the other
//! faults.
//!
//! An admin host (`a0`, an `oncekv-client`) makes the two calls through the simulated
//! network, retrying until they take (as an operator would); between them it asks the
//! driver, which alone can crash, wipe and restart hosts, to take the node down and later
//! to start it again ([`Requests`]). The plan comes from its own RNG, seeded from the run's
//! seed without drawing from the fault plan's, so the other faults of a seed stay as
//! they were.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncekv_client::{Client, ClientConfig, Error};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::faults::{Action, Step};
use crate::net::{Net, PEER_PORT};
use crate::trace::Trace;

/// The admin host's name.
pub const ADMIN: &str = "a0";

/// Where a replacement stands, as the admin and the driver hand it over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The admin asks the driver to crash and wipe the removed node.
    WipeRequested,
    Wiped,
    /// The admin asks the driver to start the node again, to join.
    StartRequested,
    Started,
}

/// Replacements under way, by node index: the admin writes requests, the driver answers.
pub type Requests = Arc<Mutex<Vec<(usize, Phase)>>>;

/// One replacement the schedule asks for.
#[derive(Debug, Clone)]
pub struct Replacement {
    pub node: usize,
    /// The member id the node has now (what MemberRemove names).
    pub id: u64,
}

/// The membership changes of a seed: one replacement in the fault window, of the leader
/// or of a follower (as it turns out when it runs).
pub fn plan(seed: u64, end_ms: u64) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x6d65_6d62_6572_7321);
    if end_ms < 6_000 {
        return Vec::new();
    }
    let at_ms = rng.gen_range(2_000..end_ms - 4_000);
    let action = if rng.gen_bool(0.5) {
        Action::ReplaceMember { leader: true }
    } else {
        Action::ReplaceMember { leader: false }
    };
    vec![Step { at_ms, action }]
}

/// What the admin host runs.
#[derive(Debug, Clone)]
pub struct AdminPlan {
    pub endpoints: Vec<String>,
    pub jobs: Arc<Mutex<Vec<Replacement>>>,
    pub requests: Requests,
    pub clients_running: Arc<AtomicUsize>,
    pub trace: Trace,
    pub net: Net,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn now_ms() -> u128 {
    turmoil::sim_elapsed().map_or(0, |d| d.as_millis())
}

/// Sets `node`'s phase to `phase` and waits until the driver moved it to `until`.
async fn hand_over(requests: &Requests, node: usize, phase: Phase, until: Phase) {
    {
        let mut r = lock(requests);
        r.retain(|(n, _)| *n != node);
        r.push((node, phase));
    }
    loop {
        if lock(requests).contains(&(node, until)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Retries `call` until it answers `Ok`, or an answer `done` accepts (the change had
/// taken before a lost reply), for up to `limit`.
async fn until_taken<T, F, Fut>(
    what: &str,
    trace: &Trace,
    limit: Duration,
    done: impl Fn(&Error) -> bool,
    call: F,
) -> bool
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match call().await {
            Ok(_) => return true,
            Err(e) if done(&e) => {
                trace.at(now_ms(), format!("admin: {what} had taken: {e}"));
                return true;
            }
            Err(e) => {
                if tokio::time::Instant::now() > deadline {
                    trace.at(now_ms(), format!("admin: {what} gave up: {e}"));
                    return false;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the cluster lists the new member under its name (it joined and published
/// it, through the log), adding it again if a member list shows no member at its peer URL
/// (an add whose reply was lost may have been an uncommitted entry a new leader dropped),
/// as an operator checking `member list` would.
async fn confirm(client: &Client, trace: &Trace, name: &str, peer_url: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while tokio::time::Instant::now() < deadline {
        if let Ok(members) = client.member_list().await {
            match members
                .iter()
                .find(|m| m.peer_urls.iter().any(|u| u == peer_url))
            {
                Some(m) if m.name == name => {
                    trace.at(now_ms(), format!("admin: {name} is a member again"));
                    return;
                }
                Some(_) => {}
                None => {
                    trace.at(
                        now_ms(),
                        format!("admin: {name} is not listed; adding it again"),
                    );
                    let _ = client.member_add(vec![peer_url.to_string()], false).await;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    trace.at(
        now_ms(),
        format!("admin: {name} did not show up as a member"),
    );
}

/// The admin host: carries out each replacement the driver queues, until the workload
/// clients are done and nothing is queued.
pub async fn run(plan: AdminPlan) -> turmoil::Result {
    let config = ClientConfig {
        request_timeout: Duration::from_secs(2),
        ..ClientConfig::untracked()
    };
    let client = Client::connect_with(&plan.endpoints, config, Some(plan.net.connector(ADMIN)))?;
    loop {
        let job = lock(&plan.jobs).pop();
        let Some(job) = job else {
            if plan.clients_running.load(Ordering::Acquire) == 0 {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let name = format!("n{}", job.node);
        plan.trace
            .at(now_ms(), format!("admin: removing {name} ({:x})", job.id));
        let removed = until_taken(
            "member remove",
            &plan.trace,
            Duration::from_secs(30),
            |e| e.to_string().contains("member not found"),
            || client.member_remove(job.id),
        )
        .await;
        if !removed {
            continue;
        }
        hand_over(&plan.requests, job.node, Phase::WipeRequested, Phase::Wiped).await;
        let peer_url = format!("http://{name}:{PEER_PORT}");
        plan.trace
            .at(now_ms(), format!("admin: adding {name} back"));
        let added = until_taken(
            "member add",
            &plan.trace,
            Duration::from_secs(60),
            |e| e.to_string().contains("Peer URLs already exists"),
            || client.member_add(vec![peer_url.clone()], false),
        )
        .await;
        if added {
            hand_over(
                &plan.requests,
                job.node,
                Phase::StartRequested,
                Phase::Started,
            )
            .await;
            plan.trace
                .at(now_ms(), format!("admin: {name} started to join"));
            confirm(&client, &plan.trace, &name, &peer_url).await;
        }
    }
}
