"""Every read bounded, every wait with a deadline (plugins/module_utils/gpufleet/bounded.py).

Real peers on this machine: an HTTP server on 127.0.0.1 and a Unix-socket server (the
stand-in for HAProxy's admin socket), each in a thread, that
(a) send a huge answer (200 MB, generated as it is sent, never held by the server): the
    read must stop at its cap with the clear error, its peak memory (tracemalloc, every
    thread) below twice the cap;
(b) drip one byte every 0.2 s for ever: the call must end within its deadline plus
    MARGIN s of wall time (time.monotonic);
(c) answer normally: the result is what it was before.
Per class (admin socket, /metrics, the readiness gate, the Packages index) one control
runs the old code (whole reads, per-read timeouts only) against a short drip (12 bytes
over 2.4 s: it ends by itself) and an answer of twice the cap plus 1 MiB: it outlives the
deadline, and its peak passes twice the cap. Each test prints its wall time and peak
memory (pytest -s shows them).
"""
import functools
import gzip
import http.server
import os
import shutil
import socket
import tempfile
import threading
import time
import tracemalloc
import urllib.request
import zlib

import pytest
import requests

from conftest import FIXTURES
from gpufleet import bounded, gateway, serve_ready, upgrade
from gpufleet.bounded import BoundError
from helpers import run_module

HUGE = 200_000_000  # bytes a huge answer announces and would send
BLOCK = b"x" * (64 << 10)
DRIP = 0.2  # seconds between two dripped bytes
SHORT_DRIP = 12  # bytes of the controls' drip: 2.4 s, then the answer is complete
DEADLINE = 1.0  # seconds the tests give a dripped read
MARGIN = 0.5  # seconds a bounded call may end after its deadline
MiB = 1 << 20
STAT = (FIXTURES / "haproxy" / "show-stat-2.6.12.csv").read_text()


def measure(label, call):
    """(result or None, exception or None, wall s, peak bytes) of call(); printed."""
    tracemalloc.start()
    start = time.monotonic()
    result = error = None
    try:
        result = call()
    except Exception as exc:  # noqa: BLE001 - the tests look at it
        error = exc
    wall = time.monotonic() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    if error is not None:
        said = f"{type(error).__name__}: {error}"
    elif isinstance(result, tuple) and result[1]:  # run_module's (result, failed)
        said = f"module failed: {result[0]['msg']}"
    else:
        said = "returned"
    print(f"\n[{label}] wall {wall:.2f} s, peak {peak / MiB:.1f} MiB, {said[:200]}")
    return result, error, wall, peak


# ----------------------------------------------------------------- the peers
def huge_chunks(total=HUGE):
    sent = 0
    while sent < total:
        block = BLOCK if total - sent >= len(BLOCK) else BLOCK[:total - sent]
        sent += len(block)
        yield block


class Peer(http.server.BaseHTTPRequestHandler):
    """routes: {path: (kind, arg)}; kind "huge" (arg: bytes), "drip" (arg: bytes, None
    for ever), "body" (arg: (status, bytes, headers))."""
    protocol_version = "HTTP/1.1"
    routes = {}
    stop = threading.Event()

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.do_GET()

    def do_GET(self):
        kind, arg = self.routes.get(self.path, ("body", (404, b"", {})))
        try:
            if kind == "body":
                status, data, headers = arg
                self.send_response(status)
                # the handler closes every connection after its answer (below), so it says
                # so: a client told nothing reuses the connection for its next request and
                # can send it into the close (RemoteDisconnected: the readiness gate's
                # warm-up request, twice in 2026-12-07's runs under load)
                for name, value in dict({"Content-Length": str(len(data)), "Connection": "close"},
                                        **headers).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            elif kind == "huge":
                self.send_response(200)
                self.send_header("Content-Length", str(arg))
                self.end_headers()
                for block in huge_chunks(arg):
                    if self.stop.is_set():
                        break
                    self.wfile.write(block)
            elif kind == "drip":
                self.send_response(200)
                self.send_header("Content-Length", str(arg or HUGE))
                self.end_headers()
                sent = 0
                while (arg is None or sent < arg) and not self.stop.is_set():
                    self.wfile.write(b"#")
                    sent += 1
                    time.sleep(DRIP)
            elif kind == "drip-headers":
                for byte in b"HTTP/1.1 200 OK\r\nX-Drip: " + b"d" * 10000:
                    if self.stop.is_set():
                        break
                    self.wfile.write(bytes([byte]))
                    time.sleep(DRIP)
        except OSError:  # the reader stopped reading and hung up
            pass
        self.close_connection = True


