"""Speculative decoding as vLLM 0.32.0 sizes it (issue #34 item 2): what
`--speculative-config` (and --spec-method / --spec-model / --spec-tokens) in a model's
extra_args does to the KV pool, the blocks a request holds and the weights per GPU.

Plain data in, plain data out; no Ansible imports. gpufleet.tune calls read() on the
extra_args, then apply() with the model description (and, for EAGLE, the draft's
description from describe_draft()); it plans the model apply() returns.

What vLLM 0.32.0 does (read in the lab image gpufleet/vllm-cpu:lab; paths under vllm/):

- engine/arg_utils.py create_speculative_config: --spec-method, --spec-model and
  --spec-tokens are the keys method, model and num_speculative_tokens of the same
  dict (each "mutually exclusive" with that key in --speculative-config); the dict's
  '-' become '_' and it goes to SpeculativeConfig.
- config/speculative.py SpeculativeConfig.__post_init__: a method in MTPModelTypes
  other than "mtp" (deepseek_mtp, ...) is a deprecated alias of "mtp"; no method with
  model "ngram" is ngram, with another model draft_model (later guessed from the
  draft's name: eagle, eagle3, dflash, ...). gpufleet does not guess: a draft model
  without a method is refused.
- The drafter's attention layers are in the same forward context as the target's, so
  GPUModelRunner.get_kv_cache_spec gives each a spec and they share the one KV pool
  (v1/worker/gpu_model_runner.py). EAGLE / EAGLE-3 (model_executor/models/
  llama_eagle3.py, llama_eagle.py): the draft config's num_hidden_layers decoder layers,
  numbered after the target's, with the draft's heads, KV heads and head size, sharded
  over the draft's tensor-parallel size (the target's unless draft_tensor_parallel_size
  says 1: _verify_and_get_draft_tp), in the target's dtype. MTP on DeepSeek-V4
  (models/deepseek_v4/nvidia/mtp.py): num_nextn_predict_layers decoder layers numbered
  from num_hidden_layers, and attention.py:232-235 gives such a layer compress ratio 1:
  each keeps one sliding-window cache and nothing else.
- v1/core/kv_cache_utils.py get_kv_cache_configs: the blocks a request holds at start
  are each spec's max_memory_usage_bytes (full attention: cdiv(max_model_len, block));
  num_lookahead_tokens (the speculative tokens, config/vllm.py) are added per step by
  the scheduler's allocate_slots, not to the startup footprint. SlidingWindowSpec keeps
  extra_retained_tokens = num_prefill_lookahead_tokens - 1 more, which is 0 unless MTP
  runs several modules (use_multi_module_mtp: min(num_nextn_predict_layers,
  num_speculative_tokens) > 1), refused here.
- config/vllm.py VllmConfig.__post_init__: async scheduling stays on for the EAGLE
  family (EagleModelTypes: eagle, eagle3, mtp, ...), ngram_gpu, draft_model, dspark and
  dflash, and is switched off for the others (ngram, suffix, medusa, ...); with
  --async-scheduling given it is an error. The tokens a sliding-window group reserves
  for work in flight follow (gpufleet.kv_memory.in_flight_tokens).
- Weights: an EAGLE drafter loads its own checkpoint (its embed_tokens and lm_head are
  the target's when the checkpoint has none: v1/spec_decode/llm_base_proposer.py
  _maybe_share_embeddings / _maybe_share_lm_head), so its bytes are the draft folder's
  safetensors (an over-estimate where the checkpoint holds an embedding identical to
  the target's, which vLLM shares); DeepSeek-V4's MTP layer is in the target's
  checkpoint (mtp.* tensors), which gpufleet already counts whole.

tests/differential/spec_vllm.py runs vLLM's own functions for Llama-3.1-8B + EAGLE-3
and DeepSeek-V4 + MTP at TP 1/2/4/8; tests/unit/test_tune_speculative.py requires
gpufleet's numbers to equal them.
"""
from __future__ import annotations

