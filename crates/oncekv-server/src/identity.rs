//! Who a member is: its own id and its cluster's.
//!
//! A member's identity is decided at its first start, from
//! `--initial-cluster` for a founding member (ids from names, so every founder computes
//! the same) or from the running cluster for a joining one, and kept in the data
//! directory's `member` file, so later restarts do not depend on the flags staying the
//! same. In a data directory laid out as etcd's (imported from `etcdctl snapshot
//! restore`, see [`crate::backup::import_etcd_data_dir`]) `member` is etcd's directory,
//! left as it was; the identity is then kept beside it in `oncekv-member`.

use std::collections::BTreeMap;
use std::path::Path;

use crate::disk::Disk;
use crate::types::{Member, NodeId};

/// Who a member is: its own id and its cluster's. Kept in the data directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    pub member_id: NodeId,
    pub cluster_id: u64,
}

const IDENTITY_FILE: &str = "member";
/// Where the identity is kept when `member` is etcd's directory.
const BESIDE_ETCD_FILE: &str = "oncekv-member";

/// The identity file's name in `data_dir`.
fn file_name(disk: &dyn Disk, data_dir: &Path) -> &'static str {
    match disk.list_dir(&data_dir.join(IDENTITY_FILE)) {
        Ok(_) => BESIDE_ETCD_FILE,
        Err(_) => IDENTITY_FILE,
    }
}

impl Identity {
    /// The identity saved in `data_dir`, if any.
    pub fn load(disk: &dyn Disk, data_dir: &Path) -> Result<Option<Identity>, String> {
        let path = data_dir.join(file_name(disk, data_dir));
        let text = match disk.read(&path) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("reading {}: {e}", path.display())),
        };
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                .ok_or_else(|| format!("{}: no valid {name} line", path.display()))
        };
        Ok(Some(Identity {
            member_id: field("member_id")?,
            cluster_id: field("cluster_id")?,
        }))
    }

    /// Saves it durably in `data_dir` (a temporary file, synced, renamed over).
    pub fn save(&self, disk: &dyn Disk, data_dir: &Path) -> Result<(), String> {
        let name = file_name(disk, data_dir);
        let path = data_dir.join(name);
        let tmp = data_dir.join(format!("{name}.tmp"));
        let text = format!(
            "member_id={:x}\ncluster_id={:x}\n",
            self.member_id, self.cluster_id
        );
        let io = |what: &str, e: std::io::Error| format!("{what} {}: {e}", path.display());
        disk.create_dir_all(data_dir)
            .map_err(|e| io("creating the directory of", e))?;
        let mut f = disk.create(&tmp).map_err(|e| io("creating", e))?;
        f.write_all(text.as_bytes()).map_err(|e| io("writing", e))?;
        f.sync_data().map_err(|e| io("syncing", e))?;
        drop(f);
        disk.rename(&tmp, &path).map_err(|e| io("renaming to", e))?;
        disk.sync_dir(data_dir)
            .map_err(|e| io("syncing the directory of", e))
    }
}

/// etcd's cluster id for a cluster formed with `members` under `token` (etcd's
/// `--initial-cluster-token`): the same on every founder, and different for two clusters
/// whose members have the same names but whose tokens differ, so that their peer ports
/// refuse each other's members.
pub fn founding_cluster_id(members: &BTreeMap<NodeId, Member>, token: &str) -> u64 {
    let seed = token.bytes().fold(0x9e37_79b9_7f4a_7c15u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    members
        .keys()
        .fold(seed, |h, id| (h ^ id).wrapping_mul(0x100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DEFAULT_CLUSTER_TOKEN;

    #[test]
    fn the_cluster_token_tells_clusters_of_the_same_names_apart() {
        let founders: BTreeMap<NodeId, Member> = ["n1", "n2", "n3"]
            .into_iter()
            .map(|n| {
                let m = Member {
                    name: n.into(),
                    peer_url: format!("http://{n}:2380"),
                    client_url: String::new(),
                };
                (crate::types::member_id(n), m)
            })
            .collect();
        let a = founding_cluster_id(&founders, DEFAULT_CLUSTER_TOKEN);
        assert_eq!(a, founding_cluster_id(&founders, DEFAULT_CLUSTER_TOKEN));
        assert_ne!(a, founding_cluster_id(&founders, "staging"));
        let two: BTreeMap<_, _> = founders.into_iter().take(2).collect();
        assert_ne!(a, founding_cluster_id(&two, DEFAULT_CLUSTER_TOKEN));
    }

    #[test]
    fn identity_round_trips_through_its_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let disk = crate::disk::os_disk();
        assert_eq!(Identity::load(disk.as_ref(), dir.path()), Ok(None));
        let id = Identity {
            member_id: 0xdead_beef,
            cluster_id: 0x1234,
        };
        id.save(disk.as_ref(), dir.path()).expect("saved");
        assert_eq!(Identity::load(disk.as_ref(), dir.path()), Ok(Some(id)));
        std::fs::write(dir.path().join(IDENTITY_FILE), "member_id=zz\n").expect("write");
        assert!(Identity::load(disk.as_ref(), dir.path()).is_err());
    }

    #[test]
    fn beside_an_etcd_member_directory_the_identity_has_a_file_of_its_own() {
        let dir = tempfile::tempdir().expect("tempdir");
        let disk = crate::disk::os_disk();
        std::fs::create_dir_all(dir.path().join("member/snap")).expect("mkdir");
        assert_eq!(Identity::load(disk.as_ref(), dir.path()), Ok(None));
        let id = Identity {
            member_id: 7,
            cluster_id: 9,
        };
        id.save(disk.as_ref(), dir.path()).expect("saved");
        assert!(dir.path().join(BESIDE_ETCD_FILE).is_file());
        assert!(
            dir.path().join("member/snap").is_dir(),
            "etcd's files untouched"
        );
        assert_eq!(Identity::load(disk.as_ref(), dir.path()), Ok(Some(id)));
    }
}
