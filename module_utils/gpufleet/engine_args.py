"""Every `vllm serve` argument of vLLM 0.32.0, classified (issue #34 item 1): what a model
entry's `extra_args` may hold, and what happens to it.

The arguments are vLLM's own: tests/fixtures/vllm-args/serve-0.32.0.json lists every
option string of `vllm serve`'s parser in the lab image (tests/differential/serve_args.py,
run in gpufleet/vllm-cpu:lab; tests/slow/test_vllm_image.py regenerates it and fails on an
argument this table does not know). Each falls in one class:

- TUNED: the tuner decides it from the model, the GPUs and its options, and writes it on
  the command line; in extra_args vLLM would take the last one and run with other
  settings than the plan predicts. Refused, with the option that sets it.
- SERVER: vllm_server writes it (address, port, served name, key, shutdown); refused with
  the variable that sets it.
- NOT_MODELLED: it changes the memory arithmetic (the KV pool, the weights per GPU, the
  blocks) in a way the tuner does not compute, so its prediction would be wrong. Refused
  by name, with why.
- READ: the tuner reads it from extra_args (and the prediction follows it).
- everything else: passed through as given; not read by the tuner. They configure the
  API server, parsers, logging, loading, scheduling policy, observability, or features
  that do not size the KV pool or the weights.

Plain Python, no Ansible imports.
"""
from __future__ import annotations

import json

__all__ = ["TUNED", "SERVER", "NOT_MODELLED", "READ", "CLASSES", "HF_OVERRIDES_ALLOWED",
           "classify", "refusal", "flag_of", "hf_overrides_refusal", "first_refusal"]

# flag -> the vllm_tune option (or what) sets it
TUNED = {
    "--tensor-parallel-size": "the option tensor_parallel_size", "-tp": "the option tensor_parallel_size",
    "--max-model-len": "the option max_model_len",
    "--max-num-seqs": "the option target_concurrency",
    "--max-num-batched-tokens": "the tuner (settings.max_num_batched_tokens, from max_model_len)",
    "--dtype": "the option dtype",
    "--gpu-memory-utilization": "the option gpu_memory_utilization",
    "--device-memory-utilization": "the option gpu_memory_utilization",
    "--kv-cache-memory-bytes": "the option kv_cache_memory_bytes",
    "--kv-cache-dtype": "the option kv_cache_dtype (with allow_fp8)",
    "--block-size": "the tuner (settings.block_size: the attention backend's)",
    "--enable-expert-parallel": "the tuner (settings.enable_expert_parallel)",
    "--no-enable-expert-parallel": "the tuner (settings.enable_expert_parallel)",
    "-ep": "the tuner (settings.enable_expert_parallel)",
    "--runner": "the tuner (the model's kind: generate or pooling)",
    "--convert": "the tuner (the model's kind: generate or pooling)",
}

# flag -> the vllm_server variable that sets it
SERVER = {
    "--model": "the model entry's path (vllm_server mounts it and names it first)",
    "--served-model-name": "the model entry's served_model_name",
    "--host": "vllm_server_bind_address",
    "--port": "the model entry's port (vllm_server_port for the first)",
    "--api-key": "vllm_server_api_key and vllm_server_api_keys_retiring (from a vault; given to vLLM in a root-only --config file)",
    "--shutdown-timeout": "vllm_server_shutdown_timeout",
    "--hf-token": ("nothing: vllm_server serves the folder model_fetch wrote, and a token on "
                   "the command line is in `docker inspect` and every process list"),
    "--config": ("the model entry's options: a config file would set arguments the plan cannot "
                 "see (vllm_server names its own, holding the API keys; vLLM takes one)"),
    "--uds": "vllm_server_bind_address and the port (the gateway and Prometheus reach TCP)",
    "--headless": "nothing: gpufleet runs one API server per instance",
    "--api-server-count": "nothing: gpufleet runs one API server per instance",
    "-asc": "nothing: gpufleet runs one API server per instance",
}

_PP = "pipeline parallelism is not modelled (issue #34 item 3)"
_SPEC = "speculative decoding is not modelled (issue #34 item 2)"
_DP = ("data parallelism in one container is not modelled: gpufleet runs one instance per "
       "GPU group (the model entry's replicas)")
_CP = "context parallelism is not modelled (the KV cache per GPU would differ)"
_OFFLOAD = "offloading changes the weights or the KV cache per GPU, which the plan does not compute"
_LORA = "LoRA adapters take GPU memory the plan does not reserve"
_MAMBA = "the tuner sizes mamba and linear-attention state with vLLM's own defaults only"
_QUANT = ("on-the-fly quantization changes the weights per GPU; serve a checkpoint quantized "
          "ahead (its config.json names the method, which the tuner reads)")
