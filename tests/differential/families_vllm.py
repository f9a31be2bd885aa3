"""Every family the tuner describes, its KV cache as vLLM itself builds and plans it,
for the tuner's differential check (issue #34 item 4).

Runs INSIDE the lab image (vllm 0.32.0, CPU build; no GPU, no weights):

    docker run --rm --network none -v /work/main:/src:ro --entrypoint python \
        gpufleet/vllm-cpu:lab /src/tests/differential/families_vllm.py [--models a,b]

and prints one JSON document: for one real config.json per family (FAMILIES: the
tuner's model_type -> a folder of tests/fixtures/models), at each tensor-parallel size
of 1/2/4/8 that vLLM accepts, --kv-cache-dtype auto and fp8, two block sizes (16 and
32; MLA families: FlashMLA's forced 64), max_num_batched_tokens 8192 and 2048 and two
max_model_len (the one vLLM serves without --max-model-len and a shorter one),
vLLM's own num_blocks,
maximum concurrency, "KV cache size: N tokens", blocks per request, estimated maximum
model length, bytes per block and KV cache groups, or vLLM's own error. A TP size
vLLM refuses (heads not divisible) is recorded with vLLM's error.

Where the specs come from (vllm 0.32.0, read in the image): the family's OWN vLLM
model class, not a re-implementation.
- ModelConfig(model=the fixture folder) resolves the architecture and config class as
  `vllm serve` does; vllm.model_executor.model_loader.utils.get_model_architecture
  picks the model class (native or Transformers backend) as the model loader does.
- The class is instantiated on the meta device (torch.device("meta"): no weights, no
  memory) under set_current_vllm_config, after a one-process gloo group
  (init_distributed_environment, initialize_model_parallel(1, 1)) whose tensor-parallel
  group then reports the case's size (parallel_state._TP.world_size): every layer
  vLLM builds reads its shard (KV heads per GPU, replication when TP exceeds the KV
  heads) through get_tensor_model_parallel_world_size(), so each rank-0 layer is the
  one the first GPU of a TP-sized engine builds.
- Every module that is an AttentionLayerBase is asked for its spec by its own
  get_kv_cache_spec(vllm_config), as GPUModelRunner.get_kv_cache_spec does. The CPU
  build gives each layer the CPU backend; the layer's attn_backend is replaced by the
  CUDA target's before the call (FlashAttention; FlashMLA for MLA layers, what vLLM
  0.32.0 picks on compute capability 9.x), then vllm/v1/worker/utils.py
  customize_attention_spec with that backend, as the runner does. The layout is
  resolved from that backend (vllm_kv_plan.plan).
- Settings the CPU platform decides otherwise are set to CUDA's (vllm_kv_plan.
  make_config): hybrid KV cache manager on, async scheduling on, chunked prefill,
  the case's block size and max_num_batched_tokens, device type cuda; and
  CacheConfig.sliding_window as EngineArgs sets it (the config's window when
  layer_types is absent or all sliding), which a layer built without a window of its
  own takes (Mistral, Phi-3, the Transformers backend).
- Where the class cannot be built as it is on the CPU build, the closest vLLM-owned
  path, recorded per case (`config_changed`, `device`, `moe_kernel_fallback`):
  multimodal wrappers whose file imports torchvision (absent from the image) build
  the language model their file names (TEXT_MODELS) on their text config, as
  gemma4_vllm.py does; a quantization_config is dropped (MoE layers pick CPU kernels
  while they are built, and there are none for MXFP4 or FP8 blocks; the weights'
  quantization does not reach the KV cache); an unquantized MoE layer without a CPU
  kernel (gpt-oss) gets no kernel class (_moe_kernel_fallback); a model that computes
  a tensor while it is built (Bloom's ALiBi slopes) is built on the CPU device.
- A TP size vLLM refuses is recorded with vLLM's error: VllmConfig's check of the
  attention heads, or the model file's own assertion on the KV heads (llama.py:151,
  155), with its line.
- The arithmetic is vLLM's (vllm_kv_plan.plan): get_kv_cache_groups,
  get_kv_cache_configs, generate_scheduler_kv_cache_config, update_kv_cache_capacity,
  _estimate_max_model_len_from_groups.

Families not run here, and why, are in EXCLUDED (recorded in the output).
"""
from __future__ import annotations

