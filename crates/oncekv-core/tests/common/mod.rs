//! Helpers shared by the integration tests: a replica that numbers its own log entries.
//!
//! Each test file uses a different subset, so unused helpers are expected here.
#![allow(dead_code)]

use bytes::Bytes;
use oncekv_core::{
    Command, KeyRange, LogPayload, Op, OpReply, OpResponse, PutRequest, RangeRequest, Response,
    Secret, Settings, StateMachine, Tracked,
};

/// A state machine plus the log position and cluster time of the next entry, so a test reads
/// as "at time t, apply these commands".
#[derive(Debug, Clone)]
pub struct Replica {
    pub sm: StateMachine,
    /// Index of the last entry applied.
    pub index: u64,
    /// Cluster time stamped on the next entry unless a test says otherwise.
    pub time: u64,
}

impl Replica {
    pub fn new(settings: Settings) -> Replica {
        Replica {
            sm: StateMachine::new(settings),
            index: 0,
            time: 1_000,
        }
    }

    /// Applies one entry at cluster time `time`.
    pub fn entry_at(&mut self, time: u64, commands: Vec<Command>) -> Vec<Response> {
        self.index += 1;
        self.time = time;
        let responses = self.sm.apply(
            self.index,
            &LogPayload {
                cluster_time: time,
                commands,
            },
        );
        if let Err(e) = self.sm.validate() {
            panic!("invariant broken after entry {}: {e}", self.index);
        }
        responses
    }

    /// Applies one entry holding `command` at the current time.
    pub fn one(&mut self, command: Command) -> Response {
        let time = self.time;
        self.one_at(time, command)
    }

    pub fn one_at(&mut self, time: u64, command: Command) -> Response {
        let mut responses = self.entry_at(time, vec![command]);
        assert_eq!(responses.len(), 1);
        responses.remove(0)
    }

    /// An entry with a `Tick` only, at `time`.
    pub fn tick_at(&mut self, time: u64) {
        assert_eq!(self.one_at(time, Command::Tick), Response::Done);
    }

    /// Registers a session; returns its client id.
    pub fn register(&mut self, secret: Secret) -> u64 {
        match self.one(Command::RegisterClient { secret, nonce: 0 }) {
            Response::Registered { client_id, .. } => client_id,
            other => panic!("registration refused: {other:?}"),
        }
    }

    /// Runs an untracked op; the reply (the session rules cannot refuse it).
    pub fn untracked(&mut self, op: Op) -> OpReply {
        match self.one(Command::Untracked(op)) {
            Response::Op(Ok(reply)) => reply,
            other => panic!("untracked op answered {other:?}"),
        }
    }

    /// Runs an untracked op that must succeed; its response.
    pub fn ok(&mut self, op: Op) -> OpResponse {
        let reply = self.untracked(op);
        match reply.result {
            Ok(resp) => resp,
            Err(e) => panic!("op failed: {e}"),
        }
    }

    pub fn snapshot(&self) -> Vec<u8> {
        self.sm.snapshot().expect("snapshot encodes")
    }

    pub fn version(&self, key: &str) -> Option<i64> {
        self.sm.kv().get(key.as_bytes()).map(|v| v.version)
    }

    pub fn value(&self, key: &str) -> Option<Bytes> {
        self.sm.kv().get(key.as_bytes()).map(|v| v.value.clone())
    }
}

pub fn tracked(client_id: u64, secret: Secret, seq: u64, first_incomplete: u64, op: Op) -> Command {
    Command::Tracked(Tracked::new(client_id, secret, seq, first_incomplete, op))
}

/// A put with options filled in by `f`.
pub fn put_with(key: &str, value: &str, f: impl FnOnce(&mut PutRequest)) -> Op {
    let mut p = PutRequest {
        key: Bytes::copy_from_slice(key.as_bytes()),
        value: Bytes::copy_from_slice(value.as_bytes()),
        ..PutRequest::default()
    };
    f(&mut p);
    Op::Put(p)
}

pub fn range(key: &str, range_end: &str) -> KeyRange {
    KeyRange {
        key: Bytes::copy_from_slice(key.as_bytes()),
        range_end: Bytes::copy_from_slice(range_end.as_bytes()),
    }
}

pub fn get_req(range: KeyRange) -> RangeRequest {
    RangeRequest {
        range,
        ..RangeRequest::default()
    }
}

/// postcard bytes of a response: "byte-identical" means these are equal.
pub fn bytes_of(response: &Response) -> Vec<u8> {
    postcard::to_allocvec(response).expect("response encodes")
}
