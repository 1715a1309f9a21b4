//! grpc-gateway's proto3 JSON, both ways, through the serde impls oncekv-proto generates
//! for the prost types with pbjson-build (its `json` feature): a request body's fields by
//! proto or lowerCamelCase name (bytes as base64, 64-bit integers as strings or numbers,
//! enums by name or number, unknown fields passed over), and answers with proto field
//! names that leave zero values out. What every service's mapping is made of.

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tonic::Status;

/// A request body as its message (an empty body is `{}`; anything but an object is
/// refused).
pub(super) fn parse<T: DeserializeOwned>(body: &Bytes) -> Result<T, Status> {
    let body: &[u8] = if body.is_empty() { b"{}" } else { body };
    from_value(serde_json::from_slice(body).map_err(bad_body)?)
}

/// One object of a streamed body as its message. A field given as `null` is left unset,
/// as jsonpb reads it (pbjson refuses a `null` scalar).
pub(super) fn from_value<T: DeserializeOwned>(mut v: Value) -> Result<T, Status> {
    drop_nulls(&mut v);
    serde_json::from_value(v).map_err(bad_body)
}

fn drop_nulls(v: &mut Value) {
    match v {
        Value::Object(fields) => {
            fields.retain(|_, f| !f.is_null());
            fields.values_mut().for_each(drop_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

/// An answer as its JSON object. Only an enum value the proto does not name fails.
pub(super) fn to_json<T: Serialize>(message: &T) -> Result<Value, Status> {
    serde_json::to_value(message)
        .map_err(|e| Status::internal(format!("answer not written as JSON: {e}")))
}

/// A body that is not the message: InvalidArgument, as grpc-gateway answers it. pbjson
/// passes base64's own error on ("Invalid symbol 32, offset 3."), which does not say what
/// was expected; that is said first.
fn bad_body(e: serde_json::Error) -> Status {
    const BASE64_ERRORS: [&str; 4] = [
        "Invalid symbol",
        "Invalid last symbol",
        "Invalid input length",
        "Invalid padding",
    ];
    let what = e.to_string();
    let kind = if BASE64_ERRORS.iter().any(|p| what.starts_with(p)) {
        "not base64: "
    } else {
        ""
    };
    Status::invalid_argument(format!("invalid JSON body: {kind}{what}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::pb::{authpb, etcdserverpb as pb};
    use serde_json::json;

    fn body(v: &Value) -> Bytes {
        Bytes::from(v.to_string())
    }

    #[test]
    fn a_body_must_be_an_object() {
        assert_eq!(
            parse::<pb::RangeRequest>(&Bytes::new()).unwrap(),
            pb::RangeRequest::default()
        );
        let e = parse::<pb::RangeRequest>(&Bytes::from_static(b"\"oops\"")).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        let e = parse::<pb::PutRequest>(&body(&json!({"key": "not base64!"}))).unwrap_err();
        assert!(e.message().contains("not base64"), "{e}");
    }

    #[test]
    fn a_null_field_is_left_unset() {
        let put: pb::PutRequest =
            parse(&body(&json!({"key": "YQ==", "value": null, "lease": null}))).unwrap();
        assert_eq!(
            (&put.key[..], &put.value[..], put.lease),
            (&b"a"[..], &b""[..], 0)
        );
    }

    #[test]
    fn member_ids_take_the_whole_u64_range() {
        let r: pb::MemberRemoveRequest =
            parse(&body(&json!({"ID": "13064775543180735813"}))).unwrap();
        assert_eq!(r.id, 13064775543180735813);
        let r: pb::MemberRemoveRequest =
            parse(&body(&json!({"ID": 18446744073709551615u64}))).unwrap();
        assert_eq!(r.id, u64::MAX);
        assert!(parse::<pb::MemberRemoveRequest>(&body(&json!({"ID": -1}))).is_err());
    }

    #[test]
    fn answers_use_proto_names_strings_for_64_bits_and_leave_zeros_out() {
        let header = pb::ResponseHeader {
            cluster_id: u64::MAX,
            member_id: 0,
            revision: 5,
            raft_term: 2,
        };
        let v = to_json(&pb::HashKvResponse {
            header: Some(header),
            hash: 7,
            compact_revision: 0,
        })
        .unwrap();
        assert_eq!(
            v,
            json!({
                "header": {"cluster_id": "18446744073709551615", "revision": "5", "raft_term": "2"},
                "hash": 7
            })
        );
    }

    #[test]
    fn enums_are_written_by_name_and_zero_left_out() {
        let perm = |perm_type| authpb::Permission {
            perm_type,
            key: Bytes::from_static(b"a"),
            range_end: Bytes::new(),
        };
        assert_eq!(to_json(&perm(0)).unwrap(), json!({"key": "YQ=="}));
        assert_eq!(
            to_json(&perm(2)).unwrap(),
            json!({"permType": "READWRITE", "key": "YQ=="})
        );
        assert_eq!(to_json(&perm(7)).unwrap_err().code(), tonic::Code::Internal);
    }
}
