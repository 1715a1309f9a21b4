//! What a node needs to start, with defaults that follow etcd's where they mean the same.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use oncekv_core::Settings;

use crate::disk::Disk;
use crate::runtime::Clock;
use crate::sm_store::ApplyObserver;
use crate::types::Member;

/// etcd's `--initial-cluster-token` default.
pub const DEFAULT_CLUSTER_TOKEN: &str = "etcd-cluster";

/// etcd's default space quota: 2 GiB.
pub const DEFAULT_QUOTA_BYTES: u64 = 2 << 30;

/// Everything a server needs to start. Defaults follow etcd's where they mean the same.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub name: String,
    pub data_dir: PathBuf,
    /// Where clients connect (etcd's `--listen-client-urls`).
    pub client_addr: SocketAddr,
    /// More addresses serving clients the same way (the rest of etcd's
    /// `--listen-client-urls`), bound by [`Node::start_with_listeners`](crate::Node).
    pub more_client_addrs: Vec<SocketAddr>,
    /// Where peers connect (etcd's `--listen-peer-urls`).
    pub peer_addr: SocketAddr,
    /// More addresses serving peers the same way (the rest of `--listen-peer-urls`),
    /// bound by [`Node::start_with_listeners`](crate::Node).
    pub more_peer_addrs: Vec<SocketAddr>,
    /// Peer listeners on unix sockets, at these paths (etcd's `unix://` peer URLs: the
    /// path is the URL's host and port, `unix://etcd.unix:1` is `./etcd.unix:1`).
    pub peer_unix_paths: Vec<PathBuf>,
    /// Every member: name, peer url, client url (may be empty if unknown).
    pub initial_cluster: Vec<Member>,
    /// Whether this member founds a new cluster with `initial_cluster` or joins a running
    /// one that already has it as a member (etcd's `--initial-cluster-state`). Only read
    /// at the first start; later starts go by the identity in the data directory.
    pub initial_cluster_state: ClusterState,
    /// Mixed into the cluster id a new cluster gets (etcd's `--initial-cluster-token`);
    /// only read when founding.
    pub initial_cluster_token: String,
    /// Take a snapshot (and purge the log) every this many applied entries.
    pub snapshot_count: u64,
    pub heartbeat_ms: u64,
    pub election_timeout_ms: u64,
    /// Requests larger than this are refused ("etcdserver: request is too large").
    pub max_request_bytes: usize,
    pub max_txn_ops: usize,
    /// The space quota on this member's data on disk (etcd's `--quota-backend-bytes`,
    /// 2 GiB by default): past it, writes that add data raise the NOSPACE alarm and are
    /// refused until it is disarmed. 0 turns the check off.
    pub quota_backend_bytes: u64,
    /// Compare every member's HashKV once after starting (etcd's
    /// `--experimental-initial-corrupt-check`); a mismatch raises the CORRUPT alarm.
    pub initial_corrupt_check: bool,
    /// Compare every member's HashKV this often (etcd's
    /// `--experimental-corrupt-check-time`); `None`: never.
    pub corrupt_check_time: Option<Duration>,
    /// Connections open at once on each port (client, peer, metrics); past it new ones are
    /// closed at once. Silent new connections are closed after
    /// `conn_guard::FIRST_BYTES_TIMEOUT`.
    pub max_connections: usize,
    /// HTTP/2 pings on a connection idle this long (etcd's `--grpc-keepalive-interval`,
    /// 2 h), and how long an answer may take before the connection is closed
    /// (`--grpc-keepalive-timeout`, 20 s): how a connection whose peer vanished is found.
    pub grpc_keepalive_interval: Duration,
    pub grpc_keepalive_timeout: Duration,
    /// HTTP/2 streams one client connection may have open at once (etcd's
    /// `--max-concurrent-streams`; its default, `u32::MAX`, is no limit).
    pub max_concurrent_streams: u32,
    /// etcd's `--metrics extensive`: also `grpc_server_handling_seconds`, each gRPC call's
    /// duration by method (basic: counts only).
    pub metrics_extensive: bool,
    /// Where the raft log lives (etcd's `--wal-dir`); `None`: `data_dir/log`. A member
    /// records a chosen directory in its data directory and refuses to start with another
    /// (see `node::log_dir`).
    pub wal_dir: Option<PathBuf>,
    /// TLS on the client port (etcd's `--cert-file`, `--key-file`, `--trusted-ca-file`,
    /// `--client-cert-auth`); plaintext when `None`.
    pub client_tls: Option<crate::tls::TlsFiles>,
    /// TLS on the peer port and on this member's connections to its peers (the `--peer-`
    /// forms): the same certificate serves and dials, and the peer CA checks both ways.
    pub peer_tls: Option<crate::tls::TlsFiles>,
    /// bcrypt's cost for the password hashes this member computes (etcd's
    /// `--bcrypt-cost`, 10).
    pub bcrypt_cost: u32,
    /// How long a token from Authenticate stays valid (etcd's `--auth-token-ttl`, 300 s);
    /// any auth change ends every token earlier.
    pub auth_token_ttl: Duration,
    /// An entry whose apply takes longer is logged as a warning (etcd's
    /// `--experimental-warning-apply-duration`, 100 ms).
    pub warning_apply_duration: Duration,
    /// JWT tokens (etcd's `--auth-token jwt,...`) instead of oncekv's simple ones.
    pub auth_jwt: Option<std::sync::Arc<crate::jwt::Jwt>>,
    /// Leader-lease reads (off by default; see `read_lease` for the clock assumption):
    /// a leader whose leadership a quorum confirmed within the last 0.8 election
    /// timeouts serves linearizable reads without another round. Every member must have
    /// it: it also stops a member voting during its first election timeout.
    pub leader_lease_reads: bool,
    /// How long a write may wait for its entry to be applied.
    pub request_timeout: Duration,
    /// How often a watcher created with `progress_notify` gets an empty response carrying
    /// the revision when it has had no events (etcd's
    /// `--experimental-watch-progress-notify-interval`, 10 minutes by default).
    pub watch_progress_notify_interval: Duration,
    /// Replicated settings proposed when the cluster first forms.
    pub settings: Settings,
    /// etcd's auto-compaction (off by default, as in etcd 3.4).
    pub auto_compaction: AutoCompaction,
    pub batch: BatchLimits,
    /// The clock this member stamps entries with while it leads.
    pub clock: Clock,
    /// The file system under the log and the snapshot (the real one by default).
    pub disk: Arc<dyn Disk>,
    /// Watches the state machine apply entries (simulation and tests only).
    pub observer: Option<Arc<dyn ApplyObserver>>,
    /// Simulation only, to prove its checkers catch the loss: the leader still
    /// acknowledges its own appends before they are durable, but nothing waits for them
    /// (entries are applied and their commit is passed on before the leader's copy is
    /// durable).
    #[cfg(feature = "sim")]
    pub break_durability_gates: bool,
}

