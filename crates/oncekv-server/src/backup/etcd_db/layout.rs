//! etcd 3.4's database as both directions read it: the bucket names, how a revision is
//! spelled as a `key` bucket key, etcd's lease record, and the checksum that tells whether
//! etcd has written to a copy since oncekv wrote it.

use crate::backup::bbolt::Buckets;

pub(super) const KEY: &[u8] = b"key";
pub(super) const META: &[u8] = b"meta";
pub(super) const LEASE: &[u8] = b"lease";
pub(super) const AUTH: &[u8] = b"auth";
pub(super) const AUTH_USERS: &[u8] = b"authUsers";
pub(super) const AUTH_ROLES: &[u8] = b"authRoles";
pub(super) const ALARM: &[u8] = b"alarm";
pub(super) const MEMBERS: &[u8] = b"members";
pub(super) const MEMBERS_REMOVED: &[u8] = b"members_removed";
pub(super) const CLUSTER: &[u8] = b"cluster";
pub(super) const ONCEKV: &[u8] = b"oncekv";

/// The buckets whose content an etcd member changes as it serves: the `oncekv` bucket's
/// image is current only while these are as written.
const VIEW: [&[u8]; 6] = [ALARM, AUTH, AUTH_ROLES, AUTH_USERS, KEY, LEASE];
pub(super) const VIEW_SUM: &[u8] = b"etcd-view-crc32";
/// Chunks of a whole snapshot file (copies written before [`STATE_PREFIX`]).
pub(super) const IMAGE_PREFIX: &[u8] = b"image/";
/// Chunks of a snapshot file without the key space.
pub(super) const STATE_PREFIX: &[u8] = b"state/";
/// Chunks of the image, so that no value needs one huge run of pages.
pub(super) const CHUNK: usize = 1 << 20;

/// etcd's `leasepb.Lease` (etcd's server-side proto, not part of its API).
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct LeaseRecord {
    #[prost(int64, tag = "1")]
    pub(super) id: i64,
    #[prost(int64, tag = "2")]
    pub(super) ttl: i64,
    #[prost(int64, tag = "3")]
    pub(super) remaining_ttl: i64,
}

pub(super) fn rev_bytes(main: i64, sub: i64, tombstone: bool) -> Vec<u8> {
    let mut k = Vec::with_capacity(18);
    k.extend_from_slice(&(main as u64).to_be_bytes());
    k.push(b'_');
    k.extend_from_slice(&(sub as u64).to_be_bytes());
    if tombstone {
        k.push(b't');
    }
    k
}

/// `(main, sub, tombstone)` of a `key` bucket key.
pub(super) fn parse_rev(k: &[u8]) -> Option<(i64, i64, bool)> {
    let tombstone = match k.len() {
        17 => false,
        18 if k[17] == b't' => true,
        _ => return None,
    };
    if k[8] != b'_' {
        return None;
    }
    let main = u64::from_be_bytes(k[0..8].try_into().ok()?) as i64;
    let sub = u64::from_be_bytes(k[9..17].try_into().ok()?) as i64;
    Some((main, sub, tombstone))
}

/// CRC-32 of the [`VIEW`] buckets, lengths included (so that moving a byte from a key to
/// its value changes it), fed bucket by bucket in [`VIEW`]'s order.
pub(super) struct ViewSum(crc32fast::Hasher);

impl ViewSum {
    pub(super) fn new() -> ViewSum {
        ViewSum(crc32fast::Hasher::new())
    }

    pub(super) fn bucket(&mut self, name: &[u8]) {
        self.0.update(&(name.len() as u64).to_be_bytes());
        self.0.update(name);
    }

    pub(super) fn pair(&mut self, k: &[u8], v: &[u8]) {
        self.0.update(&(k.len() as u64).to_be_bytes());
        self.0.update(k);
        self.0.update(&(v.len() as u64).to_be_bytes());
        self.0.update(v);
    }

    pub(super) fn finish(self) -> u32 {
        self.0.finalize()
    }
}

/// The [`ViewSum`] of `buckets` as read.
pub(super) fn view_sum(buckets: &Buckets) -> u32 {
    let mut h = ViewSum::new();
    for name in VIEW {
        h.bucket(name);
        for (k, v) in bucket(buckets, name) {
            h.pair(k, v);
        }
    }
    h.finish()
}

/// The pairs of the bucket `name`, in key order; none if the database has no such bucket.
pub(super) fn bucket<'a>(buckets: &'a Buckets, name: &[u8]) -> &'a [(Vec<u8>, Vec<u8>)] {
    buckets.get(name).map_or(&[][..], |b| &b[..])
}
