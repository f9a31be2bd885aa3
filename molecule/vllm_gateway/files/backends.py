#!/usr/bin/env python3
"""STAND-IN vLLM instances for the vllm_gateway scenario: tiny HTTP servers on 127.0.0.1
(not vLLM), also used by the fleet_monitoring scenario. Each answers GET /health with 200,
GET /metrics with a few gauges under vLLM's own metric names (the Prometheus text format,
the values fixed), and every other GET or POST, keyless, with JSON naming its own port, the
path and the Authorization header exactly as it arrived (as vLLM's routes that check no key
do: only the gateway's front door can refuse them).

  backends.py start STATE PORT...   serve in the background (pid in STATE/backends.pid),
                                     stopping by itself after --lifetime seconds
  backends.py stop STATE            stop the process of STATE/backends.pid
"""
import argparse
import http.server
import json
import os
import pathlib
import signal
import sys
import threading
import time


# vLLM's metric names (vllm/v1/metrics/loggers.py), with fixed stand-in values.
METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{model}"}} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="{model}"}} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="{model}"}} 0.25
"""


class Handler(http.server.BaseHTTPRequestHandler):
    def _answer(self):
        if self.path == "/health":
            code, body = 200, b""
        elif self.path == "/metrics":
            code, body = 200, METRICS.format(model="stand-in").encode()
        else:
            # Every other path answers, keyless, as several of vLLM's own routes do (/tokenize,
            # /invocations, /load, ...): only the gateway can refuse them.
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(min(length, 2 ** 20))
            code = 200
            body = json.dumps({"port": self.server.server_port, "path": self.path,
                               "authorization": self.headers.get("Authorization")}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; version=0.0.4" if self.path == "/metrics"
                         else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_HEAD = _answer

    def log_message(self, *args):
        pass


def serve(ports, lifetime):
    for port in ports:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    time.sleep(lifetime)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["start", "stop", "run"])
    parser.add_argument("state")
    parser.add_argument("ports", nargs="*", type=int)
    parser.add_argument("--lifetime", type=int, default=900)
    args = parser.parse_args()
    state = pathlib.Path(args.state)
    pidfile = state / "backends.pid"
    if args.action == "stop":
        if pidfile.exists():
            try:
                os.kill(int(pidfile.read_text()), signal.SIGTERM)
            except ProcessLookupError:
                pass
            pidfile.unlink()
        return
    if args.action == "run":
        serve(args.ports, args.lifetime)
        return
    state.mkdir(parents=True, exist_ok=True)
    if os.fork():
        return
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    pidfile.write_text(str(os.getpid()))
    serve(args.ports, args.lifetime)
    sys.exit(0)


if __name__ == "__main__":
    main()
