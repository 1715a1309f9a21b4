//! The proxy's side toward the cluster: one oncekv client per downstream identity, and
//! the one way every relayed call goes out.
//!
//! **Identity.** A downstream caller's rights are those of the auth token it sends
//! (etcd's `token` metadata). The proxy never lends its own: each distinct token (and
//! "no token") gets a client of its own that sends that token, so the cluster checks
//! every request against the caller's user, and the session that client registers
//! belongs to that user (the server refuses a session used by another user). Clients of
//! tokens unused for [`IDLE_CLIENT`] are closed, which ends their sessions.
//!
//! **Calls.** A relayed call runs in a task of its own: when the downstream caller goes
//! away (its deadline passes, its connection drops), a write already sent keeps retrying
//! under its seq until the cluster answers. Its outcome is then simply not delivered,
//! but it is known to the cluster and applied at most once. In-flight calls are bounded
//! by [`ProxyConfig::max_in_flight`](crate::ProxyConfig::max_in_flight).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use oncekv_client::{CallKind, Channel, Client, ClientConfig};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tonic::{Request, Status};

use crate::metrics::Metrics;

/// etcd's auth token metadata key.
pub(crate) const TOKEN_KEY: &str = "token";
/// A client whose token has not been used for this long is closed (its session ends).
const IDLE_CLIENT: Duration = Duration::from_secs(300);
/// At most this many distinct tokens hold a client at once; the least recently used
/// beyond it is closed.
const MAX_CLIENTS: usize = 4096;

/// The clients toward the cluster, one per downstream token.
#[derive(Debug)]
pub(crate) struct Upstream {
    endpoints: Vec<String>,
    config: ClientConfig,
    clients: Mutex<HashMap<Option<String>, Entry>>,
    in_flight: Arc<Semaphore>,
    pub(crate) metrics: Arc<Metrics>,
}

#[derive(Debug)]
struct Entry {
    client: Client,
    last_used: Instant,
}

impl Upstream {
    pub(crate) fn new(
        endpoints: Vec<String>,
        config: ClientConfig,
        max_in_flight: usize,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Upstream>, oncekv_client::Error> {
        // Fail at start on endpoints the client cannot use, not at the first request.
        Client::connect(&endpoints, config.clone())?;
        let upstream = Arc::new(Upstream {
            endpoints,
            config,
            clients: Mutex::new(HashMap::new()),
            in_flight: Arc::new(Semaphore::new(max_in_flight.max(1))),
            metrics,
        });
        let weak = Arc::downgrade(&upstream);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(IDLE_CLIENT / 5);
            loop {
                tick.tick().await;
                let Some(upstream) = weak.upgrade() else {
                    return;
                };
                upstream.close_idle(IDLE_CLIENT);
            }
        });
        Ok(upstream)
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<Option<String>, Entry>> {
        self.clients.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The client for the caller of `request` (by the token it sent).
    pub(crate) fn client_for<T>(&self, request: &Request<T>) -> Result<Client, Status> {
        self.client_for_token(token_of(request)?)
    }

    pub(crate) fn client_for_token(&self, token: Option<String>) -> Result<Client, Status> {
        let now = Instant::now();
        let mut entries = self.entries();
        if let Some(entry) = entries.get_mut(&token) {
            entry.last_used = now;
            return Ok(entry.client.clone());
        }
        let client = Client::connect(&self.endpoints, self.config.clone())
            .map_err(|e| Status::failed_precondition(e.to_string()))?;
        client
            .use_token(token.as_deref())
            .map_err(|_| Status::invalid_argument("etcdserver: invalid auth token"))?;
        if entries.len() >= MAX_CLIENTS {
            let oldest = entries
                .iter()
                .filter(|(k, _)| k.is_some())
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone());
            if let Some(old) = oldest.and_then(|k| entries.remove(&k)) {
                close_in_background(old.client);
            }
        }
        entries.insert(
            token,
            Entry {
                client: client.clone(),
                last_used: now,
            },
        );
        self.metrics.upstream_clients.set(entries.len() as i64);
        Ok(client)
    }

    /// Closes the clients of tokens not used for `idle` (never the token-less one, which
    /// every caller without auth shares).
    pub(crate) fn close_idle(&self, idle: Duration) {
        let now = Instant::now();
        let mut entries = self.entries();
        let stale: Vec<_> = entries
            .iter()
            .filter(|(k, e)| k.is_some() && now.duration_since(e.last_used) >= idle)
            .map(|(k, _)| k.clone())
            .collect();
        for key in stale {
            if let Some(entry) = entries.remove(&key) {
                close_in_background(entry.client);
            }
        }
        self.metrics.upstream_clients.set(entries.len() as i64);
    }

