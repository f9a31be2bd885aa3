"""Gemma 4 in the tuner (issue #14 item 5): layer kinds with their own head size and KV
heads, so pages of two sizes, on gemma-4-26B-A4B's and gemma-4-31B-it's own config.json
files (gemma-4-E2B-it's is refused: shared KV layers).

The numbers come from vLLM: tests/fixtures/vllm-kv/gemma-4.json is what
tests/differential/gemma4_vllm.py printed in the lab image (vllm 0.32.0), which builds
each layer's KV cache spec from vLLM's own per-layer config and calls vLLM's
kv_cache_utils; the tuner must give the same groups, blocks, concurrency, "KV cache
size" tokens and estimated max_model_len (tests/helpers.kv_plan_vs_vllm; the slow twin
re-runs the script: tests/slow/test_kv_plan_vs_vllm.py).

Worked by hand, TP 2 on a Hopper GPU (block 16, bfloat16): a sliding layer holds
8 / 2 = 4 KV heads x 256, a page of 2 x 4 x 256 x 2 bytes x 16 tokens = 65,536 bytes;
a full-attention layer max(1, 2 / 2) = 1 x 512, 32,768 bytes. vLLM keeps the larger
page and gives the full layers 32-token blocks (unify_kv_cache_spec_page_size); 25
sliding and 5 full layers make six groups of 5 (group size: the smaller count), so a
block is 5 x 65,536 = 327,680 bytes. A request of 131,072 tokens holds 131,072 / 32 =
4,096 full blocks and, in each of the five sliding groups, cdiv(1,023 + 2 x 8,192,
16) + 1 = 1,089: 9,541 blocks.
"""
import json

import pytest

from conftest import FIXTURES
from gpufleet import model as m
from gpufleet import tune as t
from gpufleet import kv_memory
from gpufleet import kv_log
from helpers import kv_plan_vs_vllm
from test_tune_lab_hybrid import (TINY_GEMMA4_CASES, TINY_GEMMA4_CONFIG,
                                  TINY_GEMMA4_WEIGHTS_BYTES)

RECORDED = FIXTURES / "vllm-kv" / "gemma-4.json"
H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559,
        "compute_capability": "9.0"}
L40S = {"name": "NVIDIA L40S", "memory_total_mib": 46068, "compute_capability": "8.9"}
B200 = {"name": "NVIDIA B200", "memory_total_mib": 183359, "compute_capability": "10.0"}
# gemma-4-26B-A4B's checkpoint: about 51.6 GB in bfloat16 (an assumed figure; with
# model_path the safetensors headers give it).
WEIGHTS = 51_600_000_000


def config():
    return json.loads((FIXTURES / "models" / "gemma-4-26b-a4b" / "config.json").read_text())


def describe(cfg=None):
    return m.describe_config(cfg or config(), weights_bytes=WEIGHTS)


def test_described_from_its_own_config():
    desc = describe()
    assert desc["model_type"] == "gemma4_text" and desc["known_architecture"]
    assert desc["layer_kinds"] == (["sliding"] * 5 + ["full"]) * 5
    assert desc["kind_heads"] == {"sliding": {"num_kv_heads": 8, "head_size": 256},
                                  "full": {"num_kv_heads": 2, "head_size": 512}}
    assert (desc["num_kv_heads"], desc["head_size"]) == (8, 256)  # get_head_size()
    assert desc["sliding_window"] == 1024 and desc["attention"] == "gqa+sliding"
    assert t.model_max_len(desc) == 262144  # vLLM's derived length (recorded)


def test_31b_described_from_its_own_config():
    """google/gemma-4-31B-it: dense, 60 layers, 16 KV heads x 256 sliding (window
    1,024), 4 x 512 full (attention_k_eq_v)."""
    cfg = json.loads((FIXTURES / "models" / "gemma-4-31b-it" / "config.json").read_text())
    desc = m.describe_config(cfg, weights_bytes=1)
    assert desc["layer_kinds"] == (["sliding"] * 5 + ["full"]) * 10
    assert desc["kind_heads"] == {"sliding": {"num_kv_heads": 16, "head_size": 256},
                                  "full": {"num_kv_heads": 4, "head_size": 512}}
    assert desc["moe"] is None and t.model_max_len(desc) == 262144


