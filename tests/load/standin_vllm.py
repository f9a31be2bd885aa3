#!/usr/bin/env python3
"""STAND-IN vLLM instances for the rollout orchestration tests: tiny OpenAI-shaped HTTP
servers on 127.0.0.1 (not vLLM), behind a REAL HAProxy (tests/unit/test_upgrade_orchestration.py).

What each one answers, as vLLM 0.32.0 does for the paths gpufleet and the load generator use:
- GET /health: 200, empty.
- GET /metrics: vllm:num_requests_running (the requests this process is answering now:
  the drain's idle wait reads it) and vllm:num_requests_waiting (0), Prometheus text.
- POST /v1/completions with `Authorization: Bearer <key>` (else 401): after --latency
  seconds, one choice with finish_reason "length" and usage counting max_tokens.
- POST /v1/chat/completions with "stream": true: text/event-stream, HTTP/1.1 chunked, one
  `data:` chunk per token every --chunk-interval seconds, a chunk with finish_reason
  "length", a usage chunk, then `data: [DONE]` (tests/load/loadgen.py checks all of it).
  A process killed mid-stream cuts the stream, as a replaced container does.

    standin_vllm.py serve PORT --key KEY [--latency S] [--chunk-interval S]
    standin_vllm.py restart STATE HOST [--slow]  replace HOST's process (STATE/backends.json:
                                                 {"key", "ports": {host: port}}), SIGKILL the
                                                 old one, start the new one, wait for /health;
                                                 --slow: the new one answers 1.5 s late
    standin_vllm.py stop STATE                   stop every process of STATE
Each process stops by itself after an hour (a test that died leaves nothing for long).
"""
import argparse
import http.server
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
import urllib.request

LIFETIME_S = 3600
SLOW_LATENCY_S = 1.5


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet: the test reads HAProxy's and its own output
        pass

    def _send(self, code, body, ctype="application/json"):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self._send(200, b"")
        elif self.path == "/metrics":
            running = self.server.running
            self._send(200, (
                "# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{engine="0",model_name="chat"}} {running}.0\n'
                "# TYPE vllm:num_requests_waiting gauge\n"
                'vllm:num_requests_waiting{engine="0",model_name="chat"} 0.0\n').encode(),
                "text/plain; version=0.0.4")
        else:
            self._send(404, b'{"error": "not found"}')

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(min(length, 2 ** 20)) or b"{}")
        if self.headers.get("Authorization") != f"Bearer {self.server.key}":
            return self._send(401, b'{"error": "Unauthorized"}')
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            return self._send(404, b'{"error": "not found"}')
        with self.server.lock:
            self.server.running += 1
        try:
            tokens = int(body.get("max_tokens") or 16)
            if body.get("stream"):
                self._stream(body, tokens)
            else:
                time.sleep(self.server.latency)
                self._send(200, json.dumps({
                    "id": "cmpl-standin", "object": "text_completion", "model": body.get("model"),
                    "choices": [{"index": 0, "text": " ok" * tokens, "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 4, "completion_tokens": tokens,
                              "total_tokens": 4 + tokens}}).encode())
        finally:
            with self.server.lock:
                self.server.running -= 1

    def _stream(self, body, tokens):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def event(data):
            raw = f"data: {data}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(raw), raw))
            self.wfile.flush()

        base = {"id": "chatcmpl-standin", "object": "chat.completion.chunk", "model": body.get("model")}
        time.sleep(self.server.latency)
        for i in range(tokens):
            event(json.dumps(dict(base, choices=[{"index": 0, "delta": {"content": f" t{i}"},
                                                  "finish_reason": None}])))
            time.sleep(self.server.chunk_interval)
        event(json.dumps(dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": "length"}])))
        event(json.dumps(dict(base, choices=[], usage={"prompt_tokens": 8, "completion_tokens": tokens,
                                                       "total_tokens": 8 + tokens})))
        event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def serve(port, key, latency, chunk_interval):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.key, server.latency, server.chunk_interval = key, latency, chunk_interval
    server.running, server.lock = 0, threading.Lock()
    threading.Timer(LIFETIME_S, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
    server.serve_forever()


def _healthy(port, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"the stand-in on port {port} did not answer /health in {timeout} s")


def _kill(pidfile):
    try:
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return
    # wait until the port is free again (the kernel closes the socket with the process)
    time.sleep(0.2)


def restart(state, host, slow=False):
    state = pathlib.Path(state)
    config = json.loads((state / "backends.json").read_text())
    port = config["ports"][host]
    _kill(state / f"{host}.pid")
    proc = subprocess.Popen(
        [sys.executable, __file__, "serve", str(port), "--key", config["key"],
         "--latency", str(SLOW_LATENCY_S if slow else config.get("latency", 0.02)),
         "--chunk-interval", str(config.get("chunk_interval", 0.05))],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    (state / f"{host}.pid").write_text(str(proc.pid))
    _healthy(port)


def stop(state):
    for pidfile in pathlib.Path(state).glob("*.pid"):
        _kill(pidfile)
        pidfile.unlink()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("serve")
    p.add_argument("port", type=int)
    p.add_argument("--key", required=True)
    p.add_argument("--latency", type=float, default=0.02)
    p.add_argument("--chunk-interval", type=float, default=0.05)
    p = sub.add_parser("restart")
    p.add_argument("state")
    p.add_argument("host")
    p.add_argument("--slow", action="store_true")
    p = sub.add_parser("stop")
    p.add_argument("state")
    args = parser.parse_args(argv)
    if args.cmd == "serve":
        serve(args.port, args.key, args.latency, args.chunk_interval)
    elif args.cmd == "restart":
        restart(args.state, args.host, args.slow)
    else:
        stop(args.state)


if __name__ == "__main__":
    main()
