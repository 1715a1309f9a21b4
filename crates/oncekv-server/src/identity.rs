//! Who a member is: its own id and its cluster's.
//!
//! A member's identity is decided at its first start, from
//! `--initial-cluster` for a founding member (every founder computes the same ids from
//! the same flags, see [`IdScheme`]) or from the running cluster for a joining one, and
//! kept in the data directory's `member` file, so later restarts do not depend on the
//! flags staying the same. In a data directory laid out as etcd's (imported from `etcdctl snapshot
//! restore`, see [`crate::backup::import_etcd_data_dir`]) `member` is etcd's directory,
//! left as it was; the identity is then kept beside it in `oncekv-member`.

use std::collections::BTreeMap;
use std::path::Path;

use sha1::Digest;

use crate::disk::Disk;
use crate::types::{Member, NodeId};

/// How a cluster's founders derived their ids from `--initial-cluster`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdScheme {
    /// etcd's (every cluster formed since): a member's id is the first 8 bytes of the
    /// SHA-1 of its peer URLs (sorted, concatenated) and the cluster token; the
    /// cluster's, of its founders' ids. So a cluster formed with the same flags as an
    /// etcd cluster, or from `etcdctl snapshot restore`, has etcd's ids.
    Etcd,
    /// oncekv's first: a hash of the member's name ([`crate::types::member_id`]); the
    /// cluster's from those and the token. Clusters formed with it keep it (an identity
    /// file without an `ids=` line).
    Names,
}

impl IdScheme {
    /// `member`'s id in a cluster founded under `token`.
    pub fn member_id(self, member: &Member, token: &str) -> NodeId {
        match self {
            IdScheme::Names => crate::types::member_id(&member.name),
            IdScheme::Etcd => {
                // One URL per member here; etcd sorts several before joining them.
                let mut h = sha1::Sha1::new();
                h.update(member.peer_url.trim().as_bytes());
                h.update(token.as_bytes());
                first_u64(&h.finalize())
            }
        }
    }

    /// The id of a cluster founded by `founders` (by id) under `token`.
    pub fn cluster_id(self, founders: &BTreeMap<NodeId, Member>, token: &str) -> u64 {
        match self {
            IdScheme::Names => founding_cluster_id(founders, token),
            IdScheme::Etcd => {
                let mut h = sha1::Sha1::new();
                for id in founders.keys() {
                    h.update(id.to_be_bytes());
                }
                first_u64(&h.finalize())
            }
        }
    }

    /// The founders of `initial_cluster` by id.
    pub fn founders(self, initial_cluster: &[Member], token: &str) -> BTreeMap<NodeId, Member> {
        initial_cluster
            .iter()
            .map(|m| (self.member_id(m, token), m.clone()))
            .collect()
    }

    /// The identity of founder `name` of `initial_cluster` (`None`: not listed there).
    pub fn founder(self, name: &str, initial_cluster: &[Member], token: &str) -> Option<Identity> {
        let me = initial_cluster.iter().find(|m| m.name == name)?;
        Some(Identity {
            member_id: self.member_id(me, token),
            cluster_id: self.cluster_id(&self.founders(initial_cluster, token), token),
            scheme: self,
        })
    }
}

/// A digest's first 8 bytes, big-endian, as etcd reads an id out of a SHA-1.
fn first_u64(digest: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(b)
}

