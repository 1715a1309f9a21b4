//! The client's half of exactly-once: one registered session, its sequence numbers and
//! its background keep-alive.
//!
//! A session is registered on the first mutating call (`Session.Register` answers the
//! client id, the 16-byte secret, the TTL and the window). Every tracked request then takes
//! a seq from the session's [`RequestTracker`] and carries four metadata keys: client id,
//! secret (32 lower-case hex digits), seq and first-incomplete. A seq is completed exactly
//! when its call ends, however it ends, through the [`InFlight`] guard.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::Duration;

use bytes::Bytes;
use oncekv_core::{RequestTracker, Secret};
use oncekv_proto::metadata;
use oncekv_proto::oncekv::session_client::SessionClient;
use oncekv_proto::oncekv::{RegisterRequest, SessionCloseRequest, SessionKeepAliveRequest};
use rand::RngCore;
use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tonic::Request;
use tonic::metadata::{Ascii, MetadataValue};

use crate::config::ClientConfig;
use crate::error::{Error, Failure, classify, timed_out};
use crate::retry::Budget;
use crate::transport::Transport;

#[derive(Debug)]
struct Seqs {
    tracker: RequestTracker,
    /// The last seq handed out (the tracker does not expose it).
    last: u64,
}

/// A registered session. Dropping the last reference stops its keep-alive task.
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) client_id: u64,
    secret: Secret,
    secret_hex: MetadataValue<Ascii>,
    /// At most this many seqs past first-incomplete may be outstanding.
    window: u64,
    seqs: Mutex<Seqs>,
    /// Woken whenever a seq completes (callers waiting for room in the window).
    completed: Notify,
    expired: AtomicBool,
    keep_alive: OnceLock<AbortHandle>,
}

impl Session {
    fn new(client_id: u64, secret: Secret, window: u64) -> Result<Session, Error> {
        let secret_hex = metadata::secret_value(&secret);
        Ok(Session {
            client_id,
            secret,
            secret_hex,
            window: window.max(1),
            seqs: Mutex::new(Seqs {
                tracker: RequestTracker::new(),
                last: 0,
            }),
            completed: Notify::new(),
            expired: AtomicBool::new(false),
            keep_alive: OnceLock::new(),
        })
    }

    fn seqs(&self) -> MutexGuard<'_, Seqs> {
        self.seqs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the next seq, waiting while the window is full (so the server never has to
    /// answer `WindowExceeded`). The guard completes the seq when dropped.
    pub(crate) async fn begin(self: &Arc<Self>) -> InFlight {
        loop {
            let completed = self.completed.notified();
            tokio::pin!(completed);
            completed.as_mut().enable();
            {
                let mut seqs = self.seqs();
                if seqs.last + 1 < seqs.tracker.first_incomplete() + self.window {
                    let seq = seqs.tracker.next_seq();
                    seqs.last = seq;
                    return InFlight {
                        session: self.clone(),
                        seq,
                    };
                }
            }
            completed.await;
        }
    }

    fn complete(&self, seq: u64) {
        self.seqs().tracker.complete(seq);
        self.completed.notify_waiters();
    }

    /// Puts the four session keys on `request` for `seq`.
    pub(crate) fn attach<T>(&self, request: &mut Request<T>, seq: u64) {
        let first_incomplete = self.seqs().tracker.first_incomplete();
        let md = request.metadata_mut();
        metadata::attach(md, self.client_id, &self.secret_hex, seq, first_incomplete);
    }

    /// The session is gone on the server: the next call must register a new one.
    pub(crate) fn mark_expired(&self) {
        self.expired.store(true, Ordering::Relaxed);
        if let Some(task) = self.keep_alive.get() {
            task.abort();
        }
    }

    pub(crate) fn is_expired(&self) -> bool {
        self.expired.load(Ordering::Relaxed)
    }

    /// Ends the session on the server (frees its saved responses). One attempt.
    pub(crate) async fn close(
        &self,
        transport: &Transport,
        timeout: Duration,
    ) -> Result<(), Error> {
        self.mark_expired();
        let i = transport.current();
        let url = transport.url(i).to_string();
        let mut request = Request::new(SessionCloseRequest {
            client_id: self.client_id,
            secret: Bytes::copy_from_slice(&self.secret.0),
        });
        request.set_timeout(timeout);
        let mut client = SessionClient::new(transport.channel(i));
        let call = client.close(request);
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(status)) => match classify(&status, &url) {
                Failure::SessionExpired(message) => Err(Error::SessionExpired(message)),
                Failure::Answer(e) | Failure::Retry { error: e, .. } => Err(e),
            },
            Err(_) => Err(Error::Timeout {
                endpoint: url,
                after: timeout,
            }),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(task) = self.keep_alive.get() {
            task.abort();
        }
    }
}

/// One outstanding seq. Dropping it completes the seq: the call got its answer, gave up,
/// or was cancelled by its caller. Either way the servers may forget the response.
#[derive(Debug)]
pub(crate) struct InFlight {
    pub(crate) session: Arc<Session>,
    pub(crate) seq: u64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.session.complete(self.seq);
    }
}

