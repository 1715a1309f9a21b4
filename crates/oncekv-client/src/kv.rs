//! The KV calls: put, range/get, delete, txn, compact.

use bytes::Bytes;
use oncekv_core::KeyValue;
use oncekv_proto::etcdserverpb::CompactionRequest;
use oncekv_proto::etcdserverpb::kv_client::KvClient;

use crate::client::{Client, Kind};
use crate::error::Error;
use crate::options::{Compare, DeleteOptions, GetOptions, PutOptions, TxnOp, txn_request};
use crate::responses::{CompactResponse, DeleteResponse, PutResponse, RangeResponse, TxnResponse};

fn bytes(b: impl Into<Vec<u8>>) -> Bytes {
    Bytes::from(b.into())
}

impl Client {
    /// Sets `key` to `value`. Exactly once: however often it is retried, the key's
    /// `version` goes up by one.
    pub async fn put(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
    ) -> Result<PutResponse, Error> {
        self.put_with(key, value, PutOptions::new()).await
    }

    /// [`put`](Client::put) with a lease, `prev_kv`, `ignore_value` or `ignore_lease`.
    pub async fn put_with(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        options: PutOptions,
    ) -> Result<PutResponse, Error> {
        let req = options.request(bytes(key), bytes(value));
        self.call(Kind::Write, "put", req, |ch, r| async move {
            Ok(KvClient::new(ch).put(r).await?.into_inner())
        })
        .await
        .map(PutResponse::from)
    }

    /// The key's current key-value, or `None` if it does not exist. Linearizable.
    pub async fn get(&self, key: impl Into<Vec<u8>>) -> Result<Option<KeyValue>, Error> {
        let resp = self.range(key, GetOptions::new()).await?;
        Ok(resp.kvs.into_iter().next())
    }

    /// Reads the keys `options` select starting at `key` (a prefix, from the key on, up
    /// to a range end), with limit, keys-only, count-only, sorting and serializable reads.
    pub async fn range(
        &self,
        key: impl Into<Vec<u8>>,
        options: GetOptions,
    ) -> Result<RangeResponse, Error> {
        let req = options.request(bytes(key));
        self.call(Kind::Read, "range", req, |ch, r| async move {
            Ok(KvClient::new(ch).range(r).await?.into_inner())
        })
        .await
        .map(RangeResponse::from)
    }

    /// Deletes `key`. Exactly once: a retry answers what the first delete answered.
    pub async fn delete(&self, key: impl Into<Vec<u8>>) -> Result<DeleteResponse, Error> {
        self.delete_with(key, DeleteOptions::new()).await
    }

    /// Deletes the keys `options` select starting at `key` (a prefix, from the key on, up
    /// to a range end), optionally returning them.
    pub async fn delete_with(
        &self,
        key: impl Into<Vec<u8>>,
        options: DeleteOptions,
    ) -> Result<DeleteResponse, Error> {
        let req = options.request(bytes(key));
        self.call(Kind::Write, "delete", req, |ch, r| async move {
            Ok(KvClient::new(ch).delete_range(r).await?.into_inner())
        })
        .await
        .map(DeleteResponse::from)
    }

    /// Runs `success` if every compare holds, else `failure`, atomically. Exactly once:
    /// a retry answers with the first execution's branch and results.
    pub async fn txn(
        &self,
        compares: Vec<Compare>,
        success: Vec<TxnOp>,
        failure: Vec<TxnOp>,
    ) -> Result<TxnResponse, Error> {
        let req = txn_request(&compares, &success, &failure);
        self.call(Kind::Write, "txn", req, |ch, r| async move {
            Ok(KvClient::new(ch).txn(r).await?.into_inner())
        })
        .await
        .map(TxnResponse::from)
    }

    /// Discards history below `revision`: reads at older revisions, and watches starting
    /// before it, are refused as compacted from then on. `physical`: answer only once the
    /// compaction has been applied (etcd's `--physical`).
    ///
    /// Refused (an [`Error::Rejected`] with code `OutOfRange`, as etcd) when `revision` is
    /// at or below the last compaction or above the current revision. Exactly once, like
    /// every write: a retry after a lost reply gets the first answer back, not a
    /// "compacted" refusal caused by its own first attempt.
    pub async fn compact(&self, revision: i64, physical: bool) -> Result<CompactResponse, Error> {
        let req = CompactionRequest { revision, physical };
        self.call(Kind::Write, "compact", req, |ch, r| async move {
            Ok(KvClient::new(ch).compact(r).await?.into_inner())
        })
        .await
        .map(CompactResponse::from)
    }
}
