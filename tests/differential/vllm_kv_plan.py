"""What the tests/differential/ scripts share: a VllmConfig for one case and vLLM's own
KV cache planning of a model's per-layer specs.

Runs INSIDE the lab image (vllm 0.32.0), imported by deepseek_v4_vllm.py,
gemma4_vllm.py, families_vllm.py and the others (Python puts the script's folder on
sys.path). Each script builds its
model's per-layer KV cache specs its own way; from there the arithmetic is vLLM's:
resolve_kv_cache_layout from the layers' backends (as the engine core does),
get_kv_cache_groups, get_kv_cache_configs, generate_scheduler_kv_cache_config,
update_kv_cache_capacity and _estimate_max_model_len_from_groups
(vllm/v1/core/kv_cache_utils.py).
"""
from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import sys
import time

GIB = 1024 ** 3
# Available KV memory per GPU for each TP size (an input, like vLLM's profiled
# "Available KV cache memory"); the odd bytes exercise the floor divisions.
AVAILABLE = {1: 3 * GIB + 12345, 2: 17 * GIB + 777, 4: 41 * GIB + 99, 8: 63 * GIB + 5}

_MODEL_CONFIGS = {}


def quiet():
    logging.disable(logging.WARNING)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def make_config(model_dir, tp, block_size, kv_dtype, max_model_len, *, async_sched=True,
                max_num_batched_tokens=8192, max_num_seqs=1024, device_type="cuda"):
    """A VllmConfig for one case. The settings a platform decides (the hybrid KV cache
    manager, async scheduling, chunked prefill and its batched tokens, the block size,
    the device type, which only names the pool in the log line) are set to the
    target's values after construction, since the image's CPU platform would decide
    them otherwise; each script's docstring says which values and why."""
    from vllm.config import (CacheConfig, ModelConfig, ParallelConfig, SchedulerConfig,
                             VllmConfig)
    if model_dir not in _MODEL_CONFIGS:  # about 10 s each: build it once per model
        _MODEL_CONFIGS[model_dir] = ModelConfig(model=model_dir, skip_tokenizer_init=True)
    mc = copy.deepcopy(_MODEL_CONFIGS[model_dir])
    if max_model_len is not None:
        # --max-model-len below the derived limit: ModelConfig keeps it as given.
        assert max_model_len <= mc.max_model_len
        mc.max_model_len = max_model_len
    vc = VllmConfig(
        model_config=mc,
        cache_config=CacheConfig(block_size=block_size, cache_dtype=kv_dtype),
        scheduler_config=SchedulerConfig(
            max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
            max_model_len=mc.max_model_len, is_encoder_decoder=False,
            enable_chunked_prefill=True),
        parallel_config=ParallelConfig(tensor_parallel_size=tp))
    vc.cache_config.block_size = block_size
    # EngineArgs.create_engine_config (engine/arg_utils.py:2248-2254) gives CacheConfig
    # the model's sliding_window when layer_types is absent or all sliding; Attention
    # takes it for a layer its model file builds without a per-layer window
    # (attention.py:265-273: Mistral, Phi-3, the Transformers backend...).
    layer_types = getattr(mc.hf_text_config, "layer_types", None)
    if layer_types is None or all(t == "sliding_attention" for t in layer_types):
        vc.cache_config.sliding_window = mc.get_sliding_window()
    vc.scheduler_config.disable_hybrid_kv_cache_manager = False
    vc.scheduler_config.async_scheduling = async_sched
    vc.scheduler_config.max_num_batched_tokens = max_num_batched_tokens
    vc.scheduler_config.enable_chunked_prefill = True
    vc.device_config.device_type = device_type
    return vc


def summarise_groups(groups):
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs
    out = []
    for group in groups:
        spec = group.kv_cache_spec
        layers = (list(spec.kv_cache_specs.values())
                  if isinstance(spec, UniformTypeKVCacheSpecs) else
                  [spec] * len(group.layer_names))
        pages = {}
        for layer in layers:
            pages[str(layer.page_size_bytes)] = pages.get(str(layer.page_size_bytes), 0) + 1
        out.append({"type": type(layers[0]).__name__, "layers": len(group.layer_names),
                    "block_size": spec.block_size, "layers_per_page_bytes": pages,
                    "page_bytes": sum(s.page_size_bytes for s in layers)})
    return out


