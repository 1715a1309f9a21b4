//! The seven exactly-once rules of `shared/DESIGN.md` section 2, applied through
//! `StateMachine::apply` as the server does.

mod common;

use bytes::Bytes;
use common::{Replica, bytes_of, put_with, range, tracked};
use oncekv_core::{
    Command, Compare, CompareResult, CompareTarget, DeleteRangeRequest, KeyRange, Op, OpError,
    OpReply, OpResponse, PutRequest, PutResponse, RangeRequest, RequestOp, Response, Secret,
    SessionError, Settings, TxnRequest,
};

const SECRET: Secret = Secret([0x5e; 16]);
const WRONG: Secret = Secret([0x5f; 16]);
const WINDOW: u64 = 4;

/// One registered client, and every response it got, by seq.
struct Fixture {
    r: Replica,
    client: u64,
    answers: Vec<(u64, Response)>,
}

impl Fixture {
    fn new() -> Fixture {
        let mut r = Replica::new(Settings {
            window: WINDOW,
            ..Settings::default()
        });
        let client = r.register(SECRET);
        Fixture {
            r,
            client,
            answers: Vec::new(),
        }
    }

    /// The op every row sends: a put whose value names the seq.
    fn put(seq: u64) -> Op {
        Op::put("k", format!("v{seq}"))
    }

    fn cmd(&self, seq: u64, first_incomplete: u64) -> Command {
        tracked(self.client, SECRET, seq, first_incomplete, Self::put(seq))
    }

    /// Sends seq with first_incomplete, remembering the answer.
    fn send(&mut self, seq: u64, first_incomplete: u64) -> Response {
        let response = self.r.one(self.cmd(seq, first_incomplete));
        self.answers.push((seq, response.clone()));
        response
    }

    fn saved_response_of(&self, seq: u64) -> &Response {
        self.answers
            .iter()
            .find(|(s, r)| *s == seq && matches!(r, Response::Op(Ok(_))))
            .map(|(_, r)| r)
            .expect("the setup executed this seq")
    }

    /// `(acked_below, saved seqs)` of the client's session.
    fn session(&self) -> Option<(u64, Vec<u64>)> {
        let s = self.r.sm.sessions().get(self.client)?;
        Some((
            s.acked_below(),
            s.saved().iter().map(|(seq, _)| *seq).collect(),
        ))
    }
}

// --- setups -------------------------------------------------------------------------------

fn fresh(_: &mut Fixture) {}

/// Seqs 1..=4 executed and answered, and the client has said so: acked_below = 5, nothing
/// saved (the ack rides on a retry of seq 4, which rule 4 then refuses as stale).
fn acked_5(f: &mut Fixture) {
    for seq in 1..=4 {
        f.send(seq, seq);
    }
    assert!(matches!(
        f.send(4, 5),
        Response::Op(Err(SessionError::Stale { .. }))
    ));
    assert_eq!(f.session(), Some((5, vec![])));
}

/// acked_below = 5; seqs 5 and 6 executed, their responses saved.
fn saved_5_6(f: &mut Fixture) {
    acked_5(f);
    f.send(5, 5);
    f.send(6, 5);
    assert_eq!(f.session(), Some((5, vec![5, 6])));
}

/// As `saved_5_6`, then seq 7 carried first_incomplete = 7: responses 5 and 6 are gone.
fn acked_7(f: &mut Fixture) {
    saved_5_6(f);
    f.send(7, 7);
    assert_eq!(f.session(), Some((7, vec![7])));
}

fn closed(f: &mut Fixture) {
    let closed = f.r.one(Command::CloseSession {
        client_id: f.client,
        secret: SECRET,
    });
    assert_eq!(closed, Response::Session(Ok(())));
}

// --- the table ----------------------------------------------------------------------------

enum Expect {
    /// The put ran: `Ok` at the next store revision.
    Executes,
    /// Refused by a session rule (the error is built from the client id).
    Refused(fn(u64) -> SessionError),
    /// The saved response of this seq, unchanged.
    SavedResponseOf(u64),
}

