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
No Ansible imports: the module ``plugins/modules/hf_model.py`` is a thin shell around
:func:`sync_repo`.
"""
from __future__ import annotations

import datetime
import fcntl
import fnmatch
import hashlib
import http.client
import json
import os
import random
import re
import shutil
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import quote, urljoin, urlsplit, urlunsplit

try:
    import requests
    import urllib3
except ImportError:  # the plain logic (names, manifests) still imports; HubClient says what is missing
    requests = urllib3 = None
HAS_REQUESTS = requests is not None

from . import model_lock
from .bounded import Decoder

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
MAX_REDIRECTS = 10
# Limits against a hostile or broken mirror (hf_model options of the same names).
MAX_API_BYTES = 64 << 20  # one API answer (repo info, one listing page), decompressed
MAX_LISTING_ENTRIES = 10000  # entries (files and folders) of one repo listing
DEADLINE = 86400.0  # seconds the whole fetch may take (0: no limit)
MIN_RATE = 1024  # bytes/s a download must average over `timeout` seconds (0: no floor)
MAX_FILE_ATTEMPTS = 20  # requests for one file's bytes in a run
MAX_TOTAL_RETRIES = 100  # failed requests retried across the whole fetch
# Inodes demanded beyond the files and folders a fetch creates (state files, temp files).
INODE_MARGIN = 64
# Free space demanded beyond the bytes still to download: 1% of them plus 64 MiB.
SPACE_MARGIN_FRACTION = 0.01
SPACE_MARGIN_BYTES = 64 << 20

_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
# Never in a revision or a listed file name: quotes, backslashes, whitespace (Unicode too)
# and control characters (C0, DEL, C1).
_UNSAFE_NAME_CHARS = re.compile(r"[\s\"'`\\\x00-\x1f\x7f-\x9f]")
_DEFAULT_PORTS = {"http": 80, "https": 443}
VERIFY_MODES = ("full", "manifest")


class HubError(ValueError):
    """A fetch that cannot go on; the message says what was wrong and what to do."""


class DiskSpaceError(HubError):
    """dest lacks the space the listing needs; raised before anything is written."""


class UnsafePathError(HubError):
    """A name or path that could leave its root (dest, the site root) or inject lines."""


class ShortFileError(HubError):
    """The mirror's copy of a file is shorter than the listing says."""

    def __init__(self, path, have, size, how):
        super().__init__(
            f"{path}: the mirror's copy is short: it has {have} of the {size} bytes the "
            f"listing gives ({how}). The {have} bytes received are kept in "
            f"{STATE_DIR}/incomplete/; fix the mirror's copy or fetch from another mirror.")
        self.path, self.have, self.size = path, have, size


class DeadlineError(HubError):
    """The fetch ran past its deadline."""


class VerificationError(HubError):
    """A file's content kept failing its hash check."""

    def __init__(self, path, expected, got, algorithm):
        super().__init__(
            f"{path}: {algorithm} mismatch after {VERIFY_ATTEMPTS} downloads: the hub "
            f"lists {expected}, the mirror sent bytes hashing to {got}. The bad copy is "
            f"in {STATE_DIR}/quarantine/; check the mirror (HF_ENDPOINT) or fetch from "
            "another one.")
        self.path, self.expected, self.got = path, expected, got


class LockMismatchError(HubError):
    """The endpoint's commit, listing or bytes differ from the model's lock (model_lock)."""


class _Transient(Exception):
    """A failure worth retrying (5xx, 429, dropped or stalled connection, short body)."""

    def __init__(self, msg, retry_after=None, slow=False):
        super().__init__(msg)
        self.retry_after = retry_after
        self.slow = slow  # slower than min_rate: bytes it brought do not count as progress


@dataclass(frozen=True)
class RepoFile:
    """One file of the listing: what its bytes must hash to."""

    path: str
    size: int
    algorithm: str  # "sha256" for LFS files, "sha1" (git blob) for the others
    digest: str
    pinned: str | None = None  # the sha256 the model's lock pins (model_lock), if any

    def hasher(self):
        if self.algorithm == "sha256":
            return hashlib.sha256()
        h = hashlib.sha1()
        h.update(b"blob %d\0" % self.size)
        # a locked sha1-listed file is also hashed with sha256 (one read of the bytes)
        return _PinnedHasher(h) if self.pinned else h

    def pinned_ok(self, hasher):
        """The lock's word on bytes that matched the listing: None when no lock pins this
        file, else the sha256 they hash to (equal to self.pinned or not)."""
        if not self.pinned:
            return None
        return self.digest if self.algorithm == "sha256" else hasher.sha256.hexdigest()


