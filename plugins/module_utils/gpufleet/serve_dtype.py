"""The dtypes vLLM serves with on a GPU: the weights' (--dtype) and the KV cache's.

Plain data in, plain data out; no Ansible imports.  What vLLM 0.32.0's `--dtype auto`
picks for a checkpoint on a compute capability (and what an asked-for dtype is refused
on), whether an fp8 KV cache runs there, the per-layer-kind backends' limits, and each
weight quantization method's minimum compute capability.  Each decision appends its
reason; gpufleet.tune's planner calls them.  Which GPUs have bf16 and fp8 units is
gpufleet.arch's table.
"""
from __future__ import annotations

from . import deepseek_v4, kv_memory
from .arch import ARCHITECTURES, architecture
from .model_description import ModelDescription
from .tune_errors import TuneError
from .vllm_flags import version_at_least


# Minimum compute capability per weight quantization method, get_min_capability() in
# vllm/model_executor/layers/quantization/<method>.py. awq (75, "Turing or newer",
# activations torch.half only) was read at commit 000796ac; gptq (60) and fp8 (80, with
# a weight-only Marlin path below 8.9 per shared/notes/gpu-cuda-facts.md) were not
# re-read there.
QUANT_MIN_CAPABILITY = {"awq": (7, 5), "gptq": (6, 0), "fp8": (8, 0)}
# Below 8.9 there is no FP8 hardware: vLLM runs FP8 weights weight-only (Marlin).
# Which GPUs have FP8 units (and bf16) is gpufleet.arch's `fp8` (`bf16`) column.
# V1 attention backends reject an fp8 KV cache below SM89 (vllm-project/vllm issues
# #26431 on an RTX 3090 with v0.11: "type fp8e4nv not supported in this architecture";
# #47549 on SM75 with v0.24: "FP8 KV cache is not supported by the Triton attention
# backend ... native FP8 (fp8e4nv) requires SM89+"). The V0 engine (default before
# 0.8.0) stored fp8 and converted in its kernels with no hardware support (#4827).
V1_DEFAULT_SINCE = "0.8.0"
FP8_KV_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2")
# vLLM 0.32.0 config/model.py:2381-2386 _FLOAT16_NOT_SUPPORTED_MODELS: model types it
# refuses to run in float16 ("Numerical instability"); --dtype auto then skips float16,
# so a Turing GPU serves them in float32 (_resolve_auto_dtype).
FLOAT16_REFUSED_MODEL_TYPES = ("gemma2", "gemma3", "gemma3_text", "glm4")


def _has(cc, feature):
    """gpufleet.arch's `bf16` / `fp8` column for a (known) compute capability."""
    return ARCHITECTURES[architecture(cc)][feature]


def served_dtype(model, cc, requested, reasons, cpu):
    """The --dtype to emit and its element size: what vLLM 0.32.0's --dtype auto picks
    (config/model.py _resolve_auto_dtype), or the user's choice where vLLM accepts it."""
    model = ModelDescription.of(model)
    quant = (model.quantization or {}).get("method")
    model_type = model.model_type
    no_float16 = model_type in FLOAT16_REFUSED_MODEL_TYPES
    if requested not in (None, "auto"):
        if requested not in ("bfloat16", "float16", "float32"):
            raise TuneError(f"dtype {requested!r} is not auto, bfloat16, float16 or "
                            "float32")
        if requested == "bfloat16" and cc is not None and not _has(cc, "bf16"):
            raise TuneError(
                f"dtype bfloat16 needs compute capability >= 8.0 and this GPU has "
                f"{cc[0]}.{cc[1]} (gpu_worker.py _check_if_gpu_supports_dtype); use "
                + ("float32" if no_float16 else "float16"))
        if requested == "float16" and no_float16:
            raise TuneError(
                f"dtype float16: vLLM refuses float16 for model_type {model_type!r} "
                "(config/model.py _FLOAT16_NOT_SUPPORTED_MODELS: numerical instability); "
                "use bfloat16 (compute capability >= 8.0) or float32")
        reasons.append(f"dtype {requested}: set by the user.")
        return requested, 4 if requested == "float32" else 2
    if quant in ("awq", "gptq") and no_float16:
        # vLLM 0.32.0's AWQ/GPTQ kernels take float16 or bfloat16 activations
        # (auto_awq.py / auto_gptq.py get_supported_act_dtypes), and these model types
        # never run in float16: bfloat16, where the GPU has it.
        if cpu or _has(cc, "bf16"):
            reasons.append(f"dtype bfloat16: vLLM refuses float16 for model_type "
                           f"{model_type!r} and its {quant.upper()} kernels take "
                           "bfloat16 too.")
            return "bfloat16", 2
        raise TuneError(
            f"a {quant.upper()} checkpoint of model_type {model_type!r} cannot be served on "
            f"compute capability {cc[0]}.{cc[1]}: vLLM refuses float16 for it "
            "(_FLOAT16_NOT_SUPPORTED_MODELS), the GPU has no bfloat16 (< 8.0), and the "
            f"{quant.upper()} kernels take only 16-bit activations. Use a GPU of compute "
            "capability >= 8.0, or an unquantized checkpoint (served in float32).")
    if quant in ("awq", "gptq"):
        reasons.append(f"dtype float16: {quant.upper()} kernels take float16 "
                       "activations.")
        return "float16", 2
    if cpu:
        reasons.append("dtype bfloat16: the CPU backend runs 16-bit models in bfloat16.")
        return "bfloat16", 2
    # _resolve_auto_dtype: the platform's dtypes (platforms/cuda.py supported_dtypes:
    # bfloat16 from compute capability 8.0), less float16 for the model types vLLM
    # refuses it for; a pooling model prefers float16, others the first.
    supported = ["bfloat16", "float16", "float32"] if _has(cc, "bf16") else [
        "float16", "float32"]
    if no_float16:
        supported.remove("float16")
    preferred = "float16" if model.kind == "pooling" and "float16" in supported \
        else supported[0]
    wanted = model.torch_dtype
    cc_text = f"compute capability {cc[0]}.{cc[1]}"
    if wanted == "float32":
        chosen = preferred
        why = (f"the checkpoint is float32, which vLLM serves in its preferred "
               f"{preferred} on {cc_text}"
               + (" (float16 for a pooling model)" if model.kind == "pooling" else ""))
    elif wanted in supported:
        chosen = wanted
        why = (f"the checkpoint is {wanted} and {cc_text} >= 8.0 supports bfloat16"
               if wanted == "bfloat16" else f"the checkpoint is {wanted}")
    else:
        chosen = preferred
        why = (f"{cc_text} < 8.0 has no bfloat16 (vLLM refuses it there)"
               if wanted == "bfloat16" else
               f"the checkpoint is {wanted}, which vLLM does not serve here")
    if no_float16 and chosen != wanted:
        why += (f"; vLLM refuses float16 for model_type {model_type!r} "
                "(_FLOAT16_NOT_SUPPORTED_MODELS)")
    reasons.append(f"dtype {chosen}: {why}.")
    return chosen, 4 if chosen == "float32" else 2


