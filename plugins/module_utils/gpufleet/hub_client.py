"""The HTTP client of a Hugging Face hub or mirror (requests), bounded against a hostile one.

The API subset gpufleet reads (huggingface_hub 1.x, hf_api.py, file_download.py):
``GET {endpoint}/api/models/{repo}/revision/{rev}`` -> ``sha``;
``GET {endpoint}/api/models/{repo}/tree/{commit}?recursive=true`` (paginated with a
``Link: <...>; rel="next"`` header); ``GET {endpoint}/{repo}/resolve/{commit}/{path}``.
Retries with backoff and Retry-After, redirects followed by hand, the token only to the
endpoint's origin, byte caps on API answers, a minimum rate and a deadline on the fetch.
"""
from __future__ import annotations

import http.client
import json
import random
import threading
import time
from urllib.parse import quote, urljoin

try:
    import requests
    import urllib3
except ImportError:  # the plain logic (names, manifests) still imports; HubClient says what is missing
    requests = urllib3 = None
HAS_REQUESTS = requests is not None

from .bounded import Decoder
from .hub_errors import DeadlineError, HubError
from .hub_listing import parse_tree
from .hub_names import HEX40, STATE_DIR, normalize_endpoint, origin, redact_url, scrub

PUBLIC_ENDPOINT = "https://huggingface.co"
CHUNK = 1 << 20  # hashlib releases the GIL on updates this large, so workers hash in parallel
# urllib3 1.26 (Debian 12's python3-urllib3) has no read1, only read(n), which waits for n
# bytes and loses them if the connection drops: read smaller pieces there.
LEGACY_CHUNK = 64 << 10
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


class Transient(Exception):
    """A failure worth retrying (5xx, 429, dropped or stalled connection, short body)."""

    def __init__(self, msg, retry_after=None, slow=False):
        super().__init__(msg)
        self.retry_after = retry_after
        self.slow = slow  # slower than min_rate: bytes it brought do not count as progress


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
        when allow_416) or raises Transient / HubError. The caller closes it."""
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
                raise Transient(f"connection to {redact_url(url)} failed: "
                                f"{type(exc).__name__}") from None
            except (requests.RequestException, urllib3.exceptions.HTTPError,
                    http.client.HTTPException, OSError, ValueError) as exc:
                raise HubError(f"request to {redact_url(url)} failed: "
                               f"{type(exc).__name__}: {scrub(exc)}") from None
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
            raise Transient(f"{redact_url(url)} answered {code}", retry_after)
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
        compression bomb costs no memory. Raises Transient when the connection drops,
        stalls (timeout) or averages less than min_rate over `timeout` seconds."""
        decoder = Decoder(resp.headers.get("Content-Encoding"), redact_url(url),
                          error=HubError, corrupt=Transient)
        read1 = getattr(resp.raw, "read1", None)
        t0, n0 = time.monotonic(), 0
        while room > 0:
            self.time_left()
            try:
                raw = (read1(CHUNK, decode_content=False) if read1 else
                       resp.raw.read(LEGACY_CHUNK, decode_content=False))
            except (requests.RequestException, urllib3.exceptions.HTTPError,
                    http.client.HTTPException, OSError, ValueError) as exc:
                raise Transient(f"connection to {redact_url(url)} lost "
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
                    raise Transient(f"{redact_url(url)} sent {n0 / (now - t0):.0f} bytes/s "
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
            except Transient as exc:
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
            raise Transient(f"{redact_url(url)} did not answer JSON") from None

    # -- API ---------------------------------------------------------------------
    def api_url(self, repo_id, *tail):
        return "/".join([self.endpoint, "api/models", repo_id] + list(tail))

    def resolve_commit(self, repo_id, revision):
        url = self.api_url(repo_id, "revision", quote(revision, safe=""))
        data, _links, _final = self.get_json(url)
        sha = data.get("sha") if isinstance(data, dict) else None
        if not isinstance(sha, str) or not HEX40.match(sha):
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
