//! etcd's v3election service (`/v3/election/...`): campaign, proclaim, leader, resign, and
//! observe as a stream of lines.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{MethodRouter, post};
use bytes::Bytes;
use serde_json::Value;
use tonic::Status;

use super::call::{Gateway, request, unary};
use super::json::{Obj, bytes_of, field, header, header_only, int_of, parse};
use super::kv::kv;
use super::reply::{error, lines};
use crate::etcd::ElectionService;
use crate::pb::v3electionpb as electionpb;
use crate::pb::v3electionpb::election_server::Election;

/// The paths this service answers at, under `/v3` and `/v3beta`.
pub(super) fn rpcs() -> Vec<(&'static str, MethodRouter<Gateway>)> {
    vec![
        ("election/campaign", post(campaign)),
        ("election/proclaim", post(proclaim)),
        ("election/leader", post(leader)),
        ("election/observe", post(observe)),
        ("election/resign", post(resign)),
    ]
}

/// A `LeaderKey` field (`{"name", "key", "rev", "lease"}`); absent is `None`, which the
/// election service answers with etcd's error.
fn leader_key_of(v: &Value, name: &str) -> Result<Option<electionpb::LeaderKey>, Status> {
    match field(v, name) {
        None | Some(Value::Null) => Ok(None),
        Some(l @ Value::Object(_)) => Ok(Some(electionpb::LeaderKey {
            name: bytes_of(l, "name")?,
            key: bytes_of(l, "key")?,
            rev: int_of(l, "rev")?,
            lease: int_of(l, "lease")?,
        })),
        Some(other) => Err(Status::invalid_argument(format!(
            "{name}: expected an object, got {other}"
        ))),
    }
}

fn leader_key(l: &electionpb::LeaderKey) -> Value {
    Obj::default()
        .bytes("name", &l.name)
        .bytes("key", &l.key)
        .int("rev", l.rev)
        .int("lease", l.lease)
        .done()
}

fn leader_resp(r: &electionpb::LeaderResponse) -> Value {
    Obj::default()
        .value("header", header(&r.header))
        .value("kv", r.kv.as_ref().map(kv))
        .done()
}

/// `{"name", "lease", "value"}` → `{"header", "leader": {"name", "key", "rev", "lease"}}`,
/// once the caller leads (the request waits, as a lock does).
async fn campaign(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let e = ElectionService {
        node: g.core,
        stop: g.stop,
    };
    let build = |v: &Value| {
        Ok(electionpb::CampaignRequest {
            name: bytes_of(v, "name")?,
            lease: int_of(v, "lease")?,
            value: bytes_of(v, "value")?,
        })
    };
    let write = |r: &electionpb::CampaignResponse| {
        Obj::default()
            .value("header", header(&r.header))
            .value("leader", r.leader.as_ref().map(leader_key))
            .done()
    };
    unary(&headers, &body, build, |r| e.campaign(r), write).await
}

async fn proclaim(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let e = ElectionService {
        node: g.core,
        stop: g.stop,
    };
    let build = |v: &Value| {
        Ok(electionpb::ProclaimRequest {
            leader: leader_key_of(v, "leader")?,
            value: bytes_of(v, "value")?,
        })
    };
    let write = |r: &electionpb::ProclaimResponse| header_only(&r.header);
    unary(&headers, &body, build, |r| e.proclaim(r), write).await
}

/// `{"name"}` → `{"header", "kv"}`: the leader's key and the value it proclaims.
async fn leader(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let e = ElectionService {
        node: g.core,
        stop: g.stop,
    };
    let build = |v: &Value| {
        Ok(electionpb::LeaderRequest {
            name: bytes_of(v, "name")?,
        })
    };
    unary(&headers, &body, build, |r| e.leader(r), leader_resp).await
}

/// `POST /v3/election/observe` with `{"name"}`: a `{"result": {"header", "kv"}}` line for
/// the leader and for each change of leader or value, until the client goes away or the
/// server stops.
async fn observe(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let e = ElectionService {
        node: g.core,
        stop: g.stop,
    };
    let responses = async {
        let name = bytes_of(&parse(&body)?, "name")?;
        e.observe(request(&headers, electionpb::LeaderRequest { name }))
            .await
    };
    match responses.await {
        // The service ends the stream at the server's stop.
        Ok(responses) => lines(responses.into_inner(), leader_resp),
        Err(s) => error(&s),
    }
}

async fn resign(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let e = ElectionService {
        node: g.core,
        stop: g.stop,
    };
    let build = |v: &Value| {
        Ok(electionpb::ResignRequest {
            leader: leader_key_of(v, "leader")?,
        })
    };
    let write = |r: &electionpb::ResignResponse| header_only(&r.header);
    unary(&headers, &body, build, |r| e.resign(r), write).await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn objects_keep_the_proto_field_order() {
        let key = leader_key(&electionpb::LeaderKey {
            name: Bytes::from_static(b"n"),
            key: Bytes::from_static(b"k"),
            rev: 2,
            lease: 3,
        });
        assert_eq!(
            key.to_string(),
            r#"{"name":"bg==","key":"aw==","rev":"2","lease":"3"}"#
        );
    }

    #[test]
    fn a_leader_key_must_be_an_object() {
        let v = json!({"leader": {"name": "ZWxl", "rev": "4", "lease": 7}, "bad": "x"});
        let l = leader_key_of(&v, "leader").unwrap().unwrap();
        assert_eq!((&l.name[..], l.rev, l.lease), (&b"ele"[..], 4, 7));
        assert!(leader_key_of(&v, "missing").unwrap().is_none());
        let e = leader_key_of(&v, "bad").unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }
}