import json
import os

from .model_description import ModelDescription

__all__ = ["SpeculativeError", "CPU_METHODS", "DRAFT_METHODS", "FLAGS", "cpu_refusal", "read", "describe_draft", "apply",
           "with_draft"]

FLAGS = ("--speculative-config", "-sc", "--spec-method", "--spec-model", "--spec-tokens")
_DOTTED = ("--speculative-config.", "-sc.")
_SPLIT = {"--spec-method": "method", "--spec-model": "model",
          "--spec-tokens": "num_speculative_tokens"}
# config/speculative.py MTPModelTypes: deprecated aliases of "mtp"
MTP_ALIASES = (
    "deepseek_mtp", "dots3_note_mtp", "mimo_mtp", "mimo_v2_mtp", "glm4_moe_mtp",
    "glm4_moe_lite_mtp", "glm_ocr_mtp", "ernie_mtp", "nemotron_h_mtp", "exaone_moe_mtp",
    "exaone4_5_mtp", "qwen3_next_mtp", "qwen4_exp_mtp", "qwen3_5_mtp", "longcat_flash_mtp",
    "bailing_hybrid_v3_mtp", "minimax_m3_mtp", "bailing_hybrid_mtp", "kimi_k3_mtp",
    "pangu_ultra_moe_mtp", "step3p5_mtp", "hy_v3_mtp", "hy_v4_mtp", "gemma4_mtp",
    "inkling_mtp", "glm5_next_mtp")
# Methods vLLM 0.32.0 accepts that gpufleet does not model, and why.
REFUSED_METHODS = {
    "draft_model": ("a separate draft model has its own layers, KV heads and weights, "
                    "which gpufleet has not checked against vLLM"),
    "medusa": "Medusa heads are not modelled",
    "mlp_speculator": "MLP speculators are not modelled",
    "ngram_gpu": ("its GPU token buffers of max_num_seqs x max_model_len "
                  "(v1/spec_decode/ngram_proposer_gpu.py) are not in the plan"),
    "suffix": "suffix decoding (Arctic Inference) is not modelled",
    "dflash": "DFlash drafters are not modelled",
    "dspark": "DSpark drafters are not modelled",
    "custom_class": "a custom proposer class runs code whose memory the plan cannot know",
    "extract_hidden_states": "extract_hidden_states is not modelled",
}
# vLLM keeps async scheduling for these (config/vllm.py: EagleModelTypes, NgramGPUTypes,
# draft_model, dspark, dflash); gpufleet plans eagle, eagle3, mtp and ngram only.
KEEPS_ASYNC = ("eagle", "eagle3", "mtp")
# The methods planned on vLLM's CPU backend (vllm_server_gpu_runtime none, the lab): each
# was started on the lab's CPU build (vllm-cpu 0.32.0, gpufleet/vllm-cpu:lab) and its
# logged KV cache compared with the plan (tests/slow/test_tune_speculative_cpu.py).
# n-gram prompt lookup adds no layer and no weight, and the CPU platform runs without
# async scheduling anyway, so the CPU plan is the plan without it.
CPU_METHODS = ("ngram", "eagle3")
# The methods whose draft is a checkpoint of its own (a folder: the model entry's
# speculative_model_path, which the plan reads and roles/vllm_server mounts).
DRAFT_METHODS = ("eagle", "eagle3")
# --speculative-config keys that do not change what the plan computes (the method and
# its draft, the count of speculative tokens, the draft's own context limit, n-gram
# window sizes, revisions); any other key is refused by name.
READ_KEYS = ("method", "model", "num_speculative_tokens", "draft_tensor_parallel_size",
             "max_model_len", "prompt_lookup_min", "prompt_lookup_max", "revision",
             "code_revision")


