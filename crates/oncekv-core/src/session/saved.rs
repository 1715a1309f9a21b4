//! One session's saved responses, laid out for the common case.
//!
//! A client that waits for each reply before sending the next request has at most one
//! saved response at a time, and most replies (a Put without `prev_kv`, a refusal, a
//! lease revoke, a small delete) are just a revision and a tag. So the session keeps its
//! *newest* saved seq inline, with that reply packed into 16 bytes when it fits, and puts
//! everything else in a heap-allocated spill list that most sessions never have:
//!
//! - a new request (a seq above the newest saved one) is decided without leaving the
//!   session's own cache line, whatever the spill holds;
//! - a duplicate of the newest seq with a packable reply is answered from the same line;
//! - saving a packable reply of a client with nothing else outstanding allocates nothing.
//!
//! Which entry is inline depends on history (the order seqs were saved and acknowledged),
//! so equality and the snapshot image use only the logical content: the saved `(seq,
//! reply)` pairs in seq order.

use std::borrow::Cow;
use std::num::NonZeroU64;

use crate::command::{DeleteRangeResponse, OpError, OpReply, OpResponse, PutResponse};

/// The shape of a packed reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `Ok(Put)` without `prev_kv`.
    Put,
    /// `Ok(LeaseRevoke)`.
    LeaseRevoke,
    /// `Ok(DeleteRange)` that deleted nothing (no `prev_kvs`).
    DeletedNone,
    /// `Ok(DeleteRange)` that deleted one key and did not ask for `prev_kvs`.
    DeletedOne,
    /// `Err(_)`: the store refused the op.
    Refused(OpError),
}

impl Kind {
    /// The kind's code, a packed reply's top byte. `Put` is 0, so that the usual reply
    /// packs to its revision alone.
    fn code(self) -> u64 {
        match self {
            Kind::Put => 0,
            Kind::LeaseRevoke => 1,
            Kind::DeletedNone => 2,
            Kind::DeletedOne => 3,
            Kind::Refused(e) => 4 + e as u64,
        }
    }

    /// The kind whose [`code`](Self::code) is `code`, if any.
    fn from_code(code: u64) -> Option<Kind> {
        Some(match code {
            0 => Kind::Put,
            1 => Kind::LeaseRevoke,
            2 => Kind::DeletedNone,
            3 => Kind::DeletedOne,
            c => Kind::Refused(*OpError::ALL.get(usize::try_from(c - 4).ok()?)?),
        })
    }
}

/// Revisions below 2^56 are packed into 7 bytes (beyond that a reply is spilled).
const PACKED_REVISION_LIMIT: i64 = 1 << 56;

/// A reply in 8 bytes: the revision in the low 7 bytes, the [`Kind`]'s code in the top
/// byte. Saving the usual reply is then one 8-byte store of its revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Packed(u64);

impl Packed {
    /// Marks a newest seq whose reply did not pack (it is the spill's last entry). No
    /// reply packs to it: the top byte 0xff is no kind's code.
    const SPILLED: Packed = Packed(u64::MAX);

    /// `None` if `reply` does not fit.
    #[inline]
    fn pack(reply: &OpReply) -> Option<Packed> {
        // A negative revision has its top bit set, so one compare rejects both ends.
        let revision = reply.revision as u64;
        if revision >= PACKED_REVISION_LIMIT as u64 {
            return None;
        }
        // The usual reply first, ahead of the general match (a compare, not a jump table).
        if let Ok(OpResponse::Put(PutResponse { prev_kv: None })) = &reply.result {
            return Some(Packed(revision));
        }
        Some(Packed(Self::kind_of(reply)?.code() << 56 | revision))
    }

    /// The shape of any reply; `None` if it has no packed form.
    #[inline(never)]
    fn kind_of(reply: &OpReply) -> Option<Kind> {
        let kind = match &reply.result {
            Ok(OpResponse::Put(PutResponse { prev_kv: None })) => Kind::Put,
            Ok(OpResponse::LeaseRevoke) => Kind::LeaseRevoke,
            Ok(OpResponse::DeleteRange(DeleteRangeResponse { deleted, prev_kvs }))
                if prev_kvs.is_empty() && (*deleted == 0 || *deleted == 1) =>
            {
                if *deleted == 0 {
                    Kind::DeletedNone
                } else {
                    Kind::DeletedOne
                }
            }
            Err(e) => Kind::Refused(*e),
            Ok(_) => return None,
        };
        // An error missing from `OpError::ALL` would not decode: it is spilled instead.
        (Kind::from_code(kind.code()) == Some(kind)).then_some(kind)
    }

