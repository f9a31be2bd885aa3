#!/usr/bin/env python3
"""The lab's two Hugging Face mirrors on loopback, serving the lab's models.

    env PYTHONPATH=plugins/module_utils:tests .venv/bin/python tests/hfstub/lab_mirrors.py up [--olah-port 8091] [--site-port 8090]
    env PYTHONPATH=plugins/module_utils:tests .venv/bin/python tests/hfstub/lab_mirrors.py status
    env PYTHONPATH=plugins/module_utils:tests .venv/bin/python tests/hfstub/lab_mirrors.py down

`up` takes every model built by lab/models/build.sh (.cache/lab/models/<org>/<name>) and:
1. puts it in a git repository with git-lfs (*.safetensors, *.bin, *.gguf) under
   .cache/lab/hf/olah/mirrors/models/<org>/<name> (rebuilt when the model changed), and
   serves those with olah (PyPI, a real HF mirror; STAND-IN for a company mirror) in
   offline mode: HF_ENDPOINT=http://127.0.0.1:<olah-port>;
2. fetches each model from olah with hf_model's logic (every byte verified) into
   .cache/lab/hf/models/<org>/<name>, publishes those folders as the site mirror
   (hf_mirror_index logic + the hf_site_mirror role's nginx template) and serves it with
   nginx: HF_ENDPOINT=http://127.0.0.1:<site-port>.
Both run in the background (pid files in .cache/lab/hf/); `down` stops them.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import shutil
import signal
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]

from gpufleet import hub, hub_client, hub_mirror  # noqa: E402
from hfstub.nginxlab import render_site_conf, wait_http, write_main_conf  # noqa: E402
from hfstub.olahlab import git_lfs_repo, olah_config  # noqa: E402
from hfstub.venvs import tool_venv  # noqa: E402

MODELS = ROOT / ".cache/lab/models"
STATE = ROOT / ".cache/lab/hf"


def lab_models():
    return sorted(p.parent for p in MODELS.glob("*/*/config.json"))


def content_stamp(folder):
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            st = p.stat()
            h.update(f"{p.relative_to(folder)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def git_repos(models):
    """One git-lfs repo per model, rebuilt only when the model folder changed."""
    for folder in models:
        repo_id = "/".join(folder.parts[-2:])
        repo = STATE / "olah/mirrors/models" / repo_id
        stamp = repo.parent / f".{repo.name}.stamp"
        want = content_stamp(folder)
        if repo.exists() and stamp.exists() and stamp.read_text() == want:
            continue
        shutil.rmtree(repo, ignore_errors=True)
        files = {str(p.relative_to(folder)): p.read_bytes()
                 for p in folder.rglob("*") if p.is_file()}
        git_lfs_repo(repo, files, lfs_patterns=("*.safetensors", "*.bin", "*.gguf"))
        stamp.write_text(want)
        print(f"  git-lfs repo  {repo_id}")


def running(name):
    try:
        pid = int((STATE / f"{name}.pid").read_text())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def start_olah(port):
    if running("olah"):
        return
    conf = olah_config(STATE / "olah", port)
    log = open(STATE / "olah/olah.log", "ab")
    proc = subprocess.Popen([str(tool_venv("olah") / "olah-cli"), "--config", str(conf)],
                            cwd=STATE / "olah", stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    (STATE / "olah.pid").write_text(str(proc.pid))
    wait_http(f"http://127.0.0.1:{port}/", timeout=60)


def start_site(models, olah_url, port):
    folders = []
    for folder in models:
        repo_id = "/".join(folder.parts[-2:])
        dest = STATE / "models" / repo_id
        res = hub.sync_repo(hub_client.HubClient(olah_url), repo_id, "main", str(dest))
        print(f"  fetched       {repo_id}@{res['commit'][:12]} from olah "
              f"({res['bytes_downloaded']} bytes downloaded, "
              f"{'changed' if res['changed'] else 'unchanged'})")
        folders.append({"path": str(dest)})
    hub_mirror.build_site(str(STATE / "site"), folders)
    conf_dir = render_site_conf(STATE / "site", f"127.0.0.1:{port}", STATE / "nginx/conf.d")
    if running("nginx"):
        subprocess.run(["nginx", "-p", str(STATE / "nginx"), "-c",
                        str(STATE / "nginx/nginx.conf"), "-s", "reload"], check=True)
    else:
        conf = write_main_conf(STATE / "nginx", conf_dir, daemon=True)
        subprocess.run(["nginx", "-p", str(STATE / "nginx"), "-c", str(conf)], check=True)
        (STATE / "nginx.pid").write_text((STATE / "nginx/nginx.pid").read_text().strip())
    wait_http(f"http://127.0.0.1:{port}/")


def stop(name):
    pid = running(name)
    if pid:
        os.kill(pid, signal.SIGTERM)
        print(f"  stopped {name} (pid {pid})")
    (STATE / f"{name}.pid").unlink(missing_ok=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["up", "down", "status"])
    ap.add_argument("--olah-port", type=int, default=8091)
    ap.add_argument("--site-port", type=int, default=8090)
    args = ap.parse_args()
    STATE.mkdir(parents=True, exist_ok=True)
    if args.action == "down":
        stop("nginx")
        stop("olah")
        return 0
    if args.action == "status":
        for name in ("olah", "nginx"):
            print(f"{name}: {'running, pid %d' % running(name) if running(name) else 'stopped'}")
        return 0
    models = lab_models()
    if not models:
        print(f"no models in {MODELS}: run lab/models/build.sh first", file=sys.stderr)
        return 1
    git_repos(models)
    olah_url = f"http://127.0.0.1:{args.olah_port}"
    start_olah(args.olah_port)
    start_site(models, olah_url, args.site_port)
    print(f"olah (offline, git-lfs repos): HF_ENDPOINT={olah_url}")
    print(f"site mirror (nginx):           HF_ENDPOINT=http://127.0.0.1:{args.site_port}")
    print("models: " + ", ".join("/".join(m.parts[-2:]) for m in models))
    return 0


if __name__ == "__main__":
    sys.exit(main())
