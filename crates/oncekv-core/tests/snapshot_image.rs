//! The snapshot image: its bytes are a replicated format (a follower installs what the
//! leader built, a restarted node reads what it wrote before an upgrade), so they must not
//! depend on how a session happens to hold its saved responses in memory.

use bytes::Bytes;
use oncekv_core::{
    Command, DeleteRangeRequest, KeyRange, LogPayload, Op, PutRequest, Response, Secret, Settings,
    StateMachine, Tracked,
};

struct Log {
    sm: StateMachine,
    index: u64,
}

impl Log {
    fn new() -> Log {
        Log {
            sm: StateMachine::new(Settings::default()),
            index: 0,
        }
    }

    fn apply(&mut self, commands: Vec<Command>) -> Vec<Response> {
        self.index += 1;
        let entry = LogPayload {
            cluster_time: 1_000 + self.index,
            commands,
        };
        self.sm.apply(self.index, &entry)
    }

    /// Registers with `nonce` (0: none); the session's client id.
    fn register(&mut self, secret: u128, nonce: u128) -> u64 {
        match self.apply(vec![Command::RegisterClient {
            secret: Secret::from_u128(secret),
            nonce,
        }])[..]
        {
            [Response::Registered { client_id, .. }] => client_id,
            ref other => panic!("register answered {other:?}"),
        }
    }

    fn tracked(&mut self, client_id: u64, secret: u128, seq: u64, first_incomplete: u64, op: Op) {
        self.apply(vec![Command::Tracked(Tracked::new(
            client_id,
            Secret::from_u128(secret),
            seq,
            first_incomplete,
            op,
        ))]);
    }
}

fn put_prev(key: &'static str, value: &'static str) -> Op {
    Op::Put(PutRequest {
        key: Bytes::from_static(key.as_bytes()),
        value: Bytes::from_static(value.as_bytes()),
        prev_kv: true,
        ..PutRequest::default()
    })
}

fn delete(key: &'static str) -> Op {
    Op::DeleteRange(DeleteRangeRequest {
        range: KeyRange::single(key),
        prev_kv: false,
    })
}

/// A state whose sessions hold every kind of saved response: small ones (plain put,
/// refusal, delete, lease revoke), large ones (prev_kv, lease grant), several per session
/// saved out of seq order, and sessions with nothing saved; some registered with a nonce.
fn varied_state() -> StateMachine {
    let mut log = Log::new();
    let a = log.register(0xa, NONCE_A);
    let b = log.register(0xb, 0);
    let _idle = log.register(0xc, NONCE_IDLE);
    // a: sequential, one saved response at a time.
    log.tracked(a, 0xa, 1, 1, Op::put("x", "1"));
    log.tracked(a, 0xa, 2, 2, put_prev("x", "2"));
    log.tracked(a, 0xa, 3, 3, Op::put("", "refused: empty key"));
    // b: pipelined, seqs saved out of order, mixing small and large replies.
    log.tracked(b, 0xb, 3, 1, Op::LeaseGrant { id: 7, ttl: 60 });
    log.tracked(b, 0xb, 1, 1, Op::put("y", "1"));
    log.tracked(b, 0xb, 5, 1, delete("y"));
    log.tracked(b, 0xb, 2, 1, put_prev("y", "2"));
    log.tracked(b, 0xb, 4, 1, Op::LeaseRevoke { id: 7 });
    log.tracked(b, 0xb, 6, 2, delete("nothing"));
    // History: compacted at 5, then x (last written at 3) written again.
    log.tracked(a, 0xa, 4, 4, Op::Compact { revision: 5 });
    log.tracked(a, 0xa, 5, 5, Op::put("x", "3"));
    log.sm
}

/// The image bytes are pinned: replicas must agree on state hashes and read each other's
/// snapshots, whatever the in-memory layout of their sessions, so a change to the format
/// must be deliberate (and change the image's version, `MAGIC` in `src/snapshot.rs`).
#[test]
fn snapshot_bytes_are_pinned() {
    let sm = varied_state();
    sm.validate().expect("valid");
    let saved = |id: u64| -> Vec<u64> {
        let s = sm.sessions().get(id).expect("live");
        s.saved().iter().map(|(seq, _)| *seq).collect()
    };
    assert_eq!(saved(1), [5]);
    assert_eq!(sm.compacted_revision(), 5);
    assert_eq!(saved(2), [2, 3, 4, 5, 6]);
    assert_eq!(saved(3), [0u64; 0]);
    assert_eq!(sm.state_hash(), GOLDEN_STATE_HASH, "{:#x}", sm.state_hash());
}