class _PinnedHasher:
    """The listing's git-blob sha1 (hexdigest) and the lock's sha256 at once."""

    def __init__(self, sha1):
        self.sha1, self.sha256 = sha1, hashlib.sha256()

    def update(self, data):
        self.sha1.update(data)
        self.sha256.update(data)

    def hexdigest(self):
        return self.sha1.hexdigest()


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
    try:
        parts = urlsplit(url)
        if parts.username or parts.password:
            parts = parts._replace(netloc=parts.netloc.rsplit("@", 1)[1])
        return urlunsplit(parts)
    except ValueError:
        return _scrub(str(url))


def _scrub(text):
    """Credentials (user:password@) out of any text that may hold a URL."""
    return re.sub(r"//[^/@\s'\"]*@", "//", str(text))


def origin(url):
    """(scheme, host, port) of an http(s) URL; HubError for anything else."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise HubError(f"{redact_url(url)} is not a valid URL.") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise HubError(f"{redact_url(url)} is not an http(s) URL.")
    return scheme, parts.hostname.lower(), port or _DEFAULT_PORTS[scheme]


def validate_name(value, what):
    """The one check of a revision or a listed file name (hf_model, hf_mirror_index).

    What the Hub allows (git ref and path rules): no quotes, backslashes, whitespace,
    control characters or newlines, no absolute path, no empty, '.' or '..' component
    (and, as git refs, no '..' anywhere in a revision). Raises UnsafePathError.
    """
    problem = None
    if not isinstance(value, str) or not value:
        problem = "empty or not a string"
    elif _UNSAFE_NAME_CHARS.search(value):
        problem = "quotes, backslashes, whitespace or control characters"
    elif value.startswith("/"):
        problem = "an absolute path"
    elif any(p in ("", ".", "..") for p in value.split("/")):
        problem = "an empty, '.' or '..' component"
    elif what == "revision" and ".." in value:
        problem = "'..'"
    if problem:
        raise UnsafePathError(f"unsafe {what} {value!r} ({problem}): the Hub allows none of "
                              "these; refusing it.")
    return value


def safe_relpath(path):
    """A listing path must stay inside dest and outside our state folder."""
    validate_name(path, "path")
    if path.split("/")[0] == STATE_DIR:
        raise UnsafePathError(f"unsafe path {path!r} (the state folder {STATE_DIR}); "
                              "refusing it.")
    return path


def path_under(root, rel, final_may_be_link=False):
    """root/rel, checked before it is opened: no existing component below root is a
    symbolic link (the last one may be when final_may_be_link: it is then replaced or
    removed, never followed) and the path resolves under root. Raises UnsafePathError."""
    parts = validate_name(rel, "path").split("/")
    path = root
    for i, part in enumerate(parts):
        path = os.path.join(path, part)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            break
        except NotADirectoryError:
            raise UnsafePathError(f"{path}: a file stands where a folder is needed; "
                                  "remove it and run again.") from None
        if stat.S_ISLNK(st.st_mode) and not (final_may_be_link and i == len(parts) - 1):
            raise UnsafePathError(
                f"{path} is a symbolic link inside {root}; gpufleet never writes through "
                "links there: remove it (or make it a real folder) and run again.")
    path = os.path.join(root, *parts)
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.dirname(path) if final_may_be_link else path)
    if os.path.commonpath([real_root, real]) != real_root:
        raise UnsafePathError(f"{path} resolves to {real}, outside {root}; refusing it.")
    return path


def parse_tree(items):
    """Tree API entries -> RepoFile list (directories skipped). A listing that cannot
    describe one tree is refused before anything is downloaded: the same path twice (two
    downloads would write one partial file, and the manifest would call it complete), or a
    path that is a file and a folder at once. Messages quote at most 200 characters of an
    entry."""
    files, folders = [], set()
    for item in items:
        if not isinstance(item, dict):
            raise HubError(f"the listing has an entry that is not an object ({item!r:.80}); "
                           "the mirror does not serve the tree API.")
        if item.get("type") == "directory":
            folders.add(safe_relpath(item.get("path")))
            continue
        if item.get("type") != "file":
            continue
        path = safe_relpath(item.get("path"))
        lfs = item.get("lfs") or None
        if lfs and not isinstance(lfs, dict):
            lfs = {}
        if lfs:
            algorithm, digest = "sha256", str(lfs.get("oid") or lfs.get("sha256") or "")
            size = lfs.get("size", item.get("size"))
            ok = _HEX64.match(digest)
        else:
            algorithm, digest, size = "sha1", str(item.get("oid") or ""), item.get("size")
            ok = _HEX40.match(digest)
        if not ok or not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise HubError(f"the listing entry for {path!r:.200} has no usable size/hash "
                           f"({item!r:.200}); the mirror does not serve the tree API with hashes.")
        files.append(RepoFile(path, size, algorithm, digest))
    _check_one_tree(files, folders)
    return files


def _check_one_tree(files, folders):
    """Refuse a listing whose paths cannot all exist at once (see parse_tree)."""
    seen = set()
    for f in files:
        if f.path in seen:
            raise HubError(f"the listing names {f.path!r:.200} twice: it does not describe one "
                           "tree, so nothing was downloaded. Fix the mirror (or the proxy in "
                           "front of it) that serves this listing.")
        seen.add(f.path)
    parents = set(folders)
    for f in files:
        parts = f.path.split("/")[:-1]
        parents.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    both = sorted(seen & parents)
    if both:
        raise HubError(f"the listing names {both[0]!r:.200} as a file and as a folder: it does "
                       "not describe one tree, so nothing was downloaded. Fix the mirror that "
                       "serves this listing.")


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
    """requests-based client with retries (backoff, Retry-After) for the HF API subset.

    Hostile mirrors are bounded: the token goes only to the endpoint's origin (scheme,
    host, port), redirects are followed by hand (at most MAX_REDIRECTS, no loops, http(s)
    only), an API answer is read up to max_api_bytes (decompressed), a download slower
    than min_rate over `timeout` seconds is cut, retries are limited per request
    (retries), per file (max_file_attempts) and per fetch (max_total_retries), and the
    whole fetch has a deadline. start() (called by sync_repo) starts the clock.
    """

    def __init__(self, endpoint, token=None, timeout=30.0, retries=5, backoff=1.0,
                 session=None, max_api_bytes=MAX_API_BYTES,
                 max_listing_entries=MAX_LISTING_ENTRIES, deadline=DEADLINE,
                 min_rate=MIN_RATE, max_file_attempts=MAX_FILE_ATTEMPTS,
                 max_total_retries=MAX_TOTAL_RETRIES):
        self.endpoint = normalize_endpoint(endpoint)
        self.origin = origin(self.endpoint)
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.max_api_bytes = int(max_api_bytes)
        self.max_listing_entries = int(max_listing_entries)
        self.deadline = float(deadline or 0)
        self.min_rate = float(min_rate or 0)
        self.max_file_attempts = int(max_file_attempts)
        self.max_total_retries = int(max_total_retries)
        for name in ("timeout", "max_api_bytes", "max_listing_entries", "max_file_attempts"):
            if getattr(self, name) <= 0:
                raise HubError(f"{name} must be > 0.")
        for name in ("retries", "backoff", "deadline", "min_rate", "max_total_retries"):
            if getattr(self, name) < 0:
                raise HubError(f"{name} must be >= 0.")
        if session is None and not HAS_REQUESTS:
            raise HubError("talking to a hub needs the Python library requests on this host "
                           "(Debian: python3-requests; or pip install requests).")
        self.session = session or requests.Session()
        self.session.headers["User-Agent"] = "gpufleet-hf_model/1"
        # Not a session header: open() adds it only to requests for the endpoint's origin.
        self._token = token or None
        self._lock = threading.Lock()
        self.api_bytes = 0  # decompressed bytes of API answers read (tests, reports)
        self.start()

    def start(self):
        """Start the fetch's deadline and its budget of retries."""
        with self._lock:
            self._deadline_at = time.monotonic() + self.deadline if self.deadline else None
            self._retries_left = self.max_total_retries

    def time_left(self):
        """Seconds before the deadline (None: no deadline); DeadlineError once past it."""
        if self._deadline_at is None:
            return None
        left = self._deadline_at - time.monotonic()
        if left <= 0:
            raise DeadlineError(
                f"gave up: the fetch ran past its deadline ({self.deadline:g} s); partial "
                f"files are kept in {STATE_DIR}/incomplete/ for the next run: run again or "
                "raise deadline.")
        return left

    def same_origin(self, url):
        try:
            return origin(url) == self.origin
        except HubError:
            return False

    # -- one attempt -------------------------------------------------------------
    def open(self, url, headers=None, params=None, allow_416=False, encoding="identity"):
        """One GET (redirects followed here). Returns the streamed response (2xx, or 416
        when allow_416) or raises _Transient / HubError. The caller closes it."""
        first, seen = url, {url}
        for _hop in range(MAX_REDIRECTS + 1):
            origin(url)  # http(s) only
            hdrs = {"Accept-Encoding": encoding, **(headers or {})}
            if self._token and self.same_origin(url):
                hdrs["Authorization"] = f"Bearer {self._token}"
            left = self.time_left()
            try:
                resp = self.session.get(url, headers=hdrs, params=params, stream=True,
                                        allow_redirects=False,
                                        timeout=self.timeout if left is None
                                        else min(self.timeout, left))
            except (requests.ConnectionError, requests.Timeout,
                    requests.exceptions.ChunkedEncodingError,
                    requests.exceptions.ContentDecodingError) as exc:
                raise _Transient(f"connection to {redact_url(url)} failed: "
                                 f"{type(exc).__name__}") from None
            except (requests.RequestException, urllib3.exceptions.HTTPError,
                    http.client.HTTPException, OSError, ValueError) as exc:
                raise HubError(f"request to {redact_url(url)} failed: "
                               f"{type(exc).__name__}: {_scrub(exc)}") from None
            if not resp.is_redirect:
                break
            try:
                target = self.session.get_redirect_target(resp)
                resp.close()
                nxt = urljoin(resp.url, target)
            except (ValueError, UnicodeError):
                raise HubError(f"{redact_url(url)} redirected to an unreadable Location; "
                               "check the mirror.") from None
            try:
                origin(nxt)
            except HubError:
                raise HubError(f"{redact_url(url)} redirected to {redact_url(nxt)}, not an "
                               "http(s) URL; refusing to follow it.") from None
            if nxt in seen:
                raise HubError(f"{redact_url(first)}: redirect loop (back to "
                               f"{redact_url(nxt)}); check the mirror.")
            seen.add(nxt)
            url, params = nxt, None
        else:
            resp.close()
            raise HubError(f"{redact_url(first)}: more than {MAX_REDIRECTS} redirects; "
                           "check the mirror.")
        code = resp.status_code
        if 200 <= code < 300 or (code == 416 and allow_416):
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

    def iter_body(self, resp, url, room):
        """The decoded body of resp in pieces, at most `room` bytes in all (the rest is
        never read). Decodes gzip/deflate itself, never more than a chunk at a time, so a
        compression bomb costs no memory. Raises _Transient when the connection drops,
        stalls (timeout) or averages less than min_rate over `timeout` seconds."""
        decoder = Decoder(resp.headers.get("Content-Encoding"), redact_url(url),
                          error=HubError, corrupt=_Transient)
        read1 = getattr(resp.raw, "read1", None)
        t0, n0 = time.monotonic(), 0
        while room > 0:
            self.time_left()
            try:
                raw = (read1(CHUNK, decode_content=False) if read1 else
                       resp.raw.read(LEGACY_CHUNK, decode_content=False))
            except (requests.RequestException, urllib3.exceptions.HTTPError,
                    http.client.HTTPException, OSError, ValueError) as exc:
                raise _Transient(f"connection to {redact_url(url)} lost "
                                 f"({type(exc).__name__})") from None
            for piece in decoder.feed(raw, room):
                room -= len(piece)
                yield piece
            if not raw:
                return
            n0 += len(raw)
            now = time.monotonic()
            if self.min_rate and now - t0 >= self.timeout:
                if n0 < self.min_rate * (now - t0):
                    raise _Transient(f"{redact_url(url)} sent {n0 / (now - t0):.0f} bytes/s "
                                     f"over {now - t0:.1f} s, below min_rate "
                                     f"({self.min_rate:g})", slow=True)
                t0, n0 = now, 0

    def wait(self, attempt, retry_after=None, reason="a request failed"):
        """Sleep before retry `attempt`; HubError when the fetch's retries are spent or
        the wait would pass the deadline."""
        with self._lock:
            if self._retries_left <= 0:
                raise HubError(f"{reason}; gave up: the fetch spent its "
                               f"{self.max_total_retries} retries (max_total_retries). "
                               "Check the mirror or raise max_total_retries.")
            self._retries_left -= 1
        if retry_after is not None:
            delay = min(retry_after, MAX_RETRY_AFTER)
        else:
            delay = min(self.backoff * (2 ** attempt), MAX_BACKOFF)
            delay *= 0.5 + random.random() / 2
        left = self.time_left()
        if left is not None and delay >= left:
            raise DeadlineError(f"{reason}; gave up: waiting {delay:.0f} s more would pass "
                                f"the fetch's deadline ({self.deadline:g} s). Run again "
                                "or raise deadline.")
        time.sleep(delay)

    def get_json(self, url, params=None):
        """GET with retries; returns (json, response links, final URL)."""
        for attempt in range(self.retries + 1):
            try:
                return self._get_json_once(url, params)
            except _Transient as exc:
                if attempt >= self.retries:
                    raise HubError(f"{exc} (gave up after {self.retries + 1} attempts); "
                                   "check the mirror or raise retries/timeout.") from None
                self.wait(attempt, exc.retry_after, str(exc))
        raise AssertionError("unreachable")

    def _get_json_once(self, url, params):
        resp = self.open(url, params=params, encoding="gzip, deflate")
        with resp:
            body = bytearray()
            for piece in self.iter_body(resp, url, self.max_api_bytes + 1):
                body += piece
            with self._lock:
                self.api_bytes += len(body)
            if len(body) > self.max_api_bytes:
                raise HubError(f"{redact_url(url)} answered more than {self.max_api_bytes} "
                               "bytes (max_api_bytes); stopped reading. Raise max_api_bytes "
                               "if this answer is really that large.")
            try:
                links = resp.links
            except (ValueError, TypeError, AttributeError):
                links = {}
            final = resp.url
        try:
            return json.loads(bytes(body)), links, final
        except RecursionError:
            raise HubError(f"{redact_url(url)} answered JSON nested too deeply to read; "
                           "check the mirror.") from None
        except ValueError:
            raise _Transient(f"{redact_url(url)} did not answer JSON") from None

    # -- API ---------------------------------------------------------------------
    def api_url(self, repo_id, *tail):
        return "/".join([self.endpoint, "api/models", repo_id] + list(tail))

    def resolve_commit(self, repo_id, revision):
        url = self.api_url(repo_id, "revision", quote(revision, safe=""))
        data, _links, _final = self.get_json(url)
        sha = data.get("sha") if isinstance(data, dict) else None
        if not isinstance(sha, str) or not _HEX40.match(sha):
            raise HubError(f"{redact_url(url)} gave no commit sha for revision "
                           f"{revision!r}; is the endpoint a Hugging Face mirror?")
        return sha

    def list_files(self, repo_id, commit):
        url = self.api_url(repo_id, "tree", commit)
        params = {"recursive": "true", "expand": "false"}
        items, seen = [], {url}
        for _page in range(MAX_PAGES):
            page, links, got = self.get_json(url, params=params)
            if not isinstance(page, list):
                raise HubError(f"{redact_url(url)} did not answer a tree listing.")
            items.extend(page)
            if len(items) > self.max_listing_entries:
                raise HubError(f"the listing of {repo_id} has more than "
                               f"{self.max_listing_entries} entries (max_listing_entries); "
                               "raise max_listing_entries if the repo really has that many "
                               "files.")
            nxt = (links.get("next") or {}).get("url")
            if not nxt:
                return parse_tree(items)
            nxt = urljoin(got, nxt)
            if not self.same_origin(nxt):
                raise HubError(f"the listing's next page {redact_url(nxt)} is not on the "
                               f"endpoint {redact_url(self.endpoint)} (scheme, host and "
                               "port must match); refusing to follow it: the token stays "
                               "with the endpoint.")
            if nxt in seen:
                raise HubError(f"the listing of {repo_id} loops: its next page "
                               f"{redact_url(nxt)} was already read; check the mirror.")
            seen.add(nxt)
            url, params = nxt, None  # the next link carries its own query
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


