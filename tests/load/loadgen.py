"""A bounded load generator for the upgrade tests: real requests, every response checked.

    gen = Load(url, api_key, model, clients=2)
    gen.start(); ...; result = gen.stop()     # {"sent", "failed", "failures": [...]}
    chats = Load(url, api_key, model, clients=1, stream=True, max_tokens=48)

Each client thread sends one request after another until stopped, or until `max_requests`
or `max_seconds` is reached, whichever comes first: it always ends by itself.
- Short completions (the default): POST /v1/completions with a fixed prompt. A response
  counts as good only when it is HTTP 200, a complete JSON body, with a choice whose
  finish_reason is set and whose usage counts the tokens generated.
- Long streaming chats (`stream=True`): POST /v1/chat/completions with "stream": true,
  "ignore_eos" (vLLM's sampling parameter: every stream runs its `max_tokens`) and the
  usage in the last chunk. A stream counts as good only when it is HTTP 200 and
  text/event-stream, every event is `data: <JSON chunk>`, the content arrives in deltas,
  a chunk says finish_reason, the usage counts every token asked for and `data: [DONE]`
  ends it. A stream cut mid-way (a closed connection, a read timeout, an event that is not
  JSON, no [DONE]) is a failure, with how many chunks arrived before.
Anything else (a refused connection, a 5xx, a cut or empty body) is a failure with its
reason and time. Only loopback addresses are allowed.

Command line (for a person watching an upgrade):
    .venv/bin/python tests/load/loadgen.py URL MODEL --key-file .cache/lab/api-key --seconds 60
    .venv/bin/python tests/load/loadgen.py URL MODEL --key-file .cache/lab/api-key --stream
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import threading
import time
import urllib.parse

import requests


def _loopback_only(url):
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        ok = ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = host == "localhost"
    if not ok:
        raise ValueError(f"the load generator only sends to loopback addresses, not {host!r}")


def check_completion(resp):
    """None when the response is a complete, successful completion; else the reason."""
    if resp.status_code != 200:
        return f"HTTP {resp.status_code}: {resp.text[:200]}"
    try:
        body = resp.json()
    except ValueError:
        return f"body is not complete JSON: {resp.text[:200]!r}"
    choices = body.get("choices") or []
    if not choices or choices[0].get("finish_reason") is None or "text" not in choices[0]:
        return f"no finished choice: {str(body)[:200]}"
    if not (body.get("usage") or {}).get("completion_tokens"):
        return f"no tokens generated: {str(body)[:200]}"
    return None


def check_stream(resp, max_tokens):
    """None when the response is a complete chat stream of `max_tokens` tokens; else the
    reason. Reads the whole stream (a cut connection raises, and the caller counts it)."""
    if resp.status_code != 200:
        return f"HTTP {resp.status_code}: {resp.text[:200]}"
    ctype = resp.headers.get("Content-Type", "")
    if not ctype.startswith("text/event-stream"):
        return f"not an event stream ({ctype!r}): {resp.text[:200]!r}"
    chunks, deltas, finished, usage, done = 0, 0, None, None, False
    for line in resp.iter_lines(decode_unicode=False):
        if not line:
            continue
        if done:
            return f"data after [DONE] (chunk {chunks}): {line[:100]!r}"
        if not line.startswith(b"data: "):
            return f"not an SSE data line after {chunks} chunks: {line[:100]!r}"
        data = line[len(b"data: "):]
        if data == b"[DONE]":
            done = True
            continue
        try:
            chunk = json.loads(data)
        except ValueError:
            return f"chunk {chunks + 1} is not JSON (cut mid-way?): {data[:100]!r}"
        chunks += 1
        for choice in chunk.get("choices") or []:
            if (choice.get("delta") or {}).get("content"):
                deltas += 1
            finished = choice.get("finish_reason") or finished
        usage = chunk.get("usage") or usage
    if not done:
        return f"the stream ended without [DONE] after {chunks} chunks (cut mid-way)"
    if not finished or not deltas:
        return f"no finished choice with content in {chunks} chunks"
    if (usage or {}).get("completion_tokens") != max_tokens:
        return f"usage {usage} does not count the {max_tokens} tokens asked for"
    return None


class Load:
    def __init__(self, url, api_key, model, clients=2, max_tokens=8, max_requests=5000,
                 max_seconds=1800, request_timeout=180, pause=0.0, stream=False):
        _loopback_only(url)
        self.stream, self.max_tokens = stream, max_tokens
        self.headers = {"Authorization": f"Bearer {api_key}"}
        if stream:
            self.url = url.rstrip("/") + "/v1/chat/completions"
            self.body = {"model": model, "max_tokens": max_tokens, "temperature": 0,
                         "messages": [{"role": "user",
                                       "content": "Tell the story of a fleet upgrade."}],
                         "stream": True, "stream_options": {"include_usage": True},
                         "ignore_eos": True}
        else:
            self.url = url.rstrip("/") + "/v1/completions"
            self.body = {"model": model, "prompt": "The fleet upgrade", "max_tokens": max_tokens,
                         "temperature": 0}
        self.clients, self.max_requests, self.max_seconds = clients, max_requests, max_seconds
        self.request_timeout, self.pause = request_timeout, pause
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.sent, self.failures, self.latencies = 0, [], []
        self._threads, self._start = [], None

    def _client(self):
        session = requests.Session()
        while not self._stop.is_set():
            with self._lock:
                if self.sent >= self.max_requests or time.monotonic() - self._start > self.max_seconds:
                    return
                self.sent += 1
            began = time.monotonic()
            try:
                with session.post(self.url, json=self.body, headers=self.headers,
                                  timeout=self.request_timeout, stream=self.stream) as resp:
                    why = (check_stream(resp, self.max_tokens) if self.stream
                           else check_completion(resp))
            except requests.RequestException as exc:
                why = f"{type(exc).__name__}: {str(exc)[:200]}"
            with self._lock:
                if why:
                    self.failures.append({"t": round(began - self._start, 2), "why": why})
                else:
                    self.latencies.append(time.monotonic() - began)
            if self.pause:
                time.sleep(self.pause)

    def start(self):
        self._start = time.monotonic()
        self._threads = [threading.Thread(target=self._client, daemon=True)
                         for _ in range(self.clients)]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self):
        self._stop.set()
        for thread in self._threads:
            thread.join(self.request_timeout + 5)
        lat = sorted(self.latencies)
        return {"sent": self.sent, "failed": len(self.failures), "ok": len(lat),
                "failures": self.failures[:20],
                "seconds": round(time.monotonic() - self._start, 1),
                "p50_s": round(lat[len(lat) // 2], 3) if lat else None,
                "max_s": round(lat[-1], 3) if lat else None}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("model")
    parser.add_argument("--key-file", required=True)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--stream", action="store_true", help="long streaming chats")
    parser.add_argument("--max-tokens", type=int, default=None)
    args = parser.parse_args(argv)
    key = open(args.key_file, encoding="utf-8").read().strip()
    load = Load(args.url, key, args.model, clients=args.clients, max_seconds=args.seconds,
                stream=args.stream, max_tokens=args.max_tokens or (48 if args.stream else 8))
    load.start()
    time.sleep(args.seconds)
    print(json.dumps(load.stop(), indent=2))


if __name__ == "__main__":
    main()
