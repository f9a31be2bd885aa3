"""KV layout of more model families (issue #14 item 5, slice g), each on its own config.json.

Every config here is a published config.json of that model (tests/fixtures/models/
SOURCES.md, the section for this file). Each expected number was derived by hand from
the vLLM file named in the test's comment, read in vLLM 0.32.0 (the wheel the lab image
installs), with that image's transformers 5.19.0, whose config classes fill what
config.json leaves out. Line numbers are from those files. None of these configs has a
sliding_window or layer_types, so no layer slides (vllm/engine/arg_utils.py:2249-2254).

The tuner's bytes per token per layer are checked against 2 x kv_heads x head_size x
element bytes (check_kv_bytes), vllm/v1/kv_cache_interface.py.
"""
import pytest

from test_model_families import load
from test_model_families_more_c import check_full_decoder
from gpufleet import model as m
from gpufleet import tune as t


def test_llava_1_5_7b_language_model_takes_llama_config_defaults(monkeypatch):
    # llava-hf/llava-1.5-7b-hf (LlavaForConditionalGeneration, model_type llava; its
    # text_config is llama). registry.py:490 -> llava.py. llava.py:569-572 builds the
    # language model with init_vllm_registered_model(hf_config=config.text_config), i.e.
    # LlamaForCausalLM (the text_config's architectures) on the object transformers 5.19's
    # LlavaConfig made from the file's text_config with
    # CONFIG_MAPPING["llama"](**text_config) (configuration_llava.py:81-83). The file names
    # only max_position_embeddings 4096 and vocab_size 32064 there; LlamaConfig fills the
    # rest (configuration_llama.py:64-71: hidden_size 4096, intermediate_size 11008, 32
    # layers, 32 heads; :87-90: head_dim = 4096 // 32 = 128, num_key_value_heads = 32).
    # llama.py:158-159 head_dim 128; :288-291 num_kv_heads = num_key_value_heads 32 (MHA);
    # :185-204 a window only from layer_types (none); :389-390 make_layers(32). The engine
    # reads the same object (config.py get_hf_text_config; the context 4096 from
    # model_arch_config_convertor.py:394-427). torch_dtype float16 (both levels).
    cfg = load("llava-1.5-7b-hf")
    text = cfg["text_config"]
    assert text["model_type"] == "llama" and not {
        "hidden_size", "num_hidden_layers", "num_attention_heads"} & set(text)
    # 2 x 32 x 128 x 2 = 16,384 bytes per token per layer
    desc = check_full_decoder(cfg, "LlavaForConditionalGeneration", "llama", (32, 32, 128),
                              "mha", "float16", 4096)
    assert (desc["hidden_size"], desc["intermediate_size"], desc["vocab_size"]) == (
        4096, 11008, 32064)
    # 32 KV heads split across TP 4: 8 per GPU (llama.py:147-156)
    assert t.kv_layout(desc, tp=4, block_size=16)["per_token_layer_bytes"] == 2 * 8 * 128 * 2
    # the same abbreviated fields as a top-level config.json are still refused: the
    # defaults complete a wrapper's text_config only
    with pytest.raises(m.ModelError, match="lacks num_hidden_layers, num_attention_heads"):
        m.describe_config(dict(text, architectures=["LlamaForCausalLM"]), weights_bytes=1)
    # control: without TEXT_CONFIG_DEFAULTS the text_config lacks the shape
    monkeypatch.setattr(m, "TEXT_CONFIG_DEFAULTS", {})
    with pytest.raises(m.ModelError, match="lacks num_hidden_layers, num_attention_heads"):
        m.describe_config(cfg, weights_bytes=1)


def test_olmoe_0125_instruct_is_mha_hidden_over_heads(monkeypatch):
    # allenai/OLMoE-1B-7B-0125-Instruct (OlmoeForCausalLM, model_type olmoe). registry.py:184
    # -> olmoe.py (native). olmoe.py:130-146 OlmoeAttention: 16 heads,
    # total_num_kv_heads = num_key_value_heads 16 (split across TP ranks, replicated below
    # their count); :147 head_dim = hidden_size // heads = 2048 // 16 = 128 (config.head_dim
    # is never read); :164-165 q/k RMSNorms over all heads (numerics, not the cache);
    # :180-188 Attention(num_heads, head_dim, num_kv_heads) without a window; :287-288
    # make_layers(num_hidden_layers 16). 64 experts, 8 per token (MoE MLP). Context
    # max_position_embeddings 4096, rope_scaling null, torch_dtype bfloat16.
    cfg = load("olmoe-1b-7b-0125-instruct")
    assert "head_dim" not in cfg and cfg["num_key_value_heads"] == cfg["num_attention_heads"]
    # 2 x 16 x 128 x 2 = 8,192 bytes per token per layer
    desc = check_full_decoder(cfg, "OlmoeForCausalLM", "olmoe", (16, 16, 128), "mha",
                              "bfloat16", 4096)
    assert desc["moe"] == {"num_experts": 64, "experts_per_token": 8}
    # 16 KV heads split across TP 4: 4 per GPU
    assert t.kv_layout(desc, tp=4, block_size=16)["per_token_layer_bytes"] == 2 * 4 * 128 * 2
    # control: without its table entry the family is refused
    monkeypatch.setattr(m, "KNOWN_MODEL_TYPES", m.KNOWN_MODEL_TYPES - {"olmoe"})
    with pytest.raises(m.ModelError, match="not in gpufleet's table"):
        m.describe_config(cfg, weights_bytes=1)
