"""Pipeline parallelism on one host (issue #34 item 3): the tuner against vLLM 0.32.0's
own arithmetic, recorded by tests/differential/pp_vllm.py in the lab image into
tests/fixtures/vllm-kv/pipeline-parallel.json (vLLM's get_pp_indices, each stage's
projected KV cache groups, bytes per block and blocks, get_kv_cache_configs' minimum,
maximum concurrency, "KV cache size" tokens, in-flight tokens, estimated maximum model
length). Exact for layer ranges, bytes per block and block counts. Plus the plan:
the option, its refusals, the emitted flag, and PP 1 unchanged.
"""
import copy
import json
import os

import pytest

from gpufleet import engine_args, model as m, tune
from gpufleet import kv_memory

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "vllm-kv", "pipeline-parallel.json")
with open(FIXTURE) as handle:
    RECORDED = json.load(handle)

H100 = [{"memory_total_mib": 81559, "compute_capability": "9.0",
         "name": "NVIDIA H100 80GB HBM3", "memory_reserved_mib": 500}]


def _model(key):
    folder = os.path.join(ROOT, os.path.dirname(RECORDED["models"][key]["config"]))
    return m.describe_model_dir(folder, weights_bytes=10 ** 9)


CASES = [(key, case) for key, entry in sorted(RECORDED["models"].items())
         for case in entry["cases"]]


