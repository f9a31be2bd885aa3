"""A model's description as a typed record: what gpufleet.model.describe builds from a
config.json (the per-family rules of gpufleet.model_families fill it) and what the tuner
reads (gpufleet.kv_memory, tune, serve_dtype, engine_args, speculative, deepseek_v4).

Plain data in, plain data out; no Ansible imports. Shaped after vLLM's
v1/kv_cache_interface.py specs (FullAttentionSpec, SlidingWindowSpec, MLAAttentionSpec:
frozen dataclasses with typed fields). Inside module_utils a description is read by
attribute only (tests/unit/test_model_description.py scans for `desc["..."]`); it has no
`[]`. The modules return `as_dict()`, the same mapping describe_config returned before
this record (docs/tuning.md, "Model description"), and `of()` turns such a mapping
(a test's, or a module's option) back into a record, refusing unknown keys, missing keys
and wrong types.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields

from .model_fields import ModelError

__all__ = ["ModelDescription", "ModelDescriptionError", "check_fields"]


def check_fields(record, types, sequences, error, label):
    """The check every typed record of module_utils runs at construction: each field of
    `types` is an instance of its allowed types (a bool is not an int unless bool is
    allowed), each field of `sequences` holds strings; `error` names the field."""
    for name, allowed in types.items():
        value = getattr(record, name)
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise error(f"{label}: {name} is {value!r} ({type(value).__name__}); it must be "
                        + " or ".join(t.__name__ for t in allowed))
    for name in sequences:
        if not all(isinstance(item, str) for item in getattr(record, name)):
            raise error(f"{label}: {name} must hold strings, got {getattr(record, name)!r}")


class ModelDescriptionError(ModelError):
    """A description built or read with an unknown key, a missing key or a wrong type."""


_INT = (int,)
_OPT_INT = (int, type(None))
_OPT_STR = (str, type(None))
_OPT_DICT = (dict, type(None))
_NUMBER = (int, float)


@dataclass(frozen=True, slots=True)
class ModelDescription:
    """One model as the tuner sees it; each field names where it comes from.

    "config.json" below means the language model's config: a multimodal wrapper's
    text_config (or InternVL's llm_config), with the config class's defaults and other
    names applied (gpufleet.model_families CONFIG_DEFAULTS, config_class_names).
    """
    # The folder's name, else config.json architectures[0], else model_type.
    name: str
    # config.json architectures (vLLM's registry picks the model class from the first).
    architectures: tuple
    # config.json model_type (text_config's when wrapped): the key of every family table.
    model_type: str
    # model_type is in model_families.KNOWN_MODEL_TYPES (its KV layout was checked
    # against vLLM); false only with allow_unknown_architecture.
    known_architecture: bool
    # "generative" or "pooling": vLLM's runner (config/model.py _get_default_runner_type,
    # model_families.pooling_kind).
    kind: str
    # the architecture pools by itself (vLLM's *ForSequenceClassification, *Model
    # embedders); false: vLLM converts it (--convert embed).
    native_pooling: bool
    # the folder holds sentence-transformers files (model.SENTENCE_TRANSFORMERS_FILES).
    sentence_transformers: bool
    # the attention kind: mha / mqa / gqa (+sliding / -sliding), mla, encoder_only,
    # deepseek_v4 (model._attention; vLLM's AttentionSpec subclasses).
    attention: str
    # --kv-cache-dtype has no effect on this family's cache
    # (model_families.KV_CACHE_DTYPE_IGNORED_MODEL_TYPES).
    kv_cache_dtype_ignored: bool
    # config.json num_hidden_layers (n_layer, num_layers).
    num_layers: int
    # config.json num_attention_heads (n_head).
    num_attention_heads: int
    # vLLM's get_total_num_kv_heads: the first of model.KV_HEAD_KEYS, else the head count.
    num_kv_heads: int
    # config.json head_dim, else hidden_size // num_attention_heads (get_head_size).
    head_size: int
    # {layer kind: {"num_kv_heads", "head_size"}} when the kinds differ in them
    # (model_families.PER_KIND_HEAD_MODEL_TYPES), else None.
    kind_heads: dict | None
    # one entry per layer: "full", "sliding", or DeepSeek-V4's "c4a" / "c128a".
    layer_kinds: tuple
    # config.json sliding_window (+ model_families.WINDOW_OFFSET) when a layer slides,
    # else None.
    sliding_window: int | None
    # config.json kv_lora_rank (MLA's latent KV width), or None.
    kv_lora_rank: int | None
    # config.json qk_rope_head_dim (MLA's rotary part of a key), or None.
    qk_rope_head_dim: int | None
    # config.json hidden_size (n_embd, d_model); None when only head_dim is given.
    hidden_size: int | None
    # config.json intermediate_size (the overhead estimate's MLP width), or None.
    intermediate_size: object
    # config.json vocab_size, or None.
    vocab_size: int | None
    # config.json tie_word_embeddings (lm_head is the input embedding), or None.
    tie_word_embeddings: bool | None
    # the smallest of model.MAX_LEN_KEYS (vLLM's derive_max_model_len_and_key), or
    # model_max_length, or tokenizer_config.json's model_max_length (describe_model_dir).
    max_position_embeddings: int
    # a folder's sentence-transformers max_seq_length (model.SENTENCE_LENGTH_FILES).
    sentence_max_seq_length: int | None
    # config.json rope_scaling (or rope_parameters), factor and lengths checked, or None.
    rope_scaling: dict | None
    # config.json original_max_position_embeddings (longrope: tune.default_max_len).
    original_max_position_embeddings: int | None
    # config.json torch_dtype (dtype), else the weights' dtype, else "bfloat16".
    torch_dtype: str
    # torch_dtype came from config.json or the weights, not the default.
    torch_dtype_from_config: bool
    # {"num_experts", "experts_per_token"} from n_routed_experts / num_local_experts /
    # num_experts and num_experts_per_tok, or None.
    moe: dict | None
    # config.json quantization_config folded: {"method", "bits", "group_size",
    # "weight_block_size", "format"} (those present), or None.
    quantization: dict | None
    # the checkpoint's own config class vLLM must run with --trust-remote-code
    # (model_families.REMOTE_CONFIG_MODEL_TYPES), or None.
    remote_config_class: str | None
    # DeepSeek-V4's fields (gpufleet.deepseek_v4.describe_fields), or None.
    deepseek_v4: dict | None
    # config.json num_nextn_predict_layers: the MTP layers --speculative-config method
    # mtp runs (gpufleet.speculative), or None.
    num_nextn_predict_layers: int | None
    # {path: sha256 or None}: the Python --trust-remote-code may run (auto_map's modules;
    # describe_model_dir adds the folder's *.py with their sha256).
    python_files: dict
    # other repositories auto_map names ("org/repo--module.Class").
    remote_code_repos: tuple
    # the weights' bytes (safetensors headers, the index's total_size, or an option).
    weights_bytes: int | None
    # where weights_bytes was read.
    weights_source: str | None
    # the safetensors dtype holding most bytes, or None.
    weights_dtype: str | None

    def __post_init__(self):
        check_fields(self, _TYPES, _SEQUENCES, ModelDescriptionError, "model description")

    @classmethod
    def of(cls, value):
        """The record itself, or one built from a mapping with exactly its keys
        (as_dict's); ModelDescriptionError naming unknown and missing keys."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ModelDescriptionError(
                f"a model description is a ModelDescription or a mapping, not "
                f"{type(value).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - names)
        missing = sorted(names - set(value))
        if unknown or missing:
            raise ModelDescriptionError(
                "model description: "
                + "; ".join(part for part in (
                    f"unknown key(s) {', '.join(unknown)}" if unknown else "",
                    f"missing key(s) {', '.join(missing)}" if missing else "") if part))
        data = dict(value)
        for name in _SEQUENCES:
            if isinstance(data[name], list):
                data[name] = tuple(data[name])
        return cls(**data)

    def replace(self, **changes):
        """A copy with `changes` (checked as at construction)."""
        return dataclasses.replace(self, **changes)

    def as_dict(self):
        """The description as the mapping the modules return (lists, not tuples)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in _SEQUENCES:
            out[name] = list(out[name])
        out["python_files"] = dict(self.python_files)
        return out


# The allowed types of each field, checked at construction (bool is not an int here).
_TYPES = {
    "name": (str,), "architectures": (tuple,), "model_type": (str,),
    "known_architecture": (bool,), "kind": (str,), "native_pooling": (bool,),
    "sentence_transformers": (bool,), "attention": (str,),
    "kv_cache_dtype_ignored": (bool,), "num_layers": _INT, "num_attention_heads": _INT,
    "num_kv_heads": _INT, "head_size": _INT, "kind_heads": _OPT_DICT,
    "layer_kinds": (tuple,), "sliding_window": _OPT_INT, "kv_lora_rank": _OPT_INT,
    "qk_rope_head_dim": _OPT_INT, "hidden_size": _OPT_INT,
    "intermediate_size": (int, list, type(None)), "vocab_size": _OPT_INT,
    "tie_word_embeddings": (bool, type(None)), "max_position_embeddings": _INT,
    "sentence_max_seq_length": _OPT_INT, "rope_scaling": _OPT_DICT,
    "original_max_position_embeddings": _NUMBER + (type(None),),
    "torch_dtype": (str,), "torch_dtype_from_config": (bool,), "moe": _OPT_DICT,
    "quantization": _OPT_DICT, "remote_config_class": _OPT_STR, "deepseek_v4": _OPT_DICT,
    "num_nextn_predict_layers": _OPT_INT, "python_files": (dict,),
    "remote_code_repos": (tuple,), "weights_bytes": _OPT_INT, "weights_source": _OPT_STR,
    "weights_dtype": _OPT_STR,
}
# Fields held as tuples in the record and as lists in as_dict().
_SEQUENCES = ("architectures", "layer_kinds", "remote_code_repos")
