//! Txn compares and the checks etcd makes on a txn before running it.

use std::collections::BTreeSet;
use std::ops::Bound;

use bytes::Bytes;

use crate::command::{
    Compare, CompareResult, CompareTarget, KeyRange, OpError, RequestOp, TxnRequest,
};
use crate::kv::{KvStore, Value, in_range};

/// etcd's compare: every key in the range must satisfy it; a missing key compares as a
/// zero key-value, except that a value compare against a missing key is false.
pub fn compare_holds(kv: &KvStore, cmp: &Compare) -> bool {
    let mut any = false;
    for (_, v) in kv.scan(&cmp.range) {
        any = true;
        if !compare_one(Some(v), cmp) {
            return false;
        }
    }
    any || compare_one(None, cmp)
}

fn compare_one(v: Option<&Value>, cmp: &Compare) -> bool {
    use std::cmp::Ordering;
    let ordering: Ordering = match (&cmp.target, v) {
        (CompareTarget::Value(_), None) => return false,
        (CompareTarget::Value(want), Some(v)) => v.value.as_ref().cmp(want.as_ref()),
        (CompareTarget::Version(want), v) => v.map_or(0, |v| v.version).cmp(want),
        (CompareTarget::CreateRevision(want), v) => v.map_or(0, |v| v.create_revision).cmp(want),
        (CompareTarget::ModRevision(want), v) => v.map_or(0, |v| v.mod_revision).cmp(want),
        (CompareTarget::Lease(want), v) => v.map_or(0, |v| v.lease).cmp(want),
    };
    match cmp.result {
        CompareResult::Equal => ordering == Ordering::Equal,
        CompareResult::NotEqual => ordering != Ordering::Equal,
        CompareResult::Greater => ordering == Ordering::Greater,
        CompareResult::Less => ordering == Ordering::Less,
    }
}

/// Whether all of a txn's compares hold (its success branch runs).
pub fn compares_hold(kv: &KvStore, txn: &TxnRequest) -> bool {
    txn.compare.iter().all(|c| compare_holds(kv, c))
}

/// The request-shape checks etcd makes before proposing a txn: at most `max_ops` compares
/// and ops per branch, no op without a key, and no key written twice in one branch (a put
/// twice, or a put inside a deleted range), nested txns included. The server calls this
/// before proposing; the state machine calls it again so a txn from the log can never
/// half-apply.
pub fn validate_txn(txn: &TxnRequest, max_ops: usize) -> Result<(), OpError> {
    check_op_count(txn, max_ops)?;
    for branch in [&txn.success, &txn.failure] {
        let mut puts = BTreeSet::new();
        let mut deletes = Vec::new();
        collect_writes(branch, max_ops, &mut puts, &mut deletes)?;
        for range in &deletes {
            // Puts are sorted: only the first at or after the range start can be inside it.
            let first = puts
                .range::<[u8], _>((Bound::Included(&range.key[..]), Bound::Unbounded))
                .next();
            if first.is_some_and(|k| in_range(range, k)) {
                return Err(OpError::DuplicateKey);
            }
        }
    }
    Ok(())
}

fn check_op_count(txn: &TxnRequest, max_ops: usize) -> Result<(), OpError> {
    if txn.compare.len() > max_ops || txn.success.len() > max_ops || txn.failure.len() > max_ops {
        return Err(OpError::TooManyOps);
    }
    Ok(())
}

/// Adds the branch's put keys to `puts` (failing on a repeat) and its delete ranges to
/// `deletes`.
fn collect_writes(
    ops: &[RequestOp],
    max_ops: usize,
    puts: &mut BTreeSet<Bytes>,
    deletes: &mut Vec<KeyRange>,
) -> Result<(), OpError> {
    for op in ops {
        match op {
            RequestOp::Range(r) => {
                if r.range.key.is_empty() {
                    return Err(OpError::EmptyKey);
                }
            }
            RequestOp::Put(p) => {
                if p.key.is_empty() {
                    return Err(OpError::EmptyKey);
                }
                if !puts.insert(p.key.clone()) {
                    return Err(OpError::DuplicateKey);
                }
            }
            RequestOp::DeleteRange(d) => {
                if d.range.key.is_empty() {
                    return Err(OpError::EmptyKey);
                }
                deletes.push(d.range.clone());
            }
            RequestOp::Txn(inner) => {
                check_op_count(inner, max_ops)?;
                // Only one inner branch runs, so the two may share keys, but either may
                // clash with this branch.
                let before = puts.clone();
                for branch in [&inner.success, &inner.failure] {
                    let mut branch_puts = before.clone();
                    collect_writes(branch, max_ops, &mut branch_puts, deletes)?;
                    puts.extend(branch_puts);
                }
            }
        }
    }
    Ok(())
}
