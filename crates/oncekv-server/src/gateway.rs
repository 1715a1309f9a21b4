//! etcd's JSON gateway: the v3 API as HTTP+JSON on the client port, for curl and clients
//! that speak no gRPC (`POST /v3/kv/put` and so on).
//!
//! The mapping is grpc-gateway's as etcd configures it: proto field names (`range_end`,
//! `create_revision`), bytes as base64, 64-bit integers as strings (numbers are taken
//! too), fields with zero values left out, enums by name or number. A watch, a lease
//! keep-alive and a snapshot are POSTs whose response is a stream of `{"result": ...}`
//! objects, one per line. Errors come as `{"error", "message", "code"}` with the HTTP
//! status etcd 3.4's grpc-gateway gives the gRPC code.
//!
//! etcd's v3lock and v3election services are served too (`/v3/lock/lock`,
//! `/v3/election/campaign` and so on, as etcd 3.4 registers them beside the KV gateway);
//! an election's observe is a stream of lines like a watch.
//!
//! Every request runs through the same service code as its gRPC twin. The oncekv session
//! headers (`oncekv-client-id`, `oncekv-session-secret`, `oncekv-seq`,
//! `oncekv-first-incomplete`) are passed on as gRPC metadata, so a gateway write can be
//! exactly-once too.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, post};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde_json::{Map, Value, json};
use tokio::sync::watch;
use tonic::Status;

use crate::etcd::{
    AuthService, ClusterService, ElectionService, KvService, LeaseService, LockService,
    MaintenanceService,
};
use crate::pb::authpb;
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::auth_server::Auth;
use crate::pb::etcdserverpb::cluster_server::Cluster;
use crate::pb::etcdserverpb::kv_server::Kv;
use crate::pb::etcdserverpb::lease_server::Lease;
use crate::pb::etcdserverpb::maintenance_server::Maintenance;
use crate::pb::mvccpb;
use crate::pb::v3electionpb as electionpb;
use crate::pb::v3electionpb::election_server::Election;
use crate::pb::v3lockpb as lockpb;
use crate::pb::v3lockpb::lock_server::Lock;
use crate::request_path::NodeCore;

#[derive(Clone, Debug)]
struct Gateway {
    core: Arc<NodeCore>,
    stop: watch::Receiver<bool>,
}

/// The gateway's routes: every v3 RPC at its path in etcd's `rpc.proto` (and the lock and
/// election services at theirs in `v3lock.proto` and `v3election.proto`), under `/v3` and
/// again under `/v3beta`, as etcd 3.4 serves them (it answers 404 under `/v3alpha`).
pub fn routes(core: Arc<NodeCore>, stop: watch::Receiver<bool>) -> Router {
    let rpcs: Vec<(&str, MethodRouter<Gateway>)> = vec![
        ("kv/range", post(range)),
        ("kv/put", post(put)),
        ("kv/deleterange", post(delete_range)),
        ("kv/txn", post(txn)),
        ("kv/compaction", post(compaction)),
        ("watch", post(watch)),
        ("lease/grant", post(lease_grant)),
        ("lease/revoke", post(lease_revoke)),
        ("kv/lease/revoke", post(lease_revoke)),
        ("lease/keepalive", post(lease_keep_alive)),
        ("lease/timetolive", post(lease_time_to_live)),
        ("kv/lease/timetolive", post(lease_time_to_live)),
        ("lease/leases", post(lease_leases)),
        ("kv/lease/leases", post(lease_leases)),
        ("cluster/member/add", post(member_add)),
        ("cluster/member/remove", post(member_remove)),
        ("cluster/member/update", post(member_update)),
        ("cluster/member/list", post(member_list)),
        ("cluster/member/promote", post(member_promote)),
        ("maintenance/alarm", post(alarm)),
        ("maintenance/status", post(status)),
        ("maintenance/defragment", post(defragment)),
        ("maintenance/hash", post(hash)),
        ("maintenance/hashkv", post(hash_kv)),
        ("maintenance/snapshot", post(snapshot)),
        ("maintenance/transfer-leadership", post(move_leader)),
        ("auth/enable", post(auth_enable)),
        ("auth/disable", post(auth_disable)),
        ("auth/status", post(auth_status)),
        ("auth/authenticate", post(authenticate)),
        ("auth/user/add", post(user_add)),
        ("auth/user/get", post(user_get)),
        ("auth/user/list", post(user_list)),
        ("auth/user/delete", post(user_delete)),
        ("auth/user/changepw", post(user_change_password)),
        ("auth/user/grant", post(user_grant_role)),
        ("auth/user/revoke", post(user_revoke_role)),
        ("auth/role/add", post(role_add)),
        ("auth/role/get", post(role_get)),
        ("auth/role/list", post(role_list)),
        ("auth/role/delete", post(role_delete)),
        ("auth/role/grant", post(role_grant_permission)),
        ("auth/role/revoke", post(role_revoke_permission)),
        ("lock/lock", post(lock)),
        ("lock/unlock", post(unlock)),
        ("election/campaign", post(campaign)),
        ("election/proclaim", post(proclaim)),
        ("election/leader", post(leader)),
        ("election/observe", post(observe)),
        ("election/resign", post(resign)),
    ];
    let mut router = Router::new();
    for (path, handler) in rpcs {
        router = router
            .route(&format!("/v3/{path}"), handler.clone())
            .route(&format!("/v3beta/{path}"), handler);
    }
    router.with_state(Gateway { core, stop })
}

/// The session headers a gateway request may carry, passed on as gRPC metadata.
const SESSION_HEADERS: [&str; 4] = [
    oncekv_proto::metadata::CLIENT_ID_KEY,
    oncekv_proto::metadata::SECRET_KEY,
    oncekv_proto::metadata::SEQ_KEY,
    oncekv_proto::metadata::FIRST_INCOMPLETE_KEY,
];

fn request<T>(headers: &HeaderMap, message: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    for name in SESSION_HEADERS {
        if let Some(v) = headers.get(name)
            && let Ok(v) = v.to_str()
            && let Ok(v) = v.parse()
        {
            req.metadata_mut().insert(name, v);
        }
    }
    // etcd's gateway takes the token from `Authorization` (with auth on).
    if let Some(token) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|t| t.trim_start_matches("Bearer ").parse().ok())
    {
        req.metadata_mut()
            .insert(crate::auth::TOKEN_METADATA, token);
    }
    req
}

