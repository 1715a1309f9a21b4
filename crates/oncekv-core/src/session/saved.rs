//! One session's saved responses, laid out for the common case.
//!
//! A client that waits for each reply before sending the next request has at most one
//! saved response at a time, and most replies (a Put without `prev_kv`, a refusal, a
//! lease revoke, a small delete) are just a revision and a tag. So a session with one
//! saved response keeps it inline, packed into 8 bytes beside its seq and the fingerprint
//! of the request that produced it; a session with several (a pipelined client), or with
//! a reply that does not pack, keeps them in a heap-allocated spill list and only the
//! newest seq inline:
//!
//! - a new request (a seq above the newest saved one) is decided without leaving the
//!   session's own cache line, whatever the spill holds;
//! - a duplicate of a sequential client's request is answered from the same line;
//! - saving a packable reply of a client with nothing else outstanding allocates nothing.
//!
//! Which form a session is in depends on history (the order seqs were saved and
//! acknowledged), so equality and the snapshot image use only the logical content: the
//! saved `(seq, fingerprint, reply)` triples in seq order.

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
            // Only `pack` makes a `Packed`, and it packs only kinds that decode.
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

/// The one saved reply of a session with nothing else saved: its seq, the reply packed,
/// and the fingerprint of the request that produced it. 24 bytes; the seq is never 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Inline {
    seq: NonZeroU64,
    reply: Packed,
    fingerprint: u64,
}

/// A saved reply kept whole in the spill list.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    seq: u64,
    /// [`Op::fingerprint`](crate::command::Op::fingerprint) of the request.
    fingerprint: u64,
    reply: OpReply,
}

/// A saved reply where a duplicate check found it: packed in the session record or in
/// the spill list. Cheap to copy; [`to_reply`](Self::to_reply) gives the reply itself.
#[derive(Debug, Clone, Copy)]
pub struct SavedReply<'a>(Found<'a>);

#[derive(Debug, Clone, Copy)]
enum Found<'a> {
    /// In the session record (a reference, not a copy: the packed bytes are unaligned).
    Packed(&'a Inline),
    Spilled(&'a Entry),
}

impl SavedReply<'_> {
    /// The reply exactly as it was saved.
    pub fn to_reply(&self) -> OpReply {
        match self.0 {
            Found::Packed(inline) => inline.reply.unpack(),
            Found::Spilled(entry) => entry.reply.clone(),
        }
    }

    /// The [`Op::fingerprint`](crate::command::Op::fingerprint) of the request that
    /// produced the reply.
    pub fn fingerprint(&self) -> u64 {
        match self.0 {
            Found::Packed(inline) => inline.fingerprint,
            Found::Spilled(entry) => entry.fingerprint,
        }
    }
}

/// Compares the replies and fingerprints, wherever they are kept.
impl PartialEq for SavedReply<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.fingerprint() == other.fingerprint() && self.to_reply() == other.to_reply()
    }
}

impl Eq for SavedReply<'_> {}

/// Saved replies that are not inline: strictly increasing by seq, never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spill {
    entries: Vec<Entry>,
}

impl Spill {
    fn find(&self, seq: u64) -> Option<&Entry> {
        let i = self.entries.binary_search_by_key(&seq, |e| e.seq).ok()?;
        self.entries.get(i)
    }
}

/// A session's saved responses (24 bytes inline).
///
/// Invariants (checked by [`validate`](Self::validate)): `One` holds a packed reply that
/// round-trips; in `Spilled`, `newest` is 0 exactly when `spill` is `None` (nothing is
/// saved), and otherwise the spill is non-empty, strictly increasing by seq, and `newest`
/// is its last seq.
#[derive(Debug, Clone)]
pub(crate) enum Saved {
    /// One reply, packed inline: the sequential client's steady state.
    One(Inline),
    /// Every saved reply in the spill list, or nothing saved. `newest` repeats the largest
    /// saved seq so that a request above it is told new without reading the list.
    Spilled {
        newest: u64,
        spill: Option<Box<Spill>>,
    },
}

// The session record (`session/slots.rs`) is one cache line with this inside: the
// spilled form fits beside the inline seq, whose 0 (no saved seq is 0) marks it.
const _: () = assert!(std::mem::size_of::<Saved>() == 24);

