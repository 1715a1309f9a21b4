//! `watch` and `compaction`: following changes as they happen (or from a past revision),
//! and discarding old history.

use std::io::Write as _;
use std::time::Duration;

use clap::Args;
use oncekv_client::{Client, Error, WatchOptions, Watcher};

use super::kv::range_key;
use super::lease::stop_signal;
use super::output::Printer;
use super::{CliError, ClientFlags, Options, close, emit, one_shot};

/// etcdctl's exit status for a watch the server cancelled (its `ExitInterrupted`).
const EXIT_WATCH_CANCELED: u8 = 5;
/// The pause before watching again after the cluster was unreachable for a whole retry
/// budget.
const REWATCH_PAUSE: Duration = Duration::from_secs(1);

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// The key, or the start of the range, to watch.
    pub key: String,
    /// The end of the range [key, range_end) to watch.
    pub range_end: Option<String>,
    /// Watch every key that starts with the key.
    #[arg(long, conflicts_with = "range_end")]
    pub prefix: bool,
    /// Replay history from this revision (inclusive) before following live changes
    /// (0: only changes made from now on). A revision compaction removed ends the watch.
    #[arg(long, default_value_t = 0, value_name = "REVISION")]
    pub rev: i64,
    /// Print each event's previous key-value pair (before its new one).
    #[arg(long)]
    pub prev_kv: bool,
    #[command(flatten)]
    pub flags: ClientFlags,
}

#[derive(Debug, Args)]
pub struct CompactionArgs {
    /// Discard the history of every revision below this one.
    #[arg(value_name = "REVISION")]
    pub revision: i64,
    /// Return only once the compaction has been applied.
    #[arg(long)]
    pub physical: bool,
    #[command(flatten)]
    pub flags: ClientFlags,
}

impl WatchArgs {
    fn key(&self) -> Vec<u8> {
        range_key(&self.key, self.prefix, false)
    }

    fn options(&self) -> WatchOptions {
        let mut o = WatchOptions::new();
        if self.prefix {
            // etcd clients watch "every key" as the key "\0" with a from-key range.
            o = if self.key.is_empty() {
                o.with_from_key()
            } else {
                o.with_prefix()
            };
        }
        if let Some(end) = &self.range_end {
            o = o.with_range_end(end.as_bytes());
        }
        if self.rev != 0 {
            o = o.with_start_revision(self.rev);
        }
        if self.prev_kv {
            o = o.with_prev_kv();
        }
        o
    }
}

/// Runs `watch` until ctrl-c or SIGTERM (a success), or until the server cancels the
/// watch or it fails.
pub async fn run(opts: &Options, args: WatchArgs) -> Result<(), CliError> {
    let client = opts.client()?;
    let printer = opts.printer();
    let stop = stop_signal();
    tokio::pin!(stop);
    let result = tokio::select! {
        result = follow(&client, &printer, &args) => result,
        () = &mut stop => Ok(()),
    };
    close(&client).await;
    result
}

/// How etcdctl reports a watch the server cancelled: the server's reason on one line, its
/// own verdict after `Error: `, exit status 5.
fn canceled(reason: &str) -> CliError {
    eprintln!("watch was canceled ({reason})");
    CliError::new("watch is canceled by the server".into()).with_status(EXIT_WATCH_CANCELED)
}

/// Prints every event until the watch ends. The client resumes the watch on another member
/// when its member fails; if the whole cluster stays unreachable for longer than the
/// client's retry budget, this watches again from where delivery got to, as etcdctl keeps
/// waiting for the cluster to come back. Only the first creation must succeed within the
/// budget.
async fn follow(client: &Client, p: &Printer, args: &WatchArgs) -> Result<(), CliError> {
    let key = args.key();
    let mut watcher = client
        .watch(key.clone(), args.options())
        .await
        .map_err(|e| ended_by(e, p))?;
    loop {
        let Some(e) = print_until_end(&mut watcher, p).await? else {
            return Ok(());
        };
        if !e.is_retryable() {
            return Err(ended_by(e, p));
        }
        tracing::debug!("watch: the cluster is unreachable ({e}); watching again");
        // Where delivery got to: the new watch starts there, so nothing is missed.
        let options = args.options().with_start_revision(watcher.next_revision());
        watcher = loop {
            tokio::time::sleep(REWATCH_PAUSE).await;
            match client.watch(key.clone(), options.clone()).await {
                Ok(w) => break w,
                Err(e) if e.is_retryable() => {
                    tracing::debug!("watch: still unreachable: {e}");
                }
                Err(e) => return Err(ended_by(e, p)),
            }
        };
    }
}

/// Prints the watcher's responses until it ends; `Some(error)` if it ended with one.
async fn print_until_end(watcher: &mut Watcher, p: &Printer) -> Result<Option<Error>, CliError> {
    while let Some(item) = watcher.next().await {
        match item {
            Ok(r) => {
                // Progress notifications (never asked for here) have nothing to print.
                if r.events.is_empty() {
                    continue;
                }
                if !print(&p.watch(&r))? {
                    return Ok(None);
                }
            }
            Err(e) => return Ok(Some(e)),
        }
    }
    Ok(None)
}

fn ended_by(e: Error, p: &Printer) -> CliError {
    match e {
        Error::Compacted { compact_revision } => {
            // Stdout may be gone already; the verdict goes to stderr anyway.
            let _ = print(&p.watch_compacted(compact_revision));
            canceled("etcdserver: mvcc: required revision has been compacted")
        }
        Error::WatchCanceled { reason } => canceled(&reason),
        other => other.into(),
    }
}

/// Writes `bytes` to stdout; `false` once stdout is closed (`oncekv watch k | head -3`):
/// nobody reads any more, so the watch stops, as etcdctl does.
fn print(bytes: &[u8]) -> Result<bool, CliError> {
    if bytes.is_empty() {
        return Ok(true);
    }
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(CliError::new(format!("writing the output: {e}"))),
    }
}

/// `compaction`: prints etcdctl's `compacted revision N` (in every output format, as
/// etcdctl does).
pub async fn compaction(opts: &Options, args: CompactionArgs) -> Result<(), CliError> {
    one_shot(opts, |c, _| async move {
        c.compact(args.revision, args.physical).await?;
        emit(format!("compacted revision {}\n", args.revision).as_bytes())
    })
    .await
}