enum Change {
    /// Byte-identical to a replica that applied a bare `Tick` at the same index and time.
    Nothing,
    /// The session ends with this `acked_below` and these saved seqs; `executed` says
    /// whether the put changed the store (version of `k` + 1) or left it untouched.
    Session {
        executed: bool,
        acked_below: u64,
        saved: &'static [u64],
    },
}

struct Row {
    name: &'static str,
    setup: fn(&mut Fixture),
    command: fn(&Fixture) -> Command,
    expect: Expect,
    change: Change,
}

fn rows() -> Vec<Row> {
    use Change::{Nothing, Session};
    use Expect::{Executes, Refused, SavedResponseOf};
    vec![
        // Rule 1: nothing may run for a session the replicas do not know.
        Row {
            name: "unknown session is expired",
            setup: fresh,
            command: |f| tracked(f.client + 100, SECRET, 1, 1, Fixture::put(1)),
            expect: Refused(|c| SessionError::SessionExpired { client_id: c + 100 }),
            change: Nothing,
        },
        // Rule 1: a closed session is gone for good, with its saved responses.
        Row {
            name: "closed session is expired",
            setup: closed,
            command: |f| f.cmd(1, 1),
            expect: Refused(|c| SessionError::SessionExpired { client_id: c }),
            change: Nothing,
        },
        // Rule 2 before rule 3: a guessed client id must neither ack nor run anything.
        Row {
            name: "wrong secret is denied and acks nothing",
            setup: saved_5_6,
            command: |f| tracked(f.client, WRONG, 7, 7, Fixture::put(7)),
            expect: Refused(|c| SessionError::PermissionDenied { client_id: c }),
            change: Nothing,
        },
        // Rule 2: a wrong secret must not read a saved response either.
        Row {
            name: "wrong secret on a saved seq reveals nothing",
            setup: saved_5_6,
            command: |f| tracked(f.client, WRONG, 6, 5, Fixture::put(6)),
            expect: Refused(|c| SessionError::PermissionDenied { client_id: c }),
            change: Nothing,
        },
        // Rule 4: seqs start at 1; 0 is below a fresh session's acked_below.
        Row {
            name: "seq 0 is stale",
            setup: fresh,
            command: |f| f.cmd(0, 1),
            expect: Refused(|_| SessionError::Stale {
                seq: 0,
                acked_below: 1,
            }),
            change: Nothing,
        },
        // Rule 4 boundary: the client said it holds this response; running it again would
        // apply it twice.
        Row {
            name: "seq acked_below - 1 is stale",
            setup: acked_5,
            command: |f| f.cmd(4, 5),
            expect: Refused(|_| SessionError::Stale {
                seq: 4,
                acked_below: 5,
            }),
            change: Nothing,
        },
        // Rule 7 boundary: the lowest seq the client may still need runs.
        Row {
            name: "seq acked_below executes",
            setup: acked_5,
            command: |f| f.cmd(5, 5),
            expect: Executes,
            change: Session {
                executed: true,
                acked_below: 5,
                saved: &[5],
            },
        },
        // Rule 7 on a fresh session: the very first request runs.
        Row {
            name: "first seq of a fresh session executes",
            setup: fresh,
            command: |f| f.cmd(1, 1),
            expect: Executes,
            change: Session {
                executed: true,
                acked_below: 1,
                saved: &[1],
            },
        },
        // Rule 6 boundary: the last seq inside the window runs.
        Row {
            name: "seq acked_below + window - 1 executes",
            setup: acked_5,
            command: |f| f.cmd(5 + WINDOW - 1, 5),
            expect: Executes,
            change: Session {
                executed: true,
                acked_below: 5,
                saved: &[8],
            },
        },
        // Rule 6 boundary: one past the window is refused, so memory stays bounded.
        Row {
            name: "seq acked_below + window is refused",
            setup: acked_5,
            command: |f| f.cmd(5 + WINDOW, 5),
            expect: Refused(|_| SessionError::WindowExceeded { seq: 9, limit: 8 }),
            change: Nothing,
        },
        // Rule 3 before rule 6: the command's own first_incomplete slides the window.
        Row {
            name: "first_incomplete in the same command slides the window",
            setup: acked_5,
            command: |f| f.cmd(5 + WINDOW, 6),
            expect: Executes,
            change: Session {
                executed: true,
                acked_below: 6,
                saved: &[9],
            },
        },
        // Rules 3 + 6: the slid window has its own edge; rule 3's ack still takes effect.
        Row {
            name: "one past the slid window is refused",
            setup: acked_5,
            command: |f| f.cmd(6 + WINDOW, 6),
            expect: Refused(|_| SessionError::WindowExceeded { seq: 10, limit: 9 }),
            change: Session {
                executed: false,
                acked_below: 6,
                saved: &[],
            },
        },
        // Rules 3 + 5: an ack that leaves a saved response keeps its duplicate answer.
        Row {
            name: "duplicate of the seq first_incomplete names returns the saved response",
            setup: saved_5_6,
            command: |f| f.cmd(6, 6),
            expect: SavedResponseOf(6),
            change: Session {
                executed: false,
                acked_below: 6,
                saved: &[6],
            },
        },
        // Rule 5: a retry after a lost reply gets the first answer, and runs nothing.
        Row {
            name: "duplicate returns the saved response",
            setup: saved_5_6,
            command: |f| f.cmd(6, 5),
            expect: SavedResponseOf(6),
            change: Nothing,
        },
        // Rule 5: a saved answer goes only to the request that produced it; another op
        // under the same seq is a client bug, refused rather than answered wrongly.
        Row {
            name: "same seq with a different op is refused",
            setup: saved_5_6,
            command: |f| tracked(f.client, SECRET, 5, 5, Op::put("other", "x")),
            expect: Refused(|_| SessionError::SeqReused { seq: 5 }),
            change: Nothing,
        },
        // Rule 3: acked_below only grows; an old first_incomplete cannot resurrect anything.
        Row {
            name: "lower first_incomplete does not move acked_below back",
            setup: saved_5_6,
            command: |f| f.cmd(6, 1),
            expect: SavedResponseOf(6),
            change: Nothing,
        },
        // Rule 3: responses the client acknowledged are dropped (bounded memory).
        Row {
            name: "first_incomplete advancing drops saved responses below it",
            setup: saved_5_6,
            command: |f| f.cmd(7, 7),
            expect: Executes,
            change: Session {
                executed: true,
                acked_below: 7,
                saved: &[7],
            },
        },
        // Rules 3 + 4: once dropped, a retry must not run again; it is stale.
        Row {
            name: "retry of a dropped seq is stale",
            setup: acked_7,
            command: |f| f.cmd(6, 6),
            expect: Refused(|_| SessionError::Stale {
                seq: 6,
                acked_below: 7,
            }),
            change: Nothing,
        },
        // Rule 3 applies even when the command itself is then refused.
        Row {
            name: "ack carried by a stale command still drops responses",
            setup: saved_5_6,
            command: |f| f.cmd(5, 7),
            expect: Refused(|_| SessionError::Stale {
                seq: 5,
                acked_below: 7,
            }),
            change: Session {
                executed: false,
                acked_below: 7,
                saved: &[],
            },
        },
    ]
}

