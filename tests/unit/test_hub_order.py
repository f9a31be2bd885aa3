"""Order and parallelism gpufleet.hub must keep (docs/model-fetch.md, steps 4 and 5).

- A file gets its final name only after every byte was hashed and the hash matched,
  while a slow loopback mirror (tests/hfstub/server.py's HubStub, a STAND-IN hub,
  throttled) sends it. The evidence is recorded by events, in the fetcher's own thread:
  every rename into a final name (with the bytes it carried), and at every hash update
  and at the hexdigest whether the final name already exists. A polling thread also
  watches the final name, but it can only add evidence: no outcome depends on when it
  runs (under CPU load it missed the few ms between the rename and the end of the fetch,
  and the good-file test failed; 3 of 200 runs beside a `pytest -n 2` of the other unit
  files). Copies of Fetcher._download that rename first and quarantine afterwards, or
  stream into the final name (the mutants below), are caught by the event checks alone.
- Transfers run in parallel: with max_workers >= 2 the stand-in sends at least two
  bodies at the same time (with max_workers=1, never).
"""
import hashlib
import os
import pathlib
import threading
import time

import pytest

from gpufleet import hub, hub_client, hub_fetch, hub_listing
from hfstub import server as hfserver  # noqa: E402
from hfstub.server import HubStub, Repo  # noqa: E402

BIG = "model-00000.safetensors"


def _files(n_big=1, size=600_000):
    rnd = __import__("random").Random(13)
    files = {"config.json": b'{"model_type": "llama"}'}
    for i in range(n_big):
        files[f"model-{i:05d}.safetensors"] = rnd.randbytes(size)
    return files


def _client(url):
    return hub_client.HubClient(url, timeout=5, retries=2, backoff=0.001)


class _Watch:
    """Polls dest/BIG from another thread; keeps when it first appeared and its bytes.

    A supplement to _Record's events, never the only evidence: a poll can miss a
    short-lived state (the thread may not run for ms on a loaded machine), so __exit__
    takes one last look after the thread ended, and the mutant controls must be caught
    without this watcher."""

    def __init__(self, path):
        self.path, self.first_seen, self.first_bytes = path, None, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _look(self):
        if self.first_seen is None and os.path.lexists(self.path):
            self.first_seen = time.monotonic()
            try:
                self.first_bytes = self.path.read_bytes()
            except OSError:
                self.first_bytes = b"<gone before it could be read>"

    def _run(self):
        while not self._stop.is_set():
            self._look()
            time.sleep(0.0005)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._look()  # the thread may have been stopped before it ran after the rename


class _Record:
    """Events, recorded in the thread that causes them (no polling): when BIG's last byte
    was hashed (its hexdigest after `size` bytes), whether dest/BIG existed at any hash
    update or at the hexdigest of BIG (before its last byte was hashed), and every
    os.replace into a final name under dest (time, the sha256 of the bytes it carried)."""

    def __init__(self, monkeypatch, dest, size):
        self.dest, self.size = str(dest), size
        self.final = os.path.join(self.dest, BIG)
        self.all_hashed_at, self.replaces = None, []
        self.final_while_hashing = []  # (bytes hashed so far, "update" | "hexdigest")
        record, real_hasher, real_replace = self, hub_listing.RepoFile.hasher, os.replace

        class Hasher:
            def __init__(self, inner):
                self.inner, self.seen = inner, 0

            def _final_exists(self, when):
                if os.path.lexists(record.final):
                    record.final_while_hashing.append((self.seen, when))

            def update(self, data):
                self._final_exists("update")  # the bytes of data are not hashed yet
                self.inner.update(data)
                self.seen += len(data)

            def hexdigest(self):
                self._final_exists("hexdigest")  # the hash is not checked yet
                if self.seen == record.size:
                    record.all_hashed_at = time.monotonic()
                return self.inner.hexdigest()

        def hasher(f):
            inner = real_hasher(f)
            return Hasher(inner) if f.path == BIG else inner

        def replace(src, dst, *a, **kw):
            dst_s = os.fspath(dst)
            if dst_s.startswith(self.dest) and "/.gpufleet/" not in dst_s[len(self.dest):]:
                with open(src, "rb") as fh:
                    record.replaces.append((time.monotonic(), dst_s,
                                            hashlib.sha256(fh.read()).hexdigest()))
            return real_replace(src, dst, *a, **kw)

        monkeypatch.setattr(hub_listing.RepoFile, "hasher", hasher)
        monkeypatch.setattr(hub_fetch.os, "replace", replace)