/// grpc-gateway's HTTP status for a gRPC code.
fn http_status(code: tonic::Code) -> StatusCode {
    use tonic::Code as C;
    match code {
        C::Ok => StatusCode::OK,
        C::InvalidArgument | C::OutOfRange => StatusCode::BAD_REQUEST,
        // grpc-gateway v1's mapping, which etcd 3.4 uses (v2 changed it to 400).
        C::FailedPrecondition => StatusCode::PRECONDITION_FAILED,
        C::NotFound => StatusCode::NOT_FOUND,
        C::AlreadyExists | C::Aborted => StatusCode::CONFLICT,
        C::PermissionDenied => StatusCode::FORBIDDEN,
        C::Unauthenticated => StatusCode::UNAUTHORIZED,
        C::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        C::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        C::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        C::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        C::Cancelled => StatusCode::REQUEST_TIMEOUT,
        C::Unknown | C::Internal | C::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn error(status: &Status) -> Response {
    let body = json!({
        "error": status.message(),
        "message": status.message(),
        "code": status.code() as i32,
    });
    reply(http_status(status.code()), body)
}

fn reply(status: StatusCode, body: Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn answer(result: Result<Value, Status>) -> Response {
    match result {
        Ok(v) => reply(StatusCode::OK, v),
        Err(s) => error(&s),
    }
}

/// The request body: a JSON object (an empty body is `{}`).
fn parse(body: &Bytes) -> Result<Value, Status> {
    if body.is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    serde_json::from_slice(body)
        .map_err(|e| Status::invalid_argument(format!("invalid JSON body: {e}")))
        .and_then(object)
}

fn object(v: Value) -> Result<Value, Status> {
    if v.is_object() {
        Ok(v)
    } else {
        Err(Status::invalid_argument(format!(
            "invalid JSON body: expected an object, got {v}"
        )))
    }
}

// --- reading requests ---------------------------------------------------------------

/// A request's field by its proto name (`range_end`) or, as grpc-gateway's parser takes
/// too, by its lowerCamelCase JSON name (`rangeEnd`), which Go clients marshalling with
/// jsonpb's defaults send.
fn field<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    v.get(name).or_else(|| {
        let mut parts = name.split('_');
        let first = parts.next()?;
        let rest: String = parts
            .map(|p| {
                let mut chars = p.chars();
                chars.next().map_or_else(String::new, |c| {
                    c.to_ascii_uppercase().to_string() + chars.as_str()
                })
            })
            .collect();
        (!rest.is_empty()).then(|| v.get(format!("{first}{rest}").as_str()))?
    })
}

fn bytes_of(v: &Value, name: &str) -> Result<Bytes, Status> {
    match field(v, name) {
        None | Some(Value::Null) => Ok(Bytes::new()),
        Some(Value::String(s)) => B64
            .decode(s)
            .map(Bytes::from)
            .map_err(|e| Status::invalid_argument(format!("{name}: not base64: {e}"))),
        Some(other) => Err(Status::invalid_argument(format!(
            "{name}: expected a base64 string, got {other}"
        ))),
    }
}

fn int_of(v: &Value, name: &str) -> Result<i64, Status> {
    match field(v, name) {
        None | Some(Value::Null) => Ok(0),
        Some(Value::Number(n)) => n
            .as_i64()
            .ok_or_else(|| Status::invalid_argument(format!("{name}: not a 64-bit integer"))),
        Some(Value::String(s)) => s
            .parse()
            .map_err(|_| Status::invalid_argument(format!("{name}: not an integer: {s:?}"))),
        Some(other) => Err(Status::invalid_argument(format!(
            "{name}: expected an integer, got {other}"
        ))),
    }
}

fn uint_of(v: &Value, name: &str) -> Result<u64, Status> {
    match field(v, name) {
        None | Some(Value::Null) => Ok(0),
        Some(Value::Number(n)) => n.as_u64().ok_or_else(|| {
            Status::invalid_argument(format!("{name}: not an unsigned 64-bit integer"))
        }),
        Some(Value::String(s)) => s.parse().map_err(|_| {
            Status::invalid_argument(format!("{name}: not an unsigned integer: {s:?}"))
        }),
        Some(other) => Err(Status::invalid_argument(format!(
            "{name}: expected an integer, got {other}"
        ))),
    }
}

fn text_of(v: &Value, name: &str) -> Result<String, Status> {
    match field(v, name) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(Status::invalid_argument(format!(
            "{name}: expected a string, got {other}"
        ))),
    }
}

fn texts_of(v: &Value, name: &str) -> Result<Vec<String>, Status> {
    match field(v, name) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => Ok(s.clone()),
                other => Err(Status::invalid_argument(format!(
                    "{name}: expected strings, got {other}"
                ))),
            })
            .collect(),
        Some(other) => Err(Status::invalid_argument(format!(
            "{name}: expected a list of strings, got {other}"
        ))),
    }
}

fn bool_of(v: &Value, name: &str) -> bool {
    matches!(field(v, name), Some(Value::Bool(true)))
}

/// An enum field, by name (from `names`, index = value) or by number.
fn enum_of(v: &Value, name: &str, names: &[&str]) -> Result<i32, Status> {
    match field(v, name) {
        None | Some(Value::Null) => Ok(0),
        Some(Value::String(s)) => names
            .iter()
            .position(|n| n == s)
            .map(|i| i as i32)
            .ok_or_else(|| Status::invalid_argument(format!("{name}: unknown value {s:?}"))),
        Some(Value::Number(n)) => Ok(n.as_i64().unwrap_or(0) as i32),
        Some(other) => Err(Status::invalid_argument(format!(
            "{name}: unexpected {other}"
        ))),
    }
}

const PERM_TYPES: &[&str] = &["READ", "WRITE", "READWRITE"];
const ALARM_ACTIONS: &[&str] = &["GET", "ACTIVATE", "DEACTIVATE"];
const ALARM_TYPES: &[&str] = &["NONE", "NOSPACE", "CORRUPT"];

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

fn range_req(v: &Value) -> Result<pb::RangeRequest, Status> {
    Ok(pb::RangeRequest {
        key: bytes_of(v, "key")?,
        range_end: bytes_of(v, "range_end")?,
        limit: int_of(v, "limit")?,
        revision: int_of(v, "revision")?,
        sort_order: enum_of(v, "sort_order", &["NONE", "ASCEND", "DESCEND"])?,
        sort_target: enum_of(
            v,
            "sort_target",
            &["KEY", "VERSION", "CREATE", "MOD", "VALUE"],
        )?,
        serializable: bool_of(v, "serializable"),
        keys_only: bool_of(v, "keys_only"),
        count_only: bool_of(v, "count_only"),
        min_mod_revision: int_of(v, "min_mod_revision")?,
        max_mod_revision: int_of(v, "max_mod_revision")?,
        min_create_revision: int_of(v, "min_create_revision")?,
        max_create_revision: int_of(v, "max_create_revision")?,
    })
}

fn put_req(v: &Value) -> Result<pb::PutRequest, Status> {
    Ok(pb::PutRequest {
        key: bytes_of(v, "key")?,
        value: bytes_of(v, "value")?,
        lease: int_of(v, "lease")?,
        prev_kv: bool_of(v, "prev_kv"),
        ignore_value: bool_of(v, "ignore_value"),
        ignore_lease: bool_of(v, "ignore_lease"),
    })
}

fn delete_req(v: &Value) -> Result<pb::DeleteRangeRequest, Status> {
    Ok(pb::DeleteRangeRequest {
        key: bytes_of(v, "key")?,
        range_end: bytes_of(v, "range_end")?,
        prev_kv: bool_of(v, "prev_kv"),
    })
}