@pytest.fixture
def peer():
    """(base URL, routes) of a loopback HTTP server that sends what the routes say."""
    Peer.routes, Peer.stop = {}, threading.Event()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Peer)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", Peer.routes
    Peer.stop.set()
    server.shutdown()
    server.server_close()


@pytest.fixture
def admin_socket():
    """HAProxy's admin socket stand-in: reads the command, then answer(conn, stop)."""
    folder = tempfile.mkdtemp(prefix="gf-sock-")  # short: AF_UNIX paths are short
    path = os.path.join(folder, "admin.sock")
    state = {"answer": None, "commands": []}
    stop = threading.Event()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)

    def handle(conn):
        with conn:
            try:
                conn.settimeout(5)
                state["commands"].append(conn.recv(100))
                conn.settimeout(None)
                state["answer"](conn, stop)
            except OSError:  # the reader hung up
                pass

    def accept():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield path, state
    stop.set()
    server.close()
    shutil.rmtree(folder, ignore_errors=True)


def sock_huge(total):
    def answer(conn, stop):
        for block in huge_chunks(total):
            if stop.is_set():
                return
            conn.sendall(block)
    return answer


def sock_drip(count=None):
    def answer(conn, stop):
        sent = 0
        while (count is None or sent < count) and not stop.is_set():
            conn.sendall(b"#")
            sent += 1
            time.sleep(DRIP)
    return answer


def sock_text(text):
    return lambda conn, stop: conn.sendall(text.encode())