def _violations(record, watch, dest, good_sha256):
    """What broke the order: a final name that existed before every byte was hashed, or
    a rename into the final name of bytes that do not hash right. watch=None: the
    recorded events alone (they do not depend on timing)."""
    final = os.path.join(str(dest), BIG)
    out = []
    for when, dst, sha in record.replaces:
        if dst == final and sha != good_sha256:
            out.append(f"renamed bytes with sha256 {sha[:12]} into {BIG} before checking them")
        if dst == final and (record.all_hashed_at is None or when < record.all_hashed_at):
            out.append(f"renamed into {BIG} before its last byte was hashed")
    for seen, when in record.final_while_hashing[:1]:
        out.append(f"{BIG} existed at a hash {when} after {seen} of {record.size} bytes "
                   f"(before its last byte was hashed and checked); "
                   f"{len(record.final_while_hashing)} such hash calls")
    if watch is not None and watch.first_seen is not None:
        if record.all_hashed_at is None or watch.first_seen < record.all_hashed_at:
            out.append(f"{BIG} existed before its last byte was hashed")
        if watch.first_bytes != b"<gone before it could be read>" and \
                hashlib.sha256(watch.first_bytes).hexdigest() != good_sha256:
            out.append(f"{BIG} appeared holding bytes that do not hash right")
    return out


def _mutant_download(self, f):
    """Fetcher._download with the order broken: rename into place, then check the hash
    and quarantine the final name on a mismatch."""
    partial_path = self.partial_path(f)
    got = None
    for _ in range(hub_fetch.VERIFY_ATTEMPTS):
        part = hub_fetch._Partial(f, partial_path)
        got = self._stream(f, part)
        final = self.final_path(f)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        os.replace(partial_path, final)
        if got == f.digest:
            return
        self.quarantine(f, final, got)
    raise hub.VerificationError(f.path, f.digest, got, f.algorithm)


def _fetch(monkeypatch, tmp_path, corrupt):
    files = _files()
    good = hashlib.sha256(files[BIG]).hexdigest()
    served = dict(files)
    if corrupt:
        bad = bytearray(files[BIG])
        bad[-1] ^= 0x01  # only the last byte differs: a check before it cannot see it
        served = {BIG: bytes(bad)}
    dest = tmp_path / "m"
    record = _Record(monkeypatch, dest, len(files[BIG]))
    # 600 kB at 1.5 MB/s: each transfer of BIG takes about 0.4 s
    with HubStub([Repo("org/model", files)], throttle_bps=1_500_000,
                 corrupt=served if corrupt else None) as s:
        with _Watch(dest / BIG) as watch:
            try:
                hub.sync_repo(_client(s.url), "org/model", "main", dest, max_workers=2)
                error = None
            except hub.HubError as exc:
                error = exc
    return record, watch, dest, good, error


def test_a_good_file_gets_its_final_name_only_after_its_last_byte_was_hashed(monkeypatch, tmp_path):
    record, watch, dest, good, error = _fetch(monkeypatch, tmp_path, corrupt=False)
    assert error is None
    assert watch.first_seen is not None and record.all_hashed_at is not None
    assert _violations(record, watch, dest, good) == []
    assert [sha for _, dst, sha in record.replaces if dst.endswith(BIG)] == [good]


def test_a_lying_mirror_never_puts_its_bytes_under_the_final_name(monkeypatch, tmp_path):
    record, watch, dest, good, error = _fetch(monkeypatch, tmp_path, corrupt=True)
    assert isinstance(error, hub.HubError) and BIG in str(error)
    assert _violations(record, watch, dest, good) == []
    assert watch.first_seen is None and not [r for r in record.replaces if r[1].endswith(BIG)]
    assert len(list((dest / ".gpufleet" / "quarantine").iterdir())) == 1