def state_path(dest, *names):
    """dest/.gpufleet/NAMES..., refusing symbolic links on the way (UnsafePathError)."""
    return path_under(dest, "/".join((STATE_DIR,) + names))


def _open_nofollow(path, mode):
    """open() that never follows a symbolic link at path (OSError ELOOP instead)."""
    flags = {"rb": os.O_RDONLY, "rb+": os.O_RDWR, "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
             "ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
             "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC}[mode]
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    return os.fdopen(fd, mode, **({"encoding": "utf-8"} if mode == "w" else {}))


def load_manifest(dest):
    """The manifest's files dict ({} when absent or unreadable: then nothing is trusted)."""
    files = read_manifest(dest).get("files")
    return files if isinstance(files, dict) else {}


def read_manifest(dest):
    """The whole manifest ({} when absent, unreadable or of another format)."""
    path = state_path(dest, MANIFEST_NAME)
    try:
        with _open_nofollow(path, "rb") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        return {}
    return data


def _write_json_atomic(path, data):
    """Replace path atomically, keeping the mode and owner a role may have given it."""
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    with _open_nofollow(tmp, "w") as fh:
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
            and (not f.pinned or entry.get("lock_sha256") == f.pinned)
            and entry.get("size") == f.size == st.st_size
            and entry.get("mtime_ns") == st.st_mtime_ns)


