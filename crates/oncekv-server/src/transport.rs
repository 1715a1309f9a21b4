//! The network seam: where a node's gRPC servers get their connections and how its
//! channels (to peers, and a client's to members) open them.
//!
//! Production uses tokio's TCP ([`Node::start`](crate::Node::start) binds listeners and
//! tonic connects by itself). A deterministic simulation passes [`Incoming`] streams of
//! simulated connections and a [`Connector`] that dials simulated hosts; everything
//! above the byte stream (HTTP/2, gRPC, raft) is the same code either way.
//!
//! A byte stream cannot deliver a message twice, but a network can (a retransmitting
//! proxy, a client library that retries below the application). With the `sim` feature,
//! `Duplicator` lets a simulation ask for a second, delayed copy of a message where
//! messages exist: peer RPCs as they are sent, client writes as they are received. The
//! product is built without the feature, so none of it is in a server binary.

#[cfg(feature = "sim")]
use std::fmt;
#[cfg(feature = "sim")]
use std::sync::Arc;
#[cfg(feature = "sim")]
use std::time::Duration;

pub use oncekv_proto::net::{Conn, Connector, Incoming, Io};

/// The messages a [`Duplicator`] may deliver twice.
#[cfg(feature = "sim")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum MessageKind {
    AppendEntries,
    Vote,
    InstallSnapshot,
    /// A request a follower forwards to the leader.
    Forward,
    /// A state-changing client request (put, delete, txn, lease, keep-alive).
    ClientWrite,
}

/// Decides which messages arrive twice (simulation only).
#[cfg(feature = "sim")]
pub trait Duplicator: Send + Sync + fmt::Debug {
    /// `Some(delay)`: the receiver gets a second copy of this `kind` message `delay` after
    /// the first. Its answer goes nowhere: the sender saw one request and gets one reply.
    fn duplicate(&self, kind: MessageKind) -> Option<Duration>;
}

/// How a node gets its connections: accepted ones for its client and peer servers, and a
/// connector for its channels to peers.
#[allow(missing_debug_implementations)]
pub struct NodeTransport {
    pub clients: Incoming,
    pub peers: Incoming,
    pub connector: Connector,
    /// Messages the network delivers twice, if any.
    #[cfg(feature = "sim")]
    pub duplicator: Option<Arc<dyn Duplicator>>,
}
