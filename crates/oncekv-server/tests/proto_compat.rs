//! Wire-compatibility check of oncekv's hand-written etcd protos against a real etcd 3.4.
//!
//! Starts `etcd` on 127.0.0.1 (temp data dir, free ports) and talks to it with the
//! *generated clients from our own .proto files*. If a field number were wrong, etcd would
//! ignore the field or we would decode garbage, and the assertions below would fail.
//! Skipped (with a message) when `etcd` is not on PATH; `.ci/install-deps` installs it.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use oncekv_server::pb::etcdserverpb::{
    AlarmRequest, CompactionRequest, Compare, DeleteRangeRequest, HashKvRequest, LeaseGrantRequest,
    LeaseKeepAliveRequest, LeaseLeasesRequest, LeaseRevokeRequest, LeaseTimeToLiveRequest,
    MemberListRequest, PutRequest, RangeRequest, RequestOp, ResponseOp, StatusRequest, TxnRequest,
    alarm_request, cluster_client::ClusterClient, compare, kv_client::KvClient,
    lease_client::LeaseClient, maintenance_client::MaintenanceClient, range_request, request_op,
    response_op,
};
use tonic::transport::Channel;

/// A running etcd; killed (and its data dir removed) on drop.
struct Etcd {
    child: Child,
    dir: tempfile::TempDir,
    client_url: String,
    peer_url: String,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Etcd {
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local addr").port()
}

fn etcd_on_path() -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|p| p.join("etcd").is_file()))
}

fn start_etcd() -> Etcd {
    let dir = tempfile::tempdir().expect("temp dir");
    let (client_port, peer_port) = (free_port(), free_port());
    let client_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let log = std::fs::File::create(dir.path().join("etcd.log")).expect("etcd log file");
    let log_err = log.try_clone().expect("clone log file");
    let data_dir: &Path = &dir.path().join("data");
    let child = Command::new("etcd")
        .arg("--name=compat")
        .arg(format!("--data-dir={}", data_dir.display()))
        .arg(format!("--listen-client-urls={client_url}"))
        .arg(format!("--advertise-client-urls={client_url}"))
        .arg(format!("--listen-peer-urls={peer_url}"))
        .arg(format!("--initial-advertise-peer-urls={peer_url}"))
        .arg(format!("--initial-cluster=compat={peer_url}"))
        .arg("--initial-cluster-state=new")
        .arg("--logger=zap")
        .arg("--log-outputs=stderr")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .spawn()
        .expect("spawn etcd");
    Etcd {
        child,
        dir,
        client_url,
        peer_url,
    }
}

/// Connects and waits until etcd answers Status (it has elected itself leader).
async fn connect(etcd: &mut Etcd) -> Channel {
    for _ in 0..100 {
        if let Ok(Some(status)) = etcd.child.try_wait() {
            panic!("etcd exited early ({status}):\n{}", etcd.log());
        }
        if let Ok(channel) = Channel::from_shared(etcd.client_url.clone())
            .expect("valid url")
            .connect_timeout(Duration::from_secs(1))
            .timeout(Duration::from_secs(5))
            .connect()
            .await
        {
            let mut m = MaintenanceClient::new(channel.clone());
            if let Ok(r) = m.status(StatusRequest {}).await
                && r.get_ref().leader != 0
            {
                return channel;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("etcd did not become ready within 10 s:\n{}", etcd.log());
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn rev(header: Option<&oncekv_server::pb::etcdserverpb::ResponseHeader>) -> i64 {
    header.expect("response header").revision
}

fn put_op(key: &str, value: &str) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key: b(key),
            value: b(value),
            ..Default::default()
        })),
    }
}

fn range_op(key: &str) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(RangeRequest {
            key: b(key),
            ..Default::default()
        })),
    }
}

#[tokio::test]
async fn generated_clients_talk_to_real_etcd() {
    if !etcd_on_path() {
        println!("SKIPPED: etcd not installed (run .ci/install-deps)");
        return;
    }
    let mut etcd = start_etcd();
    let outcome = tokio::time::timeout(Duration::from_secs(60), async {
        let channel = connect(&mut etcd).await;
        exercise(&etcd, channel).await;
    })
    .await;
    if outcome.is_err() {
        panic!("compat test timed out:\n{}", etcd.log());
    }
}

