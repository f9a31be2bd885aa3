"""Model description from real config.json files and safetensors headers.

Fixtures under tests/fixtures/models/ are real configs (SOURCES.md says where each came
from). Safetensors files written here are built by hand in the format's own layout:
an 8-byte little-endian header length, then the JSON header.
"""
import json
import shutil
import struct

import pytest

from conftest import FIXTURES
from gpufleet import model as m

MODELS = FIXTURES / "models"


def write_safetensors(path, tensors, data=True):
    """Write a safetensors file: tensors is {name: (dtype, shape, nbytes)}."""
    header, offset = {}, 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header).encode()
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw)
        if data:
            handle.write(b"\0" * offset)
    return offset


def copy_model(name, tmp_path):
    dest = tmp_path / name
    shutil.copytree(MODELS / name, dest)
    return dest


# --- attention kinds from real configs -------------------------------------------

def test_llama_3_1_8b_is_gqa_with_derived_head_size():
    cfg = json.loads((MODELS / "llama-3.1-8b" / "config.json").read_text())
    desc = m.describe_config(cfg, weights_bytes=1)
    assert desc["attention"] == "gqa"
    assert (desc["num_layers"], desc["num_attention_heads"], desc["num_kv_heads"]) == (32, 32, 8)
    assert desc["head_size"] == 4096 // 32  # no head_dim in the config
    assert desc["kind"] == "generative"
    assert desc["max_position_embeddings"] == 131072
    assert desc["rope_scaling"]["rope_type"] == "llama3"


def test_qwen3_8b_uses_explicit_head_dim():
    cfg = json.loads((MODELS / "qwen3-8b" / "config.json").read_text())
    desc = m.describe_config(cfg, weights_bytes=1)
    assert desc["head_size"] == 128 and desc["num_kv_heads"] == 8 and desc["num_layers"] == 36
    assert desc["layer_kinds"] == ["full"] * 36  # sliding_window null


def test_qwen2_5_sliding_window_switched_off_means_full_attention():
    # Qwen2.5 configs carry sliding_window 131072 with use_sliding_window false.
    cfg = json.loads((MODELS / "qwen2.5-7b" / "config.json").read_text())
    desc = m.describe_config(cfg, weights_bytes=1)
    assert desc["layer_kinds"] == ["full"] * 28
    assert desc["attention"] == "gqa" and desc["num_kv_heads"] == 4
    assert desc["sliding_window"] is None


def test_deepseek_v3_is_mla_with_fp8_weights_and_moe():
    cfg = json.loads((MODELS / "deepseek-v3" / "config.json").read_text())
    desc = m.describe_config(cfg, weights_bytes=1)
    assert desc["attention"] == "mla"
    assert (desc["kv_lora_rank"], desc["qk_rope_head_dim"]) == (512, 64)
    assert desc["quantization"] == {"method": "fp8", "bits": 8, "weight_block_size": [128, 128]}
    assert desc["moe"] == {"num_experts": 256, "experts_per_token": 8}
    assert desc["num_layers"] == 61


def test_minilm_folder_is_a_native_pooling_encoder(tmp_path):
    folder = copy_model("all-minilm-l6-v2", tmp_path)
    (folder / "model.safetensors.header").rename(folder / "model.safetensors")
    desc = m.describe_model_dir(str(folder))
    assert desc["kind"] == "pooling" and desc["native_pooling"] is True
    assert desc["sentence_transformers"] is True
    assert desc["attention"] == "encoder_only"
    # the real header's tensors: file size 90,868,376 - 8 - 11,408 header bytes
    assert desc["weights_bytes"] == 90_868_376 - 8 - 11_408
    assert desc["weights_dtype"] == "F32"
    assert desc["torch_dtype"] == "float32"  # no torch_dtype in config: from the header


def test_sentence_transformers_files_turn_a_causal_lm_into_an_embedding_model(tmp_path):
    # Qwen3-Embedding-0.6B as published: a Qwen3ForCausalLM config + modules.json
    folder = copy_model("qwen3-embedding-0.6b", tmp_path)
    assert json.loads((folder / "config.json").read_text())["architectures"] == [
        "Qwen3ForCausalLM"]
    write_safetensors(folder / "model.safetensors", {"w": ("BF16", [4], 8)})
    desc = m.describe_model_dir(str(folder))
    assert desc["kind"] == "pooling" and desc["native_pooling"] is False
    for name in ("modules.json", "config_sentence_transformers.json"):
        (folder / name).unlink()
    assert m.describe_model_dir(str(folder))["kind"] == "generative"


