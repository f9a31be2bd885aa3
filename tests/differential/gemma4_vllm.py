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

import functools
import json
import os
import types

import vllm_kv_plan

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
MAX_MODEL_LENS = (None, 131072, 8193)  # None: the length vLLM derives from config


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


@functools.lru_cache(maxsize=None)
def text_model_dir(model_dir):
    """A temporary folder whose config.json is the fixture's text_config as
    Gemma4ForCausalLM (see the module docstring); one per model, so that
    vllm_kv_plan builds its ModelConfig once."""
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
    # The target platform's decisions (see the module docstring).
    return vllm_kv_plan.make_config(
        text_model_dir(model_dir), tp, block_size, kv_dtype, max_model_len,
        async_sched=async_sched, max_num_batched_tokens=mnbt, max_num_seqs=256,
        device_type=device_type)


def one_case(model_dir, target, tp, kv_dtype, avail, max_model_len, derived):
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
    case["layer_pages"] = sorted({s.page_size_bytes for s in specs.values()})
    return vllm_kv_plan.plan(vc, specs, [backend], avail, derived, case)


def cases(model_dir, derived):
    return [one_case(model_dir, target, tp, kv_dtype, vllm_kv_plan.AVAILABLE[tp], max_len,
                     derived)
            for target, (_, _, _, _, tps, kv_dtypes, _) in TARGETS.items()
            for tp in tps for kv_dtype in kv_dtypes for max_len in MAX_MODEL_LENS]


if __name__ == "__main__":
    vllm_kv_plan.main(
        __doc__, MODELS,
        lambda d: make_config(d, 1, 16, "auto", None, True, 8192,
                              "cuda").model_config.max_model_len, cases)
