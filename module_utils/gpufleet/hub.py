"""Verified model fetch from a Hugging Face hub or mirror (pure Python + requests).

What it does, and where the protocol comes from (huggingface_hub 1.x, constants.py,
file_download.py, hf_api.py; ../shared/notes/vllm-hf-facts.md):

- ``GET {endpoint}/api/models/{repo}/revision/{rev}`` -> ``sha`` (the commit).
- ``GET {endpoint}/api/models/{repo}/tree/{commit}?recursive=true`` (paginated with a
  ``Link: <...>; rel="next"`` header) -> ``path``, ``size``, ``oid`` (git blob sha1) and,
  for LFS files, ``lfs.oid`` (sha256 of the content).
- ``GET {endpoint}/{repo}/resolve/{commit}/{path}`` with ``Range: bytes=N-`` -> 206 (or
  200 from mirrors that ignore Range, e.g. olah 0.5.4); LFS files may redirect.
- git blob sha1 = sha1(b"blob " + str(size) + b"\\0" + content).

Every byte is hashed while it streams in (one read of the bytes), partial files live in
``dest/.gpufleet/incomplete/`` and only a file whose hash matched the listing is moved
(``os.replace``) to its final name. A verified manifest (``dest/.gpufleet/manifest.json``:
commit, files, sizes, hashes, mtimes, verification time; never the token) lets a re-run
trust files whose size and mtime are unchanged instead of re-hashing hundreds of GB.
No Ansible imports: the module ``library/hf_model.py`` is a thin shell around
:func:`sync_repo`.
"""
from __future__ import annotations

import datetime
import fcntl
import fnmatch
import hashlib
import json
import os
import random
import re
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import quote, urlsplit, urlunsplit

import requests
import urllib3

PUBLIC_ENDPOINT = "https://huggingface.co"
STATE_DIR = ".gpufleet"
MANIFEST_NAME = "manifest.json"
PROGRESS_NAME = "progress.json"
MANIFEST_FORMAT = 1
CHUNK = 1 << 20  # hashlib releases the GIL on updates this large, so workers hash in parallel
# urllib3 1.26 (Debian 12's python3-urllib3) has no read1, only read(n), which waits for n
# bytes and loses them if the connection drops: read smaller pieces there.
LEGACY_CHUNK = 64 << 10
VERIFY_ATTEMPTS = 2  # a file whose hash mismatches is quarantined and fetched once more
MAX_RETRY_AFTER = 120.0
MAX_BACKOFF = 30.0
MAX_PAGES = 10000
# Free space demanded beyond the bytes still to download: 1% of them plus 64 MiB.
SPACE_MARGIN_FRACTION = 0.01
SPACE_MARGIN_BYTES = 64 << 20

_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
VERIFY_MODES = ("full", "manifest")


class HubError(ValueError):
    """A fetch that cannot go on; the message says what was wrong and what to do."""


class DiskSpaceError(HubError):
    """dest lacks the space the listing needs; raised before anything is written."""


class VerificationError(HubError):
    """A file's content kept failing its hash check."""

    def __init__(self, path, expected, got, algorithm):
        super().__init__(
            f"{path}: {algorithm} mismatch after {VERIFY_ATTEMPTS} downloads: the hub "
            f"lists {expected}, the mirror sent bytes hashing to {got}. The bad copy is "
            f"in {STATE_DIR}/quarantine/; check the mirror (HF_ENDPOINT) or fetch from "
            "another one.")
        self.path, self.expected, self.got = path, expected, got


class _Transient(Exception):
    """A failure worth retrying (5xx, 429, dropped or stalled connection, short body)."""

    def __init__(self, msg, retry_after=None):
        super().__init__(msg)
        self.retry_after = retry_after


@dataclass(frozen=True)
class RepoFile:
    """One file of the listing: what its bytes must hash to."""

    path: str
    size: int
    algorithm: str  # "sha256" for LFS files, "sha1" (git blob) for the others
    digest: str

    def hasher(self):
        if self.algorithm == "sha256":
            return hashlib.sha256()
        h = hashlib.sha1()
        h.update(b"blob %d\0" % self.size)
        return h


# ---------------------------------------------------------------- validation helpers

def validate_repo_id(repo_id):
    if not isinstance(repo_id, str) or not _REPO_ID.match(repo_id) or ".." in repo_id:
        raise HubError(f"repo_id {repo_id!r} is not a Hugging Face repo id: use "
                       "'org/name' (letters, digits, '.', '_', '-').")
    return repo_id


