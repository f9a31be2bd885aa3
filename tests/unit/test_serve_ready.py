"""The readiness gate (plugins/module_utils/gpufleet/serve_ready.py) and the vllm_ready
module's main().

Stand-in: the gate is tested against a small HTTP server on 127.0.0.1 that answers like
vLLM's OpenAI server (/health, /v1/models and /v1/completions or /v1/embeddings behind a
bearer key, 401 without it; paths and bodies as in
vllm/entrypoints/openai/api_server.py), so every stage and failure can be produced. The
container logs under tests/fixtures/serve/ are real logs of the lab's vLLM CPU image.
"""
import http.server
import json
import pathlib
import socket
import threading

import pytest
import requests

from gpufleet import serve_ready
from helpers import run_module

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "serve"
KEY = "sk-gpufleet-unit-7f3a9c"


def _log(name):
    return (FIXTURES / name).read_text()


class FakeVllm(http.server.BaseHTTPRequestHandler):
    """Stand-in for vLLM's OpenAI server on loopback (see module docstring)."""
    state = {}

    def log_message(self, *args):
        pass

    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorised(self):
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            self._send(401, {"error": "Unauthorized"})
            return False
        return True

    def do_GET(self):
        st = self.state
        st["hits"] = st.get("hits", 0) + 1
        if self.path == "/health":
            self._send(200 if st["hits"] > st.get("unhealthy_polls", 0) else 503, {})
        elif self.path == "/v1/models" and self._authorised():
            self._send(200, {"object": "list", "data": [{"id": n, "object": "model"}
                                                        for n in st.get("models", [])]})

    def do_POST(self):
        st = self.state
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if not self._authorised():
            return
        st.setdefault("posts", []).append((self.path, body))
        if st.get("post_status", 200) != 200:
            self._send(st["post_status"], {"error": "boom"})
        elif self.path == "/v1/completions":
            self._send(200, {"choices": [{"text": " world", "index": 0}],
                             "usage": {"completion_tokens": 1}})
        elif self.path == "/v1/embeddings":
            self._send(200, {"data": [{"embedding": [0.1] * 384, "index": 0}]})
        else:
            self._send(404, {})


@pytest.fixture
def fake_vllm():
    FakeVllm.state = {"models": ["tiny"]}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeVllm)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", FakeVllm.state
    server.shutdown()
    server.server_close()


def _gate(url, **kw):
    opts = {"runner": "generate", "timeout": 5, "interval": 0.05}
    opts.update(kw)
    return serve_ready.wait_ready(requests.Session(), url, KEY, "tiny", **opts)


def test_gate_waits_for_health_then_models_then_a_real_completion(fake_vllm):
    url, state = fake_vllm
    state["unhealthy_polls"] = 3
    result = _gate(url, warmup_requests=3)
    assert list(result["stages"]) == ["health", "models", "request"]
    assert result["response"]["text"] == " world"
    assert result["warmup_requests"] == 3
    assert state["posts"][0] == ("/v1/completions", {"model": "tiny", "prompt": "Hello",
                                                     "max_tokens": 4, "temperature": 0})
    assert all(body["max_tokens"] == 1 for _, body in state["posts"][1:])


def test_gate_sends_an_embedding_for_pooling_models(fake_vllm):
    url, state = fake_vllm
    result = _gate(url, runner="pooling")
    assert result["response"] == {"dimensions": 384}
    assert state["posts"][0][0] == "/v1/embeddings"


def test_gate_times_out_when_the_model_is_not_listed(fake_vllm):
    url, state = fake_vllm
    state["models"] = ["other"]
    with pytest.raises(serve_ready.NotReady) as exc:
        _gate(url, timeout=0.5)
    assert exc.value.stage == "models"
    assert "lists ['other'], not 'tiny'" in exc.value.detail


def test_gate_fails_at_once_on_a_wrong_key_and_on_a_failing_request(fake_vllm):
    url, state = fake_vllm
    with pytest.raises(serve_ready.NotReady, match="401"):
        serve_ready.wait_ready(requests.Session(), url, "wrong", "tiny", timeout=30, interval=0.05)
    state["post_status"] = 500
    with pytest.raises(serve_ready.NotReady) as exc:
        _gate(url, timeout=30)
    assert exc.value.stage == "request" and exc.value.elapsed < 5