async fn exercise(etcd: &Etcd, channel: Channel) {
    let mut kv = KvClient::new(channel.clone());
    let mut lease = LeaseClient::new(channel.clone());
    let mut cluster = ClusterClient::new(channel.clone());
    let mut maint = MaintenanceClient::new(channel);

    // ---- Maintenance.Status ----
    let st = maint
        .status(StatusRequest {})
        .await
        .expect("status")
        .into_inner();
    let h = st.header.expect("status header");
    assert_ne!(h.cluster_id, 0);
    assert_ne!(h.member_id, 0);
    assert!(h.raft_term >= 1, "{st:?}");
    assert!(st.version.starts_with("3."), "{st:?}");
    assert!(st.db_size > 0 && st.db_size_in_use > 0, "{st:?}");
    assert!(st.db_size_in_use <= st.db_size, "{st:?}");
    assert_eq!(st.leader, h.member_id, "single member is its own leader");
    assert!(st.raft_index > 0 && st.raft_applied_index > 0, "{st:?}");
    assert_eq!(st.raft_term, h.raft_term);
    assert!(st.errors.is_empty() && !st.is_learner, "{st:?}");
    let member_id = h.member_id;

    // ---- Cluster.MemberList ----
    let ml = cluster
        .member_list(MemberListRequest {})
        .await
        .expect("member list")
        .into_inner();
    assert_eq!(ml.header.as_ref().expect("header").member_id, member_id);
    assert_eq!(ml.members.len(), 1, "{ml:?}");
    let m = &ml.members[0];
    assert_eq!(m.id, member_id);
    assert_eq!(m.name, "compat");
    assert_eq!(m.peer_ur_ls, vec![etcd.peer_url.clone()]);
    assert_eq!(m.client_ur_ls, vec![etcd.client_url.clone()]);
    assert!(!m.is_learner);

    // ---- KV.Put ----
    let p1 = kv
        .put(PutRequest {
            key: b("compat/a"),
            value: b("1"),
            ..Default::default()
        })
        .await
        .expect("put")
        .into_inner();
    let r1 = rev(p1.header.as_ref());
    assert!(r1 > 0);
    assert!(p1.prev_kv.is_none());
    let p2 = kv
        .put(PutRequest {
            key: b("compat/a"),
            value: b("2"),
            prev_kv: true,
            ..Default::default()
        })
        .await
        .expect("put prev_kv")
        .into_inner();
    let r2 = rev(p2.header.as_ref());
    assert_eq!(r2, r1 + 1, "each put bumps the revision");
    let prev = p2.prev_kv.expect("prev_kv requested");
    assert_eq!(
        (prev.value, prev.version, prev.mod_revision),
        (b("1"), 1, r1)
    );
    for (k, v) in [("compat/b", "b"), ("compat/c", "c")] {
        kv.put(PutRequest {
            key: b(k),
            value: b(v),
            ..Default::default()
        })
        .await
        .expect("put");
    }
    let r4 = r2 + 2;

    // ---- KV.Range ----
    let one = kv
        .range(RangeRequest {
            key: b("compat/a"),
            ..Default::default()
        })
        .await
        .expect("range")
        .into_inner();
    assert_eq!(rev(one.header.as_ref()), r4);
    assert_eq!(one.count, 1);
    let a = &one.kvs[0];
    assert_eq!((a.key.clone(), a.value.clone()), (b("compat/a"), b("2")));
    assert_eq!(
        (a.create_revision, a.mod_revision, a.version, a.lease),
        (r1, r2, 2, 0)
    );

    let prefix = |limit, count_only, keys_only| RangeRequest {
        key: b("compat/"),
        range_end: b("compat0"),
        limit,
        count_only,
        keys_only,
        ..Default::default()
    };
    let all = kv
        .range(prefix(0, false, false))
        .await
        .expect("range prefix")
        .into_inner();
    let keys: Vec<Bytes> = all.kvs.iter().map(|kv| kv.key.clone()).collect();
    assert_eq!(keys, vec![b("compat/a"), b("compat/b"), b("compat/c")]);
    assert_eq!((all.count, all.more), (3, false));

    let limited = kv
        .range(prefix(2, false, false))
        .await
        .expect("range limit")
        .into_inner();
    assert_eq!(
        (limited.kvs.len(), limited.count, limited.more),
        (2, 3, true)
    );

    let counted = kv
        .range(prefix(0, true, false))
        .await
        .expect("count only")
        .into_inner();
    assert!(counted.kvs.is_empty());
    assert_eq!(counted.count, 3);

    let keys_only = kv
        .range(prefix(0, false, true))
        .await
        .expect("keys only")
        .into_inner();
    assert_eq!(keys_only.kvs.len(), 3);
    assert!(
        keys_only
            .kvs
            .iter()
            .all(|kv| kv.value.is_empty() && kv.version > 0)
    );

    let sorted = kv
        .range(RangeRequest {
            sort_order: range_request::SortOrder::Descend as i32,
            sort_target: range_request::SortTarget::Key as i32,
            serializable: true,
            ..prefix(0, false, false)
        })
        .await
        .expect("sorted range")
        .into_inner();
    assert_eq!(sorted.kvs[0].key, b("compat/c"));

    let filtered = kv
        .range(RangeRequest {
            min_mod_revision: r2 + 1,
            ..prefix(0, false, false)
        })
        .await
        .expect("filtered range")
        .into_inner();
    assert_eq!(
        filtered.kvs.len(),
        2,
        "a was last modified at r2: {filtered:?}"
    );
    let filtered = kv
        .range(RangeRequest {
            max_create_revision: r1,
            ..prefix(0, false, false)
        })
        .await
        .expect("filtered range")
        .into_inner();
    assert_eq!(filtered.kvs.len(), 1);

    let old = kv
        .range(RangeRequest {
            key: b("compat/a"),
            revision: r1,
            ..Default::default()
        })
        .await
        .expect("historic range")
        .into_inner();
    assert_eq!(old.kvs[0].value, b("1"));

    // ---- KV.Txn: compares of every target, nested txn ----
    let cmp = |target: compare::CompareTarget,
               result: compare::CompareResult,
               key: &str,
               tu: compare::TargetUnion| Compare {
        result: result as i32,
        target: target as i32,
        key: b(key),
        target_union: Some(tu),
        range_end: Bytes::new(),
    };
    use compare::{CompareResult as R, CompareTarget as T, TargetUnion as U};
    let nested = RequestOp {
        request: Some(request_op::Request::RequestTxn(TxnRequest {
            compare: vec![cmp(T::Value, R::Equal, "compat/b", U::Value(b("nope")))],
            success: vec![put_op("compat/never", "x")],
            failure: vec![range_op("compat/b")],
        })),
    };
    let txn = kv
        .txn(TxnRequest {
            compare: vec![
                cmp(T::Version, R::Equal, "compat/a", U::Version(2)),
                cmp(T::Create, R::Equal, "compat/a", U::CreateRevision(r1)),
                cmp(T::Mod, R::Less, "compat/a", U::ModRevision(r2 + 1)),
                cmp(T::Value, R::Equal, "compat/b", U::Value(b("b"))),
                cmp(T::Lease, R::Equal, "compat/c", U::Lease(0)),
                cmp(T::Version, R::NotEqual, "compat/missing", U::Version(1)),
                Compare {
                    range_end: b("compat0"),
                    ..cmp(T::Version, R::Greater, "compat/", U::Version(0))
                },
            ],
            success: vec![put_op("compat/d", "d"), range_op("compat/a"), nested],
            failure: vec![],
        })
        .await
        .expect("txn")
        .into_inner();
    assert!(txn.succeeded, "{txn:?}");
    let r5 = rev(txn.header.as_ref());
    assert_eq!(r5, r4 + 1, "a txn with a put is one revision");
    assert_eq!(txn.responses.len(), 3);
    match &txn.responses[0].response {
        Some(response_op::Response::ResponsePut(p)) => assert_eq!(rev(p.header.as_ref()), r5),
        other => panic!("expected a put response, got {other:?}"),
    }
    match &txn.responses[1].response {
        Some(response_op::Response::ResponseRange(r)) => assert_eq!(r.kvs[0].value, b("2")),
        other => panic!("expected a range response, got {other:?}"),
    }
    match &txn.responses[2].response {
        Some(response_op::Response::ResponseTxn(t)) => {
            assert!(!t.succeeded);
            match &t.responses[..] {
                [
                    ResponseOp {
                        response: Some(response_op::Response::ResponseRange(r)),
                    },
                ] => {
                    assert_eq!(r.kvs[0].value, b("b"));
                }
                other => panic!("expected the nested failure range, got {other:?}"),
            }
        }
        other => panic!("expected a nested txn response, got {other:?}"),
    }
    let failed = kv
        .txn(TxnRequest {
            compare: vec![cmp(
                T::Mod,
                R::Greater,
                "compat/a",
                U::ModRevision(1_000_000),
            )],
            success: vec![put_op("compat/never", "x")],
            failure: vec![range_op("compat/d")],
        })
        .await
        .expect("txn")
        .into_inner();
    assert!(!failed.succeeded);
    assert_eq!(
        rev(failed.header.as_ref()),
        r5,
        "a read-only branch does not bump the revision"
    );

    // ---- KV.DeleteRange ----
    let del = kv
        .delete_range(DeleteRangeRequest {
            key: b("compat/"),
            range_end: b("compat0"),
            prev_kv: true,
        })
        .await
        .expect("delete range")
        .into_inner();
    assert_eq!(del.deleted, 4);
    assert_eq!(del.prev_kvs.len(), 4);
    assert!(
        del.prev_kvs
            .iter()
            .any(|kv| kv.key == b("compat/d") && kv.value == b("d"))
    );
    let r6 = rev(del.header.as_ref());
    assert_eq!(r6, r5 + 1);

    // ---- Lease ----
    let g = lease
        .lease_grant(LeaseGrantRequest { ttl: 60, id: 0 })
        .await
        .expect("lease grant")
        .into_inner();
    assert!(g.id > 0 && g.ttl == 60 && g.error.is_empty(), "{g:?}");
    let chosen_id = 0x0123_4567_89ab;
    let g2 = lease
        .lease_grant(LeaseGrantRequest {
            ttl: 30,
            id: chosen_id,
        })
        .await
        .expect("lease grant with id")
        .into_inner();
    assert_eq!((g2.id, g2.ttl), (chosen_id, 30));
    let dup = lease
        .lease_grant(LeaseGrantRequest {
            ttl: 30,
            id: chosen_id,
        })
        .await
        .expect_err("granting an existing lease id fails");
    println!(
        "etcd duplicate LeaseGrant: {:?} {:?}",
        dup.code(),
        dup.message()
    );
    assert_eq!(dup.code(), tonic::Code::FailedPrecondition);

    kv.put(PutRequest {
        key: b("compat/leased"),
        value: b("v"),
        lease: g.id,
        ..Default::default()
    })
    .await
    .expect("put with lease");
    let ttl = lease
        .lease_time_to_live(LeaseTimeToLiveRequest {
            id: g.id,
            keys: true,
        })
        .await
        .expect("time to live")
        .into_inner();
    assert_eq!((ttl.id, ttl.granted_ttl), (g.id, 60));
    assert!(ttl.ttl > 0 && ttl.ttl <= 60, "{ttl:?}");
    assert_eq!(ttl.keys, vec![b("compat/leased")]);

    let leases = lease
        .lease_leases(LeaseLeasesRequest {})
        .await
        .expect("leases")
        .into_inner();
    let mut ids: Vec<i64> = leases.leases.iter().map(|l| l.id).collect();
    ids.sort_unstable();
    let mut want = vec![g.id, chosen_id];
    want.sort_unstable();
    assert_eq!(ids, want);

    // etcd (grpc-go) sends the response headers only with the first response, so the
    // first request must be queued before the call can complete.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(LeaseKeepAliveRequest { id: g.id })
        .await
        .expect("queue keep-alive");
    let mut responses = lease
        .lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("keep-alive stream")
        .into_inner();
    for round in 0..2 {
        if round > 0 {
            tx.send(LeaseKeepAliveRequest { id: g.id })
                .await
                .expect("send keep-alive");
        }
        let ka = responses
            .message()
            .await
            .expect("keep-alive response")
            .expect("not closed");
        assert_eq!((ka.id, ka.ttl), (g.id, 60), "{ka:?}");
        assert_ne!(ka.header.expect("header").revision, 0);
    }
    drop(tx);

    let revoked = lease
        .lease_revoke(LeaseRevokeRequest { id: g.id })
        .await
        .expect("revoke")
        .into_inner();
    assert!(
        rev(revoked.header.as_ref()) > r6,
        "revoking deletes the attached key"
    );
    let gone = lease
        .lease_time_to_live(LeaseTimeToLiveRequest {
            id: g.id,
            keys: false,
        })
        .await
        .expect("time to live of a revoked lease")
        .into_inner();
    assert_eq!(gone.ttl, -1);
    let leased = kv
        .range(RangeRequest {
            key: b("compat/leased"),
            ..Default::default()
        })
        .await
        .expect("range")
        .into_inner();
    assert_eq!(leased.count, 0);
    let missing = lease
        .lease_revoke(LeaseRevokeRequest { id: g.id })
        .await
        .expect_err("revoking an unknown lease fails");
    println!(
        "etcd unknown LeaseRevoke: {:?} {:?}",
        missing.code(),
        missing.message()
    );
    assert_eq!(missing.code(), tonic::Code::NotFound);

    // ---- Errors etcd reports, for reference ----
    let too_many = kv
        .txn(TxnRequest {
            success: (0..129)
                .map(|i| put_op(&format!("compat/t{i}"), "x"))
                .collect(),
            ..Default::default()
        })
        .await
        .expect_err("more than 128 txn ops fails");
    println!(
        "etcd 129 txn ops: {:?} {:?}",
        too_many.code(),
        too_many.message()
    );
    assert_eq!(too_many.code(), tonic::Code::InvalidArgument);
    let no_key = kv
        .put(PutRequest {
            key: Bytes::new(),
            value: b("x"),
            ..Default::default()
        })
        .await
        .expect_err("an empty key fails");
    println!("etcd empty key: {:?} {:?}", no_key.code(), no_key.message());
    assert_eq!(no_key.code(), tonic::Code::InvalidArgument);

    // ---- Compact, then an old revision is gone ----
    kv.compact(CompactionRequest {
        revision: r5,
        physical: true,
    })
    .await
    .expect("compact");
    let compacted = kv
        .range(RangeRequest {
            key: b("compat/a"),
            revision: r1,
            ..Default::default()
        })
        .await
        .expect_err("reading a compacted revision fails");
    println!(
        "etcd compacted read: {:?} {:?}",
        compacted.code(),
        compacted.message()
    );
    assert_eq!(compacted.code(), tonic::Code::OutOfRange);

    // ---- The remaining Maintenance messages ----
    let alarms = maint.alarm(AlarmRequest {
        action: alarm_request::AlarmAction::Get as i32,
        member_id: 0,
        alarm: 0,
    });
    assert!(
        alarms
            .await
            .expect("alarm list")
            .into_inner()
            .alarms
            .is_empty()
    );
    let hkv = maint
        .hash_kv(HashKvRequest { revision: 0 })
        .await
        .expect("hash kv")
        .into_inner();
    assert_ne!(hkv.hash, 0);
    assert_eq!(hkv.compact_revision, r5);
    let st2 = maint
        .status(StatusRequest {})
        .await
        .expect("status")
        .into_inner();
    assert!(st2.raft_index > st.raft_index);
    assert!(rev(st2.header.as_ref()) > r6);
}