fn txn_req(v: &Value) -> Result<pb::TxnRequest, Status> {
    use pb::compare::TargetUnion;
    let list = |name: &str| -> Vec<Value> {
        field(v, name)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let compare = list("compare")
        .iter()
        .map(|c| {
            let target = enum_of(c, "target", &["VERSION", "CREATE", "MOD", "VALUE", "LEASE"])?;
            let union = if field(c, "version").is_some() {
                Some(TargetUnion::Version(int_of(c, "version")?))
            } else if field(c, "create_revision").is_some() {
                Some(TargetUnion::CreateRevision(int_of(c, "create_revision")?))
            } else if field(c, "mod_revision").is_some() {
                Some(TargetUnion::ModRevision(int_of(c, "mod_revision")?))
            } else if field(c, "value").is_some() {
                Some(TargetUnion::Value(bytes_of(c, "value")?))
            } else if field(c, "lease").is_some() {
                Some(TargetUnion::Lease(int_of(c, "lease")?))
            } else {
                None
            };
            Ok(pb::Compare {
                result: enum_of(c, "result", &["EQUAL", "GREATER", "LESS", "NOT_EQUAL"])?,
                target,
                key: bytes_of(c, "key")?,
                range_end: bytes_of(c, "range_end")?,
                target_union: union,
            })
        })
        .collect::<Result<_, Status>>()?;
    let ops = |name: &str| -> Result<Vec<pb::RequestOp>, Status> {
        list(name).iter().map(request_op).collect()
    };
    Ok(pb::TxnRequest {
        compare,
        success: ops("success")?,
        failure: ops("failure")?,
    })
}

fn request_op(v: &Value) -> Result<pb::RequestOp, Status> {
    use pb::request_op::Request as R;
    let request = if let Some(r) = field(v, "request_range") {
        R::RequestRange(range_req(r)?)
    } else if let Some(r) = field(v, "request_put") {
        R::RequestPut(put_req(r)?)
    } else if let Some(r) = field(v, "request_delete_range") {
        R::RequestDeleteRange(delete_req(r)?)
    } else if let Some(r) = field(v, "request_txn") {
        R::RequestTxn(txn_req(r)?)
    } else {
        return Err(Status::invalid_argument(
            "a txn op needs request_range, request_put, request_delete_range or request_txn",
        ));
    };
    Ok(pb::RequestOp {
        request: Some(request),
    })
}

// --- writing responses --------------------------------------------------------------

/// A JSON object that leaves zero values out, as grpc-gateway's marshaler does.
#[derive(Default)]
struct Obj(Map<String, Value>);

impl Obj {
    fn int(mut self, name: &str, n: i64) -> Self {
        if n != 0 {
            self.0.insert(name.into(), Value::String(n.to_string()));
        }
        self
    }

    fn uint(mut self, name: &str, n: u64) -> Self {
        if n != 0 {
            self.0.insert(name.into(), Value::String(n.to_string()));
        }
        self
    }

    /// A `uint32`: a JSON number.
    fn uint32(mut self, name: &str, n: u32) -> Self {
        if n != 0 {
            self.0.insert(name.into(), Value::from(n));
        }
        self
    }

    /// An enum: its name from `names` (index = value), or its number if unnamed.
    fn enumerated(mut self, name: &str, n: i32, names: &[&str]) -> Self {
        if n != 0 {
            let v = usize::try_from(n)
                .ok()
                .and_then(|i| names.get(i))
                .map_or_else(|| Value::from(n), |s| Value::from(*s));
            self.0.insert(name.into(), v);
        }
        self
    }

    fn bytes(mut self, name: &str, b: &[u8]) -> Self {
        if !b.is_empty() {
            self.0.insert(name.into(), Value::String(B64.encode(b)));
        }
        self
    }

    fn flag(mut self, name: &str, b: bool) -> Self {
        if b {
            self.0.insert(name.into(), Value::Bool(true));
        }
        self
    }

    fn text(mut self, name: &str, s: &str) -> Self {
        if !s.is_empty() {
            self.0.insert(name.into(), Value::String(s.to_string()));
        }
        self
    }

    fn value(mut self, name: &str, v: Option<Value>) -> Self {
        if let Some(v) = v {
            self.0.insert(name.into(), v);
        }
        self
    }

    fn list(mut self, name: &str, items: Vec<Value>) -> Self {
        if !items.is_empty() {
            self.0.insert(name.into(), Value::Array(items));
        }
        self
    }

    fn done(self) -> Value {
        Value::Object(self.0)
    }
}

fn header(h: &Option<pb::ResponseHeader>) -> Option<Value> {
    h.as_ref().map(|h| {
        Obj::default()
            .uint("cluster_id", h.cluster_id)
            .uint("member_id", h.member_id)
            .int("revision", h.revision)
            .uint("raft_term", h.raft_term)
            .done()
    })
}

/// A response that is only a header.
fn header_only(h: &Option<pb::ResponseHeader>) -> Value {
    Obj::default().value("header", header(h)).done()
}

fn texts(items: &[String]) -> Vec<Value> {
    items.iter().map(|s| json!(s)).collect()
}

fn member(m: &pb::Member) -> Value {
    Obj::default()
        .uint("ID", m.id)
        .text("name", &m.name)
        .list("peerURLs", texts(&m.peer_ur_ls))
        .list("clientURLs", texts(&m.client_ur_ls))
        .flag("isLearner", m.is_learner)
        .done()
}

/// A member-change response: `{"header", "members"}`.
fn members(h: &Option<pb::ResponseHeader>, members: &[pb::Member]) -> Value {
    Obj::default()
        .value("header", header(h))
        .list("members", members.iter().map(member).collect())
        .done()
}

fn permission(p: &authpb::Permission) -> Value {
    Obj::default()
        .enumerated("permType", p.perm_type, PERM_TYPES)
        .bytes("key", &p.key)
        .bytes("range_end", &p.range_end)
        .done()
}

fn kv(kv: &mvccpb::KeyValue) -> Value {
    Obj::default()
        .bytes("key", &kv.key)
        .int("create_revision", kv.create_revision)
        .int("mod_revision", kv.mod_revision)
        .int("version", kv.version)
        .bytes("value", &kv.value)
        .int("lease", kv.lease)
        .done()
}

fn range_resp(r: &pb::RangeResponse) -> Value {
    Obj::default()
        .value("header", header(&r.header))
        .list("kvs", r.kvs.iter().map(kv).collect())
        .flag("more", r.more)
        .int("count", r.count)
        .done()
}

fn put_resp(r: &pb::PutResponse) -> Value {
    Obj::default()
        .value("header", header(&r.header))
        .value("prev_kv", r.prev_kv.as_ref().map(kv))
        .done()
}

fn delete_resp(r: &pb::DeleteRangeResponse) -> Value {
    Obj::default()
        .value("header", header(&r.header))
        .int("deleted", r.deleted)
        .list("prev_kvs", r.prev_kvs.iter().map(kv).collect())
        .done()
}

fn txn_resp(r: &pb::TxnResponse) -> Value {
    use pb::response_op::Response as R;
    let responses = r
        .responses
        .iter()
        .map(|op| match &op.response {
            Some(R::ResponseRange(r)) => json!({ "response_range": range_resp(r) }),
            Some(R::ResponsePut(r)) => json!({ "response_put": put_resp(r) }),
            Some(R::ResponseDeleteRange(r)) => {
                json!({ "response_delete_range": delete_resp(r) })
            }
            Some(R::ResponseTxn(r)) => json!({ "response_txn": txn_resp(r) }),
            None => json!({}),
        })
        .collect();
    Obj::default()
        .value("header", header(&r.header))
        .flag("succeeded", r.succeeded)
        .list("responses", responses)
        .done()
}

fn event(e: &mvccpb::Event) -> Value {
    let kind = if e.r#type == mvccpb::event::EventType::Delete as i32 {
        Some(Value::String("DELETE".into()))
    } else {
        None
    };
    Obj::default()
        .value("type", kind)
        .value("kv", e.kv.as_ref().map(kv))
        .value("prev_kv", e.prev_kv.as_ref().map(kv))
        .done()
}

