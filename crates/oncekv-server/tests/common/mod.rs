//! A real cluster on loopback sockets for integration tests: members can be stopped and
//! restarted from their data directories.
#![allow(dead_code, clippy::unwrap_used)]

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use oncekv_server::local_cluster::LocalCluster;
use oncekv_server::pb::etcdserverpb::kv_client::KvClient;
use oncekv_server::pb::etcdserverpb::{PutRequest, RangeRequest};
use oncekv_server::{Node, NodeConfig};
use tonic::transport::Channel;

/// A [`LocalCluster`] in a temporary directory, with test-friendly timings, whose waits
/// fail the test instead of returning.
pub struct TestCluster {
    pub dir: tempfile::TempDir,
    pub inner: LocalCluster,
}

impl Deref for TestCluster {
    type Target = LocalCluster;
    fn deref(&self) -> &LocalCluster {
        &self.inner
    }
}

impl DerefMut for TestCluster {
    fn deref_mut(&mut self) -> &mut LocalCluster {
        &mut self.inner
    }
}

impl TestCluster {
    /// Starts `n` members with fast elections; `tweak` adjusts every member's config.
    pub async fn start(n: usize, tweak: impl Fn(&mut NodeConfig)) -> TestCluster {
        let dir = tempfile::tempdir().unwrap();
        let inner = LocalCluster::start(n, dir.path(), |c| {
            LocalCluster::fast_timings(c);
            tweak(c)
        })
        .await
        .unwrap();
        TestCluster { dir, inner }
    }

    pub fn node(&self, i: usize) -> &Node {
        self.inner.get(i).expect("member is running")
    }

    pub async fn restart(&mut self, i: usize) {
        assert!(self.inner.get(i).is_none(), "member {i} is still running");
        self.inner.restart(i).await.unwrap();
    }

    /// Waits for a leader among the running members that they all agree on.
    pub async fn wait_leader(&self, timeout: Duration) -> usize {
        self.inner.wait_leader(timeout).await.unwrap_or_else(|| {
            let leaders: Vec<_> = self.running().map(|(_, n)| n.core.leader()).collect();
            panic!("no agreed leader within {timeout:?}: {leaders:?}")
        })
    }

    /// Waits until every running member has applied at least `index`.
    pub async fn wait_applied(&self, index: u64, timeout: Duration) {
        if !self.inner.wait_applied(index, timeout).await {
            let applied: Vec<u64> = self
                .running()
                .map(|(_, n)| n.core.applied.read().sm.applied_index())
                .collect();
            panic!("not applied to {index} within {timeout:?}: {applied:?}");
        }
    }

    pub async fn kv(&self, i: usize) -> KvClient<Channel> {
        KvClient::connect(self.endpoint(i)).await.unwrap()
    }
}

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
