//! The client commands of `oncekv`: etcdctl 3.4's commands and output, on the oncekv
//! client library, so every write goes through a session and takes effect exactly once.
//!
//! Each command connects lazily, runs, and closes its session (if a write registered one)
//! before it exits, so a one-shot command leaves no session behind to wait for its TTL.
//! Output is what etcdctl 3.4 prints for the same answer: `-w simple` (the default),
//! `-w json` (etcd's JSON with the Go field names, zero fields left out) and, for
//! `member list` and `endpoint status`, `-w table`.

mod cluster;
mod concurrency;
mod endpoint_status;
mod json;
mod kv;
mod lease;
mod output;
mod snapshot;
mod txn;
mod watch;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use oncekv_client::{Client, ClientConfig};

pub use output::Format;

/// The client commands (beside `serve`, `dev`, `bench` in the top-level command).
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Puts the given key into the store (exactly once, through a session).
    ///
    /// The value is read from standard input when it is not given.
    Put(kv::PutArgs),
    /// Gets the key or a range of keys.
    Get(kv::GetArgs),
    /// Removes the specified key or range of keys [key, range_end) (exactly once).
    Del(kv::DelArgs),
    /// Txn processes all the requests in one transaction (exactly once).
    ///
    /// Reads etcdctl's format from standard input: compares one per line (e.g.
    /// `value("k") = "v"`, `mod("k") > "0"`; targets ver, create, mod, value, lease),
    /// a blank line, the requests run on success (put/get/del lines with their flags), a
    /// blank line, the requests run on failure, and a blank line (or the end of input).
    Txn(txn::TxnArgs),
    /// Lease related commands.
    Lease(lease::LeaseArgs),
    /// Membership related commands.
    Member(cluster::MemberArgs),
    /// Endpoint related commands.
    Endpoint(cluster::EndpointArgs),
    /// Alarm commands: list the raised alarms, or clear them.
    Alarm(cluster::AlarmArgs),
    /// Defragments members (oncekv: takes a snapshot now, which gives back the space of
    /// the log before it and of compacted history).
    Defrag(cluster::DefragArgs),
    /// Hands leadership to another member (by ID in hex).
    MoveLeader(cluster::MoveLeaderArgs),
    /// Snapshot commands: save a consistent copy of a member's state, show what a copy
    /// holds, restore a new cluster from one.
    Snapshot(snapshot::SnapshotArgs),
    /// Watches events stream on keys or prefixes, until ctrl-c.
    ///
    /// Prints each change as etcdctl does: PUT or DELETE, then (with --prev-kv) the
    /// previous key and value, then the key and value, one per line. With --rev, replays
    /// history from that revision first. If the member serving the watch fails, the watch
    /// carries on from another member without missing or repeating an event. A watch the
    /// server cancels (its start revision was compacted) exits with status 5.
    Watch(watch::WatchArgs),
    /// Compacts the event history: reads and watches at revisions below REVISION are
    /// refused from then on (exactly once, through a session).
    ///
    /// Refused if REVISION is at or below the last compaction ("required revision has
    /// been compacted") or above the current revision ("required revision is a future
    /// revision").
    Compaction(watch::CompactionArgs),
    /// Acquires a named lock: runs COMMAND while holding it (then releases it), or prints
    /// the lock key and holds the lock until ctrl-c.
    ///
    /// Waits while another holder has it. The command sees ETCD_LOCK_KEY, ETCD_LOCK_REV
    /// and ONCEKV_FENCING_TOKEN (the key's create revision: guard writes made under the
    /// lock with it). Through a session, a lock retried after a lost reply never queues a
    /// second waiter. If this process dies, the lock is released after --ttl seconds.
    Lock(concurrency::LockArgs),
    /// Campaigns in a named election and leads until ctrl-c (then resigns), printing the
    /// leader key and PROPOSAL once elected; with -l, prints each leader as it changes.
    Elect(concurrency::ElectArgs),
}

const DEFAULT_ENDPOINTS: &str = "127.0.0.1:2379";
const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_DIAL_TIMEOUT: Duration = Duration::from_secs(2);

