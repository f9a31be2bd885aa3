"""KV layout of five older families (issue #14 item 5): Gemma 1, GPT-2, OPT, GPT-J, Bloom.

Every config here is the model's own published config.json (tests/fixtures/models/
SOURCES.md, the section for this file; GPT-2, OPT and bloomz-560m are byte for byte the
hub files, their git blob equal to the hub's etag). Each expected number was derived by
hand from the vLLM file named in the test's comment, read in vLLM 0.32.0 (the wheel the
lab image installs), with that image's transformers 5.19.0, whose config classes fill
what config.json leaves out and resolve the fields' other names. Line numbers are from
those files. All five are native vLLM model files (registry.py:81 BloomForCausalLM,
:106 GemmaForCausalLM, :123 GPT2LMHeadModel, :124 GPTJForCausalLM, :185 OPTForCausalLM;
none is in _TRANSFORMERS_SUPPORTED_MODELS or _PREVIOUSLY_SUPPORTED_MODELS), each layer
one Attention without a per-layer window; none of these configs has a sliding_window or
layer_types, so no layer slides (vllm/engine/arg_utils.py:2249-2254).

The engine counts the same heads: model_arch_config_convertor.py:150-166
get_total_num_kv_heads (none of n_head_kv / num_kv_heads / num_key_value_heads / ... on
GPT-2, OPT, GPT-J or Bloom's config classes: one per attention head) and :89-116
get_head_size (head_dim, else hidden_size // num_attention_heads, which GPT2Config and
GPTJConfig answer through their attribute_map).

The tuner's bytes per token per layer are checked against 2 x kv_heads x head_size x
element bytes (check_kv_bytes), vllm/v1/kv_cache_interface.py.
"""
import pytest

from test_model_families import check_kv_bytes, load
from test_kv_falcon_neox_olmo2_deepseek_v2_granite_cohere2 import check_full_decoder
from gpufleet import model as m
from gpufleet import model_families
from gpufleet import tune as t
from gpufleet import kv_memory


def test_gemma_7b_reads_head_dim_256_not_hidden_over_heads(monkeypatch):
    # google/gemma-7b (GemmaForCausalLM, model_type gemma). gemma.py:216-223
    # GemmaDecoderLayer: GemmaAttention(num_heads=num_attention_heads 16,
    # num_kv_heads=num_key_value_heads 16, head_dim=config.head_dim 256); :145-154 KV
    # heads split across TP ranks (replicated below their count); :183-190 Attention
    # without a window; :278-279 make_layers(num_hidden_layers 28). 3072 // 16 = 192 is
    # never used: q_size = 16 x 256 = 4096 > hidden_size. Context max_position_embeddings
    # 8192, rope_scaling null.
    cfg = load("gemma-7b")
    assert cfg["head_dim"] == 256 and cfg["hidden_size"] // cfg["num_attention_heads"] == 192
    # 2 x 16 x 256 x 2 = 16,384 bytes per token per layer
    desc = check_full_decoder(cfg, "GemmaForCausalLM", "gemma", (28, 16, 256), "mha",
                              "bfloat16", 8192)
    # 16 KV heads split across TP 2: 8 per GPU
    assert kv_memory.kv_layout(desc, tp=2, block_size=16)["per_token_layer_bytes"] == 2 * 8 * 256 * 2
    # a file without head_dim still gets 256: GemmaConfig's default
    # (transformers 5.19 configuration_gemma.py:73), through CONFIG_DEFAULTS
    bare = {k: v for k, v in cfg.items() if k != "head_dim"}
    assert m.describe_config(bare, weights_bytes=1)["head_size"] == 256
    # control: without that default the generic rule would give 3072 // 16 = 192
    monkeypatch.setattr(model_families, "CONFIG_DEFAULTS", {})
    assert m.describe_config(bare, weights_bytes=1)["head_size"] == 192


