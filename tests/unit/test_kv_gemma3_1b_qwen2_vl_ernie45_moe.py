"""KV layout of more families (issue #14 item 5): Gemma 3 1B, Qwen2-VL, ERNIE 4.5 MoE.

Every config here is a published config.json of that model (tests/fixtures/models/
SOURCES.md, the section for this file): the ERNIE file is byte for byte the hub file (its
git blob equals the hub's etag), the Gemma 3 1B and Qwen2-VL files are test-data copies
of the hub files. Each expected number was derived by hand from the vLLM file named in
the test's comment, read in vLLM 0.32.0 (the wheel the lab image installs), with that
image's transformers 5.19.0, whose config classes fill what config.json leaves out. Line
numbers are from those files. vllm/engine/arg_utils.py:2249-2254 sets
CacheConfig.sliding_window to the config's window only when layer_types is absent or all
sliding_attention; a per-layer window comes from the model file itself.

The tuner's bytes per token per layer are checked against 2 x kv_heads x head_size x
element bytes (check_kv_bytes), vllm/v1/kv_cache_interface.py.
"""
import pytest

from test_model_families import check_kv_bytes, kinds, load
from test_kv_falcon_neox_olmo2_deepseek_v2_granite_cohere2 import check_full_decoder
from gpufleet import model as m
from gpufleet import model_families
from gpufleet import tune as t
from gpufleet import kv_memory


def test_gemma3_1b_text_only_slides_five_of_six_layers_by_512_with_one_kv_head():
    # google/gemma-3-1b-it (Gemma3ForCausalLM, model_type gemma3_text, registry.py:108
    # -> gemma3.py; no text_config: the text model itself). Its file (transformers
    # 4.50) has sliding_window_pattern 6 and no layer_types: transformers 5.19
    # configuration_gemma3.py:109-115 writes layer i sliding unless (i + 1) % 6 == 0,
    # so of 26 layers the 6th, 12th, 18th and 24th are full: 22 sliding + 4 full.
    # gemma3.py:153-155 a sliding layer's window is config.sliding_window (512), the
    # others none (per_layer_sliding_window, :185); :224-226 num_kv_heads =
    # num_key_value_heads 1 (MQA; :117-126 replicated on every TP rank), head_dim =
    # config.head_dim 256 (not 1152 // 4 = 288); :306-307 make_layers(26).
    # Context max_position_embeddings 32,768, rope_scaling null.
    cfg = load("gemma-3-1b-it")
    assert "layer_types" not in cfg and cfg["sliding_window_pattern"] == 6
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 288
    desc = m.describe_config(cfg, weights_bytes=1)
    assert desc["architectures"] == ["Gemma3ForCausalLM"]
    assert desc["model_type"] == "gemma3_text" and desc["known_architecture"] is True
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (26, 1, 256)
    assert kinds(desc) == {"sliding": 22, "full": 4} and desc["sliding_window"] == 512
    assert [i for i, k in enumerate(desc["layer_kinds"]) if k == "full"] == [5, 11, 17, 23]
    assert desc["attention"] == "mqa+sliding" and desc["kind"] == "generative"
    assert desc["torch_dtype"] == "bfloat16" and desc["rope_scaling"] is None
    assert desc["max_position_embeddings"] == 32768 and t.model_max_len(desc) == 32768
    # 2 x 1 x 256 x 2 = 1,024 bytes per token per layer
    check_kv_bytes(desc, 26, 1, 256)
    # one KV head is replicated, not split: still 1,024 bytes per GPU at TP 4
    assert kv_memory.kv_layout(desc, tp=4, block_size=16)["per_token_layer_bytes"] == 2 * 1 * 256 * 2
    # KV cache groups of 4 layers (the smaller count; 22 >= 1.5 x 4): ceil(22 / 4) = 6
    # sliding groups and 1 full group, each block 4 layers' pages
    layout = kv_memory.kv_layout(desc, tp=1, block_size=16)
    assert layout["group_size"] == 4 and sorted(layout["groups"]) == ["full"] + ["sliding"] * 6
    assert layout["bytes_per_block"] == 16 * 1024 * 4
    # 4 heads: TP 4 is accepted (gemma3.py:114 asserts heads % tp == 0), TP 8 not
    assert t.tp_problem(desc, 4) is None and "not divisible" in t.tp_problem(desc, 8)


def test_gemma3_1b_window_control_pattern_and_defaults(monkeypatch):
    cfg = load("gemma-3-1b-it")
    # the layer_types transformers 5.19 would write, given explicitly: the same layers
    written = dict(cfg, layer_types=["full_attention" if (i + 1) % 6 == 0
                                     else "sliding_attention" for i in range(26)])
    assert m.describe_config(written, weights_bytes=1)["layer_kinds"] == \
        m.describe_config(cfg, weights_bytes=1)["layer_kinds"]
    # control: without the Gemma 3 pattern rule the tuner cannot place the full
    # layers and refuses the published file rather than sliding all 26
    monkeypatch.setattr(model_families, "LAYER_PATTERN_DEFAULTS", {})
    with pytest.raises(m.UnsupportedModelError, match="no layer_types"):
        m.describe_config(cfg, weights_bytes=1)


