"""The KV cache as vLLM lays it out, in bytes, blocks, tokens and concurrency.

Plain data in, plain data out; no Ansible imports.  A layout (kv_layout) is the model's
KV cache groups, their page sizes and the tokens each reserves, at one tensor-parallel
size and block size; from it, the tokens a KV cache of so many bytes holds, the requests
that fit, the longest context that fits; and the same per pipeline stage (pp_*).  Every
rule names the vLLM file it mirrors (vllm/v1/kv_cache_interface.py,
vllm/v1/core/kv_cache_utils.py, vllm/distributed/utils.py; see gpufleet.tune's
docstring).  gpufleet.tune's planner chooses settings with it.
"""
from __future__ import annotations

import math

from . import deepseek_v4
from .model_description import ModelDescription
from .tune_errors import TuneError


KV_DTYPE_BYTES = {"auto": None, "bfloat16": 2, "float16": 2, "half": 2,
                  "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_ds_mla": None}
# The tokens a sliding-window group reserves for work in flight, vLLM 0.32.0's rule for
# every family (vllm/config/vllm.py): VllmConfig.max_in_flight_tokens =
# max_concurrent_batches x max_num_batched_tokens, and max_concurrent_batches is 2 with
# async scheduling at pipeline size 1 (pp_size + 1 on the V2 model runner, 2 on V1),
# else the pipeline size (in_flight_tokens: pp + 1 with async scheduling at pp > 1, as on
# the V2 runner vLLM picks on CUDA; tests/differential/pp_vllm.py). Async scheduling
# (SchedulerConfig.async_scheduling, None unless --async-scheduling or
# --no-async-scheduling) is switched on by VllmConfig.__post_init__ unless the model is
# a pooling model (or speculative decoding of a non-EAGLE kind, an executor without it,
# pipeline parallelism on the V1 runner); vllm/platforms/cpu.py
# CpuPlatform.check_and_update_config then sets it False on the CPU backend (after
# __post_init__'s choice: "the platform hook has the last word on async scheduling").
ASYNC_CONCURRENT_BATCHES = 2


def kv_element_bytes(kv_cache_dtype, dtype_bytes):
    if kv_cache_dtype not in KV_DTYPE_BYTES:
        raise TuneError(f"kv_cache_dtype {kv_cache_dtype!r} is not one of "
                        f"{', '.join(k for k in KV_DTYPE_BYTES)}")
    return KV_DTYPE_BYTES[kv_cache_dtype] or dtype_bytes


def async_scheduling(cpu, pooling, extra_args=()):
    """Whether vLLM 0.32 schedules asynchronously here (see ASYNC_CONCURRENT_BATCHES):
    never on the CPU backend; else as extra_args' --async-scheduling /
    --no-async-scheduling say, and by default for a generative model, not a pooling one."""
    if cpu:
        return False
    args = [str(arg) for arg in extra_args or ()]
    if "--no-async-scheduling" in args:
        return False
    return "--async-scheduling" in args or not pooling


def in_flight_tokens(layout, max_num_batched_tokens):
    """VllmConfig.max_in_flight_tokens for the target the layout was built for: the
    tokens each sliding-window group holds beyond window - 1 (SlidingWindowSpec.
    max_admission_blocks_per_request). 2 x max_num_batched_tokens with async
    scheduling (a generative model on a GPU), 1 x without (the CPU backend, pooling
    models). The one rule for every family, DeepSeek-V4's included."""
    pp = layout.get("pipeline_parallel_size", 1)
    if pp > 1:
        # VllmConfig.max_concurrent_batches: pp_size + 1 with async scheduling on the V2
        # model runner (vLLM 0.32.0's default on CUDA, which it keeps for pipeline
        # parallelism with async scheduling), pp_size without async scheduling.
        batches = pp + 1 if layout["async_scheduling"] else pp
    else:
        batches = ASYNC_CONCURRENT_BATCHES if layout["async_scheduling"] else 1
    return batches * max_num_batched_tokens


