//! The in-memory side of the log: the index of present entries (log index → segment,
//! offset, length, checksum, and the payload itself while it is recent), the small
//! durable state, and the layout of the segment files.
//!
//! Every mutation that must reach disk is queued to the writer thread from inside the
//! same critical section that changes this state, so the file order is the state order.
//! Recovery replays records through the same methods, so an append and its replay obey
//! one set of rules.

use std::collections::{BTreeSet, VecDeque};

use bytes::Bytes;
use openraft::{LogId, NodeId, Vote};

use super::LogError;
use super::format::{FILE_HEADER_LEN, Kind, MetaRecord, RECORD_HEADER_LEN, payload_crc};
use super::writer::{Op, Staged};

/// Where one present entry lives.
#[derive(Debug, Clone)]
pub(super) struct Slot<NID: NodeId> {
    pub(super) log_id: LogId<NID>,
    pub(super) segment: u64,
    /// Offset of the payload (not the header) in the segment file.
    pub(super) offset: u64,
    pub(super) len: u32,
    pub(super) crc: u32,
    /// The store's record sequence number (0 for entries found by recovery).
    pub(super) seq: u64,
    /// The encoded entry, kept for recent entries so replication reads need no I/O.
    pub(super) cached: Option<Bytes>,
}

/// What `slot`'s record takes in its segment file, header included.
fn record_bytes<NID: NodeId>(slot: &Slot<NID>) -> u64 {
    u64::from(slot.len) + super::format::RECORD_HEADER_LEN as u64
}

/// The log's in-memory state. Invariant: `slots` hold consecutive indexes, all above
/// `purged`; slots with index `>= cache_from` have `cached` set, the others do not.
#[derive(Debug)]
pub(super) struct State<NID: NodeId> {
    pub(super) slots: VecDeque<Slot<NID>>,
    /// What the records of `slots` take in the segment files, headers included (kept as
    /// slots come and go: the ticker reads it every heartbeat, and a long log holds
    /// millions of slots).
    pub(super) slot_bytes: u64,
    pub(super) vote: Option<Vote<NID>>,
    pub(super) committed: Option<LogId<NID>>,
    /// `committed` changed since it was last queued for the writer: the next record
    /// queued (or a flush) carries it to disk first. See [`State::set_committed`].
    pub(super) committed_dirty: bool,
    pub(super) purged: Option<LogId<NID>>,
    /// Segment ids present on disk (or queued for creation); the last one is active.
    pub(super) segments: BTreeSet<u64>,
    /// Length the active segment will have once everything queued is written.
    pub(super) active_len: u64,
    pub(super) next_seq: u64,
    /// This node's id once [`LogStore::ack_own_appends_early`](super::LogStore::ack_own_appends_early)
    /// was called: appends made under its own leadership are acknowledged when queued.
    pub(super) acks_early_for: Option<NID>,
    pub(super) cache_from: u64,
    pub(super) cache_bytes: usize,
    pub(super) segment_limit: u64,
    pub(super) cache_limit: usize,
    /// Operations of the current critical section, sent as one message by
    /// [`State::dispatch`] so the writer never cuts a batch in the middle of one call.
    outbox: Vec<Op>,
    /// The queue to the writer; `None` during recovery and after shutdown.
    pub(super) tx: Option<Sink>,
}

/// The queue to the writer: a thread in production, a task on the async runtime in a
/// deterministic simulation.
#[derive(Debug)]
pub(super) enum Sink {
    Thread(std::sync::mpsc::Sender<Vec<Op>>),
    Task(tokio::sync::mpsc::UnboundedSender<Vec<Op>>),
}

impl Sink {
    fn send(&self, ops: Vec<Op>) -> Result<(), LogError> {
        let sent = match self {
            Sink::Thread(tx) => tx.send(ops).is_ok(),
            Sink::Task(tx) => tx.send(ops).is_ok(),
        };
        if sent {
            Ok(())
        } else {
            Err(LogError::WriterGone)
        }
    }
}

impl<NID: NodeId> State<NID> {
    pub(super) fn new(segment_limit: u64, cache_limit: usize) -> State<NID> {
        State {
            slots: VecDeque::new(),
            slot_bytes: 0,
            vote: None,
            committed: None,
            committed_dirty: false,
            purged: None,
            segments: BTreeSet::new(),
            active_len: 0,
            next_seq: 1,
            acks_early_for: None,
            cache_from: 0,
            cache_bytes: 0,
            segment_limit,
            cache_limit,
            outbox: Vec::new(),
            tx: None,
        }
    }

