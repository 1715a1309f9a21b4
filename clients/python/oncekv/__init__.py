"""Exactly-once writes to oncekv from Python: its session protocol as a grpcio interceptor.

    import oncekv
    etcd = oncekv.client("127.0.0.1", 2379)      # a python-etcd3 client (extra [etcd3])
    etcd.put("k", "v")                           # retried with one seq: applied once
    channel = oncekv.intercept(grpc.insecure_channel("127.0.0.1:2379"))  # any stubs
"""

from .channel import SessionChannel, intercept
from .interceptor import (TRACKED, OutcomeUnknown, SessionInfo, SessionInterceptor,
                          error_detail)

__all__ = ["client", "intercept", "OutcomeUnknown", "SessionChannel", "SessionInfo",
           "SessionInterceptor", "TRACKED", "error_detail"]


def client(host="localhost", port=2379, **kwargs):
    """A python-etcd3 Etcd3Client for an oncekv cluster whose writes are exactly-once.

    Takes etcd3.client()'s arguments plus the session options of SessionInterceptor
    (attempt_timeout, max_attempt_timeout, budget, keepalive). client.session is the
    interceptor (its .stats and .session); client.close() ends the session.
    """
    from . import _etcd3  # python-etcd3 is optional: only this function needs it
    return _etcd3.client(host, port, **kwargs)
