//! A write permitted at one auth revision (`Command::Authorized`) is applied only while
//! the store is still there or auth is off; otherwise it is refused with etcd's "revision
//! of auth store is old", and through a session that refusal is the seq's saved answer.

mod common;

use bytes::Bytes;
use common::{Replica, tracked};
use oncekv_core::{
    AuthCommand, Command, Op, OpError, PermKind, Permission, Response, Secret, Settings,
};

const SECRET: Secret = Secret([0x3c; 16]);

fn auth(r: &mut Replica, command: AuthCommand) {
    assert_eq!(r.one(Command::Auth(command)), Response::Auth(Ok(())));
}

/// A replica with auth on: root, and `app` with read-write on `k`.
fn with_auth() -> Replica {
    let mut r = Replica::new(Settings::default());
    for c in [
        AuthCommand::UserAdd {
            name: "root".into(),
            password: Some("h".into()),
        },
        AuthCommand::UserGrantRole {
            user: "root".into(),
            role: "root".into(),
        },
        AuthCommand::RoleAdd { name: "app".into() },
        grant_app(),
        AuthCommand::Enable { token_key: [1; 32] },
    ] {
        auth(&mut r, c);
    }
    r
}

/// Read-write on `k` for the role `app`.
fn grant_app() -> AuthCommand {
    AuthCommand::RoleGrantPermission {
        role: "app".into(),
        permission: Permission {
            kind: PermKind::ReadWrite,
            key: Bytes::from_static(b"k"),
            range_end: Bytes::new(),
        },
    }
}

fn authorized(auth_revision: u64, command: Command) -> Command {
    Command::Authorized {
        auth_revision,
        command: Box::new(command),
    }
}

fn op_result(response: Response) -> Result<(), OpError> {
    match response {
        Response::Op(Ok(reply)) => reply.result.map(|_| ()),
        other => panic!("not an op's answer: {other:?}"),
    }
}

fn revoke_app(r: &mut Replica) {
    auth(
        r,
        AuthCommand::RoleRevokePermission {
            role: "app".into(),
            key: Bytes::from_static(b"k"),
            range_end: Bytes::new(),
        },
    );
}

#[test]
fn a_write_permitted_at_the_current_revision_is_applied() {
    let mut r = with_auth();
    let at = r.sm.auth().revision();
    let put = Command::Untracked(Op::put("k", "v"));
    assert_eq!(op_result(r.one(authorized(at, put))), Ok(()));
    assert_eq!(r.value("k").as_deref(), Some(&b"v"[..]));
}

#[test]
fn a_write_permitted_before_a_revoke_is_refused_and_changes_nothing() {
    let mut r = with_auth();
    let at = r.sm.auth().revision();
    revoke_app(&mut r);
    let revision = r.sm.revision();
    let put = Command::Untracked(Op::put("k", "v"));
    assert_eq!(
        op_result(r.one(authorized(at, put))),
        Err(OpError::AuthOldRevision)
    );
    assert_eq!(r.value("k"), None);
    assert_eq!(r.sm.revision(), revision, "a refusal makes no revision");
}

#[test]
fn a_tracked_refusal_is_saved_for_its_seq() {
    let mut r = with_auth();
    let id = r.register(SECRET);
    let at = r.sm.auth().revision();
    revoke_app(&mut r);
    let put = || authorized(at, tracked(id, SECRET, 1, 1, Op::put("k", "v")));
    assert_eq!(op_result(r.one(put())), Err(OpError::AuthOldRevision));
    // The permission comes back: the retry of the same seq still gets the saved refusal,
    // so the write never runs behind the answer its client was given.
    auth(&mut r, grant_app());
    let now = r.sm.auth().revision();
    let retry = authorized(now, tracked(id, SECRET, 1, 1, Op::put("k", "v")));
    assert_eq!(op_result(r.one(retry)), Err(OpError::AuthOldRevision));
    assert_eq!(r.value("k"), None);
    // A new seq, permitted now, runs.
    let next = authorized(now, tracked(id, SECRET, 2, 2, Op::put("k", "v")));
    assert_eq!(op_result(r.one(next)), Ok(()));
    assert_eq!(r.value("k").as_deref(), Some(&b"v"[..]));
}

#[test]
fn with_auth_off_at_apply_the_permit_is_not_needed() {
    let mut r = with_auth();
    let at = r.sm.auth().revision();
    auth(&mut r, AuthCommand::Disable);
    let put = Command::Untracked(Op::put("k", "v"));
    assert_eq!(op_result(r.one(authorized(at, put))), Ok(()));
    assert_eq!(r.value("k").as_deref(), Some(&b"v"[..]));
}

#[test]
fn the_wrapper_survives_the_log_encoding() {
    let command = authorized(7, Command::Untracked(Op::put("k", "v")));
    let bytes = postcard::to_allocvec(&command).expect("encodes");
    let back: Command = postcard::from_bytes(&bytes).expect("decodes");
    assert_eq!(back, command);
    assert!(back.tracked().is_none());
    let t = authorized(7, tracked(9, SECRET, 3, 3, Op::put("k", "v")));
    assert_eq!(t.tracked().map(|t| (t.client_id, t.seq)), Some((9, 3)));
}
