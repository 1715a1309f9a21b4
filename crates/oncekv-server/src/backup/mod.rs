//! Point-in-time copies of a member's state, and new clusters built from them.
//!
//! - [`current`]: the applied state right now, as a copy (what Maintenance.Snapshot streams
//!   and `etcdctl snapshot save` writes). It is taken under the state's read lock, so it is
//!   one consistent point: one applied index, with the keys, their history, leases and
//!   sessions (saved replies included) of that index.
//! - [`status`]: what a copy holds (`oncekv snapshot status`, as `etcdctl snapshot status`).
//! - [`restore`]: a data directory for one member of a new cluster, from a copy
//!   (`oncekv snapshot restore`, as etcdutl's): the copy's state at its index, with the new
//!   cluster's membership in place of the old one. Every member of the new cluster is
//!   restored from the same copy with the same `--initial-cluster`, so all start equal.
//!
//! A copy is what etcd's Snapshot stream is: an etcd 3.4 database file (bbolt, see
//! [`etcd_db`] for what is in it) followed by the SHA-256 of the file. So etcdctl and
//! etcdutl read an oncekv copy (`snapshot status`, and `snapshot restore` into an etcd
//! cluster), and `oncekv snapshot restore` reads etcd's: the way from etcd to oncekv and
//! back. An oncekv copy also carries the part of oncekv's state etcd's buckets have no
//! place for (sessions with their saved replies, among others), and restores exactly
//! from the two together. Copies in oncekv's earlier format (its snapshot file, padded,
//! its length and a SHA-256) and plain snapshot files (`state/snapshot.bin`) are read too.
//! A damaged copy is refused, not restored.

pub mod bbolt;
pub mod etcd_db;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use oncekv_core::StateMachine;
use openraft::storage::SnapshotMeta;
use openraft::{CommittedLeaderId, Membership, StoredMembership};
use sha2::Digest;

use crate::disk::{Disk, write_atomically};
use crate::identity::{IdScheme, Identity};
use crate::sm_store::{
    Applied, SNAPSHOT_FILE, SnapshotFile, decode_snapshot_file, encode_snapshot_file,
};
use crate::types::{LogId, Member, NodeId};

/// What a snapshot copy holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// For a database file, what `etcdctl snapshot status` prints: a CRC-32C of every
    /// bucket's name, keys and values; the last revision in the `key` bucket; the number
    /// of entries in all buckets; the database's size. For a copy in oncekv's earlier
    /// format: a CRC-32 of the state image, the store's revision, the live keys and the
    /// copy's size.
    pub hash: u32,
    pub revision: i64,
    pub total_keys: usize,
    pub total_size: u64,
    /// Keys in the key space at the copy's revision.
    pub live_keys: usize,
    /// The raft index it was taken at.
    pub index: u64,
    pub sessions: usize,
    pub origin: Origin,
}

/// Where the state of a copy comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// oncekv's own image: the whole state, sessions included.
    Oncekv,
    /// etcd's buckets (an etcd snapshot, or an oncekv copy that etcd has written to
    /// since): no sessions.
    Etcd(etcd_db::ImportNotes),
}

/// What a copy says when opened as an etcd user would expect.
impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Oncekv => write!(f, "oncekv state, sessions included"),
            Origin::Etcd(notes) => {
                write!(f, "etcd data (no exactly-once sessions)")?;
                if notes.stale_oncekv_image {
                    write!(
                        f,
                        "; its oncekv sessions were dropped: etcd has written to it since"
                    )?;
                }
                if notes.keys_detached > 0 {
                    write!(
                        f,
                        "; {} key revisions named a lease the copy lacks and were kept \
                         without it",
                        notes.keys_detached
                    )?;
                }
                Ok(())
            }
        }
    }
}

