//! Writes: an op becomes a tracked command (with a session) or an untracked one, joins
//! the same request already in flight here, and is proposed by this member when it leads
//! or forwarded to the leader; a follower's batches are proposed here on the leader.

use crate::error::{ApiError, ProposeError};
use crate::forwarder::ForwardError;
#[cfg(feature = "sim")]
use crate::transport::MessageKind;
use crate::types::NodeId;
use oncekv_core::{AlarmKind, Command, Op, OpReply, Response, Tracked};
use oncekv_proto::SessionMeta;
use std::sync::Arc;

use super::NodeCore;
use super::reads::{failover_wait, leader_other_than};

/// A tracked request, by `(client_id, seq, op fingerprint)`.
pub(super) type RequestKey = (u64, u64, u64);

type Waiter = oncekv_core::waiting_list::Waiter<Result<Response, ProposeError>, ProposeError>;

/// [`NodeCore::join_or_claim`]'s answer.
enum InFlight {
    /// The same request is in flight: this waits for its result.
    Joined(Waiter),
    /// This caller proposes it; the marker keeps the key visibly in flight.
    Claimed(Waiter),
}

impl NodeCore {
    /// Before a write that adds data: past the space quota, raise NOSPACE (once, as etcd's
    /// quota check does) so that the state machine refuses the write. The refusal comes
    /// from the log, not from here: a retried tracked write that was applied before the
    /// quota filled must still get its saved reply.
    async fn check_quota(&self, op: &Op) -> Result<(), ProposeError> {
        let quota = self.config.quota_backend_bytes;
        // Far below the quota (the common case) nothing about the op needs measuring.
        let size = self.db_size();
        if quota == 0 || size + self.config.max_request_bytes as u64 <= quota {
            return Ok(());
        }
        if !op.adds_data() || size + op.approx_size() as u64 <= quota {
            return Ok(());
        }
        let raised = self
            .applied
            .read()
            .sm
            .alarms()
            .any(|(_, a)| a == AlarmKind::NoSpace);
        if !raised {
            tracing::warn!(
                db_size = self.db_size(),
                quota,
                "space quota exceeded; raising the NOSPACE alarm"
            );
            self.set_alarm(true, self.id, AlarmKind::NoSpace).await?;
        }
        Ok(())
    }

    /// Whether the tracked request `(client_id, seq, op fingerprint)` is being proposed
    /// through this node.
    pub fn is_in_flight(&self, key: &RequestKey) -> bool {
        self.in_flight.contains_key(key)
    }

    /// How many tracked requests wait in the in-flight list: originals being proposed
    /// plus retries joined to them.
    pub fn in_flight_waiters(&self) -> usize {
        self.in_flight.len()
    }

