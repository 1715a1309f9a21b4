//! Point-in-time copies of a member's state, and new clusters built from them.
//!
//! - [`current`]: the applied state right now, in the snapshot file's format (what
//!   Maintenance.Snapshot streams and `etcdctl snapshot save` writes). It is taken under
//!   the state's read lock, so it is one consistent point: one applied index, with the
//!   keys, their history, leases and sessions (saved replies included) of that index.
//! - [`status`]: what a copy holds (`oncekv snapshot status`).
//! - [`restore`]: a data directory for one member of a new cluster, from a copy
//!   (`oncekv snapshot restore`, as etcdutl's): the copy's state at its index, with the new
//!   cluster's membership in place of the old one. Every member of the new cluster is
//!   restored from the same copy with the same `--initial-cluster`, so all start equal.
//!
//! A copy is laid out as etcd's snapshot stream is, so that etcdctl takes it: the
//! snapshot file, zeros up to a 512-byte boundary (less the 8 bytes that follow), the
//! file's length, and a SHA-256 of everything before it (etcdctl checks that the size is
//! 32 past a multiple of 512). The file inside is checksummed itself (CRC-32); a damaged
//! copy is refused, not restored. A plain snapshot file (`state/snapshot.bin`) is taken
//! too.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use oncekv_core::StateMachine;
use openraft::storage::SnapshotMeta;
use openraft::{CommittedLeaderId, Membership, StoredMembership};

use crate::disk::{Disk, write_atomically};
use crate::membership::{Identity, founding_cluster_id};
use crate::sm_store::{
    Applied, SNAPSHOT_FILE, SnapshotFile, decode_snapshot_file, encode_snapshot_file,
};
use crate::types::{LogId, Member, NodeId, member_id};

/// What a snapshot copy holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// CRC-32 of the state image (etcdctl prints the database's hash here).
    pub hash: u32,
    pub revision: i64,
    pub total_keys: usize,
    /// The copy's size in bytes.
    pub total_size: u64,
    /// The raft index it was taken at.
    pub index: u64,
    pub sessions: usize,
}

/// The applied state of `applied`, now, as a snapshot file.
pub fn current(applied: &Applied) -> Result<Vec<u8>, String> {
    let inner = applied.read();
    let data = inner.sm.snapshot().map_err(|e| e.to_string())?;
    let last = inner.last_applied;
    let meta = SnapshotMeta {
        last_log_id: last,
        last_membership: inner.membership.clone(),
        snapshot_id: match last {
            Some(l) => format!("copy-{}-{}", l.leader_id, l.index),
            None => "copy-empty".to_string(),
        },
    };
    drop(inner);
    Ok(seal(encode_snapshot_file(&SnapshotFile { meta, data })?))
}

/// Page size of etcd's snapshot stream, and the size of its trailing checksum.
const PAGE: usize = 512;
const SHA_LEN: usize = 32;

/// A snapshot file as a copy: padded, its length, its SHA-256.
fn seal(mut file: Vec<u8>) -> Vec<u8> {
    use sha2::Digest;
    let len = file.len() as u64;
    let pad = (PAGE - (file.len() + 8) % PAGE) % PAGE;
    file.resize(file.len() + pad, 0);
    file.extend_from_slice(&len.to_le_bytes());
    let sum = sha2::Sha256::digest(&file);
    file.extend_from_slice(&sum);
    file
}

/// The snapshot file inside a copy, or `bytes` itself if it is a plain snapshot file.
fn unseal(bytes: &[u8]) -> Result<&[u8], String> {
    use sha2::Digest;
    let n = bytes.len();
    let sealed_size = n >= SHA_LEN + 8 && (n - SHA_LEN).is_multiple_of(PAGE);
    if sealed_size {
        let (body, sum) = bytes.split_at(n - SHA_LEN);
        if sha2::Sha256::digest(body).as_slice() == sum {
            let mut len = [0u8; 8];
            len.copy_from_slice(&body[body.len() - 8..]);
            let len = usize::try_from(u64::from_le_bytes(len)).unwrap_or(usize::MAX);
            return body
                .get(..len)
                .filter(|_| len <= body.len() - 8)
                .ok_or_else(|| "the copy's length field is out of range".to_string());
        }
    }
    match decode_snapshot_file(bytes) {
        Ok(_) => Ok(bytes),
        Err(_) if sealed_size => Err("sha256 checksum mismatch: the copy is damaged".into()),
        Err(e) => Err(e),
    }
}