def test_e2b_refused_for_its_shared_kv_layers():
    """google/gemma-4-E2B-it: its last 20 of 35 layers read an earlier layer's cache
    (gemma4.py:471-491), which the tuner does not model."""
    cfg = json.loads((FIXTURES / "models" / "gemma-4-e2b-it" / "config.json").read_text())
    with pytest.raises(m.UnsupportedModelError, match=r"^num_kv_shared_layers is set "
                       r"\(20\): cross-layer KV sharing \(Gemma 3n, Gemma 4 E2B/E4B\)"):
        m.describe_config(cfg, weights_bytes=1)


def test_recorded_vllm_numbers_equal_the_tuner():
    recorded = json.loads(RECORDED.read_text())
    assert recorded["vllm_version"] == "0.32.0"
    compared, refused, diffs = kv_plan_vs_vllm(recorded)
    assert not diffs, "\n".join(diffs[:20])
    models = recorded["models"]
    cases = [c for e in models.values() for c in e["cases"]]
    # per model, FlashAttention: TP 1/2/4/8 x 3 lengths; Triton: also fp8; CPU: TP 1
    assert all(len(e["cases"]) == 12 + 24 + 3 for e in models.values()) and len(models) == 2
    # the rest do not fit in 3 GiB (TP 1) or 17 GiB (31B at TP 2): vLLM's error, its
    # estimate compared
    assert sum("num_blocks" in c for c in cases) == 32 + 27
    assert compared == 508 and refused == 0
    # what vLLM resolved: LBNHC on the GPUs, LBHNC on the CPU, never block-outermost
    assert {(c["target"], c["kv_cache_layout"]) for c in cases} == {
        ("cuda-flash-attn", "LBNHC"), ("cuda-triton", "LBNHC"), ("cpu", "LBHNC")}
    # two page sizes except where the split evens them: 26B-A4B at TP 4 (2 x 256
    # sliding = 1 x 512 full), 31B at TP 8 (2 x 256 = 1 x 512)
    for key, tp in (("26b-a4b", 4), ("31b-it", 8)):
        assert {c["tp"] for c in models[key]["cases"] if len(c["layer_pages"]) == 1} == {tp}


def _pad_instead_of_scale(original):
    def layout(model, counts, kind_bytes, block_size, async_sched):
        out = original(model, counts, kind_bytes, block_size, async_sched)
        for group in out["kv_cache_groups"]:
            group["block_size"] = block_size
        return out
    return layout


def test_the_comparison_can_fail(monkeypatch):
    """Controls: the smaller page padded instead of its block size scaled (what vLLM
    does only when the pages do not divide), and the full layers' own KV heads
    forgotten; each must show against the recorded vLLM numbers."""
    recorded = json.loads(RECORDED.read_text())
    monkeypatch.setattr(kv_memory, "_unified_page_layout",
                        _pad_instead_of_scale(kv_memory._unified_page_layout))
    _, _, diffs = kv_plan_vs_vllm(recorded)
    assert any("blocks_per_request" in d for d in diffs)
    assert any("estimated_max_model_len" in d for d in diffs)
    monkeypatch.undo()
    cfg = config()
    cfg["text_config"]["attention_k_eq_v"] = False  # full layers: 8 KV heads
    wrong = describe(cfg)
    assert wrong["kind_heads"]["full"]["num_kv_heads"] == 8
    monkeypatch.setattr(m, "describe_config", lambda *a, **k: wrong)
    _, _, diffs = kv_plan_vs_vllm(recorded)
    assert any("bytes_per_block" in d for d in diffs)


def test_plan_prediction_equals_vllm_for_a_recorded_case():
    """The module's prediction, not only the layout functions: FlashAttention, TP 2,
    max_model_len 131,072 (the case worked by hand in the docstring)."""
    recorded = json.loads(RECORDED.read_text())
    case = next(c for c in recorded["models"]["26b-a4b"]["cases"]
                if (c["target"], c["tp"], c["max_model_len"])
                == ("cuda-flash-attn", 2, 131072))
    result = t.plan(describe(), [H100] * 2, tensor_parallel_size=2, max_model_len=131072,
                    kv_cache_memory_bytes=case["available_bytes"])
    p, s = result["prediction"], result["settings"]
    assert s["block_size"] == 16 and s["kv_cache_dtype"] == "auto"
    assert p["bytes_per_block"] == case["bytes_per_block"] == 327680
    assert p["num_blocks"] == case["num_blocks"] == 55705
    assert p["blocks_per_request"] == case["blocks_per_request"] == 9541
    assert p["kv_cache_tokens"] == case["kv_cache_size_tokens"]
    assert p["max_concurrency"] == round(case["max_concurrency"], 2)
    assert p["fixed_blocks_per_request"] == 5 * 1089
    assert [(g["kind"], g["block_size"]) for g in p["kv_cache_groups"]] == \
        [("sliding", 16)] * 5 + [("full", 32)]
    assert any("FlashAttention 4" in r and "LBNHC" in r for r in result["reasons"])
    assert any("full layers 32-token blocks" in r for r in result["reasons"])


