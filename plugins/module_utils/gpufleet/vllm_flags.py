"""The vLLM flags and defaults that depend on its version, and how versions compare.

Plain data in, plain data out; no Ansible imports.  FLAG_CHANGES lists each renamed flag
or changed default with the first release that has it and its source; gpufleet.tune
writes the flags of the version it plans for, and gpufleet.serve_dtype reads
V1_DEFAULT_SINCE against it.
"""
from __future__ import annotations

import re

from .tune_errors import TuneError


# Flag renames and defaults that depend on the vLLM version. `since` is the first
# release with the new behaviour.
FLAG_CHANGES = [
    {"name": "runner_convert", "since": "0.10.1",
     "new": ["--runner", "pooling", "--convert", "embed"], "old": ["--task", "embed"],
     "source": "vllm-project/vllm PR #21470 (merged 2025-07-24) replaced --task with "
               "--runner/--convert; --task was then removed"},
    {"name": "no_enable_log_requests", "since": "0.10.2",
     "new": ["--no-enable-log-requests"], "old": ["--disable-log-requests"],
     "source": "vllm/engine/arg_utils.py (enable_log_requests); version from "
               "shared/notes/vllm-hf-facts.md, not checked against a release tag"},
    {"name": "kv_cache_memory_bytes", "since": "0.11.0",
     "new": ["--kv-cache-memory-bytes"], "old": None,
     "source": "vllm/config/cache.py CacheConfig.kv_cache_memory_bytes; first release "
               "not checked against a tag"},
    {"name": "gpu_memory_utilization_default", "since": "0.21.0", "new": 0.92, "old": 0.9,
     "source": "vllm/config/cache.py: gpu_memory_utilization Field(default=0.92) at "
               "commit 002f10e0; 0.9 in earlier releases (version from the notes)"},
]


def parse_version(text):
    parts = re.findall(r"\d+", str(text))[:3]
    if not parts:
        raise TuneError(f"vllm_version {text!r} is not a version like 0.32.0")
    return tuple(int(p) for p in parts + ["0"] * (3 - len(parts)))


def version_at_least(version, since):
    return parse_version(version) >= parse_version(since)


def flag_change(name):
    return next(c for c in FLAG_CHANGES if c["name"] == name)


def default_gpu_memory_utilization(version):
    change = flag_change("gpu_memory_utilization_default")
    return change["new"] if version_at_least(version, change["since"]) else change["old"]
