"""Bringing dest to exactly the listed files of one commit, every byte verified.

Every byte is hashed while it streams in (one read of the bytes), partial files live in
``dest/.gpufleet/incomplete/`` and resume with Range, only a file whose hash matched the
listing (and the lock's sha256, where one pins it) is moved (``os.replace``) to its final
name; a file that keeps failing goes to ``dest/.gpufleet/quarantine/``. Free space and
inodes are checked before anything is written.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from . import model_lock
from .hub_client import CHUNK, Transient
from .hub_errors import DiskSpaceError, HubError, LockMismatchError
from .hub_manifest import (PROGRESS_NAME, manifest_outdated, manifest_trusts, open_nofollow,
                           state_path, utc_now, write_json_atomic)
from .hub_names import STATE_DIR, path_under

VERIFY_ATTEMPTS = 2  # a file whose hash mismatches is quarantined and fetched once more
# Inodes demanded beyond the files and folders a fetch creates (state files, temp files).
INODE_MARGIN = 64
# Free space demanded beyond the bytes still to download: 1% of them plus 64 MiB.
SPACE_MARGIN_FRACTION = 0.01
SPACE_MARGIN_BYTES = 64 << 20


class ShortFileError(HubError):
    """The mirror's copy of a file is shorter than the listing says."""

    def __init__(self, path, have, size, how):
        super().__init__(
            f"{path}: the mirror's copy is short: it has {have} of the {size} bytes the "
            f"listing gives ({how}). The {have} bytes received are kept in "
            f"{STATE_DIR}/incomplete/; fix the mirror's copy or fetch from another mirror.")
        self.path, self.have, self.size = path, have, size


class VerificationError(HubError):
    """A file's content kept failing its hash check."""

    def __init__(self, path, expected, got, algorithm):
        super().__init__(
            f"{path}: {algorithm} mismatch after {VERIFY_ATTEMPTS} downloads: the hub "
            f"lists {expected}, the mirror sent bytes hashing to {got}. The bad copy is "
            f"in {STATE_DIR}/quarantine/; check the mirror (HF_ENDPOINT) or fetch from "
            "another one.")
        self.path, self.expected, self.got = path, expected, got


def check_disk_space(dest, needed, inodes=0):
    """Raise DiskSpaceError when the filesystem of dest lacks needed bytes + margin, or
    the inodes for `inodes` new files and folders + INODE_MARGIN."""
    probe = os.path.abspath(dest)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    free = shutil.disk_usage(probe).free
    want = needed + int(needed * SPACE_MARGIN_FRACTION) + SPACE_MARGIN_BYTES if needed else 0
    if free < want:
        raise DiskSpaceError(
            f"{dest} has {_gib(free)} free; this fetch needs {_gib(needed)} plus a margin "
            f"({_gib(want)} in all). Free space or choose another dest; nothing was written.")
    free_inodes = _free_inodes(probe)
    if inodes and free_inodes is not None and free_inodes < inodes + INODE_MARGIN:
        raise DiskSpaceError(
            f"{dest} has {free_inodes} free inodes; this fetch creates {inodes} files and "
            f"folders plus a margin of {INODE_MARGIN}. Free inodes or choose another dest; "
            "nothing was written.")


def _free_inodes(path):
    """Inodes an unprivileged process may still create (None: no inode limit reported)."""
    st = os.statvfs(path)
    return st.f_favail if st.f_files else None


def _gib(n):
    return f"{n / (1 << 30):.2f} GiB"


# ---------------------------------------------------------------- the fetch