def normalize_endpoint(endpoint):
    """Strip the trailing slash; refuse what is not an http(s) URL."""
    endpoint = (endpoint or "").strip().rstrip("/")
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise HubError(f"endpoint {endpoint!r} is not an http(s) URL: give the mirror's "
                       "base URL, e.g. https://hf-mirror.example.com (like HF_ENDPOINT).")
    return endpoint


def redact_url(url):
    """The URL without user:password, for messages and the manifest."""
    parts = urlsplit(url)
    if parts.username or parts.password:
        parts = parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else ""))
    return urlunsplit(parts)


def safe_relpath(path):
    """A listing path must stay inside dest and outside our state folder."""
    if (not isinstance(path, str) or not path or path.startswith("/") or "\\" in path
            or "\0" in path):
        raise HubError(f"the listing names an unsafe path {path!r}; refusing to write it.")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts) or parts[0] == STATE_DIR:
        raise HubError(f"the listing names an unsafe path {path!r}; refusing to write it.")
    return path


def parse_tree(items):
    """Tree API entries -> RepoFile list (directories skipped)."""
    files = []
    for item in items:
        if item.get("type") != "file":
            continue
        path = safe_relpath(item.get("path"))
        lfs = item.get("lfs") or None
        if lfs:
            algorithm, digest = "sha256", str(lfs.get("oid") or lfs.get("sha256") or "")
            size = lfs.get("size", item.get("size"))
            ok = _HEX64.match(digest)
        else:
            algorithm, digest, size = "sha1", str(item.get("oid") or ""), item.get("size")
            ok = _HEX40.match(digest)
        if not ok or not isinstance(size, int) or size < 0:
            raise HubError(f"the listing entry for {path!r} has no usable size/hash "
                           f"({item!r}); the mirror does not serve the tree API with hashes.")
        files.append(RepoFile(path, size, algorithm, digest))
    return files


def filter_files(files, allow_patterns=None, ignore_patterns=None):
    """fnmatch filtering as huggingface_hub's filter_repo_objects: 'dir/' means 'dir/*'."""
    def norm(patterns):
        if patterns is None:
            return None
        if isinstance(patterns, str):
            patterns = [patterns]
        return [p + "*" if p.endswith("/") else p for p in patterns]

    allow, ignore = norm(allow_patterns), norm(ignore_patterns)
    return [f for f in files
            if (allow is None or any(fnmatch.fnmatch(f.path, p) for p in allow))
            and not (ignore and any(fnmatch.fnmatch(f.path, p) for p in ignore))]


# ---------------------------------------------------------------- HTTP client

