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
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def intercept(channel, **options):
    """Wraps a grpcio channel so its writes are exactly-once; see SessionInterceptor for the
    options. Use it with any generated etcd stubs: `KVStub(oncekv.intercept(channel))`."""
    return SessionChannel(channel, **options)
