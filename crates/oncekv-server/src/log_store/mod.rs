//! Durable raft log (being written).
