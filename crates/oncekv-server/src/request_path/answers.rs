//! Typed answers. A handler names the answer its request has ([`PutResponse`] for a put,
//! [`LeaseGranted`] for a grant) and gets that, or the refusal the store or the session
//! rules gave; it never matches the state machine's wide reply enums itself.
//!
//! Invariant: the state machine answers each op and command with one shape (a put with
//! `OpResponse::Put`, an auth command with `Response::Auth`, ...). A reply of another
//! shape would be a bug in this server, reported as `Internal` from this one place.

use std::fmt::Debug;
use std::sync::Arc;

use oncekv_core::auth::AuthCommand;
use oncekv_core::{
    Command, DeleteRangeResponse, Enqueued, Op, OpError, OpResponse, PutResponse, Response, Secret,
    Settings, TxnResponse,
};
use oncekv_proto::SessionMeta;

use super::{NodeCore, Permit};
use crate::error::ApiError;

/// An op's answer with the store revision right after it was applied.
#[derive(Debug, Clone)]
pub struct Answered<T> {
    pub revision: i64,
    pub answer: T,
}

/// The answer of one kind of op.
pub trait Answer: Sized {
    /// The answer, if `response` has this shape; otherwise `response` back.
    fn from_response(response: OpResponse) -> Result<Self, OpResponse>;
}

macro_rules! answer_is_variant {
    ($($variant:ident($ty:ty)),* $(,)?) => {$(
        impl Answer for $ty {
            fn from_response(response: OpResponse) -> Result<Self, OpResponse> {
                match response {
                    OpResponse::$variant(answer) => Ok(answer),
                    other => Err(other),
                }
            }
        }
    )*};
}

macro_rules! answer_is_unit {
    ($($variant:ident => $ty:ident),* $(,)?) => {$(
        impl Answer for $ty {
            fn from_response(response: OpResponse) -> Result<Self, OpResponse> {
                match response {
                    OpResponse::$variant => Ok($ty),
                    other => Err(other),
                }
            }
        }
    )*};
}

answer_is_variant!(
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
    Enqueue(Enqueued),
);

/// A compaction's answer: it was applied.
#[derive(Debug, Clone, Copy)]
pub struct Compacted;

/// A lease grant's answer: the lease's id (chosen by the leader when asked for 0) and TTL.
#[derive(Debug, Clone, Copy)]
pub struct LeaseGranted {
    pub id: i64,
    pub ttl: i64,
}

/// A lease revocation's answer: the lease and its keys are gone.
#[derive(Debug, Clone, Copy)]
pub struct LeaseRevoked;

/// A keep-alive's answer: the lease's TTL, renewed.
#[derive(Debug, Clone, Copy)]
pub struct LeaseKept {
    pub ttl: i64,
}

answer_is_unit!(Compact => Compacted, LeaseRevoke => LeaseRevoked);

impl Answer for LeaseGranted {
    fn from_response(response: OpResponse) -> Result<Self, OpResponse> {
        match response {
            OpResponse::LeaseGrant { id, ttl } => Ok(LeaseGranted { id, ttl }),
            other => Err(other),
        }
    }
}

impl Answer for LeaseKept {
    fn from_response(response: OpResponse) -> Result<Self, OpResponse> {
        match response {
            OpResponse::LeaseKeepAlive { ttl, .. } => Ok(LeaseKept { ttl }),
            other => Err(other),
        }
    }
}

/// A session registration's answer.
#[derive(Debug, Clone, Copy)]
pub struct Registered {
    pub client_id: u64,
    pub secret: Secret,
    pub settings: Settings,
}

/// The one place a reply of the wrong shape is met (see the module doc).
fn wrong_shape(asked: &str, got: impl Debug) -> ApiError {
    ApiError::Internal(format!("{asked} was answered with {got:?}"))
}

/// `result` as the answer `T`, or the store's refusal.
pub fn answer<T: Answer>(result: Result<OpResponse, OpError>) -> Result<T, ApiError> {
    T::from_response(result.map_err(ApiError::from)?)
        .map_err(|other| wrong_shape(std::any::type_name::<T>(), other))
}

impl NodeCore {
    /// [`NodeCore::execute`], answered as `T`.
    pub async fn execute_as<T: Answer>(
        self: &Arc<Self>,
        op: Op,
        meta: Option<SessionMeta>,
        permit: Permit,
    ) -> Result<Answered<T>, ApiError> {
        let reply = self.execute(op, meta, permit).await?;
        Ok(Answered {
            revision: reply.revision,
            answer: answer(reply.result)?,
        })
    }

    /// Proposes an auth change: done, or refused by the auth rules.
    pub async fn propose_auth(&self, command: AuthCommand) -> Result<(), ApiError> {
        match self.propose(Command::Auth(command)).await? {
            Response::Auth(done) => Ok(done?),
            other => Err(wrong_shape("an auth command", other)),
        }
    }

    /// Proposes a session's keep-alive or close: done, or refused by the session rules.
    pub async fn propose_session(&self, command: Command) -> Result<(), ApiError> {
        match self.propose(command).await? {
            Response::Session(done) => Ok(done?),
            other => Err(wrong_shape("a session command", other)),
        }
    }

    /// Proposes a session registration. `Rejected` is a retried registration that names
    /// another user's session: permission denied.
    pub async fn propose_registration(&self, command: Command) -> Result<Registered, ApiError> {
        match self.propose(command).await? {
            Response::Registered {
                client_id,
                secret,
                settings,
            } => Ok(Registered {
                client_id,
                secret,
                settings,
            }),
            Response::Rejected => Err(oncekv_core::auth::AuthError::PermissionDenied.into()),
            other => Err(wrong_shape("a registration", other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_of_its_shape_is_taken_and_another_is_internal() {
        let put: PutResponse = answer(Ok(OpResponse::Put(PutResponse::default()))).expect("put");
        assert_eq!(put, PutResponse::default());
        let granted: LeaseGranted =
            answer(Ok(OpResponse::LeaseGrant { id: 7, ttl: 5 })).expect("grant");
        assert_eq!((granted.id, granted.ttl), (7, 5));
        match answer::<PutResponse>(Ok(OpResponse::Compact)) {
            Err(ApiError::Internal(why)) => assert!(why.contains("Compact"), "{why}"),
            other => panic!("a compaction's answer for a put: {other:?}"),
        }
        assert!(matches!(
            answer::<LeaseKept>(Err(OpError::LeaseNotFound)),
            Err(ApiError::Op(OpError::LeaseNotFound))
        ));
    }
}
