//! etcd's Maintenance calls an operator makes: alarms, HashKV, defragmentation, moving
//! the leader.

use oncekv_proto::etcdserverpb::kv_client::KvClient;
use oncekv_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use oncekv_proto::etcdserverpb::{
    AlarmRequest, AlarmType, DefragmentRequest, HashKvRequest, MoveLeaderRequest, RangeRequest,
    StatusRequest, alarm_request::AlarmAction,
};
use tonic::Request;

use crate::client::Client;
use crate::error::Error;

/// A raised alarm: the member it is for, and its type (`NOSPACE` or `CORRUPT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alarm {
    pub member_id: u64,
    pub alarm: &'static str,
}

/// A member's HashKV answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashKv {
    pub hash: u32,
    /// The revision hashed (the header's).
    pub revision: i64,
    pub compact_revision: i64,
}

fn alarms(list: Vec<oncekv_proto::etcdserverpb::AlarmMember>) -> Vec<Alarm> {
    list.into_iter()
        .map(|a| Alarm {
            member_id: a.member_id,
            alarm: match AlarmType::try_from(a.alarm) {
                Ok(AlarmType::Nospace) => "NOSPACE",
                Ok(AlarmType::Corrupt) => "CORRUPT",
                _ => "NONE",
            },
        })
        .collect()
}

impl Client {
    async fn alarm(
        &self,
        action: AlarmAction,
        member_id: u64,
        alarm: i32,
    ) -> Result<Vec<oncekv_proto::etcdserverpb::AlarmMember>, Error> {
        let r = self
            .first_answer(|channel, timeout| async move {
                let mut request = Request::new(AlarmRequest {
                    action: action as i32,
                    member_id,
                    alarm,
                });
                request.set_timeout(timeout);
                MaintenanceClient::new(channel).alarm(request).await
            })
            .await?;
        Ok(r.alarms)
    }

    /// The raised alarms.
    pub async fn alarm_list(&self) -> Result<Vec<Alarm>, Error> {
        let raised = self
            .alarm(AlarmAction::Get, 0, AlarmType::None as i32)
            .await?;
        Ok(alarms(raised))
    }

    /// Clears every raised alarm (etcdctl's `alarm disarm`); returns those cleared. A
    /// NOSPACE alarm comes back with the next write if the space was not freed.
    pub async fn alarm_disarm(&self) -> Result<Vec<Alarm>, Error> {
        let raised = self
            .alarm(AlarmAction::Get, 0, AlarmType::None as i32)
            .await?;
        let mut cleared = Vec::new();
        for a in raised {
            cleared.extend(
                self.alarm(AlarmAction::Deactivate, a.member_id, a.alarm)
                    .await?,
            );
        }
        Ok(alarms(cleared))
    }

    /// The HashKV of the member at `endpoint` at `revision` (0: its newest).
    pub async fn hash_kv(&self, endpoint: &str, revision: i64) -> Result<HashKv, Error> {
        self.answer_of(endpoint, &|channel, timeout| async move {
            let mut request = Request::new(HashKvRequest { revision });
            request.set_timeout(timeout);
            MaintenanceClient::new(channel).hash_kv(request).await
        })
        .await
        .map(|r| HashKv {
            hash: r.hash,
            revision: r.header.map_or(0, |h| h.revision),
            compact_revision: r.compact_revision,
        })
        .map_err(|(e, _)| e)
    }

    /// Defragments the member at `endpoint` (oncekv: takes a snapshot now and drops the
    /// log before it).
    pub async fn defragment(&self, endpoint: &str) -> Result<(), Error> {
        self.answer_of(endpoint, &|channel, timeout| async move {
            let mut request = Request::new(DefragmentRequest {});
            request.set_timeout(timeout);
            MaintenanceClient::new(channel).defragment(request).await
        })
        .await
        .map(|_| ())
        .map_err(|(e, _)| e)
    }

    /// A linearizable read of `key` at the member at `endpoint`, one attempt: what
    /// `endpoint health` checks (a leader, a quorum, the member caught up).
    pub async fn get_at(&self, endpoint: &str, key: &str) -> Result<(), Error> {
        let key = bytes::Bytes::copy_from_slice(key.as_bytes());
        self.answer_of(endpoint, &|channel, timeout| {
            let key = key.clone();
            async move {
                let mut request = Request::new(RangeRequest {
                    key,
                    ..Default::default()
                });
                request.set_timeout(timeout);
                KvClient::new(channel).range(request).await
            }
        })
        .await
        .map(|_| ())
        .map_err(|(e, _)| e)
    }

    /// Hands leadership to member `target`, through whichever endpoint leads; returns the
    /// previous leader's id.
    pub async fn move_leader(&self, target: u64) -> Result<u64, Error> {
        let mut leader = None;
        for endpoint in self.endpoint_urls() {
            let status = self
                .answer_of(&endpoint, &|channel, timeout| async move {
                    let mut request = Request::new(StatusRequest {});
                    request.set_timeout(timeout);
                    MaintenanceClient::new(channel).status(request).await
                })
                .await;
            if let Ok(s) = status
                && s.header.is_some_and(|h| h.member_id == s.leader)
            {
                leader = Some((endpoint, s.leader));
                break;
            }
        }
        let Some((endpoint, id)) = leader else {
            return Err(Error::InvalidArgument(
                "no leader endpoint given: list the leader's client URL in --endpoints".to_string(),
            ));
        };
        // Two election timeouts or more: the transfer waits out the leader's lease.
        let answer = self
            .answer_of(&endpoint, &|channel, _timeout| async move {
                MaintenanceClient::new(channel)
                    .move_leader(Request::new(MoveLeaderRequest { target_id: target }))
                    .await
            })
            .await;
        answer.map(|_| id).map_err(|(e, _)| e)
    }
}