impl NodeConfig {
    /// openraft's `election_timeout_min` and `election_timeout_max` for this member's
    /// `--election-timeout` T: T/2 and T.
    ///
    /// Why not T and 2T: in openraft 0.9 a follower that knows a leader refuses votes
    /// for `election_timeout_max` after it last heard from it (its leader lease), and
    /// stands for election only after that lease *plus* its own randomized timeout. With
    /// T and 2T a crashed leader was replaced after 3T to 4T; etcd, whose followers time
    /// out after a randomized T to 2T, takes 1T to 2T. With T/2 and T the lease is T and
    /// the replacement comes after 1.5T to 2T. A member that knows no leader (a fresh or
    /// restarted cluster) stands after T/2 to T, as etcd's first election comes early.
    pub fn raft_election_timeouts(&self) -> (u64, u64) {
        let max = self.election_timeout_ms;
        (max / 2, max)
    }

    /// How long a voter refuses votes after it last heard from its leader: openraft's
    /// leader lease, its `election_timeout_max` (see [`Self::raft_election_timeouts`]).
    pub fn vote_lease(&self) -> Duration {
        Duration::from_millis(self.raft_election_timeouts().1)
    }

    /// A config with etcd-like defaults for everything but names and addresses.
    pub fn new(
        name: impl Into<String>,
        data_dir: impl Into<PathBuf>,
        client_addr: SocketAddr,
        peer_addr: SocketAddr,
        initial_cluster: Vec<Member>,
    ) -> NodeConfig {
        NodeConfig {
            name: name.into(),
            data_dir: data_dir.into(),
            client_addr,
            more_client_addrs: Vec::new(),
            more_peer_addrs: Vec::new(),
            peer_unix_paths: Vec::new(),
            peer_addr,
            initial_cluster,
            initial_cluster_state: ClusterState::New,
            initial_cluster_token: DEFAULT_CLUSTER_TOKEN.to_string(),
            snapshot_count: 10_000,
            heartbeat_ms: 100,
            election_timeout_ms: 1_000,
            max_request_bytes: 1536 * 1024,
            max_txn_ops: 128,
            quota_backend_bytes: DEFAULT_QUOTA_BYTES,
            initial_corrupt_check: false,
            corrupt_check_time: None,
            max_connections: 10_000,
            grpc_keepalive_interval: Duration::from_secs(2 * 3600),
            grpc_keepalive_timeout: Duration::from_secs(20),
            max_concurrent_streams: u32::MAX,
            metrics_extensive: false,
            wal_dir: None,
            bcrypt_cost: 10,
            auth_token_ttl: Duration::from_secs(300),
            auth_jwt: None,
            warning_apply_duration: crate::sm_store::DEFAULT_WARN_APPLY,
            client_tls: None,
            peer_tls: None,
            leader_lease_reads: false,
            request_timeout: Duration::from_secs(7),
            watch_progress_notify_interval: Duration::from_secs(10 * 60),
            settings: Settings::default(),
            auto_compaction: AutoCompaction::Off,
            batch: BatchLimits::default(),
            clock: Clock::system(),
            disk: crate::disk::os_disk(),
            observer: None,
            #[cfg(feature = "sim")]
            break_durability_gates: false,
        }
    }
}

