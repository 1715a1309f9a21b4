//! Who a request comes from and what it may do, with auth on (etcd's auth): tokens,
//! client-certificate users, permission checks, and the rule that a session belongs to
//! the user that registered it.
//!
//! A token is `<user>.<auth revision>.<issued ms>.<MAC>` (user base64url), signed with
//! HMAC-SHA256 under the key the replicated auth store drew when auth was enabled: every
//! member can check any member's tokens without asking, a token names the auth revision
//! it was issued at (any auth change makes it stale, and clients re-authenticate, as with
//! etcd), and it expires after `--auth-token-ttl`. The token is opaque to clients. With
//! `--auth-token jwt,...` tokens are etcd's JWTs instead ([`crate::jwt`]), checked the same
//! way for revision and user.
//!
//! With auth off every check passes without touching the state machine (one atomic
//! load), so the cost falls only on clusters that turn it on.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use hmac::{Hmac, Mac};
use oncekv_core::{Access, AuthError, AuthStore, Op, RequestOp, prefix_end};
use oncekv_proto::SessionMeta;
use sha2::Sha256;

use crate::error::ApiError;
use crate::request_path::{NodeCore, Permit};
use crate::tls::CertIdentity;

/// The request metadata etcd's clients carry their token in.
pub const TOKEN_METADATA: &str = "token";

/// What a request says about its sender: a token, and the common name of the TLS client
/// certificate it connected with.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    token: Option<String>,
    common_name: Option<Arc<str>>,
}

impl Caller {
    pub fn of<T>(request: &tonic::Request<T>) -> Caller {
        Caller {
            token: request
                .metadata()
                .get(TOKEN_METADATA)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            common_name: request
                .extensions()
                .get::<CertIdentity>()
                .and_then(|c| c.common_name.clone()),
        }
    }

    /// The JSON gateway's caller: the token in the `Authorization` header (as etcd's
    /// gateway takes it).
    pub fn of_http(headers: &http::HeaderMap) -> Caller {
        Caller {
            token: headers
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .map(|t| t.trim_start_matches("Bearer ").to_string()),
            common_name: None,
        }
    }
}

/// One thing a request needs permission for.
#[derive(Debug, Clone, Copy)]
pub enum Need<'a> {
    /// Read every key in `[key, range_end)` (etcd's `range_end` conventions).
    Read(&'a Bytes, &'a Bytes),
    Write(&'a Bytes, &'a Bytes),
    /// The root role (auth management, membership, maintenance that copies or rewrites
    /// the whole store).
    Admin,
    /// Any authenticated user.
    Anyone,
}

static EMPTY: Bytes = Bytes::new();
const NO_END: &Bytes = &EMPTY;

/// What `op` needs: writes on what it writes, reads on what it reads (a txn's compares
/// too), the root role for compaction.
pub fn op_needs(op: &Op) -> Vec<Need<'_>> {
    fn ops<'a>(list: &'a [RequestOp], out: &mut Vec<Need<'a>>) {
        for op in list {
            match op {
                RequestOp::Range(r) => out.push(Need::Read(&r.range.key, &r.range.range_end)),
                RequestOp::Put(p) => {
                    out.push(Need::Write(&p.key, NO_END));
                    if p.prev_kv {
                        out.push(Need::Read(&p.key, NO_END));
                    }
                }
                RequestOp::DeleteRange(d) => {
                    out.push(Need::Write(&d.range.key, &d.range.range_end));
                    if d.prev_kv {
                        out.push(Need::Read(&d.range.key, &d.range.range_end));
                    }
                }
                RequestOp::Txn(t) => {
                    for c in &t.compare {
                        out.push(Need::Read(&c.range.key, &c.range.range_end));
                    }
                    ops(&t.success, out);
                    ops(&t.failure, out);
                }
            }
        }
    }
    let mut out = Vec::new();
    match op {
        Op::Put(p) => {
            out.push(Need::Write(&p.key, NO_END));
            if p.prev_kv {
                out.push(Need::Read(&p.key, NO_END));
            }
        }
        Op::DeleteRange(d) => {
            out.push(Need::Write(&d.range.key, &d.range.range_end));
            if d.prev_kv {
                out.push(Need::Read(&d.range.key, &d.range.range_end));
            }
        }
        Op::Txn(t) => {
            for c in &t.compare {
                out.push(Need::Read(&c.range.key, &c.range.range_end));
            }
            ops(&t.success, &mut out);
            ops(&t.failure, &mut out);
        }
        // Revoking deletes the lease's keys: the lease service checks those itself.
        Op::LeaseGrant { .. } | Op::LeaseRevoke { .. } | Op::LeaseKeepAlive { .. } => {
            out.push(Need::Anyone)
        }
        Op::Compact { .. } => out.push(Need::Admin),
        // Lock and Campaign create a key under the name and read the queue.
        Op::Enqueue(e) => out.push(Need::Write(&e.name, NO_END)),
    }
    out
}