def test_gate_stops_when_the_container_died():
    with pytest.raises(serve_ready.NotReady, match=r"not running \(it exited with status 2\)"):
        serve_ready.wait_ready(requests.Session(), "http://127.0.0.1:9", KEY, "tiny", timeout=30,
                         interval=0.05, alive=lambda: (False, "it exited with status 2"))


def test_gate_nothing_listening_times_out_with_last_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(serve_ready.NotReady) as exc:
        serve_ready.wait_ready(requests.Session(), f"http://127.0.0.1:{port}", KEY, "tiny",
                         timeout=0.3, interval=0.05)
    assert exc.value.stage == "health" and "ConnectionError" in exc.value.detail


# ----------------------------------------------------------------- modules' main()
class FakeWatch:
    """Container watch stand-in: a container that exited, with a real vLLM log."""

    def __init__(self, log):
        self.log = log

    def alive(self):
        return False, "it exited with status 1"

    def logs(self, lines):
        return "\n".join(self.log.splitlines()[-lines:])


def test_vllm_ready_main_success_never_returns_the_key(fake_vllm, monkeypatch):
    import vllm_ready
    url, _ = fake_vllm
    result, failed = run_module(vllm_ready.main, {
        "url": url, "api_key": KEY, "served_model_name": "tiny", "interval": 1,
        "timeout": 10}, monkeypatch, check_mode=True)
    assert not failed and not result["changed"]
    assert result["response"]["text"] == " world"
    assert KEY not in json.dumps(result)


def test_vllm_ready_run_failure_carries_diagnosis_and_log_tail():
    import vllm_ready
    params = {"url": "http://127.0.0.1:9", "api_key": KEY, "served_model_name": "tiny",
              "runner": "generate", "timeout": 30, "interval": 1, "request_timeout": 5,
              "warmup_requests": 0, "container": "vllm-tiny", "log_lines": 40}
    failed, result = vllm_ready.run(params, session=requests.Session(),
                                    watch=FakeWatch(_log("missing-weights.log")))
    assert failed and result["stage"] == "health"
    assert "(container vllm-tiny) is not ready" in result["msg"]
    assert "Cause: the model folder has no weights vLLM can load" in result["msg"]
    assert result["diagnoses"][0]["fix"].startswith("fetch the model again")
    assert KEY not in json.dumps(result)


@pytest.mark.parametrize("args, message", [
    ({"timeout": 0}, "timeout must be a whole number of seconds from 1 to 86400 (a day), not 0"),
    ({"interval": -1}, "interval must be a whole number of seconds from 1 to 3600 (an hour), not -1"),
])
def test_vllm_ready_main_bad_input(args, message, monkeypatch):
    import vllm_ready
    result, failed = run_module(vllm_ready.main, {
        "url": "http://127.0.0.1:9", "served_model_name": "x", **args}, monkeypatch)
    assert failed and message in result["msg"]


def test_a_warmup_request_that_fails_is_not_ready_not_a_traceback():
    """A server that stops answering during the warm-up requests fails the gate with the
    stage and the cause (it raised a requests error out of the module before)."""
    import requests

    class Resp:
        def __init__(self, status, body):
            self.status_code, self._body = status, body
            self.text = json.dumps(body)
            self.headers = {}

        def json(self):
            return self._body

    calls = []

    def fake(session, method, url, limit, seconds, advice="", **kw):
        calls.append(url)
        if url.endswith("/health"):
            return Resp(200, {})
        if url.endswith("/v1/models"):
            return Resp(200, {"data": [{"id": "m"}]})
        if len([c for c in calls if c.endswith("/completions")]) > 1:
            raise requests.ConnectionError("connection reset by peer")
        return Resp(200, {"choices": [{"text": "ok"}]})

    import pytest as _pytest
    mp = _pytest.MonkeyPatch()
    mp.setattr(serve_ready.bounded, "http_request", fake)
    try:
        with _pytest.raises(serve_ready.NotReady) as exc:
            serve_ready.wait_ready(object(), "http://x", "k", "m", warmup_requests=3, sleep=lambda s: None)
    finally:
        mp.undo()
    assert exc.value.stage == "warmup" and "connection reset by peer" in str(exc.value)
