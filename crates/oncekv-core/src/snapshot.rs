//! The whole replicated state to bytes and back.
//!
//! The image holds only semantic state in a canonical order (keys, lease ids and client
//! ids sorted), never the lazy deadline indexes or counters, so two replicas with equal
//! state produce byte-identical snapshots, and restoring a snapshot then applying the rest
//! of the log gives the same bytes as never having snapshotted.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::auth::AuthStore;
use crate::command::{AlarmKind, Settings};
use crate::encoding;
use crate::history::{Change, Changes};
use crate::kv::{KvStore, Value};
use crate::lease::{Lease, LeaseTable};
use crate::session::{Session, SessionTable};
use crate::state_machine::StateMachine;

mod relink;
mod stream;

/// The image format and its version: a change to the format changes the version, so that
/// an image of another format is refused (`BadMagic`), never misread. Version 4 is
/// version 3 followed by the raised alarms; version 5 is version 4 followed by the auth
/// store and the session owners. Older images (no alarms, auth off, no owners) still
/// restore.
const MAGIC: &[u8; 4] = b"OKV5";
const MAGIC_V4: &[u8; 4] = b"OKV4";
const MAGIC_V3: &[u8; 4] = b"OKV3";
/// A version 5 image whose key space and history were left out because they are kept
/// elsewhere (in a copy's etcd `key` bucket, see [`StateMachine::snapshot_without_keys`]).
/// Its own magic, so that it can never be restored as a whole state with no keys.
const MAGIC_KEYLESS: &[u8; 4] = b"OKK5";

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("not an oncekv snapshot (bad magic bytes)")]
    BadMagic,
    #[error("oncekv snapshot could not be encoded or decoded: {0}")]
    Codec(#[from] postcard::Error),
    #[error("oncekv snapshot is inconsistent: {0}")]
    Invalid(String),
}

/// A state built from another system's data (an etcd database), without sessions: the
/// key space with its history since `compacted`, leases, auth and alarms. Settings are
/// the defaults.
#[derive(Debug, Clone, Default)]
pub struct ImportedState {
    pub revision: i64,
    pub compacted: i64,
    /// The current keys.
    pub kvs: Vec<(Bytes, Value)>,
    /// Every change from `compacted` on, in revision order (see [`crate::history`]).
    pub changes: Vec<Change>,
    pub leases: Vec<(i64, Lease)>,
    pub alarms: Vec<(u64, AlarmKind)>,
    pub auth: AuthStore,
    pub applied_index: u64,
    pub cluster_time: u64,
}

impl StateMachine {
    /// The state `parts` describes; refused, with the broken invariant named, if it is not
    /// one a replica could hold (a key attached to a missing lease, history that does not
    /// lead to the keys, ...).
    pub fn from_imported(parts: ImportedState) -> Result<StateMachine, SnapshotError> {
        let sm = StateMachine {
            kv: KvStore::from_parts(parts.revision, parts.kvs, parts.compacted, parts.changes),
            leases: LeaseTable::from_leases(parts.leases),
            alarms: parts.alarms.into_iter().collect(),
            auth: parts.auth,
            applied_index: parts.applied_index,
            cluster_time: parts.cluster_time,
            ..StateMachine::default()
        };
        sm.validate().map_err(SnapshotError::Invalid)?;
        Ok(sm)
    }
}

/// Borrowed form, for encoding without copying the state.
#[derive(Serialize)]
struct ImageRef<'a> {
    settings: Settings,
    applied_index: u64,
    cluster_time: u64,
    revision: i64,
    kvs: Vec<(&'a Bytes, &'a Value)>,
    compacted: i64,
    /// The history record, in the order applied (its index is rebuilt on restore).
    history: Changes<'a>,
    leases: Vec<(&'a i64, &'a Lease)>,
    sessions: Vec<(u64, &'a Session)>,
    /// `(client_id, nonce)` of the sessions registered with a nonce, by client id.
    nonces: Vec<(u64, u128)>,
}

/// The whole state ready to encode (see [`StateMachine::snapshot_view`]): the magic,
/// then the image, the alarms, and the auth store with the keys' owners. postcard
/// encodes a tuple, and a byte array, as their elements in turn, so this is the magic's
/// four bytes followed by the three parts, with nothing between them.
pub struct SnapshotView<'a> {
    magic: [u8; 4],
    image: ImageRef<'a>,
    alarms: Vec<(u64, AlarmKind)>,
    auth: &'a AuthStore,
    owners: Vec<(&'a u64, &'a String)>,
}

impl std::fmt::Debug for SnapshotView<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotView")
            .field("applied_index", &self.image.applied_index)
            .field("revision", &self.image.revision)
            .field("keys", &self.image.kvs.len())
            .field("changes", &self.image.history.len())
            .finish_non_exhaustive()
    }
}

impl Serialize for SnapshotView<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        (
            &self.magic,
            &self.image,
            &self.alarms,
            (self.auth, &self.owners),
        )
            .serialize(serializer)
    }
}

