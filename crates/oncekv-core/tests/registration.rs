//! Registration is idempotent: a client that lost the reply to `Register` retries with the
//! same nonce and gets the same session back, instead of leaving an orphan session behind.

mod common;

use common::Replica;
use oncekv_core::{Command, Response, Secret, Settings};

const FIRST: Secret = Secret([0x11; 16]);
/// The leader draws a new secret for every proposal, so a retry carries another one.
const RETRY: Secret = Secret([0x22; 16]);
const NONCE: u128 = 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210;

fn settings() -> Settings {
    Settings {
        session_ttl_ms: 1_000,
        ..Settings::default()
    }
}

fn register(r: &mut Replica, secret: Secret, nonce: u128) -> (u64, Secret) {
    match r.one(Command::RegisterClient { secret, nonce }) {
        Response::Registered {
            client_id, secret, ..
        } => (client_id, secret),
        other => panic!("registration answered {other:?}"),
    }
}

// A lost reply must not cost a session: the retry is answered with the id and secret the
// first registration made, and no second session exists to expire unused.
#[test]
fn retried_register_with_the_same_nonce_gets_the_same_session() {
    let mut r = Replica::new(settings());
    let first = register(&mut r, FIRST, NONCE);
    let retry = register(&mut r, RETRY, NONCE);
    assert_eq!(retry, first);
    assert_eq!(first.1, FIRST, "the stored secret, not the retry's");
    assert_eq!(r.sm.sessions().len(), 1);
}

// Nonces tell clients apart; no nonce (0) is the behaviour before nonces: every
// registration is a new session.
#[test]
fn different_nonces_or_none_make_different_sessions() {
    for (a, b) in [(NONCE, NONCE + 1), (0, 0), (NONCE, 0), (0, NONCE)] {
        let mut r = Replica::new(settings());
        let first = register(&mut r, FIRST, a);
        let second = register(&mut r, RETRY, b);
        assert_ne!(first.0, second.0, "nonces {a:#x}, {b:#x}");
        assert_eq!(second.1, RETRY);
        assert_eq!(r.sm.sessions().len(), 2);
    }
}

// The nonce lives as long as its session: once the session is gone (expired or closed),
// a registration with that nonce must open a working session, not name a dead one.
#[test]
fn nonce_is_forgotten_once_its_session_expires_or_closes() {
    for close in [false, true] {
        let mut r = Replica::new(settings());
        let (old, secret) = register(&mut r, FIRST, NONCE);
        if close {
            let closed = r.one(Command::CloseSession {
                client_id: old,
                secret,
            });
            assert_eq!(closed, Response::Session(Ok(())));
        } else {
            let expired_at = r.time + settings().session_ttl_ms + 1;
            r.tick_at(expired_at);
        }
        assert!(r.sm.sessions().get(old).is_none(), "close: {close}");
        let (new, new_secret) = register(&mut r, RETRY, NONCE);
        assert_ne!(new, old, "close: {close}");
        assert_eq!(new_secret, RETRY);
        assert_eq!(r.sm.sessions().len(), 1);
    }
}

// A retry proves the client is alive; counting it as activity keeps the session from
// expiring just as the client finally learns of it.
#[test]
fn retried_register_keeps_the_session_alive() {
    let mut r = Replica::new(settings());
    let start = r.time;
    let first = register(&mut r, FIRST, NONCE);
    r.tick_at(start + 800);
    assert_eq!(register(&mut r, RETRY, NONCE), first);
    r.tick_at(start + 1_500);
    assert!(r.sm.sessions().get(first.0).is_some());
}

// The leader may batch a registration and its retry into one entry; the retry creates
// nothing, so it is answered like any other retry rather than refused as a second
// registration.
#[test]
fn retry_in_the_same_entry_gets_the_same_session() {
    let mut r = Replica::new(settings());
    let time = r.time;
    let responses = r.entry_at(
        time,
        vec![
            Command::RegisterClient {
                secret: FIRST,
                nonce: NONCE,
            },
            Command::RegisterClient {
                secret: RETRY,
                nonce: NONCE,
            },
        ],
    );
    assert_eq!(responses[0], responses[1]);
    assert!(matches!(
        responses[0],
        Response::Registered { secret: FIRST, .. }
    ));
    assert_eq!(r.sm.sessions().len(), 1);
}
