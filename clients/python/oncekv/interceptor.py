"""The oncekv session protocol as a grpcio unary-unary client interceptor.

Writes (the methods in TRACKED) get a sequence number from the client's session and carry
it in four metadata keys; the server runs each (client id, seq) at most once and answers a
retry with the saved response. So this interceptor retries a write only with the SAME seq,
and never resends it under another session: once a write may have reached the cluster and
its session is gone, nobody can tell whether it ran, and the caller gets OutcomeUnknown.
"""

import collections
import os
import threading
import time

import grpc

from . import _wire

TRACKED = frozenset({
    "/etcdserverpb.KV/Put",
    "/etcdserverpb.KV/DeleteRange",
    "/etcdserverpb.KV/Txn",
    "/etcdserverpb.KV/Compact",
    "/etcdserverpb.Lease/LeaseGrant",
    "/etcdserverpb.Lease/LeaseRevoke",
    "/v3lockpb.Lock/Lock",
    "/v3lockpb.Lock/Unlock",
    "/v3electionpb.Election/Campaign",
    "/v3electionpb.Election/Proclaim",
    "/v3electionpb.Election/Resign",
})

REGISTER = "/oncekv.Session/Register"
KEEP_ALIVE = "/oncekv.Session/KeepAlive"
CLOSE = "/oncekv.Session/Close"

CLIENT_ID_KEY = "oncekv-client-id"
SECRET_KEY = "oncekv-session-secret"
SEQ_KEY = "oncekv-seq"
FIRST_INCOMPLETE_KEY = "oncekv-first-incomplete"
ERROR_KEY = "oncekv-error"
_SESSION_KEYS = (CLIENT_ID_KEY, SECRET_KEY, SEQ_KEY, FIRST_INCOMPLETE_KEY)

SESSION_EXPIRED = "session-expired"
# The cluster could not decide now; the same request may succeed later or on another try.
RETRYABLE_DETAILS = frozenset({"not-leader", "no-leader", "timeout", "peer-unreachable", "stopping"})
# Refusals given before the cluster looks at a write's seq (a stale or invalid token, a
# permission the user lost, a full window): they answer the attempt that got them and say
# nothing about an earlier attempt of the same seq.
DOOR_DETAILS = frozenset({"auth", "permission-denied", "window-exceeded"})
_RETRYABLE_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class OutcomeUnknown(Exception):
    """A write may or may not have been applied, and can no longer be found out.

    Raised when a write that may have reached the cluster meets an expired session, or when
    its time budget runs out after it may have been sent. Deliberately NOT a grpc.RpcError:
    code that retries every RpcError would otherwise resend the write without a seq and
    could apply it twice, the one thing this package exists to prevent.
    """

    def __init__(self, method, client_id, seq, reason, last_error=None):
        self.method = method
        self.client_id = client_id
        self.seq = seq
        self.reason = reason
        self.last_error = last_error
        super().__init__(
            "oncekv: the outcome of %s (session %d, seq %d) is unknown (it may or may not "
            "have been applied): %s" % (method, client_id, seq, reason))


class _LocalError(grpc.RpcError, grpc.Call):
    """An RpcError for a call this package ends before sending anything (so python-etcd3
    and plain-stub users handle it like any timeout)."""

    def __init__(self, code, details):
        super().__init__(details)
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details

    def initial_metadata(self):
        return ()

    def trailing_metadata(self):
        return ()

    def is_active(self):
        return False

    def time_remaining(self):
        return None

    def cancel(self):
        return False

    def add_callback(self, callback):
        return False


def error_detail(error):
    """The oncekv-error detail of an RpcError, or None (etcd's own errors, transport errors)."""
    try:
        trailing = error.trailing_metadata() or ()
    except Exception:  # a local error may have no call behind it
        return None
    for key, value in trailing:
        if key == ERROR_KEY:
            return value.decode() if isinstance(value, bytes) else value
    return None


def _retryable(error, detail):
    if detail is not None:
        return detail in RETRYABLE_DETAILS
    return error.code() in _RETRYABLE_CODES


def _never_left(error):
    # gRPC fails a call this way when no connection could be made at all: the request was
    # never written to any socket, so it cannot have run. Anything else (a reset, a
    # timeout, a "not leader" from a member that may have forwarded it) might have.
    return (error.code() == grpc.StatusCode.UNAVAILABLE
            and "failed to connect to all addresses" in (error.details() or ""))


def _token_metadata(metadata):
    return tuple((k, v) for k, v in (metadata or ()) if k == "token")


