"""gpufleet lab image only: a KV cache default for `vllm serve` on small CPU machines.

Loaded at interpreter start by gpufleet_lab_defaults.pth in the image's venv.

vLLM's CPU backend sizes its KV cache like the GPU one: `--gpu-memory-utilization`
(default 0.92) of the NUMA node's memory, and refuses to start when that is more than
the node has free ("Available memory on node 0 ... is less than desired CPU memory
utilization", vllm/v1/worker/cpu_worker.py). On a 24 GiB lab machine it always is. The
legacy variable VLLM_CPU_KVCACHE_SPACE (GiB) avoids that, but vllm/platforms/cpu.py lets
it OVERRIDE --kv-cache-memory-bytes, so the image cannot set it in ENV without breaking
every caller that sizes the cache itself (the tuner does).

So: only for `vllm serve` started with neither --kv-cache-memory-bytes nor
--gpu-memory-utilization nor VLLM_CPU_KVCACHE_SPACE, set VLLM_CPU_KVCACHE_SPACE to
GPUFLEET_LAB_KVCACHE_SPACE (GiB, default 1) for this process and its children.
Explicit flags are never overridden. Production images do not carry this file.
"""
import os
import sys

_EXPLICIT = ("--kv-cache-memory-bytes", "--gpu-memory-utilization")


def _apply(argv, environ):
    if environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return False
    if len(argv) < 2 or os.path.basename(argv[0]) != "vllm" or argv[1] != "serve":
        return False
    if any(arg.split("=", 1)[0].replace("_", "-") in _EXPLICIT for arg in argv[2:]):
        return False
    environ["VLLM_CPU_KVCACHE_SPACE"] = environ.get("GPUFLEET_LAB_KVCACHE_SPACE", "1")
    return True


_apply(getattr(sys, "argv", []), os.environ)