class Stats:
    def __init__(self, dest, total_files, total_bytes, write_progress, progress_path=None):
        self.lock = threading.Lock()
        self.bytes_downloaded = 0
        self.bytes_verified = 0
        self.files_done = 0
        self.total_files, self.total_bytes = total_files, total_bytes
        self.path = ((progress_path or state_path(dest, PROGRESS_NAME)) if write_progress
                     else None)
        self.last_write = 0.0

    def add(self, downloaded=0, verified=0, file_done=False):
        with self.lock:
            self.bytes_downloaded += downloaded
            self.bytes_verified += verified
            self.files_done += int(file_done)
            now = time.monotonic()
            if self.path and (file_done or now - self.last_write >= 1.0):
                self.last_write = now
                self._write()

    def _write(self):
        write_json_atomic(self.path, {
            "files_done": self.files_done, "files_total": self.total_files,
            "bytes_downloaded": self.bytes_downloaded, "bytes_verified": self.bytes_verified,
            "bytes_total": self.total_bytes, "updated": utc_now()})


def _flat(path):
    """One file name for a repo path (hashed when too long for a file name)."""
    name = path.replace("%", "%25").replace("/", "%2F")
    return name if len(name.encode()) <= 200 else hashlib.sha1(path.encode()).hexdigest()


class _Partial:
    """A partial file plus the running hash of the bytes it holds."""

    def __init__(self, f, path):
        self.f, self.path = f, path
        self.hasher, self.offset = f.hasher(), 0
        try:
            st = os.lstat(path)
        except OSError:
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            os.unlink(path)  # a link or other non-file planted there: ours to remove
            st = None
        size = st.st_size if st else 0
        if 0 < size <= f.size:
            # the only way to continue a sha256 is to hash what is already there (once)
            with open_nofollow(path, "rb") as fh:
                while chunk := fh.read(CHUNK):
                    self.hasher.update(chunk)
                    self.offset += len(chunk)
        elif size:
            os.unlink(path)

    def restart(self):
        self.hasher, self.offset = self.f.hasher(), 0
        with open_nofollow(self.path, "wb"):
            pass


