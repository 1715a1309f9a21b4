//! etcd's KV service, relayed: reads retried, writes tracked (put, delete, compact, and
//! any txn with a put or delete in it), keys moved under `--namespace`.

use std::sync::Arc;

use oncekv_client::CallKind;
use oncekv_proto::etcdserverpb::kv_client::KvClient;
use oncekv_proto::etcdserverpb::kv_server::Kv;
use oncekv_proto::etcdserverpb::*;
use tonic::{Request, Response, Status};

use crate::namespace::{Namespace, txn_writes};
use crate::upstream::Upstream;

#[derive(Debug)]
pub(crate) struct KvProxy {
    pub(crate) up: Arc<Upstream>,
    pub(crate) ns: Namespace,
}

#[tonic::async_trait]
impl Kv for KvProxy {
    async fn range(
        &self,
        request: Request<RangeRequest>,
    ) -> Result<Response<RangeResponse>, Status> {
        let client = self.up.client_for(&request)?;
        let mut req = request.into_inner();
        self.ns.range(&mut req.key, &mut req.range_end);
        let mut resp = self
            .up
            .call(client, CallKind::Read, "range", req, |ch, r| async move {
                Ok(KvClient::new(ch).range(r).await?.into_inner())
            })
            .await?;
        resp.kvs.iter_mut().for_each(|kv| self.ns.strip_kv(kv));
        Ok(Response::new(resp))
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let client = self.up.client_for(&request)?;
        let mut req = request.into_inner();
        self.ns.range(&mut req.key, &mut Default::default());
        let mut resp = self
            .up
            .call(client, CallKind::Write, "put", req, |ch, r| async move {
                Ok(KvClient::new(ch).put(r).await?.into_inner())
            })
            .await?;
        resp.prev_kv.iter_mut().for_each(|kv| self.ns.strip_kv(kv));
        Ok(Response::new(resp))
    }

    async fn delete_range(
        &self,
        request: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        let client = self.up.client_for(&request)?;
        let mut req = request.into_inner();
        self.ns.range(&mut req.key, &mut req.range_end);
        let mut resp = self
            .up
            .call(client, CallKind::Write, "delete", req, |ch, r| async move {
                Ok(KvClient::new(ch).delete_range(r).await?.into_inner())
            })
            .await?;
        resp.prev_kvs.iter_mut().for_each(|kv| self.ns.strip_kv(kv));
        Ok(Response::new(resp))
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let client = self.up.client_for(&request)?;
        let mut req = request.into_inner();
        self.ns.txn(&mut req);
        // A read-only txn needs no seq: retrying it is harmless, and it leaves the
        // session's window to the writes.
        let kind = if txn_writes(&req) {
            CallKind::Write
        } else {
            CallKind::Read
        };
        let mut resp = self
            .up
            .call(client, kind, "txn", req, |ch, r| async move {
                Ok(KvClient::new(ch).txn(r).await?.into_inner())
            })
            .await?;
        self.ns.strip_txn(&mut resp);
        Ok(Response::new(resp))
    }

    async fn compact(
        &self,
        request: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        crate::relay::relay!(self, request, CallKind::Write, "compact", KvClient::compact)
    }
}