    /// The reply [`pack`](Self::pack) was given.
    fn unpack(&self) -> OpReply {
        let revision = (self.0 & (PACKED_REVISION_LIMIT as u64 - 1)) as i64;
        let deleted = |deleted| {
            Ok(OpResponse::DeleteRange(DeleteRangeResponse {
                deleted,
                prev_kvs: Vec::new(),
            }))
        };
        let Some(kind) = Kind::from_code(self.0 >> 56) else {
            // Only `pack` makes a `Packed` (`SPILLED` is never unpacked: `Newest::packed`),
            // and it packs only kinds that decode.
            unreachable!("packed reply {:#x} has no kind", self.0)
        };
        let result = match kind {
            Kind::Put => Ok(OpResponse::Put(PutResponse { prev_kv: None })),
            Kind::LeaseRevoke => Ok(OpResponse::LeaseRevoke),
            Kind::DeletedNone => deleted(0),
            Kind::DeletedOne => deleted(1),
            Kind::Refused(e) => Err(e),
        };
        OpReply { revision, result }
    }
}

/// The newest saved seq and its reply, packed when it fits. 16 bytes. (The seq is never 0:
/// `Option<Newest>` is `None` there, and takes no space of its own.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Newest {
    seq: NonZeroU64,
    /// [`Packed::SPILLED`]: the reply did not fit and is the spill's last entry.
    reply: Packed,
}

impl Newest {
    fn seq(&self) -> u64 {
        self.seq.get()
    }

    /// The packed reply; `None` if it is in the spill.
    fn packed(&self) -> Option<&Packed> {
        (self.reply != Packed::SPILLED).then_some(&self.reply)
    }
}

/// A saved reply where a duplicate check found it: packed in the session record or in
/// the spill list. Cheap to copy; [`to_reply`](Self::to_reply) gives the reply itself.
#[derive(Debug, Clone, Copy)]
pub struct SavedReply<'a>(Found<'a>);

#[derive(Debug, Clone, Copy)]
enum Found<'a> {
    /// In the session record (a reference, not a copy: the packed bytes are unaligned).
    Packed(&'a Packed),
    Spilled(&'a OpReply),
}

impl SavedReply<'_> {
    /// The reply exactly as it was saved.
    pub fn to_reply(&self) -> OpReply {
        match self.0 {
            Found::Packed(packed) => packed.unpack(),
            Found::Spilled(reply) => reply.clone(),
        }
    }
}

/// Compares the replies, wherever they are kept.
impl PartialEq for SavedReply<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.to_reply() == other.to_reply()
    }
}

impl Eq for SavedReply<'_> {}

/// Saved replies that are not inline: strictly increasing by seq, never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Spill {
    entries: Vec<(u64, OpReply)>,
}

/// A session's saved responses (24 bytes inline).
///
/// Invariants (checked by [`validate`](Self::validate)): `newest` is `None` exactly when
/// nothing is saved; `newest.seq` is the largest saved seq; the spill holds every other
/// saved seq (and the newest one too when its reply does not pack, as its last entry),
/// strictly increasing, and is `None` rather than empty.
#[derive(Debug, Clone, Default)]
pub(crate) struct Saved {
    newest: Option<Newest>,
    spill: Option<Box<Spill>>,
}

