//! How a [`Client`](crate::Client) times out, retries and keeps its session.

use std::time::Duration;

/// Client settings. Start from [`ClientConfig::default`] and change what you need:
///
/// ```
/// use std::time::Duration;
/// use oncekv_client::ClientConfig;
///
/// let config = ClientConfig {
///     request_timeout: Duration::from_secs(2),
///     max_attempts: 10,
///     ..ClientConfig::default()
/// };
/// assert!(config.exactly_once);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// How long the first attempt of a call may wait for its answer before the client
    /// gives up on it and retries on the next endpoint over a fresh connection. Each
    /// further attempt may wait twice as long as the one before, up to
    /// [`request_timeout`](Self::request_timeout), so a hung reply costs one short attempt
    /// while a slow but working server still gets the time it needs. A retried write keeps
    /// its sequence number, so giving up early never applies it twice.
    pub attempt_timeout: Duration,
    /// The longest any one attempt may wait (the attempt's outcome is then unknown, so a
    /// mutating call will only be retried under its original sequence number).
    pub request_timeout: Duration,
    /// How long establishing a connection to one endpoint may take.
    pub connect_timeout: Duration,
    /// Retry budget: at most this many attempts per call (the first one included).
    pub max_attempts: u32,
    /// Retry budget: no new attempt starts once this much time has passed since the call
    /// began, and no attempt runs past it.
    pub max_retry_time: Duration,
    /// The first backoff before a retry; it doubles on each further retry...
    pub backoff_base: Duration,
    /// ...up to this cap. Each delay is jittered to between half and all of its value.
    pub backoff_cap: Duration,
    /// Keep the session alive in the background (every third of its TTL). Turn off only
    /// to let a session expire on purpose (tests).
    pub keep_alive: bool,
    /// HTTP/2 keep-alive: a connection that has received nothing for this long is pinged,
    /// and declared dead (its calls fail and retry elsewhere) if the ping is not answered
    /// within the same time again. etcd servers refuse pings more often than every 5 s
    /// (grpc-go's keep-alive enforcement); use at least that against them.
    pub keep_alive_interval: Duration,
    /// Send a write that has not answered after the recent p95 latency (at least
    /// [`hedge_after_min`](Self::hedge_after_min)) a second time, with the same sequence
    /// number, to another member. The cluster absorbs the duplicate (the leader joins it
    /// to the original), so hedging trims tail latency when one member is slow without
    /// changing what is applied. Off by default; only tracked writes are hedged.
    pub hedge_writes: bool,
    /// The shortest delay before a hedge (until enough latencies are known, the delay is
    /// this).
    pub hedge_after_min: Duration,
    /// `true` (the default): mutating calls carry session metadata and take effect exactly
    /// once. `false`: an etcd-style client with the same API and the same retries but no
    /// session, so a retried write may be applied twice (kept for comparison).
    pub exactly_once: bool,
    /// Speak TLS to every endpoint: which CA to trust and which certificate to present
    /// (etcdctl's `--cacert`, `--cert`, `--key`, `--insecure-skip-tls-verify`). `None`:
    /// plaintext, except to `https://` endpoints, which are checked against the system's
    /// CA bundle.
    pub tls: Option<oncekv_proto::tls::ClientTlsOptions>,
    /// A user and password for clusters with auth on (etcdctl's `--user`): the client
    /// authenticates before its first request, sends the token with every request, and
    /// authenticates again when the cluster says the token went stale. The session it
    /// registers belongs to this user.
    pub credentials: Option<Credentials>,
}

/// A user name and password. `Debug` does not print the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            attempt_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(1),
            max_attempts: 30,
            max_retry_time: Duration::from_secs(30),
            backoff_base: Duration::from_millis(25),
            backoff_cap: Duration::from_secs(1),
            keep_alive: true,
            keep_alive_interval: Duration::from_secs(1),
            hedge_writes: false,
            hedge_after_min: Duration::from_millis(20),
            exactly_once: true,
            tls: None,
            credentials: None,
        }
    }
}

impl ClientConfig {
    /// The etcd-style contrast: default settings without sessions (at-least-once writes).
    pub fn untracked() -> ClientConfig {
        ClientConfig {
            exactly_once: false,
            ..ClientConfig::default()
        }
    }
}
