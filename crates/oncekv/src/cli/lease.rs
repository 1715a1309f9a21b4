//! `lease grant | revoke | keep-alive | timetolive | list`. Lease IDs are read and printed in
//! hex (`%016x`), as etcdctl does.

use std::time::Duration;

use clap::{Args, Subcommand};
use oncekv_client::{Client, Error};
use tokio::time::Instant;

use super::output::Printer;
use super::{CliError, ClientFlags, Options, close, emit, one_shot, parse_lease_id};

#[derive(Debug, Args)]
pub struct LeaseArgs {
    #[command(subcommand)]
    pub command: LeaseCommand,
    #[command(flatten)]
    pub flags: ClientFlags,
}

#[derive(Debug, Subcommand)]
pub enum LeaseCommand {
    /// Creates a lease of TTL seconds (exactly once) and prints its ID in hex.
    Grant {
        /// Time to live, in seconds.
        #[arg(value_name = "TTL", allow_negative_numbers = true)]
        ttl: i64,
    },
    /// Revokes a lease and deletes the keys attached to it (exactly once).
    Revoke {
        /// The lease ID, in hex.
        #[arg(value_name = "ID", value_parser = parse_lease_id)]
        id: i64,
    },
    /// Keeps a lease alive: renews it every third of its TTL until ctrl-c (or once).
    KeepAlive {
        /// Renew once and exit.
        #[arg(long)]
        once: bool,
        /// The lease ID, in hex.
        #[arg(value_name = "ID", value_parser = parse_lease_id)]
        id: i64,
    },
    /// Prints a lease's granted TTL and remaining seconds (and its keys with --keys).
    Timetolive {
        /// The lease ID, in hex.
        #[arg(value_name = "ID", value_parser = parse_lease_id)]
        id: i64,
        /// Also list the keys attached to the lease.
        #[arg(long)]
        keys: bool,
    },
    /// Lists all active leases.
    List,
}

pub async fn run(opts: &Options, command: LeaseCommand) -> Result<(), CliError> {
    opts.printer().no_table()?;
    match command {
        LeaseCommand::Grant { ttl } => {
            one_shot(opts, |c, p| async move {
                let r = c.lease_grant(ttl, 0).await?;
                emit(&p.lease_grant(&r))
            })
            .await
        }
        LeaseCommand::Revoke { id } => {
            one_shot(opts, |c, p| async move {
                let r = c.lease_revoke(id).await.map_err(|e| {
                    CliError::new(format!("failed to revoke lease ({})", CliError::from(e)))
                })?;
                emit(&p.lease_revoke(id, &r))
            })
            .await
        }
        LeaseCommand::KeepAlive { once: true, id } => {
            one_shot(opts, |c, p| async move {
                let r = c.lease_keep_alive(id).await?;
                emit(&p.keep_alive(&r))
            })
            .await
        }
        LeaseCommand::KeepAlive { once: false, id } => {
            let client = opts.client()?;
            let result = keep_alive_until_stopped(&client, &opts.printer(), id).await;
            close(&client).await;
            result
        }
        LeaseCommand::List => {
            one_shot(opts, |c, p| async move {
                let ids = c.lease_leases().await?;
                emit(&p.lease_list(&ids))
            })
            .await
        }
        LeaseCommand::Timetolive { id, keys } => {
            one_shot(opts, |c, p| async move {
                let r = c.lease_time_to_live(id, keys).await?;
                emit(&p.time_to_live(&r, keys))
            })
            .await
        }
    }
}

/// Renews the lease now and then every third of its TTL, printing each renewal, until
/// ctrl-c (or SIGTERM), or until the lease is gone.
///
/// A renewal that fails for another reason (the cluster briefly unreachable) is retried
/// until the lease must have expired; only a failing first renewal is an error.
async fn keep_alive_until_stopped(client: &Client, p: &Printer, id: i64) -> Result<(), CliError> {
    let stop = stop_signal();
    tokio::pin!(stop);
    let mut renewed_at: Option<(Instant, Duration)> = None;
    loop {
        let answer = tokio::select! {
            answer = client.lease_keep_alive(id) => answer,
            () = &mut stop => return Ok(()),
        };
        let wait = match answer {
            Ok(r) => {
                emit(&p.keep_alive(&r))?;
                let ttl = Duration::from_secs(r.ttl.max(1).unsigned_abs());
                renewed_at = Some((Instant::now(), ttl));
                ttl / 3
            }
            Err(Error::LeaseNotFound) => return emit(&p.keep_alive_ended(id)),
            Err(e) => match renewed_at {
                None => return Err(e.into()),
                Some((at, ttl)) if at.elapsed() >= ttl => return emit(&p.keep_alive_ended(id)),
                Some(_) => {
                    eprintln!(
                        "lease {id:016x}: renewal failed, retrying: {}",
                        CliError::from(e)
                    );
                    Duration::from_millis(500)
                }
            },
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = &mut stop => return Ok(()),
        }
    }
}

/// Resolves on ctrl-c or SIGTERM (never, if the handlers cannot be installed).
pub(super) async fn stop_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    () = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => ctrl_c.await,
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await;
}