class HubClient:
    """requests-based client with retries (backoff, Retry-After) for the HF API subset."""

    def __init__(self, endpoint, token=None, timeout=30.0, retries=5, backoff=1.0,
                 session=None):
        self.endpoint = normalize_endpoint(endpoint)
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.session = session or requests.Session()
        self.session.headers["User-Agent"] = "gpufleet-hf_model/1"
        if token:
            # requests drops Authorization when a redirect goes to another host (LFS CDN).
            self.session.headers["Authorization"] = f"Bearer {token}"

    # -- one attempt -------------------------------------------------------------
    def open(self, url, headers=None, stream=False, params=None):
        """One GET. Returns the response (2xx/416) or raises _Transient / HubError."""
        try:
            resp = self.session.get(url, headers=headers, params=params, stream=stream,
                                    timeout=self.timeout, allow_redirects=True)
        except (requests.ConnectionError, requests.Timeout,
                requests.exceptions.ChunkedEncodingError,
                requests.exceptions.ContentDecodingError) as exc:
            raise _Transient(f"connection to {redact_url(url)} failed: "
                             f"{type(exc).__name__}") from None
        code = resp.status_code
        if code < 400 or code == 416:
            return resp
        retry_after = _retry_after(resp.headers.get("Retry-After"))
        resp.close()
        if code == 429 or code >= 500:
            raise _Transient(f"{redact_url(url)} answered {code}", retry_after)
        error_code = resp.headers.get("X-Error-Code", "")
        hint = {
            401: "the repo is private or gated (give a token) or does not exist",
            403: "the token may not read this repo",
            404: "the repo, revision or file does not exist on this endpoint",
        }.get(code, "the mirror refused the request")
        raise HubError(f"{redact_url(url)} answered {code} {error_code}".rstrip()
                       + f": {hint}.")

    def wait(self, attempt, retry_after=None):
        if retry_after is not None:
            delay = min(retry_after, MAX_RETRY_AFTER)
        else:
            delay = min(self.backoff * (2 ** attempt), MAX_BACKOFF)
            delay *= 0.5 + random.random() / 2
        time.sleep(delay)

    def get_json(self, url, params=None):
        """GET with retries; returns (json, response links)."""
        for attempt in range(self.retries + 1):
            try:
                resp = self.open(url, params=params)
                try:
                    return resp.json(), resp.links
                except ValueError:
                    raise _Transient(f"{redact_url(url)} did not answer JSON") from None
            except _Transient as exc:
                if attempt >= self.retries:
                    raise HubError(f"{exc} (gave up after {self.retries + 1} attempts); "
                                   "check the mirror or raise retries/timeout.") from None
                self.wait(attempt, exc.retry_after)
        raise AssertionError("unreachable")

    # -- API ---------------------------------------------------------------------
    def api_url(self, repo_id, *tail):
        return "/".join([self.endpoint, "api/models", repo_id] + list(tail))

    def resolve_commit(self, repo_id, revision):
        url = self.api_url(repo_id, "revision", quote(revision, safe=""))
        data, _ = self.get_json(url)
        sha = data.get("sha") if isinstance(data, dict) else None
        if not isinstance(sha, str) or not _HEX40.match(sha):
            raise HubError(f"{redact_url(url)} gave no commit sha for revision "
                           f"{revision!r}; is the endpoint a Hugging Face mirror?")
        return sha

    def list_files(self, repo_id, commit):
        url = self.api_url(repo_id, "tree", commit)
        params = {"recursive": "true", "expand": "false"}
        items = []
        for _ in range(MAX_PAGES):
            page, links = self.get_json(url, params=params)
            if not isinstance(page, list):
                raise HubError(f"{redact_url(url)} did not answer a tree listing.")
            items.extend(page)
            url = links.get("next", {}).get("url")
            if not url:
                return parse_tree(items)
            params = None  # the next link carries its own query
        raise HubError(f"the tree listing of {repo_id} has more than {MAX_PAGES} pages.")

    def file_url(self, repo_id, commit, path):
        return f"{self.endpoint}/{repo_id}/resolve/{commit}/{quote(path, safe='/')}"


def _retry_after(value):
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError):
        return None


# ---------------------------------------------------------------- manifest

def state_dir(dest):
    return os.path.join(dest, STATE_DIR)


