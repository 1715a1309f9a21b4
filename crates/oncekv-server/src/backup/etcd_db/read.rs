//! etcd 3.4's buckets read back as oncekv's state: an oncekv copy's own image when etcd
//! has not written to it since, else the state built from the etcd buckets alone.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use oncekv_core::command::AlarmKind;
use oncekv_core::history::Change;
use oncekv_core::kv::Value;
use oncekv_core::lease::Lease;
use oncekv_core::{AuthStore, ImportedState, PermKind, Permission, StateMachine};
use prost::Message;

use super::layout::{
    ALARM, AUTH, AUTH_ROLES, AUTH_USERS, IMAGE_PREFIX, KEY, LEASE, LeaseRecord, META, ONCEKV,
    STATE_PREFIX, VIEW_SUM, bucket, parse_rev, view_sum,
};
use crate::backup::bbolt::Buckets;
use crate::pb::{authpb, etcdserverpb, mvccpb};

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
