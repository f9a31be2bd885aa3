"""What the tuner returns, as typed records: TunePlan (the `vllm serve` arguments, the
settings, the prediction, the reasons) and its Prediction of the KV cache.

Plain data in, plain data out; no Ansible imports. gpufleet.tune.make_plan builds a
TunePlan; `as_dict()` is the mapping the vllm_tune module returns and tune.plan gives
(docs/tuning.md, the example at the top): the same keys, in the same order, as before
these records. Fields are checked at construction (TunePlanError names the field).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from .model_description import check_fields
from .tune_errors import TuneError

__all__ = ["GroupPrediction", "Prediction", "TunePlan", "TunePlanError"]


class TunePlanError(TuneError):
    """A plan record built with a field of the wrong type (a bug in the tuner)."""


_NUMBER = (int, float)
_OPT_NUMBER = (int, float, type(None))


def _check(record, types, sequences=()):
    check_fields(record, types, sequences, TunePlanError, type(record).__name__)


@dataclass(frozen=True, slots=True)
class GroupPrediction:
    """The KV cache groups of a layout whose groups differ in block size (DeepSeek-V4,
    Gemma 4: kv_memory.kv_layout's "kv_cache_groups"), as vLLM's KVCacheConfig holds them
    (vllm/v1/core/kv_cache_utils.py get_kv_cache_configs)."""
    # one entry per group: its kind, block size, window, layers and bytes per block
    kv_cache_groups: list
    # the bytes one block of the shared pool takes (_get_kv_cache_bytes_per_block)
    bytes_per_block: int | float
    # the blocks one request of max_model_len takes (kv_memory.blocks_per_request)
    blocks_per_request: int | float | None
    # the blocks the sliding and compressed groups hold whatever the length
    # (kv_memory.fixed_blocks_per_request)
    fixed_blocks_per_request: int | float | None

    def __post_init__(self):
        _check(self, {"kv_cache_groups": (list,), "bytes_per_block": _NUMBER,
                      "blocks_per_request": _OPT_NUMBER,
                      "fixed_blocks_per_request": _OPT_NUMBER})


@dataclass(frozen=True, slots=True)
class Prediction:
    """The KV cache vLLM should find, per GPU (what kv_log compares with vLLM's log)."""
    # KV bytes one token of context takes over every layer
    kv_bytes_per_token: int | float
    # ... and in one layer (kv_memory.kv_layout's per_token_layer_bytes)
    kv_bytes_per_token_per_layer: int | float
    # the weights each GPU holds (tune._evaluate)
    weights_bytes_per_gpu: int | float
    # the estimated memory besides weights and KV cache (tune.estimate_overhead_bytes)
    overhead_bytes_per_gpu: int | float
    # what is left for the KV cache (gpu_worker.determine_available_memory's rule)
    kv_cache_bytes: int | float
    # kv_memory.kv_tokens_from_bytes: vLLM's get_num_blocks
    num_blocks: int
    # kv_memory.kv_cache_size_tokens: vLLM's logged "KV cache size"
    kv_cache_tokens: int | float | None
    # requests of max_model_len that fit at once, rounded to 2 places; None for a model
    # with no KV cache
    max_concurrency: int | float | None
    # the longest context one request could have
    max_model_len_that_fits: int | float
    # pipeline parallelism: one entry per stage (kv_memory.pp_stages), else None
    pipeline_stages: list | None = None
    # layouts whose groups differ in block size, else None
    groups: GroupPrediction | None = None

    def __post_init__(self):
        _check(self, {
            "kv_bytes_per_token": _NUMBER, "kv_bytes_per_token_per_layer": _NUMBER,
            "weights_bytes_per_gpu": _NUMBER, "overhead_bytes_per_gpu": _NUMBER,
            "kv_cache_bytes": _NUMBER, "num_blocks": (int,), "kv_cache_tokens": _OPT_NUMBER,
            "max_concurrency": _OPT_NUMBER, "max_model_len_that_fits": _NUMBER,
            "pipeline_stages": (list, type(None)),
            "groups": (GroupPrediction, type(None))})

    def as_dict(self):
        """The mapping of the module's `prediction`: the optional parts only when set."""
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name not in ("pipeline_stages", "groups")}
        if self.pipeline_stages is not None:
            out["pipeline_stages"] = self.pipeline_stages
        if self.groups is not None:
            out.update({f.name: getattr(self.groups, f.name) for f in fields(self.groups)})
        return out


@dataclass(frozen=True, slots=True)
class TunePlan:
    """The tuner's answer for one model on one host."""
    # each chosen setting: tensor_parallel_size, max_model_len, dtype, docker, env, ...
    # (docs/tuning.md; the roles read them from the module's return)
    settings: dict
    # one sentence per decision, in the order the decisions were made
    reasons: tuple
    prediction: Prediction
    # the arguments of `vllm serve MODEL ...`, in order
    args: tuple

    def __post_init__(self):
        _check(self, {"settings": (dict,), "reasons": (tuple,),
                      "prediction": (Prediction,), "args": (tuple,)}, ("reasons", "args"))

    def as_dict(self):
        """The module's return (besides `model`): settings, reasons, prediction, args."""
        return {"settings": self.settings, "reasons": list(self.reasons),
                "prediction": self.prediction.as_dict(), "args": list(self.args)}
