"""Pipeline parallelism on one host as vLLM itself plans it, for the tuner's
differential check (issue #34 item 3).

Runs INSIDE the lab image (vllm 0.32.0, CPU build; no GPU, no weights):
    docker run --rm --network none -v /work/main:/src:ro --entrypoint python \
        gpufleet/vllm-cpu:lab /src/tests/differential/pp_vllm.py
and prints one JSON document: for Llama-3.1-8B and -70B (every layer full attention),
Gemma 2 9B (sliding and full layers alternating, 42 layers) and Gemma 3 1B (five
sliding layers to one full, 26 layers) from tests/fixtures/models, at TP x PP
1x2, 2x2, 1x4 and 2x4 and two max_model_len each, vLLM's own split of the layers per
stage, each stage's bytes per block and blocks before the minimum, then num_blocks,
maximum concurrency, "KV cache size: N tokens", the in-flight tokens and the estimated
maximum model length, or vLLM's own error.

What is vLLM's and what is built here (vllm 0.32.0, read in the image):
- The layers of stage r are vllm/distributed/utils.py get_pp_indices(num_layers, r, pp)
  (VLLM_PP_LAYER_PARTITION unset), called here.
- Each layer's spec is vllm/model_executor/layers/attention/attention.py
  Attention.get_kv_cache_spec on a stand-in holding what it reads (as in
  gemma4_vllm.py), then vllm/v1/worker/utils.py customize_attention_spec with the
  FlashAttention backend, as GPUModelRunner does. KV heads per GPU and head size are
  ModelConfig.get_num_kv_heads / get_head_size. A layer slides when
  hf_text_config.layer_types[i] is sliding_attention, with config.sliding_window
  (gemma2.py:155-156, gemma3.py:154-155); Llama has no sliding layers.
- Each worker (pp stage x tp rank, stage-major) gets its stage's layers, named
  model.layers.{i}.self_attn.attn, and its own available KV memory: AVAILABLE[tp]
  (tests/differential/vllm_kv_plan.py) less STAGE_LESS for the first and last stage,
  which hold the embedding and lm_head in vLLM, so the stages differ as they do.
- The arithmetic is vLLM's: get_kv_cache_configs (global groups from the merged
  specs, projected per worker, the minimum num_blocks across workers),
  generate_scheduler_kv_cache_config, update_kv_cache_capacity; the per-stage blocks
  before the minimum are get_kv_cache_config_from_groups on the projected groups
  (_project_kv_cache_groups_to_worker), as get_kv_cache_configs computes them; the
  estimated maximum model length is the smallest over stages of
  _estimate_max_model_len_from_groups on the memory left after the null block, as
  _auto_fit_max_model_len does.
- Settings the CPU platform decides otherwise are set to CUDA's (as in the other
  scripts): block size 16, hybrid KV cache manager on, async scheduling on, chunked
  prefill with max_num_batched_tokens 8192, device type cuda, and the V2 model runner
  (VLLM_USE_V2_MODEL_RUNNER=1 once the config is built, since the CPU build refuses it
  while building: what vLLM 0.32.0 picks on CUDA; with async scheduling it runs
  pp + 1 concurrent batches, VllmConfig.max_concurrent_batches).
"""
from __future__ import annotations

import os
import types

import vllm_kv_plan

MODELS = {"llama-3.1-8b": "llama-3.1-8b", "llama-3.1-70b": "llama-3.1-70b",
          "gemma-2-9b-it": "gemma-2-9b-it", "gemma-3-1b-it": "gemma-3-1b-it"}
SHAPES = ((1, 2), (2, 2), (1, 4), (2, 4))  # (tp, pp)
MAX_MODEL_LENS = (8192, 4097)
BLOCK_SIZE = 16
MNBT = 8192
GIB = vllm_kv_plan.GIB
# Less KV memory on the first and last stage (embedding, lm_head): odd bytes on purpose.
STAGE_LESS = {"first": GIB // 3 + 1234, "last": GIB // 2 + 56789}
BACKEND = "vllm.v1.attention.backends.flash_attn:FlashAttentionBackend"


def stage_available(tp, pp):
    out = []
    for rank in range(pp):
        avail = vllm_kv_plan.AVAILABLE[tp]
        if rank == 0:
            avail -= STAGE_LESS["first"]
        if rank == pp - 1:
            avail -= STAGE_LESS["last"]
        out.append(avail)
    return out


def make_config(model_dir, tp, pp, max_model_len):
    from vllm.config import ParallelConfig
    os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)  # the CPU build refuses V2 here
    vc = vllm_kv_plan.make_config(model_dir, tp, BLOCK_SIZE, "auto", max_model_len,
                                  async_sched=True, max_num_batched_tokens=MNBT,
                                  max_num_seqs=1024, device_type="cuda")
    # the pipeline size, set as ParallelConfig takes it (vllm_kv_plan builds TP only)
    pc = ParallelConfig(tensor_parallel_size=tp, pipeline_parallel_size=pp)
    vc.parallel_config = pc
    vc.scheduler_config.async_scheduling = True
    # CUDA's runner (see the docstring), read by VllmConfig.use_v2_model_runner
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    return vc