// Every exactly-once rule and each of its boundaries, one row each, so a change to any
// rule shows up as the row it breaks.
#[test]
fn exactly_once_rules_and_their_boundaries() {
    for row in rows() {
        let mut f = Fixture::new();
        (row.setup)(&mut f);
        let before = f.r.clone();
        let command = (row.command)(&f);
        let time = f.r.time + 10;
        let response = f.r.one_at(time, command);

        let name = row.name;
        match &row.expect {
            Expect::Executes => {
                let want = Response::Op(Ok(OpReply {
                    revision: before.sm.revision() + 1,
                    result: Ok(OpResponse::Put(PutResponse { prev_kv: None })),
                }));
                assert_eq!(response, want, "{name}");
            }
            Expect::Refused(err) => {
                assert_eq!(response, Response::Op(Err(err(f.client))), "{name}");
            }
            Expect::SavedResponseOf(seq) => {
                let saved = f.saved_response_of(*seq);
                assert_eq!(bytes_of(&response), bytes_of(saved), "{name}");
            }
        }

        let mut twin = before.clone();
        twin.tick_at(time);
        match row.change {
            Change::Nothing => {
                assert_eq!(f.r.snapshot(), twin.snapshot(), "{name}: state changed");
            }
            Change::Session {
                executed,
                acked_below,
                saved,
            } => {
                assert_eq!(
                    f.session(),
                    Some((acked_below, saved.to_vec())),
                    "{name}: session"
                );
                if executed {
                    let v = |r: &Replica| r.version("k").unwrap_or(0);
                    assert_eq!(v(&f.r), v(&before) + 1, "{name}: version of k");
                    assert_eq!(f.r.sm.revision(), before.sm.revision() + 1, "{name}");
                } else {
                    assert_eq!(f.r.sm.kv(), twin.sm.kv(), "{name}: store changed");
                    assert_eq!(f.r.sm.leases(), twin.sm.leases(), "{name}: leases");
                }
            }
        }
    }
}

