#!/usr/bin/env python3
"""Benchmark (not part of the test run): fetch one multi-GB repo from the
site mirror (the hf_site_mirror role's nginx config, sendfile) three ways, with the same
parallelism, into fresh folders on the same disk:

  hf_model   (gpufleet.hub: streams, hashes every byte, verifies, renames)
  hf download (huggingface_hub, pinned in .cache/hfhub-venv; checks sizes only)
  curl       (plain parallel curl of the same URLs: the limit, no hashing)

each timed until its bytes are on disk (`sync`), then times a re-run with verify=manifest on the fetched folder against verify=full.

    env PYTHONPATH=plugins/module_utils:tests .venv/bin/python tests/bench/bench_fetch.py [--gib 3] [--files 6] [--workers 8]

Prints the throughputs, the ratios and whether the targets hold (ours >= hf download,
>= 0.8 x curl; manifest re-verify under 1 s). Exit status 1 when a target is missed.
Everything listens on 127.0.0.1 and lives in a temporary folder (--keep keeps it).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]

from gpufleet import hub, hub_client, hub_listing, hub_manifest, hub_mirror  # noqa: E402
from hfstub.nginxlab import Nginx, free_port, render_site_conf  # noqa: E402
from hfstub.venvs import tool_venv  # noqa: E402

REPO = "bench/multi-gb"
COMMIT = "b" * 40


def make_model(folder, gib, n_files):
    """n_files safetensors of random bytes (gib GiB in all) + small json files, with the
    manifest hf_model would write after verifying them (hashes computed here)."""
    folder.mkdir(parents=True)
    size = int(gib * (1 << 30)) // n_files
    block = os.urandom(16 << 20)
    files = []
    for i in range(n_files):
        path = f"model-{i + 1:05d}-of-{n_files:05d}.safetensors"
        f_hash = hub_listing.RepoFile(path, size, "sha256", "").hasher()
        with open(folder / path, "wb") as out:
            left = size
            while left:
                chunk = os.urandom(64) + block[: min(left, len(block)) - 64] \
                    if left >= 64 else os.urandom(left)
                out.write(chunk)
                f_hash.update(chunk)
                left -= len(chunk)
        files.append(hub_listing.RepoFile(path, size, "sha256", f_hash.hexdigest()))
    for name, data in (("config.json", b'{"model_type": "llama"}'),
                       ("tokenizer.json", b'{"version": "1.0"}' * 1000)):
        (folder / name).write_bytes(data)
        h = hub_listing.RepoFile(name, len(data), "sha1", "").hasher()
        h.update(data)
        files.append(hub_listing.RepoFile(name, len(data), "sha1", h.hexdigest()))
    hub_manifest.write_manifest(str(folder), REPO, "main", COMMIT, "http://bench.invalid",
                                hub_manifest.manifest_entries(str(folder), files))
    return files


def publish(work, folder, port):
    """Static site + the role's nginx server config, rendered from its template."""
    site = work / "site"
    hub_mirror.build_site(str(site), [{"path": str(folder)}])
    return render_site_conf(site, f"127.0.0.1:{port}", work / "conf.d")


def timed(fn, flush=False):
    """Seconds fn takes; with flush, until its bytes are on disk (`sync`): hf_model fsyncs
    each file before giving it its final name, curl and hf download leave that to later."""
    t0 = time.perf_counter()
    fn()
    if flush:
        subprocess.run(["sync"], check=True)
    return time.perf_counter() - t0


