//! etcd's JSON gateway: the v3 API as HTTP+JSON on the client port, for curl and clients
//! that speak no gRPC (`POST /v3/kv/put` and so on).
//!
//! The mapping is grpc-gateway's as etcd configures it: proto field names (`range_end`,
//! `create_revision`), bytes as base64, 64-bit integers as strings (numbers are taken
//! too), fields with zero values left out, enums by name or number. A watch is a POST
//! whose response is a stream of `{"result": ...}` objects, one per line. Errors come as
//! `{"error", "message", "code"}` with the HTTP status grpc-gateway gives the gRPC code.
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
use axum::routing::post;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use serde_json::{Map, Value, json};
use tokio::sync::watch;
use tonic::Status;

use crate::etcd::{AuthService, ClusterService, KvService, LeaseService, MaintenanceService};
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::auth_server::Auth;
use crate::pb::etcdserverpb::cluster_server::Cluster;
use crate::pb::etcdserverpb::kv_server::Kv;
use crate::pb::etcdserverpb::lease_server::Lease;
use crate::pb::etcdserverpb::maintenance_server::Maintenance;
use crate::pb::mvccpb;
use crate::request_path::NodeCore;

#[derive(Clone, Debug)]
struct Gateway {
    core: Arc<NodeCore>,
    stop: watch::Receiver<bool>,
}

