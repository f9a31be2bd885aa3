"""DeepSeek-V4's KV cache as vLLM itself plans it, for the tuner's differential check.

Runs INSIDE the lab image (vllm 0.32.0, CPU build; no GPU, no weights):

    docker run --rm --network none -v /work/main:/src:ro --entrypoint python \
        gpufleet/vllm-cpu:lab /src/tests/differential/deepseek_v4_vllm.py

and prints one JSON document: for every model (Flash, Pro), tensor-parallel size,
--block-size, --kv-cache-dtype, available KV memory and max_model_len, vLLM's own
num_blocks, maximum concurrency, "KV cache size: N tokens" and the estimated maximum
model length, or vLLM's own error for the combinations it refuses.

How the per-layer specs are built (vllm 0.32.0, read in the image):

- The attention class is the one the CUDA model file picks:
  vllm/models/deepseek_v4/nvidia/model.py `_select_dsv4_attn_cls` (FlashMLA unless
  the GPU is SM12x or --attention-backend says otherwise). Its cache modules are
  created in the order DeepseekV4Attention.__init__ creates them
  (vllm/models/deepseek_v4/attention.py): for a compress ratio 4 layer the indexer's
  key cache (DeepseekV4IndexerCache) and its compressor's state cache
  (CompressorStateCache, vllm/models/deepseek_v4/compressor.py), then the
  sliding-window cache (DeepseekV4SWACache, vllm/v1/attention/backends/mla/
  sparse_swa.py), then the layer itself, then the main compressor's state cache for
  ratio 4 and 128. Those cache modules are the real classes, constructed with the
  arguments the model passes. The layer's own spec is DeepseekV4Attention.
  get_kv_cache_spec called on a stand-in holding the four attributes it reads
  (compress_ratio, head_dim, kv_cache_dtype, kv_cache_torch_dtype), each set as
  __init__ sets it (max(1, compress_ratios[i]); config.head_dim;
  _resolve_dsv4_kv_cache_dtype). Building the whole layer would need CUDA.
- Each spec then goes through vllm/v1/worker/utils.py customize_attention_spec with
  the layer's backend, as GPUModelRunner.get_kv_cache_spec does.
- The layout is resolved from those backends' supported layouts
  (get_supported_kv_cache_layouts, resolve_kv_cache_layout), as the engine core does.
- Five settings the CPU platform decides differently from CUDA are set to the CUDA
  values: the hybrid KV cache manager on (vllm/config/vllm.py,
  support_hybrid_kv_cache), async scheduling on (the default for a generative model
  on the mp executor, config/vllm.py), chunked prefill with max_num_batched_tokens
  8192 (the API server's default on a GPU of >= 70 GiB, engine/arg_utils.py), the
  user's --block-size (the CPU platform forces 256 for DeepSeek-V4; CUDA keeps a
  user-specified size, platforms/interface.py update_block_size_for_backend) and the
  device type, which only names the pool in the log line.
- The manager arithmetic is vLLM's: get_kv_cache_configs,
  generate_scheduler_kv_cache_config, update_kv_cache_capacity and
  _estimate_max_model_len_from_groups (vllm/v1/core/kv_cache_utils.py).
- The block size check is the worker's: vllm/v1/worker/utils.py
  select_common_block_size for every layer's backend and spec, which refuses a block
  size the DeepSeek-V4 sparse MLA and indexer kernels (256 only) cannot split into.
"""
from __future__ import annotations

import types

import vllm_kv_plan

MODELS = {"flash": "deepseek-v4-flash", "pro": "deepseek-v4-pro"}
TPS = (1, 2, 4, 8)
BLOCK_SIZES = (128, 256)
KV_DTYPES = ("auto", "fp8", "bfloat16")
MAX_NUM_BATCHED_TOKENS = 8192
MAX_MODEL_LENS = (None, 131072, 200001)  # None: the length vLLM derives from config


