//! etcd's v3election service (`/v3/election/...`): campaign, proclaim, leader, resign, and
//! observe as a stream of lines.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{MethodRouter, post};
use bytes::Bytes;

use super::call::{Gateway, request, unary};
use super::json::parse;
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

/// `{"name", "lease", "value"}` → `{"header", "leader": {"name", "key", "rev", "lease"}}`,
/// once the caller leads (the request waits, as a lock does).
async fn campaign(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let e = ElectionService {
        node: g.core,
        stop: g.stop,
    };
    unary(&headers, &body, |r| e.campaign(r)).await
}

async fn proclaim(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let e = ElectionService {
        node: g.core,
        stop: g.stop,
    };
    unary(&headers, &body, |r| e.proclaim(r)).await
}

/// `{"name"}` → `{"header", "kv"}`: the leader's key and the value it proclaims.
async fn leader(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let e = ElectionService {
        node: g.core,
        stop: g.stop,
    };
    unary(&headers, &body, |r| e.leader(r)).await
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
        let req: electionpb::LeaderRequest = parse(&body)?;
        e.observe(request(&headers, req)).await
    };
    match responses.await {
        // The service ends the stream at the server's stop.
        Ok(responses) => lines(responses.into_inner()),
        Err(s) => error(&s),
    }
}

async fn resign(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let e = ElectionService {
        node: g.core,
        stop: g.stop,
    };
    unary(&headers, &body, |r| e.resign(r)).await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn objects_keep_the_proto_field_order() {
        let key = super::super::json::to_json(&electionpb::LeaderKey {
            name: Bytes::from_static(b"n"),
            key: Bytes::from_static(b"k"),
            rev: 2,
            lease: 3,
        })
        .unwrap();
        assert_eq!(
            key.to_string(),
            r#"{"name":"bg==","key":"aw==","rev":"2","lease":"3"}"#
        );
    }

    #[test]
    fn a_leader_key_must_be_an_object() {
        let req: electionpb::ProclaimRequest = parse(&Bytes::from_static(
            br#"{"leader": {"name": "ZWxl", "rev": "4", "lease": 7}, "bad": "x"}"#,
        ))
        .unwrap();
        let l = req.leader.unwrap();
        assert_eq!((&l.name[..], l.rev, l.lease), (&b"ele"[..], 4, 7));
        let req: electionpb::ResignRequest = parse(&Bytes::from_static(b"{}")).unwrap();
        assert!(req.leader.is_none());
        let e = parse::<electionpb::ProclaimRequest>(&Bytes::from_static(br#"{"leader": "x"}"#))
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }
}