// --- duplicates of every mutating command -------------------------------------------------

const LEASE_A: i64 = 7;
const LEASE_B: i64 = 9;

/// A store with keys a..d, `a` on lease 7 and `d` on lease 9, and one session.
fn base() -> (Replica, u64) {
    let mut r = Replica::new(Settings::default());
    let client = r.register(SECRET);
    for (id, ttl) in [(LEASE_A, 60), (LEASE_B, 60)] {
        r.ok(Op::LeaseGrant { id, ttl });
    }
    r.ok(put_with("a", "1", |p| p.lease = LEASE_A));
    r.ok(Op::put("b", "2"));
    r.ok(Op::put("c", "3"));
    r.ok(put_with("d", "4", |p| p.lease = LEASE_B));
    (r, client)
}

fn delete(range: KeyRange, prev_kv: bool) -> DeleteRangeRequest {
    DeleteRangeRequest { range, prev_kv }
}

struct DupCase {
    name: &'static str,
    op: Op,
    /// Applied (untracked) between the first try and the retry, on every replica; chosen so
    /// that running the op again would answer or change something different.
    between: Option<Op>,
}

fn dup_cases() -> Vec<DupCase> {
    let txn = TxnRequest {
        compare: vec![Compare {
            result: CompareResult::Equal,
            target: CompareTarget::Version(1),
            range: KeyRange::single("a"),
        }],
        success: vec![
            RequestOp::Put(PutRequest {
                key: Bytes::from_static(b"a"),
                value: Bytes::from_static(b"txn"),
                prev_kv: true,
                ..PutRequest::default()
            }),
            RequestOp::DeleteRange(delete(KeyRange::single("c"), true)),
            RequestOp::Range(RangeRequest {
                range: range("\0", "\0"),
                ..RangeRequest::default()
            }),
        ],
        failure: vec![RequestOp::Put(PutRequest {
            key: Bytes::from_static(b"z"),
            value: Bytes::from_static(b"failed"),
            ..PutRequest::default()
        })],
    };
    vec![
        DupCase {
            name: "put",
            op: put_with("a", "new", |p| p.prev_kv = true),
            between: None,
        },
        DupCase {
            name: "put refused for an unknown lease, retried once the lease exists",
            op: put_with("e", "5", |p| p.lease = 404),
            between: Some(Op::LeaseGrant { id: 404, ttl: 60 }),
        },
        DupCase {
            name: "delete range",
            op: Op::DeleteRange(delete(range("b", "d"), true)),
            between: None,
        },
        DupCase {
            name: "txn",
            op: Op::Txn(txn),
            between: None,
        },
        DupCase {
            name: "lease grant with an explicit id",
            op: Op::LeaseGrant { id: 42, ttl: 5 },
            between: None,
        },
        DupCase {
            name: "lease grant with id 0",
            op: Op::LeaseGrant { id: 0, ttl: 5 },
            between: None,
        },
        DupCase {
            name: "lease grant of an existing id, retried once the id is free",
            op: Op::LeaseGrant {
                id: LEASE_A,
                ttl: 5,
            },
            between: Some(Op::LeaseRevoke { id: LEASE_A }),
        },
        DupCase {
            name: "lease revoke",
            op: Op::LeaseRevoke { id: LEASE_B },
            between: None,
        },
        DupCase {
            name: "lease keep-alive",
            op: Op::LeaseKeepAlive { id: LEASE_A },
            between: None,
        },
    ]
}