/// Registers a new session, retrying transport failures within the retry budget, and
/// starts its keep-alive if configured. Every attempt carries the same random nonce, so a
/// retry whose first reply was lost gets the session that attempt opened, not a second
/// one left to expire unused.
pub(crate) async fn register(
    transport: &Arc<Transport>,
    config: &ClientConfig,
) -> Result<Arc<Session>, Error> {
    let mut budget = Budget::new(config);
    let mut nonce = [0u8; 16];
    // The OS-seeded thread RNG (a CSPRNG), or the simulation's seeded one.
    oncekv_proto::rng::SeededRng.fill_bytes(&mut nonce);
    let nonce = Bytes::copy_from_slice(&nonce);
    loop {
        let i = transport.current();
        let url = transport.url(i).to_string();
        let timeout = budget.start_attempt();
        let mut request = Request::new(RegisterRequest {
            nonce: nonce.clone(),
        });
        request.set_timeout(timeout);
        let (generation, channel) = transport.channel_with_generation(i);
        let mut client = SessionClient::new(channel);
        let call = client.register(request);
        let error = match tokio::time::timeout(timeout, call).await {
            Ok(Ok(resp)) => {
                let r = resp.into_inner();
                let secret: [u8; 16] =
                    r.secret.as_ref().try_into().map_err(|_| Error::Rejected {
                        code: tonic::Code::Internal,
                        message: format!(
                            "oncekv client: the server sent a {}-byte session secret",
                            r.secret.len()
                        ),
                    })?;
                let session = Arc::new(Session::new(r.client_id, Secret(secret), r.window)?);
                if config.keep_alive {
                    let ttl = Duration::from_millis(r.ttl_ms.max(3));
                    let task = tokio::spawn(keep_alive(
                        Arc::downgrade(&session),
                        transport.clone(),
                        r.client_id,
                        r.secret,
                        ttl,
                        config.request_timeout,
                    ));
                    let _ = session.keep_alive.set(task.abort_handle());
                }
                tracing::debug!(
                    client_id = r.client_id,
                    ttl_ms = r.ttl_ms,
                    window = r.window,
                    "oncekv client: session registered"
                );
                return Ok(session);
            }
            Ok(Err(status)) => match classify(&status, &url) {
                Failure::Retry { error, .. } => {
                    if timed_out(&status) {
                        transport.reconnect(i, generation);
                    }
                    error
                }
                Failure::SessionExpired(message) => return Err(Error::SessionExpired(message)),
                Failure::Answer(e) => return Err(e),
            },
            Err(_) => {
                transport.reconnect(i, generation);
                Error::Timeout {
                    endpoint: url,
                    after: timeout,
                }
            }
        };
        transport.failed(i);
        let Some(delay) = budget.next_delay() else {
            return Err(error);
        };
        tokio::time::sleep(delay).await;
        transport.find_leader().await;
    }
}

/// Refreshes the session every third of its TTL (sooner after a failure) until the
/// session is dropped or the cluster says it is gone.
async fn keep_alive(
    session: Weak<Session>,
    transport: Arc<Transport>,
    client_id: u64,
    secret: Bytes,
    ttl: Duration,
    request_timeout: Duration,
) {
    let period = ttl / 3;
    let mut delay = period;
    loop {
        tokio::time::sleep(delay).await;
        match session.upgrade() {
            Some(s) if !s.is_expired() => {}
            _ => return,
        }
        let i = transport.current();
        let timeout = request_timeout.min(period.max(Duration::from_millis(50)));
        let mut request = Request::new(SessionKeepAliveRequest {
            client_id,
            secret: secret.clone(),
        });
        request.set_timeout(timeout);
        let (generation, channel) = transport.channel_with_generation(i);
        let mut client = SessionClient::new(channel);
        let call = client.keep_alive(request);
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(_)) => delay = period,
            Ok(Err(status)) => match classify(&status, transport.url(i)) {
                Failure::Retry { error, .. } => {
                    if timed_out(&status) {
                        transport.reconnect(i, generation);
                    }
                    tracing::debug!(
                        client_id,
                        "oncekv client: session keep-alive failed: {error}"
                    );
                    transport.failed(i);
                    delay = period / 4;
                }
                Failure::SessionExpired(_) | Failure::Answer(_) => {
                    tracing::info!(
                        client_id,
                        "oncekv client: session expired: {}",
                        status.message()
                    );
                    if let Some(s) = session.upgrade() {
                        s.mark_expired();
                    }
                    return;
                }
            },
            Err(_) => {
                transport.reconnect(i, generation);
                transport.failed(i);
                delay = period / 4;
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use oncekv_proto::SessionMeta;

    // The keys are a wire contract with the server: parse what the client attaches with
    // the server's own parser.
    #[tokio::test]
    async fn attached_metadata_parses_on_the_server() {
        let secret = Secret::from_u128(0xabcdef);
        let session = Arc::new(Session::new(7, secret, 4).unwrap());
        let first = session.begin().await;
        let second = session.begin().await;
        let mut request = Request::new(());
        session.attach(&mut request, second.seq);
        let meta = SessionMeta::from_metadata(request.metadata())
            .unwrap()
            .unwrap();
        assert_eq!(
            meta,
            SessionMeta {
                client_id: 7,
                secret,
                seq: 2,
                first_incomplete: 1
            }
        );
        drop(first);
        let mut request = Request::new(());
        session.attach(&mut request, second.seq);
        let meta = SessionMeta::from_metadata(request.metadata())
            .unwrap()
            .unwrap();
        assert_eq!(
            meta.first_incomplete, 2,
            "the dropped call no longer holds back acks"
        );
    }

    // Without the window wait, a burst of calls would be refused with WindowExceeded.
    #[tokio::test]
    async fn begin_waits_for_room_in_the_window() {
        let session = Arc::new(Session::new(1, Secret::default(), 2).unwrap());
        let a = session.begin().await;
        let _b = session.begin().await;
        let s = session.clone();
        let third = tokio::spawn(async move { s.begin().await.seq });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !third.is_finished(),
            "seq 3 must wait while seqs 1 and 2 are outstanding"
        );
        drop(a);
        assert_eq!(third.await.unwrap(), 3);
    }
}