    /// Proposes `op`, tracked under the session in `meta` if there is one (exactly once),
    /// untracked otherwise (etcd behaviour), to be applied only under `permit`.
    pub async fn execute(
        self: &Arc<Self>,
        op: Op,
        meta: Option<SessionMeta>,
        permit: Permit,
    ) -> Result<OpReply, ApiError> {
        #[cfg(feature = "sim")]
        if let Some(delay) = self.peers.duplicate(MessageKind::ClientWrite) {
            // The network delivered this request twice; the copy's reply goes nowhere.
            let (node, op) = (self.clone(), op.clone());
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = node.execute_once(op, meta, permit).await;
            });
        }
        self.execute_once(op, meta, permit).await
    }

    async fn execute_once(
        &self,
        op: Op,
        meta: Option<SessionMeta>,
        permit: Permit,
    ) -> Result<OpReply, ApiError> {
        self.check_quota(&op).await?;
        let response = match meta {
            Some(m) => {
                let key = (m.client_id, m.seq, op.fingerprint());
                let command = Command::Tracked(Tracked {
                    client_id: m.client_id,
                    secret: m.secret,
                    seq: m.seq,
                    first_incomplete: m.first_incomplete,
                    fingerprint: key.2,
                    op,
                });
                self.propose_tracked(key, permit.wrap(command)).await?
            }
            None => self.propose(permit.wrap(Command::Untracked(op))).await?,
        };
        match response {
            Response::Op(Ok(reply)) => Ok(reply),
            Response::Op(Err(e)) => Err(ApiError::Session(e)),
            other => Err(ApiError::Internal(format!("{other:?}"))),
        }
    }

    /// Proposes a tracked command, or, if the same request is already being proposed
    /// through this node, waits for that one's response. Correctness does not depend on
    /// this: a duplicate that does get proposed is answered from the session's saved
    /// response by the state machine.
    async fn propose_tracked(
        &self,
        key: RequestKey,
        command: Command,
    ) -> Result<Response, ProposeError> {
        let _marker = match self.join_or_claim(key) {
            InFlight::Joined(waiter) => return waiter.await?,
            InFlight::Claimed(marker) => marker,
        };
        let result = self.propose(command).await;
        self.in_flight.complete(&key, result.clone());
        result
    }

    /// Joins the request `key` if it is in flight through this node, else marks it in
    /// flight (until the marker is dropped) so that copies arriving meanwhile join it; the
    /// claimer MUST complete `key` with its result.
    fn join_or_claim(&self, key: RequestKey) -> InFlight {
        if self.in_flight.contains_key(&key) {
            let deadline = tokio::time::Instant::now().into_std() + self.config.request_timeout;
            InFlight::Joined(self.in_flight.register(key, Some(deadline)))
        } else {
            InFlight::Claimed(self.in_flight.register(key, None))
        }
    }

    /// Proposes `command` through the leader: locally if this node leads, else forwarded.
    pub async fn propose(&self, command: Command) -> Result<Response, ProposeError> {
        // Forward straight away when another member is known to lead; otherwise let raft
        // decide (it answers NotLeader with the leader it knows of, if any).
        let result = match self.settled_leader().await {
            Some(leader) if leader != self.id => Err(ProposeError::NotLeader {
                leader: Some(leader),
            }),
            _ => self.propose_local(command.clone()).await,
        };
        let result = match result {
            Err(ProposeError::NotLeader {
                leader: Some(leader),
            }) if leader != self.id => {
                let sent = self
                    .forwarder
                    .forward(leader, command, self.config.request_timeout)
                    .await;
                match sent {
                    Ok(response) => Ok(response),
                    // The leader could not be dialed, so the command was not sent: a
                    // leader that crashed is still the one this member knows until the
                    // others elect a new one, so wait for that and send it there once.
                    Err(ForwardError::Unsent { command, reason }) => {
                        tracing::debug!(
                            leader = format!("{leader:x}"),
                            "the leader was not reached ({reason}); waiting for the next one"
                        );
                        self.propose_after(leader, command).await
                    }
                    Err(ForwardError::Failed(e)) => Err(e),
                }
            }
            Err(ProposeError::NotLeader { leader: None }) => Err(ProposeError::NoLeader),
            other => other,
        };
        if result.is_err() {
            self.metrics.proposal_failed();
        }
        result
    }

    /// Proposes `command` through whichever member leads after `gone`, waiting up to
    /// [`failover_wait`] for one; "no leader" if none does by then.
    async fn propose_after(
        &self,
        gone: NodeId,
        command: Command,
    ) -> Result<Response, ProposeError> {
        let leader = leader_other_than(&self.raft, failover_wait(&self.config), Some(gone)).await;
        let result = match leader {
            Some(leader) if leader == self.id => self.propose_local(command).await,
            Some(leader) => match self
                .forwarder
                .forward(leader, command, self.config.request_timeout)
                .await
            {
                Ok(response) => Ok(response),
                Err(ForwardError::Unsent { .. }) => Err(ProposeError::NoLeader),
                Err(ForwardError::Failed(e)) => Err(e),
            },
            None => Err(ProposeError::NoLeader),
        };
        result.map_err(|e| match e {
            ProposeError::NotLeader { .. } => ProposeError::NoLeader,
            other => other,
        })
    }

    /// Proposes only on this node (a forwarded request must not be forwarded again).
    pub(super) async fn propose_local(&self, command: Command) -> Result<Response, ProposeError> {
        if self.transferring.load(std::sync::atomic::Ordering::Acquire) {
            // Handing leadership over: new entries would keep the followers' leader lease
            // alive and stop the transferee's election.
            return Err(ProposeError::NoLeader);
        }
        self.proposer
            .propose(command, self.config.request_timeout)
            .await
    }

    /// A follower's batch, on the leader. A tracked command whose request is already in
    /// flight here (a retry or hedge that went through another member) joins it instead of
    /// being proposed again; the others are proposed together, each visibly in flight
    /// until answered, so that copies arriving meanwhile join them in turn.
    pub(crate) async fn propose_forwarded(
        &self,
        commands: Vec<Command>,
    ) -> Vec<Result<Response, ProposeError>> {
        if self.transferring.load(std::sync::atomic::Ordering::Acquire) {
            return vec![Err(ProposeError::NoLeader); commands.len()];
        }
        let mut results: Vec<Option<Result<Response, ProposeError>>> = vec![None; commands.len()];
        let (mut joined, mut proposing, mut batch, mut markers) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (i, command) in commands.into_iter().enumerate() {
            let key = command
                .tracked()
                .map(|t| (t.client_id, t.seq, t.fingerprint));
            if let Some(key) = key {
                match self.join_or_claim(key) {
                    InFlight::Joined(waiter) => {
                        joined.push((i, waiter));
                        continue;
                    }
                    InFlight::Claimed(marker) => markers.push(marker),
                }
            }
            proposing.push((i, key));
            batch.push(command);
        }
        let proposed = self
            .proposer
            .propose_many(batch, self.config.request_timeout)
            .await;
        for ((i, key), result) in proposing.into_iter().zip(proposed) {
            if let Some(key) = key {
                self.in_flight.complete(&key, result.clone());
            }
            results[i] = Some(result);
        }
        drop(markers);
        for (i, waiter) in joined {
            results[i] = Some(waiter.await.map_err(ProposeError::from).and_then(|r| r));
        }
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(ProposeError::Internal(
                        "the proposer answered fewer commands than it was given".into(),
                    ))
                })
            })
            .collect()
    }
}

/// The auth revision at which a client's write was permitted ([`crate::auth`]). It goes
/// into the log with the write (`Command::Authorized`), and applying the write refuses it
/// if the auth store has changed since: the member that checked may have done so on state
/// older than a revoke the leader had already applied, and etcd checks at apply too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct Permit {
    auth_revision: Option<u64>,
}

impl Permit {
    /// No check to repeat at apply: auth was off when the write was checked, or the
    /// write is one this member makes itself.
    pub const UNCHECKED: Permit = Permit {
        auth_revision: None,
    };

    /// Permitted by the auth store at `auth_revision`.
    pub(crate) fn at(auth_revision: u64) -> Permit {
        Permit {
            auth_revision: Some(auth_revision),
        }
    }

    /// `command`, to be applied only while the store is at this permit's revision.
    fn wrap(self, command: Command) -> Command {
        match self.auth_revision {
            Some(auth_revision) => Command::Authorized {
                auth_revision,
                command: Box::new(command),
            },
            None => command,
        }
    }
}
