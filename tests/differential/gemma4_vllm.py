"""Gemma 4's KV cache as vLLM itself plans it, for the tuner's differential check.

Runs INSIDE the lab image (vllm 0.32.0, CPU build; no GPU, no weights):

    docker run --rm --network none -v /work/main:/src:ro --entrypoint python \
        gpufleet/vllm-cpu:lab /src/tests/differential/gemma4_vllm.py

and prints one JSON document: for the Gemma 4 config.json files in tests/fixtures/
models, each target (below), tensor-parallel size, --kv-cache-dtype, available KV
memory and max_model_len, vLLM's own num_blocks, maximum concurrency, "KV cache size: N
tokens", estimated maximum model length, bytes per block and KV cache groups.

Gemma 4's sliding layers (head_dim, num_key_value_heads) and full-attention layers
(global_head_dim, num_global_key_value_heads) have pages of two sizes. How the
per-layer specs are built (vllm 0.32.0, read in the image):

- The model is the language model vLLM builds inside Gemma4ForConditionalGeneration:
  gemma4_mm.py:1134-1141 builds Gemma4ForCausalLM on config.text_config. The image
  cannot inspect the multimodal class (transformers' Gemma4Processor imports
  torchvision, which the CPU image lacks), so the script gives ModelConfig that
  text_config as a config.json of its own, architectures ["Gemma4ForCausalLM"], in a
  temporary folder; the vision and audio towers keep no KV cache.
- Each layer's head size and KV heads per GPU are vLLM's own:
  ModelConfig.model_arch_config[i].head_size and ModelConfig.get_num_kv_heads(
  parallel_config, model_arch_config[i]) (what Gemma4Config reads in
  model_executor/models/config.py); the script also requires them to equal what
  gemma4.py:577-587 builds the layer from (hf_text_config.per_layer_config[i], the
  KV heads split as Gemma4Attention splits them, gemma4.py:388-393). A layer slides
  when layer_types[i] is sliding_attention, with config.sliding_window
  (gemma4.py:448-451).
- The spec is vllm/model_executor/layers/attention/attention.py
  Attention.get_kv_cache_spec called on a stand-in holding the attributes it reads,
  set as Attention.__init__ sets them (kv_cache_torch_dtype from
  kv_cache_dtype_str_to_dtype), then vllm/v1/worker/utils.py
  customize_attention_spec with the layer's backend, as GPUModelRunner does. Building
  the whole layer would need the backend's kernels.
- The backend is a target's: FlashAttention (FLASH_ATTN, what Gemma4Config keeps on
  compute capability 9.x with an auto KV cache, FA4 when the wheel has it), Triton
  (TRITON_ATTN, what it forces where FA4 is not available: compute capability 8.x,
  12.x and older), or CPU_ATTN (the CPU build, whatever is asked). For these inputs
  the CPU platform gives the same answers as those GPUs: FlashAttention's kernel
  block sizes depend on the platform only for an fp8 KV cache on 9.x or head size 256
  on 10.x/11.x (flash_attn.py _get_sm90_fa4_fp8_kv_block_size,
  _get_fa4_hd256_block_size), which these targets are not; Triton's never do.
- The layout is resolved from that backend's supported layouts
  (get_supported_kv_cache_layouts, resolve_kv_cache_layout), as the engine core does.
- Settings the CPU platform decides differently from CUDA are set to the CUDA values
  for the GPU targets (as tests/differential/deepseek_v4_vllm.py does): the hybrid KV
  cache manager on, async scheduling on, chunked prefill with max_num_batched_tokens
  8192, block size 16 (CacheConfig's default, which neither backend changes), device
  type cuda. The CPU target keeps the CPU platform's: async scheduling off,
  max_num_batched_tokens 2048 and block size 128 (gpufleet.tune CPU_BLOCK_SIZE).
- The manager arithmetic is vLLM's: get_kv_cache_groups, get_kv_cache_configs,
  generate_scheduler_kv_cache_config, update_kv_cache_capacity and
  _estimate_max_model_len_from_groups (vllm/v1/core/kv_cache_utils.py).
"""
from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import sys
import time
import types