def test_hybrid_layer_types_and_uniform_sliding_window():
    # Hand-written configs exercising the layer_types rule (transformers >= 4.53).
    base = {"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"],
            "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
            "head_dim": 64, "hidden_size": 512, "max_position_embeddings": 4096,
            "sliding_window": 128}
    hybrid = dict(base, layer_types=["sliding_attention", "full_attention"] * 2)
    desc = m.describe_config(hybrid, weights_bytes=1)
    assert desc["layer_kinds"] == ["sliding", "full", "sliding", "full"]
    assert desc["attention"] == "gqa+sliding" and desc["sliding_window"] == 128
    mistral = dict(base, model_type="mistral", architectures=["MistralForCausalLM"])
    desc = m.describe_config(mistral, weights_bytes=1)
    assert desc["layer_kinds"] == ["sliding"] * 4 and desc["attention"] == "gqa-sliding"


def test_unmodelled_layer_types_are_refused():
    cfg = {"model_type": "qwen3", "architectures": ["X"], "num_hidden_layers": 2,
           "num_attention_heads": 2, "hidden_size": 8, "max_position_embeddings": 8,
           "layer_types": ["linear_attention", "full_attention"]}
    with pytest.raises(m.UnsupportedModelError, match="linear_attention"):
        m.describe_config(cfg, weights_bytes=1)


def test_deepseek_v4_is_described_and_its_unmodelled_fields_refused():
    # deepseek-ai/DeepSeek-V4-Flash's own config.json (SOURCES.md); the layout and its
    # check against vLLM are in tests/unit/test_deepseek_v4.py
    cfg = json.loads((MODELS / "deepseek-v4-flash" / "config.json").read_text())
    desc = m.describe_config(cfg, weights_bytes=1)
    assert desc["attention"] == "deepseek_v4"
    # compress_ratios over 43 layers = 2 x 0 (window only), 21 x 4, 20 x 128
    assert m.model_summary(desc)["layer_kinds"] == {"sliding": 2, "c4a": 21, "c128a": 20}
    # a config with only the marker field is refused, naming what is missing
    with pytest.raises(m.UnsupportedModelError, match=r"DeepSeek-V4 config not modelled"):
        m.describe_config({"model_type": "x", "compress_ratios": [4]}, weights_bytes=1)


def test_awq_gptq_compressed_tensors_quantization_fields():
    base = json.loads((MODELS / "qwen2.5-7b" / "config.json").read_text())
    awq = json.loads((MODELS / "qwen2.5-7b-instruct-awq" / "config.json").read_text())
    assert m.describe_config(awq, weights_bytes=1)["quantization"] == {
        "method": "awq", "bits": 4, "group_size": 128}
    gptq = dict(base, quantization_config={"quant_method": "gptq", "bits": 8,
                                           "group_size": -1})
    assert m.describe_config(gptq, weights_bytes=1)["quantization"]["bits"] == 8
    ct = dict(base, quantization_config={"quant_method": "compressed-tensors",
                                         "format": "int-quantized"})
    assert m.describe_config(ct, weights_bytes=1)["quantization"] == {
        "method": "compressed-tensors", "format": "int-quantized"}


# --- refusals -----------------------------------------------------------------------

def test_folder_without_config_json_fails_clearly(tmp_path):
    write_safetensors(tmp_path / "model.safetensors", {"w": ("F16", [2], 4)})
    with pytest.raises(m.ModelError, match="has no config.json"):
        m.describe_model_dir(str(tmp_path))


def test_missing_folder_fails(tmp_path):
    with pytest.raises(m.ModelError, match="is not a directory"):
        m.describe_model_dir(str(tmp_path / "nope"))


def test_unknown_architecture_names_fields_or_falls_back_when_asked():
    cfg = {"architectures": ["BaichuanForCausalLM"], "model_type": "baichuan",
           "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
           "max_position_embeddings": 2048, "num_key_value_heads": 1}
    with pytest.raises(m.ModelError) as exc:
        m.describe_config(cfg, weights_bytes=1)
    assert "allow_unknown_architecture" in str(exc.value)
    assert "num_attention_heads" in str(exc.value)
    desc = m.describe_config(cfg, weights_bytes=1, allow_unknown_architecture=True)
    assert desc["known_architecture"] is False
    assert desc["num_kv_heads"] == 1 and desc["attention"] == "mqa"


# Falcon's KV head count as vLLM 0.32.0 reads it (FalconModelArchConfigConvertor,
# model_arch_config_convertor.py:536-549) from what transformers 5.19's FalconConfig loads
# (configuration_falcon.py:66-95: multi_query defaults to true, num_kv_heads to the head
# count). Variations of falcon-7b's shape (its own config.json is tested in
# test_kv_falcon_neox_olmo2_deepseek_v2_granite_cohere2.py) and falcon-40b's (no verbatim config of it was found);
# the older remote-code type RefinedWebModel stays outside the table.
FALCON_7B = {"architectures": ["FalconForCausalLM"], "model_type": "falcon",
             "hidden_size": 4544, "num_attention_heads": 71, "num_hidden_layers": 32,
             "multi_query": True, "new_decoder_architecture": False, "parallel_attn": True}


