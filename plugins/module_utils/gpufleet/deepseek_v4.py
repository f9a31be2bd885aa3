"""DeepSeek-V4's KV cache as vLLM 0.32.0 plans it on a CUDA GPU (FlashMLA path).

Plain data in, plain data out; no Ansible imports. gpufleet.model describes the
config (describe_fields), gpufleet.tune asks kv_layout() for the cache groups and
counts their blocks per request for concurrency and the longest fitting context.

The spec is vLLM's own code at 0.32.0 (the lab image gpufleet/vllm-cpu:lab), read in
these files (paths under vllm/):

- models/deepseek_v4/attention.py: DeepseekV4Attention.__init__ (compress ratio
  max(1, compress_ratios[i]); an indexer only for ratio 4; the sliding-window cache
  of every layer; a compressor for ratio > 1), get_kv_cache_spec (None for ratio 1,
  else MLAAttentionSpec of block_size tokens, tokens_per_state = ratio, 584-byte
  fp8_ds_mla entries, 576-byte page alignment), _resolve_dsv4_kv_cache_dtype (auto
  and fp8* become fp8_ds_mla; anything else is refused), DeepseekV4Indexer (key
  cache rows of index_head_dim + index_head_dim / 128 * 4 bytes) and
  DeepseekV4IndexerCache.get_kv_cache_spec.
- models/deepseek_v4/compressor.py: CompressorStateCache (fp32 state of
  2 * coff * head_dim, coff 2 for ratio 4 and 1 for 128; block 4 for ratio 4 and 8
  for 128; sliding window coff * ratio).
- v1/attention/backends/mla/sparse_swa.py: DeepseekV4SWACache (block 64, window =
  sliding_window, 584-byte entries, 576-byte alignment).
- models/deepseek_v4/nvidia/model.py _select_dsv4_attn_cls: FlashMLA unless the GPU
  is SM12x; models/deepseek_v4/sparse_mla.py: the FlashMLA backend's only kernel
  block size is 256 (v1/attention/backends/mla/indexer.py: the indexer's too), and
  v1/worker/utils.py select_common_block_size refuses a --block-size that is not a
  multiple of it.
- v1/kv_cache_interface.py: page sizes (AttentionSpec.page_size_bytes,
  _apply_alignment_padding), FullAttentionSpec / SlidingWindowSpec
  max_memory_usage_bytes, UniformTypeKVCacheSpecs.
- v1/core/kv_cache_utils.py: _get_packed_kv_cache_groups (the layout is block-
  outermost, BLHNC, because the V4 indexer backend supports only block-outermost
  layouts), _approximate_gcd, _get_kv_cache_bytes_per_block, get_kv_cache_configs
  (the null block), get_max_concurrency_for_kv_cache_config, get_kv_cache_capacity,
  _estimate_max_model_len_from_groups.
- config/vllm.py max_in_flight_tokens: 2 x max_num_batched_tokens with async
  scheduling, vLLM's default for a generative model on a GPU. The rule is shared
  with every family that has sliding-window layers: gpufleet.kv_memory.in_flight_tokens
  works the number out, and gpufleet.kv_memory.blocks_per_request counts each group's
  blocks from this layout's "kv_cache_groups".

tests/differential/deepseek_v4_vllm.py runs those functions in the image;
tests/slow/test_kv_plan_vs_vllm.py and tests/unit/test_deepseek_v4.py require
this module's numbers to equal theirs.
"""
from __future__ import annotations

from .model_description import ModelDescription

__all__ = [
    "DeepseekV4Error",
    "describe_fields",
    "kv_layout",
    "resolve_kv_cache_dtype",
    "check_block_size",
]

MODEL_TYPE = "deepseek_v4"
ARCHITECTURE = "DeepseekV4ForCausalLM"
# fp8_ds_mla entry: 448 fp8 NoPE + 64 bf16 RoPE (128 bytes) + 8 scale bytes
# (attention.py get_kv_cache_spec state_content_bytes=584; sparse_swa.py
# packed_bytes_per_token=584), pages padded to 576 bytes (FlashMLA's TMA stride).
ENTRY_BYTES = 584
PAGE_ALIGNMENT = 576
HEAD_DIM = 512            # sparse_mla.py get_supported_head_sizes: [512]
SWA_BLOCK_SIZE = 64       # DeepseekV4SWACache(block_size=64)
KERNEL_BLOCK_SIZE = 256   # DeepseekV4SparseMLABackend / DeepseekV4IndexerBackend
INDEXER_HEAD_DIM = 128    # DeepseekCompressor: head_dim 512 (main) or 128 (indexer)
INDEXER_QUANT_BLOCK = 128  # DeepseekV4Indexer.quant_block_size, one fp32 scale each
STATE_DTYPE_BYTES = 4     # CompressorStateCache: float32
STATE_BLOCK_SIZE = {4: 4, 128: 8}  # CompressorStateCache.__init__
RATIOS = (0, 1, 4, 128)   # 0 and 1: sliding window only; CompressorStateCache asserts
# Compute capability majors whose default DeepSeek-V4 attention is FlashMLA
# (_select_dsv4_attn_cls; DeepseekV4SparseMLABackend.supports_compute_capability).
FLASHMLA_MAJORS = (9, 10)
VLLM_VERSION = "0.32.0"


