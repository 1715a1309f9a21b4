//! `--namespace`: every key a downstream client names is taken to live under a prefix on
//! the cluster, and comes back without it, as with etcd's proxy (KV and Watch; lease,
//! lock and election names are passed as they are, as etcd's proxy passes them).

use bytes::{Bytes, BytesMut};
use oncekv_proto::etcdserverpb::{
    self as pb, request_op::Request as Op, response_op::Response as OpResp,
};
use oncekv_proto::mvccpb;

/// A key prefix; empty means no namespace (every method is then a no-op).
#[derive(Debug, Clone, Default)]
pub(crate) struct Namespace(Bytes);

impl Namespace {
    pub(crate) fn new(prefix: &str) -> Namespace {
        Namespace(Bytes::copy_from_slice(prefix.as_bytes()))
    }

    fn on(&self) -> bool {
        !self.0.is_empty()
    }

    fn key(&self, key: &mut Bytes) {
        let mut k = BytesMut::with_capacity(self.0.len() + key.len());
        k.extend_from_slice(&self.0);
        k.extend_from_slice(key);
        *key = k.freeze();
    }

    /// A range end: `"\0"` (every key from `key` on) becomes the end of the namespace;
    /// an empty end (a single key) stays empty.
    fn range_end(&self, end: &mut Bytes) {
        if end.is_empty() {
        } else if end.as_ref() == [0] {
            *end = prefix_end(&self.0);
        } else {
            self.key(end);
        }
    }

    /// Both ends of a request's range.
    pub(crate) fn range(&self, key: &mut Bytes, end: &mut Bytes) {
        if self.on() {
            self.key(key);
            self.range_end(end);
        }
    }

    /// Removes the namespace from a key the cluster returned.
    pub(crate) fn strip(&self, key: &mut Bytes) {
        if self.on() && key.starts_with(&self.0) {
            *key = key.slice(self.0.len()..);
        }
    }

    pub(crate) fn strip_kv(&self, kv: &mut mvccpb::KeyValue) {
        self.strip(&mut kv.key);
    }

    pub(crate) fn strip_event(&self, e: &mut mvccpb::Event) {
        if let Some(kv) = e.kv.as_mut() {
            self.strip_kv(kv);
        }
        if let Some(kv) = e.prev_kv.as_mut() {
            self.strip_kv(kv);
        }
    }

    pub(crate) fn txn(&self, t: &mut pb::TxnRequest) {
        if !self.on() {
            return;
        }
        for c in &mut t.compare {
            self.range(&mut c.key, &mut c.range_end);
        }
        for op in t.success.iter_mut().chain(t.failure.iter_mut()) {
            match op.request.as_mut() {
                Some(Op::RequestRange(r)) => self.range(&mut r.key, &mut r.range_end),
                Some(Op::RequestPut(r)) => self.key(&mut r.key),
                Some(Op::RequestDeleteRange(r)) => self.range(&mut r.key, &mut r.range_end),
                Some(Op::RequestTxn(r)) => self.txn(r),
                None => {}
            }
        }
    }

    pub(crate) fn strip_txn(&self, t: &mut pb::TxnResponse) {
        if !self.on() {
            return;
        }
        for r in &mut t.responses {
            match r.response.as_mut() {
                Some(OpResp::ResponseRange(r)) => r.kvs.iter_mut().for_each(|kv| self.strip_kv(kv)),
                Some(OpResp::ResponsePut(r)) => {
                    r.prev_kv.iter_mut().for_each(|kv| self.strip_kv(kv))
                }
                Some(OpResp::ResponseDeleteRange(r)) => {
                    r.prev_kvs.iter_mut().for_each(|kv| self.strip_kv(kv))
                }
                Some(OpResp::ResponseTxn(r)) => self.strip_txn(r),
                None => {}
            }
        }
    }
}

/// The smallest key greater than every key starting with `prefix` (`"\0"`, every key,
/// when there is none).
fn prefix_end(prefix: &[u8]) -> Bytes {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Bytes::from(end);
        }
    }
    Bytes::from_static(&[0])
}

/// Whether a txn writes (any put or delete, at any depth): only then is it tracked.
pub(crate) fn txn_writes(t: &pb::TxnRequest) -> bool {
    t.success
        .iter()
        .chain(t.failure.iter())
        .any(|op| match op.request.as_ref() {
            Some(Op::RequestPut(_)) | Some(Op::RequestDeleteRange(_)) => true,
            Some(Op::RequestTxn(t)) => txn_writes(t),
            Some(Op::RequestRange(_)) | None => false,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_ends_move_under_the_namespace_and_back() {
        let ns = Namespace::new("app/");
        let (mut key, mut end) = (Bytes::from_static(b"a"), Bytes::from_static(&[0]));
        ns.range(&mut key, &mut end);
        assert_eq!((&key[..], &end[..]), (&b"app/a"[..], &b"app0"[..]));
        let (mut key, mut end) = (Bytes::from_static(b"a"), Bytes::new());
        ns.range(&mut key, &mut end);
        assert_eq!((&key[..], &end[..]), (&b"app/a"[..], &b""[..]));
        ns.strip(&mut key);
        assert_eq!(&key[..], b"a");
        // A key outside the namespace (cannot come back from a namespaced request) is
        // left whole rather than cut.
        let mut other = Bytes::from_static(b"x");
        ns.strip(&mut other);
        assert_eq!(&other[..], b"x");
    }

    #[test]
    fn prefix_end_carries_past_0xff() {
        assert_eq!(&prefix_end(b"a\xff")[..], b"b");
        assert_eq!(&prefix_end(b"\xff\xff")[..], &[0]);
    }

    #[test]
    fn a_txn_writes_if_any_branch_at_any_depth_does() {
        let put = pb::RequestOp {
            request: Some(Op::RequestPut(pb::PutRequest::default())),
        };
        let get = pb::RequestOp {
            request: Some(Op::RequestRange(pb::RangeRequest::default())),
        };
        let reads = pb::TxnRequest {
            success: vec![get.clone()],
            ..Default::default()
        };
        assert!(!txn_writes(&reads));
        let nested = pb::TxnRequest {
            failure: vec![pb::RequestOp {
                request: Some(Op::RequestTxn(pb::TxnRequest {
                    success: vec![put],
                    ..Default::default()
                })),
            }],
            success: vec![get],
            ..Default::default()
        };
        assert!(txn_writes(&nested));
    }
}