/// Who a member is: its own id and its cluster's. Kept in the data directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    pub member_id: NodeId,
    pub cluster_id: u64,
    /// How the cluster's founders derived their ids.
    pub scheme: IdScheme,
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
        let scheme = match text.lines().find_map(|l| l.strip_prefix("ids=")) {
            None => IdScheme::Names,
            Some("etcd") => IdScheme::Etcd,
            Some(other) => return Err(format!("{}: unknown ids={other}", path.display())),
        };
        Ok(Some(Identity {
            member_id: field("member_id")?,
            cluster_id: field("cluster_id")?,
            scheme,
        }))
    }

    /// Saves it durably in `data_dir` (a temporary file, synced, renamed over).
    pub fn save(&self, disk: &dyn Disk, data_dir: &Path) -> Result<(), String> {
        let name = file_name(disk, data_dir);
        let path = data_dir.join(name);
        let tmp = data_dir.join(format!("{name}.tmp"));
        let mut text = format!(
            "member_id={:x}\ncluster_id={:x}\n",
            self.member_id, self.cluster_id
        );
        if self.scheme == IdScheme::Etcd {
            text.push_str("ids=etcd\n");
        }
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

/// The cluster id of [`IdScheme::Names`] for a cluster formed with `members` under
/// `token` (etcd's `--initial-cluster-token`): the same on every founder, and different
/// for two clusters whose members have the same names but whose tokens differ, so that
/// their peer ports refuse each other's members.
fn founding_cluster_id(members: &BTreeMap<NodeId, Member>, token: &str) -> u64 {
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
    fn the_cluster_token_tells_clusters_of_the_same_members_apart() {
        let list: Vec<Member> = ["n1", "n2", "n3"]
            .into_iter()
            .map(|n| Member {
                name: n.into(),
                peer_url: format!("http://{n}:2380"),
                client_url: String::new(),
            })
            .collect();
        for scheme in [IdScheme::Etcd, IdScheme::Names] {
            let cluster =
                |list: &[Member], token| scheme.cluster_id(&scheme.founders(list, token), token);
            let a = cluster(&list, DEFAULT_CLUSTER_TOKEN);
            assert_eq!(a, cluster(&list, DEFAULT_CLUSTER_TOKEN), "{scheme:?}");
            assert_ne!(a, cluster(&list, "staging"), "{scheme:?}");
            assert_ne!(a, cluster(&list[..2], DEFAULT_CLUSTER_TOKEN), "{scheme:?}");
        }
    }

    #[test]
    fn identity_round_trips_through_its_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let disk = crate::disk::os_disk();
        assert_eq!(Identity::load(disk.as_ref(), dir.path()), Ok(None));
        for scheme in [IdScheme::Etcd, IdScheme::Names] {
            let id = Identity {
                member_id: 0xdead_beef,
                cluster_id: 0x1234,
                scheme,
            };
            id.save(disk.as_ref(), dir.path()).expect("saved");
            assert_eq!(Identity::load(disk.as_ref(), dir.path()), Ok(Some(id)));
        }
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
            scheme: IdScheme::Etcd,
        };
        id.save(disk.as_ref(), dir.path()).expect("saved");
        assert!(dir.path().join(BESIDE_ETCD_FILE).is_file());
        assert!(
            dir.path().join("member/snap").is_dir(),
            "etcd's files untouched"
        );
        assert_eq!(Identity::load(disk.as_ref(), dir.path()), Ok(Some(id)));
    }

    // The figures etcdctl 3.4 printed for `snapshot restore --name infra1
    // --initial-cluster infra1=http://127.0.0.1:2380 --initial-cluster-token new`
    // ("added member", "added-peer-id":"347efd38acec9c95", "cluster-id":"5e49c4f5faed6ca5").
    #[test]
    fn ids_are_etcds_for_the_same_flags() {
        let cluster = [Member {
            name: "infra1".into(),
            peer_url: "http://127.0.0.1:2380".into(),
            client_url: String::new(),
        }];
        let id = IdScheme::Etcd
            .founder("infra1", &cluster, "new")
            .expect("listed");
        assert_eq!(id.member_id, 0x347e_fd38_acec_9c95);
        assert_eq!(id.cluster_id, 0x5e49_c4f5_faed_6ca5);
        assert!(IdScheme::Etcd.founder("infra2", &cluster, "new").is_none());
    }

    // A data directory written before etcd's ids keeps the ids it has: its identity file
    // has no ids= line.
    #[test]
    fn an_identity_file_without_a_scheme_is_of_the_name_scheme() {
        let dir = tempfile::tempdir().expect("tempdir");
        let disk = crate::disk::os_disk();
        std::fs::write(
            dir.path().join(IDENTITY_FILE),
            "member_id=5\ncluster_id=6\n",
        )
        .expect("write");
        let loaded = Identity::load(disk.as_ref(), dir.path()).expect("reads");
        assert_eq!(loaded.map(|i| i.scheme), Some(IdScheme::Names));
    }
}