def run(cmd, env=None):
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{cmd[0]} failed: {out.stdout[-1500:]} {out.stderr[-1500:]}")
    return out.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=3.0, help="repo size in GiB")
    ap.add_argument("--files", type=int, default=6, help="number of large files")
    ap.add_argument("--workers", type=int, default=8, help="parallel files, all clients")
    ap.add_argument("--rounds", type=int, default=2, help="runs per client (best counts)")
    ap.add_argument("--dir", default=None, help="work folder (default: a temporary one)")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()

    work = pathlib.Path(args.dir or tempfile.mkdtemp(prefix="gpufleet-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    hf_bin = tool_venv("hfhub")
    try:
        print(f"building a {args.gib} GiB repo of {args.files} files in {work} ...", flush=True)
        files = make_model(work / "source", args.gib, args.files)
        total = sum(f.size for f in files)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        conf_dir = publish(work, work / "source", port)
        with Nginx(work / "nginx", conf_dir, workers=2) as n:
            n.wait(url)
            dest = work / "dest"

            def fresh():
                shutil.rmtree(dest, ignore_errors=True)
                subprocess.run(["sync"], check=True)

            def ours():
                code = ("from gpufleet import hub, hub_client; "
                        "hub.sync_repo(hub_client.HubClient(%r), %r, 'main', %r, max_workers=%d)"
                        % (url, REPO, str(dest), args.workers))
                run([sys.executable, "-c", code],
                    env=dict(os.environ, PYTHONPATH=str(ROOT / "plugins/module_utils")))

            def hf_download():
                env = dict(os.environ, HF_ENDPOINT=url, HF_HOME=str(work / "hf-home"),
                           HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_XET="1",
                           HF_HUB_DISABLE_PROGRESS_BARS="1")
                run([str(hf_bin / "hf"), "download", REPO, "--local-dir", str(dest),
                     "--max-workers", str(args.workers)], env=env)

            def curl():
                dest.mkdir(parents=True, exist_ok=True)
                urls = "\n".join(f"{url}/{REPO}/resolve/main/{f.path}" for f in files)
                subprocess.run(["xargs", "-P", str(args.workers), "-n", "1", "sh", "-c",
                                f'curl -sfS -o "{dest}/$(basename "$0")" "$0"'],
                               input=urls, text=True, check=True)

            results = {}
            for rnd in range(args.rounds):
                for name, fn in (("curl", curl), ("hf download", hf_download),
                                 ("hf_model", ours)):
                    fresh()
                    secs = timed(fn, flush=True)
                    for f in files:  # every client must have fetched every byte
                        assert (dest / f.path).stat().st_size == f.size, (name, f.path)
                    results.setdefault(name, []).append(secs)
                    print(f"  round {rnd + 1}: {name:12s} {secs:6.2f} s  "
                          f"{total / secs / 1e6:7.0f} MB/s", flush=True)

            # hf_model's last fetch is in dest: re-run it both ways
            fresh()
            ours()
            client = hub_client.HubClient(url)
            t_manifest = statistics.median(
                timed(lambda: hub.sync_repo(client, REPO, "main", str(dest), verify="manifest"))
                for _ in range(3))
            t_full = timed(lambda: hub.sync_repo(client, REPO, "main", str(dest), verify="full",
                                                 max_workers=args.workers))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    best = {k: min(v) for k, v in results.items()}
    mbps = {k: total / v / 1e6 for k, v in best.items()}
    vs_hf = best["hf download"] / best["hf_model"]
    vs_curl = best["curl"] / best["hf_model"]
    print(f"\nrepo {total / (1 << 30):.2f} GiB, {len(files)} files, {args.workers} workers, "
          f"site mirror = nginx (sendfile) on loopback; best of {args.rounds}; "
          "times include `sync` (bytes on disk)")
    for k in ("curl", "hf download", "hf_model"):
        print(f"  {k:12s} {mbps[k]:7.0f} MB/s  ({best[k]:.2f} s)")
    print(f"  hf_model / hf download = {vs_hf:.2f}x   (target >= 1.0)")
    print(f"  hf_model / curl        = {vs_curl:.2f}x   (target >= 0.8, hashing included)")
    print(f"  re-run verify=manifest: {t_manifest:.3f} s   (target < 1 s)")
    print(f"  re-run verify=full:     {t_full:.2f} s ({total / t_full / 1e6:.0f} MB/s re-hash)")
    ok = vs_hf >= 1.0 and vs_curl >= 0.8 and t_manifest < 1.0
    print("targets met" if ok else "TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
