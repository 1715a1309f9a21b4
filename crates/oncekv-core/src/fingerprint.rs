//! A request's fingerprint: a 64-bit digest of an [`Op`], saved with its response.
//!
//! A session answers a retried `(client_id, seq)` with the response saved for it (rule 5).
//! If a buggy client sends a *different* request under a seq it already used, that saved
//! response would be a wrong answer passed off as the outcome of the new request; comparing
//! fingerprints turns it into an explicit refusal instead.
//!
//! Fingerprints are replicated state: a replica compares a request against a fingerprint
//! that another replica computed and shipped in a snapshot. So the digest is defined over
//! an explicit encoding of the op's fields, in 64-bit words, with fixed constants and
//! wrapping 64/128-bit arithmetic only: the same on every platform, build and version of
//! Rust (unlike std's `DefaultHasher` or anything that hashes a `usize`). Changing the
//! encoding changes every saved fingerprint, which would make replicas disagree on
//! duplicates: the pinned values in the tests below are there to notice it.
//!
//! Every struct is destructured without `..`, so a field added to a request does not
//! compile until it is given a place in the encoding.

use bytes::Bytes;

use crate::command::{
    Compare, CompareResult, CompareTarget, DeleteRangeRequest, KeyRange, Op, PutRequest,
    RangeRequest, RequestOp, SortOrder, SortTarget, TxnRequest,
};

/// Initial state (the first digits of π's fractional part in hex).
const SEED: u64 = 0x243f_6a88_85a3_08d3;
/// Odd multipliers (2^64/φ, and the next digits of π).
const MUL: u64 = 0x9e37_79b9_7f4a_7c15;
const FINAL_MUL: u64 = 0x1319_8a2e_0370_7345;

/// Kind tags, one per variant that can appear (ops, txn ops, compare targets and
/// results, sort options): distinct so that no two shapes share an encoding prefix.
mod tag {
    pub(super) const PUT: u64 = 1;
    pub(super) const DELETE_RANGE: u64 = 2;
    pub(super) const TXN: u64 = 3;
    pub(super) const LEASE_GRANT: u64 = 4;
    pub(super) const LEASE_REVOKE: u64 = 5;
    pub(super) const LEASE_KEEP_ALIVE: u64 = 6;
    pub(super) const RANGE: u64 = 7;
    pub(super) const TARGET_VERSION: u64 = 8;
    pub(super) const TARGET_CREATE: u64 = 9;
    pub(super) const TARGET_MOD: u64 = 10;
    pub(super) const TARGET_VALUE: u64 = 11;
    pub(super) const TARGET_LEASE: u64 = 12;
    pub(super) const COMPACT: u64 = 13;
    pub(super) const ENQUEUE: u64 = 14;
}

