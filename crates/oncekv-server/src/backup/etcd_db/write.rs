//! oncekv's state written as etcd 3.4's buckets, in name order, into a database file (or,
//! for tests, into memory).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;
use oncekv_core::command::AlarmKind;
use oncekv_core::history::Change;
use oncekv_core::kv::Value;
use oncekv_core::{PermKind, StateMachine};
use prost::Message;

use super::layout::{
    ALARM, AUTH, AUTH_ROLES, AUTH_USERS, CHUNK, CLUSTER, KEY, LEASE, LeaseRecord, MEMBERS,
    MEMBERS_REMOVED, META, ONCEKV, STATE_PREFIX, VIEW_SUM, ViewSum, rev_bytes,
};
#[cfg(test)]
use crate::backup::bbolt::Buckets;
use crate::backup::bbolt::DbWriter;
use crate::pb::{authpb, etcdserverpb, mvccpb};
use crate::types::{Member, NodeId};

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
pub(super) fn key_records(sm: &StateMachine) -> Box<dyn Iterator<Item = (Vec<u8>, Vec<u8>)> + '_> {
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
pub(super) fn key_bucket(sm: &StateMachine) -> Vec<(Vec<u8>, Vec<u8>)> {
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

/// The buckets `export` gathers, written straight into a database file in `out`: the pairs
/// are made one at a time and written as pages fill, so no copy of the state is gathered in
/// memory.
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