// A retry of any mutating command (the reply was lost) must answer byte-for-byte what the
// first try answered and change nothing, whatever happened in between; each case is built so
// that running the op a second time would be visible.
#[test]
fn duplicate_of_every_mutating_command_is_absorbed_byte_for_byte() {
    for case in dup_cases() {
        let name = case.name;
        let (mut r, client) = base();
        let cmd = tracked(client, SECRET, 1, 1, case.op.clone());
        let first = r.one_at(2_000, cmd.clone());
        assert!(matches!(first, Response::Op(Ok(_))), "{name}: {first:?}");
        if let Some(op) = case.between.clone() {
            r.time = 2_500;
            r.ok(op);
        }

        let mut twin = r.clone();
        twin.tick_at(3_000);
        let mut rerun = r.clone();
        let rerun_response = rerun.one_at(3_000, Command::Untracked(case.op.clone()));
        // Without this the case could not catch a second execution.
        assert!(
            bytes_of(&rerun_response) != bytes_of(&first) || rerun.snapshot() != twin.snapshot(),
            "{name}: running the op again would look the same; the case proves nothing"
        );

        let retry = r.one_at(3_000, cmd);
        assert_eq!(bytes_of(&retry), bytes_of(&first), "{name}: response");
        assert_eq!(r.snapshot(), twin.snapshot(), "{name}: state");
        assert_eq!(r.sm.stats().duplicates, 1, "{name}");
    }
}

// etcd's "lease already exists" on a retried grant is the classic non-idempotent failure:
// through a session, a grant that succeeded succeeds again on retry.
#[test]
fn retried_lease_grant_that_succeeded_succeeds_again() {
    let mut r = Replica::new(Settings::default());
    let client = r.register(SECRET);
    let grant = tracked(client, SECRET, 1, 1, Op::LeaseGrant { id: 42, ttl: 5 });
    let first = r.one(grant.clone());
    let retry = r.one(grant);
    let granted = Response::Op(Ok(OpReply {
        revision: 1,
        result: Ok(OpResponse::LeaseGrant { id: 42, ttl: 5 }),
    }));
    assert_eq!(first, granted);
    assert_eq!(retry, granted);
    // Untracked (etcd behaviour), the same retry fails.
    let again = r.untracked(Op::LeaseGrant { id: 42, ttl: 5 });
    assert_eq!(again.result, Err(OpError::LeaseAlreadyExists));
}

// A failed non-idempotent op, retried, must fail the same way even after the cause went
// away: otherwise the client would see "failed" and later find it applied.
#[test]
fn retried_lease_grant_that_failed_fails_the_same_way() {
    let mut r = Replica::new(Settings::default());
    let client = r.register(SECRET);
    r.ok(Op::LeaseGrant { id: 42, ttl: 60 });
    let grant = tracked(client, SECRET, 1, 1, Op::LeaseGrant { id: 42, ttl: 5 });
    let first = r.one(grant.clone());
    assert!(matches!(
        &first,
        Response::Op(Ok(OpReply {
            result: Err(OpError::LeaseAlreadyExists),
            ..
        }))
    ));
    r.ok(Op::LeaseRevoke { id: 42 });
    let retry = r.one(grant);
    assert_eq!(retry, first);
    assert!(
        r.sm.leases().get(42).is_none(),
        "the retry granted the lease"
    );
}

// A batched entry may carry a request and its retry side by side (the leader proposed both
// before either applied); the second must still be absorbed.
#[test]
fn duplicate_in_the_same_entry_is_absorbed() {
    let mut r = Replica::new(Settings::default());
    let client = r.register(SECRET);
    let put = tracked(client, SECRET, 1, 1, Op::put("k", "v"));
    let responses = r.entry_at(2_000, vec![put.clone(), put]);
    assert_eq!(responses[0], responses[1]);
    assert_eq!(r.version("k"), Some(1));
    assert_eq!(r.sm.stats().executed, 1);
    assert_eq!(r.sm.stats().duplicates, 1);
}

