"""python-etcd3 (0.12) on an oncekv session. Imported only when asked for: etcd3 is an
optional dependency."""

import etcd3
import etcd3.etcdrpc as etcdrpc

from .channel import SessionChannel

SESSION_OPTIONS = ("attempt_timeout", "max_attempt_timeout", "budget", "keepalive")

# gRPC pings a connection that has been quiet this long and drops it if no answer comes:
# a retry must not wait on a connection that is open but silent (a peer gone mid-call).
_KEEPALIVE_OPTIONS = [
    ("grpc.keepalive_time_ms", 10000),
    ("grpc.keepalive_timeout_ms", 5000),
]


class Etcd3Client(etcd3.Etcd3Client):
    """An etcd3.Etcd3Client whose unary calls go through an oncekv session.

    Etcd3Client.__init__ makes its channel (and authenticates on it, untracked) and builds
    its stubs; here the channel is wrapped afterwards and the unary stubs are built again
    on the wrapped one. The watcher keeps the plain channel: watches are streams, never
    tracked.
    """

    def __init__(self, host="localhost", port=2379, session_options=None, **kwargs):
        if kwargs.get("grpc_options") is None:
            kwargs["grpc_options"] = list(_KEEPALIVE_OPTIONS)
        super().__init__(host=host, port=port, **kwargs)
        self.channel = SessionChannel(self.channel, **(session_options or {}))
        self.session = self.channel.session
        self.kvstub = etcdrpc.KVStub(self.channel)
        self.clusterstub = etcdrpc.ClusterStub(self.channel)
        self.leasestub = etcdrpc.LeaseStub(self.channel)
        self.maintenancestub = etcdrpc.MaintenanceStub(self.channel)
        if hasattr(self, "auth_stub"):
            self.auth_stub = etcdrpc.AuthStub(self.channel)

    # close() is Etcd3Client's: it calls self.channel.close(), which ends the session first.


def client(host="localhost", port=2379, **kwargs):
    session_options = {k: kwargs.pop(k) for k in SESSION_OPTIONS if k in kwargs}
    return Etcd3Client(host=host, port=port, session_options=session_options, **kwargs)