def _outdated(entry, f, st):
    """The manifest verified this file with another hash (an earlier revision), and it
    has not been touched since: replace it without hashing or quarantining it."""
    return (isinstance(entry, dict) and entry.get("size") == st.st_size
            and entry.get("mtime_ns") == st.st_mtime_ns
            and any(entry.get(a) not in (None, f.digest) for a in ("sha256", "sha1")))


# ---------------------------------------------------------------- disk space

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

class _Stats:
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
            st = os.lstat(path)
        except OSError:
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            os.unlink(path)  # a link or other non-file planted there: ours to remove
            st = None
        size = st.st_size if st else 0
        if 0 < size <= f.size:
            # the only way to continue a sha256 is to hash what is already there (once)
            with _open_nofollow(path, "rb") as fh:
                while chunk := fh.read(CHUNK):
                    self.hasher.update(chunk)
                    self.offset += len(chunk)
        elif size:
            os.unlink(path)

    def restart(self):
        self.hasher, self.offset = self.f.hasher(), 0
        with _open_nofollow(self.path, "wb"):
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
            elif self.verify == "manifest" and _outdated(manifest.get(f.path), f, st):
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
        self.stats = _Stats(self.dest, len(plan), total, write_progress, progress_path)
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
        with _open_nofollow(path, "rb") as fh:
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
                with _open_nofollow(partial_path, "rb+") as fh:
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
                raise _Transient(f"{f.path}: the body ended after {part.offset} of "
                                 f"{f.size} bytes")
            except _Transient as exc:
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
                raise _Transient(f"{f.path}: the mirror refused Range {part.offset}-")
            if part.offset and resp.status_code == 206:
                start = _content_range_start(resp.headers.get("Content-Range"))
                if start != part.offset:
                    part.restart()
                    raise _Transient(f"{f.path}: the mirror answered the wrong range")
            elif part.offset:
                part.restart()  # no Range support (200): this file starts over
            with _open_nofollow(part.path, "ab") as out:
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


