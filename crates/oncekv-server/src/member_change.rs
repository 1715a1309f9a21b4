//! The vocabulary of membership changes: what the Cluster service asks for, what a
//! change answers, and why one is refused. Followers forward changes to the leader in
//! these types, so they sit below both the forwarder and the code that applies them
//! ([`crate::membership`]).

use serde::{Deserialize, Serialize};

use crate::error::ProposeError;
use crate::types::{Member, NodeId};

/// One membership change, as the Cluster service asks for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberChange {
    Add { peer_url: String, learner: bool },
    Remove { id: NodeId },
    Update { id: NodeId, peer_url: String },
    Promote { id: NodeId },
}

/// A member as the Cluster service reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    pub id: NodeId,
    pub member: Member,
    pub learner: bool,
}

/// What a change answers: the member it added (for MemberAdd), and the members after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Changed {
    pub added: Option<NodeId>,
    pub members: Vec<MemberInfo>,
}

/// Why a change was refused, with etcd's messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum MembershipError {
    #[error("etcdserver: member not found")]
    NotFound,
    #[error("etcdserver: Peer URLs already exists")]
    PeerUrlExists,
    #[error("etcdserver: can only promote a learner member")]
    NotLearner,
    #[error("etcdserver: can only promote a learner member which is in sync with leader")]
    LearnerNotReady,
    #[error("etcdserver: too many learner members in cluster")]
    TooManyLearners,
    #[error("etcdserver: peer URL {0:?} is not http://HOST:PORT")]
    BadPeerUrl(String),
    /// openraft refused it: another change is still in progress, or the change would
    /// leave no voter.
    #[error("etcdserver: membership change refused: {0}")]
    Refused(String),
    #[error(transparent)]
    Propose(#[from] ProposeError),
}

impl From<MembershipError> for tonic::Status {
    /// etcd's gRPC codes; a proposal's failure maps as any request's does.
    fn from(e: MembershipError) -> tonic::Status {
        let code = match &e {
            MembershipError::Propose(p) => return crate::error::ApiError::from(p.clone()).into(),
            MembershipError::NotFound => tonic::Code::NotFound,
            MembershipError::BadPeerUrl(_) => tonic::Code::InvalidArgument,
            _ => tonic::Code::FailedPrecondition,
        };
        tonic::Status::new(code, e.to_string())
    }
}
