//! Authentication, etcd's documented auth flow, and users and roles over HTTP/JSON.

use super::*;

// With auth on, a JSON client logs in at /v3/auth/authenticate and sends the token in
// `Authorization`, as with etcd's gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authenticate_over_http_json_gives_a_token_for_later_requests() {
    use oncekv_server::pb::etcdserverpb::AuthEnableRequest;
    use oncekv_server::pb::etcdserverpb::auth_client::AuthClient;

    let cluster = TestCluster::start(3, |c| c.bcrypt_cost = 4).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let base = cluster.endpoint(leader);
    let at = |path: &str| format!("{base}{path}");
    let (status, before) = post(&at("/v3/auth/status"), &json!({}), &[]);
    assert_eq!((status, before.get("enabled")), (200, None), "{before}");

    let mut auth = AuthClient::connect(base.clone()).await.unwrap();
    oncekv_testkit::auth::add_user_with_role(&mut auth, "root", "secret", "root")
        .await
        .unwrap();
    auth.auth_enable(AuthEnableRequest {}).await.unwrap();

    let (status, wrong) = post(
        &at("/v3/auth/authenticate"),
        &json!({"name": "root", "password": "nope"}),
        &[],
    );
    assert_eq!(status, 400, "{wrong}");
    assert!(
        wrong["message"]
            .as_str()
            .unwrap()
            .contains("authentication failed"),
        "{wrong}"
    );
    let (status, login) = post(
        &at("/v3/auth/authenticate"),
        &json!({"name": "root", "password": "secret"}),
        &[],
    );
    assert_eq!(status, 200, "{login}");
    let token = login["token"].as_str().unwrap().to_string();

    let put = json!({"key": b64("k"), "value": b64("v")});
    let (status, refused) = post(&at("/v3/kv/put"), &put, &[]);
    assert_ne!(status, 200, "a put without the token: {refused}");
    let (status, done) = post(
        &at("/v3/kv/put"),
        &put,
        &[format!("Authorization: {token}")],
    );
    assert_eq!(status, 200, "{done}");
    let (status, after) = post(
        &at("/v3/auth/status"),
        &json!({}),
        &[format!("Authorization: {token}")],
    );
    assert_eq!(
        (status, after["enabled"].as_bool()),
        (200, Some(true)),
        "{after}"
    );
}

// etcd's documented curl flow for auth (etcd.io, "gRPC gateway", authentication), word
// for word: add root, give it the root role, enable auth, log in, put with the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_documented_auth_flow_over_http_json() {
    let cluster = TestCluster::start(3, |c| c.bcrypt_cost = 4).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let base = cluster.endpoint((leader + 1) % 3);
    let at = |path: &str| format!("{base}{path}");
    let ok = |path: &str, body: Value, headers: &[String]| {
        let (status, v) = post(&at(path), &body, headers);
        assert_eq!(status, 200, "{path}: {v}");
        v
    };

    let added = ok(
        "/v3/auth/user/add",
        json!({"name": "root", "password": "pass"}),
        &[],
    );
    assert!(added["header"]["revision"].is_string(), "{added}");
    ok("/v3/auth/role/add", json!({"name": "root"}), &[]);
    ok(
        "/v3/auth/user/grant",
        json!({"user": "root", "role": "root"}),
        &[],
    );
    ok("/v3/auth/enable", json!({}), &[]);
    let login = ok(
        "/v3/auth/authenticate",
        json!({"name": "root", "password": "pass"}),
        &[],
    );
    let token = vec![format!(
        "Authorization: {}",
        login["token"].as_str().unwrap()
    )];

    let put = json!({"key": "Zm9v", "value": "YmFy"});
    let done = ok("/v3/kv/put", put.clone(), &token);
    assert!(done["header"]["revision"].is_string(), "{done}");
    // As etcd: no token is an anonymous request, refused for want of a user name.
    let (status, refused) = post(&at("/v3/kv/put"), &put, &[]);
    assert_eq!(
        (status, &refused["code"], &refused["error"]),
        (400, &json!(3), &json!("etcdserver: user name is empty")),
        "{refused}"
    );
    let (status, refused) = post(&at("/v3/auth/disable"), &json!({}), &[]);
    assert_ne!(status, 200, "disabling takes root: {refused}");

    ok("/v3/auth/disable", json!({}), &token);
    let after = ok("/v3/auth/status", json!({}), &[]);
    assert!(after.get("enabled").is_none(), "{after}");
    ok("/v3/kv/put", put, &[]);
    cluster.inner.shutdown().await;
}