class DeepseekV4Error(ValueError):
    """A DeepSeek-V4 config or setting this module does not model (names the field)."""


def _int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def describe_fields(text, architectures):
    """The V4-specific part of a model description, or DeepseekV4Error naming the
    field gpufleet cannot model."""
    model_type = text.get("model_type")
    if model_type not in (None, MODEL_TYPE):
        raise DeepseekV4Error(
            f"model_type is {model_type!r}: DeepSeek-V4.1 and other variants keep a "
            "bounded-replay sliding window and their own specs (vllm/models/"
            "deepseek_v41); gpufleet models model_type deepseek_v4 only")
    other = [a for a in architectures if a != ARCHITECTURE]
    if other:
        raise DeepseekV4Error(
            f"architectures has {other}: the vision variant "
            "(DeepseekV4ForConditionalGeneration) widens the sliding window by its image "
            f"tokens; gpufleet models {ARCHITECTURE} only")
    if text.get("vision_n_layers"):
        raise DeepseekV4Error("vision_n_layers is set: the vision variant is not modelled")
    layers = text.get("num_hidden_layers")
    if not _int(layers) or layers < 1:
        raise DeepseekV4Error(f"num_hidden_layers is {layers!r}; it must be an integer >= 1")
    ratios = text.get("compress_ratios")
    if not isinstance(ratios, list) or len(ratios) < layers:
        raise DeepseekV4Error(
            f"compress_ratios must list one ratio per layer ({layers}, MTP layers may "
            f"follow); got {ratios!r}")
    per_layer = ratios[:layers]
    bad = sorted({repr(r) for r in per_layer if not _int(r) or r not in RATIOS})
    if bad:
        raise DeepseekV4Error(
            f"compress_ratios has {', '.join(bad)}: vLLM's compressor takes ratios 4 and "
            "128 (CompressorStateCache), 0 and 1 mean the sliding window only")
    if text.get("head_dim") != HEAD_DIM:
        raise DeepseekV4Error(
            f"head_dim is {text.get('head_dim')!r}: the fp8_ds_mla entry of 584 bytes and "
            f"vLLM's sparse MLA kernels are for head_dim {HEAD_DIM} only")
    if 4 in per_layer and text.get("index_head_dim") != INDEXER_HEAD_DIM:
        raise DeepseekV4Error(
            f"index_head_dim is {text.get('index_head_dim')!r}: vLLM's indexer "
            f"compressor takes {INDEXER_HEAD_DIM} only (DeepseekCompressor)")
    window = text.get("sliding_window")
    if not _int(window) or window < 1:
        raise DeepseekV4Error(f"sliding_window is {window!r}: every DeepSeek-V4 layer "
                              "keeps a sliding-window cache; it must be an integer >= 1")
    return {"compress_ratios": [max(1, r) for r in per_layer],
            "sliding_window": window, "head_dim": HEAD_DIM,
            "index_head_dim": text.get("index_head_dim")}


def resolve_kv_cache_dtype(requested):
    """_resolve_dsv4_kv_cache_dtype for the fp8_ds_mla layout: auto and fp8* become
    fp8_ds_mla; anything else is refused with vLLM's reason."""
    requested = requested or "auto"
    if requested == "auto" or requested.startswith("fp8"):
        return "fp8_ds_mla"
    raise DeepseekV4Error(
        f"kv_cache_dtype {requested} is refused: vLLM's DeepSeek-V4 FlashMLA layout "
        "(fp8_ds_mla) only supports an fp8 KV cache (_resolve_dsv4_kv_cache_dtype: "
        "'DeepseekV4 fp8_ds_mla layout only supports fp8 kv-cache'); use auto or fp8")


def check_block_size(block_size):
    """vLLM's worker refuses a block size the 256-token kernels cannot split into
    (select_common_block_size: 'No common block size for 128 (...: [256])')."""
    if block_size % KERNEL_BLOCK_SIZE:
        raise DeepseekV4Error(
            f"block_size {block_size} is refused: DeepSeek-V4's sparse MLA and indexer "
            f"kernels take {KERNEL_BLOCK_SIZE}-token blocks only, and vLLM fails with "
            f"'No common block size for {block_size} (FLASHMLA_SPARSE_DSV4: [256])'; "
            f"use {KERNEL_BLOCK_SIZE}")
    if block_size != KERNEL_BLOCK_SIZE:
        raise DeepseekV4Error(
            f"block_size {block_size}: vLLM accepts it (split into {KERNEL_BLOCK_SIZE}-"
            "token kernel blocks, with a different page alignment), but gpufleet models "
            f"DeepSeek-V4 at --block-size {KERNEL_BLOCK_SIZE} only")