def plan(vc, specs, backends, avail, derived_max_len, case):
    """vLLM's plan of `specs` (layer name -> spec) on `avail` bytes per GPU, into
    `case`: the layout resolved from `backends` (the layers' backend classes), the
    groups, bytes per block, the estimated maximum model length (the model's own
    limit `derived_max_len`, the memory left after the null block), and, when one
    request fits, num_blocks, blocks per request, maximum concurrency and "KV cache
    size" tokens; else vLLM's error. Returns `case`."""
    from vllm.v1.attention.backends.utils import (get_supported_kv_cache_layouts,
                                                  resolve_kv_cache_layout)
    from vllm.v1.core import kv_cache_utils as kcu

    tp = vc.parallel_config.tensor_parallel_size
    layout = resolve_kv_cache_layout(
        vc, [[x.name for x in get_supported_kv_cache_layouts(set(backends))]],
        list(specs.values()))
    case["kv_cache_layout"] = layout.name
    # The groups get_kv_cache_configs builds (it calls get_kv_cache_groups on the
    # merged specs), for the estimate and the summary.
    groups = kcu.get_kv_cache_groups(vc, dict(specs))
    bytes_per_block = kcu._pool_bytes_per_block(vc, groups)
    # The estimate vLLM's auto-fit (--max-model-len auto) and its "not enough memory"
    # error use: the longest length up to the model's own limit whose one request
    # fits in the memory left after the null block (get_kv_cache_configs).
    saved = vc.model_config.max_model_len
    vc.model_config.max_model_len = derived_max_len
    try:
        case["estimated_max_model_len"] = kcu._estimate_max_model_len_from_groups(
            vc, groups, avail - bytes_per_block)
    finally:
        vc.model_config.max_model_len = saved
    case["bytes_per_block"] = bytes_per_block
    case["groups"] = summarise_groups(groups)
    try:
        configs = kcu.get_kv_cache_configs(vc, [dict(specs) for _ in range(tp)],
                                           [avail] * tp)
    except ValueError as exc:
        case["error"] = f"ValueError: {exc}"
        return case
    sched = kcu.generate_scheduler_kv_cache_config(configs)
    kcu.update_kv_cache_capacity(vc, sched)
    assert kcu._pool_bytes_per_block(vc, configs[0].kv_cache_groups) == bytes_per_block
    per_request = sum(
        kcu.cdiv(g.kv_cache_spec.max_memory_usage_bytes(vc), g.kv_cache_spec.page_size_bytes)
        for g in sched.kv_cache_groups)
    case.update({
        "num_blocks": sched.num_blocks,
        "blocks_per_request": per_request,
        "max_concurrency": vc.cache_config.kv_cache_max_concurrency,
        "kv_cache_size_tokens": vc.cache_config.kv_cache_size_tokens,
    })
    return case


def main(doc, models, derived_max_len, cases, header=None):
    """A script's command line (--models-dir, --models: keys of `models`, folder names
    under tests/fixtures/models): for each model, `derived_max_len(model_dir)` (the
    length vLLM derives from its config) and `cases(model_dir, derived)` (the list of
    case dicts); prints one JSON document with `header` added."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--models-dir", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "models"))
    parser.add_argument("--models", default=",".join(models))
    args = parser.parse_args()
    quiet()
    import vllm
    started = time.time()
    out = dict(header or {}, vllm_version=vllm.__version__, models={})
    for key in args.models.split(","):
        model_dir = os.path.abspath(os.path.join(args.models_dir, models[key]))
        derived = derived_max_len(model_dir)
        out["models"][key] = {"config": f"tests/fixtures/models/{models[key]}/config.json",
                              "derived_max_model_len": derived,
                              "cases": cases(model_dir, derived)}
    out["seconds"] = round(time.time() - started, 1)
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
