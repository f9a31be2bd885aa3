"""KV layout of more model families, each checked against its vLLM model file.

Issue #14 item 5 (part). Every config here is the model's own published config.json
(tests/fixtures/models/SOURCES.md). Each expected number was derived by hand from the
vLLM file named in the test's comment, read in vLLM 0.33.0 (the PyPI wheel; its
vllm/_version.py gives commit 4ba787ec9), together with:

- vllm/engine/arg_utils.py (create_engine_config): CacheConfig.sliding_window is the
  config's sliding_window only when layer_types is absent or all sliding_attention;
  vllm/model_executor/layers/attention/attention.py: a layer built without
  per_layer_sliding_window takes CacheConfig.sliding_window. So a config with a
  sliding_window and no layer_types slides on every layer that does not pass its own.
- the HF config class of transformers 5.20 (vLLM 0.33.0 requires >= 5.16.1, < 5.21),
  whose defaults fill fields config.json leaves out.

The tuner's bytes per token per layer are checked against 2 x kv_heads x head_size x
element bytes (MHA/GQA) or (kv_lora_rank + qk_rope_head_dim) x element bytes (MLA),
vllm/v1/kv_cache_interface.py.
"""
import json

import pytest

from conftest import FIXTURES
from gpufleet import model as m
from gpufleet import model_families
from gpufleet import tune as t
from gpufleet import kv_memory

MODELS = FIXTURES / "models"


def load(name):
    return json.loads((MODELS / name / "config.json").read_text())


def kinds(desc):
    out = {}
    for kind in desc["layer_kinds"]:
        out[kind] = out.get(kind, 0) + 1
    return out


def check_kv_bytes(desc, layers, kv_heads, head_size):
    """Per-token KV bytes at TP 1: 16-bit and fp8 (16-bit where the family's vLLM file
    ignores --kv-cache-dtype: model_families.KV_CACHE_DTYPE_IGNORED_MODEL_TYPES), per
    layer and for the model."""
    fp8 = 2 if desc["kv_cache_dtype_ignored"] else 1
    for kv_dtype, width in (("auto", 2), ("fp8", fp8)):
        layout = kv_memory.kv_layout(desc, tp=1, block_size=16, kv_cache_dtype=kv_dtype)
        assert layout["per_token_layer_bytes"] == 2 * kv_heads * head_size * width
        assert layout["per_token_layer_bytes"] * layout["num_layers"] == \
            2 * layers * kv_heads * head_size * width
        assert layout["page_bytes"] == 16 * 2 * kv_heads * head_size * width


def check_encoder_only(desc, architecture, model_type, layers_heads_head_size):
    """A known, natively pooling encoder-only model: its name, kind and attention shape."""
    assert desc["architectures"] == [architecture]
    assert desc["model_type"] == model_type and desc["known_architecture"] is True
    assert desc["kind"] == "pooling" and desc["native_pooling"] is True
    assert desc["attention"] == "encoder_only"
    assert (desc["num_layers"], desc["num_attention_heads"], desc["head_size"]) == \
        layers_heads_head_size


# --- families the tuner now describes ----------------------------------------------

def test_phi3_medium_slides_every_layer_by_its_sliding_window():
    # vllm/model_executor/models/phi3.py: Phi3ForCausalLM is LlamaForCausalLM.
    # llama.py LlamaDecoderLayer: num_kv_heads = num_key_value_heads (10);
    # LlamaAttention: head_dim = config.head_dim or hidden_size // heads = 5120 // 40
    # = 128; sliding only from layer_types, absent here (transformers' Phi3Config
    # writes none), so every layer takes CacheConfig.sliding_window = 2047.
    desc = m.describe_config(load("phi-3-medium-4k-instruct"), weights_bytes=1)
    assert desc["known_architecture"] is True
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (40, 10, 128)
    assert kinds(desc) == {"sliding": 40} and desc["sliding_window"] == 2047
    assert desc["attention"] == "gqa-sliding"
    check_kv_bytes(desc, 40, 10, 128)
    # one group of 40 sliding layers: a request of 4,096 tokens holds
    # ceil(min(2047 - 1 + in-flight, 4096) / 16) + 1 = 257 blocks, not 256, whether
    # 2 x 2048 (a GPU, async scheduling: kv_layout's default) or 1 x 2048 are in flight
    layout = kv_memory.kv_layout(desc, tp=1, block_size=16)
    assert layout["groups"] == ["sliding"]
    assert kv_memory.max_concurrency(layout, 257, 4096, 2048) == 1.0


def test_phi4_has_no_sliding_window():
    # Same files as Phi-3 (phi3.py -> llama.py); sliding_window null: full attention.
    # 5120 // 40 = 128, 10 KV heads, 40 layers.
    desc = m.describe_config(load("phi-4"), weights_bytes=1)
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (40, 10, 128)
    assert kinds(desc) == {"full": 40} and desc["attention"] == "gqa"
    assert desc["max_position_embeddings"] == 16384
    check_kv_bytes(desc, 40, 10, 128)


def test_mistral_7b_v0_1_slides_every_layer():
    # vllm/model_executor/models/mistral.py: MistralAttention is LlamaAttention
    # (head_dim 4096 // 32 = 128, 8 KV heads); no layer_types, sliding_window 4096:
    # every layer slides (CacheConfig.sliding_window).
    desc = m.describe_config(load("mistral-7b-instruct-v0.1"), weights_bytes=1)
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (32, 8, 128)
    assert kinds(desc) == {"sliding": 32} and desc["sliding_window"] == 4096
    check_kv_bytes(desc, 32, 8, 128)