def kv_cache_dtype(requested, allow_fp8, cc, version, cpu, reasons):
    if requested is None:
        requested = "auto"
    if requested not in kv_memory.KV_DTYPE_BYTES:
        raise TuneError(f"kv_cache_dtype {requested!r} is not one of "
                        f"{', '.join(kv_memory.KV_DTYPE_BYTES)}")
    if requested in FP8_KV_DTYPES and not cpu and not _has(cc, "fp8"):
        if version_at_least(version, V1_DEFAULT_SINCE):
            raise TuneError(
                f"kv_cache_dtype {requested} is refused on compute capability "
                f"{cc[0]}.{cc[1]}: vLLM {version}'s V1 attention backends need SM 8.9+ "
                "for an fp8 KV cache (vllm issues #26431, #47549). Use kv_cache_dtype "
                "auto, or a GPU of compute capability 8.9 or newer.")
        reasons.append(f"kv_cache_dtype {requested}: emulated on compute capability "
                       f"{cc[0]}.{cc[1]} (vLLM {version} stores fp8 and converts in its "
                       "kernels; half the KV memory, no speed-up; vllm issue #4827).")
        return requested
    if requested != "auto":
        reasons.append(f"kv_cache_dtype {requested}: set by the user.")
        return requested
    if allow_fp8 and not cpu and _has(cc, "fp8"):
        reasons.append(f"kv_cache_dtype fp8: allowed by the user and compute capability "
                       f"{cc[0]}.{cc[1]} has native FP8; halves KV bytes per token.")
        return "fp8"
    if allow_fp8:
        where = "the CPU target" if cpu else f"compute capability {cc[0]}.{cc[1]}"
        reasons.append(f"kv_cache_dtype auto: fp8 is allowed but {where} has no native "
                       "FP8 KV cache support.")
    else:
        reasons.append("kv_cache_dtype auto: the KV cache uses the model dtype "
                       "(allow_fp8 is off).")
    return "auto"


