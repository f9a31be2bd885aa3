"""Bounded reads: every answer read from a peer has a byte cap and an overall deadline.

A per-read timeout (``socket.settimeout``, the ``timeout=`` of requests or of Ansible's
``open_url``) bounds one recv, not an answer: a peer that drips a byte every few seconds
holds the reader as long as it likes, and an answer read whole can be gigabytes. Here:

- :class:`Deadline`: an overall limit in seconds, started once; ``left()`` raises
  :class:`BoundError` once it has passed.
- :func:`read_capped`: ``read(n)`` until EOF, at most ``max_bytes``, before the deadline.
  With ``settimeout`` (a socket's), the socket's timeout is set to the time left before
  each read, so a dripping peer cannot extend it (``gateway.read_show_stat``).
- :func:`within`: ``fn()`` in a worker thread, its result, or BoundError at the deadline.
  For libraries whose socket we do not hold (requests, urllib), where a peer can drip its
  status line and headers too; the worker's own reads stay capped, and it stops at its
  next read past the deadline and closes what it opened.
- :func:`http_request`: one requests call (``stream=True``) whose body is read under both
  limits, gzip/deflate decoded in bounded pieces; it returns the Response with its content
  filled in, so ``.status_code``, ``.text`` and ``.json()`` work as before.
- :func:`open_capped`: the same for a urllib-style opener (Ansible's ``open_url``).
- :func:`join_capped`: an iterable of byte chunks (docker's archive stream), capped.
- :class:`Decoder`: Content-Encoding identity/gzip/deflate decoded in bounded pieces
  (also used by hub.py's client, where it came from).

Every refusal is one error type, :class:`BoundError` (a ValueError): the message names
what was read, the cap or the deadline and what to do. Callers keep their own error
types by converting at the call site. No Ansible imports, no third-party imports.
"""
from __future__ import annotations

import threading
import time
import zlib

__all__ = ["BoundError", "CHUNK", "Decoder", "Deadline", "http_request", "join_capped",
           "open_capped", "read_capped", "within"]

CHUNK = 64 << 10  # bytes asked of one read
PIECE = 1 << 20  # most decoded bytes produced from one compressed piece
# urllib3 1.26 (Debian 12's python3-urllib3) has no read1, only read(n), which waits for n
# bytes: read smaller pieces there (the deadline still holds: within() ends the wait).
LEGACY_CHUNK = 16 << 10
# A gzip/deflate body carries at most this many raw bytes per decoded byte allowed (stored
# blocks add 5 bytes per 64 KiB); more is junk a server adds (after the end of the stream).
_RAW_SLACK = 64 << 10

_CAP_ADVICE = "A healthy server answers far less: check what answers there."
_DEADLINE_ADVICE = ("A healthy server answers well within it: check whether it is stuck, "
                    "overloaded, or sending its answer a few bytes at a time.")


class BoundError(ValueError):
    """An answer over its byte cap (kind "cap"), not complete by its deadline (kind
    "deadline") or in an encoding not decoded here (kind "encoding"); the message names
    what was read, the limit and what to do."""

    def __init__(self, message, kind):
        super().__init__(message)
        self.kind = kind


def _size(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


class Deadline:
    """An overall limit of `seconds` on reading `what` (a URL, a socket path), from now.

    ``read`` counts the bytes read so far (for the message). `advice` ends both messages.
    """

    def __init__(self, seconds, what, advice=None, clock=time.monotonic):
        self.seconds = float(seconds)
        self.what = what
        self.advice = advice
        self.read = 0
        self._clock = clock
        self._at = clock() + self.seconds

    def remaining(self):
        """Seconds left (0 once passed)."""
        return max(0.0, self._at - self._clock())

    def passed(self):
        return self.remaining() <= 0

    def left(self):
        """Seconds left (> 0); BoundError once the deadline has passed."""
        left = self.remaining()
        if left <= 0:
            raise self.error()
        return left

    def error(self):
        return BoundError(
            f"{self.what} did not answer in full within {self.seconds:g} s (the deadline "
            f"on this answer; {self.read} bytes read by then); stopped waiting. "
            f"{self.advice or _DEADLINE_ADVICE}", "deadline")

    def cap_error(self, max_bytes):
        return _cap_error(self.what, max_bytes, self.advice)


def _cap_error(what, max_bytes, advice):
    return BoundError(f"{what} sent more than {_size(max_bytes)} (the cap on this answer); "
                      f"stopped reading there. {advice or _CAP_ADVICE}", "cap")


def read_capped(read, max_bytes, deadline, settimeout=None, decoder=None, chunk=CHUNK):
    """The bytes `read(n)` returns until it returns b"", at most `max_bytes` (after
    `decoder`, a :class:`Decoder`, when given) and before `deadline` (a Deadline).

    settimeout: the socket's settimeout; called with the time left before each read, so
    no single read outlives the deadline. Raises BoundError past either limit (the rest is
    never read); a timeout of such a read is the deadline. Other errors of `read` pass.
    """
    body = bytearray()
    try:
        return _read_into(body, read, max_bytes, deadline, settimeout, decoder, chunk)
    except BaseException:
        body.clear()  # the traceback keeps this frame: not its bytes
        raise


def _read_into(body, read, max_bytes, deadline, settimeout, decoder, chunk):
    raw_total, raw_cap = 0, max_bytes + max_bytes // 64 + _RAW_SLACK
    while True:
        left = deadline.left()
        if settimeout is not None:
            settimeout(left)
        try:
            data = read(chunk)
        except TimeoutError:
            if settimeout is not None or deadline.passed():
                raise deadline.error() from None
            raise
        if not data:
            return bytes(body)
        raw_total += len(data)
        room = max_bytes + 1 - len(body)
        if decoder is None:
            body += data[:room]
        else:
            for piece in decoder.feed(data, room):
                body += piece
        deadline.read = len(body)
        if len(body) > max_bytes or raw_total > raw_cap:
            raise deadline.cap_error(max_bytes)


def join_capped(chunks, max_bytes, what, advice=None):
    """b"".join(chunks), refused (BoundError) as soon as it passes `max_bytes`."""
    body = bytearray()
    for data in chunks:
        body += data
        if len(body) > max_bytes:
            body.clear()
            raise _cap_error(what, max_bytes, advice)
    return bytes(body)


def within(deadline, fn):
    """fn() in a daemon worker thread: its result or its exception, or BoundError when
    `deadline` passes first (the worker is left to notice the deadline at its next read
    and close what it opened). An exception that comes when the deadline has passed (a
    timeout of the last read) is reported as the deadline."""
    box = {}

    def work():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=work, name=f"gpufleet-bounded {deadline.what}"[:80],
                              daemon=True)
    worker.start()
    worker.join(deadline.remaining())
    if worker.is_alive():
        raise deadline.error()
    if "error" in box:
        exc = box.pop("error")
        try:
            if isinstance(exc, BoundError) or not deadline.passed():
                raise exc
            raise deadline.error() from exc
        finally:
            exc = None  # no cycle: exception -> traceback -> this frame -> exception
    return box.pop("value")