def cpu_refusal(method):
    """Why `method` is not planned on vLLM's CPU backend (one sentence)."""
    return (f"speculative decoding {method} on vLLM's CPU backend is not modelled: "
            f"gpufleet plans {', '.join(CPU_METHODS)} there, the method(s) checked "
            "against the lab's CPU build (docs/tuning.md, \"Speculative decoding\")")


class SpeculativeError(ValueError):
    """A speculative decoding setting gpufleet does not model (says which and why)."""


def _value(args, i):
    arg = args[i]
    if "=" in arg:
        return arg.split("=", 1)[1]
    if i + 1 >= len(args):
        raise SpeculativeError(f"extra_args ends with {arg}, which takes a value")
    return args[i + 1]


def read(extra_args):
    """The speculative configuration extra_args asks vLLM for, as vLLM builds its dict
    (create_speculative_config), or None: {"method", "model", "num_speculative_tokens",
    "draft_tensor_parallel_size", ...}. Raises SpeculativeError for what vLLM would
    refuse or gpufleet does not read."""
    args = [str(a) for a in extra_args or ()]
    config, split, seen = None, {}, []
    for i, arg in enumerate(args):
        flag = arg.split("=", 1)[0]
        if flag.startswith(_DOTTED):
            raise SpeculativeError(
                f"extra_args holds {flag}: give --speculative-config as one JSON object "
                "(gpufleet reads that form only)")
        if flag not in FLAGS:
            continue
        if flag in seen:
            raise SpeculativeError(f"extra_args holds {flag} twice: vLLM takes the last one; "
                                   "say it once")
        seen.append(flag)
        text = _value(args, i)
        if flag in _SPLIT:
            split[_SPLIT[flag]] = text
            continue
        if "--speculative-config" in seen and "-sc" in seen:
            raise SpeculativeError("extra_args holds both --speculative-config and -sc; "
                                   "say it once")
        try:
            config = json.loads(text)
        except ValueError:
            raise SpeculativeError(f"{flag} {text!r:.120} is not a JSON object") from None
        if not isinstance(config, dict):
            raise SpeculativeError(f"{flag} {text!r:.120} is not a JSON object")
    if config is None and not split:
        return None
    try:
        return _resolve(config, split)
    except SpeculativeError as exc:
        raise SpeculativeError(f"extra_args {' / '.join(seen)}: {exc}") from None


def _resolve(config, split):
    """read() after the flags are parsed: the dict vLLM builds, checked."""
    config = {str(k).replace("-", "_"): v for k, v in (config or {}).items()}
    for key, value in split.items():
        if key in config:
            flag = next(f for f, k in _SPLIT.items() if k == key)
            raise SpeculativeError(f"{flag} and --speculative-config['{key}'] are mutually "
                                   "exclusive (vLLM create_speculative_config)")
        config[key] = value
    other = sorted(k for k in config if k not in READ_KEYS)
    if other:
        raise SpeculativeError(
            f"--speculative-config key {other[0]} is not modelled: gpufleet reads "
            f"{', '.join(READ_KEYS)} only, which do not change the memory it plans")
    tokens = config.get("num_speculative_tokens")
    if tokens is not None:
        try:
            ok = not isinstance(tokens, bool) and int(str(tokens)) >= 1
        except ValueError:
            ok = False
        if not ok:
            raise SpeculativeError(f"num_speculative_tokens {tokens!r} must be an integer "
                                   ">= 1")
        config["num_speculative_tokens"] = int(str(tokens))
    config["method"] = _method(config)
    if config["method"] in REFUSED_METHODS:
        raise SpeculativeError(
            f"speculative decoding method {config['method']} is not modelled: "
            f"{REFUSED_METHODS[config['method']]}. gpufleet models eagle, eagle3, mtp "
            "(DeepSeek-V4) and ngram.")
    if config.get("num_speculative_tokens") is None:
        raise SpeculativeError(f"method {config['method']}: num_speculative_tokens is not "
                               "set (vLLM needs it here too)")
    return config


