//! What a call can fail with, and how a gRPC status is sorted into "retry", "answer" and
//! "session expired".

use std::error::Error as _;
use std::time::Duration;

use tonic::{Code, Status};

use oncekv_proto::{ErrorClass, ErrorDetail};

/// Why a call failed. Four kinds, kept apart because they call for different handling:
///
/// - **Transport trouble** ([`Unavailable`](Error::Unavailable), [`Timeout`](Error::Timeout)):
///   retryable. The client already retried (with backoff, following the leader) until its
///   retry budget ran out; you only see these from reads, or from writes that provably
///   never reached a server.
/// - **Answers** (everything from [`LeaseNotFound`](Error::LeaseNotFound) to
///   [`SessionExpired`](Error::SessionExpired)): the cluster decided; sending the same
///   request again gets the same answer. A tracked write that got an answer did not run.
/// - [`OutcomeUnknown`](Error::OutcomeUnknown): the write was sent at least once and the
///   client cannot tell whether it took effect.
/// - [`Internal`](Error::Internal): a server bug, reported as is and never retried.
///
/// [`is_retryable`](Error::is_retryable), [`is_answer`](Error::is_answer),
/// [`is_outcome_unknown`](Error::is_outcome_unknown) and [`is_bug`](Error::is_bug) sort
/// them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `Client::connect` was given an empty endpoint list.
    #[error("oncekv client: no endpoints given")]
    NoEndpoints,
    /// An endpoint is not a valid `http://host:port` (or `host:port`) address.
    #[error("oncekv client: invalid endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint { endpoint: String, reason: String },
    /// The TLS options (CA, certificate or key file) cannot be used.
    #[error("oncekv client: TLS: {0}")]
    Tls(String),

    /// The endpoint could not be reached, has no leader, or is not the leader and could not
    /// forward. Retryable.
    #[error("oncekv client: {endpoint} is unavailable: {message}")]
    Unavailable { endpoint: String, message: String },
    /// No answer within the request timeout. Retryable.
    #[error("oncekv client: no answer from {endpoint} within {after:?}")]
    Timeout { endpoint: String, after: Duration },

    /// The lease does not exist (any more). An answer.
    #[error("etcdserver: requested lease not found")]
    LeaseNotFound,
    /// A lease with the requested ID exists already. An answer.
    #[error("etcdserver: lease already exists")]
    LeaseAlreadyExists,
    /// The request is malformed or too large, or a txn has too many or conflicting ops.
    /// An answer.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Any other refusal from the server (e.g. a compacted or future revision, a lease TTL
    /// that is too large), with its gRPC code. An answer.
    #[error("{message} (gRPC code {code:?})")]
    Rejected { code: Code, message: String },
    /// The request's sequence number is below what the session has acknowledged. An answer
    /// (it points at a client bug).
    #[error("{0}")]
    Stale(String),
    /// Too many requests of the session are outstanding. An answer.
    #[error("{0}")]
    WindowExceeded(String),
    /// The session secret did not match, or (auth on) the user may not do this or use
    /// this session. An answer.
    #[error("{0}")]
    PermissionDenied(String),
    /// An auth refusal with etcd's message: no or wrong credentials, auth not enabled, a
    /// missing user or role, a stale token (the client re-authenticates on its own when
    /// it has credentials). An answer.
    #[error("{0}")]
    Auth(String),
    /// The request's sequence number already answered a *different* request. An answer
    /// (it points at a client bug; the other request's reply is never revealed).
    #[error("{0}")]
    SeqReused(String),
    /// The server hit a bug (an invariant broke). Never retried: sending the request
    /// again would hide the bug and may meet it again.
    #[error("oncekv server bug: {0}")]
    Internal(String),
    /// A watch needs revisions that compaction has removed: it asked to start (or, after
    /// losing its member, to resume) below `compact_revision`, the oldest revision history
    /// still holds. The watch has ended; events before `compact_revision` are lost to it.
    /// Read the current state (and watch again from after it) to carry on. An answer.
    #[error(
        "etcdserver: mvcc: required revision has been compacted (history starts at revision {compact_revision})"
    )]
    Compacted { compact_revision: i64 },
    /// The server cancelled a watch for another reason than compaction. An answer.
    #[error("watch canceled by the server: {reason}")]
    WatchCanceled { reason: String },
    /// A lock's (or a candidacy's) key was gone by the time its turn came: its lease
    /// expired or was revoked while it waited. etcd's `mutex: session is expired`. An
    /// answer: lock again (with a live lease) to get back in the queue.
    #[error("{0}")]
    LockLost(String),
    /// Proclaim with a leadership that is no longer the leader (its key is gone or was
    /// recreated). etcd's `election: not leader`. An answer.
    #[error("{0}")]
    NotLeader(String),
    /// The session is gone (a session-level call such as `close` met an expired session).
    /// Writes never return this: they re-register or report
    /// [`OutcomeUnknown`](Error::OutcomeUnknown).
    #[error("{0}")]
    SessionExpired(String),

    /// A write was sent at least once, and then either the retry budget ran out or its
    /// session expired before an answer arrived: it may or may not have taken effect.
    /// Read the affected keys to find out.
    #[error(
        "oncekv client: the outcome of {what} is unknown (it may or may not have been applied): {reason}"
    )]
    OutcomeUnknown {
        /// Which call, e.g. `"put"`, with its session and sequence number if tracked.
        what: String,
        /// Why the client stopped waiting.
        reason: String,
    },
}