/// etcd's `--initial-cluster-state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClusterState {
    /// Found the cluster: every member of `--initial-cluster` starts this way together.
    #[default]
    New,
    /// Join a running cluster that added this member (MemberAdd) first.
    Existing,
}

/// How the leader's proposer batches commands into entries, and a follower's forwarder
/// batches them into peer RPCs.
#[derive(Debug, Clone, Copy)]
pub struct BatchLimits {
    pub max_commands: usize,
    pub max_bytes: usize,
    /// On the leader: entries proposed and not yet answered.
    pub max_in_flight: usize,
    /// On a follower: forwarded batches (one peer RPC each) outstanding at once.
    pub max_forwards_in_flight: usize,
    /// On the leader, under load (the last entry carried at least
    /// [`LOADED_ENTRY`](Self::LOADED_ENTRY) commands): how many times the proposer lets
    /// the runtime's other ready tasks run before it cuts the next batch, so that requests
    /// already read from their sockets join it. 0: cut at once.
    pub gather_yields: usize,
}

impl BatchLimits {
    /// Commands in an entry that mark the leader as loaded (see `gather_yields`). One
    /// client's writes never reach it, so a lone writer's entry is cut at once.
    pub const LOADED_ENTRY: usize = 8;
}

impl Default for BatchLimits {
    /// The in-flight defaults were chosen with `scripts/bench-vs-etcd.sh`; the figures are
    /// in `benches/README.md`.
    fn default() -> Self {
        BatchLimits {
            max_commands: 1024,
            max_bytes: 4 * 1024 * 1024,
            // One entry at a time: the requests that arrive while it commits form a bigger
            // next batch sharing one fsync, which is worth more than overlapping appends.
            max_in_flight: 1,
            // Two forwards: one keeps a follower's writes waiting a whole round trip for
            // the batch ahead of them; more split batches without overlapping more work.
            max_forwards_in_flight: 2,
            // Each entry costs every member a log write and an fdatasync (most of it kernel
            // CPU), an AppendEntries each way and a pass of the raft core, whatever it
            // carries; under 64 clients entries grew from 24 to 33 puts and the put rate
            // by about a tenth (benches/README.md, "Gathering a batch"). More yields did
            // not gather more.
            gather_yields: 8,
        }
    }
}

/// etcd's interval between two revision-mode compactions.
pub const REVISION_MODE_INTERVAL: Duration = Duration::from_secs(300);