/// The applied state of `applied`, now, as a copy, written to an unnamed temporary file
/// in `dir` (gone once closed): the file, at its start, and its length. Only the state's
/// image and a decoded copy of it are held in memory, not the copy itself.
pub fn current(applied: &Applied, dir: &Path) -> Result<(std::fs::File, u64), String> {
    use std::io::{Seek, SeekFrom, Write};
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
    let members: BTreeMap<NodeId, Member> = inner
        .membership
        .membership()
        .nodes()
        .map(|(id, m)| (*id, m.clone()))
        .collect();
    // Writes wait while the lock is held: only the encoding happens under it (as for a
    // raft snapshot). The etcd view is built from a decoded copy of the image, outside.
    drop(inner);
    let copy = StateMachine::restore(&data).map_err(|e| format!("invalid state: {e}"))?;
    drop(data);
    // The key space goes into etcd's `key` bucket only: the copy is about the size of
    // etcd's, not twice it.
    let data = copy.snapshot_without_keys().map_err(|e| e.to_string())?;
    let image = encode_snapshot_file(&meta, &data)?;
    let io = |e: std::io::Error| format!("writing the copy in {}: {e}", dir.display());
    let file = tempfile::tempfile_in(dir).map_err(io)?;
    let out = std::io::BufWriter::with_capacity(1 << 20, file);
    let out = etcd_db::export_db(&copy, &members, &image, out).map_err(io)?;
    drop((copy, image));
    let mut file = out.into_inner().map_err(|e| io(e.into_error()))?;
    // etcd's stream ends with the SHA-256 of the database.
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    let mut sha = sha2::Sha256::new();
    std::io::copy(&mut file, &mut sha).map_err(io)?;
    file.write_all(&sha.finalize()).map_err(io)?;
    let len = file.stream_position().map_err(io)?;
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    Ok((file, len))
}

/// Page size of oncekv's earlier copies, and the size of the trailing checksum.
const PAGE: usize = 512;
const SHA_LEN: usize = 32;

/// The snapshot file inside a copy in oncekv's earlier format (padded to 512 bytes less 8,
/// its length, a SHA-256), or `bytes` itself if it is a plain snapshot file.
fn unseal(bytes: &[u8]) -> Result<&[u8], String> {
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

/// How a copy is checked before it is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpenOptions {
    /// Accept a database file without its trailing SHA-256 (etcdutl's
    /// `--skip-hash-check`: a `member/snap/db` copied out of a data directory has none).
    pub skip_hash_check: bool,
    /// Cluster time (ms) to start imported leases from: they get their full TTL from it.
    pub now_ms: u64,
}

/// A copy, opened: its snapshot file (for an oncekv image), the state, what it says of
/// itself.
struct Opened {
    /// The oncekv snapshot file, when the copy holds the whole state as one.
    file: Option<SnapshotFile>,
    sm: StateMachine,
    summary: Summary,
}

/// The database inside `bytes` (without its SHA-256), if `bytes` is one.
fn database(bytes: &[u8], opts: OpenOptions) -> Result<Option<&[u8]>, String> {
    if !bbolt::looks_like_db(bytes) {
        return Ok(None);
    }
    // etcd's test: a copy with a hash is 32 bytes past a multiple of 512.
    if bytes.len() % PAGE == SHA_LEN {
        let (db, sum) = bytes.split_at(bytes.len() - SHA_LEN);
        if !opts.skip_hash_check && sha2::Sha256::digest(db).as_slice() != sum {
            return Err("sha256 checksum mismatch: the copy is damaged".into());
        }
        Ok(Some(db))
    } else if opts.skip_hash_check {
        Ok(Some(bytes))
    } else {
        Err("snapshot missing hash but --skip-hash-check=false".into())
    }
}

/// etcdctl's `snapshot status` of a database: CRC-32C over every bucket's name, keys and
/// values, the last `key` revision, the entries of all buckets, the size in pages.
fn etcd_status(buckets: &bbolt::Buckets) -> (u32, i64, usize) {
    let mut crc = Crc32c::default();
    let mut revision = 0;
    let mut total = 0;
    for (name, pairs) in buckets {
        crc.update(name);
        for (k, v) in pairs {
            crc.update(k);
            crc.update(v);
            if name == b"key" && k.len() >= 8 {
                let mut main = [0u8; 8];
                main.copy_from_slice(&k[..8]);
                revision = u64::from_be_bytes(main) as i64;
            }
            total += 1;
        }
    }
    (crc.finish(), revision, total)
}

/// CRC-32 with the Castagnoli polynomial (what etcdctl hashes a snapshot with).
struct Crc32c {
    table: [u32; 256],
    crc: u32,
}

impl Default for Crc32c {
    fn default() -> Self {
        let mut table = [0u32; 256];
        for (i, slot) in table.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 == 1 {
                    (c >> 1) ^ 0x82F6_3B78
                } else {
                    c >> 1
                };
            }
            *slot = c;
        }
        Crc32c { table, crc: !0 }
    }
}