/// Client options given before the command (`oncekv --endpoints A,B get k`).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Client options (for the client commands)")]
pub struct GlobalArgs {
    /// gRPC endpoints, comma separated [default: 127.0.0.1:2379]
    #[arg(
        id = "global_endpoints",
        long = "endpoints",
        value_name = "ENDPOINTS",
        env = "ONCEKV_ENDPOINTS",
        value_delimiter = ','
    )]
    endpoints: Vec<String>,
    /// Timeout for a short-running command, e.g. 5s, 500ms, 1m [default: 5s]
    #[arg(
        id = "global_command_timeout",
        long = "command-timeout",
        value_name = "DURATION",
        value_parser = parse_duration
    )]
    command_timeout: Option<Duration>,
    /// Timeout for connecting to an endpoint [default: 2s]
    #[arg(
        id = "global_dial_timeout",
        long = "dial-timeout",
        value_name = "DURATION",
        value_parser = parse_duration
    )]
    dial_timeout: Option<Duration>,
    /// Output format (table: member list and endpoint status only) [default: simple]
    #[arg(
        id = "global_write_out",
        short = 'w',
        long = "write-out",
        value_name = "FORMAT"
    )]
    write_out: Option<Format>,
    /// Print keys and values as hex-encoded strings (\x..)
    #[arg(id = "global_hex", long = "hex")]
    hex: bool,
    /// Send a write that has not answered after the recent p95 latency a second time, with
    /// the same sequence number, to another endpoint (it still applies once)
    #[arg(id = "global_hedge_writes", long = "hedge-writes")]
    hedge_writes: bool,
    /// Verify the servers' TLS certificates with this CA bundle (https:// endpoints)
    #[arg(id = "global_cacert", long = "cacert", value_name = "FILE")]
    cacert: Option<PathBuf>,
    /// Identify to the servers with this TLS certificate (with --key)
    #[arg(id = "global_cert", long = "cert", value_name = "FILE")]
    cert: Option<PathBuf>,
    /// The private key of --cert
    #[arg(id = "global_key", long = "key", value_name = "FILE")]
    key: Option<PathBuf>,
    /// Accept any server certificate (servers with --auto-tls)
    #[arg(
        id = "global_insecure_skip_tls_verify",
        long = "insecure-skip-tls-verify"
    )]
    insecure_skip_tls_verify: bool,
    /// User for a cluster with auth on, as NAME:PASSWORD (or NAME with --password)
    #[arg(id = "global_user", long = "user", value_name = "NAME[:PASSWORD]")]
    user: Option<String>,
    /// Password of --user
    #[arg(id = "global_password", long = "password", value_name = "PASSWORD")]
    password: Option<String>,
}

/// The same options, given after the command (`oncekv get k -w json`, as etcdctl
/// allows). These win over the ones given before it.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Global options")]
pub struct ClientFlags {
    /// gRPC endpoints, comma separated [default: 127.0.0.1:2379, env: ONCEKV_ENDPOINTS]
    #[arg(long, global = true, value_delimiter = ',')]
    endpoints: Vec<String>,
    /// Timeout for a short-running command, e.g. 5s, 500ms, 1m [default: 5s]
    #[arg(long, global = true, value_name = "DURATION", value_parser = parse_duration)]
    command_timeout: Option<Duration>,
    /// Timeout for connecting to an endpoint [default: 2s]
    #[arg(long, global = true, value_name = "DURATION", value_parser = parse_duration)]
    dial_timeout: Option<Duration>,
    /// Output format (table: member list and endpoint status only) [default: simple]
    #[arg(short = 'w', long, global = true, value_name = "FORMAT")]
    write_out: Option<Format>,
    /// Print keys and values as hex-encoded strings (\x..)
    #[arg(long, global = true)]
    hex: bool,
    /// Send a write that has not answered after the recent p95 latency a second time, with
    /// the same sequence number, to another endpoint (it still applies once)
    #[arg(long, global = true)]
    hedge_writes: bool,
    /// Verify the servers' TLS certificates with this CA bundle (https:// endpoints)
    #[arg(id = "tls_cacert", long = "cacert", global = true, value_name = "FILE")]
    cacert: Option<PathBuf>,
    /// Identify to the servers with this TLS certificate (with --key)
    #[arg(id = "tls_cert", long = "cert", global = true, value_name = "FILE")]
    cert: Option<PathBuf>,
    /// The private key of --cert
    #[arg(id = "tls_key", long = "key", global = true, value_name = "FILE")]
    key: Option<PathBuf>,
    /// Accept any server certificate (servers with --auto-tls)
    #[arg(
        id = "tls_insecure_skip_tls_verify",
        long = "insecure-skip-tls-verify",
        global = true
    )]
    insecure_skip_tls_verify: bool,
    /// User for a cluster with auth on, as NAME:PASSWORD (or NAME with --password)
    #[arg(
        id = "auth_user",
        long = "user",
        global = true,
        value_name = "NAME[:PASSWORD]"
    )]
    user: Option<String>,
    /// Password of --user
    #[arg(
        id = "auth_password",
        long = "password",
        global = true,
        value_name = "PASSWORD"
    )]
    password: Option<String>,
}