def _method(config):
    method = config.get("method")
    model = config.get("model")
    if method is None:
        if model in ("ngram", "[ngram]"):
            return "ngram"
        if model is not None:
            raise SpeculativeError(
                f"--speculative-config names the draft {model!r} without a method: vLLM "
                "guesses it from the name (eagle, eagle3, dflash, else draft_model); "
                "gpufleet does not. Add \"method\": \"eagle3\" (or eagle, mtp, ngram).")
        raise SpeculativeError("--speculative-config has neither method nor model")
    method = str(method)
    if method == "[ngram]":
        return "ngram"
    if method in MTP_ALIASES:
        return "mtp"
    if method in KEEPS_ASYNC or method == "ngram" or method in REFUSED_METHODS:
        return method
    raise SpeculativeError(f"speculative decoding method {method!r} is not one of vLLM "
                           "0.32.0's")


def describe_draft(path, weights_bytes=None):
    """The fields of an EAGLE draft's config.json (in the folder `path`) that size its
    KV cache and weights: {"layers", "num_attention_heads", "num_kv_heads", "head_size",
    "weights_bytes", "architectures", "source"}. Weight bytes from the folder's
    safetensors unless `weights_bytes` is given."""
    from . import model as model_mod

    if not os.path.isdir(str(path)):
        raise SpeculativeError(
            f"speculative_model_path {path} is not a folder on this host: fetch the draft "
            "there first (a model_fetch_models entry with the draft's repo_id and that "
            "dest) or correct the path")
    config_path = os.path.join(str(path), "config.json")
    try:
        with open(config_path, encoding="utf-8") as handle:
            cfg = json.load(handle)
    except (OSError, ValueError) as exc:
        raise SpeculativeError(f"{config_path}: cannot read the draft's config ({exc})") \
            from None
    if not isinstance(cfg, dict):
        raise SpeculativeError(f"{config_path} is not a JSON object")
    if weights_bytes is None:
        try:
            weights_bytes = model_mod.weights_from_dir(str(path))["bytes"]
        except (model_mod.ModelError, OSError) as exc:
            raise SpeculativeError(f"the draft's weights: {exc}") from None
    return describe_draft_config(cfg, weights_bytes, source=config_path)


def describe_draft_config(cfg, weights_bytes, source="the draft's config.json"):
    """describe_draft for a parsed config.json."""
    def positive(field, value):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpeculativeError(f"{source}: {field} is {value!r}; an integer >= 1 is "
                                   "needed to size the draft's KV cache")
        return value

    layers = positive("num_hidden_layers", cfg.get("num_hidden_layers"))
    heads = positive("num_attention_heads", cfg.get("num_attention_heads"))
    kv = cfg.get("num_key_value_heads")
    kv = heads if kv is None else positive("num_key_value_heads", kv)
    head = cfg.get("head_dim")
    if head is None:
        head = positive("hidden_size", cfg.get("hidden_size")) // heads
    head = positive("head_dim", head)
    kinds = cfg.get("layer_types")
    if kinds and any(k != "full_attention" for k in kinds):
        raise SpeculativeError(f"{source}: layer_types has {sorted(set(kinds))}: a draft "
                               "with sliding-window layers is not modelled")
    if cfg.get("kv_lora_rank"):
        raise SpeculativeError(f"{source}: an MLA draft (kv_lora_rank) is not modelled")
    if weights_bytes is None or isinstance(weights_bytes, bool) or int(weights_bytes) < 0:
        raise SpeculativeError(f"the draft's weight bytes are {weights_bytes!r}")
    return {"layers": layers, "num_attention_heads": heads, "num_kv_heads": kv,
            "head_size": head, "weights_bytes": int(weights_bytes),
            "architectures": list(cfg.get("architectures") or []), "source": source}