impl Crc32c {
    fn update(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.crc = self.table[((self.crc ^ u32::from(*b)) & 0xff) as usize] ^ (self.crc >> 8);
        }
    }

    fn finish(&self) -> u32 {
        !self.crc
    }
}

fn open(bytes: &[u8], opts: OpenOptions) -> Result<Opened, String> {
    if let Some(db) = database(bytes, opts)? {
        let buckets = bbolt::read(db).map_err(|e| e.to_string())?;
        let (hash, revision, total_keys) = etcd_status(&buckets);
        let total_size = bbolt::size(db).map_err(|e| e.to_string())?;
        // Imported auth needs a key to sign tokens with; a fresh one, as `auth enable`
        // draws.
        let token_key: [u8; 32] = rand::random();
        let invalid = |e: oncekv_core::SnapshotError| format!("invalid state: {e}");
        let (file, sm, origin) = match etcd_db::open(&buckets, opts.now_ms, token_key)? {
            etcd_db::Contents::Oncekv { image, keys } => {
                let file = decode_snapshot_file(&image)?;
                let sm = StateMachine::restore_without_keys(&file.data, keys.into_kv())
                    .map_err(invalid)?;
                (None, sm, Origin::Oncekv)
            }
            etcd_db::Contents::OncekvWhole(image) => {
                let file = decode_snapshot_file(&image)?;
                let sm = StateMachine::restore(&file.data).map_err(invalid)?;
                (Some(file), sm, Origin::Oncekv)
            }
            etcd_db::Contents::Etcd(sm, notes) => (None, *sm, Origin::Etcd(notes)),
        };
        let summary = Summary {
            hash,
            revision,
            total_keys,
            total_size,
            live_keys: sm.kv().len(),
            index: file
                .as_ref()
                .and_then(|f| f.meta.last_log_id)
                .map_or(sm.applied_index(), |l| l.index),
            sessions: sm.sessions().len(),
            origin,
        };
        return Ok(Opened { file, sm, summary });
    }
    let file = decode_snapshot_file(unseal(bytes)?)?;
    let sm = StateMachine::restore(&file.data).map_err(|e| format!("invalid state: {e}"))?;
    let summary = Summary {
        hash: crc32fast::hash(&file.data),
        revision: sm.revision(),
        total_keys: sm.kv().len(),
        total_size: bytes.len() as u64,
        live_keys: sm.kv().len(),
        index: file.meta.last_log_id.map_or(0, |l| l.index),
        sessions: sm.sessions().len(),
        origin: Origin::Oncekv,
    };
    Ok(Opened {
        file: Some(file),
        sm,
        summary,
    })
}

/// What the copy `bytes` holds; an error if it is damaged or not a snapshot.
pub fn status(bytes: &[u8], opts: OpenOptions) -> Result<Summary, String> {
    // As etcdctl's status, a database without its hash is read; one with a hash is
    // checked against it.
    let opts = OpenOptions {
        skip_hash_check: opts.skip_hash_check || bytes.len() % PAGE != SHA_LEN,
        ..opts
    };
    Ok(open(bytes, opts)?.summary)
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
    opts: OpenOptions,
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
    let opened = open(bytes, opts)?;
    install(opened, disk, data_dir, name, initial_cluster, cluster_token)
}

/// Writes `opened`'s state into `data_dir` as the snapshot of member `name` of a new
/// cluster of `initial_cluster`, then the member's identity: the identity comes last, so
/// a data directory with one holds the whole state durably.
fn install(
    Opened { file, sm, summary }: Opened,
    disk: &dyn Disk,
    data_dir: &Path,
    name: &str,
    initial_cluster: &[Member],
    cluster_token: &str,
) -> Result<Summary, String> {
    // A state not read from one whole snapshot file (an etcd database's, or a copy that
    // keeps its key space in etcd's `key` bucket) becomes one here.
    let data = match file {
        Some(file) => file.data,
        None => sm.snapshot().map_err(|e| e.to_string())?,
    };
    // A restored cluster is a new one: etcd's ids, the same as `etcdctl snapshot restore`
    // gives for the same flags.
    let scheme = IdScheme::Etcd;
    let founders: BTreeMap<NodeId, Member> = scheme.founders(initial_cluster, cluster_token);
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
    let restored = SnapshotFile { meta, data };
    let out = encode_snapshot_file(&restored.meta, &restored.data)?;
    let state_dir = data_dir.join("state");
    disk.create_dir_all(&state_dir)
        .map_err(|e| format!("creating {}: {e}", state_dir.display()))?;
    let path = state_dir.join(SNAPSHOT_FILE);
    write_atomically(disk, &path, &out).map_err(|e| format!("writing {}: {e}", path.display()))?;
    scheme
        .founder(name, initial_cluster, cluster_token)
        .ok_or_else(|| format!("member {name:?} is not in --initial-cluster"))?
        .save(disk, data_dir)?;
    Ok(summary)
}

