//! `-w json`: the JSON etcdctl 3.4 prints, which is Go's `encoding/json` of etcd's client
//! response structs. So: the Go field names (snake_case for protobuf messages, `ID`/`TTL`
//! for the lease wrappers, camelCase for `Member` and `Status`), zero fields left out
//! where etcd's structs say `omitempty`, 64-bit integers as plain numbers, byte strings in
//! base64, and `<`, `>`, `&` escaped as `\u003c` and so on.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use oncekv_client::{
    DeleteResponse, EventType, Header, KeyValue, LeaseGrantResponse, LeaseKeepAliveResponse,
    LeaseRevokeResponse, LeaseTimeToLiveResponse, MemberListResponse, PutResponse, RangeResponse,
    TxnOpResponse, TxnResponse, WatchResponse,
};
use serde::Serialize;

use super::endpoint_status::EndpointStatus;

fn zero<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

fn base64(b: &[u8]) -> String {
    STANDARD.encode(b)
}

/// A `[]byte` field with `omitempty`.
fn base64_opt(b: &[u8]) -> Option<String> {
    (!b.is_empty()).then(|| base64(b))
}

#[derive(Debug, Serialize)]
struct JsonHeader {
    #[serde(skip_serializing_if = "zero")]
    cluster_id: u64,
    #[serde(skip_serializing_if = "zero")]
    member_id: u64,
    #[serde(skip_serializing_if = "zero")]
    revision: i64,
    #[serde(skip_serializing_if = "zero")]
    raft_term: u64,
}

impl From<&Header> for JsonHeader {
    fn from(h: &Header) -> JsonHeader {
        JsonHeader {
            cluster_id: h.cluster_id,
            member_id: h.member_id,
            revision: h.revision,
            raft_term: h.raft_term,
        }
    }
}

/// A `header` field: left out when the server sent none (the client then reports zeros).
fn header(h: &Header) -> Option<JsonHeader> {
    (*h != Header::default()).then(|| h.into())
}

#[derive(Debug, Serialize)]
struct JsonKv {
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    #[serde(skip_serializing_if = "zero")]
    create_revision: i64,
    #[serde(skip_serializing_if = "zero")]
    mod_revision: i64,
    #[serde(skip_serializing_if = "zero")]
    version: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<String>,
    #[serde(skip_serializing_if = "zero")]
    lease: i64,
}

impl From<&KeyValue> for JsonKv {
    fn from(kv: &KeyValue) -> JsonKv {
        JsonKv {
            key: base64_opt(&kv.key),
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
            value: base64_opt(&kv.value),
            lease: kv.lease,
        }
    }
}

#[derive(Debug, Serialize)]
struct JsonRange {
    #[serde(skip_serializing_if = "Option::is_none")]
    header: Option<JsonHeader>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    kvs: Vec<JsonKv>,
    #[serde(skip_serializing_if = "zero")]
    more: bool,
    #[serde(skip_serializing_if = "zero")]
    count: i64,
}

impl From<&RangeResponse> for JsonRange {
    fn from(r: &RangeResponse) -> JsonRange {
        JsonRange {
            header: header(&r.header),
            kvs: r.kvs.iter().map(JsonKv::from).collect(),
            more: r.more,
            count: r.count,
        }
    }
}

#[derive(Debug, Serialize)]
struct JsonPut {
    #[serde(skip_serializing_if = "Option::is_none")]
    header: Option<JsonHeader>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prev_kv: Option<JsonKv>,
}

impl From<&PutResponse> for JsonPut {
    fn from(r: &PutResponse) -> JsonPut {
        JsonPut {
            header: header(&r.header),
            prev_kv: r.prev_kv.as_ref().map(JsonKv::from),
        }
    }
}

#[derive(Debug, Serialize)]
struct JsonDelete {
    #[serde(skip_serializing_if = "Option::is_none")]
    header: Option<JsonHeader>,
    #[serde(skip_serializing_if = "zero")]
    deleted: i64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    prev_kvs: Vec<JsonKv>,
}

impl From<&DeleteResponse> for JsonDelete {
    fn from(r: &DeleteResponse) -> JsonDelete {
        JsonDelete {
            header: header(&r.header),
            deleted: r.deleted,
            prev_kvs: r.prev_kvs.iter().map(JsonKv::from).collect(),
        }
    }
}