fn watch_resp(r: &pb::WatchResponse) -> Value {
    Obj::default()
        .value("header", header(&r.header))
        .int("watch_id", r.watch_id)
        .flag("created", r.created)
        .flag("canceled", r.canceled)
        .int("compact_revision", r.compact_revision)
        .text("cancel_reason", &r.cancel_reason)
        .flag("fragment", r.fragment)
        .list("events", r.events.iter().map(event).collect())
        .done()
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

// --- handlers -----------------------------------------------------------------------

/// One unary RPC: the body read by `build`, the request (the headers passed on as
/// metadata) run through the service's gRPC code by `call`, the answer written by `write`.
async fn unary<Req, Resp, Fut>(
    headers: &HeaderMap,
    body: &Bytes,
    build: impl FnOnce(&Value) -> Result<Req, Status>,
    call: impl FnOnce(tonic::Request<Req>) -> Fut,
    write: impl FnOnce(&Resp) -> Value,
) -> Response
where
    Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
{
    answer(
        async {
            let req = build(&parse(body)?)?;
            let resp = call(request(headers, req)).await?.into_inner();
            Ok(write(&resp))
        }
        .await,
    )
}

/// The request of an RPC whose request has no fields (the body must still be an object).
fn empty<T: Default>(_: &Value) -> Result<T, Status> {
    Ok(T::default())
}

/// A streaming answer: each response as a `{"result": ...}` line, a failure as
/// grpc-gateway's `{"error": ...}` line.
fn lines<T: 'static>(
    responses: impl Stream<Item = Result<T, Status>> + Send + 'static,
    write: fn(&T) -> Value,
) -> Response {
    // The first error is the last line, as a gRPC status ends a call (a service may go on
    // yielding after an error of its request stream).
    let lines = responses.scan(false, move |failed, r| {
        if *failed {
            return futures::future::ready(None);
        }
        *failed = r.is_err();
        let v = match r {
            Ok(resp) => json!({ "result": write(&resp) }),
            Err(s) => {
                let http = http_status(s.code());
                json!({ "error": {
                    "grpc_code": s.code() as i32,
                    "http_code": http.as_u16(),
                    "message": s.message(),
                    "http_status": http.canonical_reason().unwrap_or_default(),
                } })
            }
        };
        futures::future::ready(Some(Ok::<_, std::convert::Infallible>(Bytes::from(
            format!("{v}\n"),
        ))))
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(lines),
    )
        .into_response()
}

async fn range(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let kv = KvService { node: g.core };
    unary(&headers, &body, range_req, |r| kv.range(r), range_resp).await
}

async fn put(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let kv = KvService { node: g.core };
    unary(&headers, &body, put_req, |r| kv.put(r), put_resp).await
}

async fn delete_range(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let kv = KvService { node: g.core };
    unary(
        &headers,
        &body,
        delete_req,
        |r| kv.delete_range(r),
        delete_resp,
    )
    .await
}

async fn txn(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let kv = KvService { node: g.core };
    unary(&headers, &body, txn_req, |r| kv.txn(r), txn_resp).await
}

async fn compaction(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let kv = KvService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::CompactionRequest {
            revision: int_of(v, "revision")?,
            physical: bool_of(v, "physical"),
        })
    };
    let write = |r: &pb::CompactionResponse| header_only(&r.header);
    unary(&headers, &body, build, |r| kv.compact(r), write).await
}

async fn lease_grant(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let lease = LeaseService {
        node: g.core,
        stop: g.stop,
    };
    let build = |v: &Value| {
        Ok(pb::LeaseGrantRequest {
            ttl: int_of(v, "TTL")?,
            id: int_of(v, "ID")?,
        })
    };
    let write = |r: &pb::LeaseGrantResponse| {
        Obj::default()
            .value("header", header(&r.header))
            .int("ID", r.id)
            .int("TTL", r.ttl)
            .text("error", &r.error)
            .done()
    };
    unary(&headers, &body, build, |r| lease.lease_grant(r), write).await
}

async fn lease_revoke(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let lease = LeaseService {
        node: g.core,
        stop: g.stop,
    };
    let build = |v: &Value| {
        Ok(pb::LeaseRevokeRequest {
            id: int_of(v, "ID")?,
        })
    };
    let write = |r: &pb::LeaseRevokeResponse| header_only(&r.header);
    unary(&headers, &body, build, |r| lease.lease_revoke(r), write).await
}

async fn lease_time_to_live(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let lease = LeaseService {
        node: g.core,
        stop: g.stop,
    };
    let build = |v: &Value| {
        Ok(pb::LeaseTimeToLiveRequest {
            id: int_of(v, "ID")?,
            keys: bool_of(v, "keys"),
        })
    };
    let write = |r: &pb::LeaseTimeToLiveResponse| {
        let keys = r.keys.iter().map(|k| json!(B64.encode(k))).collect();
        Obj::default()
            .value("header", header(&r.header))
            .int("ID", r.id)
            .int("TTL", r.ttl)
            .int("grantedTTL", r.granted_ttl)
            .list("keys", keys)
            .done()
    };
    unary(
        &headers,
        &body,
        build,
        |r| lease.lease_time_to_live(r),
        write,
    )
    .await
}

async fn lease_leases(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let lease = LeaseService {
        node: g.core,
        stop: g.stop,
    };
    let write = |r: &pb::LeaseLeasesResponse| {
        let leases = r
            .leases
            .iter()
            .map(|l| Obj::default().int("ID", l.id).done())
            .collect();
        Obj::default()
            .value("header", header(&r.header))
            .list("leases", leases)
            .done()
    };
    unary(&headers, &body, empty, |r| lease.lease_leases(r), write).await
}

/// `POST /v3/lease/keepalive` with one or more `{"ID": ...}` objects in the body: a
/// `{"result": ...}` line per keep-alive, in order, from the service's keep-alive stream.
/// The body is read as it comes, as etcd's gateway reads it: a client may hold one
/// request open and send a keep-alive whenever its lease needs one, each answered at
/// once. A malformed first object is a 400 (nothing was answered yet); a later one ends
/// the stream with an error line.
async fn lease_keep_alive(State(g): State<Gateway>, headers: HeaderMap, body: Body) -> Response {
    use tonic::codec::Codec as _;
    // Fused: when the body held no object, the chain below polls it again after its end.
    let mut requests = Box::pin(json_objects(body, KEEP_ALIVE_OBJECT_MAX).fuse().map(|v| {
        v.and_then(|v| {
            Ok(pb::LeaseKeepAliveRequest {
                id: int_of(&v, "ID")?,
            })
        })
    }));
    let first = match requests.next().await {
        Some(Ok(first)) => Some(first),
        Some(Err(s)) => return error(&s),
        None => None,
    };
    let frames = futures::stream::iter(first.map(Ok))
        .chain(requests)
        .map(|r| r.map(|req| http_body::Frame::data(grpc_frame(&req))));
    let decoder = oncekv_proto::codec::Codec::<
        pb::LeaseKeepAliveResponse,
        pb::LeaseKeepAliveRequest,
    >::default()
    .decoder();
    let requests =
        tonic::Streaming::new_request(decoder, http_body_util::StreamBody::new(frames), None, None);
    let lease = LeaseService {
        node: g.core,
        stop: g.stop,
    };
    match lease.lease_keep_alive(request(&headers, requests)).await {
        Ok(responses) => lines(responses.into_inner(), |r| {
            Obj::default()
                .value("header", header(&r.header))
                .int("ID", r.id)
                .int("TTL", r.ttl)
                .done()
        }),
        Err(s) => error(&s),
    }
}

