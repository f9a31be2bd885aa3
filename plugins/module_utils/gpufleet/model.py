"""Describe a model for the vLLM tuner from its folder or its config.json.

Plain data in, plain data out; no Ansible imports. Nothing here loads a tensor:
weight bytes come from safetensors headers (an 8-byte little-endian header length,
then a JSON header whose `data_offsets` give each tensor's byte range) or from
`model.safetensors.index.json` (`metadata.total_size`).

The field rules follow vLLM's ModelConfig (vllm/config/model.py, get_num_kv_heads /
get_head_size / get_total_num_kv_heads) and the KV specs in
vllm/v1/kv_cache_interface.py; see docs/tuning.md.
"""
from __future__ import annotations

import json
import os
import struct

from . import deepseek_v4
from . import model_families as families
from .model_description import ModelDescription, ModelDescriptionError
from .model_fields import (ModelError, UnsupportedModelError, field_name, first_of,
                           is_int, optional_int, positive_int, positive_number)

__all__ = [
    "ModelError",
    "ModelDescription",
    "ModelDescriptionError",
    "UnsupportedModelError",
    "describe",
    "describe_config",
    "describe_dir",
    "describe_model_dir",
    "model_summary",
    "safetensors_file_info",
    "weights_from_dir",
]


# Safetensors dtype codes of 16/32-bit checkpoints, as config.json torch_dtype names.
SAFETENSORS_TO_TORCH = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}

# Where a multimodal wrapper's config.json keeps its language model's config, in the
# order describe_config looks.
TEXT_CONFIG_KEYS = ("text_config", "llm_config")
# The config fields vLLM reads the KV head count from, in its order (see describe_config).
KV_HEAD_KEYS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num",
                "num_attention_groups")
# Files that mark a sentence-transformers (embedding) checkpoint.
SENTENCE_TRANSFORMERS_FILES = ("modules.json", "config_sentence_transformers.json",
                               "sentence_bert_config.json")
# The sentence-transformers files vLLM 0.32.0 reads a max_seq_length from, in its order
# (transformers_utils/config.py:1062-1070 get_sentence_transformer_tokenizer_config: the
# first non-empty one; its max_seq_length, if it has one, then replaces the context
# derived from config.json, config/model.py:2618-2619, whatever the runner).
SENTENCE_LENGTH_FILES = ("sentence_bert_config.json", "sentence_roberta_config.json",
                         "sentence_distilbert_config.json", "sentence_camembert_config.json",
                         "sentence_albert_config.json", "sentence_xlm-roberta_config.json",
                         "sentence_xlnet_config.json")


# Context keys vLLM 0.32.0 compares (model_arch_config_convertor.py:396-413).
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                "max_target_positions", "max_sequence_length", "max_seq_length",
                "seq_len")

# What the tuner needs from a config.json, named in errors.
REQUIRED_FIELDS = ("architectures or model_type", "num_hidden_layers",
                   "num_attention_heads", "hidden_size (or head_dim)",
                   "max_position_embeddings")


# Bytes per element of each safetensors dtype (safetensors' Dtype enum); None: packed
# sub-byte types whose tensor size is not a whole number of elements' bytes.
SAFETENSORS_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
    "F64": 8, "I64": 8, "U64": 8, "F4": None, "F6_E2M3": None, "F6_E3M2": None,
}


def _tensor_size(path, name, entry):
    """Byte size of one header entry, every field checked."""
    if not isinstance(entry, dict):
        raise ModelError(f"{path}: tensor {name!r} is not a mapping in the safetensors "
                         "header; the file is corrupt")
    offsets = entry.get("data_offsets")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(
            is_int(o) and o >= 0 for o in offsets) and offsets[1] >= offsets[0]):
        if isinstance(offsets, list) and len(offsets) == 2 and all(is_int(o) for o in offsets):
            raise ModelError(f"{path}: tensor {name!r} has negative size")
        raise ModelError(f"{path}: tensor {name!r} has no valid data_offsets (two integers "
                         f"[start, end], 0 <= start <= end; got {offsets!r})")
    dtype = entry.get("dtype")
    if dtype not in SAFETENSORS_DTYPE_BYTES:
        raise ModelError(f"{path}: tensor {name!r} has dtype {dtype!r}, not one of "
                         f"{', '.join(SAFETENSORS_DTYPE_BYTES)}; the file is corrupt or "
                         "newer than gpufleet")
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(is_int(d) and d >= 0 for d in shape):
        raise ModelError(f"{path}: tensor {name!r} has shape {shape!r}; it must be a list "
                         "of non-negative integers")
    size = offsets[1] - offsets[0]
    width = SAFETENSORS_DTYPE_BYTES[dtype]
    if width is not None:
        count = 1
        for dim in shape:
            count *= dim
        if count * width != size:
            raise ModelError(f"{path}: tensor {name!r} of shape {shape} and dtype {dtype} "
                             f"needs {count * width} bytes but data_offsets give {size}; "
                             "the file is corrupt")
    return dtype, size