def kv_layout(model, tp, block_size, kv_cache_dtype="auto", dtype_bytes=2,
              async_sched=True):
    """How vLLM lays out this model's KV cache on one GPU (or the CPU backend).

    Returns {"per_token_layer_bytes", "page_bytes", "group_size", "groups",
    "bytes_per_block", "block_size", "sliding_window", "num_layers",
    "async_scheduling"}; `groups` lists one attention kind ("full" / "sliding") per KV
    cache group, `bytes_per_block` is what one block of the shared pool takes,
    `async_scheduling` (async_scheduling(); True, vLLM's default for a generative model
    on a GPU, unless told) decides in_flight_tokens(). An encoder-only model has no
    groups. Layouts whose groups differ in block size add "kv_cache_groups" (each
    group's kind, block size, window, layers and bytes per block): DeepSeek-V4
    (gpufleet.deepseek_v4) and layer kinds with pages of different sizes (Gemma 4,
    _unified_page_layout).
    """
    model = ModelDescription.of(model)
    num_layers = model.num_layers
    if model.kv_cache_dtype_ignored:
        # the model file builds its layers without cache_config: "auto" whatever the
        # flag says (model_families.KV_CACHE_DTYPE_IGNORED_MODEL_TYPES)
        kv_cache_dtype = "auto"
    if model.attention == "encoder_only":
        return {"per_token_layer_bytes": 0, "page_bytes": 0, "group_size": 0,
                "groups": [], "bytes_per_block": 0, "block_size": block_size,
                "sliding_window": None, "num_layers": num_layers,
                "async_scheduling": async_sched}
    if model.attention == "deepseek_v4":
        try:
            layout = deepseek_v4.kv_layout(model, block_size, kv_cache_dtype)
        except deepseek_v4.DeepseekV4Error as exc:
            raise TuneError(str(exc)) from None
        layout["async_scheduling"] = async_sched
        return layout
    if model.attention == "mla":
        # MLAAttentionSpec: one latent (kv_lora_rank + qk_rope_head_dim) per token per
        # layer, num_kv_heads 1, not sharded by tensor parallelism.
        if kv_cache_dtype == "fp8_ds_mla":
            per_token = 656
        else:
            head = int(model.kv_lora_rank) + int(model.qk_rope_head_dim or 0)
            per_token = head * kv_element_bytes(kv_cache_dtype, dtype_bytes)
    else:
        if kv_cache_dtype == "fp8_ds_mla":
            raise TuneError("kv_cache_dtype fp8_ds_mla applies to MLA models only")
        element = kv_element_bytes(kv_cache_dtype, dtype_bytes)
        per_token = _attention_token_bytes(model.num_kv_heads, model.head_size, tp,
                                           element)
    counts = {}
    for kind in model.layer_kinds:
        counts[kind] = counts.get(kind, 0) + 1
    if model.kind_heads:
        kind_bytes = {kind: _attention_token_bytes(h["num_kv_heads"], h["head_size"], tp,
                                                   element)
                      for kind, h in model.kind_heads.items()}
        if len(set(kind_bytes.values())) > 1:
            return _unified_page_layout(model, counts, kind_bytes, block_size,
                                        async_sched)
        per_token = next(iter(kind_bytes.values()))
    group_size = _group_size(counts)
    groups = []
    for kind, count in counts.items():
        groups += [kind] * math.ceil(count / group_size)
    return {"per_token_layer_bytes": per_token, "page_bytes": per_token * block_size,
            "group_size": group_size, "groups": groups,
            "bytes_per_block": per_token * block_size * group_size,
            "block_size": block_size, "sliding_window": model.sliding_window,
            "num_layers": num_layers, "async_scheduling": async_sched}