_GRAPH = ("CUDA graph capture sizes change the memory vLLM reserves; the option enforce_eager "
          "is what the plan models")

# flag -> why it is refused
NOT_MODELLED = {
    "--pipeline-parallel-size": _PP, "-pp": _PP,
    "--speculative-config": _SPEC, "-sc": _SPEC, "--spec-method": _SPEC,
    "--spec-model": _SPEC, "--spec-tokens": _SPEC,
    "--data-parallel-size": _DP, "-dp": _DP, "--data-parallel-size-local": _DP, "-dpl": _DP,
    "--decode-context-parallel-size": _CP, "-dcp": _CP,
    "--prefill-context-parallel-size": _CP, "-pcp": _CP,
    "--dcp-kv-cache-interleave-size": _CP, "--cp-kv-cache-interleave-size": _CP,
    "--num-gpu-blocks-override": "it overrides the KV blocks the plan computes",
    "--cpu-offload-gb": _OFFLOAD, "--cpu-offload-params": _OFFLOAD,
    "--offload-backend": _OFFLOAD, "--offload-group-size": _OFFLOAD,
    "--offload-num-in-group": _OFFLOAD, "--offload-prefetch-step": _OFFLOAD,
    "--offload-params": _OFFLOAD, "--kv-offloading-size": _OFFLOAD,
    "--kv-offloading-backend": _OFFLOAD,
    "--quantization": _QUANT, "-q": _QUANT, "--quantization-config": _QUANT,
    "--enable-lora": _LORA, "--max-loras": _LORA, "--max-lora-rank": _LORA,
    "--lora-modules": _LORA, "--fully-sharded-loras": _LORA, "--max-cpu-loras": _LORA,
    "--lora-dtype": _LORA, "--lora-target-modules": _LORA, "--default-mm-loras": _LORA,
    "--enable-tower-connector-lora": _LORA,
    "--mamba-cache-dtype": _MAMBA, "--mamba-ssm-cache-dtype": _MAMBA,
    "--mamba-block-size": _MAMBA, "--mamba-cache-mode": _MAMBA,
    "--kv-cache-dtype-skip-layers": "per-layer KV dtypes are not modelled (the option kv_cache_dtype sets all)",
    "--disable-hybrid-kv-cache-manager": ("the tuner computes the hybrid KV cache manager's "
                                          "pools (vLLM's default), not one pool per layer"),
    "--disable-sliding-window": ("the tuner sizes sliding-window layers as vLLM does by "
                                 "default; disabling it makes them full attention"),
    "--kv-sharing-fast-prefill": "KV sharing across layers is not modelled",
    "--hf-config-path": "the plan reads the model folder's own config.json",
    "--cudagraph-capture-sizes": _GRAPH, "--max-cudagraph-capture-size": _GRAPH,
    "--compilation-config": _GRAPH, "-cc": _GRAPH, "--optimization-level": _GRAPH,
    "--kv-transfer-config": "a KV transfer connector (disaggregated prefill) is not modelled",
    "--enable-sleep-mode": "sleep mode changes how vLLM allocates memory; not modelled",
    "--limit-mm-per-prompt": ("the multimodal encoder's cache is sized from it; the plan "
                              "counts vLLM's defaults only"),
    "--mm-processor-cache-gb": "the multimodal processor cache is not modelled",
    "--language-model-only": "the plan counts the whole checkpoint's weights",
    "--max-num-scheduled-tokens": "the tuner sizes the batch from max_num_batched_tokens",
    "--attention-backend": ("the attention backend decides the KV block size and layout; the "
                            "tuner follows the backend vLLM picks by default"),
    "--skip-mm-profiling": ("vLLM would not profile the multimodal encoder, and size the KV "
                            "pool from a profile the plan does not make"),
    "--mm-ipc-gpu-memory-gb": "GPU memory for multimodal IPC is not modelled",
    "--mm-processor-device": "a multimodal processor on the GPU takes memory the plan does not count",
    "--ec-manager-config": "an encoder cache manager is not modelled",
    "--ec-transfer-config": "an encoder cache transfer connector is not modelled",
    "--enable-elastic-ep": _DP, "--elastic-ep-max-dp-size": _DP,
    "--enable-eplb": "expert load balancing adds redundant experts the plan does not count",
    "--eplb-config": "expert load balancing adds redundant experts the plan does not count",
}

