//! `member list / add / remove / update / promote` and `endpoint status`: the cluster as
//! its members see it, and changing who is in it.

use clap::{Args, Subcommand};
use oncekv_client::{Client, Member, MemberListResponse};

use super::endpoint_status::EndpointStatus;
use super::output::Printer;
use super::{CliError, ClientFlags, Options, emit, one_shot};

#[derive(Debug, Args)]
pub struct MemberArgs {
    #[command(subcommand)]
    pub command: MemberCommand,
    #[command(flatten)]
    pub flags: ClientFlags,
}

#[derive(Debug, Subcommand)]
pub enum MemberCommand {
    /// Lists every member: ID (hex), status, name, peer URLs, client URLs, is-learner.
    List,
    /// Adds a member to the cluster, then prints the settings to start it with
    /// (--name, --initial-cluster, --initial-cluster-state existing).
    Add {
        /// The new member's name (used in the printed --initial-cluster).
        name: String,
        /// Where the new member will serve peers (http://IP:PORT).
        #[arg(long)]
        peer_urls: Option<String>,
        /// Add it as a learner: it receives the log but does not vote until promoted.
        #[arg(long)]
        learner: bool,
    },
    /// Removes a member (ID in hex) from the cluster; a removed member stops.
    Remove {
        /// The member's ID, in hex (from member list).
        id: String,
    },
    /// Changes a member's peer URL.
    Update {
        /// The member's ID, in hex.
        id: String,
        #[arg(long)]
        peer_urls: Option<String>,
    },
    /// Makes a learner a voting member (once it has caught up with the leader).
    Promote {
        /// The learner's ID, in hex.
        id: String,
    },
}

/// etcdctl's member ID argument: hex.
fn member_id(arg: &str) -> Result<u64, CliError> {
    u64::from_str_radix(arg, 16).map_err(|e| {
        CliError::new(format!(
            "bad member ID arg ({e}: parsing {arg:?}), expecting ID in Hex"
        ))
    })
}

fn peer_urls(urls: Option<String>) -> Result<Vec<String>, CliError> {
    let urls: Vec<String> = urls
        .iter()
        .flat_map(|u| u.split(','))
        .map(|u| u.trim().to_string())
        .filter(|u| !u.is_empty())
        .collect();
    if urls.is_empty() {
        return Err(CliError::new("member peer urls not provided".to_string()));
    }
    Ok(urls)
}

/// What `member add` prints: etcdctl's lines, including the settings the new member
/// starts with.
fn added_text(name: &str, added: &Member, r: &MemberListResponse) -> String {
    let initial: Vec<String> = r
        .members
        .iter()
        .flat_map(|m| {
            let n = if m.id == added.id { name } else { &m.name };
            m.peer_urls.iter().map(move |u| format!("{n}={u}"))
        })
        .collect();
    format!(
        "Member {:16x} added to cluster {:16x}\n\n\
         ETCD_NAME={name:?}\n\
         ETCD_INITIAL_CLUSTER={:?}\n\
         ETCD_INITIAL_ADVERTISE_PEER_URLS={:?}\n\
         ETCD_INITIAL_CLUSTER_STATE=\"existing\"\n",
        added.id,
        r.header.cluster_id,
        initial.join(","),
        added.peer_urls.join(","),
    )
}

#[derive(Debug, Args)]
pub struct EndpointArgs {
    #[command(subcommand)]
    pub command: EndpointCommand,
    #[command(flatten)]
    pub flags: ClientFlags,
}

#[derive(Debug, Subcommand)]
pub enum EndpointCommand {
    /// Prints each endpoint's status: endpoint, ID, version, db size, is leader, is
    /// learner, raft term, raft index, raft applied index, errors.
    Status {
        /// Ask every member of the cluster (their client URLs from the member list)
        /// instead of the given endpoints.
        #[arg(long)]
        cluster: bool,
    },
    /// Checks each endpoint's health with a linearizable read, as etcdctl does.
    Health {
        /// Every member of the cluster instead of the given endpoints.
        #[arg(long)]
        cluster: bool,
    },
    /// Prints each endpoint's HashKV: equal on every member at one revision (a differing
    /// one means a member's state diverged).
    Hashkv {
        /// Every member of the cluster instead of the given endpoints.
        #[arg(long)]
        cluster: bool,
        /// The revision to hash (0: each member's newest).
        #[arg(long, default_value_t = 0)]
        rev: i64,
    },
}