#[derive(Debug, Serialize)]
struct JsonTxn {
    #[serde(skip_serializing_if = "Option::is_none")]
    header: Option<JsonHeader>,
    #[serde(skip_serializing_if = "zero")]
    succeeded: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    responses: Vec<JsonResponseOp>,
}

/// Go's encoding of a protobuf `oneof`: the interface field, then the wrapper's field.
#[derive(Debug, Serialize)]
struct JsonResponseOp {
    #[serde(rename = "Response")]
    response: JsonOneOf,
}

#[derive(Debug, Serialize)]
enum JsonOneOf {
    #[serde(rename = "ResponseRange")]
    Range(JsonRange),
    #[serde(rename = "ResponsePut")]
    Put(JsonPut),
    #[serde(rename = "ResponseDeleteRange")]
    Delete(JsonDelete),
    #[serde(rename = "ResponseTxn")]
    Txn(JsonTxn),
}

impl From<&TxnResponse> for JsonTxn {
    fn from(r: &TxnResponse) -> JsonTxn {
        JsonTxn {
            header: header(&r.header),
            succeeded: r.succeeded,
            responses: r
                .responses
                .iter()
                .map(|op| JsonResponseOp {
                    response: match op {
                        TxnOpResponse::Get(r) => JsonOneOf::Range(r.into()),
                        TxnOpResponse::Put(r) => JsonOneOf::Put(r.into()),
                        TxnOpResponse::Delete(r) => JsonOneOf::Delete(r.into()),
                        TxnOpResponse::Txn(r) => JsonOneOf::Txn(r.into()),
                    },
                })
                .collect(),
        }
    }
}

/// clientv3's lease responses embed the header (its fields appear at the top level).
#[derive(Debug, Serialize)]
struct JsonLeaseGrant {
    #[serde(flatten)]
    header: JsonHeader,
    #[serde(rename = "ID")]
    id: i64,
    #[serde(rename = "TTL")]
    ttl: i64,
    #[serde(rename = "Error")]
    error: String,
}

#[derive(Debug, Serialize)]
struct JsonKeepAlive {
    #[serde(flatten)]
    header: JsonHeader,
    #[serde(rename = "ID")]
    id: i64,
    #[serde(rename = "TTL")]
    ttl: i64,
}

#[derive(Debug, Serialize)]
struct JsonTimeToLive {
    #[serde(flatten)]
    header: JsonHeader,
    id: i64,
    ttl: i64,
    #[serde(rename = "granted-ttl")]
    granted_ttl: i64,
    /// `null` when there are none (a nil Go slice).
    keys: Option<Vec<String>>,
}

#[derive(Debug, Serialize)]
struct JsonLeaseRevoke {
    #[serde(skip_serializing_if = "Option::is_none")]
    header: Option<JsonHeader>,
}

