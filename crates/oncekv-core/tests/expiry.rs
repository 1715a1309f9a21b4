//! Sessions and leases expire from the log's cluster time, at exact boundaries, and never
//! from a replica's own clock.

mod common;

use std::time::Duration;

use common::{Replica, put_with, tracked};
use oncekv_core::{
    Command, Expired, LogPayload, Op, OpError, Response, Secret, SessionError, Settings,
    StateMachine,
};

const SECRET: Secret = Secret([0x11; 16]);
const TTL_MS: u64 = 10_000;

fn settings() -> Settings {
    Settings {
        session_ttl_ms: TTL_MS,
        ..Settings::default()
    }
}

/// A replica with one session registered at cluster time `t`.
fn session_at(t: u64) -> (Replica, u64) {
    let mut r = Replica::new(settings());
    r.time = t;
    let client = r.register(SECRET);
    (r, client)
}

/// Ticks at every deadline the state machine reports below `until`, checking `alive` at each,
/// as a leader that only proposes ticks when something is due would.
fn tick_through_deadlines_before(r: &mut Replica, until: u64, alive: impl Fn(&Replica) -> bool) {
    let mut previous = None;
    while let Some(d) = r.sm.next_deadline().filter(|d| *d < until) {
        // A deadline that does not move after its tick would have the leader tick forever.
        assert!(previous < Some(d), "no progress: deadline {d} again");
        assert!(d >= r.sm.cluster_time(), "deadline {d} in the past");
        r.tick_at(d);
        assert!(alive(r), "expired early at {d} (boundary {until})");
        previous = Some(d);
    }
}

// The boundary is `last_active + ttl < cluster_time`: off by one either way, replicas
// expire sessions a client still counts on, or keep ones the docs say are gone.
#[test]
fn session_survives_at_last_active_plus_ttl_and_expires_one_ms_later() {
    let t = 5_000;
    let (mut r, client) = session_at(t);
    assert_eq!(r.sm.next_deadline(), Some(t + TTL_MS + 1));
    r.tick_at(t + TTL_MS);
    assert!(r.sm.sessions().get(client).is_some(), "gone at t + ttl");

    r.sm.record_expiries(true);
    let put = tracked(client, SECRET, 1, 1, Op::put("k", "v"));
    let response = r.one_at(t + TTL_MS + 1, put);
    assert_eq!(
        response,
        Response::Op(Err(SessionError::SessionExpired { client_id: client }))
    );
    assert_eq!(r.version("k"), None, "the op ran on an expired session");
    assert_eq!(
        r.sm.take_expired(),
        vec![Expired::Session {
            index: r.index,
            client_id: client
        }]
    );
    assert_eq!(r.sm.next_deadline(), None);
}

// An executed command refreshes the session: a busy client never expires.
#[test]
fn tracked_command_at_the_boundary_refreshes_the_session() {
    let t = 5_000;
    let (mut r, client) = session_at(t);
    let put = |seq| tracked(client, SECRET, seq, seq, Op::put("k", "v"));
    assert!(matches!(r.one_at(t + TTL_MS, put(1)), Response::Op(Ok(_))));
    let last_active = r.sm.sessions().get(client).map(|s| s.last_active());
    assert_eq!(last_active, Some(t + TTL_MS));
    assert!(matches!(
        r.one_at(t + 2 * TTL_MS, put(2)),
        Response::Op(Ok(_))
    ));
    r.tick_at(t + 3 * TTL_MS + 1);
    assert!(r.sm.sessions().get(client).is_none());
}

// Keep-alives are how an idle client holds its session (and its saved responses); the
// boundary must move with them, and next_deadline must lead the leader's ticks to it.
#[test]
fn session_keep_alive_moves_the_boundary_and_next_deadline_finds_it() {
    let t = 5_000;
    let (mut r, client) = session_at(t);
    let keep_alive_at = t + 4_000;
    let keep_alive = Command::KeepAlive {
        client_id: client,
        secret: SECRET,
    };
    assert_eq!(
        r.one_at(keep_alive_at, keep_alive),
        Response::Session(Ok(()))
    );
    let boundary = keep_alive_at + TTL_MS + 1;
    assert!(r.sm.next_deadline().is_some_and(|d| d <= boundary));

    tick_through_deadlines_before(&mut r, boundary, |r| r.sm.sessions().get(client).is_some());
    assert_eq!(r.sm.next_deadline(), Some(boundary));
    r.tick_at(boundary - 1);
    assert!(r.sm.sessions().get(client).is_some());
    r.tick_at(boundary);
    assert!(r.sm.sessions().get(client).is_none());
}