# ---------------------------------------------------------------- entry point

class _Lock:
    """One fetch per dest at a time (fcntl lock on dest/.gpufleet/lock)."""

    def __init__(self, dest):
        os.makedirs(state_path(dest), exist_ok=True)
        self.fh = _open_nofollow(state_path(dest, "lock"), "w")
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.fh.close()
            raise HubError(f"another fetch is writing into {dest}; wait for it to "
                           "finish (or stop it) and run again.") from None

    def release(self):
        self.fh.close()


def sync_repo(client, repo_id, revision, dest, allow_patterns=None, ignore_patterns=None,
              verify="manifest", max_workers=8, check_mode=False, lock=None, resolved=None,
              progress_path=None, runner=None):
    """Make dest hold the verified files of repo_id@revision. Returns a result dict.

    resolved: (commit, listing) already read from the endpoint by the caller
    (revisions.sync_revision), so they are not asked for twice. progress_path: where the
    progress file goes (default dest/.gpufleet/progress.json). runner: what brings the
    missing bytes instead of the mirror's http (p2p.Runner: runner(fetcher, plan,
    progress_path) -> (outcome, errors)), called after the disk-space check; not called
    when nothing is missing.

    lock: the model's lock (model_lock.ModelLock or its dict): the revision must resolve
    to its commit, the selected files must be the lock's (same patterns) with its sha256s,
    checked on the listing before anything is written and on every file's bytes before it
    gets its final name (LockMismatchError).

    Raises HubError (DiskSpaceError, VerificationError, LockMismatchError) with a message
    for the user.
    """
    validate_repo_id(repo_id)
    if lock is not None:
        try:
            lock = model_lock.parse_lock(lock)
            model_lock.check_commit(lock, repo_id, lock.commit)  # the lock's repo
        except model_lock.LockError as exc:
            raise LockMismatchError(str(exc)) from None
    if verify not in VERIFY_MODES:
        raise HubError(f"verify must be one of {', '.join(VERIFY_MODES)}, not {verify!r}.")
    if int(max_workers) < 1:
        raise HubError("max_workers must be at least 1.")
    if not revision:
        raise HubError("revision must be a branch, tag or commit sha, e.g. 'main'.")
    validate_name(revision, "revision")
    dest = os.path.abspath(dest)
    if os.path.exists(dest) and not os.path.isdir(dest):
        raise HubError(f"dest {dest} exists and is not a directory.")

    if resolved is None:
        client.start()
        commit = client.resolve_commit(repo_id, revision)
        listing = client.list_files(repo_id, commit)
    else:
        commit, listing = resolved
    if lock is not None:
        listing = _apply_lock(lock, client, repo_id, commit, listing, allow_patterns,
                              ignore_patterns)
    files = filter_files(listing, allow_patterns, ignore_patterns)
    if not files:
        raise HubError(f"no file of {repo_id}@{commit} matches allow_patterns/"
                       "ignore_patterns; check the patterns.")
    old = read_manifest(dest)
    manifest = load_manifest(dest)
    # The files of a new commit can all equal the old one's (a commit that touched only
    # files outside the patterns): the folder then holds the new commit, and the manifest
    # must say so (the deploy labels and the upgrade's last-good record read its commit).
    recommit = bool(old) and (old.get("commit"), old.get("repo_id")) != (commit, repo_id)
    fetcher = Fetcher(client, repo_id, commit, dest, verify, int(max_workers))
    plan = fetcher.classify(files, manifest)
    kept, deleted = leftovers(dest, listing, {f.path for f in files}, manifest)
    needed = fetcher.bytes_to_fetch(plan)
    check_disk_space(dest, needed, fetcher.inodes_to_create(plan))

    result = {"commit": commit, "locked": lock is not None,
              "bytes_to_download": needed, "quarantined": [],
              "removed": deleted, "manifest": state_path(dest, MANIFEST_NAME)}
    if check_mode:
        would = {"missing": "would_download", "stale": "would_download",
                 "outdated": "would_download", "present": "would_verify",
                 "trusted": "trusted"}
        result.update(changed=bool(deleted) or recommit
                      or any(would[s] == "would_download" for _file, s in plan),
                      bytes_downloaded=0,
                      bytes_verified=0,
                      files=[_file_result(f, would[s]) for f, s in plan])
        return result

    os.makedirs(dest, exist_ok=True)
    lock = _Lock(dest)
    try:
        if runner is not None and needed:
            outcome, errors = runner(fetcher, plan, progress_path=progress_path)
        else:
            outcome, errors = fetcher.run(plan, progress_path=progress_path)
        for path in deleted:
            os.unlink(path_under(dest, path, final_may_be_link=True))
        changed = _write_manifest(dest, client, repo_id, revision, commit, fetcher, plan,
                                  outcome, manifest, kept, recommit)
    finally:
        lock.release()
    changed = changed or bool(deleted) or bool(fetcher.quarantined) \
        or any(s == "downloaded" for s in outcome.values())
    result.update(
        changed=changed, quarantined=fetcher.quarantined,
        bytes_downloaded=fetcher.stats.bytes_downloaded,
        bytes_verified=fetcher.stats.bytes_verified,
        files=[_file_result(f, outcome.get(f.path, "failed")) for f, _state in plan])
    if errors:
        msgs = "; ".join(str(e) for e in errors)
        exc = HubError(f"{len(errors)} of {len(plan)} files failed: {msgs}")
        exc.result = result  # what was done before the failure, for the module's report
        raise exc
    return result


