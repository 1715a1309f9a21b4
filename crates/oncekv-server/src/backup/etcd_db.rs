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

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;
use oncekv_core::command::AlarmKind;
use oncekv_core::history::Change;
use oncekv_core::kv::Value;
use oncekv_core::lease::Lease;
use oncekv_core::{AuthStore, ImportedState, PermKind, Permission, StateMachine};
use prost::Message;

use super::bbolt::{Buckets, DbWriter};
use crate::pb::{authpb, etcdserverpb, mvccpb};
use crate::types::{Member, NodeId};

const KEY: &[u8] = b"key";
const META: &[u8] = b"meta";
const LEASE: &[u8] = b"lease";
const AUTH: &[u8] = b"auth";
const AUTH_USERS: &[u8] = b"authUsers";
const AUTH_ROLES: &[u8] = b"authRoles";
const ALARM: &[u8] = b"alarm";
const MEMBERS: &[u8] = b"members";
const MEMBERS_REMOVED: &[u8] = b"members_removed";
const CLUSTER: &[u8] = b"cluster";
const ONCEKV: &[u8] = b"oncekv";

/// The buckets whose content an etcd member changes as it serves: the `oncekv` bucket's
/// image is current only while these are as written.
const VIEW: [&[u8]; 6] = [ALARM, AUTH, AUTH_ROLES, AUTH_USERS, KEY, LEASE];
const VIEW_SUM: &[u8] = b"etcd-view-crc32";
/// Chunks of a whole snapshot file (copies written before [`STATE_PREFIX`]).
const IMAGE_PREFIX: &[u8] = b"image/";
/// Chunks of a snapshot file without the key space.
const STATE_PREFIX: &[u8] = b"state/";
/// Chunks of the image, so that no value needs one huge run of pages.
const CHUNK: usize = 1 << 20;

/// etcd's `leasepb.Lease` (etcd's server-side proto, not part of its API).
#[derive(Clone, PartialEq, prost::Message)]
struct LeaseRecord {
    #[prost(int64, tag = "1")]
    id: i64,
    #[prost(int64, tag = "2")]
    ttl: i64,
    #[prost(int64, tag = "3")]
    remaining_ttl: i64,
}

fn rev_bytes(main: i64, sub: i64, tombstone: bool) -> Vec<u8> {
    let mut k = Vec::with_capacity(18);
    k.extend_from_slice(&(main as u64).to_be_bytes());
    k.push(b'_');
    k.extend_from_slice(&(sub as u64).to_be_bytes());
    if tombstone {
        k.push(b't');
    }
    k
}

/// `(main, sub, tombstone)` of a `key` bucket key.
fn parse_rev(k: &[u8]) -> Option<(i64, i64, bool)> {
    let tombstone = match k.len() {
        17 => false,
        18 if k[17] == b't' => true,
        _ => return None,
    };
    if k[8] != b'_' {
        return None;
    }
    let main = u64::from_be_bytes(k[0..8].try_into().ok()?) as i64;
    let sub = u64::from_be_bytes(k[9..17].try_into().ok()?) as i64;
    Some((main, sub, tombstone))
}

fn kv_record(key: &Bytes, v: &Value) -> Vec<u8> {
    mvccpb::KeyValue {
        key: key.clone(),
        create_revision: v.create_revision,
        mod_revision: v.mod_revision,
        version: v.version,
        value: v.value.clone(),
        lease: v.lease,
    }
    .encode_to_vec()
}

/// The `key` bucket of `sm` (what etcd would hold after the same writes and compaction),
/// record by record in key order.
///
/// Two parts: what compaction kept of the time before the history (each key's value from
/// before its first recorded change, or its current value if it has none, written at a
/// compacted revision), then the history, in revision order. The first part's revisions
/// are below every recorded change's, so the two follow each other; a state where they
/// would not is put in order as a whole instead.
fn key_records(sm: &StateMachine) -> Box<dyn Iterator<Item = (Vec<u8>, Vec<u8>)> + '_> {
    let kv = sm.kv();
    let changes = kv.history().changes();
    let mut first_change: HashMap<&Bytes, &Change> = HashMap::new();
    for c in changes {
        first_change.entry(&c.key).or_insert(c);
    }
    let mut before: Vec<(&Bytes, &Value)> = Vec::new();
    for (key, value) in kv.iter() {
        if !first_change.contains_key(key) {
            before.push((key, value));
        }
    }
    for (key, c) in &first_change {
        if let Some(v) = &c.prev {
            before.push((key, v));
        }
    }
    before.sort_by(|a, b| (a.1.mod_revision, a.0).cmp(&(b.1.mod_revision, b.0)));
    let overlap = match (before.last(), changes.first()) {
        (Some((_, v)), Some(c)) => v.mod_revision >= c.revision,
        _ => false,
    };
    if overlap {
        return Box::new(key_bucket(sm).into_iter());
    }
    // Subs count the records of one revision, in order.
    let subs = |revisions: Vec<i64>| {
        let mut last = None;
        let mut sub = 0i64;
        revisions
            .into_iter()
            .map(move |r| {
                sub = if last == Some(r) { sub + 1 } else { 0 };
                last = Some(r);
                sub
            })
            .collect::<Vec<_>>()
    };
    let before_subs = subs(before.iter().map(|(_, v)| v.mod_revision).collect());
    let change_subs = subs(changes.iter().map(|c| c.revision).collect());
    let before = before
        .into_iter()
        .zip(before_subs)
        .map(|((key, v), sub)| (rev_bytes(v.mod_revision, sub, false), kv_record(key, v)));
    let history = changes
        .iter()
        .zip(change_subs)
        .map(|(c, sub)| match &c.value {
            Some(v) => (rev_bytes(c.revision, sub, false), kv_record(&c.key, v)),
            None => (rev_bytes(c.revision, sub, true), tombstone(&c.key)),
        });
    Box::new(before.chain(history))
}