/// The options a command runs with, after merging both places and the defaults.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub endpoints: Vec<String>,
    pub command_timeout: Duration,
    pub dial_timeout: Duration,
    pub format: Format,
    pub hex: bool,
    pub hedge_writes: bool,
    /// TLS to the endpoints (given any of --cacert, --cert, --key,
    /// --insecure-skip-tls-verify).
    pub tls: Option<oncekv_client::ClientTlsOptions>,
    /// --user and --password.
    pub credentials: Option<oncekv_client::Credentials>,
}

/// etcdctl's `--user NAME:PASSWORD`, or `--user NAME --password PASSWORD`.
fn credentials(
    user: Option<&String>,
    password: Option<&String>,
) -> Option<oncekv_client::Credentials> {
    let user = user?;
    let (user, inline) = match user.split_once(':') {
        Some((name, pw)) => (name, Some(pw)),
        None => (user.as_str(), None),
    };
    Some(oncekv_client::Credentials {
        user: user.to_string(),
        password: password
            .map(String::as_str)
            .or(inline)
            .unwrap_or_default()
            .to_string(),
    })
}

impl Options {
    fn merge(global: &GlobalArgs, flags: &ClientFlags) -> Options {
        let endpoints = [&flags.endpoints, &global.endpoints]
            .into_iter()
            .map(|list| {
                list.iter()
                    .map(|e| e.trim().to_string())
                    .filter(|e| !e.is_empty())
                    .collect::<Vec<_>>()
            })
            .find(|list| !list.is_empty())
            .unwrap_or_else(|| vec![DEFAULT_ENDPOINTS.to_string()]);
        Options {
            endpoints,
            command_timeout: flags
                .command_timeout
                .or(global.command_timeout)
                .unwrap_or(DEFAULT_COMMAND_TIMEOUT),
            dial_timeout: flags
                .dial_timeout
                .or(global.dial_timeout)
                .unwrap_or(DEFAULT_DIAL_TIMEOUT),
            format: flags.write_out.or(global.write_out).unwrap_or_default(),
            hex: flags.hex || global.hex,
            hedge_writes: flags.hedge_writes || global.hedge_writes,
            tls: {
                let options = oncekv_client::ClientTlsOptions {
                    ca_file: flags.cacert.clone().or_else(|| global.cacert.clone()),
                    cert_file: flags.cert.clone().or_else(|| global.cert.clone()),
                    key_file: flags.key.clone().or_else(|| global.key.clone()),
                    insecure_skip_verify: flags.insecure_skip_tls_verify
                        || global.insecure_skip_tls_verify,
                };
                (options != oncekv_client::ClientTlsOptions::default()).then_some(options)
            },
            credentials: credentials(
                flags.user.as_ref().or(global.user.as_ref()),
                flags.password.as_ref().or(global.password.as_ref()),
            ),
        }
    }

