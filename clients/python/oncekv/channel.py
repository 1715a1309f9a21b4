"""intercept(): a grpcio channel whose writes go through an oncekv session."""

import grpc

from .interceptor import SessionInterceptor


class SessionChannel(grpc.Channel):
    """A grpc.Channel that tracks writes through `self.session` (a SessionInterceptor).

    It exists so that close() can end the session (stop its keep-alive thread, free the
    server's saved responses) before the connection goes; grpc's own intercepted channel
    only closes the connection.
    """

    def __init__(self, channel, **options):
        self.session = SessionInterceptor(channel, **options)
        self._raw = channel
        self._channel = grpc.intercept_channel(channel, self.session)
        # Keep the channel's connection attempts driven. grpcio's core only advances a
        # pending connect while some thread polls for it; once the channel is in
        # TRANSIENT_FAILURE, calls fail fast without polling, so a retry loop like ours
        # never lets a reconnect complete: each attempt sits until the 20 s connect
        # timeout, again and again, long after the member is back. A connectivity
        # subscriber makes grpcio poll in a thread of its own (every 0.2 s).
        channel.subscribe(_ignore_state, try_to_connect=True)

    def subscribe(self, callback, try_to_connect=False):
        self._channel.subscribe(callback, try_to_connect=try_to_connect)

    def unsubscribe(self, callback):
        self._channel.unsubscribe(callback)

    # *args: newer generated stubs pass grpc's private _registered_method flag as well.
    def unary_unary(self, method, *args, **kwargs):
        return self._channel.unary_unary(method, *args, **kwargs)

    def unary_stream(self, method, *args, **kwargs):
        return self._channel.unary_stream(method, *args, **kwargs)

    def stream_unary(self, method, *args, **kwargs):
        return self._channel.stream_unary(method, *args, **kwargs)

    def stream_stream(self, method, *args, **kwargs):
        return self._channel.stream_stream(method, *args, **kwargs)

    def close(self):
        self.session.close()
        self._raw.unsubscribe(_ignore_state)
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _ignore_state(_state):
    pass


def intercept(channel, **options):
    """Wraps a grpcio channel so its writes are exactly-once; see SessionInterceptor for the
    options. Use it with any generated etcd stubs: `KVStub(oncekv.intercept(channel))`."""
    return SessionChannel(channel, **options)
