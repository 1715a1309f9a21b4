//! The endpoint list: lazily created channels and which member to talk to.
//!
//! Requests go to the *current* endpoint. After a retryable failure the caller moves on to
//! the next one ([`Transport::failed`]) and, before retrying, asks every member for its
//! `Maintenance.Status` ([`Transport::find_leader`]): the member that reports itself as
//! leader becomes current. Followers forward writes, so talking to a follower is correct,
//! just one hop slower.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use oncekv_proto::etcdserverpb::StatusRequest;
use oncekv_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use oncekv_proto::net::Connector;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::codegen::{Service, http};
use tonic::transport::Endpoint;

use crate::config::ClientConfig;
use crate::error::Error;

/// Leader discovery gives up on silent members after this long.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// Concurrent failures share one discovery round within this window.
const REDISCOVER_AFTER: Duration = Duration::from_millis(50);

#[derive(Debug)]
struct Target {
    url: String,
    endpoint: Endpoint,
    /// The channel (created on first use) and its generation: a call that timed out
    /// replaces the generation it used, so concurrent timeouts replace it once.
    channel: Mutex<Option<(u64, Channel)>>,
}

/// The members a client talks to.
#[derive(Debug)]
pub(crate) struct Transport {
    targets: Vec<Target>,
    current: AtomicUsize,
    request_timeout: Duration,
    /// Whether leader discovery has run at least once (the per-call fast path).
    discovered: AtomicBool,
    /// When leader discovery last ran (`None`: never).
    last_discovery: tokio::sync::Mutex<Option<Instant>>,
    /// How channels connect: tokio TCP when `None` (a simulation passes its network's).
    connector: Option<Connector>,
    token: TokenSlot,
}

/// The auth token every channel of a client sends, once it has one.
pub(crate) type TokenSlot = Arc<std::sync::RwLock<Option<http::HeaderValue>>>;

/// A channel to one endpoint that puts the client's auth token, when it has one, on
/// every request (etcd's `token` metadata): every call, watch and keep-alive carries it
/// without each building its own metadata.
#[derive(Debug, Clone)]
pub struct Channel {
    inner: tonic::transport::Channel,
    token: TokenSlot,
}

type HttpRequest = http::Request<tonic::body::Body>;

impl Service<HttpRequest> for Channel {
    type Response = http::Response<tonic::body::Body>;
    type Error = tonic::transport::Error;
    type Future = <tonic::transport::Channel as Service<HttpRequest>>::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        Service::<HttpRequest>::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, mut request: HttpRequest) -> Self::Future {
        let token = self.token.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(token) = token.as_ref() {
            request.headers_mut().insert("token", token.clone());
        }
        drop(token);
        self.inner.call(request)
    }
}

/// `127.0.0.1:2379` → `http://127.0.0.1:2379`; URLs with a scheme are kept.
pub(crate) fn normalize(url: &str) -> String {
    let url = url.trim();
    if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    }
}