_Details = collections.namedtuple(
    "_Details", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"))


class _CallDetails(_Details, grpc.ClientCallDetails):
    pass


class SessionInfo(collections.namedtuple("SessionInfo", "client_id secret ttl window")):
    """A registered session: id, 16-byte secret, TTL in seconds, window."""


class _Session:
    """One registered session and its sequence numbers (the client-side request tracker)."""

    def __init__(self, registered):
        self.info = SessionInfo(registered.client_id, registered.secret,
                                registered.ttl_ms / 1000.0, max(1, registered.window))
        self._secret_hex = registered.secret.hex()
        self._cond = threading.Condition()
        self._next = 1
        self._open = set()  # seqs handed out and not yet finished
        self.expired = False

    def begin(self, deadline):
        """The next seq, once the window has room; None if the session expired meanwhile."""
        with self._cond:
            while not self.expired:
                # The server refuses seq >= first_incomplete + window (it would have to keep
                # unbounded saved responses), so wait for older calls to finish instead.
                if self._next < self._first_incomplete() + self.info.window:
                    seq = self._next
                    self._next += 1
                    self._open.add(seq)
                    return seq
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _LocalError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                      "oncekv: no room in the session window before the deadline")
                self._cond.wait(left)
            return None

    def _first_incomplete(self):
        return min(self._open) if self._open else self._next

    def finish(self, seq):
        # Every end counts (an answer, an error, an unknown outcome): the seq will never be
        # sent again, so the server may drop its saved response.
        with self._cond:
            self._open.discard(seq)
            self._cond.notify_all()

    def mark_expired(self):
        with self._cond:
            self.expired = True
            self._cond.notify_all()

    def metadata(self, seq):
        with self._cond:
            first = self._first_incomplete()
        return ((CLIENT_ID_KEY, str(self.info.client_id)),
                (SECRET_KEY, self._secret_hex),
                (SEQ_KEY, str(seq)),
                (FIRST_INCOMPLETE_KEY, str(first)))


class Stats:
    """Counters, for tests and for callers who want to see what the retries did."""

    FIELDS = ("calls", "attempts", "retries", "registrations", "keepalives", "outcome_unknown")

    def __init__(self):
        self._lock = threading.Lock()
        for f in self.FIELDS:
            setattr(self, f, 0)

    def add(self, field, n=1):
        with self._lock:
            setattr(self, field, getattr(self, field) + n)

    def snapshot(self):
        with self._lock:
            return {f: getattr(self, f) for f in self.FIELDS}