/// The longest keep-alive object accepted, in bytes: `{"ID": "..."}` takes about 40, so
/// anything near this long is not a keep-alive, and the request holds no more memory.
const KEEP_ALIVE_OBJECT_MAX: usize = 4096;

/// A message framed as gRPC frames it on the wire (uncompressed, its length in four bytes
/// big-endian): what the service's request stream decodes.
fn grpc_frame(message: &impl prost::Message) -> Bytes {
    let len = message.encoded_len();
    let mut framed = Vec::with_capacity(5 + len);
    framed.push(0);
    framed.extend_from_slice(&(len as u32).to_be_bytes());
    message.encode_raw(&mut framed);
    framed.into()
}

/// The JSON objects of a body, each as soon as its last byte has come (objects may be
/// separated by whitespace or nothing, as grpc-gateway's decoder allows). Something other
/// than an object, an object longer than `limit` bytes (whitespace before it included;
/// refused as soon as that much is unfinished), a malformed one, or one the body ends
/// inside is an error, after which the stream ends. Each byte is scanned once however the
/// body is cut into chunks, so a client trickling a large object costs linear work.
fn json_objects(body: Body, limit: usize) -> impl Stream<Item = Result<Value, Status>> + Send {
    let invalid =
        |e: &dyn std::fmt::Display| Status::invalid_argument(format!("invalid JSON body: {e}"));
    let state = (
        body.into_data_stream(),
        Vec::<u8>::new(),
        ObjectEnd::default(),
        false,
    );
    futures::stream::unfold(
        state,
        move |(mut chunks, mut buf, mut scan, mut ended)| async move {
            // After an error the stream ends: nothing is left to read or to report.
            let fail = |e: Status, chunks| {
                Some((Err(e), (chunks, Vec::new(), ObjectEnd::default(), true)))
            };
            loop {
                match scan.find(&buf) {
                    Err(e) => return fail(invalid(&e), chunks),
                    Ok(Some(end)) if end > limit => {
                        return fail(
                            invalid(&format!("an object longer than {limit} bytes")),
                            chunks,
                        );
                    }
                    Ok(Some(end)) => {
                        let parsed = serde_json::from_slice::<Value>(&buf[..end]);
                        buf.drain(..end);
                        return match parsed {
                            Ok(v) => Some((Ok(v), (chunks, buf, scan, ended))),
                            Err(e) => fail(invalid(&e), chunks),
                        };
                    }
                    Ok(None) if buf.len() > limit => {
                        return fail(
                            invalid(&format!("an object longer than {limit} bytes")),
                            chunks,
                        );
                    }
                    Ok(None) if ended => {
                        return if scan.inside() {
                            fail(invalid(&"the body ends inside an object"), chunks)
                        } else {
                            None
                        };
                    }
                    Ok(None) => {}
                }
                match chunks.next().await {
                    Some(Ok(chunk)) => buf.extend_from_slice(&chunk),
                    Some(Err(e)) => {
                        return fail(
                            Status::invalid_argument(format!("reading the body: {e}")),
                            chunks,
                        );
                    }
                    None => ended = true,
                }
            }
        },
    )
}

/// Where the JSON object at the start of a buffer ends, found by counting brackets outside
/// strings. It remembers how far it has looked, so bytes appended later are the only ones
/// looked at; `serde_json` then checks the object it delimits. Invariant: `scanned` bytes of
/// the buffer have been looked at, and `depth`, `in_string` and `escaped` describe the
/// position after them.
#[derive(Clone, Copy, Default)]
struct ObjectEnd {
    scanned: usize,
    depth: usize,
    in_string: bool,
    escaped: bool,
}

impl ObjectEnd {
    /// `Some(end)` once `buf[..end]` holds the whole first object (and the scan starts
    /// afresh for the next one, which begins at `end`); `None` while it is unfinished.
    fn find(&mut self, buf: &[u8]) -> Result<Option<usize>, String> {
        for (i, &b) in buf.iter().enumerate().skip(self.scanned) {
            if self.depth == 0 {
                match b {
                    b' ' | b'\t' | b'\n' | b'\r' => {}
                    b'{' => self.depth = 1,
                    _ => {
                        let found = String::from_utf8_lossy(&buf[i..(i + 16).min(buf.len())]);
                        return Err(format!("expected an object, found `{found}`"));
                    }
                }
            } else if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                }
            } else {
                match b {
                    b'"' => self.in_string = true,
                    b'{' | b'[' => self.depth += 1,
                    b'}' | b']' => {
                        self.depth -= 1;
                        if self.depth == 0 {
                            *self = Self::default();
                            return Ok(Some(i + 1));
                        }
                    }
                    _ => {}
                }
            }
        }
        self.scanned = buf.len();
        Ok(None)
    }

    /// Whether the scan stopped inside an object (not in whitespace between objects).
    fn inside(&self) -> bool {
        self.depth > 0
    }
}

/// `POST /v3/watch` with one or more `{"create_request": ...}`, `{"cancel_request": ...}`
/// or `{"progress_request": {}}` objects in the body: the watch stream's responses as
/// `{"result": ...}` lines, until the client goes away. As with etcd's gateway the body
/// is read as it comes, so a client may hold it open and create or cancel watches later,
/// and the watches go on after it ends. A malformed first object is a 400; a later one
/// ends the stream with an error line.
async fn watch(State(g): State<Gateway>, headers: HeaderMap, body: Body) -> Response {
    // A create request carries its key and range end in base64: up to 4/3 of the largest
    // request, and the field names.
    let limit = g.core.config().max_request_bytes / 3 * 4 + KEEP_ALIVE_OBJECT_MAX;
    let mut requests = Box::pin(
        json_objects(body, limit)
            .fuse()
            .map(|v| v.and_then(|v| watch_req(&v))),
    );
    let first = match requests.next().await {
        Some(Ok(first)) => first,
        Some(Err(s)) => return error(&s),
        None => {
            return error(&Status::invalid_argument(
                "expected {\"create_request\": {...}} in the body",
            ));
        }
    };
    // The watch task ends quietly at an error of its request stream (a gRPC client sees
    // its call fail); here the error is kept and written as the stream's last line.
    let failed = Arc::new(std::sync::Mutex::new(None::<Status>));
    let keep = failed.clone();
    let requests = futures::stream::iter([Ok(first)]).chain(requests.inspect(move |r| {
        if let (Err(s), Ok(mut slot)) = (r, keep.lock()) {
            *slot = Some(s.clone());
        }
    }));
    let caller = crate::auth::Caller::of_http(&headers);
    let responses = crate::etcd::watch_stream(g.core, g.stop, Box::pin(requests), false, caller);
    let last = futures::stream::once(async move {
        failed.lock().ok().and_then(|mut slot| slot.take()).map(Err)
    })
    .filter_map(futures::future::ready);
    lines(responses.chain(last), watch_resp)
}

