//! A member serving TLS frees its ports when it stops: restarted in the same process on
//! the same ports (TLS handshakes run in a task of their own, which must let the listener
//! go), it serves again over TLS.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use oncekv_client::{Client, ClientConfig, ClientTlsOptions};
use oncekv_server::tls::DevPki;
use oncekv_testkit::local_cluster::TempCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_member_restarts_on_its_ports() {
    let pki_dir = tempfile::tempdir().unwrap();
    let pki = DevPki::create(pki_dir.path(), &[]).unwrap();
    let (client_tls, _) = pki.member_tls(false);
    let mut cluster = TempCluster::start(1, |c| c.client_tls = Some(client_tls.clone())).await;
    cluster.wait_leader(Duration::from_secs(10)).await;
    let url = format!("https://{}", cluster.configs[0].client_addr);
    let config = ClientConfig {
        tls: Some(ClientTlsOptions {
            ca_file: Some(pki.ca_file.clone()),
            ..ClientTlsOptions::default()
        }),
        ..ClientConfig::default()
    };
    Client::connect([url.clone()], config.clone())
        .unwrap()
        .put("k", "1")
        .await
        .unwrap();
    cluster.stop(0).await;
    cluster.restart(0).await;
    cluster.wait_leader(Duration::from_secs(10)).await;
    let got = Client::connect([url], config)
        .unwrap()
        .get("k")
        .await
        .unwrap();
    assert_eq!(got.unwrap().value.as_ref(), b"1");
}