/// `alarm list | disarm`.
#[derive(Debug, Args)]
pub struct AlarmArgs {
    #[command(subcommand)]
    pub command: AlarmCommand,
    #[command(flatten)]
    pub flags: ClientFlags,
}

#[derive(Debug, Subcommand)]
pub enum AlarmCommand {
    /// Lists the raised alarms (NOSPACE: the space quota was exceeded; CORRUPT: members
    /// disagree on the state).
    List,
    /// Clears every raised alarm (free space first: a NOSPACE alarm comes back with the
    /// next write otherwise).
    Disarm,
}

/// `defrag`.
#[derive(Debug, Args)]
pub struct DefragArgs {
    /// Every member of the cluster instead of the given endpoints.
    #[arg(long)]
    pub cluster: bool,
    #[command(flatten)]
    pub flags: ClientFlags,
}

/// `move-leader`.
#[derive(Debug, Args)]
pub struct MoveLeaderArgs {
    /// The member to lead, by ID in hex (from member list); the leader's endpoint must be
    /// among --endpoints.
    pub id: String,
    #[command(flatten)]
    pub flags: ClientFlags,
}

pub async fn member(client: Client, p: Printer, command: MemberCommand) -> Result<(), CliError> {
    match command {
        MemberCommand::List => {
            let r = client.member_list_response().await?;
            emit(&p.member_list(&r))
        }
        MemberCommand::Add {
            name,
            peer_urls: urls,
            learner,
        } => {
            let (added, r) = client.member_add(peer_urls(urls)?, learner).await?;
            emit(added_text(&name, &added, &r).as_bytes())
        }
        MemberCommand::Remove { id } => {
            let id = member_id(&id)?;
            let r = client.member_remove(id).await?;
            emit(
                format!(
                    "Member {id:16x} removed from cluster {:16x}\n",
                    r.header.cluster_id
                )
                .as_bytes(),
            )
        }
        MemberCommand::Update {
            id,
            peer_urls: urls,
        } => {
            let id = member_id(&id)?;
            let r = client.member_update(id, peer_urls(urls)?).await?;
            emit(
                format!(
                    "Member {id:16x} updated in cluster {:16x}\n",
                    r.header.cluster_id
                )
                .as_bytes(),
            )
        }
        MemberCommand::Promote { id } => {
            let id = member_id(&id)?;
            let r = client.member_promote(id).await?;
            emit(
                format!(
                    "Member {id:16x} promoted in cluster {:16x}\n",
                    r.header.cluster_id
                )
                .as_bytes(),
            )
        }
    }
}

pub async fn endpoint(opts: &Options, command: EndpointCommand) -> Result<(), CliError> {
    match command {
        EndpointCommand::Status { cluster } => {
            one_shot(opts, |c, p| status(c, p, opts.endpoints.clone(), cluster)).await
        }
        EndpointCommand::Health { cluster } => {
            one_shot(opts, |c, _| health(c, opts.endpoints.clone(), cluster)).await
        }
        EndpointCommand::Hashkv { cluster, rev } => {
            one_shot(opts, |c, _| hashkv(c, opts.endpoints.clone(), cluster, rev)).await
        }
    }
}

/// The endpoints a per-member command asks: the given ones, or with `cluster` every
/// member's client URLs.
async fn targets(
    client: &Client,
    given: Vec<String>,
    cluster: bool,
) -> Result<Vec<String>, CliError> {
    if !cluster {
        return Ok(given);
    }
    Ok(client
        .member_list()
        .await?
        .into_iter()
        .flat_map(|m| m.client_urls)
        .collect())
}

