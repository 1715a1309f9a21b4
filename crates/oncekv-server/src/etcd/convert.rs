//! Between etcd's protobuf messages and the core's request and response types.

use oncekv_core as core;
use oncekv_core::{
    CompareResult, CompareTarget, Event, EventKind, KeyRange, SortOrder, SortTarget,
};

use crate::error::ApiError;
use crate::pb::etcdserverpb as pb;
use crate::pb::mvccpb;

pub fn range_request(r: &pb::RangeRequest) -> Result<core::RangeRequest, ApiError> {
    use pb::range_request::{SortOrder as O, SortTarget as T};
    let sort_order = match O::try_from(r.sort_order) {
        Ok(O::None) => SortOrder::None,
        Ok(O::Ascend) => SortOrder::Ascend,
        Ok(O::Descend) => SortOrder::Descend,
        Err(_) => {
            return Err(ApiError::InvalidArgument(format!(
                "unknown sort order {}",
                r.sort_order
            )));
        }
    };
    let sort_target = match T::try_from(r.sort_target) {
        Ok(T::Key) => SortTarget::Key,
        Ok(T::Version) => SortTarget::Version,
        Ok(T::Create) => SortTarget::Create,
        Ok(T::Mod) => SortTarget::Mod,
        Ok(T::Value) => SortTarget::Value,
        Err(_) => {
            return Err(ApiError::InvalidArgument(format!(
                "unknown sort target {}",
                r.sort_target
            )));
        }
    };
    Ok(core::RangeRequest {
        range: KeyRange {
            key: r.key.clone(),
            range_end: r.range_end.clone(),
        },
        limit: r.limit,
        revision: r.revision,
        sort_order,
        sort_target,
        keys_only: r.keys_only,
        count_only: r.count_only,
        min_mod_revision: r.min_mod_revision,
        max_mod_revision: r.max_mod_revision,
        min_create_revision: r.min_create_revision,
        max_create_revision: r.max_create_revision,
    })
}

pub fn put_request(r: pb::PutRequest) -> core::PutRequest {
    core::PutRequest {
        key: r.key,
        value: r.value,
        lease: r.lease,
        prev_kv: r.prev_kv,
        ignore_value: r.ignore_value,
        ignore_lease: r.ignore_lease,
    }
}

pub fn delete_request(r: pb::DeleteRangeRequest) -> core::DeleteRangeRequest {
    core::DeleteRangeRequest {
        range: KeyRange {
            key: r.key,
            range_end: r.range_end,
        },
        prev_kv: r.prev_kv,
    }
}

pub fn txn_request(r: pb::TxnRequest) -> Result<core::TxnRequest, ApiError> {
    let compare = r
        .compare
        .into_iter()
        .map(compare)
        .collect::<Result<_, _>>()?;
    let success = r
        .success
        .into_iter()
        .map(request_op)
        .collect::<Result<_, _>>()?;
    let failure = r
        .failure
        .into_iter()
        .map(request_op)
        .collect::<Result<_, _>>()?;
    Ok(core::TxnRequest {
        compare,
        success,
        failure,
    })
}