/// One request of a watch stream, as grpc-gateway reads `WatchRequest` from JSON.
fn watch_req(v: &Value) -> Result<pb::WatchRequest, Status> {
    use pb::watch_request::RequestUnion;
    let given = |name: &str| field(v, name).filter(|f| !f.is_null());
    let union = if let Some(c) = given("create_request") {
        let filters = c
            .get("filters")
            .and_then(Value::as_array)
            .map(|fs| {
                fs.iter()
                    .map(|f| match f.as_str() {
                        Some("NOPUT") => 0,
                        Some("NODELETE") => 1,
                        _ => f.as_i64().unwrap_or(0) as i32,
                    })
                    .collect()
            })
            .unwrap_or_default();
        RequestUnion::CreateRequest(pb::WatchCreateRequest {
            key: bytes_of(c, "key")?,
            range_end: bytes_of(c, "range_end")?,
            start_revision: int_of(c, "start_revision")?,
            progress_notify: bool_of(c, "progress_notify"),
            filters,
            prev_kv: bool_of(c, "prev_kv"),
            watch_id: int_of(c, "watch_id")?,
            fragment: bool_of(c, "fragment"),
        })
    } else if let Some(c) = given("cancel_request") {
        RequestUnion::CancelRequest(pb::WatchCancelRequest {
            watch_id: int_of(c, "watch_id")?,
        })
    } else if given("progress_request").is_some() {
        RequestUnion::ProgressRequest(pb::WatchProgressRequest {})
    } else {
        return Err(Status::invalid_argument(
            "expected {\"create_request\": {...}}, {\"cancel_request\": {...}} or {\"progress_request\": {}}",
        ));
    };
    Ok(pb::WatchRequest {
        request_union: Some(union),
    })
}

async fn member_add(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let c = ClusterService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::MemberAddRequest {
            peer_ur_ls: texts_of(v, "peerURLs")?,
            is_learner: bool_of(v, "isLearner"),
        })
    };
    let write = |r: &pb::MemberAddResponse| {
        Obj::default()
            .value("header", header(&r.header))
            .value("member", r.member.as_ref().map(member))
            .list("members", r.members.iter().map(member).collect())
            .done()
    };
    unary(&headers, &body, build, |r| c.member_add(r), write).await
}

async fn member_remove(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let c = ClusterService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::MemberRemoveRequest {
            id: uint_of(v, "ID")?,
        })
    };
    let write = |r: &pb::MemberRemoveResponse| members(&r.header, &r.members);
    unary(&headers, &body, build, |r| c.member_remove(r), write).await
}

async fn member_update(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let c = ClusterService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::MemberUpdateRequest {
            id: uint_of(v, "ID")?,
            peer_ur_ls: texts_of(v, "peerURLs")?,
        })
    };
    let write = |r: &pb::MemberUpdateResponse| members(&r.header, &r.members);
    unary(&headers, &body, build, |r| c.member_update(r), write).await
}

async fn member_list(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let c = ClusterService { node: g.core };
    let write = |r: &pb::MemberListResponse| members(&r.header, &r.members);
    unary(&headers, &body, empty, |r| c.member_list(r), write).await
}

async fn member_promote(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let c = ClusterService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::MemberPromoteRequest {
            id: uint_of(v, "ID")?,
        })
    };
    let write = |r: &pb::MemberPromoteResponse| members(&r.header, &r.members);
    unary(&headers, &body, build, |r| c.member_promote(r), write).await
}

async fn alarm(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let m = MaintenanceService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::AlarmRequest {
            action: enum_of(v, "action", ALARM_ACTIONS)?,
            member_id: uint_of(v, "memberID")?,
            alarm: enum_of(v, "alarm", ALARM_TYPES)?,
        })
    };
    let write = |r: &pb::AlarmResponse| {
        let alarms = r
            .alarms
            .iter()
            .map(|a| {
                Obj::default()
                    .uint("memberID", a.member_id)
                    .enumerated("alarm", a.alarm, ALARM_TYPES)
                    .done()
            })
            .collect();
        Obj::default()
            .value("header", header(&r.header))
            .list("alarms", alarms)
            .done()
    };
    unary(&headers, &body, build, |r| m.alarm(r), write).await
}

async fn status(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let m = MaintenanceService { node: g.core };
    let write = |r: &pb::StatusResponse| {
        Obj::default()
            .value("header", header(&r.header))
            .text("version", &r.version)
            .int("dbSize", r.db_size)
            .uint("leader", r.leader)
            .uint("raftIndex", r.raft_index)
            .uint("raftTerm", r.raft_term)
            .uint("raftAppliedIndex", r.raft_applied_index)
            .list("errors", texts(&r.errors))
            .int("dbSizeInUse", r.db_size_in_use)
            .flag("isLearner", r.is_learner)
            .done()
    };
    unary(&headers, &body, empty, |r| m.status(r), write).await
}

async fn defragment(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let m = MaintenanceService { node: g.core };
    let write = |r: &pb::DefragmentResponse| header_only(&r.header);
    unary(&headers, &body, empty, |r| m.defragment(r), write).await
}

async fn hash(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let m = MaintenanceService { node: g.core };
    let write = |r: &pb::HashResponse| {
        Obj::default()
            .value("header", header(&r.header))
            .uint32("hash", r.hash)
            .done()
    };
    unary(&headers, &body, empty, |r| m.hash(r), write).await
}

async fn hash_kv(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let m = MaintenanceService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::HashKvRequest {
            revision: int_of(v, "revision")?,
        })
    };
    let write = |r: &pb::HashKvResponse| {
        Obj::default()
            .value("header", header(&r.header))
            .uint32("hash", r.hash)
            .int("compact_revision", r.compact_revision)
            .done()
    };
    unary(&headers, &body, build, |r| m.hash_kv(r), write).await
}

async fn move_leader(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let m = MaintenanceService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::MoveLeaderRequest {
            target_id: uint_of(v, "targetID")?,
        })
    };
    let write = |r: &pb::MoveLeaderResponse| header_only(&r.header);
    unary(&headers, &body, build, |r| m.move_leader(r), write).await
}

/// `POST /v3/maintenance/snapshot`: the database file as `{"result": {"blob", ...}}`
/// lines, one per chunk.
async fn snapshot(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let m = MaintenanceService { node: g.core };
    let chunks = async {
        parse(&body)?;
        m.snapshot(request(&headers, pb::SnapshotRequest {})).await
    };
    match chunks.await {
        Ok(chunks) => lines(chunks.into_inner(), |c| {
            Obj::default()
                .value("header", header(&c.header))
                .uint("remaining_bytes", c.remaining_bytes)
                .bytes("blob", &c.blob)
                .done()
        }),
        Err(s) => error(&s),
    }
}

async fn auth_enable(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let write = |r: &pb::AuthEnableResponse| header_only(&r.header);
    unary(&headers, &body, empty, |r| auth.auth_enable(r), write).await
}

async fn auth_disable(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let write = |r: &pb::AuthDisableResponse| header_only(&r.header);
    unary(&headers, &body, empty, |r| auth.auth_disable(r), write).await
}

async fn auth_status(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let write = |r: &pb::AuthStatusResponse| {
        Obj::default()
            .value("header", header(&r.header))
            .flag("enabled", r.enabled)
            .uint("authRevision", r.auth_revision)
            .done()
    };
    unary(&headers, &body, empty, |r| auth.auth_status(r), write).await
}

/// `{"name", "password"}` → `{"header", "token"}`; the token then goes in the
/// `Authorization` header of later requests, as with etcd's gateway.
async fn authenticate(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::AuthenticateRequest {
            name: text_of(v, "name")?,
            password: text_of(v, "password")?,
        })
    };
    let write = |r: &pb::AuthenticateResponse| {
        Obj::default()
            .value("header", header(&r.header))
            .text("token", &r.token)
            .done()
    };
    unary(&headers, &body, build, |r| auth.authenticate(r), write).await
}