def build_specs(vc, backend, layers):
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.worker.utils import customize_attention_spec

    mc, pc = vc.model_config, vc.parallel_config
    text = mc.hf_text_config
    layer_types = getattr(text, "layer_types", None)
    kv_heads, head_size = mc.get_num_kv_heads(pc), mc.get_head_size()
    kv_dtype = vc.cache_config.cache_dtype
    specs = {}
    with set_current_vllm_config(vc):
        for i in layers:
            sliding = bool(layer_types) and layer_types[i] == "sliding_attention"
            stand_in = types.SimpleNamespace(
                attn_type=AttentionType.DECODER,
                sliding_window=text.sliding_window if sliding else None,
                attn_backend=backend, num_kv_heads=kv_heads, head_size=head_size,
                head_size_v=head_size, kv_cache_dtype=kv_dtype,
                kv_cache_torch_dtype=kv_cache_dtype_str_to_dtype(kv_dtype, mc))
            specs[f"model.layers.{i}.self_attn.attn"] = customize_attention_spec(
                backend, Attention.get_kv_cache_spec(stand_in, vc))
    return specs


def one_case(model_dir, tp, pp, max_model_len, derived):
    import importlib

    from vllm.distributed.utils import get_pp_indices
    from vllm.v1.attention.backends.utils import (get_supported_kv_cache_layouts,
                                                  resolve_kv_cache_layout)
    from vllm.v1.core import kv_cache_utils as kcu

    module, name = BACKEND.split(":")
    backend = getattr(importlib.import_module(module), name)
    vc = make_config(model_dir, tp, pp, max_model_len)
    num_layers = vc.model_config.get_total_num_hidden_layers()
    ranges = [list(get_pp_indices(num_layers, rank, pp)) for rank in range(pp)]
    available = stage_available(tp, pp)
    stage_specs = [build_specs(vc, backend, range(*r)) for r in ranges]
    case = {"tp": tp, "pp": pp, "block_size": BLOCK_SIZE, "kv_cache_dtype": "auto",
            "max_model_len": vc.model_config.max_model_len,
            "max_num_batched_tokens": MNBT, "async_scheduling": True,
            "max_in_flight_tokens": vc.max_in_flight_tokens,
            "use_v2_model_runner": vc.use_v2_model_runner,
            "stage_available_bytes": available}
    all_specs = [s for s in stage_specs for _ in range(tp)]
    all_avail = [a for a in available for _ in range(tp)]
    merged = {k: v for s in stage_specs for k, v in s.items()}
    layout = resolve_kv_cache_layout(
        vc, [[x.name for x in get_supported_kv_cache_layouts({backend})]],
        list(merged.values()))
    case["kv_cache_layout"] = layout.name
    groups = kcu.get_kv_cache_groups(vc, dict(merged))
    case["groups"] = vllm_kv_plan.summarise_groups(groups)
    stages, estimates = [], []
    saved = vc.model_config.max_model_len
    for r, specs, avail in zip(ranges, stage_specs, available):
        projected = kcu._project_kv_cache_groups_to_worker(groups, specs)
        bpb = kcu._pool_bytes_per_block(vc, projected)
        config = kcu.get_kv_cache_config_from_groups(vc, projected, avail)
        vc.model_config.max_model_len = derived
        try:
            estimates.append(kcu._estimate_max_model_len_from_groups(
                vc, projected, avail - bpb))
        finally:
            vc.model_config.max_model_len = saved
        stages.append({"layers": r, "bytes_per_block": bpb,
                       "num_blocks": config.num_blocks,
                       "group_layers": [len(g.layer_names) for g in projected]})
    case["stages"] = stages
    case["estimated_max_model_len"] = min(estimates)
    try:
        configs = kcu.get_kv_cache_configs(vc, all_specs, all_avail)
    except ValueError as exc:
        case["error"] = f"ValueError: {exc}"
        return case
    sched = kcu.generate_scheduler_kv_cache_config(configs)
    kcu.update_kv_cache_capacity(vc, sched)
    case.update({
        "num_blocks": sched.num_blocks,
        "blocks_per_request": sum(
            kcu.cdiv(g.kv_cache_spec.max_memory_usage_bytes(vc),
                     g.kv_cache_spec.page_size_bytes) for g in sched.kv_cache_groups),
        "max_concurrency": vc.cache_config.kv_cache_max_concurrency,
        "kv_cache_size_tokens": vc.cache_config.kv_cache_size_tokens,
    })
    return case


def cases(model_dir, derived):
    return [one_case(model_dir, tp, pp, max_len, derived)
            for tp, pp in SHAPES for max_len in MAX_MODEL_LENS]


if __name__ == "__main__":
    vllm_kv_plan.main(
        __doc__, MODELS,
        lambda d: make_config(d, 1, 1, None).model_config.max_model_len, cases,
        header={"script": "tests/differential/pp_vllm.py", "block_size": BLOCK_SIZE,
                "stage_less_bytes": STAGE_LESS,
                "available_bytes_per_tp": {str(k): v for k, v in
                                           vllm_kv_plan.AVAILABLE.items()}})