def test_backends_gpufleet_does_not_model_are_refused_with_the_reason():
    desc = describe()
    with pytest.raises(t.TuneError, match="Blackwell data-center GPUs.*128-token pages"):
        t.plan(desc, [B200])
    with pytest.raises(t.TuneError, match="fp8 on compute capability 9.0 is not "
                       "modelled.*64-token pages"):
        t.plan(desc, [H100] * 2, kv_cache_dtype="fp8")
    # allow_fp8 only allows it: on Hopper the plan keeps auto and says why
    result = t.plan(desc, [H100] * 2, allow_fp8=True)
    assert result["settings"]["kv_cache_dtype"] == "auto"
    assert any("kv_cache_dtype auto, not fp8" in r for r in result["reasons"])
    # Ada runs Triton, where an fp8 cache is modelled (recorded: cuda-triton fp8)
    result = t.plan(desc, [L40S] * 2, kv_cache_dtype="fp8")
    assert result["settings"]["kv_cache_dtype"] == "fp8"
    assert any("runs Triton" in r for r in result["reasons"])


def test_cpu_backend_plan():
    result = t.plan(describe(), [], kv_cache_memory_bytes=8 * 2 ** 30)
    groups = result["prediction"]["kv_cache_groups"]
    assert [(g["kind"], g["block_size"]) for g in groups] == \
        [("sliding", 128)] * 5 + [("full", 256)]
    assert any("CPU_ATTN" in r for r in result["reasons"])


def test_tensor_parallel_checked_for_each_layer_kind():
    desc = describe()
    assert t.tp_problem(desc, 4) is None  # 2 full KV heads: one per GPU, replicated
    assert "not divisible" in t.tp_problem(desc, 3)  # 16 attention heads
    odd = dict(desc, kind_heads=dict(desc["kind_heads"],
                                     full={"num_kv_heads": 3, "head_size": 512}),
               num_attention_heads=24)
    assert t.tp_problem(odd, 2) == ("full layers' kv heads (3) are not divisible by "
                                    "tensor parallel size 2")
    assert t.tp_problem(odd, 4) == ("full layers' kv heads 3: tensor parallel size 4 is "
                                    "neither a divisor nor a multiple of 3")


@pytest.mark.parametrize("change, field", [
    ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention"),
    ({"num_kv_shared_layers": 10}, "num_kv_shared_layers"),  # Gemma 4 E2B / E4B
    ({"model_type": "gemma4_unified_text"}, "global_head_dim"),  # not read
])
def test_variants_not_modelled_are_refused_by_their_field(change, field):
    cfg = config()
    cfg["text_config"].update(change)
    with pytest.raises(m.UnsupportedModelError, match=f"^{field} is set"):
        describe(cfg)


def test_the_last_layer_is_full_as_transformers_forces_it():
    cfg = config()
    cfg["text_config"]["layer_types"][-1] = "sliding_attention"
    assert describe(cfg)["layer_kinds"][-1] == "full"


def test_defaults_of_the_config_class():
    """Gemma4TextConfig's defaults where config.json is silent: global_head_dim 512,
    and without attention_k_eq_v the full layers keep num_key_value_heads."""
    cfg = config()
    for field in ("global_head_dim", "attention_k_eq_v"):
        del cfg["text_config"][field]
    assert describe(cfg)["kind_heads"]["full"] == {"num_kv_heads": 8, "head_size": 512}


# --- the lab's gpufleet/tiny-gemma4 against what a running vLLM logged ---------------
# Its config and log lines live with the other lab hybrid's in test_tune_lab_hybrid.py,
# whose parametrized test requires the module's prediction to equal them.