/// The gateway's routes (etcd 3.4 serves the same under `/v3beta` and `/v3alpha`; oncekv
/// serves `/v3`).
pub fn routes(core: Arc<NodeCore>, stop: watch::Receiver<bool>) -> Router {
    Router::new()
        .route("/v3/kv/range", post(range))
        .route("/v3/kv/put", post(put))
        .route("/v3/kv/deleterange", post(delete_range))
        .route("/v3/kv/txn", post(txn))
        .route("/v3/kv/compaction", post(compaction))
        .route("/v3/lease/grant", post(lease_grant))
        .route("/v3/lease/revoke", post(lease_revoke))
        .route("/v3/kv/lease/revoke", post(lease_revoke))
        .route("/v3/lease/timetolive", post(lease_time_to_live))
        .route("/v3/kv/lease/timetolive", post(lease_time_to_live))
        .route("/v3/lease/leases", post(lease_leases))
        .route("/v3/kv/lease/leases", post(lease_leases))
        .route("/v3/watch", post(watch))
        .route("/v3/maintenance/status", post(status))
        .route("/v3/cluster/member/list", post(member_list))
        .route("/v3/auth/authenticate", post(authenticate))
        .route("/v3/auth/status", post(auth_status))
        .with_state(Gateway { core, stop })
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
        C::InvalidArgument | C::FailedPrecondition | C::OutOfRange => StatusCode::BAD_REQUEST,
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

fn parse(body: &Bytes) -> Result<Value, Status> {
    if body.is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    serde_json::from_slice(body)
        .map_err(|e| Status::invalid_argument(format!("invalid JSON body: {e}")))
}

// --- reading requests ---------------------------------------------------------------

fn bytes_of(v: &Value, name: &str) -> Result<Bytes, Status> {
    match v.get(name) {
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
    match v.get(name) {
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

fn bool_of(v: &Value, name: &str) -> bool {
    matches!(v.get(name), Some(Value::Bool(true)))
}

/// An enum field, by name (from `names`, index = value) or by number.
fn enum_of(v: &Value, name: &str, names: &[&str]) -> Result<i32, Status> {
    match v.get(name) {
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
        v.get(name)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let compare = list("compare")
        .iter()
        .map(|c| {
            let target = enum_of(c, "target", &["VERSION", "CREATE", "MOD", "VALUE", "LEASE"])?;
            let union = if c.get("version").is_some() {
                Some(TargetUnion::Version(int_of(c, "version")?))
            } else if c.get("create_revision").is_some() {
                Some(TargetUnion::CreateRevision(int_of(c, "create_revision")?))
            } else if c.get("mod_revision").is_some() {
                Some(TargetUnion::ModRevision(int_of(c, "mod_revision")?))
            } else if c.get("value").is_some() {
                Some(TargetUnion::Value(bytes_of(c, "value")?))
            } else if c.get("lease").is_some() {
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
    let request = if let Some(r) = v.get("request_range") {
        R::RequestRange(range_req(r)?)
    } else if let Some(r) = v.get("request_put") {
        R::RequestPut(put_req(r)?)
    } else if let Some(r) = v.get("request_delete_range") {
        R::RequestDeleteRange(delete_req(r)?)
    } else if let Some(r) = v.get("request_txn") {
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

// --- handlers -----------------------------------------------------------------------

async fn range(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let kv = KvService { node: g.core };
    answer(
        async {
            let req = range_req(&parse(&body)?)?;
            let r = kv.range(request(&headers, req)).await?.into_inner();
            Ok(range_resp(&r))
        }
        .await,
    )
}

async fn put(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let kv = KvService { node: g.core };
    answer(
        async {
            let req = put_req(&parse(&body)?)?;
            let r = kv.put(request(&headers, req)).await?.into_inner();
            Ok(put_resp(&r))
        }
        .await,
    )
}

async fn delete_range(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let kv = KvService { node: g.core };
    answer(
        async {
            let req = delete_req(&parse(&body)?)?;
            let r = kv.delete_range(request(&headers, req)).await?.into_inner();
            Ok(delete_resp(&r))
        }
        .await,
    )
}

async fn txn(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let kv = KvService { node: g.core };
    answer(
        async {
            let req = txn_req(&parse(&body)?)?;
            let r = kv.txn(request(&headers, req)).await?.into_inner();
            Ok(txn_resp(&r))
        }
        .await,
    )
}

async fn compaction(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let kv = KvService { node: g.core };
    answer(
        async {
            let v = parse(&body)?;
            let req = pb::CompactionRequest {
                revision: int_of(&v, "revision")?,
                physical: bool_of(&v, "physical"),
            };
            let r = kv.compact(request(&headers, req)).await?.into_inner();
            Ok(Obj::default().value("header", header(&r.header)).done())
        }
        .await,
    )
}

async fn lease_grant(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let lease = LeaseService { node: g.core };
    answer(
        async {
            let v = parse(&body)?;
            let req = pb::LeaseGrantRequest {
                ttl: int_of(&v, "TTL")?,
                id: int_of(&v, "ID")?,
            };
            let r = lease
                .lease_grant(request(&headers, req))
                .await?
                .into_inner();
            Ok(Obj::default()
                .value("header", header(&r.header))
                .int("ID", r.id)
                .int("TTL", r.ttl)
                .text("error", &r.error)
                .done())
        }
        .await,
    )
}

async fn lease_revoke(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let lease = LeaseService { node: g.core };
    answer(
        async {
            let req = pb::LeaseRevokeRequest {
                id: int_of(&parse(&body)?, "ID")?,
            };
            let r = lease
                .lease_revoke(request(&headers, req))
                .await?
                .into_inner();
            Ok(Obj::default().value("header", header(&r.header)).done())
        }
        .await,
    )
}

async fn lease_time_to_live(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let lease = LeaseService { node: g.core };
    answer(
        async {
            let v = parse(&body)?;
            let req = pb::LeaseTimeToLiveRequest {
                id: int_of(&v, "ID")?,
                keys: bool_of(&v, "keys"),
            };
            let r = lease
                .lease_time_to_live(request(&headers, req))
                .await?
                .into_inner();
            let keys = r
                .keys
                .iter()
                .map(|k| Value::String(B64.encode(k)))
                .collect();
            Ok(Obj::default()
                .value("header", header(&r.header))
                .int("ID", r.id)
                .int("TTL", r.ttl)
                .int("grantedTTL", r.granted_ttl)
                .list("keys", keys)
                .done())
        }
        .await,
    )
}

async fn lease_leases(State(g): State<Gateway>, headers: HeaderMap) -> Response {
    let lease = LeaseService { node: g.core };
    answer(
        async {
            let r = lease
                .lease_leases(request(&headers, pb::LeaseLeasesRequest {}))
                .await?
                .into_inner();
            let leases = r
                .leases
                .iter()
                .map(|l| Obj::default().int("ID", l.id).done())
                .collect();
            Ok(Obj::default()
                .value("header", header(&r.header))
                .list("leases", leases)
                .done())
        }
        .await,
    )
}

/// `{"name", "password"}` → `{"header", "token"}`; the token then goes in the
/// `Authorization` header of later requests, as with etcd's gateway.
async fn authenticate(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = AuthService { node: g.core };
    answer(
        async {
            let v = parse(&body)?;
            let text = |name: &str| match v.get(name) {
                None | Some(Value::Null) => Ok(String::new()),
                Some(Value::String(s)) => Ok(s.clone()),
                Some(other) => Err(Status::invalid_argument(format!(
                    "{name}: expected a string, got {other}"
                ))),
            };
            let req = pb::AuthenticateRequest {
                name: text("name")?,
                password: text("password")?,
            };
            let r = auth
                .authenticate(request(&headers, req))
                .await?
                .into_inner();
            Ok(Obj::default()
                .value("header", header(&r.header))
                .text("token", &r.token)
                .done())
        }
        .await,
    )
}

async fn auth_status(State(g): State<Gateway>, headers: HeaderMap) -> Response {
    let auth = AuthService { node: g.core };
    answer(
        async {
            let r = auth
                .auth_status(request(&headers, pb::AuthStatusRequest {}))
                .await?
                .into_inner();
            Ok(Obj::default()
                .value("header", header(&r.header))
                .flag("enabled", r.enabled)
                .uint("authRevision", r.auth_revision)
                .done())
        }
        .await,
    )
}

async fn status(State(g): State<Gateway>, headers: HeaderMap) -> Response {
    let m = MaintenanceService { node: g.core };
    answer(
        async {
            let r = m
                .status(request(&headers, pb::StatusRequest {}))
                .await?
                .into_inner();
            Ok(Obj::default()
                .value("header", header(&r.header))
                .text("version", &r.version)
                .int("dbSize", r.db_size)
                .uint("leader", r.leader)
                .uint("raftIndex", r.raft_index)
                .uint("raftTerm", r.raft_term)
                .uint("raftAppliedIndex", r.raft_applied_index)
                .list("errors", r.errors.iter().map(|e| json!(e)).collect())
                .int("dbSizeInUse", r.db_size_in_use)
                .flag("isLearner", r.is_learner)
                .done())
        }
        .await,
    )
}

async fn member_list(State(g): State<Gateway>, headers: HeaderMap) -> Response {
    let c = ClusterService { node: g.core };
    answer(
        async {
            let r = c
                .member_list(request(&headers, pb::MemberListRequest {}))
                .await?
                .into_inner();
            let members = r
                .members
                .iter()
                .map(|m| {
                    Obj::default()
                        .uint("ID", m.id)
                        .text("name", &m.name)
                        .list("peerURLs", m.peer_ur_ls.iter().map(|u| json!(u)).collect())
                        .list(
                            "clientURLs",
                            m.client_ur_ls.iter().map(|u| json!(u)).collect(),
                        )
                        .flag("isLearner", m.is_learner)
                        .done()
                })
                .collect();
            Ok(Obj::default()
                .value("header", header(&r.header))
                .list("members", members)
                .done())
        }
        .await,
    )
}

/// `POST /v3/watch` with `{"create_request": {...}}`: the watch's responses as a stream
/// of `{"result": ...}` lines, until the client goes away.
async fn watch(State(g): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    use futures::StreamExt;
    let create = match parse(&body).and_then(|v| {
        let c = v.get("create_request").cloned().unwrap_or(Value::Null);
        if c.is_null() {
            return Err(Status::invalid_argument(
                "expected {\"create_request\": {...}}",
            ));
        }
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
        Ok(pb::WatchCreateRequest {
            key: bytes_of(&c, "key")?,
            range_end: bytes_of(&c, "range_end")?,
            start_revision: int_of(&c, "start_revision")?,
            progress_notify: bool_of(&c, "progress_notify"),
            filters,
            prev_kv: bool_of(&c, "prev_kv"),
            watch_id: int_of(&c, "watch_id")?,
            fragment: bool_of(&c, "fragment"),
        })
    }) {
        Ok(c) => c,
        Err(s) => return error(&s),
    };
    let req = pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(create)),
    };
    // One create request, then the request side stays open: the watch runs until the
    // client disconnects (which drops the response stream).
    let requests = futures::stream::iter([Ok(req)]).chain(futures::stream::pending());
    let caller = crate::auth::Caller::of_http(&headers);
    let responses = crate::etcd::watch_stream(g.core, g.stop, Box::pin(requests), false, caller);
    let lines = responses.map(|r| {
        let v = match r {
            Ok(resp) => json!({ "result": watch_resp(&resp) }),
            Err(s) => json!({ "error": { "grpc_code": s.code() as i32, "message": s.message(), "http_code": http_status(s.code()).as_u16() } }),
        };
        Ok::<_, std::convert::Infallible>(Bytes::from(format!("{v}\n")))
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(lines),
    )
        .into_response()
}
