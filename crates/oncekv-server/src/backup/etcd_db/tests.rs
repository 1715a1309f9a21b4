#![allow(clippy::unwrap_used)]
use std::collections::BTreeMap;

use bytes::Bytes;
use oncekv_core::command::AlarmKind;
use oncekv_core::kv::Value;
use oncekv_core::{PermKind, Permission, StateMachine};
use prost::Message;

use super::layout::{IMAGE_PREFIX, KEY, ONCEKV, VIEW_SUM, bucket, parse_rev, rev_bytes};
use super::read::{Contents, ImportNotes, open};
use super::write::{export, export_db, key_bucket, key_records};
use crate::backup::bbolt::Buckets;
use crate::pb::mvccpb;
use crate::types::Member;
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
            password: Some("$2b$10$abcdefghijklmnopqrstuuM2mS0xJx1d3f5TqSgq7b0aVvM3lKQ7W".into()),
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
    assert!(
        bucket(&buckets, KEY).iter().all(|(_, v)| {
            mvccpb::KeyValue::decode(v.as_slice()).unwrap().key.as_ref() != b"gone"
        })
    );

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
