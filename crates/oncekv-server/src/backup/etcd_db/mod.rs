//! oncekv's state as etcd 3.4's database holds it, and back.
//!
//! etcd keeps its state in bbolt buckets; the ones that matter for a copy:
//!
//! - `key`: every revision of every key still kept, keyed by the revision (`main` as a
//!   big-endian u64, `_`, `sub` likewise, then `t` for a deletion), valued by the
//!   `mvccpb.KeyValue` written (a deletion's carries the key alone). `sub` orders the
//!   changes one transaction made. After compaction at `c`, each key keeps its last
//!   revision at or below `c`, unless that was a deletion, and everything after `c`.
//! - `meta`: `consistent_index` (the raft index applied) and, once compacted,
//!   `scheduledCompactRev` / `finishedCompactRev` (a revision as in `key`).
//! - `lease`: `leasepb.Lease` by big-endian lease id. `auth`: `authEnabled` (one byte) and
//!   `authRevision` (big-endian u64); `authUsers` / `authRoles`: `authpb.User` / `Role` by
//!   name. `alarm`: a marshalled `AlarmMember` per raised alarm, valued empty. `members`:
//!   each member's JSON by hex id. `cluster`: `clusterVersion`.
//!
//! An oncekv copy adds an `oncekv` bucket holding what etcd has no place for: oncekv's own
//! snapshot file without the key space and its history (those are in `key`), so sessions
//! and their saved replies, the leases' exact state, settings; cut into chunks, with a
//! checksum of the etcd buckets it was written beside. Opening a copy whose etcd buckets
//! are still the ones it was written with takes the key space from `key` and the rest
//! from that image, which gives back the state exactly; when they are not (the copy went
//! through etcd, which wrote to it), the etcd buckets are what is current, and the state
//! is built from them alone, without sessions. Copies written before the key space was
//! left to `key` hold the whole snapshot file, under other keys, and open as before.
//!
//! `layout` names the buckets and spells revisions as both directions do; `write` makes
//! the buckets of a state, `read` the state of buckets.

mod layout;
mod read;
#[cfg(test)]
mod tests;
mod write;

pub use read::{Contents, ImportNotes, open};
#[cfg(test)]
pub use write::export;
pub use write::export_db;