impl Error {
    /// Transport trouble: sending the same request again may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Unavailable { .. } | Error::Timeout { .. })
    }

    /// The cluster's definitive answer to the request.
    pub fn is_answer(&self) -> bool {
        matches!(
            self,
            Error::LeaseNotFound
                | Error::LeaseAlreadyExists
                | Error::InvalidArgument(_)
                | Error::Rejected { .. }
                | Error::Stale(_)
                | Error::WindowExceeded(_)
                | Error::PermissionDenied(_)
                | Error::Auth(_)
                | Error::SeqReused(_)
                | Error::SessionExpired(_)
                | Error::Compacted { .. }
                | Error::WatchCanceled { .. }
                | Error::LockLost(_)
                | Error::NotLeader(_)
        )
    }

    /// A server bug: report it, do not retry it.
    pub fn is_bug(&self) -> bool {
        matches!(self, Error::Internal(_))
    }

    /// The call may or may not have taken effect.
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(self, Error::OutcomeUnknown { .. })
    }
}

/// How one attempt failed, as the retry loop sees it.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Worth another attempt (on the next endpoint). `maybe_sent` is false only when the
    /// request provably never left the client (the connection was refused).
    Retry { error: Error, maybe_sent: bool },
    /// The server answered `session-expired` for this request's session.
    SessionExpired(String),
    /// The server's definitive answer.
    Answer(Error),
}

impl Failure {
    pub(crate) fn timeout(endpoint: &str, after: Duration) -> Failure {
        Failure::Retry {
            error: Error::Timeout {
                endpoint: endpoint.to_string(),
                after,
            },
            maybe_sent: true,
        }
    }
}

/// Sorts a gRPC status from `endpoint`.
///
/// oncekv's errors carry an [`ErrorDetail`] whose [`ErrorClass`] decides: retryable
/// (not leader, no leader, timeout, peer unreachable, stopping), an answer, an expired
/// session, or a server bug (never retried). A status without one (from etcd, or made by
/// tonic from a local transport error) is sorted by its code: `Unavailable`,
/// `DeadlineExceeded`, `Cancelled`, `Aborted`, `Unknown` and any local transport error are
/// retryable; everything else is an answer.
/// etcd's messages for the concurrency services' refusals (`concurrency.ErrSessionExpired`,
/// `ErrElectionNotLeader`, `ErrElectionNoLeader`, `v3election.ErrMissingLeaderKey`).
pub(crate) const LOCK_LOST: &str = "mutex: session is expired";
pub(crate) const NOT_LEADER: &str = "election: not leader";
pub(crate) const NO_LEADER: &str = "election: no leader";
const MISSING_LEADER_KEY: &str = "\"leader\" field must be provided";