def tuner_numbers(model, case, derived, ignore_stages=False):
    """What the tuner says for one recorded case. ignore_stages: the control, a tuner
    that plans the whole model on one stage (as before issue #34 item 3)."""
    tp, pp, mnbt = case["tp"], case["pp"], case["max_num_batched_tokens"]
    avail = case["stage_available_bytes"]
    if ignore_stages:
        layout = kv_memory.kv_layout(model, tp, case["block_size"])
        stages = [{"layers": [0, model["num_layers"]],
                   "bytes_per_block": layout["bytes_per_block"],
                   "num_blocks": a // layout["bytes_per_block"]} for a in avail]
        stage_layouts = [layout] * pp
    else:
        layout = kv_memory.pp_layout(model, tp, pp, case["block_size"])
        stages = kv_memory.pp_stages(model, tp, pp, case["block_size"], avail)
        stage_layouts = [kv_memory.pp_stage_layout(layout, model, *st["layers"])
                         for st in stages]
    num_blocks = min(st["num_blocks"] for st in stages)
    length = case["max_model_len"]
    concurrency = kv_memory.max_concurrency(layout, num_blocks, length, mnbt)
    return {
        "stages": stages,
        "num_blocks": num_blocks,
        "max_in_flight_tokens": kv_memory.in_flight_tokens(layout, mnbt),
        "max_concurrency": concurrency,
        "kv_cache_size_tokens": kv_memory.kv_cache_size_tokens(concurrency, length),
        "estimated_max_model_len": min(
            kv_memory.max_fitting_len(sl, a, derived, mnbt)
            for sl, a in zip(stage_layouts, avail)),
    }


def mismatches(recorded, ours):
    """The fields where the tuner differs from vLLM's record (exact, but for the
    float concurrency)."""
    out = []
    if [s["layers"] for s in recorded["stages"]] != [list(s["layers"]) for s in ours["stages"]]:
        out.append("layers")
    for field in ("bytes_per_block", "num_blocks"):
        if [s[field] for s in recorded["stages"]] != [s[field] for s in ours["stages"]]:
            out.append(f"stages.{field}")
    for field in ("num_blocks", "max_in_flight_tokens", "kv_cache_size_tokens",
                  "estimated_max_model_len"):
        if recorded.get(field) != ours[field]:
            out.append(field)
    if abs(recorded["max_concurrency"] - ours["max_concurrency"]) > 1e-9:
        out.append("max_concurrency")
    return out


def test_the_fixture_is_vllms_and_covers_the_shapes():
    assert RECORDED["vllm_version"] == "0.32.0"
    assert set(RECORDED["models"]) == {"llama-3.1-8b", "llama-3.1-70b", "gemma-2-9b-it",
                                       "gemma-3-1b-it"}
    assert len(CASES) == 32
    assert {(c["tp"], c["pp"]) for _, c in CASES} == {(1, 2), (2, 2), (1, 4), (2, 4)}
    assert not [c for _, c in CASES if "error" in c]
    # the tightest stage is not always an end stage: Gemma 2's 42 layers split
    # 10/11/11/10, and its middle stages' larger groups give fewer blocks at TP 2 x PP 4
    gemma2 = [c for k, c in CASES if k == "gemma-2-9b-it" and (c["tp"], c["pp"]) == (2, 4)]
    blocks = [s["num_blocks"] for s in gemma2[0]["stages"]]
    assert blocks.index(min(blocks)) == 1


@pytest.mark.parametrize("key, case", CASES,
                         ids=[f"{k}-tp{c['tp']}xpp{c['pp']}-len{c['max_model_len']}"
                              for k, c in CASES])
def test_the_tuner_matches_vllm_per_stage(key, case):
    derived = RECORDED["models"][key]["derived_max_model_len"]
    ours = tuner_numbers(_model(key), case, derived)
    assert mismatches(case, ours) == [], (ours, case)


def test_control_a_tuner_ignoring_stages_fails_every_case():
    failed = 0
    for key, case in CASES:
        derived = RECORDED["models"][key]["derived_max_model_len"]
        if mismatches(case, tuner_numbers(_model(key), case, derived, ignore_stages=True)):
            failed += 1
    assert failed == len(CASES)


def test_control_an_altered_fixture_fails():
    key, case = CASES[0]
    derived = RECORDED["models"][key]["derived_max_model_len"]
    ours = tuner_numbers(_model(key), case, derived)
    assert mismatches(case, ours) == []
    for change in ("stage_blocks", "layers", "concurrency"):
        altered = copy.deepcopy(case)
        if change == "stage_blocks":
            altered["stages"][-1]["num_blocks"] += 1
        elif change == "layers":
            altered["stages"][0]["layers"][1] += 1
        else:
            altered["max_concurrency"] *= 1.001
        assert mismatches(altered, ours), change


def test_layer_split_is_get_pp_indices():
    # vllm/distributed/utils.py: the remainder goes to the stages before the last
    assert kv_memory.pp_layer_ranges(42, 4) == [(0, 10), (10, 21), (21, 32), (32, 42)]
    assert kv_memory.pp_layer_ranges(32, 5) == [(0, 6), (6, 12), (12, 19), (19, 26), (26, 32)]
    assert kv_memory.pp_layer_ranges(80, 3) == [(0, 27), (27, 54), (54, 80)]
    assert kv_memory.pp_layer_ranges(7, 1) == [(0, 7)]


def test_stage_weights_embedding_first_lm_head_last():
    model = dict(_model("llama-3.1-8b"), vocab_size=1000, hidden_size=10, num_layers=4)
    embed = 1000 * 10 * 2
    untied = dict(model, tie_word_embeddings=False)
    weights = 2 * embed + 4000
    assert kv_memory.pp_stage_weights(untied, weights, 2, [(0, 4)]) == [weights]
    assert kv_memory.pp_stage_weights(untied, weights, 2, [(0, 2), (2, 4)]) == [
        embed + 2000, embed + 2000]
    assert kv_memory.pp_stage_weights(untied, weights, 2, [(0, 1), (1, 3), (3, 4)]) == [
        embed + 1000, 2000, embed + 1000]
    # tied: one matrix in the checkpoint, but the last stage builds its own copy
    tied = dict(model, tie_word_embeddings=True)
    assert kv_memory.pp_stage_weights(tied, embed + 4000, 2, [(0, 2), (2, 4)]) == [
        embed + 2000, embed + 2000]


def _llama70():
    return m.describe_model_dir(os.path.join(ROOT, "tests/fixtures/models/llama-3.1-70b"),
                                weights_bytes=141 * 10 ** 9)


def test_plan_emits_the_flag_and_the_tightest_stage():
    result = tune.plan(_llama70(), H100 * 8, tensor_parallel_size=2,
                       pipeline_parallel_size=4)
    args = result["args"]
    assert args[args.index("--pipeline-parallel-size") + 1] == "4"
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    assert result["settings"]["pipeline_parallel_size"] == 4
    assert result["settings"]["replicas"] == 1
    assert result["settings"]["docker"] == {"ipc_mode": "host"}
    stages = result["prediction"]["pipeline_stages"]
    assert [s["layers"] for s in stages] == [[0, 20], [20, 40], [40, 60], [60, 80]]
    # the end stages hold the embedding / lm_head: fewer blocks, and they decide
    assert stages[0]["weights_bytes_per_gpu"] > stages[1]["weights_bytes_per_gpu"]
    assert result["prediction"]["num_blocks"] == min(s["num_blocks"] for s in stages)
    assert any("pipeline_parallel_size 4" in r for r in result["reasons"])


def test_plan_auto_tp_fits_within_tp_times_pp():
    result = tune.plan(_llama70(), H100 * 8, pipeline_parallel_size=2)
    tp = result["settings"]["tensor_parallel_size"]
    assert tp * 2 <= 8
    assert result["settings"]["replicas"] == 8 // (tp * 2)


def test_pp_1_is_the_plan_without_the_option():
    model = _llama70()
    a = tune.plan(model, H100 * 8)
    b = tune.plan(model, H100 * 8, pipeline_parallel_size=1)
    assert a == b
    assert "--pipeline-parallel-size" not in a["args"]
    assert "pipeline_stages" not in a["prediction"]


@pytest.mark.parametrize("kwargs, words", [
    ({"tensor_parallel_size": 4, "pipeline_parallel_size": 4}, "needs 16 GPUs"),
    ({"pipeline_parallel_size": 16}, "needs at least 16 GPUs"),
    ({"pipeline_parallel_size": 0}, "pipeline_parallel_size 0 is refused"),
    ({"pipeline_parallel_size": True}, "pipeline_parallel_size True is refused"),
])
def test_plan_refuses_sizes_that_do_not_fit(kwargs, words):
    with pytest.raises(tune.TuneError) as err:
        tune.plan(_llama70(), H100 * 8, **kwargs)
    assert words in str(err.value), err.value


def test_pp_refused_where_not_modelled():
    small = m.describe_model_dir(os.path.join(ROOT, "tests/fixtures/models/llama-3.1-8b"),
                                 weights_bytes=16 * 10 ** 9)
    with pytest.raises(tune.TuneError, match="CPU target"):
        tune.plan(small, [], kv_cache_memory_bytes=2 ** 30, pipeline_parallel_size=2)
    v4 = m.describe_model_dir(os.path.join(ROOT, "tests/fixtures/models/deepseek-v4-flash"),
                              weights_bytes=10 ** 9)
    with pytest.raises(tune.TuneError, match="not modelled for DeepSeek-V4"):
        tune.plan(v4, H100 * 8, pipeline_parallel_size=2)
    with pytest.raises(tune.TuneError, match="fewer than"):
        tune.plan(dict(small, num_layers=1, layer_kinds=["full"]), H100 * 8,
                  pipeline_parallel_size=2)


def test_extra_args_pp_is_refused_naming_the_option():
    for flag in ("--pipeline-parallel-size", "-pp"):
        assert engine_args.classify(flag) == "tuned"
        assert "the option pipeline_parallel_size" in engine_args.refusal(flag)


def test_nothing_fits_names_tp_times_pp_gpus():
    a10g = [{"memory_total_mib": 24000, "compute_capability": "8.6", "name": "A10G",
             "memory_reserved_mib": 500}]
    with pytest.raises(tune.NoFitError) as err:
        tune.plan(_llama70(), a10g * 2, pipeline_parallel_size=2)
    assert err.value.nearest == {"gpus_needed": 16}
    assert "tensor_parallel_size 8 x pipeline_parallel_size 2" in str(err.value)
