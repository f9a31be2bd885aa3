"""DeepSeek-V4 in the tuner (issue #14 item 6), on the models' own config.json files.

The numbers come from vLLM: tests/fixtures/vllm-kv/deepseek-v4.json is what
tests/differential/deepseek_v4_vllm.py printed in the lab image (vllm 0.32.0), which
builds the V4 layers' KV cache specs and calls vLLM's kv_cache_utils; the tuner must
give the same blocks, concurrency, "KV cache size" tokens and estimated max_model_len
(tests/helpers.kv_plan_vs_vllm; the slow twin re-runs the script:
tests/slow/test_kv_plan_vs_vllm.py). The field scenario (DeepSeek-V4-Pro on 8 B200
with the vllm-openai:deepseekv4-cu130 image) is planned at the end.
"""
import json

import pytest

import vllm_tune
from conftest import FIXTURES
from gpufleet import cuda
from gpufleet import deepseek_v4 as v4
from gpufleet import model as m
from gpufleet import tune as t
from gpufleet import kv_memory
from helpers import DEEPSEEK_V4_REFUSALS, kv_plan_vs_vllm, run_module

MODELS = FIXTURES / "models"
RECORDED = FIXTURES / "vllm-kv" / "deepseek-v4.json"
# NVIDIA B200: 183,359 MiB (about 179 GiB) per GPU, compute capability 10.0.
B200 = {"name": "NVIDIA B200", "memory_total_mib": 183359, "compute_capability": "10.0"}
# DeepSeek-V4-Pro's checkpoint (FP4 experts, FP8 elsewhere): an assumed 865 GB, not
# read from the checkpoint here (with model_path the safetensors headers give it). The
# plan depends on it only through "does it fit on 4 GPUs" (no: 216 GB each).
PRO_WEIGHTS = 865 * 10 ** 9


def config(name):
    return json.loads((MODELS / name / "config.json").read_text())


def describe(name, weights=1):
    return m.describe_config(config(name), weights_bytes=weights, name=name)


def test_recorded_vllm_numbers_equal_the_tuner():
    recorded = json.loads(RECORDED.read_text())
    assert recorded["vllm_version"] == "0.32.0"
    compared, refused, diffs = kv_plan_vs_vllm(recorded, DEEPSEEK_V4_REFUSALS)
    assert not diffs, "\n".join(diffs[:20])
    cases = [c for e in recorded["models"].values() for c in e["cases"]]
    # 2 models x TP 1/2/4/8 x block 128/256 x kv auto/fp8/bfloat16 x 3 lengths
    assert len(cases) == 144
    # vLLM refuses block 128 (kernel blocks of 256) and bfloat16 (fp8_ds_mla layout)
    assert refused == 96
    assert sum("num_blocks" in c for c in cases) == 36   # fits: every number compared
    assert compared == 312


def test_the_comparison_can_fail(monkeypatch):
    """The control: an fp8_ds_mla entry of 576 bytes (the "576B per-token slot" that
    vLLM's own docstring of _resolve_dsv4_kv_cache_dtype names) instead of 584, and
    the recorded vLLM numbers no longer match. (583 would still match: the 576-byte
    page alignment absorbs it.)"""
    recorded = json.loads(RECORDED.read_text())
    monkeypatch.setattr(v4, "ENTRY_BYTES", 576)
    _, _, diffs = kv_plan_vs_vllm(recorded, DEEPSEEK_V4_REFUSALS)
    assert any("bytes_per_block" in d for d in diffs)
    monkeypatch.undo()
    monkeypatch.setattr(kv_memory, "ASYNC_CONCURRENT_BATCHES", 1)  # async scheduling forgotten
    _, _, diffs = kv_plan_vs_vllm(recorded, DEEPSEEK_V4_REFUSALS)
    assert any("blocks_per_request" in d for d in diffs)


@pytest.mark.parametrize("name,layers,c4,c128,window_only", [
    ("deepseek-v4-flash", 43, 21, 20, 2), ("deepseek-v4-pro", 61, 30, 31, 0)])
def test_described_from_its_config(name, layers, c4, c128, window_only):
    desc = describe(name)
    assert desc["attention"] == "deepseek_v4" and desc["known_architecture"]
    kinds = m.model_summary(desc)["layer_kinds"]
    assert kinds == {k: n for k, n in (("c4a", c4), ("c128a", c128),
                                       ("sliding", window_only)) if n}
    assert desc["deepseek_v4"]["sliding_window"] == 128
    assert len(desc["deepseek_v4"]["compress_ratios"]) == layers  # MTP entry dropped
    assert t.model_max_len(desc) == 1048576  # yarn: max_position_embeddings as it stands


def test_pro_layout_by_hand():
    """The Pro's caches at block 256, fp8_ds_mla (page sizes padded to 576 bytes)."""
    layout = kv_memory.kv_layout(describe("deepseek-v4-pro"), 8, 256, "fp8")
    assert layout["kv_cache_dtype"] == "fp8_ds_mla"
    # c4a: 64 entries x 584 = 37,376 -> 37,440; c128a: 2 x 584 -> 1,728;
    # indexer: 64 x 132 -> 8,640; one 64-token window page 37,440.
    full = next(g for g in layout["kv_cache_groups"] if g["kind"] == "full")
    assert full["layers"] == 31 + 30 + 30
    assert full["page_bytes"] == 31 * 1728 + 30 * 37440 + 30 * 8640 == 1435968
    assert layout["bytes_per_block"] == 1435968
    assert [(g["layers"], g["block_size"], g["sliding_window"])
            for g in layout["kv_cache_groups"]] == [
        (31, 64, 128), (30, 64, 128), (91, 256, None), (31, 8, 128), (60, 4, 8)]
    # Per request, whatever its length: 2 x (cdiv(127 + 16,384, 64) + 1) window blocks,
    # cdiv(127 + 16,384, 8) + 1 and cdiv(7 + 16,384, 4) + 1 compressor-state blocks.
    assert kv_memory.in_flight_tokens(layout, 8192) == 16384  # async scheduling on a GPU
    assert kv_memory.fixed_blocks_per_request(layout, 16384) == 2 * 259 + 2065 + 4099 == 6682
    assert kv_memory.blocks_per_request(layout, 1048576, 8192) == 6682 + 4096


