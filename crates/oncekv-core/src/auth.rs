//! etcd's auth store, replicated: users (with bcrypt password hashes, hashed before they
//! reach the log), roles with key-range permissions, whether auth is on, and the auth
//! revision that every change advances (tokens name the revision they were issued at, so
//! a change makes every older token stale).
//!
//! Only the decisions live here (what a command changes, whether a user may touch a
//! range); hashing, tokens and the gRPC surface are the server's. Refusals carry etcd's
//! messages.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// The user and role every permission check lets through.
pub const ROOT: &str = "root";

/// etcd's permission types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PermKind {
    Read,
    Write,
    ReadWrite,
}

impl PermKind {
    fn allows(self, need: Access) -> bool {
        matches!(
            (self, need),
            (PermKind::ReadWrite, _)
                | (PermKind::Read, Access::Read)
                | (PermKind::Write, Access::Write)
        )
    }
}

/// What a request does to a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// A role's permission on `[key, range_end)`; `range_end` empty: the key alone;
/// `range_end` `[0]`: every key from `key` on (etcd's conventions).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Permission {
    pub kind: PermKind,
    pub key: Bytes,
    pub range_end: Bytes,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    /// The bcrypt hash; `None`: a user without a password (it authenticates only by its
    /// TLS certificate's common name).
    pub password: Option<String>,
    pub roles: BTreeSet<String>,
}

/// A change to the auth store (etcd's Auth service's writes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthCommand {
    /// Turn auth on. `token_key` signs the tokens members hand out from now on; the
    /// member that proposes drew it at random (a fresh one at every enable).
    Enable {
        token_key: [u8; 32],
    },
    Disable,
    UserAdd {
        name: String,
        password: Option<String>,
    },
    UserDelete {
        name: String,
    },
    UserChangePassword {
        name: String,
        password: Option<String>,
    },
    UserGrantRole {
        user: String,
        role: String,
    },
    UserRevokeRole {
        user: String,
        role: String,
    },
    RoleAdd {
        name: String,
    },
    RoleDelete {
        name: String,
    },
    RoleGrantPermission {
        role: String,
        permission: Permission,
    },
    RoleRevokePermission {
        role: String,
        key: Bytes,
        range_end: Bytes,
    },
}

/// etcd's auth errors, with its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum AuthError {
    #[error("etcdserver: root user does not exist")]
    RootUserNotExist,
    #[error("etcdserver: root user does not have root role")]
    RootRoleNotExist,
    #[error("etcdserver: user name already exists")]
    UserAlreadyExist,
    #[error("etcdserver: user name is empty")]
    UserEmpty,
    #[error("etcdserver: user name not found")]
    UserNotFound,
    #[error("etcdserver: role name already exists")]
    RoleAlreadyExist,
    #[error("etcdserver: role name not found")]
    RoleNotFound,
    #[error("etcdserver: role name is empty")]
    RoleEmpty,
    #[error("etcdserver: authentication failed, invalid user ID or password")]
    AuthFailed,
    #[error("etcdserver: permission denied")]
    PermissionDenied,
    #[error("etcdserver: role is not granted to the user")]
    RoleNotGranted,
    #[error("etcdserver: permission is not granted to the role")]
    PermissionNotGranted,
    #[error("etcdserver: authentication is not enabled")]
    AuthNotEnabled,
    #[error("etcdserver: invalid auth token")]
    InvalidAuthToken,
    #[error("etcdserver: invalid auth management")]
    InvalidAuthMgmt,
    #[error("etcdserver: revision of auth store is old")]
    AuthOldRevision,
}

/// The replicated auth state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthStore {
    enabled: bool,
    revision: u64,
    users: BTreeMap<String, User>,
    roles: BTreeMap<String, Vec<Permission>>,
    token_key: [u8; 32],
}

/// `[start, end)` with `None` as "no end".
type Interval = (Bytes, Option<Bytes>);

fn interval(key: &Bytes, range_end: &Bytes) -> Interval {
    if range_end.is_empty() {
        let mut end = key.to_vec();
        end.push(0);
        (key.clone(), Some(Bytes::from(end)))
    } else if range_end.as_ref() == [0] {
        (key.clone(), None)
    } else {
        (key.clone(), Some(range_end.clone()))
    }
}