// etcd: a lease expires when its remaining TTL reaches zero, and its keys go with it in one
// revision. Exact to the millisecond so that every replica deletes at the same index.
#[test]
fn lease_survives_until_ttl_elapses_and_its_keys_go_in_one_revision() {
    let mut r = Replica::new(settings());
    let t = 1_000;
    r.time = t;
    r.ok(Op::LeaseGrant { id: 5, ttl: 3 });
    r.ok(put_with("a", "1", |p| p.lease = 5));
    r.ok(put_with("b", "2", |p| p.lease = 5));
    r.ok(Op::put("c", "3"));
    let deadline = t + 3 * 1_000;
    assert_eq!(r.sm.next_deadline(), Some(deadline));

    r.tick_at(deadline - 1);
    assert!(r.sm.leases().get(5).is_some());
    assert_eq!(r.value("a").as_deref(), Some(&b"1"[..]));
    let revision = r.sm.revision();

    r.sm.record_expiries(true);
    r.tick_at(deadline);
    assert!(r.sm.leases().get(5).is_none());
    assert_eq!((r.version("a"), r.version("b")), (None, None));
    assert_eq!(
        r.version("c"),
        Some(1),
        "a key without the lease was deleted"
    );
    assert_eq!(r.sm.revision(), revision + 1);
    assert_eq!(
        r.sm.take_expired(),
        vec![Expired::Lease {
            index: r.index,
            id: 5
        }]
    );
    assert_eq!(r.sm.next_deadline(), None);
    // The expiry happens before the entry's commands: a keep-alive in it is too late.
    assert_eq!(
        r.untracked(Op::LeaseKeepAlive { id: 5 }).result,
        Err(OpError::LeaseNotFound)
    );
}

// A lease whose keep-alive lands in the entry at its deadline is already gone (expiry runs
// first), one that lands a millisecond earlier is renewed: both sides of the race decided by
// the log, identically on every replica.
#[test]
fn lease_keep_alive_moves_the_boundary_and_next_deadline_finds_it() {
    let mut r = Replica::new(settings());
    r.time = 1_000;
    r.ok(Op::LeaseGrant { id: 5, ttl: 3 });
    r.ok(put_with("a", "1", |p| p.lease = 5));
    r.time = 3_999;
    let renewed = r.ok(Op::LeaseKeepAlive { id: 5 });
    assert_eq!(
        renewed,
        oncekv_core::OpResponse::LeaseKeepAlive { id: 5, ttl: 3 }
    );
    let boundary = 3_999 + 3_000;
    assert!(r.sm.next_deadline().is_some_and(|d| d <= boundary));

    tick_through_deadlines_before(&mut r, boundary, |r| r.sm.leases().get(5).is_some());
    assert_eq!(r.sm.next_deadline(), Some(boundary));
    r.tick_at(boundary - 1);
    assert_eq!(r.version("a"), Some(1));
    r.tick_at(boundary);
    assert!(r.sm.leases().get(5).is_none());
    assert_eq!(r.version("a"), None);
}

// next_deadline is the earlier of the session and lease deadlines: the leader must tick for
// whichever comes first, and an idle cluster with nothing due writes nothing.
#[test]
fn next_deadline_is_the_earliest_of_sessions_and_leases() {
    let mut r = Replica::new(settings());
    assert_eq!(r.sm.next_deadline(), None, "an idle cluster must not tick");
    r.time = 1_000;
    r.ok(Op::LeaseGrant { id: 1, ttl: 60 });
    assert_eq!(r.sm.next_deadline(), Some(61_000));
    r.register(SECRET);
    assert_eq!(r.sm.next_deadline(), Some(1_000 + TTL_MS + 1));
}