def test_gpt2_is_mha_with_its_n_names_and_1024_positions(monkeypatch):
    # openai-community/gpt2 (GPT2LMHeadModel, model_type gpt2). gpt2.py:72-77
    # GPT2Attention: hidden_size (GPT2Config's attribute_map: n_embd 768) //
    # num_attention_heads (n_head 12) = 64; :95-102 Attention without num_kv_heads, so
    # one KV head per head (attention.py:327-328): 12; :211-212 make_layers(
    # num_hidden_layers = n_layer 12). Context: n_positions 1024 (convertor :394-427
    # reads max_position_embeddings, which attribute_map makes n_positions); n_ctx is
    # not read. No torch_dtype in the file: vLLM reads the safetensors' F32 and serves
    # 16 bits (config/model.py:2422-2424), the tuner's bfloat16 fallback on a GPU with
    # bf16 (torch_dtype_from_config false).
    cfg = load("gpt2")
    assert "torch_dtype" not in cfg and cfg["n_ctx"] == 1024
    # 2 x 12 x 64 x 2 = 3,072 bytes per token per layer
    desc = check_full_decoder(cfg, "GPT2LMHeadModel", "gpt2", (12, 12, 64), "mha",
                              "bfloat16", 1024)
    assert desc["torch_dtype_from_config"] is False and desc["hidden_size"] == 768
    # 12 heads: TP 4 keeps 3 per GPU; TP 8 is refused (gpt2.py:75 asserts
    # heads % tp == 0)
    assert kv_memory.kv_layout(desc, tp=4, block_size=16)["per_token_layer_bytes"] == 2 * 3 * 64 * 2
    assert t.tp_problem(desc, 4) is None and "not divisible" in t.tp_problem(desc, 8)
    # a file naming max_position_embeddings sets n_positions (attribute_map): 2048 here
    renamed = {k: v for k, v in cfg.items() if k != "n_positions"}
    renamed["max_position_embeddings"] = 2048
    assert m.describe_config(renamed, weights_bytes=1)["max_position_embeddings"] == 2048
    # control: without CONFIG_ATTRIBUTE_MAP GPT2Config's default n_positions 1024 would
    # stand beside it and the smaller would win
    monkeypatch.setattr(model_families, "CONFIG_ATTRIBUTE_MAP", {})
    assert m.describe_config(renamed, weights_bytes=1)["max_position_embeddings"] == 1024


@pytest.mark.parametrize("flag", ["add_cross_attention", "scale_attn_by_inverse_layer_idx",
                                  "reorder_and_upcast_attn"])
def test_gpt2_flags_vllm_asserts_off_are_refused(flag):
    # gpt2.py:200-202: GPT2Model asserts each of these is false
    with pytest.raises(m.UnsupportedModelError, match=flag):
        m.describe_config(dict(load("gpt2"), **{flag: True}), weights_bytes=1)
    assert m.describe_config(dict(load("gpt2"), **{flag: False}), weights_bytes=1)


def test_opt_125m_is_mha_and_word_embed_proj_dim_stays_out_of_the_cache():
    # facebook/opt-125m (OPTForCausalLM, model_type opt). opt.py:136-139
    # OPTDecoderLayer: OPTAttention(embed_dim=hidden_size 768, num_heads=12); :85-88
    # head_dim = 768 // 12 = 64; :106-113 Attention without num_kv_heads: 12 KV heads;
    # :259-260 make_layers(num_hidden_layers 12). word_embed_proj_dim sizes only the
    # token embedding and its projections (:211-240). Context max_position_embeddings
    # 2048 (:209), torch_dtype float16.
    cfg = load("opt-125m")
    # 2 x 12 x 64 x 2 = 3,072 bytes per token per layer
    check_full_decoder(cfg, "OPTForCausalLM", "opt", (12, 12, 64), "mha", "float16", 2048)
    # control: opt-350m's shape projects a 512-wide embedding into 1024-wide layers of 16
    # heads; the cache is 1024 // 16 = 64 per head, not 512 // 16 = 32 (hand-written
    # variation of this file: no opt-350m config.json was read)
    shape_350m = dict(cfg, hidden_size=1024, num_attention_heads=16, num_hidden_layers=24,
                      word_embed_proj_dim=512, ffn_dim=4096)
    desc = m.describe_config(shape_350m, weights_bytes=1)
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (24, 16, 64)
    check_kv_bytes(desc, 24, 16, 64)


def test_gpt_j_6b_head_size_is_hidden_over_heads_not_rotary_dim():
    # EleutherAI/gpt-j-6b (GPTJForCausalLM, model_type gptj). gpt_j.py:68-70
    # head_size = hidden_size (GPTJConfig attribute_map: n_embd 4096) // num_attention_heads
    # (n_head 16) = 256; :93-96 rotary_dim 64 only sets partial_rotary_factor 64 / 256 (the
    # rotary embedding turns 64 of the 256 dimensions); :104-111 Attention(num_heads,
    # head_size) without num_kv_heads: 16 KV heads of 256; :205-206 make_layers(n_layer
    # 28). Context n_positions 2048. No torch_dtype in the file.
    cfg = load("gpt-j-6b")
    assert cfg["rotary_dim"] == 64
    # 2 x 16 x 256 x 2 = 16,384 bytes per token per layer
    desc = check_full_decoder(cfg, "GPTJForCausalLM", "gptj", (28, 16, 256), "mha",
                              "bfloat16", 2048)
    assert desc["torch_dtype_from_config"] is False
    # control: were rotary_dim the head size, it would be 2 x 16 x 64 x 2 = 4,096
    per_token = kv_memory.kv_layout(desc, tp=1, block_size=16)["per_token_layer_bytes"]
    assert per_token == 16384 != 2 * 16 * cfg["rotary_dim"] * 2
    # another rotary_dim changes nothing in the cache
    assert m.describe_config(dict(cfg, rotary_dim=32), weights_bytes=1)["head_size"] == 256
    # 16 KV heads split across TP 8: 2 per GPU
    assert kv_memory.kv_layout(desc, tp=8, block_size=16)["per_token_layer_bytes"] == 2 * 2 * 256 * 2


