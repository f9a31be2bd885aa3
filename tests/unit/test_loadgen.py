"""tests/load/loadgen.py's verdicts on a response: what counts as a good completion and a
good stream (issue #31 item 10: a stream cut mid-way is a failed request)."""
import json
import pathlib

import pytest

from load.loadgen import Load, check_completion, check_stream  # noqa: E402


class Resp:
    def __init__(self, status=200, lines=(), ctype="text/event-stream; charset=utf-8", body=None):
        self.status_code, self.headers, self._lines = status, {"Content-Type": ctype}, list(lines)
        self.text = body if body is not None else ""

    def iter_lines(self, decode_unicode=False):
        for line in self._lines:
            if isinstance(line, Exception):
                raise line
            yield line

    def json(self):
        return json.loads(self.text)


def chunk(**choice):
    return b"data: " + json.dumps({"choices": [dict({"index": 0}, **choice)]}).encode()


def stream(tokens=3, done=True, usage=None):
    lines = []
    for i in range(tokens):
        lines += [chunk(delta={"content": f" t{i}"}, finish_reason=None), b""]
    lines += [chunk(delta={}, finish_reason="length"), b""]
    lines += [b"data: " + json.dumps({"choices": [], "usage": usage or {"completion_tokens": tokens}}).encode(), b""]
    if done:
        lines += [b"data: [DONE]", b""]
    return lines


def test_a_whole_stream_is_good():
    assert check_stream(Resp(lines=stream(3)), 3) is None


@pytest.mark.parametrize("resp, reason", [
    (Resp(lines=stream(3, done=False)), "without [DONE] after 5 chunks (cut mid-way)"),
    (Resp(lines=stream(3)[:3] + [b'data: {"choices": [{"ind']), "chunk 3 is not JSON (cut mid-way?)"),
    (Resp(lines=stream(3, usage={"completion_tokens": 2})), "does not count the 3 tokens"),
    (Resp(lines=[b"data: [DONE]"]), "no finished choice with content in 0 chunks"),
    (Resp(lines=stream(3) + [chunk(delta={"content": "x"})]), "data after [DONE]"),
    (Resp(lines=[b"event: ping"] + stream(3)), "not an SSE data line"),
    (Resp(status=503, body="no server"), "HTTP 503"),
    (Resp(ctype="application/json", body="{}"), "not an event stream"),
], ids=["no-done", "cut-json", "short-usage", "empty", "after-done", "not-sse", "5xx", "not-a-stream"])
def test_a_broken_stream_is_a_failure_with_its_reason(resp, reason):
    why = check_stream(resp, 3)
    assert why and reason in why, why


def test_a_connection_cut_mid_stream_raises_for_the_client_to_count():
    """The client counts what iter_lines raises (requests' ChunkedEncodingError): the
    control in test_upgrade_orchestration.py cuts real streams."""
    import requests
    resp = Resp(lines=stream(3)[:2] + [requests.exceptions.ChunkedEncodingError("ended prematurely")])
    with pytest.raises(requests.exceptions.ChunkedEncodingError):
        check_stream(resp, 3)


def test_a_completion_needs_a_finished_choice_and_tokens():
    good = {"choices": [{"text": " ok", "finish_reason": "length"}], "usage": {"completion_tokens": 1}}
    assert check_completion(Resp(ctype="application/json", body=json.dumps(good))) is None
    cut = dict(good, choices=[{"text": " ok", "finish_reason": None}])
    assert "no finished choice" in check_completion(Resp(ctype="application/json", body=json.dumps(cut)))


def test_only_loopback_and_the_stream_body():
    with pytest.raises(ValueError, match="only sends to loopback"):
        Load("http://10.0.0.1:8000", "k", "m")
    load = Load("http://127.0.0.1:9", "k", "m", stream=True, max_tokens=32)
    assert load.url.endswith("/v1/chat/completions")
    assert load.body["stream"] and load.body["ignore_eos"] and load.body["max_tokens"] == 32
    assert load.body["stream_options"] == {"include_usage": True}