def test_mistral_without_the_key_uses_transformers_default_window():
    # transformers 5.20 MistralConfig: sliding_window defaults to 4096, so a config
    # that leaves the key out slides; an explicit null (Mistral-7B v0.3) does not.
    cfg = {k: v for k, v in load("mistral-7b-instruct-v0.1").items()
           if k != "sliding_window"}
    desc = m.describe_config(cfg, weights_bytes=1)
    assert kinds(desc) == {"sliding": 32} and desc["sliding_window"] == 4096
    desc = m.describe_config(dict(cfg, sliding_window=None), weights_bytes=1)
    assert kinds(desc) == {"full": 32}


def test_mixtral_8x7b_is_full_gqa_moe():
    # vllm/model_executor/models/mixtral.py MixtralDecoderLayer: num_kv_heads =
    # num_key_value_heads (8); MixtralAttention head_dim = head_dim or 4096 // 32 =
    # 128; sliding_window null (MixtralConfig default None too).
    desc = m.describe_config(load("mixtral-8x7b-v0.1"), weights_bytes=1)
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (32, 8, 128)
    assert kinds(desc) == {"full": 32}
    assert desc["moe"] == {"num_experts": 8, "experts_per_token": 2}
    check_kv_bytes(desc, 32, 8, 128)


def test_qwen3_30b_a3b_uses_its_head_dim_not_hidden_over_heads():
    # vllm/model_executor/models/qwen3_moe.py Qwen3MoeDecoderLayer: head_dim =
    # config.head_dim (128; hidden 2048 // 32 heads would be 64), num_kv_heads = 4;
    # use_sliding_window false: transformers' Qwen3MoeConfig sets sliding_window None.
    desc = m.describe_config(load("qwen3-30b-a3b"), weights_bytes=1)
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (48, 4, 128)
    assert kinds(desc) == {"full": 48}
    assert desc["moe"] == {"num_experts": 128, "experts_per_token": 8}
    check_kv_bytes(desc, 48, 4, 128)


def test_gpt_oss_20b_alternates_sliding_and_full_layers():
    # vllm/model_executor/models/gpt_oss.py OAIAttention: head_dim = config.head_dim
    # (64), num_key_value_heads 8, sliding_window 128 on even layers
    # (layer_idx % 2 == 0), which is what the config's layer_types says: 12 + 12.
    desc = m.describe_config(load("gpt-oss-20b"), weights_bytes=1)
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (24, 8, 64)
    assert desc["layer_kinds"][:2] == ["sliding", "full"]
    assert all(k == ("sliding" if i % 2 == 0 else "full")
               for i, k in enumerate(desc["layer_kinds"]))
    assert kinds(desc) == {"sliding": 12, "full": 12} and desc["sliding_window"] == 128
    assert desc["quantization"]["method"] == "mxfp4"
    check_kv_bytes(desc, 24, 8, 64)
    layout = kv_memory.kv_layout(desc, tp=1, block_size=16)
    assert layout["group_size"] == 12 and sorted(layout["groups"]) == ["full", "sliding"]


def test_exaone4_32b_three_sliding_layers_to_one_full():
    # vllm/model_executor/models/exaone4.py Exaone4Attention: head_dim = config.head_dim
    # (128), num_kv_heads = num_key_value_heads (8), sliding when
    # layer_types[i] == "sliding_attention" (LLLG: 48 sliding, 16 full, window 4096).
    desc = m.describe_config(load("exaone-4.0-32b"), weights_bytes=1)
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (64, 8, 128)
    assert desc["layer_kinds"][:4] == ["sliding", "sliding", "sliding", "full"]
    assert kinds(desc) == {"sliding": 48, "full": 16} and desc["sliding_window"] == 4096
    check_kv_bytes(desc, 64, 8, 128)
    # _get_kv_cache_groups_uniform_page_size: 48 >= 1.5 x 16, so groups of 16 layers:
    # 3 sliding groups and 1 full group share the pool.
    layout = kv_memory.kv_layout(desc, tp=1, block_size=16)
    assert layout["group_size"] == 16
    assert sorted(layout["groups"]) == ["full", "sliding", "sliding", "sliding"]


def test_olmo3_runs_on_the_transformers_backend_with_its_layer_types():
    # registry.py: Olmo3ForCausalLM -> ("transformers", "TransformersForCausalLM").
    # vllm/model_executor/models/transformers/base.py: head_size from
    # model_arch_config (transformers_utils/model_arch_config_convertor.py
    # get_head_size: no head_dim, 5120 // 40 = 128), num_kv_heads from the aliases
    # (num_key_value_heads 8), per_layer_sliding_window where layer_types[i] is
    # sliding_attention (48 of 64, window 4096).
    desc = m.describe_config(load("olmo-3.1-32b-instruct"), weights_bytes=1)
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (64, 8, 128)
    assert kinds(desc) == {"sliding": 48, "full": 16} and desc["sliding_window"] == 4096
    check_kv_bytes(desc, 64, 8, 128)


def test_minimax_m2_5_is_full_gqa_with_explicit_head_dim():
    # vllm/model_executor/models/minimax_m2.py MiniMaxM2DecoderLayer: num_kv_heads =
    # num_key_value_heads (8), head_dim = config.head_dim (128; 3072 // 48 would be
    # 64); attn_window_size is not passed (None) and the config has no sliding_window.
    desc = m.describe_config(load("minimax-m2.5"), weights_bytes=1)
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (62, 8, 128)
    assert kinds(desc) == {"full": 62}
    assert desc["quantization"]["method"] == "fp8"
    check_kv_bytes(desc, 62, 8, 128)