def build_specs(vc, attn_cls, hf):
    """The per-layer KV cache specs, in the model's registration order."""
    from vllm.config import set_current_vllm_config
    from vllm.models.deepseek_v4.attention import (
        DeepseekV4IndexerCache, _resolve_dsv4_kv_cache_dtype)
    from vllm.models.deepseek_v4.compressor import CompressorBackend, CompressorStateCache
    from vllm.v1.attention.backends.mla.indexer import (
        DeepseekV4IndexerBackend, dsa_indexer_uses_fp4)
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache
    from vllm.v1.kv_cache_interface import AttentionSpec
    from vllm.v1.worker.utils import customize_attention_spec
    from vllm.models.deepseek_v4.common.ops.fused_indexer_q import MXFP4_BLOCK_SIZE

    cache_config = vc.cache_config
    modules = []  # (name, module or stand-in, backend)
    with set_current_vllm_config(vc):
        for i in range(hf.num_hidden_layers):
            prefix = f"model.layers.{i}.attn"
            ratio = max(1, hf.compress_ratios[i])  # attention.py __init__
            if ratio == 4:  # DeepseekV4Indexer.__init__
                head_dim = hf.index_head_dim
                if dsa_indexer_uses_fp4(vc):
                    k_head = head_dim // 2 + head_dim // MXFP4_BLOCK_SIZE
                else:
                    k_head = head_dim + head_dim // 128 * 4  # quant_block_size 128
                k_cache = DeepseekV4IndexerCache(
                    head_dim=k_head, dtype=__import__("torch").uint8,
                    prefix=f"{prefix}.indexer.k_cache", cache_config=cache_config,
                    compress_ratio=ratio)
                modules.append((k_cache.prefix, k_cache, DeepseekV4IndexerBackend))
                coff = 2  # DeepseekCompressor: overlap when ratio == 4
                state = CompressorStateCache(
                    state_dim=2 * coff * head_dim, dtype=__import__("torch").float32,
                    compress_ratio=ratio,
                    prefix=f"{prefix}.indexer.compressor.state_cache")
                modules.append((state.prefix, state, CompressorBackend))
            kv_dtype, torch_dtype = _resolve_dsv4_kv_cache_dtype(
                attn_cls.use_fp8_ds_mla_layout, cache_config.cache_dtype, cache_config)
            swa = DeepseekV4SWACache(
                head_dim=hf.head_dim, window_size=hf.sliding_window, dtype=torch_dtype,
                prefix=f"{prefix}.swa_cache", cache_config=cache_config,
                backend_cls=attn_cls.swa_backend_cls)
            modules.append((swa.prefix, swa, swa.backend_cls))
            stand_in = types.SimpleNamespace(
                compress_ratio=ratio, head_dim=hf.head_dim, kv_cache_dtype=kv_dtype,
                kv_cache_torch_dtype=torch_dtype)
            modules.append((prefix, stand_in, attn_cls.backend_cls))
            if ratio > 1:
                coff = 1 + (ratio == 4)
                state = CompressorStateCache(
                    state_dim=2 * coff * hf.head_dim, dtype=__import__("torch").float32,
                    compress_ratio=ratio, prefix=f"{prefix}.compressor.state_cache")
                modules.append((state.prefix, state, CompressorBackend))
    specs, backends = {}, {}
    for name, module, backend in modules:
        if isinstance(module, types.SimpleNamespace):
            spec = attn_cls.get_kv_cache_spec(module, vc)
        else:
            spec = module.get_kv_cache_spec(vc)
        if spec is None:  # ratio <= 1: the layer keeps only its SWA cache
            continue
        if isinstance(spec, AttentionSpec):
            spec = customize_attention_spec(backend, spec)
        specs[name] = spec
        backends[name] = backend
    return specs, backends


def make_config(model_dir, tp, block_size, kv_dtype, max_model_len):
    # The CUDA platform's decisions (see the module docstring). The CPU platform also
    # forces block size 256 for DeepSeek-V4 ("DeepSeek-V4 CPU backend requires
    # block_size=256"); CUDA keeps a user-specified --block-size
    # (Platform.update_block_size_for_backend).
    return vllm_kv_plan.make_config(model_dir, tp, block_size, kv_dtype, max_model_len,
                                    max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS)


def one_case(model_dir, tp, block_size, kv_dtype, avail, max_model_len, hf_cache):
    from vllm.v1.worker.utils import select_common_block_size

    vc = make_config(model_dir, tp, block_size, kv_dtype, max_model_len)
    hf = vc.model_config.hf_config
    try:
        from vllm.models.deepseek_v4.nvidia.model import _select_dsv4_attn_cls
        attn_cls = _select_dsv4_attn_cls(vc)
    except ImportError:  # pragma: no cover - the model file needs CUDA-only imports
        from vllm.models.deepseek_v4.nvidia.flashmla import DeepseekV4FlashMLAAttention
        attn_cls = DeepseekV4FlashMLAAttention
    case = {"tp": tp, "block_size": block_size, "kv_cache_dtype": kv_dtype,
            "available_bytes": avail, "max_model_len": vc.model_config.max_model_len,
            "attention_class": attn_cls.__name__}
    try:
        specs, backends = build_specs(vc, attn_cls, hf)
    except ValueError as exc:
        case["error"] = f"{type(exc).__name__}: {exc}"
        return case
    case["resolved_kv_cache_dtype"] = vc.cache_config.cache_dtype
    # Worker check (GPUModelRunner -> AttentionGroup.create_metadata_builders):
    # every backend must split the manager's block into its kernel blocks.
    for name, spec in specs.items():
        if getattr(spec, "has_layer_views", True):
            try:
                select_common_block_size(spec.block_size, [backends[name]], [spec])
            except ValueError as exc:
                case["error"] = f"ValueError: {exc}"
                case["error_layer"] = name
                return case
    case["num_specs"] = len(specs)
    return vllm_kv_plan.plan(vc, specs, backends.values(), avail,
                             hf_cache["derived_max_len"], case)


def cases(model_dir, derived):
    hf_cache = {"derived_max_len": derived}
    return [one_case(model_dir, tp, block_size, kv_dtype, vllm_kv_plan.AVAILABLE[tp],
                     max_len, hf_cache)
            for tp in TPS for block_size in BLOCK_SIZES for kv_dtype in KV_DTYPES
            for max_len in MAX_MODEL_LENS]


if __name__ == "__main__":
    vllm_kv_plan.main(
        __doc__, MODELS,
        lambda d: make_config(d, 1, 256, "auto", None).model_config.max_model_len, cases,
        header={"max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS, "async_scheduling": True})
