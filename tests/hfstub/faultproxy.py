"""TEST DOUBLE: a fault-injecting reverse proxy between a hub client and a mirror.

Each request is forwarded to the upstream mirror (e.g. server.HubStub); then, by script
(`queue`) or at random (`rate`, seeded), one fault replaces the faithful answer:

- reset:    close the connection before any answer
- 500, 429: an error status (429 with Retry-After)
- drop:     headers with the true Content-Length, half the body, then close
- truncate: a consistent but short answer (Content-Length of half the body)
- flip:     one byte of the body inverted, length and headers unchanged
- stall:    headers and a few bytes, then silence longer than the client's timeout

Body faults only hit file bodies (200/206 with at least 2 bytes); other answers get a
status fault. `only` limits faults to paths containing a string. `injected` counts what
was done. Loopback only.
"""
from __future__ import annotations

import collections
import http.client
import random
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit

from hfstub.server import LoopbackServer

STATUS_FAULTS = ("reset", "500", "429")
BODY_FAULTS = ("drop", "truncate", "flip", "stall")
ALL_FAULTS = STATUS_FAULTS + BODY_FAULTS
HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


class FaultProxy(LoopbackServer):
    def __init__(self, upstream, rate=0.0, kinds=ALL_FAULTS, seed=0, stall_s=3.0,
                 retry_after="0", queue=(), only=None):
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.rate, self.kinds = rate, tuple(kinds)
        self.random = random.Random(seed)
        self.stall_s, self.retry_after = stall_s, retry_after
        self.queue = collections.deque(queue)  # scripted faults first, None = pass
        self.only = only  # when set, only paths containing it are considered for faults
        self.injected = collections.Counter()
        self.forwarded = 0
        self.lock = threading.Lock()
        proxy = self

        class Handler(_ProxyHandler):
            owner = proxy

        self._listen(Handler)

    @property
    def total_faults(self):
        return sum(self.injected.values())

    def choose(self, path, body_ok):
        """The fault for this answer (None: forward faithfully)."""
        with self.lock:
            if self.only and self.only not in path:
                kind = None
            elif self.queue:
                kind = self.queue.popleft()
            elif self.random.random() < self.rate:
                kind = self.random.choice(self.kinds)
            else:
                kind = None
            if kind in BODY_FAULTS and not body_ok:
                kind = self.random.choice([k for k in STATUS_FAULTS if k in self.kinds]
                                          or ["500"])
            if kind:
                self.injected[kind] += 1
            else:
                self.forwarded += 1
            return kind


class _ProxyHandler(BaseHTTPRequestHandler):
    owner: FaultProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self._proxy()

    def do_HEAD(self):
        self._proxy()

    def _proxy(self):
        o = self.owner
        conn = http.client.HTTPConnection(*o.upstream, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        conn.request(self.command, self.path, headers=headers)
        up = conn.getresponse()
        body = up.read() if self.command != "HEAD" else b""
        conn.close()
        is_file = "/resolve/" in self.path or self.path.startswith("/lfs-cdn/")
        kind = o.choose(self.path, body_ok=is_file and up.status in (200, 206) and len(body) >= 2)
        self.close_connection = True
        out_headers = [(k, v) for k, v in up.getheaders() if k.lower() not in HOP]
        if kind == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       b"\x01\x00\x00\x00\x00\x00\x00\x00")
            return
        if kind in ("500", "429"):
            extra = [("Retry-After", o.retry_after)] if kind == "429" else []
            return self._answer(int(kind), extra, b"injected fault\n", len(b"injected fault\n"))
        length = len(body) if self.command != "HEAD" else int(up.getheader("Content-Length") or 0)
        if kind == "flip":
            i = o.random.randrange(len(body))
            body = body[:i] + bytes([body[i] ^ 0xFF]) + body[i + 1:]
        elif kind == "truncate":
            body = body[:len(body) // 2]
            length = len(body)
        elif kind == "drop":
            return self._answer(up.status, out_headers, body[:len(body) // 2], length)
        elif kind == "stall":
            self._answer(up.status, out_headers, body[:1], length)
            time.sleep(o.stall_s)
            return
        self._answer(up.status, out_headers, body, length)

    def _answer(self, status, headers, body, length):
        try:
            self.send_response(status)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(length))
            self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