def _padded(size):
    return -(-size // PAGE_ALIGNMENT) * PAGE_ALIGNMENT


def _specs(v4, block_size):
    """Per-layer specs in vLLM's registration order: (kind, block_size, window,
    page_bytes). kind is "full" (MLAAttentionSpec) or "sliding"
    (SlidingWindowMLASpec)."""
    specs = []
    window = v4["sliding_window"]
    for ratio in v4["compress_ratios"]:
        if ratio == 4:
            index_row = INDEXER_HEAD_DIM + INDEXER_HEAD_DIM // INDEXER_QUANT_BLOCK * 4
            specs.append(("full", block_size, None,
                          _padded(block_size // ratio * index_row)))
            state = 2 * 2 * INDEXER_HEAD_DIM * STATE_DTYPE_BYTES
            specs.append(("sliding", STATE_BLOCK_SIZE[4], 2 * 4,
                          _padded(STATE_BLOCK_SIZE[4] * state)))
        specs.append(("sliding", SWA_BLOCK_SIZE, window,
                      _padded(SWA_BLOCK_SIZE * ENTRY_BYTES)))
        if ratio > 1:
            specs.append(("full", block_size, None,
                          _padded(block_size // ratio * ENTRY_BYTES)))
            coff = 1 + (ratio == 4)
            state = 2 * coff * v4["head_dim"] * STATE_DTYPE_BYTES
            specs.append(("sliding", STATE_BLOCK_SIZE[ratio], coff * ratio,
                          _padded(STATE_BLOCK_SIZE[ratio] * state)))
    return specs


def _approximate_gcd(values, lower_bound):
    """kv_cache_utils._approximate_gcd: the chunk size with the least upward padding
    (ties: the larger)."""
    best_d, best_pad = lower_bound, None
    for d in range(lower_bound, max(values) + 1):
        pad = sum((d - x % d) % d for x in values)
        if best_pad is None or pad < best_pad or (pad == best_pad and d > best_d):
            best_d, best_pad = d, pad
    return best_d


def _groups(specs):
    """kv_cache_utils._get_packed_kv_cache_groups for these specs: buckets of one
    type (same block size, and for sliding specs the same window), balanced buckets
    split into groups of a common number of pattern repeats."""
    buckets = []  # [(kind, block_size, window), {page_bytes: count}]
    for kind, block, window, page in specs:
        key = (kind, block, window)
        for bucket in buckets:
            if bucket[0] == key:
                bucket[1][page] = bucket[1].get(page, 0) + 1
                break
        else:
            buckets.append((key, {page: 1}))
    bucketed = []
    for key, pages in buckets:
        balanced = len(set(pages.values())) == 1
        bucketed.append((key, pages, balanced, max(pages.values())))
    floor = max((most for _key, pages, balanced, most in bucketed
                 if balanced and len(pages) > 1), default=0)
    repeats = _approximate_gcd([most for _key, _pages, balanced, most in bucketed if balanced],
                               floor) if floor else None
    groups = []
    for (kind, block, window), pages, balanced, most in bucketed:
        count = -(-most // repeats) if balanced and repeats is not None else 1
        for i in range(count):
            # Group i takes pattern repeats i, i + count, ... (one layer of each page
            # size per repeat).
            layers = {page: len(range(i, n, count)) for page, n in pages.items()}
            groups.append({"kind": kind, "block_size": block, "sliding_window": window,
                           "layers": sum(layers.values()),
                           "page_bytes": sum(p * n for p, n in layers.items())})
    return groups


def kv_layout(model, block_size, kv_cache_dtype="auto"):
    """The KV cache layout vLLM builds for one GPU (tensor parallelism does not
    shard it: every spec has max_tp_shards 1).

    Returns the dict gpufleet.tune uses for every model ("groups", "bytes_per_block",
    "block_size", ...) plus "kv_cache_groups": one entry per KV cache group with its kind,
    block size, window, layer count and bytes per block.
    """
    model = ModelDescription.of(model)
    # vLLM's order: the dtype when the layers are built, the block size when the
    # worker builds its attention metadata.
    resolved = resolve_kv_cache_dtype(kv_cache_dtype)
    check_block_size(block_size)
    v4 = model.deepseek_v4
    specs = _specs(v4, block_size)
    groups = _groups(specs)
    # _get_kv_cache_bytes_per_block (block-outermost): the widest group's pages;
    # every block stride alignment is 1 at block size 256.
    bytes_per_block = max(g["page_bytes"] for g in groups)
    # What one more token of context costs the pool: a block of every full-attention
    # group per block_size tokens (the sliding groups do not grow).
    full_groups = sum(1 for g in groups if g["kind"] == "full")
    per_token = full_groups * bytes_per_block / block_size
    return {"per_token_layer_bytes": per_token / model.num_layers,
            "page_bytes": bytes_per_block, "group_size": None,
            "groups": [g["kind"] for g in groups], "kv_cache_groups": groups,
            "bytes_per_block": bytes_per_block, "block_size": block_size,
            "sliding_window": v4["sliding_window"], "num_layers": model.num_layers,
            "num_specs": len(specs), "kv_cache_dtype": resolved}