def test_kimi_k2_is_mla():
    # transformers_utils/model_arch_config_convertor.py is_deepseek_mla: kimi_k2 with
    # kv_lora_rank; transformers_utils/config.py maps kimi_k2 to DeepseekV3Config;
    # registry.py: DeepseekV3ForCausalLM -> deepseek_v2.py. One latent of
    # kv_lora_rank + qk_rope_head_dim = 512 + 64 per token per layer, not sharded.
    desc = m.describe_config(load("kimi-k2-instruct"), weights_bytes=1)
    assert desc["attention"] == "mla" and desc["num_layers"] == 61
    assert (desc["kv_lora_rank"], desc["qk_rope_head_dim"]) == (512, 64)
    for tp in (1, 8):
        layout = kv_memory.kv_layout(desc, tp=tp, block_size=64)
        assert layout["per_token_layer_bytes"] == (512 + 64) * 2
    assert kv_memory.kv_layout(desc, 1, 64, kv_cache_dtype="fp8")["per_token_layer_bytes"] == 576


def test_mimo_is_not_added_its_config_class_is_remote_code():
    # model_type "mimo" has no config class in transformers 5.20 nor in vLLM 0.33.0
    # (vllm/transformers_utils/configs): it is the checkpoint's own remote code, which
    # was not read, so whether transformers drops its sliding_window
    # (use_sliding_window false) is not checked. It stays outside the table.
    cfg = load("mimo-7b-base")
    with pytest.raises(m.ModelError, match="not in gpufleet's table"):
        m.describe_config(cfg, weights_bytes=1)
    assert m.describe_config(cfg, weights_bytes=1,
                             allow_unknown_architecture=True)["known_architecture"] is False


# --- structures refused by the fields that show them -------------------------------

@pytest.mark.parametrize("fixture, field, facts", [
    ("llama-4-scout-17b-16e-instruct", "attention_chunk_size", "8192"),
    ("nemotron-h-56b-base-8k", "hybrid_override_pattern",
     "118 layers: 54 Mamba, 10 attention"),
    ("llama-3.3-nemotron-super-49b-v1", "block_configs", "80 blocks, 31 without attention"),
    ("glm-5", "index_topk", "2048"),
])
def test_real_configs_refused_by_the_field_that_shows_the_structure(fixture, field, facts):
    with pytest.raises(m.UnsupportedModelError) as err:
        m.describe_config(load(fixture), weights_bytes=1)
    assert str(err.value).startswith(f"{field} is set ({facts})")
    assert "--kv-cache-memory-bytes" in str(err.value)
    # the structure, not the name: allow_unknown_architecture does not lift it
    with pytest.raises(m.UnsupportedModelError, match=field):
        m.describe_config(load(fixture), weights_bytes=1, allow_unknown_architecture=True)


def test_qwen3_5_linear_attention_layers_refused_from_layer_types():
    # Qwen/Qwen3.5-27B: text_config.layer_types has 48 linear_attention (Gated
    # DeltaNet) and 16 full_attention layers.
    with pytest.raises(m.UnsupportedModelError, match="layer_types has 48 x "
                       "linear_attention"):
        m.describe_config(load("qwen3.5-27b"), weights_bytes=1)


BASE = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
        "hidden_size": 512, "max_position_embeddings": 4096}


@pytest.mark.parametrize("extra, field", [
    ({"attention_chunk_size": 8192}, "attention_chunk_size"),        # Llama 4
    ({"num_kv_shared_layers": 2}, "num_kv_shared_layers"),           # Gemma 3n
    ({"head_dim": 256, "global_head_dim": 512}, "global_head_dim"),  # Gemma 4
    ({"num_global_key_value_heads": 1}, "num_global_key_value_heads"),  # Gemma 4
    ({"full_attention_interval": 4}, "full_attention_interval"),     # Qwen3-Next
    ({"hybrid_override_pattern": "M*MM"}, "hybrid_override_pattern"),  # Nemotron-H
    ({"ssm_state_size": 128}, "ssm_state_size"),                     # Mamba2
    ({"mamba_d_state": 16}, "mamba_d_state"),                        # Falcon-H1, Zamba2
    ({"attn_layer_period": 8}, "attn_layer_period"),                 # Jamba
    ({"block_configs": []}, "block_configs"),                        # DeciLM / NAS
    ({"index_topk": 2048, "kv_lora_rank": 512}, "index_topk"),       # DeepSeek-V3.2
])
def test_each_unmodelled_structure_is_refused_naming_its_field(extra, field):
    with pytest.raises(m.UnsupportedModelError) as err:
        m.describe_config(dict(BASE, **extra), weights_bytes=1)
    assert str(err.value).startswith(f"{field} is set")


@pytest.mark.parametrize("extra", [
    {"num_kv_shared_layers": 0},                        # Gemma 4 26B writes 0: no sharing
    {"head_dim": 64, "global_head_dim": 64},            # same head size on every layer
    {"num_global_key_value_heads": 2},                  # same KV heads on every layer
    {"attention_chunk_size": None},
])
def test_fields_that_show_nothing_unusual_are_not_refused(extra):
    desc = m.describe_config(dict(BASE, **extra), weights_bytes=1)
    assert desc["num_kv_heads"] == 2


def test_mamba_layer_types_are_refused_with_their_count():
    cfg = dict(BASE, layer_types=["mamba", "full_attention", "mamba", "mamba"])
    with pytest.raises(m.UnsupportedModelError, match="layer_types has 3 x mamba"):
        m.describe_config(cfg, weights_bytes=1)


def test_layer_types_must_be_a_list():
    with pytest.raises(m.ModelError, match="must be a list"):
        m.describe_config(dict(BASE, layer_types="full_attention"), weights_bytes=1)


