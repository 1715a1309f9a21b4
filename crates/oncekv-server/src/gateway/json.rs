//! grpc-gateway's proto3 JSON, both ways: a request body's fields by proto or lowerCamelCase
//! name (bytes as base64, 64-bit integers as strings or numbers, enums by name or number),
//! and response objects that leave zero values out. What every service's mapping is made of.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use serde_json::{Map, Value, json};
use tonic::Status;

use crate::pb::etcdserverpb as pb;

/// The request body: a JSON object (an empty body is `{}`).
pub(super) fn parse(body: &Bytes) -> Result<Value, Status> {
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

/// A request's field by its proto name (`range_end`) or, as grpc-gateway's parser takes
/// too, by its lowerCamelCase JSON name (`rangeEnd`), which Go clients marshalling with
/// jsonpb's defaults send.
pub(super) fn field<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
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

pub(super) fn bytes_of(v: &Value, name: &str) -> Result<Bytes, Status> {
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

pub(super) fn int_of(v: &Value, name: &str) -> Result<i64, Status> {
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

pub(super) fn uint_of(v: &Value, name: &str) -> Result<u64, Status> {
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

pub(super) fn text_of(v: &Value, name: &str) -> Result<String, Status> {
    match field(v, name) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(Status::invalid_argument(format!(
            "{name}: expected a string, got {other}"
        ))),
    }
}

pub(super) fn texts_of(v: &Value, name: &str) -> Result<Vec<String>, Status> {
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

pub(super) fn bool_of(v: &Value, name: &str) -> bool {
    matches!(field(v, name), Some(Value::Bool(true)))
}

/// An enum field, by name (from `names`, index = value) or by number.
pub(super) fn enum_of(v: &Value, name: &str, names: &[&str]) -> Result<i32, Status> {
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

/// A JSON object that leaves zero values out, as grpc-gateway's marshaler does.
#[derive(Default)]
pub(super) struct Obj(Map<String, Value>);

impl Obj {
    pub(super) fn int(mut self, name: &str, n: i64) -> Self {
        if n != 0 {
            self.0.insert(name.into(), Value::String(n.to_string()));
        }
        self
    }

    pub(super) fn uint(mut self, name: &str, n: u64) -> Self {
        if n != 0 {
            self.0.insert(name.into(), Value::String(n.to_string()));
        }
        self
    }

    /// A `uint32`: a JSON number.
    pub(super) fn uint32(mut self, name: &str, n: u32) -> Self {
        if n != 0 {
            self.0.insert(name.into(), Value::from(n));
        }
        self
    }

    /// An enum: its name from `names` (index = value), or its number if unnamed.
    pub(super) fn enumerated(mut self, name: &str, n: i32, names: &[&str]) -> Self {
        if n != 0 {
            let v = usize::try_from(n)
                .ok()
                .and_then(|i| names.get(i))
                .map_or_else(|| Value::from(n), |s| Value::from(*s));
            self.0.insert(name.into(), v);
        }
        self
    }

    pub(super) fn bytes(mut self, name: &str, b: &[u8]) -> Self {
        if !b.is_empty() {
            self.0.insert(name.into(), Value::String(B64.encode(b)));
        }
        self
    }

    pub(super) fn flag(mut self, name: &str, b: bool) -> Self {
        if b {
            self.0.insert(name.into(), Value::Bool(true));
        }
        self
    }

    pub(super) fn text(mut self, name: &str, s: &str) -> Self {
        if !s.is_empty() {
            self.0.insert(name.into(), Value::String(s.to_string()));
        }
        self
    }

    pub(super) fn value(mut self, name: &str, v: Option<Value>) -> Self {
        if let Some(v) = v {
            self.0.insert(name.into(), v);
        }
        self
    }

    pub(super) fn list(mut self, name: &str, items: Vec<Value>) -> Self {
        if !items.is_empty() {
            self.0.insert(name.into(), Value::Array(items));
        }
        self
    }

    pub(super) fn done(self) -> Value {
        Value::Object(self.0)
    }
}

pub(super) fn header(h: &Option<pb::ResponseHeader>) -> Option<Value> {
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
pub(super) fn header_only(h: &Option<pb::ResponseHeader>) -> Value {
    Obj::default().value("header", header(h)).done()
}

pub(super) fn texts(items: &[String]) -> Vec<Value> {
    items.iter().map(|s| json!(s)).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

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
    fn enums_are_written_by_name_and_zero_left_out() {
        // authpb's permission types.
        const PERM_TYPES: &[&str] = &["READ", "WRITE", "READWRITE"];
        let v = Obj::default()
            .enumerated("zero", 0, PERM_TYPES)
            .enumerated("named", 2, PERM_TYPES)
            .enumerated("unnamed", 7, PERM_TYPES)
            .done();
        assert_eq!(v, json!({"named": "READWRITE", "unnamed": 7}));
    }
}
