//! Rule 5 answers a saved response only to the request that produced it: a seq reused for
//! a different request (a client bug) is refused with `SeqReused`, and changes nothing.

mod common;

use common::{Replica, put_with, tracked};
use oncekv_core::{
    DeleteRangeRequest, KeyRange, Op, Response, Secret, SessionError, Settings, TxnRequest,
};

const SECRET: Secret = Secret([0x5e; 16]);

fn delete(key: &'static str) -> Op {
    Op::DeleteRange(DeleteRangeRequest {
        range: KeyRange::single(key),
        prev_kv: false,
    })
}

/// A replica with one session and one lease (7), so that every op below can succeed.
fn replica() -> (Replica, u64) {
    let mut r = Replica::new(Settings::default());
    let client = r.register(SECRET);
    r.ok(Op::LeaseGrant { id: 7, ttl: 60 });
    r.ok(Op::put("k", "old"));
    (r, client)
}

struct Case {
    name: &'static str,
    first: Op,
    reused: Op,
}

fn cases() -> Vec<Case> {
    let case = |name, first, reused| Case {
        name,
        first,
        reused,
    };
    vec![
        case("another key", Op::put("k", "v"), Op::put("j", "v")),
        case("another value", Op::put("k", "v"), Op::put("k", "w")),
        case(
            "another option",
            Op::put("k", "v"),
            put_with("k", "v", |p| p.prev_kv = true),
        ),
        case("put, then delete", Op::put("k", "v"), delete("k")),
        case("delete, then put", delete("k"), Op::put("k", "v")),
        case(
            "put, then lease grant",
            Op::put("k", "v"),
            Op::LeaseGrant { id: 8, ttl: 60 },
        ),
        case(
            "lease revoke, then keep-alive",
            Op::LeaseRevoke { id: 7 },
            Op::LeaseKeepAlive { id: 7 },
        ),
        // A reply that does not pack into the session record is kept in the spill list.
        case(
            "spilled reply, another key",
            put_with("k", "v", |p| p.prev_kv = true),
            put_with("j", "v", |p| p.prev_kv = true),
        ),
        case(
            "txn, then another txn",
            Op::Txn(TxnRequest::default()),
            Op::Txn(TxnRequest {
                success: vec![oncekv_core::RequestOp::Put(oncekv_core::PutRequest {
                    key: "k".into(),
                    value: "v".into(),
                    ..Default::default()
                })],
                ..TxnRequest::default()
            }),
        ),
    ]
}

// Answering the saved reply would hand one request's outcome to another, silently; the
// client must learn that it reused a seq. Each case also leaves an older, pipelined seq
// saved, so the spilled form of the saved replies is covered too.
#[test]
fn reused_seq_with_another_request_is_refused() {
    for pipelined in [false, true] {
        for Case {
            name,
            first,
            reused,
        } in cases()
        {
            let (mut r, client) = replica();
            if pipelined {
                let older = r.one(tracked(client, SECRET, 1, 1, Op::put("p", "1")));
                assert!(matches!(older, Response::Op(Ok(_))), "{name}: {older:?}");
            }
            let original = r.one(tracked(client, SECRET, 2, 1, first));
            assert!(
                matches!(original, Response::Op(Ok(_))),
                "{name}: {original:?}"
            );
            let got = r.one(tracked(client, SECRET, 2, 1, reused));
            assert_eq!(
                got,
                Response::Op(Err(SessionError::SeqReused { seq: 2 })),
                "{name} (pipelined: {pipelined})"
            );
        }
    }
}

// A refusal must be exactly that: the reused request does not run, and the original's
// saved reply stays for the original's retries.
#[test]
fn refused_reuse_changes_neither_store_revision_nor_saved_reply() {
    for Case {
        name,
        first,
        reused,
    } in cases()
    {
        let (mut r, client) = replica();
        let original = tracked(client, SECRET, 1, 1, first);
        let answer = r.one(original.clone());
        let (kv, leases) = (r.sm.kv().clone(), r.sm.leases().clone());
        let revision = r.sm.revision();
        let saved = r.sm.sessions().get(client).map(|s| s.saved());
        let stats = r.sm.stats();

        r.one(tracked(client, SECRET, 1, 1, reused));

        assert_eq!(r.sm.kv(), &kv, "{name}: store changed");
        assert_eq!(r.sm.leases(), &leases, "{name}: leases changed");
        assert_eq!(r.sm.revision(), revision, "{name}: revision moved");
        let saved_after = r.sm.sessions().get(client).map(|s| s.saved());
        assert_eq!(saved_after, saved, "{name}: saved replies changed");
        assert_eq!(r.sm.stats().executed, stats.executed, "{name}");
        assert_eq!(r.sm.stats().rejected, stats.rejected + 1, "{name}");
        // The original's retry is still absorbed with its own reply.
        assert_eq!(r.one(original), answer, "{name}: retry lost its reply");
    }
}

// The retry of the very same request is the point of rule 5: it must still get the saved
// reply, byte for byte, and run nothing.
#[test]
fn identical_retry_still_gets_the_saved_reply() {
    for Case { name, first, .. } in cases() {
        let (mut r, client) = replica();
        let command = tracked(client, SECRET, 1, 1, first);
        let answer = r.one(command.clone());
        let revision = r.sm.revision();
        assert_eq!(r.one(command), answer, "{name}");
        assert_eq!(r.sm.revision(), revision, "{name}");
        assert_eq!(r.sm.stats().duplicates, 1, "{name}");
    }
}

// Clients and operators read this message; it names the seq and says what went wrong.
#[test]
fn seq_reused_error_names_the_seq() {
    assert_eq!(
        SessionError::SeqReused { seq: 12 }.to_string(),
        "oncekv: seq 12 was already used for a different request"
    );
}