pub(crate) fn classify(status: &Status, endpoint: &str) -> Failure {
    let message = status.message().to_string();
    let retry = || Failure::Retry {
        error: Error::Unavailable {
            endpoint: endpoint.to_string(),
            message: describe(status),
        },
        maybe_sent: !connection_refused(status),
    };
    if let Some(detail) = ErrorDetail::of(status) {
        return match detail.class() {
            ErrorClass::Retryable => retry(),
            ErrorClass::SessionExpired => Failure::SessionExpired(message),
            ErrorClass::Bug => Failure::Answer(Error::Internal(message)),
            ErrorClass::Answer => Failure::Answer(match detail {
                ErrorDetail::Stale => Error::Stale(message),
                ErrorDetail::WindowExceeded => Error::WindowExceeded(message),
                ErrorDetail::PermissionDenied => Error::PermissionDenied(message),
                ErrorDetail::Auth => Error::Auth(message),
                ErrorDetail::SeqReused => Error::SeqReused(message),
                ErrorDetail::LeaseNotFound => Error::LeaseNotFound,
                ErrorDetail::LeaseAlreadyExists => Error::LeaseAlreadyExists,
                _ if status.code() == Code::InvalidArgument => Error::InvalidArgument(message),
                _ => Error::Rejected {
                    code: status.code(),
                    message,
                },
            }),
        };
    }
    // etcd's concurrency services answer with plain messages (gRPC code Unknown, which
    // otherwise means transport trouble): these are answers, not reasons to retry.
    if status.code() == Code::Unknown {
        match message.as_str() {
            LOCK_LOST => return Failure::Answer(Error::LockLost(message)),
            NOT_LEADER => return Failure::Answer(Error::NotLeader(message)),
            NO_LEADER | MISSING_LEADER_KEY => {
                return Failure::Answer(Error::Rejected {
                    code: Code::Unknown,
                    message,
                });
            }
            _ => {}
        }
    }
    let local_transport_error = status.source().is_some();
    match status.code() {
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Cancelled
        | Code::Aborted
        | Code::Unknown => retry(),
        _ if local_transport_error => retry(),
        Code::NotFound if message.contains("lease not found") => {
            Failure::Answer(Error::LeaseNotFound)
        }
        Code::FailedPrecondition if message.contains("lease already exists") => {
            Failure::Answer(Error::LeaseAlreadyExists)
        }
        Code::InvalidArgument => Failure::Answer(Error::InvalidArgument(message)),
        Code::PermissionDenied => Failure::Answer(Error::PermissionDenied(message)),
        Code::Internal => Failure::Answer(Error::Internal(message)),
        code => Failure::Answer(Error::Rejected { code, message }),
    }
}

/// The status message plus its innermost cause (tonic's messages for transport errors,
/// such as "transport error", say little on their own).
fn describe(status: &Status) -> String {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = status.source();
    let mut innermost = None;
    while let Some(e) = cause {
        innermost = Some(e.to_string());
        cause = e.source();
    }
    match innermost {
        Some(inner) if !status.message().contains(&inner) => {
            format!("{}: {inner}", status.message())
        }
        _ => status.message().to_string(),
    }
}

/// Whether the attempt ended because its deadline passed (tonic's own timeout, which fires
/// just before the caller's): the connection it used may be hung.
pub(crate) fn timed_out(status: &Status) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = status.source();
    while let Some(e) = cause {
        if e.is::<tonic::TimeoutExpired>() {
            return true;
        }
        cause = e.source();
    }
    status.code() == Code::DeadlineExceeded
}