GIB = 1024 ** 3
MODELS = {"26b-a4b": "gemma-4-26b-a4b", "31b-it": "gemma-4-31b-it"}
# target: (backend module:class, block size, async scheduling, max_num_batched_tokens,
# tensor-parallel sizes, KV cache dtypes, device type)
TARGETS = {
    "cuda-flash-attn": ("vllm.v1.attention.backends.flash_attn:FlashAttentionBackend",
                        16, True, 8192, (1, 2, 4, 8), ("auto",), "cuda"),
    "cuda-triton": ("vllm.v1.attention.backends.triton_attn:TritonAttentionBackend",
                    16, True, 8192, (1, 2, 4, 8), ("auto", "fp8"), "cuda"),
    "cpu": ("vllm.v1.attention.backends.cpu_attn:CPUAttentionBackend",
            128, False, 2048, (1,), ("auto",), "cpu"),
}
# Available KV memory per GPU for each TP size (an input, like vLLM's profiled
# "Available KV cache memory"); the odd bytes exercise the floor divisions.
AVAILABLE = {1: 3 * GIB + 12345, 2: 17 * GIB + 777, 4: 41 * GIB + 99, 8: 63 * GIB + 5}
MAX_MODEL_LENS = (None, 131072, 8193)  # None: the length vLLM derives from config