impl Saved {
    /// The saved reply of `seq`. A seq above the newest saved one is answered without
    /// touching the spill.
    #[inline]
    pub(crate) fn get(&self, seq: u64) -> Option<SavedReply<'_>> {
        let newest = self.newest.as_ref()?;
        if seq > newest.seq() {
            return None;
        }
        if seq == newest.seq()
            && let Some(packed) = newest.packed()
        {
            return Some(SavedReply(Found::Packed(packed)));
        }
        let spill = self.spill.as_deref()?;
        let i = spill.entries.binary_search_by_key(&seq, |(s, _)| *s).ok()?;
        let (_, reply) = spill.entries.get(i)?;
        Some(SavedReply(Found::Spilled(reply)))
    }

    /// Whether `seq` has a saved reply; a seq above the newest saved one is answered
    /// without touching the spill.
    #[inline]
    pub(crate) fn contains(&self, seq: u64) -> bool {
        match self.newest {
            None => false,
            Some(newest) if seq > newest.seq() => false,
            Some(newest) if seq == newest.seq() => true,
            Some(_) => self.spill.as_deref().is_some_and(|spill| {
                spill
                    .entries
                    .binary_search_by_key(&seq, |(s, _)| *s)
                    .is_ok()
            }),
        }
    }

    /// Rule 3: forgets every reply below `first_incomplete`.
    #[inline]
    pub(crate) fn drop_below(&mut self, first_incomplete: u64) {
        let Some(newest) = self.newest else {
            return;
        };
        if newest.seq() < first_incomplete {
            // A client that waits for each reply acknowledges everything: the usual case.
            self.newest = None;
            if self.spill.is_some() {
                self.spill = None;
            }
            return;
        }
        self.drop_spilled_below(first_incomplete);
    }

    /// [`drop_below`](Self::drop_below) when the newest saved seq stays.
    fn drop_spilled_below(&mut self, first_incomplete: u64) {
        if let Some(spill) = &mut self.spill {
            let keep_from = spill
                .entries
                .partition_point(|(seq, _)| *seq < first_incomplete);
            if keep_from == spill.entries.len() {
                self.spill = None;
            } else {
                spill.entries.drain(..keep_from);
            }
        }
    }

    /// Saves `reply` for `seq`, replacing a reply already saved for it (no caller does:
    /// `check` admits only a seq with nothing saved, and a snapshot's seqs are strictly
    /// increasing; kept so that seqs stay unique whatever the caller). Clones `reply` only
    /// when it cannot be packed inline. (Saved seqs are never 0: the lowest is 1.)
    #[inline]
    pub(crate) fn insert(&mut self, seq: NonZeroU64, reply: &OpReply) {
        match self.newest {
            Some(newest) if seq < newest.seq => self.spill_insert(seq.get(), reply.clone()),
            Some(newest) if seq == newest.seq => {
                if newest.packed().is_none() {
                    self.spill_pop();
                }
                self.set_newest(seq, reply);
            }
            Some(newest) => {
                // The current newest becomes an ordinary older entry.
                if let Some(older) = newest.packed() {
                    self.spill_insert(newest.seq(), older.unpack());
                }
                self.set_newest(seq, reply);
            }
            None => self.set_newest(seq, reply),
        }
    }

    #[inline]
    fn set_newest(&mut self, seq: NonZeroU64, reply: &OpReply) {
        let packed = Packed::pack(reply).unwrap_or_else(|| {
            self.spill_insert(seq.get(), reply.clone());
            Packed::SPILLED
        });
        self.newest = Some(Newest { seq, reply: packed });
    }

    #[inline(never)]
    fn spill_insert(&mut self, seq: u64, reply: OpReply) {
        let spill = self.spill.get_or_insert_with(|| {
            Box::new(Spill {
                entries: Vec::with_capacity(2),
            })
        });
        match spill.entries.binary_search_by_key(&seq, |(s, _)| *s) {
            Ok(i) => {
                if let Some(entry) = spill.entries.get_mut(i) {
                    entry.1 = reply;
                }
            }
            Err(i) => spill.entries.insert(i, (seq, reply)),
        }
    }

    fn spill_pop(&mut self) {
        if let Some(spill) = &mut self.spill {
            spill.entries.pop();
            if spill.entries.is_empty() {
                self.spill = None;
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        let spilled = self.spill.as_ref().map_or(0, |s| s.entries.len());
        let packed = self
            .newest
            .and_then(|n| n.packed().copied())
            .map_or(0, |_| 1);
        spilled + packed
    }

    /// Every saved `(seq, reply)`, by seq (exact size, for serializing without copying).
    pub(crate) fn iter(&self) -> impl ExactSizeIterator<Item = (u64, Cow<'_, OpReply>)> {
        let spilled = self
            .spill
            .as_deref()
            .map_or(&[][..], |s| &s.entries[..])
            .iter()
            .map(|(seq, reply)| (*seq, Cow::Borrowed(reply)));
        let packed = self
            .newest
            .and_then(|n| Some((n.seq(), Cow::Owned(n.packed()?.unpack()))));
        ExactChain {
            first: spilled,
            last: packed,
        }
    }

    /// Rebuilds from `(seq, reply)` pairs (a snapshot's), which must be strictly increasing.
    pub(crate) fn from_sorted(entries: Vec<(u64, OpReply)>) -> Result<Saved, String> {
        if entries.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err("saved seqs not strictly increasing".into());
        }
        let mut saved = Saved::default();
        for (seq, reply) in &entries {
            let seq = NonZeroU64::new(*seq).ok_or("saved seq 0")?;
            saved.insert(seq, reply);
        }
        Ok(saved)
    }

    /// Checks the layout invariants (see the type's docs) and that every saved seq lies in
    /// `[acked_below, acked_below + window)`.
    pub(crate) fn validate(&self, acked_below: u64, window: u64) -> Result<(), String> {
        let spilled = self.spill.as_deref().map_or(&[][..], |s| &s.entries[..]);
        if self.spill.is_some() && spilled.is_empty() {
            return Err("empty spill list kept allocated".into());
        }
        if spilled.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err("spilled seqs not strictly increasing".into());
        }
        let Some(newest) = self.newest else {
            return if spilled.is_empty() {
                Ok(())
            } else {
                Err("spilled replies but no newest seq".into())
            };
        };
        let last_spilled = spilled.last().map(|(seq, _)| *seq);
        let seq = newest.seq();
        match newest.packed() {
            None if last_spilled != Some(seq) => {
                return Err(format!(
                    "newest seq {seq} marked spilled but not the spill's last"
                ));
            }
            None => {}
            Some(_) if last_spilled.is_some_and(|s| s >= seq) => {
                return Err(format!("inline seq {seq} is not above every spilled seq"));
            }
            Some(packed) if Kind::from_code(packed.0 >> 56).is_none() => {
                return Err(format!("inline reply of seq {seq} has no kind"));
            }
            Some(packed) if Packed::pack(&packed.unpack()) != Some(*packed) => {
                return Err(format!("inline reply of seq {seq} does not round-trip"));
            }
            Some(_) => {}
        }
        for (seq, _) in self.iter() {
            // Exact arithmetic, as in rule 6: `seq - acked_below` cannot wrap here.
            if seq < acked_below || seq - acked_below >= window {
                return Err(format!(
                    "saved seq {seq} outside [{acked_below}, {acked_below}+{window})"
                ));
            }
        }
        Ok(())
    }
}