    /// Whether an append now is this node's own, made as the leader of the vote it holds:
    /// the vote is committed (a quorum granted it) and names this node.
    pub(super) fn appends_as_leader(&self) -> bool {
        let (Some(me), Some(vote)) = (&self.acks_early_for, &self.vote) else {
            return false;
        };
        vote.is_committed() && vote.leader_id().voted_for().as_ref() == Some(me)
    }

    /// The id of the last present entry, or the purge point when none is present.
    pub(super) fn last_log_id(&self) -> Option<LogId<NID>> {
        match self.slots.back() {
            Some(s) => Some(s.log_id.clone()),
            None => self.purged.clone(),
        }
    }

    /// Position in `slots` of log index `index`, if present.
    pub(super) fn position(&self, index: u64) -> Option<usize> {
        let first = self.slots.front()?.log_id.index;
        let pos = usize::try_from(index.checked_sub(first)?).ok()?;
        (pos < self.slots.len()).then_some(pos)
    }

    /// Checks that entries with these indexes, appended in order, leave no hole and do
    /// not rewrite purged entries. An index at or below the last one replaces it and
    /// everything after it (Raft's overwrite rule).
    ///
    /// With `follow_purge`, the first entry of an empty log must directly follow the purge
    /// point. Recovery passes `false`: when whole segments were deleted after a purge, the
    /// oldest kept segment may start past its own recorded purge point; the later purge
    /// record closes that gap, and recovery checks the end result.
    pub(super) fn check_append(
        &self,
        indexes: impl IntoIterator<Item = u64>,
        follow_purge: bool,
    ) -> Result<(), String> {
        let mut last = self.slots.back().map(|s| s.log_id.index);
        let purged = self.purged.as_ref().map(|p| p.index);
        for index in indexes {
            if let Some(p) = purged
                && index <= p
            {
                return Err(format!(
                    "entry {index} is at or below the purge point {p} and cannot be written"
                ));
            }
            if let Some(l) = last
                && index > l + 1
            {
                return Err(format!("entry {index} would leave a hole after entry {l}"));
            }
            if last.is_none()
                && follow_purge
                && let Some(p) = purged
                && index != p + 1
            {
                return Err(format!(
                    "entry {index} would leave a hole after the purge point {p}"
                ));
            }
            last = Some(index);
        }
        Ok(())
    }

    /// Inserts an entry slot that `check_append` accepted.
    pub(super) fn insert_slot(&mut self, slot: Slot<NID>) {
        self.truncate_from(slot.log_id.index);
        if let Some(b) = &slot.cached {
            self.cache_bytes += b.len();
        } else {
            self.cache_from = slot.log_id.index + 1;
        }
        self.slot_bytes += record_bytes(&slot);
        self.slots.push_back(slot);
    }

    /// Removes every entry with index `>= index`.
    pub(super) fn truncate_from(&mut self, index: u64) {
        while self.slots.back().is_some_and(|s| s.log_id.index >= index) {
            if let Some(s) = self.slots.pop_back() {
                self.slot_bytes -= record_bytes(&s);
                if let Some(b) = s.cached {
                    self.cache_bytes -= b.len();
                }
            }
        }
        self.cache_from = self.cache_from.min(index);
    }

    /// Removes every entry up to and including `log_id.index` and records the purge
    /// point. Returns false (and changes nothing) if the log is already purged that far.
    pub(super) fn purge_upto(&mut self, log_id: LogId<NID>) -> bool {
        if self
            .purged
            .as_ref()
            .is_some_and(|p| p.index >= log_id.index)
        {
            return false;
        }
        while self
            .slots
            .front()
            .is_some_and(|s| s.log_id.index <= log_id.index)
        {
            if let Some(s) = self.slots.pop_front() {
                self.slot_bytes -= record_bytes(&s);
                if let Some(b) = s.cached {
                    self.cache_bytes -= b.len();
                }
            }
        }
        self.cache_from = self.cache_from.max(log_id.index + 1);
        self.purged = Some(log_id);
        true
    }

    /// Drops cached payloads, oldest first, while over budget. Only payloads the writer
    /// has already written (`seq <= written_seq`) are dropped: the rest are not yet
    /// readable from the file.
    pub(super) fn evict(&mut self, written_seq: u64) {
        if let Some(first) = self.slots.front().map(|s| s.log_id.index) {
            // A truncation below the first present entry can leave `cache_from` there.
            self.cache_from = self.cache_from.max(first);
        }
        while self.cache_bytes > self.cache_limit {
            let Some(pos) = self.position(self.cache_from) else {
                return;
            };
            let slot = &mut self.slots[pos];
            if slot.seq > written_seq {
                return;
            }
            if let Some(b) = slot.cached.take() {
                self.cache_bytes -= b.len();
            }
            self.cache_from += 1;
        }
    }