fn tombstone(key: &Bytes) -> Vec<u8> {
    mvccpb::KeyValue {
        key: key.clone(),
        ..Default::default()
    }
    .encode_to_vec()
}

/// [`key_records`] gathered and put in order as a whole (for a state whose compacted part
/// and history would overlap).
fn key_bucket(sm: &StateMachine) -> Vec<(Vec<u8>, Vec<u8>)> {
    let kv = sm.kv();
    let changes = kv.history().changes();
    let mut records: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    // Subs in the order each revision's changes were applied.
    let mut next_sub: HashMap<i64, i64> = HashMap::new();
    let mut sub = |revision: i64| {
        let s = next_sub.entry(revision).or_insert(0);
        *s += 1;
        *s - 1
    };
    let mut first_change: HashMap<&Bytes, &Change> = HashMap::new();
    for c in changes {
        first_change.entry(&c.key).or_insert(c);
        let at = sub(c.revision);
        let record = match &c.value {
            Some(v) => (rev_bytes(c.revision, at, false), kv_record(&c.key, v)),
            None => (
                rev_bytes(c.revision, at, true),
                mvccpb::KeyValue {
                    key: c.key.clone(),
                    ..Default::default()
                }
                .encode_to_vec(),
            ),
        };
        records.insert(record.0, record.1);
    }
    // What compaction kept of the time before the history: each key's value from before
    // its first recorded change (or its current value, if it has none), written at a
    // compacted revision. Keys in order, so the subs given are deterministic.
    let mut keys: BTreeSet<&Bytes> = first_change.keys().copied().collect();
    keys.extend(kv.iter().map(|(k, _)| k));
    for key in keys {
        let before = match first_change.get(key) {
            Some(c) => c.prev.as_ref(),
            None => kv.get(key),
        };
        if let Some(v) = before {
            let at = sub(v.mod_revision);
            records.insert(rev_bytes(v.mod_revision, at, false), kv_record(key, v));
        }
    }
    records.into_iter().collect()
}

fn perm_type(kind: PermKind) -> i32 {
    match kind {
        PermKind::Read => authpb::permission::Type::Read as i32,
        PermKind::Write => authpb::permission::Type::Write as i32,
        PermKind::ReadWrite => authpb::permission::Type::Readwrite as i32,
    }
}

fn alarm_type(kind: AlarmKind) -> i32 {
    match kind {
        AlarmKind::NoSpace => etcdserverpb::AlarmType::Nospace as i32,
        AlarmKind::Corrupt => etcdserverpb::AlarmType::Corrupt as i32,
    }
}

/// CRC-32 of the [`VIEW`] buckets, lengths included (so that moving a byte from a key to
/// its value changes it), fed bucket by bucket in [`VIEW`]'s order.
struct ViewSum(crc32fast::Hasher);

impl ViewSum {
    fn new() -> ViewSum {
        ViewSum(crc32fast::Hasher::new())
    }

    fn bucket(&mut self, name: &[u8]) {
        self.0.update(&(name.len() as u64).to_be_bytes());
        self.0.update(name);
    }

    fn pair(&mut self, k: &[u8], v: &[u8]) {
        self.0.update(&(k.len() as u64).to_be_bytes());
        self.0.update(k);
        self.0.update(&(v.len() as u64).to_be_bytes());
        self.0.update(v);
    }

    fn finish(self) -> u32 {
        self.0.finalize()
    }
}