fn open(bytes: &[u8]) -> Result<(SnapshotFile, StateMachine), String> {
    let file = decode_snapshot_file(unseal(bytes)?)?;
    let sm = StateMachine::restore(&file.data).map_err(|e| format!("invalid state: {e}"))?;
    Ok((file, sm))
}

/// What the copy `bytes` holds; an error if it is damaged or not a snapshot.
pub fn status(bytes: &[u8]) -> Result<Summary, String> {
    let (file, sm) = open(bytes)?;
    Ok(summary(bytes.len(), &file, &sm))
}

fn summary(size: usize, file: &SnapshotFile, sm: &StateMachine) -> Summary {
    Summary {
        hash: crc32fast::hash(&file.data),
        revision: sm.revision(),
        total_keys: sm.kv().len(),
        total_size: size as u64,
        index: file.meta.last_log_id.map_or(0, |l| l.index),
        sessions: sm.sessions().len(),
    }
}

/// Writes a data directory at `data_dir` for member `name` of a new cluster of
/// `initial_cluster`, holding the state of the copy `bytes`. `data_dir` must not exist or
/// be empty (a restore never overwrites a member's data).
pub fn restore(
    bytes: &[u8],
    disk: &dyn Disk,
    data_dir: &Path,
    name: &str,
    initial_cluster: &[Member],
    cluster_token: &str,
) -> Result<Summary, String> {
    if !initial_cluster.iter().any(|m| m.name == name) {
        return Err(format!("member {name:?} is not in --initial-cluster"));
    }
    match disk.list_dir(data_dir) {
        Ok(entries) if !entries.is_empty() => {
            return Err(format!(
                "data-dir {:?} exists",
                data_dir.display().to_string()
            ));
        }
        _ => {}
    }
    let (file, sm) = open(bytes)?;
    let founders: BTreeMap<NodeId, Member> = initial_cluster
        .iter()
        .map(|m| (member_id(&m.name), m.clone()))
        .collect();
    let voters: BTreeSet<NodeId> = founders.keys().copied().collect();
    // The copy's index, under a term-0 leader: the new cluster's first leader (term 1 or
    // more) appends after it, so log ids keep increasing. The old cluster's terms and
    // membership do not come along.
    let index = sm.applied_index();
    let log_id = LogId::new(CommittedLeaderId::new(0, 0), index);
    let meta = SnapshotMeta {
        last_log_id: Some(log_id),
        last_membership: StoredMembership::new(
            Some(log_id),
            Membership::new(vec![voters], founders.clone()),
        ),
        snapshot_id: format!("restored-{index}"),
    };
    let restored = SnapshotFile {
        meta,
        data: file.data.clone(),
    };
    let out = encode_snapshot_file(&restored)?;
    let size = out.len();
    let state_dir = data_dir.join("state");
    disk.create_dir_all(&state_dir)
        .map_err(|e| format!("creating {}: {e}", state_dir.display()))?;
    let path = state_dir.join(SNAPSHOT_FILE);
    write_atomically(disk, &path, &out).map_err(|e| format!("writing {}: {e}", path.display()))?;
    Identity {
        member_id: member_id(name),
        cluster_id: founding_cluster_id(&founders, cluster_token),
    }
    .save(disk, data_dir)?;
    Ok(summary(size, &restored, &sm))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_copy_has_etcds_size_and_opens_back() {
        for len in [0usize, 1, 100, 503, 504, 505, 5000] {
            let file = encode_snapshot_file(&SnapshotFile {
                meta: SnapshotMeta::default(),
                data: vec![7u8; len],
            })
            .expect("encodes");
            let sealed = seal(file.clone());
            assert_eq!(sealed.len() % PAGE, SHA_LEN, "len {len}");
            assert_eq!(unseal(&sealed), Ok(file.as_slice()));
            let mut damaged = sealed.clone();
            damaged[2] ^= 1;
            assert!(unseal(&damaged).is_err());
        }
    }
}