    /// Segments holding nothing still needed: all before the one holding the first
    /// present entry (or before the active one when no entry is present).
    pub(super) fn deletable_segments(&self) -> Vec<u64> {
        let active = self.segments.last().copied().unwrap_or(0);
        let keep_from = self.slots.front().map_or(active, |s| s.segment);
        self.segments.range(..keep_from).copied().collect()
    }

    /// Adds `op` to the outbox; [`State::dispatch`] MUST follow before the lock is released.
    pub(super) fn send(&mut self, op: Op) {
        self.outbox.push(op);
    }

    /// Sends the outbox to the writer as one message. Called under the state lock, so
    /// the writer sees operations in state order.
    pub(super) fn dispatch(&mut self) -> Result<(), LogError> {
        if self.outbox.is_empty() {
            return Ok(());
        }
        let ops = std::mem::take(&mut self.outbox);
        self.tx.as_ref().ok_or(LogError::WriterGone)?.send(ops)
    }

    /// Records the committed id in memory only. It reaches disk in front of the next record
    /// queued for any other reason (an append, a vote, a truncation, a purge, a new
    /// segment's meta record) or at the next [`flush`](super::LogStore::flush), so it never
    /// costs an fdatasync of its own.
    ///
    /// Why this is safe: persisting `committed` is optional in Raft (a restarted node
    /// relearns it from the leader; openraft only uses it to re-apply at startup). And the
    /// recovered value never exceeds the recovered log: the entries up to `committed` were
    /// queued before this call (openraft commits only entries it has appended), the record
    /// is queued later still, and a torn tail only ever cuts a suffix of the file, so if
    /// the committed record survives, every entry it covers survives too.
    pub(super) fn set_committed(&mut self, committed: Option<LogId<NID>>) {
        self.committed = committed;
        self.committed_dirty = true;
    }

    /// Queues the committed id if [`set_committed`](Self::set_committed) left it unwritten.
    pub(super) fn queue_committed(&mut self) -> Result<(), LogError> {
        if !self.committed_dirty {
            return Ok(());
        }
        let payload = Bytes::from(postcard::to_stdvec(&self.committed)?);
        self.queue_record(Kind::Committed, payload)?;
        self.committed_dirty = false;
        Ok(())
    }

    /// Starts a new segment whose first record is the current [`MetaRecord`], so that
    /// older segments can later be deleted without losing vote, committed or purged.
    pub(super) fn start_segment(&mut self) -> Result<(), LogError> {
        let id = self.segments.last().map_or(1, |l| l + 1);
        self.send(Op::Rotate { id });
        self.segments.insert(id);
        self.active_len = FILE_HEADER_LEN as u64;
        let meta = MetaRecord {
            vote: self.vote.clone(),
            committed: self.committed.clone(),
            purged: self.purged.clone(),
        };
        let payload = Bytes::from(postcard::to_stdvec(&meta)?);
        self.queue_record(Kind::Meta, payload)?;
        // The meta record carries the committed id.
        self.committed_dirty = false;
        Ok(())
    }

    /// Queues one record for the writer, rotating first if the active segment is full.
    /// Returns (segment, payload offset, crc, seq).
    pub(super) fn write_record(
        &mut self,
        kind: Kind,
        payload: Bytes,
    ) -> Result<(u64, u64, u32, u64), LogError> {
        if self.active_len >= self.segment_limit {
            self.start_segment()?;
        }
        self.queue_committed()?;
        self.queue_record(kind, payload)
    }

    fn queue_record(
        &mut self,
        kind: Kind,
        payload: Bytes,
    ) -> Result<(u64, u64, u32, u64), LogError> {
        if u32::try_from(payload.len()).is_err() {
            return Err(LogError::Inconsistent(format!(
                "a record of {} bytes exceeds the 4 GiB record limit",
                payload.len()
            )));
        }
        let segment = self.segments.last().copied().ok_or(LogError::WriterGone)?;
        let offset = self.active_len;
        let crc = payload_crc(&payload);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.active_len += (RECORD_HEADER_LEN + payload.len()) as u64;
        self.send(Op::Record(Staged {
            kind,
            payload,
            payload_crc: crc,
            offset,
            seq,
        }));
        Ok((segment, offset + RECORD_HEADER_LEN as u64, crc, seq))
    }
}
