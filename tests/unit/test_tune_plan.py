"""gpufleet.tune_plan: the typed records the tuner returns (TunePlan, Prediction), and
their mapping at the boundary (the same keys, in the same order, as tune.plan's)."""
import dataclasses
import json

import pytest

from conftest import FIXTURES
from gpufleet import model as m
from gpufleet import tune as t
from gpufleet.tune_plan import GroupPrediction, Prediction, TunePlan, TunePlanError


def hopper(count):
    return [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81920,
             "compute_capability": "9.0", "architecture": "hopper", "mig_mode": False}
            for i in range(count)]


def describe(name, weights):
    cfg = json.loads((FIXTURES / "models" / name / "config.json").read_text())
    return m.describe(cfg, weights_bytes=weights)


LLAMA = ("llama-3.1-8b", 16_060_522_496)
GEMMA4 = ("gemma-4-31b-it", 62_000_000_000)


def test_make_plan_is_a_typed_record_and_plan_is_its_mapping():
    desc = describe(*LLAMA)
    record = t.make_plan(desc, hopper(1))
    assert isinstance(record, TunePlan) and isinstance(record.prediction, Prediction)
    assert record.prediction.groups is None and record.prediction.pipeline_stages is None
    as_dict = t.plan(desc.as_dict(), hopper(1))
    assert record.as_dict() == as_dict
    assert list(as_dict) == ["settings", "reasons", "prediction", "args"]
    assert list(as_dict["prediction"]) == [
        "kv_bytes_per_token", "kv_bytes_per_token_per_layer", "weights_bytes_per_gpu",
        "overhead_bytes_per_gpu", "kv_cache_bytes", "num_blocks", "kv_cache_tokens",
        "max_concurrency", "max_model_len_that_fits"]
    assert as_dict["args"][:2] == ["--tensor-parallel-size", "1"]
    assert json.loads(json.dumps(as_dict)) == as_dict


def test_optional_prediction_parts_appear_only_when_set():
    plan = t.make_plan(describe(*GEMMA4), hopper(1))
    assert isinstance(plan.prediction.groups, GroupPrediction)
    out = plan.prediction.as_dict()
    assert list(out)[-4:] == ["kv_cache_groups", "bytes_per_block", "blocks_per_request",
                              "fixed_blocks_per_request"]
    assert "pipeline_stages" not in out
    staged = t.make_plan(describe(*LLAMA), hopper(2), pipeline_parallel_size=2,
                         tensor_parallel_size=1)
    assert len(staged.prediction.as_dict()["pipeline_stages"]) == 2


def test_the_records_are_frozen_and_have_no_item_access():
    plan = t.make_plan(describe(*LLAMA), hopper(1))
    with pytest.raises(TypeError):
        plan["args"]  # noqa: B018 (the access itself is the test)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.args = ()


@pytest.mark.parametrize("change, words", [
    ({"num_blocks": 1.5}, "num_blocks is 1.5 (float); it must be int"),
    ({"kv_cache_bytes": "1"}, "kv_cache_bytes is '1' (str)"),
    ({"max_concurrency": True}, "max_concurrency is True (bool)"),
    ({"groups": {}}, "groups is {} (dict)"),
])
def test_a_prediction_with_a_wrong_type_fails_at_construction(change, words):
    good = t.make_plan(describe(*LLAMA), hopper(1)).prediction
    with pytest.raises(TunePlanError) as exc:
        dataclasses.replace(good, **change)
    assert words in str(exc.value)


def test_a_plan_with_a_wrong_type_fails_at_construction():
    good = t.make_plan(describe(*LLAMA), hopper(1))
    with pytest.raises(TunePlanError, match="args is"):
        dataclasses.replace(good, args=list(good.args))
    with pytest.raises(TunePlanError, match="args must hold strings"):
        dataclasses.replace(good, args=("--max-model-len", 8192))
    with pytest.raises(TunePlanError, match="prediction is"):
        dataclasses.replace(good, prediction=good.prediction.as_dict())