def check_per_kind_backend(model, hw, kv_dtype, requested, reasons):
    """Layer kinds with pages of two sizes (Gemma 4) are modelled on the backends whose
    block size and KV cache layout vLLM 0.32.0's own code fixes for them; refuse the
    others, saying why.

    vLLM picks Gemma 4's backend itself when its head sizes differ
    (model_executor/models/config.py Gemma4Config): FlashAttention 4 on compute
    capability 9.x/10.x/11.x where the wheel has it (per layer FA3/FA4 on 9.x with an
    fp8 KV cache), else Triton; the CPU build always runs CPU_ATTN
    (platforms/cpu.py:177-179). Returns the KV cache dtype: auto, not the fp8 that
    allow_fp8 chose, where fp8 is not modelled."""
    model = ModelDescription.of(model)
    heads = model.kind_heads
    if not heads:
        return kv_dtype
    if hw["cpu"]:
        reasons.append(
            "Gemma 4 on vLLM's CPU backend: CPU_ATTN keeps the head-major LBHNC layout "
            "(cpu_attn.py supported_kv_cache_layouts), which is not block-outermost: "
            "where the two layer kinds' pages differ, vLLM unifies them at block size "
            f"{hw['block_size']}.")
        return kv_dtype
    cc = hw["cc"]
    where = f"compute capability {cc[0]}.{cc[1]}"
    if len({h["head_size"] for h in heads.values()}) == 1:
        raise TuneError(
            "the layer kinds differ in KV heads but not in head size, so vLLM keeps its "
            f"default attention backend on {where}, whose block size and KV cache layout "
            "for two page sizes gpufleet has not checked; run vLLM once with "
            "--kv-cache-memory-bytes and read its 'KV cache size' line instead.")
    if cc[0] in (10, 11):
        raise TuneError(
            f"Gemma 4 on {where} (Blackwell data-center GPUs) is not modelled: vLLM runs "
            "it on FlashAttention 4, whose head-size-256 kernel takes 128-token pages "
            "(v1/attention/backends/fa_utils.py FA4_HD256_PAGE_SIZE) unless it falls "
            "back to FlashAttention 2 (for the multimodal prefix among others, "
            "_fa4_hd256_fallback_reason), so the block size depends on the build and "
            "the request mix. Run vLLM once with --kv-cache-memory-bytes and read its "
            "'KV cache size' line instead.")
    if cc[0] == 9 and kv_dtype in FP8_KV_DTYPES and requested in (None, "auto"):
        reasons.append(
            f"kv_cache_dtype auto, not fp8: with an fp8 KV cache on {where} vLLM picks "
            "FlashAttention 3 or 4 per Gemma 4 layer, and FA4's fp8 kernel for head "
            "size 512 takes 64-token pages (flash_attn.py "
            "_get_sm90_fa4_fp8_kv_block_size), which gpufleet does not model.")
        kv_dtype = "auto"
    if cc[0] == 9 and kv_dtype in FP8_KV_DTYPES:
        raise TuneError(
            f"Gemma 4 with kv_cache_dtype {kv_dtype} on {where} is not modelled: vLLM "
            "then picks FlashAttention 3 or 4 per layer (Gemma4Config), and FA4's fp8 "
            "kernel for head size 512 takes 64-token pages (flash_attn.py "
            "_get_sm90_fa4_fp8_kv_block_size). Use kv_cache_dtype auto on this GPU.")
    backend = ("FlashAttention 4 (Triton where the wheel lacks it)" if cc[0] == 9
               else "Triton (FlashAttention 4 needs compute capability 9.x-11.x)")
    reasons.append(
        f"Gemma 4 on {where}: its head sizes differ, so vLLM runs {backend} "
        "(Gemma4Config); both take 16-token blocks here and neither declares a KV cache "
        "layout, so vLLM keeps LBNHC, which is not block-outermost: where the two layer "
        "kinds' pages differ, it unifies them (kv_cache_utils.get_kv_cache_groups).")
    return kv_dtype


def v4_kv_cache_dtype(requested, reasons):
    """DeepSeek-V4's FlashMLA path stores fp8_ds_mla whether --kv-cache-dtype is auto
    or fp8 (_resolve_dsv4_kv_cache_dtype); gpufleet writes fp8 out."""
    requested = requested or "auto"
    try:
        deepseek_v4.resolve_kv_cache_dtype(requested)
    except deepseek_v4.DeepseekV4Error as exc:
        raise TuneError(str(exc)) from None
    reasons.append(f"kv_cache_dtype fp8 ({requested} requested): vLLM stores DeepSeek-V4's "
                   "KV cache as fp8_ds_mla either way (584-byte entries: 448 fp8 NoPE, "
                   "64 bf16 RoPE, 8 scale bytes), so gpufleet writes --kv-cache-dtype fp8.")
    return "fp8"


def check_quantization(model, cc, reasons):
    model = ModelDescription.of(model)
    quant = model.quantization
    if not quant:
        return
    method = quant["method"]
    need = QUANT_MIN_CAPABILITY.get(method)
    if need and cc < need:
        raise TuneError(f"{method} weights need compute capability >= {need[0]}.{need[1]} "
                        f"in vLLM; this GPU has {cc[0]}.{cc[1]}")
    if method == "fp8" and not _has(cc, "fp8"):
        reasons.append(f"fp8 weights on compute capability {cc[0]}.{cc[1]}: vLLM runs them "
                       "weight-only (Marlin), without FP8 compute.")
    else:
        bits = f" {quant['bits']}-bit" if quant.get("bits") else ""
        reasons.append(f"quantization {method}{bits}: read from quantization_config; "
                       "vLLM picks it up without --quantization.")