/// The `[prefix, prefix_end(prefix))` range a Lock or Election name's queue lives in.
pub fn queue_range(name: &Bytes) -> (Bytes, Bytes) {
    let mut prefix = name.to_vec();
    prefix.push(b'/');
    let end = prefix_end(&prefix);
    (Bytes::from(prefix), end)
}

type HmacSha256 = Hmac<Sha256>;

fn mac(key: &[u8; 32], body: &str) -> HmacSha256 {
    // HMAC takes a key of any length; 32 bytes is never refused.
    let mut mac = <HmacSha256 as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    mac.update(body.as_bytes());
    mac
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A new token for `user` at the store's current revision.
pub fn mint(store: &AuthStore, user: &str) -> String {
    let body = format!(
        "{}.{}.{}",
        URL_SAFE_NO_PAD.encode(user),
        store.revision(),
        now_ms()
    );
    let tag = mac(store.token_key(), &body).finalize().into_bytes();
    format!("{body}.{}", URL_SAFE_NO_PAD.encode(tag))
}

/// What checking a token against this member's applied store found.
#[derive(Debug, PartialEq, Eq)]
enum Checked {
    User(String),
    /// Issued at an auth revision this member has not applied yet.
    Ahead,
    Refused(AuthError),
}

fn check_token(store: &AuthStore, token: &str, ttl: Duration) -> Checked {
    let refused = Checked::Refused(AuthError::InvalidAuthToken);
    let Some((body, tag)) = token.rsplit_once('.') else {
        return refused;
    };
    let Ok(tag) = URL_SAFE_NO_PAD.decode(tag) else {
        return refused;
    };
    if mac(store.token_key(), body).verify_slice(&tag).is_err() {
        return refused;
    }
    let mut fields = body.split('.');
    let (Some(user), Some(revision), Some(issued), None) =
        (fields.next(), fields.next(), fields.next(), fields.next())
    else {
        return refused;
    };
    let (Ok(user), Ok(revision), Ok(issued)) = (
        URL_SAFE_NO_PAD.decode(user),
        revision.parse::<u64>(),
        issued.parse::<u64>(),
    ) else {
        return refused;
    };
    let Ok(user) = String::from_utf8(user) else {
        return refused;
    };
    if revision > store.revision() {
        return Checked::Ahead;
    }
    if revision < store.revision() {
        return Checked::Refused(AuthError::AuthOldRevision);
    }
    if now_ms().saturating_sub(issued) > ttl.as_millis() as u64 {
        return refused;
    }
    if store.user(&user).is_none() {
        return refused;
    }
    Checked::User(user)
}

/// [`check_token`] for a JWT: the signature and expiry by `jwt`, then the revision and user
/// as for a simple token.
fn check_jwt(store: &AuthStore, jwt: &crate::jwt::Jwt, token: &str) -> Checked {
    let Some(claims) = jwt.verify(token, now_ms() / 1000) else {
        return Checked::Refused(AuthError::InvalidAuthToken);
    };
    if claims.revision > store.revision() {
        return Checked::Ahead;
    }
    if claims.revision < store.revision() {
        return Checked::Refused(AuthError::AuthOldRevision);
    }
    if store.user(&claims.username).is_none() {
        return Checked::Refused(AuthError::InvalidAuthToken);
    }
    Checked::User(claims.username)
}

/// Whether `user` may do everything in `needs`, by `store`.
fn permitted(store: &AuthStore, user: &str, needs: &[Need<'_>]) -> Result<(), AuthError> {
    let ok = needs.iter().all(|need| match need {
        Need::Anyone => true,
        Need::Admin => store.is_admin(user),
        Need::Read(key, end) => store.permitted(user, Access::Read, key, end),
        Need::Write(key, end) => store.permitted(user, Access::Write, key, end),
    });
    if ok {
        Ok(())
    } else {
        Err(AuthError::PermissionDenied)
    }
}

impl NodeCore {
    /// The user `caller` is authenticated as; `None` when auth is off. A token from an
    /// auth revision this member has not applied yet waits for a read barrier once.
    pub async fn caller_user(&self, caller: &Caller) -> Result<Option<String>, ApiError> {
        if !self.applied().auth_enabled() {
            return Ok(None);
        }
        if let Some(token) = &caller.token {
            let ttl = self.config().auth_token_ttl;
            let jwt = self.config().auth_jwt.clone();
            for first in [true, false] {
                let checked = {
                    let inner = self.applied().read();
                    if !inner.sm.auth().enabled() {
                        return Ok(None);
                    }
                    match &jwt {
                        Some(jwt) => check_jwt(inner.sm.auth(), jwt, token),
                        None => check_token(inner.sm.auth(), token, ttl),
                    }
                };
                match checked {
                    Checked::User(user) => return Ok(Some(user)),
                    Checked::Ahead if first => self.read_index().await?,
                    Checked::Ahead => return Err(AuthError::InvalidAuthToken.into()),
                    Checked::Refused(e) => return Err(e.into()),
                }
            }
        }
        // etcd's --client-cert-auth: a verified certificate's common name is the user.
        let cert_auth = self
            .config()
            .client_tls
            .as_ref()
            .is_some_and(|t| t.client_cert_auth);
        match &caller.common_name {
            Some(cn) if cert_auth => Ok(Some(cn.to_string())),
            _ => Err(AuthError::UserEmpty.into()),
        }
    }

    /// Checks that `caller` may do everything in `needs`; the user, `None` with auth off.
    pub async fn authorize(
        &self,
        caller: &Caller,
        needs: &[Need<'_>],
    ) -> Result<Option<String>, ApiError> {
        Ok(self.authorize_at(caller, needs).await?.0)
    }

    /// [`authorize`](Self::authorize), with the permit the check grants a write.
    async fn authorize_at(
        &self,
        caller: &Caller,
        needs: &[Need<'_>],
    ) -> Result<(Option<String>, Permit), ApiError> {
        let Some(user) = self.caller_user(caller).await? else {
            return Ok((None, Permit::UNCHECKED));
        };
        let inner = self.applied().read();
        let store = inner.sm.auth();
        if !store.enabled() {
            return Ok((Some(user), Permit::UNCHECKED));
        }
        permitted(store, &user, needs)?;
        Ok((Some(user), Permit::at(store.revision())))
    }

    /// [`authorize`](Self::authorize) for `op`: see
    /// [`authorize_tracked`](Self::authorize_tracked).
    pub async fn authorize_op(
        &self,
        caller: &Caller,
        op: &Op,
        meta: Option<&SessionMeta>,
    ) -> Result<Permit, ApiError> {
        if !self.applied().auth_enabled() {
            return Ok(Permit::UNCHECKED);
        }
        self.authorize_tracked(caller, &op_needs(op), meta).await
    }

    /// [`authorize`](Self::authorize) for a write, and, for a tracked request, that the
    /// session is the caller's: a session registered by one user is refused to another
    /// before anything looks for its saved replies. The permit goes with the write, which
    /// applying it checks again (see [`Permit`]).
    pub async fn authorize_tracked(
        &self,
        caller: &Caller,
        needs: &[Need<'_>],
        meta: Option<&SessionMeta>,
    ) -> Result<Permit, ApiError> {
        let (user, permit) = match self.authorize_at(caller, needs).await {
            // This member's state may not hold yet an auth change the leader applied
            // before the request was sent (`auth disable`, a grant). etcd checks a write
            // on state as new as the write, so a refusal here is checked once more after
            // this member has caught up with the leader.
            Err(ApiError::Auth(_)) => {
                self.read_index().await?;
                self.authorize_at(caller, needs).await?
            }
            checked => checked?,
        };
        if let (Some(user), Some(meta)) = (user, meta) {
            self.check_session_owner(&user, meta.client_id)?;
        }
        Ok(permit)
    }

    /// Refuses `user` a session it does not own (with auth on). An unknown session
    /// passes: the state machine answers it expired, which reveals nothing.
    pub fn check_session_owner(&self, user: &str, client_id: u64) -> Result<(), ApiError> {
        let inner = self.applied().read();
        if !inner.sm.auth().enabled() || inner.sm.sessions().get(client_id).is_none() {
            return Ok(());
        }
        match inner.sm.session_owner(client_id) {
            Some(owner) if owner == user => Ok(()),
            _ => Err(AuthError::PermissionDenied.into()),
        }
    }

    /// etcd's Authenticate: checks the password (bcrypt, off the async threads) against
    /// the store as of a read barrier, and mints a token.
    pub async fn authenticate(&self, name: &str, password: &str) -> Result<String, ApiError> {
        self.read_index().await?;
        let hash = {
            let inner = self.applied().read();
            let auth = inner.sm.auth();
            if !auth.enabled() {
                return Err(AuthError::AuthNotEnabled.into());
            }
            auth.user(name).and_then(|u| u.password.clone())
        };
        // A missing user still costs a hash: the answer's timing does not tell which
        // names exist.
        let hash = hash.unwrap_or_else(|| DUMMY_HASH.to_string());
        let password = password.to_string();
        let ok = tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash))
            .await
            .map_err(|e| ApiError::Internal(format!("password check: {e}")))?
            .unwrap_or(false);
        let inner = self.applied().read();
        let auth = inner.sm.auth();
        if !ok || auth.user(name).is_none() {
            return Err(AuthError::AuthFailed.into());
        }
        match &self.config().auth_jwt {
            Some(jwt) => jwt
                .sign(name, auth.revision(), now_ms() / 1000)
                .map_err(ApiError::Internal),
            None => Ok(mint(auth, name)),
        }
    }

    /// A bcrypt hash of `password` at `--bcrypt-cost`, computed off the async threads.
    pub async fn hash_password(&self, password: &str) -> Result<String, ApiError> {
        let (password, cost) = (password.to_string(), self.config().bcrypt_cost);
        tokio::task::spawn_blocking(move || bcrypt::hash(password, cost))
            .await
            .map_err(|e| ApiError::Internal(format!("password hash: {e}")))?
            .map_err(|e| ApiError::InvalidArgument(format!("etcdserver: {e}")))
    }
}

/// A valid bcrypt hash of nothing anyone knows, checked when the user does not exist.
const DUMMY_HASH: &str = "$2b$10$7EqJtq98hPqEX7fNZaFWoOhi5BWX4Z3bj5JtT2nHEwI6K7MhR8Bsa";

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use oncekv_core::AuthCommand;

    use super::*;

    fn store() -> AuthStore {
        let mut s = AuthStore::default();
        for c in [
            AuthCommand::UserAdd {
                name: "root".into(),
                password: None,
            },
            AuthCommand::UserGrantRole {
                user: "root".into(),
                role: "root".into(),
            },
            AuthCommand::Enable { token_key: [3; 32] },
        ] {
            s.apply(&c).unwrap();
        }
        s
    }

    #[test]
    fn tokens_check_their_mac_revision_and_age() {
        let mut s = store();
        let ttl = Duration::from_secs(300);
        let token = mint(&s, "root");
        assert_eq!(check_token(&s, &token, ttl), Checked::User("root".into()));
        // Any change to the token breaks its MAC.
        let forged = token.replacen("cm9vd", "YWxpY2", 1);
        assert_eq!(
            check_token(&s, &forged, ttl),
            Checked::Refused(AuthError::InvalidAuthToken)
        );
        assert_eq!(
            check_token(&s, "garbage", ttl),
            Checked::Refused(AuthError::InvalidAuthToken)
        );
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(
            check_token(&s, &token, Duration::from_millis(1)),
            Checked::Refused(AuthError::InvalidAuthToken),
            "an expired token"
        );
        // Another key (auth re-enabled) refuses it.
        let mut other = s.clone();
        other.apply(&AuthCommand::Disable).unwrap();
        other
            .apply(&AuthCommand::Enable { token_key: [4; 32] })
            .unwrap();
        assert_eq!(
            check_token(&other, &token, ttl),
            Checked::Refused(AuthError::InvalidAuthToken)
        );
        // An auth change makes it stale; a newer one is ahead of an older store.
        let old = s.clone();
        s.apply(&AuthCommand::RoleAdd { name: "r".into() }).unwrap();
        assert_eq!(
            check_token(&s, &token, ttl),
            Checked::Refused(AuthError::AuthOldRevision)
        );
        assert_eq!(check_token(&old, &mint(&s, "root"), ttl), Checked::Ahead);
    }

    #[test]
    fn the_dummy_hash_is_a_hash() {
        assert!(!bcrypt::verify("", DUMMY_HASH).unwrap());
    }
}
