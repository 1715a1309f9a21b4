//! A real cluster on loopback sockets for integration tests: members can be stopped and
//! restarted from their data directories.
#![allow(dead_code, clippy::unwrap_used)]

use std::time::Duration;

use oncekv_server::pb::etcdserverpb::kv_client::KvClient;
use oncekv_server::pb::etcdserverpb::{PutRequest, RangeRequest};
use tonic::transport::Channel;

pub use oncekv_testkit::local_cluster::TempCluster as TestCluster;

pub async fn put(kv: &mut KvClient<Channel>, key: &str, value: &str) -> Result<i64, tonic::Status> {
    let resp = kv
        .put(PutRequest {
            key: key.as_bytes().to_vec().into(),
            value: value.as_bytes().to_vec().into(),
            ..Default::default()
        })
        .await?;
    Ok(resp.into_inner().header.map_or(0, |h| h.revision))
}

/// A linearizable get: `(value, version)` or `None` if the key does not exist. Retries
/// `Unavailable` (no leader yet, or leadership being confirmed) as etcd clients do; a read
/// is safe to repeat.
pub async fn get(
    kv: &mut KvClient<Channel>,
    key: &str,
) -> Result<Option<(String, i64)>, tonic::Status> {
    let req = RangeRequest {
        key: key.as_bytes().to_vec().into(),
        ..Default::default()
    };
    let mut attempts = 0;
    let resp = loop {
        match kv.range(req.clone()).await {
            Err(s) if s.code() == tonic::Code::Unavailable && attempts < 50 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => break other?,
        }
    };
    Ok(resp
        .into_inner()
        .kvs
        .first()
        .map(|kv| (String::from_utf8_lossy(&kv.value).into_owned(), kv.version)))
}

/// A request carrying oncekv session metadata (what the oncekv client sends), for `seq`.
pub fn tracked<T>(session: &(u64, String), seq: u64, message: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    let md = req.metadata_mut();
    md.insert("oncekv-client-id", session.0.to_string().parse().unwrap());
    md.insert("oncekv-session-secret", session.1.parse().unwrap());
    md.insert("oncekv-seq", seq.to_string().parse().unwrap());
    md.insert("oncekv-first-incomplete", "1".parse().unwrap());
    req
}

pub async fn register(endpoint: &str) -> (u64, String) {
    use oncekv_server::pb::oncekv::RegisterRequest;
    use oncekv_server::pb::oncekv::session_client::SessionClient;
    let mut s = SessionClient::connect(endpoint.to_string()).await.unwrap();
    let r = s
        .register(RegisterRequest::default())
        .await
        .unwrap()
        .into_inner();
    let secret = r.secret.iter().map(|b| format!("{b:02x}")).collect();
    (r.client_id, secret)
}
