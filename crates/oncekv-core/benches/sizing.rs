//! The README's sizing guide: a member's memory per live key, per retained revision and
//! per byte of value, at 1 M and 5 M keys (issue 43).
//!
//! For each case a fresh `StateMachine` applies, one entry each, a put of every key (the
//! head fills), `Op::Compact` at the current revision (only the head is left: the
//! per-key figure), then one more put of every key (each old value now lives on in
//! history as the change's `prev`: the per-revision figure), then a restore from the
//! snapshot (the restart figure). 35-byte etcd-style keys; each key and value in a buffer
//! of its own, as decoded log entries are.
//!
//! Live heap bytes come from a counting global allocator (the `cap` crate around
//! mimalloc, the server's allocator), so the figures are exact and the same on every
//! run; what the allocator keeps on top (its pages, fragmentation) is not in them, and
//! a member's resident memory is larger by that and by its log cache.
//!
//! Run: `cargo bench -p oncekv-core --bench sizing` (about a minute and 3 GB of memory;
//! `SIZING_KEYS=100000` for a quick look).

use std::hint::black_box;

use bytes::Bytes;
use cap::Cap;
use oncekv_core::{Command, LogPayload, Op, OpResponse, Response, Settings, StateMachine};

#[global_allocator]
static ALLOCATOR: Cap<mimalloc::MiMalloc> = Cap::new(mimalloc::MiMalloc, usize::MAX);

fn live() -> usize {
    ALLOCATOR.allocated()
}

const KEY_BYTES: usize = 35;

fn key(i: u64) -> Bytes {
    Bytes::from(format!("/registry/pods/default/pod-{i:08}"))
}

fn apply(sm: &mut StateMachine, op: Op) -> Response {
    let index = sm.applied_index() + 1;
    let entry = LogPayload {
        cluster_time: 1_000,
        commands: vec![Command::Untracked(op)],
    };
    sm.apply(index, &entry).swap_remove(0)
}

fn put_every_key(sm: &mut StateMachine, keys: u64, value_size: usize, fill: u8) {
    for i in 0..keys {
        let value = Bytes::from(vec![fill; value_size]);
        black_box(apply(sm, Op::put(key(i), value)));
    }
}

fn compact_now(sm: &mut StateMachine) {
    let revision = sm.revision();
    match apply(sm, Op::Compact { revision }) {
        Response::Op(Ok(reply)) if matches!(reply.result, Ok(OpResponse::Compact)) => {}
        other => panic!("compact at {revision} was refused: {other:?}"),
    }
}

/// Per live key, per retained revision (both beyond the value bytes), and the restored
/// state's live bytes against the written one's.
fn measure(keys: u64, value_size: usize) -> (f64, f64, f64) {
    let base = live();
    let mut sm = StateMachine::new(Settings::default());
    put_every_key(&mut sm, keys, value_size, 1);
    compact_now(&mut sm);
    let head = live() - base;
    put_every_key(&mut sm, keys, value_size, 2);
    let with_history = live() - base;
    assert_eq!(sm.kv().history().len() as u64, keys + 1);

    let image = sm.snapshot().expect("the state encodes");
    let before_restore = live();
    let restored = StateMachine::restore(&image).expect("the image decodes");
    let restored_bytes = live() - before_restore;
    drop(restored);
    drop(image);
    drop(sm);

    let per_key = head as f64 / keys as f64 - value_size as f64;
    let per_revision = (with_history - head) as f64 / keys as f64 - value_size as f64;
    (
        per_key,
        per_revision,
        restored_bytes as f64 / with_history as f64,
    )
}

fn main() {
    let scales: Vec<u64> = match std::env::var("SIZING_KEYS") {
        Ok(v) => v
            .split(',')
            .map(|s| {
                s.trim()
                    .parse()
                    .expect("SIZING_KEYS: comma-separated key counts")
            })
            .collect(),
        Err(_) => vec![1_000_000, 5_000_000],
    };
    println!(
        "sizing: {KEY_BYTES}-byte keys; bytes beyond the value, per live key and per retained \
         revision; restored/written live bytes"
    );
    println!("| keys | value | per live key | per retained revision | restored / written |");
    println!("| ---: | ---: | ---: | ---: | ---: |");
    for &keys in &scales {
        for value_size in [100, 1_000] {
            // 5 M keys of 1,000 bytes, twice over, would need 10 GB: the per-byte slope
            // is read at the smaller scales.
            if keys > 1_000_000 && value_size > 100 {
                continue;
            }
            let (per_key, per_revision, restored) = measure(keys, value_size);
            println!(
                "| {keys} | {value_size} B | {per_key:.0} B | {per_revision:.0} B | {restored:.3}x |"
            );
        }
    }
}
