//! `lock` and `elect`: etcdctl's concurrency commands on the oncekv client's lock and
//! election, whose Lock and Campaign calls are tracked commands (a retry after a lost reply
//! never queues a second waiter or candidacy).

use std::process::Stdio;

use clap::Args;
use oncekv_client::{Client, GetOptions, LockOptions};
use tokio_stream::StreamExt as _;

use super::lease::stop_signal;
use super::output::{GetStyle, Printer};
use super::{CliError, ClientFlags, Options, close, emit};

/// etcdctl's exit status for bad arguments (`ExitBadArgs`).
const EXIT_BAD_ARGS: u8 = 128;

#[derive(Debug, Args)]
pub struct LockArgs {
    /// The lock's name; the holder's key is created under "<name>/".
    pub name: String,
    /// A command to run while holding the lock (after `--`); without one, the key is
    /// printed and the lock held until ctrl-c.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    pub command: Vec<String>,
    /// TTL of the lock's lease, in seconds: if this process dies, the lock is released
    /// this long after.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    pub ttl: i64,
    #[command(flatten)]
    pub flags: ClientFlags,
}

#[derive(Debug, Args)]
pub struct ElectArgs {
    /// The election's name; candidates' keys are created under "<name>/".
    pub name: String,
    /// The value to proclaim once elected (required unless --listen).
    pub proposal: Option<String>,
    /// Observe the election instead: print each leader's key and value as it changes.
    #[arg(short = 'l', long)]
    pub listen: bool,
    /// TTL of the candidacy's lease, in seconds: if this process dies, leadership passes
    /// on this long after.
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    pub ttl: i64,
    #[command(flatten)]
    pub flags: ClientFlags,
}

/// Prints `key` as `get` would, from a linearizable read.
async fn print_key(client: &Client, p: &Printer, key: &[u8]) -> Result<(), CliError> {
    let r = client.range(key.to_vec(), GetOptions::new()).await?;
    if r.kvs.is_empty() {
        return Err("lock lost on init".into());
    }
    emit(&p.get(&r, GetStyle::default()))
}

/// `lock NAME [-- COMMAND]`: waits for the lock (ctrl-c gives up), then runs the command
/// with `ETCD_LOCK_KEY` and `ETCD_LOCK_REV` set (plus `ONCEKV_FENCING_TOKEN`, the key's
/// create revision) and releases the lock when it exits; or prints the key and holds the
/// lock until ctrl-c.
pub async fn lock(opts: &Options, args: LockArgs) -> Result<(), CliError> {
    let client = opts.client()?;
    let result = hold_lock(&client, &opts.printer(), args).await;
    close(&client).await;
    result
}

async fn hold_lock(client: &Client, p: &Printer, args: LockArgs) -> Result<(), CliError> {
    let stop = stop_signal();
    tokio::pin!(stop);
    let options = LockOptions::new().with_ttl(args.ttl);
    let guard = tokio::select! {
        guard = client.lock_with(args.name.as_bytes().to_vec(), options) => guard?,
        // Dropping the pending lock leaves the queue (the client revokes its lease).
        () = &mut stop => return Ok(()),
    };
    if let Some((program, rest)) = args.command.split_first() {
        let key = String::from_utf8_lossy(guard.key()).into_owned();
        let status = tokio::process::Command::new(program)
            .args(rest)
            .env("ETCD_LOCK_KEY", &key)
            .env("ETCD_LOCK_REV", guard.revision().to_string())
            .env("ONCEKV_FENCING_TOKEN", guard.fencing_token().to_string())
            .stdin(Stdio::inherit())
            .status()
            .await;
        let unlocked = guard.unlock().await;
        let status = status.map_err(|e| CliError::new(format!("{program}: {e}")))?;
        unlocked?;
        if !status.success() {
            return Err(match status.code() {
                Some(code) => format!("exit status {code}"),
                None => "the command was killed by a signal".to_string(),
            }
            .into());
        }
        return Ok(());
    }
    print_key(client, p, guard.key()).await?;
    tokio::select! {
        () = &mut stop => {
            guard.unlock().await?;
            Ok(())
        }
        () = guard.lost() => Err("session expired".into()),
    }
}

/// `elect NAME PROPOSAL`: campaigns, prints the leader key and value once elected, leads
/// until ctrl-c, then resigns. `elect -l NAME`: prints each leader until ctrl-c.
pub async fn elect(opts: &Options, args: ElectArgs) -> Result<(), CliError> {
    if !args.listen && args.proposal.is_none() {
        return Err(
            CliError::new("no proposal argument but -l not set".into()).with_status(EXIT_BAD_ARGS)
        );
    }
    let client = opts.client()?;
    let p = opts.printer();
    let result = if args.listen {
        observe(&client, &p, &args.name).await
    } else {
        campaign(&client, &p, args).await
    };
    close(&client).await;
    result
}

async fn observe(client: &Client, p: &Printer, name: &str) -> Result<(), CliError> {
    let stop = stop_signal();
    tokio::pin!(stop);
    let mut leaders = client.election(name.as_bytes().to_vec()).observe();
    loop {
        tokio::select! {
            next = leaders.next() => match next {
                Some(Ok(kv)) => emit(&p.leader(&kv))?,
                Some(Err(e)) => return Err(e.into()),
                None => return Ok(()),
            },
            () = &mut stop => return Ok(()),
        }
    }
}

async fn campaign(client: &Client, p: &Printer, args: ElectArgs) -> Result<(), CliError> {
    let stop = stop_signal();
    tokio::pin!(stop);
    let election = client.election(args.name.as_bytes().to_vec());
    let proposal = args.proposal.unwrap_or_default();
    let options = LockOptions::new().with_ttl(args.ttl);
    let leadership = tokio::select! {
        l = election.campaign_with(proposal.into_bytes(), options) => l?,
        () = &mut stop => return Ok(()),
    };
    print_key(client, p, leadership.key()).await?;
    tokio::select! {
        () = &mut stop => {
            leadership.resign().await?;
            Ok(())
        }
        () = leadership.lost() => Err("elect: session expired".into()),
    }
}
