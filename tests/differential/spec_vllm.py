"""Speculative decoding's KV cache as vLLM itself plans it, for the tuner's differential
check (issue #34 item 2).

Runs INSIDE the lab image (vllm 0.32.0, CPU build; no GPU, no weights):
    docker run --rm --network none -v /work/main:/src:ro --entrypoint python \
        gpufleet/vllm-cpu:lab /src/tests/differential/spec_vllm.py
and prints one JSON document: for Llama-3.1-8B with an EAGLE-3 draft
(tests/fixtures/drafts/eagle3-llama3-8b) and for DeepSeek-V4-Flash and -Pro with their
MTP layer, at TP 1/2/4/8, vLLM's own SpeculativeConfig (the method it resolves, the
draft's layers, KV heads per GPU and head size, num_lookahead_tokens,
num_prefill_lookahead_tokens), then the KV cache plan of the target's layers plus the
draft's: groups, bytes per block, num_blocks, maximum concurrency, "KV cache size"
tokens, blocks per request and the estimated maximum model length, or vLLM's error.

What is vLLM's and what is built here (vllm 0.32.0, read in the image):
- The SpeculativeConfig is vLLM's own, built as EngineArgs.create_speculative_config
  builds it from --speculative-config (method, model, num_speculative_tokens, the
  target's model and parallel configs): it resolves the draft's ModelConfig (for MTP,
  hf_config_override turns DeepSeek-V4's config into deepseek_mtp with n_predict =
  num_nextn_predict_layers), the draft's tensor-parallel size, and VllmConfig reads
  num_lookahead_tokens / num_prefill_lookahead_tokens from it. It is set on the
  VllmConfig, so get_kv_cache_configs sees it (SlidingWindowSpec.extra_retained_tokens
  from num_prefill_lookahead_tokens, _annotate_eagle_groups).
- GPUModelRunner.get_kv_cache_spec gives every attention layer in the forward context a
  spec, the drafter's too (vllm/v1/worker/gpu_model_runner.py); the drafter is built
  after the target, so its layers come last.
- EAGLE-3 on Llama: vllm/model_executor/models/llama_eagle3.py Eagle3LlamaForCausalLM
  builds draft_model_config.hf_config.num_hidden_layers LlamaDecoderLayers numbered from
  the target's layer count (start_layer_id), each with a LlamaAttention of the draft
  config's heads; its spec is Attention.get_kv_cache_spec on a stand-in holding the
  draft ModelConfig's get_num_kv_heads(draft_parallel_config) and get_head_size(), the
  target's KV cache dtype (the draft ModelConfig takes the target's dtype,
  config/speculative.py), then customize_attention_spec with FlashAttention, as in
  pp_vllm.py. No sliding window (the draft config has no layer_types).
- MTP on DeepSeek-V4: vllm/models/deepseek_v4/nvidia/mtp.py builds
  num_nextn_predict_layers DeepseekV4DecoderLayers numbered from num_hidden_layers
  (mtp_start_layer_idx); attention.py:232-235 gives a layer at or past
  num_hidden_layers compress ratio 1, so each keeps only its sliding-window cache
  (DeepseekV4SWACache, the real class) and no compressed or indexer cache. The
  target's layers are deepseek_v4_vllm.build_specs, as for deepseek-v4.json.
- Settings the CPU platform decides otherwise are set to CUDA's, as in the other
  scripts (vllm_kv_plan.make_config): async scheduling on (VllmConfig.__post_init__
  keeps it for the EAGLE and MTP methods: EagleModelTypes), chunked prefill with
  max_num_batched_tokens 8192, the hybrid KV cache manager, block 16 (Llama) or 256
  (DeepSeek-V4).
"""
from __future__ import annotations

import importlib
import os
import types

import deepseek_v4_vllm
import vllm_kv_plan

HERE = os.path.dirname(os.path.abspath(__file__))
DRAFTS_DIR = os.path.join(HERE, "..", "fixtures", "drafts")
TPS = (1, 2, 4, 8)
FA = "vllm.v1.attention.backends.flash_attn:FlashAttentionBackend"
EAGLE_DRAFT = "eagle3-llama3-8b"
LLAMA_LENS = (None, 8192, 4097)      # None: the length vLLM derives (131,072)
LLAMA_TOKENS = (3, 1)
V4_LENS = (None, 131072)
V4_TOKENS = (1, 2)