/// The [`ViewSum`] of `buckets` as read.
fn view_sum(buckets: &Buckets) -> u32 {
    let mut h = ViewSum::new();
    for name in VIEW {
        h.bucket(name);
        for (k, v) in buckets.get(name).map_or(&[][..], |b| &b[..]) {
            h.pair(k, v);
        }
    }
    h.finish()
}

/// Where [`export_to`] puts the buckets, in name order.
trait Sink {
    fn bucket(
        &mut self,
        name: &[u8],
        pairs: &mut dyn Iterator<Item = (Vec<u8>, Vec<u8>)>,
    ) -> std::io::Result<()>;
}

/// Gathering in memory, for the tests that look inside the buckets.
#[cfg(test)]
impl Sink for Buckets {
    fn bucket(
        &mut self,
        name: &[u8],
        pairs: &mut dyn Iterator<Item = (Vec<u8>, Vec<u8>)>,
    ) -> std::io::Result<()> {
        self.insert(name.to_vec(), pairs.collect());
        Ok(())
    }
}

impl<W: std::io::Write + std::io::Seek> Sink for DbWriter<W> {
    fn bucket(
        &mut self,
        name: &[u8],
        pairs: &mut dyn Iterator<Item = (Vec<u8>, Vec<u8>)>,
    ) -> std::io::Result<()> {
        DbWriter::bucket(self, name, pairs)
    }
}

/// The buckets of an etcd 3.4 database holding `sm`, with `members` as the membership, and
/// `image` (oncekv's snapshot file of the same state, without the key space: see
/// [`StateMachine::snapshot_without_keys`]) in the `oncekv` bucket.
#[cfg(test)]
pub fn export(sm: &StateMachine, members: &BTreeMap<NodeId, Member>, image: &[u8]) -> Buckets {
    let mut b = Buckets::new();
    // Gathering into memory does not fail.
    let _ = export_to(&mut b, sm, members, image);
    b
}

/// [`export`] written straight into a database file in `out`: the pairs are made one at a
/// time and written as pages fill, so no copy of the state is gathered in memory.
pub fn export_db<W: std::io::Write + std::io::Seek>(
    sm: &StateMachine,
    members: &BTreeMap<NodeId, Member>,
    image: &[u8],
    out: W,
) -> std::io::Result<W> {
    let mut db = DbWriter::new(out);
    export_to(&mut db, sm, members, image)?;
    db.finish()
}

