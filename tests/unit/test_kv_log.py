"""gpufleet.kv_log: vLLM's start-up lines about its KV cache, and a prediction against them."""
import pytest

from gpufleet import kv_log
from gpufleet.tune_errors import TuneError


def test_parse_vllm_log_lines_and_compare():
    # Line formats from vllm/v1/core/kv_cache_utils.py _report_kv_cache_config and the
    # CPU backend's "CPU KV cache size: 2,816 tokens" (shared/notes/test-infra.md).
    log = ("INFO [gpu_worker.py:298] Available KV cache memory: 3.81 GiB\n"
           "INFO [kv_cache_utils.py:1087] GPU KV cache size: 31,232 tokens\n"
           "INFO [kv_cache_utils.py:1091] Maximum concurrency for 8,192 tokens per "
           "request: 3.81x\n")
    parsed = kv_log.parse_kv_cache_log(log)
    assert parsed == {"kv_cache_tokens": 31232, "device": "GPU", "max_model_len": 8192,
                      "max_concurrency": 3.81, "available_kv_gib": 3.81}
    assert kv_log.parse_kv_cache_log("CPU KV cache size: 2,816 tokens")["device"] == "CPU"
    cmp = kv_log.compare_with_log(31200, log)
    assert cmp["observed"] == 31232 and abs(cmp["relative_error"]) < 0.01
    with pytest.raises(TuneError, match="no 'KV cache size"):
        kv_log.parse_kv_cache_log("nothing here")
