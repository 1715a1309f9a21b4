//! [`Client`]: the session, the counters, and the one retry loop every call goes through.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::transport::Channel;
use tokio::time::Instant;
use tonic::{Request, Status};

use crate::config::ClientConfig;
use crate::error::{Error, Failure, classify, timed_out};
use crate::hedge::Latencies;
use crate::retry::Budget;
use crate::session::{self, InFlight, Session};
use crate::transport::Transport;

/// A connection to an oncekv (or etcd) cluster. Cheap to clone: clones share the
/// endpoints, the session and the counters, and may be used concurrently.
///
/// See the [crate documentation](crate) for how calls retry and what exactly-once means
/// for each of them.
#[derive(Debug, Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: ClientConfig,
    transport: Arc<Transport>,
    /// The live session, if one is registered. Dropping it stops its keep-alive.
    session: Mutex<Option<Arc<Session>>>,
    /// Held while registering, so concurrent first calls share one registration.
    registering: tokio::sync::Mutex<()>,
    counters: Counters,
    /// Recent write latencies (when to hedge).
    latencies: Latencies,
    /// Releases of abandoned locks and candidacies still running in the background;
    /// [`Client::close`] waits for them, so a process that closes its client before it
    /// exits leaves no waiter behind.
    releases: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    retries: AtomicU64,
    outcome_unknown: AtomicU64,
    sessions_registered: AtomicU64,
    hedges: AtomicU64,
}

/// What a client has done so far (all clones of it together).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Calls made (reads and writes).
    pub requests: u64,
    /// Attempts beyond the first of each call.
    pub retries: u64,
    /// Calls that ended in [`Error::OutcomeUnknown`].
    pub outcome_unknown: u64,
    /// Sessions registered (the first one, and one after each expiry).
    pub sessions_registered: u64,
    /// Writes sent a second time to another member because the first copy was slow
    /// ([`ClientConfig::hedge_writes`]).
    pub hedges: u64,
}

/// etcd's messages for a token that no longer works.
const INVALID_TOKEN: &str = "etcdserver: invalid auth token";
const OLD_AUTH_REVISION: &str = "etcdserver: revision of auth store is old";

/// Whether a call changes state (and so is tracked and may end in `OutcomeUnknown`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Read,
    Write,
    /// A write whose answer may legitimately take unbounded time (Lock, Campaign: they
    /// answer once the caller's turn comes). Tracked like a write, but an attempt has no
    /// deadline (a dead connection is still found by HTTP/2 keep-alive pings), it is never
    /// hedged, and time spent waiting does not count against the retry budget.
    Wait,
}

impl Kind {
    fn writes(self) -> bool {
        matches!(self, Kind::Write | Kind::Wait)
    }
}

impl Client {
    /// A client for the cluster at `endpoints` (`http://host:port` or `host:port`).
    ///
    /// Nothing connects yet: channels open on first use, and the session is registered by
    /// the first write. Calls must run inside a tokio runtime.
    pub fn connect<S: AsRef<str>>(
        endpoints: impl IntoIterator<Item = S>,
        config: ClientConfig,
    ) -> Result<Client, Error> {
        Client::connect_with(endpoints, config, None)
    }

    /// As [`connect`](Self::connect), dialing through `connector` (a simulated network)
    /// instead of tokio's TCP when one is given.
    pub fn connect_with<S: AsRef<str>>(
        endpoints: impl IntoIterator<Item = S>,
        config: ClientConfig,
        connector: Option<oncekv_proto::net::Connector>,
    ) -> Result<Client, Error> {
        let urls: Vec<String> = endpoints
            .into_iter()
            .map(|s| s.as_ref().to_string())
            .collect();
        let transport = Arc::new(Transport::new(&urls, &config, connector)?);
        Ok(Client {
            inner: Arc::new(Inner {
                config,
                transport,
                session: Mutex::new(None),
                registering: tokio::sync::Mutex::new(()),
                counters: Counters::default(),
                latencies: Latencies::default(),
                releases: Mutex::new(Vec::new()),
            }),
        })
    }

    pub(crate) fn transport(&self) -> &Arc<Transport> {
        &self.inner.transport
    }

    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    pub fn stats(&self) -> ClientStats {
        let c = &self.inner.counters;
        ClientStats {
            requests: c.requests.load(Ordering::Relaxed),
            retries: c.retries.load(Ordering::Relaxed),
            outcome_unknown: c.outcome_unknown.load(Ordering::Relaxed),
            sessions_registered: c.sessions_registered.load(Ordering::Relaxed),
            hedges: c.hedges.load(Ordering::Relaxed),
        }
    }