impl PartialEq for Saved {
    fn eq(&self, other: &Saved) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Saved {}

/// `first` then `last`, with an exact length (std's `Chain` is not `ExactSizeIterator`).
struct ExactChain<I, T> {
    first: I,
    last: Option<T>,
}

impl<I: ExactSizeIterator<Item = T>, T> Iterator for ExactChain<I, T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        self.first.next().or_else(|| self.last.take())
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.first.len() + usize::from(self.last.is_some());
        (n, Some(n))
    }
}

impl<I: ExactSizeIterator<Item = T>, T> ExactSizeIterator for ExactChain<I, T> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::KeyValue;

    fn put(revision: i64) -> OpReply {
        OpReply {
            revision,
            result: Ok(OpResponse::Put(PutResponse::default())),
        }
    }

    fn put_with_prev(revision: i64) -> OpReply {
        OpReply {
            revision,
            result: Ok(OpResponse::Put(PutResponse {
                prev_kv: Some(Box::new(KeyValue {
                    key: "k".into(),
                    value: "old".into(),
                    ..KeyValue::default()
                })),
            })),
        }
    }

    fn nz(seq: u64) -> NonZeroU64 {
        NonZeroU64::new(seq).expect("saved seqs start at 1")
    }

    fn contents(s: &Saved) -> Vec<(u64, OpReply)> {
        s.iter().map(|(seq, r)| (seq, r.into_owned())).collect()
    }

    /// Every reply shape that can be packed comes back unchanged: duplicates must be
    /// byte-identical to the first answer.
    #[test]
    fn packed_replies_round_trip_exactly() {
        let mut replies = vec![
            put(0),
            put(1),
            put(PACKED_REVISION_LIMIT - 1),
            OpReply {
                revision: 7,
                result: Ok(OpResponse::LeaseRevoke),
            },
        ];
        for deleted in [0, 1] {
            replies.push(OpReply {
                revision: 9,
                result: Ok(OpResponse::DeleteRange(DeleteRangeResponse {
                    deleted,
                    prev_kvs: Vec::new(),
                })),
            });
        }
        for e in OpError::ALL {
            replies.push(OpReply {
                revision: 3,
                result: Err(e),
            });
        }
        for reply in replies {
            let packed = Packed::pack(&reply).expect("packable");
            assert_eq!(packed.unpack(), reply);
        }
    }

    /// Every store error has a one-byte code that reads back as itself, and no code
    /// collides with the marker of a spilled reply.
    #[test]
    fn every_error_has_a_code_that_reads_back() {
        for (i, e) in OpError::ALL.iter().enumerate() {
            assert_eq!(
                *e as usize, i,
                "OpError::ALL out of declaration order at {e:?}"
            );
            let kind = Kind::Refused(*e);
            assert_eq!(Kind::from_code(kind.code()), Some(kind));
            assert!(kind.code() < Packed::SPILLED.0 >> 56);
        }
        assert_eq!(Kind::from_code(Packed::SPILLED.0 >> 56), None);
        assert_eq!(Kind::from_code(4 + OpError::ALL.len() as u64), None);
    }

    /// A snapshot naming seq 0 (no request has it) is refused, not restored.
    #[test]
    fn a_saved_seq_of_zero_is_refused() {
        assert!(Saved::from_sorted(vec![(0, put(1)), (1, put(2))]).is_err());
    }

    /// Replies that do not fit are kept whole in the spill, never truncated.
    #[test]
    fn large_replies_are_spilled_whole() {
        for reply in [put(-1), put(PACKED_REVISION_LIMIT), put_with_prev(4)] {
            assert_eq!(Packed::pack(&reply), None);
            let mut s = Saved::default();
            s.insert(nz(1), &reply);
            assert_eq!(s.get(1).map(|r| r.to_reply()), Some(reply.clone()));
            assert_eq!(contents(&s), vec![(1, reply)]);
            s.validate(1, 8).expect("valid");
        }
    }

    /// The sequential client's steady state allocates nothing.
    #[test]
    fn one_packable_reply_stays_inline() {
        let mut s = Saved::default();
        s.insert(nz(1), &put(2));
        assert!(s.spill.is_none());
        s.drop_below(2);
        s.insert(nz(2), &put(3));
        assert!(s.spill.is_none());
        assert_eq!(contents(&s), vec![(2, put(3))]);
    }

    /// Out-of-order saves (pipelined requests) keep every reply, by seq.
    #[test]
    fn pipelined_saves_keep_every_reply() {
        let mut s = Saved::default();
        for seq in [3, 1, 5, 2, 4] {
            let reply = if seq % 2 == 0 {
                put_with_prev(seq as i64)
            } else {
                put(seq as i64)
            };
            s.insert(nz(seq), &reply);
            s.validate(1, 8).expect("valid");
        }
        let seqs: Vec<u64> = s.iter().map(|(seq, _)| seq).collect();
        assert_eq!(seqs, [1, 2, 3, 4, 5]);
        assert_eq!(s.get(4).map(|r| r.to_reply()), Some(put_with_prev(4)));
        assert_eq!(s.get(5).map(|r| r.to_reply()), Some(put(5)));
        assert_eq!(s.get(6), None);
        s.drop_below(4);
        s.validate(4, 8).expect("valid");
        assert_eq!(s.iter().map(|(seq, _)| seq).collect::<Vec<_>>(), [4, 5]);
        s.drop_below(6);
        assert_eq!(s.len(), 0);
        assert!(s.spill.is_none() && s.newest.is_none());
    }

    /// `contains` (which the duplicate check asks first) agrees with `get` for every seq,
    /// inline or spilled, packable or not, through saves and acknowledgements.
    #[test]
    fn contains_agrees_with_get() {
        let mut s = Saved::default();
        let agree = |s: &Saved| {
            for seq in 0..12 {
                assert_eq!(s.contains(seq), s.get(seq).is_some(), "seq {seq}");
            }
        };
        agree(&s);
        for seq in [3, 1, 7, 2, 9, 5] {
            let reply = if seq % 3 == 0 {
                put_with_prev(seq as i64)
            } else {
                put(seq as i64)
            };
            s.insert(nz(seq), &reply);
            agree(&s);
        }
        for acked in [2, 4, 8, 10] {
            s.drop_below(acked);
            agree(&s);
        }
        assert_eq!(s.len(), 0);
    }

    /// Equality and the snapshot image see content, not which entry happens to be inline.
    #[test]
    fn equal_content_compares_equal_whatever_the_placement() {
        let mut a = Saved::default();
        a.insert(nz(1), &put(1));
        a.insert(nz(2), &put_with_prev(2));
        let b = Saved::from_sorted(contents(&a)).expect("sorted");
        assert_eq!(a, b);
        assert_eq!(contents(&a), contents(&b));
        assert!(Saved::from_sorted(vec![(2, put(1)), (2, put(2))]).is_err());
    }
}
