//! `member list / add / remove / update / promote` and `endpoint status`: the cluster as
//! its members see it, and changing who is in it.

use clap::{Args, Subcommand};
use oncekv_client::{Client, Member, MemberListResponse};

use super::output::{EndpointStatus, Printer};
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
    }
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
