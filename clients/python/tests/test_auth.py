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

from conftest import SESSION_TTL, Cluster, _binary


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
            auth = etcdrpc.AuthStub(ch)
            auth.UserAdd(etcdrpc.AuthUserAddRequest(name="root", password="pw"), timeout=10)
            auth.UserGrantRole(etcdrpc.AuthUserGrantRoleRequest(user="root", role="root"), timeout=10)
            auth.AuthEnable(etcdrpc.AuthEnableRequest(), timeout=10)
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