def _kv_heads_per_gpu(kv, tp):
    return max(1, kv // tp)  # ModelConfig.get_num_kv_heads


def apply(model, spec, tp, draft=None):
    """What `spec` (read()) changes for `model` at tensor-parallel size tp.

    Returns {"model": the description to plan (the drafter's KV layers added),
    "draft_weights_bytes": bytes the drafter adds to the checkpoint's (all GPUs
    together), "async_scheduling": False where vLLM switches it off, else None,
    "summary": what the plan reports, "reason": one sentence}. Raises SpeculativeError
    for what is not modelled, naming it."""
    model = ModelDescription.of(model)
    method, tokens = spec["method"], spec["num_speculative_tokens"]
    if model.kind == "pooling":
        raise SpeculativeError("speculative decoding is for generative models; this one is "
                               "planned as a pooling model")
    draft_tp = spec.get("draft_tensor_parallel_size")
    if draft_tp is not None and str(draft_tp) != str(tp):
        raise SpeculativeError(
            f"draft_tensor_parallel_size {draft_tp} is not modelled: gpufleet plans the "
            f"drafter on the target's tensor-parallel size ({tp}); leave it out")
    summary = {"method": method, "num_speculative_tokens": tokens, "draft_layers": 0}
    if method == "ngram":
        summary["async_scheduling"] = False
        return {"model": model, "draft_weights_bytes": 0, "async_scheduling": False,
                "summary": summary,
                "reason": (f"speculative decoding ngram ({tokens} tokens): prompt lookup on "
                           "the CPU, no draft layers or weights; vLLM switches async "
                           "scheduling off for it (VllmConfig.__post_init__).")}
    if method == "mtp":
        return _apply_mtp(model, spec, summary)
    return _apply_eagle(model, spec, tp, draft, summary)


def _apply_mtp(model, spec, summary):
    tokens = spec["num_speculative_tokens"]
    if model.attention != "deepseek_v4":
        raise SpeculativeError(
            f"speculative decoding mtp is modelled for DeepSeek-V4 only; this model's "
            f"attention is {model.attention} (model_type {model.model_type!r}), "
            "whose MTP layers gpufleet has not checked against vLLM")
    if spec.get("model") is not None:
        raise SpeculativeError("method mtp with a separate model is not modelled: the MTP "
                               "layers come from the target's own checkpoint; leave "
                               "\"model\" out")
    n_predict = model.num_nextn_predict_layers
    if not n_predict:
        raise SpeculativeError("method mtp: config.json has no num_nextn_predict_layers, "
                               "so the checkpoint has no MTP layer")
    if min(n_predict, tokens) > 1:
        raise SpeculativeError(
            f"method mtp with {n_predict} MTP layers and {tokens} speculative tokens runs "
            "several modules (use_multi_module_mtp), whose sliding-window caches keep "
            "extra tokens (extra_retained_tokens); not modelled")
    v4 = dict(model.deepseek_v4)
    # attention.py:232-235: a layer at or past num_hidden_layers has compress ratio 1
    v4["compress_ratios"] = list(v4["compress_ratios"]) + [1] * n_predict
    planned = model.replace(deepseek_v4=v4)
    summary.update(draft_layers=n_predict, async_scheduling=True)
    return {"model": planned, "draft_weights_bytes": 0, "async_scheduling": None,
            "summary": summary,
            "reason": (f"speculative decoding mtp ({tokens} token(s)): DeepSeek-V4's "
                       f"{n_predict} MTP layer(s) each keep one sliding-window cache in the "
                       "same pool (compress ratio 1 past num_hidden_layers); their weights "
                       "are in the checkpoint, already counted; async scheduling stays on.")}


def _apply_eagle(model, spec, tp, draft, summary):
    method, tokens = spec["method"], spec["num_speculative_tokens"]
    if spec.get("model") in (None, ""):
        raise SpeculativeError(f"method {method} needs the draft's \"model\"")
    if draft is None:
        raise SpeculativeError(
            f"speculative decoding {method} with the draft {spec['model']!r} has no draft "
            "folder: gpufleet needs the draft's config.json and weights to size its layers "
            "and vLLM needs them in the container. Give the model entry's "
            "speculative_model_path (the draft's folder on the host, e.g. where "
            "model_fetch fetched its repo_id): the plan reads it and vllm_server mounts it")
    kinds = set(model.layer_kinds or [])
    if model.attention not in ("mha", "mqa", "gqa") or kinds - {"full"} \
            or model.kind_heads:
        raise SpeculativeError(
            f"speculative decoding {method} is modelled for targets whose layers are all "
            f"standard full attention (Llama, Qwen, Mistral ...); this one's are "
            f"{model.attention}: the draft's layers would make a KV cache group of "
            "their own, which gpufleet has not checked")
    if draft["num_attention_heads"] % tp:
        raise SpeculativeError(
            f"the draft's attention heads ({draft['num_attention_heads']}) are not "
            f"divisible by tensor parallel size {tp}")
    target = (_kv_heads_per_gpu(model.num_kv_heads, tp), model.head_size)
    ours = (_kv_heads_per_gpu(draft["num_kv_heads"], tp), draft["head_size"])
    if target != ours:
        raise SpeculativeError(
            f"the draft's KV page ({ours[0]} KV heads of {ours[1]} per GPU) differs from "
            f"the target's ({target[0]} of {target[1]}): vLLM would unify pages of two "
            "sizes, which gpufleet does not model for a drafter")
    layers = draft["layers"]
    planned = model.replace(num_layers=model.num_layers + layers,
                            layer_kinds=model.layer_kinds + ("full",) * layers)
    summary.update(draft_layers=layers, async_scheduling=True,
                   draft_weights_bytes=draft["weights_bytes"])
    return {"model": planned, "draft_weights_bytes": draft["weights_bytes"],
            "async_scheduling": None, "summary": summary,
            "reason": (f"speculative decoding {method} ({tokens} tokens): the draft's "
                       f"{layers} layer(s) of {ours[0]} KV heads x {ours[1]} per GPU join "
                       f"the target's {model.num_layers} in one KV cache group "
                       f"({model.num_layers + layers} layers per block); its "
                       f"{draft['weights_bytes'] / 1024 ** 3:.2f} GiB of weights "
                       f"({draft['source']}) are spread over the {tp} GPU(s); vLLM "
                       "keeps async scheduling for it where the platform runs it (not on "
                       "the CPU).")}


def with_draft(args, container_path):
    """args with the draft of their --speculative-config (or --spec-model) named by its
    path in the container, container_path: what vLLM loads is the folder the role mounts
    there (roles/vllm_server: serve.draft_mount), whatever the model entry's config
    called it (a hub name, a path on the host). Everything else is kept as written.
    Raises SpeculativeError when args ask for no method with a separate draft."""
    args = [str(a) for a in args or ()]
    spec = read(args)
    if spec is None or spec["method"] not in DRAFT_METHODS:
        what = "no --speculative-config" if spec is None else f"method {spec['method']}"
        raise SpeculativeError(
            f"speculative_model_path is set but extra_args holds {what}: a draft folder is "
            f"for the methods {', '.join(DRAFT_METHODS)}, whose --speculative-config names "
            "the draft; leave speculative_model_path out or give such a config")
    out = list(args)
    # the draft is named once: by --spec-model where given (vLLM refuses it beside the
    # config's own "model"), else by the config's "model"
    named_by = ("--spec-model",) if any(a.partition("=")[0] == "--spec-model" for a in args) \
        else ("--speculative-config", "-sc")
    for i, arg in enumerate(args):
        flag, eq, inline = arg.partition("=")
        if flag not in named_by:
            continue
        if flag == "--spec-model":
            value = container_path
        else:
            config = json.loads(inline if eq else args[i + 1])
            config["model"] = container_path
            value = json.dumps(config)
        if eq:
            out[i] = f"{flag}={value}"
        else:
            out[i + 1] = value
    return out
