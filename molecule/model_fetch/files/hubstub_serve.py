#!/usr/bin/env python3
"""Run the STAND-IN hub (tests/hfstub/server.py HubStub) for a Molecule scenario.

    hubstub_serve.py STATE_DIR --token TOKEN [--lifetime 900]

Serves one small repo, `molecule/tiny-lfs` (LFS *.safetensors behind a 302 to the
stub's LFS "CDN", non-LFS json files, a nested folder), on 127.0.0.1 with a port the
kernel picks (no clash with other scenarios), and requires `Authorization: Bearer
TOKEN` like a gated repo. Writes STATE_DIR/hub.url and STATE_DIR/hub.pid once it
listens; stops on SIGTERM/SIGINT or after --lifetime seconds, whichever comes first (a
scenario that dies before its cleanup leaves nothing behind for long).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import signal
import threading

ROOT = pathlib.Path(__file__).resolve().parents[3]

from hfstub.server import HubStub, Repo  # noqa: E402

REPO_ID = "molecule/tiny-lfs"


def repo_files():
    """Deterministic content: the same commit sha on every run."""
    rnd = random.Random(20261129)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 512}
    return {
        "config.json": json.dumps(config, indent=2).encode() + b"\n",
        "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "BPE"}}).encode(),
        "model-00001-of-00002.safetensors": rnd.randbytes(3 << 20),
        "model-00002-of-00002.safetensors": rnd.randbytes((1 << 20) + 12345),
        "original/params.json": b'{"dim": 64, "n_layers": 2}\n',
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("state_dir", type=pathlib.Path)
    ap.add_argument("--token", required=True)
    ap.add_argument("--lifetime", type=float, default=900)
    args = ap.parse_args()
    args.state_dir.mkdir(parents=True, exist_ok=True)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with HubStub([Repo(REPO_ID, repo_files())], token=args.token) as hub:
        (args.state_dir / "hub.pid").write_text(f"{os.getpid()}\n")
        (args.state_dir / "hub.url").write_text(hub.url + "\n")
        stop.wait(args.lifetime)
    for name in ("hub.url", "hub.pid"):
        (args.state_dir / name).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