# --- more families, read in vLLM 0.32.0 ----------------------------------------------
# The files below were read in vLLM 0.32.0 as installed in the lab image
# (gpufleet/vllm-cpu:lab, /opt/venv/lib/python3.11/site-packages/vllm; its
# _version.py records no commit id) with that image's transformers 5.19.0; line
# numbers are from those files.

def test_qwen3_vl_8b_language_model_is_qwen3_from_text_config():
    # vllm/model_executor/models/qwen3_vl.py:2043-2047: the language model is
    # Qwen3LLMForCausalLM built with_hf_config(config.text_config,
    # architectures=["Qwen3ForCausalLM"]); qwen3.py:206,209 Qwen3DecoderLayer:
    # num_kv_heads = num_key_value_heads (8), head_dim = config.head_dim (128). No
    # sliding_window in text_config, none in transformers' Qwen3VLTextConfig: full.
    desc = m.describe_config(load("qwen3-vl-8b-instruct"), weights_bytes=1)
    assert desc["model_type"] == "qwen3_vl_text" and desc["known_architecture"] is True
    assert desc["architectures"] == ["Qwen3VLForConditionalGeneration"]
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (36, 8, 128)
    assert kinds(desc) == {"full": 36} and desc["attention"] == "gqa"
    assert desc["max_position_embeddings"] == 262144
    check_kv_bytes(desc, 36, 8, 128)


def test_qwen3_vl_30b_a3b_language_model_is_qwen3_moe():
    # qwen3_vl_moe.py:285-288: Qwen3MoeLLMForCausalLM on config.text_config
    # (architectures Qwen3MoeForCausalLM); qwen3_moe.py:372,377: num_kv_heads 4,
    # head_dim 128 (2048 // 32 would be 64); transformers 5.19
    # Qwen3VLMoeTextConfig sets sliding_window None (configuration_qwen3_vl_moe.py:114).
    desc = m.describe_config(load("qwen3-vl-30b-a3b-instruct"), weights_bytes=1)
    assert desc["model_type"] == "qwen3_vl_moe_text"
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (48, 4, 128)
    assert kinds(desc) == {"full": 48}
    assert desc["moe"] == {"num_experts": 128, "experts_per_token": 8}
    check_kv_bytes(desc, 48, 4, 128)


def test_qwen2_5_vl_7b_language_model_is_qwen2_from_top_level_fields():
    # qwen2_5_vl.py:1444-1447: init_vllm_registered_model(architectures=
    # ["Qwen2ForCausalLM"]) on the text config, which transformers 5.19 builds from
    # the top-level fields (configuration_qwen2_5_vl.py:198-207) with sliding_window
    # None unless use_sliding_window (line 131; false here). qwen2.py:269:
    # num_kv_heads = num_key_value_heads (4); head 3584 // 28 = 128.
    desc = m.describe_config(load("qwen2.5-vl-7b-instruct"), weights_bytes=1)
    assert desc["model_type"] == "qwen2_5_vl"
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (28, 4, 128)
    assert kinds(desc) == {"full": 28}
    assert desc["rope_scaling"]["type"] == "mrope"
    assert desc["max_position_embeddings"] == 128000  # mrope does not stretch it
    check_kv_bytes(desc, 28, 4, 128)


def test_devstral_small_2_language_model_is_ministral3_with_its_head_dim():
    # mistral3.py:485-488: the language model is init_vllm_registered_model on
    # config.text_config; config/vllm.py:942-951 with_hf_config names it
    # Ministral3ForCausalLM (transformers' causal-LM mapping of "ministral3"), which
    # registry.py:172 runs as mistral.py MistralForCausalLM (llama.py layers):
    # llama.py:158-159 head_dim = config.head_dim (128, not 5120 // 32 = 160),
    # llama.py:289 num_kv_heads 8; sliding_window null (Ministral3Config default None).
    desc = m.describe_config(load("devstral-small-2-24b-instruct"), weights_bytes=1)
    assert desc["model_type"] == "ministral3"
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (40, 8, 128)
    assert kinds(desc) == {"full": 40}
    assert desc["quantization"] == {"method": "fp8", "bits": 8}
    # yarn: the config's own 393,216 (= original 8192 x factor 48; vLLM 0.32.0 does not
    # stretch a yarn config again)
    assert desc["max_position_embeddings"] == 393216
    check_kv_bytes(desc, 40, 8, 128)


def test_phi_1_runs_on_the_transformers_backend_as_mha():
    # registry.py:725 PhiForCausalLM -> ("transformers", "TransformersForCausalLM");
    # transformers/base.py:633 head_size from model_arch_config
    # (model_arch_config_convertor.py:104-116: no head_dim, 2048 // 32 = 64),
    # base.py:668 num_kv_heads (num_key_value_heads 32 = heads: MHA), base.py:675 a
    # per-layer window only from layer_types (none); no sliding_window: full.
    desc = m.describe_config(load("phi-1"), weights_bytes=1)
    assert desc["model_type"] == "phi" and desc["attention"] == "mha"
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (24, 32, 64)
    assert kinds(desc) == {"full": 24} and desc["torch_dtype"] == "float32"
    check_kv_bytes(desc, 24, 32, 64)


