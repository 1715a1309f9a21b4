//! One oncekv server: opens storage and starts raft, serves the client-facing gRPC
//! services and the peer service, runs the background tasks (proposer, forwarder, ticker,
//! leadership watch), and shuts it all down. What a request goes through once it arrives
//! is [`crate::request_path`]'s.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::server::Connected;

use crate::config::{ClusterState, NodeConfig};
use crate::conn_guard::guard;
use crate::error::StartError;
use crate::forwarder::Identified;
use crate::identity::{IdScheme, Identity};
use crate::log_store::{FsyncObserver, LogStore, LogStoreOptions};
use crate::metrics::NodeMetrics;
use crate::network::{Network, PeerChannels};
use crate::request_path::NodeCore;
use crate::sm_store::{SaveObserver, SmStore};
#[cfg(feature = "sim")]
use crate::transport::Duplicator;
use crate::transport::{Connector, NodeTransport};
use crate::types::{Member, NodeId, Raft, TypeConfig};

mod tasks;

use tasks::{fatal_watch, leadership_watch, publish_client_url, ticker};

/// A running node. Dropping it does not stop it; call [`Node::shutdown`].
#[derive(Debug)]
pub struct Node {
    pub core: Arc<NodeCore>,
    pub client_addr: SocketAddr,
    pub peer_addr: SocketAddr,
    stop: watch::Sender<bool>,
    stop_rx: watch::Receiver<bool>,
    /// Set when this member cannot go on: raft stopped on a storage error, or the
    /// member was removed from the cluster.
    fatal: watch::Receiver<Option<Stopped>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Node {
    /// Opens the data directory, starts raft and the servers, and forms the cluster if this
    /// is the first start. Returns once the ports are listening.
    pub async fn start(config: NodeConfig) -> Result<Node, StartError> {
        let client_listener =
            crate::services::bind(config.client_addr)
                .await
                .map_err(|source| StartError::Listen {
                    addr: config.client_addr,
                    source,
                })?;
        let peer_listener = crate::services::bind(config.peer_addr)
            .await
            .map_err(|source| StartError::Listen {
                addr: config.peer_addr,
                source,
            })?;
        Node::start_with_listeners(config, client_listener, peer_listener).await
    }

    /// As [`start`](Self::start), on listeners the caller bound (tests bind port 0 first,
    /// so no other process can take the port between choosing and binding it).
    pub async fn start_with_listeners(
        config: NodeConfig,
        client_listener: TcpListener,
        peer_listener: TcpListener,
    ) -> Result<Node, StartError> {
        let client_addr = client_listener.local_addr().unwrap_or(config.client_addr);
        let peer_addr = peer_listener.local_addr().unwrap_or(config.peer_addr);
        let max = config.max_connections;
        let server_tls = |files: &Option<crate::tls::TlsFiles>, port| {
            files
                .clone()
                .map(crate::tls::ServerTls::new)
                .transpose()
                .map_err(|source| StartError::Tls { port, source })
        };
        let client_tls = server_tls(&config.client_tls, "client")?;
        let peer_tls = server_tls(&config.peer_tls, "peer")?;
        // `first`, and listeners bound on `more` (the rest of a --listen-*-urls list).
        async fn with_more(
            first: TcpListener,
            more: &[SocketAddr],
        ) -> Result<Vec<TcpListener>, StartError> {
            let mut all = vec![first];
            for &addr in more {
                let listener = crate::services::bind(addr)
                    .await
                    .map_err(|source| StartError::Listen { addr, source })?;
                all.push(listener);
            }
            Ok(all)
        }
        let client_listeners = with_more(client_listener, &config.more_client_addrs).await?;
        let peer_listeners = with_more(peer_listener, &config.more_peer_addrs).await?;
        let unix_peers = crate::services::bind_unix_all(&config.peer_unix_paths)?;
        let core = Node::open(
            config,
            None,
            #[cfg(feature = "sim")]
            None,
        )
        .await?;
        Ok(Node::run(
            core,
            (client_addr, peer_addr),
            crate::services::client_incoming(client_listeners, max, client_tls),
            crate::tls::accept(
                guard(
                    crate::services::incoming_with_unix(peer_listeners, unix_peers),
                    max,
                    "peer",
                ),
                peer_tls,
            ),
        ))
    }

    /// As [`start`](Self::start), on connections from `transport` instead of tokio's TCP
    /// (a deterministic simulation's network). The node reports `config`'s addresses.
    pub async fn start_with_transport(
        config: NodeConfig,
        transport: NodeTransport,
    ) -> Result<Node, StartError> {
        let (client_addr, peer_addr) = (config.client_addr, config.peer_addr);
        let core = Node::open(
            config,
            Some(transport.connector),
            #[cfg(feature = "sim")]
            transport.duplicator,
        )
        .await?;
        Ok(Node::run(
            core,
            (client_addr, peer_addr),
            transport.clients,
            transport.peers,
        ))
    }

    /// Opens storage, starts raft and the proposer, and forms the cluster on first start.
    async fn open(
        config: NodeConfig,
        connector: Option<Connector>,
        #[cfg(feature = "sim")] duplicator: Option<Arc<dyn Duplicator>>,
    ) -> Result<Arc<NodeCore>, StartError> {
        if !config.initial_cluster.iter().any(|m| m.name == config.name) {
            return Err(StartError::NotAMember(config.name.clone()));
        }
        let mut peers = PeerChannels::new(
            Duration::from_millis(config.heartbeat_ms.max(100) * 5),
            crate::network::peer_message_limit(&config),
        );
        if let Some(c) = connector {
            peers = peers.with_connector(c);
        } else if let Some(files) = &config.peer_tls {
            let dial = oncekv_proto::tls::ClientTlsOptions {
                ca_file: files.trusted_ca_file.clone(),
                cert_file: Some(files.cert_file.clone()),
                key_file: Some(files.key_file.clone()),
                insecure_skip_verify: files.self_signed,
            }
            .build()
            .map_err(|source| StartError::Tls {
                port: "peer",
                source,
            })?;
            let check = crate::tls::NameRule::of(files)
                .filter(|_| !files.self_signed)
                .map(crate::tls::NameRule::dial_check);
            peers = peers.with_connector(Connector::tls_checked(dial, check));
        }
        #[cfg(feature = "sim")]
        if let Some(d) = duplicator {
            peers = peers.with_duplicator(d);
        }
        import_etcd_layout(&config)?;
        let identity = identity(&config, &peers).await?;
        peers.set_identity(identity.cluster_id, identity.member_id);
        let id = identity.member_id;
        // The founding members by id; this member under its own id, which for a member
        // that joined later is the one MemberAdd gave it, not one derived from its name.
        let members: BTreeMap<NodeId, Member> = config
            .initial_cluster
            .iter()
            .map(|m| {
                let mid = if m.name == config.name {
                    id
                } else {
                    identity.scheme.member_id(m, &config.initial_cluster_token)
                };
                (mid, m.clone())
            })
            .collect();

        let metrics = Arc::new(
            NodeMetrics::with_handling_times(config.metrics_extensive)
                .map_err(|e| StartError::Raft(format!("metrics registry: {e}")))?,
        );
        let fsync_metrics = metrics.clone();
        let log_options = LogStoreOptions::default()
            .with_disk(config.disk.clone())
            .with_fsync_observer(FsyncObserver(Arc::new(move |took| {
                fsync_metrics.observe_fsync(took)
            })));
        let log_dir = log_dir(
            config.disk.as_ref(),
            &config.data_dir,
            config.wal_dir.as_deref(),
        )?;
        let log = LogStore::<TypeConfig>::open(log_dir, log_options).await?;
        // The leader writes its own entries while raft replicates them; the network and
        // the state machine below wait on the log's durability where a commit needs it.
        log.ack_own_appends_early(id);
        #[cfg(feature = "sim")]
        let gated = !config.break_durability_gates;
        #[cfg(not(feature = "sim"))]
        let gated = true;
        let log_handle = log.clone();
        let state_dir = config.data_dir.join("state");
        let (settings, disk, observer) = (
            config.settings,
            config.disk.clone(),
            config.observer.clone(),
        );
        // Loading a large snapshot takes seconds of reading and decoding: off the
        // runtime, so members started together (`oncekv dev`) load side by side. A
        // simulation keeps it on the runtime, in seed order.
        let sm = if config.disk.runs_on_runtime() {
            SmStore::open_with(&state_dir, settings, disk, observer)
        } else {
            tokio::task::spawn_blocking(move || {
                SmStore::open_with(&state_dir, settings, disk, observer)
            })
            .await
            .map_err(|e| StartError::StateMachine(format!("loading the state failed: {e}")))?
        }
        .map_err(StartError::StateMachine)?
        .with_apply_warning(config.warning_apply_duration)
        .with_save_observer({
            let metrics = metrics.clone();
            SaveObserver(Arc::new(move |took| metrics.observe_snapshot_save(took)))
        });
        let sm = if gated {
            sm.with_durability(log.durability())
        } else {
            sm
        };
        let applied = sm.applied();
        // The log keeps only what follows the last snapshot. With the snapshot gone
        // (deleted, or a data directory copied without it), raft would ask the log for
        // entries it purged and fail with a message that names neither.
        let mut log_reader = log.clone();
        let purged = openraft::storage::RaftLogStorage::get_log_state(&mut log_reader)
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?
            .last_purged_log_id;
        let applied_index = applied.read().last_applied.map(|l| l.index);
        if let Some(purged) = purged
            && applied_index.is_none_or(|a| a < purged.index)
        {
            return Err(StartError::MissingSnapshot {
                snapshot: config
                    .data_dir
                    .join("state")
                    .join(crate::sm_store::SNAPSHOT_FILE),
                purged: purged.index,
                applied: applied_index,
            });
        }

        let (election_timeout_min, election_timeout_max) = config.raft_election_timeouts();
        let raft_config = openraft::Config {
            cluster_name: "oncekv".into(),
            heartbeat_interval: config.heartbeat_ms,
            election_timeout_min,
            election_timeout_max,
            // The ticker asks for snapshots (`NodeCore::snapshot_if_due`): raft's policy
            // counts entries only, not what a snapshot costs to write.
            snapshot_policy: openraft::SnapshotPolicy::Never,
            max_in_snapshot_log_to_keep: 0,
            max_payload_entries: 64,
            snapshot_max_chunk_size: crate::network::SNAPSHOT_CHUNK_BYTES,
            install_snapshot_timeout: 10_000,
            ..openraft::Config::default()
        }
        .validate()
        .map_err(|e| StartError::Raft(e.to_string()))?;
        let network = Network {
            peers: peers.clone(),
            durability: gated.then(|| log.durability()),
            retry_after: Duration::from_millis(config.heartbeat_ms),
        };
        let raft = Raft::new(id, Arc::new(raft_config), network, log, sm)
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?;

        let founding = config.initial_cluster_state == ClusterState::New;
        if founding
            && !raft
                .is_initialized()
                .await
                .map_err(|e| StartError::Raft(e.to_string()))?
        {
            // Any founder can form the cluster, and each does it with the same membership.
            // But forming makes a founder campaign at once, and founders campaigning
            // together split term 1: openraft lets a higher id take over within a term,
            // so the first leader steps down and clients meet "no leader" right after the
            // cluster said it was up. The founder with the highest id (the one no other
            // can displace in term 1) forms it at once; the others give it an election
            // timeout to reach them, and form it themselves only if it has not.
            let first = members.keys().max() == Some(&id);
            let wait = Duration::from_millis(election_timeout_min);
            let (raft, members) = (raft.clone(), members.clone());
            let form = async move {
                if !first {
                    tokio::time::sleep(wait).await;
                    if raft.is_initialized().await.unwrap_or(true) {
                        return;
                    }
                }
                if let Err(e) = raft.initialize(members).await {
                    tracing::debug!("initialize: {e}");
                }
            };
            if first {
                form.await;
            } else {
                tokio::spawn(form);
            }
        }

        Ok(Arc::new(NodeCore::new(
            config,
            raft,
            applied,
            peers,
            (identity, members),
            log_handle,
            metrics,
        )))
    }

    /// Serves clients and peers on the given connection streams and spawns the background
    /// tasks.
    fn run<C, P, CIO, PIO>(
        core: Arc<NodeCore>,
        (client_addr, peer_addr): (SocketAddr, SocketAddr),
        clients: C,
        peers: P,
    ) -> Node
    where
        C: futures::Stream<Item = std::io::Result<CIO>> + Send + 'static,
        P: futures::Stream<Item = std::io::Result<PIO>> + Send + 'static,
        CIO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
        PIO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    {
        let (stop, stop_rx) = watch::channel(false);
        let (fatal_tx, fatal) = watch::channel(None);
        let mut tasks = vec![
            tokio::spawn(fatal_watch(core.clone(), fatal_tx, stop_rx.clone())),
            tokio::spawn(crate::services::serve_clients(
                core.clone(),
                clients,
                stop_rx.clone(),
            )),
            tokio::spawn(crate::services::serve_peers(
                core.clone(),
                peers,
                stop_rx.clone(),
            )),
            tokio::spawn(ticker(core.clone(), stop_rx.clone())),
            tokio::spawn(publish_client_url(core.clone(), stop_rx.clone())),
            tokio::spawn(crate::compactor::run(core.clone(), stop_rx.clone())),
            tokio::spawn(leadership_watch(core.clone(), stop_rx.clone())),
        ];
        if core.config().initial_corrupt_check {
            tasks.push(tokio::spawn(crate::fanout::initial_check(
                core.clone(),
                stop_rx.clone(),
            )));
        }
        if let Some(period) = core.config().corrupt_check_time {
            tasks.push(tokio::spawn(crate::fanout::periodic_check(
                core.clone(),
                period,
                stop_rx.clone(),
            )));
        }
        let id = core.id();
        tracing::info!(name = %core.config().name, id = format!("{id:x}"), %client_addr, %peer_addr, "oncekv node started");
        let broken = oncekv_core::broken::active();
        if !broken.is_empty() {
            tracing::warn!(
                ?broken,
                "this build is deliberately broken (ONCEKV_BREAK): for the nemesis's checks only"
            );
        }
        Node {
            core,
            client_addr,
            peer_addr,
            stop,
            stop_rx,
            fatal,
            tasks,
        }
    }

    /// Serves the HTTP routes (metrics, health, version) on `listener` as well, through
    /// the client port's TLS when `tls` (etcd's `https://` `--listen-metrics-urls`: the
    /// client certificate, key and CA, client certificates required with
    /// `--client-cert-auth`). Refused when `tls` is asked for without client TLS.
    pub fn serve_http(&mut self, listener: TcpListener, tls: bool) -> Result<(), String> {
        let server_tls = if tls {
            let files = self.core.config().client_tls.clone().ok_or_else(|| {
                "an https:// metrics URL needs the client port's TLS (--cert-file and \
                 --key-file, or --auto-tls)"
                    .to_string()
            })?;
            Some(crate::tls::ServerTls::new(files).map_err(|e| format!("metrics TLS: {e}"))?)
        } else {
            None
        };
        let routes = crate::http::routes(self.core.clone()).fallback(crate::http::not_found);
        let stop = self.stop_rx.clone();
        let incoming = crate::tls::accept(
            guard(
                crate::services::incoming(listener),
                self.core.config().max_connections,
                "metrics",
            ),
            server_tls,
        );
        self.tasks.push(tokio::spawn(async move {
            let result = tonic::transport::Server::builder()
                .accept_http1(true)
                .add_routes(routes.into())
                .serve_with_incoming_shutdown(incoming, async move {
                    let mut stop = stop;
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await;
            if let Err(e) = result {
                tracing::error!("metrics server stopped: {e}");
            }
        }));
        Ok(())
    }

    /// Resolves when this member can no longer serve: raft stopped on an error it cannot
    /// recover from (a failed write or fsync of the log or a snapshot: a full disk, an I/O
    /// error), or a configuration without this member was committed. etcd exits then, so
    /// that a supervisor restarts it rather than leaving a process that answers every
    /// request with "server stopped"; `oncekv serve` does the same.
    pub async fn failed(&self) -> Stopped {
        let mut fatal = self.fatal.clone();
        match fatal.wait_for(|f| f.is_some()).await {
            Ok(f) => f.clone().unwrap_or(Stopped::Fatal(String::new())),
            // The watcher ended without a verdict: the node is shutting down.
            Err(_) => std::future::pending().await,
        }
    }

    /// Stops serving and shuts raft down (what is acknowledged is already durable). A
    /// leader of up to three voters first hands leadership to another, as etcd does on
    /// stop, so that clients find a leader at once rather than after an election timeout
    /// (see [`NodeCore::hand_over_before_stop`]).
    pub async fn shutdown(self) {
        self.core.hand_over_before_stop().await;
        self.halt().await;
    }

    /// [`Node::shutdown`] without the hand-over: for stopping every member at once (a
    /// hand-over would pass leadership to a member about to stop too), and for tests
    /// that want a leader gone without one.
    pub async fn halt(self) {
        let _ = self.stop.send(true);
        // The servers stop gracefully (in-flight requests finish), but a client that keeps
        // a connection open must not hold the shutdown forever.
        let grace = self.core.config().request_timeout;
        for mut t in self.tasks {
            if tokio::time::timeout(grace, &mut t).await.is_err() {
                tracing::warn!("a server task did not stop within {grace:?}; aborting it");
                t.abort();
            }
        }
        if let Err(e) = self.core.raft().shutdown().await {
            tracing::warn!("raft shutdown: {e}");
        }
        // A snapshot build runs on a task raft's shutdown does not wait for.
        self.core.applied().stop_snapshots().await;
        // Raft is stopped, so nothing queues another record: the log's files are final
        // when this returns. Its last write (the committed id, on drop of the last handle)
        // would otherwise land whenever the last task holding a handle ends, after a
        // caller may already be reading or copying the data directory. The clean-stop
        // mark lets a member that led resume its term at the next start instead of
        // waiting for an election (see `LogStore::read_vote`).
        if let Err(e) = self.core.close_log_cleanly().await {
            tracing::warn!("closing the raft log at stop: {e}");
        }
    }
}

/// A data directory written by `etcdctl snapshot restore` (etcd's `member/snap/db`) is
/// imported at the first start on it, as `oncekv snapshot restore` would from the same
/// database; etcd's files are left as they were.
fn import_etcd_layout(config: &NodeConfig) -> Result<(), StartError> {
    let imported = crate::backup::import_etcd_data_dir(
        config.disk.as_ref(),
        &config.data_dir,
        &config.name,
        &config.initial_cluster,
        &config.initial_cluster_token,
        config.clock.now_ms(),
    )
    .map_err(StartError::Import)?;
    if let Some(summary) = imported {
        tracing::info!(
            data_dir = %config.data_dir.display(),
            revision = summary.revision,
            keys = summary.live_keys,
            origin = %summary.origin,
            "imported etcd's member/snap/db as this member's state (once; etcd's files are \
             left as they were and no longer read)"
        );
    }
    Ok(())
}

/// This member's identity: the one saved in its data directory, or at the first start
/// the founding one (from `--initial-cluster`) or the one the running cluster gave it
/// (asked of the other members listed in `--initial-cluster`), then saved.
async fn identity(config: &NodeConfig, peers: &PeerChannels) -> Result<Identity, StartError> {
    let disk = config.disk.as_ref();
    if let Some(saved) = Identity::load(disk, &config.data_dir).map_err(StartError::Identity)? {
        return Ok(saved);
    }
    let identity = match config.initial_cluster_state {
        // A cluster formed now gets etcd's ids.
        ClusterState::New => IdScheme::Etcd
            .founder(
                &config.name,
                &config.initial_cluster,
                &config.initial_cluster_token,
            )
            .ok_or_else(|| StartError::NotAMember(config.name.clone()))?,
        ClusterState::Existing => join(config, peers).await?,
    };
    identity
        .save(disk, &config.data_dir)
        .map_err(StartError::Identity)?;
    Ok(identity)
}

/// Asks the other members of `--initial-cluster` who this member is, by its peer URL,
/// until one knows (MemberAdd must have added it).
async fn join(config: &NodeConfig, peers: &PeerChannels) -> Result<Identity, StartError> {
    let own = config
        .initial_cluster
        .iter()
        .find(|m| m.name == config.name)
        .map(|m| m.peer_url.clone())
        .unwrap_or_default();
    let mut answers = Vec::new();
    for attempt in 0..10 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        answers.clear();
        for m in config.initial_cluster.iter().filter(|m| m.peer_url != own) {
            match crate::forwarder::identify(peers, &m.peer_url, &own, Duration::from_secs(2)).await
            {
                Ok(Identified::Member(member_id, cluster_id)) => {
                    // The scheme only derives the founders' ids, which a member that
                    // joins later takes from the membership instead.
                    return Ok(Identity {
                        member_id,
                        cluster_id,
                        scheme: IdScheme::Etcd,
                    });
                }
                Ok(Identified::NotAMember) => answers.push(format!("{}: not a member", m.peer_url)),
                Ok(Identified::Unknown) => answers.push(format!("{}: still joining", m.peer_url)),
                Err(e) => answers.push(format!("{}: {e}", m.peer_url)),
            }
        }
    }
    Err(StartError::Join {
        peer_url: own,
        answers: answers.join("; "),
    })
}

/// Why a member stopped serving by itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// Raft stopped on this error (a storage failure).
    Fatal(String),
    /// A configuration without this member was committed.
    Removed,
}

/// The file in a data directory naming the directory its log was created in, when that is
/// not `data_dir/log` (etcd's `--wal-dir`).
const WAL_DIR_FILE: &str = "wal-dir";

/// Where this member's log is: `wal_dir`, or `data_dir/log` without one. A member started
/// once with `--wal-dir` records it, and is refused a start with another (or none): opening
/// an empty log beside its state would forget its vote and its unapplied entries. A data
/// directory whose log is already in `data_dir/log` is refused a `--wal-dir` the same way.
pub(crate) fn log_dir(
    disk: &dyn crate::disk::Disk,
    data_dir: &Path,
    wal_dir: Option<&Path>,
) -> Result<PathBuf, StartError> {
    let default = data_dir.join("log");
    let marker = data_dir.join(WAL_DIR_FILE);
    let recorded = match disk.read(&marker) {
        Ok(bytes) => Some(PathBuf::from(
            String::from_utf8_lossy(&bytes).trim_end().to_string(),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            return Err(StartError::WalDir(format!(
                "reading {}: {e}",
                marker.display()
            )));
        }
    };
    let wanted = wal_dir.map_or_else(|| default.clone(), Path::to_path_buf);
    match recorded {
        Some(recorded) if recorded == wanted => Ok(wanted),
        Some(recorded) => Err(StartError::WalDir(format!(
            "this member's log is in {} (its --wal-dir when it was created), not {}: start it \
             with --wal-dir {}",
            recorded.display(),
            wanted.display(),
            recorded.display()
        ))),
        None if wal_dir.is_none() => Ok(wanted),
        None => {
            let old_log = disk.list_dir(&default).map(|files| !files.is_empty());
            if matches!(old_log, Ok(true)) {
                return Err(StartError::WalDir(format!(
                    "this member's log is in {}: start it without --wal-dir (or move that \
                     directory to {} and write its path into {})",
                    default.display(),
                    wanted.display(),
                    marker.display()
                )));
            }
            let write = || -> std::io::Result<()> {
                disk.create_dir_all(data_dir)?;
                let tmp = data_dir.join(format!("{WAL_DIR_FILE}.tmp"));
                let mut file = disk.create(&tmp)?;
                file.write_all(wanted.to_string_lossy().as_bytes())?;
                file.sync_data()?;
                drop(file);
                disk.rename(&tmp, &marker)?;
                disk.sync_dir(data_dir)
            };
            write().map_err(|e| {
                StartError::WalDir(format!("recording --wal-dir in {}: {e}", marker.display()))
            })?;
            Ok(wanted)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_member_keeps_the_wal_dir_it_was_created_with() -> Result<(), Box<dyn std::error::Error>> {
        let disk = crate::disk::os_disk();
        let root = tempfile::tempdir()?;
        let (data, wal) = (root.path().join("data"), root.path().join("wal"));
        // No --wal-dir: the log is in DATA_DIR/log and nothing is recorded.
        assert_eq!(log_dir(disk.as_ref(), &data, None)?, data.join("log"));
        // The first start with one records it; later starts must name the same.
        assert_eq!(log_dir(disk.as_ref(), &data, Some(&wal))?, wal);
        assert_eq!(log_dir(disk.as_ref(), &data, Some(&wal))?, wal);
        let dropped = log_dir(disk.as_ref(), &data, None).map(|_| ()).unwrap_err();
        assert!(dropped.to_string().contains("--wal-dir"), "{dropped}");
        let moved = log_dir(disk.as_ref(), &data, Some(&root.path().join("elsewhere")));
        assert!(moved.is_err());

        // A member whose log is in DATA_DIR/log is refused a --wal-dir.
        let other = root.path().join("other");
        std::fs::create_dir_all(other.join("log"))?;
        std::fs::write(other.join("log").join("segment"), b"x")?;
        let refused = log_dir(disk.as_ref(), &other, Some(&wal))
            .map(|_| ())
            .unwrap_err();
        assert!(
            refused.to_string().contains("without --wal-dir"),
            "{refused}"
        );
        assert_eq!(log_dir(disk.as_ref(), &other, None)?, other.join("log"));
        Ok(())
    }
}