fn compare(c: pb::Compare) -> Result<core::Compare, ApiError> {
    use pb::compare::{CompareResult as R, CompareTarget as T, TargetUnion as U};
    let result = match R::try_from(c.result) {
        Ok(R::Equal) => CompareResult::Equal,
        Ok(R::Greater) => CompareResult::Greater,
        Ok(R::Less) => CompareResult::Less,
        Ok(R::NotEqual) => CompareResult::NotEqual,
        Err(_) => {
            return Err(ApiError::InvalidArgument(format!(
                "unknown compare result {}",
                c.result
            )));
        }
    };
    // etcd reads the operand from the union member matching `target`; a missing one
    // compares against the zero value.
    let target = match (T::try_from(c.target), c.target_union) {
        (Ok(T::Version), Some(U::Version(v))) => CompareTarget::Version(v),
        (Ok(T::Version), _) => CompareTarget::Version(0),
        (Ok(T::Create), Some(U::CreateRevision(v))) => CompareTarget::CreateRevision(v),
        (Ok(T::Create), _) => CompareTarget::CreateRevision(0),
        (Ok(T::Mod), Some(U::ModRevision(v))) => CompareTarget::ModRevision(v),
        (Ok(T::Mod), _) => CompareTarget::ModRevision(0),
        (Ok(T::Value), Some(U::Value(v))) => CompareTarget::Value(v),
        (Ok(T::Value), _) => CompareTarget::Value(Default::default()),
        (Ok(T::Lease), Some(U::Lease(v))) => CompareTarget::Lease(v),
        (Ok(T::Lease), _) => CompareTarget::Lease(0),
        (Err(_), _) => {
            return Err(ApiError::InvalidArgument(format!(
                "unknown compare target {}",
                c.target
            )));
        }
    };
    Ok(core::Compare {
        result,
        target,
        range: KeyRange {
            key: c.key,
            range_end: c.range_end,
        },
    })
}

fn request_op(op: pb::RequestOp) -> Result<core::RequestOp, ApiError> {
    use pb::request_op::Request;
    Ok(match op.request {
        Some(Request::RequestRange(r)) => core::RequestOp::Range(range_request(&r)?),
        Some(Request::RequestPut(p)) => core::RequestOp::Put(put_request(p)),
        Some(Request::RequestDeleteRange(d)) => core::RequestOp::DeleteRange(delete_request(d)),
        Some(Request::RequestTxn(t)) => core::RequestOp::Txn(txn_request(t)?),
        None => return Err(ApiError::InvalidArgument("txn op with no request".into())),
    })
}

pub fn key_value(kv: core::KeyValue) -> mvccpb::KeyValue {
    kv.into()
}

pub fn range_response(
    r: core::RangeResponse,
    header: Option<pb::ResponseHeader>,
) -> pb::RangeResponse {
    pb::RangeResponse {
        header,
        kvs: r.kvs.into_iter().map(key_value).collect(),
        more: r.more,
        count: r.count,
    }
}

pub fn put_response(r: core::PutResponse, header: Option<pb::ResponseHeader>) -> pb::PutResponse {
    pb::PutResponse {
        header,
        prev_kv: r.prev_kv.map(|kv| key_value(*kv)),
    }
}

pub fn delete_response(
    r: core::DeleteRangeResponse,
    header: Option<pb::ResponseHeader>,
) -> pb::DeleteRangeResponse {
    pb::DeleteRangeResponse {
        header,
        deleted: r.deleted,
        prev_kvs: r.prev_kvs.into_iter().map(key_value).collect(),
    }
}

/// A txn response. Its nested responses' headers carry a revision only, as etcd 3.4's
/// do (its server fills the outer header alone): the revision the op saw or wrote, the
/// txn's starting revision until one of its ops changed something and the txn's write
/// revision from then on. A nested txn's own header is empty.
pub fn txn_response(r: core::TxnResponse, header: Option<pb::ResponseHeader>) -> pb::TxnResponse {
    let revision = header.map_or(0, |h| h.revision);
    // A txn that changed something wrote at its starting revision + 1.
    let begin = if txn_changes(&r) {
        revision - 1
    } else {
        revision
    };
    pb::TxnResponse {
        header,
        succeeded: r.succeeded,
        responses: nested_responses(r.responses, begin, &mut false),
    }
}

/// Whether a txn's ops changed anything (a put always does, a delete that deleted).
fn txn_changes(r: &core::TxnResponse) -> bool {
    r.responses.iter().any(|op| match op {
        core::ResponseOp::Range(_) => false,
        core::ResponseOp::Put(_) => true,
        core::ResponseOp::DeleteRange(d) => d.deleted > 0,
        core::ResponseOp::Txn(t) => txn_changes(t),
    })
}