def test_kimi_k2_5_is_mla_through_its_text_config_and_quantization_there():
    # kimi_k25.py:378-380: the language model is DeepseekV2ForCausalLM on
    # config.text_config (model_type kimi_k2, kv_lora_rank 512): MLA
    # (model_arch_config_convertor.py:332 is_deepseek_mla lists kimi_k2). The
    # compressed-tensors config sits in text_config only; vLLM reads it there
    # (model_arch_config_convertor.py:305-312), and so does the tuner.
    cfg = load("kimi-k2.5")
    assert "quantization_config" not in cfg
    desc = m.describe_config(cfg, weights_bytes=1)
    assert desc["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert desc["attention"] == "mla" and desc["num_layers"] == 61
    assert (desc["kv_lora_rank"], desc["qk_rope_head_dim"]) == (512, 64)
    assert desc["quantization"]["method"] == "compressed-tensors"
    for tp in (1, 8):
        assert kv_memory.kv_layout(desc, tp=tp, block_size=64)["per_token_layer_bytes"] == \
            (512 + 64) * 2


@pytest.mark.parametrize("fixture, field, facts", [
    # deepseek_v2.py:638 DeepseekV32IndexerCache, used by
    # vllm/models/deepseek_v32/attention.py:51 (index_topk read at :65)
    ("deepseek-v3.2", "index_topk", "2048"),
    # mimo_v2.py:375-410,470: hybrid_layer_pattern[i] == 1 layers get
    # swa_num_key_value_heads 8 and a 128 window, the others 4 KV heads; V 128, K 192.
    # The config also sets attention_chunk_size, which vLLM's mimo_v2.py never reads.
    ("mimo-v2-flash", "hybrid_layer_pattern", "48 layers: 39 sliding-window, 9 full"),
    # configs/kimi_linear.py:157-160 is_kda_layer: (i + 1) in kda_layers
    ("kimi-k3", "linear_attn_config", "69 KDA layers, 24 full attention"),
])
def test_more_real_configs_refused_by_the_field_that_shows_the_structure(
        fixture, field, facts):
    with pytest.raises(m.UnsupportedModelError) as err:
        m.describe_config(load(fixture), weights_bytes=1, allow_unknown_architecture=True)
    assert str(err.value).startswith(f"{field} is set ({facts})")


def test_glm_4_5_needs_its_head_dim_hidden_over_heads_is_not_whole():
    # glm4_moe.py:342,344 Glm4MoeDecoderLayer: num_kv_heads = num_key_value_heads
    # (8), head_dim = config.head_dim (128; 5120 / 96 is not whole); no sliding
    # window in the file or in transformers 5.19's Glm4MoeConfig. 92 layers; the
    # MTP layer (num_nextn_predict_layers) is a separate draft model, not counted.
    desc = m.describe_config(load("glm-4.5"), weights_bytes=1)
    assert desc["model_type"] == "glm4_moe" and desc["known_architecture"] is True
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (92, 8, 128)
    assert kinds(desc) == {"full": 92}
    assert desc["moe"] == {"num_experts": 160, "experts_per_token": 8}
    check_kv_bytes(desc, 92, 8, 128)
    # without head_dim the config is refused, not guessed
    cfg = {k: v for k, v in load("glm-4.5").items() if k != "head_dim"}
    with pytest.raises(m.ModelError, match="not a multiple"):
        m.describe_config(cfg, weights_bytes=1)


def test_lfm2_vl_short_conv_layers_refused_from_layer_types():
    # LiquidAI LFM2.5-VL-1.6B: text_config.layer_types has 10 "conv" layers, which
    # lfm2.py:331-333 builds as Lfm2ShortConvDecoderLayer (ShortConv, a conv state
    # per request), and 6 full_attention layers.
    with pytest.raises(m.UnsupportedModelError, match="layer_types has 10 x conv"):
        m.describe_config(load("lfm2.5-vl-1.6b"), weights_bytes=1,
                          allow_unknown_architecture=True)


def test_gemma3_27b_five_sliding_layers_to_one_full_from_text_config():
    # gemma3_mm.py:563-565: the language model is Gemma3ForCausalLM on
    # config.text_config. gemma3.py:153-155: a layer slides (window 1024) when
    # layer_types[i] is sliding_attention; :225-226 num_kv_heads 16, head_dim 128
    # (5376 // 32 would be 168). 62 layers: full at every 6th, 10 full + 52 sliding.
    # This config was saved by transformers 4.56.2 (layer_types written out).
    desc = m.describe_config(load("gemma-3-27b-it"), weights_bytes=1)
    assert desc["model_type"] == "gemma3_text" and desc["known_architecture"] is True
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (62, 16, 128)
    assert kinds(desc) == {"sliding": 52, "full": 10} and desc["sliding_window"] == 1024
    assert desc["layer_kinds"][:6] == ["sliding"] * 5 + ["full"]
    assert desc["attention"] == "gqa+sliding"
    check_kv_bytes(desc, 62, 16, 128)
    # config/model.py:2583-2585: Gemma 3's 131,072 is already scaled, so the linear
    # factor 8 is not applied again
    assert desc["rope_scaling"]["factor"] == 8.0
    assert t.model_max_len(desc) == 131072


def test_gemma3_without_layer_types_derives_them_as_transformers_does():
    # The Hub's Gemma 3 configs (transformers 4.50) carry sliding_window_pattern, no
    # layer_types; transformers 5.19 configuration_gemma3.py:109-115 writes
    # sliding unless (i + 1) % pattern == 0 (pattern default 6). The list derived
    # from the pattern is the one transformers 4.56.2 saved in this config.
    cfg = load("gemma-3-27b-it")
    saved = cfg["text_config"]["layer_types"]
    text = {k: v for k, v in cfg["text_config"].items()
            if k not in ("layer_types", "_sliding_window_pattern")}
    for extra in ({}, {"sliding_window_pattern": 6}):
        desc = m.describe_config(dict(cfg, text_config=dict(text, **extra)), weights_bytes=1)
        assert desc["layer_kinds"] == [k.split("_")[0] for k in saved]
    desc = m.describe_config(dict(cfg, text_config=dict(text, sliding_window_pattern=2)),
                             weights_bytes=1)
    assert kinds(desc) == {"sliding": 31, "full": 31}


def test_gemma2_without_layer_types_alternates_starting_with_sliding():
    # transformers 5.19 configuration_gemma2.py:95-98: sliding when (i + 1) % 2;
    # vllm gemma2.py:155-156 reads that list. Defaults (sliding_window 4096, head_dim
    # 256) from Gemma2Config fill what the config leaves out.
    cfg = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
           "num_hidden_layers": 4, "hidden_size": 2304}
    desc = m.describe_config(cfg, weights_bytes=1)
    assert desc["layer_kinds"] == ["sliding", "full", "sliding", "full"]
    assert (desc["num_kv_heads"], desc["head_size"], desc["sliding_window"]) == (4, 256, 4096)