def _apply_lock(lock, client, repo_id, commit, listing, allow_patterns, ignore_patterns):
    """Check the resolved commit and the selected files against the lock (no write yet);
    returns the listing with each locked file's sha256 attached (RepoFile.pinned)."""
    try:
        model_lock.check_commit(lock, repo_id, commit, redact_url(client.endpoint))
        selected = filter_files(listing, allow_patterns, ignore_patterns)
        required = {f.path for f in filter_files(
            [RepoFile(p, 0, "sha256", d) for p, d in lock.files.items()],
            allow_patterns, ignore_patterns)}
        model_lock.check_listing(lock, selected, required)
    except model_lock.LockError as exc:
        raise LockMismatchError(str(exc)) from None
    return [RepoFile(f.path, f.size, f.algorithm, f.digest, lock.files.get(f.path))
            for f in listing]


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
            st = os.lstat(path_under(dest, safe_relpath(path), final_may_be_link=True))
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
                    kept, recommit=False):
    """Record the verified files; returns True when the file list or the commit changed."""
    verified = [f for f, _state in plan if f.path in outcome]
    files = {**kept, **manifest_entries(dest, verified)}
    if files == old and len(verified) == len(plan) and not recommit:
        return False
    write_manifest(dest, repo_id, revision, commit, client.endpoint, files,
                   complete=len(verified) == len(plan))
    return True


