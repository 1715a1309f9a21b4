//! A state restored from its snapshot holds no more memory than the same state built by
//! writes (issue 43: a restarted member needed 1.8 times the memory it had before).
//!
//! Live heap bytes come from a counting global allocator (the `cap` crate around
//! mimalloc, the server's allocator): bytes asked for and not freed, so the figure is
//! exact and does not depend on when pages go back to the OS. This file is its own test
//! binary, so nothing else allocates while it measures (one test only: the harness runs
//! tests of one binary on parallel threads).

use std::hint::black_box;

use bytes::Bytes;
use cap::Cap;
use oncekv_core::{Command, DeleteRangeRequest, KeyRange, LogPayload, Op, Settings, StateMachine};

#[global_allocator]
static ALLOCATOR: Cap<mimalloc::MiMalloc> = Cap::new(mimalloc::MiMalloc, usize::MAX);

fn live() -> usize {
    ALLOCATOR.allocated()
}

/// `puts` puts of 1,000-byte values over `keys` keys, each value and key in a buffer of
/// its own as decoded log entries are, one entry each; every tenth put deletes instead.
fn written(puts: u64, keys: u64) -> StateMachine {
    let mut sm = StateMachine::new(Settings::default());
    for i in 0..puts {
        let key = Bytes::from(format!("/registry/pods/default/pod-{:08}", i % keys));
        let op = if i % 10 == 9 {
            Op::DeleteRange(DeleteRangeRequest {
                range: KeyRange {
                    key,
                    range_end: Bytes::new(),
                },
                ..DeleteRangeRequest::default()
            })
        } else {
            Op::put(key, Bytes::from(vec![(i % 251) as u8; 1_000]))
        };
        let entry = LogPayload {
            cluster_time: 1_000,
            commands: vec![Command::Untracked(op)],
        };
        black_box(sm.apply(i + 1, &entry));
    }
    sm
}

#[test]
fn a_restored_state_holds_no_more_memory_than_the_written_one() {
    let before = live();
    let sm = written(20_000, 2_000);
    let built = live() - before;

    let image = sm.snapshot().expect("the state encodes");
    let before = live();
    let restored = StateMachine::restore(&image).expect("the image decodes");
    let loaded = live() - before;
    assert_eq!(restored.snapshot().expect("encodes"), image);

    // Each value is held once either way (20 MB of them); what may differ is the
    // history's chunking and the maps' node fill, a few percent.
    let ratio = loaded as f64 / built as f64;
    println!("written: {built} B live; restored: {loaded} B live ({ratio:.3}x)");
    assert!(
        ratio < 1.05,
        "restored state holds {loaded} B where the written one held {built} B ({ratio:.2}x)"
    );
    drop(sm);
    drop(restored);
}