/// What history the leader compacts away by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AutoCompaction {
    /// Only clients compact.
    #[default]
    Off,
    /// Keep `retention` of history: the revision is sampled every tenth of the interval
    /// (`retention`, at most an hour), and once `retention` has passed, then every
    /// interval, history is compacted at the revision sampled `retention` ago.
    Periodic { retention: Duration },
    /// Keep the last `keep` revisions: every `every` (etcd: 5 minutes), history is
    /// compacted at the current revision minus `keep`.
    Revision { keep: i64, every: Duration },
}

impl AutoCompaction {
    /// Reads etcd's two flags. `retention` "0" is off in either mode; in periodic mode a
    /// bare number is hours (etcd's reading), otherwise a duration such as `30m` or `1h30m`
    /// read by `parse_duration`; in revision mode it is a count of revisions.
    pub fn from_flags(
        mode: &str,
        retention: &str,
        parse_duration: impl Fn(&str) -> Result<Duration, String>,
    ) -> Result<AutoCompaction, String> {
        let retention = retention.trim();
        match mode {
            "periodic" => {
                let period = match retention.parse::<u64>() {
                    Ok(hours) => Duration::from_secs(hours.saturating_mul(3600)),
                    Err(_) => parse_duration(retention)
                        .map_err(|e| format!("--auto-compaction-retention: {e}"))?,
                };
                Ok(if period.is_zero() {
                    AutoCompaction::Off
                } else {
                    AutoCompaction::Periodic { retention: period }
                })
            }
            "revision" => {
                let keep: i64 = retention.parse().map_err(|_| {
                    format!(
                        "--auto-compaction-retention {retention:?}: in revision mode, a number of revisions to keep"
                    )
                })?;
                if keep < 0 {
                    return Err(format!(
                        "--auto-compaction-retention {keep}: must not be negative"
                    ));
                }
                Ok(if keep == 0 {
                    AutoCompaction::Off
                } else {
                    AutoCompaction::Revision {
                        keep,
                        every: REVISION_MODE_INTERVAL,
                    }
                })
            }
            other => Err(format!(
                "--auto-compaction-mode {other:?}: expected \"periodic\" or \"revision\""
            )),
        }
    }
}

/// gRPC's own allowance on top of `--max-request-bytes`, as etcd has: a request between
/// the two gets etcd's "request is too large" rather than a transport error.
pub const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

/// A snapshot is sent in chunks of this size (openraft's `snapshot_max_chunk_size`).
pub const SNAPSHOT_CHUNK_BYTES: u64 = 3 * 1024 * 1024;

/// The largest peer message a member sends or accepts: room for the largest entry the
/// proposer makes (a batch of up to `BatchLimits::max_bytes`, plus the one request that
/// may take it past that), and more than a snapshot chunk. The peer port refuses anything
/// larger before buffering it, so a sender that names this cluster but is no member costs
/// at most this much per request; appends of many entries are split to fit (see
/// the raft network client's `append_entries`).
pub fn peer_message_limit(config: &NodeConfig) -> usize {
    let largest_entry = config.batch.max_bytes + config.max_request_bytes + GRPC_OVERHEAD_BYTES;
    (largest_entry + (1 << 20)).max(2 * SNAPSHOT_CHUNK_BYTES as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    // A follower of a crashed leader stands after the vote lease plus its own timeout:
    // within etcd's one to two election timeouts, never sooner than one. And every
    // heartbeat interval that etcd's flag check lets through (at most a fifth of the
    // election timeout) is shorter than the shortest timeout, as openraft requires.
    #[test]
    fn a_crashed_leader_is_replaced_within_two_election_timeouts() {
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        let mut config = NodeConfig::new("n", "/nonexistent", addr, addr, Vec::new());
        for election in [5, 300, 1_000, 15_000, 50_000] {
            config.election_timeout_ms = election;
            let (min, max) = config.raft_election_timeouts();
            let lease = config.vote_lease().as_millis() as u64;
            assert!(min < max, "{election}: openraft needs min < max");
            assert!(lease + min >= election, "{election}: sooner than etcd");
            assert!(lease + max <= 2 * election, "{election}: later than etcd");
            assert!(min > election / 5, "{election}: a heartbeat would not fit");
        }
    }
}