def http_request(session, method, url, max_bytes, seconds, what=None, advice=None,
                 **kwargs):
    """session.request(method, url, **kwargs) with its whole answer (connect, status,
    headers, body) within `seconds` and its body (decoded) at most `max_bytes`.

    The connect and read timeouts are the time left; the body is read raw and decoded
    here (gzip, deflate) in bounded pieces; ``Accept-Encoding`` is "gzip, deflate" unless
    kwargs' headers say otherwise. Returns the requests Response, its content read (as
    requests itself stores it), so .status_code, .text and .json() work as before.
    Raises BoundError past either limit; the session's own errors pass unchanged.
    """
    deadline = Deadline(seconds, what or url, advice)
    headers = {"Accept-Encoding": "gzip, deflate", **(kwargs.pop("headers", None) or {})}

    def fetch():
        left = deadline.left()
        resp = session.request(method, url, headers=headers, stream=True,
                               timeout=(left, left), **kwargs)
        try:
            deadline.left()
            decoder = Decoder(resp.headers.get("Content-Encoding"), deadline.what)
            read1 = getattr(resp.raw, "read1", None)
            if read1 is not None:
                body = read_capped(lambda n: read1(n, decode_content=False), max_bytes,
                                   deadline, decoder=decoder)
            else:
                body = read_capped(lambda n: resp.raw.read(n, decode_content=False),
                                   max_bytes, deadline, decoder=decoder, chunk=LEGACY_CHUNK)
            resp._content = body  # what Response.content would have read
            resp._content_consumed = True  # so close() returns the connection to the pool
        finally:
            resp.close()
        return resp

    return within(deadline, fetch)


def open_capped(opener, url, max_bytes, seconds, what=None, advice=None):
    """The body of `opener(url, timeout=...)` (urllib.request's opener, Ansible's open_url: a
    response with read1 or read) within `seconds` in all and at most `max_bytes`.
    Raises BoundError past either limit; the opener's own errors pass unchanged."""
    deadline = Deadline(seconds, what or url, advice)

    def fetch():
        resp = opener(url, timeout=deadline.left())
        try:
            read = getattr(resp, "read1", None) or resp.read
            return read_capped(read, max_bytes, deadline)
        finally:
            resp.close()

    return within(deadline, fetch)


class Decoder:
    """Content-Encoding identity, gzip or deflate, decoded in bounded pieces (a
    compression bomb costs no memory). `error` is raised for an encoding not decoded here,
    `corrupt` (default: `error`) for a body that does not decompress; both with `what`
    (the URL) in the message. Bytes after the end of a compressed stream are dropped,
    never kept."""

    def __init__(self, encoding, what, error=None, corrupt=None):
        error = error or (lambda msg: BoundError(msg, "encoding"))
        self.corrupt = corrupt or error
        enc = (encoding or "").strip().lower()
        if enc in ("", "identity"):
            self.z = None
        elif enc in ("gzip", "x-gzip", "deflate"):
            self.z = zlib.decompressobj(32 + zlib.MAX_WBITS)  # gzip or zlib header
        else:
            raise error(f"{what} answered with Content-Encoding {encoding!r:.40}, which "
                        "gpufleet does not decode; serve identity or gzip.")
        self.what = what

    def feed(self, data, room):
        """Decoded pieces of `data`, at most `room` bytes in all."""
        if self.z is None:
            if data:
                yield data[:room]
            return
        while room > 0 and not self.z.eof:
            try:
                out = self.z.decompress(data, min(PIECE, room))
            except zlib.error:
                raise self.corrupt(f"{self.what} sent a body that does not "
                                   "decompress") from None
            data = self.z.unconsumed_tail
            if out:
                room -= len(out)
                yield out
            elif not data:
                return
