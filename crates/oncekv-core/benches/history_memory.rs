//! Memory per retained revision of MVCC history, and what compaction frees (issue 14).
//!
//! For each value size, a fresh `StateMachine` applies `PUTS` untracked puts, one entry
//! each, spread round-robin over `KEYS` keys, so every put after the first `KEYS` makes a
//! revision that overwrites an older one: the history then retains `PUTS` changes while the
//! head holds only `KEYS` values. Each put's key and value are buffers of their own, as the
//! server's decoded log entries are (sharing one buffer would hide the value bytes).
//!
//! Live heap bytes are read from a counting global allocator (the `cap` crate's wrapper
//! around mimalloc, the server's allocator): bytes the program asked for and has not freed,
//! without the allocator's own overhead or the pages it keeps, so the figure does not
//! depend on when the allocator returns memory to the OS. (A counting allocator written
//! here would need `unsafe`, which the workspace forbids.)
//!
//! Printed per value size:
//! - live bytes per retained revision: (bytes with full history - bytes after compacting at
//!   the current revision) / (changes dropped), and its overhead beyond the value bytes;
//! - what `Op::Compact` at the current revision freed, and the live bytes left, next to a
//!   store that only ever held those `KEYS` keys' last values (the no-history figure).
//!
//! Run: `cargo bench -p oncekv-core --bench history_memory` (a few seconds; no timing).

use std::hint::black_box;
use std::mem::size_of;

use bytes::Bytes;
use cap::Cap;
use oncekv_core::history::Change;
use oncekv_core::kv::Value;
use oncekv_core::{Command, LogPayload, Op, OpResponse, Response, Settings, StateMachine};

/// Counts live heap bytes (see the module docs).
#[global_allocator]
static ALLOCATOR: Cap<mimalloc::MiMalloc> = Cap::new(mimalloc::MiMalloc, usize::MAX);

const PUTS: u64 = 100_000;
const KEYS: u64 = 1_000;
const VALUE_SIZES: [usize; 3] = [0, 100, 1_000];

fn live() -> usize {
    ALLOCATOR.allocated()
}

/// A 35-byte etcd-style key (`/registry/pods/default/pod-NNNNNNNN`), in a buffer of its own.
fn key(i: u64) -> Bytes {
    Bytes::from(format!("/registry/pods/default/pod-{:08}", i % KEYS))
}

/// Applies one untracked op as an entry of its own at `index`; returns what it answered.
fn apply(sm: &mut StateMachine, index: u64, op: Op) -> Response {
    let entry = LogPayload {
        cluster_time: 1_000,
        commands: vec![Command::Untracked(op)],
    };
    sm.apply(index, &entry).swap_remove(0)
}

/// `puts` puts of `value_size`-byte values (each in a buffer of its own) over the keys.
fn load(puts: u64, value_size: usize) -> StateMachine {
    let mut sm = StateMachine::new(Settings::default());
    for i in 0..puts {
        let value = Bytes::from(vec![(i % 251) as u8; value_size]);
        black_box(apply(&mut sm, i + 1, Op::put(key(i), value)));
    }
    sm
}

/// `Op::Compact` at the store's current revision, through the log as the server does it.
fn compact_now(sm: &mut StateMachine) {
    let revision = sm.revision();
    let index = sm.applied_index() + 1;
    match apply(sm, index, Op::Compact { revision }) {
        Response::Op(Ok(reply)) if matches!(reply.result, Ok(OpResponse::Compact)) => {}
        other => panic!("compact at {revision} was refused: {other:?}"),
    }
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn measure(value_size: usize) {
    let base = live();
    let mut sm = load(PUTS, value_size);
    let full = live() - base;
    let retained = sm.kv().history().len();
    assert_eq!(retained as u64, PUTS, "every put is a change in history");

    compact_now(&mut sm);
    let compacted = live() - base;
    let kept = sm.kv().history().len();
    if let Err(e) = sm.validate() {
        panic!("state machine invalid after compaction: {e}");
    }

    // The no-history figure: a store that only ever held each key's last value.
    let base_reference = live();
    let mut reference = load(KEYS, value_size);
    compact_now(&mut reference);
    let no_history = live() - base_reference;
    assert_eq!(reference.kv().len(), sm.kv().len());
    drop(reference);

    let freed = full.saturating_sub(compacted);
    let per_revision = freed as f64 / (retained - kept) as f64;
    println!(
        "value {value_size:>5} B: {PUTS} puts over {KEYS} keys, {retained} changes retained: \
         {:.1} MiB live; per retained revision {per_revision:.1} B ({:+.1} B beyond the value)",
        mib(full),
        per_revision - value_size as f64,
    );
    // std's Vec doubles its capacity, so the record holds the next power of two of slots.
    let spare = (retained.next_power_of_two() - retained) * size_of::<Change>();
    println!(
        "               of which about {:.1} B is the record's spare capacity (if it is the \
         next power of two: {} slots)",
        spare as f64 / (retained - kept) as f64,
        retained.next_power_of_two(),
    );
    println!(
        "               compact at {}: freed {:.1} MiB, {:.2} MiB left ({kept} change kept) \
         against {:.2} MiB for the same {KEYS} keys without history ({:+} B)",
        sm.revision(),
        mib(freed),
        mib(compacted),
        mib(no_history),
        compacted as i64 - no_history as i64,
    );
    drop(sm);
    let leaked = live() as i64 - base as i64;
    assert!(
        leaked.abs() < 64 * 1024,
        "{leaked} B still live after dropping the state machine"
    );
}

fn main() {
    println!(
        "history memory: size_of Change {} B (Value {} B, Bytes {} B); the record is a Vec, \
         so up to half its capacity may be spare before compaction",
        size_of::<Change>(),
        size_of::<Value>(),
        size_of::<Bytes>(),
    );
    for value_size in VALUE_SIZES {
        measure(value_size);
    }
}