def _quiet():
    logging.disable(logging.WARNING)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def _backend(path):
    import importlib
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def build_specs(vc, backend):
    """The per-layer KV cache specs, in layer order; raises if vLLM's per-layer
    values and the model file's disagree."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.worker.utils import customize_attention_spec

    mc, pc = vc.model_config, vc.parallel_config
    text = mc.hf_text_config
    tp = pc.tensor_parallel_size
    specs = {}
    with set_current_vllm_config(vc):
        for i in range(mc.model_arch_config.total_num_hidden_layers):
            arch = mc.model_arch_config[i]
            head_size = arch.head_size
            kv_heads = mc.get_num_kv_heads(pc, arch)
            layer = text.per_layer_config[i]  # gemma4.py:578-580
            if (layer.head_dim, max(1, layer.num_key_value_heads // tp)) != (
                    head_size, kv_heads):
                raise SystemExit(f"layer {i}: vLLM's per-layer config says "
                                 f"{kv_heads} x {head_size}, gemma4.py builds "
                                 f"{layer.num_key_value_heads} // {tp} x {layer.head_dim}")
            sliding = text.layer_types[i] == "sliding_attention"
            kv_dtype = vc.cache_config.cache_dtype
            stand_in = types.SimpleNamespace(
                attn_type=AttentionType.DECODER,
                sliding_window=text.sliding_window if sliding else None,
                attn_backend=backend, num_kv_heads=kv_heads, head_size=head_size,
                head_size_v=head_size, kv_cache_dtype=kv_dtype,
                kv_cache_torch_dtype=kv_cache_dtype_str_to_dtype(kv_dtype, mc))
            spec = Attention.get_kv_cache_spec(stand_in, vc)
            specs[f"model.language_model.layers.{i}.self_attn.attn"] = \
                customize_attention_spec(backend, spec)
    return specs


_MODEL_CONFIGS = {}


def text_model_dir(model_dir):
    """A temporary folder whose config.json is the fixture's text_config as
    Gemma4ForCausalLM (see the module docstring)."""
    import tempfile
    with open(os.path.join(model_dir, "config.json")) as handle:
        cfg = json.load(handle)
    text = dict(cfg["text_config"], architectures=["Gemma4ForCausalLM"])
    folder = tempfile.mkdtemp(prefix="gemma4-text-")
    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump(text, handle)
    return folder


def make_config(model_dir, tp, block_size, kv_dtype, max_model_len, async_sched, mnbt,
                device_type):
    from vllm.config import (CacheConfig, ModelConfig, ParallelConfig, SchedulerConfig,
                             VllmConfig)
    if model_dir not in _MODEL_CONFIGS:  # about 10 s each: build it once per model
        _MODEL_CONFIGS[model_dir] = ModelConfig(model=text_model_dir(model_dir),
                                                skip_tokenizer_init=True)
    mc = copy.deepcopy(_MODEL_CONFIGS[model_dir])
    if max_model_len is not None:
        # --max-model-len below the derived limit: ModelConfig keeps it as given.
        assert max_model_len <= mc.max_model_len
        mc.max_model_len = max_model_len
    vc = VllmConfig(
        model_config=mc,
        cache_config=CacheConfig(block_size=block_size, cache_dtype=kv_dtype),
        scheduler_config=SchedulerConfig(
            max_num_batched_tokens=mnbt, max_num_seqs=256,
            max_model_len=mc.max_model_len, is_encoder_decoder=False,
            enable_chunked_prefill=True),
        parallel_config=ParallelConfig(tensor_parallel_size=tp))
    # The target platform's decisions (see the module docstring).
    vc.cache_config.block_size = block_size
    vc.scheduler_config.disable_hybrid_kv_cache_manager = False
    vc.scheduler_config.async_scheduling = async_sched
    vc.scheduler_config.max_num_batched_tokens = mnbt
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
        out.append({"type": type(layers[0]).__name__, "layers": len(group.layer_names),
                    "block_size": spec.block_size,
                    "page_bytes": sum(s.page_size_bytes for s in layers)})
    return out


def one_case(model_dir, target, tp, kv_dtype, avail, max_model_len, derived):
    from vllm.v1.attention.backends.utils import (get_supported_kv_cache_layouts,
                                                  resolve_kv_cache_layout)
    from vllm.v1.core import kv_cache_utils as kcu

    path, block_size, async_sched, mnbt, _, _, device_type = TARGETS[target]
    backend = _backend(path)
    vc = make_config(model_dir, tp, block_size, kv_dtype, max_model_len, async_sched,
                     mnbt, device_type)
    case = {"target": target, "tp": tp, "block_size": block_size,
            "kv_cache_dtype": kv_dtype, "available_bytes": avail,
            "max_model_len": vc.model_config.max_model_len,
            "async_scheduling": async_sched, "max_num_batched_tokens": mnbt,
            "backend": backend.get_name()}
    specs = build_specs(vc, backend)
    layout = resolve_kv_cache_layout(
        vc, [[x.name for x in get_supported_kv_cache_layouts([backend])]],
        list(specs.values()))
    case["kv_cache_layout"] = layout.name
    case["layer_pages"] = sorted({s.page_size_bytes for s in specs.values()})
    groups = kcu.get_kv_cache_groups(vc, dict(specs))
    bytes_per_block = kcu._pool_bytes_per_block(vc, groups)
    saved = vc.model_config.max_model_len
    vc.model_config.max_model_len = derived
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models-dir", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "models"))
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    _quiet()
    import vllm
    started = time.time()
    out = {"vllm_version": vllm.__version__, "models": {}}
    for key in args.models.split(","):
        model_dir = os.path.abspath(os.path.join(args.models_dir, MODELS[key]))
        derived = make_config(model_dir, 1, 16, "auto", None, True, 8192,
                              "cuda").model_config.max_model_len
        cases = []
        for target, (_, _, _, _, tps, kv_dtypes, _) in TARGETS.items():
            for tp in tps:
                for kv_dtype in kv_dtypes:
                    for max_len in MAX_MODEL_LENS:
                        cases.append(one_case(model_dir, target, tp, kv_dtype,
                                              AVAILABLE[tp], max_len, derived))
        out["models"][key] = {"config": f"tests/fixtures/models/{MODELS[key]}/config.json",
                              "derived_max_model_len": derived, "cases": cases}
    out["seconds"] = round(time.time() - started, 1)
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