def test_qwen2_vl_7b_language_model_is_qwen2_from_top_level_fields():
    # Qwen/Qwen2-VL-7B-Instruct (Qwen2VLForConditionalGeneration, model_type qwen2_vl,
    # registry.py:258 -> qwen2_vl.py). qwen2_vl.py:1422-1426: the language model is
    # init_vllm_registered_model(architectures=["Qwen2ForCausalLM"]) on the text config,
    # which transformers 5.19 builds from the file's top-level fields
    # (configuration_qwen2_vl.py:168-184) with sliding_window None unless
    # use_sliding_window (:108; false here, so the file's 32,768 is dropped) and every
    # layer full_attention in layer_types (:114-119). qwen2.py:150 head_dim =
    # hidden_size // heads = 3584 // 28 = 128; :269 num_kv_heads = num_key_value_heads
    # 4; :196-205 Attention without a window. 28 layers. Context
    # max_position_embeddings 32,768: mrope (rope_scaling type "mrope", which
    # configuration_qwen2_vl.py:131-132 makes rope_type "default") has no factor.
    cfg = load("qwen2-vl-7b-instruct")
    assert cfg["sliding_window"] == 32768 and cfg["use_sliding_window"] is False
    # 2 x 4 x 128 x 2 = 2,048 bytes per token per layer
    desc = check_full_decoder(cfg, "Qwen2VLForConditionalGeneration", "qwen2_vl",
                              (28, 4, 128), "gqa", "bfloat16", 32768)
    assert desc["rope_scaling"]["type"] == "mrope"
    # 4 KV heads: TP 2 keeps 2 per GPU; TP 8 replicates them (qwen2.py:141-149): 1 each
    assert kv_memory.kv_layout(desc, tp=2, block_size=16)["per_token_layer_bytes"] == 2 * 2 * 128 * 2
    assert kv_memory.kv_layout(desc, tp=8, block_size=16)["per_token_layer_bytes"] == 2 * 1 * 128 * 2


def test_ernie_4_5_21b_a3b_moe_layout_and_experts_from_moe_names(monkeypatch):
    # baidu/ERNIE-4.5-21B-A3B-Thinking (Ernie4_5_MoeForCausalLM, model_type
    # ernie4_5_moe; the same architecture as ERNIE-4.5-21B-A3B-PT, which vLLM's own
    # tests name). registry.py:98 -> ernie45_moe.py. :318-322 Ernie4_5_MoeAttention(
    # num_kv_heads=num_key_value_heads 4, head_dim=getattr(config, "head_dim", None));
    # the file has no head_dim and Ernie4_5_MoeConfig (configuration_ernie4_5_moe.py)
    # declares none, so :247 head_dim = hidden_size // heads = 2560 // 20 = 128;
    # :237-246 KV heads split across TP ranks (replicated below their count);
    # :278-285 Attention without a window; :438-439 make_layers(num_hidden_layers 28).
    # Context max_position_embeddings 131,072, no rope scaling.
    cfg = load("ernie-4.5-21b-a3b-thinking")
    assert "head_dim" not in cfg and cfg["moe_num_experts"] == 64 and cfg["moe_k"] == 6
    # 2 x 4 x 128 x 2 = 2,048 bytes per token per layer
    desc = check_full_decoder(cfg, "Ernie4_5_MoeForCausalLM", "ernie4_5_moe", (28, 4, 128),
                              "gqa", "bfloat16", 131072)
    assert kv_memory.kv_layout(desc, tp=8, block_size=16)["per_token_layer_bytes"] == 2 * 1 * 128 * 2
    # the routed experts (ernie45_moe.py:136, 186-187: moe_num_experts 64, top_k moe_k
    # 6), read through the config class's attribute_map, so expert parallelism is
    # allowed for it
    assert desc["moe"] == {"num_experts": 64, "experts_per_token": 6}
    reasons = []
    assert t._expert_parallel(desc, 2, True, reasons) is True
    # control: without CONFIG_ATTRIBUTE_MAP the file's moe_* names are not read, the
    # model looks dense and --enable-expert-parallel is refused
    monkeypatch.setattr(model_families, "CONFIG_ATTRIBUTE_MAP", {})
    dense = m.describe_config(cfg, weights_bytes=1)
    assert dense["moe"] is None
    with pytest.raises(t.TuneError, match="mixture-of-experts"):
        t._expert_parallel(dense, 2, True, [])
