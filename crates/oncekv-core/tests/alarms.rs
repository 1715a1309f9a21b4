//! Alarms in the replicated state: NOSPACE refuses what adds data and lets deletes and
//! compaction through; CORRUPT refuses everything; a refusal through a session is saved
//! like any answer; disarming resumes writes; alarms survive a snapshot.

mod common;

use bytes::Bytes;
use common::{Replica, range, tracked};
use oncekv_core::{
    AlarmKind, Command, DeleteRangeRequest, Op, OpError, Response, Secret, Settings, StateMachine,
    TxnRequest,
};

const SECRET: Secret = Secret([0x5a; 16]);

fn alarm(r: &mut Replica, activate: bool, member: u64, alarm: AlarmKind) {
    let cmd = Command::Alarm {
        activate,
        member,
        alarm,
    };
    assert_eq!(r.one(cmd), Response::Done);
}

fn refused(r: &mut Replica, op: Op) -> OpError {
    match r.untracked(op).result {
        Err(e) => e,
        Ok(resp) => panic!("not refused: {resp:?}"),
    }
}

fn delete(key: &str) -> Op {
    Op::DeleteRange(DeleteRangeRequest {
        range: range(key, ""),
        prev_kv: false,
    })
}

#[test]
fn nospace_refuses_what_adds_data_and_disarming_resumes() {
    let mut r = Replica::new(Settings::default());
    r.ok(Op::put("a", "1"));
    alarm(&mut r, true, 7, AlarmKind::NoSpace);
    assert_eq!(r.sm.alarms().collect::<Vec<_>>(), [(7, AlarmKind::NoSpace)]);

    assert_eq!(refused(&mut r, Op::put("b", "2")), OpError::NoSpace);
    assert_eq!(
        refused(&mut r, Op::LeaseGrant { id: 5, ttl: 10 }),
        OpError::NoSpace
    );
    let txn_put = Op::Txn(TxnRequest {
        compare: vec![],
        success: vec![oncekv_core::RequestOp::Put(oncekv_core::PutRequest {
            key: Bytes::from_static(b"c"),
            ..Default::default()
        })],
        failure: vec![],
    });
    assert_eq!(refused(&mut r, txn_put), OpError::NoSpace);
    assert_eq!(r.value("b"), None);

    // Deletes and compaction free space and are allowed.
    r.ok(delete("a"));
    r.ok(Op::Compact { revision: 2 });
    assert_eq!(r.value("a"), None);

    alarm(&mut r, false, 7, AlarmKind::NoSpace);
    r.ok(Op::put("b", "2"));
    assert_eq!(r.value("b").as_deref(), Some(&b"2"[..]));
}

#[test]
fn a_refusal_through_a_session_is_saved_and_answered_to_the_retry() {
    let mut r = Replica::new(Settings::default());
    let id = r.register(SECRET);
    alarm(&mut r, true, 1, AlarmKind::NoSpace);
    let put = || tracked(id, SECRET, 1, 1, Op::put("k", "v"));
    let first = r.one(put());
    // Disarmed in between: the retry still gets the saved refusal, nothing runs twice.
    alarm(&mut r, false, 1, AlarmKind::NoSpace);
    let retry = r.one(put());
    assert_eq!(first, retry);
    match first {
        Response::Op(Ok(reply)) => assert_eq!(reply.result, Err(OpError::NoSpace)),
        other => panic!("{other:?}"),
    }
    assert_eq!(r.value("k"), None);
}

#[test]
fn corrupt_refuses_everything_until_disarmed() {
    let mut r = Replica::new(Settings::default());
    r.ok(Op::put("a", "1"));
    alarm(&mut r, true, 3, AlarmKind::Corrupt);
    assert_eq!(refused(&mut r, Op::put("a", "2")), OpError::Corrupt);
    assert_eq!(refused(&mut r, delete("a")), OpError::Corrupt);
    assert_eq!(
        refused(&mut r, Op::Compact { revision: 1 }),
        OpError::Corrupt
    );
    alarm(&mut r, false, 3, AlarmKind::Corrupt);
    r.ok(Op::put("a", "2"));
}

#[test]
fn alarms_survive_a_snapshot() {
    let mut r = Replica::new(Settings::default());
    alarm(&mut r, true, 9, AlarmKind::NoSpace);
    alarm(&mut r, true, 4, AlarmKind::Corrupt);
    let restored = StateMachine::restore(&r.snapshot()).expect("restores");
    assert_eq!(
        restored.alarms().collect::<Vec<_>>(),
        [(4, AlarmKind::Corrupt), (9, AlarmKind::NoSpace)]
    );
    assert_eq!(restored.snapshot().expect("encodes"), r.snapshot());
}

// Images written before alarms existed (version 3: the same image without the alarms
// that end version 4) and before auth existed (version 4: without the auth store and
// session owners that end version 5) restore, with no alarm raised and auth off.
#[test]
fn version_3_and_4_images_restore() {
    let mut r = Replica::new(Settings::default());
    r.ok(Op::put("a", "1"));
    let mut image = r.snapshot();
    assert_eq!(&image[..4], b"OKV5");
    let auth_tail = postcard::to_allocvec(&(
        oncekv_core::AuthStore::default(),
        Vec::<(u64, String)>::new(),
    ))
    .expect("encodes");
    assert!(image.ends_with(&auth_tail));
    image.truncate(image.len() - auth_tail.len());
    let mut v4 = image;
    v4[..4].copy_from_slice(b"OKV4");
    let restored = StateMachine::restore(&v4).expect("a version 4 image restores");
    assert!(!restored.auth().enabled());
    assert_eq!(restored.snapshot().expect("encodes"), r.snapshot());
    let mut v3 = v4;
    assert_eq!(v3.pop(), Some(0), "an empty alarm list is one byte");
    v3[..4].copy_from_slice(b"OKV3");
    let restored = StateMachine::restore(&v3).expect("a version 3 image restores");
    assert_eq!(restored.alarms().count(), 0);
    assert_eq!(restored.snapshot().expect("encodes"), r.snapshot());
}
