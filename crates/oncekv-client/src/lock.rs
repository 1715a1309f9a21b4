//! Locks: [`Client::lock`] waits for etcd's Lock service to grant a named lock and returns
//! a [`LockGuard`] carrying the fencing token (the lock key's create revision, which
//! increases from holder to holder).
//!
//! The Lock call is tracked like any write: if its reply is lost, the retry carries the
//! same sequence number, the cluster answers with the key it queued the first time, and
//! the call waits for that key's turn; it never queues a second waiter. It is also a
//! [`Kind::Wait`] call: waiting for the turn has no deadline.
//!
//! Each lock runs on a lease of its own (unless [`LockOptions::with_lease`] names one):
//! granted before the Lock call, kept alive while the guard lives, revoked by
//! [`LockGuard::unlock`], which deletes the key and the lease in one command. Two reasons:
//! - two tasks locking the same name through one `Client` must exclude each other; with one
//!   shared lease both would get the key `name/<lease>` and both would "hold" the lock
//!   (the reentrancy of etcd's session-based mutex);
//! - a lock abandoned while it waits (its future dropped, or failed) is cleaned up by
//!   revoking the lease, which removes the waiter key whether or not the Lock was applied.
//!   An Unlock instead could run before a still-retried Lock and leave that one's key
//!   behind, holding the lock until its lease expired.
//!
//! A guard dropped without `unlock` revokes its lease in the background, as does an
//! abandoned lock; [`Client::close`] waits for such releases to finish. The fencing token is what makes a lock safe to rely on: a holder whose
//! lease expired (after a pause or a partition) may still believe it holds the lock, so
//! writes made under it should be guarded by the lock key's create revision (a txn compare
//! `create_revision(key) == token`), which fails once the key is gone.

use std::time::Duration;

use bytes::Bytes;
use oncekv_core::queue_key;
use oncekv_proto::v3lockpb::lock_client::LockClient;
use oncekv_proto::v3lockpb::{LockRequest, UnlockRequest};
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::client::{Client, Kind};
use crate::error::Error;
use crate::options::GetOptions;
use crate::responses::Header;

/// The TTL of a lock's own lease unless [`LockOptions::with_ttl`] says otherwise: etcd's
/// default session TTL.
pub const DEFAULT_LOCK_TTL_SECS: i64 = 60;

/// How a lock (or a candidacy) gets its lease.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LockOptions {
    ttl: Option<i64>,
    lease: Option<i64>,
}

impl LockOptions {
    /// A lease of the lock's own, with [`DEFAULT_LOCK_TTL_SECS`].
    pub fn new() -> LockOptions {
        LockOptions::default()
    }

    /// The TTL of the lock's own lease, in seconds: how long after this process dies the
    /// lock is released.
    pub fn with_ttl(mut self, secs: i64) -> LockOptions {
        self.ttl = Some(secs);
        self
    }

    /// Lock with the caller's lease `id` instead: the guard neither keeps it alive nor
    /// revokes it, and `unlock` deletes the key only.
    pub fn with_lease(mut self, id: i64) -> LockOptions {
        self.lease = Some(id);
        self
    }

    fn ttl(&self) -> i64 {
        self.ttl.unwrap_or(DEFAULT_LOCK_TTL_SECS)
    }
}

/// The lease a lock or a candidacy runs on, and what undoes it: while armed, dropping it
/// revokes an own lease (or deletes the key on the caller's lease) in the background.
#[derive(Debug)]
pub(crate) struct Tenure {
    client: Client,
    key: Bytes,
    lease: i64,
    own: bool,
    lost: watch::Receiver<bool>,
    keeper: Option<AbortHandle>,
    armed: bool,
}

impl Tenure {
    /// Grants the lease (unless `options` names one) and starts keeping it alive.
    pub(crate) async fn begin(
        client: &Client,
        name: &[u8],
        options: LockOptions,
    ) -> Result<Tenure, Error> {
        let (lost_tx, lost) = watch::channel(false);
        let (lease, own, keeper) = match options.lease {
            Some(id) => (id, false, None),
            None => {
                let granted = client.lease_grant(options.ttl(), 0).await?;
                let keeper = tokio::spawn(keep_alive(
                    client.clone(),
                    granted.id,
                    granted.ttl.max(1),
                    lost_tx,
                ));
                (granted.id, true, Some(keeper.abort_handle()))
            }
        };
        Ok(Tenure {
            client: client.clone(),
            key: queue_key(name, lease),
            lease,
            own,
            lost,
            keeper,
            armed: true,
        })
    }

