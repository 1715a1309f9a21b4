//! The openraft type configuration oncekv runs on.

use std::fmt;
use std::io::Cursor;

use oncekv_core::{LogPayload, Response};
use serde::{Deserialize, Serialize};

/// A cluster member as raft's membership records it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub name: String,
    /// `http://host:port` where peers reach its raft service.
    pub peer_url: String,
    /// `http://host:port` where clients reach it (empty if not known to this node).
    pub client_url: String,
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.peer_url)
    }
}

/// What applying one raft entry answered: one [`Response`] per command in it (none for a
/// blank or membership entry).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryResponses(pub Vec<Response>);

openraft::declare_raft_types!(
    /// oncekv's raft types: entries carry [`LogPayload`]s, snapshots are byte buffers.
    pub TypeConfig:
        D = LogPayload,
        R = EntryResponses,
        NodeId = u64,
        Node = Member,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = crate::runtime::OncekvRuntime,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type NodeId = u64;
pub type LogId = openraft::LogId<NodeId>;
pub type StorageError = openraft::StorageError<NodeId>;

/// A 64-bit id hashed from `name` (FNV-1a, never 0): the founders' ids of clusters formed
/// before oncekv took etcd's ([`crate::identity::IdScheme`]), and the base of the ids
/// MemberAdd draws.
pub fn member_id(name: &str) -> NodeId {
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    h.max(1)
}