/// Whether the status comes from a refused TCP connection: the request never left.
fn connection_refused(status: &Status) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = status.source();
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return true;
        }
        cause = e.source();
    }
    false
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn with_detail(code: Code, detail: ErrorDetail) -> Status {
        let mut status = Status::new(code, "oncekv: something");
        detail.attach(&mut status);
        status
    }

    // The retry loop's safety rests on this table: retrying an answer would waste the
    // budget, and treating transport trouble as an answer would give up too early.
    #[test]
    fn statuses_sort_into_retry_answer_and_session_expired() {
        let cases: Vec<(Status, &str)> = vec![
            (Status::unavailable("etcdserver: no leader"), "retry"),
            (Status::deadline_exceeded("deadline"), "retry"),
            (Status::cancelled("cancelled"), "retry"),
            (
                with_detail(Code::Unavailable, ErrorDetail::Timeout),
                "retry",
            ),
            (
                with_detail(Code::Unavailable, ErrorDetail::NotLeader),
                "retry",
            ),
            (with_detail(Code::Internal, ErrorDetail::Bug), "Internal"),
            (Status::internal("etcdserver: some bug"), "Internal"),
            (
                with_detail(Code::FailedPrecondition, ErrorDetail::SeqReused),
                "SeqReused",
            ),
            (
                Status::not_found("etcdserver: requested lease not found"),
                "LeaseNotFound",
            ),
            (
                Status::failed_precondition("etcdserver: lease already exists"),
                "LeaseAlreadyExists",
            ),
            (
                Status::invalid_argument("etcdserver: request is too large"),
                "InvalidArgument",
            ),
            (
                Status::out_of_range("etcdserver: too large lease TTL"),
                "Rejected",
            ),
            (
                with_detail(Code::FailedPrecondition, ErrorDetail::SessionExpired),
                "SessionExpired",
            ),
            (
                with_detail(Code::FailedPrecondition, ErrorDetail::Stale),
                "Stale",
            ),
            (
                with_detail(Code::ResourceExhausted, ErrorDetail::WindowExceeded),
                "WindowExceeded",
            ),
            (
                with_detail(Code::PermissionDenied, ErrorDetail::PermissionDenied),
                "PermissionDenied",
            ),
        ];
        for (status, want) in cases {
            let got = match classify(&status, "e") {
                Failure::Retry { .. } => "retry",
                Failure::SessionExpired(_) => "SessionExpired",
                Failure::Answer(Error::LeaseNotFound) => "LeaseNotFound",
                Failure::Answer(Error::LeaseAlreadyExists) => "LeaseAlreadyExists",
                Failure::Answer(Error::InvalidArgument(_)) => "InvalidArgument",
                Failure::Answer(Error::Rejected { .. }) => "Rejected",
                Failure::Answer(Error::Stale(_)) => "Stale",
                Failure::Answer(Error::WindowExceeded(_)) => "WindowExceeded",
                Failure::Answer(Error::PermissionDenied(_)) => "PermissionDenied",
                Failure::Answer(Error::Auth(_)) => "Auth",
                Failure::Answer(Error::SeqReused(_)) => "SeqReused",
                Failure::Answer(Error::Internal(_)) => "Internal",
                Failure::Answer(other) => panic!("unexpected {other:?}"),
            };
            assert_eq!(got, want, "{status:?}");
        }
    }

    // A refused connection proves the request never reached a server, so a session that
    // turns out to have expired cannot have applied it.
    #[test]
    fn a_refused_connection_is_known_unsent() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let status = Status::from_error(Box::new(refused));
        match classify(&status, "e") {
            Failure::Retry { maybe_sent, .. } => assert!(!maybe_sent),
            other => panic!("unexpected {other:?}"),
        }
        match classify(&Status::unavailable("etcdserver: no leader"), "e") {
            Failure::Retry { maybe_sent, .. } => assert!(maybe_sent),
            other => panic!("unexpected {other:?}"),
        }
    }

    // The same, through a real tonic channel: tonic must keep the io error in the chain.
    #[tokio::test]
    async fn a_refused_connection_through_tonic_is_known_unsent() {
        use oncekv_proto::etcdserverpb::StatusRequest;
        use oncekv_proto::etcdserverpb::maintenance_client::MaintenanceClient;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .connect_lazy();
        let status = MaintenanceClient::new(channel)
            .status(StatusRequest {})
            .await
            .unwrap_err();
        match classify(&status, "e") {
            Failure::Retry { maybe_sent, error } => assert!(!maybe_sent, "{error}"),
            other => panic!("unexpected {other:?}"),
        }
    }
}