def test_tiny_gemma4_control_padding_fails_the_log(monkeypatch):
    """The full page padded to 65,536 B at 128 tokens: 5 x 21 + 32 = 137 blocks per
    request at L 4096, 30,615 tokens / 7.47x, not vLLM's 34,663 / 8.46x."""
    monkeypatch.setattr(kv_memory, "_unified_page_layout",
                        _pad_instead_of_scale(kv_memory._unified_page_layout))
    max_model_len, kv_bytes, _, logged = TINY_GEMMA4_CASES[0]
    desc = m.describe_config(TINY_GEMMA4_CONFIG, TINY_GEMMA4_WEIGHTS_BYTES)
    p = t.plan(desc, [], kv_cache_memory_bytes=kv_bytes, max_model_len=max_model_len,
               dtype="bfloat16")["prediction"]
    log = kv_log.parse_kv_cache_log(logged)
    assert p["blocks_per_request"] == 137
    assert (p["kv_cache_tokens"], p["max_concurrency"]) == (30615, 7.47)
    assert abs(p["kv_cache_tokens"] - log["kv_cache_tokens"]) > 128


def _saved_by_transformers_5_24(cfg):
    """The same config as transformers 5.24's save_pretrained writes it: the full
    layer's head size and KV heads in per_layer_config, without global_head_dim /
    num_global_key_value_heads (lab/models/build_models.py build_tiny_gemma4 checks
    that this is what it writes)."""
    cfg = {k: v for k, v in cfg.items()
           if k not in ("global_head_dim", "num_global_key_value_heads")}
    cfg["per_layer_config"] = {"5": {"head_dim": 64, "num_key_value_heads": 1}}
    return cfg


def test_per_layer_config_read_as_vllm_reads_it():
    """vLLM 0.32.0 logged 34,663 tokens / 8.46x for the tiny-gemma4 folder saved in
    transformers 5.24's layout too (2026-12-05, helper run, docs/tuning.md); the tuner
    used to take global_head_dim's default 512 and the sliding layers' 4 KV heads for
    the full layer there (5,577 tokens / 1.36x)."""
    cfg = _saved_by_transformers_5_24(TINY_GEMMA4_CONFIG)
    desc = m.describe_config(cfg, TINY_GEMMA4_WEIGHTS_BYTES)
    assert desc["kind_heads"] == {"sliding": {"num_kv_heads": 4, "head_size": 32},
                                  "full": {"num_kv_heads": 1, "head_size": 64}}
    max_model_len, kv_bytes, _, logged = TINY_GEMMA4_CASES[0]
    p = t.plan(desc, [], kv_cache_memory_bytes=kv_bytes, max_model_len=max_model_len,
               dtype="bfloat16")["prediction"]
    log = kv_log.parse_kv_cache_log(logged)
    assert (p["kv_cache_tokens"], p["max_concurrency"]) == \
        (log["kv_cache_tokens"], log["max_concurrency"]) == (34663, 8.46)
    # control: per_layer_config ignored, the class defaults give the old 5,577
    cfg.pop("per_layer_config")
    p = t.plan(m.describe_config(cfg, TINY_GEMMA4_WEIGHTS_BYTES), [],
               kv_cache_memory_bytes=kv_bytes, max_model_len=max_model_len,
               dtype="bfloat16")["prediction"]
    assert (p["kv_cache_tokens"], p["max_concurrency"]) == (5577, 1.36)


@pytest.mark.parametrize("per_layer, error, match", [
    ({"5": {"sliding_window": 128}}, m.UnsupportedModelError,
     r"per_layer_config\['5'\] overrides sliding_window"),
    ({"0": {"head_dim": 64}}, m.UnsupportedModelError,
     "gives sliding layers different KV heads or head sizes"),
    ({"6": {"head_dim": 64}}, m.ModelError, "layer index below 6"),
    ({"5": {"num_key_value_heads": 3}}, m.ModelError, "does not divide"),
    ([64], m.ModelError, "must map layer indices"),
])
def test_per_layer_config_it_cannot_read_is_refused(per_layer, error, match):
    cfg = dict(TINY_GEMMA4_CONFIG, per_layer_config=per_layer)
    with pytest.raises(error, match=match):
        m.describe_config(cfg, TINY_GEMMA4_WEIGHTS_BYTES)


def test_per_layer_config_of_another_family_is_refused_by_the_field():
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
           "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
           "hidden_size": 512, "max_position_embeddings": 4096,
           "per_layer_config": {"3": {"num_key_value_heads": 1}}}
    with pytest.raises(m.UnsupportedModelError, match="^per_layer_config is set"):
        m.describe_config(cfg, weights_bytes=1)