@pytest.mark.parametrize("field,value,needle", [
    ("compress_ratios", [16] * 61, "compress_ratios has 16"),
    ("head_dim", 256, "head_dim is 256"),
    ("index_head_dim", 64, "index_head_dim is 64"),
    ("model_type", "deepseek_v41", "model_type is 'deepseek_v41'"),
    ("architectures", ["DeepseekV4ForConditionalGeneration"], "vision variant"),
    ("sliding_window", None, "sliding_window is None"),
    ("compress_ratios", [4] * 10, "one ratio per layer"),
])
def test_what_it_cannot_model_is_refused_by_field(field, value, needle):
    cfg = dict(config("deepseek-v4-pro"), **{field: value})
    with pytest.raises(m.UnsupportedModelError) as exc:
        m.describe_config(cfg, weights_bytes=1)
    assert needle in str(exc.value) and "not modelled" in str(exc.value)


def test_block_size_and_kv_dtype_refused_as_vllm_does():
    gpus = [B200] * 8
    desc = describe("deepseek-v4-pro", PRO_WEIGHTS)
    with pytest.raises(t.TuneError, match="No common block size for 128"):
        t.plan(desc, gpus, block_size=128)
    with pytest.raises(t.TuneError, match="only supports fp8 kv-cache"):
        t.plan(desc, gpus, kv_cache_dtype="bfloat16")
    with pytest.raises(t.TuneError, match="compute capability 8.0 is not modelled"):
        t.plan(desc, [dict(B200, compute_capability="8.0")] * 8)
    with pytest.raises(t.TuneError, match="CPU backend is not modelled"):
        t.plan(desc, [], kv_cache_memory_bytes=10 ** 10)


def test_plan_prediction_equals_vllm_for_a_recorded_case():
    """The module's prediction (not just the layout functions) for one recorded
    case: Flash, TP 4, block 256, auto, max_model_len 200,001."""
    recorded = json.loads(RECORDED.read_text())
    case = next(c for c in recorded["models"]["flash"]["cases"]
                if (c["tp"], c["block_size"], c["kv_cache_dtype"], c["max_model_len"])
                == (4, 256, "auto", 200001))
    result = t.plan(describe("deepseek-v4-flash"), [B200] * 4, tensor_parallel_size=4,
                    max_model_len=200001, kv_cache_memory_bytes=case["available_bytes"],
                    block_size=256)
    p = result["prediction"]
    assert p["num_blocks"] == case["num_blocks"]
    assert p["kv_cache_tokens"] == case["kv_cache_size_tokens"]
    assert p["max_concurrency"] == round(case["max_concurrency"], 2)
    assert p["blocks_per_request"] == case["blocks_per_request"]
    assert p["max_model_len_that_fits"] == case["estimated_max_model_len"]


def test_seed_scenario_pro_on_8_b200_cu130(monkeypatch):
    """The field scenario: DeepSeek-V4-Pro on 8x B200 with the
    vllm/vllm-openai:deepseekv4-cu130 image."""
    result, failed = run_module(vllm_tune.main, {
        "model_config": config("deepseek-v4-pro"), "weights_bytes": PRO_WEIGHTS,
        "gpus": [B200] * 8, "kv_cache_dtype": "fp8", "block_size": 256}, monkeypatch)
    assert not failed, result.get("msg")
    s, p = result["settings"], result["prediction"]
    assert s["tensor_parallel_size"] == 8 and s["enable_expert_parallel"]
    assert s["kv_cache_dtype"] == "fp8" and s["block_size"] == 256
    assert s["max_model_len"] == 1048576  # the whole context fits on 8 B200s
    assert s["docker"] == {"ipc_mode": "host"}
    args = result["args"]
    for flag, value in (("--tensor-parallel-size", "8"), ("--block-size", "256"),
                        ("--kv-cache-dtype", "fp8"), ("--max-model-len", "1048576")):
        assert args[args.index(flag) + 1] == value
    assert "--enable-expert-parallel" in args
    # about 4 requests of the full million tokens at once on each TP group
    assert 3 < p["max_concurrency"] < 6 and p["fixed_blocks_per_request"] == 6682
    # 4 GPUs cannot hold 865 GB of weights: auto picks 8
    assert any("tensor_parallel_size 8" in r for r in result["reasons"])
    # CUDA 13.0 in the image needs driver >= 580 (gpufleet.cuda decides, not this test)
    old = cuda.check("570.195.03", ["10.0"], cuda_version="13.0", datacenter_gpu=True)
    new = cuda.check("580.65.06", ["10.0"], cuda_version="13.0", datacenter_gpu=True)
    assert (old["compatible"], new["compatible"]) == (False, True)
    assert old["min_driver"] == new["min_driver"] == "580.65.06"


def test_module_refuses_block_128_naming_vllm_error(monkeypatch):
    result, failed = run_module(vllm_tune.main, {
        "model_config": config("deepseek-v4-flash"), "weights_bytes": 160 * 10 ** 9,
        "gpus": [B200] * 4, "block_size": 128}, monkeypatch)
    assert failed and "No common block size for 128" in result["msg"]