import functools
import importlib
import os
import traceback

import vllm_kv_plan

# The tuner's model_type (gpufleet.model_families KNOWN_MODEL_TYPES) -> the real config.json
# folder under tests/fixtures/models that this script builds.
FAMILIES = {
    "bloom": "bloomz-560m", "chatglm": "chatglm3-6b", "cohere": "c4ai-command-r-v01",
    "cohere2": "tiny-aya-global", "deepseek_v2": "deepseek-v2-lite",
    "deepseek_v3": "deepseek-v3", "ernie4_5_moe": "ernie-4.5-21b-a3b-thinking",
    "exaone4": "exaone-4.0-32b",
    "exaone4_5_text": "exaone-4.5-33b", "falcon": "falcon-7b-instruct",
    "gemma": "gemma-7b", "gemma2": "gemma-2-9b-it", "gemma3_text": "gemma-3-1b-it",
    "glm4_moe": "glm-4.5", "gpt2": "gpt2", "gpt_bigcode": "starcoderbase-7b",
    "gpt_neox": "redpajama-incite-7b-base", "gpt_oss": "gpt-oss-20b", "gptj": "gpt-j-6b",
    "granite": "granite-3.0-8b-instruct",
    "kimi_k2": "kimi-k2-instruct", "llama": "llama-3.1-8b",
    "minimax_m2": "minimax-m2.5", "ministral3": "devstral-small-2-24b-instruct",
    "mistral": "mistral-7b-instruct-v0.1", "mixtral": "mixtral-8x7b-v0.1",
"olmo2": "olmo-2-1124-7b-instruct",
    "olmo3": "olmo-3.1-32b-instruct", "olmoe": "olmoe-1b-7b-0125-instruct",
    "opt": "opt-125m", "phi": "phi-1", "phi3": "phi-3-medium-4k-instruct",
    "phimoe": "phi-3.5-moe-instruct", "qwen2": "qwen2.5-7b-instruct",
    "qwen2_5_vl": "qwen2.5-vl-7b-instruct", "qwen2_moe": "qwen2-57b-a14b",
    "qwen2_vl": "qwen2-vl-7b-instruct", "qwen3": "qwen3-8b",
    "qwen3_moe": "qwen3-30b-a3b", "qwen3_vl_moe_text": "qwen3-vl-30b-a3b-instruct",
    "qwen3_vl_text": "qwen3-vl-8b-instruct", "smollm3": "smollm3-3b",
    "stablelm": "stablelm-3b-4e1t", "starcoder2": "starcoder2-7b",
}
# Families of the tuner's table not run by this script, with the reason.
EXCLUDED = {
    "deepseek_v4": "its own script: tests/differential/deepseek_v4_vllm.py "
                   "(tests/fixtures/vllm-kv/deepseek-v4.json)",
    "gemma4_text": "its own script: tests/differential/gemma4_vllm.py "
                   "(tests/fixtures/vllm-kv/gemma-4.json); its multimodal class cannot "
                   "be inspected on the CPU image (Gemma4Processor imports torchvision)",
    "exaone": "its config class is the checkpoint's remote code (auto_map "
              "configuration_exaone.py, --trust-remote-code), which the fixture does not "
              "hold and the image cannot fetch (--network none)",
    "muse_glimmer_text": "vLLM's muse_glimmer.py, which holds the language model too "
                         "(registry.py:182, 537: MuseGlimmerForCausalLM for both "
                         "names), imports its processor and vision code, which need "
                         "torchvision, absent from the CPU image: the class cannot be "
                         "inspected (tests/unit/test_model_families.py reads it by hand)",
    "internlm2": "its config class is the checkpoint's remote code (auto_map "
                 "configuration_internlm2.py, --trust-remote-code), which the fixture "
                 "does not hold and the image cannot fetch (--network none)",
    "granitemoehybrid": "no real all-attention config.json in tests/fixtures/models",
    "lfm2": "no real all-attention config.json in tests/fixtures/models",
    "lfm2_moe": "no real all-attention config.json in tests/fixtures/models",
}
# Encoder-only pooling families keep no KV cache (Attention.get_kv_cache_spec returns
# None for ENCODER_ONLY layers); the tuner's layout for them has no groups. Not run.
ENCODER_ONLY = "encoder-only pooling model: no KV cache in vLLM (Attention." \
               "get_kv_cache_spec returns None for ENCODER_ONLY), none in the tuner"
