"""Run nginx (Debian nginx-light) in the foreground on loopback with the server configs of
a folder, as the hf_site_mirror role's nginx would: for tests and the benchmark."""
from __future__ import annotations

import pathlib
import subprocess
import time

import requests

from .olahlab import free_port


ROOT = pathlib.Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "roles/hf_site_mirror/templates/hf-site-mirror.conf.j2"


def render_site_conf(root, listen, conf_dir):
    """The hf_site_mirror role's server config, rendered outside Ansible (same template)."""
    import jinja2  # ansible's dependency, in .venv

    address, _, port = str(listen).rpartition(":")
    address = address.strip("[]") or "127.0.0.1"
    conf_dir = pathlib.Path(conf_dir)
    conf_dir.mkdir(parents=True, exist_ok=True)
    (conf_dir / "gpufleet-hf-site-mirror.conf").write_text(
        jinja2.Template(TEMPLATE.read_text()).render(
            ansible_managed="rendered by tests/hfstub/nginxlab.py",
            hf_site_mirror_root=str(root), hf_site_mirror_bind_address=address,
            hf_site_mirror_port=int(port), hf_site_mirror_allow=[]))
    return conf_dir


def write_main_conf(workdir, conf_dir, workers=2, daemon=False, access_log=None):
    """A main nginx.conf under workdir that includes conf_dir/*.conf in http {}. With
    access_log (a path), each request is logged as "status body_bytes_sent range uri"
    (what the mirror sent: its egress)."""
    w = pathlib.Path(workdir)
    for d in ("tmp", "logs"):
        (w / d).mkdir(parents=True, exist_ok=True)
    conf = w / "nginx.conf"
    log = ("  access_log off;\n" if not access_log else
           "  log_format egress '$status $body_bytes_sent \"$http_range\" $uri';\n"
           f"  access_log {access_log} egress;\n")
    conf.write_text(
        f"daemon {'on' if daemon else 'off'};\nuser root;\n"
        f"worker_processes {workers};\n"
        f"pid {w}/nginx.pid;\nerror_log {w}/logs/error.log warn;\n"
        "events { worker_connections 256; }\n"
        "http {\n" + log +
        f"  client_body_temp_path {w}/tmp/body;\n"
        f"  include {conf_dir}/*.conf;\n}}\n")
    subprocess.run(["nginx", "-t", "-q", "-p", str(w), "-c", str(conf)], check=True,
                   capture_output=True)
    return conf


def wait_http(url, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            requests.get(url, timeout=1)
            return
        except requests.ConnectionError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing answered on {url} within {timeout} s")


class Nginx:
    """`with Nginx(workdir, conf_dir) as n:` runs nginx in the foreground (a child)."""

    def __init__(self, workdir, conf_dir, workers=2, access_log=None):
        self.workdir = pathlib.Path(workdir)
        self.conf_dir = pathlib.Path(conf_dir)
        self.workers = workers
        self.access_log = access_log
        self.proc = None

    def __enter__(self):
        conf = write_main_conf(self.workdir, self.conf_dir, self.workers,
                               access_log=self.access_log)
        self.proc = subprocess.Popen(["nginx", "-p", str(self.workdir), "-c", str(conf)],
                                     stderr=subprocess.PIPE)
        return self

    def wait(self, url, timeout=20):
        wait_http(url, timeout)

    def egress(self):
        """Body bytes nginx sent, from the access log (None without one)."""
        if not self.access_log:
            return None
        try:
            lines = pathlib.Path(self.access_log).read_text().splitlines()
        except FileNotFoundError:
            return 0
        return sum(int(line.split()[1]) for line in lines if line.strip())

    def stop(self):
        self.__exit__(None, None, None)

    def __exit__(self, *exc):
        if self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


__all__ = ["Nginx", "free_port", "render_site_conf", "wait_http", "write_main_conf"]