@pytest.mark.parametrize("change, kv_heads", [
    ({}, 1),                                           # falcon-7b: multi-query
    ({"num_kv_heads": 71}, 1),                         # as FalconConfig saves it again
    ({"multi_query": None}, 1),                        # absent: FalconConfig's default, true
    ({"multi_query": False}, 71),                      # falcon-rw-1b's kind: one per head
    # the older remote-code model type (no FalconConfig defaults: all fields given)
    ({"model_type": "RefinedWebModel", "n_head_kv": 71, "max_position_embeddings": 2048}, 1),
    ({"new_decoder_architecture": True, "num_kv_heads": 8, "num_attention_heads": 128,
      "hidden_size": 8192}, 8),                        # falcon-40b: multi_query ignored
])
def test_falcon_kv_heads_follow_vllms_falcon_rule(change, kv_heads):
    cfg = {k: v for k, v in dict(FALCON_7B, **change).items() if v is not None}
    desc = m.describe_config(cfg, weights_bytes=1, allow_unknown_architecture=True)
    assert desc["known_architecture"] is (cfg["model_type"] == "falcon")
    assert desc["num_kv_heads"] == kv_heads
    assert desc["head_size"] == cfg["hidden_size"] // cfg["num_attention_heads"]
    assert desc["max_position_embeddings"] == 2048  # FalconConfig's default


def test_num_attention_groups_is_a_kv_head_count_as_in_vllm():
    cfg = {"architectures": ["Step3p5ForCausalLM"], "model_type": "step3p5",
           "num_hidden_layers": 2, "num_attention_heads": 64, "hidden_size": 4096,
           "max_position_embeddings": 4096, "num_attention_groups": 8}
    desc = m.describe_config(cfg, weights_bytes=1, allow_unknown_architecture=True)
    assert desc["num_kv_heads"] == 8


def test_config_lacking_fields_names_them():
    with pytest.raises(m.ModelError, match="lacks num_hidden_layers, max_position_embeddings"):
        m.describe_config({"model_type": "llama", "num_attention_heads": 4,
                           "hidden_size": 64}, weights_bytes=1)
    with pytest.raises(m.ModelError, match="neither architectures nor model_type"):
        m.describe_config({"hidden_size": 64}, weights_bytes=1)


def test_invalid_config_json_fails(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(m.ModelError, match="not valid JSON"):
        m.describe_model_dir(str(tmp_path))


# --- weight bytes -----------------------------------------------------------------

def test_safetensors_header_sums_data_offsets_across_shards(tmp_path):
    one = write_safetensors(tmp_path / "model-00001-of-00002.safetensors",
                            {"a": ("BF16", [1024, 8], 16384), "b": ("BF16", [8], 16)})
    two = write_safetensors(tmp_path / "model-00002-of-00002.safetensors",
                            {"c": ("F32", [10], 40)}, data=False)  # header only is enough
    info = m.weights_from_dir(str(tmp_path))
    assert info["bytes"] == one + two == 16440
    assert info["dtype"] == "BF16" and "2 files" in info["source"]


def test_index_total_size_used_when_no_shards_present(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 16060522496}, "weight_map": {}}))
    info = m.weights_from_dir(str(tmp_path))
    assert info["bytes"] == 16060522496 and "index" in info["source"]


def test_real_trimmed_index_with_zero_total_is_refused(tmp_path):
    folder = copy_model("deepseek-v3", tmp_path)
    with pytest.raises(m.ModelError, match="total_size is 0"):
        m.describe_model_dir(str(folder))
    # weights_bytes replaces the index
    assert m.describe_model_dir(str(folder), weights_bytes=5)["weights_bytes"] == 5


def test_no_weights_at_all_is_refused(tmp_path):
    shutil.copy(MODELS / "qwen3-8b" / "config.json", tmp_path / "config.json")
    with pytest.raises(m.ModelError, match="pass weights_bytes"):
        m.describe_model_dir(str(tmp_path))


@pytest.mark.parametrize("content,message", [
    (b"\x01\x02", "shorter than 8 bytes"),
    (struct.pack("<Q", 50) + b'{"a": 1', "truncated"),
    (struct.pack("<Q", 7) + b"not-js!", "not JSON"),
    (struct.pack("<Q", 2**40), "implausible"),
])
def test_broken_safetensors_headers_fail(tmp_path, content, message):
    path = tmp_path / "x.safetensors"
    path.write_bytes(content)
    with pytest.raises(m.ModelError, match=message):
        m.safetensors_file_info(str(path))


def test_model_summary_folds_layer_kinds():
    cfg = json.loads((MODELS / "qwen3-8b" / "config.json").read_text())
    summary = m.model_summary(m.describe_config(cfg, weights_bytes=1))
    assert summary["layer_kinds"] == {"full": 36}
