//! Calls in etcd's own wire types, for programs that pass other clients' requests on
//! (`oncekv grpc-proxy`): the request goes out as it came in and the reply comes back as
//! the cluster sent it, while the client adds what it adds to its own calls (the session
//! and seq of a write, retries, leader following, the auth token).
//!
//! The typed API ([`Client::put`] and the rest) is for programs of their own; this one
//! keeps every field of the etcd message, including those the typed API does not model,
//! and hands back the cluster's own [`Status`] for a refusal so an etcd client downstream
//! sees etcd's code and message.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use tonic::{Code, Request, Status};

use crate::client::{Client, Kind};
use crate::error::Error;
use crate::transport::Channel;

/// Whether a relayed call changes state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    /// Retried freely, no session.
    Read,
    /// Tracked: one seq for all of its attempts, so it applies at most once.
    Write,
    /// Tracked, and its answer may take unbounded time (Lock, Campaign): no attempt
    /// deadline, never hedged.
    Wait,
}

/// Why a relayed call failed: the client's view of it, and the cluster's own status when
/// the cluster answered (so it can be passed on unchanged).
#[derive(Debug, Clone)]
pub struct RelayError {
    pub error: Error,
    /// The status of the attempt that ended the call, when the cluster answered it (a
    /// refusal such as "lease not found"); `None` when the call ended on transport
    /// trouble or an unknown outcome.
    pub answer: Option<Status>,
}

impl RelayError {
    /// The status to give the caller downstream: the cluster's own answer when there is
    /// one. Otherwise etcd's "request timed out" (Unavailable), which is what an etcd
    /// member answers when it cannot tell whether a write was applied, so an etcd client
    /// treats it as it would etcd's.
    ///
    /// A write's session registration, which goes first under the same token, is refused
    /// without a status of the relayed request's own (a token that is invalid or stale, a
    /// user who may not register). Such a refusal gets etcd's code for its message: as
    /// "request timed out" an etcd client would retry with the same token, where etcd's
    /// "invalid auth token" makes it authenticate again.
    pub fn to_status(&self) -> Status {
        if let Some(status) = &self.answer {
            return status.clone();
        }
        match &self.error {
            Error::Auth(m) => Status::new(auth_code(m), m.clone()),
            Error::PermissionDenied(m) => Status::permission_denied(m.clone()),
            Error::InvalidArgument(m) => Status::invalid_argument(m.clone()),
            Error::Rejected { code, message } => Status::new(*code, message.clone()),
            Error::Internal(m) => Status::internal(m.clone()),
            Error::NoEndpoints | Error::InvalidEndpoint { .. } | Error::Tls(_) => {
                Status::new(Code::FailedPrecondition, self.error.to_string())
            }
            _ => Status::unavailable("etcdserver: request timed out"),
        }
    }
}

/// etcd's gRPC code for one of its auth refusals (its `rpctypes`), by the message.
fn auth_code(message: &str) -> Code {
    use oncekv_core::AuthError as A;
    let is = |a: A| message == a.to_string();
    if is(A::InvalidAuthToken) {
        Code::Unauthenticated
    } else if [
        A::UserEmpty,
        A::RoleEmpty,
        A::AuthFailed,
        A::AuthOldRevision,
    ]
    .into_iter()
    .any(is)
    {
        Code::InvalidArgument
    } else {
        Code::FailedPrecondition
    }
}

impl Client {
    /// Sends `req` through `send` as one call of `kind`, with the retries, session and
    /// token of any call of this client. `what` names it in logs and errors.
    ///
    /// A [`CallKind::Write`] is tracked whenever the client is (the default), so however
    /// often it is retried it applies once; when its outcome cannot be known it fails with
    /// [`Error::OutcomeUnknown`].
    pub async fn relay<Req, Resp, F, Fut>(
        &self,
        kind: CallKind,
        what: &'static str,
        req: Req,
        send: F,
    ) -> Result<Resp, RelayError>
    where
        Req: Clone,
        F: Fn(Channel, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Resp, Status>>,
    {
        let last = Arc::new(Mutex::new(None::<Status>));
        let kind = match kind {
            CallKind::Read => Kind::Read,
            CallKind::Write => Kind::Write,
            CallKind::Wait => Kind::Wait,
        };
        let result = self
            .call(kind, what, req, |channel, request| {
                let last = last.clone();
                let sent = send(channel, request);
                async move {
                    let result = sent.await;
                    if let Err(status) = &result {
                        *last.lock().unwrap_or_else(PoisonError::into_inner) = Some(status.clone());
                    }
                    result
                }
            })
            .await;
        result.map_err(|error| {
            // Only an answer (or a bug the server reported) came as a status of the
            // cluster's; transport trouble and unknown outcomes are the client's to word.
            let answer = if error.is_answer() || error.is_bug() {
                last.lock().unwrap_or_else(PoisonError::into_inner).take()
            } else {
                None
            };
            RelayError { error, answer }
        })
    }

    /// Sends `token` (etcd's auth token) with every request from now on, in place of one
    /// from [`ClientConfig::credentials`](crate::ClientConfig::credentials): a relay uses
    /// the token its caller presented, so the caller's rights, not the relay's, decide. The
    /// session this client registers belongs to that token's user.
    pub fn use_token(&self, token: Option<&str>) -> Result<(), Error> {
        self.transport().set_token(token)
    }

    /// The channel to the endpoint calls go to now (for streams a relay runs itself, such
    /// as Watch and Lease keep-alive, which then resume elsewhere on their own).
    pub fn current_channel(&self) -> Channel {
        let t = self.transport();
        t.channel(t.current())
    }

    /// Marks the current endpoint failed (the next call tries another) and looks for the
    /// leader again: for a relay whose own stream to it broke.
    pub async fn endpoint_failed(&self) {
        let t = self.transport();
        t.failed(t.current());
        t.find_leader().await;
    }
}