def manifest_entries(dest, files):
    """{path: {size, sha256|sha1, mtime_ns}} of RepoFiles whose bytes were verified."""
    entries = {}
    for f in files:
        st = os.lstat(path_under(dest, f.path, final_may_be_link=True))
        entries[f.path] = {"size": f.size, f.algorithm: f.digest, "mtime_ns": st.st_mtime_ns}
        if f.pinned:  # the lock's sha256, checked on these bytes (model_lock)
            entries[f.path]["lock_sha256"] = f.pinned
    return entries


def write_manifest(dest, repo_id, revision, commit, endpoint, entries, complete=True):
    """dest/.gpufleet/manifest.json: what was verified, when, from where (never a token)."""
    os.makedirs(state_path(dest), exist_ok=True)
    _write_json_atomic(state_path(dest, MANIFEST_NAME), {
        "format": MANIFEST_FORMAT, "repo_id": repo_id, "revision": revision,
        "commit": commit, "endpoint": redact_url(endpoint), "verified_at": _now(),
        "complete": complete, "files": entries})


# ---------------------------------------------------------------- writing a lock

def lock_from_hub(client, repo_id, revision, max_workers=8):
    """The lock (model_lock.ModelLock) of repo_id@revision from an endpoint the operator
    trusts: the commit it resolves, the listing's sha256 of each LFS file (the weights are
    not downloaded), and the sha256 of every other file's bytes, fetched into a temporary
    folder and checked against the listing's git blob sha1 first. Every file of the
    repository, whatever patterns a fetch uses later."""
    import tempfile

    validate_repo_id(repo_id)
    validate_name(revision, "revision")
    client.start()
    commit = client.resolve_commit(repo_id, revision)
    listing = client.list_files(repo_id, commit)
    files = {f.path: f.digest for f in listing if f.algorithm == "sha256"}
    small = [f for f in listing if f.algorithm != "sha256"]
    with tempfile.TemporaryDirectory(prefix="gpufleet-lock-") as tmp:
        fetcher = Fetcher(client, repo_id, commit, tmp, "full", int(max_workers))
        _outcome, errors = fetcher.run([(f, "missing") for f in small], write_progress=False)
        if errors:
            raise HubError(f"{len(errors)} of {len(small)} files could not be read to write "
                           f"the lock; no lock was written: "
                           + "; ".join(str(e) for e in errors))
        for f in small:
            h = hashlib.sha256()
            with _open_nofollow(fetcher.final_path(f), "rb") as fh:
                while chunk := fh.read(CHUNK):
                    h.update(chunk)
            files[f.path] = h.hexdigest()
    return _checked_lock(model_lock.ModelLock(repo_id, commit, files,
                                              source=redact_url(client.endpoint),
                                              written_at=_now()))