def _backend(path):
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def speculative(vc, **kwargs):
    """vLLM's SpeculativeConfig from --speculative-config's keys, set on `vc`."""
    from vllm.config import SpeculativeConfig
    sc = SpeculativeConfig(target_model_config=vc.model_config,
                           target_parallel_config=vc.parallel_config, **kwargs)
    vc.speculative_config = sc
    return sc


def spec_summary(vc, sc):
    from typing import get_args

    from vllm.config.speculative import EagleModelTypes
    draft = sc.draft_model_config
    hf = draft.hf_config
    return {"method": sc.method, "num_speculative_tokens": sc.num_speculative_tokens,
            "draft_tensor_parallel_size": sc.draft_tensor_parallel_size,
            "draft_model_type": hf.model_type,
            "draft_architectures": list(getattr(hf, "architectures", None) or []),
            "n_predict": getattr(hf, "n_predict", None),
            "method_keeps_async_scheduling": sc.method in get_args(EagleModelTypes),
            "use_eagle": sc.use_eagle(),
            "multi_module_mtp": sc.use_multi_module_mtp(),
            "num_lookahead_tokens": vc.num_lookahead_tokens,
            "num_prefill_lookahead_tokens": vc.num_prefill_lookahead_tokens}


def llama_specs(vc, sc, backend):
    """The target's 32 full-attention layers, then the EAGLE-3 draft's."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.worker.utils import customize_attention_spec

    mc, pc = vc.model_config, vc.parallel_config
    draft = sc.draft_model_config
    kv_dtype = vc.cache_config.cache_dtype
    target_layers = mc.get_total_num_hidden_layers()
    layers = [(f"model.layers.{i}.self_attn.attn", mc.get_num_kv_heads(pc),
               mc.get_head_size(), mc) for i in range(target_layers)]
    # llama_eagle3.py: layers numbered from the target's count (start_layer_id)
    layers += [(f"model.layers.{target_layers + i}.self_attn.attn",
                draft.get_num_kv_heads(sc.draft_parallel_config), draft.get_head_size(),
                draft) for i in range(draft.hf_config.num_hidden_layers)]
    specs = {}
    with set_current_vllm_config(vc):
        for name, kv_heads, head_size, config in layers:
            stand_in = types.SimpleNamespace(
                attn_type=AttentionType.DECODER, sliding_window=None, attn_backend=backend,
                num_kv_heads=kv_heads, head_size=head_size, head_size_v=head_size,
                kv_cache_dtype=kv_dtype,
                kv_cache_torch_dtype=kv_cache_dtype_str_to_dtype(kv_dtype, config))
            specs[name] = customize_attention_spec(
                backend, Attention.get_kv_cache_spec(stand_in, vc))
    return specs


def llama_case(model_dir, tp, max_len, tokens, derived):
    backend = _backend(FA)
    vc = vllm_kv_plan.make_config(model_dir, tp, 16, "auto", max_len)
    sc = speculative(vc, method="eagle3", model=os.path.join(DRAFTS_DIR, EAGLE_DRAFT),
                     num_speculative_tokens=tokens)
    case = {"tp": tp, "block_size": 16, "kv_cache_dtype": "auto",
            "available_bytes": vllm_kv_plan.AVAILABLE[tp],
            "max_model_len": vc.model_config.max_model_len,
            "draft": f"tests/fixtures/drafts/{EAGLE_DRAFT}/config.json",
            "speculative": spec_summary(vc, sc)}
    draft = sc.draft_model_config
    case["speculative"].update(
        draft_layers=draft.hf_config.num_hidden_layers,
        draft_kv_heads_per_gpu=draft.get_num_kv_heads(sc.draft_parallel_config),
        draft_head_size=draft.get_head_size())
    specs = llama_specs(vc, sc, backend)
    case["num_specs"] = len(specs)
    return vllm_kv_plan.plan(vc, specs, [backend], vllm_kv_plan.AVAILABLE[tp], derived, case)


def v4_specs(vc, sc, attn_cls):
    """deepseek_v4_vllm.build_specs for the target, then each MTP layer's
    sliding-window cache (compress ratio 1 past num_hidden_layers)."""
    from vllm.config import set_current_vllm_config
    from vllm.models.deepseek_v4.attention import _resolve_dsv4_kv_cache_dtype
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache
    from vllm.v1.worker.utils import customize_attention_spec

    hf = vc.model_config.hf_config
    specs, backends = deepseek_v4_vllm.build_specs(vc, attn_cls, hf)
    draft_hf = sc.draft_model_config.hf_config
    cache_config = vc.cache_config
    with set_current_vllm_config(vc):
        for j in range(draft_hf.n_predict):
            prefix = f"model.layers.{hf.num_hidden_layers + j}.attn"
            _, torch_dtype = _resolve_dsv4_kv_cache_dtype(
                attn_cls.use_fp8_ds_mla_layout, cache_config.cache_dtype, cache_config)
            swa = DeepseekV4SWACache(
                head_dim=draft_hf.head_dim, window_size=draft_hf.sliding_window,
                dtype=torch_dtype, prefix=f"{prefix}.swa_cache", cache_config=cache_config,
                backend_cls=attn_cls.swa_backend_cls)
            specs[swa.prefix] = customize_attention_spec(swa.backend_cls,
                                                         swa.get_kv_cache_spec(vc))
            backends[swa.prefix] = swa.backend_cls
    return specs, backends


def v4_case(model_dir, tp, max_len, tokens, derived):
    try:
        from vllm.models.deepseek_v4.nvidia.model import _select_dsv4_attn_cls
        attn_cls = None
    except ImportError:  # pragma: no cover
        _select_dsv4_attn_cls = None
    vc = deepseek_v4_vllm.make_config(model_dir, tp, 256, "fp8", max_len)
    if _select_dsv4_attn_cls is not None:
        attn_cls = _select_dsv4_attn_cls(vc)
    else:  # pragma: no cover
        from vllm.models.deepseek_v4.nvidia.flashmla import DeepseekV4FlashMLAAttention
        attn_cls = DeepseekV4FlashMLAAttention
    sc = speculative(vc, method="mtp", num_speculative_tokens=tokens)
    case = {"tp": tp, "block_size": 256, "kv_cache_dtype": "fp8",
            "available_bytes": vllm_kv_plan.AVAILABLE[tp],
            "max_model_len": vc.model_config.max_model_len,
            "attention_class": attn_cls.__name__, "speculative": spec_summary(vc, sc)}
    specs, backends = v4_specs(vc, sc, attn_cls)
    case["num_specs"] = len(specs)
    return vllm_kv_plan.plan(vc, specs, backends.values(), vllm_kv_plan.AVAILABLE[tp],
                             derived, case)


MODELS = {"llama-3.1-8b+eagle3": "llama-3.1-8b", "deepseek-v4-flash+mtp": "deepseek-v4-flash",
          "deepseek-v4-pro+mtp": "deepseek-v4-pro"}


def derived_len(model_dir):
    if "deepseek-v4" in model_dir:
        return deepseek_v4_vllm.make_config(model_dir, 1, 256, "fp8", None).model_config.max_model_len
    return vllm_kv_plan.make_config(model_dir, 1, 16, "auto", None).model_config.max_model_len


def cases(model_dir, derived):
    if "deepseek-v4" in model_dir:
        return [v4_case(model_dir, tp, max_len, tokens, derived)
                for tp in TPS for max_len in V4_LENS for tokens in V4_TOKENS]
    return [llama_case(model_dir, tp, max_len, tokens, derived)
            for tp in TPS for max_len in LLAMA_LENS for tokens in LLAMA_TOKENS]


if __name__ == "__main__":
    vllm_kv_plan.main(
        __doc__, MODELS, derived_len, cases,
        header={"script": "tests/differential/spec_vllm.py", "max_num_batched_tokens": 8192,
                "async_scheduling": True,
                "available_bytes_per_tp": {str(k): v for k, v in
                                           vllm_kv_plan.AVAILABLE.items()}})