TPS = (1, 2, 4, 8)
KV_DTYPES = ("auto", "fp8")
BLOCK_SIZES = (16, 32)
MLA_BLOCK_SIZE = 64  # FlashMLA's (gpufleet.tune MLA_BLOCK_SIZE[9])
MNBTS = (8192, 2048)
SHORT_LEN = 4097
BACKENDS = {"attention": "vllm.v1.attention.backends.flash_attn:FlashAttentionBackend",
            "mla": "vllm.v1.attention.backends.mla.flashmla:FlashMLABackend"}
_DIST = []
_STUBBED = []


def _moe_kernel_fallback():
    """The CPU build has no MoE kernel for some unquantized expert layers (gpt-oss's
    biased SwiGLU: "No Unquantized MoE backend supports the deployment
    configuration"); the choice of kernel does not reach the attention layers, so on
    that error the expert layer is built with the out-of-tree backend and no kernel
    class, and the family records `moe_kernel_fallback`."""
    from vllm.model_executor.layers.fused_moe import unquantized_fused_moe_method as ufm
    from vllm.model_executor.layers.fused_moe.oracle import unquantized as oracle
    original = oracle.select_unquantized_moe_backend

    def select(moe_config):
        try:
            return original(moe_config)
        except NotImplementedError:
            _STUBBED.append(True)
            return oracle.UnquantizedMoeBackend.OOT, None
    ufm.select_unquantized_moe_backend = select


