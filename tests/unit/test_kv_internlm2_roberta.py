"""KV layout of InternLM2 and RoBERTa, each checked against its vLLM model file.

Every config here is the model's own published config.json
(tests/fixtures/models/SOURCES.md). The vLLM files were read at vLLM's main branch,
commit 073c510c9 (2026-08-09, "[Migration] Migrate bitsandbytes support to OOT
plugin (#43529)"), the newest upstream revision reachable here (in the history of a
fork, QuantTrio/vllm-cubic); no snapshot of the v0.33.0 tag could be read. Line
numbers are from that revision. The helpers are test_model_families.py's.
"""
import json

import pytest

from gpufleet import model as m
from gpufleet import model_families
from gpufleet import tune as t
from gpufleet import kv_memory
from test_model_families import MODELS, check_encoder_only, check_kv_bytes, kinds, load


# --- InternLM2 --------------------------------------------------------------------

def test_internlm2_5_7b_is_full_gqa_with_head_size_hidden_over_heads(monkeypatch):
    # internlm/internlm2_5-7b (downloaded with hf_hub_download, SOURCES.md).
    # registry.py:135 InternLM2ForCausalLM -> internlm2.py. InternLMDecoderLayer
    # (:206-214) builds InternLM2Attention with num_kv_heads =
    # config.num_key_value_heads (8); InternLM2Attention :118-119 head_dim =
    # hidden_size // num_attention_heads = 4096 // 32 = 128 (head_dim is not read);
    # :148-156 Attention(..., num_kv_heads) with no per-layer window, and the config
    # has no sliding_window: all 32 layers (make_layers over num_hidden_layers) full.
    cfg = load("internlm2_5-7b")
    desc = m.describe_config(cfg, weights_bytes=1)
    assert desc["architectures"] == ["InternLM2ForCausalLM"]
    assert desc["model_type"] == "internlm2" and desc["known_architecture"] is True
    assert desc["kind"] == "generative"
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (32, 8, 128)
    assert kinds(desc) == {"full": 32} and desc["sliding_window"] is None
    assert desc["attention"] == "gqa" and desc["torch_dtype"] == "bfloat16"
    # config/model.py:2372-2397 (_get_and_verify_max_len): a "dynamic" rope scaling is
    # not in ("su", "longrope", "llama3"), so max_position_embeddings 262,144 is
    # stretched by its factor 2.0: 524,288 tokens
    assert desc["max_position_embeddings"] == 262144
    assert desc["rope_scaling"] == {"factor": 2.0, "type": "dynamic"}
    assert t.model_max_len(desc) == 524288
    # 2 x 8 x 128 x 2 = 4,096 bytes per token per layer, x 32 = 131,072 per token
    check_kv_bytes(desc, 32, 8, 128)
    # 8 KV heads split across TP 8 (1 each), replicated past it (internlm2.py:110-118)
    assert kv_memory.kv_layout(desc, tp=8, block_size=16)["per_token_layer_bytes"] == 2 * 128 * 2
    assert kv_memory.kv_layout(desc, tp=16, block_size=16)["per_token_layer_bytes"] == 2 * 128 * 2
    # control: outside the table the same config is refused
    monkeypatch.setattr(model_families, "KNOWN_MODEL_TYPES",
                        model_families.KNOWN_MODEL_TYPES - {"internlm2"})
    with pytest.raises(m.ModelError, match="not in gpufleet's table"):
        m.describe_config(cfg, weights_bytes=1)


def test_internlm2_5_7b_folder_weights_from_its_safetensors_index():
    # The hub's model.safetensors.index.json, downloaded beside config.json: total_size
    # 15,475,417,088 = 2 bytes (bfloat16) x 7,737,708,544 parameters, which the config
    # gives by hand: tok_embeddings and output (untied) 2 x 92,544 x 4,096 =
    # 758,120,448; per layer wqkv (32 + 2 x 8) x 128 x 4,096 = 25,165,824, wo 4,096^2 =
    # 16,777,216, w1/w2/w3 3 x 4,096 x 14,336 = 176,160,768, two norms 8,192:
    # 218,112,000 x 32 = 6,979,584,000; final norm 4,096.
    params = 2 * 92544 * 4096 + 32 * ((32 + 2 * 8) * 128 * 4096 + 4096 * 4096
                                      + 3 * 4096 * 14336 + 2 * 4096) + 4096
    assert params == 7737708544
    desc = m.describe_model_dir(str(MODELS / "internlm2_5-7b"))
    assert desc["weights_bytes"] == 2 * params == 15475417088
    assert desc["weights_source"] == "model.safetensors.index.json metadata.total_size"
    assert (desc["name"], desc["num_kv_heads"], desc["head_size"]) == ("internlm2_5-7b", 8, 128)


# --- RoBERTa ----------------------------------------------------------------------

def test_twitter_roberta_base_sentiment_is_an_encoder_only_classifier(tmp_path, monkeypatch):
    # cardiffnlp/twitter-roberta-base-sentiment (a copy of the hub folder, SOURCES.md).
    # registry.py:333 RobertaForSequenceClassification is a cross-encoder (pooling)
    # model -> roberta.py:264-300, a BertModel with RobertaEmbedding; bert.py:230-273
    # BertSelfAttention: head_dim = 768 // 12 = 64, num_kv_heads = num_heads (12),
    # EncoderOnlyAttention: no KV cache (kv_cache_interface.py EncoderOnlyAttentionSpec).
    # 12 layers; max_position_embeddings 514 (roberta.py:80-87 starts positions at
    # pad_token_id + 1, vLLM still reads 514).
    cfg = load("twitter-roberta-base-sentiment")
    desc = m.describe_config(cfg, weights_bytes=1)
    check_encoder_only(desc, "RobertaForSequenceClassification", "roberta", (12, 12, 64))
    assert desc["max_position_embeddings"] == 514
    assert desc["torch_dtype_from_config"] is False  # the config names no dtype
    for kv_dtype in ("auto", "fp8"):
        layout = kv_memory.kv_layout(desc, tp=1, block_size=16, kv_cache_dtype=kv_dtype)
        assert layout["per_token_layer_bytes"] == 0 and layout["groups"] == []
    # config/model.py:1926-1937: the tokenizer's model_max_length caps a pooling model
    # only when hf_config.position_embedding_type is "absolute". transformers 5.18's
    # RobertaConfig has no such field, and this file (written before transformers added
    # it to saved configs; re-saved copies carry it) has no key, so a
    # tokenizer_config.json of 512 (synthetic) leaves 514; with the key it gives 512.
    assert "position_embedding_type" not in cfg
    folder = tmp_path / "twitter-roberta-base-sentiment"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 512}))
    assert m.describe_model_dir(str(folder), weights_bytes=1)[
        "max_position_embeddings"] == 514
    (folder / "config.json").write_text(json.dumps(dict(cfg, position_embedding_type="absolute")))
    assert m.describe_model_dir(str(folder), weights_bytes=1)[
        "max_position_embeddings"] == 512
    # control: read as a decoder, the same config would need 2 x 12 x 64 x 2 = 3,072
    # bytes per token per layer, which vLLM does not allocate
    monkeypatch.setattr(model_families, "ENCODER_ONLY_MODEL_TYPES",
                        model_families.ENCODER_ONLY_MODEL_TYPES - {"roberta"})
    decoder = m.describe_config(cfg, weights_bytes=1)
    assert decoder["attention"] == "mha"
    assert kv_memory.kv_layout(decoder, tp=1, block_size=16)["per_token_layer_bytes"] == 3072
