//! Decoding an image's key space and history so that each value is held once.
//!
//! In a running member one value's bytes are shared: the head holds a key's current
//! value, the change that wrote it holds the same bytes, and the next change to that key
//! holds them again as its `prev` (all three are clones of one [`Bytes`]). An image
//! encodes each of those places in full, so a plain decode allocates a value up to three
//! times, and a member restarted from a snapshot held up to three times the memory the
//! same state had before the restart.
//!
//! Here the history is decoded one change at a time against what came before it: a
//! change's key, and a value equal to the head's or to the key's previous change's, is
//! replaced by a clone of the copy already held, as the write path would have shared it.
//! The duplicate is freed at once, before the next change is decoded, so its memory is
//! reused rather than left as holes between live values (which an allocator cannot give
//! back). The encoding is unchanged: this is only how it is read.

use std::collections::HashMap;

use bytes::Bytes;

use crate::history::Change;
use crate::value::Value;

/// What the changes decoded so far hold, per key.
pub(super) struct Linker<'a> {
    head: &'a [(Bytes, Value)],
    /// Per key changed so far: the key's bytes, and its value after its latest change
    /// (`None`: deleted), which is what the key's next change holds as its `prev`.
    latest: HashMap<Bytes, Option<Bytes>>,
}

impl<'a> Linker<'a> {
    pub(super) fn new(head: &'a [(Bytes, Value)]) -> Linker<'a> {
        Linker {
            head,
            latest: HashMap::new(),
        }
    }

    fn head_of(&self, key: &[u8]) -> Option<&'a (Bytes, Value)> {
        let head = self.head;
        head.binary_search_by(|(k, _)| k.as_ref().cmp(key))
            .ok()
            .map(|i| &head[i])
    }

    /// `change` with its key and values replaced by equal bytes already held.
    pub(super) fn link(&mut self, mut change: Change) -> Change {
        let head = self.head_of(&change.key);
        let (key, latest) = match (self.latest.get_key_value(&change.key), head) {
            (Some((key, latest)), _) => (key.clone(), latest.clone()),
            (None, Some((key, _))) => (key.clone(), None),
            (None, None) => (change.key.clone(), None),
        };
        change.key = key.clone();
        if let (Some(prev), Some(latest)) = (change.prev.as_mut(), latest) {
            share(&mut prev.value, &latest);
        }
        // The head's value is its last change's: the same revision.
        if let (Some(value), Some((_, now))) = (change.value.as_mut(), head)
            && value.mod_revision == now.mod_revision
        {
            share(&mut value.value, &now.value);
        }
        let after = change.value.as_ref().map(|v| v.value.clone());
        self.latest.insert(key, after);
        change
    }
}

/// Makes `bytes` a clone of `held` when the two are equal; `bytes`' own copy is freed.
fn share(bytes: &mut Bytes, held: &Bytes) {
    if bytes.as_ptr() != held.as_ptr() && bytes == held {
        *bytes = held.clone();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::command::Settings;
    use crate::command::{Command, DeleteRangeRequest, KeyRange, LogPayload, Op, PutRequest};
    use crate::state_machine::StateMachine;

    fn apply(sm: &mut StateMachine, index: u64, op: Op) {
        sm.apply(
            index,
            &LogPayload {
                cluster_time: 1_000 + index,
                commands: vec![Command::Untracked(op)],
            },
        );
    }

    fn put(key: &str, value: &str) -> Op {
        Op::Put(PutRequest {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: Bytes::copy_from_slice(value.as_bytes()),
            ..PutRequest::default()
        })
    }

    /// The state the tests restore: keys written several times, one deleted and one
    /// written again after its delete.
    fn written() -> StateMachine {
        let mut sm = StateMachine::new(Settings::default());
        let ops = [
            put("a", "a1"),
            put("b", "b1"),
            put("a", "a2"),
            put("c", "c1"),
            Op::DeleteRange(DeleteRangeRequest {
                range: KeyRange {
                    key: Bytes::from_static(b"c"),
                    range_end: Bytes::new(),
                },
                ..DeleteRangeRequest::default()
            }),
            put("a", "a3"),
            put("c", "c2"),
        ];
        for (i, op) in ops.into_iter().enumerate() {
            apply(&mut sm, i as u64 + 1, op);
        }
        sm
    }

    #[test]
    fn a_restored_state_holds_each_value_once() {
        let before = written();
        let restored = StateMachine::restore(&before.snapshot().unwrap()).unwrap();
        assert_eq!(restored.snapshot().unwrap(), before.snapshot().unwrap());
        let changes: Vec<&Change> = restored.kv.history().changes().iter().collect();
        assert_eq!(changes.len(), 7);
        let mut shared = 0;
        for (i, change) in changes.iter().enumerate() {
            // The change's prev is the bytes of the key's previous change's value.
            if let Some(prev) = &change.prev {
                let earlier = changes[..i]
                    .iter()
                    .rev()
                    .find(|c| c.key == change.key)
                    .and_then(|c| c.value.as_ref())
                    .unwrap();
                assert_eq!(prev.value.as_ptr(), earlier.value.as_ptr(), "{change:?}");
                shared += 1;
            }
        }
        // a2's and a3's prevs, c1's (in the delete).
        assert_eq!(shared, 3);
        for (key, now) in restored.kv.iter() {
            let last = changes.iter().rev().find(|c| c.key == *key).unwrap();
            assert_eq!(last.key.as_ptr(), key.as_ptr());
            assert_eq!(
                last.value.as_ref().unwrap().value.as_ptr(),
                now.value.as_ptr()
            );
        }
    }
}