#[derive(Debug, Serialize)]
struct JsonMemberList {
    #[serde(skip_serializing_if = "Option::is_none")]
    header: Option<JsonHeader>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    members: Vec<JsonMember>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonMember {
    #[serde(rename = "ID", skip_serializing_if = "zero")]
    id: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    name: String,
    #[serde(rename = "peerURLs", skip_serializing_if = "Vec::is_empty")]
    peer_urls: Vec<String>,
    #[serde(rename = "clientURLs", skip_serializing_if = "Vec::is_empty")]
    client_urls: Vec<String>,
    #[serde(skip_serializing_if = "zero")]
    is_learner: bool,
}

#[derive(Debug, Serialize)]
struct JsonEndpointStatus {
    #[serde(rename = "Endpoint")]
    endpoint: String,
    #[serde(rename = "Status")]
    status: JsonStatus,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonStatus {
    #[serde(skip_serializing_if = "Option::is_none")]
    header: Option<JsonHeader>,
    #[serde(skip_serializing_if = "String::is_empty")]
    version: String,
    #[serde(skip_serializing_if = "zero")]
    db_size: i64,
    #[serde(skip_serializing_if = "zero")]
    leader: u64,
    #[serde(skip_serializing_if = "zero")]
    raft_index: u64,
    #[serde(skip_serializing_if = "zero")]
    raft_term: u64,
    #[serde(skip_serializing_if = "zero")]
    raft_applied_index: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    errors: Vec<String>,
    #[serde(skip_serializing_if = "zero")]
    db_size_in_use: i64,
    #[serde(skip_serializing_if = "zero")]
    is_learner: bool,
}

/// clientv3's `WatchResponse`: Go field names without JSON tags (so capitalised, and never
/// left out), a header that is a struct value (`{}` when empty), and the events as etcd's
/// `mvccpb.Event` (`type` left out for a put, which is 0).
#[derive(Debug, Serialize)]
struct JsonWatch {
    #[serde(rename = "Header")]
    header: JsonHeader,
    #[serde(rename = "Events")]
    events: Vec<JsonEvent>,
    #[serde(rename = "CompactRevision")]
    compact_revision: i64,
    #[serde(rename = "Canceled")]
    canceled: bool,
    #[serde(rename = "Created")]
    created: bool,
}

#[derive(Debug, Serialize)]
struct JsonEvent {
    #[serde(rename = "type", skip_serializing_if = "zero")]
    kind: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    kv: Option<JsonKv>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prev_kv: Option<JsonKv>,
}

/// One JSON document and a newline, escaped as Go escapes it.
fn document(value: &impl Serialize) -> Vec<u8> {
    let text = match serde_json::to_string(value) {
        Ok(text) => text,
        // Plain structs of strings and numbers always serialize.
        Err(e) => format!("{{\"error\":{:?}}}", e.to_string()),
    };
    // These characters can only occur inside strings, so replacing them keeps the JSON
    // valid and equal to Go's (which escapes them for safe embedding in HTML).
    let mut out = String::with_capacity(text.len() + 1);
    for c in text.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out.push('\n');
    out.into_bytes()
}

pub(crate) fn range(r: &RangeResponse) -> Vec<u8> {
    document(&JsonRange::from(r))
}

pub(crate) fn put(r: &PutResponse) -> Vec<u8> {
    document(&JsonPut::from(r))
}

pub(crate) fn delete(r: &DeleteResponse) -> Vec<u8> {
    document(&JsonDelete::from(r))
}

pub(crate) fn txn(r: &TxnResponse) -> Vec<u8> {
    document(&JsonTxn::from(r))
}

pub(crate) fn lease_grant(r: &LeaseGrantResponse) -> Vec<u8> {
    document(&JsonLeaseGrant {
        header: (&r.header).into(),
        id: r.id,
        ttl: r.ttl,
        error: String::new(),
    })
}

pub(crate) fn lease_revoke(r: &LeaseRevokeResponse) -> Vec<u8> {
    document(&JsonLeaseRevoke {
        header: header(&r.header),
    })
}

pub(crate) fn keep_alive(r: &LeaseKeepAliveResponse) -> Vec<u8> {
    document(&JsonKeepAlive {
        header: (&r.header).into(),
        id: r.id,
        ttl: r.ttl,
    })
}

pub(crate) fn time_to_live(r: &LeaseTimeToLiveResponse) -> Vec<u8> {
    document(&JsonTimeToLive {
        header: (&r.header).into(),
        id: r.id,
        ttl: r.ttl,
        granted_ttl: r.granted_ttl,
        keys: (!r.keys.is_empty()).then(|| r.keys.iter().map(|k| base64(k)).collect()),
    })
}

pub(crate) fn member_list(r: &MemberListResponse) -> Vec<u8> {
    document(&JsonMemberList {
        header: header(&r.header),
        members: r
            .members
            .iter()
            .map(|m| JsonMember {
                id: m.id,
                name: m.name.clone(),
                peer_urls: m.peer_urls.clone(),
                client_urls: m.client_urls.clone(),
                is_learner: m.is_learner,
            })
            .collect(),
    })
}

pub(crate) fn endpoint_status(statuses: &[EndpointStatus]) -> Vec<u8> {
    let list: Vec<JsonEndpointStatus> = statuses
        .iter()
        .map(|e| {
            let s = &e.status;
            JsonEndpointStatus {
                endpoint: e.endpoint.clone(),
                status: JsonStatus {
                    header: header(&s.header),
                    version: s.version.clone(),
                    db_size: s.db_size,
                    leader: s.leader,
                    raft_index: s.raft_index,
                    raft_term: s.raft_term,
                    raft_applied_index: s.raft_applied_index,
                    errors: s.errors.clone(),
                    db_size_in_use: s.db_size_in_use,
                    is_learner: s.is_learner,
                },
            }
        })
        .collect();
    document(&list)
}

pub(crate) fn watch(r: &WatchResponse) -> Vec<u8> {
    document(&JsonWatch {
        header: (&r.header).into(),
        events: r
            .events
            .iter()
            .map(|e| JsonEvent {
                kind: match e.kind {
                    EventType::Put => 0,
                    EventType::Delete => 1,
                },
                kv: Some((&e.kv).into()),
                prev_kv: e.prev_kv.as_ref().map(JsonKv::from),
            })
            .collect(),
        compact_revision: 0,
        canceled: false,
        created: false,
    })
}

/// The response etcdctl prints when the server cancels a watch that needs compacted
/// history (the client library reports it as an error, without the header).
pub(crate) fn watch_compacted(compact_revision: i64) -> Vec<u8> {
    document(&JsonWatch {
        header: (&Header::default()).into(),
        events: Vec::new(),
        compact_revision,
        canceled: true,
        created: false,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use bytes::Bytes;

    // etcdctl's JSON is what scripts parse: zero fields must be absent, numbers plain,
    // bytes base64 — byte for byte what etcdctl printed for the same answer.
    #[test]
    fn a_get_prints_as_etcdctl_prints_it() {
        let r = RangeResponse {
            header: Header {
                cluster_id: 12101053776118486841,
                member_id: 15985099378392235387,
                revision: 5,
                raft_term: 2,
            },
            kvs: vec![KeyValue {
                key: Bytes::from("foo"),
                create_revision: 2,
                mod_revision: 5,
                version: 4,
                value: Bytes::from("fromstdin\n"),
                lease: 0,
            }],
            more: false,
            count: 1,
        };
        let want = r#"{"header":{"cluster_id":12101053776118486841,"member_id":15985099378392235387,"revision":5,"raft_term":2},"kvs":[{"key":"Zm9v","create_revision":2,"mod_revision":5,"version":4,"value":"ZnJvbXN0ZGluCg=="}],"count":1}"#;
        assert_eq!(String::from_utf8(range(&r)).unwrap(), format!("{want}\n"));
    }

    #[test]
    fn lease_responses_embed_the_header() {
        let h = Header {
            cluster_id: 1,
            member_id: 2,
            revision: 24,
            raft_term: 2,
        };
        let grant = LeaseGrantResponse {
            header: h,
            id: 9041998796911733549,
            ttl: 60,
        };
        assert_eq!(
            String::from_utf8(lease_grant(&grant)).unwrap(),
            "{\"cluster_id\":1,\"member_id\":2,\"revision\":24,\"raft_term\":2,\
             \"ID\":9041998796911733549,\"TTL\":60,\"Error\":\"\"}\n"
        );
        let expired = LeaseTimeToLiveResponse {
            header: h,
            id: 5,
            ttl: -1,
            granted_ttl: 0,
            keys: vec![],
        };
        assert_eq!(
            String::from_utf8(time_to_live(&expired)).unwrap(),
            "{\"cluster_id\":1,\"member_id\":2,\"revision\":24,\"raft_term\":2,\
             \"id\":5,\"ttl\":-1,\"granted-ttl\":0,\"keys\":null}\n"
        );
    }

    #[test]
    fn txn_responses_use_gos_oneof_names_and_html_escapes() {
        let r = TxnResponse {
            header: Header::default(),
            succeeded: true,
            responses: vec![TxnOpResponse::Put(PutResponse {
                header: Header {
                    revision: 23,
                    ..Header::default()
                },
                prev_kv: None,
            })],
        };
        assert_eq!(
            String::from_utf8(txn(&r)).unwrap(),
            "{\"succeeded\":true,\"responses\":[{\"Response\":{\"ResponsePut\":\
             {\"header\":{\"revision\":23}}}}]}\n"
        );
        let members = MemberListResponse {
            header: Header::default(),
            members: vec![oncekv_client::Member {
                id: 1,
                name: "<a&b>".into(),
                ..Default::default()
            }],
        };
        assert_eq!(
            String::from_utf8(member_list(&members)).unwrap(),
            "{\"members\":[{\"ID\":1,\"name\":\"\\u003ca\\u0026b\\u003e\"}]}\n"
        );
    }
}