    pub(crate) fn key(&self) -> &Bytes {
        &self.key
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    pub(crate) fn lease(&self) -> i64 {
        self.lease
    }

    pub(crate) fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    pub(crate) async fn lost(&self) {
        let mut lost = self.lost.clone();
        // An error means the keeper is gone without deciding: never lost by it.
        if lost.wait_for(|l| *l).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Ends the tenure now: revokes an own lease (the key goes with it), or deletes the
    /// key on the caller's lease. A lease already gone is no error: the lock is released
    /// either way.
    pub(crate) async fn end(mut self) -> Result<(), Error> {
        self.armed = false;
        if let Some(k) = self.keeper.take() {
            k.abort();
        }
        release(&self.client, self.own, self.lease, self.key.clone()).await
    }
}

async fn release(client: &Client, own: bool, lease: i64, key: Bytes) -> Result<(), Error> {
    if own {
        match client.lease_revoke(lease).await {
            Ok(_) | Err(Error::LeaseNotFound) => Ok(()),
            Err(e) => Err(e),
        }
    } else {
        client.unlock_key(key).await
    }
}

impl Drop for Tenure {
    fn drop(&mut self) {
        if let Some(k) = self.keeper.take() {
            k.abort();
        }
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (client, own, lease, key) =
            (self.client.clone(), self.own, self.lease, self.key.clone());
        let task = runtime.spawn({
            let client = client.clone();
            async move {
                if let Err(e) = release(&client, own, lease, key).await {
                    tracing::debug!("oncekv client: releasing an abandoned lock failed: {e}");
                }
            }
        });
        client.track_release(task);
    }
}

/// Renews `lease` every third of its TTL. Marks it lost when the cluster says it is gone,
/// or when no renewal succeeded for a whole TTL (it must have expired meanwhile).
async fn keep_alive(client: Client, lease: i64, ttl: i64, lost: watch::Sender<bool>) {
    let ttl = Duration::from_secs(ttl.unsigned_abs());
    let mut renewed = Instant::now();
    loop {
        tokio::time::sleep((ttl / 3).max(Duration::from_millis(100))).await;
        match client.lease_keep_alive(lease).await {
            Ok(_) => renewed = Instant::now(),
            Err(Error::LeaseNotFound) => break,
            Err(e) => {
                tracing::debug!("oncekv client: lock lease {lease:x} renewal failed: {e}");
                if renewed.elapsed() >= ttl {
                    break;
                }
            }
        }
    }
    let _ = lost.send(true);
}

/// A held lock. Release it with [`unlock`](Self::unlock); dropping it releases it in the
/// background.
#[must_use = "the lock is released when the guard is dropped"]
#[derive(Debug)]
pub struct LockGuard {
    name: Bytes,
    token: i64,
    header: Header,
    tenure: Tenure,
}

impl LockGuard {
    /// The lock's name.
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// The lock key: the lock is held while it exists.
    pub fn key(&self) -> &[u8] {
        self.tenure.key()
    }

    /// The fencing token: the lock key's create revision. Each holder of a lock has a
    /// larger one than the holders before it.
    pub fn fencing_token(&self) -> i64 {
        self.token
    }

    /// The lease the lock key is attached to.
    pub fn lease(&self) -> i64 {
        self.tenure.lease()
    }

    /// The store revision when the lock was granted.
    pub fn revision(&self) -> i64 {
        self.header.revision
    }

    /// Whether the lock's own lease was found gone (expired or revoked): the lock is no
    /// longer held. Always false on a caller's lease, which the guard does not watch.
    pub fn is_lost(&self) -> bool {
        self.tenure.is_lost()
    }

    /// Completes when [`is_lost`](Self::is_lost) becomes true.
    pub async fn lost(&self) {
        self.tenure.lost().await;
    }

    /// Releases the lock: revokes its own lease (deleting the key), or deletes the key on
    /// a caller's lease. Exactly once, like every write.
    pub async fn unlock(self) -> Result<(), Error> {
        self.tenure.end().await
    }
}

impl Client {
    /// Waits for the lock `name` on a lease of its own ([`LockOptions::new`]).
    pub async fn lock(&self, name: impl Into<Vec<u8>>) -> Result<LockGuard, Error> {
        self.lock_with(name, LockOptions::new()).await
    }

    /// Waits for the lock `name`; see the [module docs](crate::lock) for what the lease
    /// options mean. Dropping the future while it waits leaves the queue.
    pub async fn lock_with(
        &self,
        name: impl Into<Vec<u8>>,
        options: LockOptions,
    ) -> Result<LockGuard, Error> {
        let name = Bytes::from(name.into());
        let tenure = Tenure::begin(self, &name, options).await?;
        let req = LockRequest {
            name: name.clone(),
            lease: tenure.lease(),
        };
        let resp = self
            .call(Kind::Wait, "lock", req, |ch, r| async move {
                Ok(LockClient::new(ch).lock(r).await?.into_inner())
            })
            .await?;
        // The fencing token is the key's create revision, which the Lock answer does not
        // carry: read it. The key is gone only if the lease ended meanwhile.
        let read = self.range(resp.key.clone(), GetOptions::new()).await?;
        let token = match read.kvs.first() {
            Some(kv) if kv.lease == tenure.lease() => kv.create_revision,
            _ => {
                return Err(Error::LockLost(
                    "mutex: session is expired (the lock key was gone right after the lock \
                     was granted)"
                        .into(),
                ));
            }
        };
        Ok(LockGuard {
            name,
            token,
            header: resp.header.into(),
            tenure,
        })
    }

    /// etcd's Unlock: deletes a lock key (exactly once). [`LockGuard::unlock`] is the usual
    /// way; this is for a key obtained otherwise.
    pub async fn unlock_key(&self, key: impl Into<Vec<u8>>) -> Result<(), Error> {
        let req = UnlockRequest {
            key: Bytes::from(key.into()),
        };
        self.call(Kind::Write, "unlock", req, |ch, r| async move {
            Ok(LockClient::new(ch).unlock(r).await?.into_inner())
        })
        .await
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_default_to_an_own_lease_of_the_etcd_ttl() {
        assert_eq!(LockOptions::new().ttl(), DEFAULT_LOCK_TTL_SECS);
        assert_eq!(LockOptions::new().lease, None);
        let o = LockOptions::new().with_ttl(5).with_lease(7);
        assert_eq!((o.ttl(), o.lease), (5, Some(7)));
    }
}