/// etcdctl's `endpoint health`: a linearizable read on each endpoint.
async fn health(client: Client, endpoints: Vec<String>, cluster: bool) -> Result<(), CliError> {
    let endpoints = targets(&client, endpoints, cluster).await?;
    let mut unhealthy = 0;
    for endpoint in &endpoints {
        let started = std::time::Instant::now();
        match client.get_at(endpoint, "health").await {
            Ok(()) => emit(
                format!(
                    "{endpoint} is healthy: successfully committed proposal: took = {:?}\n",
                    started.elapsed()
                )
                .as_bytes(),
            )?,
            Err(e) => {
                unhealthy += 1;
                eprintln!(
                    "{endpoint} is unhealthy: failed to commit proposal: {}",
                    CliError::from(e)
                );
            }
        }
    }
    if unhealthy > 0 {
        return Err(CliError::new("unhealthy cluster".to_string()));
    }
    Ok(())
}

/// etcdctl's `endpoint hashkv`: `endpoint, hash` per member.
async fn hashkv(
    client: Client,
    endpoints: Vec<String>,
    cluster: bool,
    rev: i64,
) -> Result<(), CliError> {
    let endpoints = targets(&client, endpoints, cluster).await?;
    let mut failed = 0;
    for endpoint in &endpoints {
        match client.hash_kv(endpoint, rev).await {
            Ok(h) => emit(format!("{endpoint}, {}\n", h.hash).as_bytes())?,
            Err(e) => {
                failed += 1;
                eprintln!(
                    "Failed to get the hash of endpoint {endpoint} ({})",
                    CliError::from(e)
                );
            }
        }
    }
    if failed > 0 {
        return Err(CliError::new(format!(
            "{failed} of {} endpoints did not answer",
            endpoints.len()
        )));
    }
    Ok(())
}

pub async fn alarm(client: Client, command: AlarmCommand) -> Result<(), CliError> {
    let alarms = match command {
        AlarmCommand::List => client.alarm_list().await?,
        AlarmCommand::Disarm => client.alarm_disarm().await?,
    };
    let text: String = alarms
        .iter()
        .map(|a| format!("memberID:{} alarm:{} \n", a.member_id, a.alarm))
        .collect();
    emit(text.as_bytes())
}

pub async fn defrag(client: Client, endpoints: Vec<String>, cluster: bool) -> Result<(), CliError> {
    let endpoints = targets(&client, endpoints, cluster).await?;
    let mut failed = 0;
    for endpoint in &endpoints {
        match client.defragment(endpoint).await {
            Ok(()) => emit(format!("Finished defragmenting etcd member[{endpoint}]\n").as_bytes())?,
            Err(e) => {
                failed += 1;
                eprintln!(
                    "Failed to defragment etcd member[{endpoint}] ({})",
                    CliError::from(e)
                );
            }
        }
    }
    if failed > 0 {
        return Err(CliError::new(format!(
            "{failed} of {} members were not defragmented",
            endpoints.len()
        )));
    }
    Ok(())
}

pub async fn move_leader(client: Client, id: String) -> Result<(), CliError> {
    let target = member_id(&id)?;
    let from = client.move_leader(target).await?;
    emit(format!("Leadership transferred from {from:x} to {target:x}\n").as_bytes())
}

/// Asks each endpoint in turn; prints the answers together, and reports the endpoints
/// that did not answer on stderr (then fails, as etcdctl does).
async fn status(
    client: Client,
    p: Printer,
    endpoints: Vec<String>,
    cluster: bool,
) -> Result<(), CliError> {
    let endpoints = if cluster {
        client
            .member_list()
            .await?
            .into_iter()
            .flat_map(|m| m.client_urls)
            .collect()
    } else {
        endpoints
    };
    let mut answers = Vec::new();
    let mut failed = 0;
    for endpoint in endpoints {
        match client.status(&endpoint).await {
            Ok(status) => answers.push(EndpointStatus { endpoint, status }),
            Err(e) => {
                failed += 1;
                eprintln!(
                    "Failed to get the status of endpoint {endpoint} ({})",
                    CliError::from(e)
                );
            }
        }
    }
    emit(&p.endpoint_status(&answers))?;
    if failed > 0 {
        return Err(CliError::new(format!(
            "{failed} of {} endpoints did not answer",
            failed + answers.len()
        )));
    }
    Ok(())
}