def _backend(path):
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def _init_dist(vc):
    """One gloo process group, once; its TP group's size is set per case."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state as ps
    with set_current_vllm_config(vc):
        if not _DIST:
            _moe_kernel_fallback()
            ps.init_distributed_environment(
                world_size=1, rank=0, local_rank=0, backend="gloo",
                distributed_init_method="tcp://127.0.0.1:29517")
            _DIST.append(ps)
        # per model: initialize_model_parallel creates the expert-parallel group only
        # for a MoE model_config
        ps.destroy_model_parallel()
        ps.initialize_model_parallel(1, 1)
    return ps


# Multimodal wrappers whose class the CPU image cannot import (their vision
# processors import torchvision, which it lacks): the language model each one builds,
# as its vLLM 0.32.0 file names it. Like tests/differential/gemma4_vllm.py, the script
# gives ModelConfig the wrapper's text config (transformers' get_text_config()) as a
# config.json of its own with that architecture; the vision towers keep no KV cache.
TEXT_MODELS = {
    "qwen2_vl": ("Qwen2ForCausalLM", "qwen2_vl.py:1422-1425"),
    "qwen2_5_vl": ("Qwen2ForCausalLM", "qwen2_5_vl.py:1444-1447"),
    # Qwen3LLMForCausalLM: Qwen3ForCausalLM whose model also takes deepstack inputs
    "qwen3_vl_text": ("Qwen3ForCausalLM", "qwen3_vl.py:2043-2046"),
    "qwen3_vl_moe_text": ("Qwen3MoeForCausalLM", "qwen3_vl_moe.py:285-288"),
    "exaone4_5_text": ("Exaone4ForCausalLM", "exaone4_5.py:353-357"),
    # mistral3.py:485-488 builds config.text_config by its own model_type
    "ministral3": ("Ministral3ForCausalLM", "mistral3.py:485-488"),
}


@functools.lru_cache(maxsize=None)
def model_folder(model_dir):
    """(folder ModelConfig reads, what was changed): the fixture folder itself, or a
    temporary one whose config.json
    - is the wrapper's text config with the language model's architecture
      (TEXT_MODELS), and/or
    - has no quantization_config: a quantized MoE layer picks its kernels while it is
      built and the CPU build has none for most methods ("No MXFP4 MoE backend
      supports the deployment configuration"); the weights' quantization does not
      reach the attention layers' KV cache specs (the KV cache dtype is the case's
      own)."""
    import json
    import shutil
    import tempfile
    family = next(k for k, v in FAMILIES.items() if model_dir.endswith("/" + v))
    with open(os.path.join(model_dir, "config.json")) as handle:
        cfg = json.load(handle)
    changed = []
    if family in TEXT_MODELS:
        from transformers import AutoConfig
        arch, where = TEXT_MODELS[family]
        text = AutoConfig.from_pretrained(model_dir).get_text_config().to_dict()
        # the wrapper keeps tie_word_embeddings (its lm_head, not the KV cache) at the
        # top level; Qwen2ForCausalLM reads it from the config it is given
        text.setdefault("tie_word_embeddings", cfg.get("tie_word_embeddings", False))
        cfg = dict(text, architectures=[arch])
        changed.append(f"text config as {arch} ({where})")
    for key in ("quantization_config", "compression_config"):
        if key in cfg:
            del cfg[key]
            changed.append(f"{key} removed")
    if not changed:
        return model_dir, ()
    folder = tempfile.mkdtemp(prefix=f"{family}-")
    for name in os.listdir(model_dir):
        if name != "config.json" and os.path.isfile(os.path.join(model_dir, name)):
            shutil.copy(os.path.join(model_dir, name), folder)
    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump(cfg, handle)
    return folder, tuple(changed)


def build_layers(model_dir, tp, kv_dtype):
    """The family's vLLM model class on the meta device at this TP size: its
    attention layers (name -> module) and the config it was built with."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.model_loader.utils import get_model_architecture

    vc = vllm_kv_plan.make_config(model_dir, 1, 16, kv_dtype, None)
    ps = _init_dist(vc)
    vc.parallel_config.tensor_parallel_size = tp
    ps._TP.world_size = tp
    with set_current_vllm_config(vc):
        cls, _ = get_model_architecture(vc.model_config)
        try:
            with torch.device("meta"):
                model = cls(vllm_config=vc, prefix="")
            device = "meta"
        except NotImplementedError as exc:
            if "meta tensor" not in str(exc):
                raise
            # a layer that computes a tensor from another while it is built (Bloom's
            # ALiBi slopes: "Cannot copy out of meta tensor"): build it on the CPU,
            # fresh config (the meta build registered the first layers' names)
            vc = vllm_kv_plan.make_config(model_dir, 1, 16, kv_dtype, None)
            vc.parallel_config.tensor_parallel_size = tp
            with set_current_vllm_config(vc), torch.device("cpu"):
                model = cls(vllm_config=vc, prefix="")
            device = "cpu"
    layers = {name: mod for name, mod in model.named_modules()
              if isinstance(mod, AttentionLayerBase)}
    return cls.__name__, layers, device


def specs_for(vc, layers):
    """Each layer's own get_kv_cache_spec on the target backend (see the docstring)."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.worker.utils import customize_attention_spec
    specs, backends = {}, set()
    with set_current_vllm_config(vc):
        for name, layer in layers.items():
            is_mla = layer.get_attn_backend().is_mla() or "MLA" in type(layer).__name__
            backend = _backend(BACKENDS["mla" if is_mla else "attention"])
            layer.attn_backend = backend
            spec = layer.get_kv_cache_spec(vc)
            if spec is None:
                continue
            specs[name] = customize_attention_spec(backend, spec)
            backends.add(backend)
    return specs, backends


def tp_error(model_dir, tp):
    """vLLM's own refusal of this TP size, or None."""
    try:
        vllm_kv_plan.make_config(model_dir, tp, 16, "auto", None)
    except Exception as exc:  # noqa: BLE001 - vLLM's own message is the record
        return f"{type(exc).__name__}: {exc}"
    return None