    /// The client id of the live session, if one is registered and not known to have
    /// expired.
    pub fn session_id(&self) -> Option<u64> {
        self.live_session().map(|s| s.client_id)
    }

    /// Ends the session on the server (freeing its saved responses) and stops its
    /// keep-alive. Call it once no write is in flight: a write still in flight would end
    /// in [`Error::OutcomeUnknown`]. A later write registers a new session.
    pub async fn close(&self) -> Result<(), Error> {
        let releases = std::mem::take(
            &mut *self
                .inner
                .releases
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for release in releases {
            // Bounded: each release is one write with the client's own retry budget.
            let _ = tokio::time::timeout(self.inner.config.max_retry_time, release).await;
        }
        let session = self.slot().take();
        match session {
            Some(s) if !s.is_expired() => {
                s.close(&self.inner.transport, self.inner.config.attempt_timeout)
                    .await
            }
            _ => Ok(()),
        }
    }

    /// Keeps a background release (see `Inner::releases`) for [`close`](Self::close) to
    /// wait for.
    pub(crate) fn track_release(&self, release: tokio::task::JoinHandle<()>) {
        let mut releases = self
            .inner
            .releases
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        releases.retain(|r| !r.is_finished());
        releases.push(release);
    }

    fn slot(&self) -> MutexGuard<'_, Option<Arc<Session>>> {
        self.inner
            .session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn live_session(&self) -> Option<Arc<Session>> {
        self.slot().as_ref().filter(|s| !s.is_expired()).cloned()
    }

    /// The live session, registering one if there is none.
    async fn session(&self) -> Result<Arc<Session>, Error> {
        if let Some(s) = self.live_session() {
            return Ok(s);
        }
        let _registering = self.inner.registering.lock().await;
        if let Some(s) = self.live_session() {
            return Ok(s);
        }
        let s = session::register(&self.inner.transport, &self.inner.config).await?;
        self.inner
            .counters
            .sessions_registered
            .fetch_add(1, Ordering::Relaxed);
        *self.slot() = Some(s.clone());
        Ok(s)
    }

    /// A tracked call's seq (a new session if needed); `None` for untracked calls.
    async fn begin(&self, kind: Kind) -> Result<Option<InFlight>, Error> {
        if kind.writes() && self.inner.config.exactly_once {
            Ok(Some(self.session().await?.begin().await))
        } else {
            Ok(None)
        }
    }

    /// Runs one call: sends `req` through `send` to the current endpoint, retrying
    /// retryable failures on the next endpoint with backoff until the budget is spent.
    ///
    /// A tracked write keeps its `(client_id, seq)` across every retry. If its session is
    /// found expired, the write is re-sent under a new session only when no earlier attempt
    /// can have reached a server; otherwise it ends in [`Error::OutcomeUnknown`], as does a
    /// write whose budget runs out after a send.
    pub(crate) async fn call<Req, Resp, F, Fut>(
        &self,
        kind: Kind,
        what: &'static str,
        req: Req,
        send: F,
    ) -> Result<Resp, Error>
    where
        Req: Clone,
        F: Fn(Channel, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Resp, Status>>,
    {
        let counters = &self.inner.counters;
        let transport = &self.inner.transport;
        counters.requests.fetch_add(1, Ordering::Relaxed);
        transport.discover_once().await;
        if self.inner.config.credentials.is_some() && !transport.has_token() {
            self.authenticate().await?;
        }
        // A token goes stale when any user or role changes: authenticate again, once per
        // call, and resend (the server refused before running anything).
        let mut reauthenticated = false;
        let mut budget = Budget::new(&self.inner.config);
        let mut tracked = match self.begin(kind).await {
            Err(e) if self.stale_token(&e) => {
                reauthenticated = true;
                self.authenticate().await?;
                self.begin(kind).await?
            }
            other => other?,
        };
        // Whether an attempt under the current (client_id, seq) may have reached a server.
        let mut maybe_sent = false;
        loop {
            let i = transport.current();
            let timeout = budget.start_attempt();
            if budget.attempts() > 1 {
                counters.retries.fetch_add(1, Ordering::Relaxed);
            }
            let wait = kind == Kind::Wait;
            let request = |timeout: Duration| {
                let mut request = Request::new(req.clone());
                if !wait {
                    request.set_timeout(timeout);
                }
                if let Some(t) = &tracked {
                    t.session.attach(&mut request, t.seq);
                }
                request
            };
            let hedge_after = self.hedge_after(tracked.is_some() && !wait, budget.attempts());
            let (generation, channel) = transport.channel_with_generation(i);
            let started = Instant::now();
            // Set once a hedge left: a copy may then have run even if the first attempt
            // provably never reached a server.
            let hedged = AtomicBool::new(false);
            let attempt = async {
                let first = send(channel, request(timeout));
                let Some(delay) = hedge_after else {
                    return first.await;
                };
                tokio::pin!(first);
                tokio::select! {
                    r = &mut first => return r,
                    () = tokio::time::sleep(delay) => {}
                }
                // The same (client id, seq) to the next member: whichever copy the
                // cluster sees second is absorbed, so the first success is the answer.
                counters.hedges.fetch_add(1, Ordering::Relaxed);
                hedged.store(true, Ordering::Relaxed);
                let other = (i + 1) % transport.len();
                let second = send(
                    transport.channel(other),
                    request(timeout.saturating_sub(delay)),
                );
                tokio::pin!(second);
                tokio::select! {
                    r = &mut first => match r {
                        Ok(resp) => Ok(resp),
                        Err(status) => second.await.map_err(|_| status),
                    },
                    r = &mut second => match r {
                        Ok(resp) => Ok(resp),
                        Err(_) => first.await,
                    },
                }
            };
            let outcome = if wait {
                Ok(attempt.await)
            } else {
                tokio::time::timeout(timeout, attempt).await
            };
            if wait && started.elapsed() > self.inner.config.request_timeout {
                // It waited for its turn, then failed: the budget is for failing, so the
                // retry starts a fresh one.
                budget = Budget::new(&self.inner.config);
                budget.start_attempt();
            }
            let failure = match outcome {
                // Dropping `tracked` completes the seq.
                Ok(Ok(resp)) => {
                    if kind == Kind::Write {
                        self.inner.latencies.record(started.elapsed());
                    }
                    return Ok(resp);
                }
                Ok(Err(status)) => {
                    if timed_out(&status) {
                        transport.reconnect(i, generation);
                    }
                    classify(&status, transport.url(i))
                }
                Err(_) => {
                    transport.reconnect(i, generation);
                    Failure::timeout(transport.url(i), timeout)
                }
            };
            // A session that expires now must not make the write look unsent: re-sending
            // it under a new session could apply it twice.
            maybe_sent |= hedged.load(Ordering::Relaxed);
            match failure {
                Failure::Answer(e) if !reauthenticated && self.stale_token(&e) => {
                    reauthenticated = true;
                    self.authenticate().await?;
                }
                // A refusal at the door (the token, the user's rights, the session's
                // window) is given before the cluster looks at the seq, so it says nothing
                // about an earlier attempt that may have run.
                Failure::Answer(e)
                    if maybe_sent && tracked.is_some() && refused_at_the_door(&e) =>
                {
                    let reason = format!(
                        "an earlier attempt may have run, and a later one was refused before the cluster checked its seq: {e}"
                    );
                    return Err(self.outcome_unknown(what, tracked.as_ref(), &budget, reason));
                }
                Failure::Answer(e) => return Err(e),
                Failure::SessionExpired(message) => {
                    let Some(t) = tracked.take() else {
                        return Err(Error::SessionExpired(message));
                    };
                    t.session.mark_expired();
                    if maybe_sent {
                        let reason = format!(
                            "its session expired while the request was in flight ({message})"
                        );
                        return Err(self.outcome_unknown(what, Some(&t), &budget, reason));
                    }
                    if budget.next_delay().is_none() {
                        return Err(Error::SessionExpired(message));
                    }
                    tracing::debug!(
                        client_id = t.session.client_id,
                        seq = t.seq,
                        "oncekv client: {what} met an expired session before it could run; re-registering"
                    );
                    drop(t);
                    tracked = self.begin(kind).await?;
                }
                Failure::Retry {
                    error,
                    maybe_sent: sent,
                } => {
                    maybe_sent |= sent && kind.writes();
                    transport.failed(i);
                    let Some(delay) = budget.next_delay() else {
                        if maybe_sent {
                            let reason = format!(
                                "gave up after {} attempts; last error: {error}",
                                budget.attempts()
                            );
                            return Err(self.outcome_unknown(
                                what,
                                tracked.as_ref(),
                                &budget,
                                reason,
                            ));
                        }
                        return Err(error);
                    };
                    tracing::debug!(
                        attempt = budget.attempts(),
                        ?delay,
                        "oncekv client: {what} failed, retrying: {error}"
                    );
                    tokio::time::sleep(delay).await;
                    transport.find_leader().await;
                }
            }
        }
    }

    /// Whether `e` says the token is no longer good (and the client can get another).
    fn stale_token(&self, e: &Error) -> bool {
        self.inner.config.credentials.is_some()
            && matches!(e, Error::Auth(m) if m == INVALID_TOKEN || m == OLD_AUTH_REVISION)
    }

    /// etcd's Authenticate with the configured credentials, trying each endpoint in turn;
    /// the token then goes with every request.
    pub(crate) async fn authenticate(&self) -> Result<(), Error> {
        use oncekv_proto::etcdserverpb::AuthenticateRequest;
        use oncekv_proto::etcdserverpb::auth_client::AuthClient;
        let Some(credentials) = &self.inner.config.credentials else {
            return Ok(());
        };
        let transport = &self.inner.transport;
        let mut budget = Budget::new(&self.inner.config);
        loop {
            let i = transport.current();
            let timeout = budget.start_attempt();
            let mut request = Request::new(AuthenticateRequest {
                name: credentials.user.clone(),
                password: credentials.password.clone(),
            });
            request.set_timeout(timeout);
            let mut auth = AuthClient::new(transport.channel(i));
            let sent = auth.authenticate(request);
            let error = match tokio::time::timeout(timeout, sent).await {
                Ok(Ok(resp)) => return transport.set_token(Some(&resp.into_inner().token)),
                Ok(Err(status)) => match classify(&status, transport.url(i)) {
                    Failure::Retry { error, .. } => error,
                    Failure::Answer(e) => return Err(e),
                    Failure::SessionExpired(m) => return Err(Error::Auth(m)),
                },
                Err(_) => Error::Timeout {
                    endpoint: transport.url(i).to_string(),
                    after: timeout,
                },
            };
            transport.failed(i);
            let Some(delay) = budget.next_delay() else {
                return Err(error);
            };
            tokio::time::sleep(delay).await;
        }
    }

    /// How long the first attempt of a tracked write waits before it is hedged; `None`
    /// when it is not (hedging off, an untracked call, a retry, a single endpoint).
    fn hedge_after(&self, tracked: bool, attempt: u32) -> Option<Duration> {
        let config = &self.inner.config;
        (config.hedge_writes && tracked && attempt == 1 && self.inner.transport.len() > 1)
            .then(|| self.inner.latencies.hedge_after(config.hedge_after_min))
    }

    fn outcome_unknown(
        &self,
        what: &str,
        tracked: Option<&InFlight>,
        budget: &Budget,
        reason: String,
    ) -> Error {
        self.inner
            .counters
            .outcome_unknown
            .fetch_add(1, Ordering::Relaxed);
        let what = match tracked {
            Some(t) => format!("{what} (session {}, seq {})", t.session.client_id, t.seq),
            None => format!("{what} (untracked)"),
        };
        tracing::warn!(
            attempts = budget.attempts(),
            "oncekv client: outcome of {what} unknown: {reason}"
        );
        Error::OutcomeUnknown { what, reason }
    }

    /// The client's endpoints, as normalized URLs.
    pub(crate) fn endpoint_urls(&self) -> Vec<String> {
        let t = &self.inner.transport;
        (0..t.len()).map(|i| t.url(i).to_string()).collect()
    }

    /// The channel to `endpoint` if it is one of the client's, else a new one.
    pub(crate) fn channel_to(&self, endpoint: &str) -> Result<Channel, Error> {
        let t = &self.inner.transport;
        let url = crate::transport::normalize(endpoint);
        match (0..t.len()).find(|&i| t.url(i) == url) {
            Some(i) => Ok(t.channel(i)),
            None => Ok(t.open_endpoint(&crate::transport::endpoint(endpoint, &self.inner.config)?)),
        }
    }
}

/// Whether a write's refusal came before the cluster looked up its (client id, seq): an
/// auth refusal (a token gone stale or invalid, a permission the user no longer has) or
/// a full window. Such a refusal answers that attempt only; an earlier attempt of the
/// same seq may still have run. (The one auth refusal given at apply, a write permitted
/// at an older auth revision, is the seq's saved answer; it is counted here too, which
/// errs toward "unknown", never toward a wrong "not applied".)
fn refused_at_the_door(e: &Error) -> bool {
    matches!(
        e,
        Error::Auth(_) | Error::PermissionDenied(_) | Error::WindowExceeded(_)
    )
}