const NONCE_A: u128 = 0x0a0a_0a0a_0a0a_0a0a_0a0a_0a0a_0a0a_0a0a;
const NONCE_IDLE: u128 = u128::MAX;

const GOLDEN_STATE_HASH: u64 = 0xf114_79c5_3423_e9a1;

/// Restoring gives an equal state that snapshots to the same bytes, even though the
/// restored sessions lay out their saved responses from scratch.
#[test]
fn restore_then_snapshot_gives_the_same_bytes() {
    let sm = varied_state();
    let image = sm.snapshot().expect("encodes");
    let restored = StateMachine::restore(&image).expect("decodes");
    assert_eq!(restored.snapshot().expect("encodes"), image);
    for ((id, s), (rid, r)) in sm
        .sessions()
        .sorted()
        .into_iter()
        .zip(restored.sessions().sorted())
    {
        assert_eq!((id, s), (rid, r));
    }
}

/// The image without keys (what a copy keeps beside etcd's key bucket) with the key space
/// put back is the whole state again, to the byte; on its own it is never taken for a
/// state with no keys, and a key space from another revision is refused.
#[test]
fn an_image_without_keys_restores_only_with_its_key_space() {
    let sm = varied_state();
    let keyless = sm.snapshot_without_keys().expect("encodes");
    let whole = sm.snapshot().expect("encodes");
    assert!(keyless.len() < whole.len());
    let err = StateMachine::restore(&keyless).expect_err("refused alone");
    assert!(err.to_string().contains("without its key space"), "{err}");
    assert!(StateMachine::restore_without_keys(&whole, sm.kv().clone()).is_err());

    let back = StateMachine::restore_without_keys(&keyless, sm.kv().clone()).expect("decodes");
    assert_eq!(back.snapshot().expect("encodes"), whole);

    let mut later = Log::new();
    later.sm = StateMachine::restore(&whole).expect("decodes");
    later.index = sm.applied_index();
    later.apply(vec![Command::Untracked(Op::put("z", "after the copy"))]);
    let err = StateMachine::restore_without_keys(&keyless, later.sm.into_kv())
        .expect_err("a key space of another revision");
    assert!(err.to_string().contains("revision"), "{err}");
}

/// Dedup and idempotent registration must survive compaction and failover: a replica
/// restored from a snapshot answers a retried registration with the same session, refuses
/// a reused seq and absorbs a true duplicate exactly as the original does.
#[test]
fn restore_keeps_registration_nonces_and_request_fingerprints() {
    let original = varied_state();
    let mut log = Log::new();
    log.sm = StateMachine::restore(&original.snapshot().expect("encodes")).expect("decodes");
    log.index = original.applied_index();
    let mut twin = Log::new();
    twin.sm = original;
    twin.index = log.index;
    for l in [&mut log, &mut twin] {
        // Retried registrations (a fresh secret drawn by the leader each time).
        let sessions = l.sm.sessions().len();
        assert_eq!(l.register(0xdead, NONCE_A), 1);
        assert_eq!(l.register(0xbeef, NONCE_IDLE), 3);
        assert_eq!(l.sm.sessions().len(), sessions);
        // Session 2 saved seq 5 for `delete("y")`: another request under it is refused,
        // the same request gets the saved reply.
        let before =
            l.sm.sessions()
                .get(2)
                .and_then(|s| s.saved_reply(5))
                .map(|r| (r.fingerprint(), r.to_reply()));
        assert_eq!(
            before.as_ref().map(|(f, _)| *f),
            Some(delete("y").fingerprint())
        );
        let reused = l.apply(vec![Command::Tracked(Tracked::new(
            2,
            Secret::from_u128(0xb),
            5,
            2,
            delete("z"),
        ))]);
        assert_eq!(
            reused,
            [Response::Op(Err(oncekv_core::SessionError::SeqReused {
                seq: 5
            }))]
        );
        let retried = l.apply(vec![Command::Tracked(Tracked::new(
            2,
            Secret::from_u128(0xb),
            5,
            2,
            delete("y"),
        ))]);
        assert_eq!(retried, [Response::Op(Ok(before.expect("saved").1))]);
    }
    assert_eq!(
        log.sm.snapshot().expect("encodes"),
        twin.sm.snapshot().expect("encodes")
    );
}