    /// A client whose retry budget is the command timeout. Writes through it are tracked
    /// (a session is registered by the first one).
    pub fn client(&self) -> Result<Client, CliError> {
        let config = ClientConfig {
            request_timeout: self.command_timeout,
            connect_timeout: self.dial_timeout,
            max_retry_time: self.command_timeout,
            hedge_writes: self.hedge_writes,
            tls: self.tls.clone(),
            credentials: self.credentials.clone(),
            ..ClientConfig::default()
        };
        Client::connect(&self.endpoints, config).map_err(CliError::from)
    }

    pub fn printer(&self) -> output::Printer {
        output::Printer::new(self.format, self.hex)
    }
}

/// A failed command: the message etcdctl would print after `Error: `, and the exit status
/// (1, as etcdctl's `ExitError`, unless said otherwise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CliError {
    pub message: String,
    pub status: u8,
}

impl CliError {
    pub fn new(message: String) -> CliError {
        CliError { message, status: 1 }
    }

    /// The same error, exiting with `status`.
    pub fn with_status(mut self, status: u8) -> CliError {
        self.status = status;
        self
    }
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<oncekv_client::Error> for CliError {
    /// etcd's own wording for the cluster's answers (as etcdctl prints them), the client's
    /// for everything else.
    fn from(e: oncekv_client::Error) -> CliError {
        use oncekv_client::Error as E;
        CliError::new(match e {
            E::InvalidArgument(m) | E::Rejected { message: m, .. } => m,
            other => other.to_string(),
        })
    }
}

impl From<String> for CliError {
    fn from(s: String) -> CliError {
        CliError::new(s)
    }
}

impl From<&str> for CliError {
    fn from(s: &str) -> CliError {
        CliError::new(s.to_string())
    }
}

/// Runs a client command; prints `Error: <message>` on failure and exits 1, as etcdctl.
pub async fn run(global: GlobalArgs, command: Command) -> ExitCode {
    match execute(&global, command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e}");
            ExitCode::from(e.status)
        }
    }
}

async fn execute(global: &GlobalArgs, command: Command) -> Result<(), CliError> {
    match command {
        Command::Put(args) => {
            let opts = Options::merge(global, &args.flags);
            opts.printer().no_table()?;
            // Read a value from stdin before the command's clock starts.
            let stdin = std::io::stdin();
            let request = args.op.resolve(Some(&mut stdin.lock()))?;
            one_shot(&opts, |c, p| kv::put(c, p, request)).await
        }
        Command::Get(args) => {
            let opts = Options::merge(global, &args.flags);
            opts.printer().no_table()?;
            one_shot(&opts, |c, p| kv::get(c, p, args.op)).await
        }
        Command::Del(args) => {
            let opts = Options::merge(global, &args.flags);
            opts.printer().no_table()?;
            one_shot(&opts, |c, p| kv::del(c, p, args.op)).await
        }
        Command::Txn(args) => {
            let opts = Options::merge(global, &args.flags);
            opts.printer().no_table()?;
            // Read and check the whole transaction before connecting.
            let txn = txn::read(&args)?;
            one_shot(&opts, |c, p| txn::run(c, p, txn)).await
        }
        Command::Lease(args) => {
            let opts = Options::merge(global, &args.flags);
            lease::run(&opts, args.command).await
        }
        Command::Member(args) => {
            let opts = Options::merge(global, &args.flags);
            one_shot(&opts, |c, p| cluster::member(c, p, args.command)).await
        }
        Command::Endpoint(args) => {
            let opts = Options::merge(global, &args.flags);
            cluster::endpoint(&opts, args.command).await
        }
        Command::Alarm(args) => {
            let opts = Options::merge(global, &args.flags);
            one_shot(&opts, |c, _| cluster::alarm(c, args.command)).await
        }
        Command::Defrag(args) => {
            let opts = Options::merge(global, &args.flags);
            let endpoints = opts.endpoints.clone();
            one_shot(&opts, |c, _| cluster::defrag(c, endpoints, args.cluster)).await
        }
        Command::MoveLeader(args) => {
            let opts = Options::merge(global, &args.flags);
            one_shot(&opts, |c, _| cluster::move_leader(c, args.id)).await
        }
        Command::Snapshot(args) => {
            let opts = Options::merge(global, &args.flags);
            snapshot::run(&opts, args.command).await
        }
        Command::Compaction(args) => {
            let opts = Options::merge(global, &args.flags);
            watch::compaction(&opts, args).await
        }
        Command::Lock(args) => {
            let opts = Options::merge(global, &args.flags);
            opts.printer().no_table()?;
            concurrency::lock(&opts, args).await
        }
        Command::Elect(args) => {
            let opts = Options::merge(global, &args.flags);
            opts.printer().no_table()?;
            concurrency::elect(&opts, args).await
        }
        Command::Watch(args) => {
            let opts = Options::merge(global, &args.flags);
            opts.printer().no_table()?;
            watch::run(&opts, args).await
        }
    }
}

