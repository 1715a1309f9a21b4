//! The four request metadata keys that make a write exactly-once, written by the client
//! and read by the server with the same code; and etcd's require-leader key.

use oncekv_core::Secret;
use tonic::metadata::{AsciiMetadataValue, MetadataMap, MetadataValue};

/// The session's client id (decimal).
pub const CLIENT_ID_KEY: &str = "oncekv-client-id";
/// The session secret (32 lower-case hex digits).
pub const SECRET_KEY: &str = "oncekv-session-secret";
/// The request's sequence number (decimal, from 1); a retry sends the same one.
pub const SEQ_KEY: &str = "oncekv-seq";
/// The smallest seq the client has no answer for (decimal, from 1).
pub const FIRST_INCOMPLETE_KEY: &str = "oncekv-first-incomplete";

/// etcd's `rpctypes.MetadataRequireLeaderKey`, with [`REQUIRE_LEADER_VALUE`]: etcdctl and
/// etcd's clients set it on watch streams, and a member without a leader refuses such a
/// stream, or ends it, rather than serve a view that may be cut off from the cluster.
pub const REQUIRE_LEADER_KEY: &str = "hasleader";
pub const REQUIRE_LEADER_VALUE: &str = "true";

/// The session fields of a tracked request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionMeta {
    pub client_id: u64,
    pub secret: Secret,
    pub seq: u64,
    pub first_incomplete: u64,
}

/// Why a request's session metadata cannot be read. A request with partial session
/// metadata is refused, never silently run untracked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    #[error("oncekv: session metadata is missing {0}")]
    Missing(&'static str),
    #[error("oncekv: {0} is not ASCII")]
    NotAscii(&'static str),
    #[error("oncekv: {0} is not a number")]
    NotANumber(&'static str),
    #[error("oncekv: {SECRET_KEY} must be 32 hex digits")]
    BadSecret,
    #[error("oncekv: seq and first-incomplete start at 1")]
    Zero,
}

/// `secret` as the value of [`SECRET_KEY`] (a client computes it once per session).
pub fn secret_value(secret: &Secret) -> AsciiMetadataValue {
    // Hex digits are always valid metadata; the fallback is unreachable but harmless.
    secret
        .to_hex()
        .parse()
        .unwrap_or_else(|_| AsciiMetadataValue::from_static("0"))
}

/// Writes a tracked request's session fields; `secret` is [`secret_value`]'s.
pub fn attach(
    md: &mut MetadataMap,
    client_id: u64,
    secret: &AsciiMetadataValue,
    seq: u64,
    first_incomplete: u64,
) {
    md.insert(CLIENT_ID_KEY, MetadataValue::from(client_id));
    md.insert(SECRET_KEY, secret.clone());
    md.insert(SEQ_KEY, MetadataValue::from(seq));
    md.insert(FIRST_INCOMPLETE_KEY, MetadataValue::from(first_incomplete));
}

impl SessionMeta {
    /// Writes these fields into `md`.
    pub fn attach(&self, md: &mut MetadataMap) {
        attach(
            md,
            self.client_id,
            &secret_value(&self.secret),
            self.seq,
            self.first_incomplete,
        );
    }

    /// `Ok(None)` when the request carries no session (an etcd client).
    pub fn from_metadata(md: &MetadataMap) -> Result<Option<SessionMeta>, MetadataError> {
        let keys = [CLIENT_ID_KEY, SECRET_KEY, SEQ_KEY, FIRST_INCOMPLETE_KEY];
        if !keys.iter().any(|k| md.contains_key(*k)) {
            return Ok(None);
        }
        let get = |key: &'static str| -> Result<&str, MetadataError> {
            md.get(key)
                .ok_or(MetadataError::Missing(key))?
                .to_str()
                .map_err(|_| MetadataError::NotAscii(key))
        };
        let number = |key: &'static str| -> Result<u64, MetadataError> {
            get(key)?
                .parse()
                .map_err(|_| MetadataError::NotANumber(key))
        };
        let secret = Secret::from_hex(get(SECRET_KEY)?).ok_or(MetadataError::BadSecret)?;
        let meta = SessionMeta {
            client_id: number(CLIENT_ID_KEY)?,
            secret,
            seq: number(SEQ_KEY)?,
            first_incomplete: number(FIRST_INCOMPLETE_KEY)?,
        };
        if meta.seq == 0 || meta.first_incomplete == 0 {
            return Err(MetadataError::Zero);
        }
        Ok(Some(meta))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Client and server share this code; a round trip is the wire contract.
    #[test]
    fn attached_fields_read_back() {
        let meta = SessionMeta {
            client_id: 7,
            secret: Secret::from_u128(0xabcdef),
            seq: 3,
            first_incomplete: 2,
        };
        let mut md = MetadataMap::new();
        meta.attach(&mut md);
        assert_eq!(SessionMeta::from_metadata(&md), Ok(Some(meta)));
    }

    // A half-sent session must never turn a write into an untracked (at-least-once) one.
    #[test]
    fn partial_or_malformed_metadata_is_refused() {
        assert_eq!(SessionMeta::from_metadata(&MetadataMap::new()), Ok(None));
        let mut md = MetadataMap::new();
        md.insert(SEQ_KEY, MetadataValue::from(1u64));
        assert_eq!(
            SessionMeta::from_metadata(&md),
            Err(MetadataError::Missing(SECRET_KEY))
        );
        let meta = SessionMeta {
            client_id: 1,
            secret: Secret::default(),
            seq: 0,
            first_incomplete: 1,
        };
        let mut md = MetadataMap::new();
        meta.attach(&mut md);
        assert_eq!(SessionMeta::from_metadata(&md), Err(MetadataError::Zero));
        md.insert(SECRET_KEY, AsciiMetadataValue::from_static("xyz"));
        assert_eq!(
            SessionMeta::from_metadata(&md),
            Err(MetadataError::BadSecret)
        );
    }
}