/// Owned form, same field order and types, for decoding a keyless image; a whole image's
/// key space and history are decoded element by element instead (see [`stream`]), which
/// fills in the rest of this.
#[derive(Deserialize)]
struct Image {
    settings: Settings,
    applied_index: u64,
    cluster_time: u64,
    revision: i64,
    /// Empty in a keyless image; decoded only to keep the encoding's order.
    _kvs: Vec<(Bytes, Value)>,
    compacted: i64,
    /// As `_kvs`.
    _history: Vec<Change>,
    leases: Vec<(i64, Lease)>,
    sessions: Vec<(u64, Session)>,
    nonces: Vec<(u64, u128)>,
}

impl StateMachine {
    /// Encodes the whole replicated state (KV with its history, leases, sessions with
    /// their saved responses and registration nonces, settings, applied index, cluster
    /// time).
    pub fn snapshot(&self) -> Result<Vec<u8>, SnapshotError> {
        self.encode(true)
    }

    /// [`snapshot`](Self::snapshot) without the key space and its history (their
    /// revision and compaction point stay, as a check): the part of the state an etcd
    /// database has no place for, to go beside one that holds the rest. Only
    /// [`restore_without_keys`](Self::restore_without_keys) reads it back.
    pub fn snapshot_without_keys(&self) -> Result<Vec<u8>, SnapshotError> {
        self.encode(false)
    }

    /// The state as one value whose postcard encoding is [`snapshot`](Self::snapshot)'s
    /// bytes, for writing a snapshot out without holding those bytes (hundreds of MB
    /// with a long history) in memory.
    pub fn snapshot_view(&self) -> SnapshotView<'_> {
        self.view(true)
    }

    fn view(&self, with_keys: bool) -> SnapshotView<'_> {
        let (kvs, history, magic) = if with_keys {
            (self.kv.iter().collect(), self.kv.history().changes(), MAGIC)
        } else {
            (Vec::new(), Changes::none(), MAGIC_KEYLESS)
        };
        SnapshotView {
            magic: *magic,
            image: ImageRef {
                settings: self.settings,
                applied_index: self.applied_index,
                cluster_time: self.cluster_time,
                revision: self.kv.revision(),
                kvs,
                compacted: self.kv.compacted_revision(),
                history,
                leases: self.leases.iter().collect(),
                sessions: self.sessions.sorted(),
                nonces: self.sessions.sorted_nonces(),
            },
            alarms: self.alarms.iter().copied().collect(),
            auth: &self.auth,
            owners: self.owners.iter().collect(),
        }
    }

    fn encode(&self, with_keys: bool) -> Result<Vec<u8>, SnapshotError> {
        Ok(encoding::encode(&self.view(with_keys))?)
    }

    /// Decodes a [`snapshot`](Self::snapshot). Fails, changing nothing, on bytes that are
    /// not a valid image.
    pub fn restore(bytes: &[u8]) -> Result<StateMachine, SnapshotError> {
        stream::restore_with_window(bytes, bytes.len())
    }

    /// Decodes a [`snapshot_without_keys`](Self::snapshot_without_keys) with `kv` (the
    /// key space and history kept beside it) as its key space. Refused if `kv` is not at
    /// the image's revision and compaction point, or the whole is not a consistent state
    /// (a key's lease missing, ...).
    pub fn restore_without_keys(bytes: &[u8], kv: KvStore) -> Result<StateMachine, SnapshotError> {
        let body = bytes
            .strip_prefix(MAGIC_KEYLESS)
            .ok_or(SnapshotError::BadMagic)?;
        let (image, rest): (Image, _) = postcard::take_from_bytes(body)?;
        let (alarms, rest): (Vec<(u64, AlarmKind)>, _) = postcard::take_from_bytes(rest)?;
        let (auth, owners): (AuthStore, Vec<(u64, String)>) = postcard::from_bytes(rest)?;
        if (image.revision, image.compacted) != (kv.revision(), kv.compacted_revision()) {
            return Err(SnapshotError::Invalid(format!(
                "the key space is at revision {} (compacted at {}), the rest of the state at {} (compacted at {})",
                kv.revision(),
                kv.compacted_revision(),
                image.revision,
                image.compacted
            )));
        }
        Self::assemble(image, kv, alarms, auth, owners)
    }

    fn assemble(
        image: Image,
        kv: KvStore,
        alarms: Vec<(u64, AlarmKind)>,
        auth: AuthStore,
        owners: Vec<(u64, String)>,
    ) -> Result<StateMachine, SnapshotError> {
        let sm = StateMachine {
            kv,
            leases: LeaseTable::from_leases(image.leases),
            sessions: SessionTable::from_sessions(image.sessions, image.nonces)
                .map_err(SnapshotError::Invalid)?,
            settings: image.settings,
            alarms: alarms.into_iter().collect(),
            auth,
            owners: owners.into_iter().collect(),
            applied_index: image.applied_index,
            cluster_time: image.cluster_time,
            ..StateMachine::default()
        };
        sm.validate().map_err(SnapshotError::Invalid)?;
        Ok(sm)
    }

    /// A 64-bit digest of the replicated state (FNV-1a over the snapshot bytes), for
    /// comparing replicas cheaply.
    pub fn state_hash(&self) -> u64 {
        self.snapshot()
            .unwrap_or_default()
            .iter()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
            })
    }
}
