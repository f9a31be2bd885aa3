"""olah (PyPI, a real self-hosted HF mirror) on loopback, offline, over local git repos.

An independent implementation of the HF API to test hf_model against; a STAND-IN for a
company mirror. Layout it serves (olah 0.5.4, olah/mirror/repos.py): a non-bare git
checkout with git-lfs objects at <mirrors-path>/models/<org>/<repo>.
"""
from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import time

import requests

from .venvs import tool_venv

def git_lfs_repo(path, files, lfs_patterns=("*.safetensors", "*.bin")):
    """A git repo at path holding files ({relpath: bytes}); lfs_patterns go through git-lfs.
    Returns the commit sha."""
    path = pathlib.Path(path)
    path.mkdir(parents=True)
    env = dict(os.environ, GIT_AUTHOR_NAME="lab", GIT_AUTHOR_EMAIL="lab@localhost",
               GIT_COMMITTER_NAME="lab", GIT_COMMITTER_EMAIL="lab@localhost")

    def git(*args):
        return subprocess.run(["git", *args], cwd=path, env=env, check=True,
                              capture_output=True, text=True).stdout.strip()

    git("init", "-q", "-b", "main")
    git("lfs", "install", "--local")
    for pattern in lfs_patterns:
        git("lfs", "track", pattern)
    for rel, data in files.items():
        p = path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    git("add", "-A")
    git("commit", "-q", "-m", "model")
    return git("rev-parse", "HEAD")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def olah_config(workdir, port):
    """olah.toml for offline serving of workdir/mirrors/models/<org>/<repo> on 127.0.0.1."""
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    conf = workdir / "olah.toml"
    conf.write_text(
        "[basic]\n"
        f'host = "127.0.0.1"\nport = {port}\n'
        f'repos-path = "{workdir / "repos"}"\n'
        f'mirror-netloc = "127.0.0.1:{port}"\n'
        f'mirror-lfs-netloc = "127.0.0.1:{port}"\n'
        f'mirrors-path = ["{workdir / "mirrors"}"]\n'
        "[accessibility]\noffline = true\n")
    return conf


class Olah:
    """`with Olah(workdir) as url:` serves workdir/mirrors/models/<org>/<repo> offline."""

    def __init__(self, workdir):
        self.workdir = pathlib.Path(workdir)
        self.mirrors = self.workdir / "mirrors"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def __enter__(self):
        cli = str(tool_venv("olah") / "olah-cli")
        conf = olah_config(self.workdir, self.port)
        self.log = open(self.workdir / "olah.log", "wb")
        self.proc = subprocess.Popen([cli, "--config", str(conf)], cwd=self.workdir,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"olah exited: {(self.workdir / 'olah.log').read_text()[-2000:]}")
            try:
                requests.get(self.url + "/", timeout=1)
                return self.url
            except requests.ConnectionError:
                time.sleep(0.2)
        raise RuntimeError("olah did not start within 60 s")

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