fn nested_responses(
    ops: Vec<core::ResponseOp>,
    begin: i64,
    changed: &mut bool,
) -> Vec<pb::ResponseOp> {
    use pb::response_op::Response as R;
    let at = |changed: bool| {
        Some(pb::ResponseHeader {
            revision: begin + i64::from(changed),
            ..pb::ResponseHeader::default()
        })
    };
    ops.into_iter()
        .map(|op| pb::ResponseOp {
            response: Some(match op {
                core::ResponseOp::Range(x) => R::ResponseRange(range_response(x, at(*changed))),
                core::ResponseOp::Put(x) => {
                    *changed = true;
                    R::ResponsePut(put_response(x, at(true)))
                }
                core::ResponseOp::DeleteRange(x) => {
                    *changed |= x.deleted > 0;
                    R::ResponseDeleteRange(delete_response(x, at(*changed)))
                }
                core::ResponseOp::Txn(x) => R::ResponseTxn(pb::TxnResponse {
                    header: Some(pb::ResponseHeader::default()),
                    succeeded: x.succeeded,
                    responses: nested_responses(x.responses, begin, changed),
                }),
            }),
        })
        .collect()
}

/// A history event as etcd's `mvccpb.Event`. A delete's `kv` carries the key and the
/// delete's revision only, as etcd's does.
pub fn event(e: Event) -> mvccpb::Event {
    let kind = match e.kind {
        EventKind::Put => mvccpb::event::EventType::Put,
        EventKind::Delete => mvccpb::event::EventType::Delete,
    };
    mvccpb::Event {
        r#type: kind as i32,
        kv: Some(key_value(e.kv)),
        prev_kv: e.prev_kv.map(key_value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn revisions(r: &pb::TxnResponse) -> Vec<Option<i64>> {
        use pb::response_op::Response as R;
        r.responses
            .iter()
            .flat_map(|op| match op.response.as_ref() {
                Some(R::ResponseRange(x)) => vec![x.header.map(|h| h.revision)],
                Some(R::ResponsePut(x)) => vec![x.header.map(|h| h.revision)],
                Some(R::ResponseDeleteRange(x)) => vec![x.header.map(|h| h.revision)],
                Some(R::ResponseTxn(x)) => {
                    let mut inner = vec![x.header.map(|h| h.revision)];
                    inner.extend(revisions(x));
                    inner
                }
                None => vec![None],
            })
            .collect()
    }

    #[test]
    fn nested_headers_carry_the_revision_each_op_saw_as_etcds_do() {
        use oncekv_core::ResponseOp as Op;
        let outer = pb::ResponseHeader {
            cluster_id: 1,
            member_id: 2,
            revision: 10,
            raft_term: 3,
        };
        // get, nothing deleted, put, get, nested txn with a get: the put wrote at 10, so
        // the txn began at 9.
        let txn = core::TxnResponse {
            succeeded: true,
            responses: vec![
                Op::Range(core::RangeResponse::default()),
                Op::DeleteRange(core::DeleteRangeResponse::default()),
                Op::Put(core::PutResponse::default()),
                Op::Range(core::RangeResponse::default()),
                Op::Txn(core::TxnResponse {
                    succeeded: false,
                    responses: vec![Op::Range(core::RangeResponse::default())],
                }),
            ],
        };
        let r = txn_response(txn, Some(outer));
        assert_eq!(r.header, Some(outer));
        assert_eq!(
            revisions(&r),
            [Some(9), Some(9), Some(10), Some(10), Some(0), Some(10)]
        );
        let inner = match &r.responses[2].response {
            Some(pb::response_op::Response::ResponsePut(p)) => p.header,
            other => panic!("{other:?}"),
        };
        assert_eq!(inner.map(|h| (h.cluster_id, h.member_id)), Some((0, 0)));
        // A txn that changed nothing: every op saw the current revision.
        let read_only = core::TxnResponse {
            succeeded: true,
            responses: vec![Op::Range(core::RangeResponse::default())],
        };
        assert_eq!(revisions(&txn_response(read_only, Some(outer))), [Some(10)]);
    }
}