class Fetcher:
    """Brings dest to exactly the listed files of one commit, verifying every byte."""

    def __init__(self, client, repo_id, commit, dest, verify="manifest", max_workers=8):
        self.client, self.repo_id, self.commit = client, repo_id, commit
        self.dest, self.verify, self.max_workers = dest, verify, max_workers
        self.quarantined = []
        self._qlock = threading.Lock()
        self._attempts = {}  # path -> requests made for its bytes in this run
        self.stats = None

    # -- paths ---------------------------------------------------------------------
    def final_path(self, f):
        """dest/PATH, no link on the way (one at the final name is replaced, never
        followed)."""
        return path_under(self.dest, f.path, final_may_be_link=True)

    def partial_path(self, f):
        return state_path(self.dest, "incomplete",
                          f"{_flat(f.path)}.{f.digest[:16]}.incomplete")

    def quarantine(self, f, src, got):
        qdir = state_path(self.dest, "quarantine")
        os.makedirs(qdir, exist_ok=True)
        # one slot per path: a mirror that keeps lying cannot fill the disk
        os.replace(src, os.path.join(qdir, _flat(f.path)))
        with self._qlock:
            self.quarantined.append({"path": f.path, "expected": f.digest, "got": got,
                                     "algorithm": f.algorithm})

    # -- classification (no writes) ---------------------------------------------------
    def classify(self, files, manifest):
        """-> [(file, state)], state: trusted | present (to hash) | outdated | stale |
        missing."""
        plan = []
        for f in files:
            try:
                st = os.lstat(self.final_path(f))
            except FileNotFoundError:
                plan.append((f, "missing"))
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_size != f.size:
                plan.append((f, "stale"))  # another revision's file, a broken one, a link
            elif self.verify == "manifest" and manifest_trusts(manifest.get(f.path), f, st):
                plan.append((f, "trusted"))
            elif self.verify == "manifest" and manifest_outdated(manifest.get(f.path), f, st):
                plan.append((f, "outdated"))  # the verified file of another revision
            else:
                plan.append((f, "present"))
        return plan

    def inodes_to_create(self, plan):
        """Files to download plus their folders (an upper bound: some folders exist)."""
        fetch = [f for f, state in plan if state in ("missing", "stale", "outdated")]
        folders = {"/".join(f.path.split("/")[:i]) for f in fetch
                   for i in range(1, f.path.count("/") + 1)}
        return len(fetch) + len(folders)

    def bytes_to_fetch(self, plan):
        total = 0
        for f, state in plan:
            if state in ("missing", "stale", "outdated"):
                try:
                    have = os.path.getsize(self.partial_path(f))
                except OSError:
                    have = 0
                total += f.size - min(have, f.size)
        return total

    # -- work ------------------------------------------------------------------------
    def run(self, plan, write_progress=True, progress_path=None):
        total = sum(f.size for f, _state in plan)
        os.makedirs(state_path(self.dest, "incomplete"), exist_ok=True)
        self.stats = Stats(self.dest, len(plan), total, write_progress, progress_path)
        results, errors = {}, []
        with ThreadPoolExecutor(max_workers=self.max_workers) as pool:
            futures = {pool.submit(self._one, f, state): f for f, state in plan}
            for fut, f in futures.items():
                try:
                    results[f.path] = fut.result()
                except HubError as exc:
                    errors.append(exc)
                except OSError as exc:
                    errors.append(HubError(f"{f.path}: {exc.strerror or exc} "
                                           f"({exc.filename or self.dest})"))
                except Exception as exc:  # noqa: BLE001 - reported per file, run goes on
                    errors.append(HubError(f"{f.path}: unexpected {type(exc).__name__}: {exc}"))
        return results, errors

    def _one(self, f, state):
        if state == "trusted":
            self.stats.add(file_done=True)
            return "trusted"
        final = self.final_path(f)
        if state == "present":
            hasher = self._hash_file(final, f)
            got = hasher.hexdigest()
            if got == f.digest:
                pinned = f.pinned_ok(hasher)
                if pinned in (None, f.pinned):
                    self.stats.add(file_done=True)
                    return "verified"
                got = f"sha256 {pinned} (the lock pins sha256 {f.pinned})"
            self.quarantine(f, final, got)  # rotten or foreign bytes leave the final name
        elif state == "stale":
            st = os.lstat(final)
            self.quarantine(f, final, "a symbolic link" if stat.S_ISLNK(st.st_mode)
                            else f"size {st.st_size}")
        elif state == "outdated":
            os.unlink(final)  # no mix of revisions under final names, even if this run fails
        self._download(f)
        self.stats.add(file_done=True)
        return "downloaded"

    def _hash_file(self, path, f):
        h = f.hasher()
        with open_nofollow(path, "rb") as fh:
            while chunk := fh.read(CHUNK):
                h.update(chunk)
                self.stats.add(verified=len(chunk))
        return h

    def _download(self, f):
        partial_path = self.partial_path(f)
        for attempt in range(VERIFY_ATTEMPTS):
            part = _Partial(f, partial_path)
            self.stats.add(verified=part.offset)
            got = self._stream(f, part)
            if got == f.digest:
                self._check_pinned(f, part, partial_path)
                with open_nofollow(partial_path, "rb+") as fh:
                    os.fsync(fh.fileno())
                final = self.final_path(f)
                os.makedirs(os.path.dirname(final), exist_ok=True)
                os.replace(partial_path, final)
                return
            self.quarantine(f, partial_path, got)
        raise VerificationError(f.path, f.digest, got, f.algorithm)

    def _check_pinned(self, f, part, partial_path):
        """Bytes that hash right against the endpoint's listing must also hash to the
        lock's sha256 before they get their final name. A mismatch there means the
        endpoint serves a listing of its own for other bytes: fetching again from it
        cannot help, so the bytes go to quarantine and the file fails at once."""
        pinned = f.pinned_ok(part.hasher)
        if pinned in (None, f.pinned):
            return
        self.quarantine(f, partial_path, f"sha256 {pinned} (the lock pins sha256 "
                                         f"{f.pinned})")
        try:
            model_lock.check_file(model_lock.ModelLock(self.repo_id, self.commit,
                                                       {f.path: f.pinned}), f.path, pinned)
        except model_lock.LockError as exc:
            raise LockMismatchError(f"{exc} The copy is in {STATE_DIR}/quarantine/.") from None

    def _stream(self, f, part):
        """Fill part up to f.size, resuming with Range; returns the hex digest.

        Bounded: `retries` attempts in a row without new bytes (beyond the most this file
        ever had: a mirror that restarts us at 0 makes no progress), max_file_attempts
        requests in all, the client's deadline and retry budget. A mirror whose copy is
        shorter than the listing is reported as such (ShortFileError)."""
        url = self.client.file_url(self.repo_id, self.commit, f.path)
        failures, high, clean_end = 0, part.offset, None
        if not os.path.exists(part.path):
            part.restart()
        while part.offset < f.size:
            n = self._attempts[f.path] = self._attempts.get(f.path, 0) + 1
            if n > self.client.max_file_attempts:
                raise HubError(f"{f.path}: gave up after {n - 1} requests "
                               f"(max_file_attempts); {part.offset} of {f.size} bytes kept "
                               "for the next run. Check the mirror or raise "
                               "max_file_attempts.")
            try:
                self._stream_once(f, part, url)
                if part.offset == f.size:
                    break
                if clean_end == part.offset:
                    raise ShortFileError(f.path, part.offset, f.size,
                                         "its answers end there every time")
                clean_end = part.offset
                raise Transient(f"{f.path}: the body ended after {part.offset} of "
                                f"{f.size} bytes")
            except Transient as exc:
                progressed = part.offset > high and not exc.slow
                high = max(high, part.offset)
                failures = 0 if progressed else failures + 1
                if failures > self.client.retries:
                    raise HubError(f"{f.path}: {exc}; gave up after {failures} attempts "
                                   f"without progress ({part.offset} of {f.size} bytes kept "
                                   "for the next run). Check the mirror or raise "
                                   "retries/timeout.") from None
                self.client.wait(failures, exc.retry_after, f"{f.path}: {exc}")
        return part.hasher.hexdigest()

    def _stream_once(self, f, part, url):
        headers = {"Range": f"bytes={part.offset}-"} if part.offset else None
        resp = self.client.open(url, headers=headers, allow_416=True)
        with resp:
            total = _content_range_total(resp.headers.get("Content-Range"))
            if total is not None and total < f.size and resp.status_code in (206, 416):
                raise ShortFileError(f.path, total, f.size,
                                     f"it answered {resp.status_code} with Content-Range "
                                     f"{resp.headers.get('Content-Range')!r:.60}")
            if resp.status_code == 416:
                part.restart()  # the mirror disowns our offset: start the file over
                raise Transient(f"{f.path}: the mirror refused Range {part.offset}-")
            if part.offset and resp.status_code == 206:
                start = _content_range_start(resp.headers.get("Content-Range"))
                if start != part.offset:
                    part.restart()
                    raise Transient(f"{f.path}: the mirror answered the wrong range")
            elif part.offset:
                part.restart()  # no Range support (200): this file starts over
            with open_nofollow(part.path, "ab") as out:
                for chunk in self.client.iter_body(resp, url, f.size - part.offset):
                    out.write(chunk)  # a disk error (full, read-only) is not retried
                    part.hasher.update(chunk)
                    part.offset += len(chunk)
                    self.stats.add(downloaded=len(chunk), verified=len(chunk))


def _content_range_start(value):
    m = re.match(r"bytes (\d+)-", value or "")
    return int(m.group(1)) if m else None


def _content_range_total(value):
    """The complete length of a Content-Range ('bytes 0-9/10', 'bytes */10'), or None."""
    m = re.match(r"bytes (?:\d+-\d+|\*)/(\d+)\s*$", value or "")
    return int(m.group(1)) if m else None
