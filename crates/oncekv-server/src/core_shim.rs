//! TEMPORARY: the core's history API as the lead announced it, so the watch service
//! compiles before the core lands. Deleted when main is merged; never handed back.
#![allow(dead_code)]

use oncekv_core::{KeyRange, KeyValue, OpError, StateMachine};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    pub kv: KeyValue,
    pub prev_kv: Option<KeyValue>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventBatch {
    pub events: Vec<Event>,
    pub next: i64,
    pub revision: i64,
}

pub trait HistoryShim {
    fn compacted_revision(&self) -> i64;
    fn events(
        &self,
        range: &KeyRange,
        from: i64,
        prev_kv: bool,
        limit: usize,
    ) -> Result<EventBatch, OpError>;
}

impl HistoryShim for StateMachine {
    fn compacted_revision(&self) -> i64 {
        0
    }

    fn events(
        &self,
        _range: &KeyRange,
        from: i64,
        _prev_kv: bool,
        _limit: usize,
    ) -> Result<EventBatch, OpError> {
        let revision = self.revision();
        Ok(EventBatch {
            events: Vec::new(),
            next: from.max(revision + 1),
            revision,
        })
    }
}