/// 64 × 64 → 128-bit multiply, folded back to 64 bits: every input bit reaches every output
/// bit, at the cost of one multiply per word.
#[inline]
fn fold_mul(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

/// The running digest.
struct Digest(u64);

impl Digest {
    #[inline]
    fn word(&mut self, w: u64) {
        self.0 = fold_mul(self.0 ^ w, MUL);
    }

    fn int(&mut self, v: i64) {
        self.word(v as u64);
    }

    /// Flags, packed into one word (bit i is `flags[i]`).
    fn flags(&mut self, flags: &[bool]) {
        let packed = flags
            .iter()
            .enumerate()
            .fold(0u64, |w, (i, &f)| w | (u64::from(f) << i));
        self.word(packed);
    }

    /// A length: counts and byte lengths are encoded as 64-bit words whatever `usize` is.
    fn len(&mut self, n: usize) {
        self.word(n as u64);
    }

    /// The length, then the bytes in little-endian 8-byte words, the last one padded with
    /// zeros (the length prefix tells the padding from data).
    fn bytes(&mut self, b: &Bytes) {
        self.len(b.len());
        let mut chunks = b.chunks_exact(8);
        for chunk in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            self.word(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.word(u64::from_le_bytes(w));
        }
    }

    fn range(&mut self, r: &KeyRange) {
        let KeyRange { key, range_end } = r;
        self.bytes(key);
        self.bytes(range_end);
    }

    fn put(&mut self, p: &PutRequest) {
        let PutRequest {
            key,
            value,
            lease,
            prev_kv,
            ignore_value,
            ignore_lease,
        } = p;
        self.word(tag::PUT);
        self.bytes(key);
        self.bytes(value);
        self.int(*lease);
        self.flags(&[*prev_kv, *ignore_value, *ignore_lease]);
    }

    fn delete(&mut self, d: &DeleteRangeRequest) {
        let DeleteRangeRequest { range, prev_kv } = d;
        self.word(tag::DELETE_RANGE);
        self.range(range);
        self.flags(&[*prev_kv]);
    }

    fn read(&mut self, r: &RangeRequest) {
        let RangeRequest {
            range,
            limit,
            revision,
            sort_order,
            sort_target,
            keys_only,
            count_only,
            min_mod_revision,
            max_mod_revision,
            min_create_revision,
            max_create_revision,
        } = r;
        self.word(tag::RANGE);
        self.range(range);
        self.int(*limit);
        self.int(*revision);
        self.word(match sort_order {
            SortOrder::None => 0,
            SortOrder::Ascend => 1,
            SortOrder::Descend => 2,
        });
        self.word(match sort_target {
            SortTarget::Key => 0,
            SortTarget::Version => 1,
            SortTarget::Create => 2,
            SortTarget::Mod => 3,
            SortTarget::Value => 4,
        });
        self.flags(&[*keys_only, *count_only]);
        self.int(*min_mod_revision);
        self.int(*max_mod_revision);
        self.int(*min_create_revision);
        self.int(*max_create_revision);
    }

    fn compare(&mut self, c: &Compare) {
        let Compare {
            result,
            target,
            range,
        } = c;
        self.word(match result {
            CompareResult::Equal => 0,
            CompareResult::Greater => 1,
            CompareResult::Less => 2,
            CompareResult::NotEqual => 3,
        });
        match target {
            CompareTarget::Version(v) => {
                self.word(tag::TARGET_VERSION);
                self.int(*v);
            }
            CompareTarget::CreateRevision(v) => {
                self.word(tag::TARGET_CREATE);
                self.int(*v);
            }
            CompareTarget::ModRevision(v) => {
                self.word(tag::TARGET_MOD);
                self.int(*v);
            }
            CompareTarget::Value(v) => {
                self.word(tag::TARGET_VALUE);
                self.bytes(v);
            }
            CompareTarget::Lease(v) => {
                self.word(tag::TARGET_LEASE);
                self.int(*v);
            }
        }
        self.range(range);
    }

    fn request_ops(&mut self, ops: &[RequestOp]) {
        self.len(ops.len());
        for op in ops {
            match op {
                RequestOp::Range(r) => self.read(r),
                RequestOp::Put(p) => self.put(p),
                RequestOp::DeleteRange(d) => self.delete(d),
                RequestOp::Txn(t) => self.txn(t),
            }
        }
    }

    fn txn(&mut self, t: &TxnRequest) {
        let TxnRequest {
            compare,
            success,
            failure,
        } = t;
        self.word(tag::TXN);
        self.len(compare.len());
        for c in compare {
            self.compare(c);
        }
        self.request_ops(success);
        self.request_ops(failure);
    }

    fn op(&mut self, op: &Op) {
        match op {
            Op::Put(p) => self.put(p),
            Op::DeleteRange(d) => self.delete(d),
            Op::Txn(t) => self.txn(t),
            Op::LeaseGrant { id, ttl } => {
                self.word(tag::LEASE_GRANT);
                self.int(*id);
                self.int(*ttl);
            }
            Op::LeaseRevoke { id } => {
                self.word(tag::LEASE_REVOKE);
                self.int(*id);
            }
            Op::LeaseKeepAlive { id } => {
                self.word(tag::LEASE_KEEP_ALIVE);
                self.int(*id);
            }
            Op::Compact { revision } => {
                self.word(tag::COMPACT);
                self.int(*revision);
            }
            Op::Enqueue(e) => {
                self.word(tag::ENQUEUE);
                self.bytes(&e.name);
                self.int(e.lease);
                self.bytes(&e.value);
                self.word(u64::from(e.proclaim));
            }
        }
    }

    fn finish(self) -> u64 {
        fold_mul(self.0, FINAL_MUL)
    }
}

impl Op {
    /// This request's fingerprint: equal ops give equal fingerprints on every replica,
    /// platform and build; different ops give different ones except with probability about
    /// 2^-64. Not a cryptographic hash (it guards against client mistakes, not forgery: a
    /// client can only confuse its own session). Reads every byte of the op once.
    pub fn fingerprint(&self) -> u64 {
        let mut d = Digest(SEED);
        d.op(self);
        d.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &'static str, value: &'static str) -> PutRequest {
        PutRequest {
            key: Bytes::from_static(key.as_bytes()),
            value: Bytes::from_static(value.as_bytes()),
            ..PutRequest::default()
        }
    }

    fn txn() -> Op {
        Op::Txn(TxnRequest {
            compare: vec![Compare {
                result: CompareResult::Equal,
                target: CompareTarget::Value(Bytes::from_static(b"v")),
                range: KeyRange::single("k"),
            }],
            success: vec![
                RequestOp::Put(put("k", "w")),
                RequestOp::Range(RangeRequest {
                    range: KeyRange::prefix("k"),
                    ..RangeRequest::default()
                }),
            ],
            failure: vec![RequestOp::Txn(TxnRequest {
                compare: vec![],
                success: vec![],
                failure: vec![RequestOp::DeleteRange(DeleteRangeRequest {
                    range: KeyRange::single("k"),
                    prev_kv: true,
                })],
            })],
        })
    }

    /// Fingerprints are compared across replicas and kept in snapshots: these values must
    /// never change (a change means old saved fingerprints no longer match their requests).
    #[test]
    fn fingerprints_are_pinned() {
        let cases = [
            (Op::put("k", "v"), 0x1f42_ab16_a9aa_a7a9_u64),
            (Op::put("", ""), 0xd4c1_2cbd_9f9e_01d2),
            (Op::LeaseGrant { id: 7, ttl: 60 }, 0x62b7_5b4d_9abc_a448),
            (Op::LeaseRevoke { id: 7 }, 0x89fe_be57_52f6_75b8),
            (Op::LeaseKeepAlive { id: 7 }, 0xbd91_7981_4cc1_d6d3),
            (txn(), 0x2b85_be2d_35d1_786c),
        ];
        for (op, want) in cases {
            assert_eq!(op.fingerprint(), want, "{op:?}: {:#x}", op.fingerprint());
        }
    }

    /// Any difference in any field is a different request, so it must give a different
    /// fingerprint (else a reused seq would get another request's saved reply).
    #[test]
    fn every_field_changes_the_fingerprint() {
        let flags = |f: fn(&mut PutRequest)| {
            let mut p = put("k", "v");
            f(&mut p);
            Op::Put(p)
        };
        let delete = |prev_kv| {
            Op::DeleteRange(DeleteRangeRequest {
                range: KeyRange::single("k"),
                prev_kv,
            })
        };
        let read = |f: fn(&mut RangeRequest)| {
            let mut r = RangeRequest {
                range: KeyRange::single("k"),
                ..RangeRequest::default()
            };
            f(&mut r);
            Op::Txn(TxnRequest {
                compare: vec![],
                success: vec![RequestOp::Range(r)],
                failure: vec![],
            })
        };
        let cmp = |target| {
            Op::Txn(TxnRequest {
                compare: vec![Compare {
                    result: CompareResult::Equal,
                    target,
                    range: KeyRange::single("k"),
                }],
                success: vec![],
                failure: vec![],
            })
        };
        let ops = [
            Op::put("k", "v"),
            Op::put("k", "w"),
            Op::put("j", "v"),
            Op::put("kv", ""),
            Op::put("", "kv"),
            Op::put("k\0", "v"),
            Op::put("k", "v\0"),
            flags(|p| p.lease = 1),
            flags(|p| p.prev_kv = true),
            flags(|p| p.ignore_value = true),
            flags(|p| p.ignore_lease = true),
            delete(false),
            delete(true),
            Op::DeleteRange(DeleteRangeRequest {
                range: KeyRange::prefix("k"),
                prev_kv: false,
            }),
            Op::LeaseGrant { id: 7, ttl: 60 },
            Op::LeaseGrant { id: 60, ttl: 7 },
            Op::LeaseGrant { id: 7, ttl: 61 },
            Op::LeaseRevoke { id: 7 },
            Op::LeaseKeepAlive { id: 7 },
            Op::LeaseRevoke { id: 8 },
            txn(),
            read(|_| {}),
            read(|r| r.limit = 1),
            read(|r| r.revision = 1),
            read(|r| r.sort_order = SortOrder::Descend),
            read(|r| r.sort_target = SortTarget::Mod),
            read(|r| r.keys_only = true),
            read(|r| r.count_only = true),
            read(|r| r.min_mod_revision = 1),
            read(|r| r.max_mod_revision = 1),
            read(|r| r.min_create_revision = 1),
            read(|r| r.max_create_revision = 1),
            cmp(CompareTarget::Version(1)),
            cmp(CompareTarget::CreateRevision(1)),
            cmp(CompareTarget::ModRevision(1)),
            cmp(CompareTarget::Lease(1)),
            cmp(CompareTarget::Value(Bytes::from_static(b"1"))),
            Op::Txn(TxnRequest::default()),
        ];
        let mut seen = std::collections::BTreeMap::new();
        for op in &ops {
            if let Some(other) = seen.insert(op.fingerprint(), op) {
                panic!("{op:?} and {other:?} share a fingerprint");
            }
        }
    }

    /// A put's key and value are encoded word by word: every length around a word
    /// boundary, and every byte in it, must count.
    #[test]
    fn every_byte_and_length_counts() {
        let mut seen = std::collections::BTreeSet::new();
        for len in 0..=17 {
            let base = vec![b'a'; len];
            assert!(
                seen.insert(Op::put(base.clone(), "").fingerprint()),
                "{len}"
            );
            for i in 0..len {
                let mut changed = base.clone();
                changed[i] = b'b';
                assert!(seen.insert(Op::put(changed, "").fingerprint()), "{len} {i}");
            }
        }
    }
}
