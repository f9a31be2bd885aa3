"""Run nginx (Debian nginx-light) in the foreground on loopback with the server configs of
a folder, as the hf_site_mirror role's nginx would: for tests and the benchmark."""
from __future__ import annotations

import pathlib
import subprocess
import time

import requests

from .olahlab import free_port


class Nginx:
    """`with Nginx(workdir, conf_dir) as proc:` includes conf_dir/*.conf in http {}."""

    def __init__(self, workdir, conf_dir, workers=2):
        self.workdir = pathlib.Path(workdir)
        self.conf_dir = pathlib.Path(conf_dir)
        self.workers = workers
        self.proc = None

    def __enter__(self):
        w = self.workdir
        for d in ("tmp", "logs"):
            (w / d).mkdir(parents=True, exist_ok=True)
        conf = w / "nginx.conf"
        conf.write_text(
            "daemon off;\nuser root;\n"
            f"worker_processes {self.workers};\n"
            f"pid {w}/nginx.pid;\nerror_log {w}/logs/error.log warn;\n"
            "events { worker_connections 256; }\n"
            "http {\n  access_log off;\n"
            f"  client_body_temp_path {w}/tmp/body;\n"
            f"  include {self.conf_dir}/*.conf;\n}}\n")
        subprocess.run(["nginx", "-t", "-q", "-p", str(w), "-c", str(conf)], check=True,
                       capture_output=True)
        self.proc = subprocess.Popen(["nginx", "-p", str(w), "-c", str(conf)],
                                     stderr=subprocess.PIPE)
        return self

    def wait(self, url, timeout=20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                requests.get(url, timeout=1)
                return
            except requests.ConnectionError:
                time.sleep(0.1)
        raise RuntimeError(f"nginx did not answer on {url}")

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


__all__ = ["Nginx", "free_port"]
