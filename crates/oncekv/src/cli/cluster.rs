//! `member list` and `endpoint status`: the cluster as its members see it.

use clap::{Args, Subcommand};
use oncekv_client::Client;

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