impl Default for Saved {
    fn default() -> Saved {
        Saved::EMPTY
    }
}

impl Saved {
    const EMPTY: Saved = Saved::Spilled {
        newest: 0,
        spill: None,
    };

    /// The saved reply of `seq`. A seq above the newest saved one is answered without
    /// touching the spill.
    #[inline]
    pub(crate) fn get(&self, seq: u64) -> Option<SavedReply<'_>> {
        match self {
            Saved::One(inline) => {
                (inline.seq.get() == seq).then_some(SavedReply(Found::Packed(inline)))
            }
            Saved::Spilled { newest, spill } => {
                if seq > *newest {
                    return None;
                }
                let entry = spill.as_deref()?.find(seq)?;
                Some(SavedReply(Found::Spilled(entry)))
            }
        }
    }

    /// Whether `seq` has a saved reply; a seq above the newest saved one is answered
    /// without touching the spill.
    #[inline]
    pub(crate) fn contains(&self, seq: u64) -> bool {
        match self {
            Saved::One(inline) => inline.seq.get() == seq,
            Saved::Spilled { newest, spill } => {
                seq <= *newest && spill.as_deref().is_some_and(|s| s.find(seq).is_some())
            }
        }
    }

    /// Rule 3: forgets every reply below `first_incomplete`.
    #[inline]
    pub(crate) fn drop_below(&mut self, first_incomplete: u64) {
        match self {
            Saved::One(inline) => {
                // A client that waits for each reply acknowledges everything: the usual case.
                if inline.seq.get() < first_incomplete {
                    *self = Saved::EMPTY;
                }
            }
            Saved::Spilled { newest, spill } => {
                if *newest < first_incomplete {
                    if spill.is_some() {
                        *self = Saved::EMPTY;
                    }
                } else if let Some(spill) = spill {
                    // The newest entry stays, so the list does not become empty.
                    let keep_from = spill.entries.partition_point(|e| e.seq < first_incomplete);
                    spill.entries.drain(..keep_from);
                }
            }
        }
    }

    /// Saves `reply` for `seq`, with the fingerprint of the request that produced it,
    /// replacing a reply already saved for it (no caller does: `check` admits only a seq
    /// with nothing saved, and a snapshot's seqs are strictly increasing; kept so that seqs
    /// stay unique whatever the caller). Clones `reply` only when it is not the session's
    /// only saved reply or cannot be packed. (Saved seqs are never 0: the lowest is 1.)
    #[inline]
    pub(crate) fn insert(&mut self, seq: NonZeroU64, reply: &OpReply, fingerprint: u64) {
        if let Saved::Spilled { spill: None, .. } = self
            && let Some(packed) = Packed::pack(reply)
        {
            *self = Saved::One(Inline {
                seq,
                reply: packed,
                fingerprint,
            });
            return;
        }
        self.insert_spilled(seq, reply, fingerprint);
    }

    /// [`insert`](Self::insert) when the reply goes to the spill list: something else is
    /// saved (a pipelined client), or the reply does not pack.
    #[inline(never)]
    fn insert_spilled(&mut self, seq: NonZeroU64, reply: &OpReply, fingerprint: u64) {
        if let Saved::One(inline) = self
            && inline.seq == seq
        {
            *self = Saved::EMPTY;
            return self.insert(seq, reply, fingerprint);
        }
        let mut spill = match std::mem::take(self) {
            Saved::One(inline) => Box::new(Spill {
                entries: vec![Entry {
                    seq: inline.seq.get(),
                    fingerprint: inline.fingerprint,
                    reply: inline.reply.unpack(),
                }],
            }),
            Saved::Spilled {
                spill: Some(spill), ..
            } => spill,
            Saved::Spilled { spill: None, .. } => Box::new(Spill {
                entries: Vec::with_capacity(2),
            }),
        };
        let entry = Entry {
            seq: seq.get(),
            fingerprint,
            reply: reply.clone(),
        };
        match spill.entries.binary_search_by_key(&entry.seq, |e| e.seq) {
            Ok(i) => {
                if let Some(old) = spill.entries.get_mut(i) {
                    *old = entry;
                }
            }
            Err(i) => spill.entries.insert(i, entry),
        }
        let newest = spill.entries.last().map_or(0, |e| e.seq);
        *self = Saved::Spilled {
            newest,
            spill: Some(spill),
        };
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Saved::One(_) => 1,
            Saved::Spilled { spill, .. } => spill.as_ref().map_or(0, |s| s.entries.len()),
        }
    }

    /// Every saved `(seq, fingerprint, reply)`, by seq (exact size, for serializing without
    /// copying).
    pub(crate) fn iter(&self) -> impl ExactSizeIterator<Item = (u64, u64, Cow<'_, OpReply>)> {
        let (spilled, inline) = match self {
            Saved::One(inline) => (&[][..], Some(inline)),
            Saved::Spilled { spill, .. } => {
                (spill.as_deref().map_or(&[][..], |s| &s.entries[..]), None)
            }
        };
        ExactChain {
            first: spilled
                .iter()
                .map(|e| (e.seq, e.fingerprint, Cow::Borrowed(&e.reply))),
            last: inline.map(|i| (i.seq.get(), i.fingerprint, Cow::Owned(i.reply.unpack()))),
        }
    }

    /// Rebuilds from `(seq, fingerprint, reply)` triples (a snapshot's), which must be
    /// strictly increasing by seq.
    pub(crate) fn from_sorted(entries: Vec<(u64, u64, OpReply)>) -> Result<Saved, String> {
        if entries.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err("saved seqs not strictly increasing".into());
        }
        let mut saved = Saved::default();
        for (seq, fingerprint, reply) in &entries {
            let seq = NonZeroU64::new(*seq).ok_or("saved seq 0")?;
            saved.insert(seq, reply, *fingerprint);
        }
        Ok(saved)
    }

    /// Checks the layout invariants (see the type's docs) and that every saved seq lies in
    /// `[acked_below, acked_below + window)`.
    pub(crate) fn validate(&self, acked_below: u64, window: u64) -> Result<(), String> {
        match self {
            Saved::One(inline) => {
                let seq = inline.seq.get();
                if Kind::from_code(inline.reply.0 >> 56).is_none() {
                    return Err(format!("inline reply of seq {seq} has no kind"));
                }
                if Packed::pack(&inline.reply.unpack()) != Some(inline.reply) {
                    return Err(format!("inline reply of seq {seq} does not round-trip"));
                }
            }
            Saved::Spilled { newest, spill } => {
                let entries = spill.as_deref().map_or(&[][..], |s| &s.entries[..]);
                if spill.is_some() && entries.is_empty() {
                    return Err("empty spill list kept allocated".into());
                }
                if entries.windows(2).any(|w| w[0].seq >= w[1].seq) {
                    return Err("spilled seqs not strictly increasing".into());
                }
                if entries.last().map_or(0, |e| e.seq) != *newest {
                    return Err(format!("newest seq {newest} is not the spill's last"));
                }
            }
        }
        for (seq, _, _) in self.iter() {
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

    fn contents(s: &Saved) -> Vec<(u64, u64, OpReply)> {
        s.iter()
            .map(|(seq, f, r)| (seq, f, r.into_owned()))
            .collect()
    }

    /// A stand-in for the fingerprint of the request with this seq.
    fn fp(seq: u64) -> u64 {
        seq.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    fn is_inline(s: &Saved) -> bool {
        matches!(s, Saved::One(_))
    }

    fn is_empty(s: &Saved) -> bool {
        matches!(
            s,
            Saved::Spilled {
                newest: 0,
                spill: None
            }
        )
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

    /// Every store error has a one-byte code that reads back as itself.
    #[test]
    fn every_error_has_a_code_that_reads_back() {
        for (i, e) in OpError::ALL.iter().enumerate() {
            assert_eq!(
                *e as usize, i,
                "OpError::ALL out of declaration order at {e:?}"
            );
            let kind = Kind::Refused(*e);
            assert_eq!(Kind::from_code(kind.code()), Some(kind));
            assert!(kind.code() <= 0xff);
        }
        assert_eq!(Kind::from_code(4 + OpError::ALL.len() as u64), None);
    }

    /// A snapshot naming seq 0 (no request has it) is refused, not restored.
    #[test]
    fn a_saved_seq_of_zero_is_refused() {
        assert!(Saved::from_sorted(vec![(0, 0, put(1)), (1, 1, put(2))]).is_err());
    }

    /// Replies that do not fit are kept whole in the spill, never truncated.
    #[test]
    fn large_replies_are_spilled_whole() {
        for reply in [put(-1), put(PACKED_REVISION_LIMIT), put_with_prev(4)] {
            assert_eq!(Packed::pack(&reply), None);
            let mut s = Saved::default();
            s.insert(nz(1), &reply, fp(1));
            assert_eq!(s.get(1).map(|r| r.to_reply()), Some(reply.clone()));
            assert_eq!(s.get(1).map(|r| r.fingerprint()), Some(fp(1)));
            assert_eq!(contents(&s), vec![(1, fp(1), reply)]);
            s.validate(1, 8).expect("valid");
        }
    }

    /// The sequential client's steady state allocates nothing.
    #[test]
    fn one_packable_reply_stays_inline() {
        let mut s = Saved::default();
        s.insert(nz(1), &put(2), fp(1));
        assert!(is_inline(&s));
        s.drop_below(2);
        assert!(is_empty(&s));
        s.insert(nz(2), &put(3), fp(2));
        assert!(is_inline(&s));
        assert_eq!(s.get(2).map(|r| r.fingerprint()), Some(fp(2)));
        assert_eq!(contents(&s), vec![(2, fp(2), put(3))]);
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
            s.insert(nz(seq), &reply, fp(seq));
            s.validate(1, 8).expect("valid");
        }
        let seqs: Vec<u64> = s.iter().map(|(seq, _, _)| seq).collect();
        assert_eq!(seqs, [1, 2, 3, 4, 5]);
        assert_eq!(s.get(4).map(|r| r.to_reply()), Some(put_with_prev(4)));
        assert_eq!(s.get(5).map(|r| r.to_reply()), Some(put(5)));
        for seq in 1..=5 {
            assert_eq!(s.get(seq).map(|r| r.fingerprint()), Some(fp(seq)));
        }
        assert_eq!(s.get(6), None);
        s.drop_below(4);
        s.validate(4, 8).expect("valid");
        assert_eq!(s.iter().map(|(seq, _, _)| seq).collect::<Vec<_>>(), [4, 5]);
        s.drop_below(6);
        assert_eq!(s.len(), 0);
        assert!(is_empty(&s));
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
            s.insert(nz(seq), &reply, fp(seq));
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
        a.insert(nz(1), &put(1), fp(1));
        a.insert(nz(2), &put_with_prev(2), fp(2));
        let b = Saved::from_sorted(contents(&a)).expect("sorted");
        assert_eq!(a, b);
        assert_eq!(contents(&a), contents(&b));
        assert!(Saved::from_sorted(vec![(2, 2, put(1)), (2, 2, put(2))]).is_err());
        // One reply, inline in one and spilled in the other.
        let mut inline = Saved::default();
        inline.insert(nz(3), &put(3), fp(3));
        let mut spilled = Saved::default();
        spilled.insert(nz(2), &put(2), fp(2));
        spilled.insert(nz(3), &put(3), fp(3));
        spilled.drop_below(3);
        assert!(is_inline(&inline) && !is_inline(&spilled));
        assert_eq!(inline, spilled);
    }

    /// The fingerprint is content: the same reply saved for another request is another
    /// saved state (a replica that lost a fingerprint would answer a reused seq wrongly).
    #[test]
    fn fingerprints_are_part_of_equality() {
        let (mut a, mut b) = (Saved::default(), Saved::default());
        a.insert(nz(1), &put(1), fp(1));
        b.insert(nz(1), &put(1), fp(1) ^ 1);
        assert_ne!(a, b);
        a.insert(nz(2), &put_with_prev(2), fp(2));
        b = Saved::from_sorted(contents(&a)).expect("sorted");
        assert_eq!(a, b);
        b.insert(nz(2), &put_with_prev(2), 0);
        assert_ne!(a, b);
    }
}