fn export_to(
    sink: &mut dyn Sink,
    sm: &StateMachine,
    members: &BTreeMap<NodeId, Member>,
    image: &[u8],
) -> std::io::Result<()> {
    let mut sum = ViewSum::new();
    // Bucket names in byte order (bbolt's), the view buckets summed as they go.
    let mut view =
        |sink: &mut dyn Sink, name: &[u8], pairs: &mut dyn Iterator<Item = (Vec<u8>, Vec<u8>)>| {
            sum.bucket(name);
            let mut summed = pairs.inspect(|(k, v)| sum.pair(k, v));
            sink.bucket(name, &mut summed)
        };

    let alarms = sm
        .alarms()
        .map(|(member, kind)| {
            let key = etcdserverpb::AlarmMember {
                member_id: member,
                alarm: alarm_type(kind),
            }
            .encode_to_vec();
            (key, Vec::new())
        })
        .collect::<BTreeMap<_, _>>();
    view(sink, ALARM, &mut alarms.into_iter())?;

    let auth = sm.auth();
    view(
        sink,
        AUTH,
        &mut [
            (b"authEnabled".to_vec(), vec![u8::from(auth.enabled())]),
            (
                b"authRevision".to_vec(),
                auth.revision().to_be_bytes().to_vec(),
            ),
        ]
        .into_iter(),
    )?;
    let roles = auth
        .roles()
        .filter_map(|name| {
            let perms = auth.role(name)?;
            let record = authpb::Role {
                name: Bytes::copy_from_slice(name.as_bytes()),
                key_permission: perms
                    .iter()
                    .map(|p| authpb::Permission {
                        perm_type: perm_type(p.kind),
                        key: p.key.clone(),
                        range_end: p.range_end.clone(),
                    })
                    .collect(),
            };
            Some((name.as_bytes().to_vec(), record.encode_to_vec()))
        })
        .collect::<BTreeMap<_, _>>();
    view(sink, AUTH_ROLES, &mut roles.into_iter())?;
    let users = auth
        .users()
        .filter_map(|name| {
            let user = auth.user(name)?;
            let record = authpb::User {
                name: Bytes::copy_from_slice(name.as_bytes()),
                password: user
                    .password
                    .as_ref()
                    .map_or_else(Bytes::new, |p| Bytes::copy_from_slice(p.as_bytes())),
                roles: user.roles.iter().cloned().collect(),
                options: Some(authpb::UserAddOptions {
                    no_password: user.password.is_none(),
                }),
            };
            Some((name.as_bytes().to_vec(), record.encode_to_vec()))
        })
        .collect::<BTreeMap<_, _>>();
    view(sink, AUTH_USERS, &mut users.into_iter())?;

    sink.bucket(
        CLUSTER,
        &mut std::iter::once((b"clusterVersion".to_vec(), b"3.4.0".to_vec())),
    )?;

    view(sink, KEY, &mut key_records(sm))?;

    let leases = sm
        .leases()
        .iter()
        .map(|(id, l)| {
            let record = LeaseRecord {
                id: *id,
                ttl: l.ttl,
                remaining_ttl: 0,
            };
            ((*id as u64).to_be_bytes().to_vec(), record.encode_to_vec())
        })
        .collect::<BTreeMap<_, _>>();
    view(sink, LEASE, &mut leases.into_iter())?;
    let view_crc = sum.finish();

    let members = members
        .iter()
        .map(|(id, m)| {
            let json = serde_json::json!({
                "id": id,
                "peerURLs": [m.peer_url],
                "name": m.name,
                "clientURLs": if m.client_url.is_empty() { vec![] } else { vec![m.client_url.clone()] },
            });
            (format!("{id:x}").into_bytes(), json.to_string().into_bytes())
        })
        .collect::<BTreeMap<_, _>>();
    sink.bucket(MEMBERS, &mut members.into_iter())?;
    sink.bucket(MEMBERS_REMOVED, &mut std::iter::empty())?;

    let mut meta = vec![(
        b"consistent_index".to_vec(),
        sm.applied_index().to_be_bytes().to_vec(),
    )];
    let compacted = sm.compacted_revision();
    if compacted > 0 {
        // Sorted: "finished..." before "scheduled...", both after "consistent_index".
        meta.push((
            b"finishedCompactRev".to_vec(),
            rev_bytes(compacted, 0, false),
        ));
        meta.push((
            b"scheduledCompactRev".to_vec(),
            rev_bytes(compacted, 0, false),
        ));
    }
    sink.bucket(META, &mut meta.into_iter())?;

    // "etcd-view-crc32" sorts before "state/...".
    let ours = std::iter::once((VIEW_SUM.to_vec(), view_crc.to_be_bytes().to_vec())).chain(
        image.chunks(CHUNK).enumerate().map(|(i, chunk)| {
            let mut k = STATE_PREFIX.to_vec();
            k.extend_from_slice(&(i as u64).to_be_bytes());
            (k, chunk.to_vec())
        }),
    );
    sink.bucket(ONCEKV, &mut ours.into_iter())
}

/// What a database holds, as oncekv takes it.
#[derive(Debug)]
pub enum Contents {
    /// An oncekv copy whose etcd buckets are as written: oncekv's snapshot file without
    /// the key space (`image`), and the state built from the etcd buckets, whose key space
    /// and history complete it ([`StateMachine::restore_without_keys`]).
    Oncekv {
        image: Vec<u8>,
        keys: Box<StateMachine>,
    },
    /// An oncekv copy from before the key space was left to the `key` bucket, its etcd
    /// buckets as written: oncekv's whole snapshot file.
    OncekvWhole(Vec<u8>),
    /// A state built from the etcd buckets.
    Etcd(Box<StateMachine>, ImportNotes),
}

/// What a state built from etcd's buckets left out or changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ImportNotes {
    /// The copy had an `oncekv` bucket, but etcd has written since: its sessions are gone.
    pub stale_oncekv_image: bool,
    /// Keys naming a lease the copy does not have (etcd keeps them, unattached): here
    /// they are kept without a lease.
    pub keys_detached: usize,
}

/// The state held by the database `buckets`. Leases get their full TTL from `now_ms`
/// (cluster time), as etcd's new leader gives them; `token_key` signs auth tokens.
pub fn open(buckets: &Buckets, now_ms: u64, token_key: [u8; 32]) -> Result<Contents, String> {
    let ours = buckets.get(ONCEKV);
    if let Some(ours) = ours {
        let recorded = ours
            .iter()
            .find(|(k, _)| k == VIEW_SUM)
            .map(|(_, v)| v.as_slice());
        if recorded == Some(&view_sum(buckets).to_be_bytes()[..]) {
            let chunks = |prefix: &[u8]| {
                let mut image = Vec::new();
                for (k, v) in ours {
                    if k.starts_with(prefix) {
                        image.extend_from_slice(v);
                    }
                }
                image
            };
            let whole = chunks(IMAGE_PREFIX);
            if !whole.is_empty() {
                return Ok(Contents::OncekvWhole(whole));
            }
            let (keys, _) = import(buckets, now_ms, token_key)?;
            return Ok(Contents::Oncekv {
                image: chunks(STATE_PREFIX),
                keys: Box::new(keys),
            });
        }
    }
    let (sm, mut notes) = import(buckets, now_ms, token_key)?;
    notes.stale_oncekv_image = ours.is_some();
    Ok(Contents::Etcd(Box::new(sm), notes))
}

