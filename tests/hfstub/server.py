"""STAND-IN Hugging Face hub for tests: a real HTTP server on 127.0.0.1.

It speaks the subset of the hub API that hf_model, huggingface_hub and vLLM use, as
described by huggingface_hub 1.x (hf_api.py list_repo_tree / repo_info, file_download.py
get_hf_file_metadata / http_get) and ../shared/notes/vllm-hf-facts.md:

- GET /api/models/{repo}/revision/{rev}        -> {"id", "sha", "siblings"}
- GET /api/models/{repo}/tree/{rev}?recursive=true -> [{type, path, size, oid, lfs?}],
  paginated with `Link: <...&cursor=N>; rel="next"` like the hub
- GET|HEAD /{repo}/resolve/{rev}/{path}         -> ETag (sha256 for LFS, git blob sha1
  otherwise), X-Repo-Commit, Content-Length, Range -> 206; LFS files can 302-redirect to
  /lfs-cdn/{sha256} (X-Linked-Etag, X-Linked-Size) as the hub does to its CDN, on this
  server or on another one (cdn_url)
- errors: 401 RepoNotFound, 404 RevisionNotFound / EntryNotFound with X-Error-Code

Options make it behave like imperfect mirrors: no Range support (olah 0.5.4 answers 200
to every Range), no LFS redirect, a required token, a throttle, small tree pages.
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_PATTERNS = ("*.safetensors", "*.bin", "*.gguf", "*.pt")


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    """A repo at one commit: {path: bytes}; LFS files are those matching lfs_patterns."""

    def __init__(self, repo_id, files, refs=("main",), lfs_patterns=LFS_PATTERNS):
        self.repo_id = repo_id
        self.files = dict(files)
        self.lfs = {p for p in self.files if any(fnmatch.fnmatch(p, pat) for pat in lfs_patterns)}
        h = hashlib.sha1(repo_id.encode())
        for p in sorted(self.files):
            h.update(p.encode() + b"\0" + hashlib.sha256(self.files[p]).digest())
        self.commit = h.hexdigest()
        self.refs = set(refs)

    def digest(self, path):
        data = self.files[path]
        return hashlib.sha256(data).hexdigest() if path in self.lfs else git_blob_sha1(data)

    def tree(self):
        entries, dirs = [], set()
        for p in sorted(self.files):
            parts = p.split("/")
            for i in range(1, len(parts)):
                dirs.add("/".join(parts[:i]))
            data = self.files[p]
            e = {"type": "file", "path": p, "size": len(data), "oid": git_blob_sha1(data)}
            if p in self.lfs:
                # on the hub, oid is the sha1 of the LFS pointer file; lfs.oid is the sha256
                pointer = (f"version https://git-lfs.github.com/spec/v1\noid sha256:"
                           f"{hashlib.sha256(data).hexdigest()}\nsize {len(data)}\n").encode()
                e["oid"] = git_blob_sha1(pointer)
                e["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                            "pointerSize": len(pointer)}
            entries.append(e)
        entries += [{"type": "directory", "path": d, "size": 0, "oid": "0" * 40} for d in dirs]
        return sorted(entries, key=lambda e: e["path"])


class LoopbackServer:
    """A threaded HTTP server on 127.0.0.1 (a port the kernel picks, in .url), serving
    while the object is used as a context manager."""

    def _listen(self, handler_class):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler_class)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


class HubStub(LoopbackServer):
    """Start with `with HubStub([...]) as hub:`; hub.url is the endpoint (HF_ENDPOINT)."""

    def __init__(self, repos, range_support=True, lfs_redirect=True, page_size=50,
                 token=None, throttle_bps=None, corrupt=None, cdn_url=None):
        self.repos = {r.repo_id: r for r in repos}
        self.range_support = range_support
        self.lfs_redirect = lfs_redirect
        self.page_size = page_size
        self.token = token
        self.throttle_bps = throttle_bps
        self.corrupt = dict(corrupt or {})  # path -> bytes served instead (a lying mirror)
        self.cdn_url = cdn_url  # LFS redirects go to this other server (as the hub's CDN)
        self.log = []  # (method, path, Range header)
        self.seen_auth = []
        self._lock = threading.Lock()
        stub = self

        class Handler(_Handler):
            hub = stub

        self._listen(Handler)

    def url_for(self, handler):
        """Absolute base URL as the client addressed us (through a proxy: the proxy's)."""
        host = handler.headers.get("Host") or self.url.split("//", 1)[1]
        return f"http://{host}"

    def requests_for(self, needle):
        with self._lock:
            return [r for r in self.log if needle in r[1]]


class _Handler(BaseHTTPRequestHandler):
    hub: HubStub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    # -- helpers ---------------------------------------------------------------
    def _send(self, code, body=b"", headers=None, head=False):
        self.send_response(code)
        headers = dict(headers or {})
        headers.setdefault("Content-Length", str(len(body)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if not head and body:
            self._write_body(body)

    def _write_body(self, body):
        bps, step = self.hub.throttle_bps, 256 << 10
        if bps:
            step = max(1024, min(step, bps // 20))
        try:
            for i in range(0, len(body), step):
                self.wfile.write(body[i:i + step])
                if bps:
                    time.sleep(step / bps)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _json(self, code, obj, headers=None):
        body = json.dumps(obj).encode()
        self._send(code, body, {"Content-Type": "application/json", **(headers or {})})

    def _error(self, code, error_code, msg):
        self._json(code, {"error": msg}, {"X-Error-Code": error_code})

    def _repo_and_rest(self, parts):
        for n in (2, 1):
            rid = "/".join(parts[:n])
            if rid in self.hub.repos:
                return self.hub.repos[rid], parts[n:]
        return None, parts

    def _authorized(self):
        auth = self.headers.get("Authorization")
        return self.hub.token is None or auth == f"Bearer {self.hub.token}"

    # -- routes ------------------------------------------------------------------
    def do_HEAD(self):
        self._route(head=True)

    def do_GET(self):
        self._route(head=False)

    def _route(self, head):
        url = urlsplit(self.path)
        with self.hub._lock:
            self.hub.log.append((self.command, url.path, self.headers.get("Range")))
            self.hub.seen_auth.append(self.headers.get("Authorization"))
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        if parts[:1] == ["lfs-cdn"] and len(parts) == 2:
            return self._cdn(parts[1], head)
        if not self._authorized():
            return self._error(401, "RepoNotFound", "Invalid credentials in Authorization header")
        if parts[:2] == ["api", "models"]:
            repo, rest = self._repo_and_rest(parts[2:])
            if repo is None:
                return self._error(401, "RepoNotFound", "Repository not found")
            if len(rest) >= 2 and rest[0] in ("revision", "tree"):
                rev = "/".join(rest[1:])
                if rev not in repo.refs and rev != repo.commit:
                    return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                if rest[0] == "revision":
                    return self._json(200, {"id": repo.repo_id, "sha": repo.commit,
                                            "siblings": [{"rfilename": p} for p in sorted(repo.files)]})
                return self._tree(repo, rev, parse_qs(url.query))
            return self._error(404, "EntryNotFound", "unknown API route")
        repo, rest = self._repo_and_rest(parts)
        if repo is None or len(rest) < 3 or rest[0] != "resolve":
            return self._error(401, "RepoNotFound", "Repository not found")
        rev, path = rest[1], "/".join(rest[2:])
        if rev not in repo.refs and rev != repo.commit:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        if path not in repo.files:
            return self._error(404, "EntryNotFound", f"{path} does not exist")
        data = self.hub.corrupt.get(path, repo.files[path])
        headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{repo.digest(path)}"'}
        if path in repo.lfs and self.hub.lfs_redirect:
            sha = repo.digest(path)
            headers.update({"Location": f"{self.hub.cdn_url or ''}/lfs-cdn/{sha}?path={quote(path)}",
                            "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data))})
            return self._send(302, b"", headers, head)
        self._bytes(data, headers, head)

    def _tree(self, repo, rev, query):
        entries = repo.tree()
        if query.get("recursive", ["false"])[0] != "true":
            entries = [e for e in entries if "/" not in e["path"]]
        start = int(query.get("cursor", ["0"])[0])
        page = entries[start:start + self.hub.page_size]
        headers = {}
        if start + self.hub.page_size < len(entries):
            nxt = (f"{self.hub.url_for(self)}/api/models/{repo.repo_id}/tree/{rev}"
                   f"?recursive={query.get('recursive', ['false'])[0]}"
                   f"&cursor={start + self.hub.page_size}")
            headers["Link"] = f'<{nxt}>; rel="next"'
        self._json(200, page, headers)

    def _cdn(self, sha, head):
        for repo in self.hub.repos.values():
            for p in repo.lfs:
                if repo.digest(p) == sha:
                    data = self.hub.corrupt.get(p, repo.files[p])
                    return self._bytes(data, {"ETag": f'"{sha}"'}, head)
        self._send(404, b"NoSuchKey")

    def _bytes(self, data, headers, head):
        rng = self.headers.get("Range")
        m = re.match(r"^bytes=(\d+)-(\d*)$", rng or "")
        headers = {"Accept-Ranges": "bytes" if self.hub.range_support else "none",
                   "Content-Type": "application/octet-stream", **headers}
        if m and self.hub.range_support:
            start = int(m.group(1))
            end = int(m.group(2)) if m.group(2) else len(data) - 1
            if start >= len(data):
                return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"}, head)
            end = min(end, len(data) - 1)
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            return self._send(206, data[start:end + 1], headers, head)
        self._send(200, data, headers, head)


class HostileServer(LoopbackServer):
    """STAND-IN for a hostile or broken mirror on 127.0.0.1: each route (path prefix ->
    function of the request handler) answers as a test scripts it, with the handler's
    helpers below. Every request is recorded with its Authorization header (`log`), and
    the body bytes the answers got out are counted (`sent`), so a test can prove a token
    never reached it and a capped read stopped early."""

    def __init__(self, routes=None):
        self.routes = dict(routes or {})
        self.log = []  # (path with query, Authorization header or None)
        self.sent = 0
        self._lock = threading.Lock()
        server = self

        class Handler(_HostileHandler):
            owner = server

        self._listen(Handler)

    @property
    def seen_auth(self):
        with self._lock:
            return [auth for _, auth in self.log]


class _HostileHandler(BaseHTTPRequestHandler):
    owner: HostileServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        o = self.owner
        with o._lock:
            o.log.append((self.path, self.headers.get("Authorization")))
        path = urlsplit(self.path).path
        for prefix in sorted(o.routes, key=len, reverse=True):
            if path.startswith(prefix):
                try:
                    return o.routes[prefix](self)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True
                    return
        self.answer(404, b"no route", {"X-Error-Code": "EntryNotFound"})

    def answer(self, code, body=b"", headers=None, length=None):
        """Status, headers, then body; Content-Length is len(body) unless given."""
        self.send_response(code)
        headers = dict(headers or {})
        headers.setdefault("Content-Length", str(len(body) if length is None else length))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.write(body)

    def json(self, obj, headers=None):
        self.answer(200, json.dumps(obj).encode(), {"Content-Type": "application/json",
                                                    **(headers or {})})

    def write(self, data):
        if data:
            self.wfile.write(data)
            self.wfile.flush()
            with self.owner._lock:
                self.owner.sent += len(data)