def test_bloomz_560m_is_alibi_mha_with_n_embed_and_seq_length(monkeypatch):
    # bigscience/bloomz-560m (BloomForCausalLM, model_type bloom). BloomConfig
    # (configuration_bloom.py:75-78) takes the file's n_embed 1024 as hidden_size, and its
    # attribute_map (:53-56) num_attention_heads 16 as n_head. bloom.py:94-97 head_dim =
    # hidden_size // n_head = 64; :119-135 ALiBi slopes (this rank's heads) instead of a
    # rotary embedding, Attention(num_heads, head_dim) without num_kv_heads: 16 KV heads,
    # a plain full-attention cache; :258-259 make_layers(num_hidden_layers = n_layer 24).
    # Context: no max_position_embeddings or n_positions; seq_length 2048 is among the
    # keys model_arch_config_convertor.py:394-427 reads. No torch_dtype in the file.
    cfg = load("bloomz-560m")
    assert "hidden_size" not in cfg and cfg["n_embed"] == 1024 and cfg["seq_length"] == 2048
    # 2 x 16 x 64 x 2 = 4,096 bytes per token per layer
    desc = check_full_decoder(cfg, "BloomForCausalLM", "bloom", (24, 16, 64), "mha",
                              "bfloat16", 2048)
    assert desc["hidden_size"] == 1024 and desc["rope_scaling"] is None
    # 16 KV heads split across TP 2: 8 per GPU (bloom.py:120-124 slices the slopes too)
    assert kv_memory.kv_layout(desc, tp=2, block_size=16)["per_token_layer_bytes"] == 2 * 8 * 64 * 2
    # without seq_length (bigscience/bloom names no length): vLLM's 2,048
    # (config/model.py:2561-2578), and a shorter seq_length is taken as it is
    bare = {k: v for k, v in cfg.items() if k != "seq_length"}
    assert m.describe_config(bare, weights_bytes=1)["max_position_embeddings"] == 2048
    assert m.describe_config(dict(cfg, seq_length=1024),
                             weights_bytes=1)["max_position_embeddings"] == 1024
    # control: without CONFIG_ATTRIBUTE_MAP, n_embed is not read and BloomConfig's
    # test-sized default hidden_size 64 gives 64 // 16 = 4 per head
    monkeypatch.setattr(model_families, "CONFIG_ATTRIBUTE_MAP", {})
    assert m.describe_config(cfg, weights_bytes=1)["head_size"] == 4


def test_default_length_is_bloom_only():
    # vLLM's 2,048 fallback is applied to Bloom alone; an OPT file without
    # max_position_embeddings gets OPTConfig's 2048 (CONFIG_DEFAULTS), a Llama file
    # without a length is still refused
    opt = {k: v for k, v in load("opt-125m").items() if k != "max_position_embeddings"}
    assert m.describe_config(opt, weights_bytes=1)["max_position_embeddings"] == 2048
    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
             "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64}
    with pytest.raises(m.ModelError, match="lacks max_position_embeddings"):
        m.describe_config(llama, weights_bytes=1)


# The control that each of these families is refused without its table entry is
# test_kv_falcon_neox_olmo2_deepseek_v2_granite_cohere2.py's test_families_outside_the_table_are_refused.


@pytest.mark.parametrize("cfg, why", [
    # MiniCPM: minicpm.py reads num_key_value_heads and hidden_size // heads, but its
    # config class is the checkpoint's remote code and no published config.json was read
    ({"architectures": ["MiniCPMForCausalLM"], "model_type": "minicpm",
      "num_hidden_layers": 40, "num_attention_heads": 36, "num_key_value_heads": 36,
      "hidden_size": 2304, "max_position_embeddings": 2048}, "not in gpufleet's table"),
    # DBRX: DbrxConfig names its fields n_layers / n_heads / d_model / max_seq_len and
    # keeps the KV heads in attn_config.kv_n_heads (DbrxModelArchConfigConvertor,
    # model_arch_config_convertor.py:554-559); the tuner reads none of them
    ({"architectures": ["DbrxForCausalLM"], "model_type": "dbrx", "d_model": 6144,
      "n_heads": 48, "n_layers": 40, "max_seq_len": 32768,
      "attn_config": {"kv_n_heads": 8}}, "lacks num_hidden_layers, num_attention_heads"),
])
def test_minicpm_and_dbrx_stay_refused(cfg, why):
    assert cfg["model_type"] not in model_families.KNOWN_MODEL_TYPES
    with pytest.raises(m.ModelError, match=why):
        m.describe_config(cfg, weights_bytes=1)