// Cluster time is `max` of the entries' stamps: a new leader whose clock is behind must not
// make sessions younger or leases longer.
#[test]
fn cluster_time_never_runs_backwards() {
    let mut r = Replica::new(settings());
    r.tick_at(50_000);
    let older = 20_000;
    r.time = older;
    let client = r.register(SECRET);
    assert_eq!(r.sm.cluster_time(), 50_000);
    let last_active = r.sm.sessions().get(client).map(|s| s.last_active());
    assert_eq!(last_active, Some(50_000));
    r.ok(Op::LeaseGrant { id: 3, ttl: 10 });
    assert_eq!(r.sm.leases().get(3).map(|l| l.deadline), Some(60_000));

    // An older stamp cannot postpone expiry that a newer one already made due.
    r.tick_at(50_000 + TTL_MS + 1);
    assert!(r.sm.sessions().get(client).is_none());
    r.tick_at(older);
    assert_eq!(r.sm.cluster_time(), 50_000 + TTL_MS + 1);
}

// Replicas apply the same entry at different wall-clock moments; if any of them read its own
// clock they would diverge. A 1 ms TTL and a real sleep must change nothing.
#[test]
fn applying_after_a_wall_clock_sleep_changes_nothing() {
    let tiny = Settings {
        session_ttl_ms: 1,
        min_lease_ttl_secs: 1,
        ..Settings::default()
    };
    let entries: Vec<LogPayload> = vec![
        LogPayload {
            cluster_time: 100,
            commands: vec![Command::RegisterClient {
                secret: SECRET,
                nonce: 0,
            }],
        },
        LogPayload {
            cluster_time: 100,
            commands: vec![Command::Untracked(Op::LeaseGrant { id: 9, ttl: 1 })],
        },
        LogPayload {
            cluster_time: 101,
            commands: vec![tracked(1, SECRET, 1, 1, Op::put("k", "v"))],
        },
        LogPayload {
            cluster_time: 101,
            commands: vec![tracked(1, SECRET, 2, 2, Op::put("k", "w"))],
        },
    ];
    let mut fast = StateMachine::new(tiny);
    let mut slow = StateMachine::new(tiny);
    for (i, entry) in entries.iter().enumerate() {
        let index = i as u64 + 1;
        let a = fast.apply(index, entry);
        std::thread::sleep(Duration::from_millis(15));
        let b = slow.apply(index, entry);
        assert_eq!(a, b);
        assert!(
            b.iter().all(|r| !matches!(r, Response::Op(Err(_)))),
            "{b:?}"
        );
    }
    assert_eq!(fast.snapshot().ok(), slow.snapshot().ok());
    assert!(slow.sessions().get(1).is_some());
    assert!(slow.leases().get(9).is_some());
    assert_eq!(slow.kv().get(b"k").map(|v| v.version), Some(2));
}

// The session TTL is a replicated setting: changing it through the log changes every
// replica's boundary at the same index.
#[test]
fn configured_session_ttl_takes_effect_at_its_entry() {
    let (mut r, client) = session_at(1_000);
    let shorter = Settings {
        session_ttl_ms: 2_000,
        ..settings()
    };
    assert_eq!(r.one(Command::Configure(shorter)), Response::Done);
    r.tick_at(3_000);
    assert!(r.sm.sessions().get(client).is_some());
    r.tick_at(3_001);
    assert!(r.sm.sessions().get(client).is_none());
}

// Shrinking the window could strand a saved response the client still needs; it is refused.
#[test]
fn configure_refuses_a_smaller_window_and_zero_ttls() {
    let mut r = Replica::new(settings());
    for bad in [
        Settings {
            window: settings().window - 1,
            ..settings()
        },
        Settings {
            session_ttl_ms: 0,
            ..settings()
        },
        Settings {
            min_lease_ttl_secs: 0,
            ..settings()
        },
    ] {
        assert_eq!(r.one(Command::Configure(bad)), Response::Rejected);
    }
    assert_eq!(r.sm.settings(), settings());
}
