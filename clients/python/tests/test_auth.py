"""Sessions under etcd auth: a session belongs to the user whose token registered it, so
Register and KeepAlive must carry the caller's token. A cluster of its own: auth, once
enabled, would apply to every other test. With TLS, because python-etcd3 0.12 sends its
token as call credentials too, which grpcio refuses to send over an insecure channel (no
client certificate: the token alone says who the caller is)."""

import time

import etcd3.etcdrpc as etcdrpc
import etcd3.exceptions
import grpc
import pytest

import oncekv

from conftest import SESSION_TTL, Cluster, LossyProxy, _binary


def _enable_auth(channel):
    """A root user with password "pw", then auth on, as `etcdctl user add root` and
    `auth enable` would."""
    auth = etcdrpc.AuthStub(channel)
    auth.UserAdd(etcdrpc.AuthUserAddRequest(name="root", password="pw"), timeout=10)
    auth.UserGrantRole(etcdrpc.AuthUserGrantRoleRequest(user="root", role="root"), timeout=10)
    auth.AuthEnable(etcdrpc.AuthEnableRequest(), timeout=10)


@pytest.fixture(scope="module")
def auth_cluster():
    binary = _binary()
    if binary is None:
        pytest.skip("no oncekv binary: build it (cargo build -p oncekv) or set ONCEKV_BIN")
    c = Cluster(binary, tls=True)
    try:
        with open(c.ca_cert, "rb") as f:
            creds = grpc.ssl_channel_credentials(f.read())
        with grpc.secure_channel("%s:%d" % c.endpoints[0], creds) as ch:
            _enable_auth(ch)
        yield c
    finally:
        c.stop()


def test_session_is_registered_and_kept_alive_as_the_user(auth_cluster):
    c = oncekv.client(*auth_cluster.endpoints[0], ca_cert=auth_cluster.ca_cert,
                      user="root", password="pw", timeout=10)
    try:
        c.put("auth-key", "v1")
        time.sleep(SESSION_TTL * 2)  # only keep-alives sent with the token hold it
        c.put("auth-key", "v2")
        assert c.session.stats.registrations == 1
        assert c.session.stats.keepalives >= 2
        value, meta = c.get("auth-key")
        assert (value, meta.version) == (b"v2", 2)
    finally:
        c.close()


def test_anonymous_writes_are_refused_as_before(auth_cluster):
    c = oncekv.client(*auth_cluster.endpoints[0], ca_cert=auth_cluster.ca_cert, timeout=10)
    try:
        with pytest.raises((grpc.RpcError, etcd3.exceptions.Etcd3Exception)):
            c.put("auth-key", "anonymous")
    finally:
        c.close()


@pytest.fixture(scope="module")
def plain_auth_cluster():
    """A cluster of its own with auth on and no TLS, for plain grpcio stubs that send the
    token as metadata themselves (so a LossyProxy can read the HTTP/2 frames)."""
    binary = _binary()
    if binary is None:
        pytest.skip("no oncekv binary: build it (cargo build -p oncekv) or set ONCEKV_BIN")
    c = Cluster(binary)
    try:
        with grpc.insecure_channel("%s:%d" % c.endpoints[0]) as ch:
            _enable_auth(ch)
        yield c
    finally:
        c.stop()


def _token(channel, user, password):
    reply = etcdrpc.AuthStub(channel).Authenticate(
        etcdrpc.AuthenticateRequest(name=user, password=password), timeout=10)
    return (("token", reply.token),)


def test_a_refusal_after_a_lost_reply_leaves_the_outcome_unknown(plain_auth_cluster):
    # The put runs and its reply is lost; then an auth change makes the token stale, so
    # the retry is refused before the cluster looks at its seq. That refusal says nothing
    # about the first attempt: the caller must hear "unknown", not "refused".
    endpoint = plain_auth_cluster.endpoints[0]
    direct = grpc.insecure_channel("%s:%d" % endpoint)
    proxy = LossyProxy(endpoint)
    tracked = oncekv.intercept(grpc.insecure_channel("127.0.0.1:%d" % proxy.port))
    try:
        root = _token(direct, "root", "pw")
        kv = etcdrpc.KVStub(tracked)
        kv.Put(etcdrpc.PutRequest(key=b"lost-first", value=b"x"), timeout=10, metadata=root)
        key = b"lost-then-refused"

        def auth_change():
            etcdrpc.AuthStub(direct).RoleAdd(etcdrpc.AuthRoleAddRequest(name="other"),
                                             timeout=10, metadata=root)

        proxy.arm(on_swallow=auth_change)
        with pytest.raises(oncekv.OutcomeUnknown):
            kv.Put(etcdrpc.PutRequest(key=key, value=b"v"), timeout=20, metadata=root)
        assert proxy.swallowed == 1, "the proxy never lost a reply: the test proved nothing"
        fresh = _token(direct, "root", "pw")
        got = etcdrpc.KVStub(direct).Range(etcdrpc.RangeRequest(key=key), timeout=10, metadata=fresh)
        assert [item.version for item in got.kvs] == [1], "the put ran once"
    finally:
        tracked.close()
        proxy.close()
        direct.close()


def test_keep_alives_follow_the_token_of_the_latest_write(plain_auth_cluster):
    # An auth change makes the token the session was registered with stale. Once a write
    # goes through with a fresh token, the keep-alives must use that one, or the session
    # expires and the next write has to register again.
    endpoint = plain_auth_cluster.endpoints[0]
    direct = grpc.insecure_channel("%s:%d" % endpoint)
    tracked = oncekv.intercept(grpc.insecure_channel("%s:%d" % endpoint))
    try:
        first = _token(direct, "root", "pw")
        kv = etcdrpc.KVStub(tracked)
        kv.Put(etcdrpc.PutRequest(key=b"ka-1", value=b"x"), timeout=10, metadata=first)
        etcdrpc.AuthStub(direct).RoleAdd(etcdrpc.AuthRoleAddRequest(name="ka-other"),
                                         timeout=10, metadata=first)
        fresh = _token(direct, "root", "pw")
        kv.Put(etcdrpc.PutRequest(key=b"ka-2", value=b"x"), timeout=10, metadata=fresh)
        time.sleep(SESSION_TTL * 2)  # only keep-alives the cluster accepts hold it
        kv.Put(etcdrpc.PutRequest(key=b"ka-3", value=b"x"), timeout=10, metadata=fresh)
        assert tracked.session.stats.registrations == 1, "the session expired"
    finally:
        tracked.close()
        direct.close()