def cases(model_dir, derived):
    """All cases of one family; a build that fails is recorded as build_error."""
    import sys
    import time
    started = time.time()
    try:
        return _cases(model_dir, derived)
    except Exception as exc:  # noqa: BLE001 - recorded, the other families go on
        return [{"build_error": f"{type(exc).__name__}: {exc}"[:2000],
                 "traceback": traceback.format_exc()[-3000:]}]
    finally:
        print(f"{os.path.basename(model_dir)}: {time.time() - started:.1f} s",
              file=sys.stderr, flush=True)


def _cases(model_dir, derived):
    out = []
    _STUBBED.clear()
    model_dir, changed = model_folder(model_dir)
    if derived is None:  # ModelConfig failed: raise its error here, to record it
        vllm_kv_plan.make_config(model_dir, 1, 16, "auto", None)
    short = SHORT_LEN if SHORT_LEN < derived else derived // 2 + 1
    for tp in TPS:
        refused = tp_error(model_dir, tp)
        if refused:
            out.append({"tp": tp, "block_size": 16, "kv_cache_dtype": "auto",
                        "max_model_len": derived, "error": refused})
            continue
        for kv_dtype in KV_DTYPES:
            try:
                cls_name, layers, device = build_layers(model_dir, tp, kv_dtype)
            except AssertionError as exc:
                # the model file's own check of this TP size (llama.py:151, 155: KV
                # heads against TP; divide()), recorded as vLLM's refusal with the
                # failing line
                frame = traceback.extract_tb(exc.__traceback__)[-1]
                out.append({"tp": tp, "block_size": 16, "kv_cache_dtype": kv_dtype,
                            "max_model_len": derived, "error":
                            f"AssertionError at {os.path.basename(frame.filename)}:"
                            f"{frame.lineno}: {frame.line} {exc}".strip()})
                continue
            mla = any("MLA" in type(x).__name__ for x in layers.values())
            for block in ((MLA_BLOCK_SIZE,) if mla else BLOCK_SIZES):
                for mnbt in MNBTS:
                    for length in (None, short):
                        vc = vllm_kv_plan.make_config(
                            model_dir, tp, block, kv_dtype, length,
                            max_num_batched_tokens=mnbt, max_num_seqs=256)
                        specs, backends = specs_for(vc, layers)
                        case = {"tp": tp, "block_size": block, "kv_cache_dtype": kv_dtype,
                                "available_bytes": vllm_kv_plan.AVAILABLE[tp],
                                "max_model_len": vc.model_config.max_model_len,
                                "async_scheduling": True, "max_num_batched_tokens": mnbt,
                                "model_class": cls_name, "device": device,
                                "backend": sorted(b.get_name() for b in backends),
                                "attention_layers": len(specs)}
                        if _STUBBED:
                            case["moe_kernel_fallback"] = True
                        if changed:
                            case["config_changed"] = list(changed)
                        out.append(vllm_kv_plan.plan(vc, specs, sorted(
                            backends, key=lambda b: b.get_name()),
                            vllm_kv_plan.AVAILABLE[tp], derived, case))
    return out


def derived_max_len(model_dir):
    """The max_model_len vLLM derives from the config, or None when ModelConfig
    refuses it (cases() then records the error)."""
    try:
        return vllm_kv_plan.make_config(model_folder(model_dir)[0], 1, 16, "auto",
                                        None).model_config.max_model_len
    except Exception:  # noqa: BLE001 - recorded by cases()
        return None


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    vllm_kv_plan.main(
        __doc__, FAMILIES, derived_max_len,
        cases, header={"excluded": EXCLUDED, "encoder_only": ENCODER_ONLY,
                       "families": {k: v for k, v in FAMILIES.items()}})
