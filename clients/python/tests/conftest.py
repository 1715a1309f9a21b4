"""A real oncekv cluster (`oncekv dev --nodes 3`) for the tests, and a reply-losing proxy."""

import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
# Short, so the keep-alive test can outwait it; every other test then relies on the
# keep-alive too. The small window makes the window test meaningful.
SESSION_TTL = 3
SESSION_WINDOW = 4


def _binary():
    env = os.environ.get("ONCEKV_BIN")
    if env:
        return env
    for kind in ("debug", "release"):
        candidate = REPO / "target" / kind / "oncekv"
        if candidate.exists():
            return str(candidate)
    return None


class Cluster:
    def __init__(self, binary, tls=False):
        self.log = tempfile.NamedTemporaryFile(prefix="oncekv-py-cluster-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [binary, "dev", "--nodes", "3", "--session-ttl", str(SESSION_TTL),
             "--session-window", str(SESSION_WINDOW)] + (["--tls"] if tls else []),
            stdout=subprocess.PIPE, stderr=self.log, text=True, start_new_session=True)
        self.endpoints = []  # (host, port) per member, n1 first
        self.ca_cert = None  # with tls: the throw-away CA that signed the members' certificates
        lines = []
        deadline = time.monotonic() + 60
        ready = False
        # readline blocks; the dev command prints its members within seconds or exits.
        for line in self.proc.stdout:
            lines.append(line)
            if "cluster ready" in line:
                ready = True
            m = re.match(r"\s+n\d+: clients https?://([\d.]+):(\d+)\s+peers", line)
            if ready and m:
                self.endpoints.append((m.group(1), int(m.group(2))))
            m = re.search(r"--cacert=(\S+)", line)
            if m:
                self.ca_cert = m.group(1)
            # The CA shows in the etcdctl hint that follows the members.
            if ready and len(self.endpoints) == 3 and (self.ca_cert or not tls):
                break
            if time.monotonic() > deadline:
                break
        if len(self.endpoints) != 3:
            self.stop()
            raise RuntimeError("oncekv dev did not come up; stdout:\n%s\nlog: %s"
                               % ("".join(lines), self.log.name))
        # Keep reading stdout so the cluster never blocks on a full pipe.
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)  # ctrl-c: the dev cluster's own stop
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture(scope="session")
def cluster():
    binary = _binary()
    if binary is None:
        pytest.skip("no oncekv binary: build it (cargo build -p oncekv) or set ONCEKV_BIN")
    c = Cluster(binary)
    yield c
    c.stop()


@pytest.fixture
def endpoint(cluster):
    return cluster.endpoints[0]


class LossyProxy:
    """A TCP proxy in front of one member that can lose one reply.

    After arm(), the next established connection (the server has spoken on it, so HTTP/2
    settings went through) to send request bytes becomes the victim: its
    request is forwarded, everything the server sends back is dropped, and once a whole
    response was dropped both sides are closed. So the write ran on the server and the
    client never heard: exactly a lost reply. Later connections pass through untouched.
    `on_swallow` (optional) runs after the reply was dropped and before the close.
    """

    def __init__(self, upstream, port=0):
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", port))
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.armed = False
        self.swallowed = 0  # victim connections whose reply was dropped
        self.on_swallow = None
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, on_swallow=None):
        with self.lock:
            self.armed = True
            self.on_swallow = on_swallow

    def _accept(self):
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            conn = {"victim": False, "replied": False}
            threading.Thread(target=self._requests, args=(client, server, conn), daemon=True).start()
            threading.Thread(target=self._replies, args=(server, client, conn), daemon=True).start()

    def _requests(self, client, server, conn):
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    break
                with self.lock:
                    if self.armed and conn["replied"] and not conn["victim"]:
                        self.armed = False
                        conn["victim"] = True
                server.sendall(data)
        except OSError:
            pass
        finally:
            _close(client, server)

    def _replies(self, server, client, conn):
        # The server's bytes are read as HTTP/2 frames (9-byte header: length, type,
        # flags, stream) only to see where a response ends: a HEADERS frame with
        # END_STREAM is a call's trailers. A victim's bytes are dropped until then, so the
        # write has surely run before the connection is cut.
        buf = b""
        try:
            while True:
                data = server.recv(65536)
                if not data:
                    break
                if not conn["victim"]:
                    client.sendall(data)
                    conn["replied"] = True
                buf += data
                ended = False
                while len(buf) >= 9:
                    length = int.from_bytes(buf[:3], "big")
                    if len(buf) < 9 + length:
                        break
                    kind, flags = buf[3], buf[4]
                    buf = buf[9 + length:]
                    if kind == 0x1 and flags & 0x1:
                        ended = True
                if conn["victim"] and ended:
                    with self.lock:
                        self.swallowed += 1
                        hook = self.on_swallow
                    if hook is not None:
                        hook()
                    break
        except OSError:
            pass
        finally:
            _close(client, server)

    def close(self):
        self.closed = True
        self.listener.close()


def _close(*socks):
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()


@pytest.fixture
def proxy(endpoint):
    p = LossyProxy(endpoint)
    yield p
    p.close()