/// Runs one short command within `--command-timeout`, then ends the session the command
/// may have registered (whether it succeeded or not).
pub(crate) async fn one_shot<F, Fut>(opts: &Options, f: F) -> Result<(), CliError>
where
    F: FnOnce(Client, output::Printer) -> Fut,
    Fut: Future<Output = Result<(), CliError>>,
{
    let client = opts.client()?;
    // The client bounds each call (and the session registration before a first write) by
    // the command timeout; this is only a safety net around both.
    let limit = 2 * opts.command_timeout + opts.dial_timeout;
    let result = match tokio::time::timeout(limit, f(client.clone(), opts.printer())).await {
        Ok(result) => result,
        Err(_) => Err(CliError::new(format!(
            "the command did not finish within {limit:?} (--command-timeout {:?}); if it \
             wrote, the write may or may not have taken effect",
            opts.command_timeout
        ))),
    };
    close(&client).await;
    result
}

/// Ends the client's session, if a write registered one. A failure only means the session
/// lingers on the server until its TTL, so it is not the command's failure.
pub(crate) async fn close(client: &Client) {
    if let Err(e) = client.close().await {
        tracing::debug!("closing the session failed (it expires by itself): {e}");
    }
}

/// Writes command output to stdout. A closed pipe (`oncekv get ... | head -1`) is not an
/// error worth reporting.
pub(crate) fn emit(bytes: &[u8]) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(CliError::new(format!("writing the output: {e}"))),
    }
}

/// A lease ID as etcdctl takes it: hexadecimal, as `lease grant` prints it.
pub(crate) fn parse_lease_id(s: &str) -> Result<i64, String> {
    i64::from_str_radix(s, 16).map_err(|e| {
        format!("bad lease ID {s:?} ({e}): expecting the ID in hex, as `lease grant` prints it")
    })
}

/// A Go-style duration (etcdctl's flags): `5s`, `500ms`, `1m30s`, `1.5s`, `2h`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {s:?} (examples: 5s, 500ms, 1m30s)");
    let mut rest = s.trim();
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let number: f64 = rest[..number_len].parse().map_err(|_| bad())?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += number * seconds;
        rest = &rest[unit_len..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    // etcdctl users pass Go durations; a misread timeout would silently change behaviour.
    #[test]
    fn go_durations_parse_as_etcdctl_reads_them() {
        let cases = [
            ("5s", Some(Duration::from_secs(5))),
            ("500ms", Some(Duration::from_millis(500))),
            ("1m30s", Some(Duration::from_secs(90))),
            ("1.5s", Some(Duration::from_millis(1500))),
            ("2h", Some(Duration::from_secs(7200))),
            ("0", Some(Duration::ZERO)),
            ("5", None),
            ("s", None),
            ("5x", None),
            ("", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text).ok(), want, "{text:?}");
        }
    }

    // Lease IDs are printed in hex, so they must be read back in hex.
    #[test]
    fn lease_ids_are_hex() {
        assert_eq!(parse_lease_id("694d7a8b1c2e3f01"), Ok(0x694d7a8b1c2e3f01));
        assert_eq!(parse_lease_id("000000000000045b"), Ok(1115));
        assert!(parse_lease_id("zz").is_err());
        assert!(parse_lease_id("").is_err());
    }
}