def load_manifest(dest):
    """The manifest's files dict ({} when absent or unreadable: then nothing is trusted)."""
    try:
        with open(os.path.join(state_dir(dest), MANIFEST_NAME), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        return {}
    files = data.get("files")
    return files if isinstance(files, dict) else {}


def _write_json_atomic(path, data):
    """Replace path atomically, keeping the mode and owner a role may have given it."""
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.write("\n")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        pass
    else:
        os.chmod(tmp, st.st_mode & 0o7777)
        try:
            os.chown(tmp, st.st_uid, st.st_gid)
        except PermissionError:
            pass
    os.replace(tmp, path)


def manifest_trusts(entry, f, st):
    """verify=manifest: the manifest's hash is the listing's and size+mtime are unchanged."""
    return (isinstance(entry, dict) and entry.get(f.algorithm) == f.digest
            and entry.get("size") == f.size == st.st_size
            and entry.get("mtime_ns") == st.st_mtime_ns)


def _outdated(entry, f, st):
    """The manifest verified this file with another hash (an earlier revision), and it
    has not been touched since: replace it without hashing or quarantining it."""
    return (isinstance(entry, dict) and entry.get("size") == st.st_size
            and entry.get("mtime_ns") == st.st_mtime_ns
            and any(entry.get(a) not in (None, f.digest) for a in ("sha256", "sha1")))


# ---------------------------------------------------------------- disk space

def check_disk_space(dest, needed):
    """Raise DiskSpaceError when the filesystem of dest lacks needed bytes + margin."""
    probe = os.path.abspath(dest)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    free = shutil.disk_usage(probe).free
    want = needed + int(needed * SPACE_MARGIN_FRACTION) + SPACE_MARGIN_BYTES if needed else 0
    if free < want:
        raise DiskSpaceError(
            f"{dest} has {_gib(free)} free; this fetch needs {_gib(needed)} plus a margin "
            f"({_gib(want)} in all). Free space or choose another dest; nothing was written.")


def _gib(n):
    return f"{n / (1 << 30):.2f} GiB"


# ---------------------------------------------------------------- the fetch

class _Stats:
    def __init__(self, dest, total_files, total_bytes, write_progress):
        self.lock = threading.Lock()
        self.bytes_downloaded = 0
        self.bytes_verified = 0
        self.files_done = 0
        self.total_files, self.total_bytes = total_files, total_bytes
        self.path = os.path.join(state_dir(dest), PROGRESS_NAME) if write_progress else None
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
        _write_json_atomic(self.path, {
            "files_done": self.files_done, "files_total": self.total_files,
            "bytes_downloaded": self.bytes_downloaded, "bytes_verified": self.bytes_verified,
            "bytes_total": self.total_bytes, "updated": _now()})


def _now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


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
            size = os.path.getsize(path)
        except OSError:
            size = 0
        if 0 < size <= f.size:
            # the only way to continue a sha256 is to hash what is already there (once)
            with open(path, "rb") as fh:
                while chunk := fh.read(CHUNK):
                    self.hasher.update(chunk)
                    self.offset += len(chunk)
        elif size:
            os.unlink(path)

    def restart(self):
        self.hasher, self.offset = self.f.hasher(), 0
        with open(self.path, "wb"):
            pass


class Fetcher:
    """Brings dest to exactly the listed files of one commit, verifying every byte."""

    def __init__(self, client, repo_id, commit, dest, verify="manifest", max_workers=8):
        self.client, self.repo_id, self.commit = client, repo_id, commit
        self.dest, self.verify, self.max_workers = dest, verify, max_workers
        self.quarantined = []
        self._qlock = threading.Lock()
        self.stats = None

    # -- paths ---------------------------------------------------------------------
    def final_path(self, f):
        return os.path.join(self.dest, *f.path.split("/"))

    def partial_path(self, f):
        return os.path.join(state_dir(self.dest), "incomplete",
                            f"{_flat(f.path)}.{f.digest[:16]}.incomplete")

    def quarantine(self, f, src, got):
        qdir = os.path.join(state_dir(self.dest), "quarantine")
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
                st = os.stat(self.final_path(f))
            except FileNotFoundError:
                plan.append((f, "missing"))
                continue
            if not os.path.isfile(self.final_path(f)) or st.st_size != f.size:
                plan.append((f, "stale"))  # another revision's file, or a broken one
            elif self.verify == "manifest" and manifest_trusts(manifest.get(f.path), f, st):
                plan.append((f, "trusted"))
            elif self.verify == "manifest" and _outdated(manifest.get(f.path), f, st):
                plan.append((f, "outdated"))  # the verified file of another revision
            else:
                plan.append((f, "present"))
        return plan

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
    def run(self, plan, write_progress=True):
        total = sum(f.size for f, _ in plan)
        os.makedirs(os.path.join(state_dir(self.dest), "incomplete"), exist_ok=True)
        self.stats = _Stats(self.dest, len(plan), total, write_progress)
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
            got = self._hash_file(final, f)
            if got == f.digest:
                self.stats.add(file_done=True)
                return "verified"
            self.quarantine(f, final, got)  # rotten or foreign bytes leave the final name
        elif state == "stale":
            self.quarantine(f, final, f"size {os.path.getsize(final)}")
        elif state == "outdated":
            os.unlink(final)  # no mix of revisions under final names, even if this run fails
        self._download(f)
        self.stats.add(file_done=True)
        return "downloaded"

    def _hash_file(self, path, f):
        h = f.hasher()
        with open(path, "rb") as fh:
            while chunk := fh.read(CHUNK):
                h.update(chunk)
                self.stats.add(verified=len(chunk))
        return h.hexdigest()

    def _download(self, f):
        partial_path = self.partial_path(f)
        for attempt in range(VERIFY_ATTEMPTS):
            part = _Partial(f, partial_path)
            self.stats.add(verified=part.offset)
            got = self._stream(f, part)
            if got == f.digest:
                with open(partial_path, "rb+") as fh:
                    os.fsync(fh.fileno())
                final = self.final_path(f)
                os.makedirs(os.path.dirname(final), exist_ok=True)
                os.replace(partial_path, final)
                return
            self.quarantine(f, partial_path, got)
        raise VerificationError(f.path, f.digest, got, f.algorithm)

    def _stream(self, f, part):
        """Fill part up to f.size, resuming with Range; returns the hex digest."""
        url = self.client.file_url(self.repo_id, self.commit, f.path)
        failures = 0
        if not os.path.exists(part.path):
            part.restart()
        while part.offset < f.size:
            start = part.offset
            try:
                self._stream_once(f, part, url)
                if part.offset == f.size:
                    break
                raise _Transient(f"{f.path}: the body ended after {part.offset} of "
                                 f"{f.size} bytes")
            except _Transient as exc:
                failures = 0 if part.offset > start else failures + 1
                if failures > self.client.retries:
                    raise HubError(f"{f.path}: {exc}; gave up after {failures} attempts "
                                   f"without progress ({part.offset} of {f.size} bytes kept "
                                   "for the next run). Check the mirror or raise "
                                   "retries/timeout.") from None
                self.client.wait(failures, exc.retry_after)
        return part.hasher.hexdigest()

    def _stream_once(self, f, part, url):
        headers = {"Range": f"bytes={part.offset}-"} if part.offset else None
        resp = self.client.open(url, headers=headers, stream=True)
        with resp:
            if resp.status_code == 416:
                part.restart()  # the mirror disowns our offset: start the file over
                raise _Transient(f"{f.path}: the mirror refused Range {part.offset}-")
            if part.offset and resp.status_code == 206:
                start = _content_range_start(resp.headers.get("Content-Range"))
                if start != part.offset:
                    part.restart()
                    raise _Transient(f"{f.path}: the mirror answered the wrong range")
            elif part.offset:
                part.restart()  # no Range support (200): this file starts over
            # read1: what has arrived, so bytes before a drop are kept (read(n) would
            # buffer up to n and lose them with the connection); urllib3 2 has it
            read1 = getattr(resp.raw, "read1", None)
            with open(part.path, "ab") as out:
                while part.offset < f.size:
                    try:
                        chunk = (read1(CHUNK, decode_content=True) if read1 else
                                 resp.raw.read(LEGACY_CHUNK, decode_content=True))
                    except (requests.RequestException, urllib3.exceptions.HTTPError,
                            OSError) as exc:
                        raise _Transient(f"{f.path}: connection lost after {part.offset} "
                                         f"of {f.size} bytes ({type(exc).__name__})") from None
                    if not chunk:
                        break
                    chunk = chunk[:f.size - part.offset]
                    out.write(chunk)  # a disk error (full, read-only) is not retried
                    part.hasher.update(chunk)
                    part.offset += len(chunk)
                    self.stats.add(downloaded=len(chunk), verified=len(chunk))


def _content_range_start(value):
    m = re.match(r"bytes (\d+)-", value or "")
    return int(m.group(1)) if m else None


# ---------------------------------------------------------------- entry point

class _Lock:
    """One fetch per dest at a time (fcntl lock on dest/.gpufleet/lock)."""

    def __init__(self, dest):
        os.makedirs(state_dir(dest), exist_ok=True)
        self.fh = open(os.path.join(state_dir(dest), "lock"), "w")
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.fh.close()
            raise HubError(f"another fetch is writing into {dest}; wait for it to "
                           "finish (or stop it) and run again.") from None

    def release(self):
        self.fh.close()


def sync_repo(client, repo_id, revision, dest, allow_patterns=None, ignore_patterns=None,
              verify="manifest", max_workers=8, check_mode=False):
    """Make dest hold the verified files of repo_id@revision. Returns a result dict.

    Raises HubError (DiskSpaceError, VerificationError) with a message for the user.
    """
    validate_repo_id(repo_id)
    if verify not in VERIFY_MODES:
        raise HubError(f"verify must be one of {', '.join(VERIFY_MODES)}, not {verify!r}.")
    if int(max_workers) < 1:
        raise HubError("max_workers must be at least 1.")
    if not revision:
        raise HubError("revision must be a branch, tag or commit sha, e.g. 'main'.")
    dest = os.path.abspath(dest)
    if os.path.exists(dest) and not os.path.isdir(dest):
        raise HubError(f"dest {dest} exists and is not a directory.")

    commit = client.resolve_commit(repo_id, revision)
    listing = client.list_files(repo_id, commit)
    files = filter_files(listing, allow_patterns, ignore_patterns)
    if not files:
        raise HubError(f"no file of {repo_id}@{commit} matches allow_patterns/"
                       "ignore_patterns; check the patterns.")
    manifest = load_manifest(dest)
    fetcher = Fetcher(client, repo_id, commit, dest, verify, int(max_workers))
    plan = fetcher.classify(files, manifest)
    kept, deleted = leftovers(dest, listing, {f.path for f in files}, manifest)
    needed = fetcher.bytes_to_fetch(plan)
    check_disk_space(dest, needed)

    result = {"commit": commit, "bytes_to_download": needed, "quarantined": [],
              "removed": deleted, "manifest": os.path.join(state_dir(dest), MANIFEST_NAME)}
    if check_mode:
        would = {"missing": "would_download", "stale": "would_download",
                 "outdated": "would_download", "present": "would_verify",
                 "trusted": "trusted"}
        result.update(changed=bool(deleted)
                      or any(would[s] == "would_download" for _, s in plan),
                      bytes_downloaded=0,
                      bytes_verified=0,
                      files=[_file_result(f, would[s]) for f, s in plan])
        return result

    os.makedirs(dest, exist_ok=True)
    lock = _Lock(dest)
    try:
        outcome, errors = fetcher.run(plan)
        for path in deleted:
            os.unlink(os.path.join(dest, *path.split("/")))
        changed = _write_manifest(dest, client, repo_id, revision, commit, fetcher, plan,
                                  outcome, manifest, kept)
    finally:
        lock.release()
    changed = changed or bool(deleted) or bool(fetcher.quarantined) \
        or any(s == "downloaded" for s in outcome.values())
    result.update(
        changed=changed, quarantined=fetcher.quarantined,
        bytes_downloaded=fetcher.stats.bytes_downloaded,
        bytes_verified=fetcher.stats.bytes_verified,
        files=[_file_result(f, outcome.get(f.path, "failed")) for f, _ in plan])
    if errors:
        msgs = "; ".join(str(e) for e in errors)
        exc = HubError(f"{len(errors)} of {len(plan)} files failed: {msgs}")
        exc.result = result  # what was done before the failure, for the module's report
        raise exc
    return result


def _file_result(f, status):
    return {"path": f.path, "size": f.size, "algorithm": f.algorithm, "digest": f.digest,
            "status": status}


def leftovers(dest, listing, planned, manifest):
    """Manifest entries outside this run's files -> (kept, deleted).

    kept: still in the repo with the same hash and untouched since verified (fetched by an
    earlier run with other patterns): they stay in the manifest. deleted: gone from the
    repo at this commit and untouched since verified: ours to remove, so no stray shard
    of an old revision is left for vLLM to load. Files we did not verify are never touched.
    """
    by_path = {f.path: f for f in listing}
    kept, deleted = {}, []
    for path, entry in sorted(manifest.items()):
        try:
            st = os.stat(os.path.join(dest, *safe_relpath(path).split("/")))
        except (HubError, OSError):
            continue
        if path in planned or not isinstance(entry, dict):
            continue
        f = by_path.get(path)
        if f is not None:
            if manifest_trusts(entry, f, st):
                kept[path] = entry
        elif entry.get("size") == st.st_size and entry.get("mtime_ns") == st.st_mtime_ns:
            deleted.append(path)
    return kept, deleted


def _write_manifest(dest, client, repo_id, revision, commit, fetcher, plan, outcome, old,
                    kept):
    """Record the verified files; returns True when the file list changed."""
    verified = [f for f, _ in plan if f.path in outcome]
    files = {**kept, **manifest_entries(dest, verified)}
    if files == old and len(verified) == len(plan):
        return False
    write_manifest(dest, repo_id, revision, commit, client.endpoint, files,
                   complete=len(verified) == len(plan))
    return True


def manifest_entries(dest, files):
    """{path: {size, sha256|sha1, mtime_ns}} of RepoFiles whose bytes were verified."""
    entries = {}
    for f in files:
        st = os.stat(os.path.join(dest, *f.path.split("/")))
        entries[f.path] = {"size": f.size, f.algorithm: f.digest, "mtime_ns": st.st_mtime_ns}
    return entries


def write_manifest(dest, repo_id, revision, commit, endpoint, entries, complete=True):
    """dest/.gpufleet/manifest.json: what was verified, when, from where (never a token)."""
    os.makedirs(state_dir(dest), exist_ok=True)
    _write_json_atomic(os.path.join(state_dir(dest), MANIFEST_NAME), {
        "format": MANIFEST_FORMAT, "repo_id": repo_id, "revision": revision,
        "commit": commit, "endpoint": redact_url(endpoint), "verified_at": _now(),
        "complete": complete, "files": entries})