def _attention_token_bytes(num_kv_heads, head_size, tp, element_bytes):
    """One token's K and V in one layer on one GPU (AttentionSpec.page_size_bytes /
    block_size); get_num_kv_heads: heads are replicated when kv heads < tp (1 per
    GPU)."""
    return 2 * max(1, num_kv_heads // tp) * head_size * element_bytes


def _group_size(counts):
    """Layers per KV cache group, from the layer count of each kind
    (_get_kv_cache_groups_uniform_page_size): the smallest count, or the largest when
    it is under 1.5x the smallest (one kind: all its layers)."""
    smallest, largest = min(counts.values()), max(counts.values())
    return largest if largest < smallest * 1.5 else smallest


def _group_split(count, group_size):
    """Layers per group of a bucket of `count` layers (_get_kv_cache_groups_uniform_
    page_size: cdiv(count, group_size) groups, group i takes layers[i::groups])."""
    groups = math.ceil(count / group_size)
    return [len(range(i, count, groups)) for i in range(groups)]


def _unified_page_layout(model, counts, kind_bytes, block_size, async_sched):
    """The layout of layer kinds whose pages differ in size (Gemma 4: 8 KV heads x 256
    sliding, 2 x 512 full), on a layout that is not block-outermost, which the backends
    vLLM picks for it resolve (kv_cache_utils.get_kv_cache_groups: no packed groups, so
    unify_kv_cache_spec_page_size, then _get_kv_cache_groups_uniform_page_size).

    The largest page stays; a smaller one that divides it takes a block size that many
    times larger (same page bytes, more tokens), one that does not divide it is padded
    to it. The layers are then grouped by spec (_group_size), and every layer of every
    group holds one page per block."""
    pages = {kind: kind_bytes[kind] * block_size for kind in counts}
    top = max(pages.values())
    group_size = _group_size(counts)
    groups = []
    for kind, count in counts.items():
        block = block_size * (top // pages[kind]) if top % pages[kind] == 0 else block_size
        for layers in _group_split(count, group_size):
            groups.append({"kind": kind, "block_size": block,
                           "sliding_window": model.sliding_window
                           if kind == "sliding" else None,
                           "layers": layers, "page_bytes": top * layers})
    bytes_per_block = max(g["page_bytes"] for g in groups)
    # What one more token of context costs the pool: a block of every full-attention
    # group per its block size (the sliding groups stop growing past the window).
    per_token = sum(bytes_per_block / g["block_size"] for g in groups
                    if g["kind"] == "full")
    return {"per_token_layer_bytes": per_token / model.num_layers, "page_bytes": top,
            "group_size": group_size, "groups": [g["kind"] for g in groups],
            "kv_cache_groups": groups, "bytes_per_block": bytes_per_block,
            "block_size": block_size, "sliding_window": model.sliding_window,
            "num_layers": model.num_layers, "async_scheduling": async_sched,
            "kind_page_bytes": pages}


def _group_blocks(group, in_flight, model_len=None):
    """Blocks one request holds in one KV cache group (get_max_concurrency_for_kv_cache_
    config): FullAttentionSpec cdiv(len, block); SlidingWindowSpec.
    max_admission_blocks_per_request cdiv(min(window - 1 + in-flight tokens, len),
    block) + 1. model_len None: a request past the window (sliding groups only)."""
    if group["kind"] != "sliding":
        return math.ceil(model_len / group["block_size"])
    tokens = group["sliding_window"] - 1 + in_flight
    if model_len is not None:
        tokens = min(tokens, model_len)
    return math.ceil(tokens / group["block_size"]) + 1


def fixed_blocks_per_request(layout, in_flight):
    """The blocks a request holds whatever its length, once it passes window +
    in-flight tokens: its sliding-window groups' (and DeepSeek-V4's compressor-state
    groups'). Layouts with "kv_cache_groups" only."""
    return sum(_group_blocks(g, in_flight) for g in layout["kv_cache_groups"]
               if g["kind"] == "sliding")


def blocks_per_request(layout, model_len, max_num_batched_tokens):
    """Blocks one request of model_len tokens holds, summed over groups
    (_group_blocks), each group at its own block size when the layout lists them
    ("kv_cache_groups"), else at the layout's."""
    in_flight = in_flight_tokens(layout, max_num_batched_tokens)
    groups = layout.get("kv_cache_groups") or [
        {"kind": kind, "block_size": layout["block_size"],
         "sliding_window": layout["sliding_window"]} for kind in layout["groups"]]
    return sum(_group_blocks(g, in_flight, model_len) for g in groups)


def kv_tokens_from_bytes(layout, kv_cache_bytes):
    """(num_blocks, token slots) as vLLM computes them for a KV budget. The slots are
    what older vLLM logged (num_blocks // groups * block_size); vLLM 0.32 logs
    kv_cache_size_tokens() instead.

    A model without KV cache groups (encoder-only) has no blocks: (0, None)."""
    if not layout["groups"]:
        return 0, None
    num_blocks = max(0, int(kv_cache_bytes) // layout["bytes_per_block"])
    if "kv_cache_groups" in layout:
        # Groups of different block sizes share the pool: no single slot count.
        return num_blocks, None
    tokens = num_blocks // len(layout["groups"]) * layout["block_size"]
    return num_blocks, tokens


def max_concurrency(layout, num_blocks, model_len, max_num_batched_tokens):
    """get_max_concurrency_for_kv_cache_config: requests of model_len tokens at once."""
    if not layout["groups"]:
        return None
    return num_blocks / blocks_per_request(layout, model_len, max_num_batched_tokens)


def kv_cache_size_tokens(concurrency, model_len):
    """The "KV cache size: N tokens" vLLM 0.32 logs (get_kv_cache_capacity):
    int(max_concurrency * max_model_len). With max_model_len 200 and 256 blocks of 128
    it is 25,600, not the 32,768 token slots (measured, docs/lab-vllm.md)."""
    if concurrency is None:
        return None
    return int(concurrency * model_len)


def max_fitting_len(layout, kv_cache_bytes, limit, max_num_batched_tokens, requests=1):
    """Largest model length (<= limit) whose `requests` full-length requests fit
    (estimate_max_model_len's binary search). 0 when not even one token fits."""
    if not layout["groups"]:
        return limit
    num_blocks, _tokens = kv_tokens_from_bytes(layout, kv_cache_bytes)
    # get_kv_cache_configs (vllm/v1/core/kv_cache_utils.py) plans auto-fit and the
    # "To serve at least one request" check against the memory left after the null
    # block the BlockPool holds back (check_memory = available - _pool_bytes_per_block),
    # for every model with KV cache groups. The pool itself is still sized from all
    # the memory: num_blocks, the logged token count and concurrency keep that block.
    num_blocks -= 1

    def fits(length):
        return requests * blocks_per_request(layout, length, max_num_batched_tokens) \
            <= num_blocks

    if not fits(1):
        return 0
    low, high, best = 1, limit, 1
    while low <= high:
        mid = (low + high) // 2
        if fits(mid):
            best, low = mid, mid + 1
        else:
            high = mid - 1
    return best


def pp_layer_ranges(num_layers, pp):
    """[start, end) of each pipeline stage's layers, as vLLM 0.32.0 splits them
    (vllm/distributed/utils.py get_pp_indices without VLLM_PP_LAYER_PARTITION): each
    stage takes num_layers // pp, and the remainder goes one each to the stages before
    the last, from the second-to-last backwards."""
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    ranges, start = [], 0
    for count in parts:
        ranges.append((start, start + count))
        start += count
    return ranges


def pp_embedding_bytes(model, act_bytes):
    """The bytes of one vocab x hidden matrix (the input embedding, or the lm_head),
    in the served dtype; None when config.json lacks vocab_size or hidden_size."""
    model = ModelDescription.of(model)
    vocab, hidden = model.vocab_size, model.hidden_size
    if not vocab or not hidden:
        return None
    return int(vocab) * int(hidden) * act_bytes


def pp_stage_weights(model, weights, act_bytes, ranges):
    """Weight bytes of each stage (all its GPUs together; divide by tp per GPU).

    vLLM (model_executor/models/llama.py and the other SupportsPP models) builds
    embed_tokens on the first stage and lm_head on the last (PPMissingLayer elsewhere);
    with tie_word_embeddings the last stage builds embed_tokens too and ties lm_head to
    it, so it holds one vocab x hidden matrix either way. The checkpoint holds one such
    matrix when tied, two when not (config.json's tie_word_embeddings; transformers'
    default, tied, when it is absent). The rest is spread evenly over the layers."""
    model = ModelDescription.of(model)
    embed = pp_embedding_bytes(model, act_bytes)
    tied = model.tie_word_embeddings
    tied = True if tied is None else bool(tied)
    body = max(0, weights - embed * (1 if tied else 2))
    num_layers = model.num_layers
    out = []
    for stage, (start, end) in enumerate(ranges):
        share = body * (end - start) // num_layers
        ends = (stage == 0) + (stage == len(ranges) - 1)
        if len(ranges) == 1:
            ends = 1 if tied else 2
        out.append(share + embed * ends)
    return out


def pp_stage_layout(layout, model, start, end):
    """The layout of one stage: the model's KV cache groups (built from the whole
    model's layers, get_kv_cache_configs) projected onto the stage's layers
    (_project_kv_cache_groups_to_worker); its bytes per block is the largest group's
    share of those layers times the page (_get_kv_cache_bytes_per_block). The groups,
    and so the blocks one request takes, stay the whole model's."""
    model = ModelDescription.of(model)
    buckets = {}
    for index, kind in enumerate(model.layer_kinds):
        buckets.setdefault(kind, []).append(index)
    widest = 0
    for layers in buckets.values():
        groups = math.ceil(len(layers) / layout["group_size"])
        for i in range(groups):
            widest = max(widest, sum(1 for x in layers[i::groups] if start <= x < end))
    out = dict(layout, bytes_per_block=layout["page_bytes"] * widest,
               stage_layers=[start, end])
    return out


def pp_stages(model, tp, pp, block_size, available, kv_cache_dtype="auto",
              dtype_bytes=2, async_sched=True):
    """vLLM's KV cache blocks per stage for `available` bytes per GPU on each stage
    (a list, one per stage): [{"layers": [start, end], "bytes_per_block",
    "num_blocks"}]. get_kv_cache_configs then gives every worker the smallest
    num_blocks: the tightest stage decides."""
    model = ModelDescription.of(model)
    layout = pp_layout(model, tp, pp, block_size, kv_cache_dtype, dtype_bytes, async_sched)
    out = []
    for (start, end), avail in zip(pp_layer_ranges(model.num_layers, pp), available):
        stage = pp_stage_layout(layout, model, start, end)
        out.append({"layers": [start, end], "bytes_per_block": stage["bytes_per_block"],
                    "num_blocks": max(0, int(avail) // stage["bytes_per_block"])})
    return out


def pp_layout(model, tp, pp, block_size, kv_cache_dtype="auto", dtype_bytes=2,
              async_sched=True):
    """kv_layout() of the whole model at pipeline size pp (its in-flight tokens
    follow pp)."""
    model = ModelDescription.of(model)
    layout = kv_layout(model, tp, block_size, kv_cache_dtype, dtype_bytes, async_sched)
    if pp > 1:
        layout["pipeline_parallel_size"] = pp
    return layout


def pp_problem(model, pp):
    """Why gpufleet does not plan this pipeline size for this model, or None."""
    model = ModelDescription.of(model)
    if pp == 1:
        return None
    if model.attention in ("deepseek_v4", "encoder_only"):
        return (f"pipeline parallelism is not modelled for "
                f"{'DeepSeek-V4' if model.attention == 'deepseek_v4' else 'an encoder-only model'}")
    if model.kind_heads:
        return ("pipeline parallelism is not modelled for layer kinds with pages of two "
                "sizes (Gemma 4)")
    if model.kind == "pooling":
        return "pipeline parallelism is not modelled for a pooling model"
    if pp > model.num_layers:
        return f"the model has {model.num_layers} layers, fewer than {pp} stages"
    if pp_embedding_bytes(model, 2) is None:
        return ("config.json lacks vocab_size or hidden_size, from which the first and "
                "last stages' embedding bytes are computed")
    return None
