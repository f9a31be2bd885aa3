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

from test_model_families import check_kv_bytes, kinds, load
from test_kv_falcon_neox_olmo2_deepseek_v2_granite_cohere2 import check_full_decoder
from gpufleet import model as m
from gpufleet import model_families
from gpufleet import tune as t
from gpufleet import kv_memory
from gpufleet import serve_dtype


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
    assert kv_memory.kv_layout(desc, tp=4, block_size=16)["per_token_layer_bytes"] == 2 * 8 * 128 * 2
    # the same abbreviated fields as a top-level config.json are still refused: the
    # defaults complete a wrapper's text_config only
    with pytest.raises(m.ModelError, match="lacks num_hidden_layers, num_attention_heads"):
        m.describe_config(dict(text, architectures=["LlamaForCausalLM"]), weights_bytes=1)
    # control: without TEXT_CONFIG_DEFAULTS the text_config lacks the shape
    monkeypatch.setattr(model_families, "TEXT_CONFIG_DEFAULTS", {})
    with pytest.raises(m.ModelError, match="lacks num_hidden_layers, num_attention_heads"):
        m.describe_config(cfg, weights_bytes=1)


def test_olmoe_0125_instruct_is_mha_hidden_over_heads():
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
    assert kv_memory.kv_layout(desc, tp=4, block_size=16)["per_token_layer_bytes"] == 2 * 4 * 128 * 2
    # control: test_kv_falcon_neox_olmo2_deepseek_v2_granite_cohere2.py test_families_outside_the_table_are_refused[olmoe]


def test_stablelm_3b_4e1t_partial_rotary_does_not_size_the_cache():
    # stabilityai/stablelm-3b-4e1t (StableLmForCausalLM, model_type stablelm). registry.py:205
    # -> stablelm.py (native) on transformers 5.19's StableLmConfig. stablelm.py:107-119
    # StablelmAttention: 32 heads, total_num_key_value_heads = num_key_value_heads 32 (split
    # across TP ranks, replicated below their count); :120 head_dim = hidden_size // heads =
    # 2560 // 32 = 80 (no head_dim is read); :148-152 the rotary embedding of that head_dim
    # with the config's rope_parameters (partial_rotary_factor 0.25: 20 of the 80
    # dimensions turn); :154-161 Attention(num_heads, head_dim, num_kv_heads) without a
    # window; :232-233 make_layers(num_hidden_layers 32). Context max_position_embeddings
    # 4096, torch_dtype bfloat16.
    cfg = load("stablelm-3b-4e1t")
    assert cfg["partial_rotary_factor"] == 0.25 and "head_dim" not in cfg
    # 2 x 32 x 80 x 2 = 10,240 bytes per token per layer
    desc = check_full_decoder(cfg, "StableLmForCausalLM", "stablelm", (32, 32, 80), "mha",
                              "bfloat16", 4096)
    # were the rotary part the head size, it would be 2 x 32 x 20 x 2 = 2,560
    per_token = kv_memory.kv_layout(desc, tp=1, block_size=16)["per_token_layer_bytes"]
    assert per_token == 10240 != 2 * 32 * int(80 * cfg["partial_rotary_factor"]) * 2
    # 32 KV heads split across TP 2: 16 per GPU
    assert kv_memory.kv_layout(desc, tp=2, block_size=16)["per_token_layer_bytes"] == 2 * 16 * 80 * 2
    # control: test_kv_falcon_neox_olmo2_deepseek_v2_granite_cohere2.py test_families_outside_the_table_are_refused[stablelm]


def test_exaone_3_5_7_8b_reads_num_layers_and_head_dim():
    # LGAI-EXAONE/EXAONE-3.5-7.8B-Instruct (ExaoneForCausalLM, model_type exaone, remote
    # code: auto_map configuration_exaone.ExaoneConfig). registry.py:99 -> exaone.py
    # (native). The remote ExaoneConfig's attribute_map {"num_hidden_layers": "num_layers"}
    # (the copy in vLLM's former transformers_utils/configs/exaone.py, find_string id
    # 452804856) makes exaone.py:314-315 make_layers(config.num_hidden_layers) read the
    # file's num_layers 32; the file names no num_hidden_layers. exaone.py:243-249
    # num_kv_heads = num_key_value_heads 8 (:119-132 split across TP ranks, replicated
    # below 8); :133-136 head_dim = config.head_dim 128 (else 4096 // 32, also 128);
    # :166-174 Attention without a window. Context: max_position_embeddings 32768; the
    # llama3 rope_scaling (factor 8 over original 8192) is not applied again
    # (config/model.py:2585-2605, "llama3" among the types skipped). torch_dtype float32
    # in the file: vLLM downcasts a float32 checkpoint to its preferred 16-bit dtype
    # (config/model.py:2422-2424), as the tuner's dtype choice does (serve_dtype.served_dtype).
    cfg = load("exaone-3.5-7.8b-instruct")
    assert "num_hidden_layers" not in cfg and cfg["num_layers"] == 32
    assert cfg["rope_scaling"]["rope_type"] == "llama3"
    desc = m.describe_config(cfg, weights_bytes=1)
    assert desc["architectures"] == ["ExaoneForCausalLM"]
    assert desc["model_type"] == "exaone" and desc["known_architecture"] is True
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (32, 8, 128)
    assert kinds(desc) == {"full": 32} and desc["sliding_window"] is None
    assert desc["attention"] == "gqa" and desc["kind"] == "generative"
    assert desc["torch_dtype"] == "float32"
    assert serve_dtype.served_dtype(desc, (9, 0), None, [], False) == ("bfloat16", 2)
    assert desc["max_position_embeddings"] == 32768 and t.model_max_len(desc) == 32768
    # 2 x 8 x 128 x 2 = 4,096 bytes per token per layer
    check_kv_bytes(desc, 32, 8, 128)
    # 8 KV heads split across TP 8: 1 per GPU
    assert kv_memory.kv_layout(desc, tp=8, block_size=16)["per_token_layer_bytes"] == 2 * 1 * 128 * 2
    # control: test_kv_falcon_neox_olmo2_deepseek_v2_granite_cohere2.py test_families_outside_the_table_are_refused[exaone]
