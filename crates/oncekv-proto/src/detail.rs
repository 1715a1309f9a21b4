//! The machine-readable reason oncekv attaches to its errors, and what a client may do
//! about each.
//!
//! etcd clients match on a status's message; oncekv's own client reads the
//! [`ERROR_DETAIL_KEY`] metadata instead, so it never has to parse prose. Every value the
//! server sends is an [`ErrorDetail`], and every detail has one [`ErrorClass`]: the client
//! retries exactly the [`Retryable`](ErrorClass::Retryable) ones.

use std::fmt;
use std::str::FromStr;

use tonic::Status;
use tonic::metadata::MetadataValue;

/// Metadata key carrying an [`ErrorDetail`] on oncekv's errors.
pub const ERROR_DETAIL_KEY: &str = "oncekv-error";

/// What a caller may do about an error; the shape of openraft's
/// `RaftError { APIError, Fatal }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The cluster could not decide now (no leader, not the leader, a timeout): the same
    /// request may succeed later or elsewhere. A tracked write is retried under its
    /// original sequence number.
    Retryable,
    /// The cluster decided; the same request gets the same answer. Never retried.
    Answer,
    /// The session is gone: the client registers a new one (if the write cannot have run)
    /// or reports the outcome as unknown.
    SessionExpired,
    /// A server bug (an invariant broke). Never retried: retrying a bug hides it and can
    /// turn one failure into many.
    Bug,
}

macro_rules! details {
    ($( $(#[$doc:meta])* $variant:ident = $wire:literal => $class:ident, )*) => {
        /// One reason on the wire. The string forms are stable: old clients match on them.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorDetail {
            $( $(#[$doc])* $variant, )*
        }

        impl ErrorDetail {
            /// Every detail (for tests that must cover each one).
            pub const ALL: &'static [ErrorDetail] = &[$(ErrorDetail::$variant,)*];

            /// The value sent in [`ERROR_DETAIL_KEY`].
            pub fn as_str(self) -> &'static str {
                match self {
                    $( ErrorDetail::$variant => $wire, )*
                }
            }

            /// What a client may do about it.
            pub fn class(self) -> ErrorClass {
                match self {
                    $( ErrorDetail::$variant => ErrorClass::$class, )*
                }
            }
        }

        impl FromStr for ErrorDetail {
            type Err = UnknownDetail;

            fn from_str(s: &str) -> Result<ErrorDetail, UnknownDetail> {
                match s {
                    $( $wire => Ok(ErrorDetail::$variant), )*
                    _ => Err(UnknownDetail),
                }
            }
        }
    };
}

details! {
    /// The request's session does not exist (expired or closed).
    SessionExpired = "session-expired" => SessionExpired,
    /// The session secret did not match.
    PermissionDenied = "permission-denied" => Answer,
    /// The seq is below what the session acknowledged (a client bug).
    Stale = "stale" => Answer,
    /// Too many requests of the session are outstanding.
    WindowExceeded = "window-exceeded" => Answer,
    /// The seq already answered a different request.
    SeqReused = "seq-reused" => Answer,
    LeaseNotFound = "lease-not-found" => Answer,
    LeaseAlreadyExists = "lease-already-exists" => Answer,
    LeaseTtlTooLarge = "lease-ttl-too-large" => Answer,
    KeyNotFound = "key-not-found" => Answer,
    LeaseProvided = "lease-provided" => Answer,
    ValueProvided = "value-provided" => Answer,
    Compacted = "compacted" => Answer,
    FutureRevision = "future-revision" => Answer,
    DuplicateKey = "duplicate-key" => Answer,
    TooManyOps = "too-many-ops" => Answer,
    EmptyKey = "empty-key" => Answer,
    /// The NOSPACE alarm is raised: the write would add data past the space quota.
    NoSpace = "no-space" => Answer,
    /// The CORRUPT alarm is raised: members disagreed on the state.
    Corrupt = "corrupt" => Answer,
    /// The request is malformed or too large.
    InvalidArgument = "invalid-argument" => Answer,
    /// An auth refusal other than a denied permission (etcd's message says which: no
    /// user, wrong password, a stale or invalid token, ...).
    Auth = "auth" => Answer,
    /// This member is not the leader and could not hand the request on.
    NotLeader = "not-leader" => Retryable,
    /// The cluster has no leader now.
    NoLeader = "no-leader" => Retryable,
    /// The request did not complete in time; it may still be applied.
    Timeout = "timeout" => Retryable,
    /// A peer the request needed could not be reached.
    PeerUnreachable = "peer-unreachable" => Retryable,
    /// The member is shutting down.
    Stopping = "stopping" => Retryable,
    /// An invariant broke on the server.
    Bug = "bug" => Bug,
}

/// A detail this build does not know (a newer server's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown oncekv error detail")]
pub struct UnknownDetail;

impl fmt::Display for ErrorDetail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ErrorDetail {
    /// The detail a status carries, if it carries a known one.
    pub fn of(status: &Status) -> Option<ErrorDetail> {
        status
            .metadata()
            .get(ERROR_DETAIL_KEY)?
            .to_str()
            .ok()?
            .parse()
            .ok()
    }

    /// Tags `status` with this detail.
    pub fn attach(self, status: &mut Status) {
        status
            .metadata_mut()
            .insert(ERROR_DETAIL_KEY, MetadataValue::from_static(self.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Client and server agree only if every detail survives the trip through metadata.
    #[test]
    fn every_detail_reads_back_from_a_status() {
        for &d in ErrorDetail::ALL {
            let mut status = Status::internal("x");
            d.attach(&mut status);
            assert_eq!(ErrorDetail::of(&status), Some(d), "{d}");
        }
        assert_eq!(ErrorDetail::of(&Status::internal("x")), None);
        assert_eq!("no-such".parse::<ErrorDetail>(), Err(UnknownDetail));
    }

    // The client retries by class: a bug or an answer retried would be wrong.
    #[test]
    fn bugs_and_answers_are_not_retryable() {
        assert_eq!(ErrorDetail::Bug.class(), ErrorClass::Bug);
        assert_eq!(ErrorDetail::SeqReused.class(), ErrorClass::Answer);
        assert_eq!(ErrorDetail::NotLeader.class(), ErrorClass::Retryable);
        assert_eq!(
            ErrorDetail::SessionExpired.class(),
            ErrorClass::SessionExpired
        );
    }
}