# flags the tuner reads from extra_args (its prediction follows them)
READ = {
    "--hf-overrides": ("only an architecture rename (the fields the plan reads come from "
                       "config.json; see hf_overrides_refusal)"),
    "--enforce-eager": "no CUDA graphs (as the option enforce_eager)",
    "--no-enforce-eager": "CUDA graphs (the default)",
    "--trust-remote-code": "a config class only the repository defines",
    "--no-trust-remote-code": "no repository code (the default)",
    "--async-scheduling": "async scheduling", "--no-async-scheduling": "no async scheduling",
    "--enable-prefix-caching": "prefix caching (the tuner's default: on)",
    "--no-enable-prefix-caching": "no prefix caching",
    "--enable-chunked-prefill": "chunked prefill (the tuner's default: on)",
    "--no-enable-chunked-prefill": "no chunked prefill",
}

CLASSES = ("tuned", "server", "not modelled", "read", "passed through")

# --hf-overrides keys that change no field the tuner reads: a model whose config names a
# class vLLM knows under another name (gte-multilingual-base: NewModel -> GteNewModel)
HF_OVERRIDES_ALLOWED = ("architectures",)


def hf_overrides_refusal(value):
    """Why `--hf-overrides VALUE` may not be used, or None: a JSON object whose keys are
    all in HF_OVERRIDES_ALLOWED passes; any other key changes a config.json field that the
    plan reads from the file (a context length, a layer count), so vLLM would run with
    another model than the one planned."""
    try:
        data = json.loads(value)
    except (TypeError, ValueError):
        data = None
    if not isinstance(data, dict):
        return ("extra_args holds --hf-overrides without a JSON object after it: give it as "
                "--hf-overrides '{\"architectures\": [\"...\"]}'.")
    other = sorted(str(k)[:64] for k in data if k not in HF_OVERRIDES_ALLOWED)[:8]
    if other:
        return (f"extra_args holds --hf-overrides of {', '.join(other)}: config.json fields "
                "the plan reads from the file, so vLLM would run another model than the one "
                "planned. Edit config.json in the model folder (model_fetch pins it) or "
                f"override only {', '.join(HF_OVERRIDES_ALLOWED)}.")
    return None


def flag_of(arg):
    """The flag an extra_args item names ("--max-model-len=8192" -> "--max-model-len"),
    or None for a value ("8192", "hermes")."""
    text = str(arg)
    if not text.startswith("-") or text in ("-", "--") or _is_number(text):
        return None
    if text == "-O" or (text[:2] == "-O" and text[2:].isdigit()):
        return "--optimization-level"  # -O3: vLLM's parser reads it as the level
    return text.split("=", 1)[0]


def _is_number(text):
    try:
        float(text)
    except ValueError:
        return False
    return True


def classify(flag):
    """The class of a `vllm serve` flag (CLASSES)."""
    if flag in TUNED:
        return "tuned"
    if flag in SERVER:
        return "server"
    if flag in NOT_MODELLED:
        return "not modelled"
    if str(flag).startswith("--no-") and "--" + str(flag)[5:] in NOT_MODELLED:
        return "passed through"  # the off form asks for vLLM's default, which is modelled
    if flag in READ:
        return "read"
    return "passed through"


def refusal(flag):
    """Why extra_args may not hold `flag`, and what to do; None when it may."""
    kind = classify(flag)
    if kind == "tuned":
        return (f"extra_args holds {flag}, which gpufleet's tuner sets ({TUNED[flag]}): "
                "vLLM would run with the last one given, not the one the plan predicts. "
                "Remove it from extra_args and set it through that option.")
    if kind == "server":
        return (f"extra_args holds {flag}, which vllm_server sets ({SERVER[flag]}). "
                "Remove it from extra_args.")
    if kind == "not modelled":
        return (f"extra_args holds {flag}: {NOT_MODELLED[flag]}, so the plan's memory "
                "prediction would not be what vLLM runs with. Remove it.")
    return None


def first_refusal(args):
    """Why a model's extra_args (a list of strings) may not be used, for the first
    argument refused (refusal; --hf-overrides by its value), or None."""
    for i, arg in enumerate(args):
        flag = flag_of(arg)
        if flag == "--hf-overrides":
            value = arg.split("=", 1)[1] if "=" in arg else (args[i + 1] if i + 1 < len(args) else None)
            why = hf_overrides_refusal(value)
        else:
            why = refusal(flag)
        if why:
            return why
    return None