def _checked_lock(lock):
    """A lock just made, held to the rules every reader applies (never write one that
    hf_model would refuse to read)."""
    try:
        return model_lock.parse_lock(lock.as_dict())
    except model_lock.LockError as exc:
        raise HubError(f"no lock was written: {exc}") from None


def lock_from_folder(src):
    """The lock of a copy hf_model verified (src holds its complete manifest): every file the
    manifest lists is hashed again (sha256, and its recorded hash checked), so the lock says
    what is on disk now and the manifest vouches for where it came from."""
    src = os.path.abspath(src)
    manifest = read_manifest(src)
    if not manifest or manifest.get("complete") is not True:
        raise HubError(f"{src} holds no complete manifest ({STATE_DIR}/{MANIFEST_NAME}) of "
                       "a verified fetch; fetch it with hf_model first, from a source you "
                       "trust.")
    repo_id, commit = manifest.get("repo_id"), manifest.get("commit")
    validate_repo_id(repo_id)
    if not isinstance(commit, str) or not _HEX40.match(commit):
        raise HubError(f"{src}: the manifest's commit {commit!r:.60} is not a commit sha.")
    files, problems = {}, []
    for path, entry in sorted((manifest.get("files") or {}).items()):
        safe_relpath(path)
        algorithm = "sha1" if isinstance(entry, dict) and entry.get("sha1") else "sha256"
        expected = entry.get(algorithm) if isinstance(entry, dict) else None
        f = RepoFile(path, int(entry.get("size", -1)) if isinstance(entry, dict) else -1,
                     algorithm, str(expected))
        h256, h = hashlib.sha256(), f.hasher()
        try:
            with _open_nofollow(path_under(src, path), "rb") as fh:
                while chunk := fh.read(CHUNK):
                    h.update(chunk)
                    h256.update(chunk)
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror or exc}")
            continue
        if h.hexdigest() != expected or (entry.get("lock_sha256")
                                         not in (None, h256.hexdigest())):
            problems.append(f"{path}: the manifest records {algorithm} {expected}, the file "
                            f"hashes to {h.hexdigest()}")
            continue
        files[path] = h256.hexdigest()
    if problems:
        raise HubError(f"{src} no longer holds what its manifest verified; no lock was "
                       "written: " + "; ".join(problems[:10]))
    return _checked_lock(model_lock.ModelLock(repo_id, commit, files, source=f"file://{src}",
                                              written_at=_now()))