def _mutant_streams_into_place(self, f):
    """Fetcher._download with the order broken another way: the bytes stream straight
    into the final name, checked when they are all there."""
    final = self.final_path(f)
    got = None
    for _ in range(hub_fetch.VERIFY_ATTEMPTS):
        part = hub_fetch._Partial(f, final)
        got = self._stream(f, part)
        if got == f.digest:
            return
        self.quarantine(f, final, got)
    raise hub.VerificationError(f.path, f.digest, got, f.algorithm)


@pytest.mark.parametrize("mutant, corrupt", [
    (_mutant_download, True),
    (_mutant_streams_into_place, True),
    (_mutant_streams_into_place, False),
], ids=["rename-then-quarantine", "stream-into-place-lying", "stream-into-place-good"])
def test_the_checks_catch_a_fetcher_that_breaks_the_order(monkeypatch, tmp_path, mutant, corrupt):
    """The same fetch and checks with _download's order broken: they report it, so the
    two tests above fail on such a change."""
    monkeypatch.setattr(hub_fetch.Fetcher, "_download", mutant)
    record, watch, dest, good, error = _fetch(monkeypatch, tmp_path, corrupt=corrupt)
    # the events alone (no polling) catch it, so catching it does not depend on timing
    assert _violations(record, None, dest, good), "the broken order went unseen"
    if corrupt:
        assert isinstance(error, hub.HubError)  # the end state alone looks right


# ---------------------------------------------------------------------------
# Parallel downloads
# ---------------------------------------------------------------------------

class _InFlight:
    """Counts the bodies the stand-in sends at the same time (its _write_body)."""

    def __init__(self, monkeypatch):
        self.now = self.most = 0
        self.spans = []
        lock, real = threading.Condition(), hfserver._Handler._write_body
        self._lock = lock
        counter = self

        def write_body(handler, body):
            start = time.monotonic()
            with lock:
                counter.now += 1
                counter.most = max(counter.most, counter.now)
            try:
                return real(handler, body)
            finally:
                with lock:
                    counter.now -= 1
                    if len(body) >= 100_000:  # the weights, not API answers
                        counter.spans.append((start, time.monotonic()))
                    lock.notify_all()

        monkeypatch.setattr(hfserver._Handler, "_write_body", write_body)

    def settled(self, timeout=10):
        """The spans once every body the stand-in started has ended. The client can have
        read a body's last byte (and sync_repo returned) before the server's handler thread
        (a daemon thread, not joined by the stand-in's shutdown) records that body's end:
        CI's run of 2026-12-03 saw 3 of 4 spans without this wait."""
        with self._lock:
            self._lock.wait_for(lambda: self.now == 0, timeout=timeout)
            return list(self.spans)


def _overlaps(spans):
    spans = sorted(spans)
    return sum(1 for (_, end), (start, _) in zip(spans, spans[1:]) if start < end)


@pytest.mark.parametrize("workers", [2, 4])
def test_transfers_overlap_in_time_with_max_workers_2_or_more(monkeypatch, tmp_path, workers):
    files = _files(n_big=4, size=300_000)
    flight = _InFlight(monkeypatch)
    # 300 kB at 1.5 MB/s: 0.2 s each, 0.8 s one after the other
    with HubStub([Repo("org/model", files)], throttle_bps=1_500_000) as s:
        hub.sync_repo(_client(s.url), "org/model", "main", tmp_path / "m", max_workers=workers)
    spans = flight.settled()
    assert len(spans) == 4, spans
    assert flight.most >= 2, f"never two transfers at once with max_workers={workers}"
    assert _overlaps(spans) >= 1
    for name, data in files.items():
        assert (tmp_path / "m" / name).read_bytes() == data


def test_the_overlap_check_sees_one_at_a_time_with_max_workers_1(monkeypatch, tmp_path):
    files = _files(n_big=3, size=150_000)
    flight = _InFlight(monkeypatch)
    with HubStub([Repo("org/model", files)], throttle_bps=1_500_000) as s:
        hub.sync_repo(_client(s.url), "org/model", "main", tmp_path / "m", max_workers=1)
    spans = flight.settled()
    assert len(spans) == 3 and flight.most == 1 and _overlaps(spans) == 0, spans