async fn user_add(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let build = |v: &Value| {
        let options = v.get("options").filter(|o| !o.is_null());
        Ok(pb::AuthUserAddRequest {
            name: text_of(v, "name")?,
            password: text_of(v, "password")?,
            options: options.map(|o| authpb::UserAddOptions {
                no_password: bool_of(o, "no_password"),
            }),
            hashed_password: text_of(v, "hashedPassword")?,
        })
    };
    let write = |r: &pb::AuthUserAddResponse| header_only(&r.header);
    unary(&headers, &body, build, |r| auth.user_add(r), write).await
}

async fn user_get(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::AuthUserGetRequest {
            name: text_of(v, "name")?,
        })
    };
    let write = |r: &pb::AuthUserGetResponse| {
        Obj::default()
            .value("header", header(&r.header))
            .list("roles", texts(&r.roles))
            .done()
    };
    unary(&headers, &body, build, |r| auth.user_get(r), write).await
}

async fn user_list(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let write = |r: &pb::AuthUserListResponse| {
        Obj::default()
            .value("header", header(&r.header))
            .list("users", texts(&r.users))
            .done()
    };
    unary(&headers, &body, empty, |r| auth.user_list(r), write).await
}

async fn user_delete(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::AuthUserDeleteRequest {
            name: text_of(v, "name")?,
        })
    };
    let write = |r: &pb::AuthUserDeleteResponse| header_only(&r.header);
    unary(&headers, &body, build, |r| auth.user_delete(r), write).await
}

async fn user_change_password(
    State(g): State<Gateway>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let auth = AuthService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::AuthUserChangePasswordRequest {
            name: text_of(v, "name")?,
            password: text_of(v, "password")?,
            hashed_password: text_of(v, "hashedPassword")?,
        })
    };
    let write = |r: &pb::AuthUserChangePasswordResponse| header_only(&r.header);
    unary(
        &headers,
        &body,
        build,
        |r| auth.user_change_password(r),
        write,
    )
    .await
}

async fn user_grant_role(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::AuthUserGrantRoleRequest {
            user: text_of(v, "user")?,
            role: text_of(v, "role")?,
        })
    };
    let write = |r: &pb::AuthUserGrantRoleResponse| header_only(&r.header);
    unary(&headers, &body, build, |r| auth.user_grant_role(r), write).await
}

async fn user_revoke_role(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::AuthUserRevokeRoleRequest {
            name: text_of(v, "name")?,
            role: text_of(v, "role")?,
        })
    };
    let write = |r: &pb::AuthUserRevokeRoleResponse| header_only(&r.header);
    unary(&headers, &body, build, |r| auth.user_revoke_role(r), write).await
}

async fn role_add(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::AuthRoleAddRequest {
            name: text_of(v, "name")?,
        })
    };
    let write = |r: &pb::AuthRoleAddResponse| header_only(&r.header);
    unary(&headers, &body, build, |r| auth.role_add(r), write).await
}

async fn role_get(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::AuthRoleGetRequest {
            role: text_of(v, "role")?,
        })
    };
    let write = |r: &pb::AuthRoleGetResponse| {
        Obj::default()
            .value("header", header(&r.header))
            .list("perm", r.perm.iter().map(permission).collect())
            .done()
    };
    unary(&headers, &body, build, |r| auth.role_get(r), write).await
}

async fn role_list(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let write = |r: &pb::AuthRoleListResponse| {
        Obj::default()
            .value("header", header(&r.header))
            .list("roles", texts(&r.roles))
            .done()
    };
    unary(&headers, &body, empty, |r| auth.role_list(r), write).await
}

async fn role_delete(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::AuthRoleDeleteRequest {
            role: text_of(v, "role")?,
        })
    };
    let write = |r: &pb::AuthRoleDeleteResponse| header_only(&r.header);
    unary(&headers, &body, build, |r| auth.role_delete(r), write).await
}

/// `{"name", "perm": {"permType", "key", "range_end"}}`.
async fn role_grant_permission(
    State(g): State<Gateway>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let auth = AuthService { node: g.core };
    let build = |v: &Value| {
        let perm = v.get("perm").filter(|p| !p.is_null());
        let perm = perm
            .map(|p| -> Result<_, Status> {
                Ok(authpb::Permission {
                    perm_type: enum_of(p, "permType", PERM_TYPES)?,
                    key: bytes_of(p, "key")?,
                    range_end: bytes_of(p, "range_end")?,
                })
            })
            .transpose()?;
        Ok(pb::AuthRoleGrantPermissionRequest {
            name: text_of(v, "name")?,
            perm,
        })
    };
    let write = |r: &pb::AuthRoleGrantPermissionResponse| header_only(&r.header);
    unary(
        &headers,
        &body,
        build,
        |r| auth.role_grant_permission(r),
        write,
    )
    .await
}

async fn role_revoke_permission(
    State(g): State<Gateway>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let auth = AuthService { node: g.core };
    let build = |v: &Value| {
        Ok(pb::AuthRoleRevokePermissionRequest {
            role: text_of(v, "role")?,
            key: bytes_of(v, "key")?,
            range_end: bytes_of(v, "range_end")?,
        })
    };
    let write = |r: &pb::AuthRoleRevokePermissionResponse| header_only(&r.header);
    unary(
        &headers,
        &body,
        build,
        |r| auth.role_revoke_permission(r),
        write,
    )
    .await
}

/// `{"name", "lease"}` → `{"header", "key"}`, once the lock is the caller's: the request
/// waits for its turn, as etcd's does.
async fn lock(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let l = LockService { node: g.core };
    let build = |v: &Value| {
        Ok(lockpb::LockRequest {
            name: bytes_of(v, "name")?,
            lease: int_of(v, "lease")?,
        })
    };
    let write = |r: &lockpb::LockResponse| {
        Obj::default()
            .value("header", header(&r.header))
            .bytes("key", &r.key)
            .done()
    };
    unary(&headers, &body, build, |r| l.lock(r), write).await
}