/// A channel configuration for `url` (nothing connects until the first request).
pub(crate) fn endpoint(url: &str, config: &ClientConfig) -> Result<Endpoint, Error> {
    // TLS is the connector's business; tonic is given plain HTTP/2 either way.
    let normalized = normalize(url);
    let plain = match normalized.strip_prefix("https://") {
        Some(rest) => format!("http://{rest}"),
        None => normalized,
    };
    let endpoint = Endpoint::from_shared(plain).map_err(|e| Error::InvalidEndpoint {
        endpoint: url.to_string(),
        reason: e.to_string(),
    })?;
    if endpoint.uri().host().is_none() {
        return Err(Error::InvalidEndpoint {
            endpoint: url.to_string(),
            reason: "no host".into(),
        });
    }
    // HTTP/2 pings notice a connection that went silent (a dead member, a dropped path, a
    // reply that never comes) instead of waiting on it until each request's own timeout.
    // They go out while idle too: a connection whose writes are stuck (the peer stopped
    // acknowledging) opens no stream, so to hyper it looks idle, and without idle pings
    // it would never be declared dead and replaced.
    Ok(endpoint
        .connect_timeout(config.connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(config.keep_alive_interval)
        .keep_alive_timeout(config.keep_alive_interval)
        .keep_alive_while_idle(true))
}

impl Transport {
    pub(crate) fn new<S: AsRef<str>>(
        urls: &[S],
        config: &ClientConfig,
        connector: Option<Connector>,
    ) -> Result<Transport, Error> {
        if urls.is_empty() {
            return Err(Error::NoEndpoints);
        }
        let any_https = urls
            .iter()
            .any(|u| normalize(u.as_ref()).starts_with("https://"));
        let tls = match &config.tls {
            Some(options) => Some(options.clone()),
            None if any_https => Some(oncekv_proto::tls::ClientTlsOptions::default()),
            None => None,
        };
        let connector = match (connector, tls) {
            (Some(c), _) => Some(c),
            (None, Some(options)) => Some(Connector::tls(
                options.build().map_err(|e| Error::Tls(e.to_string()))?,
            )),
            (None, None) => None,
        };
        let targets = urls
            .iter()
            .map(|u| {
                Ok(Target {
                    url: normalize(u.as_ref()),
                    endpoint: endpoint(u.as_ref(), config)?,
                    channel: Mutex::new(None),
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(Transport {
            targets,
            current: AtomicUsize::new(0),
            request_timeout: config.request_timeout,
            discovered: AtomicBool::new(false),
            last_discovery: tokio::sync::Mutex::new(None),
            connector,
            token: TokenSlot::default(),
        })
    }

    /// The endpoint to send the next request to.
    pub(crate) fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed) % self.targets.len()
    }

    pub(crate) fn len(&self) -> usize {
        self.targets.len()
    }

    pub(crate) fn url(&self, i: usize) -> &str {
        &self.targets[i].url
    }

    /// The (lazily created) channel to endpoint `i`. Must be called inside a tokio runtime.
    pub(crate) fn channel(&self, i: usize) -> Channel {
        self.channel_with_generation(i).1
    }

    /// [`channel`](Self::channel) with its generation, for [`reconnect`](Self::reconnect).
    pub(crate) fn channel_with_generation(&self, i: usize) -> (u64, Channel) {
        let target = &self.targets[i];
        let mut slot = target
            .channel
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        slot.get_or_insert_with(|| (0, self.open(target))).clone()
    }

    /// A call on generation `generation` of endpoint `i`'s channel got no answer in time:
    /// its connection may be hung (the peer holds it open and silent), so later calls get
    /// a new connection rather than wait for keep-alive to declare this one dead. Calls
    /// still running on the old one finish or time out on their own.
    pub(crate) fn reconnect(&self, i: usize, generation: u64) {
        let target = &self.targets[i];
        let mut slot = target
            .channel
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((current, _)) = slot.as_ref()
            && *current == generation
        {
            *slot = Some((generation + 1, self.open(target)));
        }
    }

    fn open(&self, target: &Target) -> Channel {
        self.open_endpoint(&target.endpoint)
    }

    /// A channel to `endpoint` connecting as this transport's do (TLS included).
    pub(crate) fn open_endpoint(&self, endpoint: &Endpoint) -> Channel {
        let inner = match &self.connector {
            Some(c) => c.channel(endpoint),
            None => endpoint.connect_lazy(),
        };
        Channel {
            inner,
            token: self.token.clone(),
        }
    }

    /// Whether the client holds an auth token.
    pub(crate) fn has_token(&self) -> bool {
        self.token
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// Sends `token` with every request from now on (`None`: no token).
    pub(crate) fn set_token(&self, token: Option<&str>) -> Result<(), Error> {
        let value = token
            .map(|t| {
                http::HeaderValue::from_str(t).map_err(|_| {
                    Error::Auth("oncekv client: the server sent an unusable token".into())
                })
            })
            .transpose()?;
        *self.token.write().unwrap_or_else(PoisonError::into_inner) = value;
        Ok(())
    }

    /// A request to endpoint `i` failed retryably: move on to the next one (unless a
    /// concurrent failure already did).
    pub(crate) fn failed(&self, i: usize) {
        let next = (i + 1) % self.targets.len();
        let _ = self
            .current
            .compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Runs leader discovery once per client before the first request.
    pub(crate) async fn discover_once(&self) {
        if self.discovered.load(Ordering::Relaxed) {
            return;
        }
        let never = self.last_discovery.lock().await.is_none();
        if never {
            self.find_leader().await;
        }
    }

    /// Asks every endpoint for its status and makes the one that reports itself leader
    /// current. Best effort: without an answer the current endpoint stays as it is.
    /// Concurrent callers within a short window share one round.
    pub(crate) async fn find_leader(&self) {
        if self.targets.len() == 1 {
            self.discovered.store(true, Ordering::Relaxed);
            return;
        }
        let mut last = self.last_discovery.lock().await;
        if last.is_some_and(|t| t.elapsed() < REDISCOVER_AFTER) {
            return;
        }
        let probe_timeout = self.request_timeout.min(PROBE_TIMEOUT);
        let mut probes = JoinSet::new();
        for i in 0..self.targets.len() {
            let channel = self.channel(i);
            probes.spawn(async move {
                let mut request = tonic::Request::new(StatusRequest {});
                request.set_timeout(probe_timeout);
                let mut client = MaintenanceClient::new(channel);
                let call = client.status(request);
                match tokio::time::timeout(probe_timeout, call).await {
                    Ok(Ok(resp)) => {
                        let status = resp.into_inner();
                        let me = status.header.map_or(0, |h| h.member_id);
                        (status.leader != 0 && status.leader == me).then_some(i)
                    }
                    _ => None,
                }
            });
        }
        let deadline = tokio::time::Instant::now() + probe_timeout + Duration::from_millis(50);
        while let Ok(Some(joined)) = tokio::time::timeout_at(deadline, probes.join_next()).await {
            if let Ok(Some(leader)) = joined {
                tracing::debug!(endpoint = %self.targets[leader].url, "oncekv client: found the leader");
                self.current.store(leader, Ordering::Relaxed);
                break;
            }
        }
        *last = Some(Instant::now());
        self.discovered.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    // Users paste etcd-style endpoints with or without a scheme; both must work.
    #[test]
    fn endpoints_without_a_scheme_get_http() {
        assert_eq!(normalize("127.0.0.1:2379"), "http://127.0.0.1:2379");
        assert_eq!(normalize(" http://h:1 "), "http://h:1");
        let config = ClientConfig::default();
        assert!(endpoint("127.0.0.1:2379", &config).is_ok());
        assert!(matches!(
            endpoint("http://", &config),
            Err(Error::InvalidEndpoint { .. })
        ));
        assert!(matches!(
            Transport::new::<&str>(&[], &config, None),
            Err(Error::NoEndpoints)
        ));
    }

    // Concurrent failures of the same endpoint must advance once, not skip a member.
    #[test]
    fn concurrent_failures_advance_once() {
        let t = Transport::new(&["a:1", "b:1", "c:1"], &ClientConfig::default(), None).unwrap();
        assert_eq!(t.current(), 0);
        t.failed(0);
        t.failed(0);
        assert_eq!(t.current(), 1);
        t.failed(1);
        t.failed(2);
        assert_eq!(t.current(), 0);
    }
}