# ----------------------------------------------------------------- the old code (controls)
def old_read_show_stat(path, timeout=5.0):
    """gateway.read_show_stat before bounded.py: whole answer, per-recv timeout only."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
        sock.sendall(b"show stat\n")
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        sock.close()
    return b"".join(chunks).decode("utf-8", "replace")


def old_get(url, timeout):
    """upgrade.wait_idle's and serve_ready.wait_ready's GET before bounded.py."""
    resp = requests.Session().get(url, timeout=timeout)
    return resp.text


def old_fetch(url, timeout):
    """nvidia_repo_info's and nvidia_driver_plan's fetch before bounded.py."""
    from ansible.module_utils.urls import open_url
    return open_url(url, timeout=timeout).read()


def assert_outlives(label, call, deadline=DEADLINE):
    """The old code against the short drip: it takes the whole drip, past the deadline."""
    result, error, wall, _ = measure(label, call)
    assert error is None and len(result) == SHORT_DRIP
    assert wall > deadline + MARGIN and wall >= SHORT_DRIP * DRIP * 0.9


def assert_peaks(label, call, cap):
    """The old code against 2 x cap + 1 MiB: it holds it all, its peak past 2 x cap."""
    result, error, _, peak = measure(label, call)
    assert error is None and len(result) == 2 * cap + MiB
    assert peak > 2 * cap


# ----------------------------------------------------------------- HAProxy's admin socket
def test_admin_socket_huge_answer_stops_at_the_cap(admin_socket):
    path, state = admin_socket
    state["answer"] = sock_huge(HUGE)
    _, error, wall, peak = measure("admin socket, 200 MB answer",
                                   lambda: gateway.read_show_stat(path, timeout=30))
    assert isinstance(error, gateway.GatewayError)
    assert f"HAProxy's stats socket {path} sent more than 16 MiB (the cap" in str(error)
    assert "vllm_gateway_stats_socket" in str(error)
    assert peak < 2 * gateway.SHOW_STAT_MAX_BYTES


def test_admin_socket_drip_ends_at_the_deadline(admin_socket):
    path, state = admin_socket
    state["answer"] = sock_drip()
    _, error, wall, _ = measure("admin socket, drip for ever",
                                lambda: gateway.read_show_stat(path, timeout=DEADLINE))
    assert isinstance(error, gateway.GatewayError)
    assert f"{path} did not answer in full within 1 s (the deadline" in str(error)
    assert DEADLINE <= wall < DEADLINE + MARGIN


def test_admin_socket_normal_answer_is_read_as_before(admin_socket):
    path, state = admin_socket
    state["answer"] = sock_text(STAT)
    text, error, _, _ = measure("admin socket, normal answer",
                                lambda: gateway.read_show_stat(path))
    assert error is None and text == STAT == old_read_show_stat(path)
    assert state["commands"] == [b"show stat\n", b"show stat\n"]


def test_admin_socket_control_old_read(admin_socket):
    path, state = admin_socket
    state["answer"] = sock_drip(SHORT_DRIP)
    assert_outlives("admin socket, old read, short drip",
                    lambda: old_read_show_stat(path, timeout=DEADLINE))
    _, error, wall, _ = measure("admin socket, bounded read, short drip",
                                lambda: gateway.read_show_stat(path, timeout=DEADLINE))
    assert isinstance(error, gateway.GatewayError) and wall < DEADLINE + MARGIN
    state["answer"] = sock_huge(2 * gateway.SHOW_STAT_MAX_BYTES + MiB)
    assert_peaks("admin socket, old read, 33 MiB answer", lambda: old_read_show_stat(path),
                 gateway.SHOW_STAT_MAX_BYTES)


# ----------------------------------------------------------------- /metrics (idle wait)
def test_metrics_huge_answer_stops_at_the_cap(peer):
    url, routes = peer
    routes["/metrics"] = ("huge", HUGE)
    _, error, _, peak = measure("/metrics, 200 MB answer",
                                lambda: upgrade.read_metrics(requests.Session(), url))
    assert isinstance(error, BoundError) and error.kind == "cap"
    assert f"{url}/metrics sent more than 16 MiB (the cap on this answer)" in str(error)
    assert peak < 2 * upgrade.METRICS_MAX_BYTES
    _, error, _, peak = measure("/metrics, 200 MB answer, idle wait", lambda: upgrade.wait_idle(
        requests.Session(), url, timeout=0.5, interval=0.1))
    assert isinstance(error, upgrade.UpgradeError)
    assert "did not become idle within 0.5s (last: BoundError:" in str(error)
    assert "sent more than 16 MiB" in str(error)
    assert peak < 2 * upgrade.METRICS_MAX_BYTES


def test_metrics_drip_ends_the_idle_wait_at_its_deadline(peer, monkeypatch):
    url, routes = peer
    routes["/metrics"] = ("drip", None)
    monkeypatch.setattr(upgrade, "METRICS_TIMEOUT", DEADLINE)  # 10 s in production
    _, error, wall, _ = measure("/metrics, drip for ever, idle wait", lambda: upgrade.wait_idle(
        requests.Session(), url, timeout=1, interval=0.1))
    assert isinstance(error, upgrade.UpgradeError)
    assert f"{url}/metrics did not answer in full within 1 s (the deadline" in str(error)
    assert DEADLINE <= wall < DEADLINE + MARGIN


def test_metrics_normal_answers_are_read_as_before(peer):
    url, routes = peer
    text = ('# HELP vllm:num_requests_running Number of requests in model execution batches.\n'
            'vllm:num_requests_running{model_name="m"} 0.0\n'
            'vllm:num_requests_waiting{model_name="m"} 0.0\n')
    routes["/metrics"] = ("body", (200, text.encode(), {"Content-Type": "text/plain"}))
    resp, error, _, _ = measure("/metrics, normal answer",
                                lambda: upgrade.read_metrics(requests.Session(), url))
    assert error is None and resp.status_code == 200 and resp.text == text == old_get(
        f"{url}/metrics", 10)
    # prometheus_client gzips /metrics for a client that accepts it, as requests does
    routes["/metrics"] = ("body", (200, gzip.compress(text.encode()),
                                   {"Content-Encoding": "gzip", "Content-Type": "text/plain"}))
    assert upgrade.read_metrics(requests.Session(), url).text == text
    assert upgrade.wait_idle(requests.Session(), url, timeout=5)["polls"] == 1


def test_metrics_control_old_read(peer):
    url, routes = peer
    routes["/metrics"] = ("drip", SHORT_DRIP)
    assert_outlives("/metrics, old read, short drip", lambda: old_get(f"{url}/metrics", 10))
    _, error, wall, _ = measure("/metrics, bounded read, short drip", lambda: upgrade.read_metrics(
        requests.Session(), url, DEADLINE))
    assert isinstance(error, BoundError) and wall < DEADLINE + MARGIN
    routes["/metrics"] = ("huge", 2 * upgrade.METRICS_MAX_BYTES + MiB)
    assert_peaks("/metrics, old read, 33 MiB answer", lambda: old_get(f"{url}/metrics", 10),
                 upgrade.METRICS_MAX_BYTES)


# ----------------------------------------------------------------- the readiness gate
MODELS = b'{"object": "list", "data": [{"id": "tiny", "object": "model"}]}'
COMPLETION = b'{"choices": [{"text": " world", "index": 0}], "usage": {"completion_tokens": 1}}'
STAGES = {"health": "/health", "models": "/v1/models", "request": "/v1/completions"}


def ready_routes(routes):
    routes.update({"/health": ("body", (200, b"", {})),
                   "/v1/models": ("body", (200, MODELS, {"Content-Type": "application/json"})),
                   "/v1/completions": ("body", (200, COMPLETION,
                                                {"Content-Type": "application/json"}))})


def gate(url, **kw):
    opts = dict({"timeout": DEADLINE, "interval": 0.05}, **kw)
    return serve_ready.wait_ready(requests.Session(), url, "key", "tiny", **opts)


@pytest.mark.parametrize("stage", STAGES)
def test_readiness_huge_answer_stops_at_the_cap(peer, stage):
    url, routes = peer
    ready_routes(routes)
    routes[STAGES[stage]] = ("huge", HUGE)
    cap = serve_ready.REQUEST_MAX_BYTES if stage == "request" else serve_ready.READY_MAX_BYTES
    _, error, _, peak = measure(f"readiness {STAGES[stage]}, 200 MB answer",
                                lambda: gate(url, timeout=0.5))
    assert isinstance(error, serve_ready.NotReady) and error.stage == stage
    assert f"{url}{STAGES[stage]} sent more than {cap // MiB} MiB (the cap" in error.detail
    assert peak < 2 * cap


@pytest.mark.parametrize("stage", STAGES)
def test_readiness_drip_ends_at_the_deadline(peer, stage, monkeypatch):
    url, routes = peer
    ready_routes(routes)
    routes[STAGES[stage]] = ("drip", None)
    monkeypatch.setattr(serve_ready, "READY_POLL_TIMEOUT", DEADLINE)  # 10 s in production
    _, error, wall, _ = measure(f"readiness {STAGES[stage]}, drip for ever",
                                lambda: gate(url, request_timeout=DEADLINE))
    assert isinstance(error, serve_ready.NotReady) and error.stage == stage
    assert f"{url}{STAGES[stage]} did not answer in full within 1 s" in error.detail
    assert DEADLINE <= wall < DEADLINE + MARGIN


def test_readiness_normal_answers_pass_as_before(peer):
    url, routes = peer
    ready_routes(routes)
    routes["/v1/models"] = ("body", (200, gzip.compress(MODELS),
                                     {"Content-Encoding": "gzip",
                                      "Content-Type": "application/json"}))
    result, error, _, _ = measure("readiness, normal answers", lambda: gate(
        url, warmup_requests=2))
    assert error is None and list(result["stages"]) == ["health", "models", "request"]
    assert result["response"] == {"text": " world", "usage": {"completion_tokens": 1}}
    assert result["warmup_requests"] == 2


def test_readiness_control_old_read(peer):
    url, routes = peer
    routes["/health"] = ("drip", SHORT_DRIP)
    assert_outlives("readiness /health, old read, short drip",
                    lambda: old_get(f"{url}/health", 10))
    routes["/health"] = ("huge", 2 * serve_ready.READY_MAX_BYTES + MiB)
    assert_peaks("readiness /health, old read, 9 MiB answer",
                 lambda: old_get(f"{url}/health", 10), serve_ready.READY_MAX_BYTES)


# ----------------------------------------------------------------- the Packages index
def repo_args(module_name, url, timeout=15):
    common = {"distribution": "Debian", "distribution_version": "12",
              "architecture": "x86_64", "repo_url": f"{url}/repo/", "trusted": True,
              "timeout": timeout}
    if module_name == "nvidia_repo_info":
        return dict(common, component="container_toolkit",
                    packages=["nvidia-container-toolkit"],
                    setting="container_toolkit_repo_url")
    return dict(common, branch="580", kernel_module="open", devices=[])


@pytest.mark.parametrize("module_name", ["nvidia_repo_info", "nvidia_driver_plan"])
def test_packages_huge_index_stops_at_the_cap(peer, module_name, monkeypatch):
    from gpufleet import hoststack
    module = __import__(module_name)
    url, routes = peer
    routes["/repo/Packages"] = ("huge", HUGE)
    (result, failed), error, _, peak = measure(
        f"{module_name} Packages, 200 MB answer",
        lambda: run_module(module.main, repo_args(module_name, url, timeout=60), monkeypatch))
    assert error is None and failed
    assert f"{url}/repo/Packages: the server sent more than 64 MiB (the cap" in result["msg"]
    assert "Nothing was changed" in result["msg"]
    assert peak < 2 * hoststack.REPOSITORY_MAX_BYTES


@pytest.mark.parametrize("module_name", ["nvidia_repo_info", "nvidia_driver_plan"])
def test_packages_drip_ends_at_the_modules_timeout(peer, module_name, monkeypatch):
    module = __import__(module_name)
    url, routes = peer
    routes["/repo/Packages"] = ("drip", None)
    (result, failed), error, wall, _ = measure(
        f"{module_name} Packages, drip for ever",
        lambda: run_module(module.main, repo_args(module_name, url, timeout=1), monkeypatch))
    assert error is None and failed
    assert (f"{url}/repo/Packages: the server did not answer in full within 1 s"
            in result["msg"])
    assert DEADLINE <= wall < DEADLINE + MARGIN


def test_packages_normal_index_is_read_as_before(peer, monkeypatch):
    import nvidia_repo_info
    url, routes = peer
    index = (b"Package: nvidia-container-toolkit\nVersion: 1.17.8-1\nArchitecture: amd64\n\n"
             b"Package: nvidia-container-toolkit\nVersion: 1.18.0-1\nArchitecture: amd64\n\n")
    routes["/repo/Packages"] = ("body", (200, index, {}))
    (result, failed), error, _, _ = measure(
        "nvidia_repo_info Packages, normal answer",
        lambda: run_module(nvidia_repo_info.main, repo_args("nvidia_repo_info", url), monkeypatch))
    assert error is None and not failed
    assert result["available"] == {"nvidia-container-toolkit": ["1.17.8-1", "1.18.0-1"]}
    assert old_fetch(f"{url}/repo/Packages", 15) == index


def test_packages_control_old_read(peer):
    from gpufleet import hoststack
    url, routes = peer
    routes["/repo/Packages"] = ("drip", SHORT_DRIP)
    assert_outlives("Packages, old read, short drip",
                    lambda: old_fetch(f"{url}/repo/Packages", DEADLINE))
    cap = hoststack.REPOSITORY_MAX_BYTES
    routes["/repo/Packages"] = ("huge", 2 * cap + MiB)
    assert_peaks("Packages, old read, 129 MiB answer",
                 lambda: old_fetch(f"{url}/repo/Packages", 60), cap)


# ----------------------------------------------------------------- the bench result
def test_bench_result_archive_is_capped():
    import vllm_bench

    class Container:
        def get_archive(self, path):
            return huge_chunks(), {}

    _, error, _, peak = measure("vllm_bench result archive, 200 MB stream",
                                lambda: vllm_bench._read_result(Container(), "/r/result.json"))
    # vllm_bench has bounded.py as Ansible ships it (ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet)
    assert type(error).__name__ == "BoundError" and isinstance(error, ValueError)
    assert "the bench container's /r/result.json sent more than 16 MiB" in str(error)
    assert peak < 2 * vllm_bench.RESULT_MAX_BYTES


# ----------------------------------------------------------------- bounded.py itself
def gzip_bomb(total=HUGE):
    """gzip of `total` zero bytes, made a block at a time (about 200 KB for 200 MB)."""
    z, out, zeros = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS), [], bytes(MiB)
    for _ in range(total // MiB):
        out.append(z.compress(zeros))
    out.append(z.flush())
    return b"".join(out)


def test_a_gzip_bomb_is_cut_at_the_cap_decoded(peer):
    url, routes = peer
    routes["/bomb"] = ("body", (200, gzip_bomb(), {"Content-Encoding": "gzip"}))
    _, error, _, peak = measure("gzip bomb (200 MB decoded), cap 4 MiB", lambda: (
        bounded.http_request(requests.Session(), "GET", f"{url}/bomb", 4 * MiB, 10)))
    assert isinstance(error, BoundError) and error.kind == "cap" and peak < 8 * MiB


def test_bytes_after_a_gzip_body_count_against_the_cap(peer):
    url, routes = peer
    body = gzip.compress(b"ok") + bytes(8 * MiB)
    routes["/junk"] = ("body", (200, body, {"Content-Encoding": "gzip"}))
    _, error, _, peak = measure("gzip body + 8 MiB after its end, cap 1 MiB", lambda: (
        bounded.http_request(requests.Session(), "GET", f"{url}/junk", MiB, 10)))
    assert isinstance(error, BoundError) and error.kind == "cap"
    assert peak < 4 * MiB  # the 8 MiB were sent by this process's server thread


def test_dripped_headers_end_at_the_deadline(peer):
    url, routes = peer
    routes["/slow-headers"] = ("drip-headers", None)
    _, error, wall, _ = measure("status line and headers dripped", lambda: (
        bounded.http_request(requests.Session(), "GET", f"{url}/slow-headers", MiB, DEADLINE)))
    assert isinstance(error, BoundError) and error.kind == "deadline"
    assert "0 bytes read by then" in str(error)
    assert DEADLINE <= wall < DEADLINE + MARGIN
    _, error, wall, _ = measure("status line and headers dripped, open_capped", lambda: (
        bounded.open_capped(urllib.request.urlopen, f"{url}/slow-headers", MiB, DEADLINE)))
    assert isinstance(error, BoundError) and DEADLINE <= wall < DEADLINE + MARGIN


def test_the_peers_own_errors_pass_unchanged():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(requests.ConnectionError):
        bounded.http_request(requests.Session(), "GET", f"http://127.0.0.1:{port}/", MiB, 5)
    with pytest.raises(OSError):
        bounded.open_capped(urllib.request.urlopen, f"http://127.0.0.1:{port}/", MiB, 5)
    with pytest.raises(BoundError, match="Content-Encoding 'br'"):
        bounded.Decoder("br", "http://x/")


def test_read_capped_and_join_capped_on_plain_callables():
    chunks = iter([b"ab", b"cd", b""])
    assert bounded.read_capped(lambda n: next(chunks), 4, bounded.Deadline(5, "t")) == b"abcd"
    chunks = iter([b"ab", b"cde", b""])
    with pytest.raises(BoundError, match=r"^t sent more than 4 bytes \(the cap on this answer\)"):
        bounded.read_capped(lambda n: next(chunks), 4, bounded.Deadline(5, "t"))
    assert bounded.join_capped([b"ab", b"cd"], 4, "t") == b"abcd"
    with pytest.raises(BoundError, match="sent more than 1 KiB"):
        bounded.join_capped(iter(functools.partial(bytes, 512), None), 1024, "t")
    with pytest.raises(BoundError, match=r"within 0 s \(the deadline"):
        bounded.read_capped(lambda n: b"x", 4, bounded.Deadline(0, "t"))