def test_command_r_v01_is_full_mha_and_its_context_is_model_max_length():
    # commandr.py:186-190 CohereAttention: head_dim = hidden 8192 // 64 = 128 (no
    # head_dim), num_kv_heads = num_key_value_heads 64 (MHA); :235,243 a CohereConfig
    # (v1) has no sliding layers. model_arch_config_convertor.py:423-426: vLLM takes
    # model_max_length (131,072) over max_position_embeddings (8,192) for Command-R.
    desc = m.describe_config(load("c4ai-command-r-v01"), weights_bytes=1)
    assert desc["model_type"] == "cohere" and desc["attention"] == "mha"
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (40, 64, 128)
    assert kinds(desc) == {"full": 40}
    assert desc["max_position_embeddings"] == 131072
    check_kv_bytes(desc, 40, 64, 128)


def test_starcoder2_7b_slides_every_layer_on_the_transformers_backend():
    # registry.py:728 Starcoder2ForCausalLM -> Transformers backend; no layer_types
    # (transformers 5.19 Starcoder2Config writes none), so engine/arg_utils.py:
    # 2249-2254 sets CacheConfig.sliding_window = 4096 and every layer slides
    # (transformers/base.py:675 passes no per-layer window). 4608 // 36 = 128, 4 KV.
    desc = m.describe_config(load("starcoder2-7b"), weights_bytes=1)
    assert desc["model_type"] == "starcoder2"
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (32, 4, 128)
    assert kinds(desc) == {"sliding": 32} and desc["sliding_window"] == 4096
    assert desc["attention"] == "gqa-sliding"
    check_kv_bytes(desc, 32, 4, 128)


def test_starcoderbase_7b_gpt_bigcode_is_multi_query_one_kv_head():
    # registry.py:715 GPTBigCodeForCausalLM -> Transformers backend; transformers
    # 5.19 configuration_gpt_bigcode.py:83 num_key_value_heads = 1 if multi_query, the
    # attribute model_arch_config_convertor.py:150-167 reads; n_layer 42, n_head 32,
    # n_embd 4096 -> head 128, n_positions 8192.
    desc = m.describe_config(load("starcoderbase-7b"), weights_bytes=1)
    assert desc["model_type"] == "gpt_bigcode" and desc["attention"] == "mqa"
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (42, 1, 128)
    assert desc["max_position_embeddings"] == 8192
    check_kv_bytes(desc, 42, 1, 128)
    # one KV head is replicated, not split, across tensor-parallel ranks
    assert kv_memory.kv_layout(desc, tp=4, block_size=16)["per_token_layer_bytes"] == 2 * 128 * 2
    cfg = dict(load("starcoderbase-7b"), multi_query=False)
    assert m.describe_config(cfg, weights_bytes=1)["num_kv_heads"] == 32


def test_exaone_4_5_language_model_is_exaone4_from_text_config():
    # exaone4_5.py:353-357: Exaone4ForCausalLM on config.get_text_config(), which
    # transformers 5.19 builds as Exaone4Config (configuration_exaone4_5.py:85-87).
    # exaone4.py:140-142 head_dim = 5120 // 40 = 128 (no head_dim); the layer slides
    # when layer_types[i] is sliding_attention (LLLG: 48 x 4096 + 16 full).
    desc = m.describe_config(load("exaone-4.5-33b"), weights_bytes=1)
    assert desc["model_type"] == "exaone4_5_text"
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (64, 8, 128)
    assert kinds(desc) == {"sliding": 48, "full": 16} and desc["sliding_window"] == 4096
    assert t.model_max_len(desc) == 262144  # llama3 rope: the config's own length
    check_kv_bytes(desc, 64, 8, 128)


# --- third slice (issue #14 item 5), read in vLLM 0.32.0 (the lab image) ---------------

def test_devstral_2_123b_ministral3_causal_lm_is_full_gqa_with_its_head_dim():
    # Devstral 2 123B Instruct (tt-metal copy): architectures Ministral3ForCausalLM, which
    # registry.py:172 runs as mistral.py MistralForCausalLM (llama.py layers):
    # llama.py:158-159 head_dim = config.head_dim (128 = 12288 / 96 here too),
    # llama.py:289 num_kv_heads 8; sliding_window null: every layer full.
    desc = m.describe_config(load("devstral-2-123b-instruct"), weights_bytes=1)
    assert desc["architectures"] == ["Ministral3ForCausalLM"]
    assert desc["model_type"] == "ministral3" and desc["known_architecture"] is True
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (88, 8, 128)
    assert kinds(desc) == {"full": 88} and desc["attention"] == "gqa"
    assert desc["quantization"] == {"method": "fp8", "bits": 8}
    # rope_parameters yarn: 4096 x 64 = 262,144 = max_position_embeddings, not
    # stretched again (vLLM 0.32.0's yarn rule)
    assert desc["max_position_embeddings"] == 262144
    check_kv_bytes(desc, 88, 8, 128)