// Users and roles as etcd's gateway writes them (field names, enum names, zero values
// left out), and its error codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_and_roles_over_http_json() {
    let cluster = TestCluster::start(3, |c| c.bcrypt_cost = 4).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let base = cluster.endpoint(leader);
    let at = |path: &str| format!("{base}{path}");
    let ok = |path: &str, body: Value, headers: &[String]| {
        let (status, v) = post(&at(path), &body, headers);
        assert_eq!(status, 200, "{path}: {v}");
        v
    };
    let refused = |path: &str, body: Value, headers: &[String]| {
        let (status, v) = post(&at(path), &body, headers);
        (status, v["code"].clone(), v["error"].clone())
    };

    for name in ["root", "bob"] {
        ok(
            "/v3/auth/user/add",
            json!({"name": name, "password": "pass"}),
            &[],
        );
    }
    assert_eq!(
        refused(
            "/v3/auth/user/add",
            json!({"name": "bob", "password": "pass"}),
            &[]
        ),
        (412, json!(9), json!("etcdserver: user name already exists"))
    );
    let (status, e) = post(
        &at("/v3/auth/user/add"),
        &json!({"name": "x", "password": 5}),
        &[],
    );
    assert_eq!((status, &e["code"]), (400, &json!(3)), "{e}");
    ok("/v3/auth/role/add", json!({"name": "root"}), &[]);
    ok("/v3/auth/role/add", json!({"name": "reader"}), &[]);
    for perm in [
        json!({"permType": "READ", "key": b64("a"), "range_end": b64("b")}),
        json!({"permType": "WRITE", "key": b64("c")}),
        json!({"permType": 2, "key": b64("d")}),
    ] {
        ok(
            "/v3/auth/role/grant",
            json!({"name": "reader", "perm": perm}),
            &[],
        );
    }
    let role = ok("/v3/auth/role/get", json!({"role": "reader"}), &[]);
    assert_eq!(
        role["perm"],
        json!([
            {"key": b64("a"), "range_end": b64("b")},
            {"permType": "WRITE", "key": b64("c")},
            {"permType": "READWRITE", "key": b64("d")},
        ]),
        "READ is the zero value, left out: {role}"
    );
    assert!(role["header"]["cluster_id"].is_string(), "{role}");
    assert_eq!(
        refused("/v3/auth/role/get", json!({"role": "nope"}), &[]),
        (412, json!(9), json!("etcdserver: role name not found"))
    );

    ok(
        "/v3/auth/user/grant",
        json!({"user": "bob", "role": "reader"}),
        &[],
    );
    let bob = ok("/v3/auth/user/get", json!({"name": "bob"}), &[]);
    assert_eq!(bob["roles"], json!(["reader"]), "{bob}");
    assert_eq!(
        refused("/v3/auth/user/get", json!({"name": "nobody"}), &[]),
        (412, json!(9), json!("etcdserver: user name not found"))
    );
    let users = ok("/v3/auth/user/list", json!({}), &[]);
    assert_eq!(users["users"], json!(["bob", "root"]), "{users}");
    let roles = ok("/v3/auth/role/list", json!({}), &[]);
    assert_eq!(roles["roles"], json!(["reader", "root"]), "{roles}");

    // A changed password, tried with auth on.
    ok(
        "/v3/auth/user/changepw",
        json!({"name": "bob", "password": "new"}),
        &[],
    );
    ok(
        "/v3/auth/user/grant",
        json!({"user": "root", "role": "root"}),
        &[],
    );
    ok("/v3/auth/enable", json!({}), &[]);
    let (status, _) = post(
        &at("/v3/auth/authenticate"),
        &json!({"name": "bob", "password": "pass"}),
        &[],
    );
    assert_eq!(status, 400, "the old password");
    let login = ok(
        "/v3/auth/authenticate",
        json!({"name": "bob", "password": "new"}),
        &[],
    );
    let bob_token = vec![format!(
        "Authorization: {}",
        login["token"].as_str().unwrap()
    )];
    let bob = ok("/v3/auth/user/get", json!({"name": "bob"}), &bob_token);
    assert_eq!(
        bob["roles"],
        json!(["reader"]),
        "a user reads its own roles"
    );
    let (status, _, _) = refused("/v3/auth/user/list", json!({}), &bob_token);
    assert_ne!(status, 200, "listing users takes root");
    let login = ok(
        "/v3/auth/authenticate",
        json!({"name": "root", "password": "pass"}),
        &[],
    );
    let root = vec![format!(
        "Authorization: {}",
        login["token"].as_str().unwrap()
    )];
    ok("/v3/auth/disable", json!({}), &root);

    ok(
        "/v3/auth/user/revoke",
        json!({"name": "bob", "role": "reader"}),
        &[],
    );
    let bob = ok("/v3/auth/user/get", json!({"name": "bob"}), &[]);
    assert!(bob.get("roles").is_none(), "{bob}");
    ok(
        "/v3/auth/role/revoke",
        json!({"role": "reader", "key": b64("a"), "range_end": b64("b")}),
        &[],
    );
    let role = ok("/v3/auth/role/get", json!({"role": "reader"}), &[]);
    assert_eq!(role["perm"].as_array().unwrap().len(), 2, "{role}");
    ok("/v3/auth/role/delete", json!({"role": "reader"}), &[]);
    let roles = ok("/v3/auth/role/list", json!({}), &[]);
    assert_eq!(roles["roles"], json!(["root"]), "{roles}");
    ok("/v3/auth/user/delete", json!({"name": "bob"}), &[]);
    let users = ok("/v3/auth/user/list", json!({}), &[]);
    assert_eq!(users["users"], json!(["root"]), "{users}");
    cluster.inner.shutdown().await;
}