/// Where `etcdctl snapshot restore` (and etcd itself) keeps a member's database.
const ETCD_DB: &str = "member/snap/db";

/// Starts member `name` on a data directory laid out as etcd's: imports `member/snap/db`
/// (what `etcdctl snapshot restore` writes) once, as [`restore`] would from the same
/// database, when the directory has no oncekv identity yet. etcd's files are only read,
/// never changed; the import is durable once the identity is written (last), so a crash
/// during it imports again at the next start. `Ok(None)`: nothing to import.
///
/// Only the database is read. `member/wal` after a restore holds the new membership
/// only; a running etcd's WAL can hold writes the database does not have yet, so a
/// directory taken from a live etcd member must come from a clean stop.
pub fn import_etcd_data_dir(
    disk: &dyn Disk,
    data_dir: &Path,
    name: &str,
    initial_cluster: &[Member],
    cluster_token: &str,
    now_ms: u64,
) -> Result<Option<Summary>, String> {
    let db_path = data_dir.join(ETCD_DB);
    let bytes = match disk.read(&db_path) {
        Ok(bytes) => bytes,
        // Not there, or `member` is oncekv's identity file rather than etcd's directory.
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(None);
        }
        Err(e) => return Err(format!("reading {}: {e}", db_path.display())),
    };
    if Identity::load(disk, data_dir)?.is_some() {
        return Ok(None);
    }
    let opts = OpenOptions {
        // A database in a data directory carries no SHA-256 (only a snapshot stream does).
        skip_hash_check: true,
        now_ms,
    };
    let opened = open(&bytes, opts).map_err(|e| format!("{}: {e}", db_path.display()))?;
    install(opened, disk, data_dir, name, initial_cluster, cluster_token).map(Some)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A copy as oncekv wrote them before copies were etcd databases.
    fn seal(mut file: Vec<u8>) -> Vec<u8> {
        let len = file.len() as u64;
        let pad = (PAGE - (file.len() + 8) % PAGE) % PAGE;
        file.resize(file.len() + pad, 0);
        file.extend_from_slice(&len.to_le_bytes());
        let sum = sha2::Sha256::digest(&file);
        file.extend_from_slice(&sum);
        file
    }

    #[test]
    fn an_earlier_copy_opens_back() {
        for len in [0usize, 1, 100, 503, 504, 505, 5000] {
            let file =
                encode_snapshot_file(&SnapshotMeta::default(), &vec![7u8; len]).expect("encodes");
            let sealed = seal(file.clone());
            assert_eq!(sealed.len() % PAGE, SHA_LEN, "len {len}");
            assert_eq!(unseal(&sealed), Ok(file.as_slice()));
            let mut damaged = sealed.clone();
            damaged[2] ^= 1;
            assert!(unseal(&damaged).is_err());
        }
    }

    #[test]
    fn only_an_etcd_layout_is_imported_and_a_damaged_database_is_refused() {
        let disk = crate::disk::os_disk();
        let cluster = [Member {
            name: "m1".into(),
            peer_url: "http://127.0.0.1:2380".into(),
            client_url: String::new(),
        }];
        let import = |dir: &Path| import_etcd_data_dir(disk.as_ref(), dir, "m1", &cluster, "t", 0);
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(import(empty.path()), Ok(None));
        // oncekv's own layout: `member` is its identity file.
        let own = tempfile::tempdir().unwrap();
        std::fs::write(own.path().join("member"), "member_id=1\ncluster_id=2\n").unwrap();
        assert_eq!(import(own.path()), Ok(None));
        let damaged = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(damaged.path().join("member/snap")).unwrap();
        std::fs::write(damaged.path().join(ETCD_DB), vec![0xab; 8192]).unwrap();
        let refused = import(damaged.path()).unwrap_err();
        assert!(refused.contains("member/snap/db"), "{refused}");
        assert!(
            !damaged.path().join("state").exists(),
            "nothing half-imported"
        );
        assert_eq!(Identity::load(disk.as_ref(), damaged.path()), Ok(None));
    }
}
