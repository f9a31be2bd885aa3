"""The readiness gate: is a started vLLM server really serving its model?

Plain data in, plain data out; no Ansible imports. Used by the module `vllm_ready`
(roles/vllm_server after every start, roles/fleet_upgrade's gates): /health, then
/v1/models listing the served name, then one real request (a short completion, or an
embedding for a pooling model), every request bounded (bounded.http_request).
"""
from __future__ import annotations

import time

from . import bounded

__all__ = ["NotReady", "READY_MAX_BYTES", "READY_POLL_TIMEOUT", "REQUEST_MAX_BYTES",
           "readiness_request", "wait_ready"]


class NotReady(Exception):
    """The server did not become ready; `stage` names the check that failed."""

    def __init__(self, stage, detail, elapsed):
        super().__init__(f"{stage}: {detail}")
        self.stage = stage
        self.detail = detail
        self.elapsed = elapsed


def readiness_request(runner, served_name):
    """(path, JSON body) of the one real request: a short completion or an embedding."""
    if runner == "pooling":
        return "/v1/embeddings", {"model": served_name, "input": "gpufleet readiness check"}
    return "/v1/completions", {"model": served_name, "prompt": "Hello", "max_tokens": 4,
                               "temperature": 0}


def _check_response(runner, body):
    if runner == "pooling":
        data = (body or {}).get("data") or []
        if not data or not data[0].get("embedding"):
            raise ValueError(f"the embedding response has no vector: {str(body)[:300]}")
        return {"dimensions": len(data[0]["embedding"])}
    choices = (body or {}).get("choices") or []
    if not choices or "text" not in choices[0]:
        raise ValueError(f"the completion response has no choices: {str(body)[:300]}")
    return {"text": choices[0]["text"], "usage": body.get("usage")}


# What the readiness gate reads: /health (empty) and /v1/models (under 1 KiB a model) at
# most READY_MAX_BYTES, each within READY_POLL_TIMEOUT seconds in all; the real request's
# answer (4 tokens, or one embedding: 4096 floats are ~80 KiB of JSON) at most
# REQUEST_MAX_BYTES within request_timeout.
READY_MAX_BYTES = 4 << 20
READY_POLL_TIMEOUT = 10
REQUEST_MAX_BYTES = 16 << 20
_POLL_ADVICE = ("vLLM answers this at once and in a few KiB: check the instance, or what "
                "answers at its address.")
_REQUEST_ADVICE = ("A completion of a few tokens (or one embedding) is a few KiB: check the "
                   "instance, or what answers at its address; a first request that is "
                   "really this slow needs a larger request_timeout.")


def wait_ready(session, base_url, api_key, served_name, runner="generate", timeout=1800,
               interval=5, request_timeout=120, warmup_requests=0, alive=None,
               clock=time.monotonic, sleep=time.sleep):
    """Wait for /health, then /v1/models listing served_name, then one real request.

    session: a requests.Session.
    alive: optional callable -> (bool running, str why): checked between polls, so a
      container that exited fails at once instead of after `timeout`.
    Every request is bounded (bounded.http_request): /health and /v1/models by
    READY_MAX_BYTES and READY_POLL_TIMEOUT seconds in all, the real request and the
    warm-up requests by REQUEST_MAX_BYTES and request_timeout seconds in all; a request
    started before `timeout` runs to its own limit, so a server that drips its answers
    holds the gate at most that much past `timeout`.
    Returns {"elapsed", "stages" (seconds at which each passed), "response",
    "warmup_requests"}. Raises NotReady(stage, detail, elapsed).
    """
    start = clock()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    stages = {}
    last = "not tried yet"

    def elapsed():
        return round(clock() - start, 1)

    def request(method, path, limit, seconds, advice, **kwargs):
        return bounded.http_request(session, method, f"{base_url}{path}", limit, seconds,
                                    advice=advice, **kwargs)

    def poll(stage, attempt):
        nonlocal last
        while True:
            if alive is not None:
                running, why = alive()
                if not running:
                    raise NotReady(stage, f"the container is not running ({why})", elapsed())
            try:
                result = attempt()
            except NotReady:
                raise
            except Exception as exc:  # network errors and bad answers: retry until timeout
                last = f"{type(exc).__name__}: {exc}"
                result = None
            if result is not None:
                stages[stage] = elapsed()
                return result
            if clock() - start + interval > timeout:
                raise NotReady(stage, f"not passed after {timeout}s (last: {last})", elapsed())
            sleep(interval)

    def health():
        resp = request("GET", "/health", READY_MAX_BYTES, READY_POLL_TIMEOUT, _POLL_ADVICE)
        if resp.status_code != 200:
            raise ValueError(f"/health answered {resp.status_code}")
        return True

    def models():
        resp = request("GET", "/v1/models", READY_MAX_BYTES, READY_POLL_TIMEOUT, _POLL_ADVICE,
                       headers=headers)
        if resp.status_code == 401:
            raise NotReady("models", "/v1/models answered 401: the API key is not the "
                           "one the server was started with", elapsed())
        if resp.status_code != 200:
            raise ValueError(f"/v1/models answered {resp.status_code}")
        ids = [m.get("id") for m in resp.json().get("data", [])]
        if served_name not in ids:
            raise ValueError(f"/v1/models lists {ids}, not {served_name!r}")
        return ids

    path, body = readiness_request(runner, served_name)

    def real_request():
        resp = request("POST", path, REQUEST_MAX_BYTES, request_timeout, _REQUEST_ADVICE,
                       json=body, headers=headers)
        if resp.status_code != 200:
            # The server is up and answered: a failing request is not going to heal.
            raise NotReady("request", f"{path} answered {resp.status_code}: "
                           f"{resp.text[:300]}", elapsed())
        return _check_response(runner, resp.json())

    poll("health", health)
    poll("models", models)
    response = poll("request", real_request)
    warm = 0
    for _request in range(int(warmup_requests)):
        warm_body = dict(body, max_tokens=1) if runner != "pooling" else body
        try:
            resp = bounded.http_request(session, "POST", f"{base_url}{path}", REQUEST_MAX_BYTES,
                                        request_timeout, advice=_REQUEST_ADVICE, json=warm_body,
                                        headers=headers)
        except Exception as exc:  # network errors (requests'), bounded.BoundError
            # the server passed the gate a moment ago: one that stops answering now is not ready
            raise NotReady("warmup", f"warm-up request {warm + 1} of {int(warmup_requests)} "
                           f"failed: {str(exc)[:300]}", elapsed()) from None
        if resp.status_code == 200:
            warm += 1
    return {"elapsed": elapsed(), "stages": stages, "response": response,
            "warmup_requests": warm}