impl AuthStore {
    /// A store holding `users` and `roles` (an imported one); `token_key` signs tokens.
    pub fn from_parts(
        enabled: bool,
        revision: u64,
        users: BTreeMap<String, User>,
        roles: BTreeMap<String, Vec<Permission>>,
        token_key: [u8; 32],
    ) -> AuthStore {
        AuthStore {
            enabled,
            revision,
            users,
            roles,
            token_key,
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Advanced by every change; a token issued at an older revision is stale.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    pub fn token_key(&self) -> &[u8; 32] {
        &self.token_key
    }

    pub fn user(&self, name: &str) -> Option<&User> {
        self.users.get(name)
    }

    pub fn users(&self) -> impl Iterator<Item = &str> {
        self.users.keys().map(String::as_str)
    }

    pub fn role(&self, name: &str) -> Option<&[Permission]> {
        self.roles.get(name).map(Vec::as_slice)
    }

    pub fn roles(&self) -> impl Iterator<Item = &str> {
        self.roles.keys().map(String::as_str)
    }

    /// Whether `user` holds the root role (may do anything, including managing auth).
    pub fn is_admin(&self, user: &str) -> bool {
        self.users.get(user).is_some_and(|u| u.roles.contains(ROOT))
    }

    /// Whether `user` may `access` every key in `[key, range_end)` (etcd's conventions
    /// for `range_end`): the range must lie inside the union of the ranges its roles
    /// grant for that access.
    pub fn permitted(&self, user: &str, access: Access, key: &Bytes, range_end: &Bytes) -> bool {
        let Some(u) = self.users.get(user) else {
            return false;
        };
        if u.roles.contains(ROOT) {
            return true;
        }
        let mut granted: Vec<Interval> = u
            .roles
            .iter()
            .filter_map(|r| self.roles.get(r))
            .flatten()
            .filter(|p| p.kind.allows(access))
            .map(|p| interval(&p.key, &p.range_end))
            .collect();
        granted.sort();
        let (start, end) = interval(key, range_end);
        // Walk the granted intervals in order of their starts, extending how far from
        // `start` on is covered without a gap; an interval starting past that is a gap.
        let mut covered_to = start;
        for (s, e) in granted {
            if s > covered_to {
                break;
            }
            match e {
                None => return true,
                Some(e) if e > covered_to => covered_to = e,
                Some(_) => {}
            }
            if end.as_ref().is_some_and(|end| covered_to >= *end) {
                return true;
            }
        }
        false
    }

    /// Applies `command`; every success advances the revision.
    pub fn apply(&mut self, command: &AuthCommand) -> Result<(), AuthError> {
        self.change(command)?;
        self.revision += 1;
        Ok(())
    }

    fn change(&mut self, command: &AuthCommand) -> Result<(), AuthError> {
        match command {
            AuthCommand::Enable { token_key } => {
                if self.enabled {
                    return Ok(());
                }
                let root = self.users.get(ROOT).ok_or(AuthError::RootUserNotExist)?;
                if !root.roles.contains(ROOT) {
                    return Err(AuthError::RootRoleNotExist);
                }
                self.enabled = true;
                self.token_key = *token_key;
            }
            AuthCommand::Disable => self.enabled = false,
            AuthCommand::UserAdd { name, password } => {
                if name.is_empty() {
                    return Err(AuthError::UserEmpty);
                }
                if self.users.contains_key(name) {
                    return Err(AuthError::UserAlreadyExist);
                }
                self.users.insert(
                    name.clone(),
                    User {
                        password: password.clone(),
                        roles: BTreeSet::new(),
                    },
                );
            }
            AuthCommand::UserDelete { name } => {
                if self.enabled && name == ROOT {
                    return Err(AuthError::InvalidAuthMgmt);
                }
                self.users.remove(name).ok_or(AuthError::UserNotFound)?;
            }
            AuthCommand::UserChangePassword { name, password } => {
                self.users
                    .get_mut(name)
                    .ok_or(AuthError::UserNotFound)?
                    .password = password.clone();
            }
            AuthCommand::UserGrantRole { user, role } => {
                // The root role need not exist to be granted (etcd's rule).
                if role != ROOT && !self.roles.contains_key(role) {
                    if !self.users.contains_key(user) {
                        return Err(AuthError::UserNotFound);
                    }
                    return Err(AuthError::RoleNotFound);
                }
                self.users
                    .get_mut(user)
                    .ok_or(AuthError::UserNotFound)?
                    .roles
                    .insert(role.clone());
            }
            AuthCommand::UserRevokeRole { user, role } => {
                if self.enabled && user == ROOT && role == ROOT {
                    return Err(AuthError::InvalidAuthMgmt);
                }
                let u = self.users.get_mut(user).ok_or(AuthError::UserNotFound)?;
                if !u.roles.remove(role) {
                    return Err(AuthError::RoleNotGranted);
                }
            }
            AuthCommand::RoleAdd { name } => {
                if name.is_empty() {
                    return Err(AuthError::RoleEmpty);
                }
                if self.roles.contains_key(name) {
                    return Err(AuthError::RoleAlreadyExist);
                }
                self.roles.insert(name.clone(), Vec::new());
            }
            AuthCommand::RoleDelete { name } => {
                if self.enabled && name == ROOT {
                    return Err(AuthError::InvalidAuthMgmt);
                }
                self.roles.remove(name).ok_or(AuthError::RoleNotFound)?;
                for user in self.users.values_mut() {
                    user.roles.remove(name);
                }
            }
            AuthCommand::RoleGrantPermission { role, permission } => {
                let perms = self.roles.get_mut(role).ok_or(AuthError::RoleNotFound)?;
                // One permission per range: granting the same range again replaces it.
                match perms
                    .iter_mut()
                    .find(|p| p.key == permission.key && p.range_end == permission.range_end)
                {
                    Some(existing) => existing.kind = permission.kind,
                    None => {
                        perms.push(permission.clone());
                        perms.sort_by(|a, b| (&a.key, &a.range_end).cmp(&(&b.key, &b.range_end)));
                    }
                }
            }
            AuthCommand::RoleRevokePermission {
                role,
                key,
                range_end,
            } => {
                let perms = self.roles.get_mut(role).ok_or(AuthError::RoleNotFound)?;
                let before = perms.len();
                perms.retain(|p| !(p.key == *key && p.range_end == *range_end));
                if perms.len() == before {
                    return Err(AuthError::PermissionNotGranted);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn store() -> AuthStore {
        let mut a = AuthStore::default();
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
            AuthCommand::RoleGrantPermission {
                role: "app".into(),
                permission: Permission {
                    kind: PermKind::ReadWrite,
                    key: b("app/"),
                    range_end: b("app0"),
                },
            },
            AuthCommand::RoleGrantPermission {
                role: "app".into(),
                permission: Permission {
                    kind: PermKind::Read,
                    key: b("shared"),
                    range_end: Bytes::new(),
                },
            },
            AuthCommand::UserAdd {
                name: "alice".into(),
                password: Some("h".into()),
            },
            AuthCommand::UserGrantRole {
                user: "alice".into(),
                role: "app".into(),
            },
        ] {
            a.apply(&c).unwrap();
        }
        a
    }

    #[test]
    fn ranges_must_lie_inside_what_is_granted() {
        let a = store();
        let (read, write) = (Access::Read, Access::Write);
        assert!(a.permitted("alice", write, &b("app/x"), &Bytes::new()));
        assert!(a.permitted("alice", read, &b("app/"), &b("app0")));
        assert!(a.permitted("alice", read, &b("app/a"), &b("app/b")));
        assert!(!a.permitted("alice", read, &b("app/"), &b("app1")));
        assert!(!a.permitted("alice", read, &b("ap"), &b("app0")));
        assert!(!a.permitted("alice", write, &b("other"), &Bytes::new()));
        assert!(a.permitted("alice", read, &b("shared"), &Bytes::new()));
        assert!(!a.permitted("alice", write, &b("shared"), &Bytes::new()));
        // "From here on" is covered by nothing bounded.
        assert!(!a.permitted("alice", read, &b("app/"), &Bytes::from_static(&[0])));
        assert!(a.permitted("root", write, &b(""), &Bytes::from_static(&[0])));
        assert!(!a.permitted("nobody", read, &b("app/x"), &Bytes::new()));
    }

    #[test]
    fn adjacent_grants_cover_a_range_together() {
        let mut a = store();
        a.apply(&AuthCommand::RoleGrantPermission {
            role: "app".into(),
            permission: Permission {
                kind: PermKind::Read,
                key: b("app0"),
                range_end: b("app5"),
            },
        })
        .unwrap();
        assert!(a.permitted("alice", Access::Read, &b("app/z"), &b("app3")));
        assert!(!a.permitted("alice", Access::Write, &b("app/z"), &b("app3")));
    }

    #[test]
    fn enabling_needs_root_and_every_change_advances_the_revision() {
        let mut a = AuthStore::default();
        let enable = AuthCommand::Enable { token_key: [7; 32] };
        assert_eq!(a.apply(&enable), Err(AuthError::RootUserNotExist));
        a.apply(&AuthCommand::UserAdd {
            name: "root".into(),
            password: None,
        })
        .unwrap();
        assert_eq!(a.apply(&enable), Err(AuthError::RootRoleNotExist));
        a.apply(&AuthCommand::UserGrantRole {
            user: "root".into(),
            role: "root".into(),
        })
        .unwrap();
        let before = a.revision();
        a.apply(&enable).unwrap();
        assert!(a.enabled() && a.revision() == before + 1);
        assert_eq!(
            a.apply(&AuthCommand::UserDelete {
                name: "root".into()
            }),
            Err(AuthError::InvalidAuthMgmt)
        );
        assert_eq!(
            a.apply(&AuthCommand::UserRevokeRole {
                user: "root".into(),
                role: "root".into()
            }),
            Err(AuthError::InvalidAuthMgmt)
        );
        assert_eq!(a.revision(), before + 1, "refusals change nothing");
    }

    #[test]
    fn session_owners_survive_snapshots_and_guard_retried_registrations() {
        use crate::{Command, LogPayload, Response, Secret, StateMachine};
        let apply = |sm: &mut StateMachine, index: u64, command: Command| {
            sm.apply(
                index,
                &LogPayload {
                    cluster_time: 1_000 + index,
                    commands: vec![command],
                },
            )
            .remove(0)
        };
        let secret = Secret::from_u128(9);
        let register = |owner: &str| Command::RegisterOwned {
            secret,
            nonce: 5,
            owner: owner.into(),
        };
        let mut sm = StateMachine::default();
        assert_eq!(
            apply(
                &mut sm,
                1,
                Command::Auth(AuthCommand::RoleAdd { name: "r".into() })
            ),
            Response::Auth(Ok(()))
        );
        assert!(matches!(
            apply(&mut sm, 2, register("alice")),
            Response::Registered { client_id: 2, .. }
        ));
        assert_eq!(sm.session_owner(2), Some("alice"));
        // The nonce retried by another user obtains nothing; by its owner, the session.
        assert_eq!(apply(&mut sm, 3, register("bob")), Response::Rejected);
        assert!(matches!(
            apply(&mut sm, 4, register("alice")),
            Response::Registered { client_id: 2, .. }
        ));
        let restored = StateMachine::restore(&sm.snapshot().unwrap()).unwrap();
        assert_eq!(restored.session_owner(2), Some("alice"));
        assert_eq!(restored.auth(), sm.auth());
        assert_eq!(restored.auth().revision(), 1);
        apply(
            &mut sm,
            5,
            Command::CloseSession {
                client_id: 2,
                secret,
            },
        );
        assert_eq!(sm.session_owner(2), None);
    }

    #[test]
    fn deleting_a_role_takes_it_from_its_users() {
        let mut a = store();
        a.apply(&AuthCommand::RoleDelete { name: "app".into() })
            .unwrap();
        assert!(a.user("alice").unwrap().roles.is_empty());
        assert!(!a.permitted("alice", Access::Read, &b("app/x"), &Bytes::new()));
        assert_eq!(
            a.apply(&AuthCommand::RoleRevokePermission {
                role: "app".into(),
                key: b("app/"),
                range_end: b("app0"),
            }),
            Err(AuthError::RoleNotFound)
        );
    }
}