// A tracked put finds its key in the store before the session rules decide (so the two
// memory lookups overlap); a put they refuse must leave the store exactly as it was, for a
// key that exists and for one that does not.
#[test]
fn put_refused_by_the_session_rules_leaves_the_store_unchanged() {
    for key in ["k", "new"] {
        let mut r = Replica::new(Settings {
            window: WINDOW,
            ..Settings::default()
        });
        let client = r.register(SECRET);
        r.ok(Op::put("k", "v"));
        let acked = tracked(client, SECRET, 3, 3, Op::put("other", "x"));
        assert!(matches!(r.one(acked), Response::Op(Ok(_))));
        let before = r.sm.kv().clone();
        let refused = [
            tracked(client, WRONG, 4, 3, Op::put(key, "wrong secret")),
            tracked(client + 1, SECRET, 4, 3, Op::put(key, "no such session")),
            tracked(client, SECRET, 2, 3, Op::put(key, "stale")),
            tracked(
                client,
                SECRET,
                3 + WINDOW,
                3,
                Op::put(key, "past the window"),
            ),
        ];
        for command in refused {
            let response = r.one(command.clone());
            assert!(
                matches!(response, Response::Op(Err(_))),
                "{key}: {command:?} answered {response:?}"
            );
            assert_eq!(r.sm.kv(), &before, "{key}: {command:?} changed the store");
        }
        // The same slot path executes once the request is admitted.
        let admitted = r.one(tracked(client, SECRET, 4, 3, Op::put(key, "admitted")));
        assert!(matches!(admitted, Response::Op(Ok(_))), "{admitted:?}");
        assert_eq!(r.value(key), Some(Bytes::from_static(b"admitted")));
        assert_eq!(r.sm.kv().revision(), before.revision() + 1);
    }
}

// N puts through sessions leave version N whatever the retries (DESIGN.md section 4): the
// user-visible form of exactly-once.
#[test]
fn retried_puts_leave_version_equal_to_the_number_of_requests() {
    let mut r = Replica::new(Settings::default());
    let client = r.register(SECRET);
    for seq in 1..=20u64 {
        let put = tracked(client, SECRET, seq, seq, Op::put("k", format!("{seq}")));
        for _ in 0..=(seq % 3) {
            r.one(put.clone());
        }
    }
    assert_eq!(r.version("k"), Some(20));
}

// The session commands check the secret too: a guessed id cannot keep someone's session
// alive or close it.
#[test]
fn keep_alive_and_close_need_the_secret() {
    let mut r = Replica::new(Settings::default());
    let client = r.register(SECRET);
    let denied = Response::Session(Err(SessionError::PermissionDenied { client_id: client }));
    let keep_alive = Command::KeepAlive {
        client_id: client,
        secret: WRONG,
    };
    assert_eq!(r.one(keep_alive), denied);
    let close = Command::CloseSession {
        client_id: client,
        secret: WRONG,
    };
    assert_eq!(r.one(close), denied);
    assert!(r.sm.sessions().get(client).is_some());
    let unknown = Command::KeepAlive {
        client_id: client + 1,
        secret: SECRET,
    };
    assert_eq!(
        r.one(unknown),
        Response::Session(Err(SessionError::SessionExpired {
            client_id: client + 1
        }))
    );
}

// The client id is the registering entry's log index, so every replica names it alike;
// a second registration in one entry would need the same id and is refused.
#[test]
fn registration_takes_the_entry_index_and_only_first_in_entry() {
    let mut r = Replica::new(Settings::default());
    r.tick_at(1_000);
    let responses = r.entry_at(
        1_000,
        vec![
            Command::RegisterClient {
                secret: SECRET,
                nonce: 0,
            },
            Command::RegisterClient {
                secret: WRONG,
                nonce: 0,
            },
        ],
    );
    assert_eq!(
        responses[0],
        Response::Registered {
            client_id: 2,
            secret: SECRET,
            settings: Settings::default()
        }
    );
    assert_eq!(responses[1], Response::Rejected);
    assert_eq!(r.sm.sessions().len(), 1);
}