def test_qwen3_5_moe_35b_a3b_linear_attention_layers_refused_from_layer_types():
    # Qwen/Qwen3.5-35B-A3B: registry.py:596-599 Qwen3_5MoeForConditionalGeneration ->
    # qwen3_5.py:703; qwen3_5.py:149 builds "linear_attention" layers as Gated
    # DeltaNet (a recurrent state per request). text_config.layer_types: 30 linear, 10
    # full; it also sets full_attention_interval 4, checked after layer_types.
    cfg = load("qwen3.5-35b-a3b")
    assert cfg["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
    for unknown in (False, True):
        with pytest.raises(m.UnsupportedModelError,
                           match="layer_types has 30 x linear_attention"):
            m.describe_config(cfg, weights_bytes=1, allow_unknown_architecture=unknown)


def test_minimax_m3_sparse_index_layers_refused_by_sparse_attention_config():
    # nvidia/MiniMax-M3-NVFP4: registry.py:509-512 MiniMaxM3SparseForConditionalGeneration
    # -> vllm/models/minimax_m3; nvidia/model.py:99-107 _sparse_attention_layer_ids: the
    # layers whose sparse_attention_freq entry is not 0 (57 of 60) run the index branch,
    # whose MiniMaxM3IndexerCache (common/indexer.py:102-150) is a key-only side cache
    # (MLAAttentionSpec, one head) beside the layer's KV cache.
    cfg = load("minimax-m3-nvfp4")
    assert cfg["architectures"] == ["MiniMaxM3SparseForConditionalGeneration"]
    with pytest.raises(m.UnsupportedModelError) as err:
        m.describe_config(cfg, weights_bytes=1, allow_unknown_architecture=True)
    assert str(err.value).startswith(
        "sparse_attention_config is set (60 layers, 57 with the sparse index branch)")
    assert "--kv-cache-memory-bytes" in str(err.value)


@pytest.mark.parametrize("sparse, refused", [
    ({"use_sparse_attention": True, "sparse_attention_freq": [0, 1, 1, 1]}, True),
    # nvidia/model.py:99-107 reads only the frequency list, not use_sparse_attention
    ({"use_sparse_attention": False, "sparse_attention_freq": [0, 1, 1, 1]}, True),
    ({"use_sparse_attention": True, "sparse_attention_freq": [0, 0, 0, 0]}, False),
])
def test_sparse_attention_config_is_refused_only_when_a_layer_uses_it(sparse, refused):
    cfg = dict(BASE, sparse_attention_config=sparse)
    if refused:
        with pytest.raises(m.UnsupportedModelError, match="sparse_attention_config"):
            m.describe_config(cfg, weights_bytes=1)
    else:
        assert m.describe_config(cfg, weights_bytes=1)["num_kv_heads"] == 2


def test_muse_glimmer_30b_sliding_rope_layers_three_to_one_full_nope_layer():
    # meta-models/Muse-Glimmer-30B: registry.py:537 MuseGlimmerForConditionalGeneration
    # -> muse_glimmer.py MuseGlimmerForCausalLM on the text config (muse_glimmer.py:110-114,
    # 1304). MuseGlimmerAttention: muse_glimmer.py:1130-1136 num_kv_heads =
    # num_key_value_heads (2), head_dim = config.head_dim (128; 6656 / 32 = 208 is not
    # it); :1146 a layer slides iff no_rope_layers[i] == 1, :1198-1207 with
    # per_layer_sliding_window = sliding_window (2048), else full. The config has no
    # no_rope_layers: transformers_utils/configs/muse_glimmer.py:21-27,109-113 derive
    # it (NoPE every 4th layer counted back from the last), which names the same full
    # layers as the config's layer_types (3, 7, ..., 51), the list the tuner reads.
    cfg = load("muse-glimmer-30b")
    text = cfg["text_config"]
    n = text["num_hidden_layers"]
    nope = [(n - 1 - i) % 4 == 0 for i in range(n)]
    assert [k == "full_attention" for k in text["layer_types"]] == nope
    desc = m.describe_config(cfg, weights_bytes=1)
    assert desc["architectures"] == ["MuseGlimmerForConditionalGeneration"]
    assert desc["model_type"] == "muse_glimmer_text" and desc["known_architecture"] is True
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (52, 2, 128)
    assert kinds(desc) == {"sliding": 39, "full": 13}
    assert [k == "full" for k in desc["layer_kinds"]] == nope
    assert desc["sliding_window"] == 2048 and desc["attention"] == "gqa+sliding"
    assert desc["max_position_embeddings"] == 131072
    assert desc["torch_dtype"] == "bfloat16"
    check_kv_bytes(desc, 52, 2, 128)


# --- fourth slice (issue #14 item 5), read in vLLM 0.32.0 (the lab image) --------------

def test_gemma2_9b_it_alternates_sliding_and_full_from_the_derived_layer_types(monkeypatch):
    # google/gemma-2-9b-it as published at release (transformers 4.42.0.dev0: no
    # layer_types). registry.py:107 Gemma2ForCausalLM -> gemma2.py; :155-156 a layer
    # slides (per_layer_sliding_window = sliding_window 4096) iff
    # config.layer_types[i] == "sliding_attention", the list transformers 5.19's
    # Gemma2Config writes at load time (every 2nd layer full, starting with sliding);
    # :197-198 num_kv_heads = num_key_value_heads 8, head_dim = config.head_dim 256
    # (3584 / 16 = 224 is not it). 42 layers: 21 sliding + 21 full.
    desc = m.describe_config(load("gemma-2-9b-it"), weights_bytes=1)
    assert desc["architectures"] == ["Gemma2ForCausalLM"]
    assert desc["model_type"] == "gemma2" and desc["known_architecture"] is True
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (42, 8, 256)
    assert desc["layer_kinds"][:4] == ["sliding", "full", "sliding", "full"]
    assert kinds(desc) == {"sliding": 21, "full": 21} and desc["sliding_window"] == 4096
    assert desc["attention"] == "gqa+sliding" and desc["kind"] == "generative"
    assert desc["max_position_embeddings"] == 8192 and t.model_max_len(desc) == 8192
    check_kv_bytes(desc, 42, 8, 256)
    layout = kv_memory.kv_layout(desc, tp=1, block_size=16)
    assert layout["group_size"] == 21 and sorted(layout["groups"]) == ["full", "sliding"]
    # control: without the Gemma 2 pattern rule the same config would slide on every
    # layer (sliding_window set, no layer_types), which this test rejects
    monkeypatch.setattr(model_families, "LAYER_PATTERN_DEFAULTS", {})
    assert kinds(m.describe_config(load("gemma-2-9b-it"), weights_bytes=1)) == {
        "sliding": 42}


def test_chatglm3_6b_is_generative_multi_query_groups_and_seq_length(monkeypatch):
    # THUDM/chatglm3-6b (ModelScope folder copy). registry.py:82 ChatGLMModel ->
    # chatglm.py ChatGLMForCausalLM, a text-generation model although its name ends in
    # "Model"; vLLM loads it with its own ChatGLMConfig (transformers_utils/config.py:84,
    # configs/chatglm.py:54 max_position_embeddings = seq_length 8192).
    # chatglm.py:61-65 total_num_kv_heads = multi_query_group_num (2) because
    # multi_query_attention is true; :75 head_dim = 4096 // 32 = 128 (kv_channels 128
    # is not read); :275 num_layers 28. No sliding window.
    cfg = load("chatglm3-6b")
    desc = m.describe_config(cfg, weights_bytes=1)
    assert desc["architectures"] == ["ChatGLMModel"]
    assert desc["model_type"] == "chatglm" and desc["known_architecture"] is True
    assert desc["kind"] == "generative" and desc["native_pooling"] is False
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (28, 2, 128)
    assert kinds(desc) == {"full": 28} and desc["attention"] == "gqa"
    assert desc["max_position_embeddings"] == 8192 and t.model_max_len(desc) == 8192
    assert desc["torch_dtype"] == "float16"
    check_kv_bytes(desc, 28, 2, 128)
    # 2 KV heads are split across TP 2, replicated at TP 4
    assert kv_memory.kv_layout(desc, tp=2, block_size=16)["per_token_layer_bytes"] == 2 * 128 * 2
    assert kv_memory.kv_layout(desc, tp=4, block_size=16)["per_token_layer_bytes"] == 2 * 128 * 2
    # controls: without multi_query_attention vLLM builds one KV head per head; without
    # seq_length (its only length key) the config is refused; read by its name ending
    # alone, ChatGLMModel would be taken for a pooling model
    mha = m.describe_config(dict(cfg, multi_query_attention=False), weights_bytes=1)
    assert mha["num_kv_heads"] == 32 and mha["attention"] == "mha"
    with pytest.raises(m.ModelError, match="lacks max_position_embeddings"):
        m.describe_config({k: v for k, v in cfg.items() if k != "seq_length"},
                          weights_bytes=1)
    monkeypatch.setattr(model_families, "GENERATIVE_ARCHITECTURES", set())
    assert m.describe_config(cfg, weights_bytes=1)["kind"] == "pooling"


def test_bge_m3_xlm_roberta_is_an_encoder_only_pooling_model(tmp_path):
    # BAAI/bge-m3 (the Git LFS object of a third-party copy, identified by the
    # pointer's sha256; SOURCES.md). registry.py:247 XLMRobertaModel -> roberta.py
    # RobertaEmbeddingModel (:117), a BertEmbeddingModel whose layers are
    # EncoderOnlyAttention (bert.py:266): no KV cache (kv_cache_interface.py
    # EncoderOnlyAttentionSpec). 24 layers, 16 heads x 64; native pooling (CLS).
    cfg = load("bge-m3")
    desc = m.describe_config(cfg, weights_bytes=1)
    check_encoder_only(desc, "XLMRobertaModel", "xlm-roberta", (24, 16, 64))
    assert desc["torch_dtype"] == "float32"
    layout = kv_memory.kv_layout(desc, tp=1, block_size=16)
    assert layout["per_token_layer_bytes"] == 0 and layout["groups"] == []
    # config/model.py:2129-2141, 2552-2557: for a pooling model with absolute position
    # embeddings vLLM also takes tokenizer_config.json's model_max_length. bge-m3's own
    # tokenizer_config.json is published only as an LFS pointer here, so the test writes
    # one with the value 8192 (synthetic): the 8,194 positions become 8,192 tokens
    assert desc["max_position_embeddings"] == 8194
    folder = tmp_path / "bge-m3"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    assert m.describe_model_dir(str(folder), weights_bytes=1)[
        "max_position_embeddings"] == 8194
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 8192}))
    assert m.describe_model_dir(str(folder), weights_bytes=1)[
        "max_position_embeddings"] == 8192
    # control: without position_embedding_type "absolute" vLLM does not read the file
    (folder / "config.json").write_text(json.dumps(
        {k: v for k, v in cfg.items() if k != "position_embedding_type"}))
    assert m.describe_model_dir(str(folder), weights_bytes=1)[
        "max_position_embeddings"] == 8194