async fn unlock(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let l = LockService { node: g.core };
    let build = |v: &Value| {
        Ok(lockpb::UnlockRequest {
            key: bytes_of(v, "key")?,
        })
    };
    let write = |r: &lockpb::UnlockResponse| header_only(&r.header);
    unary(&headers, &body, build, |r| l.unlock(r), write).await
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

    #[test]
    fn fields_are_read_by_proto_or_camel_case_names() {
        let v = json!({"range_end": "YQ==", "rangeEnd": "Yg==", "createRevision": "5"});
        // The proto name first, as grpc-gateway takes it.
        assert_eq!(bytes_of(&v, "range_end").unwrap().as_ref(), b"a");
        assert_eq!(int_of(&v, "create_revision").unwrap(), 5);
        assert_eq!(field(&v, "key"), None);
        // A txn as Go's jsonpb writes it by default (etcd's e2e curl test sends this).
        let txn = txn_req(&json!({
            "compare": [{"key": "Zm9v", "target": "CREATE", "createRevision": "0"}],
            "success": [{"requestPut": {"key": "Zm9v", "value": "YmFy"}}]
        }))
        .unwrap();
        assert!(matches!(
            txn.compare[0].target_union,
            Some(pb::compare::TargetUnion::CreateRevision(0))
        ));
        assert!(matches!(
            &txn.success[0].request,
            Some(pb::request_op::Request::RequestPut(p)) if p.value.as_ref() == b"bar"
        ));
    }

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
    fn a_body_must_be_an_object() {
        assert_eq!(parse(&Bytes::new()).unwrap(), json!({}));
        let e = parse(&Bytes::from_static(b"\"oops\"")).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn member_ids_take_the_whole_u64_range() {
        let v = json!({"ID": "13064775543180735813", "n": 18446744073709551615u64});
        assert_eq!(uint_of(&v, "ID").unwrap(), 13064775543180735813);
        assert_eq!(uint_of(&v, "n").unwrap(), u64::MAX);
        assert!(uint_of(&json!({"ID": -1}), "ID").is_err());
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

    #[test]
    fn enums_are_written_by_name_and_zero_left_out() {
        let v = Obj::default()
            .enumerated("zero", 0, PERM_TYPES)
            .enumerated("named", 2, PERM_TYPES)
            .enumerated("unnamed", 7, PERM_TYPES)
            .done();
        assert_eq!(v, json!({"named": "READWRITE", "unnamed": 7}));
    }

    fn chunked(chunks: &[&'static str]) -> Body {
        let chunks: Vec<Result<Bytes, std::convert::Infallible>> = chunks
            .iter()
            .map(|c| Ok(Bytes::from_static(c.as_bytes())))
            .collect();
        Body::from_stream(futures::stream::iter(chunks))
    }

    // Objects split across chunks come out whole, each as soon as it is complete; an
    // object the body ends inside, or something else than an object, is an error.
    #[tokio::test]
    async fn json_objects_are_read_across_chunks_as_they_come() {
        let values: Vec<Value> =
            json_objects(chunked(&[r#"{"ID": "#, r#""7"} {"I"#, r#"D": 8}{}"#]), 1024)
                .map(Result::unwrap)
                .collect()
                .await;
        assert_eq!(values, [json!({"ID": "7"}), json!({"ID": 8}), json!({})]);
        let cut: Vec<_> = json_objects(chunked(&[r#"{"ID": 7} {"ID""#]), 1024)
            .collect()
            .await;
        assert!(
            cut[0].is_ok() && cut[1].is_err() && cut.len() == 2,
            "{cut:?}"
        );
        let long: Vec<_> = json_objects(chunked(&[r#"{"ID": "#, "123456789012"]), 8)
            .collect()
            .await;
        assert!(long.len() == 1 && long[0].is_err(), "{long:?}");
        let whole: Vec<_> = json_objects(chunked(&[r#"{"ID": "123456789012"}"#]), 8)
            .collect()
            .await;
        assert!(whole.len() == 1 && whole[0].is_err(), "{whole:?}");
        assert!(
            json_objects(chunked(&[" \n "]), 8)
                .collect::<Vec<_>>()
                .await
                .is_empty()
        );
        for not_object in ["5", "[{}]", r#"{} "x""#, "{}}"] {
            let got: Vec<_> = json_objects(chunked(&[not_object]), 64).collect().await;
            let last = got.last().and_then(|r| r.as_ref().err());
            assert!(
                last.is_some_and(|s| s.message().contains("expected an object")),
                "{not_object}: {got:?}"
            );
        }
        // Brackets balanced but the object malformed: serde_json has the last word.
        let bad: Vec<_> = json_objects(chunked(&[r#"{"a" 1}"#]), 64).collect().await;
        assert!(bad.len() == 1 && bad[0].is_err(), "{bad:?}");
    }

    // Brackets and quotes inside strings do not end an object, wherever the chunks cut.
    #[test]
    fn an_object_ends_at_its_own_closing_bracket() {
        let body = br#" {"k": "}{\"]", "n": [{"x": "\\"}]} {"#;
        let whole = body.len() - 2;
        assert_eq!(&body[whole..], b" {");
        for cut in 0..=body.len() {
            let mut scan = ObjectEnd::default();
            let first = scan.find(&body[..cut]);
            let found = match first {
                Ok(Some(at)) => at,
                Ok(None) => scan.find(body).unwrap().unwrap(),
                Err(e) => panic!("cut at {cut}: {e}"),
            };
            assert_eq!(found, whole, "cut at {cut}");
        }
        let parsed: Value = serde_json::from_slice(&body[..whole]).unwrap();
        assert_eq!(parsed, json!({"k": "}{\"]", "n": [{"x": "\\"}]}));
    }

    // A large object sent a byte at a time is scanned once, not again at every byte:
    // the scanner's position only moves forward.
    #[test]
    fn an_object_trickled_a_byte_at_a_time_is_scanned_once() {
        let object = format!(r#"{{"key": "{}"}}"#, "a".repeat(100_000));
        let mut scan = ObjectEnd::default();
        let mut looked = 0;
        for n in 1..=object.len() {
            let before = scan.scanned;
            let found = scan.find(&object.as_bytes()[..n]).unwrap();
            looked += n - before;
            if found.is_some() {
                assert_eq!(n, object.len());
            }
        }
        assert_eq!(looked, object.len());
    }

    // A watch body's requests: create, cancel and progress, as grpc-gateway reads them.
    #[test]
    fn watch_requests_are_read_as_the_gateway_reads_them() {
        use pb::watch_request::RequestUnion;
        let create = watch_req(&json!({"create_request": {
            "key": "YQ==", "range_end": "Yg==", "start_revision": "3",
            "filters": ["NODELETE"], "prev_kv": true, "watch_id": 9}}))
        .unwrap();
        match create.request_union {
            Some(RequestUnion::CreateRequest(c)) => {
                assert_eq!((&c.key[..], &c.range_end[..]), (&b"a"[..], &b"b"[..]));
                assert_eq!((c.start_revision, c.watch_id), (3, 9));
                assert_eq!(c.filters, [1]);
                assert!(c.prev_kv && !c.progress_notify);
            }
            other => panic!("{other:?}"),
        }
        let cancel = watch_req(&json!({"cancel_request": {"watch_id": "9"}})).unwrap();
        assert!(matches!(
            cancel.request_union,
            Some(RequestUnion::CancelRequest(pb::WatchCancelRequest {
                watch_id: 9
            }))
        ));
        let progress = watch_req(&json!({"progress_request": {}})).unwrap();
        assert!(matches!(
            progress.request_union,
            Some(RequestUnion::ProgressRequest(_))
        ));
        assert!(watch_req(&json!({})).is_err());
        assert!(watch_req(&json!({"create_request": null})).is_err());
        assert!(watch_req(&json!({"create_request": {"key": "%%"}})).is_err());
    }

    // A keep-alive request framed as gRPC frames it decodes back in the service's stream.
    #[tokio::test]
    async fn keep_alive_requests_are_framed_as_grpc_frames_them() {
        use tonic::codec::Codec as _;
        let framed: Vec<u8> = [7, 8]
            .iter()
            .flat_map(|id| grpc_frame(&pb::LeaseKeepAliveRequest { id: *id }).to_vec())
            .collect();
        let decoder = oncekv_proto::codec::Codec::<
            pb::LeaseKeepAliveResponse,
            pb::LeaseKeepAliveRequest,
        >::default()
        .decoder();
        let stream = tonic::Streaming::new_request(
            decoder,
            http_body_util::Full::new(Bytes::from(framed)),
            None,
            None,
        );
        let ids: Vec<i64> = stream.map(|r| r.unwrap().id).collect().await;
        assert_eq!(ids, [7, 8]);
    }
}