def safetensors_file_info(path):
    """Return {"bytes": tensor bytes, "dtypes": {dtype: bytes}} from a header.

    Reads only the 8-byte length and the JSON header; a tensor's size is
    data_offsets[1] - data_offsets[0]. A truncated header is an error.
    """
    try:
        with open(path, "rb") as handle:
            raw_len = handle.read(8)
            if len(raw_len) != 8:
                raise ModelError(f"{path}: not a safetensors file (shorter than 8 bytes)")
            (header_len,) = struct.unpack("<Q", raw_len)
            if header_len > 100 * 1024 * 1024:
                raise ModelError(f"{path}: safetensors header of {header_len} bytes is "
                                 "implausible; the file is corrupt")
            header_raw = handle.read(header_len)
    except OSError as exc:
        raise ModelError(f"cannot read {path}: {exc.strerror}") from exc
    if len(header_raw) != header_len:
        raise ModelError(f"{path}: safetensors header is truncated "
                         f"({len(header_raw)} of {header_len} bytes)")
    try:
        header = json.loads(header_raw)
    except ValueError as exc:  # UnicodeDecodeError too
        raise ModelError(f"{path}: safetensors header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise ModelError(f"{path}: safetensors header is not a JSON object (got "
                         f"{type(header).__name__}); the file is corrupt")
    total = 0
    dtypes = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype, size = _tensor_size(path, name, entry)
        total += size
        dtypes[dtype] = dtypes.get(dtype, 0) + size
    return {"bytes": total, "dtypes": dtypes}


def weights_from_dir(path):
    """Weight bytes of a model folder, without loading tensors.

    Returns {"bytes", "source", "dtype"}; dtype is the safetensors dtype holding most
    bytes (None when only an index was read). Raises ModelError when the folder has no
    safetensors weights.
    """
    index_path = os.path.join(path, "model.safetensors.index.json")
    shards = sorted(name for name in os.listdir(path) if name.endswith(".safetensors"))
    if shards:
        total = 0
        dtypes = {}
        for shard in shards:
            info = safetensors_file_info(os.path.join(path, shard))
            total += info["bytes"]
            for dtype, size in info["dtypes"].items():
                dtypes[dtype] = dtypes.get(dtype, 0) + size
        main_dtype = max(dtypes, key=dtypes.get) if dtypes else None
        return {"bytes": total, "source": f"safetensors headers ({len(shards)} files)",
                "dtype": main_dtype}
    if os.path.isfile(index_path):
        try:
            with open(index_path, encoding="utf-8") as handle:
                index = json.load(handle)
            total = int(index["metadata"]["total_size"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelError(f"{index_path}: no usable metadata.total_size ({exc})") from exc
        if total <= 0:
            raise ModelError(f"{index_path}: metadata.total_size is {total}; pass "
                             "weights_bytes instead")
        return {"bytes": total, "source": "model.safetensors.index.json metadata.total_size",
                "dtype": None}
    raise ModelError(f"{path}: no *.safetensors files and no model.safetensors.index.json; "
                     "download the weights or pass weights_bytes")


def _quantization(cfg, source="config.json"):
    quant = cfg.get("quantization_config")
    if not quant and isinstance(cfg.get("text_config"), dict):
        # Multimodal checkpoints may keep it in text_config (Kimi-K2.5); vLLM 0.32.0
        # looks there too (model_arch_config_convertor.py get_quantization_config).
        quant = cfg["text_config"].get("quantization_config")
    if not quant:
        return None
    if not isinstance(quant, dict):
        raise ModelError(f"{source}: quantization_config must be a mapping")
    method = str(quant.get("quant_method") or "unknown").lower()
    out = {"method": method}
    bits_key = next((k for k in ("bits", "w_bit", "num_bits") if quant.get(k) is not None),
                    "bits")
    bits = quant.get(bits_key)
    if bits is None and method == "fp8":
        bits = 8
    if bits is not None:
        out["bits"] = positive_int(bits, f"quantization_config.{bits_key}", source,
                                   extra=" and <= 32")
        if bits > 32:
            raise ModelError(f"{source}: quantization_config.{bits_key} is {bits}; it must "
                             "be an integer from 1 to 32")
    group_key = next((k for k in ("group_size", "q_group_size") if quant.get(k) is not None),
                     None)
    if group_key is not None:
        group = quant[group_key]
        if group != -1:  # GPTQ/AWQ: -1 is one group per output channel
            positive_int(group, f"quantization_config.{group_key}", source,
                         extra=", or -1 for per-channel")
        out["group_size"] = group
    block = quant.get("weight_block_size")
    if block is not None:
        if not isinstance(block, list) or not block or not all(
                is_int(b) and b > 0 for b in block):
            raise ModelError(f"{source}: quantization_config.weight_block_size is {block!r}; "
                             "it must be a list of integers >= 1, e.g. [128, 128]")
        out["weight_block_size"] = list(block)
    if quant.get("format"):
        out["format"] = quant["format"]
    return out


def _rope_scaling(text, source):
    """The rope scaling mapping with its factor and original length checked, or None."""
    key = "rope_scaling" if text.get("rope_scaling") else "rope_parameters"
    rope = text.get(key)
    if not rope:
        return None
    if not isinstance(rope, dict):
        raise ModelError(f"{source}: {key} is {rope!r}; it must be a mapping such as "
                         "{\"rope_type\": \"yarn\", \"factor\": 4.0}")
    for field in ("factor", "low_freq_factor", "high_freq_factor"):
        if rope.get(field) is not None:
            positive_number(rope[field], f"{key}.{field}", source)
    if rope.get("original_max_position_embeddings") is not None:
        positive_int(rope["original_max_position_embeddings"],
                     f"{key}.original_max_position_embeddings", source)
    return rope


def _is_deepseek_v4(text, architectures, model_type):
    return model_type.startswith("deepseek_v4") or any(
        a.startswith("DeepseekV4") for a in architectures) or \
        text.get("compress_ratios") is not None


def _wrapped_text(cfg):
    """The language model's fields: a multimodal wrapper keeps them in text_config, or
    in llm_config (InternVL), which vLLM 0.32.0 reads as text_config when there is none
    (transformers_utils/config.py:152-154 _CONFIG_ATTRS_MAPPING, :744-750, :421)."""
    return next((cfg[k] for k in TEXT_CONFIG_KEYS if isinstance(cfg.get(k), dict)), cfg)


def _language_config(cfg, architectures, model_type, source):
    """(the language model's config as vLLM reads it, DeepSeek-V4's fields or None):
    the text config of a multimodal wrapper, unmodelled structures refused, the config
    class's defaults and other names applied, then the family's rule (families.FAMILY_RULES)."""
    text = _wrapped_text(cfg)
    v4 = None
    if _is_deepseek_v4(text, architectures, model_type):
        try:
            v4 = deepseek_v4.describe_fields(text, architectures)
        except deepseek_v4.DeepseekV4Error as exc:
            raise UnsupportedModelError(
                f"{source}: DeepSeek-V4 config not modelled: {exc}. Run vLLM once with "
                "--kv-cache-memory-bytes and read its 'KV cache size' line "
                "instead.") from None
        families.refuse_unmodelled({k: v for k, v in text.items() if k != "index_topk"})
    else:
        text = families.hybrid_layer_list(text, model_type, text is not cfg, source)
        families.refuse_unmodelled(text)
    defaults = families.CONFIG_DEFAULTS.get(model_type, {})
    if text is not cfg:
        defaults = dict(families.TEXT_CONFIG_DEFAULTS.get(model_type, {}), **defaults)
    text = dict(defaults, **families.config_class_names(text, model_type))
    rule = families.FAMILY_RULES.get(model_type)
    if rule is not None:
        rule(text, source)
    return text, v4


def _sizes(text, model_type, source):
    """The layer, head and length numbers of a language config, each checked once
    (booleans are not integers); ModelError naming what is missing or wrong."""
    num_layers = first_of(text, "num_hidden_layers", "n_layer", "num_layers")
    num_heads = first_of(text, "num_attention_heads", "n_head")
    hidden = first_of(text, "hidden_size", "n_embd", "d_model")
    head_dim = text.get("head_dim")
    max_pos = first_of(text, *MAX_LEN_KEYS)
    if max_pos is None and model_type in families.DEFAULT_MAX_LEN_MODEL_TYPES:
        max_pos = families.VLLM_DEFAULT_MAX_LEN
    missing = [field for field, value in (
        ("num_hidden_layers", num_layers), ("num_attention_heads", num_heads),
        ("hidden_size (or head_dim)", hidden if head_dim is None else head_dim),
        ("max_position_embeddings", max_pos)) if value is None]
    if missing:
        raise ModelError(f"config.json lacks {', '.join(missing)}; the tuner needs: "
                         + ", ".join(REQUIRED_FIELDS))
    layers_key = field_name(text, "num_hidden_layers", "n_layer", "num_layers")
    heads_key = field_name(text, "num_attention_heads", "n_head")
    positive_int(num_layers, layers_key, source)
    positive_int(num_heads, heads_key, source)
    positive_int(max_pos, field_name(text, *MAX_LEN_KEYS), source)
    # vLLM 0.32.0 (model_arch_config_convertor.py:394-427 derive_max_model_len_and_key)
    # takes the smallest of these keys (ChatGLM has only seq_length), then Command-R's
    # model_max_length in its place.
    for key in MAX_LEN_KEYS:
        if is_int(text.get(key)) and 0 < text[key] < max_pos:
            max_pos = text[key]
    if text.get("model_max_length"):
        max_pos = positive_int(text["model_max_length"], "model_max_length", source)
    if hidden is not None:
        positive_int(hidden, field_name(text, "hidden_size", "n_embd", "d_model"), source)
    if head_dim is not None:
        positive_int(head_dim, "head_dim", source)
    elif hidden % num_heads:
        raise ModelError(f"{source}: hidden_size {hidden} is not a multiple of {heads_key} "
                         f"{num_heads}, so the head size is not whole; set head_dim")
    for field in ("intermediate_size", "vocab_size", "kv_lora_rank", "num_experts_per_tok"):
        optional_int(text, field, source)
    optional_int(text, "qk_rope_head_dim", source, minimum=0)
    return num_layers, num_heads, hidden, head_dim, max_pos, heads_key


def _kv_heads(text, num_heads, heads_key, source):
    """vLLM 0.32.0 ModelArchConfigConvertorBase.get_total_num_kv_heads
    (model_arch_config_convertor.py:150-166): the first of KV_HEAD_KEYS, else one KV
    head per attention head; checked to divide the head count (MLA aside)."""
    kv_key = field_name(text, *KV_HEAD_KEYS)
    kv_heads = first_of(text, *KV_HEAD_KEYS)
    if kv_heads is None:
        kv_heads = num_heads
    positive_int(kv_heads, kv_key, source, extra=f" dividing {heads_key} ({num_heads})")
    if text.get("kv_lora_rank") is None and num_heads % kv_heads:
        raise ModelError(f"{source}: {kv_key} {kv_heads} does not divide {heads_key} "
                         f"{num_heads}; grouped-query attention needs it to (check the "
                         "config)")
    return kv_heads


def _attention(text, model_type, v4, encoder_only, num_layers, kv_heads, num_heads):
    """(attention name, per-layer kinds) of the language config."""
    if v4 is not None:
        # Every layer keeps a sliding-window cache; 1/4 and 1/128 layers also a
        # compressed one (gpufleet.deepseek_v4).
        return "deepseek_v4", ["sliding" if r == 1 else f"c{r}a"
                               for r in v4["compress_ratios"]]
    if text.get("kv_lora_rank") is not None:
        return "mla", ["full"] * num_layers
    if encoder_only:
        return "encoder_only", ["full"] * num_layers
    layer_kinds = families.layer_kinds_of(text, num_layers, model_type)
    if model_type in families.PER_KIND_HEAD_MODEL_TYPES and layer_kinds[-1] != "full":
        # Gemma4TextConfig.__post_init__ (configuration_gemma4.py:197-202): "Last
        # layer must use full_attention ... Forcing".
        layer_kinds[-1] = "full"
    if kv_heads == num_heads:
        attention = "mha"
    elif kv_heads == 1:
        attention = "mqa"
    else:
        attention = "gqa"
    if "sliding" in layer_kinds:
        attention += "+sliding" if "full" in layer_kinds else "-sliding"
    return attention, layer_kinds


def describe_config(cfg, weights_bytes=None, weights_source=None, weights_dtype=None,
                    sentence_transformers=False, allow_unknown_architecture=False,
                    name=None, source="config.json"):
    """describe(...) as the plain mapping the modules return (ModelDescription.as_dict)."""
    return describe(cfg, weights_bytes, weights_source, weights_dtype, sentence_transformers,
                    allow_unknown_architecture, name, source).as_dict()


def describe(cfg, weights_bytes=None, weights_source=None, weights_dtype=None,
             sentence_transformers=False, allow_unknown_architecture=False,
             name=None, source="config.json"):
    """Describe a model from its config.json mapping.

    Returns a ModelDescription (see docs/tuning.md, "Model description"). Raises ModelError
    naming the missing fields, UnsupportedModelError for attention kinds the tuner does
    not model, and for an architecture outside families.KNOWN_MODEL_TYPES unless
    allow_unknown_architecture is true.
    """
    if not isinstance(cfg, dict):
        raise ModelError("model_config must be a mapping (the content of config.json)")
    architectures = list(cfg.get("architectures") or [])
    model_type = str(_wrapped_text(cfg).get("model_type") or cfg.get("model_type") or "")
    if not architectures and not model_type:
        raise ModelError("config.json names neither architectures nor model_type; the "
                         "tuner needs: " + ", ".join(REQUIRED_FIELDS))
    text, v4 = _language_config(cfg, architectures, model_type, source)
    num_layers, num_heads, hidden, head_dim, max_pos, heads_key = _sizes(
        text, model_type, source)
    if weights_bytes is not None:
        positive_int(weights_bytes, "weights_bytes", weights_source or "weights_bytes")
    known = _check_known(architectures, model_type, allow_unknown_architecture)
    kv_heads = _kv_heads(text, num_heads, heads_key, source)
    head_size = head_dim if head_dim is not None else hidden // num_heads
    window = text.get("sliding_window")
    if window is not None:
        positive_int(window, "sliding_window", source, extra=" (or null for none)")
    st_files = bool(sentence_transformers)
    kind, native_pooling = families.pooling_kind(architectures, model_type, st_files)
    encoder_only = _encoder_only(text, model_type, kind, source)
    attention, layer_kinds = _attention(text, model_type, v4, encoder_only, num_layers,
                                        kv_heads, num_heads)
    kind_heads = families.heads_per_kind(text, model_type, layer_kinds, kv_heads, head_size,
                                         num_heads, source)
    torch_dtype = _torch_dtype(cfg, text, weights_dtype)
    moe = _moe(text, source)
    remote_modules, remote_repos = auto_map_modules(cfg)
    return ModelDescription(
        name=name or (architectures[0] if architectures else model_type),
        architectures=tuple(architectures), model_type=model_type, known_architecture=known,
        kind=kind, native_pooling=native_pooling, sentence_transformers=st_files,
        attention=attention,
        kv_cache_dtype_ignored=model_type in families.KV_CACHE_DTYPE_IGNORED_MODEL_TYPES,
        num_layers=num_layers, num_attention_heads=num_heads, num_kv_heads=kv_heads,
        head_size=head_size, kind_heads=kind_heads, layer_kinds=tuple(layer_kinds),
        sliding_window=window + families.WINDOW_OFFSET.get(model_type, 0)
        if "sliding" in layer_kinds or v4 else None,
        kv_lora_rank=text.get("kv_lora_rank"), qk_rope_head_dim=text.get("qk_rope_head_dim"),
        hidden_size=hidden, intermediate_size=text.get("intermediate_size"),
        vocab_size=text.get("vocab_size"),
        tie_word_embeddings=text.get("tie_word_embeddings", cfg.get("tie_word_embeddings")),
        max_position_embeddings=max_pos, sentence_max_seq_length=None,
        rope_scaling=_rope_scaling(text, source),
        original_max_position_embeddings=text.get("original_max_position_embeddings"),
        torch_dtype=torch_dtype or "bfloat16", torch_dtype_from_config=bool(torch_dtype),
        moe=moe, quantization=_quantization(cfg, source),
        remote_config_class=_remote_config_class(cfg, model_type), deepseek_v4=v4,
        num_nextn_predict_layers=text.get("num_nextn_predict_layers"),
        python_files=dict.fromkeys(remote_modules), remote_code_repos=tuple(remote_repos),
        weights_bytes=weights_bytes, weights_source=weights_source,
        weights_dtype=weights_dtype)


def _check_known(architectures, model_type, allow_unknown_architecture):
    """Whether model_type is in families.KNOWN_MODEL_TYPES; ModelError when it is not
    and allow_unknown_architecture is false."""
    known = model_type in families.KNOWN_MODEL_TYPES
    if not known and not allow_unknown_architecture:
        raise ModelError(
            f"architecture {architectures or model_type!r} (model_type {model_type!r}) is "
            "not in gpufleet's table, so its KV layout is not verified. The generic "
            "decoder rule would use: " + ", ".join(REQUIRED_FIELDS) + ", and "
            "num_key_value_heads. Set allow_unknown_architecture: true to use it.")
    return known


def _encoder_only(text, model_type, kind, source):
    """Whether vLLM builds the layers as encoder-only attention (no KV cache); refused
    for a model vLLM would run generative."""
    encoder_only = model_type in families.ENCODER_ONLY_MODEL_TYPES or (
        text.get("is_causal") is False and model_type in families.IS_CAUSAL_MODEL_TYPES)
    if encoder_only and kind == "generative":
        # vLLM picks the runner from the architecture and the sentence-transformers
        # files, not from is_causal (config/model.py _get_default_runner_type), so it
        # would generate with layers that keep no KV cache.
        raise UnsupportedModelError(
            f"{source}: is_causal is false, so vLLM builds {model_type}'s layers as "
            "encoder-only (bidirectional) attention, which keeps no KV cache: an "
            "embedding model, which vLLM serves as one only from a folder with its "
            "sentence-transformers files (modules.json) or with --runner pooling. "
            "gpufleet's tuner does not plan it as a generative model.")
    return encoder_only


def _torch_dtype(cfg, text, weights_dtype):
    """config.json's torch_dtype (or dtype), else the weights' 16/32-bit dtype, else ""."""
    torch_dtype = str(first_of(cfg, "torch_dtype", "dtype") or first_of(
        text, "torch_dtype", "dtype") or "")
    if not torch_dtype and weights_dtype in SAFETENSORS_TO_TORCH:
        torch_dtype = SAFETENSORS_TO_TORCH[weights_dtype]
    return torch_dtype


def _moe(text, source):
    """{"num_experts", "experts_per_token"} of a mixture-of-experts config, or None."""
    names = ("n_routed_experts", "num_local_experts", "num_experts")
    num_experts = first_of(text, *names)
    if num_experts is not None:
        positive_int(num_experts, field_name(text, *names), source)
    if not num_experts:
        return None
    return {"num_experts": num_experts, "experts_per_token": text.get("num_experts_per_tok")}


def _remote_config_class(cfg, model_type):
    """The checkpoint's own config class vLLM must run (--trust-remote-code), or None."""
    if {model_type, str(cfg.get("model_type") or "")} & families.REMOTE_CONFIG_MODEL_TYPES:
        return (cfg.get("auto_map") or {}).get("AutoConfig") or model_type
    return None


def auto_map_modules(cfg):
    """The Python files config.json's auto_map names, as transformers reads it
    (dynamic_module_utils: 'module.Class', or 'org/repo--module.Class' for code in another
    repository; AutoTokenizer holds [slow, fast]). Returns (this repository's .py paths,
    the other repositories named), both sorted."""
    auto_map = cfg.get("auto_map") if isinstance(cfg, dict) else None
    text = cfg.get("llm_config") if isinstance(cfg, dict) else None
    refs = []
    for source in (auto_map, (text or {}).get("auto_map") if isinstance(text, dict) else None):
        if isinstance(source, dict):
            for value in source.values():
                refs.extend(value if isinstance(value, list) else [value])
    files, repos = set(), set()
    for ref in refs:
        if not isinstance(ref, str) or "." not in ref:
            continue
        repo, _sep, ref = ref.rpartition("--")
        module = ref.rsplit(".", 1)[0]
        if repo:
            repos.add(repo)
        else:
            files.add(module.replace(".", "/") + ".py")
    return sorted(files), sorted(repos)


def python_files_in(path):
    """{relative path: sha256} of the *.py files under a model folder (gpufleet's state
    folder and links aside): what --trust-remote-code could import from it."""
    import hashlib

    found = {}
    for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d != ".gpufleet"
                         and not os.path.islink(os.path.join(root, d)))
        for name in sorted(names):
            full = os.path.join(root, name)
            if name.endswith(".py") and os.path.isfile(full) and not os.path.islink(full):
                digest = hashlib.sha256()
                with open(full, "rb") as handle:
                    for chunk in iter(lambda: handle.read(1 << 20), b""):
                        digest.update(chunk)
                found[os.path.relpath(full, path).replace(os.sep, "/")] = digest.hexdigest()
    return found


def describe_model_dir(path, allow_unknown_architecture=False, weights_bytes=None):
    """describe_dir(...) as the plain mapping the modules return."""
    return describe_dir(path, allow_unknown_architecture, weights_bytes).as_dict()


def describe_dir(path, allow_unknown_architecture=False, weights_bytes=None):
    """Describe the model stored in a local folder (config.json + safetensors) as a
    ModelDescription."""
    if not os.path.isdir(path):
        raise ModelError(f"model_path {path} is not a directory")
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise ModelError(f"{path} has no config.json; point model_path at the folder that "
                         "holds the model's config.json (a Hugging Face snapshot), or pass "
                         "model_config and weights_bytes")
    try:
        with open(config_path, encoding="utf-8") as handle:
            cfg = json.load(handle)
    except ValueError as exc:
        raise ModelError(f"{config_path} is not valid JSON: {exc}") from exc
    if weights_bytes is None:
        weights = weights_from_dir(path)
    else:
        weights = {"bytes": weights_bytes, "source": "weights_bytes option", "dtype": None}
    st_files = any(os.path.isfile(os.path.join(path, f))
                   for f in SENTENCE_TRANSFORMERS_FILES)
    desc = describe(cfg, weights_bytes=weights["bytes"],
                    weights_source=weights["source"], weights_dtype=weights["dtype"],
                    sentence_transformers=st_files,
                    allow_unknown_architecture=allow_unknown_architecture,
                    name=os.path.basename(os.path.normpath(path)),
                    source=config_path)
    # vLLM 0.32.0 config/model.py:2129-2141, 2552-2557: a pooling model whose hf_config
    # says position_embedding_type "absolute" (BERT, XLM-RoBERTa) is also held to its
    # tokenizer_config.json model_max_length (bge-m3: 8,194 positions, 8,192 tokens).
    tok_path = os.path.join(path, "tokenizer_config.json")
    max_len = desc.max_position_embeddings
    if desc.kind == "pooling" and cfg.get("position_embedding_type") == "absolute" \
            and os.path.isfile(tok_path):
        try:
            with open(tok_path, encoding="utf-8") as handle:
                tok_max = json.load(handle).get("model_max_length")
        except (ValueError, AttributeError) as exc:
            raise ModelError(f"{tok_path} is not a JSON object: {exc}") from exc
        if isinstance(tok_max, (int, float)) and not isinstance(tok_max, bool) \
                and 0 < tok_max < max_len:
            max_len = int(tok_max)
    return desc.replace(max_position_embeddings=max_len,
                        sentence_max_seq_length=_sentence_max_seq_length(path),
                        python_files={**desc.python_files, **python_files_in(path)})


def _sentence_max_seq_length(path):
    """max_seq_length of the first non-empty sentence-transformers length file in the
    folder (SENTENCE_LENGTH_FILES, as vLLM 0.32.0 reads them), or None."""
    for name in SENTENCE_LENGTH_FILES:
        file_path = os.path.join(path, name)
        if not os.path.isfile(file_path):
            continue
        try:
            with open(file_path, encoding="utf-8") as handle:
                data = json.load(handle)
        except ValueError as exc:
            raise ModelError(f"{file_path} is not valid JSON: {exc}") from exc
        if not data:
            continue
        if not isinstance(data, dict):
            raise ModelError(f"{file_path} is not a JSON object")
        if "max_seq_length" not in data:
            return None
        return positive_int(data["max_seq_length"], "max_seq_length", file_path)
    return None


def model_summary(desc):
    """The description (a ModelDescription or its mapping) as a mapping with per-layer
    kinds folded into counts, for reports and the modules' return."""
    out = ModelDescription.of(desc).as_dict()
    counts = {}
    for kind in out["layer_kinds"]:
        counts[kind] = counts.get(kind, 0) + 1
    out["layer_kinds"] = counts
    return out
