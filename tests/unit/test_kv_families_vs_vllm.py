"""Every family the tuner describes against vLLM itself (issue #34 item 4).

tests/fixtures/vllm-kv/families.json is what tests/differential/families_vllm.py
printed in the lab image (vllm 0.32.0, CPU build): for one real config.json per
family, the family's own vLLM model class built on the meta device at TP 1/2/4/8,
each attention layer's own get_kv_cache_spec, and vLLM's kv_cache_utils, at several
points (TP, two lengths, max_num_batched_tokens 8192/2048, block size 16/32 or
FlashMLA's 64, KV cache dtype auto/fp8). The tuner must give the same blocks, KV
cache tokens, maximum concurrency, blocks per request, estimated maximum length,
bytes per block and groups, and refuse every TP size vLLM refuses, with the reason
(tests/helpers.kv_plan_vs_vllm). The slow twin re-runs the script on a sample:
tests/slow/test_kv_plan_vs_vllm.py.
"""
import copy
import json

import pytest

from conftest import FIXTURES
from gpufleet import model as m
from gpufleet import model_families
from gpufleet import tune as t
from gpufleet import kv_memory
from helpers import TP_REFUSALS, kv_plan_vs_vllm

RECORDED = json.loads((FIXTURES / "vllm-kv" / "families.json").read_text())
MODELS = RECORDED["models"]


def _one(key):
    return dict(RECORDED, models={key: MODELS[key]})


def test_every_described_family_is_run_or_excluded_with_a_reason():
    """The families of the tuner's table (model_families.KNOWN_MODEL_TYPES, less the
    encoder-only pooling ones, which keep no KV cache) are each in the fixture or in
    its `excluded` list with the reason."""
    assert RECORDED["vllm_version"] == "0.32.0"
    generative = model_families.KNOWN_MODEL_TYPES - model_families.ENCODER_ONLY_MODEL_TYPES
    assert set(MODELS) | set(RECORDED["excluded"]) == generative
    assert not set(MODELS) & set(RECORDED["excluded"])
    assert all(reason for reason in RECORDED["excluded"].values())
    # each fixture config is the family's: the tuner reads it as that model_type
    for key, entry in MODELS.items():
        cfg = json.loads((FIXTURES.parent.parent / entry["config"]).read_text())
        assert m.describe_config(cfg, weights_bytes=1)["model_type"] == key


def test_every_family_was_built_by_its_vllm_model_class():
    for key, entry in MODELS.items():
        assert not any("build_error" in c for c in entry["cases"]), key
        built = [c for c in entry["cases"] if "bytes_per_block" in c]
        assert built, key
        # the layers come from the model class (one KV cache spec per attention layer)
        assert {c["model_class"] for c in built} and all(
            c["attention_layers"] > 0 for c in built), key


@pytest.mark.parametrize("key", sorted(MODELS))
def test_the_tuner_equals_vllm(key):
    compared, refused, diffs = kv_plan_vs_vllm(_one(key), TP_REFUSALS)
    assert not diffs, "\n".join(diffs[:20])
    cases = MODELS[key]["cases"]
    assert refused == sum("bytes_per_block" not in c and "estimated maximum model length"
                          not in c.get("error", "") for c in cases)
    assert compared >= 5 * sum("bytes_per_block" in c for c in cases)


def test_the_points_compared():
    """Per family: every TP size of 1/2/4/8, two KV cache dtypes, two lengths, two
    max_num_batched_tokens, two block sizes (one for MLA)."""
    for key, entry in MODELS.items():
        cases = entry["cases"]
        assert {c["tp"] for c in cases} == {1, 2, 4, 8}, key
        ok = [c for c in cases if "bytes_per_block" in c]
        assert {c["kv_cache_dtype"] for c in ok} == {"auto", "fp8"}, key
        assert {c["max_num_batched_tokens"] for c in ok} == {8192, 2048}, key
        assert len({c["max_model_len"] for c in ok}) == 2, key
        assert {c["block_size"] for c in ok} in ({16, 32}, {64}), key


def test_control_one_kv_head_more_fails_the_family():
    """A tuner one KV head off for one family fails every case of that family."""
    key = "llama"
    original = m.describe_config

    def off_by_one_head(cfg, **kwargs):
        desc = copy.deepcopy(original(cfg, **kwargs))
        desc["num_kv_heads"] += 1
        return desc
    m.describe_config = off_by_one_head
    try:
        _, _, diffs = kv_plan_vs_vllm(_one(key), TP_REFUSALS)
    finally:
        m.describe_config = original
    # every case differs (bytes per block, blocks, tokens..., or a TP size 9 KV heads
    # do not divide): all 32 points of the 64 cases (the label leaves out
    # max_num_batched_tokens)
    labels = {f"{key}  tp={c['tp']} block={c['block_size']} kv={c['kv_cache_dtype']} "
              f"len={c['max_model_len']}" for c in MODELS[key]["cases"]}
    assert {d.split(":")[0] for d in diffs} == labels and len(labels) == 32


def test_control_an_ignored_max_num_batched_tokens_fails_the_sliding_families():
    """A tuner that ignored max_num_batched_tokens (always 8192) differs from vLLM on
    the sliding-window families at 2048 (a sliding layer keeps window - 1 plus the
    in-flight tokens, 2 x max_num_batched_tokens with async scheduling)."""
    baseline = {key for key in MODELS if kv_plan_vs_vllm(_one(key), TP_REFUSALS)[2]}
    original = kv_memory.max_concurrency

    def always_8192(layout, num_blocks, length, mnbt=None, *args, **kwargs):
        return original(layout, num_blocks, length, 8192, *args, **kwargs)
    kv_memory.max_concurrency = always_8192
    try:
        failed = {key for key in MODELS if kv_plan_vs_vllm(_one(key), TP_REFUSALS)[2]}
    finally:
        kv_memory.max_concurrency = original
    # the families with sliding layers whose window bites at these lengths (Gemma 2's
    # 4,096-token window caps both settings alike at 8,192 and 4,097)
    assert failed - baseline == {"cohere2", "exaone4", "exaone4_5_text", "gemma3_text", "gpt_oss",
                      "mistral", "olmo3", "starcoder2"}