    /// Closes every client (their sessions end on the cluster).
    pub(crate) async fn close_all(&self) {
        let clients: Vec<Client> = self.entries().drain().map(|(_, e)| e.client).collect();
        for client in clients {
            let _ = tokio::time::timeout(Duration::from_secs(2), client.close()).await;
        }
    }

    /// Relays one call for `client` (see the module doc): in a task of its own, within
    /// the in-flight bound, with the cluster's own refusal passed on unchanged.
    pub(crate) async fn call<Req, Resp, F, Fut>(
        &self,
        client: Client,
        kind: CallKind,
        what: &'static str,
        req: Req,
        send: F,
    ) -> Result<Resp, Status>
    where
        Req: Clone + Send + Sync + 'static,
        Resp: Send + 'static,
        F: Fn(Channel, Request<Req>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Resp, Status>> + Send + 'static,
    {
        let permit = self
            .in_flight
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Status::unavailable("oncekv-proxy: stopping"))?;
        self.metrics.requests.with_label_values(&[what]).inc();
        let call = Detached::new(async move {
            let _permit = permit;
            client.relay(kind, what, req, send).await
        });
        match call.await {
            Ok(resp) => Ok(resp),
            Err(e) => {
                if e.error.is_outcome_unknown() {
                    self.metrics.outcome_unknown.inc();
                    tracing::warn!("oncekv-proxy: {}", e.error);
                }
                tracing::debug!(what, error = %e.error, "oncekv-proxy: relayed call failed");
                Err(e.to_status())
            }
        }
    }
}

/// A call run in the caller's task while the caller waits, and moved to a task of its
/// own if the caller stops waiting (the downstream client went away): a write already
/// sent then still finishes its retries under its seq. Running it in place rather than
/// spawning it up front saves two task hand-offs per call, which on a loopback hop is
/// a good part of the proxy's added latency.
struct Detached<T: Send + 'static> {
    call: Option<Pin<Box<dyn Future<Output = T> + Send>>>,
}

impl<T: Send + 'static> Detached<T> {
    fn new(call: impl Future<Output = T> + Send + 'static) -> Detached<T> {
        Detached {
            call: Some(Box::pin(call)),
        }
    }
}

impl<T: Send + 'static> Future for Detached<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let Some(call) = self.call.as_mut() else {
            return Poll::Pending;
        };
        let out = std::task::ready!(call.as_mut().poll(cx));
        self.call = None;
        Poll::Ready(out)
    }
}

impl<T: Send + 'static> Drop for Detached<T> {
    fn drop(&mut self) {
        if let Some(call) = self.call.take() {
            // A box moves without moving the future inside it, so a started call can go
            // on in a task of its own.
            tokio::spawn(async move {
                let _ = call.await;
            });
        }
    }
}

/// The auth token a downstream request carries, if any.
pub(crate) fn token_of<T>(request: &Request<T>) -> Result<Option<String>, Status> {
    match request.metadata().get(TOKEN_KEY) {
        None => Ok(None),
        Some(v) => Ok(Some(
            v.to_str()
                .map_err(|_| Status::invalid_argument("etcdserver: invalid auth token"))?
                .to_string(),
        )),
    }
}

fn close_in_background(client: Client) {
    tokio::spawn(async move {
        let _ = tokio::time::timeout(Duration::from_secs(5), client.close()).await;
    });
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    // The caller gives up after the call started: the call still runs to its end.
    #[tokio::test]
    async fn a_dropped_call_runs_on_to_its_end() {
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done) = tokio::sync::oneshot::channel::<()>();
        let finished = Arc::new(AtomicBool::new(false));
        let call = Detached::new({
            let finished = finished.clone();
            async move {
                let _ = wait.await;
                finished.store(true, Ordering::SeqCst);
                let _ = done_tx.send(());
            }
        });
        // Started (polled once, waiting), then abandoned.
        let timed_out = tokio::time::timeout(Duration::from_millis(10), call).await;
        assert!(timed_out.is_err());
        assert!(!finished.load(Ordering::SeqCst));
        go.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), done)
            .await
            .unwrap()
            .unwrap();
        assert!(finished.load(Ordering::SeqCst));
    }
}