class SessionInterceptor(grpc.UnaryUnaryClientInterceptor):
    """Tracks writes through an oncekv session; reads and streams pass through untouched.

    `channel` is the plain channel the interceptor is put on: Register, KeepAlive and Close
    go straight to it. A call's own timeout bounds all its attempts; without one,
    `budget` seconds do. Each attempt waits `attempt_timeout` seconds at first, twice as
    long each retry up to `max_attempt_timeout`, so a lost reply costs one short attempt.
    """

    def __init__(self, channel, *, attempt_timeout=1.0, max_attempt_timeout=8.0,
                 budget=30.0, keepalive=True):
        self._attempt_timeout = attempt_timeout
        self._max_attempt_timeout = max_attempt_timeout
        self._budget = budget
        self._keepalive_enabled = keepalive
        # No serializers: the requests are the bytes _wire makes, the replies are decoded there.
        self._register_rpc = channel.unary_unary(REGISTER)
        self._keepalive_rpc = channel.unary_unary(KEEP_ALIVE)
        self._close_rpc = channel.unary_unary(CLOSE)
        self._registering = threading.Lock()
        self._session = None
        self._token = ()
        self._stop = threading.Event()
        self._keeper = None
        self.stats = Stats()

    # -- sessions --

    @property
    def session(self):
        """The live session's SessionInfo, or None before the first write or after expiry."""
        s = self._session
        return None if s is None or s.expired else s.info

    def _live_session(self, token, deadline):
        with self._registering:
            s = self._session
            if s is not None and not s.expired:
                return s
            s = _Session(self._register(token, deadline))
            self.stats.add("registrations")
            self._session = s
            # A session belongs to the user whose token registered it; keep-alives go as them.
            self._token = token
            self._start_keeper()
            return s

    def _register(self, token, deadline):
        # One nonce for every attempt: if a reply is lost, the retry gets the same session
        # back instead of leaking a second one.
        nonce = os.urandom(16)
        timeout, delay = self._attempt_timeout, 0.05
        while True:
            left = deadline - time.monotonic()
            try:
                reply = self._register_rpc(_wire.encode_register(nonce),
                                           timeout=max(0.01, min(timeout, left)), metadata=token)
                return _wire.decode_register(reply)
            except grpc.RpcError as e:
                if not _retryable(e, error_detail(e)) or deadline - time.monotonic() <= delay:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
            timeout = min(timeout * 2, self._max_attempt_timeout)

    def _begin(self, token, deadline):
        while True:
            s = self._live_session(token, deadline)
            seq = s.begin(deadline)
            if seq is not None:
                return s, seq

    def _start_keeper(self):
        if not self._keepalive_enabled or (self._keeper is not None and self._keeper.is_alive()):
            return
        self._stop = threading.Event()
        # A daemon: a caller who forgets close() must not keep the interpreter alive.
        self._keeper = threading.Thread(target=self._keep_alive, args=(self._stop,),
                                        name="oncekv-session-keepalive", daemon=True)
        self._keeper.start()

    def _keep_alive(self, stop):
        s = self._session
        wait = max(0.1, s.info.ttl / 3) if s is not None else 1.0
        while not stop.wait(wait):
            s = self._session
            if s is None or s.expired:
                wait = 1.0  # the next write registers a new session; nothing to keep
                continue
            # A third of the TTL leaves two more tries before the session could expire.
            interval = max(0.1, s.info.ttl / 3)
            try:
                self._keepalive_rpc(_wire.encode_session_ref(s.info.client_id, s.info.secret),
                                    timeout=max(0.1, min(interval, 5.0)), metadata=self._token)
                self.stats.add("keepalives")
                wait = interval
            except grpc.RpcError as e:
                if error_detail(e) == SESSION_EXPIRED:
                    s.mark_expired()
                # Transient trouble: try again soon rather than a whole interval later.
                wait = min(interval, 0.5)
            except ValueError:
                return  # the channel was closed under us

    def close(self):
        """Stops the keep-alive and ends the session on the server (freeing its saved
        responses). Call it once no write is in flight; a later write registers anew."""
        self._stop.set()
        if self._keeper is not None:
            self._keeper.join(timeout=10)
            self._keeper = None
        with self._registering:
            s, self._session = self._session, None
        if s is None or s.expired:
            return
        s.mark_expired()
        try:
            self._close_rpc(_wire.encode_session_ref(s.info.client_id, s.info.secret),
                            timeout=self._attempt_timeout * 2, metadata=self._token)
        except (grpc.RpcError, ValueError):
            pass  # best effort: an unclosed session simply expires after its TTL

    # -- calls --

    def intercept_unary_unary(self, continuation, client_call_details, request):
        metadata = client_call_details.metadata or ()
        if client_call_details.method not in TRACKED or any(k in _SESSION_KEYS for k, _ in metadata):
            # Reads are untracked; a caller that set session metadata itself is left alone.
            return continuation(client_call_details, request)
        return self._tracked(continuation, client_call_details, request)

    def _tracked(self, continuation, details, request):
        self.stats.add("calls")
        method = details.method
        deadline = time.monotonic() + (details.timeout if details.timeout is not None else self._budget)
        metadata = tuple(details.metadata or ())
        token = _token_metadata(metadata)
        session, seq = self._begin(token, deadline)
        maybe_sent = False
        timeout, delay = self._attempt_timeout, 0.05
        try:
            while True:
                self.stats.add("attempts")
                left = deadline - time.monotonic()
                attempt = _CallDetails(method, max(0.01, min(timeout, left)),
                                       metadata + session.metadata(seq), details.credentials,
                                       details.wait_for_ready, details.compression)
                outcome = continuation(attempt, request)
                error = outcome.exception()
                if error is None and token:
                    # The cluster took this token for the session, so it is its user's, and
                    # the freshest: an auth change makes the one it registered with stale,
                    # and keep-alives sent with that would let the session expire.
                    self._token = token
                if error is None or not isinstance(error, grpc.RpcError):
                    return outcome  # an answer, or a local failure that no retry would fix
                detail = error_detail(error)
                if detail == SESSION_EXPIRED:
                    session.mark_expired()
                    if maybe_sent:
                        self.stats.add("outcome_unknown")
                        raise OutcomeUnknown(method, session.info.client_id, seq,
                                             "its session expired while it was being retried",
                                             error) from error
                    # No attempt can have run (the server refuses a write of an unknown
                    # session before applying it): a new session and seq are safe.
                    session.finish(seq)
                    if time.monotonic() >= deadline:
                        return outcome
                    session, seq = self._begin(token, deadline)
                    continue
                if not _retryable(error, detail):
                    if maybe_sent and detail in DOOR_DETAILS:
                        # An earlier attempt may have run; this refusal cannot say it did not.
                        self.stats.add("outcome_unknown")
                        raise OutcomeUnknown(method, session.info.client_id, seq,
                                             "refused before its seq was checked: %s: %s"
                                             % (error.code(), error.details()), error) from error
                    return outcome  # the cluster's answer, raised unchanged to the caller
                if not _never_left(error):
                    maybe_sent = True
                if deadline - time.monotonic() <= delay:
                    if maybe_sent:
                        self.stats.add("outcome_unknown")
                        raise OutcomeUnknown(method, session.info.client_id, seq,
                                             "gave up retrying: %s: %s" % (error.code(), error.details()),
                                             error) from error
                    return outcome
                self.stats.add("retries")
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
                timeout = min(timeout * 2, self._max_attempt_timeout)
        finally:
            session.finish(seq)