fn bucket<'a>(buckets: &'a Buckets, name: &[u8]) -> &'a [(Vec<u8>, Vec<u8>)] {
    buckets.get(name).map_or(&[][..], |b| &b[..])
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn import(
    buckets: &Buckets,
    now_ms: u64,
    token_key: [u8; 32],
) -> Result<(StateMachine, ImportNotes), String> {
    if !buckets.contains_key(KEY) {
        return Err("the database has no \"key\" bucket: it is not etcd's".into());
    }
    let mut notes = ImportNotes::default();
    let meta_value = |name: &[u8]| {
        bucket(buckets, META)
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    };
    let compacted = match meta_value(b"finishedCompactRev") {
        Some(v) => parse_rev(v)
            .map(|(main, _, _)| main)
            .ok_or("meta bucket: finishedCompactRev is not a revision")?,
        None => 0,
    };
    let applied_index = match meta_value(b"consistent_index") {
        Some(v) => u64::from_be_bytes(
            v.try_into()
                .map_err(|_| "meta bucket: consistent_index is not 8 bytes")?,
        ),
        None => 0,
    };

    let mut leases: BTreeMap<i64, Lease> = BTreeMap::new();
    for (k, v) in bucket(buckets, LEASE) {
        let record = LeaseRecord::decode(v.as_slice())
            .map_err(|e| format!("lease bucket: lease {}: {e}", lossy(k)))?;
        let ttl = record.ttl.max(1);
        leases.insert(
            record.id,
            Lease {
                ttl,
                deadline: now_ms.saturating_add(ttl as u64 * 1000),
                keys: BTreeSet::new(),
            },
        );
    }

    // The key bucket in revision order (bbolt's key order is that order).
    let mut head: BTreeMap<Bytes, Value> = BTreeMap::new();
    let mut changes: Vec<Change> = Vec::new();
    let mut revision = compacted.max(1);
    for (k, v) in bucket(buckets, KEY) {
        let (main, _, tombstone) =
            parse_rev(k).ok_or_else(|| format!("key bucket: {k:?} is not a revision"))?;
        let kv = mvccpb::KeyValue::decode(v.as_slice())
            .map_err(|e| format!("key bucket: revision {main}: {e}"))?;
        if kv.key.is_empty() {
            return Err(format!("key bucket: revision {main} has an empty key"));
        }
        revision = revision.max(main);
        let value = (!tombstone).then(|| {
            let mut lease = kv.lease;
            if lease != 0 && !leases.contains_key(&lease) {
                notes.keys_detached += 1;
                lease = 0;
            }
            Value {
                create_revision: kv.create_revision,
                mod_revision: main,
                version: kv.version,
                value: kv.value.clone(),
                lease,
            }
        });
        let prev = match &value {
            Some(v) => head.insert(kv.key.clone(), v.clone()),
            None => head.remove(&kv.key),
        };
        // Before the compacted revision: only the key space as of then. From it on: the
        // history (a change at the compacted revision itself keeps no earlier value).
        if main >= compacted {
            changes.push(Change {
                revision: main,
                key: kv.key,
                value,
                prev: prev.filter(|_| main > compacted),
            });
        }
    }
    for (key, v) in &head {
        if v.lease != 0
            && let Some(l) = leases.get_mut(&v.lease)
        {
            l.keys.insert(key.clone());
        }
    }

    let auth_value = |name: &[u8]| {
        bucket(buckets, AUTH)
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    };
    let enabled = auth_value(b"authEnabled") == Some(&[1u8][..]);
    let auth_revision = auth_value(b"authRevision")
        .and_then(|v| v.try_into().ok())
        .map_or(0, u64::from_be_bytes);
    let mut users = BTreeMap::new();
    for (k, v) in bucket(buckets, AUTH_USERS) {
        let u = authpb::User::decode(v.as_slice())
            .map_err(|e| format!("authUsers bucket: user {}: {e}", lossy(k)))?;
        let no_password = u.options.is_some_and(|o| o.no_password) || u.password.is_empty();
        users.insert(
            lossy(&u.name),
            oncekv_core::auth::User {
                password: (!no_password).then(|| lossy(&u.password)),
                roles: u.roles.into_iter().collect(),
            },
        );
    }
    let mut roles = BTreeMap::new();
    for (k, v) in bucket(buckets, AUTH_ROLES) {
        let r = authpb::Role::decode(v.as_slice())
            .map_err(|e| format!("authRoles bucket: role {}: {e}", lossy(k)))?;
        let perms = r
            .key_permission
            .into_iter()
            .map(|p| Permission {
                kind: match authpb::permission::Type::try_from(p.perm_type) {
                    Ok(authpb::permission::Type::Read) => PermKind::Read,
                    Ok(authpb::permission::Type::Write) => PermKind::Write,
                    _ => PermKind::ReadWrite,
                },
                key: p.key,
                range_end: p.range_end,
            })
            .collect();
        roles.insert(lossy(&r.name), perms);
    }
    let mut alarms = Vec::new();
    for (k, _) in bucket(buckets, ALARM) {
        let a = etcdserverpb::AlarmMember::decode(k.as_slice())
            .map_err(|e| format!("alarm bucket: {e}"))?;
        match etcdserverpb::AlarmType::try_from(a.alarm) {
            Ok(etcdserverpb::AlarmType::Nospace) => alarms.push((a.member_id, AlarmKind::NoSpace)),
            Ok(etcdserverpb::AlarmType::Corrupt) => alarms.push((a.member_id, AlarmKind::Corrupt)),
            _ => {}
        }
    }

    let sm = StateMachine::from_imported(ImportedState {
        revision,
        compacted,
        kvs: head.into_iter().collect(),
        changes,
        leases: leases.into_iter().collect(),
        alarms,
        auth: AuthStore::from_parts(enabled, auth_revision, users, roles, token_key),
        applied_index,
        cluster_time: now_ms,
    })
    .map_err(|e| format!("the etcd data does not make a consistent state: {e}"))?;
    Ok((sm, notes))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use oncekv_core::auth::AuthCommand;
    use oncekv_core::command::{
        Command, DeleteRangeRequest, KeyRange, LogPayload, Op, PutRequest, RangeRequest, RequestOp,
        TxnRequest,
    };
    use oncekv_core::{Secret, Settings};

    struct Log {
        sm: StateMachine,
        index: u64,
    }

    impl Log {
        fn apply(&mut self, commands: Vec<Command>) {
            self.index += 1;
            let entry = LogPayload {
                cluster_time: 5_000 + self.index,
                commands,
            };
            self.sm.apply(self.index, &entry);
        }

        fn op(&mut self, op: Op) {
            self.apply(vec![Command::Untracked(op)]);
        }
    }

    fn put(key: &str, value: &str) -> PutRequest {
        PutRequest {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: Bytes::copy_from_slice(value.as_bytes()),
            ..PutRequest::default()
        }
    }

    /// Every kind of thing etcd's buckets hold: history with deletes, a transaction's
    /// several changes at one revision, compaction, a lease with keys, users and roles,
    /// an alarm; and a session, which etcd has no place for.
    fn varied() -> StateMachine {
        let mut log = Log {
            sm: StateMachine::new(Settings::default()),
            index: 0,
        };
        log.op(Op::put("a", "1"));
        log.op(Op::put("b", "2"));
        log.op(Op::put("gone", "x"));
        log.op(Op::put("a", "3"));
        log.op(Op::DeleteRange(DeleteRangeRequest {
            range: KeyRange::single("gone"),
            prev_kv: false,
        }));
        log.op(Op::put("c", "before compaction"));
        log.op(Op::Compact { revision: 7 });
        log.op(Op::Txn(TxnRequest {
            compare: vec![],
            success: vec![
                RequestOp::Put(put("t2", "second")),
                RequestOp::Put(put("t1", "first")),
                RequestOp::Put(put("a", "in txn")),
            ],
            failure: vec![],
        }));
        log.op(Op::LeaseGrant { id: 77, ttl: 30 });
        log.op(Op::Put(PutRequest {
            lease: 77,
            ..put("leased", "v")
        }));
        log.op(Op::put("b", "after"));
        log.op(Op::DeleteRange(DeleteRangeRequest {
            range: KeyRange::single("t2"),
            prev_kv: false,
        }));
        for c in [
            AuthCommand::UserAdd {
                name: "root".into(),
                password: Some(
                    "$2b$10$abcdefghijklmnopqrstuuM2mS0xJx1d3f5TqSgq7b0aVvM3lKQ7W".into(),
                ),
            },
            AuthCommand::UserAdd {
                name: "cert-only".into(),
                password: None,
            },
            AuthCommand::RoleAdd { name: "r".into() },
            AuthCommand::RoleGrantPermission {
                role: "r".into(),
                permission: Permission {
                    kind: PermKind::Read,
                    key: Bytes::from_static(b"/p"),
                    range_end: Bytes::from_static(b"/q"),
                },
            },
            AuthCommand::UserGrantRole {
                user: "cert-only".into(),
                role: "r".into(),
            },
        ] {
            log.apply(vec![Command::Auth(c)]);
        }
        log.apply(vec![Command::Alarm {
            activate: true,
            member: 9,
            alarm: AlarmKind::NoSpace,
        }]);
        log.apply(vec![Command::RegisterClient {
            secret: Secret::from_u128(5),
            nonce: 0,
        }]);
        log.sm
    }

    fn read_at(sm: &StateMachine, revision: i64) -> Vec<(Bytes, Value)> {
        let (_, r) = sm
            .range(&RangeRequest {
                range: KeyRange {
                    key: Bytes::from_static(b"\0"),
                    range_end: Bytes::from_static(b"\0"),
                },
                revision,
                ..RangeRequest::default()
            })
            .unwrap();
        r.kvs
            .into_iter()
            .map(|kv| {
                (
                    kv.key.clone(),
                    Value {
                        create_revision: kv.create_revision,
                        mod_revision: kv.mod_revision,
                        version: kv.version,
                        value: kv.value,
                        lease: kv.lease,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn etcds_buckets_hold_the_same_state() {
        let sm = varied();
        assert_eq!(sm.compacted_revision(), 7);
        let image = sm.snapshot_without_keys().unwrap();
        let mut buckets = export(&sm, &BTreeMap::new(), &image);
        // The transaction's three puts share one revision with subs 0, 1, 2.
        let txn_rev = sm.kv().get(b"t1").unwrap().mod_revision;
        let subs: Vec<i64> = bucket(&buckets, KEY)
            .iter()
            .filter_map(|(k, _)| parse_rev(k))
            .filter(|(main, _, _)| *main == txn_rev)
            .map(|(_, sub, _)| sub)
            .collect();
        assert_eq!(subs, vec![0, 1, 2]);
        // "gone" was deleted (at 6) before the compaction (at 7): etcd keeps nothing of it.
        assert!(bucket(&buckets, KEY).iter().all(|(_, v)| {
            mvccpb::KeyValue::decode(v.as_slice()).unwrap().key.as_ref() != b"gone"
        }));

        // Built from etcd's buckets alone (what etcd would hand back).
        buckets.remove(ONCEKV);
        let Contents::Etcd(imported, notes) = open(&buckets, 9_000, [1; 32]).unwrap() else {
            panic!("no oncekv image, yet it was used");
        };
        assert_eq!(notes, ImportNotes::default());
        assert_eq!(imported.revision(), sm.revision());
        assert_eq!(imported.compacted_revision(), 7);
        assert_eq!(imported.applied_index(), sm.applied_index());
        assert_eq!(
            imported.kv().history().changes(),
            sm.kv().history().changes()
        );
        for revision in 7..=sm.revision() {
            assert_eq!(
                read_at(&imported, revision),
                read_at(&sm, revision),
                "at {revision}"
            );
        }
        let lease = imported.leases().get(77).unwrap();
        assert_eq!(lease.ttl, 30);
        assert_eq!(lease.deadline, 9_000 + 30_000);
        assert_eq!(lease.keys, sm.leases().get(77).unwrap().keys);
        let (a, b) = (imported.auth(), sm.auth());
        assert_eq!(a.users().collect::<Vec<_>>(), b.users().collect::<Vec<_>>());
        for user in b.users() {
            assert_eq!(a.user(user), b.user(user), "{user}");
        }
        assert_eq!(a.role("r"), b.role("r"));
        assert_eq!(a.revision(), b.revision());
        assert_eq!(
            imported.alarms().collect::<Vec<_>>(),
            sm.alarms().collect::<Vec<_>>()
        );
        assert_eq!(imported.sessions().len(), 0);
    }

    #[test]
    fn the_streamed_database_is_the_gathered_one() {
        let sm = varied();
        let image = sm.snapshot().unwrap();
        // Record by record, in order, as the whole-bucket reference puts them.
        let streamed: Vec<_> = key_records(&sm).collect();
        assert_eq!(streamed, key_bucket(&sm));
        assert!(streamed.windows(2).all(|w| w[0].0 < w[1].0));
        let mut members = BTreeMap::new();
        members.insert(
            7,
            Member {
                name: "n1".into(),
                peer_url: "http://127.0.0.1:2380".into(),
                client_url: "http://127.0.0.1:2379".into(),
            },
        );
        let gathered = export(&sm, &members, &image);
        let file = export_db(&sm, &members, &image, std::io::Cursor::new(Vec::new()))
            .unwrap()
            .into_inner();
        assert_eq!(file, super::super::bbolt::write(&gathered).unwrap());
        assert_eq!(super::super::bbolt::read(&file).unwrap(), gathered);
    }

    #[test]
    fn the_oncekv_image_is_used_only_while_etcds_buckets_are_as_written() {
        let sm = varied();
        assert_eq!(sm.sessions().len(), 1);
        let image = sm.snapshot_without_keys().unwrap();
        let mut buckets = export(&sm, &BTreeMap::new(), &image);
        match open(&buckets, 0, [0; 32]).unwrap() {
            Contents::Oncekv { image: got, keys } => {
                assert_eq!(got, image);
                // The two together are the state, to the byte, sessions included.
                let back = StateMachine::restore_without_keys(&got, keys.into_kv()).unwrap();
                assert_eq!(back.snapshot().unwrap(), sm.snapshot().unwrap());
            }
            other => panic!("{other:?}"),
        }
        // etcd has since written a revision: its buckets are current, the image is not.
        let next = sm.revision() + 1;
        let kv = mvccpb::KeyValue {
            key: Bytes::from_static(b"written-by-etcd"),
            create_revision: next,
            mod_revision: next,
            version: 1,
            value: Bytes::from_static(b"x"),
            lease: 0,
        };
        let keys = buckets.get_mut(KEY).unwrap();
        keys.push((rev_bytes(next, 0, false), kv.encode_to_vec()));
        match open(&buckets, 0, [0; 32]).unwrap() {
            Contents::Etcd(sm2, notes) => {
                assert!(notes.stale_oncekv_image);
                assert_eq!(sm2.revision(), next);
                assert!(sm2.kv().get(b"written-by-etcd").is_some());
            }
            other => panic!("{other:?}"),
        }
    }

    /// The key space is in the copy once: the `oncekv` bucket holds a small part of what
    /// the `key` bucket does.
    #[test]
    fn a_copy_holds_the_key_space_once() {
        let mut log = Log {
            sm: StateMachine::new(Settings::default()),
            index: 0,
        };
        let value = "v".repeat(1_000);
        for i in 0..500 {
            log.op(Op::put(format!("key-{i:04}"), value.clone()));
        }
        let sm = log.sm;
        let buckets = export(&sm, &BTreeMap::new(), &sm.snapshot_without_keys().unwrap());
        let bytes = |name: &[u8]| -> usize {
            bucket(&buckets, name)
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum()
        };
        assert!(bytes(KEY) > 500_000, "{}", bytes(KEY));
        assert!(
            bytes(ONCEKV) * 50 < bytes(KEY),
            "oncekv {} bytes, key {}",
            bytes(ONCEKV),
            bytes(KEY)
        );
    }

    /// A copy written before the key space was left to the `key` bucket (the whole
    /// snapshot file under `image/`) still opens as that whole file.
    #[test]
    fn an_earlier_copy_with_the_whole_image_opens() {
        let sm = varied();
        let whole = sm.snapshot().unwrap();
        let mut buckets = export(&sm, &BTreeMap::new(), &[]);
        let ours = buckets.get_mut(ONCEKV).unwrap();
        ours.retain(|(k, _)| k == VIEW_SUM);
        for (i, chunk) in whole.chunks(100).enumerate() {
            let mut k = IMAGE_PREFIX.to_vec();
            k.extend_from_slice(&(i as u64).to_be_bytes());
            ours.push((k, chunk.to_vec()));
        }
        match open(&buckets, 0, [0; 32]).unwrap() {
            Contents::OncekvWhole(got) => assert_eq!(got, whole),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bad_etcd_data_is_refused_by_name() {
        let mut buckets = Buckets::new();
        assert!(
            open(&buckets, 0, [0; 32])
                .unwrap_err()
                .contains("no \"key\" bucket")
        );
        buckets.insert(KEY.to_vec(), vec![(b"short".to_vec(), vec![])]);
        assert!(
            open(&buckets, 0, [0; 32])
                .unwrap_err()
                .contains("is not a revision")
        );
        buckets.insert(
            KEY.to_vec(),
            vec![(rev_bytes(2, 0, false), vec![0xff, 0xff, 0xff])],
        );
        assert!(
            open(&buckets, 0, [0; 32])
                .unwrap_err()
                .contains("revision 2")
        );
        // A key naming a lease the copy lacks is kept, unattached, and counted.
        let kv = mvccpb::KeyValue {
            key: Bytes::from_static(b"k"),
            create_revision: 2,
            mod_revision: 2,
            version: 1,
            value: Bytes::new(),
            lease: 5,
        };
        buckets.insert(
            KEY.to_vec(),
            vec![(rev_bytes(2, 0, false), kv.encode_to_vec())],
        );
        match open(&buckets, 0, [0; 32]).unwrap() {
            Contents::Etcd(sm, notes) => {
                assert_eq!(notes.keys_detached, 1);
                assert_eq!(sm.kv().get(b"k").unwrap().lease, 0);
            }
            other => panic!("{other:?}"),
        }
    }
}
